// The autograd bridge between libtorch and the fused attn-kernels (Rust).
//
// tch has no custom-autograd API, so this file defines a `torch::autograd::Function` whose static
// forward and backward call back into Rust (`gpt_model_fused_forward` / `_backward`, defined in
// src/ffi/attention.rs) with the node's call (opaque here) and one `AttnParams` struct of pointers,
// strides and sizes: exactly the layout of `attn_kernels::Params` (#[repr(C)]), so the kernels read it
// as it is.
//
// The call (Rust's `FusedCall`: the variant prepared for its target, and the helper flag) is owned by
// the node from `gpt_model_fused_apply` on: a `CallRef` in the autograd context's saved data releases
// it through `gpt_model_fused_release` when the node dies, so the backward finds the forward's call
// without any process-wide registry.
//
// Memory: every tensor is allocated here by libtorch (outputs, row statistics, gradients) and owned
// by libtorch; Rust only reads and writes through the pointers for the duration of one callback.
// Saved for the backward: q, k, v (the autograd inputs), the output and the `(B, H, T, S)` f32 row
// statistics. Nothing is `T x T`.
//
// Errors: a Rust callback returns a heap string (owned by Rust, released with
// `gpt_model_fused_free_error`), which becomes a `c10::Error` here; `gpt_model_fused_apply` catches
// every C++ exception and returns its message as a `malloc`ed string (released with
// `gpt_model_bridge_free`), so no exception ever crosses into Rust. Exceptions thrown in the backward
// are propagated by libtorch's autograd engine to the caller of `backward()` (tch reports them).

#include <ATen/ATen.h>
#include <lssa_ffi_guard.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

extern "C" {

struct RawTensor {
  void* ptr;
  size_t strides[3];  // element strides of the batch, head and row axes; the last axis is contiguous
};

// Mirrors attn_kernels::Params field for field (checked from Rust: gpt_model_bridge_params_size).
struct AttnParams {
  size_t batch, heads, kv_heads, seq_len, kv_len, head_dim;
  RawTensor q, k, v, o;
  float* stats;
  float* rw_aux;  // optional re-weighting helper (set by Rust for CPU tensors; null here)
  RawTensor d_out, dq, dk, dv;
  uint32_t dtype;  // attn_kernels::Dtype: 0 f32, 1 f16, 2 bf16 (what every tensor above holds)
};

// Implemented in Rust (src/ffi/attention.rs); `call` is Rust's opaque `FusedCall`.
char* gpt_model_fused_forward(const void* call, const AttnParams* p);
char* gpt_model_fused_backward(const void* call, const AttnParams* p);
void gpt_model_fused_release(void* call);
void gpt_model_fused_free_error(char* msg);

}  // extern "C"

namespace {

// Owns one Rust call for as long as the autograd node that saved it (an IValue capsule in the
// context's saved data; the capsule is the IValue that holds an arbitrary C++ object).
struct CallRef : torch::CustomClassHolder {
  void* call;
  explicit CallRef(void* c) : call(c) {}
  CallRef(const CallRef&) = delete;
  CallRef& operator=(const CallRef&) = delete;
  ~CallRef() override { gpt_model_fused_release(call); }
};

RawTensor raw(const at::Tensor& t) {
  RawTensor r;
  r.ptr = t.data_ptr();
  for (int i = 0; i < 3; ++i) r.strides[i] = static_cast<size_t>(t.stride(i));
  return r;
}

// A view whose last axis is contiguous (the kernels' only layout requirement), copying only if needed.
at::Tensor rows_contiguous(const at::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); }

void check_rust(char* err) {
  if (err != nullptr) {
    std::string msg(err);
    gpt_model_fused_free_error(err);
    TORCH_CHECK(false, msg);
  }
}

