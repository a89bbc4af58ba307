//! `speed`: TFLOP/s of the fused kernels (and every lab version), libtorch SDPA, tch ops and
//! FlexAttention; device memory in child processes; the GPT-2 124M step (`model`), tokens/s.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result};
use attn_core::Variant;
use attn_kernels::cpu::STATS_PER_ROW;
use attn_kernels::cuda::{self, Dtype, Kernel, Version};
use attn_kernels::{Params, RawTensor};
use lssa_benches::flex;
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use crate::cli::Args;
use crate::transcript::say;

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
            kv_heads: sz[1] as usize,
            seq_len: sz[2] as usize,
            kv_len: sz[2] as usize,
            head_dim: sz[3] as usize,
            q: raw::<std::ffi::c_void>(&self.q).as_const(),
            k: raw::<std::ffi::c_void>(&self.k).as_const(),
            v: raw::<std::ffi::c_void>(&self.v).as_const(),
            o: raw(&self.o),
            stats: self.stats.data_ptr() as *mut f32,
            rw_aux: std::ptr::null_mut(),
            d_out: raw::<std::ffi::c_void>(&self.g).as_const(),
            dq: raw(&self.dq),
            dk: raw(&self.dk),
            dv: raw(&self.dv),
            dtype: Dtype::Bf16, // Bufs::new's tensors
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

/// The timings; `progress` gets the rows so far after each length (the caller saves them).
pub(crate) fn speed(args: &Args, rows: &mut Vec<Value>, progress: &mut dyn FnMut(&[Value])) -> Result<()> {
    let lssa: Variant = "lssa".parse()?;
    let lssar: Variant = "lssa+rw15".parse()?;
    // Identity + l1 on the same kernels: almost no element-wise work per score, so LSSA's time over
    // linear-l1's says how much of it the element-wise step costs (the rest is the pipeline).
    let linear: Variant = "linear-l1".parse()?;
    kernel_resources(args, &[&lssa, &lssar], rows)?;
    jit_logs(args, &[&lssa, &lssar, &"softmax".parse::<Variant>()?], rows);
    say_speed_header();
    let variants = Variants { lssa, lssar, linear };
    let mut lab = Vec::new();
    let mut flex_table = Vec::new();
    for &d in &args.head_dims {
        // The FlexAttention baseline: every length of this d in one child process, before our buffers.
        let flex_rows = args.flex.then(|| flex_baseline(args, d));
        if let Some(Err(e)) = &flex_rows {
            say!("FlexAttention baseline at d = {d} failed: {e}");
        }
        for &t in &args.lengths {
            let flex_rows = match &flex_rows {
                Some(Ok(fr)) => Some(fr.as_slice()),
                _ => None,
            };
            let tables = Tables { lab: &mut lab, flex: &mut flex_table };
            time_length(args, &variants, (d, t), flex_rows, tables, rows)?;
            progress(rows);
        }
    }
    say_tables(args, &lab, &flex_table);
    Ok(())
}

/// What the driver made of each kernel of `variants` at every `--head-dims`, bf16: registers,
/// spills, shared memory and blocks per SM explain much of a timing (and differ from an offline
/// ptxas when the driver's JIT is another version).
fn kernel_resources(args: &Args, variants: &[&Variant], rows: &mut Vec<Value>) -> Result<()> {
    for v in variants {
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
    Ok(())
}

/// The driver's JIT log of `variants` at every `--head-dims`, bf16: ptxas says there where it
/// serialised wgmma (C7515 and kin) or spilled; those lines are printed, the whole log kept in `rows`.
fn jit_logs(args: &Args, variants: &[&Variant], rows: &mut Vec<Value>) {
    for v in variants {
        for &d in &args.head_dims {
            match cuda::jit_info_log(v, d as usize, Dtype::Bf16) {
                Ok(log) => {
                    let flagged: Vec<&str> = log
                        .lines()
                        .filter(|l| l.contains("wgmma") || l.contains("C75") || l.contains("spill"))
                        .filter(|l| !l.contains(" 0 bytes spill"))
                        .collect();
                    say!(
                        "
JIT info log of {v} at d = {d}, bf16: {} lines, {} on wgmma or spills",
                        log.lines().count(),
                        flagged.len()
                    );
                    for l in &flagged {
                        say!("  {l}");
                    }
                    rows.push(json!({"variant": v.to_string(), "d": d, "jit_info_log": log}));
                }
                Err(e) => say!(
                    "
JIT info log of {v} at d = {d}: {e}"
                ),
            }
        }
    }
}

/// The header of the main table, whose rows [`time_length`] prints.
fn say_speed_header() {
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
}

/// The FlexAttention baseline at head dimension `d`: every length in one child process.
fn flex_baseline(args: &Args, d: i64) -> std::result::Result<Vec<flex::SpeedRow>, String> {
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
}

/// The variants `speed` times.
struct Variants {
    lssa: Variant,
    lssar: Variant,
    linear: Variant,
}

/// The lines of the tables printed after the main one.
struct Tables<'a> {
    /// The kernel lab's.
    lab: &'a mut Vec<String>,
    /// FlexAttention's.
    flex: &'a mut Vec<String>,
}

