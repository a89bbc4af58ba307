//! The CUDA kernel lab and benchmark (`cargo xtask bench cuda`): runs on a GPU machine from a binary
//! built anywhere (libtorch and NVRTC are found at run time).
//!
//! - `check`: every fused variant, forward and backward, against the attn-core f64 reference on the
//!   same (dtype-rounded) inputs, at awkward lengths, head dimensions 64, 128 and 48, f32 / f16 /
//!   bf16, `p` in {1, 3, 15, 64}; next to the error of the plain tch-ops implementation in the same
//!   dtype on the same GPU. Fails (exit 1) when an error exceeds its bound.
//! - `speed`: TFLOP/s (FlashAttention's convention: `4 B H T^2 d`, halved for causal; backward 2.5x
//!   the forward) for `T` in 1K..32K, `B T = 16K`, `H = 12`, bf16, causal: our LSSA and LSSAR
//!   (`p = 15`), libtorch SDPA (softmax), and LSSA / LSSAR as tch ops; forward and forward+backward;
//!   plus device memory at 16K and 64K.
//! - `model`: a GPT-2 124M forward+backward step, fused vs reference attention, tokens/s.
//!
//! Results: a table on stdout, JSON to `--out` (default `docs/bench/cuda.json`).

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use attn_core::Variant;
use attn_core::fixtures::Rng;
use attn_kernels::cpu::{Params, RawTensor, STATS_PER_ROW};
use attn_kernels::cuda::{self, Dtype, Kernel};
use clap::Parser;
use lssa_benches::flex;
use ndarray::Array4;
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

#[derive(Parser, Debug)]
#[command(about = "CUDA kernel lab: correctness against attn-core, speed against libtorch SDPA")]
struct Args {
    /// What to run: check, speed, model, or all.
    #[arg(default_value = "all")]
    what: String,
    /// JSON output.
    #[arg(long, default_value = "docs/bench/cuda.json")]
    out: std::path::PathBuf,
    /// Sequence lengths for `speed`.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1024, 2048, 4096, 8192, 16384, 32768])]
    lengths: Vec<i64>,
    /// Head dimensions for `speed`.
    #[arg(long, value_delimiter = ',', default_values_t = vec![64, 128])]
    head_dims: Vec<i64>,
    /// Timed repetitions (median reported).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// `check`: print each step to stderr as it starts (to find a hang).
    #[arg(long)]
    trace: bool,
    /// `check`: only cases of these lengths (default: all).
    #[arg(long, value_delimiter = ',')]
    only_t: Vec<usize>,
    /// `speed`: also time LSSA and LSSAR written for PyTorch's FlexAttention (`benches/flex_lssa.py`,
    /// compiled, in a child process with the Python of this libtorch) at the same shapes.
    #[arg(long)]
    flex: bool,
}

fn trace(on: bool, what: std::fmt::Arguments<'_>) {
    if on {
        eprintln!(
            "[{:?}] {what}",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
        );
    }
}

/// Everything printed, for the Markdown copy of the results.
static LOG: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// `println!` that also keeps the line for the Markdown report.
macro_rules! say {
    ($($t:tt)*) => {{
        let line = format!($($t)*);
        println!("{line}");
        let mut log = LOG.lock().unwrap_or_else(|e| e.into_inner());
        log.push_str(&line);
        log.push('\n');
    }};
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
    let o = gpt_model::attention::torch_ops::attention(&q, &k, &v, variant, 0)?;
    (&o * &g).sum(Kind::Float).backward();
    Ok([from_tch(&o), from_tch(&q.grad()), from_tch(&k.grad()), from_tch(&v.grad())])
}

