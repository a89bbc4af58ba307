//! Proves the libtorch link works end to end: a tensor graph, autograd, and a gradient that matches its
//! closed form. Also reports whether the linked libtorch sees CUDA (it must on a GPU machine: the
//! link keeps `libtorch_cuda`).

use tch::{Device, Kind, Tensor};

#[test]
fn autograd_matches_closed_form_gradient() {
    // y = sum_i softplus(x_i) * x_i^2 + sin(x_i)
    // dy/dx_i = sigmoid(x_i) * x_i^2 + 2 x_i softplus(x_i) + cos(x_i)
    let xs = [-3.0f64, -0.5, 0.0, 0.7, 2.5, 10.0];
    let x = Tensor::from_slice(&xs).to_kind(Kind::Double).set_requires_grad(true);
    let y = (x.softplus() * x.square() + x.sin()).sum(Kind::Double);
    y.backward();
    let grad: Vec<f64> = Vec::<f64>::try_from(x.grad()).unwrap();
    for (g, &x) in grad.iter().zip(&xs) {
        let softplus = x.max(0.0) + (-x.abs()).exp().ln_1p();
        let sigmoid = 1.0 / (1.0 + (-x).exp());
        let expected = sigmoid * x * x + 2.0 * x * softplus + x.cos();
        assert!((g - expected).abs() <= 1e-12 * expected.abs().max(1.0), "x={x}: autograd {g}, closed form {expected}");
    }
    // The forward value too, so a broken softplus cannot hide behind a matching derivative.
    let value = f64::try_from(&y).unwrap();
    let expected: f64 = xs.iter().map(|&x| (x.max(0.0) + (-x.abs()).exp().ln_1p()) * x * x + x.sin()).sum();
    assert!((value - expected).abs() < 1e-12 * expected.abs());
}

#[test]
fn matmul_graph_gradient() {
    // L = sum(A @ B) => dL/dA = 1 B^T (row sums of B broadcast), on whatever device is available.
    let device = gpt_model::runtime::best_device();
    eprintln!("{}", gpt_model::runtime::describe());
    let a = Tensor::randn([3, 4], (Kind::Float, device)).set_requires_grad(true);
    let b = Tensor::randn([4, 5], (Kind::Float, device));
    a.matmul(&b).sum(Kind::Float).backward();
    let expected = b.sum_dim_intlist(1i64, false, Kind::Float).unsqueeze(0).expand([3, 4], false);
    let err = (a.grad() - expected).abs().max().to_device(Device::Cpu).double_value(&[]);
    assert!(err < 1e-5, "max error {err}");
}