AttnParams base_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  AttnParams p;
  std::memset(&p, 0, sizeof(p));
  p.batch = q.size(0);
  p.heads = q.size(1);
  p.kv_heads = k.size(1);  // grouped-query attention: H a multiple of H_kv
  p.seq_len = q.size(2);
  p.kv_len = k.size(2);  // queries that continue a sequence: T_q <= T_k
  p.head_dim = q.size(3);
  p.q = raw(q);
  p.k = raw(k);
  p.v = raw(v);
  switch (q.scalar_type()) {
    case at::kFloat: p.dtype = 0; break;
    case at::kHalf: p.dtype = 1; break;
    case at::kBFloat16: p.dtype = 2; break;
    default: TORCH_CHECK(false, "the fused attention takes float32, float16 or bfloat16 tensors, got ", q.scalar_type());
  }
  return p;
}

struct FusedAttention : public torch::autograd::Function<FusedAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, const c10::intrusive_ptr<CallRef>& call,
                            int64_t stats_per_row) {
    at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
    // (B, H, T, d). On the CPU a view of (B, T, H, d) rows: the layout the model's output projection
    // reads, so that its `transpose(1, 2).contiguous()` copies nothing (nor its backward, whose
    // gradient arrives in the same layout). The CUDA kernels keep contiguous heads (not measured there).
    at::Tensor o = q.is_cpu() ? at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2)
                              : at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor stats = at::empty({q.size(0), q.size(1), q.size(2), stats_per_row}, q.options().dtype(at::kFloat));  // (B, H, T, S)
    AttnParams p = base_params(q, k, v);
    p.o = raw(o);
    p.stats = stats.data_ptr<float>();
    check_rust(gpt_model_fused_forward(call->call, &p));
    ctx->save_for_backward({q, k, v, o, stats});
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    return o;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &stats = saved[4];
    at::Tensor g = rows_contiguous(grad_outputs[0]);
    at::Tensor dq = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor dk = at::empty(k.sizes(), k.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor dv = at::empty(v.sizes(), v.options().memory_format(at::MemoryFormat::Contiguous));
    AttnParams p = base_params(q, k, v);
    p.o = raw(o);
    p.stats = const_cast<float*>(stats.data_ptr<float>());
    p.d_out = raw(g);
    p.dq = raw(dq);
    p.dk = raw(dk);
    p.dv = raw(dv);
    auto call = c10::static_intrusive_pointer_cast<CallRef>(ctx->saved_data["call"].toCapsule());
    check_rust(gpt_model_fused_backward(call->call, &p));
    // No gradient for the call and the statistics count.
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// Fused causal attention of (B, H, T, d) tensors `q`, `k`, `v` (Rust checked devices, dtypes and
// shapes) running `call`, recorded in the autograd graph. Takes ownership of `call` whatever happens.
// On success writes a new tensor to `*out` (owned by the caller, as tch's `Tensor::from_ptr` expects)
// and returns null; on failure returns the message.
char* gpt_model_fused_apply(at::Tensor* q, at::Tensor* k, at::Tensor* v, void* call, int64_t stats_per_row,
                            at::Tensor** out) {
  c10::intrusive_ptr<CallRef> owned;
  try {
    owned = c10::make_intrusive<CallRef>(call);
  } catch (...) {
    gpt_model_fused_release(call);
    return lssa_ffi::dup_message("out of memory in the fused attention bridge");
  }
  return lssa_ffi::guarded(
      [&] {
        at::Tensor o = FusedAttention::apply(*q, *k, *v, owned, stats_per_row);
        *out = new at::Tensor(std::move(o));
      },
      "unknown C++ exception in the fused attention bridge");
}

void gpt_model_bridge_free(char* msg) { std::free(msg); }

size_t gpt_model_bridge_params_size() { return sizeof(AttnParams); }

// CUDA autocast's (tch::autocast's) compute dtype, as the int of its at::ScalarType
// (src/ffi/autocast.rs): libtorch's default is fp16; the trainer's recipe asks for bf16.
int gpt_model_autocast_cuda_dtype() { return static_cast<int>(at::autocast::get_autocast_dtype(at::kCUDA)); }

void gpt_model_set_autocast_cuda_dtype(int dtype) {
  at::autocast::set_autocast_dtype(at::kCUDA, static_cast<at::ScalarType>(dtype));
}

int gpt_model_scalar_type_bf16() { return static_cast<int>(at::kBFloat16); }

}  // extern "C"
