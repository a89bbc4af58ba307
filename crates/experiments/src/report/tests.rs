//! The report's sections as typed values, and one section rendered against its checked-in golden file
//! (`tests/golden/`; regenerate with `UPDATE_GOLDEN=1`, then read the diff).

use std::path::Path;

use trainer::eval::{LengthLoss, Rope, WindowLosses};

use super::tables::{p_tables, table, table_blocks};
use crate::claims::{OrderingVerdict, Pair};
use crate::doc::{self, Block, Section};
use crate::post::Figures;
use crate::runner::{RunResult, Runs};
use crate::spec::{EvalKey, Experiment, Kind, Row};
use crate::stats::{Interval, SeedNoise, Verdict};

/// A finished run of `variant` (seed `seed`) with these evaluations (key, mean loss), each with
/// per-window losses around its mean over two spans of 4x.
fn run(variant: &str, seed: usize, evals: &[(EvalKey, f64)]) -> RunResult {
    let evals = evals
        .iter()
        .map(|&(k, loss)| {
            let rope = if k.ntk { Rope::Ntk } else { Rope::Plain };
            let windows: Vec<f32> =
                (0..8 / k.multiple).map(|w| (loss + 0.01 * ((w + seed) % 3) as f64 - 0.01) as f32).collect();
            let beyond = if k.multiple > 1 { windows.clone() } else { Vec::new() };
            let l = LengthLoss {
                multiple: k.multiple,
                seq_len: 32 * k.multiple,
                rope,
                reweight: k.posthoc,
                loss,
                tokens: 2048,
                windows: windows.len(),
                per_window: Some(WindowLosses { first: windows, rest: beyond.clone(), tail: beyond }),
            };
            (k, l)
        })
        .collect();
    RunResult {
        format: "test".into(),
        format_version: 1,
        scale: "test".into(),
        variant: variant.into(),
        seed_index: seed,
        config: String::new(),
        git_revision: "abc1234".into(),
        numbers_revision: "0123456789abcdef".into(),
        command: String::new(),
        train_wall_s: 12.4,
        eval_wall_s: 3.6,
        tokens_per_s: 2048.0,
        final_train_loss: 3.5,
        lr: 0.001,
        note: None,
        evals,
        sinks: Vec::new(),
        error: None,
    }
}

fn row(label: &str, train: &str, posthoc: Option<u32>, paper: &[f64]) -> Row {
    Row { label: label.into(), train: train.parse().unwrap(), posthoc, paper: paper.to_vec(), ablation: false }
}

fn experiment(name: &str, kind: Kind, lengths: &[usize], rows: Vec<Row>) -> Experiment {
    Experiment {
        name: name.into(),
        title: format!("Table X: {name}"),
        kind,
        lengths: lengths.to_vec(),
        powers: vec![15],
        maps: Vec::new(),
        rows,
        readme: String::new(),
        scope: crate::spec::Scope::All,
    }
}

/// Softmax on two seeds, LSSA on one (read also with p = 15 post hoc), at 1x and 4x.
fn runs() -> Runs {
    let k = EvalKey::new;
    let mut runs = Runs::new();
    let softmax = |seed: usize, d: f64| {
        run(
            "softmax",
            seed,
            &[(k(true, None, 1), 3.20 + d), (k(true, None, 4), 3.90 + d), (k(false, None, 4), 4.50 + d)],
        )
    };
    runs.insert("softmax".into(), vec![softmax(0, 0.0), softmax(1, 0.01)]);
    runs.insert(
        "lssa".into(),
        vec![run(
            "lssa",
            0,
            &[
                (k(true, None, 1), 3.25),
                (k(true, None, 4), 3.40),
                (k(false, None, 4), 3.60),
                (k(true, Some(15), 1), 3.30),
            ],
        )],
    );
    runs
}

/// Compares `rendered` with `tests/golden/<name>`, or writes it there with `UPDATE_GOLDEN=1`.
pub(crate) fn golden(name: &str, rendered: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, rendered).unwrap();
        return;
    }
    let regenerate = format!(
        "if the change is intended, regenerate it with `UPDATE_GOLDEN=1 cargo test -p experiments --lib report::tests` and read `git diff {}` before committing",
        path.display()
    );
    let expected =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}; {regenerate}", path.display()));
    if expected == rendered {
        return;
    }
    let (e, r): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), rendered.lines().collect());
    let at = (0..e.len().max(r.len())).find(|&i| e.get(i) != r.get(i)).unwrap_or(0);
    panic!(
        "{} differs from the rendered section, first at line {}:\n  golden:   {:?}\n  rendered: {:?}\n--- rendered ---\n{rendered}--- end ---\n{regenerate}",
        path.display(),
        at + 1,
        e.get(at).copied().unwrap_or("(end of file)"),
        r.get(at).copied().unwrap_or("(end of file)"),
    );
}

