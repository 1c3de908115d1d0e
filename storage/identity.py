"""A device's identity: which GPU model and setup a fingerprint names.

A study's ``evotuner_devices`` rows and the once-claim of its SDPA baselines
(:func:`evotuner.storage.claims.baselines_key`) are per identity."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

#: Device fingerprint keys containing one of these words change between runs on the
#: same GPU (clocks at start, temperature, power draw, performance state), also inside nested
#: readings; they are stored but not part of its identity.
VOLATILE_DEVICE_WORDS = ("clock", "temp", "power", "pstate")


def _stable(value: Any) -> Any:
    """``value`` without volatile keys, at every depth (the fingerprint nests nvidia-smi's readings)."""
    if isinstance(value, Mapping):
        return {k: _stable(v) for k, v in value.items() if not any(w in str(k).lower() for w in VOLATILE_DEVICE_WORDS)}
    return value


def device_identity(fingerprint: Mapping[str, Any]) -> str:
    """One GPU model and setup's key (a hash of its fingerprint without its volatile readings)."""
    blob = json.dumps(_stable(fingerprint), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
