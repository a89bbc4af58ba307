//! Downstream multiple choice scored the way lm-evaluation-harness scores it:
//! each choice is a continuation of a context; the model's summed log-likelihood of the continuation
//! picks the answer (`acc`), and the same divided by the continuation's length in characters picks it
//! for `acc_norm`. The readers take the JSONL layouts the data sets are published in; the files come
//! from the user (none of these sets is in a package registry, and nothing here downloads them).
//!
//! | task | fields of a JSONL line | context | choices (each preceded by a space) |
//! |---|---|---|---|
//! | `arc_easy`, `arc_challenge` | `question`, `choices.text`, `choices.label`, `answerKey` | `Question: {question}\nAnswer:` | the choice texts |
//! | `hellaswag` | `activity_label`, `ctx_a`, `ctx_b`, `endings`, `label` | `{activity_label}: {ctx_a} {Ctx_b}`, cleaned | the cleaned endings |
//! | `piqa` | `goal`, `sol1`, `sol2`, `label` | `Question: {goal}\nAnswer:` | `sol1`, `sol2` |
//! | `sciq` | `support`, `question`, `distractor1..3`, `correct_answer` | `{support}\nQuestion: {question}\nAnswer:` | the distractors, then the answer |
//! | `mmlu` | `subject`, `question`, `choices`, `answer` | the harness's zero-shot prompt with `A.`..`D.` | `A`, `B`, `C`, `D` |

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// What a model must answer: the summed log-probability of `continuation` given `context`.
pub trait LogLikelihood {
    /// `ln p(continuation | context)`, summed over the continuation's tokens.
    fn loglik(&mut self, context: &str, continuation: &str) -> Result<f64>;
}

/// [`LogLikelihood`] of a trained model with its tokenizer, as the harness computes it: the context
/// and the continuation are encoded together and the continuation's tokens are those after the
/// context's; the sequence starts with the end-of-text token (as every training document does) and
/// is cut from the left to the model's training length.
pub struct ModelScorer<'a> {
    /// The model.
    pub model: &'a gpt_model::model::Gpt,
    /// Its tokenizer.
    pub tokenizer: &'a trainer::data::tokenizer::Tokenizer,
    /// Where the model lives.
    pub device: tch::Device,
}

impl LogLikelihood for ModelScorer<'_> {
    fn loglik(&mut self, context: &str, continuation: &str) -> Result<f64> {
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
        let n = seq.len() as i64;
        let x = tch::Tensor::from_slice(&seq[..seq.len() - 1]).view([1, n - 1]).to(self.device);
        let y = tch::Tensor::from_slice(&seq[1..]).view([1, n - 1, 1]).to(self.device);
        let logits = tch::no_grad(|| self.model.forward(&x, &gpt_model::model::ForwardOptions::default()))?;
        // Over the real vocabulary: the embedding's padding columns are not tokens.
        let logits = logits.narrow(-1, 0, self.model.config().vocab_size as i64);
        let picked = logits.log_softmax(-1, tch::Kind::Float).gather(-1, &y, false).squeeze_dim(-1);
        let k = cont.len() as i64;
        Ok(picked.narrow(1, n - 1 - k, k).sum(tch::Kind::Double).double_value(&[]))
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
    /// Accuracy by log-likelihood per character of the continuation.
    pub acc_norm: f64,
    /// Its standard error.
    pub acc_norm_stderr: f64,
}

