//! Every verdict the report counts, read as one family: the headline claims' whole-window readings,
//! the Tables 1-3 orderings and the retrieval claims in every regime. Holm-Bonferroni over the
//! family ([`crate::stats::holm`]) says which verdicts hold at the family-wise 5% level; the
//! evaluations each verdict reads say which verdicts share runs, and the rank of their contrasts how
//! many independent quantities the family measures.

use std::collections::{BTreeMap, BTreeSet};

use crate::stats::{self, Evidence, Interval, Judgement, Verdict};

/// One counted verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Counted {
    /// The claim's name.
    pub claim: String,
    /// Which reading of it (`NTK`, `plain`, `1x`, `far-25, NTK`, `ordering`).
    pub reading: String,
    /// The estimate with its 95% interval, standard error and degrees of freedom (none for a
    /// permutation test).
    pub evidence: Option<(Interval, Evidence)>,
    /// The verdict, why, and its one-sided p-value with the level it was decided at.
    pub judgement: Judgement,
    /// What it reads: `(evaluation, coefficient)`, an evaluation named so that two verdicts reading
    /// the same numbers name it alike (`softmax at 16x, NTK`).
    pub terms: Vec<(String, f64)>,
}

/// The family with its Holm-adjusted p-values.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// The verdicts, in report order.
    pub counted: Vec<Counted>,
    /// Holm-adjusted p-values on the 0.05 scale, by index into `counted` ([`stats::holm`]).
    pub adjusted: Vec<f64>,
}

impl Family {
    /// Adjusts `counted` together.
    pub fn new(counted: Vec<Counted>) -> Family {
        let adjusted = stats::holm(&counted.iter().map(|c| (c.judgement.p, c.judgement.alpha)).collect::<Vec<_>>());
        Family { counted, adjusted }
    }

    /// The verdict of `counted[i]` at the family-wise level: its own where its adjusted p-value is
    /// below [`stats::LEVEL`], inconclusive otherwise.
    pub fn adjusted_verdict(&self, i: usize) -> Verdict {
        let v = self.counted[i].judgement.verdict;
        if v.decided() && self.adjusted[i] < stats::LEVEL { v } else { Verdict::Inconclusive }
    }

    /// `(decided, of which hold at the family-wise level)`.
    pub fn survivors(&self) -> (usize, usize) {
        let decided = self.counted.iter().filter(|c| c.judgement.verdict.decided()).count();
        let hold = (0..self.counted.len()).filter(|&i| self.adjusted_verdict(i).decided()).count();
        (decided, hold)
    }

    /// The number of linearly independent contrasts among the verdicts that read numbers (the rank of
    /// their coefficient vectors over the evaluations), and how many such verdicts there are.
    pub fn independent(&self) -> (usize, usize) {
        let with_terms: Vec<&Counted> = self.counted.iter().filter(|c| !c.terms.is_empty()).collect();
        let keys: BTreeSet<&str> = with_terms.iter().flat_map(|c| c.terms.iter().map(|t| t.0.as_str())).collect();
        let index: BTreeMap<&str, usize> = keys.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        let rows: Vec<Vec<f64>> = with_terms
            .iter()
            .map(|c| {
                let mut v = vec![0.0; keys.len()];
                for (k, coef) in &c.terms {
                    v[index[k.as_str()]] += coef;
                }
                v
            })
            .collect();
        (rank(rows), with_terms.len())
    }

    /// The evaluations that more than one claim reads, grouped: each group is a set of evaluations and
    /// the claims that all read them (evaluations read by the same claims are listed together).
    pub fn shared(&self) -> Vec<(Vec<String>, Vec<String>)> {
        let mut readers: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for c in &self.counted {
            for (k, _) in &c.terms {
                readers.entry(k.as_str()).or_default().insert(c.claim.as_str());
            }
        }
        let mut groups: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
        for (k, claims) in readers.into_iter().filter(|(_, c)| c.len() > 1) {
            groups.entry(claims.into_iter().map(String::from).collect()).or_default().push(k.to_string());
        }
        groups.into_iter().map(|(claims, evals)| (evals, claims)).collect()
    }
}

