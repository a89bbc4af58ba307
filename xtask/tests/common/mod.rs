//! What the tidy and architecture tests share: the workspace root and the files git tracks.

#![allow(dead_code)] // each test crate uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

/// The source files (relative paths): those git tracks, or outside a git checkout (a source
/// tarball) every file under the root but build outputs, data and hidden directories, so that no
/// check passes for want of files.
pub fn tracked() -> Vec<PathBuf> {
    let out = Command::new("git").arg("-C").arg(root()).args(["ls-files", "-z"]).output();
    match out {
        Ok(out) if out.status.success() => {
            let list = String::from_utf8(out.stdout).expect("git prints UTF-8 paths here");
            list.split('\0').filter(|p| !p.is_empty()).map(PathBuf::from).collect()
        }
        _ => {
            let mut files = Vec::new();
            walk(&root(), Path::new(""), &mut files);
            files
        }
    }
}

/// The files under `root/dir`, skipping build outputs (`target`), caches, hidden directories and the
/// root's `runs` and `data` (what the reproduction and the set-up write).
fn walk(root: &Path, dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let path = dir.join(&name);
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let output = ["target", "__pycache__"].contains(&name.as_str())
                || (dir.as_os_str().is_empty() && ["runs", "data"].contains(&name.as_str()));
            if !(name.starts_with('.') || output) {
                walk(root, &path, files);
            }
        } else {
            files.push(path);
        }
    }
}

pub fn text_files(ext: &[&str]) -> Vec<(PathBuf, String)> {
    tracked()
        .into_iter()
        .filter(|p| p.extension().and_then(|e| e.to_str()).is_some_and(|e| ext.contains(&e)))
        .filter_map(|p| std::fs::read_to_string(root().join(&p)).ok().map(|t| (p, t)))
        .collect()
}

/// The non-test code of a Rust file, without `//` lines: every item under `#[cfg(test)]` (a test
/// module, a test-only function, `use` or `impl`) is left out, and the code after it kept.
pub fn code_of(text: &str) -> String {
    const ATTR: &str = "#[cfg(test)]";
    let mut code = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(ATTR) {
        code.push_str(&rest[..at]);
        rest = &rest[at + ATTR.len()..];
        rest = &rest[item_len(rest)..];
    }
    code.push_str(rest);
    code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The length of the item at the start of `text` (after an attribute): up to its `;` or through the
/// `}` that closes its first `{`, skipping string and character literals and comments. All of
/// `text` when it never closes.
fn item_len(text: &str) -> usize {
    let b = text.as_bytes();
    let (mut i, mut depth) = (0, 0usize);
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                i += text[i..].find('\n').unwrap_or(text.len() - i);
                continue;
            }
            b'"' => {
                // A string literal (a raw string's hashes are not needed: it ends at the first `"`
                // that no backslash escapes, which holds for every raw string in this tree).
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            // A character literal ('{', '\'', '\\'), not a lifetime ('a).
            b'\'' if b.get(i + 2) == Some(&b'\'') && b.get(i + 1) != Some(&b'\\') => i += 2,
            b'\'' if b.get(i + 1) == Some(&b'\\') => {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
            }
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::code_of;

    /// A planted file: code before, between and after test-only items must stay; the items under
    /// `#[cfg(test)]` (with braces in their strings and characters) must go.
    #[test]
    fn code_of_keeps_what_follows_a_test_module_and_drops_every_test_item() {
        let text = "fn before() {}\n#[cfg(test)]\nuse std::fmt;\nfn between() {}\n#[cfg(test)]\nmod tests {\n    \
                    fn t() { let s = \"}}{\"; let c = '}'; let q = '\\''; let l: &'static str = \"\"; }\n}\n\
                    // a comment line\nfn after() { let x = 1; }\n#[cfg(test)]\nfn helper() -> u8 { b'{' }\nstruct Last;";
        let code = code_of(text);
        for kept in ["fn before()", "fn between()", "fn after()", "let x = 1;", "struct Last;"] {
            assert!(code.contains(kept), "`{kept}` missing from:\n{code}");
        }
        for dropped in ["use std::fmt", "mod tests", "fn t()", "fn helper", "a comment line"] {
            assert!(!code.contains(dropped), "`{dropped}` kept in:\n{code}");
        }
    }
}
