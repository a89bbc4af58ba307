//! Associative recall in token space: the retrieval task a small model can learn at its training
//! length and be asked beyond it.
//!
//! A *needle* is three tokens `M K V`: a marker, a key from a closed set of [`KEYS`] tokens and a value
//! from a closed set of [`VALUES`] tokens. A *question* is `M K` at the end of a sequence; its answer is
//! the value that followed `M K` earlier. The distance of a question is how far back its needle's value
//! sits, so "beyond the training length" means attending further back than any training sequence
//! allowed.
//!
//! - [`RecallTask::training_window`] turns one training window into a multi-query recall sequence
//!   (several needles, then questions about each of them in another order, every answer in place), so
//!   ordinary next-token loss on the whole window teaches the task.
//! - [`RecallMix`] wraps any [`BatchSource`] and replaces a fixed share of its windows by such
//!   sequences, deterministically: whether a window is replaced, and its needles, are a function of the
//!   seed and the window's own tokens, so a resumed run, and the same run on any number of ranks, see
//!   the same sequences.
//! - [`RecallTask::prompt`] builds an evaluation prompt of any length: filler text, the asked needle at
//!   an exact distance from the question, and distractor needles with other keys.
//!
//! The task's tokens are the ids just below the top of the model's vocabulary: the last merges of a
//! BPE (its rarest tokens), or ids a padded vocabulary never produces. They keep their ordinary
//! meaning elsewhere in the text; a needle is recognised by the marker followed by a key.

use anyhow::{Result, ensure};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::train::BatchSource;

/// Keys in the closed set.
pub const KEYS: usize = 16;
/// Values in the closed set (an answer is one of these: chance is `1 / VALUES`).
pub const VALUES: usize = 32;

/// The tokens of the task for one vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallTask {
    /// The marker that opens a needle and a question.
    pub marker: u32,
    /// The keys.
    pub keys: Vec<u32>,
    /// The values (the candidates an answer is scored among).
    pub values: Vec<u32>,
}

/// One evaluation prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallPrompt {
    /// The tokens, ending with the question `M K`; the answer is the next token.
    pub tokens: Vec<u32>,
    /// The answer.
    pub answer: u32,
    /// Index of the answer in [`RecallTask::values`].
    pub answer_index: usize,
    /// Index in `tokens` of the asked needle's value.
    pub value_at: usize,
}

impl RecallTask {
    /// The task's tokens for a vocabulary of `vocab_size` ids: the marker is `vocab_size - 2` (the top
    /// id is left alone, where some tokenizers keep a special token), then the keys, then the values,
    /// downwards.
    pub fn for_vocab(vocab_size: usize) -> Result<Self> {
        let need = 2 + KEYS + VALUES;
        ensure!(
            vocab_size >= 4 * need,
            "a vocabulary of {vocab_size} ids is too small for the recall task (at least {})",
            4 * need
        );
        let id = |i: usize| (vocab_size - 2 - i) as u32;
        Ok(Self {
            marker: id(0),
            keys: (1..=KEYS).map(id).collect(),
            values: (1 + KEYS..1 + KEYS + VALUES).map(id).collect(),
        })
    }

    /// Questions per training window of `len` tokens (as many needles, 6 tokens per pair).
    pub fn pairs_for(len: usize) -> usize {
        (len / 12).clamp(1, 4)
    }

