// Lab version 10: a warp-specialised Hopper forward (issue 63; LAB.md, "v10"). A lab module only,
// after the production files and `lab/wgmma.cuh`; head dimension 64, 16-bit inputs, sm_90a (or the
// emulator).
//
// - Block: 3 warpgroups, 384 threads, 128 query rows. Warpgroup 0 is the producer: it gives its
//   registers back (setmaxnreg.dec to 24), its first warp loads every K and V tile of the block's
//   sweep by TMA into a ring of NS10 stages (one elected lane issues the copies; the 32 lanes copy the
//   tile's 64 inverse key norms), and its other three warps exit. Warpgroups 1 and 2 are consumers
//   of 64 query rows each (setmaxnreg.inc to 240: 24 x 128 + 240 x 256 of the 64K registers).
// - Hand-offs: stage s has a `full` mbarrier (the elected lane's arrive.expect_tx with the tile's
//   bytes, which the TMA copies complete, and the 32 lanes' arrivals after their norms) and an
//   `empty` one (the 256 consumer threads' arrivals once their products on the stage are done).
//   Q (the block's 128 rows) comes by TMA once, on its own barrier.
// - Tiles: TMA writes rows of 64 values (128 bytes) with the 128-byte swizzle; `wgmma` reads them
//   through swizzled descriptors, Q and K K-major (S = Q K^T), V MN-major (O += P V, P from
//   registers). The maps are (d, T, H, B), so rows past T are zeros within each head.
// - The consumers' element-wise step, masking, statistics and output are v5's (`elementwise5`,
//   `finish_rows5`); LSSA and softmax in one kernel (MODE 0), re-weighting as v5's statistics and
//   second-sweep kernels (MODE 1, 2).
// - Overlap between the consumers: a named-barrier ping-pong, each warpgroup issuing its products for
//   a tile (S = Q K^T of the tile, P V of the tile before) only after the other has issued its own, so
//   that one warpgroup's element-wise step runs while the other's products occupy the tensor cores;
//   and within a consumer, the element-wise step of tile j runs while the P V of tile j - 1 does.

#if HAVE_WGMMA && HD == 64

// A TMA tensor map: a CUtensorMap's 128 bytes (128-byte aligned, as CUDA 13 declares it), encoded on
// the host (cuTensorMapEncodeTiled; the emulator keeps its own `emu::TensorMap` in them).
struct __align__(128) TmaDesc {
    u64 bits[16];
};
// v10's argument: the kernels' usual one, and q, k, v as (d, T, H, B) maps with boxes of 64 x 64
// (taken `const __grid_constant__`, so that TMA can read the maps where the launch put them).
struct KParams10 {
    KParams p;
    TmaDesc tmap[3];
};

// ---------------------------------------------------------------------------------------------
// Hopper's pipeline instructions: mbarrier, TMA, named barriers, setmaxnreg (emulated in emu.h,
// "Hopper's asynchronous machinery").

#ifdef LSSA_EMU
__device__ __forceinline__ void mbar_init(u64* bar, int count) { emu::mbar_init(bar, count); }
__device__ __forceinline__ void mbar_init_fence() {}
__device__ __forceinline__ void mbar_arrive(u64* bar) { emu::mbar_arrive(bar); }
__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, u32 bytes) { emu::mbar_arrive_expect_tx(bar, bytes); }
__device__ __forceinline__ void mbar_wait(u64* bar, int parity) { emu::mbar_wait(bar, parity); }
__device__ __forceinline__ void tma_load4(void* dst, const TmaDesc* map, int x, int y, int z, int w, u64* bar) {
    const long long at[4] = {x, y, z, w};
    emu::tma_load(dst, (const emu::TensorMap*)map, at, bar);
}
__device__ __forceinline__ void named_sync(int id, int n) { emu::named_sync(id, n); }
__device__ __forceinline__ void named_arrive(int id, int n) { emu::named_arrive(id, n); }
template <int N> __device__ __forceinline__ void setmaxnreg_inc() { emu::setmaxnreg(N, true); }
template <int N> __device__ __forceinline__ void setmaxnreg_dec() { emu::setmaxnreg(N, false); }
#else
__device__ __forceinline__ void mbar_init(u64* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA's completions) before first use.
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* bar, int parity) {
    asm volatile("{\n.reg .pred P1;\nLAB_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                 "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}
// The box of `map` at (x, y, z, w) into `dst`, completing its bytes on `bar`. `map` is the generic
// address of a `__grid_constant__` kernel argument's tensor map.
__device__ __forceinline__ void tma_load4(void* dst, const TmaDesc* map, int x, int y, int z, int w, u64* bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
                 "%5}], [%6];\n" ::"r"(smem_addr(dst)),
                 "l"((u64)map), "r"(x), "r"(y), "r"(z), "r"(w), "r"(smem_addr(bar))
                 : "memory");
}
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
#endif

