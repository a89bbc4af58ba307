// The model's loss as one autograd node (src/loss.rs): mean cross-entropy of (N, V) logits against
// (N,) int64 targets.
//
// libtorch's `cross_entropy` is `log_softmax` then `nll_loss`: its forward writes the whole (N, V)
// log-probability matrix, and its backward fills an (N, V) zero matrix, scatters -1/N into it and runs
// `log_softmax`'s backward over both (3.4 ms of a 77 ms `small` training step in PyTorch's profiler).
// Here the forward keeps only each row's log-sum-exp (N floats) and the backward writes the gradient
// once: softmax(x) · g/N, minus g/N at each row's target. Same formula, no (N, V) intermediate.
//
// CPU float32 logits whose rows are contiguous (the model's, a narrowed (N, V_pad) matrix) take the
// rows to Rust (`gpt_model_loss_*_rows` in src/attention/fused.rs, attn-kernels' `cpu::rows`), split
// over libtorch's threads here: libtorch's `exp` on this path is MKL's high-accuracy routine, about
// 1 ns per element per thread on the 2-core AMD machine the `small` shape is timed on. Other tensors
// (float64, CUDA) run the ATen ops below.
//
// What crosses: two `at::Tensor*` in (tch's `Tensor::as_ptr()`), a new `at::Tensor*` out that Rust
// owns (`Tensor::from_ptr`). Errors: NULL on success or a `malloc`ed message released with
// `gpt_model_loss_free_error` (lssa_ffi_guard.h's convention).

#include <ATen/Parallel.h>
#include <lssa_ffi_guard.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>

extern "C" {
// Implemented in Rust; they cannot fail (no allocation, targets already range-checked by `gather`).
void gpt_model_loss_logsumexp_rows(const float* x, size_t rows, size_t v, size_t stride, float* lse);
void gpt_model_loss_grad_rows(const float* x, size_t rows, size_t v, size_t stride, const float* lse,
                              const int64_t* targets, float scale, float* grad);
}

namespace {

// Rows per task: 2048 logits each at the `small` shape, so 16 rows are 128 KB.
constexpr int64_t kGrain = 16;

bool rows_in_rust(const at::Tensor& x) {
  return x.device().is_cpu() && x.scalar_type() == at::kFloat && x.stride(1) == 1 && x.size(1) > 0;
}

struct CrossEntropy : public torch::autograd::Function<CrossEntropy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& targets) {
    TORCH_CHECK(x.dim() == 2, "cross_entropy: logits must be (N, V), got ", x.sizes());
    TORCH_CHECK(targets.dim() == 1 && targets.size(0) == x.size(0), "cross_entropy: targets must be (N,) for logits ",
                x.sizes(), ", got ", targets.sizes());
    TORCH_CHECK(targets.scalar_type() == at::kLong, "cross_entropy: targets must be int64");
    TORCH_CHECK(x.size(0) > 0, "cross_entropy: no rows");
    at::Tensor lse;  // (N,)
    if (rows_in_rust(x)) {
      lse = at::empty({x.size(0)}, x.options());
      const float* xp = x.data_ptr<float>();
      float* out = lse.data_ptr<float>();
      const int64_t v = x.size(1), stride = x.stride(0);
      at::parallel_for(0, x.size(0), kGrain, [&](int64_t begin, int64_t end) {
        gpt_model_loss_logsumexp_rows(xp + begin * stride, end - begin, v, stride, out + begin);
      });
    } else {
      lse = at::logsumexp(x, {1});
    }
    at::Tensor picked = x.gather(1, targets.unsqueeze(1)).squeeze(1);        // (N,), checks the ids' range
    ctx->save_for_backward({x, targets, lse});
    return (lse - picked).mean();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &targets = saved[1], &lse = saved[2];
    if (rows_in_rust(x)) {
      const float scale = grad_outputs[0].item<float>() / static_cast<float>(x.size(0));
      at::Tensor grad = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
      const at::Tensor t = targets.contiguous();
      const float *xp = x.data_ptr<float>(), *lp = lse.data_ptr<float>();
      const int64_t* tp = t.data_ptr<int64_t>();
      float* gp = grad.data_ptr<float>();
      const int64_t v = x.size(1), stride = x.stride(0);
      at::parallel_for(0, x.size(0), kGrain, [&](int64_t begin, int64_t end) {
        gpt_model_loss_grad_rows(xp + begin * stride, end - begin, v, stride, lp + begin, tp + begin, scale,
                                 gp + begin * v);
      });
      return {grad, at::Tensor()};
    }
    // g/N as a 0-d tensor: no host read of a device value.
    at::Tensor scale = grad_outputs[0].to(x.scalar_type()) / static_cast<double>(x.size(0));
    at::Tensor grad = at::sub(x, lse.unsqueeze(1)).exp_().mul_(scale);  // softmax(x) · g/N
    grad.scatter_add_(1, targets.unsqueeze(1), scale.neg().expand({x.size(0), 1}));
    return {grad, at::Tensor()};
  }
};

}  // namespace

extern "C" {

// Mean cross-entropy of `*logits` (N, V) against `*targets` (N,), recorded in the autograd graph.
char* gpt_model_cross_entropy(const at::Tensor* logits, const at::Tensor* targets, at::Tensor** out) {
  return lssa_ffi::guarded([&] { *out = new at::Tensor(CrossEntropy::apply(*logits, *targets)); },
                           "unknown C++ exception in the fused cross-entropy");
}

void gpt_model_loss_free_error(char* msg) { std::free(msg); }

}  // extern "C"
