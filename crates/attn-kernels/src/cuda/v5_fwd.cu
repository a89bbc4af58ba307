// Tensor-core forward, lab version 5: version 3's data movement with FlashAttention-2's warp shape
// and one special-function op per score.
// - 4 warps of 2 x 16 rows (128 rows per block): every K and V fragment from ldmatrix feeds two
//   mma.sync instead of one, which halves the shared-memory traffic per score (v3 needed as many
//   ldmatrix bytes per tile as the tensor cores needed cycles, twice over) and gives each warp two
//   independent accumulator chains.
// - Softplus and exp work in log2 units: log2(e) is folded into the per-row scale and bias, so
//   exp is one ex2.approx; softplus is max(y, 0) + log2(1 + 2^-|y|) with the log by a degree-4
//   polynomial e * q(e) on [0, 1] (relative error 5.7e-5, below a tenth of f16's rounding unit;
//   SPEC's ln-based softplus is ln 2 times this). ln 2 cancels in the l1 normaliser and is
//   applied once per row otherwise; the saved statistics are in natural units, as the backward
//   and the other kernels have them.
// - Key tiles entirely below the diagonal skip the mask (and the visibility test): masked entries
//   get f = 0 directly in the diagonal tiles, so no -inf passes through an activation.
// Needs 16-byte aligned rows, as v3, and head dimension 64: at 128 the doubled accumulators spill
// (ptxas: 660 bytes at sm_90), so v3 stays the kernel there. Kernel lab: version 5 (LAB.md).
// The log2-domain helpers are compiled at every head dimension (the v6 backward uses them).

#define BQ5 128
#define BK5 64
#define NW5 4
#define KP5 (HD + 8)
#define TILE5 (BK5 * KP5)
#define MAX_TILES5 2048

#if ACT == 0 || ACT == 1
#define LOG2D 1 // scores are carried as y = x * log2(e)
#else
#define LOG2D 0
#endif
#if ACT == 1
#define F_UNIT 0.69314718055994531f // f = F_UNIT * (what the kernel accumulates)
#else
#define F_UNIT 1.f
#endif
#define LOG2E_F 1.44269504088896341f
#define LN2_F 0.69314718055994531f

__device__ __forceinline__ float ex2_fast(float x) {
#ifdef LSSA_EMU
    return emu_ex2(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}

// The lab's (v5 to v9) helpers for what every tile needs besides K and V.
#ifdef LSSA_EMU
__device__ __forceinline__ void cp_async4(float* s, const float* g, bool pred) { emu::cp_async4(s, g, pred); }
#else
__device__ __forceinline__ void cp_async4(float* s, const float* g, bool pred) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(s)), "l"(g), "r"(pred ? 4 : 0));
}
#endif

// The inverse norms of keys [j0, j0 + n) (n <= blockDim.x) into s by cp.async, in the caller's open
// copy group (issue before its cp_commit), 0 past T: a tile's norms land with its K, and no thread
// waits on a global load before the tile's barrier (v3 to v4 load them synchronously and store them
// to shared memory). Only for cosine scores; the readers take 1 (`ink_of`) otherwise.
__device__ __forceinline__ void load_ink_async(float* s, const KParams& p, int bh, int j0, int n) {
    if (COSINE && (int)threadIdx.x < n) {
        const int j = j0 + threadIdx.x;
        // The key rows' norms follow the (B*H, T) query rows' (plain shapes here: key head bh).
        const float* norms = (const float*)p.inv_norms + (long long)p.B * p.H * p.T + (long long)bh * p.T;
        cp_async4(s + threadIdx.x, norms + (j < p.T ? j : 0), j < p.T);
    }
}
// Key c's inverse norm from a tile's copy (1 where the scores are not cosine: the compiler drops it).
__device__ __forceinline__ float ink_of(const float* ink, int c) { return COSINE ? ink[c] : 1.f; }

// Longest first across heads (v5 to v9). The grid is (tiles, B*H), as for every kernel, and blocks
// start in launch order (x fastest); this numbers them tile-major, so the first wave holds every
// head's longest tile rather than one head's tiles longest first, and the short tiles of the causal
// triangle fill the tail of the last wave. Returns the tile's rank (0: the longest) and sets bh.
__device__ __forceinline__ int longest_first(int& bh) {
    const int lin = blockIdx.y * gridDim.x + blockIdx.x;
    bh = lin % gridDim.y;
    return lin / gridDim.y;
}

