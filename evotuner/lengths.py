"""``--lengths``: the sequence lengths of a packed variable-length problem, from the command line.

Three spellings, each giving one length per sequence (0: an empty sequence):

* a list: ``128,4096,77,0,8192``;
* a seeded draw: ``random:N:LO..HI`` or ``random:N:LO..HI:seed=S`` -- N lengths drawn
  uniformly from LO..HI (both included) by Python's ``random.Random(S)`` (S from 0 to
  2**32-1, as ``--seed``; 0 when not given); the study stores the drawn lengths, so
  ``resume`` never draws again;
* a recorded batch: ``@FILE`` -- a text file of lengths separated by commas, spaces or
  newlines (``#`` starts a comment).

:func:`packed_problem` turns them, ``--lengths-k`` and the ``--shape`` without batch and
lengths (``H=32,HKV=8,D=128``) into a :class:`~evotuner.problem.Problem`.
"""

from __future__ import annotations

import os
import random
import re
import stat
from pathlib import Path

from evotuner.errors import ShapeError
from evotuner.family.registry import families
from evotuner.numbers import INT32_MAX, parse_whole
from evotuner.problem import MAX_SEQUENCES, Problem, Shape, number_text, parse_shape_values

_RANDOM = re.compile(r"^random:(?P<n>\d+):(?P<lo>\d+)\.\.(?P<hi>\d+)(?::seed=(?P<seed>\d+))?$")
#: The largest file ``@FILE`` reads (a recorded batch is a few numbers per sequence).
MAX_FILE_BYTES = 1 << 20
SPELLINGS = "a list 128,4096,77, random:16:128..8192:seed=0 (a seeded uniform draw), or @FILE (a recorded batch)"
#: The largest seed of a draw (``--seed``'s range too).
MAX_SEED = 2**32 - 1


def parse_lengths(text: str, option: str = "--lengths") -> tuple[int, ...]:
    """The lengths ``text`` gives (one of the three spellings); ShapeError naming ``option``."""
    spec = text.strip()
    if spec.startswith("random"):
        return _draw(spec, option)
    if spec.startswith("@"):
        if not spec[1:].strip():
            raise ShapeError(f"{option} {spec!r}: no file named after @", "write @FILE, e.g. @batch_lengths.txt")
        return _read_file(Path(spec[1:]), option)
    return _integers(spec.split(","), f"{option} {spec[:60]!r}")


def _draw(spec: str, option: str) -> tuple[int, ...]:
    m = _RANDOM.match(spec)
    if m is None:
        raise ShapeError(f"{option} {spec[:80]!r}: cannot read the draw", "write random:N:LO..HI[:seed=S], "
                         "e.g. random:16:128..8192:seed=0")
    what = f"{option} {spec[:80]!r}"
    n = _whole(m["n"], what, "N", MAX_SEQUENCES)
    lo, hi = _whole(m["lo"], what, "LO", INT32_MAX), _whole(m["hi"], what, "HI", INT32_MAX)
    seed = _whole(m["seed"] or "0", what, "the seed", MAX_SEED)
    if not 1 <= n <= MAX_SEQUENCES:
        raise ShapeError(f"{what}: {number_text(n)} sequences", f"draw 1 to {MAX_SEQUENCES}")
    if hi > INT32_MAX:
        raise ShapeError(f"{what}: HI={number_text(hi)} does not fit the kernels' 32-bit offsets",
                         f"draw lengths of at most {INT32_MAX}")
    if lo > hi:
        raise ShapeError(f"{what}: LO={lo} is above HI={hi}", "write the shorter length first")
    if seed > MAX_SEED:
        raise ShapeError(f"{what}: seed={number_text(seed)} is out of range", f"use a seed from 0 to {MAX_SEED}")
    rng = random.Random(seed)
    return tuple(rng.randint(lo, hi) for _ in range(n))


