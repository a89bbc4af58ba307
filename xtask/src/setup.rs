//! `cargo xtask setup`: provisions libtorch (PyTorch 2.11.0 from PyPI) for `tch`, idempotently.
//!
//! Layout:
//!
//! ```text
//! $LSSA_CACHE_DIR (default $XDG_CACHE_HOME/lssa, else ~/.cache/lssa)
//! └── torch-2.11.0-py3.11/            a Python venv holding torch==2.11.0 (4.6 GB, shared by clones)
//!     ├── .complete                   written last, holds the verified torch version
//!     ├── .python-tools               the pinned test tools and `eval` extra it got (the Python package's tests)
//!     └── lib/python3.11/site-packages/torch/{lib,include,version.py}
//! <workspace>/.torch/libtorch  ->  …/site-packages/torch   (what `.cargo/config.toml` points LIBTORCH at)
//! ```
//!
//! Invariants:
//!
//! - The work-tree link is created only after the venv is complete and its version verified, so a
//!   build never sees a half-installed torch.
//! - A venv directory without `.complete` is a crashed or interrupted install: it is deleted and redone.
//! - A `.complete` venv whose torch is not 2.11.0 is an error (somebody changed it by hand): we refuse
//!   to guess and say how to fix it.
//! - A user-provided `LIBTORCH` (in the environment, not ours) is only verified, never modified.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The PyTorch release `tch =0.24.0` is built against (shared/ENV.md). Change both together.
pub const TORCH_VERSION: &str = "2.11.0";

/// Result of a successful set-up.
#[derive(Debug)]
pub struct Torch {
    /// The `torch` package directory (what LIBTORCH points at).
    pub root: PathBuf,
    /// The Python interpreter of the venv, when the torch is ours.
    pub python: Option<PathBuf>,
}

/// Where the set-up looks and what it may use; [`Options::from_env`] reads the documented variables.
#[derive(Debug, Clone)]
pub struct Options {
    /// The work tree that gets the `.torch/libtorch` link.
    pub workspace: PathBuf,
    /// The per-user cache root holding the venv.
    pub cache: PathBuf,
    /// Python interpreters to try for creating the venv, in order.
    pub pythons: Vec<PathBuf>,
    /// A libtorch named by the user (`LIBTORCH` in the environment, when it is not our own link).
    pub user_libtorch: Option<PathBuf>,
    /// Reinstall even when the cache is complete.
    pub force: bool,
}

impl Options {
    /// Options from `LSSA_CACHE_DIR`/`XDG_CACHE_HOME`/`HOME`, `LSSA_PYTHON` and `LIBTORCH`.
    pub fn from_env(workspace: &Path, force: bool) -> Result<Self> {
        let ours = workspace.join(".torch").join("libtorch");
        // `.cargo/config.toml` sets LIBTORCH to our link for every cargo-run process, this one included;
        // anything else came from the user.
        let user_libtorch = std::env::var_os("LIBTORCH").map(PathBuf::from).filter(|p| !same_path(p, &ours));
        let pythons = match std::env::var_os("LSSA_PYTHON") {
            Some(p) => vec![PathBuf::from(p)],
            None => vec!["python3".into(), "python".into()],
        };
        Ok(Self { workspace: workspace.to_path_buf(), cache: cache_dir()?, pythons, user_libtorch, force })
    }
}