#[test]
fn a_table_section_renders_as_its_golden_file() {
    let e = experiment(
        "golden",
        Kind::Table,
        &[1],
        vec![
            row("Softmax", "softmax", None, &[3.1911]),
            row("LSSA", "lssa", None, &[3.1950]),
            row("LSSA p=15 (post hoc)", "lssa", Some(15), &[3.2600]),
            row("Not trained", "relu-l1", None, &[]),
        ],
    );
    let noise = SeedNoise { sd: 0.01, rho: 0.5, rho_estimated: 0.62, df: 4, pairs: 1 };
    let ordering = OrderingVerdict {
        experiment: "golden".into(),
        pairs: vec![
            Pair {
                rows: ("Softmax".into(), "LSSA".into()),
                paper: 3.1911 - 3.1950,
                ours: Interval { estimate: -0.045, lo: -0.071, hi: -0.019 },
                separated: (false, true),
            },
            Pair {
                rows: ("LSSA".into(), "LSSA p=15 (post hoc)".into()),
                paper: 3.1950 - 3.2600,
                // The runs' own difference (3.25 - 3.30), so the fixture reads as the rows above it.
                ours: Interval { estimate: -0.05, lo: -0.08, hi: -0.02 },
                separated: (true, true),
            },
        ],
        test: None,
        verdict: Verdict::Inconclusive,
        why: "1 of 1 separated pairs agree, which random orderings match or beat with p = 0.500".into(),
    };
    let dir = tempfile::tempdir().unwrap();
    let figures = Figures { dir: dir.path(), rel: "figures" };
    let blocks = table_blocks(&e, &runs(), Some(noise), Some(&ordering), figures).unwrap();
    // One length: no figure, so nothing is drawn.
    assert!(!blocks.iter().any(|b| matches!(b, Block::Figure(_))));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let section = Section { title: e.title.clone(), blocks };
    golden("table_section.md", &doc::to_markdown(&section, 2));
    // A pair whose signs differ, separated in both, is marked.
    let mut flipped = ordering.clone();
    flipped.pairs[1].ours = Interval { estimate: 0.05, lo: 0.02, hi: 0.08 };
    let blocks = table_blocks(&e, &runs(), Some(noise), Some(&flipped), figures).unwrap();
    let pairs = blocks.iter().filter_map(|b| if let Block::Table(t) = b { Some(t) } else { None }).next_back().unwrap();
    assert_eq!(pairs.column_cells("signs"), ["-", "**disagree**"]);
}

#[test]
fn a_table_reads_each_rows_seeds_both_rope_treatments_and_the_papers_numbers() {
    let e = experiment(
        "lengths",
        Kind::Table,
        &[1, 4],
        vec![row("Softmax", "softmax", None, &[3.1911, 5.4513]), row("LSSA p=15", "lssa", Some(15), &[3.26])],
    );
    let t = table(&e, &runs());
    assert_eq!(
        t.header,
        ["row", "trained as", "1x ours (ntk / plain)", "1x paper", "4x ours (ntk / plain)", "4x paper"]
    );
    assert_eq!(t.cell(0, "trained as"), Some("`softmax` (2 seeds)"));
    // The mean over softmax's two seeds; beyond 1x, NTK / plain.
    assert_eq!(t.cell(0, "1x ours (ntk / plain)"), Some("3.205"));
    assert_eq!(t.cell(0, "4x ours (ntk / plain)"), Some("3.905 / 4.505"));
    assert_eq!(t.cell(0, "4x paper"), Some("5.4513"));
    // A post-hoc row reads its model under the power; a length it was not evaluated at, or the paper
    // has no number for, shows `-`.
    assert_eq!(t.cell(1, "trained as"), Some("`lssa`, p = 15 post hoc"));
    assert_eq!(t.cell(1, "1x ours (ntk / plain)"), Some("3.300"));
    assert_eq!(t.cell(1, "4x ours (ntk / plain)"), Some("- / -"));
    assert_eq!(t.cell(1, "4x paper"), Some("-"));
}