/// TFLOP/s of `flops` (times `mult`: 3.5 for forward+backward) in `s` seconds, as a cell; `-`
/// where the timing failed.
fn tf_cell(flops: f64, s: Option<f64>, mult: f64) -> String {
    s.map(|s| mult * flops / s / 1e12).map_or("-".to_string(), |v| format!("{v:.1}"))
}

/// Time b over time a.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}", b / a),
        _ => "-".into(),
    }
}

/// One length `t` at head dimension `d`: SDPA, the fused kernels, the lab, tch ops, and the
/// FlexAttention baseline's row from `flex_rows`; a row of the main table, lines of `tables`, and
/// rows of `rows`.
fn time_length(
    args: &Args,
    variants: &Variants,
    (d, t): (i64, i64),
    flex_rows: Option<&[flex::SpeedRow]>,
    tables: Tables<'_>,
    rows: &mut Vec<Value>,
) -> Result<()> {
    let b = (16384 / t).max(1);
    let h = 12;
    let flops = 4.0 * (b * h) as f64 * (t as f64).powi(2) * d as f64 / 2.0;
    let bufs = Bufs::new(b, h, t, d);
    let p = bufs.params();
    let tf = |s: Option<f64>, mult: f64| tf_cell(flops, s, mult);
    let sdpa = time(args.reps, || {
        let _ = Tensor::scaled_dot_product_attention(&bufs.q, &bufs.k, &bufs.v, None::<Tensor>, 0.0, true, None, false);
        Ok(())
    });
    let Variants { lssa, lssar, .. } = variants;
    let mut fused = Fused { reps: args.reps, d: d as usize, p: &p, fwd_memo: HashMap::new(), fb_memo: HashMap::new() };
    let (l, lr) = (fused.fwd(lssa, Kernel::Auto)?.1, fused.fwd(lssar, Kernel::Auto)?.1);
    let (lfb, lrfb) = (fused.fb(lssa, Kernel::Auto)?.1, fused.fb(lssar, Kernel::Auto)?.1);
    let lab_json = lab(&mut fused, &args.kernels, variants, (d, t), flops, tables.lab)?;
    let Torch { ol, olr, sdpa_fb, ops_fb } = torch_timings(args, &bufs, t);
    say!(
        "{:>4} {:>6} {:>3} | {:>8} {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8} | {:>7} {:>7}",
        d,
        t,
        b,
        tf(sdpa, 1.0),
        tf(l, 1.0),
        tf(lr, 1.0),
        tf(ol, 1.0),
        tf(olr, 1.0),
        tf(sdpa_fb, 3.5),
        tf(lfb, 3.5),
        tf(lrfb, 3.5),
        tf(ops_fb, 3.5),
        ratio(sdpa, l),
        ratio(sdpa_fb, lfb)
    );
    if let Some(fr) = flex_rows {
        flex_row(fr, (d, t), flops, [l, lr, lfb], tables.flex, rows);
    }
    rows.push(json!({"d": d, "T": t, "B": b, "H": h, "seconds": {
        "sdpa_fwd": sdpa, "lssa_fwd": l, "lssar15_fwd": lr, "ops_lssa_fwd": ol, "ops_lssar15_fwd": olr,
        "sdpa_fwd_bwd": sdpa_fb, "lssa_fwd_bwd": lfb, "lssar15_fwd_bwd": lrfb, "ops_lssa_fwd_bwd": ops_fb},
        "lab_seconds": lab_json, "forward_flops": flops}));
    Ok(())
}

/// The fused kernels' timings at one (d, T), by what actually ran (variant, lab versions), so a
/// version is timed once however many requests run it (Auto and v3; v5 and v7's shared forward; off
/// sm_90, v8's fallbacks).
struct Fused<'a> {
    reps: usize,
    d: usize,
    p: &'a Params,
    fwd_memo: HashMap<(String, u32), Option<f64>>,
    fb_memo: HashMap<(String, u32, u32), Option<f64>>,
}

