"""The GPU worker spawned before the CLI loads (evotuner.prestart): which commands get one, the
measure stage adopting it, and no early worker outliving its command. No GPU needed: the
worker is the real one (on a machine without CUDA its ``init`` says so)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evotuner import launch, prestart
from evotuner.measure.gpu import GpuMeasure


@pytest.fixture
def driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine with an NVIDIA driver, as far as prestart can tell."""
    node = tmp_path / "nvidiactl"
    node.write_text("")
    monkeypatch.setattr(prestart, "DRIVER_NODE", str(node))
    monkeypatch.delenv(prestart.OFF_ENV, raising=False)
    yield node
    prestart.discard()


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("argv, expected", [
    (["search", "--study", "s", "--shape", "D=64"], True),
    (["resume", "--study", "s"], True),
    (["search", "--study", "s", "--replay", "sweep.csv"], False),
    (["search", "--study", "s", "--replay=sweep.csv"], False),
    (["search", "--help"], False),
    (["resume", "-h"], False),
    (["show", "--study", "s"], False),
    (["export", "--study", "s"], False),
    ([], False),
])
def test_only_the_measuring_commands_on_a_gpu_machine_want_an_early_worker(driver, argv, expected):
    assert prestart.wanted(argv) is expected


def test_no_driver_or_switched_off_means_no_early_worker(driver, monkeypatch):
    argv = ["search", "--study", "s"]
    monkeypatch.setenv(prestart.OFF_ENV, "1")
    assert not prestart.wanted(argv)
    monkeypatch.setenv(prestart.OFF_ENV, "0")
    assert prestart.wanted(argv)
    driver.unlink()
    assert not prestart.wanted(argv) and not prestart.start_early(argv)


def test_the_measure_stage_adopts_the_early_worker(driver):
    assert prestart.start_early(["search", "--study", "s"])
    early = prestart._early
    assert early is not None
    gm = GpuMeasure(start_timeout_s=120.0)
    try:
        gm.start()
        assert gm.spawns == 1 and gm.spawned_pids == [early.proc.pid]
        assert prestart._early is None                     # handed over once
    finally:
        gm.close()
    assert _gone(early.proc.pid)


def test_an_early_worker_for_another_command_line_is_killed_not_adopted(driver):
    assert prestart.start_early(["search", "--study", "s"])
    early = prestart._early
    assert prestart.take([sys.executable, "-c", "pass"], prestart.worker_env()) is None
    assert _gone(early.proc.pid) and prestart._early is None


def test_an_early_worker_nobody_took_ends_with_the_command(driver, monkeypatch):
    seen = []

    def cli_main(argv):
        seen.append(prestart._early.proc.pid)              # spawned before the CLI was imported
        return 2                                           # e.g. the command refused its options

    import evotuner.cli

    monkeypatch.setattr(evotuner.cli, "main", cli_main)
    assert launch.main(["search", "--study", "s", "--shape", "D=64"]) == 2
    assert len(seen) == 1 and _gone(seen[0]) and prestart._early is None


def test_the_worker_imports_torch_before_its_first_request(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    marker = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.run([sys.executable, "-m", "evotuner.measure.worker"], stdin=subprocess.DEVNULL,
                          capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0                            # no request came: EOF ends it
    assert marker.exists()


def test_the_searching_commands_run_one_blas_thread_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv(launch.BLAS_THREADS_ENV, raising=False)
    launch.one_blas_thread(["show", "--study", "s"])
    assert launch.BLAS_THREADS_ENV not in os.environ
    launch.one_blas_thread(["search", "--study", "s"])
    assert os.environ[launch.BLAS_THREADS_ENV] == "1"
    monkeypatch.setenv(launch.BLAS_THREADS_ENV, "4")
    launch.one_blas_thread(["resume", "--study", "s"])
    assert os.environ[launch.BLAS_THREADS_ENV] == "4"


def test_the_early_worker_runs_in_the_environment_the_search_then_has(driver, monkeypatch):
    """The BLAS setting comes before the early spawn, so the measure stage still adopts it."""
    monkeypatch.delenv(launch.BLAS_THREADS_ENV, raising=False)
    adopted = []

    def cli_main(argv):
        gm = GpuMeasure(start_timeout_s=120.0)
        try:
            early = prestart._early
            gm.start()
            adopted.append(early is not None and gm.spawned_pids == [early.proc.pid])
        finally:
            gm.close()
        return 0

    import evotuner.cli

    monkeypatch.setattr(evotuner.cli, "main", cli_main)
    assert launch.main(["search", "--study", "s", "--shape", "D=64"]) == 0
    assert adopted == [True]
