"""The kernel-family contract: everything generic code needs to know about one family.

A *family* is one parametrized CUDA kernel: a folder ``<kernels root>/<name>/``
holding its sources and an ``instantiate.cuh``, plus one :class:`KernelFamily`
subclass (its Python side). The generic stages (space, propose, build, gate,
measure, storage, export, loop, cli) only ever talk to a family through this
class; they name no family parameter and no family symbol.

Contract (what a subclass sets or implements, and what the stages do with it):

* ``name`` -- the folder under :meth:`kernels_root` and the ``[space] kernel`` of
  its space files; the study records it and export keys rows by it.
* ``macro_prefix`` -- the build stage writes one ``gen.cu`` per config::

      #define <P>_HEAD_DIM 64
      #define <P>_IS_CAUSAL 0
      #define <P>_DTYPE 0               // evotuner.abi.DTYPE_CODES
      #define <P>_<PARAM> <value>       // one per space parameter
      #include "<name>/instantiate.cuh"

* ``entry`` / ``meta_symbol`` -- the ``extern "C"`` kernel and its meta table
  (``kernels/evotuner_abi.h``: common fields, then ``meta_fields`` in order).
* ``echoed`` -- {space parameter: meta field} the kernel echoes; the build stage
  refuses a cubin whose table disagrees with the config (a macro was ignored).
* ``head_dims`` / ``dtypes`` -- the problems the kernel supports.
* :meth:`default_space` -- the packaged space file (``[space] kernel = name``).
* :meth:`recommended_configs` -- the recommended config(s) for a problem: the warm
  start of a new study and what ``evotuner.flash_attention`` runs by default.
* :meth:`estimate_us` -- optional cost model (predicted µs of a config), the prior of
  the ``guided`` sampler.
* :meth:`gate_hint` / :meth:`extra_gate` -- the remedy text of each generic ptxas
  gate check, and the family's own gate rules (run after the generic ones pass).
* ``export_namespace`` / ``export_macro_prefix`` -- where the family's rows go in
  an exported header (several families share one header, one namespace each).
* :meth:`launch` -- the runtime's host side: kernel argument bytes (the family's
  own Params, one entry per kernel argument), grid, block and dynamic shared
  memory for tensors in the logical [B, H, S, D] view. Torch-free: it gets
  pointers, shapes, strides and a :class:`DeviceInfo`.

A new family: subclass, fill the fields, implement the abstract methods, and
register an instance (``evotuner.family.register``) -- a package does it through
the ``evotuner.families`` entry point group (see pyproject.toml).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from evotuner.abi import decode_meta
from evotuner.config import KernelConfig
from evotuner.problem import Problem

if TYPE_CHECKING:  # only for annotations: no import at run time
    from evotuner.space import GateThresholds

#: Names the build stage defines itself (``<P>_<NAME>``); a space parameter may not take them.
BUILD_RESERVED = frozenset({"HEAD_DIM", "IS_CAUSAL", "DTYPE", "KERNEL_NAME", "META_NAME", "ABI_VERSION", "VARLEN"})


@dataclass(frozen=True)
class TensorView:
    """One tensor as the family's host side sees it: device pointer, shape and strides
    in elements of the logical [B, H, S, D] view (or [B, H, S] for lse)."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True)
class DeviceInfo:
    """What a launch may depend on about the device."""

    index: int
    sm_count: int


