//! Attention sinks: per layer, the mean attention weight on the first key and
//! the mean entropy of attention rows, at any evaluation length, plus attention maps of single heads.
//! Weights come from the model's own queries and keys ([`Gpt::forward_probed`]) through the reference
//! weights of the variant (`torch_ops::weights`), in blocks of query rows so that long lengths fit.
//!
//! Rows of variants without an l1 normaliser do not sum to one; their statistics are taken over the
//! row divided by its sum (rows that sum to zero are skipped), so "weight on the first key" is always
//! a share of the row.

use anyhow::Result;
use gpt_model::attention::torch_ops;
use gpt_model::model::{ForwardOptions, Gpt};
use tch::{Kind, Tensor};

/// Query rows per block.
const BLOCK: i64 = 256;

/// One layer's statistics, averaged over heads, batch and query rows `1..T` (row 0 sees one key).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayerSinks {
    /// Mean share of each row's weight on key 0.
    pub first_key: f64,
    /// Mean entropy of a row (nats).
    pub entropy: f64,
}

/// Sums of the statistics of rows of `q` (absolute positions `q_offset..`) against `k`: returns
/// `(sum of first-key shares, sum of entropies, rows counted)`.
fn block_sums(q: &Tensor, k: &Tensor, plan: &attn_core::Plan, q_offset: i64) -> Result<(f64, f64, f64)> {
    let t_q = q.size()[2];
    let w = torch_ops::weights(q, &k.narrow(2, 0, q_offset + t_q), plan, q_offset)?.to_kind(Kind::Double);
    let sum = w.sum_dim_intlist(-1, true, Kind::Double); // (B, H, T_q, 1)
    let valid = sum.gt(0.0);
    let p = &w / sum.where_self(&valid, &sum.ones_like());
    let first = p.select(-1, 0); // (B, H, T_q)
    let plogp = (&p * p.clamp_min(1e-300).log()).where_self(&p.gt(0.0), &p.zeros_like());
    let entropy = -plogp.sum_dim_intlist(-1, false, Kind::Double);
    let mut keep = valid.squeeze_dim(-1); // (B, H, T_q)
    if q_offset == 0 {
        // Row 0 attends to itself only.
        let row0 = keep.zeros_like().to_kind(Kind::Bool);
        let _ = row0.narrow(2, 1, t_q - 1).fill_(1);
        keep = keep.logical_and(&row0);
    }
    let keepf = keep.to_kind(Kind::Double);
    Ok((
        (&first * &keepf).sum(Kind::Double).double_value(&[]),
        (&entropy * &keepf).sum(Kind::Double).double_value(&[]),
        keepf.sum(Kind::Double).double_value(&[]),
    ))
}

/// The statistics of queries `q` and keys `k` (`(B, H, T, d)`, after RoPE) under a variant's `plan`.
pub fn stats_from_qk(q: &Tensor, k: &Tensor, plan: &attn_core::Plan) -> Result<LayerSinks> {
    let t = q.size()[2];
    let (mut first, mut entropy, mut rows) = (0.0, 0.0, 0.0);
    let mut start = 0;
    while start < t {
        let n = BLOCK.min(t - start);
        let (f, e, r) = block_sums(&q.narrow(2, start, n), k, plan, start)?;
        first += f;
        entropy += e;
        rows += r;
        start += n;
    }
    anyhow::ensure!(rows > 0.0, "no attention row with weight to measure (T = {t})");
    Ok(LayerSinks { first_key: first / rows, entropy: entropy / rows })
}

/// Every layer's statistics on the token windows `idx` `(B, T)` with evaluation options `opts`.
pub fn layer_stats(model: &Gpt, idx: &Tensor, opts: &ForwardOptions) -> Result<Vec<LayerSinks>> {
    let mut out: Vec<Result<LayerSinks>> = Vec::new();
    let _logits = tch::no_grad(|| {
        model.forward_probed(idx, opts, &mut |_, q, k, att| out.push(stats_from_qk(q, k, att.plan())))
    })?;
    out.into_iter().collect()
}

