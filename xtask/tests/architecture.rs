//! Checks that keep `ARCHITECTURE.md` true: the size of attn-core's API, the checks its invariants
//! name, and the lists of what a change touches. `cargo xtask test` runs them with the rest of the
//! suite.

mod common;

use common::{code_of, root};

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

/// The tracked Rust files under `dir` (relative), with their text.
fn rust_under(dir: &str) -> Vec<(std::path::PathBuf, String)> {
    common::text_files(&["rs"]).into_iter().filter(|(p, _)| p.starts_with(dir)).collect()
}

#[test]
fn only_the_trainer_knows_ranks() {
    // Invariant 7: no launcher variable or process group below the trainer.
    let words = ["ProcessGroup", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "\"RANK\"", "torchrun"];
    let mut seen = Vec::new();
    for krate in ["crates/attn-core/src", "crates/attn-kernels/src", "crates/gpt-model/src"] {
        for (p, text) in rust_under(krate) {
            let code = code_of(&text);
            seen.extend(words.iter().filter(|w| code.contains(*w)).map(|w| format!("{} names {w}", p.display())));
        }
    }
    assert!(seen.is_empty(), "{seen:?}");
}

#[test]
fn the_c10d_ffi_stays_in_dist_rs_and_the_launcher_uses_no_libtorch() {
    // Invariant 8.
    let files = rust_under("crates/trainer/src");
    assert!(!files.is_empty());
    for (p, text) in &files {
        let code = code_of(text);
        if !p.ends_with("dist.rs") {
            assert!(!code.contains("lssa_dist_"), "{} calls the c10d shim", p.display());
        }
        if p.ends_with("launch.rs") {
            for w in ["tch::", "use tch", "extern \"C\""] {
                assert!(!code.contains(w), "the launcher uses {w}");
            }
        }
    }
}

/// Decimal literals (`3.14`, not `{:.3}` or `x.0`) in `code`, outside string literals.
fn decimal_literals(code: &str) -> Vec<String> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            // Skip the string (escaped quotes included).
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            continue;
        }
        let starts =
            b[i].is_ascii_digit() && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b"_.:".contains(&b[i - 1])));
        if starts {
            let j = (i..b.len()).find(|&j| !(b[j].is_ascii_digit() || b[j] == b'_')).unwrap_or(b.len());
            if j + 1 < b.len() && b[j] == b'.' && b[j + 1].is_ascii_digit() {
                let end = (j + 1..b.len()).find(|&e| !b[e].is_ascii_digit()).unwrap_or(b.len());
                out.push(code[i..end].to_string());
                i = end;
                continue;
            }
            i = j;
        }
        i += 1;
    }
    out
}

#[test]
fn the_report_holds_no_number_of_its_own() {
    // Invariant 10: the report's numbers come from results and definitions; its code holds only
    // mathematical constants (the paper's downstream accuracies, the exception, are in downstream.rs).
    let sources = ["report", "doc.rs", "retrieval/report.rs", "newton/report.rs"];
    let files: Vec<_> = sources.iter().map(|s| rust_under(&format!("crates/experiments/src/{s}"))).collect();
    // A renamed or moved file must not turn the check into one that passes on nothing.
    for (s, f) in sources.iter().zip(&files) {
        assert!(!f.is_empty(), "crates/experiments/src/{s}: no tracked Rust file there (moved? update this check)");
    }
    let found = report_numbers(&files.into_iter().flatten().collect::<Vec<_>>());
    assert!(found.is_empty(), "numbers in the report's code: {found:?}");
}

/// The decimal literals of report code that are not constants of arithmetic or presentation
/// (halves, percentages, seconds per minute, the 95% t quantile, the smallest p-value printed as a
/// number), as `path: literal`; test files and test items are not report code.
fn report_numbers(files: &[(std::path::PathBuf, String)]) -> Vec<String> {
    let allowed = ["0.0", "1.0", "2.0", "0.5", "100.0", "60.0", "0.975", "0.001"];
    let mut found = Vec::new();
    for (p, text) in files {
        if p.ends_with("tests.rs") {
            continue;
        }
        found.extend(
            decimal_literals(&code_of(text))
                .into_iter()
                .filter(|l| !allowed.contains(&l.as_str()))
                .map(|l| format!("{}: {l}", p.display())),
        );
    }
    found
}

