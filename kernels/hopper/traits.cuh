// Hopper family forward: every compile-time knob in one traits template.
// An impossible config dies here with a static_assert naming the knob.
#pragma once

#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace hopper {

template <typename Element> struct ElementInfo;
template <> struct ElementInfo<__half> { static constexpr int kDtype = 0; };         // HOPPER_DTYPE 0
template <> struct ElementInfo<__nv_bfloat16> { static constexpr int kDtype = 1; };  // HOPPER_DTYPE 1

template <int HEAD_DIM_, int BLOCK_N_, int STAGES_, int CONSUMER_WGS_, int REG_PROD_, int REG_CONS_, int OVERLAP_,
          int PINGPONG_, int SCHED_, bool IS_CAUSAL_, typename Element_, int RESCALE_LOG2_ = 0, int EXP_EMU_ = 0,
          bool VARLEN_ = false, int SPLITS_ = 1, int PACK_GQA_ = 0, int CTAS_PER_SM_ = 1, int CLUSTER_ = 1,
          int TILE_OVERLAP_ = 0, int Q_IN_REGS_ = 0>
struct Traits {
    using Element = Element_;
    static constexpr int kDtype = ElementInfo<Element>::kDtype;
    static constexpr int kHeadDim = HEAD_DIM_;
    static constexpr int kWGs = CONSUMER_WGS_;  // consumer warpgroups, 64 query rows each
    static constexpr int kBlockM = 64 * kWGs;
    static constexpr int kBlockN = BLOCK_N_;
    static constexpr int kStages = STAGES_;
    static constexpr int kRegProd = REG_PROD_;
    static constexpr int kRegCons = REG_CONS_;
    static constexpr bool kOverlap = OVERLAP_ != 0;
    static constexpr bool kPingpong = PINGPONG_ != 0;
    static constexpr bool kIsCausal = IS_CAUSAL_;
    // Packed variable-length batches (Params::cu_seqlens_q/k; params.h): a build of its own,
    // so the dense kernels carry none of its code (the producer has 24-32 registers).
    static constexpr bool kVarlen = VARLEN_;
    // Split-KV: the key blocks of a tile are divided among kSplits CTAs (grid x = m blocks *
    // kSplits); each writes its fp32 partial O and LSE to Params::scratch, and the last CTA
    // of a tile to finish (a counter per tile) combines them and writes O and the LSE
    // (split.cuh). 1: off. Fills the SMs when the query tiles alone cannot (decoding,
    // few heads with long keys).
    static constexpr int kSplits = SPLITS_;
    static constexpr bool kSplit = SPLITS_ > 1;
    // GQA query-head packing (host side only: family.py views the G query heads of one K/V
    // head as one head of G*Sq rows where the layout allows, non-causal only, so each K/V
    // block is loaded once per tile of G*Sq rows instead of once per query head). The
    // kernel's code is the same; the knob is recorded in the meta table for the host.
    static constexpr bool kPackGqa = PACK_GQA_ != 0;
    // 0: one CTA per (m block, head, batch) tile, grid (ceil(Sq/BLOCK_M), H, B);
    // 1: persistent, grid (min(#SMs, tiles)), tiles strided by gridDim.x; the
    //    epilogue stages O in its own buffer so the next tile's Q/K/V loads
    //    overlap it.
    //    2: persistent with dynamic tile fetch (atomicAdd on Params::tile_counter,
    //    broadcast to the consumers through smem with the Q barrier).
    //    3: 2, with the last wave split (non-causal dense): when the tiles leave a ragged last
    //    round of r < gridDim.x tiles, each of those r tiles is cut into s parts along its key
    //    blocks (s = min(kTailParts, gridDim.x / r, key blocks / 2, scratch slots / r): the host plans
    //    it, launch.py tail_plan, and passes Params::tail_first and tail_parts),
    //    so the last round's work is spread over r*s CTAs instead of r; each warp of a part writes
    //    an fp32 partial to Params::scratch, or, the last to arrive, combines them (tail_split.cuh).
    //    The other CTAs would idle through that round: a Stream-K-style tail, tile_scheduler.cuh.
    static constexpr int kSched = SCHED_;
    static constexpr bool kPersistent = SCHED_ >= 1;
    static constexpr bool kDynamic = SCHED_ >= 2;
    static constexpr bool kTailSplit = SCHED_ == 3;
    static constexpr int kTailParts = 8;   // most parts a tail tile is cut into (launch.py TAIL_PARTS)
    // 0: rescale O whenever a row max grows; k > 0: lazy, keep a stale max until
    // some row of the warp grows by more than k (log2 units; P <= 2^k).
    static constexpr int kRescaleLog2 = RESCALE_LOG2_;
    static constexpr bool kLazyRescale = RESCALE_LOG2_ > 0;
    // 0: every exp2 on MUFU (ex2.approx); k >= 2: one score in k goes through an
    // FMA-pipe polynomial instead (D64 is MUFU-bound: 256 MMA flops per exp).
    static constexpr int kExpEmu = EXP_EMU_;

