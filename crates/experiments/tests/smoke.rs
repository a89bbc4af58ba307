//! `reproduce --scale smoke` end to end: with `--all` every experiment runs, the report and its figures
//! are written, every run (every seed) has its evaluations with per-window losses, every verdict is
//! judged, a second invocation redoes nothing, and more seeds later train only the new ones; without
//! it, the plan is the headline rows alone.

use std::path::Path;
use std::process::Command;

const REPRODUCE: &str = env!("CARGO_BIN_EXE_reproduce");

/// `reproduce --all`: every experiment.
fn reproduce(out: &Path) -> std::process::Output {
    reproduce_with(out, &["--all"])
}

fn reproduce_with(out: &Path, extra: &[&str]) -> std::process::Output {
    let o = Command::new(REPRODUCE)
        .args(["--scale", "smoke", "--out", out.to_str().unwrap()])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(o.status.success(), "reproduce failed: {}", String::from_utf8_lossy(&o.stderr));
    o
}

fn result(out: &Path, variant: &str) -> experiments::runner::RunResult {
    seed_result(out, variant, 0)
}

fn seed_result(out: &Path, variant: &str, seed: usize) -> experiments::runner::RunResult {
    let path = experiments::runner::run_dir(out, variant, seed).join("result.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn checkpoint_time(dir: &Path) -> std::time::SystemTime {
    let ckpt = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("ckpt_"))
        .unwrap()
        .path();
    std::fs::metadata(&ckpt).unwrap().modified().unwrap()
}

