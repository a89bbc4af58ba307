//! `cargo xtask extension-counts`: what the compiler demands of an extension, measured by adding one.
//!
//! ARCHITECTURE.md's extension points say how many places a new built-in activation, CUDA kernel
//! version or experiment kind touches. Those counts are not written by hand: for each, this copies
//! the workspace's sources into `target/extension-scratch`, adds a dummy variant to the enum
//! ([`PLANTS`]), and runs `cargo check` until it passes, each round filling every `match` the
//! compiler reports as non-exhaustive with the arm it suggests (`todo!()`), so that the crates
//! downstream are checked in turn. The errors of all rounds are the places; the report is compared
//! with the bullet of ARCHITECTURE.md that states them. `cargo xtask test` runs it after the tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

/// A dummy variant added to an enum: `insert` after the first occurrence of `after` in `file`.
pub struct Plant {
    /// The extension point's title in ARCHITECTURE.md (`- **<title>**`).
    pub title: &'static str,
    pub edits: &'static [(&'static str, &'static str, &'static str)],
}

/// The extensions measured: file, anchor, inserted text.
pub const PLANTS: [Plant; 3] = [
    Plant {
        title: "A new built-in activation",
        edits: &[(
            "crates/attn-core/src/activation.rs",
            "        Identity => \"identity\",\n",
            "        Identity => \"identity\",\n        /// A dummy.\n        Dummy => \"dummy\",\n",
        )],
    },
    Plant {
        title: "A new CUDA kernel version",
        edits: &[
            (
                "crates/attn-kernels/src/cuda/kernel.rs",
                "        V10 => \"v10\",\n",
                "        V10 => \"v10\",\n        /// A dummy.\n        V11 => \"v11\",\n",
            ),
            (
                "crates/attn-kernels/src/cuda/plan.rs",
                "        BwdDq7 => \"lssa_bwd_dq7\",\n",
                "        BwdDq7 => \"lssa_bwd_dq7\",\n        Dummy => \"lssa_dummy\",\n",
            ),
        ],
    },
    Plant {
        title: "A new experiment kind",
        edits: &[(
            "crates/experiments/src/spec.rs",
            "    Downstream,\n}",
            "    Downstream,\n    /// A dummy.\n    Dummy,\n}",
        )],
    },
];

/// What the compiler demanded for one plant: the match arms it asked for, by file.
#[derive(Debug, Default)]
pub struct Demands {
    pub arms: BTreeMap<String, usize>,
}

impl Demands {
    pub fn arm_count(&self) -> usize {
        self.arms.values().sum()
    }
}

/// Measures every plant and checks ARCHITECTURE.md against the counts.
pub fn run(workspace: &Path) -> Result<()> {
    let scratch = workspace.join("target").join("extension-scratch");
    let arch = std::fs::read_to_string(workspace.join("ARCHITECTURE.md")).context("reading ARCHITECTURE.md")?;
    let mut problems = Vec::new();
    for plant in &PLANTS {
        copy_sources(workspace, &scratch)?;
        let demands = measure(workspace, &scratch, plant)?;
        let files: Vec<&String> = demands.arms.keys().collect();
        eprintln!(
            "extension-counts: {}: {} match arms in {} files: {}",
            plant.title,
            demands.arm_count(),
            files.len(),
            files.iter().map(|f| format!("{f} ({})", demands.arms[*f])).collect::<Vec<_>>().join(", ")
        );
        problems.extend(disagreements(&arch, plant, &demands)?);
    }
    ensure!(
        problems.is_empty(),
        "ARCHITECTURE.md's extension counts disagree with the compiler:\n{}",
        problems.join("\n")
    );
    Ok(())
}

/// Where the bullet of `plant` in ARCHITECTURE.md disagrees with `demands`: it must say
/// "`<arms> match arms in <files> Rust files`" and name each file.
fn disagreements(arch: &str, plant: &Plant, demands: &Demands) -> Result<Vec<String>> {
    let start = arch
        .find(&format!("**{}**", plant.title))
        .with_context(|| format!("no `{}` in ARCHITECTURE.md", plant.title))?;
    let rest = &arch[start..];
    let bullet = &rest[..rest.find("\n- ").unwrap_or(rest.len())];
    let mut out = Vec::new();
    let stated = format!("{} match arms in {} Rust files", demands.arm_count(), demands.arms.len());
    if !bullet.contains(&stated) {
        out.push(format!("{}: the compiler demands {stated}; the bullet does not say so", plant.title));
    }
    // Named as a backticked path that ends the file's path from its crate's `src/` on.
    let named: Vec<&str> = bullet.split('`').skip(1).step_by(2).filter(|n| n.ends_with(".rs")).collect();
    for file in demands.arms.keys() {
        let short = file.rsplit_once("/src/").map_or(file.as_str(), |(_, s)| s);
        if !named.iter().any(|n| n.ends_with(short) && file.ends_with(n)) {
            out.push(format!("{}: the bullet does not name `{short}` ({file})", plant.title));
        }
    }
    Ok(out)
}