// log2(1 + e) / e on [0, 1]: degree 4, fitted for the least maximum relative error (weighted least
// squares on 4000 Chebyshev nodes, reweighted toward minimax). Measured in f32 Horner evaluation
// on 2M evenly spaced points: relative error 5.7e-5, against bf16's rounding unit 3.9e-3 and
// f16's 4.9e-4 (the tensor-core kernels' dtypes, which round P to them anyway). Degree 5 (v5's
// first version: 9.5e-6; 8.5e-6 refitted) costs one more FMA per score; degree 3 gives 3.9e-4,
// 0.8 of f16's unit.
__device__ __forceinline__ float log2_1p_over(float e) {
    return fmaf(fmaf(fmaf(fmaf(0.0596514829f, e, -0.227119327f), e, 0.441898763f), e, -0.716987371f), e,
                1.44261324f);
}

// The activation on y, in the kernel's units (f / F_UNIT).
__device__ __forceinline__ float act5(float y) {
#if ACT == 0
    return ex2_fast(y);
#elif ACT == 1
    float e = ex2_fast(-fabsf(y));
    return fmaxf(y, 0.f) + e * log2_1p_over(e);
#else
    return act(y);
#endif
}

// The warpgroup (wgmma) helpers that the shared body of v5 and lab v8 names. A lab module defines
// them first (`lab/wgmma.cuh`, with HAVE_WGMMA = 1) where its PTX is sm_90a's or emulated; here they
// are empty, for the body's discarded branches, and never called.
#ifndef HAVE_WGMMA
#define HAVE_WGMMA 0
__device__ __forceinline__ void wg_fence() {}
__device__ __forceinline__ void wg_commit() {}
template <int N> __device__ __forceinline__ void wg_wait() {}
__device__ __forceinline__ void fence_async_smem() {}
template <int N> __device__ __forceinline__ void wg_keep(float (&)[N][4]) {}
__device__ __forceinline__ void sts32(u16* p, u32 v) { *(u32*)p = v; }
__device__ __forceinline__ unsigned wg_smem_addr(const void*) { return 0; }
template <int TNSP> __device__ __forceinline__ void wgmma64(float*, const u32*, u64, int) {}
template <int TA, int TB> __device__ __forceinline__ void wgmma64_ss(float*, u64, u64, int) {}
#endif

// One step of a double-buffered tile loop (v5 to v9): the current tile's copy (in flight) lands and
// is published to every thread, and the next tile's copy starts if `has_next`. For wgmma (WG) each
// thread fences the copy for the async proxy before the barrier, and the next copy starts only
// after it: the fence lowers to MEMBAR.ALL.CTA, which must not wait for a copy in flight.
template <bool WG, class Issue> __device__ __forceinline__ void pipeline_step(bool has_next, Issue issue_next) {
    if (WG) {
        cp_wait<0>();
        fence_async_smem();
        __syncthreads();
        if (has_next) issue_next();
    } else {
        if (has_next) {
            issue_next();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
    }
}

// A operand fragments (16 rows x 16 columns, columns 16 kb..) of a 16 x BK5 accumulator tile.
__device__ __forceinline__ void acc_to_a(u32 (*a)[4], const float (*x)[4]) {
#pragma unroll
    for (int kb = 0; kb < BK5 / 16; kb++) {
        a[kb][0] = pack2(x[2 * kb][0], x[2 * kb][1]);
        a[kb][1] = pack2(x[2 * kb][2], x[2 * kb][3]);
        a[kb][2] = pack2(x[2 * kb + 1][0], x[2 * kb + 1][1]);
        a[kb][3] = pack2(x[2 * kb + 1][2], x[2 * kb + 1][3]);
    }
}

// A no-swizzle matrix descriptor: start address, leading byte offset (between core matrices along
// K) and stride byte offset (along M or N).
__device__ __forceinline__ u64 wg_desc(const void* p, unsigned lbo, unsigned sbo) {
    return (u64)((wg_smem_addr(p) >> 4) & 0x3fff) | ((u64)((lbo >> 4) & 0x3fff) << 16) |
           ((u64)((sbo >> 4) & 0x3fff) << 32);
}

// The two warpgroup products of v8 and v9 (issued, not waited for), on 64-row tiles in core-matrix
// order (cm_index). wg_rows_t: acc (the warpgroup's 64 rows x 64) = A (registers, HD columns) times
// `rows` transposed (K-major B), as v4's mma_rows_t. wg_acc_rows: acc (64 x HD) += A (registers,
// 64 columns) times `rows` (MN-major B; N = 64 per wgmma), as v4's mma_acc_rows.
__device__ __forceinline__ void wg_rows_t(float (*acc)[4], const u32 (*a)[4], const u16* rows) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) wgmma64<0>(&acc[0][0], a[kk], wg_desc(rows + kk * 128, 128, HD * 16), kk);
}
// wg_rows_t_ss: the same with A (the warpgroup's 64 rows of `arows`, HD columns) from shared memory
// too, K-major as B. v8 reads Q this way: held in registers across the key-tile loop, ptxas (CUDA
// 13.0) gave Q's fragment registers to P after the first tile's product, so every later tile
// multiplied P by K (v8's failures on the H100 and H200 at d = 64 from the second key tile on;
// `tests/cuda_compile.rs` reads the SASS for it). FlashAttention-3 reads Q from shared memory too.
__device__ __forceinline__ void wg_rows_t_ss(float (*acc)[4], const u16* arows, const u16* rows) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma64_ss<0, 0>(&acc[0][0], wg_desc(arows + kk * 128, 128, HD * 16), wg_desc(rows + kk * 128, 128, HD * 16),
                         kk);
}
__device__ __forceinline__ void wg_acc_rows(float (*acc)[4], const u32 (*a)[4], const u16* rows) {
#pragma unroll
    for (int kb = 0; kb < BK5 / 16; kb++)
#pragma unroll
        for (int nh = 0; nh < HD / 64; nh++)
            wgmma64<1>(&acc[8 * nh][0], a[kb], wg_desc(rows + kb * 16 * HD + nh * 512, HD * 16, 128), 1);
}

