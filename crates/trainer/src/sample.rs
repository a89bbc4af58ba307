//! Inference on a checkpoint of either kind (a training state or a weights-only export): opening it
//! once, memory-mapped ([`open_checkpoint`]), the model and the tokenizer it was trained with
//! ([`load`]), and text generation with the KV cache ([`sample`], `trainer sample`).
//!
//! Generation is deterministic: prompt `i` draws from its own generator seeded with
//! `derive_seed(seed, i)`, never from libtorch's process-wide one, so the same checkpoint, prompts,
//! options and seed give the same text whatever else the process does, and whichever prompts share
//! its batch (batches group prompts of one token length: the model has no padding mask).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use gpt_model::ModelConfig;
use gpt_model::checkpoint::Checkpoint;
use gpt_model::model::{ForwardOptions, GenerateOptions, Gpt, Sampling};
use memmap2::Mmap;
use serde::Serialize;
use tch::Device;
use tch::nn::VarStore;

use crate::config::TrainConfig;
use crate::data::shard::MANIFEST_FILE;
use crate::data::tokenizer::{GPT2_ID, TOKENIZER_FILE, Tokenizer};
pub use crate::tasks::derive_seed;

/// Opens a checkpoint file memory-mapped: the header is checked now, and the tensors are read from
/// the page cache where they are used (the weights of a training checkpoint, not its optimiser
/// moments).
pub fn open_checkpoint(path: &Path) -> Result<Checkpoint<Mmap>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening checkpoint {}", path.display()))?;
    let meta = file.metadata().with_context(|| format!("reading {}", path.display()))?;
    ensure!(meta.is_file(), "checkpoint {}: not a file", path.display());
    // SAFETY: the map is only read. Checkpoints are written to a temporary file and renamed
    // (gpt_model::checkpoint), never changed in place, so a file being replaced meanwhile leaves
    // this map on the old, unchanged inode. Truncating the file under a running reader (by hand)
    // would be undefined behaviour, as with any memory-mapped reader.
    let map = unsafe { Mmap::map(&file) }.with_context(|| format!("memory-mapping {}", path.display()))?;
    Ok(Checkpoint::from_bytes(path, map)?)
}

/// A checkpoint loaded for inference.
pub struct Loaded {
    /// The variables (on `device`).
    pub vs: VarStore,
    /// The model.
    pub model: Gpt,
    /// The tokenizer it was trained with.
    pub tokenizer: Tokenizer,
    /// The checkpoint's metadata.
    pub meta: HashMap<String, String>,
    /// Its model config.
    pub config: ModelConfig,
    /// Where the model lives.
    pub device: Device,
}

/// Builds the model of `ckpt` on `device` and copies its weights in.
pub fn load_model<B: AsRef<[u8]>>(ckpt: &Checkpoint<B>, device: Device) -> Result<(VarStore, Gpt)> {
    let cfg = ckpt.config()?;
    let mut vs = VarStore::new(device);
    let model = Gpt::new(&vs.root(), &cfg)?;
    ckpt.load_into(&mut vs, &cfg)?;
    Ok((vs, model))
}

/// The checkpoint at `path` (either kind), read once, with its tokenizer ([`tokenizer_for`]).
pub fn load(path: &Path, data_dir: Option<&Path>, device: Device) -> Result<Loaded> {
    let ckpt = open_checkpoint(path)?;
    let config = ckpt.config()?;
    let meta = ckpt.metadata().clone();
    let tokenizer = tokenizer_for(&meta, path, data_dir)?;
    ensure!(
        tokenizer.vocab_size() <= config.vocab_size,
        "{}: the tokenizer `{}` has {} tokens but the model only {}",
        path.display(),
        tokenizer.id(),
        tokenizer.vocab_size(),
        config.vocab_size
    );
    let (vs, model) = load_model(&ckpt, device)?;
    Ok(Loaded { vs, model, tokenizer, meta, config, device })
}

/// The training `data_dir` a checkpoint records (its `train_config`), if any.
pub fn train_data_dir(meta: &HashMap<String, String>) -> Result<Option<PathBuf>> {
    match meta.get("train_config") {
        None => Ok(None),
        Some(t) => Ok(Some(TrainConfig::from_toml_with_overrides(t, "checkpoint train_config", &[])?.data_dir)),
    }
}

