// SIMT kernels (f32 arithmetic on CUDA cores; any dtype, any head dimension): the f32 forward, and
// the backward of every dtype. One warp per query row (forward, backward rows) or per key
// (backward keys); 32 keys (or query rows) per step, one per lane, staged in shared memory.
// The only kernels that take a KV cache (q the last T of Tk rows: query row i is row Tk - T + i) and
// grouped heads (Hkv < H: the keys kernel runs per key head and sums over its group of query heads).
// Kernel lab: version 1 (see LAB.md beside this file).

#define ROWS 8   // warps per block: query rows (or keys) per block
#define TK 32    // keys (or query rows) per step
#define NC ((HD + 31) / 32) // head-dimension columns per lane

// Per-row quantities of the backward, from the forward's statistics and phase A.
struct RowG {
    int n;
    float an, dp, c, umax, inv_m, inv_w, mx;
};

__device__ __forceinline__ RowG row_g(const KParams& p, int bh, int i, float dp, float c) {
    const float* s = (const float*)p.stats + ((long long)bh * p.T + i) * STATS;
    RowG r;
    r.n = p.Tk - p.T + i + 1;
    r.an = anorm(s[ST_Z], r.n);
    r.dp = dp;
    r.c = c;
    r.umax = s[ST_UMAX];
    r.inv_m = r.umax > 0.f ? 1.f / r.umax : 0.f;
    r.inv_w = s[ST_W] != 0.f ? 1.f / s[ST_W] : 0.f;
    r.mx = s[ST_MAX];
    return r;
}

// For one visible entry with score x and <g_i, v_j> = gv: the final weight w_ij and dL/ds_ij
// (before the score's own factor scale_i * inq_i * ink_j). Mirrors grad_tile in cpu/grad.rs.
__device__ __forceinline__ void entry_grad(float x, float gv, const RowG& r, float& w, float& ds) {
    float xs = RUNNING_MAX ? x - r.mx : x;
    float f = act(xs);
    float da;
#if P > 0
    if (r.umax > 0.f) {
        float rho = fmaxf(fmaf(f, (float)r.n * r.an, -offset_of(r.n)), 0.f) * r.inv_m;
        float rp = P == 1 ? (rho > 0.f ? 1.f : 0.f) : powi<(P > 1 ? P - 1 : 0)>(rho);
        da = (gv - r.dp) * ((float)r.n * (float)P * r.inv_w * r.inv_m) * rp;
        w = rho * rp * r.inv_w;
    } else {
        da = gv;
        w = f * r.an;
    }
#else
    da = gv;
    w = f * r.an;
#endif
    float df;
#if NORM == 0
    if (r.n == 1) {
        df = 0.f; // a_11 = f/|f| is constant in f
    } else {
        float sg = SIGNED ? (f > 0.f ? 1.f : (f < 0.f ? -1.f : 0.f)) : 1.f;
        df = (da - sg * r.c) * r.an;
    }
#elif NORM == 1
    df = da;
#else
    df = da * r.an;
#endif
    ds = df * act_grad(xs, f);
}

// Backward of the L2 normalisation for one row spread over a warp (lane holds columns lane + 32m):
// y -= x <x, y> inv^2, with x the raw row; nothing when the norm was clamped (inv >= 1e12).
// Warp-uniform arguments only (it shuffles).
__device__ __forceinline__ void project_lanes(float* y, const float* x, float inv, int lane) {
    if (!(inv < 1e12f)) return;
    float dot = 0.f;
#pragma unroll
    for (int m = 0; m < NC; m++) {
        int c = lane + 32 * m;
        if (c < HD) dot += y[m] * x[c];
    }
    dot = warp_sum(dot) * inv * inv;
#pragma unroll
    for (int m = 0; m < NC; m++) {
        int c = lane + 32 * m;
        if (c < HD) y[m] -= x[c] * dot;
    }
}

// Loads rows [r0, r0 + n) of one head of x into s (row stride lds), zeros past T.
__device__ __forceinline__ void stage_rows(float* s, int lds, const Tensor4& x, int b, int h, int r0, int n, int T) {
    for (int e = threadIdx.x; e < n * HD; e += blockDim.x) {
        int r = e / HD, c = e % HD;
        s[r * lds + c] = (r0 + r < T) ? ld(x, b, h, r0 + r, c) : 0.f;
    }
}

