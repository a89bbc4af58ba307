//! The retrieval benchmark's sequences: associative recall among distractors. Each of `keys` keys
//! owns `values` value tokens; a *needle* is one key's value placed in the text; a *question* is the
//! token asking for one key, and its answer is that key's needle, copied: one attention hop back.
//!
//! A training window of `T_train` tokens asks `asked` keys: their needles, and a question per key,
//! each followed by its answer, in another order. Everything else is background: filler tokens, and
//! at a fixed density (possibly 0) *distractors*, needles of the keys not asked (so they look like the
//! answer's kind of token but never answer anything). Only the answers are supervised. Where the
//! needles and questions sit is the [`Placement`]:
//!
//! - [`Placement::Spread`]: the needles at random places of the window and the questions at random
//!   places after them. An evaluation prompt of `m x T_train` tokens is such a window at the end, after
//!   `(m - 1) x T_train` tokens of the same background; for `m > 1`, half of the asked needles, drawn
//!   at random, move to random places in that prefix. So at `m > 1` half of the questions have their
//!   needle within the last training length (*inside*) and half further back than any training window
//!   reached (*beyond*).
//! - [`Placement::Far`] (in the style of Zoology's multi-query associative recall): the needles in the
//!   window's first quarter, the questions in its last quarter. An evaluation prompt of `m x T_train`
//!   tokens keeps the needles in the first quarter of the whole prompt and the questions at its end, so
//!   at `m > 1` every question is asked further back than any training window reached.
//!
//! Either way, with distractors every question's row holds `m` times as many of them as in training:
//! the dilution the paper's length scaling and re-weighting are meant to counter.
//!
//! The background is synthetic, not natural text: the models are trained from scratch on this stream
//! and know no language, so natural text would be out of their distribution; distractors of the same
//! kind as the needles make the match one among many (one key among `keys`), and random filler dilutes
//! the row without matching anything.
//!
//! Everything is a function of a seed and an index ([`keyed`]): the training windows of a model and
//! the prompts every model answers (the same prompts for every row and seed, so comparisons are paired
//! on identical questions).

use anyhow::{Result, ensure};
use rand::Rng;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// One question of a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    /// Index of the question token; the answer is the next token, predicted from here.
    pub at: usize,
    /// The asked key.
    pub key: usize,
    /// The answer: value `answer` of the key ([`Layout::candidates`]).
    pub answer: usize,
    /// Tokens from the key's needle to the question.
    pub distance: usize,
}

/// A sequence and its questions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sequence {
    /// The tokens.
    pub tokens: Vec<u32>,
    /// Its questions, in order.
    pub queries: Vec<Query>,
}

/// Where a window's needles and questions sit (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Needles at random places, questions at random places after them; at `m x T_train`, half the
    /// needles move into the prefix.
    Spread,
    /// Needles in the first quarter, questions at the end (the last quarter of a training window); at
    /// `m x T_train`, the needles in the first quarter of the whole prompt.
    Far,
}

impl Placement {
    /// `spread` / `far`.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Spread => "spread",
            Placement::Far => "far",
        }
    }
}

/// The task's vocabulary, densities and placement. Ids: filler `0..filler`, then value `v` of key `k` at
/// `filler + k * values + v`, then the question of key `k` at `filler + keys * values + k`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Filler ids.
    pub filler: u32,
    /// Keys.
    pub keys: usize,
    /// Values per key (chance is `1 / values`).
    pub values: usize,
    /// Keys asked per sequence (each once, each with one needle); the others are distractors.
    pub asked: usize,
    /// Share (per mille) of filler positions that hold a distractor: a needle of a key not asked.
    pub density_permille: u32,
    /// The training length.
    pub t_train: usize,
    /// Where the needles and the questions sit.
    pub placement: Placement,
}

/// A generator keyed by `(seed, index)`: the same pair always gives the same stream.
pub fn keyed(seed: u64, index: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index);
    rng
}

impl Layout {
    /// Checks the sizes: `asked` pairs (a needle, a question and its answer: 3 tokens each, in slots of
    /// 2) fit a training window (for [`Placement::Far`], the needles fit its first quarter and the
    /// questions with their answers its last), and distractor keys exist when the density asks for
    /// them.
    pub fn new(
        filler: u32,
        keys: usize,
        values: usize,
        asked: usize,
        density_permille: u32,
        t_train: usize,
        placement: Placement,
    ) -> Result<Self> {
        ensure!(filler >= 1 && values >= 2 && asked >= 1, "a recall layout needs filler, 2 values and a question");
        ensure!(asked <= keys, "{asked} keys asked of {keys}");
        ensure!(density_permille <= 1000, "a density of {density_permille} per mille");
        ensure!(density_permille == 0 || asked < keys, "distractors need keys that are not asked");
        ensure!(4 * asked <= t_train, "{asked} pairs do not fit windows of {t_train} tokens");
        ensure!(
            placement != Placement::Far || 2 * asked <= t_train / 4,
            "{asked} questions with their answers do not fit the last quarter of windows of {t_train} tokens"
        );
        Ok(Self { filler, keys, values, asked, density_permille, t_train, placement })
    }