    // One producer warpgroup (one elected thread issues TMA) + kWGs consumers.
    static constexpr int kThreads = 128 * (kWGs + 1);
    // CTAs resident per SM (__launch_bounds__(kThreads, kCtasPerSm)): 2 lets one CTA's
    // prologue, epilogue and barrier waits run under the other's GEMMs (few waves of 64-row
    // tiles), at half the registers and shared memory each.
    static constexpr int kCtasPerSm = CTAS_PER_SM_;
    // Registers per thread at launch (__launch_bounds__(kThreads, kCtasPerSm)): the pool
    // setmaxnreg redistributes. ptxas does not check the pool: we do.
    // Thread-block clusters along M: CLUSTER_ CTAs take adjacent query tiles of one (head,
    // batch) and read the same K/V blocks, so each K/V tile is fetched from L2 once for the
    // pair: CTA r loads the 64-column panels p with p % 2 == r, multicast into both CTAs'
    // rings (their full barriers expect the whole tile), and each consumer warpgroup frees a
    // stage in both CTAs (the empty barriers count both CTAs' warpgroups). Non-causal dense
    // problems only (the pair's tiles must need the same key blocks in the same order); the
    // grid's x is a multiple of the cluster (an odd last query tile's partner computes
    // nothing and keeps its side of the handshakes). 1: off.
    static constexpr int kCluster = CLUSTER_;
    static constexpr bool kClustered = CLUSTER_ > 1;
    // Cross-tile pipelining (persistent, non-causal dense): once this tile's last O += P V has
    // retired and O is staged in shared memory, a consumer warpgroup issues the next tile's
    // first S = Q K^T and stores this tile's O while it is computed (tile_overlap.cuh). Q is
    // double-buffered (the producer loads tile j+1's Q while tile j runs), each buffer with its
    // own barriers and tile slot. 0: off (a tile starts after the previous one's epilogue).
    static constexpr bool kTileOverlap = TILE_OVERLAP_ != 0;
    static constexpr int kQBufs = kTileOverlap ? 2 : 1;
    // S = Q K^T with Q from registers (RS-wgmma, K K-major) instead of shared memory: each
    // consumer warpgroup reads its 64 rows of Q into wgmma A fragments once per tile
    // (ldmatrix), 4 registers per k16 step (32 at D=128), so the Q K^T of every key block reads
    // only K from shared memory. 0: off (SS-wgmma, Q re-read from shared memory every block).
    static constexpr bool kQInRegs = Q_IN_REGS_ != 0;
    static constexpr int kLaunchRegs = (65536 / (kThreads * kCtasPerSm) / 8) * 8 > 255
                                           ? 255 : (65536 / (kThreads * kCtasPerSm) / 8) * 8;
    static constexpr int kPool = kThreads * kLaunchRegs;
    static constexpr int kPoolUsed = 128 * (kRegProd + kWGs * kRegCons);