/// Copies the workspace's files (what git tracks or would) into `scratch`, replacing what is there. The build scripts that compile C++
/// against libtorch become empty: checking needs neither their objects nor their link lines.
fn copy_sources(workspace: &Path, scratch: &Path) -> Result<()> {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .current_dir(workspace)
        .output()
        .context("git ls-files (the extension counts copy what git lists)")?;
    ensure!(out.status.success(), "git ls-files failed in {}", workspace.display());
    let listed = String::from_utf8(out.stdout).context("git ls-files: a path that is not UTF-8")?;
    // Everything but the Python extension (a workspace of its own) and `.cargo/config.toml` (whose
    // relative LIBTORCH would point into the scratch; `check` passes the workspace's): sources
    // embed files from elsewhere in the tree (`docs/pilot`, the definitions).
    let wanted = |p: &str| !p.starts_with("crates/lssa-py/") && !p.starts_with(".cargo/");
    for rel in listed.split('\0').filter(|p| !p.is_empty() && wanted(p)) {
        let (from, to) = (workspace.join(rel), scratch.join(rel));
        if !from.is_file() {
            continue; // listed but deleted in the work tree
        }
        let bytes = match rel {
            "Cargo.toml" => scratch_manifest(&std::fs::read_to_string(&from)?)?.into_bytes(),
            "crates/gpt-model/build.rs" | "crates/trainer/build.rs" => {
                b"// Emptied by `cargo xtask extension-counts`: checking needs no C++.\nfn main() {}\n".to_vec()
            }
            _ => std::fs::read(&from)?,
        };
        // Written only when it differs, so that a second plant leaves cargo's fingerprints (and the
        // build scripts' outputs) of the untouched files fresh.
        if std::fs::read(&to).ok().as_ref() != Some(&bytes) {
            std::fs::create_dir_all(to.parent().expect("a file has a parent"))?;
            std::fs::write(&to, bytes).with_context(|| format!("copying {rel}"))?;
        }
    }
    Ok(())
}

/// The workspace manifest with the scratch's own version of the internal crates: cargo names a
/// path crate's artifacts by its name, version and path relative to the workspace, the same in a
/// copy, so without this the scratch's crates (dummy and all) would overwrite the workspace's in the
/// shared target directory.
fn scratch_manifest(text: &str) -> Result<String> {
    let version = text
        .split("[workspace.package]")
        .nth(1)
        .and_then(|t| t.lines().find_map(|l| l.trim().strip_prefix("version = \"")?.strip_suffix('"')))
        .context("Cargo.toml: no version in [workspace.package]")?;
    let (from, to) = (format!("version = \"{version}\""), format!("version = \"{version}-extension-scratch\""));
    ensure!(text.matches(&from).count() >= 2, "Cargo.toml: the internal crates do not use the workspace's version");
    Ok(text.replace(&from, &to))
}

