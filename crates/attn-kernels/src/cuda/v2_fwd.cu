// Tensor-core forward (f16 / bf16, head dimension 64 or 128), FlashAttention-2 style: a block of
// 4 warps owns 64 query rows (16 per warp), streams 64-key tiles of K and V through shared memory,
// computes S = Q K^T and O += P V with mma.sync m16n8k16 (f32 accumulation), and keeps P in
// registers between the two products (the S accumulator layout is the A operand layout).
// Softplus needs no running maximum; softmax keeps one per row, reduced across the quad of threads
// that share the row. Re-weighting runs two sweeps: the first only accumulates Z_i and max_j f_ij
// (and a per-tile maximum of f over the block), the second skips key tiles in which no row of the
// block has an above-mean key. Kernel lab: version 2 (see LAB.md beside this file).

#define BQ 64
#define BK 64
#define KPAD (HD + 8)   // row stride of K in shared memory, in 16-bit elements: conflict-free
#define VPAD (BK + 8)   // row stride of V^T
#define MAX_TILES 2048  // tiles whose block maximum is kept for skipping (T <= 131072)

__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
#if defined(LSSA_EMU)
    emu::mma16816(c, a, b0, b1, DTYPE == 1);
#elif DTYPE == 1
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Rows [r0, r0 + 64) of one head into s (row stride KPAD), two elements per 32-bit access; zeros past T.
__device__ __forceinline__ void load_rows16(u16* s, const Tensor4& x, int b, int h, int r0, int T) {
    const u16* base = (const u16*)x.ptr + b * x.sb + h * x.sh;
    for (int e = threadIdx.x; e < BK * (HD / 2); e += blockDim.x) {
        int r = e / (HD / 2), c = 2 * (e % (HD / 2));
        u32 v = 0;
        if (r0 + r < T) v = *(const u32*)(base + (long long)(r0 + r) * x.st + c);
        *(u32*)(s + r * KPAD + c) = v;
    }
}

// The same rows transposed: s[c][r] (row stride VPAD).
__device__ __forceinline__ void load_rows16_t(u16* s, const Tensor4& x, int b, int h, int r0, int T) {
    const u16* base = (const u16*)x.ptr + b * x.sb + h * x.sh;
    for (int e = threadIdx.x; e < BK * (HD / 2); e += blockDim.x) {
        int r = e % BK, c = 2 * (e / BK);
        u32 v = 0;
        if (r0 + r < T) v = *(const u32*)(base + (long long)(r0 + r) * x.st + c);
        s[c * VPAD + r] = (u16)(v & 0xffffu);
        s[(c + 1) * VPAD + r] = (u16)(v >> 16);
    }
}

extern "C" __global__ void __launch_bounds__(128) lssa_fwd_mma(KParams p) {
    __shared__ __align__(16) u16 Ks[BK * KPAD];
    __shared__ __align__(16) u16 Vt[HD * VPAD];
    __shared__ float inkS[BK];
#if P > 0
    __shared__ int tmaxS[MAX_TILES];
    __shared__ float thrMin;
    __shared__ int anyFallback;
#endif
    const int nqb = (p.T + BQ - 1) / BQ;
    const int qb = nqb - 1 - blockIdx.x; // the longest rows first
    const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int i0 = qb * BQ;
    const int nkt = qb + 1; // causal: key tiles 0..qb (BQ == BK)

    // Q fragments, staged through Ks.
    load_rows16(Ks, p.q, b, h, i0, p.T);
    __syncthreads();
    u32 qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const u16* r0 = Ks + (warp * 16 + g) * KPAD + kk * 16 + 2 * t4;
        const u16* r8 = r0 + 8 * KPAD;
        qf[kk][0] = *(const u32*)r0;
        qf[kk][1] = *(const u32*)r8;
        qf[kk][2] = *(const u32*)(r0 + 8);
        qf[kk][3] = *(const u32*)(r8 + 8);
    }
    // This thread's two rows.
    int rows[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
    float fac[2], bias[2];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        int n = rows[q] + 1;
        fac[q] = row_scale(p, n) * ((COSINE && rows[q] < p.T) ? inv_norm(p, bh, 0, rows[q]) : 1.f);
        bias[q] = row_bias(p, n);
    }
    float oacc[HD / 8][4];
#pragma unroll
    for (int nn = 0; nn < HD / 8; nn++)