fn check(args: &Args, rows: &mut Vec<Value>) -> Result<bool> {
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    let mut all: Vec<(Variant, usize, usize, Dtype)> = Vec::new();
    for name in attn_core::STAGE1_NAMES {
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
    let mut ok = true;
    // The warpgroup operand layouts v8 and v9 assume, one product each, before the kernels that use them.
    match cuda::wgmma_probe() {
        Ok(errs) => {
            say!("wgmma layout probe (error relative to the largest entry; assumed layouts must match):");
            let mut probe = Vec::new();
            for ((what, assumed), e) in cuda::WGMMA_PROBE_MODES.iter().zip(errs) {
                let pass = if *assumed { e < 1e-5 } else { e > 0.1 };
                ok &= pass;
                say!("  {what:<46} {e:>9.2e}  {}", if pass { "ok" } else { "FAIL" });
                probe.push(json!({"mode": what, "assumed": assumed, "rel_err": e, "pass": pass}));
            }
            rows.push(json!({"wgmma_probe": probe}));
        }
        Err(e) => say!("wgmma layout probe not run: {e}"),
    }
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
    for (v, t, d, dt) in all {
        if !args.only_t.is_empty() && !args.only_t.contains(&t) {
            continue;
        }
        trace(args.trace, format_args!("{v} T={t} d={d} {dt:?}: inputs and reference"));
        let shape = (2, 3, t, d);
        let scale = if v.to_string().starts_with("softmax") || v.to_string().contains("sigmoid") { 1.0 } else { 0.7 };
        let (q, k, vv, g) = (
            normals(&mut rng, shape, scale),
            normals(&mut rng, shape, scale),
            normals(&mut rng, shape, 1.0),
            normals(&mut rng, shape, 1.0),
        );
        let (q, k, vv, g) = (round_to(&q, dt), round_to(&k, dt), round_to(&vv, dt), round_to(&g, dt));
        let f64s = |x: &Array4<f32>| x.mapv(|a| a as f64);
        let (q64, k64, v64, g64) = (f64s(&q), f64s(&k), f64s(&vv), f64s(&g));
        let o_ref = attn_core::forward(&v, &q64, &k64, &v64)?;
        let gr = attn_core::backward(&v, &q64, &k64, &v64, &g64)?;
        // Every kernel request; `cuda::versions` says what each runs on this device and at this d.
        let kernels: &[Kernel] = if cuda::has_tensor_core_forward(d, dt) {
            &Kernel::ALL[1..] // Auto runs one of the others
        } else {
            &[Kernel::Simt]
        };
        trace(args.trace, format_args!("naive"));
        let nv = naive(&v, &q, &k, &vv, &g, dt)?;
        let n_o = rel_err(&nv[0], &o_ref);
        let n_dq = rel_err(&nv[1], &gr.dq);
        let mut ran = Vec::new();
        for &kern in kernels {
            // Labelled by what ran on this device; a request that runs an already checked pair is skipped.
            let (f, b) = cuda::versions(&v, d, dt, kern)?;
            if ran.contains(&(f, b)) {
                continue;
            }
            ran.push((f, b));
            let opts = cuda::Options { dtype: dt, kernel: kern };
            trace(args.trace, format_args!("forward {kern:?}"));
            let o = cuda::forward_with(&v, &q, &k, &vv, &opts)?;
            trace(args.trace, format_args!("backward"));
            let grads = cuda::backward_with(&v, &q, &k, &vv, &g, &opts)?;
            let e = [
                rel_err(&o, &o_ref),
                rel_err(&grads.dq, &gr.dq),
                rel_err(&grads.dk, &gr.dk),
                rel_err(&grads.dv, &gr.dv),
            ];
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
    }
    ok &= model_check(rows)?;
    Ok(ok)
}

/// The autograd bridge on the GPU: a small GPT's loss and parameter gradients with `fused` attention
/// against the `reference` (tch ops) attention, in f32 (tight) and bf16 (each against f32).
fn model_check(rows: &mut Vec<Value>) -> Result<bool> {
    use gpt_model::{AttnImpl, ForwardOptions, Gpt, ModelConfig};
    say!("\nGPT (2 layers, 2 heads of 64, T = 200) on the GPU: fused vs reference attention through autograd");
    let mut ok = true;
    for variant in ["lssa", "lssa+rw15", "softmax"] {
        let run = |imp: AttnImpl, kind: Kind| -> Result<(f64, Vec<Tensor>)> {
            tch::manual_seed(7);
            let mut cfg = ModelConfig::gpt2_124m();
            (cfg.n_layer, cfg.n_head, cfg.d_model, cfg.vocab_size, cfg.context_len) = (2, 2, 128, 512, 200);
            cfg.attention = variant.into();
            cfg.attn_impl = imp;
            let mut vs = tch::nn::VarStore::new(Device::Cuda(0));
            let gpt = Gpt::new(&vs.root(), &cfg)?;
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
        let (l_ref, g_ref) = run(AttnImpl::Reference, Kind::Float)?;
        let (l_fus, g_fus) = run(AttnImpl::Fused, Kind::Float)?;
        let (l_ref16, g_ref16) = run(AttnImpl::Reference, Kind::BFloat16)?;
        let (l_fus16, g_fus16) = run(AttnImpl::Fused, Kind::BFloat16)?;
        let e32 = ((l_fus - l_ref).abs(), rel(&g_fus, &g_ref));
        let (e16f, e16r) = (rel(&g_fus16, &g_ref), rel(&g_ref16, &g_ref));
        let pass = e32.0 < 1e-4 && e32.1 < 1e-3 && e16f <= 2.0 * e16r + 1e-3;
        ok &= pass;
        say!(
            "  {variant:<10} f32: |loss diff| {:.1e}, grad rel {:.1e} | bf16 grads vs f32 reference: fused {:.1e}, reference {:.1e} | loss f32 {:.4} bf16 fused {:.4} ref {:.4} | {}",
            e32.0,
            e32.1,
            e16f,
            e16r,
            l_ref,
            l_fus16,
            l_ref16,
            if pass { "ok" } else { "FAIL" }
        );
        rows.push(json!({"model_check": variant, "f32_loss_diff": e32.0, "f32_grad_rel": e32.1, "bf16_fused_grad_rel": e16f, "bf16_reference_grad_rel": e16r, "pass": pass}));
    }
    let counts = gpt_model::attention::path_counts();
    say!("  attention calls: {counts:?}");
    Ok(ok)
}

// ---------------------------------------------------------------------------------------------
// Speed.

fn raw<P>(t: &Tensor) -> RawTensor<*mut P> {
    let s = t.stride();
    RawTensor { ptr: t.data_ptr() as *mut P, strides: [s[0] as usize, s[1] as usize, s[2] as usize] }
}

struct Bufs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    stats: Tensor,
    g: Tensor,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
}

impl Bufs {
    fn new(b: i64, h: i64, t: i64, d: i64) -> Self {
        let opts = (Kind::BFloat16, Device::Cuda(0));
        let r = || Tensor::randn([b, h, t, d], opts);
        Bufs {
            q: r(),
            k: r(),
            v: r(),
            o: Tensor::empty([b, h, t, d], opts),
            stats: Tensor::empty([b, h, t, STATS_PER_ROW as i64], (Kind::Float, Device::Cuda(0))),
            g: r(),
            dq: Tensor::empty([b, h, t, d], opts),
            dk: Tensor::empty([b, h, t, d], opts),
            dv: Tensor::empty([b, h, t, d], opts),
        }
    }
    fn params(&self) -> Params {
        let sz = self.q.size();
        Params {
            batch: sz[0] as usize,
            heads: sz[1] as usize,
            seq_len: sz[2] as usize,
            head_dim: sz[3] as usize,
            q: raw::<f32>(&self.q).as_const(),
            k: raw::<f32>(&self.k).as_const(),
            v: raw::<f32>(&self.v).as_const(),
            o: raw(&self.o),
            stats: self.stats.data_ptr() as *mut f32,
            rw_aux: std::ptr::null_mut(),
            d_out: raw::<f32>(&self.g).as_const(),
            dq: raw(&self.dq),
            dk: raw(&self.dk),
            dv: raw(&self.dv),
        }
    }
}

fn sync() {
    tch::Cuda::synchronize(0);
}

/// Median seconds per call of `f` (synchronised; warm-up first). `None` when it fails (e.g. OOM).
fn time(reps: usize, mut f: impl FnMut() -> Result<()>) -> Option<f64> {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<f64> {
        f()?;
        sync();
        // Calls per timed sample: enough for ~20 ms.
        let t0 = Instant::now();
        f()?;
        sync();
        let one = t0.elapsed().as_secs_f64().max(1e-6);
        let inner = ((0.02 / one).ceil() as usize).clamp(1, 50);
        let mut samples = Vec::new();
        for _ in 0..reps {
            let t0 = Instant::now();
            for _ in 0..inner {
                f()?;
            }
            sync();
            samples.push(t0.elapsed().as_secs_f64() / inner as f64);
        }
        samples.sort_by(|a, b| a.total_cmp(b));
        Ok(samples[samples.len() / 2])
    }));
    match run {
        Ok(Ok(s)) => Some(s),
        _ => None,
    }
}

