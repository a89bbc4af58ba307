// Shared definitions of every CUDA kernel of attn-kernels. Compiled by NVRTC at run time, so it
// includes no header: 16-bit floats are handled as raw bits with PTX conversions.
//
// The host (compile.rs, from config.rs) prepends the configuration of one variant as macros:
//   ACT          0 exp, 1 softplus, 2 relu, 3 relu2, 4 relu6, 5 gelu, 6 sigmoid, 7 mish, 8 identity
//   ACT_BODY, ACT_GRAD_BODY  the bodies of act and act_grad (below) for that activation
//   NORM         0 l1, 1 none, 2 divide by N_i
//   RUNNING_MAX  1 for exp under l1 (softmax): subtract the running row maximum
//   SIGNED       1 when phi may be negative (l1 sums |f|; its gradient carries sign(f))
//   COSINE       1 for L2-normalised q and k (inverse norms precomputed by lssa_inv_norms)
//   P            re-weighting power, 0 for none
//   DTYPE        0 f32, 1 f16, 2 bf16 (inputs and outputs; all arithmetic is f32)
//   HD           head dimension
// Everything else (the per-row scale and bias constants, sizes, strides) is a kernel argument.
// The maths mirrors src/cpu/engine.rs (and its backward, src/cpu/grad.rs) line for line; SPEC sections 2-6 are the definition.

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Dynamic shared memory; the CPU emulator (emu.h, LSSA_EMU) hands out its own buffer.
#ifdef LSSA_EMU
#define DYN_SMEM(T, name) T* name = (T*)emu_dyn_smem()
#else
#define DYN_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

struct Tensor4 {
    u64 ptr;
    long long sb, sh, st; // element strides of batch, head and row; the last axis is contiguous
};

struct KParams {
    int B, H, T, D;
    Tensor4 q, k, v, o, g, dq, dk, dv;
    u64 stats;     // f32 (B, H, T, 4): Z, running max, m_i (u max), W_i
    u64 inv_norms; // f32: 1 / max(||x||, L2_NORM_EPS) of the (B*H, T) q rows, then the (B*Hkv, Tk) k rows (cosine only)
    u64 rowgrad;   // f32 (B*H*T, 2): D'_i and C_i (backward v1 and v4; the lab's use rowk)
    u64 dq_acc;    // f32 (B*H*T, HD): dq before the projection and the dtype (backward v7 only)
    u64 rowk;      // RowK6 (B*H*T): each row's backward constants, written once by the lab's rows
                   // kernel (v6, v7, v9) for its keys kernel (lab backward only)
    u64 tilemax;   // int (ordered f32): re-weighting's tile maxima from lssa_fwd_stats5/8 (lab forward)
    float scale_c; // scale_i = scale_c * (scale_log ? ln N_i : 1)
    int scale_log;
    float bias_c; // bias_i = bias_c - (bias_log ? ln N_i : 0)
    int bias_log;
    // Key and value heads (query head h reads key head h / (H / Hkv)) and keys: q holds the last T of
    // Tk rows, so query row i is row Tk - T + i of the sequence. Only the SIMT kernels (v1) take
    // Hkv != H or Tk != T; the host runs them there.
    int Hkv, Tk;
};

// The key head of query head bh = b * H + h, as b * Hkv + h / (H / Hkv).
__device__ __forceinline__ int kv_head(const KParams& p, int bh) {
    return (bh / p.H) * p.Hkv + (bh % p.H) / (p.H / p.Hkv);
}

#define STATS 4
#define ST_Z 0
#define ST_MAX 1
#define ST_UMAX 2
#define ST_W 3

// ---------------------------------------------------------------------------------------------
// Element access in the configured dtype.

__device__ __forceinline__ float to_f32(u16 h) {
#if DTYPE == 1 && defined(LSSA_EMU)
    return emu::f16_to_f32(h);
#elif DTYPE == 1
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return __uint_as_float(((u32)h) << 16);
#endif
}

__device__ __forceinline__ u16 from_f32(float x) {
    u16 h;
#if defined(LSSA_EMU)
    h = DTYPE == 1 ? emu::f32_to_f16(x) : emu::f32_to_bf16(x);
#elif DTYPE == 1
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
#else
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
#endif
    return h;
}

// Two floats into one register of two 16-bit values, `lo` in the low half (the lower index).
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
#if defined(LSSA_EMU)
    r = (u32)from_f32(lo) | ((u32)from_f32(hi) << 16);
#elif DTYPE == 1
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

__device__ __forceinline__ float ld(const Tensor4& x, int b, int h, long long row, int c) {
    long long i = b * x.sb + h * x.sh + row * x.st + c;
#if DTYPE == 0
    return ((const float*)x.ptr)[i];
#else
    return to_f32(((const u16*)x.ptr)[i]);
#endif
}

__device__ __forceinline__ void st(const Tensor4& x, int b, int h, long long row, int c, float v) {
    long long i = b * x.sb + h * x.sh + row * x.st + c;
#if DTYPE == 0
    ((float*)x.ptr)[i] = v;
#else
    ((u16*)x.ptr)[i] = from_f32(v);
#endif
}

// ---------------------------------------------------------------------------------------------
// The positivity map phi and its derivative (f32).

