//! Validation loss at `1x .. 16x` the training length (SPEC section 9): every length scores the same
//! validation tokens, one fixed span cut into windows of that length, with plain or NTK-scaled RoPE and
//! optional post-hoc re-weighting; long lengths go through the fused kernels (or the chunked reference)
//! so no `T x T` matrix is ever built.
//!
//! One protocol serves `trainer eval`, the end of `trainer train` and the reproduction
//! ([`ValidationSet`]): spans of the longest length spread evenly over the whole validation split, so
//! that one checkpoint has one validation number wherever it is scored.

use std::path::{Path, PathBuf};

use gpt_model::model::{ForwardOptions, Gpt};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

/// RoPE treatment at lengths beyond the training length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rope {
    /// The training RoPE base, unchanged.
    Plain,
    /// NTK-scaled base `b s^(d/(d-2))` at `s x T_train` (SPEC section 7).
    Ntk,
}

/// Reads a JSON number, or `null` as NaN: serde_json writes NaN and infinities as `null`, so a
/// diverged loss must survive a round trip through a results file.
pub fn null_as_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// One evaluated length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LengthLoss {
    /// Multiple of the training length.
    pub multiple: usize,
    /// Sequence length `multiple x T_train`.
    pub seq_len: usize,
    /// RoPE treatment.
    pub rope: Rope,
    /// Post-hoc re-weighting power, if any.
    pub reweight: Option<u32>,
    /// Mean cross-entropy in nats per token (JSON writes a non-finite loss as `null`, read back as NaN).
    #[serde(deserialize_with = "null_as_nan")]
    pub loss: f64,
    /// Tokens scored.
    pub tokens: usize,
    /// Windows of `seq_len` tokens.
    pub windows: usize,
    /// Per-window losses, when scored by [`multi_length_spans`] (what paired statistics read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_window: Option<WindowLosses>,
}

/// Mean loss of every window of one evaluation, in window order (span after span, each span's windows
/// in order), split by position inside the window. With `T = T_train` and windows of `m T` tokens:
/// `first` covers positions `0..T` (the context a model had in training), `rest` positions `T..m T`
/// (only beyond the training length; empty at `m = 1`), `tail` the last `T` positions `(m-1) T..m T`
/// (empty at `m = 1`, where it is `first`). The whole-window mean is `(first + (m-1) rest) / m`.
///
/// The last `T` targets of a window are exactly the targets of one window at `1x`, so `tail` is
/// paired with `first` of that `1x` window: the same tokens, predicted with `(m-1) T` more context.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowLosses {
    /// Mean loss over each window's first `T_train` targets.
    pub first: Vec<f32>,
    /// Mean loss over each window's targets after the first `T_train` (empty at `1x`).
    pub rest: Vec<f32>,
    /// Mean loss over each window's last `T_train` targets (empty at `1x`).
    pub tail: Vec<f32>,
}

/// Mean loss over `tokens` cut into consecutive windows of `seq_len` (+1 for the targets) tokens,
/// `batch` windows per forward, without autograd. Uses at most `tokens.len() - 1` predictions; errors
/// when fewer than one window fits.
pub fn span_loss(
    model: &Gpt,
    tokens: &[u16],
    seq_len: usize,
    batch: usize,
    opts: &ForwardOptions,
    device: Device,
) -> anyhow::Result<(f64, usize, usize)> {
    anyhow::ensure!(seq_len >= 1 && batch >= 1, "seq_len and batch must be >= 1");
    let windows = tokens.len().saturating_sub(1) / seq_len;
    anyhow::ensure!(windows >= 1, "{} validation tokens cannot fill one window of {seq_len} (+1) tokens", tokens.len());
    let _g = tch::no_grad_guard();
    let mut sum = 0.0;
    let mut count = 0usize;
    let mut w = 0;
    while w < windows {
        let nb = batch.min(windows - w);
        let mut x = Vec::with_capacity(nb * seq_len);
        let mut y = Vec::with_capacity(nb * seq_len);
        for b in 0..nb {
            let start = (w + b) * seq_len;
            x.extend(tokens[start..start + seq_len].iter().map(|&t| i64::from(t)));
            y.extend(tokens[start + 1..start + seq_len + 1].iter().map(|&t| i64::from(t)));
        }
        let x = Tensor::from_slice(&x).view([nb as i64, seq_len as i64]).to_device(device);
        let y = Tensor::from_slice(&y).view([nb as i64, seq_len as i64]).to_device(device);
        let loss = model.loss(&x, &y, opts)?.to_kind(Kind::Double).double_value(&[]);
        sum += loss * (nb * seq_len) as f64;
        count += nb * seq_len;
        w += nb;
    }
    Ok((sum / count as f64, count, windows))
}

/// Validation targets scored at every length by default (`trainer eval`, the end of `trainer
/// train`; the `small` reproduction scores as many).
pub const DEFAULT_VAL_TARGETS: usize = 65_536;

