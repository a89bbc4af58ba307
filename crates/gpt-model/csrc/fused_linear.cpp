// A linear layer y = x Wᵀ (+ b) as one autograd node whose three products (x Wᵀ forward, dY W and
// dYᵀ X backward) run on AMX tiles at f32 accuracy: attn-kernels' `cpu::gemm`, through the Rust
// callbacks of src/ffi/linear.rs (src/model.rs's `linear` calls this only on CPUs that have AMX, for
// float32 CPU tensors). Each product packs its B operand once (the weight, or X for the weight's
// gradient) and runs blocks of 128 rows of its A operand in at::parallel_for, on libtorch's
// intra-op threads. A row's result does not depend on the split, so the numbers do not depend on
// the thread count.
//
// What crosses: two or three `at::Tensor*` in (x, W, and b or NULL), one new `at::Tensor*` out that
// Rust owns. Errors: NULL on success or a `malloc`ed message released with
// `gpt_model_linear_free_error` (lssa_ffi_guard.h's convention).

#include <ATen/Parallel.h>
#include <lssa_ffi_guard.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <string>

extern "C" {
// src/ffi/linear.rs: attn-kernels' `cpu::gemm::{packed_len, pack_b, rows}` and its row block; the
// second and third return NULL or a Rust-owned message that `gpt_model_fused_free_error`
// (src/ffi/attention.rs) releases.
size_t gpt_model_gemm_packed_len(size_t k, size_t n);
char* gpt_model_gemm_pack_b(const float* b, size_t ld, size_t k, size_t n, bool transposed, float* out,
                            size_t out_len);
char* gpt_model_gemm_rows(const float* a, size_t lda, bool a_transposed, size_t m, size_t k, const float* packed,
                          size_t packed_len, size_t n, float* c, size_t ldc, bool add, float* row_sums);
void gpt_model_fused_free_error(char* msg);
size_t gpt_model_gemm_row_block();
}

namespace {

void check(char* err) {
  if (err == nullptr) return;
  std::string msg(err);
  gpt_model_fused_free_error(err);
  TORCH_CHECK(false, "fused linear: ", msg);
}

// `B` (k x n) packed: `b` holds its rows, or with `transposed` Bᵀ's (n rows of k).
at::Tensor pack(const at::Tensor& b, int64_t k, int64_t n, bool transposed) {
  const size_t len = gpt_model_gemm_packed_len(k, n);
  at::Tensor out = at::empty({static_cast<int64_t>(len)}, b.options());
  check(gpt_model_gemm_pack_b(b.data_ptr<float>(), b.stride(0), k, n, transposed, out.data_ptr<float>(), len));
  return out;
}

// c (m x n, contiguous) = A · B, or = bias + A · B where `bias` (n floats) is not NULL: A's rows are
// a's (m rows of k), or with `a_transposed` a's columns (a holds k rows of m); and A's row sums to
// `row_sums` (m floats) unless it is NULL. The bias is written into a block's rows by the thread
// that adds the block's product to them, right before (the rows still in its cache), instead of
// one copy of the whole output before the products (no difference measured in the step's time).
void product(const at::Tensor& a, bool a_transposed, int64_t m, int64_t k, const at::Tensor& packed, int64_t n,
             at::Tensor& c, const float* bias, float* row_sums = nullptr) {
  const int64_t block = static_cast<int64_t>(gpt_model_gemm_row_block());
  const float* ap = a.data_ptr<float>();
  const float* bp = packed.data_ptr<float>();
  float* cp = c.data_ptr<float>();
  const int64_t lda = a.stride(0), blocks = (m + block - 1) / block;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    const int64_t i0 = b0 * block, i1 = std::min(m, b1 * block);
    const float* rows = a_transposed ? ap + i0 : ap + i0 * lda;
    float* sums = row_sums == nullptr ? nullptr : row_sums + i0;
    if (bias != nullptr) {
      for (int64_t i = i0; i < i1; ++i) std::copy(bias, bias + n, cp + i * n);
    }
    check(gpt_model_gemm_rows(rows, lda, a_transposed, i1 - i0, k, bp, packed.numel(), n, cp + i0 * n, n,
                              bias != nullptr, sums));
  });
}

struct AmxLinear : public torch::autograd::Function<AmxLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b) {
    TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "fused linear: CPU tensors only");
    TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "fused linear: float32 only, got ",
                x.scalar_type(), " and ", w.scalar_type());
    TORCH_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1), "fused linear: input ", x.sizes(),
                " does not match the weight ", w.sizes());
    const int64_t n = w.size(0), k = w.size(1);
    // No bias: an empty tensor (an undefined one is no input an autograd function takes).
    const bool bias = b.numel() > 0;
    TORCH_CHECK(!bias || (b.dim() == 1 && b.size(0) == n && b.scalar_type() == at::kFloat),
                "fused linear: bias must be (", n, ") float32");
    const at::Tensor x2 = x.reshape({-1, k}).contiguous(), wc = w.contiguous();
    const int64_t m = x2.size(0);
    at::Tensor y = at::empty({m, n}, x2.options());
    const at::Tensor bc = bias ? b.contiguous() : b;
    product(x2, false, m, k, pack(wc, k, n, /*transposed=*/true), n, y, bias ? bc.data_ptr<float>() : nullptr);
    ctx->save_for_backward({x2, wc});
    ctx->saved_data["bias"] = bias;
    auto shape = x.sizes().vec();
    shape.back() = n;
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x2 = saved[0], &w = saved[1];
    const int64_t m = x2.size(0), k = x2.size(1), n = w.size(0);
    const at::Tensor dy = grads[0].reshape({m, n}).contiguous();
    at::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {
      // dX = dY W: B = W (n rows of k).
      dx = at::empty({m, k}, dy.options());
      product(dy, false, m, n, pack(w, n, k, /*transposed=*/false), k, dx, nullptr);
      auto shape = grads[0].sizes().vec();
      shape.back() = k;
      dx = dx.view(shape);
    }
    const bool bias = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2);
    if (bias) db = at::empty({n}, dy.options());
    if (ctx->needs_input_grad(1)) {
      // dW = dYᵀ X: A's rows are dY's columns, B = X (m rows of k); the bias's gradient is A's row
      // sums, taken as its rows are split.
      dw = at::empty({n, k}, dy.options());
      product(dy, true, n, m, pack(x2, m, k, /*transposed=*/false), k, dw, nullptr, bias ? db.data_ptr<float>() : nullptr);
    } else if (bias) {
      db = dy.sum(0);
    }
    return {dx, dw, db};
  }
};

}  // namespace

extern "C" {

// `*x` (..., k) times `*w`ᵀ (w: n x k), plus `*b` (n) unless `b` is NULL, recorded in the autograd
// graph. Writes a new tensor (..., n) to `out`.
char* gpt_model_amx_linear(const at::Tensor* x, const at::Tensor* w, const at::Tensor* b, at::Tensor** out) {
  return lssa_ffi::guarded(
      [&] {
        at::Tensor y = AmxLinear::apply(*x, *w, b == nullptr ? at::empty({0}, x->options()) : *b);
        *out = new at::Tensor(std::move(y));
      },
      "unknown C++ exception in the fused linear");
}

void gpt_model_linear_free_error(char* msg) { std::free(msg); }

}  // extern "C"