/// Makes sure libtorch 2.11.0 is available to the workspace; installs it into the cache if needed.
pub fn ensure(opts: &Options) -> Result<Torch> {
    let ours = opts.workspace.join(".torch").join("libtorch");
    if let Some(user) = &opts.user_libtorch {
        // The user's own libtorch: verify, never touch.
        check_version(user).with_context(|| {
            format!(
                "LIBTORCH={} is set in the environment; unset it to let `cargo xtask setup` install PyTorch {TORCH_VERSION}",
                user.display()
            )
        })?;
        eprintln!("setup: using LIBTORCH={} (torch {TORCH_VERSION}, from the environment)", user.display());
        return Ok(Torch { root: user.clone(), python: None });
    }

    let python = find_python(&opts.pythons)?;
    let py_tag = python_tag(&python)?;
    let venv = opts.cache.join(format!("torch-{TORCH_VERSION}-py{py_tag}"));
    let stamp = venv.join(".complete");
    let torch_dir = venv.join("lib").join(format!("python{py_tag}")).join("site-packages").join("torch");

    if opts.force && venv.exists() {
        eprintln!("setup: --force: removing {}", venv.display());
        fs::remove_dir_all(&venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    if stamp.exists() {
        check_version(&torch_dir).map_err(|e| {
            anyhow::anyhow!(
                "{e:#}; the cache at {} is not what the set-up installed: delete it (`rm -rf {}`) or run `cargo xtask setup --force`",
                venv.display(),
                venv.display()
            )
        })?;
        eprintln!("setup: torch {TORCH_VERSION} already installed in {} (no download)", venv.display());
        ensure_nccl_headers(&venv);
    } else {
        install(&python, &venv, &torch_dir)?;
        fs::write(&stamp, format!("{TORCH_VERSION}\n")).with_context(|| format!("writing {}", stamp.display()))?;
    }
    ensure_python_tools(&venv, &python_packages(&opts.workspace));
    link(&torch_dir, &ours)?;
    Ok(Torch { root: ours, python: Some(venv.join("bin").join("python")) })
}

/// A venv of its own with PyTorch `version` (any release on PyPI) and the [`python_packages`], for running
/// the Python package's tests against another torch than the workspace's (`cargo xtask pytest --torch
/// <version>`): the wheel reads tensors through pointers and links no libtorch, so one build serves
/// any torch. Installed once into the cache (`torch-<version>-py<tag>-pytest`); returns its Python.
pub fn python_with_torch(opts: &Options, version: &str) -> Result<PathBuf> {
    if version.is_empty() || !version.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '+') {
        bail!("--torch takes a PyTorch version such as 2.15.0, got {version:?}");
    }
    let python = find_python(&opts.pythons)?;
    let venv = opts.cache.join(format!("torch-{version}-py{}-pytest", python_tag(&python)?));
    let stamp = venv.join(".complete");
    let vpy = venv.join("bin").join("python");
    let tools = python_packages(&opts.workspace);
    if !stamp.exists() {
        if venv.exists() {
            fs::remove_dir_all(&venv)
                .with_context(|| format!("removing the interrupted install {}", venv.display()))?;
        }
        eprintln!("setup: creating venv {} (torch {version} and the test tools; several GB)", venv.display());
        let ok = Command::new(&python).args(["-m", "venv"]).arg(&venv).status().is_ok_and(|s| s.success())
            && Command::new(&vpy)
                .args(["-m", "pip", "install", "--no-input", &format!("torch=={version}")])
                .args(&tools)
                .status()
                .is_ok_and(|s| s.success());
        if !ok {
            let _ = fs::remove_dir_all(&venv);
            bail!("installing torch=={version} and {} into a venv failed (see pip's output above)", tools.join(" "));
        }
        fs::write(&stamp, format!("{version}\n")).with_context(|| format!("writing {}", stamp.display()))?;
        let _ = fs::write(venv.join(PYTHON_TOOLS_MARKER), format!("{}\n", tools.join(" ")));
    }
    // A venv made before the eval extra existed gets it once, as the set-up's own venv does.
    ensure_python_tools(&venv, &tools);
    Ok(vpy)
}

fn install(python: &Path, venv: &Path, torch_dir: &Path) -> Result<()> {
    if venv.exists() {
        eprintln!("setup: {} is an interrupted install (no .complete stamp): removing it", venv.display());
        fs::remove_dir_all(venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    fs::create_dir_all(venv.parent().unwrap()).with_context(|| format!("creating {}", venv.display()))?;
    eprintln!("setup: creating venv {} (torch {TORCH_VERSION}: ~2.6 GB download, ~4.6 GB on disk)", venv.display());
    let fail = |what: &str| -> anyhow::Error {
        let _ = fs::remove_dir_all(venv);
        anyhow::anyhow!("{what}; nothing was left installed. Fix the cause above and run `cargo xtask setup` again")
    };
    let ok = Command::new(python).args(["-m", "venv"]).arg(venv).status().map(|s| s.success()).unwrap_or(false);
    if !ok {
        return Err(fail(&format!(
            "`{} -m venv` failed: install the venv module (Debian: apt-get install python3-venv)",
            python.display()
        )));
    }
    let vpy = venv.join("bin").join("python");
    // The two header wheels let the trainer compile libtorch's NCCL process group (multi-GPU); a few MB.
    let status = Command::new(&vpy)
        .args(["-m", "pip", "install", "--no-input", &format!("torch=={TORCH_VERSION}")])
        .args(NCCL_HEADER_WHEELS)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            return Err(fail(&format!(
                "`pip install torch=={TORCH_VERSION}` failed ({s}): check access to PyPI and free disk space (~5 GB)"
            )));
        }
        Err(e) => return Err(fail(&format!("could not run pip in the venv: {e}"))),
    }
    if let Err(e) = check_version(torch_dir) {
        return Err(fail(&format!("{e:#}")));
    }
    let _ = fs::write(venv.join(NCCL_MARKER), "installed with torch\n");
    Ok(())
}

/// CUDA's `crt` and `cccl` headers, which the NCCL process group's header needs and the torch wheel
/// lacks (the trainer's build compiles NCCL support only when they are present).
pub const NCCL_HEADER_WHEELS: [&str; 2] = ["nvidia-cuda-crt==13.0.88", "nvidia-cuda-cccl==13.0.85"];
/// Marks a venv whose header wheels were installed (or tried), so later runs never call pip.
const NCCL_MARKER: &str = ".nccl-headers";

/// Adds the NCCL header wheels to a venv installed before the set-up asked for them: one attempt,
/// a warning (not an error) on failure, since only multi-GPU training needs them.
fn ensure_nccl_headers(venv: &Path) {
    if venv.join(NCCL_MARKER).exists() {
        return;
    }
    eprintln!("setup: adding CUDA's crt/cccl headers to the venv (for the NCCL process group; a few MB)");
    let vpy = venv.join("bin").join("python");
    let ok = Command::new(&vpy)
        .args(["-m", "pip", "install", "--no-input"])
        .args(NCCL_HEADER_WHEELS)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        let _ = fs::write(venv.join(NCCL_MARKER), "added\n");
    } else {
        eprintln!(
            "setup: warning: `pip install {}` failed: the trainer will build without NCCL (CPU and single-GPU training are unaffected); run `cargo xtask setup` again to retry",
            NCCL_HEADER_WHEELS.join(" ")
        );
    }
}

