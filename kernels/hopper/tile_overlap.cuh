// Hopper family: cross-tile pipelining (TILE_OVERLAP=1; persistent, non-causal dense).
// A consumer warpgroup's tiles run back to back without most of the tile boundary's bubble:
// the next tile's Q is already in (double-buffered: the producer loaded it while this tile
// ran), so right after this tile's last O += P V retires and O / l is in the staging slab,
// the warpgroup issues the next tile's first S = Q K^T and stores this tile's O (fence,
// barrier, TMA store) while the tensor cores compute it. (Issuing that Q K^T earlier, under
// the P V or before the slab is written, keeps S live beside the fp32 or packed O: the
// 160-register consumers of three warpgroups spill.)
// Members of Consumer (consumer.cuh includes this file after the class).
//
// Handshakes (every warpgroup, rows or not, keeps the same count, so the ping-pong ring and
// every barrier phase match): per tile, n_blocks + 1 turns (its first Q K^T, n_blocks - 1
// overlap steps, its last P V), as run_tile; each K and V block released
// once, after its load landed; each tile's Q buffer released once by every consumer thread,
// after the tile's last Q K^T retired and after the thread read the tile's slot.
#pragma once

namespace hopper {

// The CTA's tile number `local` (0, 1, ...), after its Q landed; -1 when the CTA has no
// such tile (SCHED 2: the producer published -1; SCHED 1: past the static walk).
template <class T>
__device__ __forceinline__ int Consumer<T>::fetch_tile(int local, int num_tiles) const {
    if constexpr (T::kDynamic) {
        mbar_wait(sm.q_full(local & 1), (local >> 1) & 1);
        return static_cast<int>(ld_shared_u32(sm.tile_slot(local & 1)));
    } else {
        const int tile = first_tile<T>() + local * tile_stride<T>();
        if (tile >= num_tiles) return -1;
        mbar_wait(sm.q_full(local & 1), (local >> 1) & 1);
        return tile;
    }
}

template <class T>
__device__ __forceinline__ void Consumer<T>::run_tiles_overlapped(int num_tiles) {
    float s[T::kSRegs];
    uint32_t pr[T::kPRegs];
    float corr[2];
    // One iteration = the two turns that end tile local-1 and start tile local, then tile
    // local's key blocks. Nothing is in flight across the back edge (ptxas would move the
    // accumulators there and serialize every wgmma); what crosses it: O, P and the row
    // statistics of the tile to finish, and its TileInfo t.
    // Liveness: whether this warpgroup has rows in a tile is a runtime fact the compiler
    // cannot follow from one tile to the next, so every path defines O, P and S before the
    // code that reads them (zeros where nothing else does). Else their old values would count
    // as live beside the S in flight, and spill.
    bool mine = false;      // tile t (local-1) has rows of this warpgroup; false before the first
    int nb = 0;             // tile t's key blocks
    const uint32_t q_base0 = q_base;
    for (int local = 0;; ++local) {
        const int b = local & 1;   // tile local's Q buffer
        const int kvn = kv + nb;                     // ring iteration of tile local's first block
        const int sl = stage_of<T>(kvn - 1);         // tile t's last block (mine only)
        // Turn 1: tile t's last P V; once it retired, the LSE and O / l into the staging slab.
        pp_sync();
        if (mine) {
            mbar_wait(sm.v_full(sl), phase_of<T>(kvn - 1));
            issue_pv(pr, sl);
            pp_arrive();
            wgmma_wait<0>();
            pin(o);
            pin(pr);
            release(sm.v_empty(sl));
            epilogue_stage();
        } else {
            pp_arrive();
        }
        // Tile local, once its Q landed (loaded while tile t ran; waited for here, not before
        // turn 1, so a late Q never holds back tile t's last P V). Kept as an index: its
        // TileInfo is built after the epilogue (160-register consumers spill with two live).
        const int next = fetch_tile(local, num_tiles);
        const bool more = next >= 0;
        const bool next_mine = more && tile_info<T>(p, next).m0 + g * 64 < p.seqlen_q;   // rows of this WG
        // Turn 2: the next tile's first Q K^T (its Q was loaded while tile t ran); tile t's
        // staged O goes out (fence, the warpgroup's barrier, the TMA store) under it. From
        // here on this warpgroup's Q K^T read tile local's buffer.
        q_base = q_base0 + b * T::kQBytes;
        pp_sync();
        if (next_mine) {
            load_q();
            mbar_wait(sm.k_full(stage_of<T>(kvn)), phase_of<T>(kvn));
            issue_qk(s, stage_of<T>(kvn));
            pp_arrive();
            if (mine) epilogue_commit();
            wgmma_wait<0>();
            pin(s);
        } else {
            pp_arrive();
            if (mine) epilogue_commit();
#pragma unroll
            for (int i = 0; i < T::kSRegs; ++i) s[i] = 0.f;   // (see "Liveness" above)
        }
        if (!more) break;
        t = tile_info<T>(p, next);
        mine = next_mine;
        kv = kvn;
        nb = t.n_blocks;
#pragma unroll
        for (int i = 0; i < T::kORegs; ++i) o[i] = 0.f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
        ms[0] = ms[1] = 0.f;
        if (mine) {
            // The first block: its S is in (the turn above); no O to rescale yet.
            release(sm.k_empty(stage_of<T>(kv)));
            softmax_any(s, t.n_top - 1, corr);
            to_p(s, pr);
            const int n_masked_iters = nb - max(t.n_unmasked, 0);
            int it = 1;
            for (; it < n_masked_iters; ++it) overlap_step<true>(s, pr, corr, it);
            for (; it < nb; ++it) overlap_step<false>(s, pr, corr, it);
        } else {
            // No rows here (the ragged last query block): its side of every handshake (the
            // first block's turn was the one above).
            pass_loads(0);
            for (int it = 1; it < nb; ++it) pass_block(it);
#pragma unroll
            for (int i = 0; i < T::kPRegs; ++i) pr[i] = 0u;   // (see "Liveness" above)
        }
        // Every Q K^T of tile t has retired and its slot was read: its Q buffer is free.
        mbar_arrive(sm.q_empty(b));
    }
}

}  // namespace hopper
