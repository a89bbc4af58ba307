// Lab version 3 away from head dimension 128 (`v3_fwd.cu` holds its body, and its entry point at 128,
// where it is Auto's forward): at 64, where Auto runs v5.

#if HD != 128
extern "C" __global__ void __launch_bounds__(NW3 * 32) lssa_fwd_mma3(KParams p) { fwd3_body(p); }
#endif