// Element (r, c) of a tile of HD columns in core-matrix order (below).
__device__ __forceinline__ int cm_index(int r, int c) { return (r >> 3) * HD * 8 + (c >> 3) * 64 + (r & 7) * 8 + (c & 7); }

// Queues rows [r0, r0 + nrows) of one head (nrows a multiple of 8) into s in core-matrix order:
// row r, columns 8c..8c+7 at element (r / 8) HD 8 + 64 c + 8 (r % 8). Eight consecutive threads
// fill one core matrix, 128 contiguous bytes, so the stores are free of bank conflicts.
__device__ __forceinline__ void load_async_cm(u16* s, const Tensor4& x, int b, int h, int r0, int nrows, int T) {
    const u16* base = (const u16*)x.ptr + b * x.sb + h * x.sh;
    for (int e = threadIdx.x; e < nrows * (HD / 8); e += blockDim.x) {
        const int r8 = e & 7, c = (e >> 3) % (HD / 8), rb = (e >> 3) / (HD / 8), r = rb * 8 + r8;
        const bool ok = r0 + r < T;
        cp_async16(s + cm_index(r, c * 8), base + (long long)(ok ? r0 + r : 0) * x.st + c * 8, ok);
    }
}

// v5 exists at head dimension 64; v8 at 64 and 128 (MT5 below).
#if HD == 64 || (HAVE_WGMMA && HD == 128)

// Row tiles of 16 rows per warp, and warps per block, of the shared body: v5 and v8 at d = 64 have
// 4 warps of 2 tiles; v8 at d = 128 (twice the accumulators) has 8 warps, two warpgroups, of 1.
#define MT8 (HD == 128 ? 1 : 2)
#define NW8 (HD == 128 ? 8 : 4)

// Where query block qb's tile maxima sit in p.tilemax (re-weighting in two kernels): the blocks of a
// head in order, block q with min(nkt(q), MAX_TILES5) = min(C, 2 q + 2) tiles, C = min(ktiles,
// MAX_TILES5) (nkt(q) = 2 q + 2 causal tiles of 64 keys for 128 rows, at most ktiles). The first
// m = min(q, C / 2) blocks hold 2 q + 2 each, the others C: m (m + 1) + (q - m) C.
// `cuda::launch::tilemax_len` is the same count.
__device__ __forceinline__ long long tilemax_before5(long long q, long long c) {
    const long long m = q < c / 2 ? q : c / 2;
    return m * (m + 1) + (q - m) * c;
}
__device__ __forceinline__ long long tilemax_offset5(int bh, int qb, int nqb, int ktiles) {
    const long long c = ktiles < MAX_TILES5 ? ktiles : MAX_TILES5;
    return (long long)bh * tilemax_before5(nqb, c) + tilemax_before5(qb, c);
}

// Re-weighting's per-row constants from the first sweep, in the kernel's units: a_ij = f5_ij * an2,
// u_ij = f5_ij * na2 - off, umax = max_j u_ij (clamped at 0; 0 means the fallback a_ij).
struct Rw5 {
    float an2, na2, off, umax;
};
__device__ __forceinline__ Rw5 rw_row5(float z, float fmx, int n) {
    Rw5 c;
    c.an2 = anorm(z * F_UNIT, n) * F_UNIT;
    c.na2 = (float)n * c.an2;
    c.off = offset_of(n);
    c.umax = fmaxf(fmaf(RUNNING_MAX ? 1.f : fmx, c.na2, -c.off), 0.f);
    return c;
}