    /// Rewrites `window` (a training window of `T + 1` tokens: `x` is its first `T`, `y` its last
    /// `T`) into a recall sequence on its own text: [`RecallTask::pairs_for`] needles with distinct
    /// keys, then a question for each, in a shuffled order, each followed by its answer. Slots are
    /// drawn at random, so the distances spread from a few tokens to nearly the window.
    pub fn training_window(&self, window: &mut [u32], rng: &mut impl Rng) -> Result<()> {
        let n = window.len();
        let pairs = Self::pairs_for(n);
        ensure!(n >= 6 * pairs, "a {n}-token window cannot hold {pairs} needles and questions");
        let starts = spaced_starts(n, 2 * pairs, 3, rng);
        let mut keys = self.keys.clone();
        keys.shuffle(rng);
        let keys = &keys[..pairs];
        let values: Vec<u32> = (0..pairs).map(|_| self.values[rng.random_range(0..VALUES)]).collect();
        let mut order: Vec<usize> = (0..pairs).collect();
        order.shuffle(rng);
        for (slot, &s) in starts.iter().enumerate() {
            let i = if slot < pairs { slot } else { order[slot - pairs] };
            window[s..s + 3].copy_from_slice(&[self.marker, keys[i], values[i]]);
        }
        Ok(())
    }

    /// An evaluation prompt of `len` tokens of `filler` (from a random offset) with the asked needle's
    /// value `distance` tokens before the question's key (the last token), and `distractors` needles
    /// of other keys and values at random places.
    pub fn prompt(
        &self,
        filler: &[u16],
        len: usize,
        distance: usize,
        distractors: usize,
        rng: &mut impl Rng,
    ) -> Result<RecallPrompt> {
        ensure!(distractors < KEYS, "{distractors} distractors need as many other keys (there are {})", KEYS - 1);
        ensure!(
            distance >= 2 && distance + 3 <= len,
            "a needle {distance} tokens before the question does not fit a {len}-token prompt"
        );
        ensure!(filler.len() >= len, "{} filler tokens, {len} needed", filler.len());
        let start = rng.random_range(0..=filler.len() - len);
        let mut tokens: Vec<u32> = filler[start..start + len].iter().map(|&t| u32::from(t)).collect();
        let q = len - 1; // the question's key
        let value_at = q - distance;
        let mut keys = self.keys.clone();
        keys.shuffle(rng);
        let answer_index = rng.random_range(0..VALUES);
        let answer = self.values[answer_index];
        tokens[q - 1..=q].copy_from_slice(&[self.marker, keys[0]]);
        tokens[value_at - 2..=value_at].copy_from_slice(&[self.marker, keys[0], answer]);
        // Distractors: free 3-token slots that overlap neither the needle nor the question.
        let mut placed = 0;
        let mut taken = vec![(value_at - 2, value_at + 1), (q - 1, q + 1)];
        for _ in 0..64 * (distractors + 1) {
            if placed == distractors || len < 3 {
                break;
            }
            let s = rng.random_range(0..=len - 3);
            if taken.iter().any(|&(a, b)| s < b && a < s + 3) {
                continue;
            }
            let v = self.values[rng.random_range(0..VALUES)];
            tokens[s..s + 3].copy_from_slice(&[self.marker, keys[1 + placed], v]);
            taken.push((s, s + 3));
            placed += 1;
        }
        Ok(RecallPrompt { tokens, answer, answer_index, value_at })
    }
}

/// `count` sorted starts of non-overlapping `width`-token slots in `0..n`, uniformly spread.
fn spaced_starts(n: usize, count: usize, width: usize, rng: &mut impl Rng) -> Vec<usize> {
    // Choose `count` gaps summing to the free room, by drawing cut points in it.
    let room = n - count * width;
    let mut cuts: Vec<usize> = (0..count).map(|_| rng.random_range(0..=room)).collect();
    cuts.sort_unstable();
    cuts.iter().enumerate().map(|(i, &c)| c + i * width).collect()
}

/// A [`BatchSource`] that replaces a share of another's windows by recall sequences
/// ([`RecallTask::training_window`] on the window's own text). Whether a window is replaced, and its
/// needles, depend only on `seed` and the window's tokens: a resumed run, or the same run split over
/// data-parallel ranks, sees the same sequences (a window seen again in a later epoch gets the same
/// sequence again).
pub struct RecallMix<'a> {
    inner: &'a mut dyn BatchSource,
    task: RecallTask,
    share: f64,
    seq_len: usize,
    seed: u64,
}

