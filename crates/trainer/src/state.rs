//! A run's checkpoints and log on disk: writing a checkpoint (and pruning old ones), listing them,
//! picking the one `--resume latest` continues from (refusing a torn newest file), checking a resume
//! against the run before anything is written, and cutting `metrics.jsonl` back to a resumed step.
//! `train` drives these; they are apart so that the loop stays readable.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use gpt_model::checkpoint;
use tch::nn::VarStore;

use crate::config::TrainConfig;
use crate::optim::AdamW;

/// Format tag of the metadata of training checkpoints.
pub const CKPT_KIND: &str = "lssa-train-state";

/// Checkpoint file of `step` in `dir`.
pub fn checkpoint_path(dir: &Path, step: usize) -> PathBuf {
    dir.join(format!("ckpt_{step:08}.safetensors"))
}

/// Checkpoints in `dir`, oldest first.
pub fn list_checkpoints(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for e in rd {
        let p = e.with_context(|| format!("listing {}", dir.display()))?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("ckpt_") && name.ends_with(".safetensors") {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// The checkpoint `--resume latest` continues from: the newest of `dir`, if its file is whole. A
/// newest file that is truncated or corrupt (a crash or a full disk while an older version of the
/// trainer wrote it, a copy cut short, or bytes that no longer match the checksum recorded when it
/// was written) is refused, naming it and the newest intact one with the command to resume from
/// that: a run never silently starts over or skips back.
pub fn latest_checkpoint(dir: &Path) -> Result<PathBuf> {
    let all = list_checkpoints(dir)?;
    let newest = all.last().with_context(|| format!("--resume latest: no checkpoint in {}", dir.display()))?;
    // Opening parses the whole header, checks the data's length against it and verifies the
    // data's checksum (gpt_model::checkpoint).
    let whole = |p: &Path| -> Result<()> { crate::sample::open_checkpoint(p).map(drop) };
    if let Err(e) = whole(newest) {
        let intact = all.iter().rev().skip(1).find(|p| whole(p).is_ok());
        let next = match intact {
            Some(p) => format!(
                "the newest intact one is {}: resume from it with --resume {} (and remove the damaged file)",
                p.display(),
                p.display()
            ),
            None => "no older checkpoint is intact: start over with --overwrite".to_string(),
        };
        bail!("--resume latest: the newest checkpoint {} is truncated or corrupt ({e:#}); {next}", newest.display());
    }
    Ok(newest.clone())
}

/// Writes the training state of `step` and deletes checkpoints beyond the newest `keep_last`.
pub(crate) fn save_state(
    vs: &VarStore,
    opt: &AdamW,
    cfg: &TrainConfig,
    step: usize,
    data_position: &serde_json::Value,
    world: usize,
    tokenizer: &str,
    command: &str,
) -> Result<PathBuf> {
    let path = checkpoint_path(&cfg.out_dir, step);
    let meta = HashMap::from([
        ("kind".to_string(), CKPT_KIND.to_string()),
        ("step".to_string(), step.to_string()),
        ("optim_t".to_string(), opt.t.to_string()),
        ("data_position".to_string(), data_position.to_string()),
        ("train_config".to_string(), cfg.to_toml()),
        ("tokenizer".to_string(), tokenizer.to_string()),
        ("world_size".to_string(), world.to_string()),
        ("seed".to_string(), cfg.seed.to_string()),
        ("git_revision".to_string(), crate::git_revision()),
        ("command".to_string(), command.to_string()),
    ]);
    checkpoint::save_with(vs, &cfg.model, &meta, &opt.state(), &path)?;
    let all = list_checkpoints(&cfg.out_dir)?;
    if all.len() > cfg.keep_last {
        for old in &all[..all.len() - cfg.keep_last] {
            std::fs::remove_file(old).with_context(|| format!("removing old checkpoint {}", old.display()))?;
        }
    }
    Ok(path)
}

/// The per-step log in a run's `out_dir`: one [`crate::train::StepMetrics`] JSON line per step (and an event line for a pre-emption).
pub const METRICS_FILE: &str = "metrics.jsonl";

/// Keeps the lines of `path` (a [`METRICS_FILE`]) up to step `last` and the complete lines only
/// (a kill can leave the last one half written); atomically, and nothing when the file is absent.
pub(crate) fn truncate_metrics(path: &Path, last: usize) -> Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut kept = String::with_capacity(text.len());
    for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        // Step lines, and events (a pre-emption) of a step, up to `last`.
        let step = serde_json::from_str::<serde_json::Value>(line).ok().and_then(|v| v["step"].as_u64());
        if step.is_some_and(|s| s as usize <= last) {
            kept.push_str(line);
        }
    }
    if kept.len() != text.len() {
        crate::data::io::write_atomic(path, |w| w.write_all(kept.as_bytes()))
            .with_context(|| format!("rewriting {}", path.display()))?;
    }
    Ok(())
}

/// A resume checkpoint that passed every check against the run ([`check_resume`]): applying it
/// writes nothing to disk.
pub(crate) struct ResumeFrom {
    path: PathBuf,
    ckpt: checkpoint::Checkpoint<memmap2::Mmap>,
    step: usize,
    optim_t: u64,
    /// Where the data continues (`BatchSource::seek`'s argument).
    pub(crate) position: serde_json::Value,
}

/// Opens `path` and checks it against the run: a training checkpoint of this world size, of the
/// data's tokenizer `tokenizer` and of the run's model config, at a step before `max_steps`. Writes
/// nothing, so a refusal leaves the run's directory untouched.
pub(crate) fn check_resume(path: &Path, cfg: &TrainConfig, world: usize, tokenizer: &str) -> Result<ResumeFrom> {
    // One memory-mapped read of the file serves the metadata, the weights and the moments.
    let ckpt = crate::sample::open_checkpoint(path)?;
    let meta = ckpt.metadata();
    let get = |k: &str| {
        meta.get(k).with_context(|| format!("{}: not a training checkpoint (no `{k}` in its metadata)", path.display()))
    };
    if get("kind")? != CKPT_KIND {
        bail!("{}: not a training checkpoint (kind {:?})", path.display(), meta.get("kind"));
    }
    let saved_world: usize = get("world_size")?.parse().context("world_size")?;
    if saved_world != world {
        bail!(
            "{}: written by a run of world size {saved_world}, resumed with world size {world}: the data split and batch would differ; resume with {saved_world} ranks",
            path.display()
        );
    }
    let tok = get("tokenizer")?;
    if tok != tokenizer {
        bail!("{}: trained with tokenizer `{tok}`, but the data uses `{tokenizer}`", path.display());
    }
    let found = ckpt.config()?;
    if let Some((field, was, now)) =
        checkpoint::config_diff(&gpt_model::ModelConfig { attn_impl: cfg.model.attn_impl, ..found }, &cfg.model)
    {
        bail!(
            "{}: trained with model.{field} = {was}, resumed with {now}: a run continues with the model it started with (start a new run in another --out-dir to change it)",
            path.display()
        );
    }
    let step: usize = get("step")?.parse().context("step")?;
    ensure!(step <= cfg.max_steps, "{}: already at step {step} >= max_steps {}", path.display(), cfg.max_steps);
    let optim_t: u64 = get("optim_t")?.parse().context("optim_t")?;
    let position: serde_json::Value = serde_json::from_str(get("data_position")?).context("data_position")?;
    Ok(ResumeFrom { path: path.to_path_buf(), ckpt, step, optim_t, position })
}

impl ResumeFrom {
    /// Loads the weights and the optimiser's moments; returns the step to continue from.
    pub(crate) fn apply(self, vs: &mut VarStore, opt: &mut AdamW, model: &gpt_model::ModelConfig) -> Result<usize> {
        self.ckpt.load_into(vs, model)?;
        let state = self.ckpt.tensors("optim.")?;
        opt.load_state(&state, self.optim_t).map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))?;
        Ok(self.step)
    }
}
