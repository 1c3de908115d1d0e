"""The study's diagnostics: compute-sanitizer verdicts (``evotuner check``) and
Nsight Compute figures (``evotuner profile``), in two ``evotuner_`` tables.

Added in schema version 2 (see :data:`evotuner.storage.schema.SCHEMA_VERSION`):
both tables are new, so a version-1 database is upgraded by creating them
(``StudyStore`` does it on open) and bumping the version row; nothing older is
rewritten. Rows are never updated: every run appends, and readers take the
latest row per (config, tool) / (subject).
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Boolean, Column, DateTime, Float, ForeignKey, Index, Integer, String, Table, Text, insert, select

from evotuner.storage import schema

checks = Table(
    "evotuner_checks",
    schema.metadata,
    Column("id", Integer, primary_key=True),
    Column("study_id", Integer, ForeignKey("evotuner_studies.id"), nullable=False),
    Column("config", String(512), nullable=False),        # str(KernelConfig)
    Column("tool", String(32), nullable=False),           # memcheck, racecheck, synccheck, initcheck
    Column("passed", Boolean, nullable=False),
    Column("errors", Integer, nullable=False),
    Column("warnings", Integer, nullable=False),
    Column("complete", Boolean, nullable=False),          # the tool's summary was read (not killed)
    Column("findings_json", Text, nullable=False),        # the first findings, one line each
    Column("shapes_json", Text, nullable=False),          # the ragged shapes run
    Column("seconds", Float, nullable=False),
    Column("tool_version", String(256), nullable=False),
    Column("checked_at", DateTime, nullable=False),
)

profiles = Table(
    "evotuner_profiles",
    schema.metadata,
    Column("id", Integer, primary_key=True),
    Column("study_id", Integer, ForeignKey("evotuner_studies.id"), nullable=False),
    Column("subject", String(512), nullable=False),       # str(KernelConfig), or an SDPA backend name
    Column("kind", String(16), nullable=False),           # "config" or "sdpa"
    Column("problem_json", Text, nullable=False),         # the shape profiled
    Column("figures_json", Text, nullable=False),         # evotuner.tools.ncu.combine()
    Column("seconds", Float, nullable=False),             # wall time of the ncu run
    Column("tool_version", String(256), nullable=False),
    Column("device", String(256), nullable=False),
    Column("profiled_at", DateTime, nullable=False),
)

Index("ix_evotuner_checks_study", checks.c.study_id, checks.c.config, checks.c.checked_at)
Index("ix_evotuner_profiles_study", profiles.c.study_id, profiles.c.subject, profiles.c.profiled_at)

#: Schema version that introduced these tables.
SINCE_VERSION = 2


@dataclass(frozen=True)
class CheckRecord:
    config: str
    tool: str
    passed: bool
    errors: int
    warnings: int
    complete: bool
    findings: tuple[str, ...]
    shapes: tuple[str, ...]
    seconds: float
    tool_version: str
    checked_at: _dt.datetime

    def as_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "passed": self.passed, "errors": self.errors, "warnings": self.warnings,
                "complete": self.complete, "findings": list(self.findings), "shapes": list(self.shapes),
                "seconds": round(self.seconds, 3), "tool_version": self.tool_version,
                "checked_at": self.checked_at.isoformat(timespec="seconds")}


@dataclass(frozen=True)
class ProfileRecord:
    subject: str
    kind: str
    problem: dict[str, Any] = field(hash=False)
    figures: dict[str, Any] = field(hash=False)
    seconds: float = 0.0
    tool_version: str = ""
    device: str = ""
    profiled_at: _dt.datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "kind": self.kind, "problem": dict(self.problem),
                "figures": dict(self.figures), "seconds": round(self.seconds, 3), "tool_version": self.tool_version,
                "device": self.device,
                "profiled_at": self.profiled_at.isoformat(timespec="seconds") if self.profiled_at else None}


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def _study_id(store: Any, s: Any, study: str) -> int:
    return int(store.study_row(s, study).id)   # StorageError naming the study when missing


def record_check(store: Any, study: str, config: str, tool: str, *, passed: bool, errors: int, warnings: int = 0,
                 complete: bool = True, findings: tuple[str, ...] | list[str] = (), shapes: tuple[str, ...] | list[str] = (),
                 seconds: float = 0.0, tool_version: str = "") -> None:
    """Append one tool's verdict on one config of ``study``."""
    with store.session() as s:
        s.execute(insert(checks).values(
            study_id=_study_id(store, s, study), config=str(config), tool=str(tool), passed=bool(passed),
            errors=int(errors), warnings=int(warnings), complete=bool(complete),
            findings_json=json.dumps([str(f)[:2000] for f in findings]), shapes_json=json.dumps(list(shapes)),
            seconds=float(seconds), tool_version=str(tool_version)[:256], checked_at=_now()))


def latest_checks(store: Any, study: str) -> dict[str, dict[str, CheckRecord]]:
    """config -> tool -> the latest verdict."""
    with store.session() as s:
        sid = _study_id(store, s, study)
        rows = s.execute(select(checks).where(checks.c.study_id == sid).order_by(checks.c.checked_at, checks.c.id)).all()
    out: dict[str, dict[str, CheckRecord]] = {}
    for r in rows:
        out.setdefault(r.config, {})[r.tool] = CheckRecord(
            config=r.config, tool=r.tool, passed=bool(r.passed), errors=int(r.errors), warnings=int(r.warnings),
            complete=bool(r.complete), findings=tuple(json.loads(r.findings_json or "[]")),
            shapes=tuple(json.loads(r.shapes_json or "[]")), seconds=float(r.seconds),
            tool_version=r.tool_version, checked_at=r.checked_at)
    return out


def verdict(by_tool: dict[str, CheckRecord] | None, required: tuple[str, ...]) -> str:
    """``passed`` (every required tool's latest run passed), ``failed`` (one did not) or
    ``unchecked`` (a required tool never ran on it)."""
    by_tool = by_tool or {}
    if any(not by_tool[t].passed for t in required if t in by_tool):
        return "failed"
    if all(t in by_tool for t in required):
        return "passed"
    return "unchecked"


def record_profile(store: Any, study: str, subject: str, kind: str, *, problem: dict[str, Any],
                   figures: dict[str, Any], seconds: float, tool_version: str = "", device: str = "") -> None:
    """Append one ncu profile (a config of ``study``, or an SDPA backend at its shape)."""
    if kind not in ("config", "sdpa"):
        raise ValueError(f"profile kind {kind!r}: config or sdpa")
    with store.session() as s:
        s.execute(insert(profiles).values(
            study_id=_study_id(store, s, study), subject=str(subject), kind=kind, problem_json=json.dumps(problem),
            figures_json=json.dumps(figures), seconds=float(seconds), tool_version=str(tool_version)[:256],
            device=str(device)[:256], profiled_at=_now()))


def latest_profiles(store: Any, study: str) -> dict[str, ProfileRecord]:
    """subject -> the latest profile (configs and SDPA backends)."""
    with store.session() as s:
        sid = _study_id(store, s, study)
        rows = s.execute(select(profiles).where(profiles.c.study_id == sid)
                         .order_by(profiles.c.profiled_at, profiles.c.id)).all()
    return {r.subject: ProfileRecord(subject=r.subject, kind=r.kind, problem=json.loads(r.problem_json),
                                     figures=json.loads(r.figures_json), seconds=float(r.seconds),
                                     tool_version=r.tool_version, device=r.device, profiled_at=r.profiled_at)
            for r in rows}
