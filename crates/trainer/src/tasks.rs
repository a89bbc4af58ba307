//! Evaluation tasks on a trained model beside the validation loss: zero-shot multiple choice scored as
//! lm-evaluation-harness scores it, and passkey retrieval at multiples of the training length. One
//! scorer serves `trainer eval --tasks` and the reproduction (`experiments::downstream` re-exports
//! this module's multiple-choice half).
//!
//! ## Multiple choice
//!
//! Each choice is a continuation of a context; the model's summed log-likelihood of the continuation
//! picks the answer (`acc`), and the same divided by the choice's length in characters (without the
//! space that starts its continuation: lm-evaluation-harness's `len(choice)`) picks it for `acc_norm`. The readers take the JSONL layouts the data sets are published in; the files come
//! from the user (none of these sets is in a package registry, and nothing here downloads them).
//!
//! | task | fields of a JSONL line | context | choices (each preceded by a space) |
//! |---|---|---|---|
//! | `arc_easy`, `arc_challenge` | `question`, `choices.text`, `choices.label`, `answerKey` | `Question: {question}\nAnswer:` | the choice texts |
//! | `hellaswag` | `activity_label`, `ctx_a`, `ctx_b`, `endings`, `label` | `{activity_label}: {ctx_a} {Ctx_b}`, cleaned | the cleaned endings |
//! | `piqa` | `goal`, `sol1`, `sol2`, `label` | `Question: {goal}\nAnswer:` | `sol1`, `sol2` |
//! | `sciq` | `support`, `question`, `distractor1..3`, `correct_answer` | `{support}\nQuestion: {question}\nAnswer:` | the distractors, then the answer |
//! | `mmlu` | `subject`, `question`, `choices`, `answer` | the harness's zero-shot prompt with `A.`..`D.` | `A`, `B`, `C`, `D` |
//!
//! [`ModelScorer`] scores all the choices of an item in one padded forward
//! ([`LogLikelihood::loglik_batch`]): sequences are padded on the right, which causal attention never
//! lets an earlier position see, so each choice's score equals its own unpadded forward's (up to the
//! rounding of a batched matmul; tested to 1e-4). The exception is `relu-seqlen`, whose weights
//! divide by the length of the whole window: there only choices of equal length share a forward.
//!
//! ## Passkey retrieval
//!
//! The prompt of Mohtashami and Jaggi (2023, "Landmark attention"), built in token space so that it
//! has exactly the length asked for: the end-of-text token (every training document starts with
//! it), an instruction, the filler [`PASSKEY_FILLER`] repeated, the needle
//! `The pass key is {key}. Remember it. {key} is the pass key.` with a random 5-digit key placed at a
//! given depth of the filler (0 = its start, 1 = its end), and the question
//! `What is the pass key? The pass key is`. The model continues it greedily with the KV cache; a
//! prompt counts as retrieved when the first number in the continuation is the key, and
//! `digit_accuracy` is the share of the key's digits found in place in that number. Prompts are a
//! function of the seed and the length alone ([`SampleRng`]), so every RoPE treatment and
//! re-weighting power is scored on the same prompts. Needs no data: the filler is fixed text.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use gpt_model::model::{ForwardOptions, GenerateOptions, Gpt, SampleRng, Sampling};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::data::tokenizer::Tokenizer;
use crate::eval::Rope;

/// One multiple-choice question.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// The context every choice continues.
    pub context: String,
    /// The continuations (each starts with the separating space).
    pub choices: Vec<String>,
    /// Index of the right one.
    pub gold: usize,
}

/// The tasks this module reads.
pub const TASKS: [&str; 6] = ["arc_easy", "arc_challenge", "hellaswag", "piqa", "sciq", "mmlu"];

