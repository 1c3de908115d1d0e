"""Everything the CLI prints reads whole on an 80-column terminal, for both kernel families.

A replayed hopper_grid study (ten parameters) and a replayed FlashCore study are run through
`search`, `show`, `export`, `bench`, `check` and `compile` at COLUMNS=80: no value is cut
(no ``…``), no line is longer than 80, every legend pair ``X = NAME`` is on one line, the
headers are the same at 80 and at 200 columns, and long paths and reasons wrap at word
boundaries. `bench` runs the test-only scaffold measure stage (real nvcc builds); `check`
runs a fake compute-sanitizer that writes a real saved log (tests/test_cli_diagnostics.py)."""

from __future__ import annotations

import re
import stat
from contextlib import ExitStack
from pathlib import Path

import pytest

import evotuner.measure
import evotuner.tools
from evotuner import cli, columns, session
from evotuner.problem import Problem, Shape
from evotuner.space import load_space

from cli_helpers import run, scaffold_env

ROOT = Path(__file__).parent.parent
DATA = ROOT / "tests" / "data"
SHAPE = "B=16,H=16,S=2048,D=64"
GRID = ROOT / "search_spaces" / "hopper_grid.toml"
FAMILIES = {
    #          study     sweep                                  space file
    "hopper": ("hop", DATA / "sweep_h100_hopper_d64.csv", GRID),
    "flashcore": ("fc", DATA / "sweep_h100_d64.csv", None),
}


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    """One database with a replayed 16-trial study of each family."""
    url = f"sqlite:///{tmp_path_factory.mktemp('layout') / 'studies.db'}"
    store = session.open_store(url)
    problem = Problem(Shape.parse(SHAPE))
    for study, sweep, space_file in FAMILIES.values():
        space = load_space(space_file)
        sampler = session.sampler_name(None, space)
        with ExitStack() as stack:
            builder, measure = session.StageFactory(replay=sweep).stages(problem, space, 2, stack)
            session.start_study(store, study, problem, space, sampler, 0, builder)
            session.run_study(store, study, problem, space, sampler, 0, 16, builder, measure, transfer=False)
    store.close()
    return url


