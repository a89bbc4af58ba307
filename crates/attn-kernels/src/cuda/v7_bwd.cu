// Tensor-core backward, Auto's: lab version 7 (its entry points at the end of this file), on the
// bodies of lab version 6 (whose own entry points are in `lab/v6_bwd.cu`). Version 6 is version 4's
// two kernels and data movement with cheaper per-entry maths.
// - Scores in log2 units where the activation is exp or softplus (as v5): softplus and its
//   derivative share one ex2, softplus's log is v5's polynomial and the sigmoid one approximate
//   reciprocal, so an entry costs two special-function ops instead of four plus an IEEE division
//   and a divergent branch (v4's softplus_f and sigmoid_f).
// - No branch per entry: masked entries and re-weighting's fallback rows are selects, and key (or
//   query) tiles wholly inside the causal triangle skip the mask.
// - Each row's constants are computed once, by the rows kernel, into one 64-byte record (RowK6):
//   kept in registers there and left in p.rowk for the keys kernel, which copies a tile's records
//   by cp.async with its Q and G tiles instead of rebuilding them per tile (or per entry, as v4).
// - The keys' inverse norms arrive by cp.async with their tile (load_ink_async), and blocks run
//   longest first across heads (longest_first); the sigmoid is 2^(y - softplus2(y)), one ex2.
// f16 / bf16 at head dimension 64 or 128, 16-byte aligned rows (as v4). Uses v5's log2 helpers and
// the tile helpers of bwd_tiles.cu (a_frags, mma_rows_t, mma_acc_rows, project_rows, store_rows).

// Per-row constants of the backward (natural units unless noted).
struct __align__(16) RowK6 {
    float fac2, bias2; // y = s * fac2 * ink + bias2, in log2 units where LOG2D
    float facn;        // the natural per-row factor of the score: dL/d(q.k) = ds * facn * ink
    float m2;          // the softmax running maximum, in y units
    float an, an_df;   // a = f an; an_df = an, or 0 for the first row under l1 (a_11 = 1 whatever f)
    float c, dp;       // C_i (D'_i without re-weighting) and D'_i
    float k1, k0;      // rho = max(f k1 + k0, 0) inv_m = max(f n an - off, 0) / umax, computed as umax
    float inv_m;       // was (1 / umax folded into k1 and k0 cancels in nearly uniform rows)
    float k2, inv_w;   // da = (gv - D'_i) k2 rho^(P-1), k2 = n P / (W umax); w = rho^P / W
    float fb;          // 1 where the row falls back to stage 1 (umax <= 0)
    float pad[2];
};
static_assert(sizeof(RowK6) == 64, "launch.rs sizes the rows' records as ROWK_BYTES = 64");

// The two products of a backward tile step, x = A X^T and y = B Y^T (S and G V^T in the rows
// kernel, their transposes in the keys kernel): on warpgroup tensor cores (v9, waited for) or on
// mma.sync (v6, v7).
template <bool WG>
__device__ __forceinline__ void rows_t2(float (*x)[4], const u32 (*a)[4], const u16* xs, float (*y)[4],
                                        const u32 (*b)[4], const u16* ys, int lm, int lr) {
    if constexpr (WG) {
        wg_fence();
        wg_rows_t(x, a, xs);
        wg_rows_t(y, b, ys);
        wg_commit();
        wg_wait<0>();
    } else {
        mma_rows_t(x, a, xs, lm, lr);
        mma_rows_t(y, b, ys, lm, lr);
    }
}