    /// Ids in the vocabulary.
    pub fn vocab(&self) -> usize {
        self.filler as usize + self.keys * (self.values + 1)
    }

    /// The token of value `v` of key `k`.
    pub fn needle(&self, k: usize, v: usize) -> u32 {
        self.filler + (k * self.values + v) as u32
    }

    /// The question of key `k`.
    pub fn ask(&self, k: usize) -> u32 {
        self.filler + (self.keys * self.values + k) as u32
    }

    /// The tokens an answer for key `k` is scored among: its values, in order.
    pub fn candidates(&self, k: usize) -> Vec<u32> {
        (0..self.values).map(|v| self.needle(k, v)).collect()
    }

    /// `(key, value)` of a needle token.
    fn needle_of(&self, t: u32) -> Option<(usize, usize)> {
        let i = t.checked_sub(self.filler)? as usize;
        (i < self.keys * self.values).then(|| (i / self.values, i % self.values))
    }

    /// The key a question token asks for.
    fn ask_of(&self, t: u32) -> Option<usize> {
        let i = (t.checked_sub(self.filler)? as usize).checked_sub(self.keys * self.values)?;
        (i < self.keys).then_some(i)
    }

    /// `n` tokens of filler with distractors of keys outside `asked`.
    fn background(&self, n: usize, asked: &[usize], rng: &mut ChaCha8Rng) -> Vec<u32> {
        let others: Vec<usize> = (0..self.keys).filter(|k| !asked.contains(k)).collect();
        (0..n)
            .map(|_| {
                if !others.is_empty() && rng.random_range(0..1000) < self.density_permille {
                    self.needle(others[rng.random_range(0..others.len())], rng.random_range(0..self.values))
                } else {
                    rng.random_range(0..self.filler)
                }
            })
            .collect()
    }

    /// Writes the asked keys' needles, then a question per key followed by its answer, in another
    /// order, into slots of 2 tokens spread at random over `window` ([`Placement::Spread`]).
    fn plant(&self, window: &mut [u32], asked: &[usize], rng: &mut ChaCha8Rng) {
        let values: Vec<usize> = asked.iter().map(|_| rng.random_range(0..self.values)).collect();
        let starts = slots(window.len(), 2 * asked.len(), rng);
        for (&at, (&k, &v)) in starts.iter().zip(asked.iter().zip(&values)) {
            window[at] = self.needle(k, v);
        }
        self.ask_all(window, &starts[asked.len()..], asked, &values, rng);
    }

    /// [`Placement::Far`]: the asked keys' needles at random distinct places of `window[..needles]`,
    /// and their questions, each followed by its answer, in another order, in slots of 2 spread at
    /// random over the last `T_train / 4` tokens.
    fn plant_far(&self, window: &mut [u32], needles: usize, asked: &[usize], rng: &mut ChaCha8Rng) {
        let values: Vec<usize> = asked.iter().map(|_| rng.random_range(0..self.values)).collect();
        let mut at: Vec<usize> = (0..needles).collect();
        at.shuffle(rng);
        for (&i, (&k, &v)) in at.iter().zip(asked.iter().zip(&values)) {
            window[i] = self.needle(k, v);
        }
        let end = window.len() - self.t_train / 4;
        let starts: Vec<usize> = slots(self.t_train / 4, asked.len(), rng).into_iter().map(|s| end + s).collect();
        self.ask_all(window, &starts, asked, &values, rng);
    }

    /// Writes a question per asked key followed by its answer at `starts`, the keys in a random order.
    fn ask_all(&self, window: &mut [u32], starts: &[usize], asked: &[usize], values: &[usize], rng: &mut ChaCha8Rng) {
        let mut order: Vec<usize> = (0..asked.len()).collect();
        order.shuffle(rng);
        for (&at, &i) in starts.iter().zip(&order) {
            window[at] = self.ask(asked[i]);
            window[at + 1] = self.needle(asked[i], values[i]);
        }
    }