/// A planted threshold in report code is found, after a test module too; the same literal in a test
/// module or a tests.rs file is not report code.
#[test]
fn the_report_number_check_finds_a_planted_threshold() {
    let planted = "fn verdict(x: f64) -> bool { x > 0.5 }\n#[cfg(test)]\nmod tests { const T: f64 = 0.3; }\n\
                   fn late(x: f64) -> bool { x < 0.3 }";
    let files = [
        ("crates/experiments/src/report/planted.rs".into(), planted.to_string()),
        ("crates/experiments/src/report/tests.rs".into(), "const T: f64 = 0.3;".to_string()),
    ];
    assert_eq!(report_numbers(&files), ["crates/experiments/src/report/planted.rs: 0.3"]);
}

#[test]
fn the_literal_reader_finds_decimals_only() {
    assert_eq!(
        decimal_literals("let x = 3.25 + y.0 + 1e3; format!(\"{:.3} 2.5 \\\" 4.5\", 10.5); a1.5"),
        ["3.25", "10.5"]
    );
}

/// The tracked Rust files but these checks', which name what they look for.
fn checked_sources() -> Vec<(std::path::PathBuf, String)> {
    common::text_files(&["rs"]).into_iter().filter(|(p, _)| !p.starts_with("xtask/tests")).collect()
}

#[test]
fn link_flags_are_written_only_by_torch_build() {
    // Invariant 11.
    let writers: Vec<String> = checked_sources()
        .into_iter()
        .filter(|(_, text)| code_of(text).contains("rustc-link-"))
        .map(|(p, _)| p.display().to_string())
        .collect();
    assert!(writers == ["crates/torch-build/src/lib.rs"], "files that write link flags: {writers:?}");
}

#[test]
fn only_the_set_up_and_the_corpus_fetch_download() {
    // Invariant 12: the programs that reach the network (npm, pip download or install from an index,
    // curl, wget) are run only by the set-up (xtask) and the corpus fetch; `pip install --no-index`
    // of a local wheel is not a download.
    let mut found = Vec::new();
    for (p, text) in checked_sources() {
        let code = code_of(&text);
        let allowed = p.starts_with("xtask/src") || p.ends_with("corpus/fetch.rs");
        for w in ["\"npm\"", "\"curl\"", "\"wget\"", "\"download\"", "ureq::", "reqwest::"] {
            if code.contains(w) && !allowed {
                found.push(format!("{} runs {w}", p.display()));
            }
        }
        if code.contains("\"install\"") && !allowed && !code.contains("\"--no-index\"") {
            found.push(format!("{} runs pip install from an index", p.display()));
        }
    }
    assert!(found.is_empty(), "{found:?}");
}

/// The invariants of ARCHITECTURE.md: `(number, text)`.
fn invariants(architecture: &str) -> Vec<(usize, String)> {
    let section = architecture.split("## Invariants").nth(1).and_then(|s| s.split("\n## ").next()).unwrap_or("");
    let mut out: Vec<(usize, String)> = Vec::new();
    for line in section.lines() {
        let numbered = line.split_once(". **").and_then(|(n, _)| n.parse::<usize>().ok());
        match numbered {
            Some(n) => out.push((n, line.to_string())),
            None => {
                if let Some((_, text)) = out.last_mut() {
                    text.push('\n');
                    text.push_str(line);
                }
            }
        }
    }
    out
}

