//! Retrieval beyond the training length: passkey retrieval and RULER-style needle-in-a-haystack
//! prompts built in token space, so a prompt has exactly the length asked for and the needle sits at
//! exactly the depth asked for.
//!
//! - **passkey**: a 5-digit number stated once inside filler text, asked for at the end.
//! - **single needle**: "One of the special magic numbers for {key} is: {value}." (7 digits), asked by key.
//! - **multi-key**: the same with several needles of different keys; one of them is asked for.
//! - **multi-value**: several needles with the same key; every value must be produced.
//!
//! The filler is held-out text (validation tokens), cut at a random offset. A prompt is drawn in two
//! steps, [`Needles::draw`] (the random keys and values) then [`Needles::assemble`] (the filler and
//! the layout), so a caller that must know the answer before choosing the length (the fine-tuning mix
//! of [`crate::retrieval_eval`], which appends the answer) builds each prompt once. Scoring (greedy
//! decoding with the KV cache) is in [`crate::retrieval_eval`].

use anyhow::{Result, ensure};
use rand::Rng;
use rand::seq::IndexedRandom;

use trainer::data::tokenizer::Tokenizer;

/// Which retrieval task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// One 5-digit pass key.
    Passkey,
    /// One key-value needle.
    SingleNeedle,
    /// `n` needles with different keys; one is asked for.
    MultiKey(usize),
    /// `n` needles with the same key; all values are asked for.
    MultiValue(usize),
}

/// One generated prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    /// The tokens given to the model (exactly the requested length).
    pub tokens: Vec<u32>,
    /// The strings a correct answer contains (all of them).
    pub answers: Vec<String>,
    /// Token offset of each needle in `tokens`.
    pub needle_at: Vec<usize>,
}

/// Keys of the key-value needles.
const KEYS: [&str; 24] = [
    "harbor", "lantern", "meadow", "copper", "violet", "glacier", "orchard", "falcon", "pepper", "canyon", "marble",
    "thistle", "anchor", "saddle", "ember", "willow", "pebble", "comet", "quartz", "juniper", "tundra", "basil",
    "cobalt", "maple",
];

fn digits(rng: &mut impl Rng, n: u32) -> String {
    rng.random_range(10u64.pow(n - 1)..10u64.pow(n)).to_string()
}

/// The random part of a prompt: its text around the filler and the answers it asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Needles {
    intro: String,
    needles: Vec<String>,
    question: String,
    /// The strings a correct answer contains (all of them).
    pub answers: Vec<String>,
}

/// Builds one prompt of `task` with exactly `len` tokens, needles at `depth` (0 = start of the filler,
/// 1 = its end; several needles are spread from `depth` towards the end), filler from `filler`:
/// [`Needles::draw`] then [`Needles::assemble`].
pub fn prompt(
    task: Task,
    tok: &Tokenizer,
    filler: &[u16],
    len: usize,
    depth: f64,
    rng: &mut impl Rng,
) -> Result<Prompt> {
    Needles::draw(task, rng)?.assemble(tok, filler, len, depth, rng)
}

impl Needles {
    /// Draws the keys and values of one prompt of `task`.
    pub fn draw(task: Task, rng: &mut impl Rng) -> Result<Self> {
        let (intro, needles, question, answers) = match task {
            Task::Passkey => {
                let key = digits(rng, 5);
                (
                    "There is an important piece of information hidden inside a lot of irrelevant text. Find it and remember it. I will ask you about it.".to_string(),
                    vec![format!("The pass key is {key}. Remember it. {key} is the pass key.")],
                    "What is the pass key? The pass key is".to_string(),
                    vec![key],
                )
            }
            Task::SingleNeedle | Task::MultiKey(_) | Task::MultiValue(_) => {
                let n = match task {
                    Task::MultiKey(n) | Task::MultiValue(n) => n,
                    _ => 1,
                };
                ensure!((1..=KEYS.len()).contains(&n), "between 1 and {} needles, not {n}", KEYS.len());
                let keys: Vec<&str> = match task {
                    Task::MultiValue(_) => vec![*KEYS.choose(rng).expect("keys")],
                    _ => KEYS.choose_multiple(rng, n).copied().collect(),
                };
                let values: Vec<String> = (0..n).map(|_| digits(rng, 7)).collect();
                let needles: Vec<String> = values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| format!("One of the special magic numbers for {} is: {v}.", keys[i % keys.len()]))
                    .collect();
                let asked = keys[0];
                let (question, answers) = if let Task::MultiValue(_) = task {
                    (
                        format!(
                            "What are all the special magic numbers for {asked} mentioned in the text? The special magic numbers for {asked} mentioned in the text are"
                        ),
                        values,
                    )
                } else {
                    (
                        format!(
                            "What is the special magic number for {asked} mentioned in the text? The special magic number for {asked} mentioned in the text is"
                        ),
                        vec![values[0].clone()],
                    )
                };
                ("Some special magic numbers are hidden inside the following text. Remember them; I will ask about them.".to_string(), needles, question, answers)
            }
        };
        Ok(Self { intro, needles, question, answers })
    }

    /// Lays the needles into `len` tokens of filler drawn from `filler` at a random offset, the first
    /// at `depth` (0 = start of the filler, 1 = its end).
    pub fn assemble(
        self,
        tok: &Tokenizer,
        filler: &[u16],
        len: usize,
        depth: f64,
        rng: &mut impl Rng,
    ) -> Result<Prompt> {
        let Self { intro, needles, question, answers } = self;
        ensure!((0.0..=1.0).contains(&depth), "depth {depth} is outside [0, 1]");
        let head = tok.encode(&format!("{intro}\n"));
        let tail = tok.encode(&format!("\n{question}"));
        let needle_tokens: Vec<Vec<u32>> = needles.iter().map(|n| tok.encode(&format!(" {n} "))).collect();
        let fixed = head.len() + tail.len() + needle_tokens.iter().map(Vec::len).sum::<usize>();
        ensure!(len > fixed, "a {len}-token prompt cannot hold its {fixed} fixed tokens");
        let fill = len - fixed;
        ensure!(filler.len() >= fill, "{} filler tokens, {fill} needed", filler.len());
        let start = rng.random_range(0..=filler.len() - fill);
        let hay: Vec<u32> = filler[start..start + fill].iter().map(|&t| u32::from(t)).collect();
        // Needle i goes at depth + i * (1 - depth) / n of the filler.
        let n = needle_tokens.len();
        let cuts: Vec<usize> =
            (0..n).map(|i| ((depth + i as f64 * (1.0 - depth) / n as f64) * fill as f64).round() as usize).collect();
        let mut tokens = head;
        let mut needle_at = Vec::with_capacity(n);
        let mut from = 0;
        for (cut, needle) in cuts.iter().zip(&needle_tokens) {
            tokens.extend_from_slice(&hay[from..*cut]);
            needle_at.push(tokens.len());
            tokens.extend_from_slice(needle);
            from = *cut;
        }
        tokens.extend_from_slice(&hay[from..]);
        tokens.extend_from_slice(&tail);
        debug_assert_eq!(tokens.len(), len);
        Ok(Prompt { tokens, answers, needle_at })
    }
}

