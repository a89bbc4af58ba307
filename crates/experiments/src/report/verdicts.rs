//! The report's summary and verdict sections: one sentence per claim saying what reproduces at this
//! scale (with a likely reason beside what does not), the verdict tables with SE, df, one-sided p and
//! the Holm-adjusted reading over every counted verdict, q across lengths, the claims added after
//! their runs were planned, the readings that share runs, and the seed-noise model.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use trainer::eval::Rope;

use crate::claims::{Claim, ContextFact, Judged, Measure, OrderingVerdict};
use crate::doc::{Align, Block, Item, Section, Table};
use crate::family::{Counted, Family};
use crate::runner::Runs;
use crate::spec::EvalKey;
use crate::stats::{Interval, Rule, SeedNoise, Verdict};

/// `NTK`, `plain`, `1x only`.
fn rope_name(rope: Option<Rope>) -> &'static str {
    match rope {
        None => "1x only",
        Some(Rope::Plain) => "plain",
        Some(Rope::Ntk) => "NTK",
    }
}

/// The name of the evaluation a claim term reads (equal for equal evaluations across claims).
fn evaluation(train: &str, posthoc: Option<u32>, multiple: usize, rope: Option<Rope>) -> String {
    let p = posthoc.map_or(String::new(), |p| format!(" post hoc p = {p}"));
    if multiple == 1 {
        format!("`{train}`{p} at 1x")
    } else {
        format!("`{train}`{p} at {multiple}x ({})", rope_name(rope))
    }
}

/// The headline claims' whole-window readings and the orderings as counted verdicts, followed by
/// the post-training kinds' (`more`).
pub(super) fn family(judged: &[Judged], orderings: &[OrderingVerdict], more: Vec<Counted>) -> Family {
    let mut counted = Vec::new();
    for j in judged {
        for r in j.readings.iter().filter(|r| r.measure == Measure::Whole) {
            counted.push(Counted {
                claim: j.claim.name.clone(),
                reading: rope_name(r.rope).to_string(),
                evidence: Some((r.interval, r.evidence)),
                judgement: r.judgement.clone(),
                terms: j
                    .claim
                    .terms
                    .iter()
                    .map(|t| (evaluation(&t.train, t.posthoc, t.multiple, r.rope), t.coef))
                    .collect(),
            });
        }
    }
    for o in orderings {
        let (p, alpha) = o.p();
        counted.push(Counted {
            claim: format!("{} ordering", o.experiment),
            reading: "1x".into(),
            evidence: None,
            judgement: crate::stats::Judgement { verdict: o.verdict, why: o.why.clone(), p, alpha },
            terms: Vec::new(),
        });
    }
    counted.extend(more);
    Family::new(counted)
}

/// `0.003` / `<1e-6`.
fn show_p(p: f64) -> String {
    if p < 1e-6 {
        "<1e-6".into()
    } else if p < 0.001 {
        format!("{p:.1e}")
    } else {
        format!("{p:.3}")
    }
}

/// The index in `family` of claim `name`'s reading `reading`.
fn find(family: &Family, name: &str, reading: &str) -> Option<usize> {
    family.counted.iter().position(|c| c.claim == name && c.reading == reading)
}

/// The row a `gap` fact of `claim` is a gap to: the first term of the claim's contrast that reads
/// another row than the fact's (the claims compare a row with its baseline).
fn gap_baseline<'a>(claim: &'a Claim, f: &ContextFact) -> Option<(&'a str, Option<u32>)> {
    claim.terms.iter().find(|t| (&t.train, t.posthoc) != (&f.train, f.posthoc)).map(|t| (t.train.as_str(), t.posthoc))
}

