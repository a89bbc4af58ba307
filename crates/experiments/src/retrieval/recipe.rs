//! How a retrieval model is trained (its [`Recipe`]: the initialisation and the optimiser), and the
//! state a training stopped by a signal leaves behind so that the next invocation continues it
//! ([`Partial`]) instead of starting again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use gpt_model::{Init, ModelConfig};
use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use trainer::optim::AdamW;

/// The initialisation and optimiser every retrieval model of a task cell is trained with: one named
/// recipe, recorded in each model's result ([`super::SeedRun::recipe`]) so that the report prints the
/// recipe that trained the models it reads, not a restatement.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// How the parameters are drawn ([`Init`]).
    pub init: Init,
    /// AdamW's decay rate of the first moment.
    pub beta1: f64,
    /// AdamW's decay rate of the second moment.
    pub beta2: f64,
    /// AdamW's epsilon.
    pub eps: f64,
    /// Decoupled weight decay, applied to the parameters of two or more dimensions only (the
    /// trainer's rule, [`trainer::optim::AdamW::new`]).
    pub weight_decay: f64,
    /// Global gradient-norm clip.
    pub grad_clip: f64,
}

impl Recipe {
    /// The language models' recipe (the trainer's AdamW, decay rule and clipping, as
    /// `TrainConfig::default()` sets them: what every language model of the project trains with)
    /// with the initialisation `init`.
    pub fn language_models(init: Init) -> Recipe {
        let t = trainer::config::TrainConfig::default();
        Recipe {
            init,
            beta1: t.beta1,
            beta2: t.beta2,
            eps: t.eps,
            weight_decay: t.weight_decay,
            grad_clip: t.grad_clip,
        }
    }

    /// The optimiser over every variable of `vs`.
    pub fn optimiser(&self, vs: &VarStore) -> AdamW {
        AdamW::new(vs.variables().into_iter().collect(), self.beta1, self.beta2, self.eps, self.weight_decay)
    }

    /// The recipe in words, for the report's task description.
    pub fn describe(&self) -> String {
        format!(
            "AdamW with betas ({}, {}), eps {:e} and weight decay {} on the weight matrices and the embedding only (the language models' optimiser), gradients clipped at global norm {}",
            self.beta1, self.beta2, self.eps, self.weight_decay, self.grad_clip
        )
    }
}

/// A retrieval training's state at a step boundary, kept in one file while it is unfinished: the
/// weights and AdamW's moments (a [`gpt_model::checkpoint`] file), the step, the answer losses of the
/// last tenth so far and the training seconds spent. Written when a stop signal arrives, read by the
/// next invocation, removed once the model's result is cached. Its metadata names what it belongs to
/// (`provenance`: the task revision and the settings), so a file of other code or settings is ignored.
pub struct Partial {
    /// The file.
    pub path: PathBuf,
    /// What the state must match to be continued.
    pub provenance: String,
}

/// What [`Partial::load`] restores besides the weights and moments.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Progress {
    /// Steps done.
    pub step: usize,
    /// Answer losses of the last tenth of the steps done so far.
    pub tail: Vec<f64>,
    /// Training seconds spent so far.
    pub train_s: f64,
}

impl Partial {
    /// Saves the state after `progress.step` steps, atomically.
    pub fn save(&self, vs: &VarStore, cfg: &ModelConfig, opt: &AdamW, progress: &Progress) -> Result<()> {
        let meta = HashMap::from([
            ("kind".to_string(), "lssa-retrieval-partial".to_string()),
            ("provenance".to_string(), self.provenance.clone()),
            ("progress".to_string(), serde_json::to_string(progress)?),
            ("adam_t".to_string(), opt.t.to_string()),
        ]);
        gpt_model::checkpoint::save_with(vs, cfg, &meta, &opt.state(), &self.path)
            .with_context(|| format!("saving the stopped retrieval training to {}", self.path.display()))
    }

    /// Restores a saved state of the same provenance into `vs` and `opt`; `None` (and nothing
    /// changed) when there is no file or it belongs to other code or settings.
    pub fn load(&self, vs: &mut VarStore, cfg: &ModelConfig, opt: &mut AdamW) -> Result<Option<Progress>> {
        if !self.path.exists() {
            return Ok(None);
        }
        let ckpt = gpt_model::checkpoint::Checkpoint::read(&self.path)?;
        let meta = ckpt.metadata();
        if meta.get("provenance") != Some(&self.provenance) {
            return Ok(None);
        }
        let what = || format!("{}: a stopped retrieval training", self.path.display());
        let progress: Progress =
            serde_json::from_str(meta.get("progress").map_or("", String::as_str)).with_context(what)?;
        let t: u64 = meta.get("adam_t").map_or("", String::as_str).parse().with_context(what)?;
        ckpt.load_into(vs, cfg)?;
        opt.load_state(&ckpt.tensors("optim.")?, t).map_err(anyhow::Error::msg).with_context(what)?;
        Ok(Some(progress))
    }

    /// Removes the file (the model's result is cached).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    /// The file of seed `seed_index` of `variant` in the cell directory `dir`.
    pub fn path_in(dir: &Path, variant: &str, seed_index: usize) -> PathBuf {
        dir.join(format!("{}_seed{seed_index}.partial.safetensors", crate::runner::run_dir_name(variant)))
    }
}