impl Fused<'_> {
    /// The forward version request `k` runs on `v`, and its time (v1 and v2, slow, at most 5 reps).
    fn fwd(&mut self, v: &Variant, k: Kernel) -> Result<(u32, Option<f64>)> {
        let (f, _) = cuda::versions(v, self.d, Dtype::Bf16, k)?;
        let reps = if f <= 2 { self.reps.min(5) } else { self.reps };
        let p = self.p;
        let s = *self
            .fwd_memo
            .entry((v.to_string(), f))
            .or_insert_with(|| time(reps, || Ok(unsafe { cuda::forward_raw(v, p, Dtype::Bf16, k) }?)));
        Ok((f, s))
    }

    /// The (forward, backward) versions request `k` runs on `v`, and the time of both.
    fn fb(&mut self, v: &Variant, k: Kernel) -> Result<((u32, u32), Option<f64>)> {
        let fb = cuda::versions(v, self.d, Dtype::Bf16, k)?;
        let (reps, p) = (self.reps, self.p);
        let s = *self.fb_memo.entry((v.to_string(), fb.0, fb.1)).or_insert_with(|| {
            time(reps, || {
                unsafe {
                    cuda::forward_raw(v, p, Dtype::Bf16, k)?;
                    cuda::backward_raw(v, p, Dtype::Bf16, k)?;
                }
                Ok(())
            })
        });
        Ok((fb, s))
    }
}

/// The lab at one (d, T): every kernel request (those of `requests` when it is not empty), labelled with the versions it ran on this device
/// (off sm_90 `v8` runs v5 or v3 + v7; at d = 128 `v5` runs v3 + v6); a repeated pair is printed
/// once. A line of `lines` per pair; returns their rows.
fn lab(
    fused: &mut Fused<'_>,
    requests: &[Kernel],
    variants: &Variants,
    (d, t): (i64, i64),
    flops: f64,
    lines: &mut Vec<String>,
) -> Result<Vec<Value>> {
    let tf = |s: Option<f64>, mult: f64| tf_cell(flops, s, mult);
    let mut ran = Vec::new();
    let mut lab_json = Vec::new();
    for k in Kernel::ALL[1..].iter().copied().filter(|k| requests.is_empty() || requests.contains(k)) {
        let request = k.name();
        let slow = matches!(k, Kernel::Lab(Version::V1) | Kernel::Lab(Version::V2));
        if slow && t > 16384 {
            continue;
        }
        let (f, sl) = fused.fwd(&variants.lssa, k)?;
        // v1 and v2 are forward-only lab rows (their backward is v1's).
        let (pair, sfb, slr, slin) = if slow {
            ((f, 0), None, None, None)
        } else {
            let (pair, sfb) = fused.fb(&variants.lssa, k)?;
            (pair, sfb, fused.fwd(&variants.lssar, k)?.1, fused.fwd(&variants.linear, k)?.1)
        };
        if ran.contains(&pair) {
            continue;
        }
        ran.push(pair);
        let label = if pair.1 == 0 { format!("v{}", pair.0) } else { format!("v{}+v{}", pair.0, pair.1) };
        lines.push(format!(
            "{d:>4} {t:>6} | {request:>7} {label:>7} | {:>8} {:>9} {:>10} | {:>10} {:>9}",
            tf(sl, 1.0),
            tf(slr, 1.0),
            tf(sfb, 3.5),
            tf(slin, 1.0),
            ratio(slin, sl)
        ));
        lab_json.push(json!({"request": request, "forward": pair.0, "backward": (pair.1 > 0).then_some(pair.1),
            "lssa_fwd": sl, "lssar15_fwd": slr, "lssa_fwd_bwd": sfb, "linear_l1_fwd": slin}));
    }
    Ok(lab_json)
}

/// libtorch's timings at one length besides SDPA's forward (`None`: failed, or skipped where the
/// `T x T` intermediates would not fit).
struct Torch {
    /// tch ops' LSSA forward.
    ol: Option<f64>,
    /// tch ops' LSSAR (p = 15) forward.
    olr: Option<f64>,
    /// SDPA's forward+backward.
    sdpa_fb: Option<f64>,
    /// tch ops' LSSA forward+backward.
    ops_fb: Option<f64>,
}

fn torch_timings(args: &Args, bufs: &Bufs, t: i64) -> Torch {
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
    Torch { ol, olr, sdpa_fb, ops_fb }
}

