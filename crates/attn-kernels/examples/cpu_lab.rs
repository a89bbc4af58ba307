//! Side-by-side timing of fused CPU variants, for kernel work on a machine that may be busy:
//! `cpu_lab T threads rounds pass variant...` with `pass` one of `fwd`, `bwd` (forward + backward).
//!
//! Each round runs every variant once (B = 1, H = 12, d = 64, causal, f32) after an untimed warm-up
//! of each, and prints the median over rounds of each variant's time over the first variant's time
//! in the same round: load that lands on a round lands on every variant of it. With one thread on
//! Linux the time is the thread's CPU time (`/proc/thread-self/schedstat`), which time slices lost to
//! other processes do not inflate, so kernel changes can be compared on a busy machine; otherwise it
//! is wall time. It needs no libtorch; the SDPA comparison is `bench-kernels`' job. The environment
//! variables `CPU_LAB_BQ`, `CPU_LAB_BK` and `CPU_LAB_BAND` override the tile sizes (and band) of
//! [`Tuning::for_isa`], and `CPU_LAB_CACHE` its score cache (bytes; 0 recomputes re-weighting's
//! second sweep). The inputs start on a 64-byte boundary as PyTorch's tensors do, or
//! `CPU_LAB_OFFSET` floats past one. A variant named `fresh:NAME` empties the kernels' buffer shelf
//! before each call ([`release_spare_buffers`]), so its calls take their large buffers fresh from
//! the allocator; one named `ISA:NAME` (`amx:lssa`, `avx512:lssa`) runs on that instruction set
//! instead of the detected one, so two paths compare in one process (`fresh:avx512:lssa` for
//! both), and `ISA.BQxBK:NAME` (`amx.128x256:lssa`) with those tiles, `ISA.BQxBKxBAND:NAME`
//! (`amx.128x128x8:lssa`) also with that band (query tiles a forward task runs in lockstep).
//!
//! [`release_spare_buffers`]: attn_kernels::cpu::release_spare_buffers
//!
//! [`Tuning::for_isa`]: attn_kernels::cpu::Tuning::for_isa
use std::time::Instant;