// ---------------------------------------------------------------------------------------------

#define NS10 4            // stages of the K / V ring
#define TILE10 (64 * HD)  // 16-bit values of one tile of 64 rows (8 KiB)
// Named barriers (0 is __syncthreads'): the consumers' turns of the ping-pong (1 + c: consumer c
// may issue its S), the consumers among themselves, and the consumers with the producer's warp.
#define BAR_TURN10 1
#define BAR_CONSUMERS10 3
#define BAR_SETUP10 4

// A descriptor of a tile as TMA writes it with the 128-byte swizzle: rows of 128 bytes (64 values),
// 8 rows an atom, atoms 1024 bytes apart (the stride byte offset). K-major (Q, K: a row is one M or
// N index), a 16-wide slice of K starts 32 bytes further on; MN-major (V: a row is one key, the K
// index), a block of 16 keys starts 2048 bytes further on. With 64 values a row the leading byte
// offset steps nowhere as the PTX ISA reads (16 by convention); V's descriptor sets it to the atoms'
// 1024 too, which is the same product as read there and the right one should the hardware step the
// K atoms of an MN-major operand by it instead (the TMA probe's P V mode tells on the first GPU).
__device__ __forceinline__ u64 wg_desc_sw128(const void* p, unsigned sbo = 1024, unsigned lbo = 16) {
    return (u64)((wg_smem_addr(p) >> 4) & 0x3fff) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) |
           (1ull << 62);
}

// O += P V for one tile: P (64 rows x 64 keys) from registers as A fragments, V (64 keys x HD)
// MN-major from its stage, 2048 bytes per 16 keys.
__device__ __forceinline__ void pv_issue10(float (*oacc)[HD / 8][4], const u32 (*pa)[4], const u16* Vs) {
#pragma unroll
    for (int kb = 0; kb < BK5 / 16; kb++)
        wgmma64<1>(&oacc[0][0][0], pa[kb], wg_desc_sw128(Vs + kb * 16 * HD, 1024, 1024), 1);
    wg_commit();
}

// Whether this sweep visits key tile kt: all of them, except re-weighting's second sweep where no
// row of the block can give a weight above zero (v5's skip, from the first sweep's tile maxima).
struct Skip10 {
    bool skipping;
    float thr_min;
};