__device__ __forceinline__ float softplus_f(float x) {
    // max(x, 0) + log1p(exp(-|x|)); log1p by its series below 1e-3, where log(1 + e) would round.
    float e = __expf(-fabsf(x));
    float l = e < 1e-3f ? e * (1.f - 0.5f * e) : __logf(1.f + e);
    return fmaxf(x, 0.f) + l;
}

// x, hidden from the compiler's value numbering: what is computed from it is computed where it is
// used rather than hoisted above the code before it and held in registers through that code.
__device__ __forceinline__ int opaque(int x) {
#if defined(LSSA_EMU)
    return x;
#else
    int y;
    asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
    return y;
#endif
}

// 1 / x by the fast reciprocal (MUFU.RCP; div.approx, 2 ulp for 2^-126 < |x| < 2^126, 0 above)
// rather than an IEEE division, whose slow path is a subroutine call: ptxas keeps registers across
// it in local memory, which spilled v2's forward and v7's kernels of several variants (issue 47).
// The kernels take the reciprocals of row sums and maxima with it (what they scale is rounded to
// f16 / bf16 anyway); the re-weighting's skip threshold off / (N a) stays an IEEE division, so that
// no tile with a positive entry can be skipped by a rounding.
__device__ __forceinline__ float rcp_fast(float x) { return __fdividef(1.f, x); }

// 1 / (1 + e^-x) -> 0 for x below about -87 (where the denominator passes 2^126): sigmoid's value
// there to f32's normal range.
__device__ __forceinline__ float sigmoid_f(float x) { return rcp_fast(1.f + __expf(-x)); }

// tanh(softplus(x)) = n / (n + 2) with n = e^x (e^x + 2), since (1 + e^x)^2 = n + 1: one exp and
// one fast reciprocal instead of softplus's log and tanhf, and no cancellation as x -> -inf (n ~ 2e^x).
// Past x = 20 the ratio is 1 in f32 (1 - 8.5e-18), so x is clamped there to keep n finite.
__device__ __forceinline__ float tanh_softplus_f(float x) {
    const float e = __expf(fminf(x, 20.f)), n = e * (e + 2.f);
    return __fdividef(n, n + 2.f);
}

// phi(x), and phi'(x) given f = phi(x): the bodies come from the host (`DeviceActivation` in
// config.rs), the one definition of each built-in's device code.
__device__ __forceinline__ float act(float x) { ACT_BODY }
__device__ __forceinline__ float act_grad(float x, float f) { ACT_GRAD_BODY }

// x^E for a compile-time E: repeated squaring, unrolled.
template <int E> __device__ __forceinline__ float powi(float x) {
    float acc = 1.f, base = x;
#pragma unroll
    for (int e = E; e > 0; e >>= 1) {
        if (e & 1) acc *= base;
        base *= base;
    }
    return acc;
}

// ---------------------------------------------------------------------------------------------
// Per-row constants.

__device__ __forceinline__ float row_scale(const KParams& p, int n) {
    return p.scale_log ? p.scale_c * __logf((float)n) : p.scale_c;
}
__device__ __forceinline__ float row_bias(const KParams& p, int n) {
    return p.bias_log ? p.bias_c - __logf((float)n) : p.bias_c;
}
__device__ __forceinline__ float offset_of(int n) { return n <= OFFSET_FREE_ROWS ? 0.f : 1.f; }

// Stage-1 normalising factor: a_ij = f_ij * anorm.
__device__ __forceinline__ float anorm(float z, int n) {
#if NORM == 0
    return z == 0.f ? 0.f : rcp_fast(z);
#elif NORM == 1
    return 1.f;
#else
    return rcp_fast((float)n);
#endif
}

// The inverse norm of row `row` of q (which 0) or of k (which 1) as query head bh sees them.
__device__ __forceinline__ float inv_norm(const KParams& p, int bh, int which, int row) {
    const float* n = (const float*)p.inv_norms;
    return which == 0 ? n[(long long)bh * p.T + row]
                      : n[(long long)p.B * p.H * p.T + (long long)kv_head(p, bh) * p.Tk + row];
}

// Order-preserving map of floats onto ints, for atomicMax on floats of either sign.
__device__ __forceinline__ int ordered(float x) {
    int i = __float_as_int(x);
    return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float unordered(int i) { return __int_as_float(i >= 0 ? i : i ^ 0x7fffffff); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Inverse L2 norms of every q and k row (cosine variants): one warp per row.
extern "C" __global__ void lssa_inv_norms(KParams p) {
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    long long qrows = (long long)p.B * p.H * p.T, krows = (long long)p.B * p.Hkv * p.Tk;
    if (w >= qrows + krows) return;
    const bool key = w >= qrows;
    const long long r = key ? w - qrows : w;
    const int t = key ? p.Tk : p.T, heads = key ? p.Hkv : p.H;
    const int i = (int)(r % t), bh = (int)(r / t);
    const int b = bh / heads, h = bh % heads;
    const Tensor4& x = key ? p.k : p.q;
    float s = 0.f;
    for (int c = lane; c < HD; c += 32) {
        float v = ld(x, b, h, i, c);
        s += v * v;
    }
    s = warp_sum(s);
    if (lane == 0) ((float*)p.inv_norms)[w] = 1.f / fmaxf(sqrtf(s), L2_NORM_EPS);
}