__device__ __forceinline__ RowK6 row_k6(const KParams& p, int bh, int i, int n, float dp, float c) {
    RowG g = row_g(p, bh, i, dp, c);
    // The reciprocals by rcp_fast, not row_g's IEEE divisions (left dead), whose slow path's call
    // made ptxas spill around it in the rows kernel.
    const float w_sum = ((const float*)p.stats)[((long long)bh * p.T + i) * STATS + ST_W];
    g.inv_m = g.umax > 0.f ? rcp_fast(g.umax) : 0.f;
    g.inv_w = w_sum != 0.f ? rcp_fast(w_sum) : 0.f;
    RowK6 r;
    r.facn = row_scale(p, n) * (COSINE ? inv_norm(p, bh, 0, i) : 1.f);
    float bias = row_bias(p, n);
    r.fac2 = LOG2D ? r.facn * LOG2E_F : r.facn;
    r.bias2 = LOG2D ? bias * LOG2E_F : bias;
    r.m2 = g.mx * LOG2E_F;
    r.an = g.an;
    r.an_df = (NORM == 0 && n == 1) ? 0.f : g.an;
    r.c = g.c;
    r.dp = g.dp;
    r.fb = g.umax > 0.f ? 0.f : 1.f;
    r.k1 = (float)n * g.an;
    r.k0 = -offset_of(n);
    r.inv_m = g.inv_m;
    r.k2 = (float)n * (float)(P > 0 ? P : 1) * g.inv_w * g.inv_m;
    r.inv_w = g.inv_w;
    r.pad[0] = r.pad[1] = 0.f;
    return r;
}

// phi and phi' at the score y (log2 units where LOG2D); f in natural units.
__device__ __forceinline__ void phi6(float y, const RowK6& r, float& f, float& gp) {
#if ACT == 1
    float e = ex2_fast(-fabsf(y));
    const float sp2 = fmaxf(y, 0.f) + e * log2_1p_over(e); // softplus in log2 units
    f = F_UNIT * sp2;
    // sigmoid(x) = e^x / (1 + e^x) = 2^(y - sp2): one add and one ex2 (no reciprocal, no select);
    // y - sp2 = -log2(1 + 2^-y) <= 0, so it never overflows.
    gp = ex2_fast(y - sp2);
#elif ACT == 0
    f = ex2_fast(RUNNING_MAX ? y - r.m2 : y);
    gp = f;
#else
    f = act(y);
    gp = act_grad(y, f);
#endif
}

// Adds a 16-row x HD block of dq (accumulator layout, rows i0 + 16 warp + ..) to p.dq_acc (f32 atomics).
__device__ __forceinline__ void dq_atomic_add(const float (*acc)[4], const KParams& p, int bh, int i0, int warp,
                                              int lane) {
    const int g = lane >> 2, t4 = lane & 3;
    float* dqa = (float*)p.dq_acc + (long long)bh * p.T * HD;
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int i = i0 + warp * 16 + g + 8 * q;
        if (i >= p.T) continue;
#pragma unroll
        for (int nn = 0; nn < HD / 8; nn++) {
            atomicAdd(dqa + (long long)i * HD + nn * 8 + 2 * t4, acc[nn][2 * q]);
            atomicAdd(dqa + (long long)i * HD + nn * 8 + 2 * t4 + 1, acc[nn][2 * q + 1]);
        }
    }
}

// v7: this block's share of dq for one query tile. dsa holds dS (times ink) for this warp's 16 keys
// x the tile's 64 rows as A fragments (keys_tile6's packing); it goes through shared memory (ds,
// [key][row]) so that each warp can take 16 query rows x all 64 keys as an A operand (ldmatrix.trans),
// times the block's K (Kb); the 16 x HD result is added to p.dq_acc with f32 atomics.
__device__ __forceinline__ void dq_from_keys7(const u32 (*dsa)[4], const u16* Kb, u16* ds, const KParams& p, int bh,
                                              int i0, int warp, int lane) {
    const int g = lane >> 2, t4 = lane & 3, lm = lane >> 3, lr = lane & 7;
#pragma unroll
    for (int nn = 0; nn < BB / 8; nn++)
#pragma unroll
        for (int q = 0; q < 2; q++) *(u32*)(ds + (warp * 16 + g + 8 * q) * KP3 + nn * 8 + 2 * t4) = dsa[nn >> 1][2 * (nn & 1) + q];
    __syncthreads();
    float acc[HD / 8][4];
#pragma unroll
    for (int nn = 0; nn < HD / 8; nn++) acc[nn][0] = acc[nn][1] = acc[nn][2] = acc[nn][3] = 0.f;
    const SAddr arow = saddr(ds + ((lm >> 1) * 8 + lr) * KP3 + warp * 16 + (lm & 1) * 8);
    const SAddr brow = b_row_t(Kb, lm, lr);
#pragma unroll
    for (int kb = 0; kb < BB / 16; kb++) {
        u32 a[4]; // rows warp*16.., keys kb*16..: the transpose of what ds stores
        ldsm4t_sa(a, sa_add(arow, kb * 16 * KP3));
        mma_a16_rows(acc, a, brow, kb);
    }
    dq_atomic_add(acc, p, bh, i0, warp, lane);
}