def _read_file(path: Path, option: str) -> tuple[int, ...]:
    """A regular file's lengths. Opened without blocking, so a FIFO nobody writes to (or a
    device) is refused at once instead of waited on for ever."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ShapeError(f"{option} @{path}: not a regular file", "name a text file of sequence lengths")
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ShapeError(f"{option} @{path}: cannot read it ({exc.strerror or exc})",
                         "name a text file of sequence lengths") from None
    if len(data) > MAX_FILE_BYTES:
        raise ShapeError(f"{option} @{path}: over {MAX_FILE_BYTES} bytes", "give a file of sequence lengths only")
    try:
        text = data.decode("utf-8-sig")      # a byte order mark (Windows editors) is not a length
    except UnicodeDecodeError:
        raise ShapeError(f"{option} @{path}: not UTF-8 text", "give a text file of sequence lengths") from None
    words = [w for line in text.splitlines() for w in re.split(r"[\s,]+", line.split("#", 1)[0]) if w]
    return _integers(words, f"{option} @{path}")


def _integers(words: list[str], what: str) -> tuple[int, ...]:
    out = []
    for word in (w.strip() for w in words):
        if not word.isdecimal():      # (isdigit() passes '²', which int() refuses)
            raise ShapeError(f"{what}: {word[:40]!r} is not a sequence length",
                             f"give lengths as whole numbers >= 0: {SPELLINGS}")
        out.append(_whole(word, what, "a length", INT32_MAX))
    if not out:
        raise ShapeError(f"{what}: no sequence lengths", f"give {SPELLINGS}")
    return tuple(out)


def _whole(digits: str, what: str, name: str, most: int) -> int:
    """``digits`` (decimal digits) as an int, the bounds left to the caller (its message names
    them); ShapeError past the 4300 digits int() reads."""
    return parse_whole(digits, f"{what}: {name}", hi=None, remedy=f"use at most {most}", error=ShapeError)


def packed_problem(shape: str, lengths: str, lengths_k: str | None, *, dtype: str, causal: bool) -> Problem:
    """The packed problem of ``--shape`` (H, D and optionally HKV; a B or S given must agree
    with the lengths) and ``--lengths`` / ``--lengths-k``."""
    values = parse_shape_values(shape)
    for key in ("H", "D"):
        if key not in values:
            raise ShapeError(f"--shape: missing dimension {key} (a packed problem needs H and D)",
                             "e.g. --shape H=32,HKV=8,D=128 --lengths 128,4096")
    dims = sorted({d for fam in families() if fam.varlen for d in fam.head_dims})
    if values["D"] not in dims:     # (else the family pick's remedy offers the dense head dims)
        raise ShapeError(f"--shape: head dim D={values['D']} has no kernel for packed variable-length batches",
                         f"with --lengths use one of {', '.join(map(str, dims))}" if dims
                         else "no kernel family here builds packed batches: drop --lengths")
    lq = parse_lengths(lengths)
    lk = parse_lengths(lengths_k, "--lengths-k") if lengths_k is not None else None
    problem = Problem.packed(lq, lk, heads=values["H"], head_dim=values["D"], heads_kv=values.get("HKV"),
                             dtype=dtype, causal=causal)
    s = problem.shape
    for key, derived, what in (("B", s.batch, "sequences"), ("SQ", s.seqlen_q, "the longest query length"),
                               ("SK", s.seqlen_k, "the longest key length")):
        if key in values and values[key] != derived:
            raise ShapeError(f"--shape: {key}={values[key]} contradicts the lengths ({what}: {derived})",
                             "drop B and S (or SQ/SK) from --shape: the lengths give them")
    return problem


def problem_of_options(shape: str, lengths: str | None, lengths_k: str | None, *, dtype: str,
                       causal: bool) -> Problem:
    """``search``'s problem: packed (:func:`packed_problem`) with ``--lengths``, else the dense
    problem of ``--shape``."""
    if lengths is not None:
        return packed_problem(shape, lengths, lengths_k, dtype=dtype, causal=causal)
    if lengths_k is not None:
        raise ShapeError("--lengths-k: key lengths without --lengths", "give the query lengths with --lengths too")
    return Problem(Shape.parse(shape), dtype=dtype, causal=causal)
