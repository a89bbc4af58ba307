//! What the CPU kernels' test files share.

/// Every variant the CPU kernels fuse (Tables 3 and 4, plus re-weighting with several `p`).
#[allow(dead_code)]
pub const FUSED: &[&str] = &[
    "softmax",
    "lssa",
    "softplus-l1",
    "relu-l1",
    "relu2-l1",
    "relu6-l1",
    "gelu-l1",
    "sigmoid-l1",
    "mish-l1",
    "exp-nonorm",
    "linear",
    "linear-l1",
    "sigmoid-bias:t_train=64",
    "sigmoid-rowbias",
    "sigmoid-rowbias-l1",
    "relu-seqlen",
    "relu-rowlen",
    "relu-ln",
    "lssa+rw1",
    "lssa+rw3",
    "lssa+rw15",
    "lssa+rw64",
    "softmax+rw3",
    "softmax+rw15",
    "sigmoid-rowbias-l1+rw3",
    "sigmoid-rowbias-l1+rw15",
    "relu-seqlen+rw3",
];

/// A variant by its stable name.
#[allow(dead_code)] // not every test file uses every helper
pub fn variant(name: &str) -> attn_core::Variant {
    name.parse().unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `x` in f64, for the reference.
#[allow(dead_code)]
pub fn to64(x: &ndarray::Array4<f32>) -> ndarray::Array4<f64> {
    x.mapv(f64::from)
}

/// The largest `|a - b|` over two arrays of one shape.
#[allow(dead_code)]
pub fn max_abs_diff(a: &ndarray::Array4<f32>, b: &ndarray::Array4<f64>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    a.iter().zip(b).fold(0.0, |m, (&x, &y)| m.max((f64::from(x) - y).abs()))
}