#pragma unroll
        for (int e = 0; e < 4; e++) oacc[nn][e] = 0.f;
    float z[2] = {0.f, 0.f}, mx[2] = {-INFINITY, -INFINITY}, fmx[2] = {-INFINITY, -INFINITY};
#if P > 0
    for (int t = threadIdx.x; t < MAX_TILES; t += blockDim.x) tmaxS[t] = ordered(-INFINITY);
#endif

    for (int pass = 0; pass < (P > 0 ? 2 : 1); pass++) {
        float an[2] = {0.f, 0.f}, na[2] = {0.f, 0.f}, off[2] = {0.f, 0.f}, umax[2] = {0.f, 0.f}, inv_m[2] = {0.f, 0.f},
              wsum[2] = {0.f, 0.f};
        (void)an; (void)na; (void)off; (void)umax; (void)inv_m;
        bool skipping = false;
        float thr_min = INFINITY;
        (void)skipping; (void)thr_min;
        if (pass == 1) {
#if P > 0
            if (threadIdx.x == 0) {
                thrMin = INFINITY;
                anyFallback = 0;
            }
            __syncthreads();
#pragma unroll
            for (int q = 0; q < 2; q++) {
                int n = rows[q] + 1;
                an[q] = anorm(z[q], n);
                na[q] = (float)n * an[q];
                off[q] = offset_of(n);
                float ftop = RUNNING_MAX ? 1.f : fmx[q];
                umax[q] = fmaxf(fmaf(ftop, na[q], -off[q]), 0.f);
                inv_m[q] = umax[q] > 0.f ? rcp_fast(umax[q]) : 0.f;
                if (rows[q] < p.T) {
                    if (umax[q] <= 0.f) atomicOr(&anyFallback, 1);
                    float thr = an[q] > 0.f ? off[q] / na[q] : INFINITY;
                    atomicMin((int*)&thrMin, ordered(thr)); // thrMin holds an ordered int from here on
                }
            }
#endif
            __syncthreads();
#if P > 0
            skipping = !RUNNING_MAX && anyFallback == 0 && nkt <= MAX_TILES;
            thr_min = unordered(*(int*)&thrMin);
#endif
        }
        for (int kt = 0; kt < nkt; kt++) {
            const int j0 = kt * BK;
#if P > 0
            if (skipping && !(unordered(tmaxS[kt]) > thr_min)) continue; // block-uniform
#endif
            __syncthreads();
            load_rows16(Ks, p.k, b, h, j0, p.T);
            load_rows16_t(Vt, p.v, b, h, j0, p.T);
            if (threadIdx.x < BK) inkS[threadIdx.x] = (COSINE && j0 + threadIdx.x < p.T) ? inv_norm(p, bh, 1, j0 + threadIdx.x) : 1.f;
            __syncthreads();
            // S = Q K^T for this warp's 16 rows and 64 keys: 8 tiles of 16 x 8.
            float s[BK / 8][4];
#pragma unroll
            for (int nn = 0; nn < BK / 8; nn++) {
                s[nn][0] = s[nn][1] = s[nn][2] = s[nn][3] = 0.f;
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) {
                    const u16* kr = Ks + (nn * 8 + g) * KPAD + kk * 16 + 2 * t4;
                    mma16816(s[nn], qf[kk], *(const u32*)kr, *(const u32*)(kr + 8));
                }
            }
            // Scores, mask, activation. Entry e of tile nn: row rows[e >> 1], key j0 + nn*8 + 2*t4 + (e & 1).
            float tmax_row[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nn = 0; nn < BK / 8; nn++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int q = e >> 1, cl = nn * 8 + 2 * t4 + (e & 1), j = j0 + cl;
                    float x = fmaf(s[nn][e] * fac[q], inkS[cl], bias[q]);
                    bool vis = j <= rows[q] && j < p.T;
                    s[nn][e] = vis ? x : -INFINITY;
                    tmax_row[q] = fmaxf(tmax_row[q], s[nn][e]);
                }
            if (RUNNING_MAX && pass == 0) {
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    float tm = fmaxf(tmax_row[q], __shfl_xor_sync(0xffffffffu, tmax_row[q], 1));
                    tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
                    if (tm > mx[q]) {
                        float r = mx[q] == -INFINITY ? 0.f : __expf(mx[q] - tm);
                        z[q] *= r;
#pragma unroll
                        for (int nn = 0; nn < HD / 8; nn++) {
                            oacc[nn][2 * q] *= r;
                            oacc[nn][2 * q + 1] *= r;
                        }
                        mx[q] = tm;
                    }
                }
            }
            float tile_fmax = -INFINITY;