// The A fragments (16 rows x HD) of this warp's rows from a tile in core-matrix order (cm_index).
__device__ __forceinline__ void a_frags_cm(u32 (*fr)[4], const u16* s, int warp, int lm, int lr) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) ldsm4(fr[kk], s + cm_index(warp * 16 + (lm & 1) * 8 + lr, kk * 16 + (lm >> 1) * 8));
}

static_assert(BB == BK5, "acc_to_a (v5_fwd.cu) packs tiles of BK5 columns");

// Re-weighting's sharpening of one entry: rho = max(f n an - off, 0) / umax (computed as umax was),
// and rp = rho^(P-1), the power whose derivative the gradient needs.
__device__ __forceinline__ float rho6(float f, const RowK6& r, float& rp) {
    float rho = fmaxf(fmaf(f, r.k1, r.k0), 0.f) * r.inv_m;
    rp = P == 1 ? (rho > 0.f ? 1.f : 0.f) : powi<(P > 1 ? P - 1 : 0)>(rho);
    return rho;
}

// One entry: the final weight w and dL/d(q.k) / ink (times ink by the caller). Mirrors entry_grad.
template <bool MASK>
__device__ __forceinline__ void entry6(float y, float gv, const RowK6& r, bool in, float& w, float& ds) {
    float f, gp;
    phi6(y, r, f, gp);
    float da;
#if P > 0
    float rp;
    float rho = rho6(f, r, rp);
    bool fb = r.fb != 0.f;
    da = fb ? gv : (gv - r.dp) * r.k2 * rp;
    w = fb ? f * r.an : rho * rp * r.inv_w;
#else
    da = gv;
    w = f * r.an;
#endif
#if NORM == 0
    float sg = SIGNED ? (f > 0.f ? 1.f : (f < 0.f ? -1.f : 0.f)) : 1.f;
    float df = (da - sg * r.c) * r.an_df;
#elif NORM == 1
    float df = da;
#else
    float df = da * r.an;
#endif
    ds = df * gp * r.facn;
    if (MASK) {
        w = in ? w : 0.f;
        ds = in ? ds : 0.f;
    }
}

// Re-weighting's E_i term of one entry: f rho^(P-1) (gv - D'_i), 0 for fallback rows.
__device__ __forceinline__ float e_term6(float y, float gv, const RowK6& r) {
    float f, gp;
    phi6(y, r, f, gp);
    float rp;
    rho6(f, r, rp);
    return r.fb != 0.f ? 0.f : f * rp * (gv - r.dp);
}

// dS (rows kernel) for one tile: s holds the scores on entry and dS / ink... times ink on exit.
template <bool MASK>
__device__ __forceinline__ void rows_tile6(float (*s)[4], const float (*gv)[4], const RowK6* rk, const float* ink,
                                           const int* rows, int j0, int t4) {
#pragma unroll
    for (int nn = 0; nn < BB / 8; nn++)
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const int q = x >> 1, cl = nn * 8 + 2 * t4 + (x & 1);
            float w, ds;
            entry6<MASK>(fmaf(s[nn][x] * rk[q].fac2, ink_of(ink, cl), rk[q].bias2), gv[nn][x], rk[q], j0 + cl <= rows[q], w,
                         ds);
            s[nn][x] = ds * ink_of(ink, cl);
        }
}

