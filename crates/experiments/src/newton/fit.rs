//! The force law's exponents with intervals: the log-space power-law fit per seed
//! ([`super::regress::Normal`]), a bootstrap over the held-out orbits (each replicate draws orbits with
//! replacement, the same draw for every seed and variant, so comparisons are paired), with the seed
//! level drawn from a t distribution as [`crate::stats`] does for losses; and the band rule that says
//! whether a law is Newton's.

use serde::{Deserialize, Serialize};

use attn_core::fixtures::Rng;

use super::regress::Normal;
use crate::stats::{Interval, Verdict, student_t};

/// Newton's exponents `(a, b, k)` of `F = G m1^a m2^b r^k`.
pub const NEWTON: [f64; 3] = [1.0, 1.0, -2.0];

/// How far an exponent may sit from Newton's and still count as Newton's law, fixed in advance.
pub const BAND: f64 = 0.2;

/// Bootstrap replicates.
pub const REPLICATES: usize = 2000;

/// One seed's fit data: the normal equations of each held-out orbit's samples above the error floor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedOrbits {
    /// Per orbit, in the order the orbits were simulated (the same for every seed and variant).
    pub orbits: Vec<Normal>,
}

impl SeedOrbits {
    /// The fit on the orbits drawn `counts[o]` times each.
    fn fit(&self, counts: &[f64]) -> Option<[f64; 4]> {
        let mut total = Normal::default();
        for (o, &c) in self.orbits.iter().zip(counts) {
            if c > 0.0 {
                total.add(o, c);
            }
        }
        total.solve()
    }

    /// The fit on every orbit once.
    pub fn point(&self) -> Option<[f64; 4]> {
        self.fit(&vec![1.0; self.orbits.len()])
    }
}

/// The exponents `(a, b, k)` of `sum_t coef_t * mean over seeds of fit(seeds_t)`, each with a 95%
/// interval. Every term has the same seeds and orbits (seed `i` of two variants is paired, like the
/// orbits). `None` when a fit is impossible (too few samples above the floor in some seed).
pub fn exponents(terms: &[(f64, &[SeedOrbits])], rng_seed: u64) -> Option<[Interval; 3]> {
    let seeds = terms.first()?.1.len();
    let orbits = terms.first()?.1.first()?.orbits.len();
    if seeds == 0
        || orbits == 0
        || terms.iter().any(|(_, s)| s.len() != seeds || s.iter().any(|x| x.orbits.len() != orbits))
    {
        return None;
    }
    // The contrast's value per seed, for one orbit draw.
    let per_seed = |counts: &[f64]| -> Option<Vec<[f64; 3]>> {
        (0..seeds)
            .map(|s| {
                let mut v = [0.0; 3];
                for (coef, fits) in terms {
                    let beta = fits[s].fit(counts)?;
                    for i in 0..3 {
                        v[i] += coef * beta[i + 1];
                    }
                }
                Some(v)
            })
            .collect()
    };
    let mean3 = |xs: &[[f64; 3]]| [0, 1, 2].map(|i| xs.iter().map(|x| x[i]).sum::<f64>() / xs.len() as f64);
    let all = per_seed(&vec![1.0; orbits])?;
    let estimate = mean3(&all);
    // Seed level: the standard error of the seed mean, per exponent.
    let se = [0, 1, 2].map(|i| {
        if seeds < 2 {
            return 0.0;
        }
        let sd = (all.iter().map(|x| (x[i] - estimate[i]).powi(2)).sum::<f64>() / (seeds - 1) as f64).sqrt();
        sd / (seeds as f64).sqrt()
    });
    let mut rng = Rng::new(rng_seed);
    let mut reps: [Vec<f64>; 3] = Default::default();
    for _ in 0..REPLICATES {
        let mut counts = vec![0.0; orbits];
        for _ in 0..orbits {
            counts[(rng.uniform() * orbits as f64) as usize % orbits] += 1.0;
        }
        let Some(v) = per_seed(&counts) else { continue };
        let m = mean3(&v);
        let t = if seeds >= 2 { student_t(&mut rng, seeds - 1) } else { 0.0 };
        for i in 0..3 {
            reps[i].push(m[i] + t * se[i]);
        }
    }
    if reps[0].len() < REPLICATES / 2 {
        return None; // most replicates could not be fitted: no honest interval
    }
    Some([0, 1, 2].map(|i| {
        let r = &mut reps[i];
        r.sort_by(f64::total_cmp);
        let at = |q: f64| r[((q * (r.len() - 1) as f64).round() as usize).min(r.len() - 1)];
        Interval { estimate: estimate[i], lo: at(0.025), hi: at(0.975) }
    }))
}

