//! `trainer eval`: the validation loss at several lengths, downstream multiple choice and passkey
//! retrieval of a checkpoint: tables on standard output, or one JSON with `--json` (and in the file
//! of `--out`, whichever is printed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use gpt_model::model::Gpt;
use serde::Serialize;
use tch::Device;
use trainer::data::tokenizer::Tokenizer;
use trainer::eval::ValidationSet;
use trainer::eval::{LengthLoss, Rope};
use trainer::sample as sampling;
use trainer::tasks::{self, ModelScorer, PasskeyOptions, PasskeyResult, Scores};
use trainer::train;

use crate::common::{DeviceArg, EVAL_FORMAT, Header, set_threads};

/// `eval --lengths` when no section is asked for.
const DEFAULT_LENGTHS: [usize; 5] = [1, 2, 4, 8, 16];

#[derive(clap::Args, Debug)]
pub(crate) struct EvalArgs {
    /// The checkpoint, a training state or a weights-only export (its config and tokenizer are read
    /// from it).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Shard directory for the validation tokens and the tokenizer (default: the checkpoint's
    /// training data_dir); for the tokenizer alone, any directory holding its tokenizer.json.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Multiples of the training length for the validation loss [default: 1,2,4,8,16 unless --tasks
    /// or --passkey is given, which then skip the loss unless --lengths is given too].
    #[arg(long, value_delimiter = ',')]
    lengths: Option<Vec<usize>>,
    /// RoPE at long lengths.
    #[arg(long, value_enum, default_value_t = RopeChoice::Both)]
    rope: RopeChoice,
    /// Post-hoc re-weighting powers to apply, in every section asked for (none: the trained variant
    /// only).
    #[arg(long, value_delimiter = ',')]
    reweight: Vec<u32>,
    /// Validation targets scored at every length: spans of the longest length spread evenly over
    /// the whole validation split (`trainer::eval::ValidationSet`, the protocol of `trainer train`'s
    /// final evaluation and of the reproduction), fewer if the split is smaller.
    #[arg(long, default_value_t = trainer::eval::DEFAULT_VAL_TARGETS)]
    val_tokens: usize,
    /// Tokens per forward.
    #[arg(long, default_value_t = 16_384)]
    batch_tokens: usize,
    /// Print the readings as one JSON document instead of tables.
    #[arg(long)]
    json: bool,
    /// Also write the JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Score the multiple-choice files of this directory (arc_easy, arc_challenge, hellaswag, piqa,
    /// sciq, mmlu `.jsonl`, any subset; see trainer::tasks) zero-shot, as lm-evaluation-harness does.
    #[arg(long, value_name = "DIR")]
    tasks: Option<PathBuf>,
    /// Passkey retrieval with greedy decoding (see trainer::tasks).
    #[arg(long)]
    passkey: bool,
    /// Passkey prompt lengths, multiples of the training length (lengths too short for the prompt's
    /// fixed text are skipped and reported).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16", requires = "passkey")]
    passkey_lengths: Vec<usize>,
    /// Depths of the passkey in the filler (0: start, 1: end).
    #[arg(long, value_delimiter = ',', default_value = "0,0.25,0.5,0.75,1", requires = "passkey")]
    passkey_depths: Vec<f64>,
    /// Passkey prompts per (length, depth).
    #[arg(long, default_value_t = 4, requires = "passkey")]
    passkey_prompts: usize,
    /// Seed of the passkey prompts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
    /// CPU threads for libtorch (0: its default, all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

/// `eval --rope`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum RopeChoice {
    /// NTK-scaled beyond the training length.
    Ntk,
    /// Plain RoPE at every length.
    Plain,
    /// Both, one after the other.
    Both,
}

