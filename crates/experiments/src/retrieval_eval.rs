//! The retrieval experiment (SPEC section 9): each trained language model is fine-tuned briefly on
//! passkey prompts at the training length, then asked for the pass key by greedy decoding (with the
//! KV cache) at 1x..16x the training length and at several needle depths.
//!
//! Choices (the paper gives no recipe for its small models):
//!
//! - Fine-tuning mix: passkey prompts ([`crate::retrieval::prompt`]) of exactly the training length
//!   with the answer appended, next-token loss on the answer tokens only, AdamW at the scale's
//!   learning rate / 2 with linear warm-down, on filler from the first half of the validation tokens. Evaluation
//!   fillers come from the second half, so no evaluation text was seen in fine-tuning.
//! - The same fine-tuned `lssa` model is also evaluated with post-hoc re-weighting (`p = 15`).
//! - A prompt counts as correct when the generated continuation contains the pass key.
//! - NTK-scaled RoPE beyond 1x, as in the report's other long-length numbers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::Tensor;
use tch::nn::OptimizerConfig;

use gpt_model::ForwardOptions;
use trainer::data::tokenizer::Tokenizer;

use crate::plot::{Series, draw_grid, save_with};
use crate::post::{Figures, Inputs, PostTraining};
use crate::retrieval::{self, Task};
use crate::runner::run_dir_name;
use crate::scale::Scale;
use crate::spec::{Experiment, Kind};

/// Sizes of the retrieval experiment at one scale.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Fine-tuning steps.
    pub steps: usize,
    /// Prompts per fine-tuning step.
    pub batch: usize,
    /// Length multiples evaluated.
    pub multiples: Vec<usize>,
    /// Needle depths evaluated.
    pub depths: Vec<f64>,
    /// Prompts per (length, depth) cell.
    pub prompts: usize,
    /// Length of fine-tuning prompts as a multiple of the training length (1 except where the
    /// training length cannot hold the prompt's fixed text; doubled at run time until it does).
    pub train_multiple: usize,
    /// Seed of prompts and filler offsets.
    pub seed: u64,
}

impl Settings {
    /// `smoke`: seconds (in the test suite); others: a few minutes per model on two CPU cores.
    pub fn for_scale(scale: &str) -> Self {
        match scale {
            "smoke" => Settings {
                steps: 2,
                batch: 2,
                multiples: vec![8, 16],
                depths: vec![0.5],
                prompts: 1,
                train_multiple: 8,
                seed: 7,
            },
            _ => Settings {
                steps: 1500,
                batch: 8,
                multiples: vec![1, 2, 4, 8, 16],
                depths: vec![0.0, 0.25, 0.5, 0.75, 1.0],
                prompts: 6,
                train_multiple: 1,
                seed: 7,
            },
        }
    }
}

/// The accuracy of one model (and post-hoc power) on the grid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetrievalResult {
    /// Row label (variant, and `post hoc p` when applied).
    pub label: String,
    /// The trained variant.
    pub variant: String,
    /// Post-hoc re-weighting power at evaluation.
    pub posthoc: Option<u32>,
    /// Settings it ran with (cached results are reused only for the same settings).
    pub settings: Settings,
    /// Accuracy per `(multiple, depth)`: the continuation contains the whole key.
    pub cells: Vec<(usize, f64, f64)>,
    /// Digit accuracy per `(multiple, depth)`: the share of the key's digits that the first number
    /// of the continuation has in the same place (partial retrieval; 0.1 is chance).
    #[serde(default)]
    pub digit_cells: Vec<(usize, f64, f64)>,
    /// The code that computed it ([`crate::runner::task_revision`]) and the fingerprint of the
    /// trained model's config: a cached result is reused only when both still match.
    #[serde(default)]
    pub provenance: String,
    /// The fine-tuning length actually used, as a multiple of the training length.
    pub train_multiple: usize,
    /// Fine-tuning loss over the last tenth of its steps.
    pub finetune_loss: f64,
    /// One example answer at the longest length (for the report), as generated.
    pub example: String,
    /// Fine-tuning and evaluation time, seconds.
    pub wall_s: f64,
}

