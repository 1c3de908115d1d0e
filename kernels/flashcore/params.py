"""ctypes mirror of ``flashcore::Params`` (kernels/flashcore/params.h), FlashCore's own
kernel argument. tests/test_params_abi.py compiles params.h on the host and compares
every offset."""

from __future__ import annotations

import ctypes
from ctypes import c_float, c_int32, c_int64, c_void_p

#: FlashCore's own meta fields, after the common ones (evotuner/abi.py), in index order:
#: FLASHCORE_META_BLOCK_M, FLASHCORE_META_BLOCK_N in params.h.
META_FIELDS: tuple[str, ...] = ("block_m", "block_n")


class Params(ctypes.Structure):
    """``flashcore::Params`` (params.h), passed by value as the kernel's one argument."""

    _fields_ = [
        ("q", c_void_p),
        ("k", c_void_p),
        ("v", c_void_p),
        ("o", c_void_p),
        ("lse", c_void_p),
        ("q_batch_stride", c_int64), ("q_head_stride", c_int64), ("q_row_stride", c_int64),
        ("k_batch_stride", c_int64), ("k_head_stride", c_int64), ("k_row_stride", c_int64),
        ("v_batch_stride", c_int64), ("v_head_stride", c_int64), ("v_row_stride", c_int64),
        ("o_batch_stride", c_int64), ("o_head_stride", c_int64), ("o_row_stride", c_int64),
        ("batch", c_int32), ("heads", c_int32), ("seqlen_q", c_int32), ("seqlen_k", c_int32),
        ("scale", c_float),
        ("scale_log2", c_float),
        ("kv_group", c_int32),
    ]
