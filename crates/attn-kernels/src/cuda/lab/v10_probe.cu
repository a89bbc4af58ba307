// Lab v10's TMA layout probe: a lab module only, after `lab/v10_fwd.cu`, whose tensor maps, pipeline
// instructions and swizzled descriptors it uses.

#if HAVE_WGMMA && HD == 64

// The TMA layout probe, for the first run on a GPU (bench-cuda check; `cuda::tma_probe`): what v10
// assumes of TMA's 128-byte swizzle and of wgmma reading it, one mode per launch (p.B), f32 results
// at p.o. tmap[1] maps a (d, T, H, B) = (64, 80, 2, 1) tensor, tmap[2] one 64 x 64 tile; p.q holds a
// 64 x 64 row-major matrix for the register operand. Modes (`TMA_PROBE_MODES` in probe.rs):
//   0, 1  tmap[1]'s box at row 32 of head 1 (its rows from 80 on are past T: zeros), the shared
//         memory as TMA wrote it (the host compares it with the swizzled layout, then the plain one);
//   2     S = A B^T: A that box, B the tile, both K-major through swizzled descriptors (v10's Q K^T);
//   3     as 2, B's stride byte offset 512 (must not match);
//   4     O = O0 + P V: P from p.q in registers, V the tile MN-major (v10's P V), O0[m][n] = (m - n) / 64;
//   5     as 4, blocks of 16 keys 1024 bytes apart (must not match).
extern "C" __global__ void __launch_bounds__(128) lssa_tma_probe(const __grid_constant__ KParams10 a) {
    const KParams& p = a.p;
    const int mode = p.B;
    DYN_SMEM(u16, dyn);
    u16* const box = dyn + ((1024 - (wg_smem_addr(dyn) & 1023)) & 1023) / 2;
    u16* const tile = box + TILE10;
    __shared__ u64 bar;
    if (threadIdx.x == 0) {
        mbar_init(&bar, 1);
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(&bar, 2 * TILE10 * 2);
        tma_load4(box, &a.tmap[1], 0, 32, 1, 0, &bar);
        tma_load4(tile, &a.tmap[2], 0, 0, 0, 0, &bar);
    }
    mbar_wait(&bar, 0);
    float* out = (float*)p.o.ptr;
    if (mode <= 1) {
        for (int e = threadIdx.x; e < TILE10; e += blockDim.x) out[e] = to_f32(box[e]);
        return;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    float d[HD / 8][4];
    for (int i = 0; i < 32; i++) {
        const int r = 16 * warp + g + 8 * ((i >> 1) & 1), c = 8 * (i >> 2) + 2 * t4 + (i & 1);
        d[i >> 2][i & 3] = mode >= 4 ? (float)(r - c) / 64.f : 0.f;
    }
    // P's A fragments (mma.sync's layout: rows 16 warp + g and + 8, columns 16 kb + 2 t4 and + 8).
    u32 pa[BK5 / 16][4];
    const u16* gp = (const u16*)p.q.ptr;
    for (int kb = 0; kb < BK5 / 16; kb++)
        for (int x = 0; x < 4; x++) {
            const int r = 16 * warp + g + 8 * (x & 1), k = 16 * kb + 2 * t4 + 8 * (x >> 1);
            pa[kb][x] = (u32)gp[r * 64 + k] | ((u32)gp[r * 64 + k + 1] << 16);
        }
    wg_keep(d);
    wg_fence();
    if (mode <= 3) {
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma64_ss<0, 0>(&d[0][0], wg_desc_sw128(box + kk * 16), wg_desc_sw128(tile + kk * 16, mode == 3 ? 512 : 1024),
                             kk);
    } else {
        for (int kb = 0; kb < BK5 / 16; kb++)
            wgmma64<1>(&d[0][0], pa[kb], wg_desc_sw128(tile + kb * (mode == 5 ? 8 : 16) * HD, 1024, 1024), 1);
    }
    wg_commit();
    wg_wait<0>();
    wg_keep(d);
    for (int i = 0; i < 32; i++)
        out[(16 * warp + g + 8 * ((i >> 1) & 1)) * 64 + 8 * (i >> 2) + 2 * t4 + (i & 1)] = d[i >> 2][i & 3];
}
#endif // HAVE_WGMMA && HD == 64