fn speed(args: &Args, rows: &mut Vec<Value>) -> Result<()> {
    let lssa: Variant = "lssa".parse()?;
    let lssar: Variant = "lssa+rw15".parse()?;
    // What the driver made of each kernel: registers, spills, shared memory and blocks per SM explain
    // much of a timing (and differ from an offline ptxas when the driver's JIT is another version).
    for v in [&lssa, &lssar] {
        for &d in &args.head_dims {
            say!("\nKernels of {v} at d = {d}, bf16: threads, registers, local bytes, shared bytes, blocks per SM");
            let mut res = Vec::new();
            for k in cuda::kernel_resources(v, d as usize, Dtype::Bf16)? {
                say!(
                    "  {:<22} {:>4} {:>4} {:>6} {:>7} {:>3}",
                    k.name,
                    k.threads,
                    k.registers,
                    k.local_bytes,
                    k.shared_bytes,
                    k.blocks_per_sm
                );
                res.push(json!({"kernel": k.name, "threads": k.threads, "registers": k.registers,
                    "local_bytes": k.local_bytes, "shared_bytes": k.shared_bytes, "blocks_per_sm": k.blocks_per_sm}));
            }
            rows.push(json!({"variant": v.to_string(), "d": d, "kernel_resources": res}));
        }
    }
    say!("\nTFLOP/s, bf16, causal, H = 12, B*T = 16K (FlashAttention FLOP convention); '-' = failed (OOM)");
    say!(
        "{:>4} {:>6} {:>3} | {:>8} {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8} | {:>7} {:>7}",
        "d",
        "T",
        "B",
        "SDPA",
        "LSSA",
        "LSSAR",
        "ops-LSSA",
        "ops-LSSAR",
        "SDPA fb",
        "LSSA fb",
        "LSSAR fb",
        "opsLSSA fb",
        "LSSA/SD",
        "fb/SD"
    );
    let mut lab = Vec::new();
    let mut flex_table = Vec::new();
    for &d in &args.head_dims {
        // The FlexAttention baseline: every length of this d in one child process, before our buffers.
        let flex_rows = args.flex.then(|| {
            let req = flex::SpeedRequest {
                device: "cuda".into(),
                dtype: "bf16".into(),
                head_dim: d as usize,
                heads: 12,
                lengths: args.lengths.iter().map(|&t| t as usize).collect(),
                batch: 0,
                tokens: 16384,
                threads: 0,
                reps: args.reps,
                min_reps: 1,
                budget_s: 4.0,
                // GPU timings do not drift with a neighbour's load as the 2-core CPU runs do: no
                // lead-in runs, and no SDPA of the child's own to pair with.
                lead_in_below_s: 0.0,
                backward: true,
                sdpa: false,
            };
            flex::speed(&req).map_err(|e| format!("{e:#}"))
        });
        if let Some(Err(e)) = &flex_rows {
            say!("FlexAttention baseline at d = {d} failed: {e}");
        }
        for &t in &args.lengths {
            let b = (16384 / t).max(1);
            let h = 12;
            let flops = 4.0 * (b * h) as f64 * (t as f64).powi(2) * d as f64 / 2.0;
            let bufs = Bufs::new(b, h, t, d);
            let p = bufs.params();
            let tf = |s: Option<f64>, mult: f64| s.map(|s| mult * flops / s / 1e12);
            let fmt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
            let sdpa = time(args.reps, || {
                let _ = Tensor::scaled_dot_product_attention(
                    &bufs.q,
                    &bufs.k,
                    &bufs.v,
                    None::<Tensor>,
                    0.0,
                    true,
                    None,
                    false,
                );
                Ok(())
            });
            // Timings by what actually ran (variant, lab versions), so a version is timed once however many
            // requests run it (Auto and v3; v5 and v7's shared forward; off sm_90, v8's fallbacks).
            let mut fwd_memo: HashMap<(String, u32), Option<f64>> = HashMap::new();
            let mut fb_memo: HashMap<(String, u32, u32), Option<f64>> = HashMap::new();
            let mut fwd = |v: &Variant, k: Kernel| -> Result<(u32, Option<f64>)> {
                let (f, _) = cuda::versions(v, d as usize, Dtype::Bf16, k)?;
                let reps = if f <= 2 { args.reps.min(5) } else { args.reps };
                let s = *fwd_memo
                    .entry((v.to_string(), f))
                    .or_insert_with(|| time(reps, || Ok(unsafe { cuda::forward_raw(v, &p, Dtype::Bf16, k) }?)));
                Ok((f, s))
            };
            let mut fb = |v: &Variant, k: Kernel| -> Result<((u32, u32), Option<f64>)> {
                let fb = cuda::versions(v, d as usize, Dtype::Bf16, k)?;
                let s = *fb_memo.entry((v.to_string(), fb.0, fb.1)).or_insert_with(|| {
                    time(args.reps, || {
                        unsafe {
                            cuda::forward_raw(v, &p, Dtype::Bf16, k)?;
                            cuda::backward_raw(v, &p, Dtype::Bf16, k)?;
                        }
                        Ok(())
                    })
                });
                Ok((fb, s))
            };
            let (l, lr) = (fwd(&lssa, Kernel::Auto)?.1, fwd(&lssar, Kernel::Auto)?.1);
            let (lfb, lrfb) = (fb(&lssa, Kernel::Auto)?.1, fb(&lssar, Kernel::Auto)?.1);
            // The lab: every kernel request, labelled with the versions it ran on this device (off sm_90
            // `v8` runs v5 or v3 + v7; at d = 128 `v5` runs v3 + v6); a repeated pair is printed once.
            let mut ran = Vec::new();
            let mut lab_json = Vec::new();
            for k in Kernel::ALL[1..].iter().copied() {
                let request = k.name();
                let slow = matches!(k, Kernel::Simt | Kernel::TensorCoreV2);
                if slow && t > 16384 {
                    continue;
                }
                let (f, sl) = fwd(&lssa, k)?;
                // v1 and v2 are forward-only lab rows (their backward is v1's).
                let (pair, sfb, slr) = if slow {
                    ((f, 0), None, None)
                } else {
                    let (pair, sfb) = fb(&lssa, k)?;
                    (pair, sfb, fwd(&lssar, k)?.1)
                };
                if ran.contains(&pair) {
                    continue;
                }
                ran.push(pair);
                let label = if pair.1 == 0 { format!("v{}", pair.0) } else { format!("v{}+v{}", pair.0, pair.1) };
                lab.push(format!(
                    "{d:>4} {t:>6} | {request:>7} {label:>7} | {:>8} {:>9} {:>10}",
                    fmt(tf(sl, 1.0)),
                    fmt(tf(slr, 1.0)),
                    fmt(tf(sfb, 3.5))
                ));
                lab_json
                    .push(json!({"request": request, "forward": pair.0, "backward": (pair.1 > 0).then_some(pair.1),
                    "lssa_fwd": sl, "lssar15_fwd": slr, "lssa_fwd_bwd": sfb}));
            }
            let ops = |pp: Option<u32>| {
                if t > 16384 {
                    return None; // (B, H, T, T) f32 intermediates: > 80 GB
                }
                time(args.reps.min(3), || {
                    let _ = tch::no_grad(|| gpt_model::attention::torch_ops::lssa(&bufs.q, &bufs.k, &bufs.v, pp));
                    Ok(())
                })
            };
            let (ol, olr) = (ops(None), ops(Some(15)));
            let req = |x: &Tensor| x.detach().set_requires_grad(true);
            let sdpa_fb = time(args.reps, || {
                let (q, k, v) = (req(&bufs.q), req(&bufs.k), req(&bufs.v));
                let o = Tensor::scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, true, None, false);
                (&o * &bufs.g).sum(Kind::Float).backward();
                Ok(())
            });
            let ops_fb = if t > 8192 {
                None
            } else {
                time(args.reps.min(3), || {
                    let (q, k, v) = (req(&bufs.q), req(&bufs.k), req(&bufs.v));
                    let o = gpt_model::attention::torch_ops::lssa(&q, &k, &v, None);
                    (&o * &bufs.g).sum(Kind::Float).backward();
                    Ok(())
                })
            };
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) => format!("{:.2}", b / a),
                _ => "-".into(),
            };
            say!(
                "{:>4} {:>6} {:>3} | {:>8} {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8} | {:>7} {:>7}",
                d,
                t,
                b,
                fmt(tf(sdpa, 1.0)),
                fmt(tf(l, 1.0)),
                fmt(tf(lr, 1.0)),
                fmt(tf(ol, 1.0)),
                fmt(tf(olr, 1.0)),
                fmt(tf(sdpa_fb, 3.5)),
                fmt(tf(lfb, 3.5)),
                fmt(tf(lrfb, 3.5)),
                fmt(tf(ops_fb, 3.5)),
                ratio(sdpa, l),
                ratio(sdpa_fb, lfb)
            );
            if let Some(Ok(fr)) = &flex_rows {
                let row = fr.iter().find(|r| r.t == t as usize);
                let cell = |c: &str| row.and_then(|r| r.median_ms(c)).map(|ms| ms / 1e3);
                let (fl, flr, ffb) = (cell(flex::LSSA_FWD), cell(flex::LSSAR15_FWD), cell(flex::LSSA_FWD_BWD));
                flex_table.push(format!(
                    "{d:>4} {t:>6} | {:>8} {:>9} {:>8} | {:>8} {:>9} {:>8} | {}",
                    fmt(tf(fl, 1.0)),
                    fmt(tf(flr, 1.0)),
                    fmt(tf(ffb, 3.5)),
                    ratio(l, fl),
                    ratio(lr, flr),
                    ratio(lfb, ffb),
                    row.map(|r| r.errors.iter().map(|(c, e)| format!("{c}: {e}")).collect::<Vec<_>>().join("; "))
                        .unwrap_or_else(|| "no row".into())
                ));
                rows.push(
                    json!({"d": d, "T": t, "flex_seconds": {"lssa_fwd": fl, "lssar15_fwd": flr, "lssa_fwd_bwd": ffb},
                    "flex_rel_err_vs_materialised": row.and_then(|r| r.rel_err_vs_materialised),
                    "flex_errors": row.map(|r| r.errors.clone())}),
                );
            }
            rows.push(json!({"d": d, "T": t, "B": b, "H": h, "seconds": {
                "sdpa_fwd": sdpa, "lssa_fwd": l, "lssar15_fwd": lr, "ops_lssa_fwd": ol, "ops_lssar15_fwd": olr,
                "sdpa_fwd_bwd": sdpa_fb, "lssa_fwd_bwd": lfb, "lssar15_fwd_bwd": lrfb, "ops_lssa_fwd_bwd": ops_fb},
                "lab_seconds": lab_json, "forward_flops": flops}));
        }
    }
    say!("\nKernel lab, TFLOP/s by the versions each request ran (bf16, causal, H = 12, B*T = 16K)");
    say!(
        "{:>4} {:>6} | {:>7} {:>7} | {:>8} {:>9} {:>10}",
        "d",
        "T",
        "request",
        "ran",
        "LSSA fwd",
        "LSSAR fwd",
        "LSSA fb"
    );
    for l in lab {
        say!("{l}");
    }
    if args.flex {
        say!(
            "\nFlexAttention baseline (benches/flex_lssa.py, compiled), TFLOP/s, and our time advantage (flex / ours)"
        );
        say!(
            "{:>4} {:>6} | {:>8} {:>9} {:>8} | {:>8} {:>9} {:>8} | errors",
            "d",
            "T",
            "LSSA fwd",
            "LSSAR fwd",
            "LSSA fb",
            "x fwd",
            "x LSSAR",
            "x fb"
        );
        for l in flex_table {
            say!("{l}");
        }
    }
    Ok(())
}

