"""What every CLI module shares: the typer ``app``, the ``Annotated`` option aliases, the two
consoles, and opening the study database. :mod:`evotuner.cli` (commands and the error
boundary) and :mod:`evotuner.cli_diagnostics` (check / profile) both import it, never each
other's internals, so the CLI has no import cycle."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from evotuner import session
from evotuner.errors import EvotunerError, ShapeError
from evotuner.numbers import real
from evotuner.problem import DTYPES, Shape, parse_shape_values
from evotuner.storage.connect import DEFAULT_URL, ENV_VAR
from evotuner.textsafe import for_terminal

#: The study database when neither --storage nor $EVOTUNER_STORAGE names one (filled in by
#: evotuner.storage.connect.resolve, the one place that does).
DEFAULT_STORAGE = DEFAULT_URL
STORAGE_ENV = ENV_VAR

app = typer.Typer(
    name="evotuner",
    help="Optuna-driven autotuner for fused attention CUDA kernels on NVIDIA Hopper (sm_90a): "
         "the hopper (wgmma + TMA) and FlashCore (mma.sync) kernel families.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# -- shared options ------------------------------------------------------------------------

def _finite(lo: float, hi: float) -> Any:
    """A typer callback: the option's value is a finite number in [lo, hi], or a usage error
    naming the option (typer's own min= lets ``inf`` and ``nan`` through)."""

    def check(ctx: typer.Context, param: Any, value: float | None) -> float | None:
        if value is None:
            return None
        try:
            return real(value, param.opts[0], lo=lo, hi=hi)
        except EvotunerError as exc:
            raise typer.BadParameter(exc.message.split(": ", 1)[-1]) from None

    return check


#: The longest --stale-after (a day) and --budget (an hour) accepted.
MAX_STALE_AFTER_S = 86400.0
MAX_BUDGET_S = 3600.0
#: The longest --timeout of check/profile (a day): every tool run is killed by some deadline.
MAX_TOOL_TIMEOUT_S = 86400.0


def _study_name(ctx: typer.Context, param: Any, value: Any) -> Any:
    """A study name is UTF-8 text. Under a C locale Python decodes the argument's bytes as
    ASCII (what is left over as surrogate escapes): bytes that are UTF-8 are read as such;
    bytes that are not (``$'caf\\xe9'``) cannot be stored in the database and are refused
    naming the option."""
    names = [value] if isinstance(value, str) else list(value or [])
    out = []
    for name in names:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            try:
                raw = os.fsencode(name)
            except UnicodeEncodeError:
                raw = name.encode("utf-8", "surrogatepass")
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError:
                shown = raw.decode("utf-8", "backslashreplace")
                raise typer.BadParameter(f"'{shown}' holds bytes that are not UTF-8 text; "
                                         "give the name in UTF-8") from None
        if not name.strip():
            raise typer.BadParameter("the study name is empty" if not name else "the study name is only blanks")
        out.append(name)
    return out[0] if isinstance(value, str) else out


StudyOpt = Annotated[str, typer.Option("--study", callback=_study_name,
                                       help="Study name (one study = one problem + one space).")]
StudiesOpt = Annotated[list[str], typer.Option("--study", callback=_study_name,
                                               help="Study to export; repeat for several.")]


def _storage_given(ctx: typer.Context, param: Any, value: str | None) -> str | None:
    """--storage as given: an empty one (``--storage "$DB"`` with DB unset) is a usage error, never
    the default database in the current folder (an empty $EVOTUNER_STORAGE is unset to click)."""
    if value is not None and not value.strip():
        raise typer.BadParameter("the database URL is empty")
    return value


StorageOpt = Annotated[
    Optional[str],
    typer.Option("--storage", envvar=STORAGE_ENV, show_envvar=True, callback=_storage_given,
                 help=f"SQLAlchemy URL of the study database [default: {DEFAULT_STORAGE}]."),
]


def _shape_given(require: tuple[str, ...] | None) -> Any:
    """A typer callback: a malformed --shape (a key or value it cannot read, a size below 1, a head
    dim no family takes, HKV not dividing H; with ``require``, a missing dimension) is a usage error
    naming the key the user wrote. ``require`` None (search, where --lengths gives B and S): a
    shape is checked whole once it names D; a missing dimension is the command's error."""

    def check(ctx: typer.Context, param: Any, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            values = parse_shape_values(value)
            if require is not None or "D" in values:
                Shape.parse(value, require=require or ())
        except ShapeError as exc:
            what = exc.message.removeprefix("--shape: ").removeprefix("shape: ")
            raise typer.BadParameter(f"{what} ({exc.remedy})" if exc.remedy else what) from None
        return value

    return check


ShapeOpt = Annotated[str, typer.Option(
    "--shape", callback=_shape_given(None),
    help="Problem shape B=..,H=..,S=..,D=.. (SQ/SK may replace S; HKV=.. key/value heads for GQA/MQA); with "
         "--lengths only H=..,D=.. (and HKV).")]
LengthsOpt = Annotated[Optional[str], typer.Option(
    "--lengths", help="Tune for a packed variable-length batch (flash_attention_varlen) of these sequence lengths: "
                      "a list 128,4096,77 (0: an empty sequence), random:N:LO..HI[:seed=S] (N lengths drawn "
                      "uniformly from LO..HI, seed 0 unless given; the study keeps what was drawn), or @FILE (a "
                      "recorded batch: lengths separated by commas, spaces or newlines). The number of sequences "
                      "and the longest lengths come from them, so --shape names H and D only.")]
LengthsKOpt = Annotated[Optional[str], typer.Option(
    "--lengths-k", help="The key lengths of the --lengths sequences, spelled the same way [default: as the query "
                        "lengths].")]
VarlenOpt = Annotated[bool, typer.Option(
    "--varlen", help="Build the packed variable-length kernel (flash_attention_varlen's, hopper family).")]
ResumeShapeOpt = Annotated[
    Optional[str], typer.Option("--shape", callback=_shape_given(("B", "H", "S", "D")),
                                help="Must equal the study's shape (resume reads it from the study).")
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help=f"Element type: {' or '.join(DTYPES)}.")]
CausalOpt = Annotated[bool, typer.Option("--causal", help="Causal (top-left) masking, as SDPA's is_causal.")]
TrialsOpt = Annotated[int, typer.Option("--trials", min=1, help="Finished trials the study should hold in total.")]
ResumeTrialsOpt = Annotated[
    Optional[int],
    typer.Option("--trials", min=1, help="Finished trials in total [default: the study's count + 32]."),
]


def _sampler_given(ctx: typer.Context, param: Any, value: str | None) -> str | None:
    """A typer callback: a sampler name evotuner does not know is a usage error naming --sampler
    (gp where it is not installed is left to the search, which says what it needs)."""
    from evotuner.propose import SAMPLERS

    if value is not None and value not in (*SAMPLERS, "gp"):
        raise typer.BadParameter(f"unknown sampler {value!r} (use one of {', '.join(SAMPLERS)})")
    return value


SamplerOpt = Annotated[
    Optional[str], typer.Option("--sampler", callback=_sampler_given,
                                help="Optuna sampler: tpe, guided, tpe-masked, nsga2, cmaes, random, grid (gp "
                                     "where available) [default: the kernel family's: tpe, guided for hopper].")
]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1,
                                      help="Sampler seed (0 to 2**32-1); the same seed reproduces a study.")]