/// Parses one JSONL line of `task`.
pub fn parse_item(task: &str, line: &str) -> Result<Item> {
    let v: Value = serde_json::from_str(line).context("not a JSON object")?;
    let text = |key: &str| -> Result<String> {
        v[key].as_str().map(str::to_string).with_context(|| format!("no string field `{key}`"))
    };
    let strings = |val: &Value, key: &str| -> Result<Vec<String>> {
        val.as_array()
            .with_context(|| format!("no array field `{key}`"))?
            .iter()
            .map(|c| c.as_str().map(str::to_string).with_context(|| format!("`{key}` holds a non-string")))
            .collect()
    };
    let index = |val: &Value, key: &str| -> Result<usize> {
        match val {
            Value::Number(n) => n.as_u64().map(|n| n as usize),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
        .with_context(|| format!("`{key}` is not an index: {val}"))
    };
    let space = |c: &str| format!(" {c}");
    let item = match task {
        "arc_easy" | "arc_challenge" => {
            let choices = strings(&v["choices"]["text"], "choices.text")?;
            let labels = strings(&v["choices"]["label"], "choices.label")?;
            let key = text("answerKey")?;
            let gold =
                labels.iter().position(|l| *l == key).with_context(|| format!("answerKey {key} not in {labels:?}"))?;
            Item {
                context: format!("Question: {}\nAnswer:", text("question")?),
                choices: choices.iter().map(|c| space(c)).collect(),
                gold,
            }
        }
        "hellaswag" => {
            let ctx_b = text("ctx_b")?;
            let mut chars = ctx_b.chars();
            let ctx_b: String = chars.next().map(|c| c.to_uppercase().chain(chars).collect()).unwrap_or_default();
            let ctx = format!("{} {}", text("ctx_a")?, ctx_b);
            Item {
                context: hellaswag_clean(&format!("{}: {}", text("activity_label")?, ctx)),
                choices: strings(&v["endings"], "endings")?.iter().map(|e| space(&hellaswag_clean(e))).collect(),
                gold: index(&v["label"], "label")?,
            }
        }
        "piqa" => Item {
            context: format!("Question: {}\nAnswer:", text("goal")?),
            choices: vec![space(&text("sol1")?), space(&text("sol2")?)],
            gold: index(&v["label"], "label")?,
        },
        "sciq" => Item {
            context: format!("{}\nQuestion: {}\nAnswer:", text("support")?.trim_start(), text("question")?),
            choices: ["distractor1", "distractor2", "distractor3", "correct_answer"]
                .iter()
                .map(|k| text(k).map(|c| space(&c)))
                .collect::<Result<_>>()?,
            gold: 3,
        },
        "mmlu" => {
            let choices = strings(&v["choices"], "choices")?;
            ensure!(choices.len() == 4, "mmlu needs 4 choices, got {}", choices.len());
            let subject = text("subject")?.replace('_', " ");
            let mut context = format!(
                "The following are multiple choice questions (with answers) about {subject}.\n\n{}\n",
                text("question")?.trim()
            );
            for (letter, c) in ["A", "B", "C", "D"].iter().zip(&choices) {
                context.push_str(&format!("{letter}. {c}\n"));
            }
            context.push_str("Answer:");
            Item { context, choices: ["A", "B", "C", "D"].map(space).to_vec(), gold: index(&v["answer"], "answer")? }
        }
        other => bail!("unknown task `{other}` (known: {})", TASKS.join(", ")),
    };
    ensure!(item.gold < item.choices.len(), "gold index {} out of {} choices", item.gold, item.choices.len());
    Ok(item)
}

/// lm-evaluation-harness's HellaSwag clean-up: ` [title]` becomes `. `, other `[...]` tags go, double
/// spaces become single, and the ends are trimmed.
pub fn hellaswag_clean(text: &str) -> String {
    let text = text.trim().replace(" [title]", ". ");
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.replace("  ", " ")
}

/// Reads a JSONL file of `task`; errors name the file and line.
pub fn read_items(task: &str, path: &Path) -> Result<Vec<Item>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| parse_item(task, l).with_context(|| format!("{}:{}: a {task} item", path.display(), i + 1)))
        .collect()
}

/// The `<task>.jsonl` files of [`TASKS`] present in `dir`, in [`TASKS`] order; an error when `dir`
/// is not a directory or holds none of them.
pub fn task_files(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    ensure!(dir.is_dir(), "{}: not a directory (expected one holding <task>.jsonl files)", dir.display());
    let files: Vec<(String, PathBuf)> =
        TASKS.iter().map(|t| (t.to_string(), dir.join(format!("{t}.jsonl")))).filter(|(_, p)| p.is_file()).collect();
    ensure!(
        !files.is_empty(),
        "{}: none of {} found (see trainer::tasks for the layouts)",
        dir.display(),
        TASKS.iter().map(|t| format!("{t}.jsonl")).collect::<Vec<_>>().join(", ")
    );
    Ok(files)
}

/// What a model must answer: the summed log-probability of `continuation` given `context`.
pub trait LogLikelihood {
    /// `ln p(continuation | context)`, summed over the continuation's tokens.
    fn loglik(&mut self, context: &str, continuation: &str) -> Result<f64>;

    /// [`LogLikelihood::loglik`] of each continuation of one context, in order. The default calls
    /// `loglik` once per continuation; a model overrides it to score them together.
    fn loglik_batch(&mut self, context: &str, continuations: &[String]) -> Result<Vec<f64>> {
        continuations.iter().map(|c| self.loglik(context, c)).collect()
    }
}