impl RetrievalResult {
    /// Mean accuracy over depths at `multiple`.
    pub fn mean_at(&self, multiple: usize) -> Option<f64> {
        mean_at(&self.cells, multiple)
    }

    /// Mean digit accuracy over depths at `multiple`.
    pub fn digits_at(&self, multiple: usize) -> Option<f64> {
        mean_at(&self.digit_cells, multiple)
    }
}

fn mean_at(cells: &[(usize, f64, f64)], multiple: usize) -> Option<f64> {
    let xs: Vec<f64> = cells.iter().filter(|c| c.0 == multiple).map(|c| c.2).collect();
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// The share of `key`'s digits found in the same place in the first run of digits of `text`.
pub fn digit_accuracy(key: &str, text: &str) -> f64 {
    let first: String = text.chars().skip_while(|c| !c.is_ascii_digit()).take_while(char::is_ascii_digit).collect();
    let hits = key.chars().zip(first.chars()).filter(|(a, b)| a == b).count();
    hits as f64 / key.len().max(1) as f64
}

/// The tokens a fine-tuning sequence appends to its prompt: " <answers>.".
fn answer_tokens(tok: &Tokenizer, answers: &[String]) -> Vec<u32> {
    tok.encode(&format!(" {}.", answers.join(", ")))
}

/// One fine-tuning sequence of exactly `len + 1` tokens: a passkey prompt with its needle at `depth`
/// followed by the answer, and the positions of the answer's tokens in it. The key is drawn first
/// because its answer's length sets the prompt's.
fn tuning_sequence(
    tok: &Tokenizer,
    filler: &[u16],
    len: usize,
    depth: f64,
    rng: &mut impl rand::Rng,
) -> Result<(Vec<i64>, std::ops::Range<usize>)> {
    let needles = retrieval::Needles::draw(Task::Passkey, rng)?;
    let ans = answer_tokens(tok, &needles.answers);
    ensure!(ans.len() < len / 2, "a {}-token answer does not fit a {len}-token sequence", ans.len());
    let p = needles.assemble(tok, filler, len + 1 - ans.len(), depth, rng)?;
    let at = p.tokens.len()..len + 1;
    Ok((p.tokens.iter().chain(&ans).map(|&t| i64::from(t)).collect(), at))
}

/// Fine-tunes the trained model of `variant` (its last checkpoint under `out`) and evaluates it for
/// each of `rows` (`(label, post-hoc power)`); results are cached under `out/retrieval`.
pub fn run(scale: &Scale, out: &Path, variant: &str, rows: &[(String, Option<u32>)]) -> Result<Vec<RetrievalResult>> {
    let settings = Settings::for_scale(scale.name);
    let my_rows: Vec<(String, String, Option<u32>)> =
        rows.iter().map(|(l, p)| (l.clone(), variant.to_string(), *p)).collect();
    let cache_dir = out.join("retrieval");
    let cache = |label: &str| cache_dir.join(format!("{}.json", run_dir_name(label)));
    // The model it fine-tunes: its config (and so its seed and scale) and the code.
    let model_config = std::fs::read_to_string(crate::runner::run_dir(out, variant, 0).join("result.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<crate::runner::RunResult>(&t).ok())
        .map_or_else(String::new, |r| r.config);
    let provenance = format!("{} {}", crate::runner::task_revision(), crate::runner::fingerprint(&model_config));
    let cached: Vec<Option<RetrievalResult>> = my_rows
        .iter()
        .map(|(label, _, _)| {
            std::fs::read_to_string(cache(label))
                .ok()
                .and_then(|t| serde_json::from_str::<RetrievalResult>(&t).ok())
                .filter(|r| r.settings == settings && r.provenance == provenance)
        })
        .collect();
    if cached.iter().all(Option::is_some) {
        crate::runner::say(&format!("retrieval experiment, `{variant}`: cached in {}", cache_dir.display()));
        return Ok(cached.into_iter().flatten().collect());
    }
    crate::runner::say(&format!("retrieval experiment, `{variant}` (fine-tuning, then greedy decoding) ..."));
    let start = Instant::now();
    let crate::runner::Trained { vs, model, tokenizer: tok, val, cfg: train_cfg, device } =
        crate::runner::load_trained(scale, out, variant)?;
    let (tune_filler, eval_filler) = val.split_at(val.len() / 2);
    let (cfg, base_lr) = (&train_cfg.model, train_cfg.lr);
    let t_train = cfg.context_len;
    let mut rng = ChaCha8Rng::seed_from_u64(settings.seed);

    // The prompt's fixed text (instructions, needle, question) plus some filler must fit.
    let fits = |len: usize| {
        retrieval::prompt(Task::Passkey, &tok, tune_filler, len, 0.5, &mut ChaCha8Rng::seed_from_u64(0)).is_ok()
    };
    let mut train_multiple = settings.train_multiple;
    while !fits(t_train * train_multiple - 8) && train_multiple < 64 {
        train_multiple *= 2;
    }
    // Fine-tuning.
    let lr = base_lr / 2.0;
    let mut opt = tch::nn::AdamW::default().build(&vs, lr)?;
    let len = t_train * train_multiple;
    let mut tail = Vec::new();
    let tuning = crate::progress::Work::start(&format!("retrieval `{variant}`: fine-tuning"), settings.steps, "steps");
    for step in 0..settings.steps {
        opt.set_lr(lr * (1.0 - step as f64 / settings.steps as f64));
        let mut seqs = Vec::with_capacity(settings.batch * (len + 1));
        let mut masks: Vec<f32> = Vec::with_capacity(settings.batch * len);
        for _ in 0..settings.batch {
            let depth = rand::Rng::random_range(&mut rng, 0.0..=1.0);
            let (seq, answer) = tuning_sequence(&tok, tune_filler, len, depth, &mut rng)?;
            seqs.extend(seq);
            let (a0, a1) = (answer.start - 1, answer.end - 1);
            masks.extend((0..len).map(|t| if (a0..a1).contains(&t) { 1.0 } else { 0.0 }));
        }
        let all = Tensor::from_slice(&seqs).view([settings.batch as i64, (len + 1) as i64]).to(device);
        let (idx, tgt) = (all.narrow(1, 0, len as i64), all.narrow(1, 1, len as i64));
        // Next-token loss on the answer tokens only: the filler is ordinary text the model has
        // already learned, and in a prompt of T_train tokens the answer is a few of them.
        let mask = Tensor::from_slice(&masks).view([settings.batch as i64, len as i64]).to(device);
        let logits = model.forward(&idx, &ForwardOptions::default())?;
        let logp =
            logits.narrow(-1, 0, cfg.vocab_size as i64).to_kind(tch::Kind::Float).log_softmax(-1, tch::Kind::Float);
        let nll = -logp.gather(-1, &tgt.unsqueeze(-1), false).squeeze_dim(-1);
        let loss = (nll * &mask).sum(tch::Kind::Float) / mask.sum(tch::Kind::Float).clamp_min(1.0);
        opt.backward_step(&loss);
        let l = loss.double_value(&[]);
        ensure!(l.is_finite(), "retrieval fine-tuning of `{variant}` diverged at step {step}");
        if step + settings.steps.div_ceil(10) >= settings.steps {
            tail.push(l);
        }
        tuning.inc();
    }
    drop(tuning);
    let finetune_loss = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    let tuned_s = start.elapsed().as_secs_f64();

    let mut results = Vec::new();
    for ((label, _, posthoc), cached) in my_rows.iter().zip(cached) {
        if let Some(r) = cached {
            results.push(r);
            continue;
        }
        let started = Instant::now();
        let mut eval_rng = ChaCha8Rng::seed_from_u64(settings.seed + 1);
        let mut cells = Vec::new();
        let mut digit_cells = Vec::new();
        let mut example = String::new();
        let prompts = crate::progress::Work::start(
            &format!("retrieval `{label}`"),
            settings.multiples.len() * settings.depths.len() * settings.prompts,
            "prompts",
        );
        for &m in &settings.multiples {
            let opts = ForwardOptions { length_scale: Some(m as f64), ntk: true, reweight: *posthoc, attn_impl: None };
            if !fits(t_train * m) {
                continue; // this length cannot hold the prompt's fixed text: no cell
            }
            for &depth in &settings.depths {
                let mut correct = 0;
                let mut digits = 0.0;
                for _ in 0..settings.prompts {
                    let p = retrieval::prompt(Task::Passkey, &tok, eval_filler, t_train * m, depth, &mut eval_rng)?;
                    let ids: Vec<i64> = p.tokens.iter().map(|&t| i64::from(t)).collect();
                    let out = tch::no_grad(|| model.generate(&ids, 8, None, &opts))?;
                    prompts.inc();
                    let new: Vec<u32> = out[ids.len()..].iter().map(|&t| t as u32).collect();
                    let text = tok.decode(&new);
                    if retrieval::is_correct(&p, &text) {
                        correct += 1;
                    }
                    digits += digit_accuracy(&p.answers[0], &text);
                    if m == *settings.multiples.last().expect("multiples") && example.is_empty() {
                        example = format!("key {} -> \"{}\"", p.answers.join(","), text.trim());
                    }
                }
                cells.push((m, depth, correct as f64 / settings.prompts as f64));
                digit_cells.push((m, depth, digits / settings.prompts as f64));
            }
        }
        let r = RetrievalResult {
            label: label.clone(),
            variant: variant.to_string(),
            posthoc: *posthoc,
            settings: settings.clone(),
            provenance: provenance.clone(),
            train_multiple,
            cells,
            digit_cells,
            finetune_loss,
            example,
            wall_s: tuned_s + started.elapsed().as_secs_f64(),
        };
        std::fs::create_dir_all(&cache_dir)?;
        std::fs::write(cache(label), serde_json::to_string_pretty(&r)?)?;
        results.push(r);
    }
    Ok(results)
}

/// The name `--only` accepts for the retrieval experiment alone (it also trains its rows' models).
pub const ONLY: &str = "retrieval";

/// The retrieval experiment as a [`PostTraining`] kind: results by row label.
#[derive(Debug, Default)]
pub struct Experiments {
    /// Results by row label (empty until run).
    pub results: BTreeMap<String, RetrievalResult>,
}

impl PostTraining for Experiments {
    fn kind(&self) -> Kind {
        Kind::Retrieval
    }

    fn only_name(&self) -> Option<&'static str> {
        Some(ONLY)
    }

    fn run(&mut self, e: &Experiment, inputs: &Inputs<'_>) -> Result<()> {
        let mut by_variant: BTreeMap<&str, Vec<(String, Option<u32>)>> = BTreeMap::new();
        for r in &e.rows {
            by_variant.entry(r.train.as_str()).or_default().push((r.label.clone(), r.posthoc));
        }
        for (variant, rows) in by_variant {
            if inputs.results.get(variant).and_then(|r| r.first()).is_none_or(|r| r.error.is_some()) {
                eprintln!("reproduce: retrieval: no trained `{variant}` model, its rows stay empty");
                continue;
            }
            for res in run(inputs.scale, inputs.out, variant, &rows)
                .with_context(|| format!("the retrieval experiment with `{variant}`"))?
            {
                eprintln!(
                    "reproduce: retrieval `{}`: accuracy by length {:?} ({:.0} s)",
                    res.label,
                    res.settings.multiples.iter().map(|&m| res.mean_at(m).unwrap_or(f64::NAN)).collect::<Vec<_>>(),
                    res.wall_s
                );
                self.results.insert(res.label.clone(), res);
            }
        }
        Ok(())
    }

    fn wall_s(&self) -> f64 {
        // A post-hoc row reuses its model's fine-tuning and evaluation time.
        self.results.values().filter(|r| r.posthoc.is_none()).map(|r| r.wall_s).sum()
    }

    fn verdicts(&self) -> Vec<String> {
        verdicts(&self.results)
    }

    fn section(&self, md: &mut String, e: &Experiment, figures: Figures<'_>) -> Result<()> {
        section(md, e, &self.results, figures)
    }
}

fn section(
    md: &mut String,
    e: &Experiment,
    retrieval: &BTreeMap<String, RetrievalResult>,
    figures: Figures<'_>,
) -> Result<()> {
    let (figures_dir, figures_rel) = (figures.dir, figures.rel);
    let Some(any) = e.rows.iter().find_map(|r| retrieval.get(&r.label)) else {
        let _ = writeln!(md, "Not run in this invocation (select it with `--only {ONLY}`).");
        return Ok(());
    };
    let s = &any.settings;
    let _ = writeln!(
        md,
        "Fine-tuning: {} steps of {} prompts at {}x the training length. Evaluation: {} prompts per cell, depths {:?}.\n",
        s.steps, s.batch, any.train_multiple, s.prompts, s.depths
    );
    let _ = write!(md, "| row | fine-tune loss |");
    for m in &s.multiples {
        let _ = write!(md, " {m}x |");
    }
    let _ = writeln!(md, " example at {}x |", s.multiples.last().copied().unwrap_or(1));
    let _ = writeln!(md, "|---|---:|{}---|", "---:|".repeat(s.multiples.len()));
    let mut series: Vec<Series> = Vec::new();
    for (i, r) in e.rows.iter().enumerate() {
        let Some(res) = retrieval.get(&r.label) else {
            let _ = writeln!(md, "| {} | - |{} - |", r.label, " - |".repeat(s.multiples.len()));
            continue;
        };
        let _ = write!(md, "| {} | {:.3} |", r.label, res.finetune_loss);
        for &m in &s.multiples {
            let pct = |x: Option<f64>| x.map_or("-".into(), |a| format!("{:.0}%", 100.0 * a));
            let _ = write!(md, " {} / {} |", pct(res.mean_at(m)), pct(res.digits_at(m)));
        }
        let _ = writeln!(md, " {} |", res.example.replace('|', "/"));
        series.push((
            r.label.clone(),
            i,
            r.posthoc.is_some(),
            s.multiples.iter().filter_map(|&m| res.digits_at(m).map(|a| (m as f64, a))).collect(),
        ));
        let name = format!("{}_{}", e.name, run_dir_name(&r.label));
        let acc =
            |m: usize, d: f64| res.digit_cells.iter().find(|c| c.0 == m && (c.1 - d).abs() < 1e-9).map_or(0.0, |c| c.2);
        let (ms, ds) = (&res.settings.multiples, &res.settings.depths);
        draw_grid(&figures_dir.join(&name), &format!("{}: passkey digit accuracy", r.label), ms, ds, &acc)?;
    }
    let _ = writeln!(
        md,
        "\nCells: exact accuracy (the whole key) / digit accuracy (share of the key's digits in place; 10% is chance), averaged over depths. The figure and the heat maps (length x depth) show digit accuracy.\n"
    );
    let name = format!("{}_accuracy", e.name);
    save_with(
        &figures_dir.join(&name),
        "Passkey digit accuracy against length (mean over depths)",
        ("length multiple", "digit accuracy"),
        &series,
    )?;
    let _ = writeln!(md, "![{}]({figures_rel}/{name}.png) ([SVG]({figures_rel}/{name}.svg))\n", e.title);
    for r in e.rows.iter().filter(|r| retrieval.contains_key(&r.label)) {
        let name = format!("{}_{}", e.name, run_dir_name(&r.label));
        let _ = writeln!(md, "![{}]({figures_rel}/{name}.png)", r.label);
    }
    Ok(())
}

/// One verdict line on retrieval beyond the training length: LSSAR against softmax at the longest length.
fn verdicts(retrieval: &BTreeMap<String, RetrievalResult>) -> Vec<String> {
    let (Some(s), Some(r)) = (retrieval.get("Softmax"), retrieval.get("LSSAR p=15 (train)")) else {
        return Vec::new();
    };
    let Some(&last) = s.settings.multiples.last() else { return Vec::new() };
    let first = s.settings.multiples[0];
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |a| format!("{:.0}%", 100.0 * a));
    let (s1, sl, r1, rl) = (s.mean_at(first), s.mean_at(last), r.mean_at(first), r.mean_at(last));
    let claim = matches!((sl, rl, r1), (Some(sl), Some(rl), Some(r1)) if rl > sl + 0.2 && r1 > 0.5);
    let (sd1, sdl, rd1, rdl) = (s.digits_at(first), s.digits_at(last), r.digits_at(first), r.digits_at(last));
    vec![format!(
        "**Passkey retrieval beyond the training length, LSSAR vs softmax**: {}. Exact accuracy {first}x -> {last}x: LSSAR (p = 15, trained) {} -> {}, softmax {} -> {}; digit accuracy LSSAR {} -> {}, softmax {} -> {} (10% is chance).",
        if claim {
            "reproduced (LSSAR holds more than 20 points above softmax at the longest length)"
        } else if r1.is_some_and(|a| a < 0.5) && s1.is_some_and(|a| a < 0.5) {
            "not testable at this scale: neither model retrieves the key reliably even at the training length"
        } else {
            "not reproduced at this scale"
        },
        pct(r1),
        pct(rl),
        pct(s1),
        pct(sl),
        pct(rd1),
        pct(rdl),
        pct(sd1),
        pct(sdl)
    )]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digit_accuracy_compares_the_first_number_place_by_place() {
        assert_eq!(digit_accuracy("85722", " 85722."), 1.0);
        assert_eq!(digit_accuracy("85722", "key 85. 722"), 0.4);
        assert_eq!(digit_accuracy("85722", "the pass key?"), 0.0);
        assert_eq!(digit_accuracy("85722", "95721"), 0.6);
    }

    #[test]
    fn a_tuning_sequence_is_len_plus_one_tokens_ending_in_the_key_it_hides() {
        let tok = Tokenizer::gpt2().unwrap();
        let text = "The river bends past the old mill, and the mill wheel turns slowly in the current. ".repeat(200);
        let filler: Vec<u16> = tok.encode(&text).into_iter().map(|t| t as u16).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for (len, depth) in [(128, 0.0), (129, 0.5), (300, 1.0), (1024, 0.3)] {
            let (seq, at) = tuning_sequence(&tok, &filler, len, depth, &mut rng).unwrap();
            assert_eq!(seq.len(), len + 1);
            assert_eq!(at.end, len + 1, "the answer ends the sequence");
            let ids: Vec<u32> = seq.iter().map(|&t| t as u32).collect();
            let answer = tok.decode(&ids[at.clone()]);
            let key = answer.trim().trim_end_matches('.');
            assert!(key.len() == 5 && key.chars().all(|c| c.is_ascii_digit()), "answer {answer:?}");
            let prompt = tok.decode(&ids[..at.start]);
            assert!(prompt.contains(&format!("The pass key is {key}.")), "the prompt hides the answered key");
            assert!(prompt.ends_with("The pass key is"), "the answer follows the question");
        }
    }
}
