// A block's q, k and v from its (B, T, 3d) projection as one autograd node (src/model.rs's
// `qkv_heads`): q and k rotated by RoPE (rotate-half), each of q, k, v written as (B, T, H, hd).
//
// Written as tensor ops (narrow the projection, view it as heads, rotate q and k with cat and four
// multiplications), the step records about twenty autograd nodes per block; their backward fills a
// zero matrix and copies into it for every narrow and select, multiplies and adds half-heads, and sums
// the pieces: about 1.2 ms of a 17 ms block at the `small` training shape on 2 cores
// (docs/bench/train-cpu-notes.md). Here the forward reads the projection once and writes q, k, v
// once, and the backward reads their gradients once and writes the projection's once:
//
//   forward   (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)      per head of q and k, v copied
//   backward  (g1, g2) -> (g1 cos + g2 sin, g2 cos - g1 sin)      the rotation's transpose
//
// CPU float32 and float64 only (the Rust side runs the tensor ops elsewhere). The cos and sin tables,
// (T, hd/2), get no gradient. A gradient that autograd does not provide (an output nobody used)
// counts as zero.
//
// What crosses: three `at::Tensor*` in, three new `at::Tensor*` out that Rust owns (q, k, v). Errors:
// NULL on success or a `malloc`ed message released with `gpt_model_rope_free_error`
// (lssa_ffi_guard.h's convention).

#include <ATen/Parallel.h>
#include <lssa_ffi_guard.h>
#include <torch/torch.h>

#include <cstdlib>