/// A context fact of `claim` in words, from our runs and the paper's length table.
fn context_line(claim: &Claim, f: &ContextFact, runs: &Runs) -> Option<String> {
    let table = super::length_table()?;
    let paper_at = |train: &str, posthoc: Option<u32>, m: usize| -> Option<f64> {
        let i = table.lengths.iter().position(|&l| l == m)?;
        table.rows.iter().find(|r| r.train == train && r.posthoc == posthoc)?.paper.get(i).copied()
    };
    let ours = |terms: &[(f64, &str, Option<u32>, usize)], ntk: bool| {
        let terms: Vec<(f64, &str, EvalKey)> =
            terms.iter().map(|&(c, v, p, m)| (c, v, EvalKey::new(ntk, p, m))).collect();
        crate::claims::contrast(runs, &terms, Measure::Whole, 1).map(|q| q.interval.estimate)
    };
    let both = |terms: &[(f64, &str, Option<u32>, usize)]| -> Option<String> {
        let ntk = ours(terms, true)?;
        let plain = ours(terms, false)?;
        Some(if (ntk - plain).abs() < 5e-4 {
            format!("{ntk:+.3}")
        } else {
            format!("{ntk:+.3} (NTK) / {plain:+.3} (plain)")
        })
    };
    let name = evaluation(&f.train, f.posthoc, 1, None).replace(" at 1x", "");
    match f.kind.as_str() {
        "rise" => {
            let here = both(&[(1.0, &f.train, f.posthoc, f.multiple), (-1.0, &f.train, f.posthoc, 1)])?;
            let paper = match (paper_at(&f.train, f.posthoc, f.multiple), paper_at(&f.train, f.posthoc, 1)) {
                (Some(a), Some(b)) => format!("{:+.2} in the paper", a - b),
                _ => "the paper has no number there".into(),
            };
            Some(format!("{name} rises by {here} nats from 1x to {}x here, {paper}", f.multiple))
        }
        _ => {
            let (base, base_p) = gap_baseline(claim, f)?;
            let here = both(&[(1.0, &f.train, f.posthoc, f.multiple), (-1.0, base, base_p, f.multiple)])?;
            let paper = match (paper_at(&f.train, f.posthoc, f.multiple), paper_at(base, base_p, f.multiple)) {
                (Some(a), Some(b)) => format!("{:+.4} in the paper", a - b),
                _ => "the paper has no number there".into(),
            };
            let base = base_p.map_or(base.to_string(), |p| format!("{base} post hoc p = {p}"));
            Some(format!("{name} minus {base} at {}x is {here} nats here, {paper}", f.multiple))
        }
    }
}

/// One summary sentence for a claim: its outcome under each reading, and the context beside a claim
/// that does not reproduce.
fn claim_sentence(j: &Judged, runs: &Runs) -> String {
    let whole: Vec<_> = j.readings.iter().filter(|r| r.measure == Measure::Whole).collect();
    if whole.is_empty() {
        return format!("{}: **not judged** ({}).", j.claim.short, j.missing.as_deref().unwrap_or("no readings"));
    }
    let first = whole[0].judgement.verdict;
    let same = whole.iter().all(|r| r.judgement.verdict == first);
    let shown: Vec<String> = whole
        .iter()
        .map(|r| {
            let rope = if r.rope.is_some() { format!("{} RoPE ", rope_name(r.rope)) } else { String::new() };
            if same {
                format!("{rope}{}", r.interval.show())
            } else {
                format!("**{}** under {rope}({})", r.judgement.verdict.word(), r.interval.show())
            }
        })
        .collect();
    let outcome = if same { format!("**{}** ({})", first.word(), shown.join("; ")) } else { shown.join(", ") };
    let mut s = format!("{}: {outcome}.", capitalise(&j.claim.short));
    if let Rule::Equivalent { margin } = j.claim.rule() {
        let reach = whole.iter().map(|r| r.evidence.equivalence_reach()).fold(0.0, f64::max);
        let _ = write!(
            s,
            " At this scale, with these seeds, equivalence can be shown within ±{reach:.3} nats at best (the half-width of the 90% interval), against the ±{margin} claimed."
        );
    }
    if !(same && first == Verdict::Reproduced) {
        let facts: Vec<String> = j.claim.context.iter().filter_map(|f| context_line(&j.claim, f, runs)).collect();
        if !facts.is_empty() {
            let _ = write!(s, " Likely reason: {}.", facts.join("; "));
        }
    }
    s
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next().map_or(String::new(), |f| f.to_uppercase().collect::<String>() + c.as_str())
}

