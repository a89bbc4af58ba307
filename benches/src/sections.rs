//! Benchmark files that keep one section per CPU model (issue 60): a run replaces its own CPU's
//! section of the Markdown table and its entry in the JSON file, and keeps every other CPU's, so a
//! reader sees what each machine the project met does (each section from one interleaved run there).
//!
//! The Markdown file is the run's own title, a line saying how it is organised, then a `## CPU: <model>`
//! section per CPU ([`crate::env::cpu_model`]: model name, logical CPUs, widest SIMD), sorted by name,
//! each holding a run's report with its headings one level deeper. The JSON file is
//! `{"per_cpu": {"<model>": <the run's report>, ...}}`. A file written before this layout (one run,
//! no sections) becomes the section of the CPU its `- CPU: ` line (Markdown) or `header.cpu` (JSON)
//! names.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

/// The heading that opens a CPU's section.
const SECTION: &str = "## CPU: ";

/// The line under the title.
const ABOUT: &str = "One section per CPU model seen, each from one interleaved run on that machine; a new run replaces its own CPU's section and keeps the others.";

/// `existing` (a file of this layout, one written before it, or none) with `cpu`'s section replaced by
/// `run_md`, a run's whole report (its first `# ` line is the title).
pub fn merge_markdown(existing: Option<&str>, cpu: &str, run_md: &str) -> String {
    let (title, body) = split_title(run_md);
    let mut sections = existing.map(parse_sections).unwrap_or_default();
    sections.insert(cpu.to_string(), demote(body));
    let mut out = format!("{title}\n\n{ABOUT}\n");
    for (cpu, body) in &sections {
        out.push_str(&format!("\n{SECTION}{cpu}\n\n{}\n", body.trim()));
    }
    out
}

/// `existing` JSON with `cpu`'s entry replaced by `run`.
pub fn merge_json(existing: Option<&str>, cpu: &str, run: serde_json::Value) -> Result<String> {
    let mut per_cpu: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    if let Some(text) = existing {
        let old: serde_json::Value = serde_json::from_str(text).context("the existing benchmark JSON")?;
        match old.get("per_cpu").and_then(serde_json::Value::as_object) {
            Some(map) => per_cpu.extend(map.iter().map(|(k, v)| (k.clone(), v.clone()))),
            None => {
                let name = old.pointer("/header/cpu").or_else(|| old.get("cpu"));
                let name = name.and_then(serde_json::Value::as_str).unwrap_or("unknown CPU");
                per_cpu.insert(name.to_string(), old.clone());
            }
        }
    }
    per_cpu.insert(cpu.to_string(), run);
    Ok(serde_json::to_string_pretty(&serde_json::json!({ "per_cpu": per_cpu }))? + "\n")
}

/// Merges a run into `<dir>/<stem>.md` and `.json` ([`merge_markdown`], [`merge_json`]) and writes both.
pub fn write(dir: &Path, stem: &str, cpu: &str, run_md: &str, run_json: serde_json::Value) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let read = |ext: &str| std::fs::read_to_string(dir.join(format!("{stem}.{ext}"))).ok();
    let md = merge_markdown(read("md").as_deref(), cpu, run_md);
    let json = merge_json(read("json").as_deref(), cpu, run_json)?;
    for (ext, text) in [("md", md), ("json", json)] {
        let path = dir.join(format!("{stem}.{ext}"));
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {} (the section of {cpu})", path.display());
    }
    Ok(())
}

/// The first `# ` line and the rest.
fn split_title(md: &str) -> (&str, &str) {
    match md.split_once('\n') {
        Some((first, rest)) if first.starts_with("# ") => (first, rest),
        _ => ("# Benchmark", md),
    }
}

/// Every heading one level deeper (outside code blocks), so that a run's `##` sits under its CPU.
fn demote(md: &str) -> String {
    let mut fenced = false;
    let lines: Vec<String> = md
        .lines()
        .map(|l| {
            if l.starts_with("```") {
                fenced = !fenced;
            }
            if !fenced && l.starts_with('#') { format!("#{l}") } else { l.to_string() }
        })
        .collect();
    lines.join("\n")
}