#[test]
fn a_p_sweep_has_a_table_per_row_from_no_power_to_the_largest() {
    let e = experiment("sweep", Kind::PSweep, &[1], vec![row("LSSA", "lssa", None, &[])]);
    let blocks = p_tables(&e, &runs());
    let [Block::Text(title), Block::Table(t)] = blocks.as_slice() else { panic!("{blocks:?}") };
    assert_eq!(title, "**LSSA** (`lssa`, NTK RoPE, first seed)");
    assert_eq!(t.column_cells("p"), ["none", "15"]);
    assert_eq!(t.column_cells("1x"), ["3.250", "3.300"]);
}

#[test]
fn the_gap_figure_draws_the_length_curves_rows_against_its_first_row() {
    let curve = super::length_curve().expect("the definitions have a length curve");
    let base = &curve.rows[0];
    // Every row of the curve on two seeds, at 1x and 4x.
    let k = EvalKey::new;
    let mut runs = Runs::new();
    for (i, r) in curve.rows.iter().enumerate() {
        let l = 3.0 + 0.01 * i as f64;
        let evals = [(k(true, r.posthoc, 1), l), (k(true, r.posthoc, 4), l + 0.1), (k(false, r.posthoc, 4), l + 0.2)];
        let seeds = runs.entry(r.train.to_string()).or_insert_with(|| (0..2).map(|s| run(&r.train, s, &[])).collect());
        for (s, seed) in seeds.iter_mut().enumerate() {
            seed.evals.extend(run(&r.train, s, &evals).evals);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let blocks = super::tables::gap_blocks(&runs, Figures { dir: dir.path(), rel: "figures" }).unwrap();
    let [Block::Figure(f), Block::Text(caption)] = blocks.as_slice() else { panic!("{blocks:?}") };
    assert_eq!(f.alt, format!("gap to {} against length", base.train));
    assert_eq!((f.path.as_str(), f.svg.as_deref()), ("figures/claims_gap.png", Some("figures/claims_gap.svg")));
    assert!(caption.contains(&format!("minus {}'s", base.train)), "{caption}");
    assert!(dir.path().join("claims_gap.svg").exists());
    // Without the baseline's results there is nothing to draw.
    runs.remove(base.train.as_str());
    assert!(super::tables::gap_blocks(&runs, Figures { dir: dir.path(), rel: "figures" }).unwrap().is_empty());
}

#[test]
fn the_runs_section_lists_every_seed_and_keeps_a_notes_text() {
    let mut runs = runs();
    let failed = runs.get_mut("lssa").unwrap();
    failed[0].error = Some("training diverged at lr 0.001 | retried".into());
    let dir = tempfile::tempdir().unwrap();
    let s = super::runs::runs_section(&runs, Figures { dir: dir.path(), rel: "figures" }).unwrap();
    let t = s.tables().next().unwrap();
    assert_eq!(t.column_cells("trained variant"), ["`lssa`", "`softmax`", "`softmax`"]);
    assert_eq!(t.column_cells("seed"), ["0", "0", "1"]);
    assert_eq!(t.cell(0, "note"), Some("training failed: training diverged at lr 0.001 | retried"));
    assert_eq!(t.cell(1, "late drop"), Some("-"), "no metrics.jsonl: no curve");
    // The renderer keeps the `|` of a cell from ending it.
    assert!(doc::to_markdown(&s, 2).contains("| training failed: training diverged at lr 0.001 / retried |"));
}

#[test]
fn the_verdicts_are_a_table_row_per_reading_and_the_summary_a_sentence_per_claim() {
    let claims: crate::claims::Claims = toml::from_str(
        r#"
        [[claim]]
        name = "lssa-below"
        short = "LSSA is below softmax at 4x"
        statement = "LSSA has a lower loss than softmax at 4x"
        rule = "effect"
        delta = 0.02
        terms = [{ coef = 1.0, train = "softmax", multiple = 4 }, { coef = -1.0, train = "lssa", multiple = 4 }]
        context = [{ kind = "gap", train = "lssa", multiple = 1 }]
        added = "in this test"
        [ordering]
        paper_noise = 0.01
        experiments = []
        "#,
    )
    .unwrap();
    let runs = runs();
    let judged = crate::claims::judge(&claims, &runs);
    let family = super::verdicts::family(&judged, &[], Vec::new());
    let noise = crate::claims::seed_noise(&runs);
    let v = super::verdicts::verdicts_section(&judged, &[], noise, &family);
    assert_eq!(v.title, "Verdicts");
    let t = v.tables().next().unwrap();
    // One row per RoPE treatment of the claim beyond 1x, each naming its seeds.
    assert_eq!(t.rows.len(), 2, "{t:?}");
    let mut ropes = t.column_cells("RoPE");
    ropes.sort_unstable();
    assert_eq!(ropes, ["NTK", "plain"]);
    assert!(t.column_cells("claim").iter().all(|c| c.starts_with("**lssa-below**") && c.contains("seeds: ")));
    assert!(t.column_cells("claimed").iter().all(|c| *c == t.cell(0, "claimed").unwrap()));
    // LSSA has one seed of softmax's two: each reading is restricted to seed 0, and says so; the added
    // claim is listed; the closing list ends with the seed-noise model.
    let lists: Vec<&Vec<crate::doc::Item>> =
        v.blocks.iter().filter_map(|b| if let Block::List(l) = b { Some(l) } else { None }).collect();
    assert_eq!(lists[0].len(), 4, "two RoPE treatments x whole windows and tails: {:?}", lists[0]);
    assert!(lists[0][0].text.contains("restricted to seeds 0"), "{}", lists[0][0].text);
    assert_eq!(lists[1][0].text, "**lssa-below**: added in this test.");
    assert!(lists.last().unwrap().last().unwrap().text.starts_with("Seed-to-seed noise"), "{lists:?}");
    // The summary: the premise paragraph first, then the claim's sentence, then the family-wise lines.
    let s = super::verdicts::summary_section(
        &judged,
        Some("**The premise.** a paragraph"),
        &["a post-training line".into()],
        &family,
        &runs,
    );
    assert!(matches!(s.blocks.first(), Some(Block::Text(t)) if t.starts_with("**The premise.**")), "{s:?}");
    let Some(Block::List(items)) = s.blocks.last() else { panic!("{s:?}") };
    assert!(items[0].text.starts_with("LSSA is below softmax at 4x: "), "{}", items[0].text);
    assert_eq!(items[1].text, "a post-training line");
    assert!(items[2].text.starts_with("Family-wise: 2 verdicts are counted"), "{}", items[2].text);
}

/// A run of `variant` (seed `seed`) scored on two spans of 16x: at each length, every window of a span
/// has the same loss, `loss` plus the span's offset (so the spans' mean is `loss`, and a contrast's
/// per-span values are exact differences).
fn run16(variant: &str, seed: usize, evals: &[(EvalKey, f64)]) -> RunResult {
    let mut r = run(variant, seed, &[]);
    for &(k, loss) in evals {
        let windows: Vec<f32> =
            [0.005, -0.005].iter().flat_map(|off| std::iter::repeat_n((loss + off) as f32, 16 / k.multiple)).collect();
        let beyond = if k.multiple > 1 { windows.clone() } else { Vec::new() };
        let l = LengthLoss {
            multiple: k.multiple,
            seq_len: 32 * k.multiple,
            rope: if k.ntk { Rope::Ntk } else { Rope::Plain },
            reweight: k.posthoc,
            loss,
            tokens: 1024,
            windows: windows.len(),
            per_window: Some(WindowLosses { first: windows, rest: beyond.clone(), tail: beyond }),
        };
        r.evals.push((k, l));
    }
    r
}

/// The premise paragraph quotes the baseline's rise from 1x to 8x and 16x under both RoPE treatments
/// (the mean over seeds of each seed's rise, with its interval), the paper's rise from its Table 4,
/// says what a small rise leaves the comparisons, and names the other scales' reports.
#[test]
fn the_premise_paragraph_sets_the_baselines_rise_against_the_papers() {
    let claims = crate::claims::all().unwrap();
    let fact = claims.claim.iter().flat_map(|c| &c.context).find(|f| f.kind == "rise").unwrap();
    let base = fact.train.to_string();
    assert_eq!(fact.multiple, 8, "the paper's Table 4 ends at 8x");
    let table = super::length_table().unwrap();
    let row = table.rows.iter().find(|r| r.train == base.as_str() && r.posthoc.is_none()).unwrap();
    let paper = row.paper[table.lengths.iter().position(|&l| l == 8).unwrap()] - row.paper[0];
    let k = EvalKey::new;
    // Two seeds; the second rises 0.02 more beyond 1x. (1x, NTK 8x, plain 8x, NTK 16x, plain 16x).
    let seed = |s: usize, [one, n8, p8, n16, p16]: [f64; 5]| {
        let extra = 0.02 * s as f64;
        run16(
            &base,
            s,
            &[
                (k(true, None, 1), one),
                (k(true, None, 8), n8 + extra),
                (k(false, None, 8), p8 + extra),
                (k(true, None, 16), n16 + extra),
                (k(false, None, 16), p16 + extra),
            ],
        )
    };
    let losses = [3.20, 3.30, 3.35, 3.40, 3.50];
    let mut runs = Runs::new();
    runs.insert(base.clone(), vec![seed(0, losses), seed(1, losses)]);
    let others = [
        super::OtherReport { scale: "gpu".into(), link: Some("REPRODUCTION-gpu.md".into()) },
        super::OtherReport { scale: "paper".into(), link: None },
    ];
    let p = super::premise::paragraph(&claims.claim, &runs, &others).unwrap();
    // Each rise is the mean of the two seeds' rises.
    for (i, (what, m)) in [("NTK", 8), ("plain", 8), ("NTK", 16), ("plain", 16)].iter().enumerate() {
        let rise = losses[i + 1] + 0.01 - losses[0];
        assert!(p.contains(&format!("{rise:+.3} [")), "{what} {m}x: {rise:+.3} not in {p}");
    }
    assert!(p.contains(&format!("its loss rises by {paper:+.2} nats from 1x to 8x")), "{p}");
    assert!(p.contains("over 2 seeds"), "{p}");
    let share = 100.0 * (losses[1] + 0.01 - losses[0]) / paper;
    assert!(p.contains(&format!("{share:.0}% (NTK)")), "{p}");
    // Far below half the paper's rise under both treatments: a contradicted comparison is not a refutation.
    assert!(p.contains("Under NTK and plain RoPE") && p.contains("not a refutation"), "{p}");
    assert!(!p.contains("cannot be reproduced"), "the rise exceeds the comparisons' 0.02 nats: {p}");
    assert!(
        p.contains("[REPRODUCTION-gpu.md](REPRODUCTION-gpu.md)") && p.contains("the `paper` scale has no report yet")
    );
    // A baseline that does not rise, on one seed: the comparisons cannot be reproduced, and the
    // paragraph says that one seed is all it read.
    let flat = [3.20, 3.201, 3.202, 3.203, 3.204];
    runs.insert(base.clone(), vec![seed(0, flat)]);
    let p = super::premise::paragraph(&claims.claim, &runs, &[]).unwrap();
    assert!(p.contains("one seed"), "{p}");
    assert!(p.contains("cannot be reproduced whatever the row does"), "{p}");
    assert!(!p.contains("other scales"), "{p}");
    // No results of the baseline: the premise is not measured, and the paragraph says so.
    let p = super::premise::paragraph(&claims.claim, &Runs::new(), &[]).unwrap();
    assert!(p.contains("no results at 1x and 8x yet"), "{p}");
}

/// A scale whose recipe the pilot of training length trained shows the pilot's figure, labelled as a
/// pilot with its seeds and step counts, and draws it; any other scale shows nothing of it.
#[test]
fn the_pilot_of_training_length_is_shown_beside_the_premise_where_it_trained_the_recipe() {
    let dir = tempfile::tempdir().unwrap();
    let figures = Figures { dir: dir.path(), rel: "figures" };
    let small = crate::scale::Scale::by_name("small").unwrap();
    assert!(small.length_pilot && small.history.is_some_and(|h| h.contains("issue 58")));
    let blocks = super::premise::pilot_blocks(&small, figures).unwrap();
    let pilot = crate::pilot::length().unwrap();
    let text = format!("{blocks:?}");
    assert!(text.contains("**pilot**") && text.contains("1337 and 1338"), "{text}");
    let steps: Vec<String> = pilot.steps().iter().map(usize::to_string).collect();
    assert!(text.contains(&steps.join(", ")), "{text}");
    assert!(matches!(blocks.last(), Some(crate::doc::Block::Figure(_))), "{text}");
    assert!(dir.path().join("pilot_length.png").is_file() && dir.path().join("pilot_length.svg").is_file());
    // The pilot's seeds are not the scale's verdict seeds.
    let seed = small.train.seed;
    assert!(pilot.points.iter().all(|p| p.seed < seed || p.seed >= seed + small.headline_seeds as u64));
    let smoke = crate::scale::Scale::by_name("smoke").unwrap();
    assert!(super::premise::pilot_blocks(&smoke, figures).unwrap().is_empty());
}
