//! The training configuration: a serde/TOML struct with documented defaults (`deny_unknown_fields`),
//! `key=value` overrides from the command line, and validation with errors that name the field.

use std::path::PathBuf;

use gpt_model::ModelConfig;
use serde::{Deserialize, Serialize};

use crate::data::loader::WindowSampling;

/// Where to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// The first GPU (this rank's `LOCAL_RANK`-th under data parallelism) when CUDA works, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// A GPU (an error when CUDA is unavailable).
    Cuda,
}

/// Everything a training run needs besides the data itself. Defaults: the `cpu-small` model and a
/// recipe that trains it on 2 CPU cores in minutes. The paper-scale recipe is SPEC section 8
/// ([`TrainConfig::paper`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// The model: a `[model]` table. `preset = "<name>"` (any `gpt_model::config::PRESETS` name, e.g.
    /// `gpt2-124m`) starts from that preset and the table's other keys override it; without `preset` the
    /// base is `cpu-small`, like the default.
    pub model: ModelConfig,
    /// Directory of the token shards (`lssa-data` output, or llm.c / modded-nanogpt FineWeb shards).
    pub data_dir: PathBuf,
    /// Output directory: `metrics.jsonl`, `config.toml`, checkpoints, `result.json`.
    pub out_dir: PathBuf,
    /// Sequences per micro-batch per rank.
    pub batch_size: usize,
    /// Tokens per optimiser step over all ranks; gradient accumulation fills it with micro-batches of
    /// `batch_size x model.context_len` tokens. Must be a multiple of `batch_size x context_len x world size`.
    pub tokens_per_step: usize,
    /// Optimiser steps.
    pub max_steps: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// The cosine decays to `lr x min_lr_ratio`.
    pub min_lr_ratio: f64,
    /// Linear warm-up steps.
    pub warmup_steps: usize,
    /// Decoupled weight decay (matrices only: parameters of 2 or more dimensions).
    pub weight_decay: f64,
    /// AdamW beta 1.
    pub beta1: f64,
    /// AdamW beta 2.
    pub beta2: f64,
    /// AdamW epsilon.
    pub eps: f64,
    /// Clip the global gradient norm to this (0: no clipping).
    pub grad_clip: f64,
    /// Evaluate the validation loss every this many steps (0: only at the end).
    pub eval_every: usize,
    /// Validation tokens per evaluation during training.
    pub eval_tokens: usize,
    /// Write a checkpoint every this many steps (0: only at the end).
    pub ckpt_every: usize,
    /// Keep this many most recent checkpoints (at least 1).
    pub keep_last: usize,
    /// Seed of the initialisation and of the data order (see `sampling`).
    pub seed: u64,
    /// How training windows are chosen ([`crate::data::loader`]): `"random"` (the default) starts each
    /// window of `context_len + 1` tokens at a uniformly random token of the whole training split,
    /// drawn from a hash of `seed` and the window's index, so any run reads windows spread over all
    /// of it; `"stream"` reads consecutive windows of the split in epochs, from a token derived from
    /// `seed` ([`crate::data::loader::seed_rotation`]), so a run shorter than an epoch reads one
    /// seed-chosen stretch. Both resume exactly and give one process the windows of several ranks; a
    /// checkpoint resumes only with the sampling that wrote it.
    pub sampling: WindowSampling,
    /// Device.
    pub device: DeviceChoice,
    /// bf16 autocast on CUDA (ignored on the CPU).
    pub bf16: bool,
    /// CPU threads for libtorch and the fused kernels (0: all cores).
    pub threads: usize,
    /// On the CPU, each micro-batch's sequences split into this many shards, each shard's forward
    /// and backward on a thread of its own with a replica of the model (`train::shards`; the
    /// gradients summed in shard order, deterministic): 0 (the default) as many as the training's
    /// libtorch threads (`threads`, or the process's count when that is 0) where that divides
    /// `batch_size` (else the largest count below it that does), 1 one forward and
    /// backward of the whole micro-batch on libtorch's intra-op threads, `n` exactly `n` (must divide
    /// `batch_size`). Ignored on a GPU. Omitted from the TOML when 0.
    #[serde(skip_serializing_if = "is_zero_count")]
    pub shards: usize,
    /// Peak FLOP/s of one device, for MFU in the metrics (0: unknown, MFU not reported).
    pub peak_flops: f64,
    /// Share of training windows replaced by associative-recall sequences on their own text
    /// ([`crate::data::recall`]), so that retrieval is learnt in training (0: none; omitted from the
    /// TOML then, so configs without it read and print as before).
    #[serde(skip_serializing_if = "is_zero")]
    pub recall_share: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero_count(x: &usize) -> bool {
    *x == 0
}

