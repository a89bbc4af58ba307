//! The problems the emulator tests run: seeded inputs rounded to a dtype, attn-core's f64
//! reference, and the error bounds of each storage dtype; and the checks of a kernel request
//! against them, run as named jobs (shared by `cuda_emu.rs` and `emu_v10.rs`).
#![allow(dead_code)] // each test binary uses its own part

use attn_core::Variant;
use attn_kernels::cuda::emu::{self, Lab};
use attn_kernels::cuda::{Dtype, Kernel, Options};
use half::{bf16, f16};
use ndarray::Array4;
use rayon::prelude::*;

/// A fixed xorshift stream of standard normals.
pub struct Rng(pub u64);

impl Rng {
    pub fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
    /// Normals times `scale`, rounded to `dt` (so the kernels and the reference see the same inputs).
    pub fn array(&mut self, shape: (usize, usize, usize, usize), scale: f64, dt: Dtype) -> Array4<f32> {
        Array4::from_shape_simple_fn(shape, || round(dt, (self.normal() * scale) as f32))
    }
}

pub fn round(dt: Dtype, x: f32) -> f32 {
    match dt {
        Dtype::F32 => x,
        Dtype::F16 => f16::from_f32(x).to_f32(),
        Dtype::Bf16 => bf16::from_f32(x).to_f32(),
    }
}

/// Unit roundoff of the storage dtype.
pub fn unit(dt: Dtype) -> f64 {
    match dt {
        Dtype::F32 => 2f64.powi(-24),
        Dtype::F16 => 2f64.powi(-11),
        Dtype::Bf16 => 2f64.powi(-8),
    }
}

/// Relative error in the Frobenius norm (infinite if anything is not finite).
pub fn rel_err(x: &Array4<f32>, r: &Array4<f64>) -> f64 {
    if x.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = x.iter().zip(r).map(|(&a, &b)| (a as f64 - b).powi(2)).sum();
    let den: f64 = r.iter().map(|&b| b * b).sum();
    (num / den.max(1e-300)).sqrt()
}

/// One problem: inputs in `dt` and the f64 reference output and gradients.
pub struct Case {
    pub v: Variant,
    pub dt: Dtype,
    pub q: Array4<f32>,
    pub k: Array4<f32>,
    pub vv: Array4<f32>,
    pub g: Array4<f32>,
    pub o: Array4<f64>,
    pub grads: attn_core::Grads<f64>,
}

pub fn case(name: &str, t: usize, d: usize, dt: Dtype, seed: u64) -> Case {
    case_b(name, 1, t, d, dt, seed)
}

/// [`case`] with `b` batch entries (two heads each), so batch and head strides both matter.
pub fn case_b(name: &str, b: usize, t: usize, d: usize, dt: Dtype, seed: u64) -> Case {
    let v: Variant = name.parse().unwrap();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    // Softmax and sigmoid scores are raw dot products: unit inputs keep them in a sane range.
    let scale = if name.starts_with("softmax") || name.contains("sigmoid") { 0.5 } else { 0.8 };
    let shape = (b, 2, t, d);
    let (q, k) = (rng.array(shape, scale, dt), rng.array(shape, scale, dt));
    let (vv, g) = (rng.array(shape, 1.0, dt), rng.array(shape, 1.0, dt));
    case_of(v, dt, q, k, vv, g)
}

/// A case on given inputs (already in `dt`): the references.
pub fn case_of(v: Variant, dt: Dtype, q: Array4<f32>, k: Array4<f32>, vv: Array4<f32>, g: Array4<f32>) -> Case {
    let f = |x: &Array4<f32>| x.mapv(|a| a as f64);
    let o = attn_core::forward(&v, &f(&q), &f(&k), &f(&vv)).unwrap();
    let grads = attn_core::backward(&v, &f(&q), &f(&k), &f(&vv), &f(&g)).unwrap();
    Case { v, dt, q, k, vv, g, o, grads }
}

