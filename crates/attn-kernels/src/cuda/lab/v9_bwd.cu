// Lab version 9: version 7's row-statistics and keys kernels on warpgroup tensor cores (wgmma; head
// dimension 64, sm_90a), with v7's dq kernel.
#if HAVE_WGMMA && HD == 64
extern "C" __global__ void __launch_bounds__(NWB * 32) lssa_bwd_rowstats9(KParams p) { bwd_rows6<false, true>(p); }
extern "C" __global__ void __launch_bounds__(NWB * 32) lssa_bwd_keys_wg9(KParams p) { bwd_keys6<true, true>(p); }
#endif
