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

// Lab version 9: version 7's row-statistics and keys kernels on warpgroup tensor cores (wgmma; head
// dimension 64, sm_90a), with v7's dq kernel.
#if HAVE_WGMMA && HD == 64
extern "C" __global__ void __launch_bounds__(NWB * 32) lssa_bwd_rowstats9(KParams p) { bwd_rows6<false, true>(p); }
extern "C" __global__ void __launch_bounds__(NWB * 32) lssa_bwd_keys_wg9(KParams p) { bwd_keys6<true, true>(p); }
#endif

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
