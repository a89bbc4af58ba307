// Lab version 8, the entry points: v5's body (`v5_fwd.cu`) on warpgroup tensor cores, and the wgmma
// layout probe. A lab module only, after the production files.

#if HAVE_WGMMA
extern "C" __global__ void __launch_bounds__(NW8 * 32) lssa_fwd_wg8(KParams p) { fwd5_body<8>(p); }
extern "C" __global__ void __launch_bounds__(NW8 * 32) lssa_fwd_stats8(KParams p) { fwd5_body<8, 1>(p); }
extern "C" __global__ void __launch_bounds__(NW8 * 32) lssa_fwd_rw8(KParams p) { fwd5_body<8, 2>(p); }
#endif

#if HAVE_WGMMA && HD == 64

// A probe of the warpgroup operand layouts v8 and v9 assume, for the first run on a new GPU (bench-cuda
// check; `cuda::wgmma_probe`): one m64n64k16 product D = A B of row-major A (64 x 16, at p.q.ptr)
// and B (16 x 64, at p.k.ptr), D (64 x 64, f32) to p.o.ptr in the accumulator layout assumed, with
// the operands laid out as p.B says:
//   0  A from registers, B K-major in shared memory (v8's Q K^T, v9's K Q^T)
//   1  as 0 with the descriptor's two byte offsets swapped: must not match
//   2  A from registers, B MN-major (v8's P V, v9's dv and dk)
//   3  as 2, offsets swapped: must not match
//   4  A MN-major from shared memory, B as 2 (v9's dq)
// Modes 5-9: v8's own products on a 64 x 64 tile (K = 64, four chained k steps), from p.v (A: 128
// rows x 64, row-major) and p.g (the tile: 64 keys x 64 dims, row-major), into p.o (128 x 64 f32):
//   5: S = A K^T, K-major, scale-d 0 then 1 (v8's Q K^T);
//   6: O = O0 + A V, MN-major, scale-d 1 onto O0[m][n] = (m - n) / 64 (v8's P V);
//   7: mode 5 with the tile 16 bytes past a 128-byte line (v8's dynamic shared memory follows its
//      static arrays);
//   8: mode 5 on both 64-row halves in two commit groups, the first read after wait_group 1 while the
//      second is in flight (v8's pipeline);
//   9: mode 8 with arithmetic on the first half (0.5 S + 1) after its wait and no operand fence, so
//      the compiler may move it above the wait: whether it does is what this mode shows.
__device__ __forceinline__ void wg_probe_kernel_shaped(const KParams& p, int mode) {
    DYN_SMEM(u16, sm);
    const u16* ga = (const u16*)p.v.ptr;
    const u16* gt = (const u16*)p.g.ptr;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    u16* tile = sm + (mode == 7 ? 8 : 0);
    for (int e = threadIdx.x; e < 64 * 64; e += blockDim.x) {
        const int r = e / 64, c = e % 64; // key, dim
        tile[(r >> 3) * 512 + (c >> 3) * 64 + (r & 7) * 8 + (c & 7)] = gt[e];
    }
    u32 af[2][4][4]; // [half][k step][register]: mma.sync's A layout, rows 64 half + 16 warp + g (+ 8)
    for (int h = 0; h < 2; h++)
        for (int kk = 0; kk < 4; kk++)
            for (int x = 0; x < 4; x++) {
                const int r = 64 * h + 16 * warp + g + 8 * (x & 1), k = 16 * kk + 2 * t4 + 8 * (x >> 1);
                af[h][kk][x] = (u32)ga[r * 64 + k] | ((u32)ga[r * 64 + k + 1] << 16);
            }
    fence_async_smem();
    __syncthreads();
    float d0[8][4], d1[8][4];
    for (int i = 0; i < 32; i++) {
        const int r = 16 * warp + g + 8 * ((i >> 1) & 1), c = 8 * (i >> 2) + 2 * t4 + (i & 1);
        d0[i >> 2][i & 3] = mode == 6 ? (float)(r - c) / 64.f : 0.f;
        d1[i >> 2][i & 3] = 0.f;
    }
    wg_keep(d0);
    wg_keep(d1);
    wg_fence();
    if (mode == 6) {
        for (int kb = 0; kb < 4; kb++) wgmma64<1>(&d0[0][0], af[0][kb], wg_desc(tile + kb * 16 * 64, 1024, 128), 1);
    } else {
        for (int kk = 0; kk < 4; kk++) wgmma64<0>(&d0[0][0], af[0][kk], wg_desc(tile + kk * 128, 128, 1024), kk);
    }
    wg_commit();
    float* out = (float*)p.o.ptr;
    if (mode >= 8) {
        for (int kk = 0; kk < 4; kk++) wgmma64<0>(&d1[0][0], af[1][kk], wg_desc(tile + kk * 128, 128, 1024), kk);
        wg_commit();
        wg_wait<1>();
        if (mode == 9) {
            for (int i = 0; i < 32; i++) d0[i >> 2][i & 3] = 0.5f * d0[i >> 2][i & 3] + 1.f;
        } else {
            wg_keep(d0);
        }
        for (int i = 0; i < 32; i++)
            out[(16 * warp + g + 8 * ((i >> 1) & 1)) * 64 + 8 * (i >> 2) + 2 * t4 + (i & 1)] = d0[i >> 2][i & 3];
    }
    wg_wait<0>();
    wg_keep(d0);
    wg_keep(d1);
    for (int i = 0; i < 32; i++) {
        const int r = 16 * warp + g + 8 * ((i >> 1) & 1), c = 8 * (i >> 2) + 2 * t4 + (i & 1);
        if (mode < 8)
            out[r * 64 + c] = d0[i >> 2][i & 3];
        else
            out[(64 + r) * 64 + c] = d1[i >> 2][i & 3];
    }
}

