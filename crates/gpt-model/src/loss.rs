//! The model's loss: mean cross-entropy as one autograd node (`csrc/fused_loss.cpp`).
//!
//! The same number as `log_softmax` then `nll_loss` (tested to float rounding, value and gradient),
//! without their `(N, V)` intermediates: the forward keeps each row's log-sum-exp, the backward writes
//! the gradient `softmax(x) · g/N - (g/N at the target)` in one tensor. At the `small` training shape
//! (1,024 rows of 2,048 logits) that is about 3% of a step (`docs/bench/train-cpu.md`). On the CPU in
//! float32 the rows run in attn-kernels' `cpu::rows` (vectorised `exp` and `ln`; libtorch's `exp` here
//! cost about 4% of a step more).

use tch::Tensor;

/// Mean cross-entropy (nats) of `logits` `(N, V)` (float32 or float64, any device) against `targets`
/// `(N,)` (int64 in `0..V`); differentiable in `logits`. Errors name the bad shape, dtype or id.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor, String> {
    // The crate's FFI lives in one module (ARCHITECTURE.md; a tidy test keeps it there).
    crate::ffi::loss::cross_entropy(logits, targets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn reference(x: &Tensor, t: &Tensor) -> Tensor {
        x.log_softmax(-1, x.kind()).nll_loss(t)
    }

    #[test]
    fn equals_log_softmax_then_nll_in_value_and_gradient() {
        for kind in [Kind::Double, Kind::Float] {
            let (n, v) = (37, 301);
            let (x0, t) = crate::model::with_seed(5, || {
                let x = Tensor::randn([n, v], (kind, Device::Cpu)) * 6.0 + 40.0; // large logits: needs the max shift
                (x, Tensor::randint(v, [n], (Kind::Int64, Device::Cpu)))
            });
            let x = x0.detach().set_requires_grad(true);
            let got = cross_entropy(&x, &t).unwrap();
            got.backward();
            let xr = x0.detach().set_requires_grad(true);
            let want = reference(&xr, &t);
            want.backward();
            let tol = if kind == Kind::Double { 1e-12 } else { 2e-6 };
            let dv = (got.double_value(&[]) - want.double_value(&[])).abs();
            assert!(dv < tol * want.double_value(&[]).abs().max(1.0), "{kind:?}: loss differs by {dv}");
            let dg = (x.grad() - xr.grad()).abs().max().double_value(&[]);
            assert!(dg < tol, "{kind:?}: gradient differs by {dg}");
        }
    }

    #[test]
    fn takes_a_strided_view_and_scales_the_upstream_gradient() {
        // The model drops padded vocabulary columns with a narrow: a non-contiguous (N, V) view. Float32
        // runs attn-kernels' row kernels, float64 libtorch's ops.
        for (kind, tol) in [(Kind::Double, 1e-12), (Kind::Float, 1e-6)] {
            let padded = crate::model::with_seed(6, || Tensor::randn([8, 70], (kind, Device::Cpu)) * 4.0);
            let t = Tensor::from_slice(&[0i64, 63, 5, 9, 1, 2, 62, 7]);
            let x = padded.detach().set_requires_grad(true);
            let got = cross_entropy(&x.narrow(1, 0, 64), &t).unwrap() * 3.0;
            got.backward();
            let xr = padded.detach().set_requires_grad(true);
            let want = reference(&xr.narrow(1, 0, 64), &t) * 3.0;
            want.backward();
            let dv = (got.double_value(&[]) - want.double_value(&[])).abs();
            assert!(dv < tol * want.double_value(&[]).abs(), "{kind:?}: loss differs by {dv}");
            // Relative to the largest gradient (3 (1 - p) / 8 at a target, about 0.4).
            let dg = (x.grad() - xr.grad()).abs().max().double_value(&[]);
            assert!(dg < tol, "{kind:?}: gradient differs by {dg}");
            assert_eq!(
                x.grad().narrow(1, 64, 6).abs().sum(Kind::Double).double_value(&[]),
                0.0,
                "{kind:?}: padding gets no gradient"
            );
        }
    }

    #[test]
    fn bad_inputs_are_errors_that_say_what() {
        let x = Tensor::zeros([4, 10], (Kind::Float, Device::Cpu));
        let err = cross_entropy(&x, &Tensor::from_slice(&[0i64, 1, 2])).unwrap_err();
        assert!(err.contains("targets must be (N,)"), "{err}");
        let err = cross_entropy(&x, &Tensor::from_slice(&[0i32, 1, 2, 3])).unwrap_err();
        assert!(err.contains("int64"), "{err}");
        let err = cross_entropy(&x, &Tensor::from_slice(&[0i64, 1, 2, 10])).unwrap_err();
        assert!(err.to_lowercase().contains("index"), "{err}");
    }
}
