//! The report's attention-sink section: a table per row and layer, two figures against length, the maps.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use crate::plot::{Series, save_with};
use crate::runner::Runs;
use crate::spec::{Experiment, Row};

/// The attention-sink section: a table per row and layer, two figures against length, the maps.
pub(super) fn sinks_section(
    md: &mut String,
    e: &Experiment,
    results: &Runs,
    figures_dir: &Path,
    figures_rel: &str,
) -> Result<()> {
    // Sinks are measured on each variant's first seed.
    let find = |r: &Row, m: usize| {
        results
            .get(&r.train)
            .and_then(|x| x.first())
            .and_then(|x| x.sinks.iter().find(|s| s.key.posthoc == r.posthoc && s.key.multiple == m))
    };
    let mut head = String::from("| row | layer |");
    let mut rule = String::from("|---|---:|");
    for m in &e.lengths {
        head.push_str(&format!(" {m}x first-token share / entropy |"));
        rule.push_str("---:|");
    }
    let _ = writeln!(md, "{head}\n{rule}");
    for r in &e.rows {
        let layers = e.lengths.iter().filter_map(|&m| find(r, m)).map(|s| s.layers.len()).max().unwrap_or(0);
        for layer in 0..layers {
            let mut line = format!("| {} | {} |", r.label, layer + 1);
            for &m in &e.lengths {
                match find(r, m).and_then(|s| s.layers.get(layer)) {
                    Some(l) => line.push_str(&format!(" {:.3} / {:.2} |", l.first_key, l.entropy)),
                    None => line.push_str(" - |"),
                }
            }
            let _ = writeln!(md, "{line}");
        }
    }
    let mean = |s: &crate::runner::SinkEval, f: fn(&crate::sinks::LayerSinks) -> f64| {
        s.layers.iter().map(f).sum::<f64>() / s.layers.len().max(1) as f64
    };
    for (what, name, f) in [
        (
            "share of attention on the first token (mean over layers)",
            "sinks_first_key",
            (|l: &crate::sinks::LayerSinks| l.first_key) as fn(&crate::sinks::LayerSinks) -> f64,
        ),
        ("attention row entropy in nats (mean over layers)", "sinks_entropy", |l: &crate::sinks::LayerSinks| l.entropy),
    ] {
        let series: Vec<Series> = e
            .rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let pts = e.lengths.iter().filter_map(|&m| find(r, m).map(|s| (m as f64, mean(s, f)))).collect();
                (r.label.clone(), i, r.posthoc.is_some(), pts)
            })
            .collect();
        save_with(
            &figures_dir.join(name),
            &format!("{} — {what}", e.title.split(':').next().unwrap_or("")),
            ("inference length / training length (NTK RoPE)", what),
            &series,
        )?;
        let _ = writeln!(md, "\n![{what}]({figures_rel}/{name}.png) ([SVG]({figures_rel}/{name}.svg))");
    }
    // The maps, copied next to the figures.
    let mut maps = Vec::new();
    for r in &e.rows {
        for &m in &e.maps {
            if let Some(src) = find(r, m).and_then(|s| s.map.as_ref()) {
                let file = src.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                if std::fs::copy(src, figures_dir.join(&file)).is_ok() {
                    maps.push(format!("![{} at {m}x]({figures_rel}/{file})", r.label));
                }
            }
        }
    }
    if !maps.is_empty() {
        let _ = writeln!(
            md,
            "\nAttention maps (one head of the last layer, first validation window; darker = more weight, rows scaled to their maximum):\n"
        );
        let _ = writeln!(md, "{}", maps.join("\n"));
    }
    Ok(())
}
