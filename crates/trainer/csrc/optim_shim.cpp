// The optimiser shim: libtorch's multi-tensor kernels (the fused AdamW that torch.optim.AdamW(fused=True)
// runs, and the _foreach_ norm, scale and zero ops), which tch does not expose, behind `extern "C"`
// functions for src/optim.rs.
//
// What crosses: arrays of `at::Tensor*` (tch's `Tensor::as_ptr()`: tch's tensors are heap
// `at::Tensor`s) with their length, and scalars. The shim copies the `at::Tensor` handles (reference
// counts) for the duration of one call; every op runs in place on the tensors' memory and has
// finished when the call returns (CPU ops synchronously; CUDA ops are queued on the current stream,
// which is what every other op of the trainer does too).
//
// Errors: every function returns NULL on success or a `malloc`ed message (released with
// `lssa_optim_free_error`): the convention of lssa_ffi_guard.h (torch-build's include/).

#include <ATen/ATen.h>
#include <lssa_ffi_guard.h>

#include <cstdlib>
#include <vector>

extern "C" {
char* lssa_optim_adamw(const void* const* params, const void* const* grads, const void* const* exp_avgs,
                       const void* const* exp_avg_sqs, size_t n, double step, double lr, double beta1, double beta2,
                       double weight_decay, double eps);
char* lssa_optim_grad_norm(const void* const* grads, size_t n, double* out);
char* lssa_optim_scale(const void* const* tensors, size_t n, double factor);
char* lssa_optim_clear_grads(const void* const* params, size_t n);
char* lssa_optim_gather_grads(const void* const* params, size_t n, const void* const* sources, size_t shards);
void lssa_optim_free_error(char* msg);
}  // extern "C"

namespace {

using lssa_ffi::guarded;

std::vector<at::Tensor> list(const void* const* ptrs, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(*static_cast<const at::Tensor*>(ptrs[i]));
  return out;
}

}  // namespace

extern "C" {

// One AdamW update of every tensor, with libtorch's fused kernel (the formula of torch.optim.AdamW:
// p -= lr·wd·p; m = lerp(m, g, 1 - beta1); v = beta2·v + (1 - beta2)·g²;
// p -= (lr / (1 - beta1^step)) · m / (sqrt(v) / sqrt(1 - beta2^step) + eps)). `step` counts this
// update (1 for the first).
char* lssa_optim_adamw(const void* const* params, const void* const* grads, const void* const* exp_avgs,
                       const void* const* exp_avg_sqs, size_t n, double step, double lr, double beta1, double beta2,
                       double weight_decay, double eps) {
  return guarded([&] {
    if (n == 0) return;
    auto p = list(params, n);
    // The kernel reads one step count per tensor; they are all the same here, so one tensor serves.
    auto step_t = at::full({}, step, p[0].options().dtype(at::kFloat));
    std::vector<at::Tensor> steps(n, step_t);
    at::_fused_adamw_(p, list(grads, n), list(exp_avgs, n), list(exp_avg_sqs, n), {}, steps, lr, beta1, beta2,
                      weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
  });
}

// The global L2 norm of the tensors: each tensor's norm in its own dtype (libtorch accumulates a
// float32 norm in float32 lanes), then the norm of those in float64.
char* lssa_optim_grad_norm(const void* const* grads, size_t n, double* out) {
  return guarded([&] {
    *out = 0.0;
    if (n == 0) return;
    auto norms = at::_foreach_norm(list(grads, n), 2);
    *out = at::stack(norms).to(at::kDouble).norm().item<double>();
  });
}

// Multiplies every tensor by `factor` in place.
char* lssa_optim_scale(const void* const* tensors, size_t n, double factor) {
  return guarded([&] {
    if (n == 0) return;
    auto t = list(tensors, n);
    at::_foreach_mul_(t, factor);
  });
}

// Drops every parameter's gradient (torch's `zero_grad(set_to_none=True)`): the next backward writes
// fresh gradients instead of adding to zeroed ones.
char* lssa_optim_clear_grads(const void* const* params, size_t n) {
  return guarded([&] {
    for (size_t i = 0; i < n; ++i) {
      at::Tensor p = *static_cast<const at::Tensor*>(params[i]);
      p.mutable_grad().reset();
    }
  });
}

// Sets parameter i's gradient (of `n`) to the sum of the gradients of `sources[s * n + i]` over the
// shards s = 0, 1, ..., added in that order (a fixed order: the same bits every time), and drops
// the sources' gradients. An undefined source gradient adds nothing; none defined leaves the
// parameter without one. The sum is made in the first defined source gradient's memory, which
// becomes the parameter's: no copy.
char* lssa_optim_gather_grads(const void* const* params, size_t n, const void* const* sources, size_t shards) {
  return guarded([&] {
    for (size_t i = 0; i < n; ++i) {
      at::Tensor p = *static_cast<const at::Tensor*>(params[i]);
      at::Tensor sum;
      for (size_t s = 0; s < shards; ++s) {
        at::Tensor src = *static_cast<const at::Tensor*>(sources[s * n + i]);
        at::Tensor g = src.grad();
        if (!g.defined()) continue;
        if (sum.defined()) {
          sum.add_(g);
        } else {
          sum = g;
        }
        src.mutable_grad().reset();
      }
      p.mutable_grad() = sum;
    }
  });
}

void lssa_optim_free_error(char* msg) { std::free(msg); }

}  // extern "C"