#pragma unroll
            for (int nn = 0; nn < BK / 8; nn++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int q = e >> 1;
                    float x = s[nn][e];
                    bool vis = x != -INFINITY;
                    float f = vis ? (RUNNING_MAX ? __expf(x - mx[q]) : act(x)) : 0.f;
                    if (pass == 0) {
                        z[q] += SIGNED ? fabsf(f) : f;
                        if (vis) {
                            fmx[q] = fmaxf(fmx[q], f);
                            tile_fmax = fmaxf(tile_fmax, f);
                        }
                    }
#if P > 0
                    if (pass == 1) {
                        f = umax[q] <= 0.f ? f * an[q] : (vis ? powi<P>(fmaxf(fmaf(f, na[q], -off[q]), 0.f) * inv_m[q]) : 0.f);
                        wsum[q] += f;
                    }
#endif
                    s[nn][e] = f;
                }
#if P > 0
            if (pass == 0) {
                tile_fmax = warp_max(tile_fmax);
                if (lane == 0 && kt < MAX_TILES) atomicMax(&tmaxS[kt], ordered(tile_fmax));
                continue;
            }
#endif
            // O += P V: P from the S accumulators, 4 steps of 16 keys.
#pragma unroll
            for (int kb = 0; kb < BK / 16; kb++) {
                u32 a[4];
                a[0] = pack2(s[2 * kb][0], s[2 * kb][1]);
                a[1] = pack2(s[2 * kb][2], s[2 * kb][3]);
                a[2] = pack2(s[2 * kb + 1][0], s[2 * kb + 1][1]);
                a[3] = pack2(s[2 * kb + 1][2], s[2 * kb + 1][3]);
#pragma unroll
                for (int nn = 0; nn < HD / 8; nn++) {
                    const u16* vr = Vt + (nn * 8 + g) * VPAD + kb * 16 + 2 * t4;
                    mma16816(oacc[nn], a, *(const u32*)vr, *(const u32*)(vr + 8));
                }
            }
        }
        // Row sums over the quad.
#pragma unroll
        for (int q = 0; q < 2; q++) {
            if (pass == 0) {
                z[q] += __shfl_xor_sync(0xffffffffu, z[q], 1);
                z[q] += __shfl_xor_sync(0xffffffffu, z[q], 2);
                fmx[q] = fmaxf(fmx[q], __shfl_xor_sync(0xffffffffu, fmx[q], 1));
                fmx[q] = fmaxf(fmx[q], __shfl_xor_sync(0xffffffffu, fmx[q], 2));
            } else {
                wsum[q] += __shfl_xor_sync(0xffffffffu, wsum[q], 1);
                wsum[q] += __shfl_xor_sync(0xffffffffu, wsum[q], 2);
            }
        }
        if (pass == (P > 0 ? 1 : 0)) {
#pragma unroll
            for (int q = 0; q < 2; q++) {
                int row = rows[q];
                if (row >= p.T) continue;
                float sc;
#if P > 0
                sc = umax[q] <= 0.f ? 1.f : rcp_fast(wsum[q]);
#else
                sc = anorm(z[q], row + 1);
#endif
                u16* o = (u16*)p.o.ptr + b * p.o.sb + h * p.o.sh + (long long)row * p.o.st;
#pragma unroll
                for (int nn = 0; nn < HD / 8; nn++)
                    *(u32*)(o + nn * 8 + 2 * t4) = pack2(oacc[nn][2 * q] * sc, oacc[nn][2 * q + 1] * sc);
                if (t4 == 0) {
                    float* stt = (float*)p.stats + ((long long)bh * p.T + row) * STATS;
                    stt[ST_Z] = z[q];
                    stt[ST_MAX] = RUNNING_MAX ? mx[q] : 0.f;
#if P > 0
                    stt[ST_UMAX] = umax[q];
                    stt[ST_W] = wsum[q];
#else
                    stt[ST_UMAX] = 0.f;
                    stt[ST_W] = 0.f;
#endif
                }
            }
        }
    }
}