// One tile's element-wise step for one warp (row tiles [m0, m1) of 16 rows x 64 keys; constants
// once inlined): y to f in place, row sums and maxima. MASK: the tile crosses the diagonal or the
// end of the sequence.
template <bool MASK>
__device__ __forceinline__ void tile_f5(int m0, int m1, float (*s)[BK5 / 8][4], const int* rows, int j0, int T,
                                        const int t4,
                                        const int pass, const float* mx, float* z, float* fmx, float* tile_fmax,
                                        const float* ra, const float* rb, const float* rc, const bool* fallback,
                                        float* wsum) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nn = 0; nn < BK5 / 8; nn++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (mt < m0 || mt >= m1) continue;
                const int r = 2 * mt + (e >> 1), cl = nn * 8 + 2 * t4 + (e & 1);
                const bool in = !MASK || (j0 + cl <= rows[r] && j0 + cl < T);
                const float y = s[mt][nn][e];
#if RUNNING_MAX
                float f = in ? ex2_fast(y - mx[r]) : 0.f;
#else
                float f = act5(y);
                if (MASK) f = in ? f : 0.f;
#endif
                if (pass == 0) {
                    z[r] += SIGNED ? fabsf(f) : f;
                    if (P > 0 && (!MASK || in)) {
                        fmx[r] = fmaxf(fmx[r], f);
                        *tile_fmax = fmaxf(*tile_fmax, f);
                    }
                }
#if P > 0
                if (pass == 1) {
                    // u / umax = (f na2 - off) / umax, computed as umax was (folding 1 / umax into
                    // the constants cancels catastrophically in nearly uniform rows, where umax is
                    // a rounding residue); the fallback rows have (ra, rb, rc) = (an2, 0, 1).
                    const float u = fmaf(f, ra[r], rb[r]) * rc[r];
                    f = fallback[r] ? u : powi<P>(fmaxf(u, 0.f));
                    if (MASK) f = in ? f : 0.f;
                    wsum[r] += f;
                }
#endif
                s[mt][nn][e] = f;
            }
}

// The second kernel's start (MODE 2, v5, v8 and v10): each of a thread's rows' first-sweep sum,
// maximum and largest activation, from the statistics kernel's slots of p.stats.
__device__ __forceinline__ void read_first_sweep5(const KParams& p, int bh, const int* rows, float* z, float* mx,
                                                  float* fmx) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        if (rows[r] >= p.T) continue;
        const float* stt = (const float*)p.stats + ((long long)bh * p.T + rows[r]) * STATS;
        z[r] = stt[ST_Z];
        mx[r] = stt[ST_MAX];
        fmx[r] = stt[ST_W];
    }
}

// Re-weighting's second sweep for a thread's rows (v5, v8 and v10): each row's constants (ra, rb,
// rc; the fallback rows keep a_ij) and the block's skip inputs, `anyFallback` and the least
// threshold `thrMin` (shared, set beforehand; the caller's barrier publishes them).
__device__ __forceinline__ void rw_setup5(const int* rows, int T, const float* z, const float* fmx, float* ra,
                                          float* rb, float* rc, bool* fallback, int* anyFallback, int* thrMin) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const Rw5 c = rw_row5(z[r], fmx[r], rows[r] + 1);
        fallback[r] = c.umax <= 0.f;
        ra[r] = fallback[r] ? c.an2 : c.na2;
        rb[r] = fallback[r] ? 0.f : -c.off;
        rc[r] = fallback[r] ? 1.f : rcp_fast(c.umax);
        if (rows[r] < T) {
            if (fallback[r]) atomicOr(anyFallback, 1);
            atomicMin(thrMin, ordered(c.an2 > 0.f ? c.off / c.na2 : INFINITY));
        }
    }
}

// The element-wise step of row tiles [m0, m1) of one key tile (v5, v8 and v10): scores to y =
// scale_i * cos_ij + bias_i (times log2 e where LOG2D), the running maximum (softmax, with the
// rescaling of what was accumulated), the activation, the row sums and maxima (tile_f5). [m0, m1)
// are constants at every call; the loops run over both row tiles and skip the others, so that they
// unroll with constant indices. `diag`: some key of the tile is masked for some row.
__device__ __forceinline__ void elementwise5(int m0, int m1, float (*s)[BK5 / 8][4], float (*oacc)[HD / 8][4],
                                             const float* fac, const float* bias, const float* ink, const int* rows,
                                             int j0, int T, bool diag, int t4, int pass, float* mx, float* z,
                                             float* fmx, float* tile_fmax, const float* ra, const float* rb,
                                             const float* rc, const bool* fallback, float* wsum) {
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nn = 0; nn < BK5 / 8; nn++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 2 * mt + (e >> 1), cl = nn * 8 + 2 * t4 + (e & 1);
                if (mt >= m0 && mt < m1) s[mt][nn][e] = fmaf(s[mt][nn][e] * fac[r], ink_of(ink, cl), bias[r]);
            }