#[test]
fn every_invariant_names_a_check_that_exists() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let list = invariants(&arch);
    assert!(list.len() >= 14, "the invariant reader found {}", list.len());
    let sources: String = common::text_files(&["rs"]).into_iter().map(|(_, t)| t).collect::<Vec<_>>().join("\n");
    let py: String = common::text_files(&["py"]).into_iter().map(|(_, t)| t).collect::<Vec<_>>().join("\n");
    let mut problems = Vec::new();
    for (n, text) in &list {
        let lower = text.to_lowercase();
        if !lower.contains("checked by") || lower.contains("not mechanically checked") {
            problems.push(format!("invariant {n} names no check"));
            continue;
        }
        let checks = text.split("Checked by").skip(1).collect::<Vec<_>>().join(" ");
        let names: Vec<&str> = checks.split('`').skip(1).step_by(2).collect();
        let mut named = 0;
        for name in names {
            if name.contains('/') && !name.contains(' ') {
                named += 1;
                if !root().join(name).exists() {
                    problems.push(format!("invariant {n}: no file {name}"));
                }
            } else if name.matches('_').count() >= 2
                && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                named += 1;
                if !sources.contains(&format!("fn {name}(")) && !py.contains(&format!("def {name}(")) {
                    problems.push(format!("invariant {n}: no test `{name}`"));
                }
            }
        }
        if named == 0 {
            problems.push(format!("invariant {n}: its check names no test or file"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn every_crate_root_limits_function_length() {
    // Invariant 14: no function outside tests over 120 lines. Clippy's lint is off by default, so
    // every library and binary root turns it on outside `cfg(test)`, and clippy.toml sets the limit.
    let config = std::fs::read_to_string(root().join("clippy.toml")).expect("clippy.toml");
    assert!(config.lines().any(|l| l.replace(' ', "") == "too-many-lines-threshold=120"), "{config}");
    const ATTR: &str = "#![cfg_attr(not(test), warn(clippy::too_many_lines))]";
    let is_root = |p: &std::path::Path| {
        let s = p.to_string_lossy();
        let in_bin = s.contains("/src/bin/");
        s.ends_with("/src/lib.rs")
            || s.ends_with("/src/main.rs")
            || (in_bin && s.ends_with("/main.rs"))
            || (in_bin && p.parent().is_some_and(|d| d.ends_with("bin")))
    };
    let roots: Vec<_> = common::text_files(&["rs"]).into_iter().filter(|(p, _)| is_root(p)).collect();
    assert!(roots.len() >= 15, "the root finder found {}", roots.len());
    let missing: Vec<String> =
        roots.iter().filter(|(_, t)| !t.contains(ATTR)).map(|(p, _)| p.display().to_string()).collect();
    assert!(missing.is_empty(), "crate roots without `{ATTR}`: {missing:?}");
}

/// The bullet of ARCHITECTURE.md's extension points that starts with `**<title>**`.
fn extension_bullet(title: &str) -> String {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let start = arch.find(&format!("- **{title}**")).unwrap_or_else(|| panic!("no extension point `{title}`"));
    let rest = &arch[start + 2..];
    rest[..rest.find("\n- ").unwrap_or(rest.len())].to_string()
}

#[test]
fn every_post_training_kind_is_wired_where_architecture_says() {
    // (The match arms a new kind needs are measured by `cargo xtask extension-counts`; this checks
    // the wiring no compiler error points to.)
    let bullet = extension_bullet("A new experiment kind");
    for f in ["lib.rs", "bin/reproduce.rs", "build.rs", "status.rs"] {
        assert!(bullet.contains(&format!("`{f}`")), "ARCHITECTURE.md no longer names {f}");
    }
    let read = |p: &str| std::fs::read_to_string(root().join(p)).expect("an experiments source");
    let (lib, reproduce) = (read("crates/experiments/src/lib.rs"), read("crates/experiments/src/bin/reproduce.rs"));
    // (Test modules implement no kind, so the whole text is searched: a kind may follow a `cfg(test)` item.)
    let kinds: Vec<String> = common::text_files(&["rs"])
        .into_iter()
        .filter(|(p, t)| p.starts_with("crates/experiments/src") && t.contains("impl PostTraining for"))
        .map(|(p, _)| p.display().to_string())
        .collect();
    assert!(kinds.len() >= 3, "{kinds:?}");
    for file in kinds {
        let module =
            file.trim_start_matches("crates/experiments/src/").split(['/', '.']).next().unwrap_or("").to_string();
        assert!(lib.contains(&format!("pub mod {module};")), "{module} is not in lib.rs");
        assert!(
            reproduce.contains(&format!("experiments::{module}::")),
            "bin/reproduce.rs does not build {module}'s kind"
        );
    }
}
