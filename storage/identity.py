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


#: Fingerprint keys that name one card, not its model and setup: cards of one model in one
#: host differ only in these, and their timings compare (``StudyStore.record_device``'s rule).
CARD_KEYS = ("device_index", "uuid", "pci.bus_id", "serial")


def setup_identity(fingerprint: Mapping[str, Any]) -> str:
    """The device identity without the card: equal for GPUs of one model, driver and stack."""
    def strip(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: strip(v) for k, v in value.items() if str(k).lower() not in CARD_KEYS}
        return value

    return device_identity(strip(fingerprint))
