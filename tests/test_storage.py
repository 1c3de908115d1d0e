"""The study database (evotuner.storage): real SQLite files under tmp_path, no GPU."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest

from evotuner.compiler.result import Artifact, BuildResult
from evotuner.config import KernelConfig
from evotuner.errors import StorageError, StudyMismatchError
from evotuner.gate import GateResult, PtxasReport
from evotuner.measure.base import MeasureFailure, Measurement
from evotuner.problem import Problem, Shape
from evotuner.space import load_space
from evotuner.storage import (
    CONNECT_TIMEOUT_S,
    INTERRUPTED_REASON,
    SCHEMA_VERSION,
    StudyStore,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

PROBLEM = Problem(Shape(16, 16, 2048, 2048, 64), dtype="fp16", causal=False)
SPACE = load_space(None)


def _url(tmp_path: Path, name: str = "study.db") -> str:
    return f"sqlite:///{tmp_path / name}"


def _create(store: StudyStore, name: str = "s1", problem: Problem = PROBLEM) -> optuna.Study:
    return store.create_study(name, problem, SPACE, "tpe", 7, source_hash="src123", nvcc_version="cuda_13.0")


def _ask(study: optuna.Study, **params: int) -> optuna.trial.Trial:
    trial = study.ask()
    for k, v in params.items():
        trial.suggest_int(k, v, v)  # a fixed value (categorical choices may not vary)
    return trial


@pytest.fixture
def store(tmp_path: Path):
    with StudyStore(_url(tmp_path)) as s:
        yield s


# -- create / load / list ------------------------------------------------------------------


def test_create_load_list_and_optuna_reads_it(store: StudyStore) -> None:
    study = _create(store)
    _create(store, "s2", Problem(Shape(1, 8, 512, 512, 128), dtype="bf16", causal=True))
    trial = _ask(study, BLOCK_M=128, BLOCK_N=64)
    study.tell(trial, 42.0)

    assert store.study_exists("s1") and not store.study_exists("nope")
    assert [i.name for i in store.list_studies()] == ["s1", "s2"]
    info = store.list_studies()[0]
    assert info.problem == PROBLEM and info.n_trials == 1 and info.best_value == 42.0 and info.sampler == "tpe"

    loaded = store.load_study("s1", problem=PROBLEM, space=SPACE)
    assert loaded.best_value == 42.0
    rec = store.study_info("s1")
    assert rec.seed == 7 and rec.space_text == SPACE.text and rec.space_fingerprint == SPACE.fingerprint()

    # Optuna (and so optuna-dashboard) reads the same database by URL, its own schema intact.
    plain = optuna.load_study(study_name="s1", storage=store.url)
    assert plain.best_params == {"BLOCK_M": 128, "BLOCK_N": 64}
    with sqlite3.connect(store.url.removeprefix("sqlite:///")) as db:
        tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
        assert {"studies", "trials", "version_info", "alembic_version"} <= tables
        ours = {t for t in tables if t.startswith("evotuner_")}
        assert ours == {"evotuner_schema_version", "evotuner_studies", "evotuner_devices",
                        "evotuner_builds", "evotuner_baselines", "evotuner_measurements",
                        "evotuner_checks", "evotuner_profiles", "evotuner_workers", "evotuner_claims"}
        assert db.execute("select version from evotuner_schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_create_twice_is_refused(store: StudyStore) -> None:
    _create(store)
    with pytest.raises(StorageError, match="study 's1' already exists"):
        _create(store)
    optuna.create_study(study_name="plain", storage=store.optuna_storage)
    with pytest.raises(StorageError, match="study 'plain' already exists"):
        _create(store, "plain")
    with pytest.raises(StorageError, match="'plain' .*was not created by evotuner"):
        store.load_study("plain")


def test_default_url_is_cwd_file_or_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EVOTUNER_STORAGE", raising=False)
    with StudyStore() as s:
        _create(s)
    assert (tmp_path / "evotuner.db").is_file()
    monkeypatch.setenv("EVOTUNER_STORAGE", _url(tmp_path, "other.db"))
    with StudyStore() as s:
        assert not s.study_exists("s1")
    assert (tmp_path / "other.db").is_file()


def test_create_false_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="no study database at"):
        StudyStore(_url(tmp_path, "missing.db"), create=False)
    assert not (tmp_path / "missing.db").exists()


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "other, expected",
    [
        (Problem(Shape(16, 16, 4096, 4096, 64)), "B=16,H=16,S=4096,D=64 fp16 non-causal"),
        (Problem(Shape(16, 16, 2048, 2048, 64), dtype="bf16"), "B=16,H=16,S=2048,D=64 bf16 non-causal"),
        (Problem(Shape(16, 16, 2048, 2048, 64), causal=True), "B=16,H=16,S=2048,D=64 fp16 causal"),
    ],
    ids=["shape", "dtype", "causal"],
)
def test_problem_mismatch_is_refused(store: StudyStore, other: Problem, expected: str) -> None:
    _create(store)
    with pytest.raises(StudyMismatchError) as err:
        store.load_study("s1", problem=other)
    assert err.value.message == (
        f"study 's1' was created for B=16,H=16,S=2048,D=64 fp16 non-causal; this run asks for {expected}"
    )
    assert err.value.remedy == "use another --study name"


def test_space_mismatch_is_refused(store: StudyStore, tmp_path: Path) -> None:
    _create(store)
    text = SPACE.text.replace("sm_90a", "sm_90a", 1) + "\n# a comment changes nothing\n"
    (tmp_path / "same.toml").write_text(text)
    assert store.load_study("s1", space=load_space(tmp_path / "same.toml")) is not None
    with pytest.raises(StudyMismatchError, match="created with search space 'flashcore'.*use another --study name"):
        store.load_study("s1", space="0" * 64)


def test_not_found_names_the_study_and_lists_the_others(store: StudyStore) -> None:
    with pytest.raises(StorageError, match="study 'x' not found in .*; existing studies: there are none"):
        store.load_study("x")
    _create(store, "b")
    _create(store, "a")
    with pytest.raises(StorageError, match="study 'x' not found in .*; existing studies: 'a', 'b'"):
        store.summary("x")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_that_is_not_a_database_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 100)
    before = _sha(path)
    with pytest.raises(StorageError, match="file is not a database"):
        StudyStore(f"sqlite:///{path}")
    assert _sha(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_a_corrupt_database_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "study.db"
    with StudyStore(f"sqlite:///{path}") as s:
        _create(s)
    with sqlite3.connect(path) as db:  # enough rows for many pages
        db.execute("create table filler (x text)")
        db.executemany("insert into filler values (?)", [("y" * 1000,)] * 300)
    db.close()
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for off in range(page * 2, len(data) - page, page):  # keep page 1 (header + schema) intact
        data[off : off + 64] = b"\xa5" * 64
    path.write_bytes(bytes(data))
    before = _sha(path)
    with pytest.raises(StorageError, match="corrupt|not a database"):
        StudyStore(f"sqlite:///{path}")
    assert _sha(path) == before


def test_an_unwritable_location_fails_and_leaves_no_file(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if not os.access(locked, os.W_OK):
            target, expected = locked / "study.db", "directory .* is read-only"
        else:
            # Running as root: chmod does not stop root, so force the failure with a
            # path whose parent is a file instead.
            (tmp_path / "afile").write_text("x")
            target, expected = tmp_path / "afile" / "study.db", "is a file, not a directory"
        with pytest.raises(StorageError, match=expected):
            StudyStore(f"sqlite:///{target}")
        assert not target.exists()
    finally:
        locked.chmod(0o755)
    with pytest.raises(StorageError, match="directory .* does not exist"):
        StudyStore(f"sqlite:///{tmp_path / 'no' / 'such' / 'study.db'}")


def test_a_failure_after_creating_the_file_removes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import evotuner.storage.opening as store_mod

    def broken(*a, **k):
        raise RuntimeError("The runtime optuna version is no longer compatible with the table schema")

    monkeypatch.setattr(store_mod, "RDBStorage", broken)
    with pytest.raises(StorageError, match="optuna storage upgrade"):
        StudyStore(_url(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_unreachable_server_fails_fast() -> None:
    t0 = time.monotonic()
    with pytest.raises(StorageError) as err:
        StudyStore("postgresql://nobody@127.0.0.1:1/x")
    assert time.monotonic() - t0 < 5
    assert "127.0.0.1" in err.value.message and err.value.remedy


def test_connection_refused_is_reported() -> None:
    pytest.importorskip("psycopg2", reason="the PostgreSQL driver psycopg2 is not installed")
    t0 = time.monotonic()
    with pytest.raises(StorageError, match=r"cannot connect to postgresql\+psycopg2://nobody@127.0.0.1:1/x"):
        StudyStore("postgresql+psycopg2://nobody@127.0.0.1:1/x")
    assert time.monotonic() - t0 < 5


def test_a_silent_server_times_out() -> None:
    pytest.importorskip("psycopg2", reason="the PostgreSQL driver psycopg2 is not installed")
    with socket.socket() as srv:  # accepts, never answers
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(StorageError, match="cannot connect"):
            StudyStore(f"postgresql+psycopg2://nobody@127.0.0.1:{port}/x")
        assert time.monotonic() - t0 < CONNECT_TIMEOUT_S + 3


@pytest.mark.parametrize("url, expected", [
    ("nosuchdb://x/y", "unknown database dialect or driver 'nosuchdb'"),
    ("sqlite://", "in-memory"),
    ("::not a url::", "cannot be read"),
])
def test_bad_urls(url: str, expected: str) -> None:
    with pytest.raises(StorageError, match=expected):
        StudyStore(url)


def test_a_newer_schema_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "study.db"
    with StudyStore(f"sqlite:///{path}") as s:
        _create(s)
    with sqlite3.connect(path) as db:
        db.execute("update evotuner_schema_version set version = ?", (SCHEMA_VERSION + 1,))
    db.close()
    before = _sha(path)
    with pytest.raises(StorageError) as err:
        StudyStore(f"sqlite:///{path}")
    assert err.value.message.startswith(f"database schema version {SCHEMA_VERSION + 1} (written by evotuner ")
    assert err.value.message.endswith(f"is newer than this evotuner's ({SCHEMA_VERSION})")
    assert "git pull" in err.value.remedy and "pip install -e ." in err.value.remedy
    assert _sha(path) == before


# -- zombies -------------------------------------------------------------------------------


def _reap(store: StudyStore, target: int = 10) -> list:
    """Reap study s1 as a live worker would, with ``target`` trials."""
    from evotuner.storage import liveness

    reaper = liveness.register(store, "s1", stale_after=60)
    return liveness.reap(store, "s1", exclude=reaper, target=target)


def test_zombies_are_failed_and_returned(store: StudyStore) -> None:
    study = _create(store)
    study.tell(_ask(study, BLOCK_M=64), 10.0)             # 0 COMPLETE BLOCK_M=64
    _ask(study, BLOCK_M=64)                               # 1 RUNNING, config already finished
    _ask(study, BLOCK_M=128)                              # 2 RUNNING -> requeue
    _ask(study, BLOCK_M=128)                              # 3 RUNNING, same config as 2
    study.ask()                                           # 4 RUNNING, never got params
    study.enqueue_trial({"BLOCK_M": 256})                 # 5 WAITING
    _ask(study, BLOCK_M=256)                              # 5 -> RUNNING (takes the enqueued one)
    study.enqueue_trial({"BLOCK_M": 256})                 # 6 WAITING, same config

    zombies = _reap(store)                                # nobody's slot held them: orphans
    assert [(z.number, z.params, z.requeue) for z in zombies] == [
        (1, {"BLOCK_M": 64}, False),
        (2, {"BLOCK_M": 128}, True),
        (3, {"BLOCK_M": 128}, False),
        (4, {}, False),
        (5, {"BLOCK_M": 256}, False),
    ]
    trials = optuna.load_study(study_name="s1", storage=store.url).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] + ["FAIL"] * 5 + ["WAITING"] * 2
    assert trials[7].system_attrs["fixed_params"] == {"BLOCK_M": 128}   # queued again, in a new slot
    assert all(t.user_attrs["reason"] == INTERRUPTED_REASON for t in trials[1:6])
    # Interrupted trials are not finished: they neither count nor block their config.
    assert store.count_finished("s1") == 1
    assert {str(k): r.number for k, r in store.finished_configs("s1").items()} == {"BLOCK_M=64": 0}
    assert _reap(store) == []


def test_a_killed_process_leaves_a_zombie(store: StudyStore) -> None:
    _create(store)
    code = (
        "import os, signal, optuna\n"
        f"s = optuna.load_study(study_name='s1', storage={store.url!r})\n"
        "t = s.ask(); t.suggest_categorical('BLOCK_M', [64]); t.suggest_categorical('STAGES', [2])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=120, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    zombies = _reap(store, target=0)                      # a done budget: failed, not queued
    assert [(z.number, z.params, z.requeue) for z in zombies] == [(0, {"BLOCK_M": 64, "STAGES": 2}, False)]
    summary = store.summary("s1")
    assert summary.trials[0].state == "FAIL" and summary.trials[0].error == INTERRUPTED_REASON


# -- records and the summary -----------------------------------------------------------------


def _build(config: KernelConfig, ok: bool = True) -> BuildResult:
    art = Artifact(Path("/nonexistent/x.cubin"), key="k" + str(config), sha256="ab" * 32, meta={}) if ok else None
    return BuildResult(config=config, key="k" + str(config), ok=ok, artifact=art,
                       ptxas_log="ptxas info    : Used 128 registers\n" * 3, seconds=1.5, cached=False,
                       error=None if ok else "error: expected ';'")


def _gate(passed: bool = True, spill: int = 0) -> GateResult:
    report = PtxasReport(entry="flashcore_fwd", arch="sm_90a", registers=168, spill_stores=spill,
                         spill_loads=spill, stack=0, static_smem=0, barriers=1, dynamic_smem=49152)
    return GateResult(passed=passed, reason=None if passed else f"spills {2 * spill} bytes", report=report,
                      check=None if passed else "spills")


def test_summary_json_shape(store: StudyStore) -> None:
    study = _create(store)
    fp = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "sm_clock_mhz": 1980, "driver": "560.35"}
    store.record_device("s1", fp)
    store.record_baselines("s1", fp, PROBLEM, {"sdpa_flash": 250.0, "sdpa_efficient": None})
    configs = [KernelConfig.of({"BLOCK_M": m, "BLOCK_N": 64}) for m in (64, 128, 192)]
    # 0: COMPLETE, 1: COMPLETE (faster), 2: PRUNED by the gate
    for i, (cfg, value) in enumerate(zip(configs[:2], (30.0, 20.0))):
        t = _ask(study, **cfg.as_dict())
        store.record_build("s1", t.number, _build(cfg), _gate())
        m = Measurement(median_us=value, p20_us=value - 1, p80_us=value + 1, tflops=PROBLEM.tflops(value),
                        max_error=1e-3, tolerance=2e-3, repetitions=50)
        store.record_measurement("s1", t.number, cfg, m)
        study.tell(t, value)
    t = _ask(study, **configs[2].as_dict())
    store.record_build("s1", t.number, _build(configs[2]), _gate(False, spill=8))
    t.set_user_attr("reason", "spills 16 bytes")
    study.tell(t, state=optuna.trial.TrialState.PRUNED)
    t = _ask(study, BLOCK_M=256, BLOCK_N=64)
    store.record_build("s1", t.number, _build(KernelConfig.of({"BLOCK_M": 256, "BLOCK_N": 64}), ok=False))
    store.record_measurement("s1", t.number, KernelConfig.of({"BLOCK_M": 256, "BLOCK_N": 64}),
                             MeasureFailure("launch", "too many resources"))
    t.set_user_attr("reason", "build failed: error: expected ';'")
    study.tell(t, state=optuna.trial.TrialState.FAIL)

    summary = store.summary("s1")
    doc = json.loads(json.dumps(summary.as_json()))
    assert {"study", "shape", "dtype", "causal", "device", "best", "trials"} <= doc.keys()
    assert (doc["study"], doc["shape"], doc["dtype"], doc["causal"]) == ("s1", "B=16,H=16,S=2048,D=64", "fp16", False)
    assert doc["device"]["name"] == "NVIDIA H100 80GB HBM3"
    assert doc["baselines"] == {"sdpa_flash": 250.0, "sdpa_efficient": None}
    assert doc["best"]["number"] == 1 and doc["best"]["value"] == 20.0
    assert doc["best"]["config"] == "BLOCK_M=128,BLOCK_N=64"
    assert doc["best"]["tflops"] == pytest.approx(PROBLEM.tflops(20.0))
    assert doc["best"]["gate"] == {"passed": True, "reason": None, "registers": 168, "spill_stores": 0,
                                   "spill_loads": 0, "stack": 0, "smem": 49152, "barriers": 1}
    assert [t["state"] for t in doc["trials"]] == ["COMPLETE", "COMPLETE", "PRUNED", "FAIL"]
    assert doc["trials"][2]["error"] == "spills 16 bytes" and doc["trials"][2]["gate"]["spill_stores"] == 8
    assert doc["trials"][3]["error"].startswith("build failed") and doc["trials"][3]["gate"] is None
    assert doc["counts"] == {"COMPLETE": 2, "PRUNED": 1, "FAIL": 1}
    assert summary.source_hash == "src123" and summary.nvcc_version == "cuda_13.0" and summary.seed == 7
    with sqlite3.connect(store.url.removeprefix("sqlite:///")) as db:
        rows = db.execute("select trial_number, ok, gate_passed, registers, artifact_sha256 is not null "
                          "from evotuner_builds order by trial_number").fetchall()
        assert rows == [(0, 1, 1, 168, 1), (1, 1, 1, 168, 1), (2, 1, 0, 168, 1), (3, 0, None, None, 0)]
        meas = db.execute("select trial_number, ok, median_us, failure_kind, config from evotuner_measurements "
                          "order by trial_number").fetchall()
        assert meas == [(0, 1, 30.0, None, "BLOCK_M=64,BLOCK_N=64"), (1, 1, 20.0, None, "BLOCK_M=128,BLOCK_N=64"),
                        (3, 0, None, "launch", "BLOCK_M=256,BLOCK_N=64")]
    assert {str(k) for k in store.finished_configs("s1")} == {str(c) for c in configs} | {"BLOCK_M=256,BLOCK_N=64"}
    assert store.count_finished("s1") == 4


def test_device_change_is_recorded(store: StudyStore) -> None:
    _create(store)
    h100 = {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132, "sm_clock_mhz": 1980, "driver": "560.35"}
    assert store.record_device("s1", h100) is False                            # first device
    assert store.record_device("s1", {**h100, "sm_clock_mhz": 1755}) is False  # same GPU, other clocks
    store.record_baselines("s1", h100, PROBLEM, {"sdpa_flash": 250.0})
    h200 = {**h100, "name": "NVIDIA H200", "driver": "570.1"}
    assert store.baselines("s1", h200) is None
    assert store.record_device("s1", h200) is True
    store.record_baselines("s1", h200, PROBLEM, {"sdpa_flash": 200.0})
    summary = store.summary("s1")
    assert [d["fingerprint"]["name"] for d in summary.devices] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert summary.devices[0]["fingerprint"]["sm_clock_mhz"] == 1980  # the latest seen (by record_baselines)
    assert summary.device == h200 and summary.baselines == {"sdpa_flash": 200.0}
    assert store.baselines("s1", h100) == {"sdpa_flash": 250.0}
    assert store.record_device("s1", h100) is True                             # back on the H100


def test_many_writes_from_threads(store: StudyStore) -> None:
    study = _create(store)
    n_threads, per_thread = 8, 6
    trials = [_ask(study, BLOCK_M=i) for i in range(n_threads * per_thread)]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for t in trials[k * per_thread : (k + 1) * per_thread]:
                cfg = KernelConfig.of(t.params)
                store.record_build("s1", t.number, _build(cfg), _gate())
                store.record_measurement("s1", t.number, cfg, MeasureFailure("timeout", "hung"))
                store.record_device("s1", {"name": "gpu", "thread": k % 2})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors[:3]
    with sqlite3.connect(store.url.removeprefix("sqlite:///")) as db:
        assert db.execute("select count(*) from evotuner_builds").fetchone() == (n_threads * per_thread,)
        assert db.execute("select count(*) from evotuner_measurements").fetchone() == (n_threads * per_thread,)
        assert db.execute("select count(*) from evotuner_devices").fetchone() == (2,)
    assert all(t.gate and t.gate["registers"] == 168 for t in store.summary("s1").trials)


def test_session_rolls_back_on_error(store: StudyStore) -> None:
    from sqlalchemy import func, select

    from evotuner.storage import schema

    _create(store)
    with pytest.raises(ZeroDivisionError):
        with store.session() as s:
            s.execute(schema.devices.insert().values(study_id=1, identity="x", fingerprint_json="{}",
                                                     first_seen=schema_now(), last_seen=schema_now()))
            1 / 0
    with store.session() as s:
        assert s.execute(select(func.count()).select_from(schema.devices)).scalar() == 0


def schema_now():
    import datetime

    return datetime.datetime(2026, 1, 1)


@pytest.mark.parametrize("old_version, dropped", [
    (1, ("evotuner_checks", "evotuner_profiles", "evotuner_workers", "evotuner_claims")),
    (2, ("evotuner_workers", "evotuner_claims")),
    (3, ()),
])
def test_older_schemas_upgrade_to_the_workers_tables(tmp_path: Path, old_version: int, dropped: tuple[str, ...]) -> None:
    """Schema 3 (several workers) on a version-1 database (no diagnostics tables either) and on a
    version-2 one (issue 13's diagnostics tables): the first writable open creates what is
    missing and bumps the version; the study and its trials are kept and the claims work."""
    from evotuner.storage import claims

    path = tmp_path / "study.db"
    with StudyStore(f"sqlite:///{path}") as s:
        study = _create(s)
        study.tell(_ask(study, BLOCK_M=128), 1.0)
    with sqlite3.connect(path) as db:
        for table in dropped:
            db.execute(f"drop table {table}")
        db.execute("update evotuner_schema_version set version = ?", (old_version,))
    db.close()
    assert SCHEMA_VERSION == 4
    with StudyStore(f"sqlite:///{path}") as s:
        assert s.count_finished("s1") == 1
        assert claims.slot_counts(s, "s1") == (0, 0)
    with sqlite3.connect(path) as db:
        tables = {r[0] for r in db.execute("select name from sqlite_master where type = 'table'")}
        assert set(dropped) <= tables
        assert db.execute("select version from evotuner_schema_version").fetchall() == [(SCHEMA_VERSION,)]
    db.close()


def test_another_card_of_the_same_model_is_no_device_change(store: StudyStore) -> None:
    """--gpus 0,1,2,3 on one host: each card is its own device row (its own baselines), but
    the study did not move to another device, so no change is reported."""
    _create(store)
    card = {"name": "NVIDIA H200", "sm_count": 132, "driver": "570.1", "nvidia_smi": {"name": "NVIDIA H200"}}
    cards = [{**card, "device_index": i, "uuid": f"GPU-{i}"} for i in range(4)]
    assert [store.record_device("s1", c) for c in cards] == [False, False, False, False]
    assert len(store.summary("s1").devices) == 4
    assert store.record_device("s1", {**cards[0], "name": "NVIDIA H100 80GB HBM3"}) is True   # another model
    assert store.record_device("s1", {**cards[1], "driver": "580.2"}) is True                  # another setup