impl Default for TrainConfig {
    fn default() -> Self {
        let model = ModelConfig::preset("cpu-small").expect("known preset");
        Self {
            model,
            data_dir: PathBuf::from("data/default"),
            out_dir: PathBuf::from("runs/default"),
            batch_size: 8,
            tokens_per_step: 8 * 128,
            max_steps: 600,
            lr: 1e-3,
            min_lr_ratio: 0.1,
            warmup_steps: 30,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
            eval_every: 100,
            eval_tokens: 16 * 1024,
            ckpt_every: 200,
            keep_last: 2,
            seed: 1337,
            sampling: WindowSampling::Random,
            device: DeviceChoice::Auto,
            bf16: true,
            threads: 0,
            shards: 0,
            peak_flops: 0.0,
            recall_share: 0.0,
        }
    }
}

/// An invalid configuration or override, naming the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The TOML does not parse, or has an unknown key.
    #[error("{source_name}: {message}")]
    Toml {
        /// The file (or `--set`).
        source_name: String,
        /// The parser's message (it names the key).
        message: String,
    },
    /// A field has an unusable value.
    #[error("config field `{field}` = {value}: {reason}")]
    Invalid {
        /// The field, dotted (`model.n_head`).
        field: String,
        /// Its value.
        value: String,
        /// What is required.
        reason: String,
    },
}

impl TrainConfig {
    /// SPEC section 8: GPT-2 124M, T = 1024, 524,288 tokens per step, 18,865 steps, peak LR 6e-4,
    /// 700 warm-up steps, cosine to 0 (llm.c's run), weight decay 0.1, clipping 1.0, bf16.
    pub fn paper() -> Self {
        Self {
            model: ModelConfig::gpt2_124m(),
            data_dir: PathBuf::from("data/fineweb10B"),
            out_dir: PathBuf::from("runs/paper"),
            batch_size: 64,
            tokens_per_step: 524_288,
            max_steps: 18_865,
            lr: 6e-4,
            min_lr_ratio: 0.0,
            warmup_steps: 700,
            eval_every: 250,
            eval_tokens: 10 * 524_288,
            ckpt_every: 2000,
            ..Self::default()
        }
    }

    /// Parses TOML text (unknown keys are errors naming the key), then applies `key=value` overrides
    /// (TOML values; dotted keys reach into `[model]`, e.g. `model.attention="lssa+rw15"`), then
    /// validates. `source_name` names the text in errors.
    pub fn from_toml_with_overrides(text: &str, source_name: &str, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut table: toml::Table = toml::from_str(text)
            .map_err(|e| ConfigError::Toml { source_name: source_name.into(), message: e.to_string() })?;
        for ov in overrides {
            apply_override(&mut table, ov)?;
        }
        expand_model_preset(&mut table)?;
        // Round trip through the typed struct so unknown keys (in the file or an override) are errors.
        let cfg: Self = toml::Table::try_into(table)
            .map_err(|e| ConfigError::Toml { source_name: source_name.into(), message: e.to_string() })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The resolved config as TOML (printed at start, stored in the run directory and in checkpoints).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a TrainConfig always serialises")
    }

    /// Tokens per micro-batch on one rank.
    pub fn micro_tokens(&self) -> usize {
        self.batch_size * self.model.context_len
    }

    /// Micro-batches per optimiser step on each rank, for `world` ranks.
    pub fn accumulation(&self, world: usize) -> Result<usize, ConfigError> {
        let per = self.micro_tokens() * world;
        if per == 0 || !self.tokens_per_step.is_multiple_of(per) || self.tokens_per_step < per {
            return Err(ConfigError::Invalid {
                field: "tokens_per_step".into(),
                value: self.tokens_per_step.to_string(),
                reason: format!(
                    "must be a positive multiple of batch_size x context_len x world size = {} x {} x {world} = {per}",
                    self.batch_size, self.model.context_len
                ),
            });
        }
        Ok(self.tokens_per_step / per)
    }

