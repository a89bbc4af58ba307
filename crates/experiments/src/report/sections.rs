//! The report's sections on the post-training experiments: downstream tasks, retrieval, Newton's
//! law and attention sinks, each with its verdict lines.

use super::*;

pub(super) fn downstream_section(
    md: &mut String,
    e: &Experiment,
    downstream: &BTreeMap<String, Vec<crate::downstream::TaskScores>>,
) {
    if downstream.is_empty() {
        let _ = writeln!(
            md,
            "Not run: no data supplied. Put the task files in a folder and add `--downstream DIR` (see above); the scores go to `runs/<scale>/downstream/`, also in lm-evaluation-harness's JSON layout."
        );
        return;
    }
    let tasks: Vec<&str> = crate::downstream::TASKS
        .iter()
        .copied()
        .filter(|t| downstream.values().any(|v| v.iter().any(|s| s.task == *t)))
        .collect();
    let _ = writeln!(md, "acc_norm ± standard error (acc), zero-shot.\n");
    let _ = writeln!(md, "| row | {} |", tasks.join(" | "));
    let _ = writeln!(md, "|---|{}", "---:|".repeat(tasks.len()));
    for r in &e.rows {
        let _ = write!(md, "| {} |", r.label);
        for t in &tasks {
            let cell =
                downstream.get(&r.train).and_then(|v| v.iter().find(|s| s.task == *t)).map_or("-".to_string(), |s| {
                    format!(
                        "{:.2} ± {:.2} ({:.2}; n = {})",
                        100.0 * s.scores.acc_norm,
                        100.0 * s.scores.acc_norm_stderr,
                        100.0 * s.scores.acc,
                        s.scores.n
                    )
                });
            let _ = write!(md, " {cell} |");
        }
        let _ = writeln!(md);
    }
    let paper = |t: &str| match t {
        "arc_easy" => "40.57",
        "arc_challenge" => "22.61",
        "piqa" => "65.34",
        "mmlu" => "22.97",
        _ => "-",
    };
    let _ = writeln!(
        md,
        "| paper, LSSAR (GPT-2 124M) | {} |",
        tasks.iter().map(|t| paper(t)).collect::<Vec<_>>().join(" | ")
    );
}

pub(super) fn retrieval_section(
    md: &mut String,
    e: &Experiment,
    retrieval: &BTreeMap<String, RetrievalResult>,
    figures_dir: &Path,
    figures_rel: &str,
) -> Result<()> {
    let Some(any) = e.rows.iter().find_map(|r| retrieval.get(&r.label)) else {
        let _ = writeln!(md, "Not run in this invocation (select it with `--only {RETRIEVAL_ONLY}`).");
        return Ok(());
    };
    let s = &any.settings;
    let _ = writeln!(
        md,
        "Fine-tuning: {} steps of {} prompts at {}x the training length. Evaluation: {} prompts per cell, depths {:?}.\n",
        s.steps, s.batch, any.train_multiple, s.prompts, s.depths
    );
    let _ = write!(md, "| row | fine-tune loss |");
    for m in &s.multiples {
        let _ = write!(md, " {m}x |");
    }
    let _ = writeln!(md, " example at {}x |", s.multiples.last().copied().unwrap_or(1));
    let _ = writeln!(md, "|---|---:|{}---|", "---:|".repeat(s.multiples.len()));
    let mut series: Vec<Series> = Vec::new();
    for (i, r) in e.rows.iter().enumerate() {
        let Some(res) = retrieval.get(&r.label) else {
            let _ = writeln!(md, "| {} | - |{} - |", r.label, " - |".repeat(s.multiples.len()));
            continue;
        };
        let _ = write!(md, "| {} | {:.3} |", r.label, res.finetune_loss);
        for &m in &s.multiples {
            let pct = |x: Option<f64>| x.map_or("-".into(), |a| format!("{:.0}%", 100.0 * a));
            let _ = write!(md, " {} / {} |", pct(res.mean_at(m)), pct(res.digits_at(m)));
        }
        let _ = writeln!(md, " {} |", res.example.replace('|', "/"));
        series.push((
            r.label.clone(),
            i,
            r.posthoc.is_some(),
            s.multiples.iter().filter_map(|&m| res.digits_at(m).map(|a| (m as f64, a))).collect(),
        ));
        let name = format!("{}_{}", e.name, crate::runner::run_dir_name(&r.label));
        let acc =
            |m: usize, d: f64| res.digit_cells.iter().find(|c| c.0 == m && (c.1 - d).abs() < 1e-9).map_or(0.0, |c| c.2);
        let (ms, ds) = (&res.settings.multiples, &res.settings.depths);
        draw_grid(&figures_dir.join(&name), &format!("{}: passkey digit accuracy", r.label), ms, ds, &acc)?;
    }
    let _ = writeln!(
        md,
        "\nCells: exact accuracy (the whole key) / digit accuracy (share of the key's digits in place; 10% is chance), averaged over depths. The figure and the heat maps (length x depth) show digit accuracy.\n"
    );
    let name = format!("{}_accuracy", e.name);
    save_with(
        &figures_dir.join(&name),
        "Passkey digit accuracy against length (mean over depths)",
        ("length multiple", "digit accuracy"),
        &series,
    )?;
    let _ = writeln!(md, "![{}]({figures_rel}/{name}.png) ([SVG]({figures_rel}/{name}.svg))\n", e.title);
    for r in e.rows.iter().filter(|r| retrieval.contains_key(&r.label)) {
        let name = format!("{}_{}", e.name, crate::runner::run_dir_name(&r.label));
        let _ = writeln!(md, "![{}]({figures_rel}/{name}.png)", r.label);
    }
    Ok(())
}

