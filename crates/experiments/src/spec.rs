//! The paper's tables and figures as data: `defs/<name>/experiment.toml` (one place per experiment,
//! with its README beside it), embedded in the binary, parsed and checked here, and the set of training
//! runs and evaluations they need.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use trainer::eval::Rope;

/// What an experiment shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Rows x lengths, next to the paper's numbers.
    Table,
    /// Loss against inference length, one line per row.
    LengthCurve,
    /// Loss against the post-hoc re-weighting power `p`, per row and length.
    PSweep,
    /// Attention-sink statistics per layer against length, and attention maps (no losses).
    Sinks,
    /// The Newton's-law experiment: its own small model per row, trained on orbits (no language model).
    Physics,
    /// Associative recall by prompt length and needle distance: small models of its own, trained from
    /// scratch on the task (no language-model losses).
    Retrieval,
    /// Zero-shot multiple choice on user-supplied data sets (`--downstream DIR`).
    Downstream,
}

impl Kind {
    /// Whether the experiment trains small models of its own (no language-model runs).
    pub fn trains_own_models(self) -> bool {
        match self {
            Kind::Physics | Kind::Retrieval => true,
            Kind::Table | Kind::LengthCurve | Kind::PSweep | Kind::Sinks | Kind::Downstream => false,
        }
    }

    /// Whether the default reproduction runs it (else only `reproduce --all`): Figure 2's p sweep and
    /// Newton's law are left to `--all`.
    pub fn in_default_run(self) -> bool {
        match self {
            Kind::PSweep | Kind::Physics => false,
            Kind::Table | Kind::LengthCurve | Kind::Sinks | Kind::Retrieval | Kind::Downstream => true,
        }
    }
}

/// A trained variant of the definitions: parsed when a definition is read (a name that does not parse
/// is a TOML error naming its key), and known by its name as written there, which keys the run
/// directories, the results and the report. Equal, ordered and hashed by that name; it reads as a
/// `&str` (`Deref`, `Borrow`), so maps keyed by it are looked up by name.
#[derive(Clone, Debug)]
pub struct TrainedVariant {
    name: String,
    variant: attn_core::Variant,
}

impl TrainedVariant {
    /// The name as the definitions write it.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The parsed variant (what a training's model config takes).
    pub fn variant(&self) -> &attn_core::Variant {
        &self.variant
    }
}

impl std::str::FromStr for TrainedVariant {
    type Err = attn_core::Error;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Ok(TrainedVariant { name: name.to_string(), variant: name.parse()? })
    }
}

impl std::ops::Deref for TrainedVariant {
    type Target = str;

    fn deref(&self) -> &str {
        &self.name
    }
}

impl std::borrow::Borrow<str> for TrainedVariant {
    fn borrow(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for TrainedVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl PartialEq for TrainedVariant {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for TrainedVariant {}

impl PartialEq<str> for TrainedVariant {
    fn eq(&self, other: &str) -> bool {
        self.name == other
    }
}

impl PartialEq<&str> for TrainedVariant {
    fn eq(&self, other: &&str) -> bool {
        self.name == *other
    }
}

impl PartialOrd for TrainedVariant {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TrainedVariant {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.name.cmp(&other.name)
    }
}

impl std::hash::Hash for TrainedVariant {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl Serialize for TrainedVariant {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name)
    }
}

impl<'de> Deserialize<'de> for TrainedVariant {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(|e| serde::de::Error::custom(format!("variant {name:?}: {e}")))
    }
}

/// One row (a line of a figure).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// Label in the report.
    pub label: String,
    /// The variant trained (attn-core name; a training-time re-weighting is part of it, `lssa+rw15`).
    pub train: TrainedVariant,
    /// Re-weighting applied after training to the model trained as `train` (the post-hoc reading).
    #[serde(default)]
    pub posthoc: Option<u32>,
    /// The paper's numbers at the first lengths (validation loss), if it has them.
    #[serde(default)]
    pub paper: Vec<f64>,
    /// An ablation of an ingredient, not one of the paper's rows: where an experiment has settings of
    /// its own (the retrieval benchmark's regimes), the default reproduction runs it only in those
    /// marked for it, and `--all` everywhere.
    #[serde(default)]
    pub ablation: bool,
}