/// Whether exponents are Newton's: reproduced when every interval lies inside Newton's value
/// `± BAND`, contradicted when some interval lies wholly outside it, inconclusive otherwise.
pub fn is_newton(e: &[Interval; 3]) -> Verdict {
    let inside = |i: &Interval, n: f64| i.lo >= n - BAND && i.hi <= n + BAND;
    let outside = |i: &Interval, n: f64| i.hi < n - BAND || i.lo > n + BAND;
    if e.iter().zip(NEWTON).all(|(i, n)| inside(i, n)) {
        Verdict::Reproduced
    } else if e.iter().zip(NEWTON).any(|(i, n)| outside(i, n)) {
        Verdict::Contradicted
    } else {
        Verdict::Inconclusive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::newton::regress::Sample;

    /// Orbits of planted samples `F = m1^a m2^b r^k` times log-normal noise of `sd`.
    fn planted(law: [f64; 3], sd: f64, orbits: usize, seed: u64) -> SeedOrbits {
        let mut rng = Rng::new(seed);
        SeedOrbits {
            orbits: (0..orbits)
                .map(|_| {
                    let (m1, m2) = (0.5 + rng.uniform(), 0.5 + rng.uniform());
                    let samples: Vec<Sample> = (0..40)
                        .map(|_| {
                            let r = 0.5 + 2.0 * rng.uniform();
                            let f = m1.powf(law[0]) * m2.powf(law[1]) * r.powf(law[2]) * (sd * rng.normal()).exp();
                            Sample { m1, m2, r, f }
                        })
                        .collect();
                    Normal::of(&samples)
                })
                .collect(),
        }
    }

    #[test]
    fn a_planted_newton_law_is_recovered_and_a_wrong_one_is_not() {
        let seeds: Vec<SeedOrbits> = (0..3).map(|s| planted(NEWTON, 0.05, 60, s)).collect();
        let e = exponents(&[(1.0, &seeds)], 1).unwrap();
        for (i, n) in e.iter().zip(NEWTON) {
            assert!(i.lo <= n && n <= i.hi && i.hi - i.lo < 0.1, "{i:?} around {n}");
        }
        assert_eq!(is_newton(&e), Verdict::Reproduced);
        let wrong: Vec<SeedOrbits> = (0..3).map(|s| planted([1.0, 1.0, -1.0], 0.05, 60, 10 + s)).collect();
        let e = exponents(&[(1.0, &wrong)], 2).unwrap();
        assert_eq!(is_newton(&e), Verdict::Contradicted, "{e:?}");
        // Very noisy forces: wide intervals that straddle the band.
        let noisy: Vec<SeedOrbits> = (0..3).map(|s| planted(NEWTON, 3.0, 8, 20 + s)).collect();
        let e = exponents(&[(1.0, &noisy)], 3).unwrap();
        assert_eq!(is_newton(&e), Verdict::Inconclusive, "{e:?}");
    }

    #[test]
    fn a_difference_of_two_variants_is_paired_and_centred() {
        let a: Vec<SeedOrbits> = (0..3).map(|s| planted(NEWTON, 0.05, 40, s)).collect();
        let b: Vec<SeedOrbits> = (0..3).map(|s| planted([1.0, 1.0, -1.5], 0.05, 40, 30 + s)).collect();
        let d = exponents(&[(1.0, &a), (-1.0, &b)], 4).unwrap();
        assert!(d[2].lo < -0.4 && d[2].hi > -0.6 && d[2].hi < 0.0, "k differs by -0.5: {:?}", d[2]);
        assert!(d[0].lo < 0.0 && d[0].hi > 0.0, "a does not differ: {:?}", d[0]);
        // Mismatched seeds or orbits cannot be paired.
        assert!(exponents(&[(1.0, &a), (-1.0, &b[..2])], 5).is_none());
    }
}