@dataclass(frozen=True)
class LaunchSpec:
    """One kernel launch: the argument bytes (one entry per kernel parameter, each the
    exact by-value bytes, e.g. ``bytes(ctypes_struct)``), grid, block, dynamic smem."""

    args: tuple[bytes, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int


@dataclass(frozen=True)
class AttentionArgs:
    """The runtime's request: tensors in the logical [B, H, S, D] view, dtype name, scale."""

    q: TensorView
    k: TensorView
    v: TensorView
    o: TensorView
    lse: TensorView | None
    dtype: str
    scale: float
    #: Device pointer to :meth:`KernelFamily.workspace_bytes` bytes that are zero when this
    #: launch starts: the runtime zeroed them on the launch stream at least once, and every
    #: launch of the family leaves them zero when it ends (0 when the family asks for none).
    workspace: int = 0
    #: Device pointer to :meth:`KernelFamily.scratch_bytes` bytes for this launch's shapes,
    #: zeroed once when the runtime allocated them (the kernel leaves what it relies on as
    #: it found it); 0 when the family asks for none.
    scratch: int = 0
    #: A packed variable-length batch (then q/o are [1, H, total_q, D] views of the packed
    #: [total_q, H, D] tensors, k/v likewise, lse [H, total_q]); None: dense.
    varlen: "VarlenArgs | None" = None


@dataclass(frozen=True)
class VarlenArgs:
    """A packed batch's offsets: int32 device arrays of ``batch + 1`` entries each
    (FlashAttention's ``cu_seqlens``), and the longest query and key lengths."""

    cu_seqlens_q: int
    cu_seqlens_k: int
    batch: int
    max_seqlen_q: int
    max_seqlen_k: int


def packaged(package: str, *parts: str) -> Path:
    """A file or folder shipped inside ``package`` (``importlib.resources``), as a Path."""
    res = resources.files(package).joinpath(*parts)
    return res if isinstance(res, Path) else Path(str(res))


class KernelFamily(abc.ABC):
    """One kernel family's Python side (see the module docstring for the contract)."""

    #: Folder name under the kernels root; the space files' ``[space] kernel``.
    name: str = ""
    #: Human name used in messages and headers.
    title: str = ""
    #: Prefix of the generated macros (``<P>_HEAD_DIM``, ``<P>_<PARAM>``).
    macro_prefix: str = ""
    #: The ``extern "C"`` kernel and meta table symbols of a generated instantiation.
    entry: str = ""
    meta_symbol: str = ""
    #: The family's own meta fields, after the common ones (evotuner/abi.py), in index order.
    meta_fields: tuple[str, ...] = ()
    #: {space parameter: meta field} the kernel echoes back.
    echoed: Mapping[str, str] = {}
    #: Problems the kernel supports (``varlen``: packed variable-length batches, a build of
    #: their own, ``<P>_VARLEN`` 1).
    head_dims: tuple[int, ...] = ()
    varlen: bool = False
    dtypes: tuple[str, ...] = ("fp16", "bf16")
    #: The generic ptxas gate checks run for this family, in order, before :meth:`extra_gate`.
    #: A family may leave one out and judge it itself in ``extra_gate`` (e.g. spills only on
    #: its consumer path).
    generic_gate_checks: tuple[str, ...] = (
        "spills", "stack", "registers", "regs_per_sm", "smem_per_block", "smem_per_sm")
    #: How gate reasons name the meta table's ``min_blocks`` (followed by its value).
    min_blocks_label: str = "blocks per SM "
    #: The sampler ``evotuner search`` uses for this family's spaces when --sampler is not
    #: given (a name of :data:`evotuner.propose.SAMPLERS`; the study records it).
    default_sampler: str = "tpe"
    #: Kernel parameters a config may set beyond those of the recommended configs, with the
    #: value the kernel takes when a config leaves one out (e.g. a knob only some spaces
    #: search): ``config=`` accepts them and :func:`evotuner.defaults.family_parameters`
    #: names them.
    optional_params: Mapping[str, int] = MappingProxyType({})
    #: C++ namespace and macro prefix of the family's rows in an exported header.
    export_namespace: str = ""
    export_macro_prefix: str = ""

    # -- files ---------------------------------------------------------------------------

    def kernels_root(self) -> Path:
        """The folder holding ``<name>/instantiate.cuh`` (default: the packaged kernels)."""
        return packaged("evotuner.kernels")

    @abc.abstractmethod
    def default_space(self) -> Path:
        """The family's packaged space file."""

    def space_for(self, problem: Problem) -> Path:
        """The packaged space file a new study of ``problem`` tunes (a family whose knobs
        differ by head dim keeps one space per range); default :meth:`default_space`."""
        return self.default_space()

    # -- problems and configs --------------------------------------------------------------

    def reserved(self) -> frozenset[str]:
        """Names a space parameter may not take (macros the build stage or the kernel owns)."""
        return BUILD_RESERVED

    def unsupported(self, problem: Problem) -> str | None:
        """Why the family cannot run ``problem`` (one line), or None."""
        d = problem.shape.head_dim
        if d not in self.head_dims:
            return f"{self.title or self.name} supports head dims {', '.join(map(str, self.head_dims))}, not D={d}"
        if problem.dtype not in self.dtypes:
            return f"{self.title or self.name} supports {', '.join(self.dtypes)}, not {problem.dtype}"
        if problem.varlen and not self.varlen:
            return f"{self.title or self.name} has no kernel for packed variable-length batches"
        return None

    @abc.abstractmethod
    def recommended_configs(self, problem: Problem) -> tuple[KernelConfig, ...]:
        """The recommended configs for ``problem``, best first (empty where none is known)."""

    def expected_speed(self, problem: Problem) -> float:
        """How fast the recommended config runs ``problem``, by the family's own measured
        figure (e.g. TFLOP/s noted in its recommended-config file); ``evotuner.flash_attention``
        runs the family with the highest. 0.0: unknown."""
        return 0.0

    def estimate_us(self, config: KernelConfig, problem: Problem) -> float | None:
        """The family's cost model: the predicted time of ``config`` at ``problem`` in µs on
        the GPU the family is tuned for (``math.inf``: predicted to fail the gate), or None
        where the family has none. The ``guided`` sampler (evotuner/guided.py) ranks the
        space by it before the first build and learns the model's bias and local errors from
        the measurements, so only the order of the estimates matters."""
        return None

    def decode_meta(self, raw: bytes, *, source: str = "meta table") -> dict[str, int]:
        """The meta table's bytes as {field: value}: the common fields (evotuner/abi.py) plus
        :attr:`meta_fields`. The default reads the shared layout (kernels/evotuner_abi.h); a
        family whose kernel keeps its own table layout maps it onto the same names here
        (raising :class:`evotuner.abi.MetaError` for a table it does not recognise)."""
        return decode_meta(raw, self.meta_fields, source=source)

    # -- gate ------------------------------------------------------------------------------

    def gate_hint(self, check: str, meta: Mapping[str, int]) -> str:
        """The remedy for a failed generic gate check (spills, registers, regs_per_sm,
        smem_per_block, smem_per_sm), in the family's parameter names."""
        return "choose a smaller config"

    def extra_gate(self, log: str, report: Any, meta: Mapping[str, int],
                   thresholds: "GateThresholds") -> tuple[str, str] | None:
        """The family's own gate rules, run after the generic checks passed:
        (check name, one-line reason with a remedy) to reject, or None."""
        return None

    # -- export ----------------------------------------------------------------------------

    # -- runtime ---------------------------------------------------------------------------

    def unsupported_views(self, views: Mapping[str, TensorView]) -> str | None:
        """Why the family cannot take these tensors ({"q", "k", "v", "o"}: [B, H, S, D] views),
        naming the tensor and stride (one line), or None. ``evotuner.flash_attention`` then
        runs another family (when the family was not asked for) and says why."""
        return None

    def workspace_bytes(self, meta: Mapping[str, int]) -> int:
        """Device bytes one launch needs zero when it starts (e.g. a dynamic scheduler's tile
        counter); the runtime passes them as ``AttentionArgs.workspace``, zeroed once per
        stream: the family's kernels must leave them zero when they end."""
        return 0

    def scratch_bytes(self, meta: Mapping[str, int], batch: int, heads: int, seqlen_q: int, seqlen_k: int) -> int:
        """Device bytes one launch of these sizes uses as scratch (e.g. split-KV partial
        results). The runtime allocates them zeroed, once per stream, and reuses them for
        every later launch on that stream (stream order keeps launches apart), so a kernel
        must leave any part it needs zero at its start zero again at its end."""
        return 0

    @abc.abstractmethod
    def launch(self, meta: Mapping[str, int], args: AttentionArgs, device: DeviceInfo) -> LaunchSpec:
        """Kernel argument bytes and launch geometry for one call."""

    def __repr__(self) -> str:
        return f"<kernel family {self.name}>"