// Forward: one warp per query row; stage 1 in one sweep, with re-weighting two.
extern "C" __global__ void __launch_bounds__(ROWS * 32) lssa_fwd_simt(KParams p) {
    __shared__ float Qs[ROWS][HD];
    __shared__ float Ks[TK][HD + 1];
    __shared__ float Vs[TK][HD];
    __shared__ float inkS[TK];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H, hk = kv_head(p, bh) % p.Hkv;
    const int row0 = p.Tk - p.T; // rows of the sequence before q's first
    const int first = blockIdx.x * ROWS;
    const int i = first + warp;
    const bool valid = i < p.T;
    const int n = row0 + i + 1;
    const float fac = row_scale(p, n) * ((COSINE && valid) ? inv_norm(p, bh, 0, i) : 1.f);
    const float bias = row_bias(p, n);
    stage_rows(&Qs[0][0], HD, p.q, b, h, first, ROWS, p.T);
    const int last = row0 + min(first + ROWS, p.T) - 1;
    const int ntiles = last / TK + 1;

    float acc[NC];
#pragma unroll
    for (int m = 0; m < NC; m++) acc[m] = 0.f;
    float z = 0.f, mx = -INFINITY, fmx = -INFINITY;
    float umax = 0.f, wsum = 0.f; // re-weighting's, from the second sweep (0 without)

    for (int pass = 0; pass < (P > 0 ? 2 : 1); pass++) {
        float an = 0.f, inv_m = 0.f, na = 0.f, off = offset_of(n);
        if (pass == 1) {
            an = anorm(z, n);
            float ftop = RUNNING_MAX ? 1.f : fmx;
            na = (float)n * an;
            umax = fmaxf(fmaf(ftop, na, -off), 0.f);
            inv_m = umax > 0.f ? rcp_fast(umax) : 0.f;
        }
        for (int t = 0; t < ntiles; t++) {
            const int j0 = t * TK;
            __syncthreads();
            stage_rows(&Ks[0][0], HD + 1, p.k, b, hk, j0, TK, p.Tk);
            stage_rows(&Vs[0][0], HD, p.v, b, hk, j0, TK, p.Tk);
            if (threadIdx.x < TK) inkS[threadIdx.x] = (COSINE && j0 + threadIdx.x < p.Tk) ? inv_norm(p, bh, 1, j0 + threadIdx.x) : 1.f;
            __syncthreads();
            const int j = j0 + lane;
            const bool vis = valid && j <= row0 + i;
            float x = 0.f;
#pragma unroll 8
            for (int c = 0; c < HD; c++) x = fmaf(Qs[warp][c], Ks[lane][c], x);
            x = fmaf(x * fac, inkS[lane], bias);
            float f;
            if (RUNNING_MAX) {
                if (pass == 0) {
                    float tmax = warp_max(vis ? x : -INFINITY);
                    if (tmax > mx) {
                        float r = mx == -INFINITY ? 0.f : __expf(mx - tmax);
                        z *= r;
#pragma unroll
                        for (int m = 0; m < NC; m++) acc[m] *= r;
                        mx = tmax;
                    }
                }
                f = vis ? __expf(x - mx) : 0.f;
            } else {
                f = vis ? act(x) : 0.f;
            }
            float w;
            if (pass == 0) {
                z += warp_sum(SIGNED ? fabsf(f) : f);
                if (P > 0) {
                    fmx = fmaxf(fmx, warp_max(vis ? f : -INFINITY));
                    continue;
                }
                w = f;
            } else {
                w = umax <= 0.f ? f * an : (vis ? powi<(P > 0 ? P : 1)>(fmaxf(fmaf(f, na, -off), 0.f) * inv_m) : 0.f);
                wsum += warp_sum(w);
            }
            // Every lane takes part in each shuffle (a shuffle under a lane-dependent branch hangs).
            for (int l = 0; l < TK; l++) {
                float wl = __shfl_sync(0xffffffffu, w, l);
#pragma unroll
                for (int m = 0; m < NC; m++) {
                    int c = lane + 32 * m;
                    if (c < HD) acc[m] = fmaf(wl, Vs[l][c], acc[m]);
                }
            }
        }
    }
    // The first sweep of re-weighting accumulates nothing into acc (it skips P V), so acc holds the
    // last sweep's sum.
    if (valid) {
        float sc = P > 0 ? (umax <= 0.f ? 1.f : rcp_fast(wsum)) : anorm(z, n);
#pragma unroll
        for (int m = 0; m < NC; m++) {
            int c = lane + 32 * m;
            if (c < HD) st(p.o, b, h, i, c, acc[m] * sc);
        }
        if (lane == 0) {
            float* s = (float*)p.stats + ((long long)bh * p.T + i) * STATS;
            s[ST_Z] = z;
            s[ST_MAX] = RUNNING_MAX ? mx : 0.f;
            s[ST_UMAX] = umax;
            s[ST_W] = wsum;
        }
    }
}

