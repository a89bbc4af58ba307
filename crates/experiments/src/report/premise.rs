//! The summary's premise paragraph, in every scale's report: the paper's comparisons at its longest
//! length read a row against a baseline (softmax) that has degraded there, so before the verdicts the
//! report says how much the baseline degrades at this scale, with its interval over seeds, against the
//! paper's rise; what that leaves the comparisons; and where the other scales' reports are.
//!
//! Which baseline, which comparisons and which lengths come from the definitions: the `rise` context
//! facts of `defs/claims.toml` name the baseline and the paper's length (8x), the claims that carry
//! such a fact are the comparisons, and the paper's numbers and the longest length are those of the
//! length table (Table 4).

use anyhow::Result;

use crate::claims::{Claim, Measure};
use crate::doc::{Block, Figure};
use crate::post::Figures;
use crate::runner::Runs;
use crate::spec::EvalKey;
use crate::stats::{Contrast, Interval, Rule, SeedLevel};

use super::OtherReport;

/// The baseline's rise from 1x to `multiple`, under NTK (`true`) or plain RoPE, with its interval.
fn rise(runs: &Runs, base: (&str, Option<u32>), ntk: bool, multiple: usize) -> Option<Contrast> {
    let terms = [(1.0, base.0, EvalKey::new(ntk, base.1, multiple)), (-1.0, base.0, EvalKey::new(ntk, base.1, 1))];
    crate::claims::contrast(runs, &terms, Measure::Whole, 1)
}

/// What the intervals read: several seeds, or one (and where its seed part comes from).
fn over(c: &Contrast) -> String {
    match c.seed_level {
        SeedLevel::Measured => format!("over {} seeds and the validation spans", c.seeds.len()),
        SeedLevel::Modelled(_) => {
            "one seed: the seed part of each interval is modelled on the rows that have several (see the seed-noise line under the verdicts)".into()
        }
        SeedLevel::Omitted => {
            "one seed, and no row has several: the intervals hold the validation spans' noise only, not the seeds'".into()
        }
    }
}

/// `the `gpu` scale's report, [REPRODUCTION-gpu.md](REPRODUCTION-gpu.md)` or `the `paper` scale has
/// no report yet`.
fn other_line(others: &[OtherReport]) -> Option<String> {
    let parts: Vec<String> = others
        .iter()
        .map(|o| match &o.link {
            Some(l) => format!("the `{}` scale's report, [{l}]({l})", o.scale),
            None => format!("the `{}` scale has no report yet", o.scale),
        })
        .collect();
    (!parts.is_empty()).then(|| format!("The same paragraph at the other scales: {}.", parts.join("; ")))
}

/// The premise paragraph: the baseline's rise from 1x to the paper's longest length and to ours, NTK
/// and plain, with 95% intervals, against the paper's; its consequence for the comparisons; the
/// other scales' reports. `None` when the definitions name no baseline rise.
pub(super) fn paragraph(claims: &[Claim], runs: &Runs, others: &[OtherReport]) -> Option<String> {
    let fact = claims.iter().flat_map(|c| &c.context).find(|f| f.kind == "rise")?;
    let base = (fact.train.as_str(), fact.posthoc);
    let name = match base.1 {
        Some(p) => format!("`{}` post hoc p = {p}", base.0),
        None => format!("`{}`", base.0),
    };
    let comparisons: Vec<&Claim> = claims
        .iter()
        .filter(|c| c.context.iter().any(|f| f.kind == "rise" && (f.train.as_str(), f.posthoc) == base))
        .collect();
    let names = comparisons.iter().map(|c| format!("`{}`", c.name)).collect::<Vec<_>>().join(", ");
    let table = super::length_table()?;
    let longest = *table.lengths.last()?;
    let paper_at = |m: usize| -> Option<f64> {
        let i = table.lengths.iter().position(|&l| l == m)?;
        table.rows.iter().find(|r| r.train == base.0 && r.posthoc == base.1)?.paper.get(i).copied()
    };
    let at = fact.multiple;
    let paper = paper_at(at).zip(paper_at(1)).map(|(a, b)| a - b);
    let paper_text = paper.map_or_else(
        || format!("in the paper's Table 4 (which gives no number for it at {at}x)"),
        |p| format!("in the paper's Table 4 its loss rises by {p:+.2} nats from 1x to {at}x"),
    );
    let mut s = format!(
        "**The premise.** The paper's comparisons at {at}x ({names}) read a row against {name} where {name} has degraded: {paper_text}."
    );
    let (Some(ntk), Some(plain)) = (rise(runs, base, true, at), rise(runs, base, false, at)) else {
        s.push_str(&format!(" Here {name} has no results at 1x and {at}x yet, so the premise is not measured."));
        s.extend(other_line(others).map(|l| format!(" {l}")));
        return Some(s);
    };
    let both = |a: &Interval, b: &Interval| format!("{} (NTK) and {} (plain)", a.show(), b.show());
    s.push_str(&format!(" Here it rises by {} from 1x to {at}x", both(&ntk.interval, &plain.interval)));
    if let (Some(n), Some(p)) = (rise(runs, base, true, longest), rise(runs, base, false, longest))
        && longest != at
    {
        s.push_str(&format!(", and by {} to {longest}x", both(&n.interval, &p.interval)));
    }
    s.push_str(&format!(" (nats, 95% intervals {})", over(&ntk)));
    if let Some(p) = paper.filter(|p| *p > 0.0) {
        // A share that rounds to zero is written `0%`, not `-0%`.
        let share = |c: &Contrast| format!("{:.0}%", 100.0 * c.interval.estimate / p).replace("-0%", "0%");
        s.push_str(&format!(": {} (NTK) and {} (plain) of the paper's rise at {at}x", share(&ntk), share(&plain)));
    }
    s.push('.');
    s.push_str(&consequence(&comparisons, &name, at, [("NTK", &ntk), ("plain", &plain)], paper));
    s.extend(other_line(others).map(|l| format!(" {l}")));
    Some(s)
}

