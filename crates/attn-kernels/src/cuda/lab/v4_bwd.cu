// Tensor-core backward (f16 / bf16, head dimension 64 or 128), lab version 4. Two kernels with the
// data movement of version 3 (cp.async double buffering, ldmatrix, 16-byte padded rows):
// - lssa_bwd_rows_mma, one block per 64 query rows: D'_i, then (re-weighting only) one key sweep for
//   E_i, then a key sweep for dq_i = sum_j dS_ij k_j (S = Q K^T and <g_i, v_j> = G V^T on tensor
//   cores, dS from the same per-entry maths as the SIMT kernels, dS K on tensor cores).
// - lssa_bwd_keys_mma, one block per 64 keys: the transposed products S^T = K Q^T and V G^T, then
//   dv_j += W^T G and dk_j += dS^T Q. Runs after the rows kernel, whose C_i it reads.
// No atomics: dq and (dk, dv) come from separate sweeps, at the price of computing S and G V^T twice.
// Uses entry_grad and RowG from v1_simt.cu, the helpers of v3_fwd.cu and the tile helpers of
// bwd_tiles.cu.

extern "C" __global__ void __launch_bounds__(NWB * 32) lssa_bwd_rows_mma(KParams p) {
    DYN_SMEM(u16, smb); // [stage][K | V] tiles of BB rows
    __shared__ float inkS[2][BB];
    __shared__ float dpS[BB];
    const int nqb = (p.T + BB - 1) / BB;
    const int qb = nqb - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int lm = lane >> 3, lr = lane & 7;
    const int i0 = qb * BB;
    const int nkt = qb + 1;
    const int TILE = BB * KP3;

    // Q and G fragments, staged through the first two tiles.
    load_async(smb, p.q, b, h, i0, BB, p.T);
    load_async(smb + TILE, p.g, b, h, i0, BB, p.T);
    cp_commit();
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
    a_frags(qf, smb, warp, lm, lr);
    a_frags(gf, smb + TILE, warp, lm, lr);
    __syncthreads();

    int rows[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
    float fac[2], bias[2], inq[2];
    RowG rg[2];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        int i = rows[q] < p.T ? rows[q] : p.T - 1;
        inq[q] = COSINE ? inv_norm(p, bh, 0, i) : 1.f;
        fac[q] = row_scale(p, rows[q] + 1) * inq[q];
        bias[q] = row_bias(p, rows[q] + 1);
        float dp = dpS[warp * 16 + g + 8 * q];
        rg[q] = row_g(p, bh, i, dp, dp);
        rg[q].n = rows[q] + 1;
    }
    float dq[HD / 8][4];
#pragma unroll
    for (int nn = 0; nn < HD / 8; nn++) dq[nn][0] = dq[nn][1] = dq[nn][2] = dq[nn][3] = 0.f;

    for (int pass = (P > 0 ? 0 : 1); pass < 2; pass++) {
        float e[2] = {0.f, 0.f};
        auto issue = [&](int kt, int stage) {
            u16* ks = smb + stage * 2 * TILE;
            load_async(ks, p.k, b, h, kt * BB, BB, p.T);
            load_async(ks + TILE, p.v, b, h, kt * BB, BB, p.T);
            cp_commit();
            if (threadIdx.x < BB) {
                int j = kt * BB + threadIdx.x;
                inkS[stage][threadIdx.x] = (COSINE && j < p.T) ? inv_norm(p, bh, 1, j) : 1.f;
            }
        };
        issue(0, 0);
        for (int kt = 0; kt < nkt; kt++) {
            const int stage = kt & 1;
            if (kt + 1 < nkt) {
                issue(kt + 1, stage ^ 1);
                cp_wait<1>();
            } else {
                cp_wait<0>();
            }
            __syncthreads();
            const u16* Ks = smb + stage * 2 * TILE;
            const u16* Vs = Ks + TILE;
            const float* ink = inkS[stage];
            const int j0 = kt * BB;
            float s[BB / 8][4], gv[BB / 8][4];
            mma_rows_t(s, qf, Ks, lm, lr);
            mma_rows_t(gv, gf, Vs, lm, lr);
#pragma unroll
            for (int nn = 0; nn < BB / 8; nn++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    int q = x >> 1, cl = nn * 8 + 2 * t4 + (x & 1), j = j0 + cl;
                    bool vis = j <= rows[q] && rows[q] < p.T;
                    float sc = fmaf(s[nn][x] * fac[q], ink[cl], bias[q]);
                    if (pass == 0) {
                        float term = 0.f;
#if P > 0
                        if (vis && rg[q].umax > 0.f) {
                            float f = act(RUNNING_MAX ? sc - rg[q].mx : sc);
                            float rho = fmaxf(fmaf(f, (float)rg[q].n * rg[q].an, -offset_of(rg[q].n)), 0.f) * rg[q].inv_m;
                            float rp = P == 1 ? (rho > 0.f ? 1.f : 0.f) : powi<(P > 1 ? P - 1 : 0)>(rho);
                            term = f * rp * (gv[nn][x] - rg[q].dp);
                        }
#endif
                        e[q] += term;
                    } else {
                        float w = 0.f, ds = 0.f;
                        if (vis) {
                            entry_grad(sc, gv[nn][x], rg[q], w, ds);
                            ds *= fac[q] * ink[cl];
                        }
                        s[nn][x] = ds;
                    }
                }
            if (pass == 1) mma_acc_rows(dq, s, Ks, lm, lr);
            __syncthreads();
        }
        if (pass == 0) {
#pragma unroll
            for (int q = 0; q < 2; q++) {
                e[q] += __shfl_xor_sync(0xffffffffu, e[q], 1);
                e[q] += __shfl_xor_sync(0xffffffffu, e[q], 2);
                if (rg[q].umax > 0.f) rg[q].c = (float)rg[q].n * e[q] * (rg[q].an * (float)P * rg[q].inv_w * rg[q].inv_m);
            }
        }
    }
    if (t4 == 0) {
#pragma unroll
        for (int q = 0; q < 2; q++) {
            if (rows[q] >= p.T) continue;
            float* r = (float*)p.rowgrad + ((long long)bh * p.T + rows[q]) * 2;
            r[0] = rg[q].dp;
            r[1] = rg[q].c;
        }
    }
    if (COSINE) project_rows(dq, p.q, b, h, rows, inq, p.T, t4);
    store_rows(p.dq, b, h, rows, dq, p.T, t4);
}