    /// Checks every field (sizes, rates, the model).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate().map_err(|e| ConfigError::Invalid {
            field: "model".into(),
            value: String::new(),
            reason: e.to_string(),
        })?;
        let bad = |field: &str, value: String, reason: &str| {
            Err(ConfigError::Invalid { field: field.into(), value, reason: reason.into() })
        };
        if self.batch_size == 0 {
            return bad("batch_size", "0".into(), "must be >= 1");
        }
        if self.max_steps == 0 {
            return bad("max_steps", "0".into(), "must be >= 1");
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            return bad("lr", self.lr.to_string(), "must be a positive number");
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return bad("min_lr_ratio", self.min_lr_ratio.to_string(), "must be in [0, 1]");
        }
        if !(0.0..1.0).contains(&self.beta1) || !(0.0..1.0).contains(&self.beta2) {
            return bad("beta1", format!("{} / beta2 {}", self.beta1, self.beta2), "betas must be in [0, 1)");
        }
        if self.weight_decay < 0.0 || self.grad_clip < 0.0 {
            return bad(
                "weight_decay",
                format!("{} / grad_clip {}", self.weight_decay, self.grad_clip),
                "must be >= 0",
            );
        }
        if self.keep_last == 0 {
            return bad("keep_last", "0".into(), "must keep at least one checkpoint");
        }
        if self.shards > 1 && !self.batch_size.is_multiple_of(self.shards) {
            return bad("shards", self.shards.to_string(), &format!("must divide batch_size ({})", self.batch_size));
        }
        if !(0.0..1.0).contains(&self.recall_share) {
            return bad("recall_share", self.recall_share.to_string(), "must be in [0, 1)");
        }
        if self.recall_share > 0.0 {
            if let Err(e) = crate::data::recall::RecallTask::for_vocab(self.model.vocab_size) {
                return bad("recall_share", self.recall_share.to_string(), &e.to_string());
            }
            if self.model.context_len < 12 {
                return bad("recall_share", self.recall_share.to_string(), "needs model.context_len >= 12");
            }
        }
        self.accumulation(1)?;
        Ok(())
    }
}

/// Replaces the `[model]` table by a full one: the preset named by `model.preset` (default: the default
/// config's model, `cpu-small`) with the table's other keys on top.
fn expand_model_preset(table: &mut toml::Table) -> Result<(), ConfigError> {
    let Some(model) = table.get_mut("model").and_then(toml::Value::as_table_mut) else {
        return Ok(());
    };
    let base = match model.remove("preset") {
        None => TrainConfig::default().model,
        Some(preset) => {
            let name = preset.as_str().unwrap_or_default().to_string();
            ModelConfig::preset(&name).map_err(|e| ConfigError::Invalid {
                field: "model.preset".into(),
                value: format!("{preset}"),
                reason: e.to_string(),
            })?
        }
    };
    let mut full: toml::Table = toml::from_str(&base.to_toml()).expect("a ModelConfig serialises to a table");
    for (k, v) in std::mem::take(model) {
        full.insert(k, v);
    }
    *model = full;
    Ok(())
}

