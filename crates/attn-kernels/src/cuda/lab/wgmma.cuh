// Lab version 8: version 5 on Hopper's warpgroup tensor cores (sm_90a). The block's 4 warps are one
// warpgroup; each key tile is two wgmma.mma_async m64n64k16 chains per product (one per 64-row
// half of the block's 128 rows) instead of 32 mma.sync per warp, with Q, K and V read by the tensor
// cores straight from shared memory (no ldmatrix) and P as a register operand, as FlashAttention-3
// does. Q, K and V tiles are stored in the no-swizzle canonical layout of core matrices (8 rows x
// 16 bytes, contiguous); the same bytes are K-major A (Q) or B (K) for Q K^T and MN-major B for
// P V. Everything else is version 5's (the body in `v5_fwd.cu` is shared).
//
// This file: the warpgroup helpers of v8 and v9, in lab modules only, placed before `v5_fwd.cu`,
// whose shared body names them (that file declares them empty where this one is absent or the PTX
// is not sm_90a's). Emulated in emu.h (wgmma_*).

#if defined(LSSA_EMU) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HAVE_WGMMA 1

#ifdef LSSA_EMU
__device__ __forceinline__ void wg_fence() { emu::wg_fence(); }
__device__ __forceinline__ void wg_commit() { emu::wg_commit(); }
template <int N> __device__ __forceinline__ void wg_wait() { emu::wg_wait(N); }
__device__ __forceinline__ void fence_async_smem() { emu::fence_proxy_async(); }
template <int N> __device__ __forceinline__ void wg_keep(float (&)[N][4]) {}
__device__ __forceinline__ void sts32(u16* p, u32 v) {
    *(u32*)p = v;
    emu::generic_write(p);
}
__device__ __forceinline__ unsigned wg_smem_addr(const void* p) { return emu::smem_offset(p); }
template <int TNSP> __device__ __forceinline__ void wgmma64(float* d, const u32* a, u64 desc, int scale_d) {
    emu::wgmma(d, a, desc, 64, scale_d != 0, TNSP != 0, DTYPE == 1);
}
template <int TA, int TB> __device__ __forceinline__ void wgmma64_ss(float* d, u64 da, u64 db, int scale_d) {
    emu::wgmma_ss(d, da, db, 64, scale_d != 0, TA != 0, TB != 0, DTYPE == 1);
}
#else
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written through the generic proxy (cp.async, st.shared) is read by wgmma through
// the async proxy: each writer fences before the barrier that publishes the tile.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// An operand fence on accumulators (as CUTLASS's warpgroup_fence_operand): the compiler sees each
// register redefined here, in order with the wgmma.fence / wait_group asm around it, so it cannot
// move their other reads and writes across those (the asm's "memory" clobber orders memory only).
template <int N> __device__ __forceinline__ void wg_keep(float (&x)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(x[i][e])::"memory");
}
// A 4-byte store to shared memory that wgmma will read (the emulator tracks it for the fence).
__device__ __forceinline__ void sts32(u16* p, u32 v) { *(u32*)p = v; }
__device__ __forceinline__ unsigned wg_smem_addr(const void* p) { return smem_addr(p); }
#if DTYPE == 1
#define WG_TYPES "f16.f16"
#else
#define WG_TYPES "bf16.bf16"
#endif
// The 32 f32 accumulators of an m64n64 wgmma, as PTX operands %0..%31 and their constraints.
#define WG_D32                                                                                                       \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                        \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D32_OPS(d)                                                                                                \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),      \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),       \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
// D (64 x 64, f32) = A (64 x 16, registers) B (16 x 64, shared memory) + (scale_d ? D : 0);
// TNSP: B is MN-major.
template <int TNSP> __device__ __forceinline__ void wgmma64(float* d, const u32* a, u64 desc, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG_TYPES " " WG_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
                 : WG_D32_OPS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(TNSP), "r"(scale_d));
}
// The same with A (64 x 16) from shared memory too; TA: A is MN-major.
template <int TA, int TB> __device__ __forceinline__ void wgmma64_ss(float* d, u64 da, u64 db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG_TYPES " " WG_D32 ", %32, %33, p, 1, 1, %34, %35;\n}\n"
                 : WG_D32_OPS(d)
                 : "l"(da), "l"(db), "n"(TA), "n"(TB), "r"(scale_d));
}
#endif // LSSA_EMU
#endif