// Backward over query rows: D'_i, C_i (one extra key sweep for E_i with re-weighting), then dq_i.
extern "C" __global__ void __launch_bounds__(ROWS * 32) lssa_bwd_rows(KParams p) {
    __shared__ float Qs[ROWS][HD];
    __shared__ float Gs[ROWS][HD];
    __shared__ float Ks[TK][HD + 1];
    __shared__ float Vs[TK][HD + 1];
    __shared__ float inkS[TK];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H, hk = kv_head(p, bh) % p.Hkv;
    const int row0 = p.Tk - p.T;
    const int first = blockIdx.x * ROWS;
    const int i = first + warp;
    const bool valid = i < p.T;
    const int ic = valid ? i : p.T - 1; // clamped, for reads
    const int n = row0 + i + 1;
    const float inq = COSINE ? inv_norm(p, bh, 0, ic) : 1.f;
    const float fac = row_scale(p, n) * inq;
    const float bias = row_bias(p, n);
    stage_rows(&Qs[0][0], HD, p.q, b, h, first, ROWS, p.T);
    stage_rows(&Gs[0][0], HD, p.g, b, h, first, ROWS, p.T);
    __syncthreads();
    float dp = 0.f;
    for (int c = lane; c < HD; c += 32) dp += Gs[warp][c] * (valid ? ld(p.o, b, h, i, c) : 0.f);
    dp = warp_sum(dp);
    RowG r = row_g(p, bh, ic, dp, dp);
    const int last = row0 + min(first + ROWS, p.T) - 1;
    const int ntiles = last / TK + 1;

    float y[NC];
#pragma unroll
    for (int m = 0; m < NC; m++) y[m] = 0.f;
    for (int pass = (P > 0 ? 0 : 1); pass < 2; pass++) {
        float e = 0.f;
        for (int t = 0; t < ntiles; t++) {
            const int j0 = t * TK;
            __syncthreads();
            stage_rows(&Ks[0][0], HD + 1, p.k, b, hk, j0, TK, p.Tk);
            stage_rows(&Vs[0][0], HD + 1, p.v, b, hk, j0, TK, p.Tk);
            if (threadIdx.x < TK) inkS[threadIdx.x] = (COSINE && j0 + threadIdx.x < p.Tk) ? inv_norm(p, bh, 1, j0 + threadIdx.x) : 1.f;
            __syncthreads();
            const int j = j0 + lane;
            const bool vis = valid && j <= row0 + i;
            float x = 0.f, gv = 0.f;
#pragma unroll 8
            for (int c = 0; c < HD; c++) {
                x = fmaf(Qs[warp][c], Ks[lane][c], x);
                gv = fmaf(Gs[warp][c], Vs[lane][c], gv);
            }
            x = fmaf(x * fac, inkS[lane], bias);
            if (pass == 0) {
                // E_i = sum_j a_ij h_ij (re-weighted rows only).
                if (r.umax > 0.f) {
                    float f = act(RUNNING_MAX ? x - r.mx : x);
                    float rho = fmaxf(fmaf(f, (float)n * r.an, -offset_of(n)), 0.f) * r.inv_m;
                    float rp = P == 1 ? (rho > 0.f ? 1.f : 0.f) : powi<(P > 1 ? P - 1 : 0)>(rho);
                    e += warp_sum(vis ? f * rp * (gv - dp) : 0.f);
                }
                continue;
            }
            float w, ds;
            entry_grad(x, gv, r, w, ds);
            ds = vis ? ds * fac * inkS[lane] : 0.f;
            for (int l = 0; l < TK; l++) {
                float dl = __shfl_sync(0xffffffffu, ds, l);
#pragma unroll
                for (int m = 0; m < NC; m++) {
                    int c = lane + 32 * m;
                    if (c < HD) y[m] = fmaf(dl, Ks[l][c], y[m]);
                }
            }
        }
        if (pass == 0 && r.umax > 0.f) r.c = (float)n * e * (r.an * (float)P * r.inv_w * r.inv_m);
    }
    if (!valid) return;
    if (lane == 0) {
        float* rg = (float*)p.rowgrad + ((long long)bh * p.T + i) * 2;
        rg[0] = dp;
        rg[1] = r.c;
    }
    if (COSINE) project_lanes(y, Qs[warp], inq, lane);
#pragma unroll
    for (int m = 0; m < NC; m++) {
        int c = lane + 32 * m;
        if (c < HD) st(p.dq, b, h, i, c, y[m]);
    }
}