/// Sets `key=value` in a TOML table; `value` is parsed as a TOML value, falling back to a string.
fn apply_override(table: &mut toml::Table, ov: &str) -> Result<(), ConfigError> {
    let (key, raw) = ov.split_once('=').ok_or_else(|| ConfigError::Invalid {
        field: ov.into(),
        value: String::new(),
        reason: "an override is key=value".into(),
    })?;
    let key = key.trim();
    let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or(key);
    let mut cur = table;
    for p in parts {
        let entry = cur.entry(p.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry.as_table_mut().ok_or_else(|| ConfigError::Invalid {
            field: key.into(),
            value: raw.into(),
            reason: format!("`{p}` is not a table"),
        })?;
    }
    cur.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_and_validate() {
        let c = TrainConfig::default();
        c.validate().unwrap();
        assert_eq!(TrainConfig::from_toml_with_overrides(&c.to_toml(), "x", &[]).unwrap(), c);
        TrainConfig::paper().validate().unwrap();
        // SPEC 8: 524,288 tokens per step = 64 x 1024 x 8 GPUs -> no accumulation on 8 ranks.
        assert_eq!(TrainConfig::paper().accumulation(8).unwrap(), 1);
    }

    #[test]
    fn overrides_reach_the_model_and_unknown_keys_are_errors() {
        let c = TrainConfig::from_toml_with_overrides(
            "max_steps = 5\n[model]\nn_layer = 2\n", // no preset: cpu-small with 2 layers
            "t.toml",
            &["model.attention=lssa+rw15".into(), "lr=0.01".into()],
        )
        .unwrap();
        assert_eq!(
            (c.max_steps, c.model.n_layer, c.model.attention.to_string().as_str(), c.lr),
            (5, 2, "lssa+rw15", 0.01)
        );
        let err = TrainConfig::from_toml_with_overrides("max_step = 5\n", "t.toml", &[]).unwrap_err();
        assert!(err.to_string().contains("max_step") && err.to_string().contains("t.toml"), "{err}");
        let err = TrainConfig::from_toml_with_overrides("", "t.toml", &["model.n_heads=3".into()]).unwrap_err();
        assert!(err.to_string().contains("n_heads"), "{err}");
        let err = TrainConfig::from_toml_with_overrides("tokens_per_step = 1000\n", "t.toml", &[]).unwrap_err();
        assert!(err.to_string().contains("tokens_per_step"), "{err}");
        // `shards`: omitted when automatic, printed when set, a divisor of the batch.
        assert!(!TrainConfig::default().to_toml().contains("shards"));
        let c = TrainConfig::from_toml_with_overrides("", "t.toml", &["shards=4".into()]).unwrap();
        assert_eq!(TrainConfig::from_toml_with_overrides(&c.to_toml(), "x", &[]).unwrap().shards, 4);
        let err = TrainConfig::from_toml_with_overrides("batch_size = 8\nshards = 3\n", "t.toml", &[]).unwrap_err();
        assert!(err.to_string().contains("shards") && err.to_string().contains("must divide batch_size (8)"), "{err}");
        // A preset with overrides on top.
        let c =
            TrainConfig::from_toml_with_overrides("[model]\npreset = \"tiny\"\nn_layer = 3\n", "t.toml", &[]).unwrap();
        let tiny = ModelConfig::preset("tiny").unwrap();
        assert_eq!((c.model.n_layer, c.model.d_model), (3, tiny.d_model));
        let err = TrainConfig::from_toml_with_overrides("[model]\npreset = \"gpt5\"\n", "t.toml", &[]).unwrap_err();
        assert!(err.to_string().contains("model.preset"), "{err}");
        // `sampling`: random by default and printed, stream on request, nothing else.
        assert!(TrainConfig::default().to_toml().contains("sampling = \"random\""));
        let c = TrainConfig::from_toml_with_overrides("", "t.toml", &["sampling=stream".into()]).unwrap();
        assert_eq!(c.sampling, WindowSampling::Stream);
        assert_eq!(TrainConfig::from_toml_with_overrides(&c.to_toml(), "x", &[]).unwrap(), c);
        let err = TrainConfig::from_toml_with_overrides("sampling = \"shuffled\"\n", "t.toml", &[]).unwrap_err();
        let e = err.to_string();
        assert!(e.contains("sampling") && e.contains("expected `random` or `stream`"), "{e}");
    }

    #[test]
    fn the_variant_is_parsed_when_the_config_is_read_and_a_bad_one_names_its_key() {
        let c = TrainConfig::from_toml_with_overrides("[model]\nattention = \"lssa+rw15\"\n", "t.toml", &[]).unwrap();
        assert_eq!(c.model.attention, "lssa".parse::<attn_core::Variant>().unwrap().with_reweight(15).unwrap());
        for (text, overrides, name) in [
            ("[model]\nattention = \"lssa+rw0\"\n", &[][..], "lssa+rw0"),
            ("", &["model.attention=lsssa".to_string()][..], "lsssa"),
        ] {
            let e = TrainConfig::from_toml_with_overrides(text, "t.toml", overrides).unwrap_err().to_string();
            assert!(e.contains("attention") && e.contains(name) && e.contains("t.toml"), "{e}");
        }
        // Its name round-trips through the TOML that checkpoints and run directories store.
        assert_eq!(TrainConfig::from_toml_with_overrides(&c.to_toml(), "x", &[]).unwrap(), c);
    }
}