use attn_kernels::cpu::Isa;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: cpu_lab T threads rounds fwd|bwd variant...";
    let num = |i: usize| -> usize { args.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{usage}")) };
    let (t, threads, rounds) = (num(1), num(2), num(3));
    let backward = match args.get(4).map(String::as_str) {
        Some("fwd") => false,
        Some("bwd") => true,
        _ => panic!("{usage}"),
    };
    // `fresh:NAME` frees the buffers the kernels keep between calls before each call of NAME, so the
    // call allocates them afresh (what every call did before `cpu::release_spare_buffers` existed).
    let variants: Vec<Spec> = args[5..]
        .iter()
        .map(|s| {
            let (name, fresh) = s.strip_prefix("fresh:").map_or((s.as_str(), false), |n| (n, true));
            let (isa, tiles, name) = match name.split_once(':') {
                Some((isa, rest)) => {
                    let (isa, tiles) = isa.split_once('.').map_or((isa, None), |(isa, t)| (isa, Some(t)));
                    let tiles = tiles.map(|t| {
                        let sizes: Vec<usize> = t.split('x').map(|x| x.parse().expect("a tile size")).collect();
                        match sizes[..] {
                            [q, k] => (q, k, None),
                            [q, k, band] => (q, k, Some(band)),
                            _ => panic!("tiles as BQxBK or BQxBKxBAND"),
                        }
                    });
                    (Some(isa.parse::<Isa>().expect("an ISA name")), tiles, rest)
                }
                None => (None, None, name),
            };
            Spec { var: name.parse().expect("variant name"), fresh, isa, tiles }
        })
        .collect();
    assert!(!variants.is_empty(), "{usage}");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let (q, k, v) = attn_core::fixtures::random_qkv::<f32>([1, 12, t, 64], 1);
    // The inputs start 64-byte aligned, as PyTorch's CPU allocator places tensors, plus
    // `CPU_LAB_OFFSET` floats (4: the 16-byte alignment of a large `Vec` from glibc's malloc).
    let offset = std::env::var("CPU_LAB_OFFSET").map_or(0, |s| s.parse::<usize>().expect("a float offset"));
    let placed: Vec<(Vec<f32>, usize)> = [&q, &k, &v].iter().map(|x| placed(x.as_slice().unwrap(), offset)).collect();
    let view = |x: usize| {
        let (buf, at) = &placed[x];
        ndarray::ArrayView4::from_shape([1, 12, t, 64], &buf[*at..*at + 12 * t * 64]).unwrap()
    };
    let (q, k, v) = (view(0), view(1), view(2));
    let opts = attn_kernels::cpu::Options::default();
    let env = |name: &str| std::env::var(name).ok().map(|s| s.parse::<usize>().expect("a tile size"));
    // The tiles of the variant's instruction set (`Tuning::for_isa`), or the environment's.
    let tuning = |isa: Isa| {
        let mut tuning = attn_kernels::cpu::Tuning::for_isa(isa);
        tuning.block_q = env("CPU_LAB_BQ").unwrap_or(tuning.block_q);
        tuning.block_k = env("CPU_LAB_BK").unwrap_or(tuning.block_k);
        tuning.score_cache_bytes = env("CPU_LAB_CACHE").unwrap_or(tuning.score_cache_bytes);
        tuning.band = env("CPU_LAB_BAND").unwrap_or(tuning.band);
        tuning
    };
    let cpu_time = threads == 1 && thread_cpu_s().is_some();
    // Seconds the call took: on the pool's only thread, its CPU time; else wall time.
    let run = |Spec { var, fresh, isa, tiles }: &Spec| -> f64 {
        if *fresh {
            attn_kernels::cpu::release_spare_buffers();
        }
        let isa = isa.unwrap_or(opts.isa).assert_supported();
        let mut tuning = tuning(isa);
        if let Some((block_q, block_k, band)) = *tiles {
            (tuning.block_q, tuning.block_k) = (block_q, block_k);
            tuning.band = band.unwrap_or(tuning.band);
        }
        let opts = attn_kernels::cpu::Options { isa, tuning, ..opts };
        pool.install(|| {
            let (wall, cpu) = (Instant::now(), thread_cpu_s());
            if backward {
                drop(attn_kernels::cpu::backward_with(var, q, k, v, v, &opts).unwrap());
            } else {
                drop(attn_kernels::cpu::forward_with(var, q, k, v, &opts).unwrap());
            }
            match (cpu_time, cpu, thread_cpu_s()) {
                (true, Some(a), Some(b)) => b - a,
                _ => wall.elapsed().as_secs_f64(),
            }
        })
    };
    variants.iter().for_each(|v| {
        run(v);
    });
    let mut times = vec![Vec::new(); variants.len()];
    for _ in 0..rounds {
        for (var, ts) in variants.iter().zip(&mut times) {
            ts.push(run(var));
        }
    }
    println!("{} time, T = {t}, {threads} thread(s), {rounds} rounds", if cpu_time { "thread CPU" } else { "wall" });
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    let name = |Spec { var, fresh, isa, tiles }: &Spec| {
        let band = |b: Option<usize>| b.map_or(String::new(), |b| format!("x{b}"));
        let tiles = tiles.map_or(String::new(), |(q, k, b)| format!(".{q}x{k}{}", band(b)));
        format!(
            "{}{}{var}",
            if *fresh { "fresh:" } else { "" },
            isa.map_or(String::new(), |isa| format!("{isa}{tiles}:"))
        )
    };
    for (var, ts) in variants.iter().zip(&times) {
        let ratio = median(ts.iter().zip(&times[0]).map(|(a, b)| a / b).collect());
        println!("{:>22}: median {:8.1} ms, {ratio:.3}x {}", name(var), median(ts.clone()) * 1e3, name(&variants[0]));
    }
}

/// A variant as the command line names it.
struct Spec {
    var: attn_core::Variant,
    /// `fresh:`: the buffer shelf emptied before each call.
    fresh: bool,
    /// `ISA:`: that instruction set instead of the detected one.
    isa: Option<Isa>,
    /// `ISA.BQxBK:` (or `ISA.BQxBKxBAND:`): those tiles (and query tiles a task runs in lockstep,
    /// `Tuning::band`) instead of the instruction set's.
    tiles: Option<(usize, usize, Option<usize>)>,
}

/// A copy of `x` in a buffer, and where it starts there: `offset` floats past a 64-byte boundary.
fn placed(x: &[f32], offset: usize) -> (Vec<f32>, usize) {
    let mut buf = vec![0.0f32; x.len() + 16 + offset];
    let at = (16 - (buf.as_ptr() as usize / 4) % 16) % 16 + offset;
    buf[at..at + x.len()].copy_from_slice(x);
    (buf, at)
}

/// This thread's CPU time in seconds (Linux: the first field of `/proc/thread-self/schedstat`, ns).
fn thread_cpu_s() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(text.split_whitespace().next()?.parse::<f64>().ok()? * 1e-9)
}
