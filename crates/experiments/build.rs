//! Links this crate's tests and binaries against the project's libtorch (see `torch-build`), and
//! computes `LSSA_NUMBERS_HASH`: a hash of every source file that can change a run's numbers, which
//! each run's `result.json` records and the runner compares before it reuses a result
//! (`runner::numbers_revision`).

use std::path::{Path, PathBuf};

/// What a trained model's losses depend on besides its config: the maths, the kernels, the model,
/// the training loop, data and evaluation, and the runner that drives them (its report code and the
/// CLI binaries do not change numbers, so editing them keeps the results). Relative to this crate.
const NUMBERS_SOURCES: [&str; 12] = [
    "../attn-core/src",
    "../attn-kernels/src",
    "../gpt-model/src",
    "../gpt-model/csrc",
    "../gpt-model/build.rs",
    "../trainer/src/data",
    "../trainer/src/train.rs",
    "../trainer/src/eval.rs",
    "../trainer/src/optim.rs",
    "../trainer/src/config.rs",
    "src/runner.rs",
    "src/sinks.rs",
];

fn main() {
    torch_build::link_libtorch();
    let mut files = Vec::new();
    for src in NUMBERS_SOURCES {
        println!("cargo:rerun-if-changed={src}");
        collect(Path::new(src), &mut files);
    }
    // The dependency versions (tch, the BPE trainer) can change numbers too.
    println!("cargo:rerun-if-changed=../../Cargo.lock");
    files.push(PathBuf::from("../../Cargo.lock"));
    files.sort();
    // FNV-1a over (path, contents): stable across machines and toolchains.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
        for b in f.to_string_lossy().bytes().chain([0]).chain(bytes) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=LSSA_NUMBERS_HASH={h:016x}");
}

fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(p)
            .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
            .map(|e| e.expect("directory entry").path())
            .collect();
        entries.sort();
        for e in entries {
            collect(&e, out);
        }
    } else if p.is_file() {
        out.push(p.to_path_buf());
    }
}
