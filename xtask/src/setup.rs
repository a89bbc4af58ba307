//! `cargo xtask setup`: provisions libtorch (PyTorch 2.11.0 from PyPI) for `tch`, idempotently.
//!
//! Layout:
//!
//! ```text
//! $LSSA_CACHE_DIR (default $XDG_CACHE_HOME/lssa, else ~/.cache/lssa)
//! └── torch-2.11.0-py3.11/            a Python venv holding torch==2.11.0 (4.6 GB, shared by clones)
//!     ├── .complete                   written last, holds the verified torch version
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

/// Makes sure libtorch 2.11.0 is available to the workspace; installs it into the cache if needed.
pub fn ensure(workspace: &Path, force: bool) -> Result<Torch> {
    let ours = workspace.join(".torch").join("libtorch");
    if let Some(user) = std::env::var_os("LIBTORCH").map(PathBuf::from)
        && !same_path(&user, &ours)
    {
        // The user's own libtorch: verify, never touch.
        check_version(&user).with_context(|| {
            format!(
                "LIBTORCH={} is set in the environment; unset it to let `cargo xtask setup` install PyTorch {TORCH_VERSION}",
                user.display()
            )
        })?;
        eprintln!("setup: using LIBTORCH={} (torch {TORCH_VERSION}, from the environment)", user.display());
        return Ok(Torch { root: user, python: None });
    }

    let python = find_python()?;
    let py_tag = python_tag(&python)?;
    let venv = cache_dir()?.join(format!("torch-{TORCH_VERSION}-py{py_tag}"));
    let stamp = venv.join(".complete");
    let torch_dir = venv.join("lib").join(format!("python{py_tag}")).join("site-packages").join("torch");

    if force && venv.exists() {
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
    } else {
        install(&python, &venv, &torch_dir)?;
        fs::write(&stamp, format!("{TORCH_VERSION}\n")).with_context(|| format!("writing {}", stamp.display()))?;
    }
    link(&torch_dir, &ours)?;
    Ok(Torch { root: ours, python: Some(venv.join("bin").join("python")) })
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
    let status =
        Command::new(&vpy).args(["-m", "pip", "install", "--no-input", &format!("torch=={TORCH_VERSION}")]).status();
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
    Ok(())
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

fn find_python() -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("LSSA_PYTHON") {
        Some(p) => vec![PathBuf::from(p)],
        None => vec!["python3".into(), "python".into()],
    };
    for c in &candidates {
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
