//! What the binary-level tests share: a tiny data set built by the real pipeline and a tiny run's
//! config, both written under a scratch directory.

use std::path::{Path, PathBuf};

use gpt_model::config::{AttnImpl, ModelConfig};
use trainer::config::{DeviceChoice, TrainConfig};
use trainer::data::corpus::{self, BuildOptions, TokenizerChoice};

/// Generated text tokenised by the real pipeline (a 320-token BPE) into `root/data`.
pub fn tiny_data(root: &Path) -> PathBuf {
    let text = root.join("text");
    corpus::write_generated_text(&text, 4, 2000, 11).unwrap();
    let dir = root.join("data");
    let opts = BuildOptions { tokenizer: TokenizerChoice::Bpe { vocab_size: 320 }, ..BuildOptions::new(&dir) };
    corpus::build(corpus::input_documents(&[text]).unwrap(), &opts).unwrap();
    dir
}

/// A tiny LSSAR run of `steps` steps on `root/data` into `root/name`, checkpointing every
/// `ckpt_every` steps; its config is written to `root/name.toml`, whose path is returned.
pub fn tiny_config(root: &Path, name: &str, steps: usize, ckpt_every: usize, keep_last: usize) -> PathBuf {
    let cfg = TrainConfig {
        model: ModelConfig {
            vocab_size: 320,
            context_len: 32,
            attn_impl: AttnImpl::Reference,
            attention: "lssa+rw15".parse().unwrap(),
            ..ModelConfig::preset("tiny").unwrap()
        },
        data_dir: root.join("data"),
        out_dir: root.join(name),
        batch_size: 2,
        tokens_per_step: 2 * 32,
        max_steps: steps,
        warmup_steps: 2,
        lr: 3e-3,
        eval_every: 0,
        eval_tokens: 256,
        ckpt_every,
        keep_last,
        device: DeviceChoice::Cpu,
        threads: 1,
        ..TrainConfig::default()
    };
    let path = root.join(format!("{name}.toml"));
    std::fs::write(&path, cfg.to_toml()).unwrap();
    path
}