// The rows kernel's body. DQ: v6 (E_i, then dq); without, v7's row pass (D'_i and, with
// re-weighting, the E_i sweep for C_i; v7's keys kernel accumulates dq). WG (without DQ; head
// dimension 64, sm_90a): v9's, with the E_i sweep's S = Q K^T and G V^T as wgmma (Q and G from
// registers, K and V tiles in core-matrix order as K-major B).
template <bool DQ, bool WG = false> __device__ __forceinline__ void bwd_rows6(const KParams& p) {
    static_assert(!(DQ && WG), "the warpgroup rows kernel has no dq sweep");
    DYN_SMEM(u16, smb); // [stage][K | V] tiles of BB rows
    __shared__ float inkS[2][BB];
    __shared__ float dpS[BB];
    const int nqb = (p.T + BB - 1) / BB;
    int bh;
    const int qb = nqb - 1 - longest_first(bh);
    const int b = bh / p.H, h = bh % p.H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int lm = lane >> 3, lr = lane & 7;
    const int i0 = qb * BB;
    const int nkt = qb + 1;
    const int TILE = BB * KP3;

    // The sweeps over key tiles: the E_i sweep (re-weighting), the dq sweep (DQ).
    constexpr int first_pass = P > 0 ? 0 : 1, end_pass = DQ ? 2 : 1;
    // Q and G fragments, staged through the first two tiles.
    auto load = [&](u16* s, const Tensor4& x, int r0) {
        if (WG)
            load_async_cm(s, x, b, h, r0, BB, p.T);
        else
            load_async(s, x, b, h, r0, BB, p.T);
    };
    if (first_pass < end_pass) {
        load(smb, p.q, i0);
        load(smb + TILE, p.g, i0);
        cp_commit();
    }
    // D'_i = <g_i, o_i>, one warp per row.
    for (int r = warp; r < BB; r += NWB) {
        int i = i0 + r;
        float d = 0.f;
        if (i < p.T)
            for (int c = lane; c < HD; c += 32) d += ld(p.g, b, h, i, c) * ld(p.o, b, h, i, c);
        d = warp_sum(d);
        if (lane == 0) dpS[r] = d;
    }
    cp_wait<0>();
    __syncthreads();
    u32 qf[HD / 16][4], gf[HD / 16][4];
    if (first_pass < end_pass) {
        if (WG) {
            a_frags_cm(qf, smb, warp, lm, lr);
            a_frags_cm(gf, smb + TILE, warp, lm, lr);
        } else {
            a_frags(qf, smb, warp, lm, lr);
            a_frags(gf, smb + TILE, warp, lm, lr);
        }
        __syncthreads();
    }

    int rows[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
    float inq[2];
    RowK6 rk[2];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        int i = rows[q] < p.T ? rows[q] : p.T - 1;
        inq[q] = COSINE ? inv_norm(p, bh, 0, i) : 1.f;
        float dp = dpS[warp * 16 + g + 8 * q];
        rk[q] = row_k6(p, bh, i, rows[q] + 1, dp, dp);
    }
    float dq[HD / 8][4];
#pragma unroll
    for (int nn = 0; nn < HD / 8; nn++) dq[nn][0] = dq[nn][1] = dq[nn][2] = dq[nn][3] = 0.f;

    float e[2] = {0.f, 0.f}; // E_i, summed over the row's quad after the first pass
    for (int pass = first_pass; pass < end_pass; pass++) {
        auto issue = [&](int kt, int stage) {
            u16* ks = smb + stage * 2 * TILE;
            load(ks, p.k, kt * BB);
            load(ks + TILE, p.v, kt * BB);
            load_ink_async(inkS[stage], p, bh, kt * BB, BB);
            cp_commit();
        };
        issue(0, 0);
        for (int kt = 0; kt < nkt; kt++) {
            const int stage = kt & 1;
            pipeline_step<WG>(kt + 1 < nkt, [&] { issue(kt + 1, stage ^ 1); });
            const u16* Ks = smb + stage * 2 * TILE;
            const u16* Vs = Ks + TILE;
            const float* ink = inkS[stage];
            const int j0 = kt * BB;
            // Some key of the tile is after some row of this warp (rows past T are never stored).
            const bool diag = j0 + BB - 1 > i0 + warp * 16;
            float s[BB / 8][4], gv[BB / 8][4];
            rows_t2<WG>(s, qf, Ks, gv, gf, Vs, lm, lr);
            if (pass == 0) {
#if P > 0
#pragma unroll
                for (int nn = 0; nn < BB / 8; nn++)
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        const int q = x >> 1, cl = nn * 8 + 2 * t4 + (x & 1);
                        float term = e_term6(fmaf(s[nn][x] * rk[q].fac2, ink_of(ink, cl), rk[q].bias2), gv[nn][x], rk[q]);
                        e[q] += (!diag || j0 + cl <= rows[q]) ? term : 0.f;
                    }
#endif
            } else {
                if (diag)
                    rows_tile6<true>(s, gv, rk, ink, rows, j0, t4);
                else
                    rows_tile6<false>(s, gv, rk, ink, rows, j0, t4);
                mma_acc_rows(dq, s, Ks, lm, lr);
            }
            __syncthreads();
        }
        if (pass == 0) {
#pragma unroll
            for (int q = 0; q < 2; q++) {
                e[q] += __shfl_xor_sync(0xffffffffu, e[q], 1);
                e[q] += __shfl_xor_sync(0xffffffffu, e[q], 2);
                if (rk[q].fb == 0.f) rk[q].c = e[q] * rk[q].k2 * rk[q].an; // n E_i an P / (W umax)
            }
        }
    }
    if (t4 == 0) {
#pragma unroll
        for (int q = 0; q < 2; q++) {
            if (rows[q] >= p.T) continue;
            // The whole record (D'_i and C_i among its fields) for the keys kernel, which reads it
            // per tile instead of rebuilding it (three global loads, three divisions and two logs
            // per row per tile). Rebuilt here rather than stored from rk: the fields the sweep never
            // reads (k2, an_df, inv_w, ..) need not live in registers through it, which spilled the
            // sigmoid ablations' rows kernel.
            const int bh2 = opaque(bh); // its addresses computed here, not held through the sweep
            RowK6 out = row_k6(p, bh2, rows[q], rows[q] + 1, rk[q].dp, rk[q].dp);
            if (P > 0 && out.fb == 0.f) out.c = e[q] * out.k2 * out.an;
            ((RowK6*)p.rowk)[(long long)bh2 * p.T + rows[q]] = out;
        }
    }
    if (DQ) {
        if (COSINE) project_rows(dq, p.q, b, h, rows, inq, p.T, t4);
        store_rows(p.dq, b, h, rows, dq, p.T, t4);
    }
}