/// How much of an experiment a reproduction runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Everything (`reproduce --all`).
    #[default]
    All,
    /// The default reproduction's share ([`headline`]).
    Headline,
}

/// One table or figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// Stable name (`table4`).
    pub name: String,
    /// Title in the report.
    pub title: String,
    /// Table or figure type.
    pub kind: Kind,
    /// Multiples of the training length to evaluate.
    pub lengths: Vec<usize>,
    /// Post-hoc powers of a p sweep.
    #[serde(default)]
    pub powers: Vec<u32>,
    /// Lengths (multiples) at which a sinks experiment draws attention maps.
    #[serde(default)]
    pub maps: Vec<usize>,
    /// Rows.
    pub rows: Vec<Row>,
    /// The experiment's README (filled in from `defs/<name>/README.md`).
    #[serde(skip)]
    pub readme: String,
    /// How much of it this reproduction runs (set by [`headline`]).
    #[serde(skip)]
    pub scope: Scope,
}

/// The embedded definitions, in report order: (TOML, README).
const DEFS: [(&str, &str); 10] = [
    (include_str!("../defs/table1/experiment.toml"), include_str!("../defs/table1/README.md")),
    (include_str!("../defs/table2/experiment.toml"), include_str!("../defs/table2/README.md")),
    (include_str!("../defs/table3/experiment.toml"), include_str!("../defs/table3/README.md")),
    (include_str!("../defs/table4/experiment.toml"), include_str!("../defs/table4/README.md")),
    (include_str!("../defs/figure1/experiment.toml"), include_str!("../defs/figure1/README.md")),
    (include_str!("../defs/figure2/experiment.toml"), include_str!("../defs/figure2/README.md")),
    (include_str!("../defs/sinks/experiment.toml"), include_str!("../defs/sinks/README.md")),
    (include_str!("../defs/retrieval/experiment.toml"), include_str!("../defs/retrieval/README.md")),
    (include_str!("../defs/downstream/experiment.toml"), include_str!("../defs/downstream/README.md")),
    (include_str!("../defs/newton/experiment.toml"), include_str!("../defs/newton/README.md")),
];

/// Every experiment, parsed and checked (variant names parse, powers are valid, paper columns fit).
pub fn all() -> anyhow::Result<Vec<Experiment>> {
    DEFS.iter()
        .map(|(toml_text, readme)| {
            let mut e: Experiment = toml::from_str(toml_text)?;
            e.readme = readme.to_string();
            e.check()?;
            Ok(e)
        })
        .collect()
}

impl Experiment {
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.lengths.is_empty() && self.lengths.iter().all(|&l| l >= 1), "{}: lengths", self.name);
        anyhow::ensure!(self.kind != Kind::PSweep || !self.powers.is_empty(), "{}: a p sweep needs powers", self.name);
        anyhow::ensure!(
            self.maps.iter().all(|m| self.lengths.contains(m)),
            "{}: every map length must be one of the lengths",
            self.name
        );
        for r in &self.rows {
            if let Some(p) = r.posthoc {
                let v = r.train.variant().clone();
                v.with_reweight(p).map_err(|e| anyhow::anyhow!("{}: row `{}`: {e}", self.name, r.label))?;
            }
            anyhow::ensure!(
                r.paper.len() <= self.lengths.len(),
                "{}: row `{}` has more paper numbers than lengths",
                self.name,
                r.label
            );
        }
        Ok(())
    }
}