    /// The questions of `tokens` with their keys, answers and distances (an asked key has one needle).
    fn queries(&self, tokens: &[u32]) -> Vec<Query> {
        let mut needle_at = vec![None; self.keys];
        let mut out = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            if let Some(key) = self.ask_of(t) {
                if let Some(pos) = needle_at[key] {
                    let (_, answer) = self.needle_of(tokens[i + 1]).expect("an answer follows its question");
                    out.push(Query { at: i, key, answer, distance: i - pos });
                }
            } else if self.needle_of(t).is_some() && (i == 0 || self.ask_of(tokens[i - 1]).is_none()) {
                // A needle (not an answer): the asked key's first one is the one its question means.
                let (key, _) = self.needle_of(t).expect("checked");
                needle_at[key].get_or_insert(i);
            }
        }
        out
    }

    fn draw_asked(&self, rng: &mut ChaCha8Rng) -> Vec<usize> {
        let mut keys: Vec<usize> = (0..self.keys).collect();
        keys.shuffle(rng);
        keys.truncate(self.asked);
        keys
    }

    /// Training window `index` of the model seeded `seed`: `T_train` tokens.
    pub fn training(&self, seed: u64, index: u64) -> Sequence {
        let mut rng = keyed(seed, index);
        let asked = self.draw_asked(&mut rng);
        let mut tokens = self.background(self.t_train, &asked, &mut rng);
        match self.placement {
            Placement::Spread => self.plant(&mut tokens, &asked, &mut rng),
            Placement::Far => self.plant_far(&mut tokens, self.t_train / 4, &asked, &mut rng),
        }
        let queries = self.queries(&tokens);
        Sequence { tokens, queries }
    }

    /// Evaluation prompt `index` of `multiple x T_train` tokens under the prompts' seed `seed`.
    pub fn prompt(&self, seed: u64, multiple: usize, index: u64) -> Result<Sequence> {
        ensure!(multiple >= 1, "a prompt of 0 training lengths");
        let mut rng = keyed(seed ^ (multiple as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15), index);
        let asked = self.draw_asked(&mut rng);
        let prefix = (multiple - 1) * self.t_train;
        let mut tokens = self.background(prefix + self.t_train, &asked, &mut rng);
        if self.placement == Placement::Far {
            self.plant_far(&mut tokens, multiple * self.t_train / 4, &asked, &mut rng);
            let queries = self.queries(&tokens);
            return Ok(Sequence { tokens, queries });
        }
        self.plant(&mut tokens[prefix..], &asked, &mut rng);
        if multiple > 1 {
            // Half of the asked needles (not the answers that repeat their tokens) move into the prefix.
            let mut needles: Vec<usize> = (prefix..tokens.len())
                .filter(|&i| {
                    self.needle_of(tokens[i]).is_some_and(|(k, _)| asked.contains(&k))
                        && self.ask_of(tokens[i - 1]).is_none()
                })
                .collect();
            needles.shuffle(&mut rng);
            let mut taken: Vec<usize> = Vec::new();
            for &from in &needles[..needles.len() / 2] {
                let to = loop {
                    let to = rng.random_range(0..prefix);
                    if !taken.contains(&to) {
                        break to;
                    }
                };
                taken.push(to);
                tokens[to] = tokens[from];
                tokens[from] = rng.random_range(0..self.filler);
            }
        }
        let queries = self.queries(&tokens);
        Ok(Sequence { tokens, queries })
    }
}