    // 64-column (128-byte) swizzle panels; D=96 takes two, the second half-used: its tiles
    // are laid out as D=128's ([2][rows][64]), the TMA loads zero-fill columns 96..127 (the
    // maps' inner extent is 96), and no MMA reads them (QK^T stops at k = 96, PV at N = 96).
    static constexpr int kPanels = (kHeadDim + 63) / 64;
    static constexpr int kDimPad = 64 * kPanels;           // smem tile width (elements)
    // D=96 ("narrow" last panel): the maps are {D, S, 1, H, B} and each 64-column panel is its
    // own TMA (x coordinate 64*panel); else {64, S, D/64, H, B}, one TMA per tile (params.h).
    static constexpr bool kNarrow = kHeadDim % 64 != 0;
    static constexpr int kKStepsQK = kHeadDim / 16;        // k16 steps of S = Q K^T
    static constexpr int kKStepsPV = kBlockN / 16;         // k16 steps of O += P V
    // Columns of O the PV wgmma computes (its N): D. HOPPER_PV_PADDED=1 (a dev switch, not a
    // space knob) computes D=96's padded 128 columns (the zero ones dropped by the epilogue),
    // should N=96 over the 128B-swizzled MN-major V tile ever prove wrong on a GPU.
#if defined(HOPPER_PV_PADDED) && HOPPER_PV_PADDED
    static constexpr int kPvCols = kDimPad;
#else
    static constexpr int kPvCols = kHeadDim;
#endif
    static constexpr int kSRegs = kBlockN / 2;             // fp32 S accumulator per thread
    static constexpr int kORegs = kPvCols / 2;             // fp32 O accumulator per thread
    static constexpr int kPRegs = kBlockN / 4;             // packed 16-bit P per thread
    static constexpr int kQRegs = kQInRegs ? 4 * kKStepsQK : 1;   // Q_IN_REGS: Q's A fragments per thread

    // Shared memory (bytes, from a 1024-B aligned base): Q (two buffers with TILE_OVERLAP), STAGES K, STAGES V,
    // the O staging tile (persistent only; else O is staged in Q's slab), then
    // the mbarriers. Tiles are [panels][rows][64] as TMA writes them (D=96: padded to 128).
    static constexpr int kQBytes = kBlockM * kDimPad * 2;
    static constexpr int kKVBytes = kBlockN * kDimPad * 2;
    static constexpr int kOffK = kQBufs * kQBytes;
    static constexpr int kOffV = kOffK + kStages * kKVBytes;
    static constexpr int kOffO = kOffV + kStages * kKVBytes;
    static constexpr int kOBytes = kPersistent ? kQBytes : 0;
    static constexpr int kOffBar = kOffO + kOBytes;
    // (q_full, q_empty) per Q buffer, k_full[], k_empty[], v_full[], v_empty[]
    static constexpr int kNumBars = 2 * kQBufs + 4 * kStages;
    static constexpr int kBarBytes = ((kNumBars * 8 + 8 /* tile slots, 4 B per Q buffer */ + 127) / 128) * 128;
    static constexpr int kSmemBytes = 1024 /* alignment slack */ + kOffBar + kBarBytes;

