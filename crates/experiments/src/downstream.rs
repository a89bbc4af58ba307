//! Downstream multiple choice for the reproduction: every trained variant scored zero-shot on the
//! `<task>.jsonl` files a user supplies, cached per variant and written in lm-evaluation-harness's
//! layout too.
//!
//! The readers, the prompts and the scorer live in [`trainer::tasks`] (re-exported here), so that the
//! reproduction and `trainer eval --tasks` score with one implementation; see it for the layouts of
//! the files.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use crate::doc::{Align, Block, Table};
use crate::post::{Figures, Inputs, PostTraining};
use crate::spec::{Experiment, Kind};

pub use trainer::tasks::{
    Item, LogLikelihood, ModelScorer, Scores, TASKS, hellaswag_clean, lm_eval_json, parse_item, read_items, score,
};

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/downstream");

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
}

/// Downstream scoring as a [`PostTraining`] kind: scores by trained variant.
#[derive(Debug, Default)]
pub struct Experiments {
    /// Scores by trained variant (empty until run, and without `--downstream DIR`).
    pub results: BTreeMap<String, Vec<TaskScores>>,
}

impl PostTraining for Experiments {
    fn kind(&self) -> Kind {
        Kind::Downstream
    }

    fn available(&self, inputs: &Inputs<'_>) -> bool {
        inputs.downstream_dir.is_some()
    }

    fn regenerate_extra(&self) -> &'static str {
        " --downstream DIR"
    }

    fn run(&mut self, e: &Experiment, inputs: &Inputs<'_>) -> Result<()> {
        let Some(dir) = inputs.downstream_dir else { return Ok(()) };
        for r in &e.rows {
            if self.results.contains_key(r.train.as_str()) {
                continue;
            }
            if inputs.results.get(r.train.as_str()).and_then(|x| x.first()).is_none_or(|x| x.error.is_some()) {
                eprintln!("reproduce: downstream: no trained `{}` model, its row stays empty", r.train);
                continue;
            }
            eprintln!("reproduce: downstream, `{}` on {} ...", r.train, dir.display());
            let scores = run(inputs.scale, inputs.out, &r.train, dir)
                .with_context(|| format!("downstream scoring of `{}`", r.train))?;
            self.results.insert(r.train.to_string(), scores);
        }
        Ok(())
    }

    fn wall_s(&self) -> f64 {
        0.0 // scoring is not timed; it is short beside training
    }

    fn verdicts(&self) -> Vec<String> {
        Vec::new()
    }

    fn section(&self, e: &Experiment, _figures: Figures<'_>) -> Result<Vec<Block>> {
        Ok(section(e, &self.results))
    }
}

fn section(e: &Experiment, downstream: &BTreeMap<String, Vec<TaskScores>>) -> Vec<Block> {
    if downstream.is_empty() {
        return vec![Block::from(
            "Not run: no data supplied. Put the task files in a folder and add `--downstream DIR` (see above); the scores go to `runs/<scale>/downstream/`, also in lm-evaluation-harness's JSON layout.",
        )];
    }
    let tasks: Vec<&str> =
        TASKS.iter().copied().filter(|t| downstream.values().any(|v| v.iter().any(|s| s.task == *t))).collect();
    let mut table = Table::new([("row", Align::Left)]);
    for t in &tasks {
        table.column(*t, Align::Right);
    }
    for r in &e.rows {
        let cells = tasks.iter().map(|t| {
            downstream.get(r.train.as_str()).and_then(|v| v.iter().find(|s| s.task == *t)).map_or(
                "-".to_string(),
                |s| {
                    format!(
                        "{:.2} ± {:.2} ({:.2}; n = {})",
                        100.0 * s.scores.acc_norm,
                        100.0 * s.scores.acc_norm_stderr,
                        100.0 * s.scores.acc,
                        s.scores.n
                    )
                },
            )
        });
        table.row(std::iter::once(r.label.clone()).chain(cells).collect());
    }
    let paper = |t: &str| match t {
        "arc_easy" => "40.57",
        "arc_challenge" => "22.61",
        "piqa" => "65.34",
        "mmlu" => "22.97",
        _ => "-",
    };
    table.row(
        std::iter::once("paper, LSSAR (GPT-2 124M)".to_string())
            .chain(tasks.iter().map(|t| paper(t).to_string()))
            .collect(),
    );
    vec![Block::from("acc_norm ± standard error (acc), zero-shot."), Block::Table(table)]
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
pub fn run(
    scale: &crate::scale::Scale,
    out: &Path,
    variant: &crate::spec::TrainedVariant,
    dir: &Path,
) -> Result<Vec<TaskScores>> {
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
    let work = crate::progress::Work::start(&format!("downstream `{variant}`"), files.len(), "task files");
    for (task, path, bytes) in files {
        if let Some(done) = old.iter().find(|s| s.task == task && s.file_bytes == bytes) {
            out_scores.push(done.clone());
            work.inc();
            continue;
        }
        if trained.is_none() {
            trained = Some(crate::runner::load_trained(scale, out, variant)?);
        }
        let t = trained.as_ref().expect("loaded");
        let items = read_items(&task, &path)?;
        let mut scorer = ModelScorer::new(&t.model, &t.tokenizer, t.device);
        let scores = score(&items, &mut scorer).with_context(|| format!("scoring {task} with `{variant}`"))?;
        out_scores.push(TaskScores { task, file_bytes: bytes, scores });
        work.inc();
    }
    drop(work);
    std::fs::create_dir_all(&cache_dir)?;
    std::fs::write(&cache, serde_json::to_string_pretty(&out_scores)?)?;
    let pairs: Vec<(String, Scores)> = out_scores.iter().map(|s| (s.task.clone(), s.scores.clone())).collect();
    std::fs::write(
        cache_dir.join(format!("{name}.lm-eval.json")),
        serde_json::to_string_pretty(&lm_eval_json(&pairs))?,
    )?;
    Ok(out_scores)
}
