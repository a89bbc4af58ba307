// Tensor-core forward, lab version 3: version 2's maths with FlashAttention-2's data movement.
// - 128 query rows per block (8 warps of 16 rows): each K/V tile read from L2 serves twice the rows.
// - K and V tiles arrive by cp.async (16-byte, zero-filled past T) into two shared-memory stages, the
//   next tile in flight while the current one is multiplied; re-weighting's first sweep loads no V.
// - Operand fragments come from ldmatrix (x4), V's transposed with ldmatrix.trans, so V is stored
//   as it is in memory; rows are padded by 16 bytes, which makes every ldmatrix conflict-free.
// Needs 16-byte aligned rows (row stride a multiple of 8 elements); the host falls back otherwise.

#define BQ3 128
#define BK3 64
#define NW3 8
#define KP3 (HD + 8)
#define TILE3 (BK3 * KP3) // elements of one K or V tile in shared memory
#define MAX_TILES3 2048

#ifdef LSSA_EMU
__device__ __forceinline__ void cp_async16(u16* s, const u16* g, bool pred) { emu::cp_async16(s, g, pred); }
__device__ __forceinline__ void cp_commit() { emu::cp_commit(); }
template <int N> __device__ __forceinline__ void cp_wait() { emu::cp_wait(N); }
__device__ __forceinline__ void ldsm4(u32* r, const u16* p) { emu::ldsm4(r, p, false); }
__device__ __forceinline__ void ldsm4t(u32* r, const u16* p) { emu::ldsm4(r, p, true); }
__device__ __forceinline__ void mma3(float* c, const u32* a, u32 b0, u32 b1) { emu::mma16816(c, a, b0, b1, DTYPE == 1); }
#else
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(u16* s, const u16* g, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(s)), "l"(g), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm4(u32* r, const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm4t(u32* r, const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void mma3(float* c, const u32* a, u32 b0, u32 b1) {
#if DTYPE == 1
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
#endif // LSSA_EMU

// A shared-memory row address for ldmatrix that later offsets add to as constants: the 32-bit
// shared-window address on the GPU, where base + constant folds into the instruction ([R + imm]),
// rather than a generic pointer, whose per-thread part ptxas re-derives (and may hold in registers)
// for every offset; the pointer itself in the emulator.
#ifdef LSSA_EMU
typedef const u16* SAddr;
__device__ __forceinline__ SAddr saddr(const u16* p) { return p; }
__device__ __forceinline__ SAddr sa_add(SAddr a, int elems) { return a + elems; }
__device__ __forceinline__ void ldsm4_sa(u32* r, SAddr a) { ldsm4(r, a); }
__device__ __forceinline__ void ldsm4t_sa(u32* r, SAddr a) { ldsm4t(r, a); }
#else
typedef unsigned SAddr;
__device__ __forceinline__ SAddr saddr(const u16* p) { return smem_addr(p); }
__device__ __forceinline__ SAddr sa_add(SAddr a, int elems) { return a + 2u * (unsigned)elems; }
__device__ __forceinline__ void ldsm4_sa(u32* r, SAddr a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm4t_sa(u32* r, SAddr a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
#endif

// Queues rows [r0, r0 + nrows) of one head into s (row stride KP3).
__device__ __forceinline__ void load_async(u16* s, const Tensor4& x, int b, int h, int r0, int nrows, int T) {
    const u16* base = (const u16*)x.ptr + b * x.sb + h * x.sh;
    for (int e = threadIdx.x; e < nrows * (HD / 8); e += blockDim.x) {
        int r = e / (HD / 8), c = (e % (HD / 8)) * 8;
        bool ok = r0 + r < T;
        cp_async16(s + r * KP3 + c, base + (long long)(ok ? r0 + r : 0) * x.st + c, ok);
    }
}

// The kernel's body: its entry point is Auto's forward at d = 128 (below) and a lab kernel at 64
// (`lab/v3_fwd.cu`), where Auto runs v5.
__device__ __forceinline__ void fwd3_body(const KParams& p) {
    DYN_SMEM(u16, smem3); // [stage][K | V] tiles
    __shared__ float inkS[2][BK3];
#if P > 0
    __shared__ int tmaxS[MAX_TILES3];
    __shared__ int thrMin;
    __shared__ int anyFallback;
#endif
    const int nqb = (p.T + BQ3 - 1) / BQ3;
    const int qb = nqb - 1 - blockIdx.x; // the longest rows first
    const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int lm = lane >> 3, lr = lane & 7; // ldmatrix: which 8x8 matrix this lane addresses, and its row
    const int i0 = qb * BQ3;
    const int ktiles = (p.T + BK3 - 1) / BK3;
    const int nkt = min(ktiles, (i0 + BQ3 + BK3 - 1) / BK3); // causal

    // Q fragments (A operand), staged through the first 128 rows of the buffer.
    load_async(smem3, p.q, b, h, i0, BQ3, p.T);
    cp_commit();
    cp_wait<0>();
    __syncthreads();
    u32 qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) ldsm4(qf[kk], smem3 + (warp * 16 + (lm & 1) * 8 + lr) * KP3 + kk * 16 + (lm >> 1) * 8);
    __syncthreads();

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
    for (int t = threadIdx.x; t < MAX_TILES3; t += blockDim.x) tmaxS[t] = ordered(-INFINITY);
#endif

    for (int pass = 0; pass < (P > 0 ? 2 : 1); pass++) {
        const bool want_v = P == 0 || pass == 1;
        float an[2] = {0.f, 0.f}, na[2] = {0.f, 0.f}, off[2] = {0.f, 0.f}, umax[2] = {0.f, 0.f}, inv_m[2] = {0.f, 0.f};
        float wsum[2] = {0.f, 0.f};
        bool skipping = false;
        float thr_min = INFINITY;
        (void)an; (void)na; (void)off; (void)umax; (void)inv_m; (void)skipping; (void)thr_min;
#if P > 0
        if (pass == 1) {
            if (threadIdx.x == 0) {
                thrMin = ordered(INFINITY);
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
                    atomicMin(&thrMin, ordered(an[q] > 0.f ? off[q] / na[q] : INFINITY));
                }
            }
            __syncthreads();
            skipping = !RUNNING_MAX && anyFallback == 0 && nkt <= MAX_TILES3;
            thr_min = unordered(thrMin);
        }
#endif
        // The key tiles this pass visits, in order (block-uniform).
        auto needed = [&](int kt) -> bool {
#if P > 0
            return !skipping || unordered(tmaxS[kt]) > thr_min;
#else
            return true;
#endif
        };
        auto next_tile = [&](int kt) -> int {
            for (int t = kt; t < nkt; t++)
                if (needed(t)) return t;
            return nkt;
        };
        auto issue = [&](int kt, int stage) {
            u16* ks = smem3 + stage * 2 * TILE3;
            load_async(ks, p.k, b, h, kt * BK3, BK3, p.T);
            if (want_v) load_async(ks + TILE3, p.v, b, h, kt * BK3, BK3, p.T);
            cp_commit();
            if (threadIdx.x < BK3) {
                int j = kt * BK3 + threadIdx.x;
                inkS[stage][threadIdx.x] = (COSINE && j < p.T) ? inv_norm(p, bh, 1, j) : 1.f;
            }
        };
        int kt = next_tile(0);
        int stage = 0;
        if (kt < nkt) issue(kt, 0);
        while (kt < nkt) {
            const int nxt = next_tile(kt + 1);
            if (nxt < nkt) {
                issue(nxt, stage ^ 1);
                cp_wait<1>();
            } else {
                cp_wait<0>();
            }
            __syncthreads();
            const u16* Ks = smem3 + stage * 2 * TILE3;
            const u16* Vs = Ks + TILE3;
            const float* ink = inkS[stage];
            const int j0 = kt * BK3;
            // S = Q K^T: 16 rows x 64 keys per warp.
            float s[BK3 / 8][4];
#pragma unroll
            for (int nn = 0; nn < BK3 / 8; nn++) s[nn][0] = s[nn][1] = s[nn][2] = s[nn][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                for (int np = 0; np < BK3 / 16; np++) {
                    u32 bf[4];
                    ldsm4(bf, Ks + (np * 16 + (lm >> 1) * 8 + lr) * KP3 + kk * 16 + (lm & 1) * 8);
                    mma3(s[2 * np], qf[kk], bf[0], bf[1]);
                    mma3(s[2 * np + 1], qf[kk], bf[2], bf[3]);
                }
            }
            const bool diag = j0 + BK3 > i0 + warp * 16 || j0 + BK3 > p.T; // masking needed in this warp's rows
            float tmax_row[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nn = 0; nn < BK3 / 8; nn++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int q = e >> 1, cl = nn * 8 + 2 * t4 + (e & 1), j = j0 + cl;
                    float x = fmaf(s[nn][e] * fac[q], ink[cl], bias[q]);
                    if (diag && !(j <= rows[q] && j < p.T)) x = -INFINITY;
                    s[nn][e] = x;
                    tmax_row[q] = fmaxf(tmax_row[q], x);
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
            for (int nn = 0; nn < BK3 / 8; nn++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int q = e >> 1;
                    float x = s[nn][e];
                    bool vis = x != -INFINITY;
                    float f = vis ? (RUNNING_MAX ? __expf(x - mx[q]) : act(x)) : 0.f;
                    if (pass == 0) {
                        z[q] += SIGNED ? fabsf(f) : f;
                        if (P > 0 && vis) {
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
                if (lane == 0 && kt < MAX_TILES3) atomicMax(&tmaxS[kt], ordered(tile_fmax));
            }
#endif
            if (want_v) {
                // O += P V.
#pragma unroll
                for (int kb = 0; kb < BK3 / 16; kb++) {
                    u32 a[4];
                    a[0] = pack2(s[2 * kb][0], s[2 * kb][1]);
                    a[1] = pack2(s[2 * kb][2], s[2 * kb][3]);
                    a[2] = pack2(s[2 * kb + 1][0], s[2 * kb + 1][1]);
                    a[3] = pack2(s[2 * kb + 1][2], s[2 * kb + 1][3]);
#pragma unroll
                    for (int dp = 0; dp < HD / 16; dp++) {
                        u32 bf[4];
                        ldsm4t(bf, Vs + (kb * 16 + (lm & 1) * 8 + lr) * KP3 + dp * 16 + (lm >> 1) * 8);
                        mma3(oacc[2 * dp], a, bf[0], bf[1]);
                        mma3(oacc[2 * dp + 1], a, bf[2], bf[3]);
                    }
                }
            }
            __syncthreads(); // this stage is free for the load after next
            kt = nxt;
            stage ^= 1;
        }
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
#if P > 0
                float sc = umax[q] <= 0.f ? 1.f : rcp_fast(wsum[q]);
#else
                float sc = anorm(z[q], row + 1);
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

#if HD == 128
extern "C" __global__ void __launch_bounds__(NW3 * 32) lssa_fwd_mma3(KParams p) { fwd3_body(p); }
#endif