extern "C" __global__ void __launch_bounds__(128) lssa_wg_probe(KParams p) {
    if (p.B >= 5) {
        wg_probe_kernel_shaped(p, p.B);
        return;
    }
    DYN_SMEM(u16, sm);
    const u16* ga = (const u16*)p.q.ptr;
    const u16* gb = (const u16*)p.k.ptr;
    const int mode = p.B, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    u16* sa = sm;           // A, 64 x 16, MN-major core matrices: k blocks 1024 bytes apart, m chunks 128
    u16* sb = sm + 64 * 16; // B, 16 x 64
    for (int e = threadIdx.x; e < 16 * 64; e += blockDim.x) {
        const int k = e / 64, n = e % 64;
        // K-major: n blocks 256 bytes apart, k chunks 128; MN-major: k blocks 1024 bytes apart, n chunks 128.
        const int bi = mode <= 1 ? (n >> 3) * 128 + (k >> 3) * 64 + (n & 7) * 8 + (k & 7)
                                 : (k >> 3) * 512 + (n >> 3) * 64 + (k & 7) * 8 + (n & 7);
        sb[bi] = gb[e];
        const int m = e / 16, ka = e % 16; // A's element e
        sa[(ka >> 3) * 512 + (m >> 3) * 64 + (ka & 7) * 8 + (m & 7)] = ga[e];
    }
    u32 a[4];
    const int r0 = 16 * warp + g;
    for (int x = 0; x < 4; x++) {
        const int r = r0 + 8 * (x & 1), k = 2 * t4 + 8 * (x >> 1);
        a[x] = (u32)ga[r * 16 + k] | ((u32)ga[r * 16 + k + 1] << 16);
    }
    fence_async_smem();
    __syncthreads();
    float d[32];
    wg_fence();
    switch (mode) {
    case 0: wgmma64<0>(d, a, wg_desc(sb, 128, 256), 0); break;
    case 1: wgmma64<0>(d, a, wg_desc(sb, 256, 128), 0); break;
    case 2: wgmma64<1>(d, a, wg_desc(sb, 1024, 128), 0); break;
    case 3: wgmma64<1>(d, a, wg_desc(sb, 128, 1024), 0); break;
    default: wgmma64_ss<1, 1>(d, wg_desc(sa, 1024, 128), wg_desc(sb, 1024, 128), 0); break;
    }
    wg_commit();
    wg_wait<0>();
    float* out = (float*)p.o.ptr;
    for (int i = 0; i < 32; i++) out[(r0 + 8 * ((i >> 1) & 1)) * 64 + 8 * (i >> 2) + 2 * t4 + (i & 1)] = d[i];
}
#endif