/// The default reproduction's scope: `all` restricted to the rows that train one of `headline` (the
/// variants the headline claims read) with no post-hoc power or one of `powers`, and to the
/// experiments that read such rows through the language models' losses, sinks, retrieval or
/// downstream scores (the retrieval benchmark whole: its rows are models of its own), less the
/// experiments named in `skip` (the Tables 1-3 ordering tables, whose
/// verdicts compare their own single-seed rows). Figure 2's sweep (a p sweep), Newton's law (its own
/// models per row), the skipped tables and Table 4's other rows are left to `reproduce --all`.
pub fn headline(
    all: Vec<Experiment>,
    headline: &std::collections::BTreeSet<String>,
    powers: &[u32],
    skip: &[String],
) -> Vec<Experiment> {
    all.into_iter()
        .filter(|e| e.kind.in_default_run() && !skip.contains(&e.name))
        .filter_map(|mut e| {
            // The retrieval benchmark's rows are its own small models: it runs every row, its ablations
            // only in the regimes marked for them.
            if !e.kind.trains_own_models() {
                e.rows.retain(|r| headline.contains(r.train.as_str()) && r.posthoc.is_none_or(|p| powers.contains(&p)));
            }
            e.scope = Scope::Headline;
            (!e.rows.is_empty()).then_some(e)
        })
        .collect()
}

/// One evaluation of a trained model: a RoPE treatment, a post-hoc power, a length multiple.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EvalKey {
    /// `false`: plain RoPE, `true`: NTK-scaled.
    pub ntk: bool,
    /// Post-hoc re-weighting power.
    pub posthoc: Option<u32>,
    /// Multiple of the training length.
    pub multiple: usize,
}

impl EvalKey {
    /// The key of an evaluation; at 1x the RoPE treatment plays no part (NTK scaling starts beyond the
    /// training length), so both treatments give the one key `ntk: true`.
    pub fn new(ntk: bool, posthoc: Option<u32>, multiple: usize) -> EvalKey {
        EvalKey { ntk: ntk || multiple == 1, posthoc, multiple }
    }

    /// The RoPE treatment.
    pub fn rope(&self) -> Rope {
        if self.ntk { Rope::Ntk } else { Rope::Plain }
    }
}

/// Every training run (by trained variant name) and the evaluations each needs.
pub fn plan(experiments: &[Experiment]) -> BTreeMap<TrainedVariant, Vec<EvalKey>> {
    let mut out: BTreeMap<TrainedVariant, Vec<EvalKey>> = BTreeMap::new();
    // Physics and retrieval train small models of their own: no language-model runs.
    for e in experiments.iter().filter(|e| !e.kind.trains_own_models()) {
        for r in &e.rows {
            let needs = out.entry(r.train.clone()).or_default();
            let mut add = |ntk: bool, posthoc: Option<u32>| {
                for &m in &e.lengths {
                    needs.push(EvalKey::new(ntk, posthoc, m));
                }
            };
            match e.kind {
                Kind::Table | Kind::LengthCurve => {
                    add(true, r.posthoc);
                    add(false, r.posthoc);
                }
                Kind::PSweep => {
                    add(true, None);
                    for &p in &e.powers {
                        add(true, Some(p));
                    }
                }
                // Trained, but measured by [`sink_plan`] or by the downstream scorer, not by losses.
                Kind::Sinks | Kind::Downstream => {}
                Kind::Physics | Kind::Retrieval => unreachable!("filtered above"),
            }
        }
    }
    for v in out.values_mut() {
        v.sort();
        v.dedup();
    }
    out
}

/// One attention-sink measurement: a post-hoc power (or none) at a length multiple, NTK RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SinkKey {
    /// Post-hoc re-weighting power.
    pub posthoc: Option<u32>,
    /// Multiple of the training length.
    pub multiple: usize,
    /// Whether an attention map is drawn too.
    pub map: bool,
}