// Backward over keys: one warp per key j of key head (b, hk) streams, for each query head of the
// key head's group, the query rows that see it (sequence row Tk - T + i >= j) for dk_j and dv_j.
// Needs lssa_bwd_rows to have written rowgrad. Grid: (Tk / ROWS, B * Hkv).
extern "C" __global__ void __launch_bounds__(ROWS * 32) lssa_bwd_keys(KParams p) {
    __shared__ float Kb[ROWS][HD];
    __shared__ float Vb[ROWS][HD];
    __shared__ float Qs[TK][HD + 1];
    __shared__ float Gs[TK][HD + 1];
    __shared__ float facS[TK], biasS[TK], dpS[TK], cS[TK];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int group = p.H / p.Hkv, row0 = p.Tk - p.T;
    const int b = blockIdx.y / p.Hkv, hk = blockIdx.y % p.Hkv;
    const int first = blockIdx.x * ROWS;
    const int j = first + warp;
    const bool valid = j < p.Tk;
    const float ink = (COSINE && valid) ? inv_norm(p, b * p.H + hk * group, 1, j) : 1.f;
    stage_rows(&Kb[0][0], HD, p.k, b, hk, first, ROWS, p.Tk);
    stage_rows(&Vb[0][0], HD, p.v, b, hk, first, ROWS, p.Tk);
    float dk[NC], dv[NC];
#pragma unroll
    for (int m = 0; m < NC; m++) dk[m] = dv[m] = 0.f;
    for (int hq = hk * group; hq < (hk + 1) * group; hq++)
    for (int i0 = max(first - row0, 0), bh = b * p.H + hq; i0 < p.T; i0 += TK) {
        __syncthreads();
        stage_rows(&Qs[0][0], HD + 1, p.q, b, hq, i0, TK, p.T);
        stage_rows(&Gs[0][0], HD + 1, p.g, b, hq, i0, TK, p.T);
        if (threadIdx.x < TK) {
            int ii = i0 + threadIdx.x, nn = row0 + ii + 1;
            bool ok = ii < p.T;
            facS[threadIdx.x] = row_scale(p, nn) * ((COSINE && ok) ? inv_norm(p, bh, 0, ii) : 1.f);
            biasS[threadIdx.x] = row_bias(p, nn);
            const float* rg = (const float*)p.rowgrad + ((long long)bh * p.T + (ok ? ii : 0)) * 2;
            dpS[threadIdx.x] = ok ? rg[0] : 0.f;
            cS[threadIdx.x] = ok ? rg[1] : 0.f;
        }
        __syncthreads();
        const int i = i0 + lane;
        const bool vis = valid && i < p.T && j <= row0 + i;
        float x = 0.f, gv = 0.f;
#pragma unroll 8
        for (int c = 0; c < HD; c++) {
            x = fmaf(Qs[lane][c], Kb[warp][c], x);
            gv = fmaf(Gs[lane][c], Vb[warp][c], gv);
        }
        x = fmaf(x * facS[lane], ink, biasS[lane]);
        float w = 0.f, ds = 0.f;
        if (vis) {
            RowG r = row_g(p, bh, i, dpS[lane], cS[lane]);
            entry_grad(x, gv, r, w, ds);
            ds *= facS[lane] * ink;
        }
        for (int l = 0; l < TK; l++) {
            float wl = __shfl_sync(0xffffffffu, w, l), dl = __shfl_sync(0xffffffffu, ds, l);
#pragma unroll
            for (int m = 0; m < NC; m++) {
                int c = lane + 32 * m;
                if (c < HD) {
                    dv[m] = fmaf(wl, Gs[l][c], dv[m]);
                    dk[m] = fmaf(dl, Qs[l][c], dk[m]);
                }
            }
        }
    }
    if (!valid) return;
    if (COSINE) project_lanes(dk, Kb[warp], ink, lane);
#pragma unroll
    for (int m = 0; m < NC; m++) {
        int c = lane + 32 * m;
        if (c < HD) {
            st(p.dk, b, hk, j, c, dk[m]);
            st(p.dv, b, hk, j, c, dv[m]);
        }
    }
}