#[derive(Serialize)]
struct EvalResult {
    #[serde(flatten)]
    header: Header,
    /// What the validation loss scored (targets, spans, the split).
    #[serde(skip_serializing_if = "Option::is_none")]
    validation: Option<String>,
    lengths: Vec<LengthLoss>,
    /// With --tasks: one row per re-weighting setting (the trained variant, then each --reweight).
    #[serde(skip_serializing_if = "Option::is_none")]
    tasks: Option<Vec<TasksRow>>,
    /// With --passkey.
    #[serde(skip_serializing_if = "Option::is_none")]
    passkey: Option<PasskeySection>,
}

#[derive(Serialize)]
struct TasksRow {
    reweight: Option<u32>,
    dir: PathBuf,
    /// Per task: the file and the scores.
    scores: BTreeMap<String, TaskScore>,
    /// The same in lm-evaluation-harness's layout.
    lm_eval: serde_json::Value,
}

#[derive(Serialize)]
struct TaskScore {
    file: PathBuf,
    #[serde(flatten)]
    scores: Scores,
}

#[derive(Serialize)]
struct PasskeySection {
    options: PasskeyOptions,
    /// One per (RoPE, re-weighting) setting.
    results: Vec<PasskeyResult>,
}

pub(crate) fn eval_cmd(a: EvalArgs) -> Result<()> {
    set_threads(a.threads);
    let ckpt = sampling::open_checkpoint(&a.checkpoint)?;
    let meta = ckpt.metadata().clone();
    let model_cfg = ckpt.config()?;
    // The validation loss: asked with --lengths, or by default when no other section is.
    let lengths_asked = match &a.lengths {
        Some(l) => Some(l.clone()),
        None if a.tasks.is_none() && !a.passkey => Some(DEFAULT_LENGTHS.to_vec()),
        None => None,
    };
    let data_dir = match (&lengths_asked, &a.data_dir, sampling::train_data_dir(&meta)?) {
        (None, ..) => None,
        (Some(_), Some(d), _) => Some(d.clone()),
        (Some(_), None, Some(d)) => Some(d),
        (Some(_), None, None) => {
            bail!("{}: no training config in the checkpoint; pass --data-dir", a.checkpoint.display())
        }
    };
    if let Some(dir) = &a.tasks {
        tasks::task_files(dir).context("--tasks")?; // a typo fails now, not after the loss
    }
    let ropes = match a.rope {
        RopeChoice::Ntk => vec![Rope::Ntk],
        RopeChoice::Plain => vec![Rope::Plain],
        RopeChoice::Both => vec![Rope::Ntk, Rope::Plain],
    };
    let device = train::pick_device(a.device.into(), 0)?;
    let (_vs, model) = sampling::load_model(&ckpt, device)?;
    drop(ckpt);
    let powers: Vec<Option<u32>> = std::iter::once(None).chain(a.reweight.iter().map(|&p| Some(p))).collect();
    let sections = (usize::from(lengths_asked.is_some() && data_dir.is_some()) * ropes.len()
        + usize::from(a.passkey) * ropes.len()
        + usize::from(a.tasks.is_some()))
        * powers.len();
    let run = Run { a: &a, model: &model, device, ropes, powers, progress: Sections::new(sections) };
    let mut lengths = Vec::new();
    let mut scored = None;
    if let (Some(multiples), Some(data_dir)) = (&lengths_asked, &data_dir) {
        let tok = meta.get("tokenizer").map(String::as_str);
        let val = ValidationSet::open(data_dir, model_cfg.context_len, multiples, a.val_tokens, tok)
            .with_context(|| format!("reading the validation split of {}", data_dir.display()))?;
        let described = val.describe();
        eprintln!("eval: {described}");
        lengths = run.losses(&val, multiples)?;
        scored = Some(described);
    }
    let tokenizer = if a.tasks.is_some() || a.passkey {
        Some(sampling::tokenizer_for(&meta, &a.checkpoint, a.data_dir.as_deref())?)
    } else {
        None
    };
    let task_rows = match (&a.tasks, &tokenizer) {
        (Some(dir), Some(tok)) => Some(run.tasks(dir, tok)?),
        _ => None,
    };
    let passkey = match (a.passkey, &tokenizer) {
        (true, Some(tok)) => Some(run.passkey(tok)?),
        _ => None,
    };
    let result = EvalResult {
        header: Header::new(EVAL_FORMAT, &a.checkpoint, &model_cfg),
        validation: scored,
        lengths,
        tasks: task_rows,
        passkey,
    };
    let json = serde_json::to_string_pretty(&result)?;
    if a.json {
        println!("{json}");
    } else {
        print!("{}", tables(&result));
    }
    if let Some(out) = &a.out {
        std::fs::write(out, &json).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

/// The loaded model and what each of `eval`'s sections runs it at: every RoPE treatment of
/// `--rope`, and the trained variant then each `--reweight` power.
struct Run<'a> {
    a: &'a EvalArgs,
    model: &'a Gpt,
    device: Device,
    ropes: Vec<Rope>,
    powers: Vec<Option<u32>>,
    progress: Sections,
}

impl Run<'_> {
    /// The validation loss at `multiples` of the training length on `val`, per (RoPE, power).
    fn losses(&self, val: &ValidationSet, multiples: &[usize]) -> Result<Vec<LengthLoss>> {
        let mut lengths = Vec::new();
        for rope in &self.ropes {
            for p in &self.powers {
                self.progress.start(&format!("loss at {multiples:?} x T_train ({}{})", rope_name(*rope), rw_name(*p)));
                lengths.extend(val.score(self.model, multiples, *rope, *p, self.a.batch_tokens, self.device)?);
                self.progress.done();
            }
        }
        Ok(lengths)
    }

    /// The multiple-choice files of `dir`, scored zero-shot once per power.
    fn tasks(&self, dir: &Path, tok: &Tokenizer) -> Result<Vec<TasksRow>> {
        let mut rows = Vec::new();
        for p in &self.powers {
            let mut scorer = ModelScorer::new(self.model, tok, self.device);
            scorer.forward.reweight = *p;
            self.progress.start(&format!("tasks in {}{}", dir.display(), rw_name(*p)));
            let scored = tasks::score_dir(dir, &mut scorer)?;
            self.progress.done();
            for (task, _, s) in &scored {
                eprintln!(
                    "eval {task}{}: acc {:.4}, acc_norm {:.4} (n = {})",
                    p.map(|p| format!(" (rw{p})")).unwrap_or_default(),
                    s.acc,
                    s.acc_norm,
                    s.n
                );
            }
            let pairs: Vec<(String, Scores)> = scored.iter().map(|(t, _, s)| (t.clone(), s.clone())).collect();
            rows.push(TasksRow {
                reweight: *p,
                dir: dir.to_path_buf(),
                lm_eval: tasks::lm_eval_json(&pairs),
                scores: scored.into_iter().map(|(t, file, scores)| (t, TaskScore { file, scores })).collect(),
            });
        }
        Ok(rows)
    }

    /// Passkey retrieval at `--passkey-lengths` and `--passkey-depths`, per (RoPE, power).
    fn passkey(&self, tok: &Tokenizer) -> Result<PasskeySection> {
        let a = self.a;
        ensure!(
            a.passkey_depths.iter().all(|d| (0.0..=1.0).contains(d)),
            "--passkey-depths must lie in [0, 1], got {:?}",
            a.passkey_depths
        );
        let options = PasskeyOptions {
            multiples: a.passkey_lengths.clone(),
            depths: a.passkey_depths.clone(),
            prompts: a.passkey_prompts,
            seed: a.seed,
            batch_tokens: a.batch_tokens,
        };
        let mut results = Vec::new();
        for rope in &self.ropes {
            for p in &self.powers {
                self.progress.start(&format!("passkey ({}{})", rope_name(*rope), rw_name(*p)));
                let r = tasks::passkey(self.model, tok, &options, *rope, *p)?;
                self.progress.done();
                for s in &r.skipped {
                    eprintln!("eval passkey: skipped {s}");
                }
                eprintln!(
                    "eval passkey ({}{}): {}",
                    if *rope == Rope::Ntk { "ntk" } else { "plain" },
                    p.map(|p| format!(", rw{p}")).unwrap_or_default(),
                    r.example
                );
                results.push(r);
            }
        }
        Ok(PasskeySection { options, results })
    }
}

