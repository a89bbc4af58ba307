//! Validation loss at `1x .. 16x` the training length (SPEC section 9): every length scores the same
//! validation tokens, one fixed span cut into windows of that length, with plain or NTK-scaled RoPE and
//! optional post-hoc re-weighting; long lengths go through the fused kernels (or the chunked reference)
//! so no `T x T` matrix is ever built.

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
        out.push(LengthLoss { multiple: m, seq_len, rope, reweight, loss, tokens: n, windows });
    }
    Ok(out)
}