/// The attention-sink measurements each trained variant needs.
pub fn sink_plan(experiments: &[Experiment]) -> BTreeMap<String, Vec<SinkKey>> {
    let mut out: BTreeMap<String, Vec<SinkKey>> = BTreeMap::new();
    for e in experiments.iter().filter(|e| e.kind == Kind::Sinks) {
        for r in &e.rows {
            let needs = out.entry(r.train.to_string()).or_default();
            for &m in &e.lengths {
                needs.push(SinkKey { posthoc: r.posthoc, multiple: m, map: e.maps.contains(&m) });
            }
        }
    }
    for v in out.values_mut() {
        v.sort();
        v.dedup();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_holds_its_parsed_variant_and_a_bad_name_is_an_error_naming_its_key() {
        let row: Row = toml::from_str("label = \"L\"\ntrain = \"lssa+rw15\"\n").unwrap();
        assert_eq!(row.train.variant(), &"lssa".parse::<attn_core::Variant>().unwrap().with_reweight(15).unwrap());
        assert_eq!(row.train, "lssa+rw15", "known by its name as written");
        let err = toml::from_str::<Row>("label = \"L\"\ntrain = \"lsssa\"\n").unwrap_err().to_string();
        assert!(err.contains("train") && err.contains("lsssa"), "{err}");
    }

    #[test]
    fn every_definition_parses_and_the_plan_covers_every_row() {
        let all = all().unwrap();
        assert_eq!(
            all.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            [
                "table1",
                "table2",
                "table3",
                "table4",
                "figure1",
                "figure2",
                "sinks",
                "retrieval",
                "downstream",
                "newton"
            ]
        );
        // The physics and retrieval experiments train their own small models: no language-model runs.
        let own: Vec<_> = all.iter().filter(|e| e.kind.trains_own_models()).cloned().collect();
        assert_eq!(own.len(), 2);
        assert!(plan(&own).is_empty());
        let sinks = sink_plan(&all);
        assert_eq!(sinks.keys().collect::<Vec<_>>(), ["lssa", "lssa+rw15", "softmax"]);
        assert!(sinks["lssa"].contains(&SinkKey { posthoc: Some(15), multiple: 8, map: true }));
        let plan = plan(&all);
        // Tables 1-4 train 26 distinct variants (Table 4's post-hoc rows reuse their base models).
        assert_eq!(plan.len(), 26, "{:?}", plan.keys().collect::<Vec<_>>());
        let lssa = &plan["lssa"];
        for p in [None, Some(3), Some(15), Some(100)] {
            assert!(lssa.contains(&EvalKey { ntk: true, posthoc: p, multiple: 16 }), "{p:?}");
        }
        assert!(lssa.contains(&EvalKey { ntk: false, posthoc: Some(15), multiple: 8 }));
        // The paper's Table 4 numbers are carried for both readings of a re-weighted row.
        let t4 = &all[3];
        let rows: Vec<_> = t4.rows.iter().filter(|r| r.label.starts_with("LSSAR")).collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].paper, rows[1].paper);
        assert_eq!(rows[1].posthoc, Some(15));
    }

    #[test]
    fn the_default_scope_keeps_the_headline_rows_and_the_retrieval_benchmark() {
        let headline_variants: std::collections::BTreeSet<String> =
            ["softmax", "lssa", "lssa+rw15", "softmax+rw15"].iter().map(|s| s.to_string()).collect();
        let skip: Vec<String> = ["table1", "table2", "table3"].iter().map(|s| s.to_string()).collect();
        let h = headline(all().unwrap(), &headline_variants, &[15], &skip);
        let names: Vec<&str> = h.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["table4", "figure1", "sinks", "retrieval", "downstream"]);
        let p = plan(&h);
        assert_eq!(p.keys().map(|t| t.to_string()).collect::<std::collections::BTreeSet<_>>(), headline_variants);
        // Table 4 keeps its headline rows, with p = 15 post hoc but not p = 3.
        let t4: Vec<&str> = h[0].rows.iter().map(|r| r.label.as_str()).collect();
        assert!(t4.contains(&"LSSAR, p=15 (post hoc)") && !t4.contains(&"LSSA, p=3 (post hoc)"), "{t4:?}");
        assert!(!p["lssa"].iter().any(|k| k.posthoc == Some(3)));
        // The retrieval benchmark keeps its ablation rows.
        assert_eq!(h[3].rows.len(), all().unwrap()[7].rows.len());
    }
}
