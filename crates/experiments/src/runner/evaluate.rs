//! The evaluations of one trained run ([`evaluate`]): the validation losses and attention-sink
//! measurements its result lacks, from its last checkpoint, the result written after each.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use gpt_model::model::Gpt;
use trainer::config::TrainConfig;
use trainer::eval;
use trainer::train;

use super::{RunResult, SINK_WINDOWS, SinkEval, run_dir_name, write_json};
use crate::scale::Scale;
use crate::spec::{EvalKey, SinkKey};

/// Adds to `result` (of `cfg`, trained) the evaluations of `needs` and the sink measurements of
/// `sink_needs` it does not have yet, writing it to `result_path` after each; loads the model only
/// when something is missing. Once `stop` is set no further evaluation starts (the one in flight
/// finishes and is written) and the error is [`super::Stopped`].
#[allow(clippy::too_many_arguments)]
pub(super) fn evaluate(
    scale: &Scale,
    cfg: &TrainConfig,
    mut result: RunResult,
    needs: &[EvalKey],
    sink_needs: &[SinkKey],
    spans: &[Vec<u16>],
    progress: &crate::progress::Training,
    result_path: &Path,
    stop: Option<trainer::process::StopFlag>,
) -> Result<RunResult> {
    let missing: Vec<EvalKey> = needs.iter().filter(|k| result.loss(k).is_none()).copied().collect();
    let missing_sinks: Vec<SinkKey> =
        sink_needs.iter().filter(|k| !result.sinks.iter().any(|s| s.key == **k)).copied().collect();
    if missing.is_empty() && missing_sinks.is_empty() {
        return Ok(result);
    }
    super::check_stop(stop)?;
    progress.phase(&format!("evaluating ({} readings, {} sink measurements)", missing.len(), missing_sinks.len()));
    let ckpt = train::list_checkpoints(&cfg.out_dir)?.pop().context("no checkpoint to evaluate")?;
    let device = train::pick_device(cfg.device, 0)?;
    let mut vs = tch::nn::VarStore::new(device);
    let model = Gpt::new(&vs.root(), &cfg.model)?;
    gpt_model::checkpoint::load(&mut vs, &cfg.model, &ckpt)?;
    let run = Evaluator { scale, cfg, model: &model, device, spans, result_path, stop };
    run.losses(&missing, &mut result)?;
    for key in missing_sinks {
        super::check_stop(stop)?;
        run.sinks(key, &mut result)?;
    }
    Ok(result)
}

/// A trained run's model and what its evaluations read.
struct Evaluator<'a> {
    scale: &'a Scale,
    cfg: &'a TrainConfig,
    model: &'a Gpt,
    device: tch::Device,
    spans: &'a [Vec<u16>],
    result_path: &'a Path,
    stop: Option<trainer::process::StopFlag>,
}

impl Evaluator<'_> {
    /// The validation loss at every key of `missing`, grouped by (RoPE, p): each call scores its
    /// lengths on the spans.
    fn losses(&self, missing: &[EvalKey], result: &mut RunResult) -> Result<()> {
        let mut groups: BTreeMap<(bool, Option<u32>), Vec<usize>> = BTreeMap::new();
        for k in missing {
            groups.entry((k.ntk, k.posthoc)).or_default().push(k.multiple);
        }
        let t_train = self.cfg.model.context_len;
        let longest = self.spans.first().map_or(1, |s| (s.len() - 1) / t_train);
        for ((ntk, posthoc), multiples) in groups {
            super::check_stop(self.stop)?;
            let started = Instant::now();
            let key0 = EvalKey { ntk, posthoc, multiple: 1 };
            let losses = eval::multi_length_spans(
                self.model,
                self.spans,
                &multiples,
                longest,
                key0.rope(),
                posthoc,
                self.scale.eval_batch_tokens,
                self.device,
            )?;
            for l in losses {
                result.evals.push((EvalKey { ntk, posthoc, multiple: l.multiple }, l));
            }
            result.evals.sort_by_key(|a| a.0);
            result.eval_wall_s += started.elapsed().as_secs_f64();
            write_json(self.result_path, &*result)?;
        }
        Ok(())
    }

    /// One attention-sink measurement, on the first tokens of the first spans: windows from several
    /// places of the validation split.
    fn sinks(&self, key: SinkKey, result: &mut RunResult) -> Result<()> {
        let started = Instant::now();
        let t = self.cfg.model.context_len * key.multiple;
        let spans = self.spans;
        let windows = spans.len().min(SINK_WINDOWS);
        anyhow::ensure!(
            windows >= 1 && spans[0].len() > t,
            "the validation spans are shorter than one {t}-token window"
        );
        let ids: Vec<i64> = spans[..windows].iter().flat_map(|s| s[..t].iter().map(|&x| i64::from(x))).collect();
        let idx = tch::Tensor::from_slice(&ids).view([windows as i64, t as i64]).to(self.device);
        let opts = gpt_model::ForwardOptions {
            length_scale: Some(key.multiple as f64),
            ntk: true,
            reweight: key.posthoc,
            attn_impl: None,
        };
        let layers = crate::sinks::layer_stats(self.model, &idx, &opts)?;
        let map = if key.map { Some(self.sink_map(key, &idx, &opts)?) } else { None };
        result.sinks.push(SinkEval { key, layers, map });
        result.sinks.sort_by_key(|s| s.key);
        result.eval_wall_s += started.elapsed().as_secs_f64();
        write_json(self.result_path, &*result)
    }

    /// The attention map of the last layer's first head on the windows `idx`, drawn beside the run;
    /// its path.
    fn sink_map(&self, key: SinkKey, idx: &tch::Tensor, opts: &gpt_model::ForwardOptions) -> Result<PathBuf> {
        let cfg = self.cfg;
        let t = cfg.model.context_len * key.multiple;
        let last = cfg.model.n_layer - 1;
        let values = crate::sinks::attention_map(self.model, idx, opts, last, 0)?;
        let name = format!(
            "map_{}{}_{}x.png",
            run_dir_name(&cfg.model.attention.to_string()),
            key.posthoc.map_or(String::new(), |p| format!("_posthoc{p}")),
            key.multiple
        );
        let path = cfg.out_dir.join(name);
        let title = format!(
            "{}{}, layer {}, head 0, T = {t}",
            cfg.model.attention,
            key.posthoc.map_or(String::new(), |p| format!(" (post hoc p = {p})")),
            last + 1
        );
        crate::plot::draw_map(&path, &title, &values)?;
        Ok(path)
    }
}