impl<'a> RecallMix<'a> {
    /// Mixes `share` (in `[0, 1]`) recall windows of `seq_len` tokens into `inner`'s batches.
    pub fn new(
        inner: &'a mut dyn BatchSource,
        task: RecallTask,
        share: f64,
        seq_len: usize,
        seed: u64,
    ) -> Result<Self> {
        ensure!((0.0..=1.0).contains(&share), "recall share {share} is outside [0, 1]");
        ensure!(seq_len >= 12, "recall sequences need windows of at least 12 tokens, not {seq_len}");
        Ok(Self { inner, task, share, seq_len, seed })
    }
}

/// A generator seeded by `seed` and the tokens of `window` (FNV-1a).
fn window_rng(seed: u64, window: &[u32]) -> ChaCha8Rng {
    let h = window
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .chain(seed.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    ChaCha8Rng::seed_from_u64(h)
}

impl BatchSource for RecallMix<'_> {
    fn next_batch(&mut self) -> Result<(Vec<i64>, Vec<i64>)> {
        let (mut x, mut y) = self.inner.next_batch()?;
        let t = self.seq_len;
        ensure!(x.len() == y.len() && x.len() % t == 0, "a batch of {} tokens is not whole windows of {t}", x.len());
        for row in 0..x.len() / t {
            let (xr, yr) = (&mut x[row * t..(row + 1) * t], &mut y[row * t..(row + 1) * t]);
            let mut window: Vec<u32> = xr.iter().map(|&v| v as u32).chain(std::iter::once(yr[t - 1] as u32)).collect();
            let mut rng = window_rng(self.seed, &window);
            if rng.random::<f64>() >= self.share {
                continue;
            }
            self.task.training_window(&mut window, &mut rng)?;
            for i in 0..t {
                xr[i] = i64::from(window[i]);
                yr[i] = i64::from(window[i + 1]);
            }
        }
        Ok((x, y))
    }

    fn position(&self) -> serde_json::Value {
        self.inner.position()
    }

    fn seek(&mut self, pos: &serde_json::Value) -> Result<()> {
        self.inner.seek(pos)
    }

    fn tokenizer_id(&self) -> String {
        self.inner.tokenizer_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::MemorySource;

    #[test]
    fn the_tokens_sit_below_the_top_id_and_small_vocabularies_are_refused() {
        let t = RecallTask::for_vocab(2048).unwrap();
        assert_eq!(t.marker, 2046);
        assert_eq!(t.keys.len(), KEYS);
        assert_eq!(t.values.len(), VALUES);
        let mut all: Vec<u32> = t.keys.iter().chain(&t.values).copied().chain([t.marker]).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 1 + KEYS + VALUES, "distinct tokens");
        assert!(all.iter().all(|&i| i < 2047));
        assert!(RecallTask::for_vocab(100).is_err());
    }

    /// Reads a recall sequence back: for every `M K` whose key was seen before, the value that followed
    /// the key's latest earlier `M K`.
    fn questions(task: &RecallTask, w: &[u32]) -> Vec<(usize, u32, u32)> {
        let mut seen = std::collections::HashMap::new();
        let mut out = Vec::new();
        for i in 0..w.len().saturating_sub(2) {
            if w[i] == task.marker && task.keys.contains(&w[i + 1]) {
                if let Some(&v) = seen.get(&w[i + 1]) {
                    out.push((i + 2, v, w[i + 2]));
                }
                seen.insert(w[i + 1], w[i + 2]);
            }
        }
        out
    }

    #[test]
    fn a_training_window_asks_every_needle_once_and_answers_it() {
        let task = RecallTask::for_vocab(2048).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for len in [13, 33, 65, 257] {
            for _ in 0..50 {
                let mut w: Vec<u32> = (0..len as u32).map(|i| i % 500).collect();
                task.training_window(&mut w, &mut rng).unwrap();
                let qs = questions(&task, &w);
                assert_eq!(qs.len(), RecallTask::pairs_for(len), "len {len}: {w:?}");
                for (at, expected, got) in qs {
                    assert_eq!(expected, got, "the answer at {at} is the needle's value");
                    assert!(task.values.contains(&got));
                }
            }
        }
        assert!(task.training_window(&mut [0u32; 5], &mut rng).is_err());
    }

    #[test]
    fn a_prompt_puts_its_needle_at_the_exact_distance_among_distractors() {
        let task = RecallTask::for_vocab(2048).unwrap();
        let filler: Vec<u16> = (0..5000u16).map(|i| i % 700).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for (len, distance) in [(64, 2), (64, 61), (1024, 960), (300, 150)] {
            let p = task.prompt(&filler, len, distance, 3, &mut rng).unwrap();
            assert_eq!(p.tokens.len(), len);
            assert_eq!(p.value_at, len - 1 - distance);
            assert_eq!(p.tokens[p.value_at], p.answer);
            assert_eq!(task.values[p.answer_index], p.answer);
            let (m, k) = (p.tokens[len - 2], p.tokens[len - 1]);
            assert_eq!((m, p.tokens[p.value_at - 2], p.tokens[p.value_at - 1]), (task.marker, task.marker, k));
            // Exactly one earlier needle has the asked key; the others are distractors.
            let needles: Vec<usize> =
                (0..len - 2).filter(|&i| p.tokens[i] == task.marker && task.keys.contains(&p.tokens[i + 1])).collect();
            assert_eq!(needles.len(), 4, "the needle and 3 distractors: {needles:?}");
            assert_eq!(needles.iter().filter(|&&i| p.tokens[i + 1] == k).count(), 1);
        }
        assert!(task.prompt(&filler, 64, 62, 0, &mut rng).is_err(), "the needle must fit");
        assert!(task.prompt(&filler[..10], 64, 10, 0, &mut rng).is_err(), "not enough filler");
    }

    #[test]
    fn the_mix_replaces_its_share_deterministically_and_resumes() {
        let tokens: Vec<u16> = (0..20_000u32).map(|i| (i % 1500) as u16).collect();
        let task = RecallTask::for_vocab(2048).unwrap();
        let run = |skip: usize, resume_from: Option<serde_json::Value>| {
            let mut src = MemorySource::new(tokens.clone(), 8, 32, 0, 1, "t").unwrap();
            let mut mix = RecallMix::new(&mut src, task.clone(), 0.25, 32, 7).unwrap();
            if let Some(p) = resume_from {
                mix.seek(&p).unwrap();
            }
            let mut out = Vec::new();
            for _ in 0..skip {
                mix.next_batch().unwrap();
            }
            let pos = mix.position();
            for _ in 0..10 {
                out.push(mix.next_batch().unwrap());
            }
            (out, pos)
        };
        let (all, _) = run(0, None);
        let mut replaced = 0;
        for (x, y) in &all {
            for row in 0..8 {
                let (xr, yr) = (&x[row * 32..(row + 1) * 32], &y[row * 32..(row + 1) * 32]);
                assert_eq!(&xr[1..], &yr[..31], "y is x shifted by one");
                let w: Vec<u32> = xr.iter().chain(&yr[31..]).map(|&v| v as u32).collect();
                if w.contains(&task.marker) {
                    replaced += 1;
                    assert!(questions(&task, &w).iter().all(|(_, e, g)| e == g));
                }
            }
        }
        // 80 windows at a share of 0.25: 20 expected; a binomial sd of about 3.9.
        assert!((8..=32).contains(&replaced), "{replaced} of 80 windows replaced");
        // Resuming from the position after 4 batches gives the same next 6 batches.
        let (first, pos) = run(4, None);
        let (again, _) = run(0, Some(pos));
        assert_eq!(&first[..6], &again[..6]);
        assert_eq!(&all[4..], &first[..6]);
    }
}
