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
//! - `warm`: the kernel modules of `check --kernels` and of the Python suite's CUDA tests compiled
//!   into the PTX cache on every core, ahead of those runs (with `--arch`, on a machine without a GPU).
//!
//! Results: a table on stdout, JSON to `--out` (default `docs/bench/cuda.json`), written after every
//! section and during `check` after every case (`"partial": true` until the run ends), so a run
//! stopped by its time limit leaves what it measured.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

mod check;
mod cli;
mod speed;
mod transcript;
mod warm;

use anyhow::{Result, bail};
use attn_kernels::cuda;
use clap::Parser;
use serde_json::{Value, json};

use cli::Args;
use transcript::{LOG, say};

fn main() -> Result<()> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() == 4 && a[1] == "memory-one" {
        return speed::memory_one(&a[2], a[3].parse()?); // internal: one measurement of `memory`, in its own process
    }
    let args = Args::parse();
    if args.what == "warm" && args.arch.is_some() {
        return warm::warm(&args); // NVRTC only
    }
    if !tch::Cuda::is_available() {
        bail!("no CUDA device visible to libtorch: run this on a GPU machine (see docs/GUIDE.md, CUDA kernels)");
    }
    say!("device: {}; NVRTC from {}", cuda::device_description()?, cuda::nvrtc_location()?.display());
    let mut out = Results { path: args.out.clone(), map: serde_json::Map::new() };
    out.map.insert("device".into(), json!(cuda::device_description()?));
    if args.what == "warm" {
        return warm::warm(&args);
    }
    let all = args.what == "all";
    let mut failed = false;
    if all || args.what == "check" {
        let mut rows = Vec::new();
        failed |= !check::check(&args, &mut rows, &mut |rows| out.save_with("check", rows))?;
        out.map.insert("check".into(), Value::Array(rows));
        out.save(true);
    }
    if all || args.what == "speed" {
        let mut rows = Vec::new();
        speed::speed(&args, &mut rows, &mut |rows| out.save_with("speed", rows))?;
        out.map.insert("speed".into(), Value::Array(rows));
        out.save(true);
        let mut rows = Vec::new();
        speed::memory(&mut rows)?;
        out.map.insert("memory".into(), Value::Array(rows));
        out.save(true);
    }
    if all || args.what == "model" {
        let mut rows = Vec::new();
        speed::model(&mut rows)?;
        out.map.insert("model".into(), Value::Array(rows));
    }
    out.save(false);
    let md = args.out.with_extension("md");
    let log = LOG.lock().unwrap_or_else(|e| e.into_inner()).clone();
    std::fs::write(&md, format!("# bench-cuda `{}`\n\n```text\n{log}```\n", args.what))?;
    say!("\nwrote {} and {}", args.out.display(), md.display());
    if failed {
        bail!("correctness check failed (rows marked FAIL)");
    }
    Ok(())
}

/// The JSON results and where they go.
struct Results {
    path: std::path::PathBuf,
    map: serde_json::Map<String, Value>,
}

impl Results {
    /// Writes the results so far (`"partial": true` while the run goes on) through a temporary file,
    /// so a run killed mid-write leaves the previous complete file. Best effort: a failed write is
    /// reported and the run goes on.
    fn save(&self, partial: bool) {
        self.write(&self.map, partial);
    }

    /// [`Results::save`] with `rows` as section `name`, for a section still running.
    fn save_with(&self, name: &str, rows: &[Value]) {
        let mut map = self.map.clone();
        map.insert(name.into(), Value::Array(rows.to_vec()));
        self.write(&map, true);
    }

    fn write(&self, map: &serde_json::Map<String, Value>, partial: bool) {
        let mut map = map.clone();
        map.insert("partial".into(), json!(partial));
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).ok();
        }
        let tmp = self.path.with_extension("json.tmp");
        let written = serde_json::to_string_pretty(&Value::Object(map))
            .map_err(std::io::Error::other)
            .and_then(|text| std::fs::write(&tmp, text))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            eprintln!("bench-cuda: cannot write {}: {e}", self.path.display());
        }
    }
}