// w and dS^T for one tile of the keys kernel, from the scores (st) and <g_i, v_j> (gvt) of this
// warp's keys x the tile's rows (accumulator layout), rounded to the dtype as A fragments (wa, da:
// acc_to_a's packing). Packing each entry as it is computed frees the f32 inputs as the loop goes,
// which keeps the generic activations' maths (linear-l1, gelu-l1, sigmoid-l1) out of local memory
// at head dimension 128, where dk and dv take 128 registers.
template <bool MASK>
__device__ __forceinline__ void keys_tile6(const float (*st)[4], const float (*gvt)[4], u32 (*wa)[4], u32 (*da)[4],
                                           const RowK6* rt, const float* ink, const int* keys, int i0, int T, int t4) {
#pragma unroll
    for (int nn = 0; nn < BB / 8; nn++)
#pragma unroll
        for (int q = 0; q < 2; q++) {
            float w[2], ds[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int x = 2 * q + e, cl = nn * 8 + 2 * t4 + e, i = i0 + cl;
                const RowK6& r = rt[cl];
                entry6<MASK>(fmaf(st[nn][x] * r.fac2, ink[q], r.bias2), gvt[nn][x], r, i >= keys[q] && i < T, w[e], ds[e]);
                ds[e] *= ink[q];
            }
            wa[nn >> 1][2 * (nn & 1) + q] = pack2(w[0], w[1]);
            da[nn >> 1][2 * (nn & 1) + q] = pack2(ds[0], ds[1]);
        }
}