/// [`LogLikelihood`] of a trained model with its tokenizer, as the harness computes it: the context
/// and the continuation are encoded together and the continuation's tokens are those after the
/// context's; the sequence starts with the end-of-text token (as every training document does) and
/// is cut from the left to the model's training length.
pub struct ModelScorer<'a> {
    /// The model.
    pub model: &'a Gpt,
    /// Its tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// Where the model lives.
    pub device: Device,
    /// Forward options (post-hoc re-weighting); the default is the trained model's forward.
    pub forward: ForwardOptions,
}

impl<'a> ModelScorer<'a> {
    /// A scorer with the trained model's forward.
    pub fn new(model: &'a Gpt, tokenizer: &'a Tokenizer, device: Device) -> Self {
        Self { model, tokenizer, device, forward: ForwardOptions::default() }
    }

    /// The scored sequence `[eot, context.., continuation..]` (cut from the left to the training
    /// length + 1) and the number `k` of continuation tokens at its end.
    fn sequence(&self, context: &str, continuation: &str) -> Result<(Vec<i64>, usize)> {
        let whole = self.tokenizer.encode(&format!("{context}{continuation}"));
        let ctx = self.tokenizer.encode(context);
        let cont: Vec<u32> = if whole.len() > ctx.len() && whole.starts_with(&ctx) {
            whole[ctx.len()..].to_vec()
        } else {
            self.tokenizer.encode(continuation)
        };
        ensure!(!cont.is_empty(), "the continuation {continuation:?} has no tokens");
        let max_len = self.model.config().context_len;
        ensure!(cont.len() <= max_len, "the continuation has {} tokens, more than the model's {max_len}", cont.len());
        let mut seq: Vec<i64> =
            std::iter::once(self.tokenizer.eot()).chain(ctx).chain(cont.iter().copied()).map(i64::from).collect();
        if seq.len() > max_len + 1 {
            seq.drain(..seq.len() - max_len - 1);
        }
        Ok((seq, cont.len()))
    }

    /// Log-probabilities of the targets, `(B, W)` f32: row `b` scores `x[b, t+1]` after `x[b, ..=t]`.
    fn target_logprobs(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let logits = tch::no_grad(|| self.model.forward(x, &self.forward))?;
        // Over the real vocabulary: the embedding's padding columns are not tokens.
        let logits = logits.narrow(-1, 0, self.model.config().vocab_size as i64);
        Ok(logits.log_softmax(-1, Kind::Float).gather(-1, &y.unsqueeze(-1), false).squeeze_dim(-1))
    }
}

impl LogLikelihood for ModelScorer<'_> {
    fn loglik(&mut self, context: &str, continuation: &str) -> Result<f64> {
        let (seq, k) = self.sequence(context, continuation)?;
        let n = seq.len() as i64;
        let x = Tensor::from_slice(&seq[..seq.len() - 1]).view([1, n - 1]).to(self.device);
        let y = Tensor::from_slice(&seq[1..]).view([1, n - 1]).to(self.device);
        let picked = self.target_logprobs(&x, &y)?;
        let k = k as i64;
        Ok(picked.narrow(1, n - 1 - k, k).sum(Kind::Double).double_value(&[]))
    }

    /// One forward for all the continuations (right-padded); for `relu-seqlen`, one per length.
    fn loglik_batch(&mut self, context: &str, continuations: &[String]) -> Result<Vec<f64>> {
        let seqs: Vec<(Vec<i64>, usize)> =
            continuations.iter().map(|c| self.sequence(context, c)).collect::<Result<_>>()?;
        // Causal attention: padding after a sequence never reaches its positions, except under a
        // normaliser that divides by the whole window's length.
        let pad_ok = self.model.variant().stage1().norm != attn_core::Norm::DivLen;
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, (seq, _)) in seqs.iter().enumerate() {
            match groups.iter_mut().find(|g| pad_ok || seqs[g[0]].0.len() == seq.len()) {
                Some(g) => g.push(i),
                None => groups.push(vec![i]),
            }
        }
        let pad = i64::from(self.tokenizer.eot());
        let mut out = vec![0.0; seqs.len()];
        for g in groups {
            let width = g.iter().map(|&i| seqs[i].0.len() - 1).max().expect("non-empty group");
            let (mut x, mut y) = (Vec::with_capacity(g.len() * width), Vec::with_capacity(g.len() * width));
            for &i in &g {
                let s = &seqs[i].0;
                x.extend(s[..s.len() - 1].iter().copied().chain(std::iter::repeat_n(pad, width + 1 - s.len())));
                y.extend(s[1..].iter().copied().chain(std::iter::repeat_n(pad, width + 1 - s.len())));
            }
            let shape = [g.len() as i64, width as i64];
            let x = Tensor::from_slice(&x).view(shape).to(self.device);
            let y = Tensor::from_slice(&y).view(shape).to(self.device);
            let picked = self.target_logprobs(&x, &y)?;
            for (row, &i) in g.iter().enumerate() {
                let (n, k) = (seqs[i].0.len() as i64, seqs[i].1 as i64);
                out[i] = picked.get(row as i64).narrow(0, n - 1 - k, k).sum(Kind::Double).double_value(&[]);
            }
        }
        Ok(out)
    }
}