/// The Python packages the test suite needs beside torch, pinned: maturin builds the `lssa` wheel
/// (crates/lssa-py), pytest runs its tests, numpy reads the token shards in `examples/`, transformers
/// is what `lssa.hf` plugs into (its tests build tiny Llama models from configs, nothing downloaded).
pub const PYTHON_TOOLS: [&str; 4] = ["maturin==1.16.0", "pytest==9.2.0", "numpy==2.4.6", "transformers==5.24.0"];
/// Holds the list of Python packages a venv got ([`python_packages`]); a different list (a newer pin)
/// installs again.
const PYTHON_TOOLS_MARKER: &str = ".python-tools";

/// The Python package's `pyproject.toml`, whose `eval` extra the set-up installs.
pub const PYPROJECT: &str = "crates/lssa-py/pyproject.toml";

/// What the set-up installs beside torch: [`PYTHON_TOOLS`], then the requirements of the `eval` extra of
/// the Python package ([`PYPROJECT`]: lm-evaluation-harness, with which `tests/test_export.py` scores an
/// exported model against `trainer eval`), read from there so that the extra is the one list of them.
/// Without the file (a workspace that is not this repository's), the tools alone.
pub fn python_packages(workspace: &Path) -> Vec<String> {
    let mut all: Vec<String> = PYTHON_TOOLS.iter().map(|t| t.to_string()).collect();
    if let Ok(text) = fs::read_to_string(workspace.join(PYPROJECT)) {
        all.extend(extra_requirements(&text, "eval"));
    }
    all
}

