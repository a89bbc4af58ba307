//! One benchmark workload (inputs of one shape, in every form each implementation wants) and the single
//! call that runs an implementation on it once.

use std::fmt;
use std::hint::black_box;
use std::str::FromStr;
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, bail};
use attn_core::Variant;
use gpt_model::attention::torch_ops;
use ndarray::{Array4, ArrayView4};
use serde::Serialize;
use tch::{Kind, Tensor};

/// What is being timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Implementation {
    /// The fused CPU kernels, `attn_kernels::cpu::{forward, backward}` (f32, rayon).
    #[serde(rename = "fused")]
    Fused,
    /// libtorch's `scaled_dot_product_attention`, causal softmax (f32; its CPU flash path).
    #[serde(rename = "sdpa")]
    Sdpa,
    /// LSSA and LSSAR written for PyTorch's FlexAttention and compiled (`benches/flex_lssa.py`, run in
    /// a child process by [`crate::flex`]; lssa and lssa+rw15 only).
    #[serde(rename = "flex-attention")]
    Flex,
    /// The materialised tch maths of `gpt_model::attention::torch_ops` with autograd (f32).
    #[serde(rename = "torch-ops")]
    TorchOps,
    /// The `attn-core` f64 reference (`attn_core::{forward, backward}`).
    #[serde(rename = "attn-core-f64")]
    Reference,
}

impl Implementation {
    /// Every implementation, in table order.
    pub const ALL: [Implementation; 5] = [Self::Fused, Self::Sdpa, Self::Flex, Self::TorchOps, Self::Reference];

    /// The stable name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fused => "fused",
            Self::Sdpa => "sdpa",
            Self::Flex => "flex-attention",
            Self::TorchOps => "torch-ops",
            Self::Reference => "attn-core-f64",
        }
    }
}

impl fmt::Display for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Forward only, or forward then backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Pass {
    /// The forward pass (no autograd recording for libtorch).
    #[serde(rename = "fwd")]
    Forward,
    /// Forward, then the backward of `L = sum(o * g)` for a fixed random `g`.
    #[serde(rename = "fwd+bwd")]
    ForwardBackward,
}

impl Pass {
    /// Both passes, in table order.
    pub const ALL: [Pass; 2] = [Self::Forward, Self::ForwardBackward];

    /// The stable name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Forward => "fwd",
            Self::ForwardBackward => "fwd+bwd",
        }
    }
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An attention variant by its stable name, parsed once for `attn-core`/`attn-kernels` and mapped to
/// the `torch_ops` function that computes the same maths.
#[derive(Clone, Debug)]
pub struct VariantSpec {
    /// The stable name, e.g. `lssa+rw15`.
    pub name: String,
    /// The parsed variant for `attn-core` and `attn-kernels`.
    pub variant: Variant,
    /// The stage-1 family for `torch_ops` (`lssa` or `softmax`), `None` when it has no torch-ops form.
    torch_base: Option<TorchBase>,
    /// The re-weighting power, if any.
    reweight_p: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TorchBase {
    Lssa,
    Softmax,
}

impl FromStr for VariantSpec {
    type Err = anyhow::Error;

    fn from_str(name: &str) -> Result<Self> {
        let variant: Variant = name.parse().map_err(|e| anyhow!("attn-core does not know variant `{name}`: {e}"))?;
        let (base, reweight_p) = match name.split_once("+rw") {
            Some((base, p)) => {
                (base, Some(p.parse::<u32>().with_context(|| format!("re-weighting power in `{name}`"))?))
            }
            None => (name, None),
        };
        let torch_base = match base {
            "lssa" => Some(TorchBase::Lssa),
            "softmax" => Some(TorchBase::Softmax),
            _ => None,
        };
        Ok(Self { name: name.to_string(), variant, torch_base, reweight_p })
    }
}

impl VariantSpec {
    /// Whether `reweight_p` is set, i.e. the variant has the re-weighting stage.
    pub fn reweighted(&self) -> bool {
        self.reweight_p.is_some()
    }

    /// Whether libtorch SDPA computes this variant (only plain causal softmax).
    pub fn has_sdpa(&self) -> bool {
        self.torch_base == Some(TorchBase::Softmax) && self.reweight_p.is_none()
    }