#if RUNNING_MAX
    if (pass == 0) {
        // The running maximum of y per row, and the rescaling of what was accumulated.
#pragma unroll
        for (int r = 0; r < 4; r++) {
            if ((r >> 1) < m0 || (r >> 1) >= m1) continue;
            float tm = -INFINITY;
#pragma unroll
            for (int nn = 0; nn < BK5 / 8; nn++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int cl = nn * 8 + 2 * t4 + c;
                    bool in = !diag || (j0 + cl <= rows[r] && j0 + cl < T);
                    tm = in ? fmaxf(tm, s[r >> 1][nn][2 * (r & 1) + c]) : tm;
                }
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
            tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
            if (tm > mx[r]) {
                float sc = mx[r] == -INFINITY ? 0.f : ex2_fast(mx[r] - tm);
                z[r] *= sc;
#pragma unroll
                for (int nn = 0; nn < HD / 8; nn++) {
                    oacc[r >> 1][nn][2 * (r & 1)] *= sc;
                    oacc[r >> 1][nn][2 * (r & 1) + 1] *= sc;
                }
                mx[r] = tm;
            }
        }
    }
#endif
    if (diag)
        tile_f5<true>(m0, m1, s, rows, j0, T, t4, pass, mx, z, fmx, tile_fmax, ra, rb, rc, fallback, wsum);
    else
        tile_f5<false>(m0, m1, s, rows, j0, T, t4, pass, mx, z, fmx, tile_fmax, ra, rb, rc, fallback, wsum);
}

// The end of a sweep for one thread's 4 rows (v5, v8 and v10): the row sums and maxima over the
// quad, the first sweep's statistics for the second kernel (MODE 1), and after the last sweep the
// output rows and their statistics.
template <int MODE>
__device__ __forceinline__ void finish_rows5(const KParams& p, int b, int h, int bh, int t4, int pass, const int* rows,
                                             float (*oacc)[HD / 8][4], float* z, const float* mx, float* fmx,
                                             float* wsum, const bool* fallback) {
#pragma unroll
    for (int r = 0; r < 4; r++) {
        if (pass == 0) {
            z[r] += __shfl_xor_sync(0xffffffffu, z[r], 1);
            z[r] += __shfl_xor_sync(0xffffffffu, z[r], 2);
            fmx[r] = fmaxf(fmx[r], __shfl_xor_sync(0xffffffffu, fmx[r], 1));
            fmx[r] = fmaxf(fmx[r], __shfl_xor_sync(0xffffffffu, fmx[r], 2));
        } else {
            wsum[r] += __shfl_xor_sync(0xffffffffu, wsum[r], 1);
            wsum[r] += __shfl_xor_sync(0xffffffffu, wsum[r], 2);
        }
    }
#if P > 0
    if (MODE == 1) {
        // Hand the first sweep to the second kernel, which overwrites these slots of p.stats.
#pragma unroll
        for (int r = 0; r < 4; r++) {
            if (rows[r] >= p.T || t4 != 0) continue;
            float* stt = (float*)p.stats + ((long long)bh * p.T + rows[r]) * STATS;
            stt[ST_Z] = z[r];
            stt[ST_MAX] = mx[r];
            stt[ST_W] = fmx[r];
        }
    }
#endif
    if (pass == (P > 0 ? 1 : 0)) {
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int row = rows[r], mt = r >> 1, q = r & 1;
            if (row >= p.T) continue;
#if P > 0
            float sc = fallback[r] ? 1.f : rcp_fast(wsum[r]);
#else
            float sc = anorm(z[r] * F_UNIT, row + 1) * F_UNIT;
#endif
            u16* o = (u16*)p.o.ptr + b * p.o.sb + h * p.o.sh + (long long)row * p.o.st;
#pragma unroll
            for (int nn = 0; nn < HD / 8; nn++)
                *(u32*)(o + nn * 8 + 2 * t4) = pack2(oacc[mt][nn][2 * q] * sc, oacc[mt][nn][2 * q + 1] * sc);
            if (t4 == 0) {
                float* stt = (float*)p.stats + ((long long)bh * p.T + row) * STATS;
#if P > 0
                // The second kernel (MODE 2) reads the first sweep's z and largest f again from
                // the slots it overwrites here, rather than holding them in registers through
                // its sweep.
                const float z1 = MODE == 2 ? stt[ST_Z] : z[r], fmx1 = MODE == 2 ? stt[ST_W] : fmx[r];
                stt[ST_Z] = z1 * F_UNIT;
                stt[ST_UMAX] = rw_row5(z1, fmx1, row + 1).umax; // as in the pass-1 set-up
                stt[ST_W] = wsum[r];
#else
                stt[ST_Z] = z[r] * F_UNIT;
                stt[ST_UMAX] = 0.f;
                stt[ST_W] = 0.f;
#endif
                stt[ST_MAX] = RUNNING_MAX ? mx[r] * LN2_F : 0.f;
            }
        }
    }
}