/// The validation protocol: `count` spans of `longest_multiple x T_train + 1` tokens spread evenly
/// over the whole validation split of a shard directory (the first at its start, the last at its
/// end: every held-out document of every source is sampled, not a prefix), enough for the targets
/// asked (fewer when the split is too small, down to one span). Every length scores exactly these
/// targets ([`multi_length_spans`]).
#[derive(Clone, Debug)]
pub struct ValidationSet {
    /// The spans, each `longest_multiple x T_train + 1` tokens.
    pub spans: Vec<Vec<u16>>,
    /// The longest multiple of `T_train` the spans hold (every length scored must divide it).
    pub longest_multiple: usize,
    /// The shard directory they come from.
    pub dir: PathBuf,
    /// Tokens of its validation split.
    pub split_tokens: u64,
}

impl ValidationSet {
    /// The spans for `multiples` of `t_train` (their least common multiple is the span's length) and
    /// about `targets` targets, from `dir`'s validation split, whose tokenizer must be `tokenizer`
    /// when given.
    pub fn open(
        dir: &Path,
        t_train: usize,
        multiples: &[usize],
        targets: usize,
        tokenizer: Option<&str>,
    ) -> anyhow::Result<ValidationSet> {
        use anyhow::Context as _;
        anyhow::ensure!(multiples.iter().all(|&m| m >= 1), "length multiples must be at least 1: {multiples:?}");
        let longest_multiple = multiples.iter().fold(1, |l, &m| lcm(l, m));
        let span_targets = longest_multiple * t_train;
        let sd = crate::data::shard::ShardDir::open(dir)?;
        let split_tokens: u64 = sd.open_shards(crate::data::Split::Val)?.iter().map(|s| s.len()).sum();
        let fit = (split_tokens / (span_targets as u64 + 1)) as usize;
        anyhow::ensure!(
            fit >= 1,
            "{}: its validation split holds {split_tokens} tokens, fewer than one span of {} ({longest_multiple} x {t_train} + 1)",
            dir.display(),
            span_targets + 1
        );
        let count = targets.div_ceil(span_targets).clamp(1, fit);
        let spans = crate::data::validation_spans(dir, span_targets + 1, count, tokenizer)
            .with_context(|| format!("the validation spans of {}", dir.display()))?;
        Ok(ValidationSet { spans, longest_multiple, dir: dir.to_path_buf(), split_tokens })
    }

    /// Targets scored at every length.
    pub fn targets(&self) -> usize {
        self.spans.iter().map(|s| s.len() - 1).sum()
    }

    /// What was scored, for a table's header: `65536 targets in 64 spans of 1025 tokens spread
    /// over the validation split of DIR (N tokens)`.
    pub fn describe(&self) -> String {
        format!(
            "{} targets in {} spans of {} tokens spread over the validation split of {} ({} tokens)",
            self.targets(),
            self.spans.len(),
            self.spans.first().map_or(0, Vec::len),
            self.dir.display(),
            self.split_tokens
        )
    }