// The keys kernel's body. DQ: v7, which also accumulates dq = dS K (f32 atomics into
// p.dq_acc) from this block's keys, through a shared-memory copy of dS (one more tile).
// WG (lab v9, with DQ, head dimension 64, sm_90a): the products on warpgroup tensor cores, as v8
// does the forward's. The block's 4 warps are one warpgroup and its 64 keys one m64 tile: S^T = K Q^T
// and (G V^T)^T with K and V fragments from registers and Q, G tiles (core-matrix order) as K-major
// B; dv += W^T G and dk += dS^T Q with W^T, dS^T from registers and G, Q as MN-major B; dq = dS K
// with dS^T stored to shared memory (core-matrix order) as an MN-major A and K as MN-major B.
template <bool DQ, bool WG = false> __device__ __forceinline__ void bwd_keys6(const KParams& p) {
    DYN_SMEM(u16, smb); // K block, V block, then [stage][Q | G] tiles (then dS^T with DQ)
    __shared__ RowK6 rt[2][BB];
    int bh;
    const int jb = longest_first(bh) * BB; // the first blocks have the most query rows: launched first
    const int b = bh / p.H, h = bh % p.H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int lm = lane >> 3, lr = lane & 7;
    const int nqt = (p.T + BB - 1) / BB;
    const int TILE = BB * KP3;
    u16* Kb = smb;
    u16* Vb = smb + TILE;
    u16* stages = smb + 2 * TILE;

    auto load = [&](u16* s, const Tensor4& x, int r0) {
        if (WG)
            load_async_cm(s, x, b, h, r0, BB, p.T);
        else
            load_async(s, x, b, h, r0, BB, p.T);
    };
    load(Kb, p.k, jb);
    load(Vb, p.v, jb);
    cp_commit();
    int keys[2] = {jb + warp * 16 + g, jb + warp * 16 + g + 8};
    float ink[2];
#pragma unroll
    for (int q = 0; q < 2; q++) ink[q] = (COSINE && keys[q] < p.T) ? inv_norm(p, bh, 1, keys[q]) : 1.f;
    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int nn = 0; nn < HD / 8; nn++)
#pragma unroll
        for (int x = 0; x < 4; x++) dk[nn][x] = dv[nn][x] = 0.f;

    auto issue = [&](int qt, int stage) {
        u16* qs = stages + stage * 2 * TILE;
        load(qs, p.q, qt * BB);
        load(qs + TILE, p.g, qt * BB);
        // The tile's row records (written by the rows kernel) land with its Q and G; rows past T
        // get zeros, which the mask discards (nothing divides by a record's fields).
        for (int e = threadIdx.x; e < BB * 4; e += blockDim.x) {
            const int r = e >> 2, part = e & 3, i = qt * BB + r;
            const RowK6* src = (const RowK6*)p.rowk + (long long)bh * p.T + (i < p.T ? i : 0);
            cp_async16((u16*)&rt[stage][r] + 8 * part, (const u16*)src + 8 * part, i < p.T);
        }
        cp_commit();
    };
    const int qt0 = jb / BB;
    const int kmax = jb + warp * 16 + 15; // this warp's last key
    issue(qt0, 0);
    for (int qt = qt0; qt < nqt; qt++) {
        const int stage = (qt - qt0) & 1;
        pipeline_step<WG>(qt + 1 < nqt, [&] { issue(qt + 1, stage ^ 1); });
        const u16* Qs = stages + stage * 2 * TILE;
        const u16* Gs = Qs + TILE;
        const int i0 = qt * BB;
        // This warp's 16 keys as A operands (read from shared memory for each tile: registers are short).
        u32 kf[HD / 16][4], vf[HD / 16][4];
        float st[BB / 8][4], gvt[BB / 8][4];
        if constexpr (WG) {
            a_frags_cm(kf, Kb, warp, lm, lr);
            a_frags_cm(vf, Vb, warp, lm, lr);
        } else {
            a_frags(kf, Kb, warp, lm, lr);
            a_frags(vf, Vb, warp, lm, lr);
        }
        rows_t2<WG>(st, kf, Qs, gvt, vf, Gs, lm, lr);
        // Some row of the tile is before some key of this warp, or past the end.
        u32 wa[BB / 16][4], da[BB / 16][4]; // W^T and dS^T as A fragments
        if (i0 < kmax || i0 + BB > p.T)
            keys_tile6<true>(st, gvt, wa, da, rt[stage], ink, keys, i0, p.T, t4);
        else
            keys_tile6<false>(st, gvt, wa, da, rt[stage], ink, keys, i0, p.T, t4);
        if constexpr (WG) {
            wg_fence();
            wg_acc_rows(dv, wa, Gs);
            wg_acc_rows(dk, da, Qs);
            wg_commit();
            // dS^T to shared memory as [key][query] in core-matrix order (tiles of BB columns),
            // while the tensor cores work on dv and dk.
            u16* ds = stages + 4 * TILE;
#pragma unroll
            for (int nn = 0; nn < BB / 8; nn++)
#pragma unroll
                for (int q = 0; q < 2; q++)
                    sts32(ds + cm_index(warp * 16 + g + 8 * q, nn * 8 + 2 * t4), da[nn >> 1][2 * (nn & 1) + q]);
            fence_async_smem();
            __syncthreads();
            // dq (queries x HD) = dS (queries x keys: MN-major A, key blocks HD 16 bytes apart,
            // query chunks 128) times K (MN-major B).
            float dqt[HD / 8][4];
            wg_fence();
#pragma unroll
            for (int kb = 0; kb < BB / 16; kb++)
                wgmma64_ss<1, 1>(&dqt[0][0], wg_desc(ds + kb * 16 * HD, HD * 16, 128),
                                 wg_desc(Kb + kb * 16 * HD, HD * 16, 128), kb);
            wg_commit();
            wg_wait<0>();
            dq_atomic_add(dqt, p, bh, i0, warp, lane);
        } else {
            mma_a_rows(dv, wa, Gs, lm, lr);
            mma_a_rows(dk, da, Qs, lm, lr);
            if (DQ) dq_from_keys7(da, Kb, stages + 4 * TILE, p, bh, i0, warp, lane);
        }
        __syncthreads();
    }
    if (COSINE) project_rows(dk, p.k, b, h, keys, ink, p.T, t4);
    store_rows(p.dk, b, h, keys, dk, p.T, t4);
    store_rows(p.dv, b, h, keys, dv, p.T, t4);
}