// The forward of versions 5 (GEN 5: mma.sync, 2 x 16 consecutive rows per warp) and 8 (GEN 8:
// wgmma; at d = 64 warp w has rows 16w.. and 64 + 16w.. of the block, the two m64 halves of one
// warpgroup; at d = 128 warp w has rows 64 (w / 4) + 16 (w % 4).., warpgroup w / 4 one m64 half).
// MT: the warp's row tiles; row r = 2 mt + q of a thread is tile_row(mt) + g + 8 q, r < 2 MT.
// MODE (re-weighting): 0 runs both sweeps in one kernel; 1 only the first (the statistics kernel:
// Q K^T and the activation, no V tiles and no output accumulators, so it holds fewer registers and
// more blocks per SM): each row's sum, maximum and largest activation go to p.stats (kernel units)
// and the block's tile maxima to p.tilemax; 2 only the second, from those.
template <int GEN, int MODE = 0> __device__ __forceinline__ void fwd5_body(const KParams& p) {
    constexpr bool WG = GEN == 8;
    constexpr int MT = WG ? MT8 : 2;
    static_assert(WG || HD == 64, "v5 is written for head dimension 64");
    DYN_SMEM(u16, smem5); // [stage][K | V] tiles
    __shared__ float inkS[2][BK5];
#if P > 0
    __shared__ int tmaxS[MAX_TILES5];
    __shared__ int thrMin;
    __shared__ int anyFallback;
#endif
    const int nqb = (p.T + BQ5 - 1) / BQ5;
    int bh;
    const int qb = nqb - 1 - longest_first(bh);
    const int b = bh / p.H, h = bh % p.H;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int lm = lane >> 3, lr = lane & 7; // ldmatrix: which 8x8 matrix this lane addresses, and its row
    const int i0 = qb * BQ5;
    // The first row of the warp's row tile mt (16 rows each).
    auto tile_row = [&](int mt) {
        return !WG ? i0 + 32 * warp + 16 * mt : MT == 2 ? i0 + 64 * mt + 16 * warp : i0 + 16 * warp;
    };
    const int w0 = tile_row(0); // the warp's smallest row
    const int ktiles = (p.T + BK5 - 1) / BK5;
    const int nkt = min(ktiles, (i0 + BQ5 + BK5 - 1) / BK5); // causal

    // Q: v5's fragments (A operand) of the warp's two 16-row tiles, staged through the first 128
    // rows; v8's 128 rows stay in shared memory after the K / V stages, in core-matrix order, and
    // are read by the tensor cores (wg_rows_t_ss).
    u32 qf[2][HD / 16][4]; // [MT] used (v5)
    u16* const Qs = smem5 + 4 * TILE5;
    if constexpr (WG) {
        load_async_cm(Qs, p.q, b, h, i0, BQ5, p.T);
        cp_commit();
        cp_wait<0>();
        fence_async_smem();
        __syncthreads();
    } else {
        load_async(smem5, p.q, b, h, i0, BQ5, p.T);
        cp_commit();
        cp_wait<0>();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++)
                ldsm4(qf[mt][kk], smem5 + (tile_row(mt) - i0 + (lm & 1) * 8 + lr) * KP5 + kk * 16 + (lm >> 1) * 8);
        __syncthreads();
    }

    // Row r = 2 * mt + q of this thread: tile_row(mt) + g + 8 q.
    int rows[4];
    float fac[4], bias[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        rows[r] = tile_row(r >> 1 < MT ? r >> 1 : 0) + g + 8 * (r & 1) + (r >> 1 < MT ? 0 : p.T); // (r >= 2 MT: none)
        int n = rows[r] + 1;
        fac[r] = row_scale(p, n) * ((COSINE && rows[r] < p.T) ? inv_norm(p, bh, 0, rows[r]) : 1.f);
        bias[r] = row_bias(p, n);
        if (LOG2D) {
            fac[r] *= LOG2E_F;
            bias[r] *= LOG2E_F;
        }
    }
    float oacc[2][HD / 8][4]; // [MT] used
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nn = 0; nn < HD / 8; nn++)
#pragma unroll
            for (int e = 0; e < 4; e++) oacc[mt][nn][e] = 0.f;
    float z[4] = {0.f, 0.f, 0.f, 0.f}, mx[4], fmx[4];
