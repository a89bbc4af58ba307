// Lab version 6, the entry points: v7's bodies (`v7_bwd.cu`) with dq computed by the rows kernel
// (a second sweep over the keys) instead of accumulated by the keys kernel.

extern "C" __global__ void __launch_bounds__(NWB * 32) lssa_bwd_rows_mma6(KParams p) { bwd_rows6<true>(p); }
extern "C" __global__ void __launch_bounds__(NWB * 32) lssa_bwd_keys_mma6(KParams p) { bwd_keys6<false>(p); }