    static_assert(sizeof(Element) == 2, "Element must be __half or __nv_bfloat16");
    static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 192 || kHeadDim == 256,
                  "HEAD_DIM must be 64, 96, 128, 192 or 256 (128B-swizzle panels of 64 columns; 96 pads to 128)");
    static_assert(kWGs >= 1 && kWGs <= 3, "CONSUMER_WGS must be 1, 2 or 3 (BLOCK_M = 64*CONSUMER_WGS)");
    static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256,
                  "BLOCK_N must be a multiple of 16 in 16..256 (wgmma N, P's k16 slices, TMA box <= 256)");
    static_assert(kStages >= 1 && kStages <= 8, "STAGES must be in 1..8");
    static_assert(kRegProd % 8 == 0 && kRegProd >= 24 && kRegProd <= 256, "REG_PROD must be a multiple of 8 in 24..256");
    static_assert(kRegCons % 8 == 0 && kRegCons >= 24 && kRegCons <= 256, "REG_CONS must be a multiple of 8 in 24..256");
    static_assert(kRegProd <= kLaunchRegs, "REG_PROD must not exceed the launch register count (setmaxnreg.dec)");
    static_assert(kRegCons >= kLaunchRegs, "REG_CONS must be >= the launch register count (setmaxnreg.inc)");
    static_assert(kPoolUsed <= kPool,
                  "register pool: 128*(REG_PROD + CONSUMER_WGS*REG_CONS) exceeds THREADS*launch registers "
                  "(setmaxnreg.inc would block forever)");
    static_assert(!kPingpong || (kOverlap && kWGs >= 2), "PINGPONG needs OVERLAP=1 and CONSUMER_WGS >= 2");
    static_assert(kRescaleLog2 >= 0 && kRescaleLog2 <= 10, "RESCALE_LOG2 must be 0 (eager) or 1..10 (P <= 2^k, fp16-safe)");
    static_assert(kExpEmu == 0 || (kExpEmu >= 2 && kExpEmu <= 16), "EXP_EMU must be 0 (off) or 2..16");
    static_assert(kSplits >= 1 && kSplits <= 128, "SPLITS must be in 1..128 (1: no split)");
    static_assert(!kSplit || kSched == 0, "SPLITS > 1 needs SCHED=0 (one CTA per (tile, split))");
    static_assert(!kSplit || !kVarlen, "SPLITS > 1 is not built for packed variable-length batches");
    static_assert(PACK_GQA_ == 0 || PACK_GQA_ == 1, "PACK_GQA must be 0 or 1");
    static_assert(kSched >= 0 && kSched <= 3,
                  "SCHED must be 0 (one CTA per tile), 1 (persistent), 2 (dynamic) or 3 (dynamic, last wave split)");
    static_assert(!kTailSplit || (!kIsCausal && !kVarlen && !kSplit && !kClustered && !kTileOverlap),
                  "SCHED=3 (the last wave split) needs a non-causal dense problem without SPLITS, CLUSTER or "
                  "TILE_OVERLAP");
    static_assert(kSmemBytes <= 232448,
                  "shared memory ((1+SCHED)*BLOCK_M*D_PAD*2 + 2*STAGES*BLOCK_N*D_PAD*2 + barriers + 1 KiB, D_PAD = HEAD_DIM "
                  "rounded up to 64) exceeds 227 KiB");
    static_assert(kCtasPerSm == 1 || kCtasPerSm == 2, "CTAS_PER_SM must be 1 or 2");
    static_assert(kCtasPerSm * (kSmemBytes + 1024) <= 233472,
                  "CTAS_PER_SM CTAs' shared memory (each + 1 KiB reserved) exceeds the SM's 228 KiB: lower STAGES or BLOCK_N");
    static_assert(kCtasPerSm * kThreads <= 2048, "CTAS_PER_SM x threads exceeds the SM's 2048 threads");
    static_assert(kCluster == 1 || kCluster == 2, "CLUSTER must be 1 (off) or 2 (a pair of CTAs sharing K/V loads)");
    static_assert(!kClustered || (!kIsCausal && !kVarlen && !kSplit),
                  "CLUSTER=2 needs a non-causal dense problem without split-KV (the pair's tiles read the same key blocks)");
    static_assert(!kClustered || kSched <= 1, "CLUSTER=2 needs SCHED 0 or 1 (the pair walks its tiles in lockstep)");
    static_assert(!kClustered || kCtasPerSm == 1, "CLUSTER=2 needs CTAS_PER_SM=1");
    static_assert(!kClustered || !kNarrow, "CLUSTER=2 needs a head dim that is a multiple of 64 (whole panels)");
    static_assert(TILE_OVERLAP_ == 0 || TILE_OVERLAP_ == 1, "TILE_OVERLAP must be 0 or 1");
    static_assert(!kTileOverlap || (kPersistent && kOverlap && !kSplit && !kClustered && !kIsCausal && !kVarlen),
                  "TILE_OVERLAP=1 needs SCHED 1 or 2, OVERLAP=1 and a non-causal dense problem without split-KV or "
                  "CTA pairs");
    static_assert(Q_IN_REGS_ == 0 || Q_IN_REGS_ == 1, "Q_IN_REGS must be 0 or 1");
    static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles must keep 1024-B (swizzle atom) alignment");
};

}  // namespace hopper
