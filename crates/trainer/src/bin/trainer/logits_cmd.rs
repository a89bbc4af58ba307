//! `trainer logits`: the model's logits for one sequence of token ids, as a NumPy `.npy` file, so
//! that another implementation (an exported model in transformers, say) can be compared with this
//! one on the same input.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use gpt_model::model::ForwardOptions;
use tch::{Device, Kind, Tensor};
use trainer::sample as sampling;

use crate::common::set_threads;

#[derive(clap::Args, Debug)]
pub(crate) struct LogitsArgs {
    /// The checkpoint, a training state or a weights-only export.
    #[arg(long)]
    checkpoint: PathBuf,
    /// A text file of token ids, separated by whitespace or commas: one sequence of any length.
    #[arg(long)]
    ids: PathBuf,
    /// RoPE beyond the training length: `ntk` scales the base to the sequence's length
    /// (`b s^(d/(d-2))`, s = length / T_train, as `trainer eval`), `plain` keeps it.
    #[arg(long, value_enum, default_value_t = LogitsRope::Plain)]
    rope: LogitsRope,
    /// Post-hoc re-weighting power p.
    #[arg(long)]
    reweight: Option<u32>,
    /// The `.npy` file to write: float32, (length, vocabulary), the real vocabulary's columns only.
    #[arg(long)]
    out: PathBuf,
    /// CPU threads for libtorch (0: its default).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

/// `logits --rope`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogitsRope {
    /// NTK-scaled to the sequence's length when it exceeds the training length.
    Ntk,
    /// Unscaled.
    Plain,
}

pub(crate) fn logits_cmd(a: LogitsArgs) -> Result<()> {
    set_threads(a.threads);
    let ckpt = sampling::open_checkpoint(&a.checkpoint)?;
    let (_vs, model) = sampling::load_model(&ckpt, Device::Cpu)?;
    let cfg = model.config().clone();
    let text = std::fs::read_to_string(&a.ids).with_context(|| format!("reading {}", a.ids.display()))?;
    let ids: Vec<i64> = text
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<i64>().with_context(|| format!("{}: `{s}` is not a token id", a.ids.display())))
        .collect::<Result<_>>()?;
    ensure!(!ids.is_empty(), "{}: no token ids", a.ids.display());
    if let Some(bad) = ids.iter().find(|&&i| i < 0 || i as usize >= cfg.vocab_size) {
        anyhow::bail!("{}: token id {bad} is outside the vocabulary of {}", a.ids.display(), cfg.vocab_size);
    }
    let s = ids.len() as f64 / cfg.context_len as f64;
    let opts = ForwardOptions {
        length_scale: (a.rope == LogitsRope::Ntk && s > 1.0).then_some(s),
        ntk: a.rope == LogitsRope::Ntk && s > 1.0,
        reweight: a.reweight,
        ..ForwardOptions::default()
    };
    let idx = Tensor::from_slice(&ids).unsqueeze(0);
    let logits = tch::no_grad(|| model.forward(&idx, &opts))?;
    let logits = logits.squeeze_dim(0).narrow(-1, 0, cfg.vocab_size as i64).to_kind(Kind::Float).contiguous();
    let (t, v) = (ids.len(), cfg.vocab_size);
    let mut data = vec![0f32; t * v];
    logits.copy_data(&mut data, t * v);
    write_npy(&a.out, &data, t, v)?;
    println!("trainer: wrote {} ({t} x {v} logits, {:?} RoPE)", a.out.display(), a.rope);
    Ok(())
}

/// A little-endian float32 `.npy` (format 1.0) of shape (rows, cols).
fn write_npy(path: &std::path::Path, data: &[f32], rows: usize, cols: usize) -> Result<()> {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // Magic (6) + version (2) + length (2) + header + newline, padded to a multiple of 64.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + data.len() * 4);
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for x in data {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}