/// The `(T, T)` attention map of one head of one layer for the first window of `idx`, rows divided
/// by their sums (for images).
pub fn attention_map(
    model: &Gpt,
    idx: &Tensor,
    opts: &ForwardOptions,
    layer: usize,
    head: i64,
) -> Result<Vec<Vec<f32>>> {
    let mut map: Option<Result<Tensor>> = None;
    let _logits = tch::no_grad(|| {
        model.forward_probed(&idx.narrow(0, 0, 1), opts, &mut |l, q, k, v| {
            if l == layer {
                let (q, k) = (q.narrow(1, head, 1), k.narrow(1, head, 1));
                map = Some(torch_ops::weights(&q, &k, v.plan(), 0).map_err(anyhow::Error::from));
            }
        })
    })?;
    let w = map.ok_or_else(|| anyhow::anyhow!("the model has no layer {layer}"))??.squeeze().to_kind(Kind::Float);
    let sum = w.sum_dim_intlist(-1, true, Kind::Float);
    let w = &w / sum.where_self(&sum.gt(0.0), &sum.ones_like());
    let t = w.size()[0];
    Ok((0..t).map(|i| Vec::<f32>::try_from(&w.get(i)).expect("a float row")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_attention_has_known_sink_share_and_entropy() {
        // Zero queries: every softmax row over keys 0..=i is uniform, so the first-key share of row i
        // is 1/(i+1) and its entropy ln(i+1); averaged over rows 1..T.
        let t = 600; // more than one block of rows
        let q = Tensor::zeros([1, 2, t, 8], (Kind::Float, tch::Device::Cpu));
        let k = gpt_model::model::with_seed(2, || Tensor::randn([1, 2, t, 8], (Kind::Float, tch::Device::Cpu)));
        let s = stats_from_qk(&q, &k, &"softmax".parse::<attn_core::Variant>().unwrap().plan().unwrap()).unwrap();
        let rows = (1..t).map(|i| i as f64 + 1.0);
        let n = (t - 1) as f64;
        let first: f64 = rows.clone().map(|r| 1.0 / r).sum::<f64>() / n;
        let entropy: f64 = rows.map(f64::ln).sum::<f64>() / n;
        assert!((s.first_key - first).abs() < 1e-6, "{} vs {first}", s.first_key);
        assert!((s.entropy - entropy).abs() < 1e-5, "{} vs {entropy}", s.entropy);
    }

    #[test]
    fn a_key_that_takes_all_the_weight_is_a_full_sink() {
        // Key 0 aligned with every query and the others orthogonal: under LSSAR's sharpening almost
        // all of each row's weight goes to key 0, with entropy near 0.
        let t = 64;
        let d = 16;
        let mut qv = vec![0f32; t * d];
        let mut kv = vec![0f32; t * d];
        for i in 0..t {
            qv[i * d] = 1.0;
            if i == 0 {
                kv[0] = 1.0;
            } else {
                kv[i * d + 1 + (i % (d - 1))] = 1.0;
            }
        }
        let q = Tensor::from_slice(&qv).view([1, 1, t as i64, d as i64]);
        let k = Tensor::from_slice(&kv).view([1, 1, t as i64, d as i64]);
        let sharp = stats_from_qk(&q, &k, &"lssa+rw15".parse::<attn_core::Variant>().unwrap().plan().unwrap()).unwrap();
        let soft = stats_from_qk(&q, &k, &"softmax".parse::<attn_core::Variant>().unwrap().plan().unwrap()).unwrap();
        assert!(sharp.first_key > 0.99 && sharp.entropy < 0.1, "{sharp:?}");
        assert!(soft.first_key < sharp.first_key && soft.entropy > sharp.entropy, "{soft:?} vs {sharp:?}");
    }

    #[test]
    fn the_probe_sees_every_layer_and_changes_nothing() {
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let cfg = gpt_model::ModelConfig {
            vocab_size: 64,
            context_len: 32,
            attention: "lssa".parse().unwrap(),
            ..gpt_model::ModelConfig::preset("tiny").unwrap()
        };
        let model = Gpt::new_seeded(&vs.root(), &cfg, 1).unwrap();
        let idx = gpt_model::model::with_seed(3, || Tensor::randint(64, [2, 32], (Kind::Int64, tch::Device::Cpu)));
        let opts = ForwardOptions::default();
        let plain = tch::no_grad(|| model.forward(&idx, &opts)).unwrap();
        let mut seen = Vec::new();
        let probed =
            tch::no_grad(|| model.forward_probed(&idx, &opts, &mut |l, q, k, _| seen.push((l, q.size(), k.size()))))
                .unwrap();
        assert!(plain.allclose(&probed, 0.0, 0.0, false));
        let hd = (cfg.d_model / cfg.n_head) as i64;
        let shape = vec![2, cfg.n_head as i64, 32, hd];
        assert_eq!(seen, (0..cfg.n_layer).map(|l| (l, shape.clone(), shape.clone())).collect::<Vec<_>>());
        let stats = layer_stats(&model, &idx, &opts).unwrap();
        assert_eq!(stats.len(), cfg.n_layer);
        for s in &stats {
            assert!(s.first_key > 0.0 && s.first_key <= 1.0 && s.entropy >= 0.0, "{s:?}");
        }
        let map = attention_map(&model, &idx, &opts, 1, 0).unwrap();
        assert_eq!(map.len(), 32);
        for (i, row) in map.iter().enumerate() {
            let sum: f32 = row.iter().sum();
            assert!((sum - 1.0).abs() < 1e-4, "row {i} sums to {sum}");
            assert!(row[i + 1..].iter().all(|w| *w == 0.0), "row {i} is causal");
        }
    }
}
