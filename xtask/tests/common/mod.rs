//! What the tidy and architecture tests share: the workspace root and the files git tracks.

#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

/// The tracked files (relative paths), or `None` outside a git checkout (a source tarball).
pub fn tracked() -> Option<Vec<PathBuf>> {
    let out = Command::new("git").arg("-C").arg(root()).args(["ls-files", "-z"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let list = String::from_utf8(out.stdout).expect("git prints UTF-8 paths here");
    Some(list.split('\0').filter(|p| !p.is_empty()).map(PathBuf::from).collect())
}

pub fn text_files(ext: &[&str]) -> Vec<(PathBuf, String)> {
    let Some(files) = tracked() else {
        eprintln!("tidy: not a git checkout, nothing to check");
        return Vec::new();
    };
    files
        .into_iter()
        .filter(|p| p.extension().and_then(|e| e.to_str()).is_some_and(|e| ext.contains(&e)))
        .filter_map(|p| std::fs::read_to_string(root().join(&p)).ok().map(|t| (p, t)))
        .collect()
}

/// The non-test code of a Rust file: what comes before its `#[cfg(test)]`, without `//` lines.
pub fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}