/// A task's scores in lm-evaluation-harness's terms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    /// Items scored.
    pub n: usize,
    /// Accuracy by summed log-likelihood.
    pub acc: f64,
    /// Its standard error (sample standard deviation over sqrt(n)).
    pub acc_stderr: f64,
    /// Accuracy by log-likelihood per character of the choice (lm-evaluation-harness's `acc_norm`).
    pub acc_norm: f64,
    /// Its standard error.
    pub acc_norm_stderr: f64,
    /// Per item, in file order: what each choice scored and which one each measure picked (to compare
    /// with another scorer question by question, e.g. lm-evaluation-harness's `--log_samples`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<ItemScore>,
}

/// One item's scores ([`Scores::items`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemScore {
    /// The summed log-likelihood of each choice's continuation.
    pub loglik: Vec<f64>,
    /// The choice `acc` picks (the largest `loglik`; ties to the earlier choice).
    pub acc_pick: usize,
    /// The choice `acc_norm` picks (the largest `loglik` per character of the choice).
    pub acc_norm_pick: usize,
    /// The correct choice.
    pub gold: usize,
}

/// Scores `items` with `model`, all the choices of an item at once ([`LogLikelihood::loglik_batch`]).
pub fn score(items: &[Item], model: &mut dyn LogLikelihood) -> Result<Scores> {
    ensure!(!items.is_empty(), "no items to score");
    let (mut acc, mut acc_norm, mut per_item) = (Vec::new(), Vec::new(), Vec::new());
    for item in items {
        let ll = model.loglik_batch(&item.context, &item.choices)?;
        ensure!(ll.len() == item.choices.len(), "{} scores for {} choices", ll.len(), item.choices.len());
        // lm-evaluation-harness divides by the length of the choice itself, not of the continuation
        // scored (which has the target delimiter, a space, in front): `len(choice)` in its
        // `process_results`.
        let norm: Vec<f64> = ll.iter().zip(&item.choices).map(|(l, c)| l / choice_chars(c) as f64).collect();
        let (pick, pick_norm) = (argmax(&ll), argmax(&norm));
        acc.push(f64::from(u8::from(pick == item.gold)));
        acc_norm.push(f64::from(u8::from(pick_norm == item.gold)));
        per_item.push(ItemScore { loglik: ll, acc_pick: pick, acc_norm_pick: pick_norm, gold: item.gold });
    }
    let (a, ase) = mean_stderr(&acc);
    let (an, anse) = mean_stderr(&acc_norm);
    Ok(Scores { n: items.len(), acc: a, acc_stderr: ase, acc_norm: an, acc_norm_stderr: anse, items: per_item })
}

/// Characters of a choice without its leading delimiter (the space every continuation starts with),
/// as lm-evaluation-harness counts them for `acc_norm`; at least 1.
fn choice_chars(continuation: &str) -> usize {
    continuation.strip_prefix(' ').unwrap_or(continuation).chars().count().max(1)
}

/// The first index of the largest value (ties go to the earlier choice).
fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

