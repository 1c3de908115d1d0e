"""evotuner's own tables (SQLAlchemy Core), beside Optuna's schema in the same database.

Every table is prefixed ``evotuner_`` so it can never collide with Optuna's
(``studies``, ``trials``, ``version_info``, ``alembic_version``, ...). The
schema is versioned in its own one-row table ``evotuner_schema_version``;
Optuna's version tables are never read or written by this module.

Changing the schema: add columns/tables, bump :data:`SCHEMA_VERSION`, and teach
:func:`evotuner.storage.connect.check_schema_version` how to upgrade the older
layout. A database whose version is *newer* than :data:`SCHEMA_VERSION` is
refused before anything is written (an older evotuner must not guess at a
newer layout).
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

#: The layout version this evotuner writes and understands.
#: 1: studies, devices, builds, measurements, baselines.
#: 2: + evotuner_checks, evotuner_profiles (evotuner.storage.diagnostics; new tables only,
#:    so a version-1 database upgrades by creating them and bumping the version row).
#: 3: + evotuner_workers, evotuner_claims (evotuner.storage.claims / liveness: several workers
#:    on one study; new tables only, so versions 1 and 2 upgrade the same way).
#: 4: no new table or column: a study row whose optuna_study_id is CREATING is a creation
#:    under way (evotuner.storage.creation), which an older evotuner would read as a study,
#:    so it must refuse the database; older versions upgrade by bumping the version row.
SCHEMA_VERSION = 4

#: Every evotuner table name starts with this.
PREFIX = "evotuner_"

metadata = MetaData()

schema_version = Table(
    "evotuner_schema_version",
    metadata,
    Column("id", Integer, primary_key=True),  # always 1: one row
    Column("version", Integer, nullable=False),
    Column("evotuner_version", String(64), nullable=False),  # who last wrote the layout
    Column("updated_at", DateTime, nullable=False),
)

#: ``evotuner_studies.optuna_study_id`` of a study whose creation is under way: the row is
#: written first (it takes the name), Optuna's study next, and the id last. Optuna's ids
#: start at 1. A row left this way by a creator that died is cleared by the next one
#: (:func:`evotuner.storage.start.await_study`).
CREATING = 0

studies = Table(
    "evotuner_studies",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(512), nullable=False, unique=True),  # == Optuna's study_name
    Column("optuna_study_id", Integer, nullable=False),  # CREATING while the study is being created
    Column("problem_json", Text, nullable=False),  # Problem.as_dict(): shape, dtype, causal
    Column("space_name", String(256), nullable=False),
    Column("space_fingerprint", String(128), nullable=False),
    Column("space_text", Text, nullable=False),  # the space file as it was when the study began
    Column("kernel_family", String(128), nullable=False),
    Column("source_hash", String(128), nullable=False),  # hash of the kernel sources
    Column("sampler", String(64), nullable=False),
    Column("seed", Integer, nullable=True),
    Column("created_at", DateTime, nullable=False),
    Column("evotuner_version", String(64), nullable=False),
    Column("nvcc_version", String(256), nullable=False),
)

devices = Table(
    "evotuner_devices",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("study_id", Integer, ForeignKey("evotuner_studies.id"), nullable=False),
    # sha256 of the fingerprint without its volatile keys (clocks): the device's identity
    Column("identity", String(64), nullable=False),
    Column("fingerprint_json", Text, nullable=False),  # the latest full fingerprint seen
    Column("first_seen", DateTime, nullable=False),
    Column("last_seen", DateTime, nullable=False),
    UniqueConstraint("study_id", "identity", name="uq_evotuner_devices_study_identity"),
)

builds = Table(
    "evotuner_builds",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("study_id", Integer, ForeignKey("evotuner_studies.id"), nullable=False),
    Column("trial_number", Integer, nullable=False),
    Column("config", String(512), nullable=False),  # str(KernelConfig)
    Column("build_key", String(128), nullable=False),
    Column("artifact_sha256", String(64), nullable=True),
    Column("ok", Boolean, nullable=False),
    Column("cached", Boolean, nullable=False),
    Column("seconds", Float, nullable=False),
    Column("registers", Integer, nullable=True),
    Column("spill_stores", Integer, nullable=True),
    Column("spill_loads", Integer, nullable=True),
    Column("stack", Integer, nullable=True),
    Column("smem", Integer, nullable=True),
    Column("barriers", Integer, nullable=True),
    Column("gate_passed", Boolean, nullable=True),  # None: the gate did not run (build failed)
    Column("gate_reason", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("log_tail", Text, nullable=False),
    Column("recorded_at", DateTime, nullable=False),
    UniqueConstraint("study_id", "trial_number", name="uq_evotuner_builds_study_trial"),
)

measurements = Table(
    "evotuner_measurements",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("study_id", Integer, ForeignKey("evotuner_studies.id"), nullable=False),
    Column("trial_number", Integer, nullable=False),
    Column("config", String(512), nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("median_us", Float, nullable=True),
    Column("p20_us", Float, nullable=True),
    Column("p80_us", Float, nullable=True),
    Column("tflops", Float, nullable=True),
    Column("max_error", Float, nullable=True),
    Column("tolerance", Float, nullable=True),
    Column("repetitions", Integer, nullable=True),
    Column("failure_kind", String(32), nullable=True),
    Column("failure_reason", Text, nullable=True),
    Column("measured_at", DateTime, nullable=False),
    UniqueConstraint("study_id", "trial_number", name="uq_evotuner_measurements_study_trial"),
)

baselines = Table(
    "evotuner_baselines",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("study_id", Integer, ForeignKey("evotuner_studies.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("evotuner_devices.id"), nullable=True),  # None: no device
    Column("problem_json", Text, nullable=False),
    Column("backend", String(64), nullable=False),
    Column("median_us", Float, nullable=True),  # None: the backend cannot run this shape
    Column("measured_at", DateTime, nullable=False),
)

#: One row per worker process that joined a study (see evotuner.storage.liveness). Times are
#: the *database's* clock in epoch seconds, so hosts with skewed clocks judge staleness alike.
workers = Table(
    "evotuner_workers",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("study_id", Integer, ForeignKey("evotuner_studies.id"), nullable=False),
    Column("host", String(256), nullable=False),       # hostname, for people
    Column("host_key", String(256), nullable=False),   # boot id + pid namespace: "same machine" test
    Column("pid", Integer, nullable=False),
    Column("proc_start", String(64), nullable=False),  # the process's start tick (pid reuse)
    Column("seat", Integer, nullable=True),             # 0, 1, ...: which derived seed it runs
    Column("seed", Integer, nullable=True),             # the sampler seed this worker runs
    Column("device", Text, nullable=True),              # device name/index it measures on (JSON)
    Column("state", String(16), nullable=False),        # live | done | dead
    Column("stale_after", Float, nullable=False),       # seconds without a heartbeat => dead
    Column("started", Float, nullable=False),
    Column("heartbeat", Float, nullable=False),
    Column("ended", Float, nullable=True),
    Column("reason", Text, nullable=True),              # why it ended (done, reaped: ...)
)

#: Claims: one row per (study, key) decides who does a thing once. Keys: ``slot:<id>``
#: (one finished trial of the budget), ``config:<config>`` (who builds and measures a
#: config), ``seat:<k>`` (a worker's derived seed), ``baselines:<device>``, ``start``.
claims = Table(
    "evotuner_claims",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("study_id", Integer, ForeignKey("evotuner_studies.id"), nullable=False),
    Column("kind", String(16), nullable=False),         # slot | config | seat | once
    Column("key", String(600), nullable=False),
    Column("worker_id", Integer, ForeignKey("evotuner_workers.id"), nullable=True),
    Column("trial_number", Integer, nullable=True),
    Column("state", String(8), nullable=False),         # held | done
    Column("created", Float, nullable=False),
    UniqueConstraint("study_id", "key", name="uq_evotuner_claims_study_key"),
)

Index("ix_evotuner_workers_study", workers.c.study_id, workers.c.state)
Index("ix_evotuner_claims_worker", claims.c.worker_id, claims.c.state)
Index("ix_evotuner_claims_kind", claims.c.study_id, claims.c.kind, claims.c.state)
Index("ix_evotuner_baselines_study", baselines.c.study_id, baselines.c.measured_at)
Index("ix_evotuner_devices_study", devices.c.study_id, devices.c.last_seen)

assert all(t.startswith(PREFIX) for t in metadata.tables), "every evotuner table is prefixed"