JobsOpt = Annotated[
    Optional[int], typer.Option("--jobs", min=1, help="Parallel nvcc builds [default: the number of CPUs].")
]
#: The packaged spaces ``--space`` takes by name (evotuner.session.packaged_spaces; a test keeps them equal).
PACKAGED_SPACES = "flashcore (also named default), hopper, hopper_d96, hopper_grid, hopper_split, hopper_wide"
SpaceOpt = Annotated[Optional[Path], typer.Option(
    "--space", help=f"Search-space TOML file, or a packaged space by name: {PACKAGED_SPACES} [default: an "
                    "existing study's own space, else the one the --replay sweep was recorded with, else the "
                    "space of the family evotuner.flash_attention runs for the problem].")]
ResumeSpaceOpt = Annotated[Optional[Path], typer.Option(
    "--space", help="Must equal the study's space (resume reads it from the study): a TOML file or a packaged "
                    "space's name.")]
CompileSpaceOpt = Annotated[Optional[Path], typer.Option(
    "--space", help=f"Search-space TOML file, or a packaged space by name: {PACKAGED_SPACES} [default: the "
                    "packaged space of the family whose parameters --config names that takes the config].")]
DiagSpaceOpt = Annotated[Optional[Path], typer.Option(
    "--space", help=f"With --config and no --study: a search-space TOML file, or a packaged space by name: "
                    f"{PACKAGED_SPACES} [default: the packaged space of the family whose parameters --config "
                    "names]. With --study it must equal the study's space.")]
