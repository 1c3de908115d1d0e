"""Load a kernel family's cubin through the driver and launch it on torch tensors.

``KernelModule.load(artifact_or_path)`` loads the cubin into the current
device's primary context (torch's), reads the family's meta table from the
module, raises the dynamic shared-memory limit when the kernel needs more than
48 KB, and caches the module by artifact key and device. ``launch`` hands the
tensors in the logical [B, H, S, D] view (any strides, last dim contiguous) to
the family (:meth:`KernelFamily.launch`: argument bytes and geometry) and
launches on the current torch stream.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Mapping

import torch

from evotuner.abi import DTYPE_NAMES, MetaError, meta_mismatch
from evotuner.compiler.result import Artifact
from evotuner.errors import EvotunerError, ShapeError
from evotuner.family import (DEFAULT_FAMILY, AttentionArgs, DeviceInfo, KernelFamily, LaunchSpec, TensorView,
                             VarlenArgs, get_family)
from evotuner.runtime import cuda

#: Grid y/z limits (heads, batch) of every CUDA device.
MAX_GRID_YZ = 65535
_TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class SharedMemoryError(EvotunerError):
    """The kernel needs more dynamic shared memory than the device allows per block."""

    failure_kind = "smem"


#: Scratch buffers a module keeps (one per stream and launch sizes; the oldest goes first).
MAX_SCRATCHES = 16


class KernelModule:
    """One loaded cubin: its entry function and its meta table, on one device."""

    _cache: dict[tuple[int, str], "KernelModule"] = {}
    _cache_lock = threading.Lock()

    def __init__(self, module: int, function: int, meta: dict[str, int], device: int, key: str,
                 entry: str, source: str, family: KernelFamily | None = None) -> None:
        self.family = family if family is not None else get_family(DEFAULT_FAMILY)
        self.module = module
        self.function = function
        self.meta = meta
        self.device = device
        self.key = key
        self.entry = entry
        self.source = source
        self.dtype = _TORCH_DTYPES[DTYPE_NAMES[meta["dtype"]]]
        self._sm_count: int | None = None
        # stream handle -> the family's workspace buffer (zeroed on that stream by zeroed_workspace)
        self._workspace: dict[int, torch.Tensor] = {}
        # (stream handle, sizes) -> the family's scratch for launches of those sizes on that
        # stream (zeroed once, when allocated; the oldest goes past MAX_SCRATCHES)
        self._scratch: OrderedDict[tuple[int, int, int, int, int], torch.Tensor] = OrderedDict()

    # -- loading -----------------------------------------------------------------

    @classmethod
    def load(cls, artifact: Artifact | str | Path, *, device: int | torch.device | None = None,
             cache: bool = True, family: KernelFamily | str | None = None) -> "KernelModule":
        """Load (or fetch from the cache) a cubin given as an Artifact or a path.

        ``family`` defaults to the artifact's (a path: the default family)."""
        dev = _device_index(device)
        if family is None:
            family = artifact.family if isinstance(artifact, Artifact) and artifact.family else DEFAULT_FAMILY
        fam = family if isinstance(family, KernelFamily) else get_family(family)
        if isinstance(artifact, Artifact):
            path, key, expected = Path(artifact.cubin), artifact.key, artifact.meta
            entry = artifact.entry or fam.entry
            image = None
        else:
            path = Path(artifact)
            try:
                image = path.read_bytes()
            except OSError as exc:
                raise EvotunerError(f"{path}: cannot read the cubin ({exc.strerror})",
                                    "rebuild it (evotuner compile) or check the path") from None
            key, entry, expected = hashlib.sha256(image).hexdigest(), fam.entry, None
        if cache:
            hit = cls._cache.get((dev, key))
            if hit is not None:
                return hit
        if image is None:
            try:
                image = path.read_bytes()
            except OSError as exc:
                raise EvotunerError(f"{path}: cannot read the cubin ({exc.strerror})",
                                    "clear the build cache and rebuild") from None
        mod = cls._load_image(image, dev, key, entry, str(path), expected, fam)
        if cache:
            with cls._cache_lock:
                mod = cls._cache.setdefault((dev, key), mod)
        return mod

    @classmethod
    def _load_image(cls, image: bytes, device: int, key: str, entry: str, source: str,
                    expected: Mapping[str, int] | None, family: KernelFamily) -> "KernelModule":
        torch.cuda.init()
        cuda.ensure_context(device)
        module = cuda.module_load_data(image)
        try:
            function = cuda.module_get_function(module, entry)
            symbol = family.meta_symbol
            ptr, size = cuda.module_get_global(module, symbol)
            meta = family.decode_meta(cuda.memcpy_dtoh(ptr, size), source=f"{source}: {symbol}")
            if expected:
                diff = meta_mismatch(meta, expected)
                if diff is not None:
                    raise MetaError(f"{source}: {symbol} on the device differs from the build's ({diff})",
                                    "clear the build cache and rebuild")
            smem = meta["smem_bytes"]
            if smem > cuda.DEFAULT_DYNAMIC_SMEM_LIMIT:
                limit = cuda.device_attribute(device, cuda.DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
                static = cuda.func_get_attribute(function, cuda.FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
                if smem + static > limit:
                    raise SharedMemoryError(
                        f"{source}: needs {smem} B dynamic + {static} B static shared memory per block, "
                        f"device {device} allows {limit} B",
                        family.gate_hint("smem_per_block", meta),
                    )
                cuda.func_set_attribute(function, cuda.FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem,
                                        what="MAX_DYNAMIC_SHARED_SIZE_BYTES")
        except BaseException:
            cuda.module_unload(module)
            raise
        return cls(module, function, meta, device, key, entry, source, family)

    # -- facts -------------------------------------------------------------------

    @property
    def threads(self) -> int:
        return self.meta["threads"]

    @property
    def smem_bytes(self) -> int:
        return self.meta["smem_bytes"]

    @property
    def head_dim(self) -> int:
        return self.meta["head_dim"]

    @property
    def causal(self) -> bool:
        return bool(self.meta["is_causal"])

    @property
    def sm_count(self) -> int:
        if self._sm_count is None:
            self._sm_count = cuda.device_attribute(self.device, cuda.DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        return self._sm_count

    # -- launching -------------------------------------------------------------------

    def launch_spec(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                    lse: torch.Tensor | None, scale: float, workspace: int = 0, scratch: int = 0) -> LaunchSpec:
        """The family's argument bytes and geometry for tensors in the [B, H, S, D] view."""
        args = AttentionArgs(q=_view(q), k=_view(k), v=_view(v), o=_view(o),
                             lse=_view(lse) if lse is not None else None,
                             dtype=DTYPE_NAMES[self.meta["dtype"]], scale=float(scale), workspace=workspace,
                             scratch=scratch)
        return self.family.launch(self.meta, args, DeviceInfo(self.device, self.sm_count))

    def launch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
               lse: torch.Tensor | None, scale: float, stream: int | torch.cuda.Stream | None = None) -> None:
        """Launch on ``stream`` (default: torch's current stream on the module's device).

        q, o: [B, H, Sq, D]; k, v: [B, H, Sk, D]; lse: fp32 [B, H, Sq] contiguous or None.
        The checks here are the ones that would make the kernel read or write out
        of bounds; user-facing validation is evotuner.flash_attention's.
        """
        self._check_launch(q, k, v, o, lse)
        if isinstance(stream, torch.cuda.Stream):
            handle = stream.cuda_stream
        elif stream is None:
            handle = torch.cuda.current_stream(self.device).cuda_stream
        else:
            handle = int(stream)
        cuda.ensure_context(self.device)
        B, H, Sq, _ = q.shape
        spec = self.launch_spec(q, k, v, o, lse, scale, self.zeroed_workspace(handle),
                                self.scratch(handle, B, H, Sq, k.shape[2]))
        cuda.launch_kernel(self.function, spec.grid, spec.block, spec.smem_bytes,
                           handle, spec.args, what=f"cuLaunchKernel({self.entry} from {self.source})")

    __call__ = launch

    def launch_varlen(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                      lse: torch.Tensor | None, scale: float, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                      max_seqlen_q: int, max_seqlen_k: int, stream: int | None = None) -> None:
        """A packed variable-length batch (a kernel built with ``Problem.varlen``): q, o
        [total_q, H, D]; k, v [total_k, HKV, D]; ``cu_seqlens_*`` int32 [batch + 1] on the
        module's device; lse fp32 [H, total_q] or None. ``max_seqlen_*`` must be at least every
        sequence's length (the grid spans them; FlashAttention's contract). Offsets that
        overrun the packed tensors read zeros and write nothing outside them."""
        if not self.meta.get("varlen"):
            raise ShapeError(f"{self.source}: a dense kernel; a packed batch needs one built for Problem(varlen=True)")
        for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
            if t.dim() != 3:
                raise ShapeError(f"{name}: expected a 3-D packed [total, H, D] tensor, got {t.dim()}-D")
            if t.dtype != self.dtype or t.device.type != "cuda" or t.device.index != self.device:
                raise ShapeError(f"{name}: {t.dtype} on {t.device}; the kernel is {self.dtype} on cuda:{self.device}")
            if t.shape[2] != self.head_dim or t.stride(2) != 1:
                raise ShapeError(f"{name}: head dim {t.shape[2]} (stride {t.stride(2)}); the kernel takes "
                                 f"D={self.head_dim}, contiguous")
        total_q, H, D = q.shape
        if tuple(o.shape) != tuple(q.shape):
            raise ShapeError(f"o: shape {tuple(o.shape)} must equal q's {tuple(q.shape)}")
        if k.shape != v.shape or k.shape[1] < 1 or H % k.shape[1]:
            raise ShapeError(f"k/v: shapes {tuple(k.shape)} and {tuple(v.shape)} must be [total_k, HKV, D={D}] "
                             f"with HKV dividing H={H}")
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            if cu.dtype != torch.int32 or cu.dim() != 1 or not cu.is_contiguous() or cu.device != q.device:
                raise ShapeError(f"{name}: must be a contiguous int32 1-D tensor on {q.device}")
        if cu_seqlens_q.numel() != cu_seqlens_k.numel() or cu_seqlens_q.numel() < 2:
            raise ShapeError(f"cu_seqlens_q/k: {cu_seqlens_q.numel()} and {cu_seqlens_k.numel()} entries; both "
                             f"must be batch + 1 >= 2")
        batch = cu_seqlens_q.numel() - 1
        if lse is not None and (lse.dtype != torch.float32 or tuple(lse.shape) != (H, total_q)
                                or not lse.is_contiguous() or lse.device != q.device):
            raise ShapeError(f"lse: must be a contiguous fp32 [H={H}, total_q={total_q}] tensor on {q.device}")
        if H > MAX_GRID_YZ or batch > MAX_GRID_YZ:
            raise ShapeError(f"q: H={H}, batch={batch}; each must be at most {MAX_GRID_YZ} (grid y/z limit)")
        handle = torch.cuda.current_stream(self.device).cuda_stream if stream is None else int(stream)
        if total_q == 0 or max_seqlen_q <= 0:
            return                                   # no query row: nothing to compute
        if k.shape[0] == 0 or max_seqlen_k <= 0:     # no key anywhere: softmax over nothing
            o.zero_()
            if lse is not None:
                lse.fill_(float("-inf"))
            return

        def packed(t: torch.Tensor) -> TensorView:   # [total, H, D] -> the [1, H, total, D] view
            return TensorView(ptr=t.data_ptr(), shape=(1, t.shape[1], t.shape[0], t.shape[2]),
                              strides=(t.shape[0] * t.stride(0), t.stride(1), t.stride(0), 1))

        cuda.ensure_context(self.device)
        args = AttentionArgs(q=packed(q), k=packed(k), v=packed(v), o=packed(o),
                             lse=_view(lse) if lse is not None else None, dtype=DTYPE_NAMES[self.meta["dtype"]],
                             scale=float(scale), workspace=self.zeroed_workspace(handle),
                             varlen=VarlenArgs(cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), batch,
                                               int(max_seqlen_q), int(max_seqlen_k)))
        spec = self.family.launch(self.meta, args, DeviceInfo(self.device, self.sm_count))
        cuda.launch_kernel(self.function, spec.grid, spec.block, spec.smem_bytes, handle, spec.args,
                           what=f"cuLaunchKernel({self.entry} from {self.source})")

    def zeroed_workspace(self, stream: int) -> int:
        """The family's workspace for launches on ``stream``: zeroed on that stream when it is
        allocated, then reused as every launch leaves it (zero: the family's contract,
        ``KernelFamily.workspace_bytes``); 0 when the family needs none."""
        nbytes = self.family.workspace_bytes(self.meta)
        if nbytes <= 0:
            return 0
        buf = self._workspace.get(stream)
        if buf is None or buf.numel() < nbytes:
            buf = self._workspace[stream] = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{self.device}")
            cuda.memset_d8_async(buf.data_ptr(), 0, nbytes, stream)
        return buf.data_ptr()

    def scratch(self, stream: int, batch: int, heads: int, seqlen_q: int, seqlen_k: int) -> int:
        """The device pointer of :meth:`scratch_buffer` (0 when the family needs none)."""
        buf = self.scratch_buffer(stream, batch, heads, seqlen_q, seqlen_k)
        return 0 if buf is None else buf.data_ptr()

    def scratch_buffer(self, stream: int, batch: int, heads: int, seqlen_q: int,
                       seqlen_k: int) -> torch.Tensor | None:
        """The family's scratch for launches of these sizes on ``stream``: zeroed on that
        stream when allocated, then reused as the kernel leaves it; None when the family needs
        none. One buffer per (stream, sizes): the kernel lays its scratch out by the sizes,
        so a buffer another shape used could hold that shape's data where this one keeps
        counters that must start at zero. The module keeps the last MAX_SCRATCHES; a caller
        that keeps launching with one (a plan) keeps a reference to it."""
        nbytes = self.family.scratch_bytes(self.meta, batch, heads, seqlen_q, seqlen_k)
        if nbytes <= 0:
            return None
        key = (stream, batch, heads, seqlen_q, seqlen_k)
        buf = self._scratch.get(key)
        if buf is None:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{self.device}")
            cuda.memset_d8_async(buf.data_ptr(), 0, nbytes, stream)
            self._scratch[key] = buf
            while len(self._scratch) > MAX_SCRATCHES:   # freed in stream order by torch's allocator
                self._scratch.popitem(last=False)
        else:
            self._scratch.move_to_end(key)
        return buf

    def _check_launch(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                      lse: torch.Tensor | None) -> None:
        for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
            if t.dim() != 4:
                raise ShapeError(f"{name}: expected a 4-D [B, H, S, D] tensor, got {t.dim()}-D")
            if t.dtype != self.dtype:
                raise ShapeError(f"{name}: dtype {t.dtype} but the kernel was built for {self.dtype}")
            if t.device.type != "cuda" or t.device.index != self.device:
                raise ShapeError(f"{name}: on {t.device}, the kernel is loaded on cuda:{self.device}")
            if t.shape[3] != self.head_dim:
                raise ShapeError(f"{name}: head dim D={t.shape[3]} but the kernel was built for D={self.head_dim}")
            if t.stride(3) != 1:
                raise ShapeError(f"{name}: last dim (D) stride is {t.stride(3)}, must be 1")
        B, H, Sq, D = q.shape
        if tuple(o.shape) != (B, H, Sq, D):
            raise ShapeError(f"o: shape {tuple(o.shape)} must equal q's {tuple(q.shape)}")
        if k.shape != v.shape or k.shape[0] != B or k.shape[1] < 1 or H % k.shape[1]:
            raise ShapeError(f"k/v: shapes {tuple(k.shape)} and {tuple(v.shape)} must be [B={B}, HKV, Sk, D={D}] "
                             f"with HKV dividing H={H}")
        if lse is not None:
            if lse.dtype != torch.float32 or tuple(lse.shape) != (B, H, Sq) or not lse.is_contiguous() \
                    or lse.device != q.device:
                raise ShapeError(f"lse: must be a contiguous fp32 [B={B}, H={H}, Sq={Sq}] tensor on {q.device}")
        if H > MAX_GRID_YZ or B > MAX_GRID_YZ:
            raise ShapeError(f"q: B={B}, H={H}; each must be at most {MAX_GRID_YZ} (grid y/z limit)")

    def __repr__(self) -> str:
        m = self.meta
        own = ", ".join(f"{f}={m[f]}" for f in self.family.meta_fields if f in m)
        return (f"KernelModule({self.family.name}: {self.source}, D={m['head_dim']}, {DTYPE_NAMES[m['dtype']]}, "
                f"causal={bool(m['is_causal'])}, {own + ', ' if own else ''}"
                f"threads={m['threads']}, smem={m['smem_bytes']})")


def _device_index(device: int | torch.device | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, torch.device):
        return device.index if device.index is not None else torch.cuda.current_device()
    return int(device)


def tensor_view(t: torch.Tensor) -> TensorView:
    """The family-side view of a tensor: device pointer, shape and strides in elements."""
    return _view(t)


def _view(t: torch.Tensor) -> TensorView:
    return TensorView(ptr=t.data_ptr(), shape=tuple(t.shape), strides=tuple(t.stride()))
