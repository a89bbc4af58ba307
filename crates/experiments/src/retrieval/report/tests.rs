//! The retrieval report's tests (moved out of report.rs, over the house limit of 800 lines).

use super::*;
use crate::retrieval::{Answers, Recipe};
use gpt_model::Init;

/// A seed's answers: `gate_hits` of 64 at 1x, `beyond_hits` of 64 beyond at 4x (both RoPE
/// treatments); key-conditional answers are right `key_extra` more often beyond.
fn run(seed_index: usize, gate_hits: usize, beyond_hits: usize) -> SeedRun {
    let n = 64;
    let mk = |multiple: usize, ntk: bool, hits: usize, distance: u32| Answers {
        ntk,
        posthoc: None,
        multiple,
        correct: (0..n).map(|i| i < (hits + 4).min(n)).collect(),
        exact: (0..n).map(|i| i < hits).collect(),
        distance: vec![distance; n],
    };
    SeedRun {
        variant: "v".into(),
        seed_index,
        recipe: Recipe::language_models(Init::Gpt2),
        train_loss: 0.1,
        train_s: 1.0,
        eval_s: 1.0,
        answers: vec![mk(1, true, gate_hits, 10), mk(4, true, beyond_hits, 100), mk(4, false, beyond_hits, 100)],
    }
}

fn claim() -> RetrievalClaim {
    RetrievalClaim {
        name: "retrieval-lssar".into(),
        statement: "LSSAR beats softmax".into(),
        row: RowRef { train: "lssa+rw15".parse().unwrap(), posthoc: None },
        baseline: RowRef { train: "softmax".parse().unwrap(), posthoc: None },
        delta: 0.05,
    }
}

fn group(name: &str, runs: BTreeMap<String, Vec<SeedRun>>) -> RegimeRuns {
    cell(name, Init::Gpt2, runs)
}

/// A task cell of initialisation `init`, its runs recording the recipe they were trained with.
fn cell(name: &str, init: Init, mut runs: BTreeMap<String, Vec<SeedRun>>) -> RegimeRuns {
    let regime = Regime {
        name: name.into(),
        placement: crate::retrieval::Placement::Spread,
        distractors_permille: 0,
        ablations: false,
        all_only: false,
        about: format!("cell {name}"),
        inits: vec![init],
    };
    for r in runs.values_mut().flatten() {
        r.recipe.init = init;
    }
    let settings = Settings { multiples: vec![1, 4], seeds: 3, ..Settings::for_regime("small", &regime) };
    RegimeRuns { regime, settings, runs }
}

#[test]
fn a_claim_needs_the_gate_then_reads_the_paired_exact_difference_beyond_t_train() {
    let mut m = BTreeMap::new();
    m.insert("lssa+rw15".to_string(), (0..3).map(|k| run(k, 64, 60 - k)).collect::<Vec<_>>());
    m.insert("softmax".to_string(), (0..3).map(|k| run(k, 64, 20 + 2 * k)).collect::<Vec<_>>());
    let g = group("a", m.clone());
    let j = judge(&g.settings, &claim(), &g.runs, &g.regime);
    assert_eq!(j.readings.len(), 2, "{j:?}");
    for r in &j.readings {
        assert_eq!(r.judgement.verdict, Verdict::Reproduced, "{r:?}");
        // Seeds: 60/64 - 20/64, 59/64 - 22/64, 58/64 - 24/64 (exact recall, not key-conditional).
        assert!((r.interval.estimate - (40.0 + 37.0 + 34.0) / 3.0 / 64.0).abs() < 1e-12, "{r:?}");
        assert!(r.evidence.df > 1.9 && r.evidence.se > 0.0);
    }
    // Equal rows: no effect, and the interval excludes the 5 points claimed.
    m.insert("softmax".to_string(), m["lssa+rw15"].clone());
    let g = group("a", m.clone());
    let j = judge(&g.settings, &claim(), &g.runs, &g.regime);
    assert!(j.readings.iter().all(|r| r.judgement.verdict == Verdict::SmallerThanClaimed), "{j:?}");
    // A seed below the gate: not judged, and the reason names the row and its 1x exact recall.
    m.insert("softmax".to_string(), vec![run(0, 64, 20), run(1, 32, 20), run(2, 64, 20)]);
    let g = group("a", m);
    let j = judge(&g.settings, &claim(), &g.runs, &g.regime);
    let why = j.not_judged.unwrap();
    assert!(j.readings.is_empty() && why.contains("`softmax` did not learn") && why.contains("50.0%"), "{why}");
}

/// Seed `k` of a row that beats softmax (all 64 questions right at 1x; 60, 59, 58 right beyond it)
/// and of one that loses to it (20, 22, 24 right beyond).
fn better(k: usize) -> SeedRun {
    run(k, 64, 60 - k)
}

fn worse(k: usize) -> SeedRun {
    run(k, 64, 20 + 2 * k)
}