/// The tokenizer of a checkpoint: GPT-2 when it records `gpt2` and no `data_dir` is given; otherwise
/// the one of `data_dir` (default: the training `data_dir` it records): a shard directory's (its
/// manifest names it), or a directory's `tokenizer.json` (e.g. copied beside an exported file). It
/// must be the tokenizer the checkpoint records.
pub fn tokenizer_for(meta: &HashMap<String, String>, ckpt: &Path, data_dir: Option<&Path>) -> Result<Tokenizer> {
    let expected = meta.get("tokenizer").map(String::as_str);
    if expected == Some(GPT2_ID) && data_dir.is_none() {
        return Ok(Tokenizer::gpt2()?);
    }
    let (dir, whence) = match data_dir {
        Some(d) => (d.to_path_buf(), "--data-dir"),
        None => match train_data_dir(meta)? {
            Some(d) => (d, "the checkpoint's training data_dir; pass --data-dir to use another"),
            None => bail!(
                "{}: no training data_dir recorded to find its tokenizer{}; pass --data-dir (a shard directory, or one holding tokenizer.json)",
                ckpt.display(),
                expected.map(|t| format!(" `{t}`")).unwrap_or_default()
            ),
        },
    };
    let tok = if !dir.join(MANIFEST_FILE).exists() && dir.join(TOKENIZER_FILE).is_file() {
        Tokenizer::from_file(&dir.join(TOKENIZER_FILE))
    } else {
        Tokenizer::load_for_dir(&dir)
    }
    .with_context(|| format!("loading the tokenizer of {} ({whence})", dir.display()))?;
    if let Some(want) = expected
        && tok.id() != want
    {
        bail!(
            "the tokenizer of {} is `{}`, but {} was trained with `{want}`; pass --data-dir with the training data (or its tokenizer.json)",
            dir.display(),
            tok.id(),
            ckpt.display()
        );
    }
    Ok(tok)
}

/// `trainer sample`'s settings.
#[derive(Clone, Debug)]
pub struct SampleOptions {
    /// New tokens per prompt, at most (`>= 1`).
    pub max_tokens: usize,
    /// Temperature (0: greedy), top-k, top-p.
    pub sampling: Sampling,
    /// Seed: prompt `i` samples with `derive_seed(seed, i)`.
    pub seed: u64,
    /// Stop a prompt at the tokenizer's end-of-text token.
    pub stop_at_eot: bool,
    /// Post-hoc re-weighting power `p` (the trained variant with `+rw p`).
    pub reweight: Option<u32>,
    /// The window as a multiple `s >= 1` of the training length: prompt + new tokens may reach
    /// `s x T_train` tokens.
    pub length_scale: f64,
    /// NTK-scaled RoPE base at `length_scale > 1` (else the training RoPE).
    pub ntk: bool,
    /// Most prompts per batched generation.
    pub batch_size: usize,
}

impl Default for SampleOptions {
    fn default() -> Self {
        Self {
            max_tokens: 64,
            sampling: Sampling { temperature: 1.0, top_k: None, top_p: None },
            seed: 0,
            stop_at_eot: true,
            reweight: None,
            length_scale: 1.0,
            ntk: true,
            batch_size: 8,
        }
    }
}

/// Why a continuation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The end-of-text token.
    Eot,
    /// `max_tokens` reached.
    Length,
}

/// One prompt's continuation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sample {
    /// The prompt as given.
    pub prompt: String,
    /// The generated text (without the prompt).
    pub completion: String,
    /// Tokens given to the model (the end-of-text token before the prompt included).
    pub prompt_tokens: usize,
    /// Tokens generated (the end-of-text token that stopped it excluded).
    pub completion_tokens: usize,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// The seed this prompt sampled with.
    pub seed: u64,
}

/// Reads prompts from a file (`-`: standard input), one per line; blank lines are skipped.
pub fn read_prompts(path: &Path) -> Result<Vec<String>> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading prompts from standard input")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading prompts from {}", path.display()))?
    };
    let prompts: Vec<String> = text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
    ensure!(!prompts.is_empty(), "{}: no prompts (one per line)", path.display());
    Ok(prompts)
}