/// The FlexAttention baseline's row at (d, T) from the child's rows `fr`, against ours (`[LSSA
/// forward, LSSAR forward, LSSA forward+backward]`): a line of `lines` and a row of `rows`.
fn flex_row(
    fr: &[flex::SpeedRow],
    (d, t): (i64, i64),
    flops: f64,
    [l, lr, lfb]: [Option<f64>; 3],
    lines: &mut Vec<String>,
    rows: &mut Vec<Value>,
) {
    let tf = |s: Option<f64>, mult: f64| tf_cell(flops, s, mult);
    let row = fr.iter().find(|r| r.t == t as usize);
    let cell = |c: &str| row.and_then(|r| r.median_ms(c)).map(|ms| ms / 1e3);
    let (fl, flr, ffb) = (cell(flex::LSSA_FWD), cell(flex::LSSAR15_FWD), cell(flex::LSSA_FWD_BWD));
    lines.push(format!(
        "{d:>4} {t:>6} | {:>8} {:>9} {:>8} | {:>8} {:>9} {:>8} | {}",
        tf(fl, 1.0),
        tf(flr, 1.0),
        tf(ffb, 3.5),
        ratio(l, fl),
        ratio(lr, flr),
        ratio(lfb, ffb),
        row.map(|r| r.errors.iter().map(|(c, e)| format!("{c}: {e}")).collect::<Vec<_>>().join("; "))
            .unwrap_or_else(|| "no row".into())
    ));
    rows.push(json!({"d": d, "T": t, "flex_seconds": {"lssa_fwd": fl, "lssar15_fwd": flr, "lssa_fwd_bwd": ffb},
        "flex_rel_err_vs_materialised": row.and_then(|r| r.rel_err_vs_materialised),
        "flex_errors": row.map(|r| r.errors.clone())}));
}

/// The kernel lab's table and, with `--flex`, FlexAttention's, after the main one.
fn say_tables(args: &Args, lab: &[String], flex_table: &[String]) {
    say!("\nKernel lab, TFLOP/s by the versions each request ran (bf16, causal, H = 12, B*T = 16K)");
    say!(
        "{:>4} {:>6} | {:>7} {:>7} | {:>8} {:>9} {:>10} | {:>10} {:>9}",
        "d",
        "T",
        "request",
        "ran",
        "LSSA fwd",
        "LSSAR fwd",
        "LSSA fb",
        "linear fwd",
        "LSSA/lin"
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
}

pub(crate) fn memory(rows: &mut Vec<Value>) -> Result<()> {
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

pub(crate) fn memory_one(which: &str, t: i64) -> Result<()> {
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

pub(crate) fn model(rows: &mut Vec<Value>) -> Result<()> {
    use gpt_model::{AttnImpl, ForwardOptions, Gpt, ModelConfig};
    say!("\nGPT-2 124M forward+backward step (bf16 weights and activations), tokens/s, B*T = 8K");
    say!("  (softmax: `Fused` runs libtorch's SDPA, the nanoGPT baseline; `FusedOwn` our softmax kernel)");
    for t in [1024i64, 4096] {
        for variant in ["softmax", "lssa", "lssa+rw15"] {
            let mut line = format!("  T = {t:>5} {variant:<10}");
            let mut res = serde_json::Map::new();
            // The fused step with the default kernels, then with the newer ones (v5 + v6, v5 + v7, v8 + v9).
            for (imp, kernel) in [
                (AttnImpl::Reference, Kernel::Auto),
                (AttnImpl::Fused, Kernel::Auto),
                (AttnImpl::FusedOwn, Kernel::Auto),
                (AttnImpl::Fused, Kernel::Lab(Version::V5)),
                (AttnImpl::Fused, Kernel::Lab(Version::V7)),
                (AttnImpl::Fused, Kernel::Lab(Version::V8)),
            ] {
                if variant == "softmax" && kernel != Kernel::Auto {
                    continue; // the lab generations are LSSA's
                }
                // Labelled by the versions the fused step runs here (GPT-2 124M: head dimension 64).
                let parsed: attn_core::Variant = variant.parse()?;
                let att = gpt_model::attention::Attention::new(parsed.clone(), imp)?;
                let label = match imp {
                    _ if gpt_model::attention::uses_sdpa(&att, 0, 1, Device::Cuda(0)) => "SDPA".to_string(),
                    AttnImpl::Fused | AttnImpl::FusedOwn => {
                        let (f, b) = cuda::versions(&parsed, 64, Dtype::Bf16, kernel)?;
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
                    cfg.attention = parsed.clone();
                    cfg.attn_impl = imp;
                    let mut vs = tch::nn::VarStore::new(Device::Cuda(0));
                    let mut gpt = Gpt::new(&vs.root(), &cfg)?;
                    gpt.set_cuda_kernel(kernel);
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
            say!("{line}");
            rows.push(json!({"T": t, "variant": variant, "tokens_per_s": res}));
        }
    }
    Ok(())
}
