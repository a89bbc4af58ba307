//! Checks that keep `ARCHITECTURE.md` true: the size of attn-core's API, the checks its invariants
//! name, and the lists of what a change touches. `cargo xtask test` runs them with the rest of the
//! suite.

use std::path::{Path, PathBuf};

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
    let lib = std::fs::read_to_string(root().join("crates/attn-core/src/lib.rs")).expect("crates/attn-core/src/lib.rs");
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
fn rust_under(dir: &str) -> Vec<(PathBuf, String)> {
    common::text_files(&["rs"]).into_iter().filter(|(p, _)| p.starts_with(dir)).collect()
}

/// The libraries below the trainer, which know no rank (invariant 7).
const BELOW_THE_TRAINER: [&str; 3] = ["crates/attn-core/src", "crates/attn-kernels/src", "crates/gpt-model/src"];

/// The files (`path names WORD`) of the crates below the trainer whose code names a launcher
/// variable, a process group or torchrun.
fn rank_words(files: &[(PathBuf, String)]) -> Vec<String> {
    let words = ["ProcessGroup", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "\"RANK\"", "torchrun"];
    let mut seen = Vec::new();
    for (p, text) in files.iter().filter(|(p, _)| BELOW_THE_TRAINER.iter().any(|dir| p.starts_with(dir))) {
        let code = code_of(text);
        seen.extend(words.iter().filter(|w| code.contains(*w)).map(|w| format!("{} names {w}", p.display())));
    }
    seen
}

#[test]
fn only_the_trainer_knows_ranks() {
    // Invariant 7: no launcher variable or process group below the trainer.
    let files = common::text_files(&["rs"]);
    for dir in BELOW_THE_TRAINER {
        assert!(files.iter().any(|(p, _)| p.starts_with(dir)), "no Rust file under {dir} (moved? update this check)");
    }
    let seen = rank_words(&files);
    assert!(seen.is_empty(), "{seen:?}");
}

#[test]
fn the_rank_check_catches_a_launcher_variable_below_the_trainer() {
    let file = |p: &str, t: &str| (PathBuf::from(p), t.to_string());
    let mut files = vec![
        file("crates/trainer/src/dist.rs", "fn world() -> usize { var(\"WORLD_SIZE\") }\n"),
        file(
            "crates/gpt-model/src/model.rs",
            "// not a ProcessGroup: one process\n#[cfg(test)]\nmod t { const R: &str = \"RANK\"; }\n",
        ),
    ];
    assert!(rank_words(&files).is_empty(), "the trainer, comments and tests may name them");
    files.push(file("crates/attn-kernels/src/cuda/device.rs", "let r = std::env::var(\"LOCAL_RANK\");\n"));
    assert_eq!(rank_words(&files), ["crates/attn-kernels/src/cuda/device.rs names LOCAL_RANK"]);
}

/// What breaks invariant 8 in the trainer's files: the c10d shim's functions (`lssa_dist_*`) named
/// outside `dist.rs`, libtorch or a C declaration in the launcher (`launch.rs`).
fn c10d_problems(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (p, text) in files {
        let code = code_of(text);
        if !p.ends_with("dist.rs") && code.contains("lssa_dist_") {
            problems.push(format!("{} calls the c10d shim", p.display()));
        }
        if p.ends_with("launch.rs") {
            problems.extend(
                ["tch::", "use tch", "extern \"C\""]
                    .iter()
                    .filter(|w| code.contains(*w))
                    .map(|w| format!("the launcher uses {w}")),
            );
        }
    }
    problems
}