/// LSSAR's runs from `a`, softmax's from `b`.
fn rows(a: fn(usize) -> SeedRun, b: fn(usize) -> SeedRun) -> BTreeMap<String, Vec<SeedRun>> {
    BTreeMap::from([
        ("lssa+rw15".to_string(), (0..3).map(a).collect::<Vec<_>>()),
        ("softmax".to_string(), (0..3).map(b).collect::<Vec<_>>()),
    ])
}

#[test]
fn the_robustness_line_says_whether_the_verdict_holds_in_every_regime() {
    let same = [group("a", rows(better, worse)), group("b", rows(better, worse))];
    let j = &verdicts(&same).unwrap()[0];
    assert_eq!(j.robustness(true), "reproduced in every regime");
    assert_eq!(j.counted().len(), 4, "two regimes x two RoPE treatments");
    let mixed = [group("a", rows(better, worse)), group("b", rows(worse, better))];
    let j = &verdicts(&mixed).unwrap()[0];
    assert_eq!(j.robustness(false), "depends on the regime: a reproduced, b contradicted");
    assert!(j.line().contains("under plain RoPE, depends on the regime"), "{}", j.line());
    // The verdicts of different regimes read different evaluations.
    let c = j.counted();
    assert_ne!(c[0].terms[0].0, c[2].terms[0].0);
}

/// The recipe axis: cells of a second initialisation are judged, counted in the report's family,
/// named in the robustness line, and the recipe text is read from the runs' records.
#[test]
fn recipe_cells_enter_the_robustness_line_the_family_and_the_golden_section() {
    let both =
        [cell("a", Init::Gpt2, rows(better, worse)), cell("a@torch-default", Init::TorchDefault, rows(better, worse))];
    let j = &verdicts(&both).unwrap()[0];
    assert_eq!(j.robustness(true), "reproduced in every regime and recipe");
    assert_eq!(j.counted().len(), 4, "two cells x two RoPE treatments enter the Holm family");
    let split =
        [cell("a", Init::Gpt2, rows(better, worse)), cell("a@torch-default", Init::TorchDefault, rows(worse, better))];
    let judged = verdicts(&split).unwrap();
    assert_eq!(
        judged[0].robustness(false),
        "depends on the regime or recipe: a reproduced, a@torch-default contradicted"
    );
    let text = recipe_text(&split);
    assert!(text.contains("`gpt2` in `a`; `torch-default` in `a@torch-default`"), "{text}");
    let t = trainer::config::TrainConfig::default();
    assert!(text.contains(&format!("betas ({}, {})", t.beta1, t.beta2)), "{text}");
    let section = across_section(&split, &judged);
    crate::report::tests::golden("retrieval_recipes.md", &crate::doc::to_markdown(&section, 2));
}

/// The regimes table says where the ablation rows ran, where only `--all` runs them, and that
/// no run trains them in a cell of another initialisation.
#[test]
fn the_regimes_table_tells_where_the_ablation_rows_run() {
    let e = crate::spec::all().unwrap().into_iter().find(|e| e.kind == crate::spec::Kind::Retrieval).unwrap();
    let ablation = e.rows.iter().find(|r| r.ablation).expect("an ablation row").train.to_string();
    let mut with = rows(better, worse);
    let softmax = with["softmax"].clone();
    with.extend(e.rows.iter().filter(|r| r.ablation).map(|r| (r.train.to_string(), softmax.clone())));
    assert!(with.contains_key(&ablation));
    let groups = [
        cell("ran", Init::Gpt2, with),
        cell("default", Init::Gpt2, rows(better, worse)),
        cell("default@torch-default", Init::TorchDefault, rows(better, worse)),
    ];
    let t = regimes_table(&e, &groups);
    let said: Vec<&str> = t.rows.iter().map(|r| r[3].as_str()).collect();
    assert_eq!(said, ["run", "`--all` only", "not run (GPT-2's initialisation only)"]);
}

#[test]
fn bins_split_questions_at_the_training_length_and_scores_differ() {
    let s = Settings { multiples: vec![1, 4], ..Settings::for_scale("small") };
    let mut r = run(0, 64, 32);
    r.answers[1].distance = (0..64).map(|i| if i < 16 { 63 } else { 64 }).collect();
    let one = std::slice::from_ref(&r);
    let inside = answers(&s, one, (true, None), &[4], Bin::Inside, Score::Exact);
    let beyond = answers(&s, one, (true, None), &[4], Bin::Beyond, Score::Exact);
    assert_eq!((inside[&0].len(), beyond[&0].len()), (16, 48));
    assert_eq!(inside[&0].iter().sum::<f64>(), 16.0, "the first 16 questions were answered");
    let acc = accuracy(beyond).unwrap();
    assert!((acc.estimate - 16.0 / 48.0).abs() < 1e-12);
    let key = accuracy(answers(&s, one, (true, None), &[4], Bin::Beyond, Score::KeyConditional)).unwrap();
    assert!((key.estimate - 20.0 / 48.0).abs() < 1e-12, "4 more right among the key's values");
}