fn mean_stderr(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    if x.len() < 2 {
        return (mean, f64::NAN);
    }
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// lm-evaluation-harness's results layout: `{"results": {task: {"acc,none": .., "acc_stderr,none": ..,
/// "acc_norm,none": .., "acc_norm_stderr,none": ..}}, "n-samples": {task: {"effective": n}}}`.
pub fn lm_eval_json(scores: &[(String, Scores)]) -> Value {
    let mut results = serde_json::Map::new();
    let mut samples = serde_json::Map::new();
    for (task, s) in scores {
        results.insert(
            task.clone(),
            serde_json::json!({
                "alias": task,
                "acc,none": s.acc,
                "acc_stderr,none": s.acc_stderr,
                "acc_norm,none": s.acc_norm,
                "acc_norm_stderr,none": s.acc_norm_stderr,
            }),
        );
        samples.insert(task.clone(), serde_json::json!({ "original": s.n, "effective": s.n }));
    }
    serde_json::json!({ "results": results, "n-samples": samples })
}

/// Scores every task file of `dir` ([`task_files`]) with `model`; `(task, file, scores)` in
/// [`TASKS`] order.
pub fn score_dir(dir: &Path, model: &mut dyn LogLikelihood) -> Result<Vec<(String, PathBuf, Scores)>> {
    let mut out = Vec::new();
    for (task, path) in task_files(dir)? {
        let items = read_items(&task, &path)?;
        let scores = score(&items, model).with_context(|| format!("scoring {}", path.display()))?;
        out.push((task, path, scores));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------------
// Passkey retrieval
// ---------------------------------------------------------------------------------------------------

/// The filler between the instruction, the needle and the question (Mohtashami and Jaggi, 2023).
pub const PASSKEY_FILLER: &str =
    " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
const PASSKEY_INTRO: &str =
    "There is an important pass key hidden inside a lot of irrelevant text. Find it and remember it.";
const PASSKEY_QUESTION: &str = " What is the pass key? The pass key is";

/// One passkey prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct PasskeyPrompt {
    /// The tokens given to the model (exactly the length asked for).
    pub tokens: Vec<i64>,
    /// The 5-digit key.
    pub key: String,
    /// Token offset of the needle in `tokens`.
    pub needle_at: usize,
}

/// Tokens of a passkey prompt that are not filler (for a 5-digit key; keys of other digits may
/// differ by a token or two with some tokenizers, which [`passkey_prompt`] accounts for).
pub fn passkey_fixed_tokens(tok: &Tokenizer) -> usize {
    1 + tok.encode(PASSKEY_INTRO).len() + tok.encode(&needle("00000")).len() + tok.encode(PASSKEY_QUESTION).len()
}

fn needle(key: &str) -> String {
    format!(" The pass key is {key}. Remember it. {key} is the pass key.")
}

/// A passkey prompt of exactly `len` tokens with its needle at `depth` of the filler (0: right after
/// the instruction, 1: right before the question) and a key drawn from `rng`.
pub fn passkey_prompt(tok: &Tokenizer, len: usize, depth: f64, rng: &mut SampleRng) -> Result<PasskeyPrompt> {
    ensure!((0.0..=1.0).contains(&depth), "passkey depth {depth} is outside [0, 1]");
    let key = rng.range(10_000, 100_000).to_string();
    let to_i64 = |v: Vec<u32>| -> Vec<i64> { v.into_iter().map(i64::from).collect() };
    let head: Vec<i64> = std::iter::once(i64::from(tok.eot())).chain(to_i64(tok.encode(PASSKEY_INTRO))).collect();
    let needle_tokens = to_i64(tok.encode(&needle(&key)));
    let tail = to_i64(tok.encode(PASSKEY_QUESTION));
    let filler = to_i64(tok.encode(PASSKEY_FILLER));
    let fixed = head.len() + needle_tokens.len() + tail.len();
    ensure!(len > fixed, "a {len}-token passkey prompt cannot hold its {fixed} fixed tokens");
    let fill = len - fixed;
    let cut = (depth * fill as f64).round() as usize;
    let hay = |range: std::ops::Range<usize>| range.map(|i| filler[i % filler.len()]);
    let mut tokens = head;
    tokens.extend(hay(0..cut));
    let needle_at = tokens.len();
    tokens.extend_from_slice(&needle_tokens);
    tokens.extend(hay(cut..fill));
    tokens.extend_from_slice(&tail);
    debug_assert_eq!(tokens.len(), len);
    Ok(PasskeyPrompt { tokens, key, needle_at })
}

/// The share of `key`'s digits found in the same place in the first run of digits of `text`.
pub fn digit_accuracy(key: &str, text: &str) -> f64 {
    let first = first_number(text);
    let hits = key.chars().zip(first.chars()).filter(|(a, b)| a == b).count();
    hits as f64 / key.len().max(1) as f64
}

fn first_number(text: &str) -> String {
    text.chars().skip_while(|c| !c.is_ascii_digit()).take_while(char::is_ascii_digit).collect()
}

/// What [`passkey`] scores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PasskeyOptions {
    /// Prompt lengths as multiples of the training length.
    pub multiples: Vec<usize>,
    /// Needle depths in `[0, 1]`.
    pub depths: Vec<f64>,
    /// Prompts per (length, depth).
    pub prompts: usize,
    /// Seed of the keys (the prompts at a length are a function of it and the length alone).
    pub seed: u64,
    /// Tokens per batched generation (the batch shrinks as the length grows).
    pub batch_tokens: usize,
}

/// Passkey accuracy at one (length, depth).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PasskeyCell {
    /// Multiple of the training length.
    pub multiple: usize,
    /// Prompt length in tokens.
    pub seq_len: usize,
    /// Needle depth.
    pub depth: f64,
    /// Prompts scored.
    pub prompts: usize,
    /// Share retrieved exactly.
    pub accuracy: f64,
    /// Mean share of digits in place.
    pub digit_accuracy: f64,
}