/// `n` starts of 2-token slots spread at random over `len` tokens, ascending and not overlapping:
/// gaps summing to the free room, from sorted cut points.
fn slots(len: usize, n: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    let room = len - 2 * n;
    let mut cuts: Vec<usize> = (0..n).map(|_| rng.random_range(0..=room)).collect();
    cuts.sort_unstable();
    cuts.iter().enumerate().map(|(i, &c)| c + 2 * i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(64, 32, 8, 8, 250, 64, Placement::Spread).unwrap()
    }

    /// The distractors of `s`: needles of keys it does not ask.
    fn distractors(l: &Layout, s: &Sequence) -> usize {
        let asked: Vec<usize> = s.queries.iter().map(|q| q.key).collect();
        s.tokens.iter().filter(|&&t| l.needle_of(t).is_some_and(|(k, _)| !asked.contains(&k))).count()
    }

    /// Each question is its key's ask token, followed by its answer, which is its needle's token, and
    /// the key has no other needle.
    fn check_questions(l: &Layout, s: &Sequence) {
        for q in &s.queries {
            assert_eq!(s.tokens[q.at], l.ask(q.key));
            assert_eq!(s.tokens[q.at + 1], l.needle(q.key, q.answer), "the answer follows");
            assert_eq!(s.tokens[q.at - q.distance], s.tokens[q.at + 1], "the needle is the answer's token");
            let of_key = s.tokens.iter().filter(|&&t| l.candidates(q.key).contains(&t)).count();
            assert_eq!(of_key, 2, "one needle per asked key, and its answer");
        }
    }

    #[test]
    fn training_windows_ask_their_keys_once_with_the_answer_next() {
        let l = layout();
        assert_eq!(l.vocab(), 64 + 32 * 9);
        let mut seen = 0;
        for i in 0..200 {
            let s = l.training(7, i);
            assert_eq!(s.tokens.len(), 64);
            assert_eq!(s.queries.len(), 8, "{:?}", s.tokens);
            check_questions(&l, &s);
            seen += distractors(&l, &s);
        }
        // 40 background positions per window at 25%: about 10 distractors each.
        assert!((1600..2400).contains(&seen), "{seen} distractors in 200 windows");
        assert_eq!(l.training(7, 3), l.training(7, 3), "a function of (seed, index)");
        assert_ne!(l.training(7, 3), l.training(8, 3));
        assert!(Layout::new(64, 8, 8, 8, 250, 64, Placement::Spread).is_err(), "distractors need keys not asked");
        assert!(Layout::new(64, 32, 8, 20, 0, 64, Placement::Spread).is_err(), "20 pairs do not fit 64 tokens");
        assert!(Layout::new(64, 32, 8, 9, 0, 64, Placement::Far).is_err(), "9 pairs do not fit the last 16 tokens");
    }

    #[test]
    fn long_prompts_move_half_the_needles_beyond_the_training_length() {
        let l = layout();
        let one = l.prompt(1, 1, 0).unwrap();
        assert_eq!(one.tokens.len(), 64);
        assert!(one.queries.iter().all(|q| q.distance < 64));
        for m in [2, 4, 16] {
            for i in 0..50 {
                let p = l.prompt(1, m, i).unwrap();
                assert_eq!(p.tokens.len(), m * 64);
                assert_eq!(p.queries.len(), 8);
                assert!(p.queries.iter().all(|q| q.at >= (m - 1) * 64), "the questions sit in the last window");
                let far = p.queries.iter().filter(|q| q.at - q.distance < (m - 1) * 64).count();
                assert_eq!(far, 4, "prompt {i} at {m}x");
                check_questions(&l, &p);
            }
        }
        assert_eq!(l.prompt(1, 4, 9).unwrap(), l.prompt(1, 4, 9).unwrap(), "the same prompts for every model");
        assert_ne!(l.prompt(1, 4, 9).unwrap().tokens[..64], l.prompt(1, 2, 9).unwrap().tokens[..64]);
    }

    #[test]
    fn far_prompts_keep_the_needles_in_the_first_quarter_and_ask_at_the_end() {
        let l = Layout::new(64, 32, 8, 8, 250, 64, Placement::Far).unwrap();
        for i in 0..100 {
            let s = l.training(3, i);
            assert_eq!((s.tokens.len(), s.queries.len()), (64, 8));
            check_questions(&l, &s);
            for q in &s.queries {
                assert!(q.at >= 48 && q.at - q.distance < 16, "needle {} question {}", q.at - q.distance, q.at);
            }
        }
        for m in [1, 2, 4, 16] {
            let len = m * 64;
            let mut total = 0;
            for i in 0..50 {
                let p = l.prompt(1, m, i).unwrap();
                assert_eq!((p.tokens.len(), p.queries.len()), (len, 8));
                check_questions(&l, &p);
                for q in &p.queries {
                    assert!(q.at >= len - 16, "the questions close the prompt");
                    assert!(q.at - q.distance < len / 4, "the needles sit in its first quarter");
                    // Beyond 1x, every question reaches further back than a training window.
                    assert!(m == 1 || q.distance >= 64, "distance {} at {m}x", q.distance);
                }
                total += distractors(&l, &p);
            }
            // The background's density holds at every length: a quarter of the (len - 24) tokens.
            let expected = 50.0 * (len - 24) as f64 / 4.0;
            assert!((total as f64 - expected).abs() < 0.15 * expected, "{total} distractors, about {expected}");
        }
        // Without distractors the background is filler alone.
        let clean = Layout::new(64, 32, 8, 8, 0, 64, Placement::Far).unwrap();
        for m in [1, 8] {
            let p = clean.prompt(1, m, 0).unwrap();
            assert_eq!(distractors(&clean, &p), 0);
            assert_eq!(p.tokens.iter().filter(|&&t| clean.needle_of(t).is_some()).count(), 16, "needles + answers");
        }
    }
}