#pragma unroll
    for (int r = 0; r < 4; r++) mx[r] = fmx[r] = -INFINITY;
#if P > 0
    for (int t = threadIdx.x; t < MAX_TILES5; t += blockDim.x) tmaxS[t] = ordered(-INFINITY);
    int* tilemax = MODE != 0 ? (int*)p.tilemax + tilemax_offset5(bh, qb, nqb, ktiles) : nullptr;
    if (MODE == 2) {
        // The statistics kernel's results (each thread reads the entries it initialised above).
        for (int t = threadIdx.x; t < min(nkt, MAX_TILES5); t += blockDim.x) tmaxS[t] = tilemax[t];
        read_first_sweep5(p, bh, rows, z, mx, fmx);
    }
#endif

    for (int pass = MODE == 2 ? 1 : 0; pass < (MODE == 1 ? 1 : P > 0 ? 2 : 1); pass++) {
        const bool want_v = P == 0 || pass == 1;
        float ra[4] = {0.f, 0.f, 0.f, 0.f}, rb[4] = {0.f, 0.f, 0.f, 0.f}, rc[4] = {0.f, 0.f, 0.f, 0.f};
        float wsum[4] = {0.f, 0.f, 0.f, 0.f};
        bool fallback[4] = {false, false, false, false};
        bool skipping = false;
        float thr_min = INFINITY;
        (void)skipping;
        (void)thr_min;
#if P > 0
        if (pass == 1) {
            if (threadIdx.x == 0) {
                thrMin = ordered(INFINITY);
                anyFallback = 0;
            }
            __syncthreads();
            rw_setup5(rows, p.T, z, fmx, ra, rb, rc, fallback, &anyFallback, &thrMin);
            __syncthreads();
            skipping = !RUNNING_MAX && anyFallback == 0 && nkt <= MAX_TILES5;
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
            u16* ks = smem5 + stage * 2 * TILE5;
            if (WG) {
                load_async_cm(ks, p.k, b, h, kt * BK5, BK5, p.T);
                if (want_v) load_async_cm(ks + TILE5, p.v, b, h, kt * BK5, BK5, p.T);
            } else {
                load_async(ks, p.k, b, h, kt * BK5, BK5, p.T);
                if (want_v) load_async(ks + TILE5, p.v, b, h, kt * BK5, BK5, p.T);
            }
            load_ink_async(inkS[stage], p, bh, kt * BK5, BK5);
            cp_commit();
        };
        int kt = next_tile(0);
        int stage = 0;
        if (kt < nkt) issue(kt, 0);
        while (kt < nkt) {
            const int nxt = next_tile(kt + 1);
            pipeline_step<WG>(nxt < nkt, [&] { issue(nxt, stage ^ 1); });
            const u16* Ks = smem5 + stage * 2 * TILE5;
            const u16* Vs = Ks + TILE5;
            const float* ink = inkS[stage];
            const int j0 = kt * BK5;
            // S = Q K^T: 2 x 16 rows x 64 keys per warp.
            float s[2][BK5 / 8][4]; // [MT] used
            const bool diag = j0 + BK5 > w0 + 1 || j0 + BK5 > p.T; // some key of the tile is masked for some row
            float tile_fmax = -INFINITY;
            auto elementwise = [&](int m0, int m1) {
                elementwise5(m0, m1, s, oacc, fac, bias, ink, rows, j0, p.T, diag, t4, pass, mx, z, fmx, &tile_fmax,
                             ra, rb, rc, fallback, wsum);
            };
            if constexpr (WG) {
                // Two commit groups, one per 64-row half, so the tensor cores work on one half
                // while the other's element-wise step runs: S0, S1 | f(S0), P0 V | f(S1), P1 V.
                // K-major B: key blocks of 8 (N) HD 16 bytes apart, 8-column chunks (K) 128 apart.
                // MN-major V: key blocks (K) HD 16 bytes apart, 8-column chunks (N) 128 apart.
                // P fragments are packed before the wgmma that reads them is issued (registers an
                // in-flight wgmma reads must not be written).
                auto pv = [&](int mt) {
                    wg_keep(oacc[mt]);
                    u32 pa[BK5 / 16][4];
                    acc_to_a(pa, s[mt]);
                    wg_fence();
                    wg_acc_rows(oacc[mt], pa, Vs);
                    wg_commit();
                };
                // (The first product ignores the accumulators, but they are defined before the
                // fence so that no instruction defines them while a wgmma is in flight.)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nn = 0; nn < BK5 / 8; nn++)
                        s[mt][nn][0] = s[mt][nn][1] = s[mt][nn][2] = s[mt][nn][3] = 0.f;
#pragma unroll
                for (int mt = 0; mt < MT; mt++) wg_keep(s[mt]);
                wg_fence();
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    wg_rows_t_ss(s[mt], Qs + ((tile_row(mt) - i0) & ~63) * HD, Ks);
                    wg_commit();
                }
                // Softmax rescales O in its element-wise step, so no wgmma may be in flight then
                // (ptxas would serialise every wgmma of the kernel): no overlap there.
                if (RUNNING_MAX || MT == 1)
                    wg_wait<0>();
                else
                    wg_wait<1>(); // S0
                wg_keep(s[0]);
                elementwise(0, 1);
                if constexpr (MT == 1) {
                    // One m64 half per warpgroup (d = 128): the block's two warpgroups overlap
                    // each other instead.
                    if (want_v) pv(0);
                } else {
                    if (want_v) {
                        pv(0);
                        if (RUNNING_MAX)
                            wg_wait<0>();
                        else
                            wg_wait<1>(); // S1 (P0 V may still run)
                    } else {
                        wg_wait<0>();
                    }
                    wg_keep(s[MT - 1]);
                    elementwise(1, 2);
                    if (want_v) pv(1);
                }
                wg_wait<0>();
#pragma unroll
                for (int mt = 0; mt < MT; mt++) wg_keep(oacc[mt]);
            } else {
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nn = 0; nn < BK5 / 8; nn++)
                        s[mt][nn][0] = s[mt][nn][1] = s[mt][nn][2] = s[mt][nn][3] = 0.f;
                // Each K fragment serves both row tiles.
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
                    for (int np = 0; np < BK5 / 16; np++) {
                        u32 bf[4];
                        ldsm4(bf, Ks + (np * 16 + (lm >> 1) * 8 + lr) * KP5 + kk * 16 + (lm & 1) * 8);
#pragma unroll
                        for (int mt = 0; mt < 2; mt++) {
                            mma3(s[mt][2 * np], qf[mt][kk], bf[0], bf[1]);
                            mma3(s[mt][2 * np + 1], qf[mt][kk], bf[2], bf[3]);
                        }
                    }
                }
                elementwise(0, 2);
            }
