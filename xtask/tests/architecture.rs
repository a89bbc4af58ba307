//! Checks that keep `ARCHITECTURE.md` true: the size of attn-core's API, the checks its invariants
//! name, and the lists of what a change touches. `cargo xtask test` runs them with the rest of the
//! suite.

mod common;

use common::root;

/// The items a library's `lib.rs` puts at its root: `pub mod`s, the names of `pub use`s and the
/// `pub` items it defines itself (`#[cfg]`-gated ones count too).
fn root_items(lib_rs: &str) -> Vec<String> {
    let mut items = Vec::new();
    let code: String = lib_rs.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    for statement in code.split(';') {
        let s = statement.trim();
        let Some(rest) = s.rfind("pub ").map(|i| &s[i + 4..]) else { continue };
        if let Some(path) = rest.strip_prefix("use ") {
            let names = match path.split_once('{') {
                Some((_, list)) => list.trim_end_matches('}').split(',').map(str::to_string).collect(),
                None => vec![path.rsplit("::").next().unwrap_or(path).to_string()],
            };
            items.extend(
                names.iter().map(|n| n.rsplit(" as ").next().unwrap_or(n).trim().to_string()).filter(|n| !n.is_empty()),
            );
        } else {
            let mut words = rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty());
            if let (Some(_kind), Some(name)) = (words.next(), words.next()) {
                items.push(name.to_string());
            }
        }
    }
    items
}

#[test]
fn attn_core_has_at_most_30_items_at_its_root() {
    let lib = std::fs::read_to_string(root().join("crates/attn-core/src/lib.rs")).expect("attn-core's lib.rs");
    let items = root_items(&lib);
    assert!(items.contains(&"Variant".to_string()) && items.contains(&"math".to_string()), "{items:?}");
    assert!(
        items.len() <= 30,
        "attn-core's root has {} items (at most 30; put the rest in modules): {items:?}",
        items.len()
    );
}

#[test]
fn the_root_item_reader_counts_modules_uses_and_definitions() {
    let lib = "//! pub use not::This;\npub mod a;\nmod hidden;\n#[cfg(feature = \"x\")]\npub mod b;\n\
               pub use a::{One, two as Two,\n    Three};\npub use b::Four;\npub const FIVE: u8 = 5;\n";
    assert_eq!(root_items(lib), ["a", "b", "One", "Two", "Three", "Four", "FIVE"]);
}
