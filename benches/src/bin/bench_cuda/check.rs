//! `check`: every fused variant and the autograd bridge on the GPU against the attn-core f64 reference,
//! next to the plain tch-ops implementation's error in the same dtype.

use anyhow::Result;
use attn_core::Variant;
use attn_core::fixtures::Rng;
use attn_kernels::cuda::{self, Dtype, Kernel, Version};
use ndarray::Array4;
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use crate::cli::Args;
use crate::transcript::say;

fn trace(on: bool, what: std::fmt::Arguments<'_>) {
    if on {
        eprintln!(
            "[{:?}] {what}",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Random inputs (attn-core's seeded generator: reproducible).

/// Standard normals times `scale`.
fn normals(rng: &mut Rng, shape: (usize, usize, usize, usize), scale: f64) -> Array4<f32> {
    Array4::from_shape_simple_fn(shape, || (rng.normal() * scale) as f32)
}

fn round_to(x: &Array4<f32>, dt: Dtype) -> Array4<f32> {
    x.mapv(|v| match dt {
        Dtype::F32 => v,
        Dtype::F16 => half::f16::from_f32(v).to_f32(),
        Dtype::Bf16 => half::bf16::from_f32(v).to_f32(),
    })
}

fn rel_err(x: &Array4<f32>, r: &Array4<f64>) -> f64 {
    let num: f64 = x.iter().zip(r).map(|(&a, &b)| (a as f64 - b).powi(2)).sum();
    let den: f64 = r.iter().map(|&b| b * b).sum();
    if x.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    (num / den.max(1e-300)).sqrt()
}

fn kind_of(dt: Dtype) -> Kind {
    match dt {
        Dtype::F32 => Kind::Float,
        Dtype::F16 => Kind::Half,
        Dtype::Bf16 => Kind::BFloat16,
    }
}

fn to_tch(x: &Array4<f32>, dt: Dtype) -> Tensor {
    let sh: Vec<i64> = x.shape().iter().map(|&s| s as i64).collect();
    Tensor::from_slice(x.as_standard_layout().as_slice().unwrap())
        .reshape(&sh)
        .to_device(Device::Cuda(0))
        .to_kind(kind_of(dt))
}

fn from_tch(x: &Tensor) -> Array4<f32> {
    let x = x.to_kind(Kind::Float).to_device(Device::Cpu).contiguous();
    let sh: Vec<usize> = x.size().iter().map(|&s| s as usize).collect();
    let v: Vec<f32> = Vec::<f32>::try_from(x.flatten(0, -1)).unwrap();
    Array4::from_shape_vec((sh[0], sh[1], sh[2], sh[3]), v).unwrap()
}

/// The plain tch-ops implementation (materialised T x T) in `dt` on the GPU: output and gradients.
fn naive(
    variant: &Variant,
    q: &Array4<f32>,
    k: &Array4<f32>,
    v: &Array4<f32>,
    g: &Array4<f32>,
    dt: Dtype,
) -> Result<[Array4<f32>; 4]> {
    let (q, k, v, g) = (
        to_tch(q, dt).set_requires_grad(true),
        to_tch(k, dt).set_requires_grad(true),
        to_tch(v, dt).set_requires_grad(true),
        to_tch(g, dt),
    );
    let o = gpt_model::attention::torch_ops::attention(&q, &k, &v, &variant.plan()?, 0)?;
    (&o * &g).sum(Kind::Float).backward();
    Ok([from_tch(&o), from_tch(&q.grad()), from_tch(&k.grad()), from_tch(&v.grad())])
}

/// The kernel requests `check` runs on a case of `head_dim` and `dtype`: every lab pair (`Auto` runs
/// one of them) where the tensor-core versions apply, else v1; with `--kernels`, those of the asked
/// requests that run here (off the tensor cores, only `auto` and `v1`), possibly none.
pub(crate) fn requests(args: &Args, head_dim: usize, dtype: Dtype) -> Vec<Kernel> {
    let tc = cuda::has_tensor_core_forward(head_dim, dtype);
    if args.kernels.is_empty() {
        return if tc { Kernel::ALL[1..].to_vec() } else { vec![Kernel::Lab(Version::V1)] };
    }
    args.kernels.iter().copied().filter(|k| tc || matches!(k, Kernel::Auto | Kernel::Lab(Version::V1))).collect()
}

/// Compiles the modules `jobs` will load (NVRTC, then the driver's JIT) on `threads` threads at once,
/// instead of one at a time at first use: on a 16-core GPU machine the lab's modules (a few seconds
/// each) otherwise take most of a check's time. A module that fails here fails again, with its
/// reason, in its case.
fn compile_ahead(jobs: &[(Variant, usize, Dtype, Kernel)], threads: usize) {
    let mut distinct: Vec<(String, usize, Dtype, cuda::Generation)> = Vec::new();
    let mut todo = Vec::new();
    for (v, d, dt, k) in jobs {
        let key = (v.to_string(), *d, *dt, k.generation());
        if !distinct.contains(&key) {
            distinct.push(key);
            todo.push((v, *d, *dt, *k));
        }
    }
    let threads = threads.min(todo.len());
    if threads <= 1 {
        return;
    }
    let started = std::time::Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some((v, d, dt, k)) = todo.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                    // `versions` loads the request's module into the device's cache.
                    if cuda::versions(v, *d, *dt, *k).is_err() {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    say!(
        "compiled {} modules ahead on {threads} threads in {:.1} s ({} failed; their cases say why)",
        todo.len(),
        started.elapsed().as_secs_f64(),
        failed.into_inner()
    );
}

/// One case: the variant, `T`, `d` and the dtype.
type Case = (Variant, usize, usize, Dtype);

/// Every case against the reference; `progress` gets the rows so far after each case (the caller
/// saves them, so a run stopped by its time limit keeps what it checked).
pub(crate) fn check(args: &Args, rows: &mut Vec<Value>, progress: &mut dyn FnMut(&[Value])) -> Result<bool> {
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let all = cases(args)?;
    let ahead: Vec<(Variant, usize, Dtype, Kernel)> = all
        .iter()
        .flat_map(|(v, _, d, dt)| requests(args, *d, *dt).into_iter().map(move |k| (v.clone(), *d, *dt, k)))
        .collect();
    if !args.kernels.is_empty() {
        let names: Vec<&str> = args.kernels.iter().map(|k| k.name()).collect();
        say!("kernel requests: {} ({} cases)", names.join(", "), all.len());
    }
    let mut ok = layout_probe("wgmma", cuda::wgmma_probe(), &cuda::WGMMA_PROBE_MODES, rows);
    ok &= layout_probe("tma", cuda::tma_probe(), &cuda::TMA_PROBE_MODES, rows);
    progress(rows);
    compile_ahead(&ahead, args.compile_threads);
    say_header();
    for case in all {
        ok &= check_case(args, &mut rng, &case, rows)?;
        progress(rows);
    }
    ok &= model_check(rows, &args.kernels)?;
    progress(rows);
    Ok(ok)
}

/// The cases `check` runs: every fused stage-1 activation at T = 77, d = 64 in f32 and bf16, then
/// LSSA, LSSAR, softmax and their kin at six shapes in every dtype; those of `--only-t` (when given)
/// that some kernel request runs.
pub(crate) fn cases(args: &Args) -> Result<Vec<Case>> {
    let mut all: Vec<Case> = Vec::new();
    for name in attn_core::variant::STAGE1_NAMES {
        // sigmoid-bias needs its training length.
        let v: Variant =
            if name.starts_with("sigmoid-bias") { format!("{name}:t_train=64").parse()? } else { name.parse()? };
        if cuda::Config::new(&v, 64).is_ok() {
            for dt in [Dtype::F32, Dtype::Bf16] {
                all.push((v.clone(), 77, 64, dt));
            }
        }
    }
    for name in
        ["lssa", "lssa+rw1", "lssa+rw3", "lssa+rw15", "lssa+rw64", "softmax", "softmax+rw15", "sigmoid-rowbias-l1+rw15"]
    {
        let v: Variant = name.parse()?;
        for dt in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
            for (t, d) in [(1, 64), (5, 64), (130, 64), (300, 64), (200, 128), (131, 48)] {
                all.push((v.clone(), t, d, dt));
            }
        }
    }
    all.retain(|(_, t, d, dt)| {
        (args.only_t.is_empty() || args.only_t.contains(t)) && !requests(args, *d, *dt).is_empty()
    });
    Ok(all)
}

/// The layouts a lab kernel assumes, checked by its probe before the kernels that use them: the
/// `wgmma` operand layouts of v8 and v9, and v10's TMA copies with their swizzle and the swizzled
/// descriptors that read them (`cuda::wgmma_probe`, `cuda::tma_probe`, one result per mode of
/// `modes`). Printed, and a row `<name>_probe` in `rows` when the probe ran; whether every mode came
/// out as assumed (true when the probe could not run).
fn layout_probe(
    name: &str,
    result: attn_kernels::Result<Vec<f64>>,
    modes: &[(&str, bool)],
    rows: &mut Vec<Value>,
) -> bool {
    let mut ok = true;
    match result {
        Ok(errs) => {
            say!("{name} layout probe (error relative to the largest entry; assumed layouts must match):");
            let mut probe = Vec::new();
            for ((what, assumed), e) in modes.iter().zip(errs) {
                let pass = if *assumed { e < 1e-5 } else { e > 0.1 };
                ok &= pass;
                say!("  {what:<56} {e:>9.2e}  {}", if pass { "ok" } else { "FAIL" });
                probe.push(json!({"mode": what, "assumed": assumed, "rel_err": e, "pass": pass}));
            }
            rows.push(json!({format!("{name}_probe"): probe}));
        }
        Err(e) => say!("{name} layout probe not run: {e}"),
    }
    ok
}

/// The header of the table [`check_case`] fills.
fn say_header() {
    say!(
        "{:<26} {:>4} {:>4} {:>5} {:>6} | {:>9} {:>9} {:>9} {:>9} | {:>9} {:>9} | verdict",
        "variant",
        "T",
        "d",
        "dtype",
        "fwd",
        "o",
        "dq",
        "dk",
        "dv",
        "naive o",
        "naive dq"
    );
}

/// One case against the f64 reference: inputs drawn from `rng` and rounded to the dtype, then one
/// line and one row of `rows` per kernel pair its requests run; whether every pair passed.
fn check_case(args: &Args, rng: &mut Rng, (v, t, d, dt): &Case, rows: &mut Vec<Value>) -> Result<bool> {
    let (v, t, d, dt) = (v, *t, *d, *dt);
    trace(args.trace, format_args!("{v} T={t} d={d} {dt:?}: inputs and reference"));
    let shape = (2, 3, t, d);
    let scale = if v.to_string().starts_with("softmax") || v.to_string().contains("sigmoid") { 1.0 } else { 0.7 };
    let (q, k, vv, g) =
        (normals(rng, shape, scale), normals(rng, shape, scale), normals(rng, shape, 1.0), normals(rng, shape, 1.0));
    let (q, k, vv, g) = (round_to(&q, dt), round_to(&k, dt), round_to(&vv, dt), round_to(&g, dt));
    let f64s = |x: &Array4<f32>| x.mapv(|a| a as f64);
    let (q64, k64, v64, g64) = (f64s(&q), f64s(&k), f64s(&vv), f64s(&g));
    let o_ref = attn_core::forward(v, &q64, &k64, &v64)?;
    let gr = attn_core::backward(v, &q64, &k64, &v64, &g64)?;
    // The kernel requests; `cuda::versions` says what each runs on this device and at this d.
    let kernels = requests(args, d, dt);
    trace(args.trace, format_args!("naive"));
    let nv = naive(v, &q, &k, &vv, &g, dt)?;
    let n_o = rel_err(&nv[0], &o_ref);
    let n_dq = rel_err(&nv[1], &gr.dq);
    let mut ok = true;
    let mut ran = Vec::new();
    for &kern in &kernels {
        // Labelled by what ran on this device; a request that runs an already checked pair is skipped.
        let (f, b) = cuda::versions(v, d, dt, kern)?;
        if ran.contains(&(f, b)) {
            continue;
        }
        ran.push((f, b));
        let opts = cuda::Options { dtype: dt, kernel: kern };
        trace(args.trace, format_args!("forward {kern:?}"));
        let o = cuda::forward_with(v, &q, &k, &vv, &opts)?;
        trace(args.trace, format_args!("backward"));
        let grads = cuda::backward_with(v, &q, &k, &vv, &g, &opts)?;
        let e =
            [rel_err(&o, &o_ref), rel_err(&grads.dq, &gr.dq), rel_err(&grads.dk, &gr.dk), rel_err(&grads.dv, &gr.dv)];
        // f32: far under 1e-3. f16/bf16: at most about 2x the naive error in the same dtype (plus a floor
        // for rows where the naive error is tiny by luck).
        let bound = |naive: f64| if dt == Dtype::F32 { 2e-4 } else { (2.5 * naive).max(4e-3) };
        let pass = e[0] <= bound(n_o) && e[1..].iter().all(|&x| x <= bound(n_dq.max(n_o)));
        ok &= pass;
        say!(
            "{:<26} {:>4} {:>4} {:>5} {:>6} | {:>9.2e} {:>9.2e} {:>9.2e} {:>9.2e} | {:>9.2e} {:>9.2e} | {}",
            v.to_string(),
            t,
            d,
            format!("{dt:?}"),
            format!("v{f}+v{b}"),
            e[0],
            e[1],
            e[2],
            e[3],
            n_o,
            n_dq,
            if pass { "ok" } else { "FAIL" }
        );
        rows.push(json!({"variant": v.to_string(), "T": t, "d": d, "dtype": format!("{dt:?}"), "forward_kernel": format!("{kern:?}"), "versions": [f, b],
            "rel_err": {"o": e[0], "dq": e[1], "dk": e[2], "dv": e[3]}, "naive_rel_err": {"o": n_o, "dq": n_dq}, "pass": pass}));
    }
    Ok(ok)
}

/// The autograd bridge on the GPU: a small GPT's loss and parameter gradients with `fused` attention
/// against the `reference` (tch ops) attention, in f32 (tight; the f32 kernels are v1's whatever the
/// request, run as `Auto`) and bf16 (each against f32), the bf16 fused model once per request of
/// `kernels` (none: `LSSA_CUDA_KERNEL`'s, else `Auto`).
fn model_check(rows: &mut Vec<Value>, kernels: &[Kernel]) -> Result<bool> {
    use gpt_model::{AttnImpl, ForwardOptions, Gpt, ModelConfig};
    say!("\nGPT (2 layers, 2 heads of 64, T = 200) on the GPU: fused vs reference attention through autograd");
    let kernels = if kernels.is_empty() { vec![Kernel::from_env()?] } else { kernels.to_vec() };
    let mut ok = true;
    for variant in ["lssa", "lssa+rw15", "softmax"] {
        let run = |imp: AttnImpl, kind: Kind, kernel: Kernel| -> Result<(f64, Vec<Tensor>)> {
            tch::manual_seed(7);
            let mut cfg = ModelConfig::gpt2_124m();
            (cfg.n_layer, cfg.n_head, cfg.d_model, cfg.vocab_size, cfg.context_len) = (2, 2, 128, 512, 200);
            cfg.attention = variant.parse()?;
            cfg.attn_impl = imp;
            let mut vs = tch::nn::VarStore::new(Device::Cuda(0));
            let mut gpt = Gpt::new(&vs.root(), &cfg)?;
            gpt.set_cuda_kernel(kernel);
            if kind == Kind::BFloat16 {
                vs.bfloat16();
            }
            tch::manual_seed(11);
            let idx = Tensor::randint(512, [3, 200], (Kind::Int64, Device::Cuda(0)));
            let loss = gpt.loss(&idx.narrow(1, 0, 199), &idx.narrow(1, 1, 199), &ForwardOptions::default())?;
            loss.backward();
            let mut grads: Vec<(String, Tensor)> =
                vs.variables().into_iter().map(|(n, t)| (n, t.grad().to_kind(Kind::Float))).collect();
            grads.sort_by(|a, b| a.0.cmp(&b.0));
            Ok((loss.double_value(&[]), grads.into_iter().map(|(_, g)| g).collect()))
        };
        let rel = |a: &[Tensor], b: &[Tensor]| -> f64 {
            let (mut num, mut den) = (0.0, 0.0);
            for (x, y) in a.iter().zip(b) {
                num += (x - y).square().sum(Kind::Double).double_value(&[]);
                den += y.square().sum(Kind::Double).double_value(&[]);
            }
            (num / den.max(1e-300)).sqrt()
        };
        let (l_ref, g_ref) = run(AttnImpl::Reference, Kind::Float, Kernel::Auto)?;
        let (l_fus, g_fus) = run(AttnImpl::Fused, Kind::Float, Kernel::Auto)?;
        let (l_ref16, g_ref16) = run(AttnImpl::Reference, Kind::BFloat16, Kernel::Auto)?;
        let e32 = ((l_fus - l_ref).abs(), rel(&g_fus, &g_ref));
        let e16r = rel(&g_ref16, &g_ref);
        for &kernel in &kernels {
            let (l_fus16, g_fus16) = run(AttnImpl::Fused, Kind::BFloat16, kernel)?;
            let e16f = rel(&g_fus16, &g_ref);
            let pass = e32.0 < 1e-4 && e32.1 < 1e-3 && e16f <= 2.0 * e16r + 1e-3;
            ok &= pass;
            say!(
                "  {variant:<10} {:>4} | f32: |loss diff| {:.1e}, grad rel {:.1e} | bf16 grads vs f32 reference: fused {:.1e}, reference {:.1e} | loss f32 {:.4} bf16 fused {:.4} ref {:.4} | {}",
                kernel.name(),
                e32.0,
                e32.1,
                e16f,
                e16r,
                l_ref,
                l_fus16,
                l_ref16,
                if pass { "ok" } else { "FAIL" }
            );
            rows.push(json!({"model_check": variant, "bf16_kernel": kernel.name(), "f32_loss_diff": e32.0, "f32_grad_rel": e32.1, "bf16_fused_grad_rel": e16f, "bf16_reference_grad_rel": e16r, "pass": pass}));
        }
    }
    let counts = gpt_model::attention::path_counts();
    say!("  attention calls: {counts:?}");
    Ok(ok)
}