/// The summary at the top of the report: the premise paragraph (when there is one), then a
/// sentence per claim and the family-wise lines.
pub(super) fn summary_section(
    judged: &[Judged],
    premise: Option<&str>,
    post_lines: &[String],
    family: &Family,
    runs: &Runs,
) -> Section {
    let mut s = Section::new("Summary");
    s.blocks.extend(premise.map(Block::from));
    s.push(
        "What reproduces at this scale, one sentence per claim (whole windows; q and its 95% interval as the verdict table below defines them; beside a claim that does not reproduce, the facts of these runs and the paper's that most likely explain it). The paper's own comparisons (its Table 4) are the claims added in issue 46; the others test the shape of the length curves.",
    );
    let mut items: Vec<String> = judged.iter().map(|j| claim_sentence(j, runs)).collect();
    items.extend(post_lines.iter().cloned());
    let (decided, hold) = family.survivors();
    let (rank, reading) = family.independent();
    items.push(format!(
        "Family-wise: {} verdicts are counted (every headline reading, ordering and retrieval reading in the tables below; the Newton's-law line is an observation and is not counted); {decided} decide their claim, and {hold} of those still do after Holm-Bonferroni over all {} at the {:.0}% level.",
        family.counted.len(),
        family.counted.len(),
        100.0 * crate::stats::LEVEL
    ));
    items.push(format!(
        "Independent findings: the {reading} verdicts that read numbers are linear contrasts spanning {rank} independent quantities (the rest are combinations of those); readings of the same trained models are correlated besides (\"Shared readings\" below)."
    ));
    s.push(Block::List(items.into_iter().map(Item::from).collect()));
    s
}

/// `+0.012 (SE 0.004, df 6.1)`.
fn verdict_cells(family: &Family, i: usize, unit: f64) -> [String; 6] {
    let c = &family.counted[i];
    let (q, se, df) = match &c.evidence {
        Some((iv, e)) => (
            format!("{:+.3} [{:+.3}, {:+.3}]", unit * iv.estimate, unit * iv.lo, unit * iv.hi),
            format!("{:.3}", unit * e.se),
            if e.df.is_finite() { format!("{:.1}", e.df) } else { "∞".into() },
        ),
        None => ("-".into(), "-".into(), "-".into()),
    };
    let adjusted = family.adjusted_verdict(i);
    let after = if c.judgement.verdict.decided() && adjusted != c.judgement.verdict {
        format!("**{}**", adjusted.word())
    } else {
        adjusted.word().to_string()
    };
    [q, se, df, show_p(c.judgement.p), show_p(family.adjusted[i]), after]
}

/// The verdicts section: how to read it, the claims' verdict table, the readings restricted to fewer
/// seeds, q across lengths, the claims added later, the retrieval verdicts, the orderings and the
/// seed-noise model, and the shared readings.
pub(super) fn verdicts_section(
    judged: &[Judged],
    orderings: &[OrderingVerdict],
    seed_noise: Option<SeedNoise>,
    family: &Family,
) -> Section {
    let mut s = Section::new("Verdicts");
    s.push(format!(
        "Each claim is a paired difference of losses (paired on seed index and on validation span) with a deterministic 95% t interval over seeds and validation spans (Welch-Satterthwaite degrees of freedom `df`, standard error `SE`; `crates/experiments/src/stats/mod.rs`); the effect that counts was fixed before the runs (`crates/experiments/defs/claims.toml`). For an effect claim (`q > 0, at least d`), in this order: **contradicted** when the interval lies below 0; **reproduced** when it lies above 0 and the estimate reaches d; **smaller than claimed** when the whole interval lies below d (the claim's size is excluded); **inconclusive** otherwise. A bound (`q < d`) is reproduced below d and contradicted above it; an equivalence (`within ±m`) is reproduced when the 90% interval lies inside ±m and contradicted when the 95% interval lies wholly outside. `p` is the one-sided p-value of the verdict's own test (for inconclusive, of the claimed direction); `Holm p` adjusts it over all {} counted verdicts (each p first put on a 5% scale: twice a one-sided p read at 2.5%), and the last column is the verdict at that family-wise 5% level. The verdict reads the whole-window mean (the paper's measure); the tail measure is beside it, not counted.",
        family.counted.len()
    ));
    s.push(claims_table(judged, family));
    let notes: Vec<Item> = judged
        .iter()
        .flat_map(|j| {
            j.readings.iter().filter_map(move |r| {
                let measure = if r.measure == Measure::Whole { "whole windows" } else { "tails" };
                r.note.as_ref().map(|n| format!("**{}** ({measure}, {}): {n}.", j.claim.name, rope_name(r.rope)))
            })
        })
        .map(Item::from)
        .collect();
    if !notes.is_empty() {
        s.push("Readings restricted to the seeds every term has (the others lack a result):");
        s.push(Block::List(notes));
    }
    s.blocks.extend(across_table(judged));
    s.blocks.extend(added_notes(judged.iter().map(|j| &j.claim)));
    if family.counted.iter().any(|c| c.reading.contains(", ")) {
        s.push(
            "Retrieval verdicts (exact recall beyond the training length, row minus baseline in percentage points; per regime, the section \"Associative recall\" below has the tables and the robustness lines):",
        );
        s.push(retrieval_table(family));
    }
    s.push(Block::List(closing_lines(orderings, seed_noise, family)));
    s.blocks.extend(shared_section(family).map(Block::Section));
    s
}