/// The requirement strings of `[project.optional-dependencies]`'s `extra = [...]` in a pyproject.toml
/// (one array of double-quoted strings, on one line or several); empty when there is no such extra.
fn extra_requirements(pyproject: &str, extra: &str) -> Vec<String> {
    let mut section = false;
    let mut array: Option<String> = None;
    for line in pyproject.lines() {
        let line = line.split_once('#').map_or(line, |(code, _)| code).trim();
        if let Some(acc) = array.as_mut() {
            acc.push_str(line);
        } else if line.starts_with('[') && !line.starts_with("[[") && line.ends_with(']') && !line.contains('=') {
            section = line == "[project.optional-dependencies]";
            continue;
        } else if section
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == extra
        {
            array = Some(value.trim().to_string());
        }
        if array.as_deref().is_some_and(closes_array) {
            break;
        }
    }
    let Some(array) = array else { return Vec::new() };
    array.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

/// Whether `text` (an array's text so far) holds its closing `]`: one outside the quoted strings, whose
/// own brackets (`"lm_eval[hf]==0.4.13"`) do not count.
fn closes_array(text: &str) -> bool {
    let mut quoted = false;
    text.chars().any(|c| {
        if c == '"' {
            quoted = !quoted;
        }
        c == ']' && !quoted
    })
}

/// Installs `packages` ([`python_packages`]) into the venv once (again when the list changes); a
/// second run with the same list calls no pip. A failure is a warning here; `cargo xtask test` then
/// stops at the Python tests, saying what is missing.
fn ensure_python_tools(venv: &Path, packages: &[String]) {
    let want = packages.join(" ");
    if fs::read_to_string(venv.join(PYTHON_TOOLS_MARKER)).is_ok_and(|got| got.trim() == want) {
        return;
    }
    eprintln!("setup: adding {want} to the venv (the Python package's build and tests)");
    let ok = Command::new(venv.join("bin").join("python"))
        .args(["-m", "pip", "install", "--no-input"])
        .args(packages)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        let _ = fs::write(venv.join(PYTHON_TOOLS_MARKER), format!("{want}\n"));
    } else {
        eprintln!(
            "setup: warning: `pip install {want}` failed: `cargo xtask test` cannot build and test the Python package \
             (crates/lssa-py) until it succeeds; run `cargo xtask setup` again to retry"
        );
    }
}

/// Reads the torch version from a libtorch directory (pip layout `version.py`, or the C++ zip's
/// `build-version`) and checks it is [`TORCH_VERSION`].
pub fn check_version(root: &Path) -> Result<()> {
    let version = if let Ok(text) = fs::read_to_string(root.join("version.py")) {
        text.lines()
            .find_map(|l| l.strip_prefix("__version__"))
            .map(|rest| rest.trim_start_matches([' ', '=', ':']).trim_start_matches("str").trim())
            .map(|v| v.trim_matches(|c| c == '\'' || c == '"' || c == ' ').to_string())
    } else {
        fs::read_to_string(root.join("build-version")).ok().map(|v| v.trim().to_string())
    };
    let Some(version) = version else {
        bail!("no torch found at {} (neither version.py nor build-version)", root.display());
    };
    // "2.11.0" or "2.11.0+cu130": the local part does not matter to tch.
    if version.split('+').next() != Some(TORCH_VERSION) {
        bail!("torch at {} is version {version}, but tch 0.24.0 needs exactly {TORCH_VERSION}", root.display());
    }
    if !root.join("lib").join("libtorch_cpu.so").exists() {
        bail!("torch {version} at {} has no lib/libtorch_cpu.so", root.display());
    }
    Ok(())
}

fn find_python(candidates: &[PathBuf]) -> Result<PathBuf> {
    for c in candidates {
        let ok = Command::new(c).arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
        if ok {
            return Ok(c.clone());
        }
    }
    bail!(
        "no Python found (tried {}): install Python >= 3.10 with pip and venv (Debian: apt-get install python3 python3-venv python3-pip), or set LSSA_PYTHON",
        candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
    )
}

fn python_tag(python: &Path) -> Result<String> {
    let out = Command::new(python)
        .args(["-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!("{} does not run a simple script: is it a working Python 3?", python.display());
    }
    let tag = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let minor: u32 = tag.strip_prefix("3.").and_then(|m| m.parse().ok()).unwrap_or(0);
    if minor < 10 {
        bail!(
            "{} is Python {tag}; torch {TORCH_VERSION} needs Python >= 3.10 (set LSSA_PYTHON to a newer one)",
            python.display()
        );
    }
    Ok(tag)
}

/// The per-user cache root: `$LSSA_CACHE_DIR`, else `$XDG_CACHE_HOME/lssa`, else `~/.cache/lssa`.
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("LSSA_CACHE_DIR") {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(d).join("lssa"));
    }
    match std::env::var_os("HOME") {
        Some(h) => Ok(PathBuf::from(h).join(".cache").join("lssa")),
        None => bail!(
            "neither LSSA_CACHE_DIR, XDG_CACHE_HOME nor HOME is set: set LSSA_CACHE_DIR to a directory for the torch venv"
        ),
    }
}