/// Continues every prompt. Each is encoded after the end-of-text token (as every training document
/// starts; not doubled when the prompt starts with `<|endoftext|>`), prompts of one token length
/// share a batch, and the options are checked first: an empty prompt, a temperature below 0, top-k
/// 0, top-p outside `(0, 1]`, a length scale below 1, an invalid re-weighting power or a sequence
/// longer than the window are errors.
pub fn sample(model: &Gpt, tok: &Tokenizer, prompts: &[String], o: &SampleOptions) -> Result<Vec<Sample>> {
    ensure!(!prompts.is_empty(), "no prompt given");
    ensure!(o.max_tokens >= 1, "--max-tokens must be at least 1");
    ensure!(o.batch_size >= 1, "the batch size must be at least 1");
    o.sampling.validate()?;
    ensure!(
        o.length_scale.is_finite() && o.length_scale >= 1.0,
        "--length-scale {} must be a finite multiple >= 1 of the training length",
        o.length_scale
    );
    if let Some(p) = o.reweight {
        model.variant().clone().with_reweight(p).with_context(|| format!("--reweight {p}"))?;
    }
    let t_train = model.config().context_len;
    let window = (t_train as f64 * o.length_scale).floor() as usize;
    let eot = tok.eot();
    let mut encoded = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let which = if prompts.len() > 1 { format!("prompt {} ", i + 1) } else { "the prompt ".to_string() };
        ensure!(
            !p.is_empty(),
            "{which}is empty; give some text (or `{}` for unconditional samples)",
            crate::data::tokenizer::EOT_TEXT
        );
        let mut ids = tok.encode(p);
        if ids.first() != Some(&eot) {
            ids.insert(0, eot);
        }
        let total = ids.len() + o.max_tokens;
        ensure!(
            total <= window,
            "{which}has {} tokens; with --max-tokens {} the sequence reaches {total} tokens, beyond the window of {window} (training length {t_train} x --length-scale {}); lower --max-tokens or raise --length-scale",
            ids.len(),
            o.max_tokens,
            o.length_scale
        );
        encoded.push(ids.into_iter().map(i64::from).collect::<Vec<i64>>());
    }
    let forward = ForwardOptions {
        length_scale: Some(o.length_scale),
        ntk: o.ntk && o.length_scale > 1.0,
        reweight: o.reweight,
        attn_impl: None,
    };
    let settings = GenerateOptions {
        max_new: o.max_tokens,
        sampling: o.sampling.clone(),
        stop: if o.stop_at_eot { vec![i64::from(eot)] } else { Vec::new() },
        forward,
    };
    let seeds: Vec<u64> = (0..prompts.len()).map(|i| derive_seed(o.seed, i as u64)).collect();
    // Prompts of one length, in order of first appearance, `batch_size` at a time.
    let mut by_len: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, ids) in encoded.iter().enumerate() {
        match by_len.iter_mut().find(|(l, _)| *l == ids.len()) {
            Some((_, v)) => v.push(i),
            None => by_len.push((ids.len(), vec![i])),
        }
    }
    let mut out: Vec<Option<Sample>> = vec![None; prompts.len()];
    for (_, members) in by_len {
        for chunk in members.chunks(o.batch_size) {
            let ids: Vec<Vec<i64>> = chunk.iter().map(|&i| encoded[i].clone()).collect();
            let chunk_seeds: Vec<u64> = chunk.iter().map(|&i| seeds[i]).collect();
            let gens = model.generate_batch(&ids, &chunk_seeds, &settings)?;
            for (&i, g) in chunk.iter().zip(gens) {
                let new: Vec<u32> = g.tokens.iter().map(|&t| t as u32).collect();
                out[i] = Some(Sample {
                    prompt: prompts[i].clone(),
                    completion: tok.decode(&new),
                    prompt_tokens: encoded[i].len(),
                    completion_tokens: new.len(),
                    finish_reason: if g.stopped { FinishReason::Eot } else { FinishReason::Length },
                    seed: seeds[i],
                });
            }
        }
    }
    Ok(out.into_iter().map(|s| s.expect("every prompt generated")).collect())
}