// Per-query-row quantities of one streamed tile, for the keys kernel.
struct RowTile {
    float fac[BB], bias[BB], an[BB], dp[BB], c[BB], umax[BB], inv_m[BB], inv_w[BB], mx[BB];
};

extern "C" __global__ void __launch_bounds__(NWB * 32) lssa_bwd_keys_mma(KParams p) {
    DYN_SMEM(u16, smb); // K block, V block, then [stage][Q | G] tiles
    __shared__ RowTile rt[2];
    const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int lm = lane >> 3, lr = lane & 7;
    const int jb = blockIdx.x * BB; // the first blocks have the most query rows: launched first
    const int nqt = (p.T + BB - 1) / BB;
    const int TILE = BB * KP3;
    u16* Kb = smb;
    u16* Vb = smb + TILE;
    u16* stages = smb + 2 * TILE;

    load_async(Kb, p.k, b, h, jb, BB, p.T);
    load_async(Vb, p.v, b, h, jb, BB, p.T);
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
        load_async(qs, p.q, b, h, qt * BB, BB, p.T);
        load_async(qs + TILE, p.g, b, h, qt * BB, BB, p.T);
        cp_commit();
        if (threadIdx.x < BB) {
            int r = threadIdx.x, i = qt * BB + r;
            bool ok = i < p.T;
            int ic = ok ? i : p.T - 1;
            const float* rgp = (const float*)p.rowgrad + ((long long)bh * p.T + ic) * 2;
            RowG x = row_g(p, bh, ic, rgp[0], rgp[1]);
            RowTile& t = rt[stage];
            t.fac[r] = row_scale(p, i + 1) * (COSINE ? inv_norm(p, bh, 0, ic) : 1.f);
            t.bias[r] = row_bias(p, i + 1);
            t.an[r] = x.an;
            t.dp[r] = x.dp;
            t.c[r] = x.c;
            t.umax[r] = x.umax;
            t.inv_m[r] = x.inv_m;
            t.inv_w[r] = x.inv_w;
            t.mx[r] = x.mx;
        }
    };
    const int qt0 = jb / BB;
    issue(qt0, 0);
    for (int qt = qt0; qt < nqt; qt++) {
        const int stage = (qt - qt0) & 1;
        if (qt + 1 < nqt) {
            issue(qt + 1, stage ^ 1);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const u16* Qs = stages + stage * 2 * TILE;
        const u16* Gs = Qs + TILE;
        const RowTile& t = rt[stage];
        const int i0 = qt * BB;
        // This warp's 16 keys as A operands (read from shared memory for each tile: registers are short).
        u32 kf[HD / 16][4], vf[HD / 16][4];
        a_frags(kf, Kb, warp, lm, lr);
        a_frags(vf, Vb, warp, lm, lr);
        float st[BB / 8][4], gvt[BB / 8][4];
        mma_rows_t(st, kf, Qs, lm, lr);
        mma_rows_t(gvt, vf, Gs, lm, lr);
#pragma unroll
        for (int nn = 0; nn < BB / 8; nn++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                int q = x >> 1, cl = nn * 8 + 2 * t4 + (x & 1), i = i0 + cl;
                bool vis = i >= keys[q] && i < p.T && keys[q] < p.T;
                float w = 0.f, ds = 0.f;
                if (vis) {
                    RowG r;
                    r.n = i + 1;
                    r.an = t.an[cl];
                    r.dp = t.dp[cl];
                    r.c = t.c[cl];
                    r.umax = t.umax[cl];
                    r.inv_m = t.inv_m[cl];
                    r.inv_w = t.inv_w[cl];
                    r.mx = t.mx[cl];
                    float sc = fmaf(st[nn][x] * t.fac[cl], ink[q], t.bias[cl]);
                    entry_grad(sc, gvt[nn][x], r, w, ds);
                    ds *= t.fac[cl] * ink[q];
                }
                st[nn][x] = w;
                gvt[nn][x] = ds;
            }
        mma_acc_rows(dv, st, Gs, lm, lr);
        mma_acc_rows(dk, gvt, Qs, lm, lr);
        __syncthreads();
    }
    if (COSINE) project_rows(dk, p.k, b, h, keys, ink, p.T, t4);
    store_rows(p.dk, b, h, keys, dk, p.T, t4);
    store_rows(p.dv, b, h, keys, dv, p.T, t4);
}