    /// Whether `torch_ops` implements this variant.
    pub fn has_torch_ops(&self) -> bool {
        self.torch_base.is_some()
    }

    /// The `torch_ops` forward for this variant on `(B, H, T, d)` tensors.
    pub fn torch_ops_forward(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        match self.torch_base {
            Some(TorchBase::Lssa) => Ok(torch_ops::lssa(q, k, v, self.reweight_p)),
            Some(TorchBase::Softmax) => Ok(torch_ops::softmax(q, k, v, self.reweight_p)),
            None => bail!("torch_ops has no implementation of `{}`", self.name),
        }
    }
}

/// Deterministic pseudo-normal numbers (splitmix64; sum of four uniforms, rescaled to mean 0 and
/// variance 1): fixed inputs without a global RNG, identical in the parent and in child processes.
pub fn pseudo_normal(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    let mut uniform = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u32 << 24) as f32
    };
    (0..n).map(|_| ((uniform() + uniform() + uniform() + uniform()) - 2.0) * 3f32.sqrt()).collect()
}

/// A `(B, H, T, d)` array of [`pseudo_normal`] numbers.
pub fn random_array(shape: (usize, usize, usize, usize), seed: u64) -> Array4<f32> {
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    Array4::from_shape_vec(shape, pseudo_normal(n, seed)).expect("length matches the shape")
}

/// A contiguous f32 tensor with the same contents and shape as `a`.
pub fn to_tensor(a: &Array4<f32>) -> Tensor {
    let shape: Vec<i64> = a.shape().iter().map(|&s| s as i64).collect();
    match a.as_slice() {
        Some(data) => Tensor::from_slice(data).reshape(shape),
        None => Tensor::from_slice(&a.iter().copied().collect::<Vec<_>>()).reshape(shape),
    }
}

/// A view of a contiguous f32 tensor's memory, `shape` its shape.
fn tensor_view(t: &Tensor, shape: (usize, usize, usize, usize)) -> ArrayView4<'_, f32> {
    assert!(t.kind() == Kind::Float && t.is_contiguous() && t.numel() == shape.0 * shape.1 * shape.2 * shape.3);
    // SAFETY: `t` holds that many contiguous f32s (checked above) and outlives the view, which
    // borrows it; nothing writes to it while the view lives (every run only reads its inputs).
    unsafe { ArrayView4::from_shape_ptr(shape, t.data_ptr() as *const f32) }
}

/// Causal attention inputs of one shape, `(B, H, T, d)`, f32, in the forms each implementation takes.
pub struct Workload {
    /// Batch size.
    pub b: usize,
    /// Heads.
    pub h: usize,
    /// Sequence length.
    pub t: usize,
    /// Head dimension.
    pub d: usize,
    q: Array4<f32>,
    k: Array4<f32>,
    v: Array4<f32>,
    /// The upstream gradient `dL/do` of the backward pass.
    g: Array4<f32>,
    tensors: [Tensor; 4],
    f64_copies: OnceLock<[Array4<f64>; 4]>,
}

impl Workload {
    /// Fixed pseudo-random inputs of shape `(b, h, t, d)` (unit-variance entries).
    pub fn new(b: usize, h: usize, t: usize, d: usize, seed: u64) -> Self {
        let shape = (b, h, t, d);
        let [q, k, v, g] = [0, 1, 2, 3].map(|i| random_array(shape, 4 * seed + i));
        let tensors = [&q, &k, &v, &g].map(to_tensor);
        Self { b, h, t, d, q, k, v, g, tensors, f64_copies: OnceLock::new() }
    }

    /// Bytes of one `(B, H, T, d)` f32 array.
    pub fn array_bytes(&self) -> usize {
        self.b * self.h * self.t * self.d * 4
    }