#[test]
fn the_c10d_ffi_stays_in_dist_rs_and_the_launcher_uses_no_libtorch() {
    // Invariant 8.
    let files = rust_under("crates/trainer/src");
    for f in ["crates/trainer/src/dist.rs", "crates/trainer/src/launch.rs"] {
        assert!(files.iter().any(|(p, _)| p == Path::new(f)), "no {f} (moved? update this check)");
    }
    let problems = c10d_problems(&files);
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn the_c10d_check_catches_the_shim_outside_dist_rs_and_libtorch_in_the_launcher() {
    let file = |p: &str, t: &str| (PathBuf::from(p), t.to_string());
    let tree = |train: &str, launch: &str| {
        vec![
            file("crates/trainer/src/dist.rs", "unsafe extern \"C\" { fn lssa_dist_barrier(); }\n"),
            file("crates/trainer/src/train/run.rs", train),
            file("crates/trainer/src/launch.rs", launch),
        ]
    };
    let (train, launch) = ("fn step() { dist::barrier() }\n", "use std::process::Command;\n// not tch::Tensor\n");
    assert!(c10d_problems(&tree(train, launch)).is_empty());
    let shim = c10d_problems(&tree("fn step() { unsafe { lssa_dist_barrier() } }\n", launch));
    assert_eq!(shim, ["crates/trainer/src/train/run.rs calls the c10d shim"]);
    let torch = c10d_problems(&tree(train, "fn go() { let t = tch::Tensor::zeros([1], o); }\n"));
    assert_eq!(torch, ["the launcher uses tch::"]);
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
fn report_numbers(files: &[(PathBuf, String)]) -> Vec<String> {
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
fn checked_sources() -> Vec<(PathBuf, String)> {
    common::text_files(&["rs"]).into_iter().filter(|(p, _)| !p.starts_with("xtask/tests")).collect()
}

/// What breaks invariant 11: a file other than torch-build's library that writes `rustc-link-`
/// flags, or torch-build's library writing none (moved, and the check would pass on nothing).
fn link_flag_problems(files: &[(PathBuf, String)]) -> Vec<String> {
    const TORCH_BUILD: &str = "crates/torch-build/src/lib.rs";
    let writers: Vec<&PathBuf> =
        files.iter().filter(|(_, text)| code_of(text).contains("rustc-link-")).map(|(p, _)| p).collect();
    let mut problems: Vec<String> = writers
        .iter()
        .filter(|p| **p != Path::new(TORCH_BUILD))
        .map(|p| format!("{} writes link flags", p.display()))
        .collect();
    if !writers.iter().any(|p| *p == Path::new(TORCH_BUILD)) {
        problems.push(format!("{TORCH_BUILD} writes no link flag (moved? update this check)"));
    }
    problems
}

#[test]
fn link_flags_are_written_only_by_torch_build() {
    // Invariant 11.
    let problems = link_flag_problems(&checked_sources());
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn the_link_flag_check_catches_a_second_writer_and_a_missing_torch_build() {
    let file = |p: &str, t: &str| (PathBuf::from(p), t.to_string());
    let torch_build = file("crates/torch-build/src/lib.rs", "println!(\"cargo:rustc-link-lib=torch\");\n");
    let quiet = file("crates/gpt-model/build.rs", "// torch_build writes the rustc-link- flags\nfn main() {}\n");
    assert!(link_flag_problems(&[torch_build.clone(), quiet.clone()]).is_empty());
    let second = file("crates/trainer/build.rs", "fn main() { println!(\"cargo:rustc-link-search=/opt\"); }\n");
    assert_eq!(
        link_flag_problems(&[torch_build, quiet.clone(), second]),
        ["crates/trainer/build.rs writes link flags"]
    );
    assert_eq!(
        link_flag_problems(&[quiet]),
        ["crates/torch-build/src/lib.rs writes no link flag (moved? update this check)"]
    );
}

/// What breaks invariant 12: a file outside `xtask/src` and the corpus fetch that runs a program
/// that reaches the network (npm, pip download or install from an index, curl, wget) or names an
/// HTTP client; `pip install --no-index` of a local wheel is not a download.
fn downloads(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (p, text) in files {
        let code = code_of(text);
        if p.starts_with("xtask/src") || p.ends_with("corpus/fetch.rs") {
            continue;
        }
        for w in ["\"npm\"", "\"curl\"", "\"wget\"", "\"download\"", "ureq::", "reqwest::"] {
            if code.contains(w) {
                found.push(format!("{} runs {w}", p.display()));
            }
        }
        if code.contains("\"install\"") && !code.contains("\"--no-index\"") {
            found.push(format!("{} runs pip install from an index", p.display()));
        }
    }
    found
}

#[test]
fn only_the_set_up_and_the_corpus_fetch_download() {
    // Invariant 12.
    let found = downloads(&checked_sources());
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn the_download_check_catches_a_download_outside_the_set_up() {
    let file = |p: &str, t: &str| (PathBuf::from(p), t.to_string());
    let mut files = vec![
        file("xtask/src/setup.rs", "Command::new(\"curl\").arg(url);\nCommand::new(\"pip\").args([\"install\", w]);\n"),
        file("crates/trainer/src/data/corpus/fetch.rs", "let r = ureq::get(url).call();\n"),
        file("crates/experiments/src/env.rs", "Command::new(\"pip\").args([\"install\", \"--no-index\", w]);\n"),
    ];
    assert!(downloads(&files).is_empty(), "the set-up, the corpus fetch and a local wheel may");
    files.push(file("crates/experiments/src/weights.rs", "fn get() { Command::new(\"wget\").arg(URL); }\n"));
    assert_eq!(downloads(&files), ["crates/experiments/src/weights.rs runs \"wget\""]);
    files.pop();
    files.push(file("crates/lssa-py/build.rs", "Command::new(\"pip\").args([\"install\", \"torch\"]);\n"));
    assert_eq!(downloads(&files), ["crates/lssa-py/build.rs runs pip install from an index"]);
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

/// The invariants of `arch` that name no check, or name a test that neither the Rust `sources` nor
/// the Python `py` define, or a file (a path with `/`) for which `exists` is false.
fn invariant_problems(arch: &str, sources: &str, py: &str, exists: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut problems = Vec::new();
    for (n, text) in &invariants(arch) {
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
                if !exists(name) {
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
    problems
}

#[test]
fn every_invariant_names_a_check_that_exists() {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let list = invariants(&arch);
    assert!(list.len() >= 14, "the invariant reader found {}", list.len());
    let sources: String = common::text_files(&["rs"]).into_iter().map(|(_, t)| t).collect::<Vec<_>>().join("\n");
    let py: String = common::text_files(&["py"]).into_iter().map(|(_, t)| t).collect::<Vec<_>>().join("\n");
    let problems = invariant_problems(&arch, &sources, &py, &|name| root().join(name).exists());
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_invariant_check_catches_an_invariant_whose_check_is_missing() {
    let arch = |second: &str| {
        format!(
            "# A\n\n## Invariants\n\n1. **One.** Text.\n   Checked by: `the_first_check_here` (`xtask/tests/a.rs`).\n\
             2. **Two.** Text.\n   {second}\n\n## Next\n\n3. **Not an invariant.**\n"
        )
    };
    let sources = "fn the_first_check_here() {}\nfn the_second_check_here() {}\n";
    let py = "def test_the_third_check():\n    pass\n";
    let exists = |p: &str| p == "xtask/tests/a.rs";
    let problems = |second: &str| invariant_problems(&arch(second), sources, py, &exists);
    assert!(problems("Checked by `the_second_check_here` and `test_the_third_check`.").is_empty());
    assert_eq!(problems("Checked by `the_gone_check_here`."), ["invariant 2: no test `the_gone_check_here`"]);
    assert_eq!(problems("Checked by `crates/gone/tests/x.rs`."), ["invariant 2: no file crates/gone/tests/x.rs"]);
    assert_eq!(problems("Not mechanically checked; checked by review."), ["invariant 2 names no check"]);
    assert_eq!(problems("Checked by review."), ["invariant 2: its check names no test or file"]);
}

/// Whether `p` is a crate root: a library's or binary's `lib.rs` / `main.rs`, or a file or a
/// directory's `main.rs` under `src/bin`.
fn is_crate_root(p: &Path) -> bool {
    let s = p.to_string_lossy();
    let in_bin = s.contains("/src/bin/");
    s.ends_with("/src/lib.rs")
        || s.ends_with("/src/main.rs")
        || (in_bin && s.ends_with("/main.rs"))
        || (in_bin && p.parent().is_some_and(|d| d.ends_with("bin")))
}

/// The lint every crate root turns on outside tests, so that clippy measures function length.
const TOO_MANY_LINES: &str = "#![cfg_attr(not(test), warn(clippy::too_many_lines))]";

/// What breaks invariant 14: `clippy.toml` without the 120-line threshold, or a crate root among
/// `files` without [`TOO_MANY_LINES`].
fn function_length_problems(clippy_toml: &str, files: &[(PathBuf, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    if !clippy_toml.lines().any(|l| l.replace(' ', "") == "too-many-lines-threshold=120") {
        problems.push(format!("clippy.toml does not set `too-many-lines-threshold = 120`:\n{clippy_toml}"));
    }
    problems.extend(
        files
            .iter()
            .filter(|(p, t)| is_crate_root(p) && !t.contains(TOO_MANY_LINES))
            .map(|(p, _)| format!("{} lacks `{TOO_MANY_LINES}`", p.display())),
    );
    problems
}

#[test]
fn every_crate_root_limits_function_length() {
    // Invariant 14: no function outside tests over 120 lines. Clippy's lint is off by default, so
    // every library and binary root turns it on outside `cfg(test)`, and clippy.toml sets the limit.
    let config = std::fs::read_to_string(root().join("clippy.toml")).expect("clippy.toml");
    let files = common::text_files(&["rs"]);
    let roots = files.iter().filter(|(p, _)| is_crate_root(p)).count();
    assert!(roots >= 15, "the root finder found {roots}");
    let problems = function_length_problems(&config, &files);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_function_length_check_catches_a_root_without_the_lint_and_a_changed_threshold() {
    let file = |p: &str, t: &str| (PathBuf::from(p), t.to_string());
    let config = "too-many-lines-threshold = 120\n";
    let mut files = vec![
        file("crates/a/src/lib.rs", &format!("//! A.\n{TOO_MANY_LINES}\npub mod b;\n")),
        file("crates/a/src/bin/tool/main.rs", &format!("{TOO_MANY_LINES}\nfn main() {{}}\n")),
        file("crates/a/src/b.rs", "pub fn f() {}\n"),
        file("crates/a/src/bin/tool/args.rs", "pub fn parse() {}\n"),
    ];
    assert!(function_length_problems(config, &files).is_empty(), "modules are not roots");
    assert_eq!(function_length_problems("too-many-lines-threshold = 200\n", &files).len(), 1);
    files.push(file("crates/a/src/bin/quick.rs", "fn main() {}\n"));
    assert_eq!(
        function_length_problems(config, &files),
        [format!("crates/a/src/bin/quick.rs lacks `{TOO_MANY_LINES}`")]
    );
}

/// The bullet of ARCHITECTURE.md's extension points that starts with `**<title>**`.
fn extension_bullet(title: &str) -> String {
    let arch = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let start = arch.find(&format!("- **{title}**")).unwrap_or_else(|| panic!("no extension point `{title}`"));
    let rest = &arch[start + 2..];
    rest[..rest.find("\n- ").unwrap_or(rest.len())].to_string()
}

/// The modules of experiments' library (`src/<module>.rs` or `src/<module>/`) that implement
/// `PostTraining`. Test modules implement no kind, so the whole text is searched: a kind may follow a
/// `cfg(test)` item.
fn post_training_kinds(files: &[(PathBuf, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(p, t)| p.starts_with("crates/experiments/src") && t.contains("impl PostTraining for"))
        .filter_map(|(p, _)| p.strip_prefix("crates/experiments/src").ok()?.iter().next()?.to_str().map(str::to_string))
        .map(|first| first.trim_end_matches(".rs").to_string())
        .collect()
}

/// The wiring a new experiment kind needs and `bullet` (ARCHITECTURE.md's extension point) promises,
/// missing for a kind among `files`: the files the bullet names, `pub mod` in lib.rs, and its build
/// in bin/reproduce.rs. Either of those two absent from `files` is an error, not a pass.
fn unwired_kinds(bullet: &str, files: &[(PathBuf, String)]) -> Vec<String> {
    let mut problems: Vec<String> = ["lib.rs", "bin/reproduce.rs", "build.rs", "status.rs"]
        .iter()
        .filter(|f| !bullet.contains(&format!("`{f}`")))
        .map(|f| format!("ARCHITECTURE.md no longer names {f}"))
        .collect();
    let read = |p: &str| {
        files.iter().find(|(f, _)| f == Path::new(p)).map(|(_, t)| t.as_str()).unwrap_or_else(|| panic!("no {p}"))
    };
    let (lib, reproduce) = (read("crates/experiments/src/lib.rs"), read("crates/experiments/src/bin/reproduce.rs"));
    for module in post_training_kinds(files) {
        if !lib.contains(&format!("pub mod {module};")) {
            problems.push(format!("{module} is not in lib.rs"));
        }
        if !reproduce.contains(&format!("experiments::{module}::")) {
            problems.push(format!("bin/reproduce.rs does not build {module}'s kind"));
        }
    }
    problems
}

#[test]
fn every_post_training_kind_is_wired_where_architecture_says() {
    // (The match arms a new kind needs are measured by `cargo xtask extension-counts`; this checks
    // the wiring no compiler error points to.)
    let files = rust_under("crates/experiments/src");
    let kinds = post_training_kinds(&files);
    assert!(kinds.len() >= 3, "{kinds:?}");
    let problems = unwired_kinds(&extension_bullet("A new experiment kind"), &files);
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn the_wiring_check_catches_a_kind_that_reproduce_does_not_build() {
    let file = |p: &str, t: &str| (PathBuf::from(p), t.to_string());
    let bullet = "**A new experiment kind**: its module, `lib.rs`, `bin/reproduce.rs`, `build.rs` and `status.rs`.";
    let mut files = vec![
        file("crates/experiments/src/lib.rs", "pub mod alpha;\npub mod beta;\n"),
        file("crates/experiments/src/bin/reproduce.rs", "use experiments::alpha::Alpha;\n"),
        file("crates/experiments/src/alpha.rs", "impl PostTraining for Alpha {}\n"),
        file("crates/experiments/src/beta/mod.rs", "pub mod kind;\n"),
    ];
    assert!(unwired_kinds(bullet, &files).is_empty());
    files.push(file("crates/experiments/src/beta/kind.rs", "impl PostTraining for Beta {}\n"));
    assert_eq!(unwired_kinds(bullet, &files), ["bin/reproduce.rs does not build beta's kind"]);
    assert_eq!(
        unwired_kinds(&bullet.replace("`status.rs`", "status"), &files[..4]),
        ["ARCHITECTURE.md no longer names status.rs"]
    );
}
