"""The problem being tuned: a shape, a dtype and the causal flag (frozen values).

The problem's *static* part (head dim, dtype, causal, packed or not) is compiled into
the kernel; the rest (batch, heads, sequence lengths) only sizes the launch. A packed
variable-length problem (``varlen``) may carry its sequences' lengths, which a search
measures and the cost model reads; they are never compiled in.
"""

from __future__ import annotations

from dataclasses import dataclass

from evotuner.errors import ShapeError
from evotuner.numbers import INT32_MAX

DTYPES = ("fp16", "bf16")
#: Head dims some family is built for (each family's ``head_dims`` says which it takes:
#: FlashCore 32, 64, 96, 128, 256; hopper 64, 128, 192, 256).
HEAD_DIMS = (32, 64, 96, 128, 192, 256)

#: Most sequences a packed problem may hold (the kernel's grid y/z limit spans them).
MAX_SEQUENCES = 65535
#: Sequences whose lengths ``str(problem)`` lists one by one; more are summarised.
LISTED_LENGTHS = 4

_SHAPE_KEYS = {"B": "batch", "H": "heads", "HKV": "heads_kv", "S": None, "SQ": "seqlen_q", "SK": "seqlen_k",
               "D": "head_dim"}


@dataclass(frozen=True, order=True)
class Shape:
    """An attention problem size: Q is [B, H, Sq, D], K and V are [B, HKV, Sk, D].

    ``heads_kv`` (HKV) is the number of key/value heads: H for multi-head attention (the
    default), a divisor of H for grouped-query attention (query head h reads K/V head
    h // (H // HKV)), 1 for multi-query attention."""

    batch: int
    heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    heads_kv: int | None = None

    def __post_init__(self) -> None:
        if self.heads_kv is None:
            object.__setattr__(self, "heads_kv", self.heads)
        for name in ("batch", "heads", "seqlen_q", "seqlen_k", "head_dim", "heads_kv"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ShapeError(f"shape: {name} must be a positive integer, got {value!r}", f"give {name}=1 or more")
            if value > INT32_MAX:       # the kernels' shape arguments are int32_t
                raise ShapeError(f"shape: {name}={number_text(value)} does not fit the kernels' 32-bit shape arguments",
                                 f"use at most {INT32_MAX}")
        if self.heads % self.heads_kv:
            raise ShapeError(f"shape: H={self.heads} query heads do not split into HKV={self.heads_kv} key/value heads",
                             "HKV must divide H (GQA: e.g. H=32,HKV=8; MQA: HKV=1)")
        if self.head_dim not in HEAD_DIMS:
            raise ShapeError(
                f"shape: head dim D={self.head_dim} is not supported",
                f"use one of {', '.join(map(str, HEAD_DIMS))}",
            )

    def differs_from(self, given: dict[str, int]) -> bool:
        """Whether any of ``given`` (:func:`parse_shape_values`' keys: only those a user wrote)
        is not this shape's."""
        return any(getattr(self, _SHAPE_KEYS[key]) != value for key, value in given.items())

    @classmethod
    def parse(cls, text: str, *, require: tuple[str, ...] = ("B", "H", "S", "D")) -> "Shape":
        """Parse ``B=16,H=16,S=2048,D=64`` (``SQ``/``SK`` may replace ``S``).

        ``require`` names the keys that must be present; a shape for
        ``evotuner compile`` needs only ``D`` and fills the rest with 1.
        """
        values = parse_shape_values(text)
        for key in require:
            keys = ("SQ", "SK") if key == "S" else (key,)
            for k in keys:
                if k not in values:
                    raise ShapeError(
                        f"--shape: missing dimension {key if key != 'S' else 'S (or SQ and SK)'}",
                        "e.g. --shape D=64" if tuple(require) == ("D",)
                        else "write all of B, H, S, D, e.g. B=16,H=16,S=2048,D=64",
                    )
        return cls(
            batch=values.get("B", 1),
            heads=values.get("H", 1),
            seqlen_q=values.get("SQ", 1),
            seqlen_k=values.get("SK", 1),
            head_dim=values["D"] if "D" in values else _missing_d(),
            heads_kv=values.get("HKV"),
        )

    @property
    def kv_group(self) -> int:
        """Query heads per key/value head (1 for multi-head attention)."""
        return self.heads // int(self.heads_kv or self.heads)

    def __str__(self) -> str:
        s = f"S={self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"SQ={self.seqlen_q},SK={self.seqlen_k}"
        kv = f",HKV={self.heads_kv}" if self.heads_kv != self.heads else ""
        return f"B={self.batch},H={self.heads}{kv},{s},D={self.head_dim}"


def shape_values_text(values: dict[str, int]) -> str:
    """:func:`parse_shape_values`' sizes as --shape text, in B, H, HKV, S, D order (``S`` where SQ = SK)."""
    same = values.get("SQ") is not None and values.get("SQ") == values.get("SK")
    keys = ["B", "H", "HKV", *(["S"] if same else ["SQ", "SK"]), "D"]
    return ",".join(f"{k}={values['SQ' if k == 'S' else k]}" for k in keys if ("SQ" if k == "S" else k) in values)


def parse_shape_values(text: str) -> dict[str, int]:
    """``--shape``'s KEY=VALUE pairs as {B, H, HKV, SQ, SK, D: int} (``S`` becomes SQ and SK),
    only the keys given; ShapeError naming the part that cannot be read."""
    values: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip().upper()
        if not sep or key not in _SHAPE_KEYS:
            raise ShapeError(
                f"--shape: cannot read {part!r}",
                "write KEY=VALUE pairs with keys B, H, S (or SQ and SK), D and optionally HKV, "
                "e.g. B=16,H=16,S=2048,D=64 or B=1,H=32,HKV=8,S=4096,D=128",
            )
        if key in values:
            raise ShapeError(f"--shape: {key} is given twice", "give each size once")
        raw = raw.strip()
        try:
            values[key] = int(raw)
        except ValueError:
            if raw.isdecimal():          # past the 4300 digits int() reads
                raise ShapeError(f"--shape: {key} has {len(raw)} digits", f"use at most {INT32_MAX}") from None
            raise ShapeError(f"--shape: {key}={raw[:40]!r} is not an integer",
                             "write each size as a whole number, e.g. B=16,H=16,S=2048,D=64") from None
    for key, value in values.items():         # named by the key the user wrote, before Shape's fields
        if key == "D" and value not in HEAD_DIMS:
            raise ShapeError(f"--shape: head dim D={value} is not supported",
                             f"use one of {', '.join(map(str, HEAD_DIMS))}")
        if value < 1:
            raise ShapeError(f"--shape: {key} must be a positive integer, got {number_text(value)}",
                             f"give {key}=1 or more")
        if value > INT32_MAX:                   # the kernels' shape arguments are int32_t
            raise ShapeError(f"--shape: {key}={number_text(value)} does not fit the kernels' 32-bit shape arguments",
                             f"use at most {INT32_MAX}")
    if "S" in values and ({"SQ", "SK"} & values.keys()):
        raise ShapeError("--shape: S and SQ/SK are both given", "give either S (Sq = Sk) or SQ and SK")
    if "S" in values:
        values["SQ"] = values["SK"] = values.pop("S")
    if "HKV" in values and "H" not in values:
        raise ShapeError("--shape: HKV (key/value heads) needs H (query heads)", "e.g. H=32,HKV=8")
    return values


def number_text(n: int) -> str:
    """``n`` as written, or ``a number of about N digits`` past 20 digits (a pasted run of
    digits; Python does not print an int past 4300 digits)."""
    if abs(n) < 10**20:
        return str(n)
    return f"a number of about {int(abs(n).bit_length() * 0.30103) + 1} digits"


def _missing_d() -> int:
    raise ShapeError("--shape: missing dimension D", "e.g. --shape D=64")


#: The fewest query rows of a tile (one consumer warpgroup): a packed batch's grid has at most
#: ceil(longest / this) x heads x sequences tiles.
PACKED_TILE_ROWS = 64


def _check_lengths(lengths: object, what: str) -> tuple[int, ...]:
    """``lengths`` as a tuple of sequence lengths (ints >= 0 that fit int32), else ShapeError."""
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise ShapeError(f"{what}: {lengths!r:.80} is not a list of sequence lengths", "e.g. --lengths 128,4096,77")
    out = tuple(lengths)  # type: ignore[arg-type]
    for n in out:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            shown = number_text(n) if isinstance(n, int) else f"{n!r:.40}"
            raise ShapeError(f"{what}: sequence length {shown} is not an integer >= 0",
                             "give each sequence's length as a whole number (0: an empty sequence)")
        if n > INT32_MAX:
            raise ShapeError(f"{what}: sequence length {number_text(n)} does not fit the kernels' 32-bit offsets",
                             f"use at most {INT32_MAX}")
    if not out:
        raise ShapeError(f"{what}: no sequences", "give at least one sequence length, e.g. --lengths 4096")
    if len(out) > MAX_SEQUENCES:
        raise ShapeError(f"{what}: {len(out)} sequences; a packed batch holds at most {MAX_SEQUENCES}",
                         "tune for a representative sample of the batch")
    if sum(out) > INT32_MAX:
        raise ShapeError(f"{what}: {sum(out)} rows in all do not fit the kernels' 32-bit offsets",
                         f"keep the total at most {INT32_MAX}")
    return out


def _check_sequences(lengths_q: object, lengths_k: object | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A packed batch's (query, key) lengths, checked together (``lengths_k`` None: the query
    lengths): one key length per sequence, some query and some key rows; else ShapeError."""
    lq = _check_lengths(lengths_q, "--lengths")
    lk = lq if lengths_k is None else _check_lengths(lengths_k, "--lengths-k")
    if len(lk) != len(lq):
        raise ShapeError(f"--lengths-k: {len(lk)} key lengths for {len(lq)} sequences",
                         "give one key length per query length, or drop --lengths-k (keys as long as queries)")
    if not max(lq):
        raise ShapeError("--lengths: every sequence is empty; there is nothing to tune",
                         "give at least one sequence a length above 0")
    if not max(lk):
        raise ShapeError("--lengths-k: no sequence has a key; every output would be zeros",
                         "give at least one sequence a key length above 0")
    return lq, lk


def describe_lengths(lengths: tuple[int, ...]) -> str:
    """``128,4096`` for a few sequences; ``128..8192 (total 61440)`` for more."""
    if len(lengths) <= LISTED_LENGTHS:
        return ",".join(map(str, lengths))
    return f"{min(lengths)}..{max(lengths)} (total {sum(lengths)})"


def causal_pairs(seqlen_q: int, seqlen_k: int) -> int:
    """(query, key) pairs a top-left causal mask keeps: query i sees keys 0..min(i, Sk-1)."""
    if seqlen_q <= seqlen_k:
        return seqlen_q * (seqlen_q + 1) // 2
    return seqlen_k * (seqlen_k + 1) // 2 + (seqlen_q - seqlen_k) * seqlen_k


@dataclass(frozen=True)
class Problem:
    """What one study tunes for: shape, dtype and causal masking. ``varlen``: a packed
    variable-length batch (``flash_attention_varlen``): then ``shape`` has the number of
    sequences as its batch and the longest query and key lengths as Sq and Sk, and the
    kernel is a build of its own (compiled in, like the head dim).

    ``lengths_q``/``lengths_k``: a packed problem's sequence lengths (query and key rows of
    each sequence; empty sequences allowed), what a search measures on; ``lengths_k`` is
    ``lengths_q`` when not given. A packed problem without them (``()``) only keys a build
    or a runtime call. :meth:`packed` makes one from its lengths."""

    shape: Shape
    dtype: str = "fp16"
    causal: bool = False
    varlen: bool = False
    lengths_q: tuple[int, ...] = ()
    lengths_k: tuple[int, ...] = ()

    def __str__(self) -> str:
        """``B=16,H=16,S=2048,D=64 fp16 non-causal`` (how errors and messages name a problem);
        a packed problem with lengths: ``H=32,HKV=8,D=128 fp16 causal, 16 sequences, q 128..8192
        (total 61440)``."""
        mask = "causal" if self.causal else "non-causal"
        if not self.lengths_q:
            packed = " packed (variable lengths)" if self.varlen else ""
            return f"{self.shape} {self.dtype} {mask}{packed}"
        return f"{self.heads_text()} {self.dtype} {mask}, {self.lengths_text()}"

    def heads_text(self) -> str:
        """``H=32,HKV=8,D=128``: the shape without batch and lengths (a packed problem's)."""
        s = self.shape
        kv = f",HKV={s.heads_kv}" if s.heads_kv != s.heads else ""
        return f"H={s.heads}{kv},D={s.head_dim}"

    def lengths_text(self) -> str:
        """``16 sequences, q 128..8192 (total 61440)`` (and the keys' where they differ); "" without lengths."""
        if not self.lengths_q:
            return ""
        n = len(self.lengths_q)
        text = f"{n} sequence{'s' if n != 1 else ''}, q {describe_lengths(self.lengths_q)}"
        if self.lengths_k != self.lengths_q:
            text += f", k {describe_lengths(self.lengths_k)}"
        return text

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ShapeError(f"--dtype: {self.dtype!r} is not supported", f"use one of {', '.join(DTYPES)}")
        s = self.shape
        grid = -(-s.seqlen_q // PACKED_TILE_ROWS) * s.heads * s.batch
        if self.varlen and grid > INT32_MAX:    # the kernel counts the grid's tiles in int32
            raise ShapeError(f"packed batch: its grid spans the longest sequence ({s.seqlen_q} rows) for each of "
                             f"{s.batch} sequences and {s.heads} heads, {grid} tiles, past the kernel's 32-bit count",
                             "split the batch, or pack sequences of similar length together")
        if not self.lengths_q and not self.lengths_k:
            return
        if not self.varlen:
            raise ShapeError("problem: sequence lengths describe a packed variable-length batch",
                             "make it with Problem.packed(...) (varlen=True), or drop the lengths")
        if not self.lengths_q:
            raise ShapeError("--lengths-k: key lengths without query lengths", "give --lengths too")
        lq, lk = _check_sequences(self.lengths_q, self.lengths_k or None)
        derived = (len(lq), max(lq), max(lk))
        if (s.batch, s.seqlen_q, s.seqlen_k) != derived:
            raise ShapeError(f"problem: shape B={s.batch},SQ={s.seqlen_q},SK={s.seqlen_k} does not match the "
                             f"lengths' B={derived[0]},SQ={derived[1]},SK={derived[2]}",
                             "drop B and S (or SQ/SK) from --shape: the lengths give them")
        object.__setattr__(self, "lengths_q", lq)
        object.__setattr__(self, "lengths_k", lk)

    @classmethod
    def packed(cls, lengths_q: tuple[int, ...] | list[int], lengths_k: tuple[int, ...] | list[int] | None = None,
               *, heads: int, head_dim: int, heads_kv: int | None = None, dtype: str = "fp16",
               causal: bool = False) -> "Problem":
        """A packed variable-length problem of these sequences: batch, Sq and Sk derived
        from the lengths (the number of sequences and the longest of each)."""
        lq, lk = _check_sequences(lengths_q, lengths_k)
        shape = Shape(len(lq), heads, max(lq), max(lk), head_dim, heads_kv)
        return cls(shape, dtype, causal, varlen=True, lengths_q=lq, lengths_k=lk)

    def sequences(self) -> tuple[tuple[int, int], ...]:
        """(query rows, key rows) of each sequence: the lengths of a packed problem, else the
        batch's B equal ones (a packed problem without lengths: its longest, B times)."""
        if self.lengths_q:
            return tuple(zip(self.lengths_q, self.lengths_k))
        return ((self.shape.seqlen_q, self.shape.seqlen_k),) * self.shape.batch

    @property
    def flops(self) -> float:
        """Forward FLOPs: 4·B·H·Sq·Sk·D (two GEMMs); causal counts half (the usual convention).
        A packed problem with lengths sums its sequences: 4·H·D·Σ Sq_b·Sk_b, causal the
        (query, key) pairs the top-left mask keeps in each (query i sees keys 0..i)."""
        s = self.shape
        if self.lengths_q:
            pairs = sum(causal_pairs(q, k) if self.causal else q * k for q, k in self.sequences())
            return 4.0 * s.heads * s.head_dim * pairs
        full = 4.0 * s.batch * s.heads * s.seqlen_q * s.seqlen_k * s.head_dim
        return full / 2 if self.causal else full

    @property
    def query_rows(self) -> int:
        """B·H·Sq: the rows of the output, what a kernel splits into tiles across the SMs
        (a packed problem with lengths: H times its total query length)."""
        if self.lengths_q:
            return self.shape.heads * sum(self.lengths_q)
        return self.shape.batch * self.shape.heads * self.shape.seqlen_q

    def tflops(self, microseconds: float) -> float:
        return self.flops / (microseconds * 1e-6) / 1e12

    def static_key(self) -> dict[str, int | str | bool]:
        """The part of the problem compiled into the kernel (``varlen`` only when set, so a
        dense problem's key, and the build cache's, read as they always did; the lengths
        are never compiled in)."""
        key: dict[str, int | str | bool] = {"head_dim": self.shape.head_dim, "dtype": self.dtype,
                                            "causal": self.causal}
        if self.varlen:
            key["varlen"] = True
        return key

    def as_dict(self) -> dict[str, object]:
        """The problem as stored with a study; ``heads_kv`` only where it is not ``heads``
        (GQA/MQA), so a multi-head problem reads as it always did; a packed problem's
        lengths as ``lengths_q`` (and ``lengths_k`` where they differ)."""
        s = self.shape
        out: dict[str, object] = {
            "batch": s.batch, "heads": s.heads, "seqlen_q": s.seqlen_q, "seqlen_k": s.seqlen_k,
            "head_dim": s.head_dim, "dtype": self.dtype, "causal": self.causal,
        }
        if s.heads_kv != s.heads:
            out["heads_kv"] = s.heads_kv
        if self.varlen:
            out["varlen"] = True
        if self.lengths_q:
            out["lengths_q"] = list(self.lengths_q)
            if self.lengths_k != self.lengths_q:
                out["lengths_k"] = list(self.lengths_k)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> "Problem":
        """:meth:`as_dict`'s problem back; ShapeError naming a key that is missing or of the
        wrong type (a stored ``"causal": "false"`` is not read as true, nor 2.5 rows as 2)."""
        missing = [k for k in ("batch", "heads", "seqlen_q", "seqlen_k", "head_dim", "dtype", "causal") if k not in d]
        if missing:
            raise ShapeError(f"problem: {', '.join(missing)} missing")
        for key in ("causal", "varlen"):
            if not isinstance(d.get(key, False), bool):
                raise ShapeError(f"problem: {key}={d[key]!r:.40} is not true or false")
        dims: list = [d["batch"], d["heads"], d["seqlen_q"], d["seqlen_k"], d["head_dim"], d.get("heads_kv")]
        shape = Shape(*dims)                  # Shape refuses what is not an int (2.5, "4", None, True)
        lengths: dict[str, tuple[int, ...]] = {}
        for name in ("lengths_q", "lengths_k"):
            raw = d.get(name)
            if raw is None:
                continue
            if not isinstance(raw, list):
                raise ShapeError(f"problem: {name} is a {type(raw).__name__}, not a list of lengths")
            lengths[name] = _check_lengths(raw, name)
        flags: dict = {"dtype": d["dtype"], "causal": d["causal"], "varlen": d.get("varlen", False)}
        return cls(shape=shape, **flags, **lengths)