/// One verdict line on retrieval beyond the training length: LSSAR against softmax at the longest length.
pub fn retrieval_verdicts(retrieval: &BTreeMap<String, RetrievalResult>) -> Vec<String> {
    let (Some(s), Some(r)) = (retrieval.get("Softmax"), retrieval.get("LSSAR p=15 (train)")) else {
        return Vec::new();
    };
    let Some(&last) = s.settings.multiples.last() else { return Vec::new() };
    let first = s.settings.multiples[0];
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |a| format!("{:.0}%", 100.0 * a));
    let (s1, sl, r1, rl) = (s.mean_at(first), s.mean_at(last), r.mean_at(first), r.mean_at(last));
    let claim = matches!((sl, rl, r1), (Some(sl), Some(rl), Some(r1)) if rl > sl + 0.2 && r1 > 0.5);
    let (sd1, sdl, rd1, rdl) = (s.digits_at(first), s.digits_at(last), r.digits_at(first), r.digits_at(last));
    vec![format!(
        "**Passkey retrieval beyond the training length, LSSAR vs softmax**: {}. Exact accuracy {first}x -> {last}x: LSSAR (p = 15, trained) {} -> {}, softmax {} -> {}; digit accuracy LSSAR {} -> {}, softmax {} -> {} (10% is chance).",
        if claim {
            "reproduced (LSSAR holds more than 20 points above softmax at the longest length)"
        } else if r1.is_some_and(|a| a < 0.5) && s1.is_some_and(|a| a < 0.5) {
            "not testable at this scale: neither model retrieves the key reliably even at the training length"
        } else {
            "not reproduced at this scale"
        },
        pct(r1),
        pct(rl),
        pct(s1),
        pct(sl),
        pct(rd1),
        pct(rdl),
        pct(sd1),
        pct(sdl)
    )]
}

