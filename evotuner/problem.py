"""The problem being tuned: a shape, a dtype and the causal flag (frozen values).

The problem's *static* part (head dim, dtype, causal) is compiled into the
kernel; the rest (batch, heads, sequence lengths) only sizes the launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from evotuner.errors import ShapeError
from evotuner.numbers import INT32_MAX

DTYPES = ("fp16", "bf16")
#: Head dims some family is built for (each family's ``head_dims`` says which it takes:
#: FlashCore 32, 64, 96, 128, 256; hopper 64, 128, 192, 256).
HEAD_DIMS = (32, 64, 96, 128, 192, 256)

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
                raise ShapeError(f"shape: {name} must be a positive integer, got {value!r}")
            if value > INT32_MAX:       # the kernels' shape arguments are int32_t
                raise ShapeError(f"shape: {name}={value} does not fit the kernels' 32-bit shape arguments",
                                 f"use at most {INT32_MAX}")
        if self.heads % self.heads_kv:
            raise ShapeError(f"shape: H={self.heads} query heads do not split into HKV={self.heads_kv} key/value heads",
                             "HKV must divide H (GQA: e.g. H=32,HKV=8; MQA: HKV=1)")
        if self.head_dim not in HEAD_DIMS:
            raise ShapeError(
                f"shape: head dim D={self.head_dim} is not supported",
                f"use one of {', '.join(map(str, HEAD_DIMS))}",
            )

    @classmethod
    def parse(cls, text: str, *, require: tuple[str, ...] = ("B", "H", "S", "D")) -> "Shape":
        """Parse ``B=16,H=16,S=2048,D=64`` (``SQ``/``SK`` may replace ``S``).

        ``require`` names the keys that must be present; a shape for
        ``evotuner compile`` needs only ``D`` and fills the rest with 1.
        """
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
                raise ShapeError(f"--shape: {key} is given twice")
            try:
                values[key] = int(raw.strip())
            except ValueError:
                raise ShapeError(f"--shape: {key}={raw.strip()!r} is not an integer") from None
        if "S" in values and ({"SQ", "SK"} & values.keys()):
            raise ShapeError("--shape: give either S or SQ and SK, not both")
        if "S" in values:
            values["SQ"] = values["SK"] = values.pop("S")
        if "HKV" in values and "H" not in values:
            raise ShapeError("--shape: HKV (key/value heads) needs H (query heads)", "e.g. H=32,HKV=8")
        for key in require:
            keys = ("SQ", "SK") if key == "S" else (key,)
            for k in keys:
                if k not in values:
                    raise ShapeError(
                        f"--shape: missing dimension {key if key != 'S' else 'S (or SQ and SK)'}",
                        "write all of B, H, S, D, e.g. B=16,H=16,S=2048,D=64",
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


def _missing_d() -> int:
    raise ShapeError("--shape: missing dimension D", "e.g. --shape D=64")


@dataclass(frozen=True)
class Problem:
    """What one study tunes for: shape, dtype and causal masking. ``varlen``: a packed
    variable-length batch (``flash_attention_varlen``): then ``shape`` has the number of
    sequences as its batch and the longest query and key lengths as Sq and Sk, and the
    kernel is a build of its own (compiled in, like the head dim)."""

    shape: Shape
    dtype: str = "fp16"
    causal: bool = False
    varlen: bool = False

    def __str__(self) -> str:
        """``B=16,H=16,S=2048,D=64 fp16 non-causal`` (how errors and messages name a problem)."""
        packed = " packed (variable lengths)" if self.varlen else ""
        return f"{self.shape} {self.dtype} {'causal' if self.causal else 'non-causal'}{packed}"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ShapeError(f"--dtype: {self.dtype!r} is not supported", f"use one of {', '.join(DTYPES)}")

    @property
    def flops(self) -> float:
        """Forward FLOPs: 4·B·H·Sq·Sk·D (two GEMMs); causal counts half (the usual convention)."""
        s = self.shape
        full = 4.0 * s.batch * s.heads * s.seqlen_q * s.seqlen_k * s.head_dim
        return full / 2 if self.causal else full

    @property
    def query_rows(self) -> int:
        """B·H·Sq: the rows of the output, what a kernel splits into tiles across the SMs."""
        return self.shape.batch * self.shape.heads * self.shape.seqlen_q

    def tflops(self, microseconds: float) -> float:
        return self.flops / (microseconds * 1e-6) / 1e12

    def static_key(self) -> dict[str, int | str | bool]:
        """The part of the problem compiled into the kernel (``varlen`` only when set, so a
        dense problem's key, and the build cache's, read as they always did)."""
        key: dict[str, int | str | bool] = {"head_dim": self.shape.head_dim, "dtype": self.dtype,
                                            "causal": self.causal}
        if self.varlen:
            key["varlen"] = True
        return key

    def as_dict(self) -> dict[str, object]:
        """The problem as stored with a study; ``heads_kv`` only where it is not ``heads``
        (GQA/MQA), so a multi-head problem reads as it always did."""
        s = self.shape
        out: dict[str, object] = {
            "batch": s.batch, "heads": s.heads, "seqlen_q": s.seqlen_q, "seqlen_k": s.seqlen_k,
            "head_dim": s.head_dim, "dtype": self.dtype, "causal": self.causal,
        }
        if s.heads_kv != s.heads:
            out["heads_kv"] = s.heads_kv
        if self.varlen:
            out["varlen"] = True
        return out

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> "Problem":
        kv = d.get("heads_kv")
        shape = Shape(int(d["batch"]), int(d["heads"]), int(d["seqlen_q"]), int(d["seqlen_k"]), int(d["head_dim"]),
                      None if kv is None else int(kv))
        return cls(shape=shape, dtype=str(d["dtype"]), causal=bool(d["causal"]), varlen=bool(d.get("varlen", False)))