/// The readings as plain-text tables: the loss by length (rows) and (RoPE, re-weighting) setting
/// (columns), the task scores by re-weighting, and passkey accuracy by setting and length.
fn tables(r: &EvalResult) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if !r.lengths.is_empty() {
        let mut settings: Vec<(Rope, Option<u32>)> = Vec::new();
        let mut multiples: Vec<(usize, usize)> = Vec::new();
        for l in &r.lengths {
            if !settings.contains(&(l.rope, l.reweight)) {
                settings.push((l.rope, l.reweight));
            }
            if !multiples.iter().any(|m| m.0 == l.multiple) {
                multiples.push((l.multiple, l.seq_len));
            }
        }
        let scored = r
            .validation
            .clone()
            .unwrap_or_else(|| format!("{} tokens at every length", r.lengths.first().map_or(0, |l| l.tokens)));
        let _ = writeln!(out, "validation loss (nats/token; {scored})");
        let _ = write!(out, "{:>6} {:>7}", "length", "T");
        for (rope, p) in &settings {
            let _ = write!(
                out,
                " {:>12}",
                format!("{}{}", rope_name(*rope), p.map(|p| format!(" rw{p}")).unwrap_or_default())
            );
        }
        let _ = writeln!(out);
        for (m, t) in &multiples {
            let _ = write!(out, "{:>5}x {t:>7}", m);
            for (rope, p) in &settings {
                let cell = r.lengths.iter().find(|l| l.multiple == *m && l.rope == *rope && l.reweight == *p);
                let _ = write!(out, " {:>12}", cell.map_or("-".to_string(), |l| format!("{:.4}", l.loss)));
            }
            let _ = writeln!(out);
        }
    }
    for row in r.tasks.iter().flatten() {
        let _ = writeln!(out, "\nmultiple choice{} ({})", rw_name(row.reweight), row.dir.display());
        let _ = writeln!(out, "{:<14} {:>6} {:>8} {:>9}", "task", "n", "acc", "acc_norm");
        for (task, s) in &row.scores {
            let _ = writeln!(out, "{task:<14} {:>6} {:>8.4} {:>9.4}", s.scores.n, s.scores.acc, s.scores.acc_norm);
        }
    }
    if let Some(p) = &r.passkey {
        let _ = writeln!(out, "\npasskey accuracy (exact; mean over depths {:?})", p.options.depths);
        for res in &p.results {
            let _ = write!(out, "{:<12}", format!("{}{}", rope_name(res.rope), rw_name(res.reweight)));
            for m in &p.options.multiples {
                let cells: Vec<f64> = res.cells.iter().filter(|c| c.multiple == *m).map(|c| c.accuracy).collect();
                if !cells.is_empty() {
                    let _ = write!(out, " {m}x {:.2}", cells.iter().sum::<f64>() / cells.len() as f64);
                }
            }
            let _ = writeln!(out);
        }
    }
    out
}

/// `eval`'s sections (a loss sweep, a task directory, a passkey sweep) as they run: a bar on a
/// terminal, a line each otherwise.
struct Sections {
    bar: Option<indicatif::ProgressBar>,
}

impl Sections {
    fn new(n: usize) -> Sections {
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
            let bar = indicatif::ProgressBar::new(n as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template("eval {pos}/{len} [{bar:25}] {msg} ({elapsed})")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar
        });
        Sections { bar }
    }

    fn start(&self, what: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(what.to_string()),
            None => eprintln!("eval: {what} ..."),
        }
    }

    fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }
}

impl Drop for Sections {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn rope_name(rope: Rope) -> &'static str {
    if rope == Rope::Ntk { "ntk" } else { "plain" }
}

fn rw_name(p: Option<u32>) -> String {
    p.map(|p| format!(", rw{p}")).unwrap_or_default()
}
