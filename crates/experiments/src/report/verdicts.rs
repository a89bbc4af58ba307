//! The report's summary and verdict sections: one sentence per claim saying what reproduces at this
//! scale (with a likely reason beside what does not), the verdict tables with SE, df, one-sided p and
//! the Holm-adjusted reading over every counted verdict, q across lengths, the claims added after
//! their runs were planned, the readings that share runs, and the seed-noise model.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use trainer::eval::Rope;

use crate::claims::{Claim, ContextFact, Judged, Measure, OrderingVerdict};
use crate::family::{Counted, FAMILY_LEVEL, Family};
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

/// A context fact in words, from our runs and the paper's Table 4.
fn context_line(f: &ContextFact, runs: &Runs) -> Option<String> {
    let table4 = crate::spec::all().ok()?.into_iter().find(|e| e.name == "table4")?;
    let paper_at = |train: &str, posthoc: Option<u32>, m: usize| -> Option<f64> {
        let i = table4.lengths.iter().position(|&l| l == m)?;
        table4.rows.iter().find(|r| r.train == train && r.posthoc == posthoc)?.paper.get(i).copied()
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
            let here = both(&[(1.0, &f.train, f.posthoc, f.multiple), (-1.0, "softmax", None, f.multiple)])?;
            let paper = match (paper_at(&f.train, f.posthoc, f.multiple), paper_at("softmax", None, f.multiple)) {
                (Some(a), Some(b)) => format!("{:+.4} in the paper", a - b),
                _ => "the paper has no number there".into(),
            };
            Some(format!("{name} minus softmax at {}x is {here} nats here, {paper}", f.multiple))
        }
    }
}