/// Plants `plant` in `scratch` and runs `cargo check` until it passes, filling the matches it
/// reports; the demands of every round.
fn measure(workspace: &Path, scratch: &Path, plant: &Plant) -> Result<Demands> {
    for (file, after, insert) in plant.edits {
        let path = scratch.join(file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {file}"))?;
        ensure!(text.contains(after), "{}: `{after}` is not in {file}: update xtask's PLANTS", plant.title);
        std::fs::write(&path, text.replacen(after, insert, 1))?;
    }
    let mut demands = Demands::default();
    for round in 1..=8 {
        let errors = check(workspace, scratch)?;
        if errors.is_empty() {
            return Ok(demands);
        }
        let mut fixes: BTreeMap<String, Vec<(usize, usize, String)>> = BTreeMap::new();
        for e in errors {
            let Some((start, end, text)) = e.suggestion else {
                bail!(
                    "{}: round {round}: {} at {} has no suggestion to apply: {}",
                    plant.title,
                    e.code,
                    e.file,
                    e.message
                )
            };
            ensure!(
                e.code == "E0004",
                "{}: an error that is not a non-exhaustive match: {} at {}: {}",
                plant.title,
                e.code,
                e.file,
                e.message
            );
            *demands.arms.entry(e.file.clone()).or_default() += 1;
            fixes.entry(e.file).or_default().push((start, end, wildcard_arm(&text)));
        }
        for (file, mut edits) in fixes {
            let path = scratch.join(&file);
            let mut bytes = std::fs::read(&path)?;
            edits.sort_by_key(|e| std::cmp::Reverse(e.0));
            edits.dedup();
            for (start, end, text) in edits {
                bytes.splice(start..end, text.into_bytes());
            }
            std::fs::write(&path, bytes)?;
        }
    }
    bail!("{}: still errors after 8 rounds of `cargo check`", plant.title)
}

/// rustc's suggested arm (`,\n    path::Kind::Dummy => todo!()`) with its pattern made `_`, which
/// compiles wherever the match is (the suggested path may not be in scope there).
fn wildcard_arm(suggestion: &str) -> String {
    let Some(arrow) = suggestion.rfind(" => ") else { return suggestion.to_string() };
    let head = &suggestion[..arrow];
    let start = head.rfind(['\n', ',', '{']).map_or(0, |i| i + 1);
    let start = start + head[start..].len() - head[start..].trim_start().len();
    format!("{}_{}", &suggestion[..start], &suggestion[arrow..])
}

/// One error of `cargo check`: its code, file (relative to the scratch workspace), message and the
/// machine suggestion it carries (byte range and replacement), if any.
struct CheckError {
    code: String,
    file: String,
    message: String,
    suggestion: Option<(usize, usize, String)>,
}

/// `cargo check` of the scratch workspace (libraries and binaries, every feature), sharing the
/// workspace's target directory so that the dependencies are not built again.
fn check(workspace: &Path, scratch: &Path) -> Result<Vec<CheckError>> {
    let target: PathBuf = workspace.join("target");
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(scratch)
        .args(["check", "--workspace", "--all-features", "--message-format=json", "--quiet", "--offline"])
        .env("CARGO_TARGET_DIR", &target)
        // As `.cargo/config.toml` resolves it for the workspace (the same value: no rebuild of torch-sys).
        .env(
            "LIBTORCH",
            std::env::var_os("LIBTORCH").unwrap_or_else(|| workspace.join(".torch").join("libtorch").into()),
        );
    let out = cmd.output().context("running cargo check in the extension scratch")?;
    let mut errors = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with('{')) {
        let msg = crate::json::parse(line)?;
        if msg.get("reason").and_then(|r| r.as_str()) != Some("compiler-message") {
            continue;
        }
        let Some(m) = msg.get("message") else { continue };
        if m.get("level").and_then(|l| l.as_str()) != Some("error") {
            continue;
        }
        let code = m.get("code").and_then(|c| c.get("code")).and_then(|c| c.as_str()).unwrap_or("").to_string();
        let message = m.get("message").and_then(|s| s.as_str()).unwrap_or("").to_string();
        let primary = m
            .get("spans")
            .and_then(|s| s.as_array())
            .and_then(|s| s.iter().find(|sp| sp.get("is_primary").and_then(|p| p.as_bool()) == Some(true)).cloned());
        let Some(primary) = primary else { bail!("cargo check in the scratch failed without a location: {message}") };
        let file = primary.get("file_name").and_then(|f| f.as_str()).unwrap_or("").to_string();
        let suggestion = m.get("children").and_then(|c| c.as_array()).and_then(|children| {
            children.iter().flat_map(|c| c.get("spans").and_then(|s| s.as_array()).into_iter().flatten()).find_map(
                |sp| {
                    let text = sp.get("suggested_replacement")?.as_str()?.to_string();
                    let start = sp.get("byte_start")?.as_f64()? as usize;
                    let end = sp.get("byte_end")?.as_f64()? as usize;
                    Some((start, end, text))
                },
            )
        });
        errors.push(CheckError { code, file, message, suggestion });
    }
    if errors.is_empty() && !out.status.success() {
        bail!(
            "cargo check in {} failed without a compiler error:\n{}",
            scratch.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(errors)
}

#[cfg(test)]
mod tests {
    use super::{Demands, PLANTS, disagreements, wildcard_arm};

    #[test]
    fn a_bullet_that_miscounts_or_misses_a_file_is_reported() {
        let demands =
            Demands { arms: [("crates/a/src/x.rs".to_string(), 2), ("crates/b/src/cpu/y.rs".to_string(), 1)].into() };
        let plant = &PLANTS[0];
        let arch = |body: &str| format!("# A\n\n- **{}** {body}\n- **Next** `z.rs`\n", plant.title);
        let right = arch("touches 3 match arms in 2 Rust files: `x.rs` and `cpu/y.rs`.");
        assert_eq!(disagreements(&right, plant, &demands).unwrap(), Vec::<String>::new());
        // A planted miscount, and a file named only by a later bullet.
        let wrong = arch("touches 4 match arms in 2 Rust files: `x.rs`.");
        let found = disagreements(&wrong, plant, &demands).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("3 match arms in 2 Rust files") && found[1].contains("`cpu/y.rs`"), "{found:?}");
        assert!(disagreements("no such bullet", plant, &demands).is_err());
    }

    #[test]
    fn a_suggested_arm_becomes_a_wildcard() {
        assert_eq!(wildcard_arm(",\n            spec::Kind::Dummy => todo!()"), ",\n            _ => todo!()");
        assert_eq!(wildcard_arm(", Phi::Builtin(Builtin::Dummy) => todo!()"), ", _ => todo!()");
        assert_eq!(wildcard_arm("Kern::Dummy | Kern::Other => todo!()"), "_ => todo!()");
    }
}
