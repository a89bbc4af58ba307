//! The report's attention-sink section: a table per row and layer, two figures against length, the maps.

use anyhow::Result;

use crate::doc::{Align, Block, Figure, Table};
use crate::plot::{Series, save_with};
use crate::post::Figures;
use crate::runner::Runs;
use crate::sinks::LayerSinks;
use crate::spec::{Experiment, Row};

/// The attention-sink section's blocks: a table per row and layer, two figures against length, the
/// maps (copied next to the figures).
pub(super) fn sinks_blocks(e: &Experiment, results: &Runs, figures: Figures<'_>) -> Result<Vec<Block>> {
    // Sinks are measured on each variant's first seed.
    let find = |r: &Row, m: usize| {
        results
            .get(r.train.as_str())
            .and_then(|x| x.first())
            .and_then(|x| x.sinks.iter().find(|s| s.key.posthoc == r.posthoc && s.key.multiple == m))
    };
    let mut t = Table::new([("row", Align::Left), ("layer", Align::Right)]);
    for m in &e.lengths {
        t.column(format!("{m}x first-token share / entropy"), Align::Right);
    }
    for r in &e.rows {
        let layers = e.lengths.iter().filter_map(|&m| find(r, m)).map(|s| s.layers.len()).max().unwrap_or(0);
        for layer in 0..layers {
            let cells = e.lengths.iter().map(|&m| match find(r, m).and_then(|s| s.layers.get(layer)) {
                Some(l) => format!("{:.3} / {:.2}", l.first_key, l.entropy),
                None => "-".into(),
            });
            t.row([r.label.clone(), (layer + 1).to_string()].into_iter().chain(cells).collect());
        }
    }
    let mut blocks = vec![Block::Table(t)];
    let mean = |s: &crate::runner::SinkEval, f: fn(&LayerSinks) -> f64| {
        s.layers.iter().map(f).sum::<f64>() / s.layers.len().max(1) as f64
    };
    for (what, name, f) in [
        (
            "share of attention on the first token (mean over layers)",
            "sinks_first_key",
            (|l: &LayerSinks| l.first_key) as fn(&LayerSinks) -> f64,
        ),
        ("attention row entropy in nats (mean over layers)", "sinks_entropy", |l: &LayerSinks| l.entropy),
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
            &figures.dir.join(name),
            &format!("{} — {what}", e.title.split(':').next().unwrap_or("")),
            ("inference length / training length (NTK RoPE)", what),
            &series,
        )?;
        blocks.push(Block::Figure(Figure::drawn(what, figures.rel, name)));
    }
    // The maps, copied next to the figures.
    let mut maps = Vec::new();
    for r in &e.rows {
        for &m in &e.maps {
            if let Some(src) = find(r, m).and_then(|s| s.map.as_ref()) {
                let file = src.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
                if std::fs::copy(src, figures.dir.join(&file)).is_ok() {
                    maps.push(Figure {
                        alt: format!("{} at {m}x", r.label),
                        path: format!("{}/{file}", figures.rel),
                        svg: None,
                    });
                }
            }
        }
    }
    if !maps.is_empty() {
        blocks.push(Block::from(
            "Attention maps (one head of the last layer, first validation window; darker = more weight, rows scaled to their maximum):",
        ));
        blocks.push(Block::Gallery(maps));
    }
    Ok(blocks)
}