#if P > 0
            if (pass == 0) {
                tile_fmax = warp_max(tile_fmax);
                if (lane == 0 && kt < MAX_TILES5) atomicMax(&tmaxS[kt], ordered(tile_fmax));
            }
#endif
            if (!WG && want_v) {
                // O += P V; each V fragment serves both row tiles.
#pragma unroll
                for (int kb = 0; kb < BK5 / 16; kb++) {
                    u32 a[2][4];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        a[mt][0] = pack2(s[mt][2 * kb][0], s[mt][2 * kb][1]);
                        a[mt][1] = pack2(s[mt][2 * kb][2], s[mt][2 * kb][3]);
                        a[mt][2] = pack2(s[mt][2 * kb + 1][0], s[mt][2 * kb + 1][1]);
                        a[mt][3] = pack2(s[mt][2 * kb + 1][2], s[mt][2 * kb + 1][3]);
                    }
#pragma unroll
                    for (int dp = 0; dp < HD / 16; dp++) {
                        u32 bf[4];
                        ldsm4t(bf, Vs + (kb * 16 + (lm & 1) * 8 + lr) * KP5 + dp * 16 + (lm >> 1) * 8);
#pragma unroll
                        for (int mt = 0; mt < 2; mt++) {
                            mma3(oacc[mt][2 * dp], a[mt], bf[0], bf[1]);
                            mma3(oacc[mt][2 * dp + 1], a[mt], bf[2], bf[3]);
                        }
                    }
                }
            }
            __syncthreads(); // this stage is free for the load after next
            kt = nxt;
            stage ^= 1;
        }
        finish_rows5<MODE>(p, b, h, bh, t4, pass, rows, oacc, z, mx, fmx, wsum, fallback);
#if P > 0
        if (MODE == 1) {
            __syncthreads(); // every warp's tile maxima are in
            for (int t = threadIdx.x; t < min(nkt, MAX_TILES5); t += blockDim.x) tilemax[t] = tmaxS[t];
        }
#endif
    }
}

#if HD == 64
extern "C" __global__ void __launch_bounds__(NW5 * 32) lssa_fwd_mma5(KParams p) { fwd5_body<5>(p); }
// Re-weighting in two kernels: the first sweep's statistics, then the second sweep (MODE above).
extern "C" __global__ void __launch_bounds__(NW5 * 32) lssa_fwd_stats5(KParams p) { fwd5_body<5, 1>(p); }
extern "C" __global__ void __launch_bounds__(NW5 * 32) lssa_fwd_rw5(KParams p) { fwd5_body<5, 2>(p); }
#endif
#endif // HD == 64 || (HAVE_WGMMA && HD == 128)
