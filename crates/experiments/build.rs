//! Links this crate's tests and binaries against the project's libtorch (see `torch-build`), and
//! computes `LSSA_NUMBERS_HASH`: a hash of every source file that can change a run's numbers, which
//! each run's `result.json` records and the runner compares before it reuses a result
//! (`runner::numbers_revision`).

use std::path::{Path, PathBuf};

/// What a trained model's losses depend on besides its config: the maths, the kernels, the model,
/// the training loop, data and evaluation, and the runner that drives them (its report code and the
/// CLI binaries do not change numbers, so editing them keeps the results). Relative to this crate.
const NUMBERS_SOURCES: [&str; 15] = [
    "../attn-core/src",
    "../attn-kernels/src",
    "../gpt-model/src",
    "../gpt-model/csrc",
    "../gpt-model/build.rs",
    "../trainer/src/data",
    "../trainer/src/train",
    "../trainer/src/state.rs",
    "../trainer/src/eval.rs",
    "../trainer/src/optim.rs",
    "../trainer/csrc/optim_shim.cpp",
    "../trainer/src/config.rs",
    "src/runner.rs",
    "src/runner",
    "src/sinks.rs",
];

/// Files under [`NUMBERS_SOURCES`] that no run computes with: the CPU emulator of the CUDA kernels
/// (tests and kernel development only) and the kernel lab's notes. (The lab's CUDA sources stay
/// hashed: `LSSA_CUDA_KERNEL` can train with them.)
const NUMBERS_EXCLUDED: [&str; 3] =
    ["../attn-kernels/src/cuda/emu.rs", "../attn-kernels/src/cuda/emu.h", "../attn-kernels/src/cuda/LAB.md"];

/// What the retrieval and Newton's-law experiments' numbers depend on beyond [`NUMBERS_SOURCES`]
/// (their results record both hashes). The report code of each (`src/newton/report.rs`,
/// `src/retrieval/report.rs`) is left out: the stored results are each seed's fit data or answers,
/// and the report computes exponents, accuracies, intervals and verdicts from them when it renders,
/// so editing it keeps the trained models.
const TASK_SOURCES: [&str; 2] = ["src/retrieval", "src/newton"];

/// Files (or folders) under [`TASK_SOURCES`] that cannot change a task's stored numbers: the report
/// code and its tests.
const TASK_EXCLUDED: [&str; 3] = ["src/newton/report.rs", "src/retrieval/report.rs", "src/retrieval/report"];

fn main() {
    torch_build::link_libtorch();
    // The dependency versions (tch, the BPE trainer) can change numbers too.
    let numbers = hash(NUMBERS_SOURCES.iter().copied().chain(["../../Cargo.lock"]), &NUMBERS_EXCLUDED);
    println!("cargo:rustc-env=LSSA_NUMBERS_HASH={numbers:016x}");
    println!("cargo:rustc-env=LSSA_TASK_HASH={:016x}", hash(TASK_SOURCES.iter().copied(), &TASK_EXCLUDED));
}

/// FNV-1a over (path, contents) of every file under `sources` but those in or under `excluded`, in
/// path order: stable across machines and toolchains.
fn hash<'a>(sources: impl Iterator<Item = &'a str>, excluded: &[&str]) -> u64 {
    let mut files = Vec::new();
    for src in sources {
        println!("cargo:rerun-if-changed={src}");
        collect(Path::new(src), &mut files);
    }
    files.retain(|f| !excluded.iter().any(|x| f.starts_with(x)));
    files.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
        for b in f.to_string_lossy().bytes().chain([0]).chain(bytes) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
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
    } else {
        // A listed source that does not exist would silently stop covering the code that computes
        // numbers (a file renamed, a module moved): fail the build instead.
        panic!("{} is listed as a source of numbers but does not exist: update build.rs", p.display());
    }
}