/// One row per claim and RoPE treatment: q, SE, df, the claim, the verdict and its p, Holm's, and the
/// tail measure beside it.
fn claims_table(judged: &[Judged], family: &Family) -> Table {
    let mut t = Table::new([
        ("claim", Align::Left),
        ("RoPE", Align::Left),
        ("q, whole windows [95% interval]", Align::Left),
        ("SE", Align::Right),
        ("df", Align::Right),
        ("claimed", Align::Left),
        ("verdict", Align::Left),
        ("p", Align::Right),
        ("Holm p", Align::Right),
        ("after Holm", Align::Left),
        ("q, tail only", Align::Left),
        ("tail verdict", Align::Left),
    ]);
    for j in judged {
        let seeds = j.seeds.iter().map(|(v, n)| format!("{v} x{n}")).collect::<Vec<_>>().join(", ");
        let name = format!("**{}**: {} (seeds: {seeds})", j.claim.name, j.claim.statement);
        let claimed = format!("q {}", j.claim.rule().show());
        if let Some(why) = &j.missing {
            let dash = || "-".to_string();
            t.row(vec![
                name,
                dash(),
                dash(),
                dash(),
                dash(),
                claimed,
                format!("not judged: {why}"),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
            ]);
            continue;
        }
        for r in j.readings.iter().filter(|r| r.measure == Measure::Whole) {
            let Some(i) = find(family, &j.claim.name, rope_name(r.rope)) else { continue };
            let [q, se, df, p, holm, after] = verdict_cells(family, i, 1.0);
            let tail = j.readings.iter().find(|t| t.rope == r.rope && t.measure == Measure::Tail);
            let (tq, tv) =
                tail.map_or(("-".into(), "-".into()), |t| (t.interval.show(), t.judgement.verdict.word().to_string()));
            let verdict = format!("**{}**: {}", r.judgement.verdict.word(), r.judgement.why);
            t.row(vec![
                name.clone(),
                rope_name(r.rope).into(),
                q,
                se,
                df,
                claimed.clone(),
                verdict,
                p,
                holm,
                after,
                tq,
                tv,
            ]);
        }
    }
    t
}

/// The retrieval readings of the family (their reading names a regime): q in points, the verdict, p
/// and Holm's.
fn retrieval_table(family: &Family) -> Table {
    let mut t = Table::new([
        ("claim", Align::Left),
        ("regime, RoPE", Align::Left),
        ("q, points [95% interval]", Align::Left),
        ("SE", Align::Right),
        ("df", Align::Right),
        ("verdict", Align::Left),
        ("p", Align::Right),
        ("Holm p", Align::Right),
        ("after Holm", Align::Left),
    ]);
    for (i, c) in family.counted.iter().enumerate().filter(|(_, c)| c.reading.contains(", ")) {
        let [q, se, df, p, holm, after] = verdict_cells(family, i, 100.0);
        let verdict = format!("**{}**", c.judgement.verdict.word());
        t.row(vec![format!("**{}**", c.claim), c.reading.clone(), q, se, df, verdict, p, holm, after]);
    }
    t
}