pub(super) fn physics_section(
    md: &mut String,
    e: &Experiment,
    physics: &BTreeMap<String, PhysicsResult>,
    figures_dir: &Path,
    figures_rel: &str,
) -> Result<()> {
    let Some(any) = e.rows.iter().find_map(|r| physics.get(&r.train)) else {
        let _ = writeln!(md, "Not run in this invocation (select it with `--only {PHYSICS_ONLY}`).");
        return Ok(());
    };
    let s = &any.settings;
    let _ = writeln!(
        md,
        "Each model: {} layers, width {}, {} heads; {} training orbits of {} steps (dt = {}), {} Adam steps of {} orbits; forces read from {} held-out orbits.\n",
        s.n_layer, s.d_model, s.n_head, s.train_orbits, s.seq_len, s.dt, s.steps, s.batch, s.test_orbits
    );
    let _ = writeln!(
        md,
        "| model | acceleration error (rel. RMSE) | best law (BIC) | its rel. RMSE | power-law fit: a (m1) | b (m2) | k (r) | Newton's law? | time |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    let mut series: Vec<Series> = Vec::new();
    for (i, r) in e.rows.iter().enumerate() {
        let Some(p) = physics.get(&r.train) else {
            let _ = writeln!(md, "| {} | - | - | - | - | - | - | - | - |", r.label);
            continue;
        };
        let pl = |j: usize| p.power_law.map_or("-".to_string(), |(v, se)| format!("{:.2} ± {:.2}", v[j], se[j]));
        let _ = writeln!(
            md,
            "| {} | {:.3} | `{}` | {:.3} | {} | {} | {} | {} | {:.0} s |",
            r.label,
            p.accel_rel_rmse,
            p.best_law,
            p.best_law_rel_rmse,
            pl(1),
            pl(2),
            pl(3),
            if p.newton_recovered { "**yes**" } else { "no" },
            p.wall_s
        );
        series.push((r.label.clone(), i, false, p.ratio_by_r.iter().map(|&(x, y)| (x, y.log10())).collect()));
    }
    let _ = writeln!(
        md,
        "\nThe acceleration error is relative to the exact accelerations; predicting no correction to constant velocity scores 1. Newton's law is `a = 1, b = 1, k = -2` with `c = G = 1`.\n"
    );
    if let Some((lo, hi)) = series
        .iter()
        .flat_map(|s| s.3.iter().map(|p| p.0))
        .fold(None, |acc: Option<(f64, f64)>, x| Some(acc.map_or((x, x), |(a, b)| (a.min(x), b.max(x)))))
    {
        series.push(("Newton".into(), 7, true, vec![(lo, 0.0), (hi, 0.0)]));
    }
    let name = format!("{}_force_ratio", e.name);
    save_with(
        &figures_dir.join(&name),
        "Implied force over Newton's force against distance (median per bin)",
        ("log2 of the distance r", "log10(implied / Newton)"),
        &series,
    )?;
    let _ = writeln!(md, "![{}]({figures_rel}/{name}.png) ([SVG]({figures_rel}/{name}.svg))", e.title);
    Ok(())
}

/// One verdict line per physics result: whether that model's implied forces follow Newton's law.
pub fn physics_verdicts(physics: &BTreeMap<String, PhysicsResult>) -> Vec<String> {
    if physics.is_empty() {
        return Vec::new();
    }
    let get = |v: &str| physics.get(v);
    let mut out = Vec::new();
    let describe = |p: &PhysicsResult| {
        let exps = p.power_law.map_or(String::new(), |(v, se)| {
            format!(
                " (fitted exponents a = {:.2} ± {:.2}, b = {:.2} ± {:.2}, k = {:.2} ± {:.2})",
                v[1], se[1], v[2], se[2], v[3], se[3]
            )
        });
        format!("{}: best law `{}`{exps}", p.variant, p.best_law)
    };
    match (get("softmax"), get("lssa+rw15")) {
        (Some(s), Some(r)) => {
            let claim = r.newton_recovered && !s.newton_recovered;
            out.push(format!(
                "**Newton's law recovered by LSSAR but not by softmax: {}.** {}; {}.",
                if claim { "reproduced" } else { "not reproduced at this scale" },
                describe(r),
                describe(s)
            ));
        }
        _ => {
            for p in physics.values() {
                out.push(format!("Newton's law: {}.", describe(p)));
            }
        }
    }
    out
}

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