/// The sections of a file of this layout, or a file of one run (before the layout) as the section of
/// the CPU its `- CPU: ` line names.
fn parse_sections(text: &str) -> BTreeMap<String, String> {
    let mut sections = BTreeMap::new();
    if text.lines().any(|l| l.starts_with(SECTION)) {
        let mut current: Option<(String, Vec<&str>)> = None;
        for line in text.lines() {
            if let Some(cpu) = line.strip_prefix(SECTION) {
                if let Some((name, body)) = current.take() {
                    sections.insert(name, body.join("\n"));
                }
                current = Some((cpu.trim().to_string(), Vec::new()));
            } else if let Some((_, body)) = current.as_mut() {
                body.push(line);
            }
        }
        if let Some((name, body)) = current {
            sections.insert(name, body.join("\n"));
        }
    } else {
        let cpu = text
            .lines()
            .find_map(|l| l.strip_prefix("- CPU: "))
            .map_or("unknown CPU", |c| c.split(';').next().unwrap_or(c))
            .trim()
            .to_string();
        sections.insert(cpu, demote(split_title(text).1));
    }
    sections
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cpu: &str, ms: &str) -> String {
        format!("# CPU attention\n\n- CPU: {cpu}\n\n## fwd\n\n| T | ms |\n|---|---|\n| 512 | {ms} |\n")
    }

    #[test]
    fn a_run_replaces_its_own_cpus_section_and_keeps_the_others() {
        let amd = "AMD EPYC (2 logical CPUs, AVX-512)";
        let intel = "Intel(R) Xeon(R) (2 logical CPUs, AVX-512)";
        // A file from before the layout becomes the section of the CPU it names.
        let legacy = run(amd, "7.27");
        let one = merge_markdown(Some(&legacy), intel, &run(intel, "9.10"));
        assert!(one.starts_with("# CPU attention\n\n"), "{one}");
        assert_eq!(one.matches(SECTION).count(), 2, "{one}");
        assert!(one.contains(&format!("{SECTION}{amd}")) && one.contains("| 512 | 7.27 |"), "{one}");
        assert!(one.contains("### fwd") && !one.contains("\n## fwd"), "headings one level deeper: {one}");
        // Sorted by name; a second run of one CPU replaces its section only.
        assert!(one.find(amd).unwrap() < one.find(intel).unwrap());
        let two = merge_markdown(Some(&one), intel, &run(intel, "8.00"));
        assert!(two.contains("| 512 | 8.00 |") && !two.contains("| 512 | 9.10 |") && two.contains("| 512 | 7.27 |"));
        assert_eq!(two.matches(SECTION).count(), 2);
        // Merging the same run again changes nothing.
        assert_eq!(merge_markdown(Some(&two), intel, &run(intel, "8.00")), two);
    }

    #[test]
    fn the_json_keeps_a_report_per_cpu() {
        // Before the layout, bench-train and bench-model named the CPU in `header`, bench-kernels at the top.
        let top = serde_json::json!({ "cpu": "AMD", "rows": [1] }).to_string();
        let top = merge_json(Some(&top), "Intel", serde_json::Value::Null).unwrap();
        assert!(serde_json::from_str::<serde_json::Value>(&top).unwrap()["per_cpu"]["AMD"].is_object(), "{top}");
        let legacy = serde_json::json!({ "header": { "cpu": "AMD" }, "rows": [1] }).to_string();
        let one = merge_json(Some(&legacy), "Intel", serde_json::json!({ "rows": [2] })).unwrap();
        let v: serde_json::Value = serde_json::from_str(&one).unwrap();
        assert_eq!(v["per_cpu"]["AMD"]["rows"][0], 1);
        assert_eq!(v["per_cpu"]["Intel"]["rows"][0], 2);
        let two = merge_json(Some(&one), "Intel", serde_json::json!({ "rows": [3] })).unwrap();
        let v: serde_json::Value = serde_json::from_str(&two).unwrap();
        assert_eq!(
            (v["per_cpu"]["AMD"]["rows"][0].clone(), v["per_cpu"]["Intel"]["rows"][0].clone()),
            (1.into(), 3.into())
        );
        assert!(merge_json(Some("not json"), "x", serde_json::Value::Null).is_err());
    }
}
