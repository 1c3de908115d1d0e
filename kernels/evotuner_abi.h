// The evotuner kernel ABI shared by every kernel family, by the build stage and by
// the runtime (evotuner/abi.py is its one Python mirror; tests/test_params_abi.py
// compiles this header on the host and compares every value).
//
// Every instantiation of every family defines one constant table
//
//   extern "C" { __constant__ int32_t <meta symbol>[EVOTUNER_META_COMMON_LEN + <family fields>]; }
//
// whose first EVOTUNER_META_COMMON_LEN entries are the ones below, in this order,
// followed by the family's own fields (the family's Python side names them, in
// order: KernelFamily.meta_fields). The build stage reads the table from the
// cubin's ELF; the runtime reads it with cuModuleGetGlobal. The launch geometry
// (threads, dynamic shared memory) comes from here, never recomputed.
//
// Each family owns its kernel-argument struct (Params) and its grid; nothing
// about them is shared.
#pragma once

#include <stdint.h>

#define EVOTUNER_ABI_VERSION 3

#define EVOTUNER_META_ABI 0         /* EVOTUNER_ABI_VERSION */
#define EVOTUNER_META_THREADS 1     /* threads per block */
#define EVOTUNER_META_SMEM_BYTES 2  /* dynamic shared memory per block */
#define EVOTUNER_META_HEAD_DIM 3
#define EVOTUNER_META_IS_CAUSAL 4   /* 0 / 1 */
#define EVOTUNER_META_DTYPE 5       /* EVOTUNER_DTYPE_* */
#define EVOTUNER_META_MIN_BLOCKS 6  /* blocks per SM the kernel is built for (__launch_bounds__) */
#define EVOTUNER_META_COMMON_LEN 7  /* the family's own fields start here */

#define EVOTUNER_DTYPE_FP16 0
#define EVOTUNER_DTYPE_BF16 1