/// What the measured rise leaves the comparisons: how far below the baseline a row can be at all,
/// where even the rise's upper end is below the size the comparisons count, and whether a verdict
/// against the paper's comparison says anything about the paper.
fn consequence(
    comparisons: &[&Claim],
    name: &str,
    at: usize,
    rises: [(&str, &Contrast); 2],
    paper: Option<f64>,
) -> String {
    let mut s = format!(
        " A row can be below {name} at {at}x by about {name}'s rise at most (were it equal to {name} at 1x and not to rise at all): here {} nats",
        rises.iter().map(|(r, c)| format!("{:+.3} ({r})", c.interval.estimate)).collect::<Vec<_>>().join(" and ")
    );
    s.push_str(&paper.map_or(".".into(), |p| format!(", against {p:.2} in the paper.")));
    let delta = comparisons
        .iter()
        .filter_map(|c| match c.rule() {
            Rule::Effect { delta } => Some(delta),
            _ => None,
        })
        .reduce(f64::min);
    if let Some(delta) = delta {
        let short: Vec<&str> = rises.iter().filter(|(_, c)| c.interval.hi < delta).map(|(r, _)| *r).collect();
        if !short.is_empty() {
            s.push_str(&format!(
                " Under {} RoPE even the upper end of that rise is below the {delta} nats the comparisons count: there \"below {name} at {at}x\" cannot be reproduced whatever the row does.",
                short.join(" and ")
            ));
        }
    }
    if let Some(p) = paper {
        let ropes = |xs: &[&(&str, &Contrast)]| xs.iter().map(|(r, _)| *r).collect::<Vec<_>>().join(" and ");
        let (strong, weak): (Vec<_>, Vec<_>) = rises.iter().partition(|(_, c)| c.interval.estimate >= 0.5 * p);
        if !weak.is_empty() {
            s.push_str(&format!(
                " Under {} RoPE {name} degrades by less than half as much as in the paper: a comparison read **contradicted** or **smaller than claimed** there is contradicted at this scale, not a refutation of the paper's comparison, whose premise this scale does not meet.",
                ropes(&weak)
            ));
        }
        if !strong.is_empty() {
            s.push_str(&format!(
                " Under {} RoPE it degrades at least half as much as in the paper: there the comparisons are read on the paper's footing.",
                ropes(&strong)
            ));
        }
    }
    s
}

/// The pilot of training length beside the premise (scales whose [`crate::scale::Scale::length_pilot`]
/// is set: the pilot trained their recipe): its figure, drawn from `docs/pilot/length.json`, and what it
/// shows, labelled as a pilot on seeds no verdict reads.
pub(super) fn pilot_blocks(scale: &crate::scale::Scale, figures: Figures<'_>) -> Result<Vec<Block>> {
    if !scale.length_pilot {
        return Ok(Vec::new());
    }
    let pilot = crate::pilot::length()?;
    if pilot.points.is_empty() {
        return Ok(Vec::new());
    }
    let name = "pilot_length";
    pilot.figure(&figures.dir.join(name))?;
    let seeds: std::collections::BTreeSet<u64> = pilot.points.iter().map(|p| p.seed).collect();
    let seeds: Vec<String> = seeds.iter().map(u64::to_string).collect();
    let steps: Vec<String> = pilot.steps().iter().map(usize::to_string).collect();
    Ok(vec![
        Block::from(format!(
            "How the premise depends on training (a **pilot**, `docs/PILOT.md`: seeds {}, which no verdict reads; {} steps of this recipe with the learning-rate schedule stretched to each): softmax's rise from 1x to 8x, and each row's gap to softmax at 1x and at 8x (plain RoPE), against the training tokens, means over the pilot's seeds.",
            seeds.join(" and "),
            steps.join(", ")
        )),
        Block::Figure(Figure::drawn(
            "Pilot: softmax's rise and each row's gap against training tokens",
            figures.rel,
            name,
        )),
    ])
}
