"""One rule for numbers that come from outside: finite, of the right type, in range.

Numbers enter evotuner through command-line options (``--replay-delay``,
``--stale-after``, ``--budget``), recorded sweeps (timings, TFLOPS, baselines,
ptxas figures) and database rows. ``float("nan")``, ``float("inf")``, ``1e400`` and
``true`` all parse as numbers in Python and JSON; past this module none of them
does. Every check raises an :class:`~evotuner.errors.EvotunerError` (or the subclass
the caller names) that says which input, what it holds, and the range.

Output follows the same rule: :func:`json_safe` turns a value that is not finite into
``null``, so ``evotuner show --json`` is strict JSON (no ``NaN``/``Infinity``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from evotuner.errors import EvotunerError

#: The largest value of a C ``int32_t`` (kernel shape arguments and parameter values).
INT32_MAX = 2**31 - 1


def _range_text(lo: float | None, hi: float | None, above: float | None) -> str:
    parts = []
    if above is not None:
        parts.append(f"greater than {above:g}")
    if lo is not None:
        parts.append(f"at least {lo:g}")
    if hi is not None:
        parts.append(f"at most {hi:g}")
    return " and ".join(parts)


def real(value: Any, what: str, *, lo: float | None = None, hi: float | None = None,
         above: float | None = None, remedy: str | None = None,
         error: type[EvotunerError] = EvotunerError) -> float:
    """``value`` as a float when it is an int or float (not a bool), finite, and within
    ``[lo, hi]`` (``above``: strictly greater); else ``error`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{what}: {value!r} is not a number", remedy)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise error(f"{what}: {value!r} is not a finite number", remedy or f"give a number {_range_text(lo, hi, above)}")
    if (lo is not None and number < lo) or (hi is not None and number > hi) or (above is not None and not number > above):
        raise error(f"{what}: {value!r} is out of range (must be {_range_text(lo, hi, above)})", remedy)
    return number


def parse_real(text: str, what: str, **bounds: Any) -> float:
    """:func:`real` of ``text`` read as a number (``nan``, ``inf`` and words are refused)."""
    error = bounds.get("error", EvotunerError)
    try:
        value = float(text.strip())
    except (ValueError, AttributeError):
        raise error(f"{what}: {text!r} is not a number", bounds.get("remedy")) from None
    if not math.isfinite(value):   # name what was typed (1e400 reads as inf)
        raise error(f"{what}: {text.strip()!r} is not a finite number", bounds.get("remedy"))
    return real(value, what, **bounds)


def whole(value: Any, what: str, *, lo: int | None = None, hi: int | None = INT32_MAX,
          remedy: str | None = None, error: type[EvotunerError] = EvotunerError) -> int:
    """``value`` when it is an int (not a bool) within ``[lo, hi]``; else ``error`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{what}: {value!r} is not an integer", remedy)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise error(f"{what}: {value} is out of range (must be {_range_text(lo, hi, None)})", remedy)
    return value


def parse_whole(text: str, what: str, **bounds: Any) -> int:
    """:func:`whole` of ``text`` read as a decimal integer."""
    error = bounds.get("error", EvotunerError)
    try:
        value = int(text.strip())
    except (ValueError, AttributeError):
        if not isinstance(text, str):
            raise error(f"{what}: {text!r} is not an integer", bounds.get("remedy")) from None
        if text.strip().isdecimal():                                 # past the 4300 digits int() reads
            raise error(f"{what} has {len(text.strip())} digits", bounds.get("remedy")) from None
        raise error(f"{what}: {text[:40]!r} is not an integer", bounds.get("remedy")) from None
    return whole(value, what, **bounds)


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else None (reading rows)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None, at every depth
    (for ``json.dumps(..., allow_nan=False)``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