FamilyOpt = Annotated[Optional[str], typer.Option(
    "--family", help="Kernel family to tune (its packaged space): hopper or flashcore [default: the family "
                     "evotuner.flash_attention runs for the problem].")]
ReplayOpt = Annotated[
    Optional[Path],
    typer.Option("--replay", help="Answer builds and measurements from a recorded sweep CSV (scripts/sweep.py); needs no GPU or nvcc."),
]
def _path_given(ctx: typer.Context, param: Any, value: str | None) -> str | None:
    """An output path as given (text, so ``./-`` and a trailing ``/`` survive): an empty one
    (``-o "$DIR"`` with DIR unset) is a usage error, never the current folder."""
    if value is not None and not value.strip():
        raise typer.BadParameter("the path is empty")
    return value


ReportDirOpt = Annotated[str, typer.Option(
    "--output", "-o", callback=_path_given,
    help="Folder for the report's PNG (and HTML) files, report.json and, when the study has profiles, "
         "ncu_profiles.md.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
TopOpt = Annotated[int, typer.Option("--top", min=1, help="How many of the best trials to list.")]
OutputOpt = Annotated[str, typer.Option("--output", "-o", callback=_path_given, help="The C++ header to write.")]
ConfigOpt = Annotated[str, typer.Option("--config", help="Kernel config NAME=VALUE,... (every space parameter).")]
CompileShapeOpt = Annotated[str, typer.Option(
    "--shape", callback=_shape_given(("D",)),
    help="The head dim, D=64 (hopper: 64, 96, 128, 192, 256; FlashCore: 32, 64, 96, 128, 256): the only "
         "dimension compiled into the kernel; H=..,HKV=.. too for a config that packs grouped query heads "
         "(e.g. H=32,HKV=8,D=128).")]
#: ``compile``'s exit status when the config builds but the ptxas gate rejects it.
GATE_REJECTED_EXIT = 3
BenchTopOpt = Annotated[int, typer.Option("--top", min=1, help="How many of the best configs to re-measure.")]
BudgetOpt = Annotated[
    Optional[float],
    typer.Option("--budget", min=0.05, callback=_finite(0.05, MAX_BUDGET_S), help="Timing budget per config and per SDPA backend, seconds "
                                            "[default: the measure stage's, 0.5]."),
]
ToolTimeoutOpt = Annotated[float, typer.Option(
    "--timeout", min=10.0, callback=_finite(10.0, MAX_TOOL_TIMEOUT_S),
    help="Seconds one tool run may take (then it is killed), at most a day.")]
RequireCheckedOpt = Annotated[
    bool, typer.Option("--require-checked", help="Refuse (write nothing) unless every row passed `evotuner check`."),
]
RecordOpt = Annotated[
    bool, typer.Option("--record/--no-record", help="Store this run's device and SDPA baselines with the study."),
]
GpusOpt = Annotated[
    Optional[str],
    typer.Option("--gpus", help="Measure on these GPUs at once: one coordinator (sampler, budget, builds) and one "
                                "measure worker per GPU, e.g. 0,1,2,3 or all [default: GPU 0 only]."),
]
MixedGpusOpt = Annotated[
    bool, typer.Option("--mixed-gpus", help="Allow GPUs of different models in one study at once (--gpus, or "
                                            "other workers'); timings then mix."),
]
StaleAfterOpt = Annotated[
    Optional[float],
    typer.Option("--stale-after", min=0.5, callback=_finite(0.5, MAX_STALE_AFTER_S), help="Seconds without a heartbeat after which other workers on the "
                                               "study take this one's trials over [default: 60]."),
]
def _replay_delay(ctx: typer.Context, param: Any, value: str | None) -> str | None:
    """A typer callback: BUILD,MEASURE seconds, or a usage error (whether --replay is given is the command's check)."""
    if value is not None:
        try:
            session.parse_replay_delay(value)
        except EvotunerError as exc:
            what = exc.message.removeprefix("--replay-delay ")
            raise typer.BadParameter(f"{what} ({exc.remedy})" if exc.remedy else what) from None
    return value


ReplayDelayOpt = Annotated[
    Optional[str],
    typer.Option("--replay-delay", callback=_replay_delay, help="With --replay: seconds each build and each measurement takes, BUILD,MEASURE "
                                        "(rehearse timing-dependent setups such as several workers)."),
]
FullTimingOpt = Annotated[
    bool,
    typer.Option("--full-timing", help="Time every config for the whole budget (default: a config clearly slower "
                                       "than the study's best so far stops early; docs/measurement.md)."),
]
PairedRaceOpt = Annotated[
    Optional[bool],
    typer.Option("--paired-race/--no-paired-race",
                 help="Race each config against this run's fastest, timed alternately with it in the same window, "
                      "so a config 3% slower stops early too (default: on, unless --full-timing; "
                      "--no-paired-race races against the best figure alone, 15% margin; docs/measurement.md).",
                 show_default=False),
]
TransferOpt = Annotated[
    bool,
    typer.Option("--transfer/--no-transfer", help="A new study starts from the best configs of the nearest studies "
                                                  "of its kernel family and GPU model in the database."),
]


class _Out:
    """The two consoles; created per invocation so redirected streams are honoured."""

    out: Console
    err: Console


consoles = _Out()


#: A compiler's error line (nvcc ``gen.cu(8): error: ...``, gcc ``x.h:3:2: error: #error ...``,
#: ``error #20: ...``), which an include trace and a caret line surround.
_ERROR_LINE = re.compile(r"(?:^|[\s):])(?:fatal )?error(?: #[\w-]+)?:")


def one_line(text: str | None) -> str:
    """A message of several lines in one: its first compiler error line where it has one (not
    the include trace before it), else its first and last lines."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    error = next((line for line in lines if _ERROR_LINE.search(line)), None)
    if len(lines) > 1 and error is not None:
        return error
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def study_args(study: str, storage: str | None) -> str:
    """``--study NAME``, with ``--storage URL`` when the command was given a database other than
    the default, as a command printed for the user to paste names them (a password shown as
    ``***``)."""
    import shlex

    from evotuner.storage.urlmask import mask_url

    args = f"--study {shlex.quote(study)}"
    if storage is None or storage == DEFAULT_STORAGE:
        return args
    return f"{args} --storage {shlex.quote(mask_url(storage))}"   # every secret: user:***@, ?password=***


def say_skipped(studies: tuple[str, ...]) -> None:
    """Name on stderr each study ``export`` left out (its arch is not the header's)."""
    for skipped in studies:
        consoles.err.print(f"skipped: {for_terminal(skipped)}", markup=False, highlight=False)


def open_store(storage: str | None, *, must_exist: bool = False, read_only: bool = False) -> Any:
    return session.open_store(storage, must_exist=must_exist, read_only=read_only)


def _print_version(value: bool) -> None:
    if value:
        from evotuner import __version__

        consoles.out.print(f"evotuner {__version__}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _top(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="Print evotuner's version and exit.")] = False,
) -> None:
    """The options before a command (``--version``); the app's ``help`` above is its text."""