template <int MODE> __device__ __forceinline__ void fwd10_body(const KParams10& a) {
    const KParams& p = a.p;
    // (Re-weighting runs as two kernels, MODE 1 and 2: the host never launches MODE 0 with P > 0, whose
    // single sweep would leave the outputs unweighted.)
    DYN_SMEM(u16, dyn10);
    // The 128-byte swizzle repeats every 1024 bytes of the shared address: align the tiles to it (the
    // launch asks for 1 KiB more than they need).
    u16* const Qs = dyn10 + ((1024 - (wg_smem_addr(dyn10) & 1023)) & 1023) / 2; // 128 rows
    u16* const ring = Qs + 2 * TILE10;                                        // [stage][K | V]
    __shared__ u64 full[NS10], empty[NS10], qbar;
    __shared__ float inkS[NS10][BK5];
#if P > 0
    __shared__ int tmaxS[MAX_TILES5];
    __shared__ int thrMin;
    __shared__ int anyFallback;
#endif
    const int nqb = (p.T + BQ5 - 1) / BQ5;
    int bh;
    const int qb = nqb - 1 - longest_first(bh);
    const int b = bh / p.H, h = bh % p.H;
    const int i0 = qb * BQ5;
    const int ktiles = (p.T + BK5 - 1) / BK5;
    const int nkt = min(ktiles, (i0 + BQ5 + BK5 - 1) / BK5); // causal
    const int wg = threadIdx.x / 128;
    const bool want_v = MODE != 1;
    const int pass = MODE == 2 ? 1 : 0;

    if (threadIdx.x == 0) {
        for (int s = 0; s < NS10; s++) {
            mbar_init(&full[s], 1 + 32);
            mbar_init(&empty[s], 256);
        }
        mbar_init(&qbar, 1);
        mbar_init_fence();
    }
    __syncthreads(); // the last block-wide barrier: the producer's warps 1-3 exit below

    Skip10 skip{false, INFINITY};
    auto needed = [&](int kt) -> bool {
#if P > 0
        return !skip.skipping || unordered(tmaxS[kt]) > skip.thr_min;
#else
        (void)kt;
        return true;
#endif
    };
    auto next_tile = [&](int kt) -> int {
        for (int t = kt; t < nkt; t++)
            if (needed(t)) return t;
        return nkt;
    };
    // Re-weighting's second sweep: the block's skip, from what the consumers computed before
    // BAR_SETUP10 (v5's pass-1 set-up).
    auto read_skip = [&]() {
#if P > 0
        skip.skipping = !RUNNING_MAX && anyFallback == 0 && nkt <= MAX_TILES5;
        skip.thr_min = unordered(thrMin);
#endif
    };

    if (wg == 0) {
        // The producer.
        setmaxnreg_dec<24>();
        if (threadIdx.x >= 32) return;
        const int lane = threadIdx.x;
        if (MODE == 2) {
            named_sync(BAR_SETUP10, 256 + 32);
            read_skip();
        }
        if (lane == 0) {
            mbar_arrive_expect_tx(&qbar, 2 * TILE10 * 2);
            tma_load4(Qs, &a.tmap[0], 0, i0, h, b, &qbar);
            tma_load4(Qs + TILE10, &a.tmap[0], 0, i0 + 64, h, b, &qbar);
        }
        // The key rows' inverse norms follow the (B*H, T) query rows' (plain shapes: key head bh).
        const float* norms = (const float*)p.inv_norms + (long long)p.B * p.H * p.T + (long long)bh * p.T;
        int it = 0;
        for (int kt = next_tile(0); kt < nkt; kt = next_tile(kt + 1), it++) {
            const int s = it % NS10;
            mbar_wait(&empty[s], ((it / NS10) & 1) ^ 1); // (the first round's waits return at once)
            u16* ks = ring + s * 2 * TILE10;
            if (lane == 0) {
                mbar_arrive_expect_tx(&full[s], (want_v ? 2 : 1) * TILE10 * 2);
                tma_load4(ks, &a.tmap[1], 0, kt * BK5, h, b, &full[s]);
                if (want_v) tma_load4(ks + TILE10, &a.tmap[2], 0, kt * BK5, h, b, &full[s]);
            }
            if (COSINE)
                for (int c = lane; c < BK5; c += 32) {
                    const int j = kt * BK5 + c;
                    inkS[s][c] = j < p.T ? norms[j] : 0.f;
                }
            mbar_arrive(&full[s]);
        }
        return;
    }

    // A consumer: warpgroup c = wg - 1 has rows i0 + 64 c .. + 63, warp w % 4 of it 16 of them.
    setmaxnreg_inc<240>();
    const int c = wg - 1, ct = threadIdx.x - 128;
    const int warp = ct >> 5, lane = ct & 31, g = lane >> 2, t4 = lane & 3;
    const int w0 = i0 + 64 * c + 16 * (warp & 3); // the warp's smallest row
    // Row r of this thread: w0 + g + 8 r for r < 2 (one m64 half: v5's row tile 0); none for r >= 2.
    int rows[4];
    float fac[4], bias[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        rows[r] = r < 2 ? w0 + g + 8 * r : p.T;
        const int n = rows[r] + 1;
        fac[r] = row_scale(p, n) * ((COSINE && rows[r] < p.T) ? inv_norm(p, bh, 0, rows[r]) : 1.f);
        bias[r] = row_bias(p, n);
        if (LOG2D) {
            fac[r] *= LOG2E_F;
            bias[r] *= LOG2E_F;
        }
    }
    float oacc[2][HD / 8][4]; // [0] used
#pragma unroll
    for (int nn = 0; nn < HD / 8; nn++)
#pragma unroll
        for (int e = 0; e < 4; e++) oacc[0][nn][e] = oacc[1][nn][e] = 0.f;
    float z[4] = {0.f, 0.f, 0.f, 0.f}, mx[4], fmx[4];
    float ra[4] = {0.f, 0.f, 0.f, 0.f}, rb[4] = {0.f, 0.f, 0.f, 0.f}, rc[4] = {0.f, 0.f, 0.f, 0.f};
    float wsum[4] = {0.f, 0.f, 0.f, 0.f};
    bool fallback[4] = {false, false, false, false};
#pragma unroll
    for (int r = 0; r < 4; r++) mx[r] = fmx[r] = -INFINITY;
#if P > 0
    for (int t = ct; t < MAX_TILES5; t += 256) tmaxS[t] = ordered(-INFINITY);
    int* tilemax = (int*)p.tilemax + tilemax_offset5(bh, qb, nqb, ktiles);
    if (MODE == 2) {
        // The statistics kernel's results (each thread reads the entries it initialised above).
        for (int t = ct; t < min(nkt, MAX_TILES5); t += 256) tmaxS[t] = tilemax[t];
        read_first_sweep5(p, bh, rows, z, mx, fmx);
        if (ct == 0) {
            thrMin = ordered(INFINITY);
            anyFallback = 0;
        }
        named_sync(BAR_CONSUMERS10, 256);
        rw_setup5(rows, p.T, z, fmx, ra, rb, rc, fallback, &anyFallback, &thrMin);
        named_sync(BAR_SETUP10, 256 + 32);
        read_skip();
    } else {
        named_sync(BAR_CONSUMERS10, 256); // tmaxS initialised before any warp's atomicMax
    }
#endif
    // The sweep's tiles are the same for both consumers (and the producer); warpgroup c computes the
    // first n[c] of them, those whose keys start at or before its last row (consumer 0 leaves each
    // block's last tile, past its 64 rows, to consumer 1), and still waits for and releases the rest.
    int n_all = 0, n[2] = {0, 0};
    for (int t = next_tile(0); t < nkt; t = next_tile(t + 1)) {
        n_all++;
        n[0] += t * BK5 <= i0 + 63;
        n[1] += t * BK5 <= i0 + 127;
    }
    const int nc = n[c];
    mbar_wait(&qbar, 0);
    const u16* Qc = Qs + 64 * c * HD; // this warpgroup's 64 rows
    // The ping-pong: a turn is the issue of this warpgroup's products for one tile (S of tile i, and
    // P V of tile i - 1); consumer 0 takes the first. Turn i of consumer 1 waits for consumer 0's turn
    // i, turn i + 1 of consumer 0 for consumer 1's turn i; consumer 1's extra last tile (past
    // consumer 0's rows) waits for nothing. So every arrival is waited for and no barrier is left
    // half full when the block ends.
    if (c == 1 && n[0] > 0) named_arrive(BAR_TURN10 + 0, 256);
    // Within the warpgroup: tile i's S goes with tile i - 1's P V, and is waited for while that
    // product runs (`wait_group 1`), so the element-wise step of tile i overlaps it; tile i - 1's
    // activations stay in `sacc` until the next turn packs them into P's A fragments just before its
    // fence (a register operand written in the loop trip that reads it, which the SASS check of issue
    // 47 tells from a clobbered loop-invariant one). Softmax rescales O in its element-wise step, so
    // there the product is waited for first. The first and last tiles are peeled off the loop, so that
    // no `wgmma` is issued under a condition ptxas cannot prove uniform (it serialises every one then).
    float sacc[2][BK5 / 8][4]; // [0] used: S, then its activations
    int kt = next_tile(0);     // tile i of the sweep
    auto stage = [&](int i) { return ring + (i % NS10) * 2 * TILE10; };
    auto release = [&](int i) { mbar_arrive(&empty[i % NS10]); };
    // Waits for tile i, then takes the turn: S = Q K^T issued (after the P V of `pa`, if given).
    auto turn = [&](int i, u32 (*pa)[4]) {
        mbar_wait(&full[i % NS10], (i / NS10) & 1);
#pragma unroll
        for (int nn = 0; nn < BK5 / 8; nn++) sacc[0][nn][0] = sacc[0][nn][1] = sacc[0][nn][2] = sacc[0][nn][3] = 0.f;
        if (c == 0 || i < n[0]) named_sync(BAR_TURN10 + c, 256); // (consumer 1's extra tile: no turn to wait for)
        wg_keep(sacc[0]);
        wg_keep(oacc[0]);
        wg_fence();
        const u16* Ks = stage(i);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma64_ss<0, 0>(&sacc[0][0][0], wg_desc_sw128(Qc + kk * 16), wg_desc_sw128(Ks + kk * 16), kk);
        wg_commit();
        if (pa) pv_issue10(oacc, pa, stage(i - 1) + TILE10);
        if (c == 0 || i + 1 < n[0]) named_arrive(BAR_TURN10 + (c ^ 1), 256); // the other's turn
    };
    // The element-wise step of tile i (its S waited for).
    auto activations = [&](int i) {
        wg_keep(sacc[0]);
        const int j0 = kt * BK5;
        const bool diag = j0 + BK5 > w0 + 1 || j0 + BK5 > p.T; // some key of the tile is masked for some row
        float tile_fmax = -INFINITY;
        elementwise5(0, 1, sacc, oacc, fac, bias, inkS[i % NS10], rows, j0, p.T, diag, t4, pass, mx, z, fmx,
                     &tile_fmax, ra, rb, rc, fallback, wsum);
#if P > 0
        if (MODE == 1) {
            tile_fmax = warp_max(tile_fmax);
            if (lane == 0 && kt < MAX_TILES5) atomicMax(&tmaxS[kt], ordered(tile_fmax));
        }
#endif
        kt = next_tile(kt + 1);
    };
    if (nc > 0) {
        turn(0, nullptr);
        wg_wait<0>();
        activations(0);
        if (!want_v) release(0);
    }
    for (int i = 1; i < nc; i++) {
        u32 pa[BK5 / 16][4];
        if (want_v) acc_to_a(pa, sacc[0]); // P of tile i - 1
        turn(i, want_v ? pa : nullptr);
        if (want_v && !RUNNING_MAX) {
            wg_wait<1>(); // S (P V of tile i - 1 may still run)
        } else {
            wg_wait<0>();
            wg_keep(oacc[0]);
        }
        activations(i);
        if (want_v) {
            wg_wait<0>();
            wg_keep(oacc[0]);
            release(i - 1);
        } else {
            release(i);
        }
    }
    if (want_v && nc > 0) {
        // The last tile's P V.
        u32 pa[BK5 / 16][4];
        acc_to_a(pa, sacc[0]);
        wg_keep(oacc[0]);
        wg_fence();
        pv_issue10(oacc, pa, stage(nc - 1) + TILE10);
        wg_wait<0>();
        wg_keep(oacc[0]);
        release(nc - 1);
    }
    for (int i = nc; i < n_all; i++) {
        // Tiles past this warpgroup's rows: every phase waited for, every stage released.
        mbar_wait(&full[i % NS10], (i / NS10) & 1);
        release(i);
    }
    finish_rows5<MODE>(p, b, h, bh, t4, pass, rows, oacc, z, mx, fmx, wsum, fallback);
#if P > 0
    if (MODE == 1) {
        named_sync(BAR_CONSUMERS10, 256); // every warp's tile maxima are in
        for (int t = ct; t < min(nkt, MAX_TILES5); t += 256) tilemax[t] = tmaxS[t];
    }
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1) lssa_fwd_ws10(const __grid_constant__ KParams10 a) {
    fwd10_body<0>(a);
}
// Re-weighting in two kernels (compiled for every P, as v5's: the host launches them where P > 0).
extern "C" __global__ void __launch_bounds__(384, 1) lssa_fwd_stats10(const __grid_constant__ KParams10 a) {
    fwd10_body<1>(a);
}
extern "C" __global__ void __launch_bounds__(384, 1) lssa_fwd_rw10(const __grid_constant__ KParams10 a) {
    fwd10_body<2>(a);
}
#endif // HAVE_WGMMA && HD == 64