/// Scores `items` with `model`.
pub fn score(items: &[Item], model: &mut dyn LogLikelihood) -> Result<Scores> {
    ensure!(!items.is_empty(), "no items to score");
    let (mut acc, mut acc_norm) = (Vec::new(), Vec::new());
    for item in items {
        let ll: Vec<f64> = item.choices.iter().map(|c| model.loglik(&item.context, c)).collect::<Result<_>>()?;
        let norm: Vec<f64> = ll.iter().zip(&item.choices).map(|(l, c)| l / c.chars().count().max(1) as f64).collect();
        acc.push(f64::from(u8::from(argmax(&ll) == item.gold)));
        acc_norm.push(f64::from(u8::from(argmax(&norm) == item.gold)));
    }
    let (a, ase) = mean_stderr(&acc);
    let (an, anse) = mean_stderr(&acc_norm);
    Ok(Scores { n: items.len(), acc: a, acc_stderr: ase, acc_norm: an, acc_norm_stderr: anse })
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

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/downstream");

    /// A "model" that likes continuations containing a marker word, scored per character so that
    /// `acc` and `acc_norm` can disagree.
    struct Oracle;
    impl LogLikelihood for Oracle {
        fn loglik(&mut self, _context: &str, continuation: &str) -> Result<f64> {
            let chars = continuation.chars().count() as f64;
            Ok(if continuation.contains("right") { -0.5 * chars } else { -chars })
        }
    }

    #[test]
    fn a_models_log_likelihood_obeys_the_chain_rule() {
        // ln p(x y | c) = ln p(x | c) + ln p(y | c x) when the tokens split cleanly at the joins.
        let tok = trainer::data::tokenizer::Tokenizer::gpt2().unwrap();
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let cfg = gpt_model::ModelConfig {
            vocab_size: tok.vocab_size(),
            context_len: 16,
            attention: "lssa+rw15".into(),
            ..gpt_model::ModelConfig::preset("tiny").unwrap()
        };
        let model = gpt_model::model::Gpt::new_seeded(&vs.root(), &cfg, 0).unwrap();
        let mut m = ModelScorer { model: &model, tokenizer: &tok, device: tch::Device::Cpu };
        let both = m.loglik("The", " cat sat").unwrap();
        let (x, y) = (m.loglik("The", " cat").unwrap(), m.loglik("The cat", " sat").unwrap());
        assert!(both < 0.0 && x < 0.0 && y < 0.0);
        assert!((both - (x + y)).abs() < 1e-4, "{both} vs {x} + {y}");
        // With an empty context it is minus the training loss of [eot, tokens...] times its targets:
        // the same alignment of logits and targets as training.
        let ids: Vec<i64> = std::iter::once(tok.eot()).chain(tok.encode(" cat sat")).map(i64::from).collect();
        let n = ids.len() as i64;
        let x = tch::Tensor::from_slice(&ids[..ids.len() - 1]).view([1, n - 1]);
        let t = tch::Tensor::from_slice(&ids[1..]).view([1, n - 1]);
        let loss = model.loss(&x, &t, &gpt_model::model::ForwardOptions::default()).unwrap().double_value(&[]);
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
    fn every_layout_is_read_with_the_harness_prompts() {
        let arc = read_items("arc_easy", &Path::new(FIXTURES).join("arc.jsonl")).unwrap();
        assert_eq!(arc.len(), 3);
        assert_eq!(arc[0].context, "Question: Which gas do plants take in?\nAnswer:");
        assert_eq!(arc[0].choices, [" oxygen", " carbon dioxide", " helium", " neon"]);
        assert_eq!(arc[0].gold, 1);
        assert_eq!(arc[2].gold, 2, "numeric answer keys ('1'..'4') map through the labels");

        let hs = read_items("hellaswag", &Path::new(FIXTURES).join("hellaswag.jsonl")).unwrap();
        assert_eq!(hs[0].context, "Baking cookies: A woman mixes flour in a bowl. She");
        assert_eq!(hs[0].choices[1], " puts the dough on a tray. Then bakes it.");
        assert_eq!(hs[0].gold, 1);

        let piqa = read_items("piqa", &Path::new(FIXTURES).join("piqa.jsonl")).unwrap();
        assert_eq!(piqa[0].context, "Question: How do you open a jar?\nAnswer:");
        assert_eq!((piqa[0].choices.len(), piqa[0].gold), (2, 0));

        let sciq = read_items("sciq", &Path::new(FIXTURES).join("sciq.jsonl")).unwrap();
        assert!(sciq[0].context.starts_with("Water boils at 100 C at sea level.\nQuestion: "));
        assert_eq!((sciq[0].choices[3].as_str(), sciq[0].gold), (" 100 C", 3));

        let mmlu = read_items("mmlu", &Path::new(FIXTURES).join("mmlu.jsonl")).unwrap();
        assert_eq!(
            mmlu[0].context,
            "The following are multiple choice questions (with answers) about high school physics.\n\n\
             What is the unit of force?\nA. joule\nB. newton\nC. watt\nD. pascal\nAnswer:"
        );
        assert_eq!((mmlu[0].choices[1].as_str(), mmlu[0].gold), (" B", 1));
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
            // -0.5 * 12 = -6); per character the right one wins (-0.5 vs -1).
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
        let json = lm_eval_json(&[("piqa".to_string(), s)]);
        assert!((json["results"]["piqa"]["acc_norm,none"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(json["n-samples"]["piqa"]["effective"], 3);
    }
}

/// One task's scores for one model, with the size of the file they came from (a changed file is rescored).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskScores {
    /// The task (one of [`TASKS`]).
    pub task: String,
    /// Bytes of `<task>.jsonl` when it was scored.
    pub file_bytes: u64,
    /// The scores.
    pub scores: Scores,
}

/// Scores the trained `variant` of `scale` (under `out`) on every `<task>.jsonl` of [`TASKS`] found
/// in `dir`, zero-shot; results are cached in `out/downstream/<variant>.json` (and written in
/// lm-evaluation-harness's layout beside it, `<variant>.lm-eval.json`).
pub fn run(scale: &crate::scale::Scale, out: &Path, variant: &str, dir: &Path) -> Result<Vec<TaskScores>> {
    let cache_dir = out.join("downstream");
    let name = crate::runner::run_dir_name(variant);
    let cache = cache_dir.join(format!("{name}.json"));
    let old: Vec<TaskScores> =
        std::fs::read_to_string(&cache).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
    let files: Vec<(String, std::path::PathBuf, u64)> = TASKS
        .iter()
        .map(|t| (t.to_string(), dir.join(format!("{t}.jsonl"))))
        .filter_map(|(t, p)| std::fs::metadata(&p).ok().map(|m| (t, p, m.len())))
        .collect();
    ensure!(
        !files.is_empty(),
        "{}: none of {} found (see experiments::downstream for the layouts)",
        dir.display(),
        TASKS.iter().map(|t| format!("{t}.jsonl")).collect::<Vec<_>>().join(", ")
    );
    let mut trained: Option<crate::runner::Trained> = None;
    let mut out_scores = Vec::new();
    for (task, path, bytes) in files {
        if let Some(done) = old.iter().find(|s| s.task == task && s.file_bytes == bytes) {
            out_scores.push(done.clone());
            continue;
        }
        if trained.is_none() {
            trained = Some(crate::runner::load_trained(scale, out, variant)?);
        }
        let t = trained.as_ref().expect("loaded");
        let items = read_items(&task, &path)?;
        let mut scorer = ModelScorer { model: &t.model, tokenizer: &t.tokenizer, device: t.device };
        let scores = score(&items, &mut scorer).with_context(|| format!("scoring {task} with `{variant}`"))?;
        out_scores.push(TaskScores { task, file_bytes: bytes, scores });
    }
    std::fs::create_dir_all(&cache_dir)?;
    std::fs::write(&cache, serde_json::to_string_pretty(&out_scores)?)?;
    let pairs: Vec<(String, Scores)> = out_scores.iter().map(|s| (s.task.clone(), s.scores.clone())).collect();
    std::fs::write(
        cache_dir.join(format!("{name}.lm-eval.json")),
        serde_json::to_string_pretty(&lm_eval_json(&pairs))?,
    )?;
    Ok(out_scores)
}
