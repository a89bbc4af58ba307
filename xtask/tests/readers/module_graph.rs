//! Readers of a crate's module structure, for the tidy checks on its module graph: the `use` items
//! and paths of a Rust text, the edges between a crate's top-level modules or between a `mod.rs`
//! and its children, the modules on a cycle, and what a crate root re-exports.

use std::path::{Path, PathBuf};

use crate::common::code_of;

/// The first identifier of each path `code` names after `prefix`: `prefix::a::B` gives `a`, a group
/// `prefix::{a::B, C as D}` gives `a` and `C`.
fn names_after(code: &str, prefix: &str) -> Vec<String> {
    let ident =
        |w: &str| -> String { w.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    code.match_indices(prefix)
        .flat_map(|(i, _)| {
            let rest = &code[i + prefix.len()..];
            match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or("").split(',').map(ident).collect(),
                None => vec![ident(rest)],
            }
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// The `use` items of `text` (outside comments and tests) under a first path segment:
/// `(public, segment, item)` for `[pub] use segment::{a, b as c}`, each item as the importing module
/// names it (`a`, `c`).
fn use_items(text: &str) -> Vec<(bool, String, String)> {
    let mut out = Vec::new();
    for statement in code_of(text).lines().collect::<Vec<_>>().join(" ").split(';') {
        let Some((before, path)) = statement.split_once("use ") else { continue };
        let Some((m, items)) = path.trim().split_once("::") else { continue };
        for item in items.trim_matches(|c| c == '{' || c == '}' || c == ' ').split(',') {
            let name = item.rsplit(" as ").next().unwrap_or("").trim();
            if !name.is_empty() {
                out.push((before.contains("pub"), m.to_string(), name.to_string()));
            }
        }
    }
    out
}

/// The edges `module -> module` between the top-level modules of one crate's library (`src/`, not
/// `src/bin`): a file of module `m` (`m.rs` or anything under `m/`) that names `crate::n::`, outside
/// comments and its `#[cfg(test)]` part.
pub fn module_edges(files: &[(PathBuf, String)], src: &Path) -> std::collections::BTreeSet<(String, String)> {
    let mut edges = std::collections::BTreeSet::new();
    for (p, text) in files {
        let Ok(rel) = p.strip_prefix(src) else { continue };
        let Some(first) = rel.components().next().and_then(|c| c.as_os_str().to_str()) else { continue };
        let module = first.trim_end_matches(".rs");
        if ["lib", "main", "bin"].contains(&module) {
            continue;
        }
        for other in names_after(&code_of(text), "crate::") {
            if other != module {
                edges.insert((module.to_string(), other));
            }
        }
    }
    edges
}

/// The modules of `edges` that lie on a cycle.
pub fn on_cycles(edges: &std::collections::BTreeSet<(String, String)>) -> Vec<String> {
    let reaches = |from: &str, to: &str| {
        let (mut seen, mut todo) = (std::collections::BTreeSet::new(), vec![from.to_string()]);
        while let Some(m) = todo.pop() {
            for (_, b) in edges.iter().filter(|(a, _)| *a == m) {
                if b == to {
                    return true;
                }
                if seen.insert(b.clone()) {
                    todo.push(b.clone());
                }
            }
        }
        false
    };
    let mut out: Vec<String> =
        edges.iter().filter(|(a, b)| reaches(b, a)).map(|(a, b)| format!("{a} <-> {b}")).collect();
    out.dedup();
    out
}

/// The items `text` defines itself at its top level (not what it re-exports): the names after
/// `struct`, `enum`, `union`, `trait`, `type`, `fn`, `const` or `static` opening a line of its code,
/// visibility and `const` / `unsafe` qualifiers aside.
pub fn defined_items(text: &str) -> std::collections::BTreeSet<String> {
    const KINDS: [&str; 8] = ["struct", "enum", "union", "trait", "type", "fn", "const", "static"];
    const QUALIFIERS: [&str; 6] = ["pub", "pub(crate)", "pub(super)", "unsafe", "async", "extern"];
    let code = code_of(text);
    code.lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let mut i = 0;
            // `const fn f` and `const unsafe fn f` are functions, `const X` a constant.
            while i + 1 < words.len()
                && (QUALIFIERS.contains(&words[i]) || (words[i] == "const" && matches!(words[i + 1], "fn" | "unsafe")))
            {
                i += 1;
            }
            let (kind, name) = (words.get(i)?, words.get(i + 1)?);
            let name: String = name.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            (KINDS.contains(kind) && !name.is_empty()).then_some(name)
        })
        .collect()
}

/// The edges `module -> module` between `dir/mod.rs` (the node `mod`) and its child modules (files
/// `dir/<m>.rs`), outside comments and the `#[cfg(test)]` part: a child names `super::<m>::`, or an
/// item that `mod.rs` re-exports from `<m>` through `super::` (an edge to `<m>`), or an item that
/// `mod.rs` defines itself (an edge to `mod`); `mod.rs` uses `<m>` in its own code or through a
/// private `use` (an edge from `mod`). A face re-exports and defines nothing its children import.
pub fn child_module_edges(mod_rs: &str, children: &[(String, String)]) -> std::collections::BTreeSet<(String, String)> {
    let names: Vec<&str> = children.iter().map(|(m, _)| m.as_str()).collect();
    let defined = defined_items(mod_rs);
    // `[pub[(crate)]] use <m>::{a, b};` or `use <m>::a;` in mod.rs: item -> m.
    let mut owner = std::collections::BTreeMap::new();
    let mut edges = std::collections::BTreeSet::new();
    for (public, m, item) in use_items(mod_rs).into_iter().filter(|(_, m, _)| names.contains(&m.as_str())) {
        if !public {
            edges.insert(("mod".to_string(), m.clone())); // a private `use`: mod.rs's own code uses it
        }
        owner.insert(item, m);
    }
    // mod.rs's own code (not its `use` and `mod` items) naming `<m>::`.
    for line in code_of(mod_rs).lines() {
        let item = line.trim_start();
        if ["use ", "pub use ", "pub(crate) use ", "mod ", "pub mod ", "pub(crate) mod ", "#["]
            .iter()
            .any(|p| item.starts_with(p))
        {
            continue;
        }
        for m in &names {
            if line
                .match_indices(&format!("{m}::"))
                .any(|(i, _)| !line[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            {
                edges.insert(("mod".to_string(), m.to_string()));
            }
        }
    }
    for (module, text) in children {
        // One line, so that a `use super::{...}` group over several lines is read whole.
        let code = code_of(text).lines().collect::<Vec<_>>().join(" ");
        for w in names_after(&code, "super::") {
            let target = if names.contains(&w.as_str()) {
                Some(w)
            } else if defined.contains(&w) {
                Some("mod".to_string())
            } else {
                owner.get(&w).cloned()
            };
            if let Some(t) = target.filter(|t| t != module) {
                edges.insert((module.clone(), t));
            }
        }
    }
    edges
}

/// The items `lib_rs` re-exports from its own modules (`pub use m::{A, B};`), each with its module.
pub fn root_re_exports(lib_rs: &str) -> std::collections::BTreeMap<String, String> {
    use_items(lib_rs)
        .into_iter()
        .filter(|(public, m, _)| {
            *public
                && !["crate", "self", "super"].contains(&m.as_str())
                && m.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
        .map(|(_, m, item)| (item, m))
        .collect()
}

/// The names `text` (outside comments and tests) imports through the crate root's re-exports
/// `owner`: `crate::X` or `crate::{X, ..}` where the root re-exports `X` from a module.
pub fn through_the_root(text: &str, owner: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    let code = code_of(text).lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join(" ");
    names_after(&code, "crate::").into_iter().filter(|w| owner.contains_key(w)).collect()
}