@pytest.fixture
def cli80(monkeypatch, tmp_path, build_cache_dir):
    scaffold_env(monkeypatch, build_cache_dir, tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    for var in ("EVOTUNER_COMPUTE_SANITIZER", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(evotuner.tools, "CUDA_ROOTS", ())
    return tmp_path


def assert_whole(text: str, width: int = 80) -> None:
    """No value cut, no line over ``width``, no legend pair split across lines."""
    assert "…" not in text, text
    long = [line for line in text.splitlines() if len(line) > width and not _copyable_alone(line)]
    assert not long, "\n".join(long)
    for line in text.splitlines():
        assert not re.search(r"(^|, )[A-Z]{1,4} =,?$", line) and not line.startswith("= "), line


def _copyable_alone(line: str) -> bool:
    """A line past the width holds one path, URL or `command` (never broken, so it copies in one
    piece) alone, after the indentation or a key."""
    words = re.findall(r"[^\s`]*`[^`]*`\S*|\S+", line)
    return bool(words) and columns.whole_unit(words[-1]) and len(words) <= 2


def assert_legend(text: str, space) -> None:
    """Each parameter's header pair ``X = NAME`` on one line (a header that is the name needs none);
    a parameter the space fixes to one value may instead be named once with it (``NAME=value``)."""
    fixed = {p.name: p.values[0] for p in space.params if len(p.values) == 1}
    for name, short in columns.headers(space.names).items():
        if name in fixed and any(f"{name}={fixed[name]}" in line for line in text.splitlines()):
            continue
        if short != name:
            assert any(f"{short} = {name}" in line for line in text.splitlines()), (name, text)


def _fake_sanitizer(path: Path) -> Path:
    log = DATA / "tools" / "sanitizer" / "memcheck_fault1.log"
    path.write_text(f"""#!/bin/sh
while [ $# -gt 0 ]; do
  if [ "$1" = "--log-file" ]; then cp "{log}" "$2"; fi
  shift
done
exit 1
""")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize("family", FAMILIES)
def test_every_command_reads_whole_at_80_columns(family, db, cli80, capsys, monkeypatch):
    study, sweep, space_file = FAMILIES[family]
    space = load_space(space_file)
    extra = ["--space", space_file] if space_file else []

    code, out, err = run(capsys, "search", "--study", study, "--shape", SHAPE, "--trials", 20, "--replay", sweep,
                         *extra, "--storage", db)
    assert code == 0, err
    assert_whole(out + err)
    assert_legend(out, space)
    assert re.search(r"^#\d+ (COMPLETE|PRUNED|FAIL)", out, re.M)      # the trial lines are there, wrapped
    assert all(not line.rstrip().endswith("=") for line in out.splitlines())   # never split inside NAME=VALUE

    code, out, err = run(capsys, "show", "--study", study, "--storage", db)
    assert code == 0, err
    assert_whole(out)
    assert_legend(out, space)
    assert "replayed" in out

    header = cli80 / "a" / ("very-long-directory-name-" * 3) / "tuned_attention_configs_for_production_build.h"
    header.parent.mkdir(parents=True)
    code, out, err = run(capsys, "export", "--study", study, "--output", header, "--storage", db)
    assert code == 0, err
    assert_whole(out)
    assert_legend(out, space)
    assert "tuned_attention_configs_for_production_build.h" in out.replace("\n", "")
    assert "(1 config)" in " ".join(out.split()) and "configs)" not in out

    code, out, err = run(capsys, "bench", "--study", study, "--top", 2, "--storage", db)
    assert code == 0, err
    assert_whole(out + err)
    assert_legend(out, space)

    monkeypatch.setenv("EVOTUNER_COMPUTE_SANITIZER", str(_fake_sanitizer(cli80 / "compute-sanitizer")))
    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: True)
    code, out, err = run(capsys, "check", "--study", study, "--top", 1, "--tools", "memcheck",
                         "--timeout", 60, "--storage", db)
    assert code == 1 and err.startswith("error: check: "), err
    assert_whole(out)
    code, out, err = run(capsys, "show", "--study", study, "--storage", db)
    assert code == 0, err
    assert_whole(out)
    assert "evotuner check" in out and "first finding: Invalid __global__ write" in " ".join(out.split())

    best = next(line for line in out.splitlines() if re.match(r"^\s*\d+\s", line)).split()
    fixed = {p.name: p.values[0] for p in space.params if len(p.values) == 1}   # no column: named below
    shown = [n for n in space.names if n not in fixed]
    config = ",".join([*(f"{n}={v}" for n, v in zip(shown, best[1:1 + len(shown)])),
                       *(f"{n}={v}" for n, v in fixed.items())])
    code, out, err = run(capsys, "compile", "--config", config, "--shape", "D=64", *extra)
    assert code in (0, 3), err
    assert_whole(out)
    cubin = next(line for line in out.splitlines() if line.startswith("cubin"))
    assert re.fullmatch(r"cubin +/\S+/[0-9a-f]{64}/kernel\.cubin", cubin), out   # whole: it copies
    assert not any(line.rstrip().endswith("=") for line in out.splitlines())


def test_an_export_of_both_families_reads_whole_at_80_columns(db, cli80, capsys):
    header = cli80 / "both.h"
    code, out, err = run(capsys, "export", "--study", "hop", "--study", "fc", "--output", header, "--storage", db)
    assert code == 0, err
    assert_whole(out)
    for space in (load_space(GRID), load_space(None)):
        assert_legend(out, space)
    words = " ".join(out.split())                     # the title wraps with the folder's length
    assert "hopper (1 row)" in out and "flashcore (1 row)" in out and "(2 configs)" in words
    assert "S≤ = the max seqlen_k a row serves" in out


def test_headers_do_not_depend_on_the_width(db, cli80, capsys, monkeypatch):
    heads = {}
    for width in (80, 120, 200):
        monkeypatch.setenv("COLUMNS", str(width))
        code, out, err = run(capsys, "show", "--study", "hop", "--storage", db)
        assert code == 0, err
        lines = out.splitlines()
        rule = next(i for i, line in enumerate(lines) if line.startswith("───"))
        heads[width] = lines[rule - 1].split()
        assert_whole(out, width)
    assert heads[80] == heads[120] == heads[200]
    assert heads[80][:4] == ["#", "BN", "CW", "STAG"]


def test_wrap_breaks_at_word_boundaries_and_legend_never_splits_a_pair():
    config = ("BLOCK_N=128,CONSUMER_WGS=3,EXP_EMU=0,OVERLAP=1,PINGPONG=1,REG_CONS=160,REG_PROD=32,"
              "RESCALE_LOG2=8,SCHED=2,STAGES=2")
    lines = columns.wrap(f"#17 COMPLETE {config}: 591.4 µs, 464.8 TFLOPS", 40, 4)
    assert all(len(line) <= 40 for line in lines)
    assert re.sub(r"\s", "", "".join(lines)) == re.sub(r"\s", "", f"#17 COMPLETE {config}: 591.4 µs, 464.8 TFLOPS")
    pieces = [p for line in lines for p in re.split(r"[ ,]", line.strip()) if p]
    assert "REG_CONS=160" in pieces and "RESCALE_LOG2=8" in pieces               # no NAME=VALUE split
    path = "/home/user/.cache/evotuner/builds/9e/" + "9e" * 32 + "/kernel.cubin"
    assert columns.wrap(path, 80) == [path]                                       # a path is never broken
    assert columns.wrap(f"cubin at {path} built", 80, 2) == ["cubin at", "  " + path, "  built"]
    hint = "`evotuner bench --study s --storage sqlite:////a/b.db`"
    assert columns.wrap(f"re-time: {hint}, or resume", 40, 4) == ["re-time:", "    " + hint + ",", "    or resume"]
    assert columns.wrap(f"see {hint}.", 80) == [f"see {hint}."]                    # it fits: one line
    assert columns.wrap("an odd ` stays a word", 12) == ["an odd `", "stays a word"]
    relative = "out/" + "reports_" * 6 + "/history.png"                             # relative: whole too
    assert columns.wrap(f"wrote {relative}", 40) == ["wrote", relative]
    assert not columns.whole_unit("B=1,H=32/8,S=4096,D=128")                        # a shape, not a path
    kernel = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"
    lines = columns.wrap(f"SDPA = default backend: {kernel}", 80, 2)
    assert all(len(line) <= 80 for line in lines) and lines[0].endswith("_")       # after an underscore
    assert "".join(line.strip() for line in lines).endswith(kernel)
    short = columns.headers(["BLOCK_N", "CONSUMER_WGS", "OVERLAP", "PINGPONG", "REG_CONS", "MIN_BLOCKS"])
    for width in range(24, 60):
        text = "\n".join(columns.legend_lines(short, width, ["S≤ = the max seqlen_k a row serves"]))
        assert all(len(line) <= width for line in text.splitlines())
        for n, s in short.items():
            assert s == n or any(f"{s} = {n}" in line for line in text.splitlines()), (width, text)


def test_a_table_too_wide_for_the_terminal_stacks_its_groups_instead_of_cutting():
    cols = [columns.Col("#", right=True), *(columns.Col(f"P{i}", right=True, group=1) for i in range(12)),
            columns.Col("µs", right=True, group=2)]
    rows = [["12", *(str(100 + i) for i in range(12)), "579.6"]]
    lines = [line.plain for line in columns.table_lines(cols, rows, 40, notes=["a reason " * 8])]
    assert all(len(line) <= 40 for line in lines), lines
    cells = " ".join(lines).split()
    assert all(str(100 + i) in cells for i in range(12)) and "579.6" in cells and "12" in cells
    assert sum(1 for line in lines if line.strip().startswith("a reason") or "reason" in line) >= 2


def test_profiles_in_show_and_report_read_whole_at_80_columns(db, cli80, capsys):
    """ncu figures of two configs and SDPA's kernel (real saved ncu output) beside each other:
    the subjects that do not fit make a second table that repeats the figure names."""
    import shutil

    from evotuner.storage import StudyStore, diagnostics
    from evotuner.tools import ncu

    copy = cli80 / "profiled.db"
    shutil.copy(db.removeprefix("sqlite:///"), copy)
    url = f"sqlite:///{copy}"
    saved = DATA / "tools" / "ncu"
    cfg = ncu.combine(ncu.parse_raw_csv((saved / "flashcore_d64_b16h16s2048.csv").read_text()))
    sdpa = ncu.combine(ncu.parse_raw_csv((saved / "sdpa_cudnn_d64_b16h16s2048.csv").read_text()))
    with StudyStore(url) as store:
        best = sorted((t for t in store.summary("hop").trials if t.state == "COMPLETE"), key=lambda t: t.value)
        for trial in best[:2]:
            diagnostics.record_profile(store, "hop", trial.config, "config", problem={}, figures=cfg, seconds=10.5)
        diagnostics.record_profile(store, "hop", "sdpa_default", "sdpa", problem={}, figures=sdpa, seconds=9.9)
    code, out, err = run(capsys, "show", "--study", "hop", "--storage", url)
    assert code == 0, err
    assert_whole(out)
    assert "ncu profiles" in out and "config 2" in out and "SDPA" in out
    words = re.sub(r",\s+", ",", " ".join(out.split()))          # the legend's configs wrap after a comma
    assert f"config 1 = {best[0].config}" in words
    code, out, err = run(capsys, "report", "--study", "hop", "--output", cli80 / "rep", "--storage", url)
    assert code == 0, err
    assert_whole(out)


def test_the_best_table_marks_timings_racing_stopped_early() -> None:
    """A stopped trial's median is of fewer repetitions: the table says so, with a legend line."""
    from types import SimpleNamespace

    from evotuner import cli_render
    from evotuner.storage.records import TrialRecord

    def rec(number: int, value: float, stopped: bool) -> TrialRecord:
        attrs = {"stopped_early": {"repetitions": 32}} if stopped else {}
        return TrialRecord(number=number, state="COMPLETE", value=value, params={"BLOCK_M": 64, "BLOCK_N": 64},
                           tflops=100.0, attrs=attrs)

    summary = SimpleNamespace(trials=(rec(0, 100.0, False), rec(1, 120.0, True)))
    text = "\n".join(line.plain for line in cli_render._top_table(summary, 10, {"sdpa_default": 110.0}))
    assert "120.0*" in text and "100.0*" not in text
    assert "stopped early (racing)" in text
    plain = "\n".join(line.plain for line in cli_render._top_table(
        SimpleNamespace(trials=(rec(0, 100.0, False),)), 10, {}))
    assert "*" not in plain and "racing" not in plain


def test_a_hopper_config_beside_its_figures_takes_one_line_at_80_columns(monkeypatch) -> None:
    """hopper.toml's twelve and hopper_split.toml's fourteen parameters (four of them fixed
    there, named once under the table instead of a column each), trial numbers past 9: the
    parameter columns stand one space apart rather than stacking each row's figures on a
    second line; a table that fits with two spaces keeps them."""
    from types import SimpleNamespace

    import io

    from rich.console import Console

    from evotuner import cli_render
    from evotuner.cli_options import consoles
    from evotuner.storage.records import TrialRecord

    monkeypatch.setattr(consoles, "out", Console(file=io.StringIO(), width=80), raising=False)

    def table(space_file: str) -> list[str]:
        space = load_space(ROOT / "search_spaces" / space_file)
        params = {p.name: max(p.values) for p in space.params}
        trials = tuple(TrialRecord(number=n, state="COMPLETE", value=577.9 + n, params=dict(params), tflops=475.6,
                                   attrs={}) for n in range(40, 52))
        lines = cli_render._top_table(SimpleNamespace(trials=trials), 10, {"sdpa_default": 600.5}, space)
        return [line.plain for line in lines]

    for space_file in ("hopper.toml", "hopper_split.toml"):
        lines = table(space_file)
        text = "\n".join(lines)
        assert_whole(text)
        rows = [line for line in lines if re.match(r"^\d\d ", line)]
        assert len(rows) == 10 and all(line.rstrip().endswith("x") for line in rows), text   # figures on the row
        head = next(line for line in lines if line.lstrip().startswith("# "))
        assert head.split()[:3] == ["#", "BN", "CW"] and head.rstrip().endswith("vs SDPA"), head
        assert "  vs SDPA" in head                         # the figures keep their two spaces
        if space_file == "hopper_split.toml":             # its one-value knobs: no column, one line
            assert "SCHE" not in head and "CLUS" not in head, head
            assert "every config here: SCHED=0, EXP_EMU=0, CLUSTER=1" in " ".join(lines), text
    grid = "\n".join(table("hopper_grid.toml"))
    assert "  BN  CW  STAG" in grid                        # fits as it was: two spaces


def test_tight_columns_fall_back_to_stacking_when_one_space_is_not_enough() -> None:
    cols = [columns.Col("#", right=True), *(columns.Col(f"P{i}", right=True, group=1, tight=True) for i in range(12)),
            columns.Col("µs", right=True, group=2)]
    row = ["12", *(str(100 + i) for i in range(12)), "579.6"]
    one = [line.plain for line in columns.table_lines(cols, [row], 60)]
    assert len(one) == 3 and "100 101 102" in one[2] and one[2].endswith("579.6")   # head, rule, one row
    stacked = [line.plain for line in columns.table_lines(cols, [row], 40)]
    assert all(len(line) <= 40 for line in stacked) and len(stacked) > 3
    assert "100  101" in " ".join(stacked)                 # stacked rows keep two spaces


def test_a_unit_stays_with_its_number_when_a_line_wraps() -> None:
    line = "SDPA baselines: sdpa_default 250.0 µs, sdpa_flash 240.0 µs, sdpa_efficient 300.0 µs"
    for width in range(30, 90):
        lines = columns.wrap(line, width, 4)
        assert all(len(part) <= width for part in lines), (width, lines)
        assert not any(re.match(r"\s*µs", part) for part in lines), (width, lines)
        assert " ".join(" ".join(lines).split()) == line
    split = columns.wrap("time split: baselines 0.0 s, sampler 1.4 s, waiting on builds 11.4 s, gate 0.0 s, "
                         "measuring 0.0 s, recording 0.6 s", 80, 4)
    assert not any(re.match(r"\s*s,?$", part.split()[0] if part.split() else "") for part in split), split
    assert columns.wrap("ends at 5 s", 8) == ["ends at", "5 s"]
