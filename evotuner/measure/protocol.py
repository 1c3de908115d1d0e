"""The wire protocol between the search process and the GPU worker.

Framing: every message is ``MAGIC`` (4 bytes) + a big-endian u32 payload length
+ that many bytes of UTF-8 JSON. The magic makes garbage on the pipe (a stray
print, a crash banner) a :class:`ProtocolError` at the first byte instead of a
wait for a length that never arrives; ``MAX_FRAME`` bounds what a corrupt
length can ask the reader to buffer.

Messages are small frozen values with ``to_wire()``; a request is answered by
exactly one :class:`Reply`. A Measurement travels as a plain dict
(``measurement_from_wire`` checks it), a MeasureFailure as ``{kind, reason}``.

Requests (parent → worker), ``op`` first:

* ``init``        {device_index}: import torch, bind the device, create the context.
* ``ping``        {}: answered at once (liveness).
* ``fingerprint`` {}: the device fingerprint (``Reply.value`` is a dict).
* ``measure``     {cubin, entry, family, key, sha256, meta, problem, seed, budget_s, race}: gate + time;
  ``race`` is None or {incumbent_us, alpha, margin, min_reps, paired_margin, paired_reps,
  [incumbent_artifact: {cubin, entry, family, key, sha256, meta}, incumbent_artifact_us]}
  (evotuner/measure/racing.py):
  the timing may stop early once the config is clearly slower than the incumbent (in a
  paired race, than the incumbent's artifact timed alternately with it).
* ``baselines``   {problem, budget_s}: SDPA backends at the problem's shape (a packed
  problem: SDPA on its padded batch and on jagged nested tensors).
* ``sanitize``    {cubin, entry, key, meta, problem, shapes, seed}: run the kernel once per
  shape ([B, H, Sq, Sk]; D, dtype, causal from problem; a packed problem: once at ragged
  packed lengths) on fresh inputs, no timing; the
  worker runs under compute-sanitizer (``evotuner check``).
* ``profile``     {kind: config|sdpa, cubin, entry, key, meta, problem}: warm up, then one
  call between cudaProfilerStart/Stop; the worker runs under ncu (``evotuner profile``).
* ``shutdown``    {}: answered, then the worker exits 0.

``problem`` is ``Problem.as_dict()``: a packed problem's carries its sequence lengths
(``lengths_q``, ``lengths_k``), which the worker builds its packed inputs from.

Replies (worker → parent): ``{"ok": true, "value": ...}`` or
``{"ok": false, "failure": {"kind", "reason"}, "fatal": bool}``; ``fatal``
says the worker's CUDA context is lost and it exits after this reply.
"""

from __future__ import annotations

import json
import math
import os
import select
import struct
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from evotuner.measure.base import Measurement, MeasureFailure

MAGIC = b"EVT1"
_HEADER = struct.Struct(">4sI")
HEADER_LEN = _HEADER.size
#: A reply carries at most a fingerprint or a few numbers; 16 MiB is generous.
MAX_FRAME = 16 * 1024 * 1024

OPS = ("init", "ping", "fingerprint", "measure", "baselines", "sanitize", "profile", "shutdown")


class ProtocolError(Exception):
    """The byte stream is not a valid frame (bad magic, oversize, bad JSON)."""


class PipeClosed(Exception):
    """The other end closed the pipe (EOF) before a whole frame arrived."""


class FrameTimeout(Exception):
    """No whole frame arrived before the deadline."""


# --------------------------------------------------------------------- framing
def encode(message: dict[str, Any]) -> bytes:
    """One frame for ``message`` (NaN/Inf allowed: errors can be non-finite)."""
    payload = json.dumps(message, separators=(",", ":"), allow_nan=True).encode("utf-8")
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"message of {len(payload)} bytes exceeds MAX_FRAME={MAX_FRAME}")
    return _HEADER.pack(MAGIC, len(payload)) + payload


def decode_payload(payload: bytes) -> dict[str, Any]:
    try:
        message = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"frame payload is not UTF-8 JSON: {exc}; starts {payload[:60]!r}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"frame payload is a {type(message).__name__}, not an object")
    return message


