"""evotuner's vocabulary: the names every stage agrees on, in one place.

* the parameter encoding: every space parameter is an Optuna integer
  ``<NAME>_index`` into its ascending value list (:func:`param_key`,
  :func:`distributions`, :func:`config_from_params`, :func:`params_for`);
* the trial user attributes evotuner writes and the "interrupted" rule (a FAIL
  trial cut short by a dead process or Ctrl-C, not judged).

The proposal stage (propose, fresh), the record stage (storage), the loop, bench
and report import these from here, so none of them imports another for a name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from optuna.distributions import IntDistribution

from evotuner.config import KernelConfig
from evotuner.errors import SpaceError

if TYPE_CHECKING:   # the encoding reads a space; the record stage imports these names without it
    from evotuner.space import SearchSpace

# -- parameter encoding ------------------------------------------------------------------------

INDEX_SUFFIX = "_index"


def param_key(name: str) -> str:
    """The Optuna parameter name for space parameter ``name``."""
    return name + INDEX_SUFFIX


def distributions(space: SearchSpace) -> dict[str, IntDistribution]:
    """The Optuna distribution of every parameter (what ``suggest`` asks for)."""
    return {param_key(p.name): IntDistribution(0, len(p.values) - 1) for p in space.params}


def config_from_params(params: Mapping[str, int], space: SearchSpace) -> KernelConfig:
    """The config behind an Optuna trial's ``params`` (as ``suggest`` stored them)."""
    values = {}
    for p in space.params:
        key = param_key(p.name)
        if key not in params:
            raise SpaceError(
                f"trial parameters lack {key} (space {space.path})",
                "the study was made with another space file; resume it with the space it was created with",
            )
        index = params[key]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(p.values):
            raise SpaceError(
                f"trial parameter {key}={index!r} is not an index into {p.name}'s {len(p.values)} values"
                f" (space {space.path})",
                "the study was made with another space file; resume it with the space it was created with",
            )
        values[p.name] = p.values[index]
    extra = sorted(set(params) - {param_key(n) for n in space.names})
    if extra:
        raise SpaceError(
            f"trial parameter {extra[0]} is not in the space {space.path}",
            f"the space defines {', '.join(space.names)}",
        )
    return KernelConfig.of(values)


def params_for(config: KernelConfig, space: SearchSpace) -> dict[str, int]:
    """The inverse of ``config_from_params``: Optuna params for ``config``
    (for ``study.enqueue_trial`` or ``optuna.trial.create_trial``)."""
    space.validate(config)
    config = space.complete(config)   # a parameter left out at its family default
    return {param_key(p.name): p.index(config[p.name]) for p in space.params}


def config_of(params: Mapping[str, Any], space: SearchSpace) -> KernelConfig | None:
    """The config of a recorded trial: its values (the loop's ``config`` attr) or, for a
    trial recorded with the sampler's encoding only, decoded through the space."""
    if not params:
        return None
    if set(params) == set(space.names):
        return KernelConfig.of(params)
    return config_from_params(params, space)


# -- trial attributes and the "interrupted" rule ------------------------------------------------

#: Trial user attributes evotuner writes (optuna-dashboard shows them).
REASON_ATTR = "reason"          # why a trial is PRUNED or FAIL (one line)
GATE_ATTR = "gate"              # ptxas figures + gate verdict, see StudyStore.record_build
TFLOPS_ATTR = "tflops"          # on COMPLETE trials
DUPLICATE_ATTR = "duplicate_of" # trial number whose result this trial reuses
TRANSFER_ATTR = "transfer_sources"  # study attr: the studies that seeded it (evotuner/transfer.py)
CONFIG_ATTR = "config"          # the config's values (Optuna's params are the sampler's encoding)
DEVICE_ATTR = "device"          # which GPU measured it (name, index)
RECOVERED_ATTR = "recovered"    # told by the worker that reaped its dead measurer (why, in words)
#: On a COMPLETE trial whose timing racing stopped early (evotuner/measure/racing.py):
#: {"reps", "planned_reps", "median_us", "incumbent_us", "rule"}; its value is that median.
STOPPED_ATTR = "stopped_early"
#: A paired race's figures ({"pairs": n, "ratio": config/incumbent median ratio}), for every
#: measurement timed beside the incumbent (a stopped one's median is that ratio on the
#: incumbent's recorded scale).
PAIRED_ATTR = "paired"
#: A Measurement's figures a COMPLETE trial keeps as user attrs (its value is the median).
MEASURED_ATTRS = ("tflops", "max_error", "p20_us", "p80_us")
#: The reason a zombie trial (left RUNNING by a dead process) is failed with.
INTERRUPTED_REASON = "interrupted: the process running this trial died"
#: A FAIL trial whose reason starts with this was cut short (zombie, Ctrl-C), not judged:
#: its config does not count as finished.
INTERRUPTED_PREFIX = "interrupted"
#: Optuna trial states, by name, that count as "finished" for skipping a config.
FINISHED_STATES = ("COMPLETE", "PRUNED", "FAIL")


def is_interrupted(state: Any, reason: Any) -> bool:
    """True for a FAIL trial cut short (its reason starts with :data:`INTERRUPTED_PREFIX`)."""
    name = str(getattr(state, "name", state)).upper()
    return name == "FAIL" and isinstance(reason, str) and reason.startswith(INTERRUPTED_PREFIX)


def measure_failure_reason(kind: str, reason: str) -> str:
    """The ``reason`` of a trial whose measurement failed (a MeasureFailure's kind and text)."""
    return f"{kind}: {reason}"