    /// Runs `imp` once on these inputs for `variant` and `pass`. Fused calls run in `pool`; libtorch
    /// uses its own intra-op threads (set once by the caller with `tch::set_num_threads`).
    pub fn run(&self, imp: Implementation, variant: &VariantSpec, pass: Pass, pool: &rayon::ThreadPool) -> Result<()> {
        match imp {
            Implementation::Fused => {
                // The fused kernels read the tensors SDPA reads, in place: the same bytes at the same
                // addresses, 64-byte aligned by libtorch's allocator as a PyTorch user's tensors are
                // (an `Array4`'s buffer from malloc sits 16 bytes off a cache line, so every 64-byte
                // load of a value row straddles two lines: the re-weighted forward took 1.07x the
                // time there on an Intel Xeon). `Tensor` is not `Sync`, so only the views cross
                // into the pool.
                let views = self.tensors.each_ref().map(|t| tensor_view(t, self.q.dim()));
                pool.install(|| run_fused(variant, pass, views))
            }
            Implementation::Sdpa => self.run_sdpa(variant, pass),
            Implementation::TorchOps => self.run_torch_ops(variant, pass),
            Implementation::Reference => self.run_reference(variant, pass),
            Implementation::Flex => {
                bail!("FlexAttention runs in a child process (lssa_benches::flex), not in a Workload")
            }
        }
    }

    fn run_sdpa(&self, variant: &VariantSpec, pass: Pass) -> Result<()> {
        if !variant.has_sdpa() {
            bail!("SDPA computes only causal softmax, not `{}`", variant.name);
        }
        self.run_tch(pass, |q, k, v| {
            // Causal, no dropout, the default 1/sqrt(d) scale.
            Ok(Tensor::scaled_dot_product_attention(q, k, v, None::<Tensor>, 0.0, true, None, false))
        })
    }

    fn run_torch_ops(&self, variant: &VariantSpec, pass: Pass) -> Result<()> {
        self.run_tch(pass, |q, k, v| variant.torch_ops_forward(q, k, v))
    }

    /// Forward without autograd, or forward with autograd and the backward of `sum(o * g)`.
    fn run_tch(&self, pass: Pass, forward: impl Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>) -> Result<()> {
        let [q, k, v, g] = &self.tensors;
        match pass {
            Pass::Forward => {
                let out = tch::no_grad(|| forward(q, k, v))?;
                black_box(&out);
            }
            Pass::ForwardBackward => {
                let (q, k, v) = (q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true));
                let out = forward(&q, &k, &v)?;
                let loss = (out * g).sum(Kind::Float); // dL/do = g; O(T d), negligible
                let grads = Tensor::run_backward(&[loss], &[&q, &k, &v], false, false);
                black_box(&grads);
            }
        }
        Ok(())
    }

    fn run_reference(&self, variant: &VariantSpec, pass: Pass) -> Result<()> {
        let [q, k, v, g] =
            self.f64_copies.get_or_init(|| [&self.q, &self.k, &self.v, &self.g].map(|a| a.mapv(f64::from)));
        let out = attn_core::forward(&variant.variant, q.view(), k.view(), v.view())
            .map_err(|e| anyhow!("attn-core forward `{}`: {e}", variant.name))?;
        black_box(&out);
        if pass == Pass::ForwardBackward {
            let grads = attn_core::backward(&variant.variant, q.view(), k.view(), v.view(), g.view())
                .map_err(|e| anyhow!("attn-core backward `{}`: {e}", variant.name))?;
            black_box((&grads.dq, &grads.dk, &grads.dv));
        }
        Ok(())
    }
}

/// One fused forward, or forward+backward, on the caller's rayon pool.
///
/// `attn_kernels::cpu::backward` runs the forward itself (for its per-row statistics; documented on
/// that function), so forward+backward is one `backward` call: calling `forward` first would count the
/// forward twice, which SDPA (it saves its statistics) does not pay. When the kernels grow a
/// forward-with-statistics / backward-from-statistics pair, time that pair here instead.
fn run_fused(variant: &VariantSpec, pass: Pass, [q, k, v, g]: [ArrayView4<'_, f32>; 4]) -> Result<()> {
    match pass {
        Pass::Forward => {
            let out = attn_kernels::cpu::forward(&variant.variant, q, k, v)
                .map_err(|e| anyhow!("fused forward `{}`: {e}", variant.name))?;
            black_box(&out);
        }
        Pass::ForwardBackward => {
            let grads = attn_kernels::cpu::backward(&variant.variant, q, k, v, g)
                .map_err(|e| anyhow!("fused backward `{}`: {e}", variant.name))?;
            black_box((&grads.dq, &grads.dk, &grads.dv));
        }
    }
    Ok(())
}