fn memory(rows: &mut Vec<Value>) -> Result<()> {
    say!("\nDevice memory of one forward+backward (bf16, B = 1, H = 12, d = 64), GiB above the CUDA context,");
    say!("each in a fresh process (libtorch's caching allocator keeps its high-water mark)");
    let exe = std::env::current_exe()?;
    for t in [16384i64, 65536] {
        for which in ["fused", "ops", "sdpa"] {
            let out = std::process::Command::new(&exe).args(["memory-one", which, &t.to_string()]).output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let gib: Option<f64> =
                text.lines().find_map(|l| l.strip_prefix("GIB ")).and_then(|v| v.trim().parse().ok());
            say!("  T = {t:>6}  {which:<6} {}", gib.map_or("out of memory / failed".into(), |g| format!("{g:.2}")));
            rows.push(json!({"T": t, "impl": which, "gib": gib}));
        }
    }
    Ok(())
}

fn memory_one(which: &str, t: i64) -> Result<()> {
    let base = used_device_bytes().context("cuMemGetInfo")?;
    let bufs = Bufs::new(1, 12, t, 64);
    let p = bufs.params();
    let lssa: Variant = "lssa".parse()?;
    match which {
        "fused" => unsafe {
            cuda::forward_raw(&lssa, &p, Dtype::Bf16, Kernel::Auto)?;
            cuda::backward_raw(&lssa, &p, Dtype::Bf16, Kernel::Auto)?;
        },
        "ops" => {
            let q = bufs.q.detach().set_requires_grad(true);
            let o = gpt_model::attention::torch_ops::lssa(&q, &bufs.k, &bufs.v, None);
            (&o * &bufs.g).sum(Kind::Float).backward();
        }
        _ => {
            let q = bufs.q.detach().set_requires_grad(true);
            let o = Tensor::scaled_dot_product_attention(&q, &bufs.k, &bufs.v, None::<Tensor>, 0.0, true, None, false);
            (&o * &bufs.g).sum(Kind::Float).backward();
        }
    }
    sync();
    let used = used_device_bytes().context("cuMemGetInfo")?;
    say!("GIB {}", used.saturating_sub(base) as f64 / (1u64 << 30) as f64);
    Ok(())
}