namespace {

// Rows of (B·T) per task: 3d = 384 floats each at the `small` shape, so 16 rows are about 50 KB.
constexpr int64_t kGrain = 16;

// y = rot(x) (forward) or rot^T(x) (backward, `sign` = -1) of one head of `hd` values.
template <typename scalar_t>
inline void rotate(const scalar_t* __restrict__ x, const scalar_t* __restrict__ c, const scalar_t* __restrict__ s,
                   scalar_t sign, int64_t half, scalar_t* __restrict__ y) {
  for (int64_t i = 0; i < half; ++i) {
    const scalar_t x1 = x[i], x2 = x[i + half], si = sign * s[i];
    y[i] = x1 * c[i] - x2 * si;
    y[i + half] = x2 * c[i] + x1 * si;
  }
}

// A (B, T, H, hd) tensor whose last axis is contiguous, addressed by row r = (b, t) and head h.
template <typename scalar_t>
struct Heads {
  const scalar_t* p;
  int64_t t, sb, st, sh;
  Heads(const at::Tensor& g, int64_t t) : p(g.data_ptr<scalar_t>()), t(t), sb(g.stride(0)), st(g.stride(1)), sh(g.stride(2)) {}
  const scalar_t* at(int64_t r, int64_t h) const { return p + (r / t) * sb + (r % t) * st + h * sh; }
};

struct QkvHeads : public torch::autograd::Function<QkvHeads> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& qkv,
                                                const at::Tensor& cos, const at::Tensor& sin, int64_t heads) {
    TORCH_CHECK(qkv.dim() == 3, "qkv_heads: the projection must be (B, T, 3d), got ", qkv.sizes());
    TORCH_CHECK(qkv.device().is_cpu(), "qkv_heads: CPU tensors only");
    TORCH_CHECK(qkv.scalar_type() == at::kFloat || qkv.scalar_type() == at::kDouble,
                "qkv_heads: float32 or float64 only, got ", qkv.scalar_type());
    TORCH_CHECK(heads > 0 && qkv.size(2) % (3 * heads) == 0, "qkv_heads: last axis ", qkv.size(2),
                " is not 3 x heads (", heads, ") x head dim");
    const int64_t b = qkv.size(0), t = qkv.size(1), d = qkv.size(2) / 3, hd = d / heads, half = hd / 2;
    TORCH_CHECK(hd % 2 == 0, "qkv_heads: odd head dim ", hd);
    for (const at::Tensor* table : {&cos, &sin}) {
      TORCH_CHECK(table->dim() == 2 && table->size(0) == t && table->size(1) == half, "qkv_heads: RoPE tables must be (",
                  t, ", ", half, "), got ", table->sizes());
      TORCH_CHECK(table->scalar_type() == qkv.scalar_type() && table->device() == qkv.device(),
                  "qkv_heads: RoPE tables must match the projection's dtype and device");
    }
    const at::Tensor x = qkv.contiguous(), c = cos.contiguous(), s = sin.contiguous();
    at::Tensor q = at::empty({b, t, heads, hd}, x.options()), k = at::empty_like(q), v = at::empty_like(q);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "qkv_heads", [&] {
      const scalar_t *xp = x.data_ptr<scalar_t>(), *cp = c.data_ptr<scalar_t>(), *sp = s.data_ptr<scalar_t>();
      scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
      at::parallel_for(0, b * t, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const scalar_t *row = xp + r * 3 * d, *cr = cp + (r % t) * half, *sr = sp + (r % t) * half;
          for (int64_t h = 0; h < heads; ++h) {
            rotate(row + h * hd, cr, sr, scalar_t(1), half, qp + r * d + h * hd);
            rotate(row + d + h * hd, cr, sr, scalar_t(1), half, kp + r * d + h * hd);
          }
          std::copy(row + 2 * d, row + 3 * d, vp + r * d);
        }
      });
    });
    ctx->save_for_backward({c, s});
    return {q, k, v};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &c = saved[0], &s = saved[1];
    const at::Tensor* shape = nullptr;
    for (const at::Tensor& g : grads) {
      if (g.defined()) shape = &g;
    }
    TORCH_CHECK(shape != nullptr, "qkv_heads: backward without any gradient");
    const int64_t b = shape->size(0), t = shape->size(1), heads = shape->size(2), hd = shape->size(3);
    const int64_t d = heads * hd, half = hd / 2;
    // Any layout whose last axis is contiguous is read as it is (the fused attention's dq is
    // (B, H, T, hd) memory, SDPA's is (B, T, H, hd)); a missing gradient reads as zeros.
    auto rows = [&](const at::Tensor& g) {
      if (!g.defined()) return at::zeros(shape->sizes(), shape->options());
      return g.stride(3) == 1 ? g : g.contiguous();
    };
    const at::Tensor dq = rows(grads[0]), dk = rows(grads[1]), dv = rows(grads[2]);
    at::Tensor dx = at::empty({b, t, 3 * d}, dq.options());
    AT_DISPATCH_FLOATING_TYPES(dx.scalar_type(), "qkv_heads_backward", [&] {
      const scalar_t *cp = c.data_ptr<scalar_t>(), *sp = s.data_ptr<scalar_t>();
      const Heads<scalar_t> gq(dq, t), gk(dk, t), gv(dv, t);
      scalar_t* xp = dx.data_ptr<scalar_t>();
      at::parallel_for(0, b * t, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          scalar_t* row = xp + r * 3 * d;
          const scalar_t *cr = cp + (r % t) * half, *sr = sp + (r % t) * half;
          for (int64_t h = 0; h < heads; ++h) {
            rotate(gq.at(r, h), cr, sr, scalar_t(-1), half, row + h * hd);
            rotate(gk.at(r, h), cr, sr, scalar_t(-1), half, row + d + h * hd);
            std::copy(gv.at(r, h), gv.at(r, h) + hd, row + 2 * d + h * hd);
          }
        }
      });
    });
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// q, k, v (B, T, H, hd) of the projection `*qkv` (B, T, 3d) with `heads` heads, q and k rotated by the
// (T, hd/2) tables `*cos`, `*sin`; recorded in the autograd graph. Writes three new tensors to `out`.
char* gpt_model_qkv_heads(const at::Tensor* qkv, const at::Tensor* cos, const at::Tensor* sin, int64_t heads,
                          at::Tensor** out) {
  return lssa_ffi::guarded(
      [&] {
        auto qkv_out = QkvHeads::apply(*qkv, *cos, *sin, heads);
        for (int i = 0; i < 3; ++i) out[i] = new at::Tensor(std::move(qkv_out[i]));
      },
      "unknown C++ exception in the fused RoPE");
}

void gpt_model_rope_free_error(char* msg) { std::free(msg); }

}  // extern "C"