/// The rank of `rows` by Gaussian elimination with partial pivoting (entries below 1e-9 of the
/// largest count as zero).
fn rank(mut rows: Vec<Vec<f64>>) -> usize {
    let cols = rows.first().map_or(0, Vec::len);
    let scale = rows.iter().flatten().fold(0.0f64, |m, x| m.max(x.abs()));
    if scale == 0.0 {
        return 0;
    }
    let (mut r, tol) = (0, 1e-9 * scale);
    for c in 0..cols {
        let Some(p) = (r..rows.len()).max_by(|&a, &b| rows[a][c].abs().total_cmp(&rows[b][c].abs())) else { break };
        if rows[p][c].abs() <= tol {
            continue;
        }
        rows.swap(r, p);
        for i in r + 1..rows.len() {
            let f = rows[i][c] / rows[r][c];
            for j in c..cols {
                rows[i][j] -= f * rows[r][j];
            }
        }
        r += 1;
        if r == rows.len() {
            break;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(claim: &str, verdict: Verdict, p: f64, terms: &[(&str, f64)]) -> Counted {
        Counted {
            claim: claim.into(),
            reading: "NTK".into(),
            evidence: None,
            judgement: Judgement { verdict, why: String::new(), p, alpha: 0.025 },
            terms: terms.iter().map(|(k, c)| (k.to_string(), *c)).collect(),
        }
    }

    #[test]
    fn holm_keeps_what_survives_the_family_and_names_the_shared_evaluations() {
        let rise = [("softmax 16x", 1.0), ("softmax 1x", -1.0)];
        let f = Family::new(vec![
            // Softmax's rise, and the interaction that holds it: rank 2 with LSSAR's rise.
            counted("softmax-degrades", Verdict::Reproduced, 1e-6, &rise),
            counted(
                "interaction",
                Verdict::Reproduced,
                0.004,
                &[("softmax 16x", 1.0), ("softmax 1x", -1.0), ("lssar 16x", -1.0), ("lssar 1x", 1.0)],
            ),
            counted(
                "lssar-flat",
                Verdict::Reproduced,
                0.02,
                &[("softmax 16x", -0.5), ("softmax 1x", 0.5), ("lssar 16x", 1.0), ("lssar 1x", -1.0)],
            ),
            counted("large-p", Verdict::Inconclusive, 0.4, &[("lssa 1x", 1.0), ("softmax 1x", -1.0)]),
        ]);
        // On the 0.05 scale: 2e-6, 0.008, 0.04, 0.8; Holm multiplies by 4, 3, 2, 1 (running maximum).
        let want = [8e-6, 0.024, 0.08, 0.8];
        for (a, w) in f.adjusted.iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{:?}", f.adjusted);
        }
        assert_eq!(f.adjusted_verdict(2), Verdict::Inconclusive, "0.08 does not survive");
        assert_eq!(f.adjusted_verdict(1), Verdict::Reproduced);
        assert_eq!(f.survivors(), (3, 2));
        // Four readings, three independent contrasts: lssar-flat = -(interaction) + 0.5 x softmax-degrades.
        assert_eq!(f.independent(), (3, 4));
        let shared = f.shared();
        assert!(shared.contains(&(
            vec!["softmax 16x".to_string()],
            vec!["interaction".into(), "lssar-flat".into(), "softmax-degrades".into()]
        )));
        assert!(shared.contains(&(
            vec!["softmax 1x".to_string()],
            vec!["interaction".into(), "large-p".into(), "lssar-flat".into(), "softmax-degrades".into()]
        )));
    }

    #[test]
    fn rank_counts_independent_rows() {
        assert_eq!(rank(vec![vec![1.0, 0.0], vec![2.0, 0.0]]), 1);
        assert_eq!(rank(vec![vec![1.0, 1.0], vec![1.0, -1.0], vec![3.0, 5.0]]), 2);
        assert_eq!(rank(vec![vec![0.0, 0.0]]), 0);
        assert_eq!(rank(Vec::new()), 0);
    }
}