/// Passkey results of one (RoPE, re-weighting) setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PasskeyResult {
    /// RoPE beyond the training length.
    pub rope: Rope,
    /// Post-hoc re-weighting power, if any.
    pub reweight: Option<u32>,
    /// Every (length, depth).
    pub cells: Vec<PasskeyCell>,
    /// Multiples skipped because their prompt cannot hold the fixed text, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// The first prompt's key and continuation at the longest length, for a human reader.
    pub example: String,
}

/// Mixes `seed` and `index` into a new seed (one SplitMix64 output), for independent streams.
pub fn derive_seed(seed: u64, index: u64) -> u64 {
    SampleRng::new(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

/// Passkey retrieval with greedy decoding at each multiple and depth of `opts` (see the module
/// documentation), with `rope` beyond the training length and optional post-hoc re-weighting.
pub fn passkey(
    model: &Gpt,
    tok: &Tokenizer,
    opts: &PasskeyOptions,
    rope: Rope,
    reweight: Option<u32>,
) -> Result<PasskeyResult> {
    ensure!(!opts.multiples.is_empty() && opts.multiples.iter().all(|&m| m >= 1), "passkey lengths must be >= 1");
    ensure!(!opts.depths.is_empty(), "no passkey depths");
    ensure!(opts.prompts >= 1, "passkey prompts per cell must be >= 1");
    let t = model.config().context_len;
    let fixed = passkey_fixed_tokens(tok);
    let mut result = PasskeyResult { rope, reweight, cells: Vec::new(), skipped: Vec::new(), example: String::new() };
    let longest = *opts.multiples.iter().max().expect("non-empty");
    for &m in &opts.multiples {
        let len = m * t;
        // At least a few filler tokens (and room for keys that take a token or two more).
        if len < fixed + 8 {
            result
                .skipped
                .push(format!("{m}x ({len} tokens) cannot hold the {fixed} tokens of the fixed text and 8 of filler"));
            continue;
        }
        let mut rng = SampleRng::new(derive_seed(opts.seed, m as u64));
        let mut prompts = Vec::new();
        for &depth in &opts.depths {
            for _ in 0..opts.prompts {
                prompts.push((depth, passkey_prompt(tok, len, depth, &mut rng)?));
            }
        }
        let forward =
            ForwardOptions { length_scale: Some(m as f64), ntk: rope == Rope::Ntk && m > 1, reweight, attn_impl: None };
        let max_new = prompts.iter().map(|(_, p)| tok.encode(&format!(" {}.", p.key)).len()).max().unwrap_or(0) + 2;
        let settings =
            GenerateOptions { max_new, sampling: Sampling::greedy(), stop: vec![i64::from(tok.eot())], forward };
        let rows = (opts.batch_tokens / (len + max_new)).max(1);
        let mut texts: Vec<String> = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(rows) {
            let ids: Vec<Vec<i64>> = chunk.iter().map(|(_, p)| p.tokens.clone()).collect();
            let out = model.generate_batch(&ids, &vec![0; ids.len()], &settings)?;
            texts.extend(out.into_iter().map(|g| tok.decode(&g.tokens.iter().map(|&x| x as u32).collect::<Vec<_>>())));
        }
        if m == longest {
            result.example = format!("key {} -> {:?}", prompts[0].1.key, texts[0]);
        }
        for &depth in &opts.depths {
            let (mut hits, mut digits, mut n) = (0usize, 0.0, 0usize);
            for ((d, p), text) in prompts.iter().zip(&texts) {
                if *d == depth {
                    n += 1;
                    hits += usize::from(first_number(text) == p.key);
                    digits += digit_accuracy(&p.key, text);
                }
            }
            result.cells.push(PasskeyCell {
                multiple: m,
                seq_len: len,
                depth,
                prompts: n,
                accuracy: hits as f64 / n as f64,
                digit_accuracy: digits / n as f64,
            });
        }
    }
    ensure!(
        !result.cells.is_empty(),
        "no passkey length fits the prompt's {fixed} fixed tokens at a training length of {t}: {}",
        result.skipped.join("; ")
    );
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A "model" that likes continuations containing a marker word, scored per character so that
    /// `acc` and `acc_norm` can disagree.
    struct Oracle;
    impl LogLikelihood for Oracle {
        fn loglik(&mut self, _context: &str, continuation: &str) -> Result<f64> {
            let chars = continuation.chars().count() as f64;
            Ok(if continuation.contains("right") { -0.5 * chars } else { -chars })
        }
    }

    fn tiny_model(tok: &Tokenizer, attention: &str) -> (tch::nn::VarStore, Gpt) {
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let cfg = gpt_model::ModelConfig {
            vocab_size: tok.vocab_size(),
            context_len: 16,
            attention: attention.parse().unwrap(),
            attn_impl: gpt_model::AttnImpl::Reference,
            ..gpt_model::ModelConfig::preset("tiny").unwrap()
        };
        let model = Gpt::new_seeded(&vs.root(), &cfg, 0).unwrap();
        (vs, model)
    }

    #[test]
    fn a_models_log_likelihood_obeys_the_chain_rule() {
        // ln p(x y | c) = ln p(x | c) + ln p(y | c x) when the tokens split cleanly at the joins.
        let tok = Tokenizer::gpt2().unwrap();
        let (_vs, model) = tiny_model(&tok, "lssa+rw15");
        let mut m = ModelScorer::new(&model, &tok, Device::Cpu);
        let both = m.loglik("The", " cat sat").unwrap();
        let (x, y) = (m.loglik("The", " cat").unwrap(), m.loglik("The cat", " sat").unwrap());
        assert!(both < 0.0 && x < 0.0 && y < 0.0);
        assert!((both - (x + y)).abs() < 1e-4, "{both} vs {x} + {y}");
        // With an empty context it is minus the training loss of [eot, tokens...] times its targets:
        // the same alignment of logits and targets as training.
        let ids: Vec<i64> = std::iter::once(tok.eot()).chain(tok.encode(" cat sat")).map(i64::from).collect();
        let n = ids.len() as i64;
        let x = Tensor::from_slice(&ids[..ids.len() - 1]).view([1, n - 1]);
        let t = Tensor::from_slice(&ids[1..]).view([1, n - 1]);
        let loss = model.loss(&x, &t, &ForwardOptions::default()).unwrap().double_value(&[]);
        let whole = m.loglik("", " cat sat").unwrap();
        assert!((whole + loss * (n - 1) as f64).abs() < 1e-4, "{whole} vs -{loss} x {}", n - 1);
        // An untrained model is close to uniform: about ln(1/V) per token.
        let per_token = both / 2.0;
        assert!((per_token + (tok.vocab_size() as f64).ln()).abs() < 1.0, "{per_token}");
        // A context longer than the window is cut from the left; the score stays finite.
        let long = "word ".repeat(40);
        assert!(m.loglik(&long, " end").unwrap().is_finite());
    }

    #[test]
    fn batched_choices_score_as_one_forward_each() {
        let tok = Tokenizer::gpt2().unwrap();
        let choices: Vec<String> =
            [" a", " carbon dioxide and water", " no", " the quick brown fox jumps over it"].map(String::from).to_vec();
        // relu-seqlen divides by the window's length: only equal lengths may share a forward.
        for attention in ["lssa+rw15", "softmax", "relu-seqlen"] {
            let (_vs, model) = tiny_model(&tok, attention);
            let mut m = ModelScorer::new(&model, &tok, Device::Cpu);
            for context in ["Question: which gas?\nAnswer:", &"long context ".repeat(20)] {
                let batched = m.loglik_batch(context, &choices).unwrap();
                for (c, b) in choices.iter().zip(&batched) {
                    let single = m.loglik(context, c).unwrap();
                    assert!((single - b).abs() < 1e-4, "{attention}: {c:?}: {single} alone, {b} batched");
                }
            }
        }
    }

    #[test]
    fn bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.jsonl");
        std::fs::write(&p, "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 0}\n{\"goal\": \"g\"}\n")
            .unwrap();
        let err = format!("{:#}", read_items("piqa", &p).unwrap_err());
        assert!(err.contains("bad.jsonl:2") && err.contains("sol1"), "{err}");
        assert!(parse_item("winogrande", "{}").is_err());
        let out_of_range = r#"{"goal": "g", "sol1": "a", "sol2": "b", "label": 2}"#;
        assert!(format!("{:#}", parse_item("piqa", out_of_range).unwrap_err()).contains("out of 2"));
        // A directory without any task file is named with what was looked for.
        let err = format!("{:#}", task_files(dir.path()).unwrap_err());
        assert!(err.contains("arc_easy.jsonl") && err.contains("mmlu.jsonl"), "{err}");
        assert!(task_files(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn hellaswag_tags_are_cleaned_like_the_harness() {
        assert_eq!(
            hellaswag_clean(" How to cook [title] Boil water. [step] Add salt.  "),
            "How to cook. Boil water. Add salt."
        );
    }

    #[test]
    fn acc_and_acc_norm_follow_summed_and_per_character_likelihood() {
        let items = vec![
            // The right choice is longer: summed log-likelihood prefers the short wrong one (-3 vs
            // -0.5 * 12 = -6); per character of the choice without its leading space the right one
            // wins (-6 / 11 against -3 / 2).
            Item { context: "c".into(), choices: vec![" no".into(), " right right".into()], gold: 1 },
            // Both criteria pick the right one.
            Item { context: "c".into(), choices: vec![" right".into(), " wrong".into()], gold: 0 },
            // Neither does.
            Item { context: "c".into(), choices: vec![" right".into(), " wrong".into()], gold: 1 },
        ];
        let s = score(&items, &mut Oracle).unwrap();
        assert_eq!(s.n, 3);
        assert!((s.acc - 1.0 / 3.0).abs() < 1e-12, "{s:?}");
        assert!((s.acc_norm - 2.0 / 3.0).abs() < 1e-12, "{s:?}");
        // Sample standard error of a 1/3 proportion over 3 items: sqrt((1/3) / 3).
        assert!((s.acc_stderr - (1.0f64 / 9.0).sqrt()).abs() < 1e-12, "{s:?}");
        // Per item: the picks that made those accuracies, with the gold answer.
        let picks: Vec<(usize, usize, usize)> = s.items.iter().map(|i| (i.acc_pick, i.acc_norm_pick, i.gold)).collect();
        assert_eq!(picks, [(0, 1, 1), (0, 0, 0), (0, 0, 1)]);
        assert!((s.items[0].loglik[1] - -6.0).abs() < 1e-12, "{:?}", s.items[0]);
        // acc_norm's length is the choice's, without its leading space: per continuation character
        // these two tie (-1 each, and the earlier would win); per choice character the longer wins
        // (-5 / 4 against -2 / 1), as lm-evaluation-harness picks.
        let item = Item { context: "c".into(), choices: vec![" x".into(), " xxxx".into()], gold: 1 };
        assert_eq!(score(&[item], &mut Oracle).unwrap().items[0].acc_norm_pick, 1);
        let json = lm_eval_json(&[("piqa".to_string(), s)]);
        assert!((json["results"]["piqa"]["acc_norm,none"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(json["n-samples"]["piqa"]["effective"], 3);
    }

    #[test]
    fn passkey_prompts_have_the_exact_length_and_depth_and_hide_their_key() {
        let tok = Tokenizer::gpt2().unwrap();
        let mut rng = SampleRng::new(3);
        for (len, depth) in [(128, 0.0), (256, 0.5), (300, 1.0), (1000, 0.25)] {
            let p = passkey_prompt(&tok, len, depth, &mut rng).unwrap();
            assert_eq!(p.tokens.len(), len);
            assert_eq!(p.tokens[0], i64::from(tok.eot()));
            assert_eq!(p.key.len(), 5);
            let ids: Vec<u32> = p.tokens.iter().map(|&t| t as u32).collect();
            let text = tok.decode(&ids);
            assert!(text.contains(&format!("The pass key is {}.", p.key)), "{text}");
            assert!(text.ends_with("The pass key is"), "the answer is not given away at the end");
            // The needle sits at the asked depth of the filler, to within one token.
            let head = 1 + tok.encode(PASSKEY_INTRO).len();
            let fill = len - head - tok.encode(&needle(&p.key)).len() - tok.encode(PASSKEY_QUESTION).len();
            let want = head as f64 + depth * fill as f64;
            assert!((p.needle_at as f64 - want).abs() <= 1.0, "needle at {} for {want}", p.needle_at);
        }
        // The same seed gives the same prompts; too short a length is refused.
        let a = passkey_prompt(&tok, 200, 0.5, &mut SampleRng::new(9)).unwrap();
        assert_eq!(a, passkey_prompt(&tok, 200, 0.5, &mut SampleRng::new(9)).unwrap());
        assert_ne!(a.key, passkey_prompt(&tok, 200, 0.5, &mut SampleRng::new(10)).unwrap().key);
        assert!(passkey_prompt(&tok, 20, 0.5, &mut rng).is_err());
        assert_eq!(digit_accuracy("85722", " 85722."), 1.0);
        assert_eq!(digit_accuracy("85722", "key 85. 722"), 0.4);
    }
}