#[test]
fn a_diverging_run_is_retried_at_lower_learning_rates_then_recorded() {
    let out = std::env::temp_dir().join(format!("lssa-smoke-diverge-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // Unnormalised exp attention at an absurd learning rate diverges at every rate tried.
    reproduce_with(&out, &["--all", "--only", "exp-nonorm", "--set", "lr=400", "--set", "warmup_steps=0"]);
    let r = result(&out, "exp-nonorm");
    let err = r.error.as_deref().expect("recorded as failed");
    for lr in ["lr 400 ", "lr 200 ", "lr 100 "] {
        assert!(err.contains(lr), "no attempt at {lr}: {err}");
    }
    assert!(r.evals.is_empty() && r.final_train_loss.is_nan());
    let report = std::fs::read_to_string(out.join("REPRODUCTION.md")).unwrap();
    assert!(report.contains("training failed: training diverged at lr 400"), "the report names the divergence");
    // A later invocation reads the failed result back (its NaN loss was written as null) and does not retrain it.
    let before = std::fs::read_to_string(out.join("exp-nonorm").join("result.json")).unwrap();
    reproduce_with(&out, &["--all", "--only", "exp-nonorm", "--set", "lr=400", "--set", "warmup_steps=0"]);
    assert_eq!(std::fs::read_to_string(out.join("exp-nonorm").join("result.json")).unwrap(), before);
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn smoke_scale_runs_every_experiment_and_resumes_without_redoing_work() {
    let out = std::env::temp_dir().join(format!("lssa-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // Downstream data as a user supplies it: the test fixtures under the names the runner looks for.
    let mc = out.join("mc");
    std::fs::create_dir_all(&mc).unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/downstream");
    for (from, to) in [("arc.jsonl", "arc_easy.jsonl"), ("piqa.jsonl", "piqa.jsonl"), ("mmlu.jsonl", "mmlu.jsonl")] {
        std::fs::copy(fixtures.join(from), mc.join(to)).unwrap();
    }
    let first = reproduce_with(&out, &["--all", "--downstream", mc.to_str().unwrap()]);
    // Off a terminal, every training logs plain progress lines (smoke: 6 steps, a line per step).
    let log = String::from_utf8_lossy(&first.stderr);
    for step in 1..=6 {
        assert!(log.contains(&format!("reproduce: lssa+rw15 seed 0: step {step}/6, loss ")), "step {step}: {log}");
    }
    assert!(!log.contains('\u{1b}'), "colour codes in a log that is not a terminal");
    let report = std::fs::read_to_string(out.join("REPRODUCTION.md")).unwrap();
    // Downstream: every row scored on the three files, in the report and in lm-eval's layout.
    let row =
        report.lines().find(|l| l.starts_with("| LSSAR p=15 (train) |") && l.contains("n = ")).expect("downstream row");
    assert_eq!(row.matches("n = ").count(), 3, "{row}");
    let lm: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("downstream/softmax.lm-eval.json")).unwrap()).unwrap();
    for task in ["arc_easy", "piqa", "mmlu"] {
        let acc = lm["results"][task]["acc_norm,none"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acc), "{task}: {acc}");
    }
    for title in [
        "Table 1",
        "Table 2",
        "Table 3",
        "Table 4",
        "Figure 1",
        "Figure 2",
        "## Summary",
        "## Verdicts",
        "not meaningful",
    ] {
        assert!(report.contains(title), "the report lacks `{title}`");
    }
    // Every claim is judged under both RoPE treatments (or at 1x only), with an interval, SE, df, its
    // p-value and the Holm column, has its summary sentence, and every ordering table has its verdict
    // and pair list.
    let outcomes = ["**reproduced**", "**contradicted**", "**inconclusive**", "**smaller than claimed**"];
    for claim in &experiments::claims::all().unwrap().claim {
        let lines: Vec<&str> = report.lines().filter(|l| l.starts_with(&format!("| **{}**", claim.name))).collect();
        assert_eq!(lines.len(), if claim.longest() > 1 { 2 } else { 1 }, "{}: {lines:?}", claim.name);
        for l in lines {
            assert!(outcomes.iter().any(|v| l.contains(v)), "{l}");
            assert!(l.contains('[') && l.contains("seeds: "), "{l}");
            assert_eq!(l.matches(" | ").count(), 11, "twelve columns: {l}");
        }
        let mut short = claim.short.chars();
        let short = short.next().unwrap().to_uppercase().collect::<String>() + short.as_str();
        assert!(report.contains(&format!("- {short}: ")), "no summary sentence for {}", claim.name);
    }
    assert!(report.contains("- Family-wise: ") && report.contains("after Holm-Bonferroni"), "the Holm count");
    assert!(report.contains("### Shared readings"), "the shared readings");
    assert!(report.contains("The paper's comparisons at every length"), "q across lengths");
    for table in ["table1", "table2", "table3"] {
        assert!(report.contains(&format!("- **{table} ordering at 1x: ")), "{table}");
    }
    assert!(report.contains("Ordering at 1x, pair by pair"));
    assert!(report.contains("Seed-to-seed noise of one row's 1x loss"));
    assert!(report.contains("3.1905"), "the paper's numbers are shown next to ours");
    assert!(report.contains("## Attention sinks"), "the sinks section");
    assert!(
        report.contains("map_softmax_8x.png") && report.contains("map_lssa_posthoc15_1x.png"),
        "the attention maps"
    );
    assert!(out.join("figures/map_lssa_rw15_8x.png").exists());
    // Retrieval: its own models in every regime, every row with its 1x gate and accuracies, a figure
    // per regime, every claim of `[[retrieval]]` with its robustness line and a verdict per regime; the
    // physics experiment too, with its verdict.
    assert!(report.contains("## Associative recall from scratch") && report.contains("## Newton's law"));
    assert!(report.contains("**LSSAR recovers Newton's law and softmax does not**"), "the Newton verdict line");
    let regimes = experiments::retrieval::cells().unwrap();
    for claim in &experiments::claims::all().unwrap().retrieval {
        let line = report
            .lines()
            .find(|l| l.starts_with(&format!("- **{}**: ", claim.name)) && l.contains("under plain RoPE, "))
            .unwrap_or_else(|| panic!("no robustness line for {}", claim.name));
        assert!(line.contains("in every regime") || line.contains("depends on the regime"), "{line}");
        for g in &regimes {
            for rope in ["NTK", "plain"] {
                let reading = format!("| **{}** | {}, {rope} |", claim.name, g.name);
                assert!(
                    report.contains(&reading) || line.contains(&format!("{} not judged", g.name)),
                    "no verdict {reading}"
                );
            }
        }
    }
    let retrieval = experiments::spec::all().unwrap().into_iter().find(|e| e.name == "retrieval").unwrap();
    for g in &regimes {
        let section = report.split(&format!("### Regime `{}`", g.name)).nth(1).expect("a section per regime");
        let section = section.split("### ").next().unwrap();
        // `--all` runs the ablation rows in every cell of GPT-2's initialisation, not in the recipe
        // axis's other cells.
        let gpt2 = g.init() == gpt_model::config::Init::Gpt2;
        for row in retrieval.rows.iter().filter(|r| gpt2 || !r.ablation) {
            let line = section
                .lines()
                .find(|l| {
                    l.starts_with(&format!("| {} |", row.label)) && (l.contains("passed") || l.contains("not learnt"))
                })
                .unwrap_or_else(|| panic!("{}: no retrieval gate row for {}", g.name, row.label));
            assert!(!line.contains("not run"), "{line}");
        }
        for ext in ["png", "svg"] {
            assert!(out.join("figures").join(format!("retrieval_{}.{ext}", g.name)).exists(), "{}", g.name);
        }
        let settings = experiments::retrieval::Settings::for_regime("smoke", g);
        for k in 0..settings.seeds {
            let path = out.join("retrieval").join(&g.name).join(format!("lssa_seed{k}.json"));
            let cached: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            assert_eq!(cached["settings"]["placement"], serde_json::json!(g.placement.name()));
            let run: experiments::retrieval::SeedRun = serde_json::from_value(cached["run"].clone()).unwrap();
            assert_eq!(run.seed_index, k);
            // Post-hoc p = 15 and as trained, every length, both RoPE treatments beyond 1x, both scores.
            for posthoc in [None, Some(15)] {
                for &m in &settings.multiples {
                    for ntk in [true, false] {
                        let a = run.get(ntk, posthoc, m).unwrap_or_else(|| panic!("{posthoc:?} {m}x ntk {ntk}"));
                        assert_eq!(a.correct.len(), settings.prompts * settings.asked);
                        assert_eq!((a.exact.len(), a.distance.len()), (a.correct.len(), a.correct.len()));
                        // An answer exact over the vocabulary is also first among its key's values.
                        assert!(a.exact.iter().zip(&a.correct).all(|(&e, &c)| !e || c));
                    }
                }
            }
        }
    }
    for fig in
        ["figure1", "figure2", "table4_length", "claims_gap", "sinks_first_key", "sinks_entropy", "newton_force_ratio"]
    {
        for ext in ["png", "svg"] {
            let p = out.join("figures").join(format!("{fig}.{ext}"));
            assert!(std::fs::metadata(&p).map(|m| m.len() > 1000).unwrap_or(false), "{} missing or empty", p.display());
        }
    }
    // Every planned run has a result with every evaluation the experiments need, with its
    // per-window losses; the variants the claims read have three seeds, with other initial weights
    // and data order.
    let plan = experiments::spec::plan(&experiments::spec::all().unwrap());
    assert_eq!(plan.len(), 26);
    let claims = experiments::claims::all().unwrap();
    for (variant, needs) in &plan {
        let r = result(&out, variant);
        assert_eq!(r.variant, variant.as_str());
        for k in needs {
            let l = r.eval(k).unwrap_or_else(|| panic!("{variant}: no evaluation {k:?}"));
            assert!(l.loss.is_finite() && l.loss > 0.0, "{variant} {k:?}: loss {}", l.loss);
            let w = l.per_window.as_ref().expect("per-window losses");
            assert_eq!(w.first.len(), l.windows, "{variant} {k:?}");
            assert_eq!(w.rest.len(), if k.multiple > 1 { l.windows } else { 0 });
            // The whole-window mean is the mean of the windows' (first + (m-1) rest) / m.
            let m = k.multiple as f64;
            let mean = (0..l.windows)
                .map(|i| (f64::from(w.first[i]) + (m - 1.0) * w.rest.get(i).map_or(0.0, |&x| f64::from(x))) / m)
                .sum::<f64>()
                / l.windows as f64;
            assert!((mean - l.loss).abs() < 1e-4, "{variant} {k:?}: windows give {mean}, the mean is {}", l.loss);
        }
        let seeds = if claims.variants().contains(variant.as_str()) { 3 } else { 1 };
        assert!(experiments::runner::run_dir(&out, variant, seeds - 1).join("result.json").exists(), "{variant}");
        assert!(!experiments::runner::run_dir(&out, variant, seeds).exists(), "{variant}: a seed too many");
        if seeds > 1 {
            let other = seed_result(&out, variant, 1);
            assert_eq!(other.seed_index, 1);
            let key = experiments::spec::EvalKey::new(true, None, 1);
            assert_ne!(other.loss(&key), r.loss(&key), "{variant}: seed 1 repeats seed 0");
        }
        for k in
            experiments::spec::sink_plan(&experiments::spec::all().unwrap()).get(variant.as_str()).into_iter().flatten()
        {
            let s =
                r.sinks.iter().find(|s| s.key == *k).unwrap_or_else(|| panic!("{variant}: no sink measurement {k:?}"));
            assert_eq!(s.layers.len(), 2, "one entry per layer");
            assert!(s.layers.iter().all(|l| l.first_key > 0.0 && l.first_key <= 1.0 && l.entropy >= 0.0));
            assert_eq!(s.map.is_some(), k.map);
        }
    }
    // The same run trained by two Gloo ranks (each half of the global batch, through the launcher)
    // lands on the same losses as the single process that accumulated both halves.
    let ranks = out.with_extension("ranks");
    reproduce_with(&ranks, &["--all", "--only", "lssa", "--seeds", "1", "--nproc-per-node", "2"]);
    let one = result(&out, "lssa");
    let two = result(&ranks, "lssa");
    assert!(
        (one.final_train_loss - two.final_train_loss).abs() < 1e-4,
        "{} vs {}",
        one.final_train_loss,
        two.final_train_loss
    );
    for (k, l) in &two.evals {
        let single = one.loss(k).unwrap();
        assert!((single - l.loss).abs() < 1e-4, "{k:?}: one process {single}, two ranks {}", l.loss);
    }
    std::fs::remove_dir_all(&ranks).unwrap();
    // The same command again trains nothing: checkpoints and results are untouched.
    let dirs: Vec<_> = (0..3).map(|k| experiments::runner::run_dir(&out, "lssa+rw15", k)).collect();
    let before: Vec<_> = dirs.iter().map(|d| checkpoint_time(d)).collect();
    let second = reproduce(&out);
    let after: Vec<_> = dirs.iter().map(|d| checkpoint_time(d)).collect();
    assert_eq!(after, before, "a finished run was retrained");
    assert_eq!(
        String::from_utf8_lossy(&first.stdout),
        String::from_utf8_lossy(&second.stdout),
        "the verdicts changed without new work"
    );
    // A fourth seed later trains only the fourth seed.
    reproduce_with(&out, &["--all", "--only", "lssa+rw15", "--seeds", "4"]);
    assert_eq!(dirs.iter().map(|d| checkpoint_time(d)).collect::<Vec<_>>(), before, "an old seed was retrained");
    assert_eq!(seed_result(&out, "lssa+rw15", 3).seed_index, 3);
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn the_default_plans_the_headline_rows_and_all_plans_every_experiment() {
    let out = std::env::temp_dir().join(format!("lssa-smoke-plan-{}", std::process::id()));
    let plan = |extra: &[&str]| {
        let o = reproduce_with(&out, &[&["--plan"], extra].concat());
        String::from_utf8_lossy(&o.stdout).lines().map(String::from).collect::<Vec<_>>()
    };
    let seeds = experiments::scale::Scale::by_name("smoke").unwrap().headline_seeds;
    let default = plan(&[]);
    let headline: Vec<String> = experiments::claims::all().unwrap().variants().into_iter().collect();
    assert_eq!(default.len(), headline.len(), "{default:?}");
    for (line, v) in default.iter().zip(&headline) {
        assert!(line.starts_with(&format!("{v}: {seeds} seeds, ")), "{line}");
    }
    assert_eq!(plan(&["--all"]).len(), 26);
    assert!(plan(&["--seeds", "9"]).iter().all(|l| l.contains(": 9 seeds")));
}
