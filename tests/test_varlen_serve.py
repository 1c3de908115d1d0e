"""Serving a packed variable-length study, without a GPU: its best serves
flash_attention_varlen calls of the same GPU model, D, dtype, causal flag and size, never
flash_attention's dense calls (and a dense study's best never a packed call); the packed
call's choice refuses split-KV; export refuses a packed study in one line. Studies made by
the CLI with the scaffold measure stage (tests/scaffold.py)."""

from __future__ import annotations

import json

import pytest

from cli_helpers import assert_one_line_error, run, scaffold_env
from scaffold import DEVICE
from evotuner import tuned
from evotuner.config import KernelConfig
from evotuner.errors import ShapeError
from evotuner.family import get_family
from evotuner.problem import Problem, Shape
from evotuner.runtime import choice
from evotuner.runtime.varlen import packed_choice

GPU = DEVICE["name"]
#: A call of flash_attention_varlen: 5 sequences, 4 heads (2 K/V heads), the longest 300.
CALL = Problem(Shape(5, 4, 300, 300, 64, 2), "fp16", True, varlen=True)
DENSE_CALL = Problem(Shape(5, 4, 300, 300, 64, 2), "fp16", True)


@pytest.fixture(autouse=True)
def env(monkeypatch, build_cache_dir, tmp_path):
    scaffold_env(monkeypatch, build_cache_dir, tmp_path)


@pytest.fixture
def db(capsys, tmp_path):
    """A database with a packed study and a dense study of the same D, dtype, causal flag and size."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    code, out, err = run(capsys, "search", "--study", "packed", "--shape", "H=4,HKV=2,D=64", "--lengths",
                         "5,300,0,77,129", "--causal", "--trials", 3, "--sampler", "random", "--jobs", 2,
                         "--storage", url)
    assert code == 0, err
    code, out, err = run(capsys, "search", "--study", "dense", "--shape", "B=5,H=4,HKV=2,S=300,D=64", "--causal",
                         "--family", "hopper", "--trials", 3, "--sampler", "random", "--jobs", 2, "--no-transfer",
                         "--storage", url)
    assert code == 0, err
    return url


def _best(capsys, url, study) -> KernelConfig:
    code, out, err = run(capsys, "show", "--study", study, "--json", "--storage", url)
    assert code == 0, err
    return KernelConfig.of(json.loads(out)["best"]["params"])


def test_a_packed_studys_best_serves_packed_calls_only(capsys, db):
    table = tuned.load(db)
    rows = {r.source.split("'")[1]: r for r in table.rows}
    packed, dense = rows["packed"], rows["dense"]
    assert packed.varlen and not dense.varlen
    assert packed.query_rows == 5 * 4 * 300 and packed.seqlen_k == 300    # sized by its padded shape
    assert packed.config == _best(capsys, db, "packed") and dense.config == _best(capsys, db, "dense")

    pick = table.pick(CALL, GPU, "hopper")
    assert pick is not None and pick.row is packed and "study 'packed'" in pick.why
    pick = table.pick(DENSE_CALL, GPU, "hopper")
    assert pick is not None and pick.row is dense

    chosen = packed_choice(CALL, device=GPU, tables=[table])
    assert chosen.config == packed.config and "tuned: study 'packed'" in chosen.why
    served = choice.choose(DENSE_CALL, device=GPU, tables=[table])
    assert served.config == dense.config and "study 'dense'" in served.why


def test_a_dense_study_never_serves_a_packed_call(capsys, db):
    table = tuned.load(db)
    only_dense = tuned.TunedTable(tuple(r for r in table.rows if not r.varlen), table.source)
    chosen = packed_choice(CALL, device=GPU, tables=[only_dense])
    assert "tuned" not in chosen.why.split(";")[0]
    assert chosen.config == get_family("hopper").recommended_configs(CALL)[0]
    assert "no tuned row for D=64 fp16 causal packed" in chosen.why
    only_packed = tuned.TunedTable(tuple(r for r in table.rows if r.varlen), table.source)
    served = choice.choose(DENSE_CALL, device=GPU, tables=[only_packed])
    assert "study 'packed'" not in served.why


def test_a_packed_call_never_runs_split_kv():
    with pytest.raises(ShapeError, match="not built for packed") as info:
        packed_choice(CALL, config={"SPLITS": 4}, device=GPU, tables=[])
    assert info.value.remedy
    # the recommended config of a small packed problem has no split either (the dense one's has)
    small = Problem(Shape(1, 8, 64, 4096, 128), "fp16", False, varlen=True)
    assert packed_choice(small, device=GPU, tables=[]).config.as_dict().get("SPLITS", 1) == 1
    assert get_family("hopper").recommended_configs(Problem(small.shape))[0]["SPLITS"] > 1


def test_export_refuses_a_packed_study_in_one_line(capsys, db, tmp_path):
    code, out, err = run(capsys, "export", "--study", "dense", "--study", "packed", "--output",
                         tmp_path / "tuned.h", "--storage", db)
    assert_one_line_error(code, out, err, "study 'packed'", "packed variable-length", "use_tuned")
    assert not (tmp_path / "tuned.h").exists()
    code, out, err = run(capsys, "export", "--study", "dense", "--output", tmp_path / "tuned.h", "--storage", db)
    assert code == 0, err
    header = tuned.load(tmp_path / "tuned.h")
    assert header.rows and not any(r.varlen for r in header.rows)
    assert header.pick(CALL, GPU, "hopper") is None        # a header's rows are dense: no packed call served


def test_transfer_keeps_packed_and_dense_studies_apart(db):
    from evotuner import session
    from evotuner.transfer import plan_transfer

    store = session.open_store(db, read_only=True)
    try:
        packed = store.summary("packed")
        space = session.study_space(store, "packed")
        plan = plan_transfer(store, "new", packed.problem, space, DEVICE)
        assert plan.studies == ("packed",) and ("dense", "a dense batch") in plan.skipped
        dense = store.summary("dense")
        plan = plan_transfer(store, "new", dense.problem, session.study_space(store, "dense"), DEVICE)
        assert "packed" not in plan.studies and ("packed", "a packed variable-length batch") in plan.skipped
    finally:
        store.close()