/// Whether generated text answers the prompt: every answer string appears in it.
pub fn is_correct(prompt: &Prompt, generated: &str) -> bool {
    prompt.answers.iter().all(|a| generated.contains(a.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn filler(tok: &Tokenizer) -> Vec<u16> {
        let text = "The river ran past the old mill and the fields beyond it were quiet. ".repeat(400);
        tok.encode(&text).into_iter().map(|t| t as u16).collect()
    }

    #[test]
    fn prompts_have_the_exact_length_and_depth_and_hold_their_answers() {
        let tok = Tokenizer::gpt2().unwrap();
        let hay = filler(&tok);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for task in [Task::Passkey, Task::SingleNeedle, Task::MultiKey(4), Task::MultiValue(3)] {
            for (len, depth) in [(256, 0.0), (512, 0.5), (2048, 1.0), (1000, 0.25)] {
                let p = prompt(task, &tok, &hay, len, depth, &mut rng).unwrap();
                assert_eq!(p.tokens.len(), len, "{task:?}");
                let text = tok.decode(&p.tokens);
                for a in &p.answers {
                    assert!(text.contains(a.as_str()), "{task:?}: answer {a} not in the prompt");
                    assert!(!text.ends_with(a.as_str()), "the answer is not given away at the end");
                }
                let expected = match task {
                    Task::MultiValue(n) => n,
                    _ => 1,
                };
                assert_eq!(p.answers.len(), expected);
                // The first needle sits at the requested depth of the prompt (within the fixed parts).
                let rel = p.needle_at[0] as f64 / len as f64;
                assert!((rel - depth).abs() < 0.2, "{task:?} at depth {depth}: needle at {rel}");
                assert!(p.needle_at.windows(2).all(|w| w[0] < w[1]));
                assert!(is_correct(&p, &format!(" {} ", p.answers.join(", "))));
                assert!(!is_correct(&p, " 0000000"));
            }
        }
    }

    #[test]
    fn multi_key_needles_have_distinct_keys_and_the_question_names_one() {
        let tok = Tokenizer::gpt2().unwrap();
        let hay = filler(&tok);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let p = prompt(Task::MultiKey(5), &tok, &hay, 1024, 0.1, &mut rng).unwrap();
        let text = tok.decode(&p.tokens);
        let keys: Vec<&str> = KEYS.iter().copied().filter(|k| text.contains(&format!("numbers for {k} is"))).collect();
        assert_eq!(keys.len(), 5, "{keys:?}");
        let question = text.rsplit('\n').next().unwrap();
        assert_eq!(keys.iter().filter(|k| question.contains(*k)).count(), 1, "{question}");
        // The asked key's needle holds the answer.
        let asked = keys.iter().find(|k| question.contains(*k)).unwrap();
        assert!(text.contains(&format!("numbers for {asked} is: {}.", p.answers[0])));
    }

    #[test]
    fn impossible_requests_are_refused() {
        let tok = Tokenizer::gpt2().unwrap();
        let hay = filler(&tok);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        assert!(prompt(Task::Passkey, &tok, &hay, 20, 0.5, &mut rng).is_err(), "shorter than the fixed text");
        assert!(prompt(Task::Passkey, &tok, &hay[..100], 4096, 0.5, &mut rng).is_err(), "not enough filler");
        assert!(prompt(Task::Passkey, &tok, &hay, 512, 1.5, &mut rng).is_err(), "depth outside [0, 1]");
        assert!(prompt(Task::MultiKey(0), &tok, &hay, 512, 0.5, &mut rng).is_err());
    }
}