fn used_device_bytes() -> Option<u64> {
    sync();
    let ctx = cudarc::driver::CudaContext::new(0).ok()?;
    let (free, total) = ctx.mem_get_info().ok()?;
    Some((total - free) as u64)
}

fn model(rows: &mut Vec<Value>) -> Result<()> {
    use gpt_model::{AttnImpl, ForwardOptions, Gpt, ModelConfig};
    say!("\nGPT-2 124M forward+backward step (bf16 weights and activations), tokens/s, B*T = 8K");
    for t in [1024i64, 4096] {
        for variant in ["lssa", "lssa+rw15"] {
            let mut line = format!("  T = {t:>5} {variant:<10}");
            let mut res = serde_json::Map::new();
            // The fused step with the default kernels, then with the newer ones (v5 + v6, v5 + v7, v8 + v9).
            for (imp, kernel) in [
                (AttnImpl::Reference, Kernel::Auto),
                (AttnImpl::Fused, Kernel::Auto),
                (AttnImpl::Fused, Kernel::TensorCoreV5),
                (AttnImpl::Fused, Kernel::TensorCoreV7),
                (AttnImpl::Fused, Kernel::TensorCoreV8),
            ] {
                gpt_model::attention::fused::set_cuda_kernel(kernel);
                // Labelled by the versions the fused step runs here (GPT-2 124M: head dimension 64).
                let label = match imp {
                    AttnImpl::Fused => {
                        let (f, b) = cuda::versions(&variant.parse()?, 64, Dtype::Bf16, kernel)?;
                        format!("Fused(v{f}+v{b})")
                    }
                    _ => format!("{imp:?}"),
                };
                if res.contains_key(&label) {
                    continue;
                }
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<f64> {
                    let mut cfg = ModelConfig::gpt2_124m();
                    cfg.context_len = t as usize;
                    cfg.attention = variant.into();
                    cfg.attn_impl = imp;
                    let mut vs = tch::nn::VarStore::new(Device::Cuda(0));
                    let gpt = Gpt::new(&vs.root(), &cfg)?;
                    vs.bfloat16();
                    let b = (8192 / t).max(1);
                    let idx = Tensor::randint(cfg.vocab_size as i64, [b, t], (Kind::Int64, Device::Cuda(0)));
                    let step = || -> Result<()> {
                        let loss = gpt.loss(&idx, &idx, &ForwardOptions::default())?;
                        loss.backward();
                        Ok(())
                    };
                    let s = time(3, step).context("step failed")?;
                    Ok((b * t) as f64 / s)
                }));
                let v = match r {
                    Ok(Ok(v)) => Some(v),
                    Ok(Err(e)) => {
                        eprintln!("    {imp:?}: {e:#}");
                        None
                    }
                    Err(_) => None,
                };
                line.push_str(&format!("  {label} {}", v.map_or("-".into(), |v| format!("{v:.0}"))));
                res.insert(label, json!(v));
            }
            gpt_model::attention::fused::set_cuda_kernel(Kernel::Auto);
            say!("{line}");
            rows.push(json!({"T": t, "variant": variant, "tokens_per_s": res}));
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() == 4 && a[1] == "memory-one" {
        return memory_one(&a[2], a[3].parse()?); // internal: one measurement of `memory`, in its own process
    }
    let args = Args::parse();
    if !tch::Cuda::is_available() {
        bail!("no CUDA device visible to libtorch: run this on a GPU machine (see docs/GUIDE.md, CUDA kernels)");
    }
    say!("device: {}; NVRTC from {}", cuda::device_description()?, cuda::nvrtc_location()?.display());
    let mut out = serde_json::Map::new();
    out.insert("device".into(), json!(cuda::device_description()?));
    let all = args.what == "all";
    let mut failed = false;
    if all || args.what == "check" {
        let mut rows = Vec::new();
        failed |= !check(&args, &mut rows)?;
        out.insert("check".into(), Value::Array(rows));
    }
    if all || args.what == "speed" {
        let mut rows = Vec::new();
        speed(&args, &mut rows)?;
        out.insert("speed".into(), Value::Array(rows));
        let mut rows = Vec::new();
        memory(&mut rows)?;
        out.insert("memory".into(), Value::Array(rows));
    }
    if all || args.what == "model" {
        let mut rows = Vec::new();
        model(&mut rows)?;
        out.insert("model".into(), Value::Array(rows));
    }
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&Value::Object(out))?)?;
    let md = args.out.with_extension("md");
    let log = LOG.lock().unwrap_or_else(|e| e.into_inner()).clone();
    std::fs::write(&md, format!("# bench-cuda `{}`\n\n```text\n{log}```\n", args.what))?;
    say!("\nwrote {} and {}", args.out.display(), md.display());
    if failed {
        bail!("correctness check failed (rows marked FAIL)");
    }
    Ok(())
}