// Tensor-core backward, lab version 7: v6's maths with FlashAttention-2's dq. v4 and v6 compute dq
// in a rows kernel of their own, which recomputes S = Q K^T and G V^T and every entry's gradient a
// second time (7 tile products per (query, key) tile pair, 9 with re-weighting). Here the keys
// kernel also multiplies its dS by its keys and adds the result to an f32 accumulator with atomics
// (5 products; 7 with re-weighting, whose C_i still needs the rows kernel's E_i sweep), and a last
// kernel applies the cosine projection and converts dq to the dtype. Extra memory: the f32 dq
// accumulator, (B, H, T, d). f16 / bf16 at head dimension 64 or 128, as v4 and v6.

// D'_i, and C_i for re-weighting (v6's rows kernel without its dq sweep).
extern "C" __global__ void __launch_bounds__(NWB * 32) lssa_bwd_rowstats7(KParams p) { bwd_rows6<false>(p); }

// dk and dv as v6, plus this block's share of dq into p.dq_acc.
extern "C" __global__ void __launch_bounds__(NWB * 32) lssa_bwd_keys_mma7(KParams p) { bwd_keys6<true>(p); }

// dq from its f32 accumulator: the L2-normalisation projection (cosine variants), then the dtype.
// One warp per row.
extern "C" __global__ void __launch_bounds__(ROWS * 32) lssa_bwd_dq7(KParams p) {
    __shared__ float xs[ROWS][HD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
    const int i = blockIdx.x * ROWS + warp;
    if (i >= p.T) return; // whole warps only
    const float* acc = (const float*)p.dq_acc + ((long long)bh * p.T + i) * HD;
    float y[NC];
#pragma unroll
    for (int m = 0; m < NC; m++) {
        int c = lane + 32 * m;
        y[m] = c < HD ? acc[c] : 0.f;
        if (COSINE && c < HD) xs[warp][c] = ld(p.q, b, h, i, c); // read back by this lane only
    }
    if (COSINE) project_lanes(y, xs[warp], inv_norm(p, bh, 0, i), lane);
#pragma unroll
    for (int m = 0; m < NC; m++) {
        int c = lane + 32 * m;
        if (c < HD) st(p.dq, b, h, i, c, y[m]);
    }
}