/// Points `<workspace>/.torch/libtorch` at `target`, replacing an old link atomically.
fn link(target: &Path, link: &Path) -> Result<()> {
    let dir = link.parent().unwrap();
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if fs::read_link(link).ok().as_deref() == Some(target) {
        return Ok(());
    }
    let tmp = dir.join(format!(".libtorch.tmp{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).with_context(|| format!("linking {}", tmp.display()))?;
    fs::rename(&tmp, link).with_context(|| format!("replacing {}", link.display()))?;
    eprintln!("setup: {} -> {}", link.display(), target.display());
    Ok(())
}

fn same_path(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

#[cfg(test)]
mod tests {
    //! The set-up's failure modes, exercised with a fake Python whose `pip` does what each test needs,
    //! so they run offline in milliseconds.

    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A scratch directory unique to this test, and the lock that runs these tests one at a time: they
    /// write fake executables and run them, and a `fork` in a parallel test while a script is still
    /// open for writing makes its `exec` fail with ETXTBSY ("Text file busy"), seen as "no Python".
    fn scratch(name: &str) -> (PathBuf, std::sync::MutexGuard<'static, ()>) {
        static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let d = std::env::temp_dir().join(format!("xtask-setup-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        (d, guard)
    }

    fn write_exe(path: &Path, body: &str) {
        fs::write(path, body).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A fake `python3` whose venv's `pip install` runs `pip_body` (bash, `$SP` = site-packages).
    fn fake_python(dir: &Path, pip_body: &str) -> PathBuf {
        let py = dir.join("python3");
        let venv_python =
            format!("#!/usr/bin/env bash\nSP=\"$(dirname \"$0\")/../lib/python3.11/site-packages\"\n{pip_body}\n");
        fs::write(dir.join("venv-python"), venv_python).unwrap();
        write_exe(
            &py,
            &format!(
                "#!/usr/bin/env bash\ncase \"$1\" in\n  --version) echo 'Python 3.11.0';;\n  -c) echo 3.11;;\n  \
                 -m) mkdir -p \"$3/bin\" && cp {} \"$3/bin/python\" && chmod +x \"$3/bin/python\";;\nesac\n",
                dir.join("venv-python").display()
            ),
        );
        py
    }

    fn fake_torch(version: &str) -> String {
        format!(
            "mkdir -p \"$SP/torch/lib\" && echo \"__version__ = '{version}'\" > \"$SP/torch/version.py\" && touch \"$SP/torch/lib/libtorch_cpu.so\""
        )
    }

    fn options(dir: &Path, python: PathBuf) -> Options {
        Options {
            workspace: dir.join("ws"),
            cache: dir.join("cache"),
            pythons: vec![python],
            user_libtorch: None,
            force: false,
        }
    }

    #[test]
    fn installs_once_then_reuses_the_cache() {
        let (dir, _serial) = scratch("reuse");
        let opts = options(&dir, fake_python(&dir, &fake_torch("2.11.0+cu130")));
        let torch = ensure(&opts).unwrap();
        let venv = dir.join("cache/torch-2.11.0-py3.11");
        assert!(venv.join(".complete").exists());
        assert_eq!(fs::read_link(&torch.root).unwrap(), venv.join("lib/python3.11/site-packages/torch"));
        // A second run must not call pip: make pip fail loudly and check nothing notices.
        write_exe(&venv.join("bin/python"), "#!/usr/bin/env bash\nexit 7\n");
        ensure(&opts).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_older_venv_gets_the_nccl_headers_once_and_a_failure_is_only_a_warning() {
        let (dir, _serial) = scratch("headers");
        let opts = options(&dir, fake_python(&dir, &fake_torch("2.11.0+cu130")));
        ensure(&opts).unwrap();
        let venv = dir.join("cache/torch-2.11.0-py3.11");
        assert!(venv.join(NCCL_MARKER).exists(), "a fresh install asks for the headers with torch");
        // A venv from before the headers: pip is called for them alone; its failure is not fatal.
        fs::remove_file(venv.join(NCCL_MARKER)).unwrap();
        let log = dir.join("pip-args");
        write_exe(
            &venv.join("bin/python"),
            &format!("#!/usr/bin/env bash\necho \"$@\" >> {}\nexit 7\n", log.display()),
        );
        ensure(&opts).unwrap();
        let args = fs::read_to_string(&log).unwrap();
        assert!(args.contains("nvidia-cuda-crt==13.0.88") && !args.contains("torch=="), "{args}");
        assert!(!venv.join(NCCL_MARKER).exists(), "a failed attempt is retried next time");
        // Success marks the venv; the next run does not call pip again.
        write_exe(
            &venv.join("bin/python"),
            &format!("#!/usr/bin/env bash\necho \"$@\" >> {}\nexit 0\n", log.display()),
        );
        ensure(&opts).unwrap();
        assert!(venv.join(NCCL_MARKER).exists());
        let calls = fs::read_to_string(&log).unwrap().lines().count();
        ensure(&opts).unwrap();
        assert_eq!(fs::read_to_string(&log).unwrap().lines().count(), calls);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_python_tools_are_installed_once_and_again_when_their_pins_change() {
        let (dir, _serial) = scratch("tools");
        let opts = options(&dir, fake_python(&dir, &fake_torch("2.11.0+cu130")));
        ensure(&opts).unwrap();
        let venv = dir.join("cache/torch-2.11.0-py3.11");
        let marker = venv.join(PYTHON_TOOLS_MARKER);
        assert_eq!(fs::read_to_string(&marker).unwrap().trim(), PYTHON_TOOLS.join(" "));
        // Installed: no pip call. Another pin list in the marker: one call, for the tools alone.
        let log = dir.join("pip-args");
        write_exe(
            &venv.join("bin/python"),
            &format!("#!/usr/bin/env bash\necho \"$@\" >> {}\nexit 0\n", log.display()),
        );
        ensure(&opts).unwrap();
        assert!(!log.exists(), "no pip call when the tools are there");
        fs::write(&marker, "maturin==0.1\n").unwrap();
        ensure(&opts).unwrap();
        let args = fs::read_to_string(&log).unwrap();
        assert_eq!(args.lines().count(), 1, "{args}");
        assert!(args.contains("maturin==1.16.0") && args.contains("pytest==") && !args.contains("torch=="), "{args}");
        assert_eq!(fs::read_to_string(&marker).unwrap().trim(), PYTHON_TOOLS.join(" "));
        // A failing pip is a warning; the marker is left as it was, so the next run tries again.
        fs::write(&marker, "old\n").unwrap();
        write_exe(&venv.join("bin/python"), "#!/usr/bin/env bash\nexit 3\n");
        ensure(&opts).unwrap();
        assert_eq!(fs::read_to_string(&marker).unwrap(), "old\n");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_eval_extra_is_read_from_the_pyproject_and_installed_with_the_tools() {
        // The repository's own file: lm-evaluation-harness, pinned.
        let ours = python_packages(&crate::workspace_root());
        assert_eq!(&ours[..PYTHON_TOOLS.len()], &PYTHON_TOOLS.map(String::from)[..]);
        assert!(ours[PYTHON_TOOLS.len()..].iter().any(|r| r.starts_with("lm_eval==")), "{ours:?}");
        // The layouts TOML allows: one line or several, comments, brackets inside the strings.
        let text = "[project]\neval = [\"not-this\"]\n\n[project.optional-dependencies]\nhf = [\"transformers>=5.0\"]\n\
                    # a comment\neval = [\n    \"lm_eval[hf]==0.4.13\",  # the harness\n    \"accelerate==1.15.0\",\n]\n\
                    test = [\"pytest\"]\n";
        assert_eq!(extra_requirements(text, "eval"), ["lm_eval[hf]==0.4.13", "accelerate==1.15.0"]);
        assert_eq!(extra_requirements(text, "hf"), ["transformers>=5.0"]);
        assert!(extra_requirements(text, "docs").is_empty());
        // A workspace with such a file: one pip call for the tools and the extra, then none.
        let (dir, _serial) = scratch("eval-extra");
        let opts = options(&dir, fake_python(&dir, &fake_torch("2.11.0")));
        fs::create_dir_all(opts.workspace.join("crates/lssa-py")).unwrap();
        fs::write(opts.workspace.join(PYPROJECT), text).unwrap();
        ensure(&opts).unwrap();
        let venv = dir.join("cache/torch-2.11.0-py3.11");
        let log = dir.join("pip-args");
        write_exe(
            &venv.join("bin/python"),
            &format!("#!/usr/bin/env bash\necho \"$@\" >> {}\nexit 0\n", log.display()),
        );
        ensure(&opts).unwrap();
        assert!(!log.exists(), "installed at the first set-up, with the tools");
        let marker = fs::read_to_string(venv.join(PYTHON_TOOLS_MARKER)).unwrap();
        assert!(marker.contains("transformers==5.24.0 lm_eval[hf]==0.4.13 accelerate==1.15.0"), "{marker}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_python_is_one_clear_error() {
        let (dir, _serial) = scratch("nopython");
        let err = ensure(&options(&dir, dir.join("does-not-exist/python3"))).unwrap_err().to_string();
        assert!(err.contains("no Python found") && err.contains("LSSA_PYTHON"), "{err}");
        assert!(!dir.join("cache").exists() && !dir.join("ws/.torch").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pip_failure_leaves_nothing_half_installed() {
        let (dir, _serial) = scratch("pipfail");
        let opts = options(&dir, fake_python(&dir, "echo 'ERROR: No matching distribution' >&2; exit 1"));
        let err = format!("{:#}", ensure(&opts).unwrap_err());
        assert!(err.contains("pip install torch==2.11.0") && err.contains("nothing was left installed"), "{err}");
        assert!(!dir.join("cache/torch-2.11.0-py3.11").exists(), "the failed venv must be removed");
        assert!(!dir.join("ws/.torch/libtorch").exists(), "no link to a failed install");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wrong_version_from_pip_is_refused_and_removed() {
        let (dir, _serial) = scratch("pipwrong");
        let opts = options(&dir, fake_python(&dir, &fake_torch("2.10.0")));
        let err = format!("{:#}", ensure(&opts).unwrap_err());
        assert!(err.contains("version 2.10.0") && err.contains("2.11.0"), "{err}");
        assert!(!dir.join("cache/torch-2.11.0-py3.11").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wrong_version_already_in_cache_says_what_to_do() {
        let (dir, _serial) = scratch("cachewrong");
        let opts = options(&dir, fake_python(&dir, &fake_torch("2.11.0")));
        ensure(&opts).unwrap();
        let version_py = dir.join("cache/torch-2.11.0-py3.11/lib/python3.11/site-packages/torch/version.py");
        fs::write(&version_py, "__version__ = '2.9.1'\n").unwrap();
        let err = format!("{:#}", ensure(&opts).unwrap_err());
        assert!(err.contains("version 2.9.1") && err.contains("--force"), "{err}");
        // --force repairs it.
        ensure(&Options { force: true, ..opts }).unwrap();
        assert!(fs::read_to_string(&version_py).unwrap().contains("2.11.0"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn interrupted_install_is_redone() {
        let (dir, _serial) = scratch("interrupted");
        let opts = options(&dir, fake_python(&dir, &fake_torch("2.11.0")));
        // A venv directory without its stamp, as a killed install leaves it.
        fs::create_dir_all(dir.join("cache/torch-2.11.0-py3.11/lib/junk")).unwrap();
        ensure(&opts).unwrap();
        assert!(dir.join("cache/torch-2.11.0-py3.11/.complete").exists());
        assert!(!dir.join("cache/torch-2.11.0-py3.11/lib/junk").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn user_libtorch_is_verified_not_modified() {
        let (dir, _serial) = scratch("user");
        let user = dir.join("libtorch");
        fs::create_dir_all(user.join("lib")).unwrap();
        fs::write(user.join("build-version"), "2.4.0+cpu\n").unwrap();
        fs::write(user.join("lib/libtorch_cpu.so"), "").unwrap();
        let opts = Options { user_libtorch: Some(user.clone()), ..options(&dir, dir.join("nopython")) };
        let err = format!("{:#}", ensure(&opts).unwrap_err());
        assert!(err.contains("LIBTORCH=") && err.contains("2.4.0"), "{err}");
        fs::write(user.join("build-version"), "2.11.0\n").unwrap();
        assert_eq!(ensure(&opts).unwrap().root, user);
        assert!(!dir.join("cache").exists() && !dir.join("ws").exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
