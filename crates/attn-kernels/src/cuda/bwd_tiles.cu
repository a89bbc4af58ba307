// Tile helpers of the tensor-core backward (f16 / bf16, head dimension 64 or 128), first written
// for lab version 4 (`lab/v4_bwd.cu`) and shared by v7 (`v7_bwd.cu`): A fragments, the tile
// products on mma.sync and the cosine projection and store of dq, dk, dv rows. Uses the helpers
// of v3_fwd.cu.

#define BB 64  // query rows (rows kernel) or keys (keys kernel) per block, and per streamed tile
#define NWB 4  // warps per block: 16 rows or keys each

// Loads a block's 64 rows of x into (row stride KP3) shared memory and the A-operand fragments of
// this warp's 16 rows from it.
__device__ __forceinline__ void a_frags(u32 (*fr)[4], const u16* s, int warp, int lm, int lr) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) ldsm4(fr[kk], s + (warp * 16 + (lm & 1) * 8 + lr) * KP3 + kk * 16 + (lm >> 1) * 8);
}

// acc[16 x 64] = A (16 x HD, fragments) times the 64 rows of `rows` (row stride KP3) transposed.
__device__ __forceinline__ void mma_rows_t(float (*acc)[4], const u32 (*a)[4], const u16* rows, int lm, int lr) {
#pragma unroll
    for (int nn = 0; nn < BB / 8; nn++) acc[nn][0] = acc[nn][1] = acc[nn][2] = acc[nn][3] = 0.f;
    const SAddr row = saddr(rows + ((lm >> 1) * 8 + lr) * KP3 + (lm & 1) * 8);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
        for (int np = 0; np < BB / 16; np++) {
            u32 bf[4];
            ldsm4_sa(bf, sa_add(row, np * 16 * KP3 + kk * 16));
            mma3(acc[2 * np], a[kk], bf[0], bf[1]);
            mma3(acc[2 * np + 1], a[kk], bf[2], bf[3]);
        }
    }
}

// This thread's ldmatrix row in a tile `rows` (row stride KP3) read as an MN-major B operand.
__device__ __forceinline__ SAddr b_row_t(const u16* rows, int lm, int lr) {
    return saddr(rows + ((lm & 1) * 8 + lr) * KP3 + (lm >> 1) * 8);
}

// out[16 x HD] += A (16 x 16, one A fragment) times the 16 rows from kb * 16 of the tile whose
// b_row_t is `row`.
__device__ __forceinline__ void mma_a16_rows(float (*out)[4], const u32* a, SAddr row, int kb) {
#pragma unroll
    for (int dp = 0; dp < HD / 16; dp++) {
        u32 bf[4];
        ldsm4t_sa(bf, sa_add(row, kb * 16 * KP3 + dp * 16));
        mma3(out[2 * dp], a, bf[0], bf[1]);
        mma3(out[2 * dp + 1], a, bf[2], bf[3]);
    }
}

// out[16 x HD] += A (16 x 64: this warp's A fragments, 16 columns each) times `rows` (64 x HD).
__device__ __forceinline__ void mma_a_rows(float (*out)[4], const u32 (*a)[4], const u16* rows, int lm, int lr) {
    const SAddr row = b_row_t(rows, lm, lr);
#pragma unroll
    for (int kb = 0; kb < BB / 16; kb++) mma_a16_rows(out, a[kb], row, kb);
}

// out[16 x HD] += P (16 x 64, accumulator layout, rounded to the dtype) times `rows` (64 x HD).
__device__ __forceinline__ void mma_acc_rows(float (*out)[4], const float (*pm)[4], const u16* rows, int lm, int lr) {
#pragma unroll
    for (int kb = 0; kb < BB / 16; kb++) {
        u32 a[4];
        a[0] = pack2(pm[2 * kb][0], pm[2 * kb][1]);
        a[1] = pack2(pm[2 * kb][2], pm[2 * kb][3]);
        a[2] = pack2(pm[2 * kb + 1][0], pm[2 * kb + 1][1]);
        a[3] = pack2(pm[2 * kb + 1][2], pm[2 * kb + 1][3]);
        mma_a16_rows(out, a, b_row_t(rows, lm, lr), kb);
    }
}

// Projects the two rows held by this thread (accumulator layout) through the L2 normalisation of
// the raw rows x (global): y -= x <x, y> inv^2, when the norm was not clamped.
__device__ __forceinline__ void project_rows(float (*y)[4], const Tensor4& x, int b, int h, const int* rows, const float* inv, int T, int t4) {
#pragma unroll
    for (int q = 0; q < 2; q++) {
        float dot = 0.f;
        if (rows[q] < T) {
#pragma unroll
            for (int nn = 0; nn < HD / 8; nn++) {
                int c = nn * 8 + 2 * t4;
                dot += y[nn][2 * q] * ld(x, b, h, rows[q], c) + y[nn][2 * q + 1] * ld(x, b, h, rows[q], c + 1);
            }
        }
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        if (rows[q] < T && inv[q] < 1e12f) {
            dot *= inv[q] * inv[q];
#pragma unroll
            for (int nn = 0; nn < HD / 8; nn++) {
                int c = nn * 8 + 2 * t4;
                y[nn][2 * q] -= ld(x, b, h, rows[q], c) * dot;
                y[nn][2 * q + 1] -= ld(x, b, h, rows[q], c + 1) * dot;
            }
        }
    }
}

__device__ __forceinline__ void store_rows(const Tensor4& x, int b, int h, const int* rows, const float (*y)[4], int T, int t4) {
#pragma unroll
    for (int q = 0; q < 2; q++) {
        if (rows[q] >= T) continue;
        u16* o = (u16*)x.ptr + b * x.sb + h * x.sh + (long long)rows[q] * x.st;
#pragma unroll
        for (int nn = 0; nn < HD / 8; nn++) *(u32*)(o + nn * 8 + 2 * t4) = pack2(y[nn][2 * q], y[nn][2 * q + 1]);
    }
}