/// One summary sentence for a claim: its outcome under each reading, and the context beside a claim
/// that does not reproduce.
fn claim_sentence(j: &Judged, runs: &Runs) -> String {
    let whole: Vec<_> = j.readings.iter().filter(|r| r.measure == Measure::Whole).collect();
    if whole.is_empty() {
        return format!("- {}: **not judged** ({}).", j.claim.short, j.missing.as_deref().unwrap_or("no readings"));
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
    let mut s = format!("- {}: {outcome}.", capitalise(&j.claim.short));
    if let Rule::Equivalent { margin } = j.claim.rule() {
        let reach = whole.iter().map(|r| r.evidence.equivalence_reach()).fold(0.0, f64::max);
        let _ = write!(
            s,
            " At this scale, with these seeds, equivalence can be shown within ±{reach:.3} nats at best (the half-width of the 90% interval), against the ±{margin} claimed."
        );
    }
    if !(same && first == Verdict::Reproduced) {
        let facts: Vec<String> = j.claim.context.iter().filter_map(|f| context_line(f, runs)).collect();
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

/// The summary at the top of the report.
pub(super) fn summary_section(md: &mut String, judged: &[Judged], post_lines: &[String], family: &Family, runs: &Runs) {
    let _ = writeln!(md, "## Summary\n");
    let _ = writeln!(
        md,
        "What reproduces at this scale, one sentence per claim (whole windows; q and its 95% interval as the verdict table below defines them; beside a claim that does not reproduce, the facts of these runs and the paper's that most likely explain it). The paper's own comparisons (its Table 4) are the claims added in issue 46; the others test the shape of the length curves.\n"
    );
    for j in judged {
        let _ = writeln!(md, "{}", claim_sentence(j, runs));
    }
    for l in post_lines {
        let _ = writeln!(md, "- {l}");
    }
    let (decided, hold) = family.survivors();
    let (rank, reading) = family.independent();
    let _ = writeln!(
        md,
        "- Family-wise: {} verdicts are counted (every headline reading, ordering and retrieval reading in the tables below; the Newton's-law line is an observation and is not counted); {decided} decide their claim, and {hold} of those still do after Holm-Bonferroni over all {} at the {:.0}% level.",
        family.counted.len(),
        family.counted.len(),
        100.0 * FAMILY_LEVEL
    );
    let _ = writeln!(
        md,
        "- Independent findings: the {reading} verdicts that read numbers are linear contrasts spanning {rank} independent quantities (the rest are combinations of those); readings of the same trained models are correlated besides (\"Shared readings\" below).\n"
    );
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

/// The verdict tables.
pub(super) fn verdicts_section(
    md: &mut String,
    judged: &[Judged],
    orderings: &[OrderingVerdict],
    seed_noise: Option<SeedNoise>,
    family: &Family,
) {
    let _ = writeln!(md, "## Verdicts\n");
    let _ = writeln!(
        md,
        "Each claim is a paired difference of losses (paired on seed index and on validation span) with a deterministic 95% t interval over seeds and validation spans (Welch-Satterthwaite degrees of freedom `df`, standard error `SE`; `crates/experiments/src/stats/mod.rs`); the effect that counts was fixed before the runs (`crates/experiments/defs/claims.toml`). For an effect claim (`q > 0, at least d`), in this order: **contradicted** when the interval lies below 0; **reproduced** when it lies above 0 and the estimate reaches d; **smaller than claimed** when the whole interval lies below d (the claim's size is excluded); **inconclusive** otherwise. A bound (`q < d`) is reproduced below d and contradicted above it; an equivalence (`within ±m`) is reproduced when the 90% interval lies inside ±m and contradicted when the 95% interval lies wholly outside. `p` is the one-sided p-value of the verdict's own test (for inconclusive, of the claimed direction); `Holm p` adjusts it over all {} counted verdicts (each p first put on a 5% scale: twice a one-sided p read at 2.5%), and the last column is the verdict at that family-wise 5% level. The verdict reads the whole-window mean (the paper's measure); the tail measure is beside it, not counted.\n",
        family.counted.len()
    );
    let _ = writeln!(
        md,
        "| claim | RoPE | q, whole windows [95% interval] | SE | df | claimed | verdict | p | Holm p | after Holm | q, tail only | tail verdict |"
    );
    let _ = writeln!(md, "|---|---|---|---:|---:|---|---|---:|---:|---|---|---|");
    for j in judged {
        let seeds = j.seeds.iter().map(|(v, n)| format!("{v} x{n}")).collect::<Vec<_>>().join(", ");
        let name = format!("**{}**: {} (seeds: {seeds})", j.claim.name, j.claim.statement);
        if let Some(why) = &j.missing {
            let _ = writeln!(
                md,
                "| {name} | - | - | - | - | q {} | not judged: {why} | - | - | - | - | - |",
                j.claim.rule().show()
            );
            continue;
        }
        for r in j.readings.iter().filter(|r| r.measure == Measure::Whole) {
            let Some(i) = find(family, &j.claim.name, rope_name(r.rope)) else { continue };
            let [q, se, df, p, holm, after] = verdict_cells(family, i, 1.0);
            let tail = j.readings.iter().find(|t| t.rope == r.rope && t.measure == Measure::Tail);
            let (tq, tv) =
                tail.map_or(("-".into(), "-".into()), |t| (t.interval.show(), t.judgement.verdict.word().to_string()));
            let _ = writeln!(
                md,
                "| {name} | {} | {q} | {se} | {df} | q {} | **{}**: {} | {p} | {holm} | {after} | {tq} | {tv} |",
                rope_name(r.rope),
                j.claim.rule().show(),
                r.judgement.verdict.word(),
                r.judgement.why
            );
        }
    }
    let notes: Vec<String> = judged
        .iter()
        .flat_map(|j| {
            j.readings.iter().filter_map(move |r| {
                let measure = if r.measure == Measure::Whole { "whole windows" } else { "tails" };
                r.note.as_ref().map(|n| format!("- **{}** ({measure}, {}): {n}.", j.claim.name, rope_name(r.rope)))
            })
        })
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(md, "\nReadings restricted to the seeds every term has (the others lack a result):\n");
        for n in notes {
            let _ = writeln!(md, "{n}");
        }
    }
    across_table(md, judged);
    added_notes(md, judged.iter().map(|j| &j.claim));
    if family.counted.iter().any(|c| c.reading.contains(", ")) {
        let _ = writeln!(
            md,
            "\nRetrieval verdicts (exact recall beyond the training length, row minus baseline in percentage points; per regime, the section \"Associative recall\" below has the tables and the robustness lines):\n"
        );
        let _ = writeln!(
            md,
            "| claim | regime, RoPE | q, points [95% interval] | SE | df | verdict | p | Holm p | after Holm |"
        );
        let _ = writeln!(md, "|---|---|---|---:|---:|---|---:|---:|---|");
        for (i, c) in family.counted.iter().enumerate().filter(|(_, c)| c.reading.contains(", ")) {
            let [q, se, df, p, holm, after] = verdict_cells(family, i, 100.0);
            let _ = writeln!(
                md,
                "| **{}** | {} | {q} | {se} | {df} | **{}** | {p} | {holm} | {after} |",
                c.claim,
                c.reading,
                c.judgement.verdict.word()
            );
        }
    }
    let _ = writeln!(md);
    for o in orderings {
        let after = find(family, &format!("{} ordering", o.experiment), "1x").map_or(String::new(), |i| {
            format!("; Holm p {}, after Holm {}", show_p(family.adjusted[i]), family.adjusted_verdict(i).word())
        });
        let _ = writeln!(
            md,
            "- **{} ordering at 1x: {}**: {}{after} (pairs separated beyond noise in both the paper and ours are listed in its section).",
            o.experiment,
            o.verdict.word(),
            o.why
        );
    }
    match seed_noise {
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
            let _ = writeln!(
                md,
                "- Seed-to-seed noise of one row's 1x loss, pooled over the rows with several seeds: {:.4} nats (standard deviation); correlation between rows on a shared seed: {:.2}{clamp}, estimated from {} pairs of multi-seed rows ({} degrees of freedom); intervals of contrasts between single-seed rows use it (a difference of rows on one seed has seed variance sd^2 (1 - correlation) per unit of its squared coefficients: the shared part cancels). Contrasts of multi-seed rows measure their own seed noise and do not use it.",
                n.sd, n.rho, n.pairs, n.df
            );
        }
        None => {
            let _ = writeln!(
                md,
                "- No row has two seeds: the intervals show the validation spans' noise only, not the seeds'."
            );
        }
    }
    shared_section(md, family);
}

/// q at every length of each claim's `across`, per RoPE treatment.
fn across_table(md: &mut String, judged: &[Judged]) {
    let lengths: Vec<usize> = {
        let mut l: Vec<usize> = judged.iter().flat_map(|j| j.across.iter().map(|a| a.1)).collect();
        l.sort_unstable();
        l.dedup();
        l
    };
    if lengths.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nThe paper's comparisons at every length (q = softmax's loss minus the row's, whole windows, 95% interval; above 0: the row is below softmax; the verdicts read 8x, the longest length of the paper's Table 4):\n"
    );
    let mut head = String::from("| claim | RoPE |");
    let mut rule = String::from("|---|---|");
    for m in &lengths {
        let _ = write!(head, " {m}x |");
        rule.push_str("---:|");
    }
    let _ = writeln!(md, "{head}\n{rule}");
    for j in judged.iter().filter(|j| !j.across.is_empty()) {
        let mut by_rope: BTreeMap<&'static str, BTreeMap<usize, Interval>> = BTreeMap::new();
        for (rope, m, i) in &j.across {
            by_rope.entry(rope_name(*rope)).or_default().insert(*m, *i);
        }
        for (rope, cells) in by_rope.iter().rev() {
            let _ = write!(md, "| {} | {rope} |", j.claim.name);
            for m in &lengths {
                let _ = write!(md, " {} |", cells.get(m).map_or("-".into(), Interval::show));
            }
            let _ = writeln!(md);
        }
    }
}