/// The error bounds of a case (output, gradients): f32 arithmetic in f32 storage; in 16-bit
/// storage the output and the weights before `P V` are rounded (measured on an H100: 0.5-0.7 units
/// of roundoff for the output, up to 1.3 for the gradients of re-weighting), so 1.5 and 3 units.
/// The l1-normalised ReLU family is worse conditioned: a row with one or two positive scores has a
/// tiny Z_i, and its gradient (g.v_j - D'_i) / Z_i cancels against D'_i = <g_i, o_i>, which the
/// backward reads from the rounded output as FlashAttention does: eight random cases measured
/// 0.5-1.2 units, one more 3.6 (v4 and v6 alike, so the storage and not a kernel), hence 6 there.
pub fn bounds(c: &Case) -> (f64, f64) {
    let name = c.v.to_string();
    let ill = name.starts_with("relu") && name.contains("-l1");
    match c.dt {
        Dtype::F32 => (1e-4, 1e-4),
        dt => (1.5 * unit(dt), if ill { 6.0 } else { 3.0 } * unit(dt)),
    }
}

pub fn check_forward(c: &Case, kernel: Kernel, reverse: bool) -> Result<(), String> {
    let (opts, lab) = (Options { dtype: c.dt, kernel }, Lab { reverse, ..Lab::default() });
    let o = emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &lab).map_err(|e| e.to_string())?;
    let e = rel_err(&o, &c.o);
    if e <= bounds(c).0 { Ok(()) } else { Err(format!("output error {e:.2e} > {:.2e}", bounds(c).0)) }
}

pub fn check_backward(c: &Case, kernel: Kernel, reverse: bool) -> Result<(), String> {
    let (opts, lab) = (Options { dtype: c.dt, kernel }, Lab { reverse, ..Lab::default() });
    let gr = emu::backward_lab(&c.v, &c.q, &c.k, &c.vv, &c.g, &opts, &lab).map_err(|e| e.to_string())?;
    let errs = [
        ("dq", rel_err(&gr.dq, &c.grads.dq)),
        ("dk", rel_err(&gr.dk, &c.grads.dk)),
        ("dv", rel_err(&gr.dv, &c.grads.dv)),
    ];
    let bad: Vec<String> =
        errs.iter().filter(|(_, e)| *e > bounds(c).1).map(|(n, e)| format!("{n} error {e:.2e}")).collect();
    if bad.is_empty() { Ok(()) } else { Err(format!("{} > {:.2e}", bad.join(", "), bounds(c).1)) }
}

/// A named check.
pub type Job = (String, Box<dyn Fn() -> Result<(), String> + Send + Sync>);

/// Runs every job (in parallel; the emulator serialises launches of one library) and reports all
/// failures at once.
pub fn run_all(jobs: Vec<Job>) {
    let failures: Vec<String> =
        jobs.par_iter().filter_map(|(name, job)| job().err().map(|e| format!("{name}: {e}"))).collect();
    assert!(failures.is_empty(), "{} of {} failed:\n{}", failures.len(), jobs.len(), failures.join("\n"));
}

pub fn kernel_jobs(name: &str, t: usize, d: usize, dt: Dtype, fwd: &[Kernel], bwd: &[Kernel]) -> Vec<Job> {
    kernel_jobs_b(name, 1, t, d, dt, fwd, bwd, &[false])
}

/// Jobs for `b` batch entries, each kernel once per thread order in `orders` (`true`: reversed).
#[allow(clippy::too_many_arguments)]
pub fn kernel_jobs_b(
    name: &str,
    b: usize,
    t: usize,
    d: usize,
    dt: Dtype,
    fwd: &[Kernel],
    bwd: &[Kernel],
    orders: &[bool],
) -> Vec<Job> {
    let c = std::sync::Arc::new(case_b(name, b, t, d, dt, (b * 100_000 + t * 1000 + d) as u64));
    let mut jobs: Vec<Job> = Vec::new();
    for &rev in orders {
        let order = if rev { ", threads reversed" } else { "" };
        for &k in fwd {
            let c = c.clone();
            let what = format!("{name} B={b} T={t} d={d} {dt:?} forward {k:?}{order}");
            jobs.push((what, Box::new(move || check_forward(&c, k, rev))));
        }
        for &k in bwd {
            let c = c.clone();
            let what = format!("{name} B={b} T={t} d={d} {dt:?} backward {k:?}{order}");
            jobs.push((what, Box::new(move || check_backward(&c, k, rev))));
        }
    }
    jobs
}

pub fn replace_first(from: &'static str, to: &'static str) -> impl Fn(String) -> String {
    move |s: String| {
        assert!(s.contains(from), "the source no longer contains {from:?}");
        s.replacen(from, to, 1)
    }
}