    /// [`multi_length_spans`] on these spans.
    #[allow(clippy::too_many_arguments)]
    pub fn score(
        &self,
        model: &Gpt,
        multiples: &[usize],
        rope: Rope,
        reweight: Option<u32>,
        batch_tokens: usize,
        device: Device,
    ) -> anyhow::Result<Vec<LengthLoss>> {
        multi_length_spans(model, &self.spans, multiples, self.longest_multiple, rope, reweight, batch_tokens, device)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    a / gcd(a, b) * b
}

/// Validation loss at each multiple of the training length, on the same span of `tokens` (trimmed to a
/// multiple of the longest length, so every length scores exactly the same predictions' tokens).
/// `batch_tokens` bounds the tokens per forward (the batch shrinks as the length grows).
pub fn multi_length(
    model: &Gpt,
    tokens: &[u16],
    multiples: &[usize],
    rope: Rope,
    reweight: Option<u32>,
    batch_tokens: usize,
    device: Device,
) -> anyhow::Result<Vec<LengthLoss>> {
    let longest = multiples.iter().copied().max().unwrap_or(1);
    multi_length_on_span(model, tokens, multiples, longest, rope, reweight, batch_tokens, device)
}

/// [`multi_length`] with the span trimmed to a multiple of `longest_multiple x T_train` (which must be
/// at least every multiple asked for), so that evaluations made in separate calls, e.g. one per
/// post-hoc `p`, score the same tokens.
#[allow(clippy::too_many_arguments)]
pub fn multi_length_on_span(
    model: &Gpt,
    tokens: &[u16],
    multiples: &[usize],
    longest_multiple: usize,
    rope: Rope,
    reweight: Option<u32>,
    batch_tokens: usize,
    device: Device,
) -> anyhow::Result<Vec<LengthLoss>> {
    let t_train = model.config().context_len;
    anyhow::ensure!(
        multiples.iter().all(|&m| m >= 1 && m <= longest_multiple),
        "multiples {multiples:?} must lie in 1..={longest_multiple}"
    );
    let longest = longest_multiple * t_train;
    let spans = tokens.len().saturating_sub(1) / longest;
    anyhow::ensure!(
        spans >= 1,
        "{} validation tokens are fewer than one window at the longest length {longest}",
        tokens.len()
    );
    let span = &tokens[..spans * longest + 1];
    let mut out = Vec::with_capacity(multiples.len());
    for &m in multiples {
        let seq_len = m * t_train;
        let opts =
            ForwardOptions { length_scale: Some(m as f64), ntk: rope == Rope::Ntk && m > 1, reweight, attn_impl: None };
        let batch = (batch_tokens / seq_len).max(1);
        let (loss, n, windows) = span_loss(model, span, seq_len, batch, &opts, device)?;
        out.push(LengthLoss { multiple: m, seq_len, rope, reweight, loss, tokens: n, windows, per_window: None });
    }
    Ok(out)
}

/// Validation loss at each multiple of the training length on `spans`, each of exactly
/// `longest_multiple x T_train + 1` tokens (e.g. from [`crate::data::validation_spans`]), keeping
/// every window's losses ([`WindowLosses`]): every length scores exactly the same targets (each span
/// cut into `longest_multiple / m` windows), so two models, two lengths or two RoPE treatments can be
/// compared window by window on identical tokens. `longest_multiple` must be a multiple of every
/// `m` asked for; `batch_tokens` bounds the tokens per forward.
#[allow(clippy::too_many_arguments)]
pub fn multi_length_spans(
    model: &Gpt,
    spans: &[Vec<u16>],
    multiples: &[usize],
    longest_multiple: usize,
    rope: Rope,
    reweight: Option<u32>,
    batch_tokens: usize,
    device: Device,
) -> anyhow::Result<Vec<LengthLoss>> {
    let t = model.config().context_len;
    let span_len = longest_multiple * t;
    anyhow::ensure!(!spans.is_empty(), "no validation spans to score");
    anyhow::ensure!(
        spans.iter().all(|s| s.len() == span_len + 1),
        "every validation span must hold {} tokens ({longest_multiple} x {t} + 1)",
        span_len + 1
    );
    anyhow::ensure!(
        multiples.iter().all(|&m| m >= 1 && longest_multiple.is_multiple_of(m)),
        "multiples {multiples:?} must divide {longest_multiple}"
    );
    let _g = tch::no_grad_guard();
    let mut out = Vec::with_capacity(multiples.len());
    for &m in multiples {
        let seq_len = m * t;
        let per_span = longest_multiple / m;
        let opts =
            ForwardOptions { length_scale: Some(m as f64), ntk: rope == Rope::Ntk && m > 1, reweight, attn_impl: None };
        // Every window of every span, in order.
        let windows: Vec<&[u16]> =
            spans.iter().flat_map(|s| (0..per_span).map(move |w| &s[w * seq_len..(w + 1) * seq_len + 1])).collect();
        let batch = (batch_tokens / seq_len).max(1);
        let mut wl = WindowLosses::default();
        let mut sum = 0.0;
        for chunk in windows.chunks(batch) {
            let nb = chunk.len() as i64;
            let ids = |off: usize| -> Vec<i64> {
                chunk.iter().flat_map(|w| w[off..off + seq_len].iter().map(|&x| i64::from(x))).collect()
            };
            let x = Tensor::from_slice(&ids(0)).view([nb, seq_len as i64]).to_device(device);
            let y = Tensor::from_slice(&ids(1)).view([nb, seq_len as i64]).to_device(device);
            let per_token = token_losses(model, &x, &y, &opts)?; // (nb, seq_len), f64 on the CPU
            let v: Vec<f64> = Vec::try_from(per_token.reshape([-1]))?;
            for row in v.chunks(seq_len) {
                let mean = |xs: &[f64]| (xs.iter().sum::<f64>() / xs.len() as f64) as f32;
                sum += row.iter().sum::<f64>();
                wl.first.push(mean(&row[..t]));
                if m > 1 {
                    wl.rest.push(mean(&row[t..]));
                    wl.tail.push(mean(&row[seq_len - t..]));
                }
            }
        }
        let tokens = windows.len() * seq_len;
        out.push(LengthLoss {
            multiple: m,
            seq_len,
            rope,
            reweight,
            loss: sum / tokens as f64,
            tokens,
            windows: windows.len(),
            per_window: Some(wl),
        });
    }
    Ok(out)
}

/// Cross-entropy of every target, `(B, T)` in f64 on the CPU, over the model's real vocabulary.
fn token_losses(model: &Gpt, x: &Tensor, y: &Tensor, opts: &ForwardOptions) -> anyhow::Result<Tensor> {
    let logits = model.forward(x, opts)?;
    let v = model.config().vocab_size as i64;
    let (b, t) = (x.size()[0], x.size()[1]);
    let logp = logits.narrow(-1, 0, v).to_kind(Kind::Float).log_softmax(-1, Kind::Float);
    let picked = logp.gather(-1, &y.unsqueeze(-1), false).squeeze_dim(-1);
    Ok((-picked).to_kind(Kind::Double).to_device(Device::Cpu).view([b, t]))
}