/// When and why the claims added after their runs were planned came in.
fn added_notes<'a>(md: &mut String, claims: impl Iterator<Item = &'a Claim>) {
    let added: Vec<String> =
        claims.filter_map(|c| c.added.as_ref().map(|a| format!("- **{}**: added {a}.", c.name))).collect();
    if added.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\nClaims added after the runs they are judged on were planned. Their thresholds are the paper's numbers or rules already in `claims.toml`, never these results; the report before them already showed the Table 4 rows they read, so they were chosen knowing how those rows came out at this scale, and they copy the paper rather than pick sizes:\n"
    );
    for a in added {
        let _ = writeln!(md, "{a}");
    }
}

/// Which evaluations several claims read, and how many independent quantities the family measures.
fn shared_section(md: &mut String, family: &Family) {
    let shared = family.shared();
    if shared.is_empty() {
        return;
    }
    let (rank, n) = family.independent();
    let _ = writeln!(
        md,
        "\n### Shared readings\n\nSeveral verdicts read the same evaluations of the same trained models, so they are not independent findings: for example, a rise that one claim tests alone is part of another claim's contrast. The {n} verdicts that read numbers span {rank} independent quantities (the rank of their contrasts' coefficients over the evaluations); each line lists evaluations and every claim that reads all of them:\n"
    );
    for (evals, claims) in shared {
        let _ = writeln!(
            md,
            "- {}: {}",
            evals.join(", "),
            claims.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")
        );
    }
    let _ = writeln!(md);
}