def write_message(stream: BinaryIO, message: dict[str, Any]) -> None:
    stream.write(encode(message))
    stream.flush()


def read_message_blocking(stream: BinaryIO) -> dict[str, Any]:
    """Read one frame from a blocking stream (the worker's side). Raises PipeClosed at EOF."""
    header = _read_exact(stream, HEADER_LEN, at_start=True)
    length = _check_header(header)
    return decode_payload(_read_exact(stream, length, at_start=False))


def _read_exact(stream: BinaryIO, n: int, *, at_start: bool) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            where = "between frames" if at_start and got == 0 else f"after {got} of {n} bytes"
            raise PipeClosed(f"pipe closed {where}")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _check_header(header: bytes) -> int:
    magic, length = _HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {header!r} (expected {MAGIC!r}): garbage on the pipe")
    if length > MAX_FRAME:
        raise ProtocolError(f"frame length {length} exceeds MAX_FRAME={MAX_FRAME}")
    return length


class FrameReader:
    """Reads frames from a raw pipe fd with a deadline (the parent's side).

    Never blocks past the deadline: it ``select``s on the fd and reads what is
    there. Bytes after one frame stay buffered for the next.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray()

    def read(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            if len(self._buf) >= len(MAGIC) and not self._buf.startswith(MAGIC):
                raise ProtocolError(f"bad frame magic {bytes(self._buf[:16])!r}: garbage on the pipe")
            if len(self._buf) < len(MAGIC) and not MAGIC.startswith(bytes(self._buf)):
                raise ProtocolError(f"bad frame magic {bytes(self._buf)!r}: garbage on the pipe")
            if len(self._buf) >= HEADER_LEN:
                length = _check_header(bytes(self._buf[:HEADER_LEN]))
                if len(self._buf) >= HEADER_LEN + length:
                    payload = bytes(self._buf[HEADER_LEN:HEADER_LEN + length])
                    del self._buf[:HEADER_LEN + length]
                    return decode_payload(payload)
            left = deadline - time.monotonic()
            if left <= 0:
                raise FrameTimeout(f"no complete frame within {timeout_s:.1f} s ({len(self._buf)} bytes pending)")
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise PipeClosed(f"pipe closed with {len(self._buf)} bytes of a frame pending" if self._buf
                                 else "pipe closed between frames")
            self._buf += chunk


# -------------------------------------------------------------------- messages
@dataclass(frozen=True)
class Request:
    """A request: ``op`` plus its arguments (``args`` must be JSON values)."""

    op: str
    args: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown op {self.op!r}; one of {', '.join(OPS)}")

    def to_wire(self) -> dict[str, Any]:
        return {"op": self.op, **self.args}

    @classmethod
    def from_wire(cls, message: dict[str, Any]) -> "Request":
        op = message.get("op")
        if op not in OPS:
            raise ProtocolError(f"request has unknown op {op!r}")
        return cls(str(op), {k: v for k, v in message.items() if k != "op"})


def artifact_wire(artifact: Any) -> dict[str, Any]:
    """An :class:`~evotuner.compiler.result.Artifact` as a measure request names it (a
    paired race's ``incumbent_artifact``)."""
    return {"cubin": str(artifact.cubin), "entry": artifact.entry, "family": artifact.family, "key": artifact.key,
            "sha256": artifact.sha256, "meta": {str(k): int(v) for k, v in dict(artifact.meta).items()}}


def measure_request(cubin: str, entry: str, meta: dict[str, int], problem: dict[str, object],
                    seed: int, budget_s: float, key: str = "", sha256: str = "", family: str = "",
                    race: dict[str, Any] | None = None) -> Request:
    return Request("measure", {"cubin": cubin, "entry": entry, "family": family, "key": key, "sha256": sha256,
                               "meta": dict(meta),
                               "problem": dict(problem), "seed": int(seed), "budget_s": float(budget_s),
                               "race": dict(race) if race is not None else None})


@dataclass(frozen=True)
class Reply:
    ok: bool
    value: Any = None
    failure: MeasureFailure | None = None
    fatal: bool = False          # the worker exits after sending this reply

    @classmethod
    def success(cls, value: Any) -> "Reply":
        return cls(ok=True, value=value)

    @classmethod
    def fail(cls, kind: str, reason: str, *, fatal: bool = False) -> "Reply":
        return cls(ok=False, failure=MeasureFailure(kind, reason), fatal=fatal)

    def to_wire(self) -> dict[str, Any]:
        if self.ok:
            return {"ok": True, "value": self.value}
        assert self.failure is not None
        return {"ok": False, "failure": {"kind": self.failure.kind, "reason": self.failure.reason},
                "fatal": self.fatal}

    @classmethod
    def from_wire(cls, message: dict[str, Any]) -> "Reply":
        ok = message.get("ok")
        if ok is True:
            return cls.success(message.get("value"))
        if ok is False:
            failure = message.get("failure")
            if not isinstance(failure, dict):
                raise ProtocolError(f"failure reply without a failure object: {message!r:.200}")
            try:
                return cls.fail(str(failure.get("kind")), str(failure.get("reason", "")),
                                fatal=bool(message.get("fatal", False)))
            except ValueError as exc:
                raise ProtocolError(str(exc)) from None
        raise ProtocolError(f"reply has no boolean 'ok': {message!r:.200}")


# ---------------------------------------------------------------- measurements
#: Fields every measurement carries; the racing ones (``_RACE_FIELDS``) only when it raced.
_RACE_FIELDS = ("stopped_early", "planned_repetitions", "incumbent_us", "pairs", "pair_ratio")
_MEASUREMENT_FIELDS = tuple(f for f in Measurement.__dataclass_fields__ if f not in _RACE_FIELDS)


def measurement_from_wire(value: Any) -> Measurement:
    """A Measurement from the worker's dict; ProtocolError names a missing/bad field."""
    if not isinstance(value, dict):
        raise ProtocolError(f"measurement is a {type(value).__name__}, not an object")
    missing = [f for f in _MEASUREMENT_FIELDS if f not in value]
    if missing:
        raise ProtocolError(f"measurement lacks {', '.join(missing)}")
    try:
        figures: dict[str, Any] = {f: (int(value[f]) if f == "repetitions" else float(value[f]))
                                   for f in _MEASUREMENT_FIELDS}
        stopped = value.get("stopped_early", False)
        if not isinstance(stopped, bool):
            raise ProtocolError(f"measurement stopped_early={stopped!r} is not a boolean")
        planned, incumbent = value.get("planned_repetitions"), value.get("incumbent_us")
        pairs, ratio = value.get("pairs", 0), value.get("pair_ratio")
        if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 0:
            raise ProtocolError(f"measurement pairs={pairs!r} is not a count")
        m = Measurement(**figures, stopped_early=stopped,
                        planned_repetitions=int(planned) if planned is not None else None,
                        incumbent_us=float(incumbent) if incumbent is not None else None,
                        pairs=pairs, pair_ratio=float(ratio) if ratio is not None else None)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"measurement has a non-numeric field: {exc}") from None
    if m.pair_ratio is not None and not (math.isfinite(m.pair_ratio) and m.pair_ratio > 0 and m.pairs > 0):
        raise ProtocolError(f"measurement pair_ratio={m.pair_ratio!r} over {m.pairs} pairs is not a positive ratio")
    if not (math.isfinite(m.median_us) and m.median_us > 0):
        raise ProtocolError(f"measurement median_us={m.median_us!r} is not a positive number")
    if m.stopped_early and (m.planned_repetitions is None or m.incumbent_us is None
                            or not m.repetitions < m.planned_repetitions):
        raise ProtocolError(f"measurement stopped early at {m.repetitions} repetitions without fewer than "
                            f"planned ({m.planned_repetitions}) or an incumbent ({m.incumbent_us})")
    return m
