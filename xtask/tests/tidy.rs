//! House rules that can be checked mechanically, over the files git tracks (in the manner of
//! rust-analyzer's tidy tests). `cargo xtask test` runs them with the rest of the suite.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

/// The tracked files (relative paths), or `None` outside a git checkout (a source tarball).
fn tracked() -> Option<Vec<PathBuf>> {
    let out = Command::new("git").arg("-C").arg(root()).args(["ls-files", "-z"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let list = String::from_utf8(out.stdout).expect("git prints UTF-8 paths here");
    Some(list.split('\0').filter(|p| !p.is_empty()).map(PathBuf::from).collect())
}

fn text_files(ext: &[&str]) -> Vec<(PathBuf, String)> {
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

#[test]
fn gpt_model_has_unsafe_code_only_in_its_ffi_module() {
    // ARCHITECTURE.md: only `attention/fused.rs` (and the C++ in `csrc/`) holds gpt-model's FFI.
    let offenders: Vec<String> = text_files(&["rs"])
        .into_iter()
        .filter(|(p, _)| p.starts_with("crates/gpt-model/src") && !p.ends_with("attention/fused.rs"))
        .flat_map(|(p, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, l)| {
                    let code = l.split("//").next().unwrap_or("");
                    code.contains("unsafe ") || code.contains("unsafe{")
                })
                .map(|(i, _)| format!("{}:{}", p.display(), i + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(offenders.is_empty(), "unsafe outside gpt-model's attention/fused.rs: {offenders:?}");
}

#[test]
fn every_todo_names_its_issue() {
    let marker = |l: &str| ["TODO", "FIXME", "XXX"].iter().any(|m| l.contains(m));
    let names_issue = |l: &str| {
        l.split(|c: char| !c.is_ascii_alphanumeric() && c != '#')
            .collect::<Vec<_>>()
            .windows(2)
            .any(|w| (w[0].eq_ignore_ascii_case("issue") && w[1].parse::<u32>().is_ok()) || w[1].starts_with('#'))
    };
    let offenders: Vec<String> = text_files(&["rs", "py", "md", "toml", "sh", "cu", "cuh", "cpp", "h"])
        .into_iter()
        .filter(|(p, _)| !p.ends_with("tidy.rs"))
        .flat_map(|(p, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, l)| marker(l) && !names_issue(l))
                .map(|(i, _)| format!("{}:{}", p.display(), i + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(offenders.is_empty(), "TODO / FIXME / XXX without an issue (write `TODO(issue 12)`): {offenders:?}");
}

/// The targets of the Markdown links `[text](target)` in `text` (images included).
fn link_targets(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        out.push(rest[..end].split_whitespace().next().unwrap_or(""));
        rest = &rest[end..];
    }
    out
}

#[test]
fn no_link_leaves_the_repository_and_every_local_link_resolves() {
    let root = root().canonicalize().unwrap();
    let mut offenders = Vec::new();
    // The sessions' reference directory beside the clone, spelt so this file does not name it.
    let shared = ["..", "shared", ""].join("/");
    for (p, text) in text_files(&["md", "rs", "py", "toml"]) {
        if text.contains(&shared) {
            offenders.push(format!("{}: names {shared}, which users never see", p.display()));
        }
        if p.extension().is_none_or(|e| e != "md") {
            continue;
        }
        for target in link_targets(&text) {
            let path = target.split('#').next().unwrap_or("");
            if path.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let dir = root.join(&p).parent().unwrap().to_path_buf();
            match dir.join(path).canonicalize() {
                Ok(abs) if abs.starts_with(&root) => {}
                Ok(abs) => {
                    offenders.push(format!("{}: {target} leaves the repository ({})", p.display(), abs.display()))
                }
                Err(_) => offenders.push(format!("{}: {target} does not exist", p.display())),
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}

#[test]
fn the_link_reader_finds_links() {
    assert_eq!(link_targets("see [a](docs/A.md#x) and ![b](figures/b.png \"t\")."), ["docs/A.md#x", "figures/b.png"]);
}