/// The orderings' verdicts, then the seed-noise model the intervals of single-seed rows use.
fn closing_lines(orderings: &[OrderingVerdict], seed_noise: Option<SeedNoise>, family: &Family) -> Vec<Item> {
    let mut lines = Vec::new();
    for o in orderings {
        let after = find(family, &format!("{} ordering", o.experiment), "1x").map_or(String::new(), |i| {
            format!("; Holm p {}, after Holm {}", show_p(family.adjusted[i]), family.adjusted_verdict(i).word())
        });
        lines.push(format!(
            "**{} ordering at 1x: {}**: {}{after} (pairs separated beyond noise in both the paper and ours are listed in its section).",
            o.experiment,
            o.verdict.word(),
            o.why
        ));
    }
    lines.push(match seed_noise {
        Some(n) => {
            let clamp = if n.rho_estimated != n.rho {
                format!(
                    " (estimated {:+.2}, clamped to {:.2}: the model's correlation lies in [0, {}])",
                    n.rho_estimated,
                    n.rho,
                    crate::stats::MAX_RHO
                )
            } else {
                String::new()
            };
            format!(
                "Seed-to-seed noise of one row's 1x loss, pooled over the rows with several seeds: {:.4} nats (standard deviation); correlation between rows on a shared seed: {:.2}{clamp}, estimated from {} pairs of multi-seed rows ({} degrees of freedom); intervals of contrasts between single-seed rows use it (a difference of rows on one seed has seed variance sd^2 (1 - correlation) per unit of its squared coefficients: the shared part cancels). Contrasts of multi-seed rows measure their own seed noise and do not use it.",
                n.sd, n.rho, n.pairs, n.df
            )
        }
        None => "No row has two seeds: the intervals show the validation spans' noise only, not the seeds'.".into(),
    });
    lines.into_iter().map(Item::from).collect()
}

/// q at every length of each claim's `across`, per RoPE treatment (with its introduction); nothing
/// when no claim has an `across`.
fn across_table(judged: &[Judged]) -> Vec<Block> {
    let lengths: Vec<usize> = {
        let mut l: Vec<usize> = judged.iter().flat_map(|j| j.across.iter().map(|a| a.1)).collect();
        l.sort_unstable();
        l.dedup();
        l
    };
    if lengths.is_empty() {
        return Vec::new();
    }
    let mut t = Table::new([("claim", Align::Left), ("RoPE", Align::Left)]);
    for m in &lengths {
        t.column(format!("{m}x"), Align::Right);
    }
    for j in judged.iter().filter(|j| !j.across.is_empty()) {
        let mut by_rope: BTreeMap<&'static str, BTreeMap<usize, Interval>> = BTreeMap::new();
        for (rope, m, i) in &j.across {
            by_rope.entry(rope_name(*rope)).or_default().insert(*m, *i);
        }
        for (rope, cells) in by_rope.iter().rev() {
            let cells = lengths.iter().map(|m| cells.get(m).map_or("-".into(), Interval::show));
            t.row([j.claim.name.clone(), rope.to_string()].into_iter().chain(cells).collect());
        }
    }
    vec![
        Block::from(
            "The paper's comparisons at every length (q = softmax's loss minus the row's, whole windows, 95% interval; above 0: the row is below softmax; the verdicts read 8x, the longest length of the paper's Table 4):",
        ),
        Block::Table(t),
    ]
}

/// When and why the claims added after their runs were planned came in (with its introduction).
fn added_notes<'a>(claims: impl Iterator<Item = &'a Claim>) -> Vec<Block> {
    let added: Vec<Item> =
        claims.filter_map(|c| c.added.as_ref().map(|a| Item::from(format!("**{}**: added {a}.", c.name)))).collect();
    if added.is_empty() {
        return Vec::new();
    }
    vec![
        Block::from(
            "Claims added after the runs they are judged on were planned. Their thresholds are the paper's numbers or rules already in `claims.toml`, never these results; the report before them already showed the Table 4 rows they read, so they were chosen knowing how those rows came out at this scale, and they copy the paper rather than pick sizes:",
        ),
        Block::List(added),
    ]
}

/// Which evaluations several claims read, and how many independent quantities the family measures.
fn shared_section(family: &Family) -> Option<Section> {
    let shared = family.shared();
    if shared.is_empty() {
        return None;
    }
    let (rank, n) = family.independent();
    let mut s = Section::new("Shared readings");
    s.push(format!(
        "Several verdicts read the same evaluations of the same trained models, so they are not independent findings: for example, a rise that one claim tests alone is part of another claim's contrast. The {n} verdicts that read numbers span {rank} independent quantities (the rank of their contrasts' coefficients over the evaluations); each line lists evaluations and every claim that reads all of them:"
    ));
    let items = shared
        .into_iter()
        .map(|(evals, claims)| {
            Item::from(format!(
                "{}: {}",
                evals.join(", "),
                claims.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")
            ))
        })
        .collect();
    s.push(Block::List(items));
    Some(s)
}
