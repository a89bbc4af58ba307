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
//! - [`crate::train::RecallMix`] wraps any training source and replaces a fixed share of its windows
//!   by such sequences, deterministically: whether a window is replaced, and its needles, are a
//!   function of the seed and the window's own tokens, so a resumed run, and the same run on any
//!   number of ranks, see the same sequences.
//! - [`RecallTask::prompt`] builds an evaluation prompt of any length: filler text, the asked needle at
//!   an exact distance from the question, and distractor needles with other keys.
//!
//! The task's tokens are the ids just below the top of the model's vocabulary: the last merges of a
//! BPE (its rarest tokens), or ids a padded vocabulary never produces. They keep their ordinary
//! meaning elsewhere in the text; a needle is recognised by the marker followed by a key.

use anyhow::{Result, ensure};
use rand::Rng;
use rand::seq::SliceRandom;

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

    /// Reads a sequence back, as a check: for every marker and key whose key was seen before, `(the
    /// index of the token after them, the value that followed the key's latest earlier needle, the
    /// token there)`. In a recall sequence the last two agree.
    pub fn questions(&self, w: &[u32]) -> Vec<(usize, u32, u32)> {
        let mut seen = std::collections::HashMap::new();
        let mut out = Vec::new();
        for i in 0..w.len().saturating_sub(2) {
            if w[i] == self.marker && self.keys.contains(&w[i + 1]) {
                if let Some(&v) = seen.get(&w[i + 1]) {
                    out.push((i + 2, v, w[i + 2]));
                }
                seen.insert(w[i + 1], w[i + 2]);
            }
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

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

    #[test]
    fn a_training_window_asks_every_needle_once_and_answers_it() {
        let task = RecallTask::for_vocab(2048).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for len in [13, 33, 65, 257] {
            for _ in 0..50 {
                let mut w: Vec<u32> = (0..len as u32).map(|i| i % 500).collect();
                task.training_window(&mut w, &mut rng).unwrap();
                let qs = task.questions(&w);
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
}
