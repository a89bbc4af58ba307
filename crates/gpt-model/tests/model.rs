//! The model: config, RoPE, initial loss, overfitting, KV-cache generation, fused vs reference,
//! a full-model f64 gradient check, long-context evaluation without `T x T`, checkpoints.

use std::collections::HashMap;

use gpt_model::attention::path_counts;
use gpt_model::checkpoint::{self, CheckpointError};
use gpt_model::config::{AttnImpl, ConfigError, ModelConfig};
use gpt_model::model::{ForwardOptions, Gpt, KvCache, qkv_heads, qkv_heads_ops, rope, with_seed};
use tch::nn::{self, OptimizerConfig, VarStore};
use tch::{Device, Kind, Tensor};

fn tiny(attention: &str, imp: AttnImpl) -> ModelConfig {
    ModelConfig {
        attention: attention.parse().unwrap(),
        attn_impl: imp,
        vocab_size: 64,
        context_len: 32,
        ..ModelConfig::preset("tiny").unwrap()
    }
}

/// A model initialised from `seed` (tch's generator is process-wide and the tests run on parallel
/// threads: `new_seeded` keeps the weights a function of the seed).
fn build(cfg: &ModelConfig, seed: i64, kind: Kind) -> (VarStore, Gpt) {
    let mut vs = VarStore::new(Device::Cpu);
    let model = Gpt::new_seeded(&vs.root(), cfg, seed).unwrap();
    if kind != Kind::Float {
        vs.set_kind(kind);
    }
    (vs, model)
}

/// Deterministic pseudo-random token ids `(b, t)` below `vocab` (an LCG: no shared RNG state).
fn tokens(b: i64, t: i64, vocab: i64, seed: i64) -> Tensor {
    let mut state = (seed as u64).wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let ids: Vec<i64> = (0..b * t)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) % vocab as u64) as i64
        })
        .collect();
    Tensor::from_slice(&ids).view([b, t])
}

#[test]
fn seeded_weights_do_not_depend_on_other_threads_building_models() {
    // Another thread builds unseeded models (as an evaluation loading a checkpoint does) while this
    // one builds seeded ones: every seeded build must draw the same weights.
    let cfg = tiny("lssa", AttnImpl::Reference);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let differing = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let vs = VarStore::new(Device::Cpu);
                Gpt::new(&vs.root(), &cfg).unwrap();
            }
        });
        let (first, _) = build(&cfg, 7, Kind::Float);
        let first = first.variables();
        let mut differing = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let (vs, _) = build(&cfg, 7, Kind::Float);
            differing.extend(vs.variables().into_iter().filter(|(name, w)| !w.equal(&first[name])).map(|(n, _)| n));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        differing
    });
    assert!(differing.is_empty(), "seeded builds drew other weights for {differing:?}");
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().to_kind(Kind::Double).double_value(&[])
}

#[test]
fn config_presets_toml_and_errors() {
    let gpt2 = ModelConfig::preset("gpt2-124m").unwrap();
    assert_eq!((gpt2.n_layer, gpt2.n_head, gpt2.d_model, gpt2.head_dim()), (12, 12, 768, 64));
    assert_eq!(gpt2.padded_vocab(), 50304); // 50257 padded to a multiple of 64
    // 124M parameters: llm.c's 124,475,904 minus its 786,432 learned position embeddings (we use RoPE).
    assert_eq!(gpt2.n_params(), 124_475_904 - 1024 * 768);
    for name in gpt_model::config::PRESETS {
        let c = ModelConfig::preset(name).unwrap();
        assert_eq!(c.head_dim(), 64, "{name}");
        c.validate().unwrap();
        assert_eq!(ModelConfig::from_toml(&c.to_toml()).unwrap(), c);
    }
    let partial = ModelConfig::from_toml("n_layer = 3\nattention = \"lssa+rw15\"\n").unwrap();
    assert_eq!((partial.n_layer, partial.d_model), (3, 768));
    for (name, imp) in
        [("reference", AttnImpl::Reference), ("fused", AttnImpl::Fused), ("fused-own", AttnImpl::FusedOwn)]
    {
        assert_eq!(ModelConfig::from_toml(&format!("attn_impl = \"{name}\"\n")).unwrap().attn_impl, imp, "{name}");
    }
    let err = ModelConfig::from_toml("n_layers = 3\n").unwrap_err();
    assert!(matches!(err, ConfigError::Toml(_)) && err.to_string().contains("n_layers"), "{err}");
    let err = ModelConfig::from_toml("attention = \"lsa\"\n").unwrap_err();
    assert!(err.to_string().contains("attention") && err.to_string().contains("lssa"), "{err}");
    let err = ModelConfig::from_toml("n_head = 5\n").unwrap_err();
    assert!(err.to_string().contains("n_head"), "{err}");
    assert!(ModelConfig::preset("gpt3").unwrap_err().to_string().contains("gpt2-124m"));
}

#[test]
fn rope_matches_attn_core_and_depends_only_on_relative_position() {
    let (b, h, t, d) = (1usize, 2usize, 7usize, 8usize);
    // Random draws go through `with_seed`: a bare draw from the process-wide generator, on a test
    // thread, lands between another test's seeding and its initialisation (11 runs of this file in 40
    // failed that way).
    let x = with_seed(1, || Tensor::randn([b as i64, h as i64, t as i64, d as i64], (Kind::Double, Device::Cpu)));
    let base = 10000.0;
    let inv = attn_core::rope::rope_inv_freq(base, d).unwrap();
    let pos = Tensor::arange(t as i64, (Kind::Double, Device::Cpu));
    let ang = pos.unsqueeze(1) * Tensor::from_slice(&inv).unsqueeze(0);
    let ours = rope(&x, &ang.cos(), &ang.sin());
    let xa: Vec<f64> = Vec::try_from(x.flatten(0, -1)).unwrap();
    let xa = ndarray::Array4::from_shape_vec((b, h, t, d), xa).unwrap();
    let theirs = attn_core::rope::rope_apply(&xa, base, 0).unwrap();
    let theirs = Tensor::from_slice(theirs.as_slice().unwrap()).view([b as i64, h as i64, t as i64, d as i64]);
    assert!(max_diff(&ours, &theirs) < 1e-12);
    // <R(m) q, R(n) k> depends only on m - n.
    let (q, k) = with_seed(2, || {
        let opts = (Kind::Double, Device::Cpu);
        (Tensor::randn([1, 1, 1, d as i64], opts), Tensor::randn([1, 1, 1, d as i64], opts))
    });
    let at = |p: f64| {
        let a = Tensor::from_slice(&inv.iter().map(|f| f * p).collect::<Vec<_>>()).unsqueeze(0);
        (a.cos(), a.sin())
    };
    let score = |m: f64, n: f64| {
        let ((cm, sm), (cn, sn)) = (at(m), at(n));
        (rope(&q, &cm, &sm) * rope(&k, &cn, &sn)).sum(Kind::Double).double_value(&[])
    };
    assert!((score(5.0, 2.0) - score(105.0, 102.0)).abs() < 1e-9);
    assert!((score(5.0, 2.0) - score(6.0, 2.0)).abs() > 1e-6, "scores must depend on the offset");
    // NTK: s = 1 leaves the base unchanged; s > 1 follows b s^(d/(d-2)).
    assert_eq!(attn_core::rope::ntk_rope_base(base, 64, 1.0), base);
    assert!((attn_core::rope::ntk_rope_base(base, 64, 16.0) - base * 16f64.powf(64.0 / 62.0)).abs() < 1e-6);
}

/// Values and gradients of `qkv_heads` (the fused node on the CPU) and of `qkv_heads_ops`, for a
/// projection `(b, t, 3 h hd)`, with upstream gradients applied to whichever of q, k, v `use_` keeps.
/// The gradient of q reaches the node through a `.contiguous()` (as from the fused attention, whose dq
/// is (B, H, T, hd) memory); k's and v's directly (as from SDPA).
fn rotated_heads(kind: Kind, (b, t, h, hd): (i64, i64, i64, i64), use_: [bool; 3], fused: bool) -> Vec<Tensor> {
    let opts = (kind, Device::Cpu);
    let (x0, ups) = with_seed(8, || {
        let x = Tensor::randn([b, t, 3 * h * hd], opts);
        (x, [0, 1, 2].map(|_| Tensor::randn([b, h, t, hd], opts)))
    });
    let inv = attn_core::rope::rope_inv_freq(10000.0, hd as usize).unwrap();
    let ang =
        (Tensor::arange(t, (Kind::Double, Device::Cpu)) + 3.0).unsqueeze(1) * Tensor::from_slice(&inv).unsqueeze(0);
    let (cos, sin) = (ang.cos().to_kind(kind), ang.sin().to_kind(kind));
    let x = x0.detach().set_requires_grad(true);
    let (q, k, v) = if fused { qkv_heads(&x, &cos, &sin, h) } else { qkv_heads_ops(&x, &cos, &sin, h) }.unwrap();
    let q = q.contiguous();
    let terms: Vec<Tensor> = [&q, &k, &v]
        .into_iter()
        .zip(&ups)
        .zip(use_)
        .filter(|(_, used)| *used)
        .map(|((out, up), _)| (out * up).sum(kind))
        .collect();
    Tensor::stack(&terms, 0).sum(kind).backward();
    vec![q, k, v, x.grad()]
}

#[test]
fn qkv_heads_fused_equals_the_tensor_ops_in_value_and_gradient() {
    for (kind, tol) in [(Kind::Double, 1e-13), (Kind::Float, 1e-5)] {
        for shape in [(2, 5, 3, 4), (3, 17, 2, 64), (1, 1, 1, 2)] {
            for use_ in [[true; 3], [true, true, false], [false, false, true]] {
                let fused = rotated_heads(kind, shape, use_, true);
                let ops = rotated_heads(kind, shape, use_, false);
                for (name, (a, b)) in ["q", "k", "v", "d qkv"].iter().zip(fused.iter().zip(&ops)) {
                    assert_eq!(a.size(), b.size(), "{name} {kind:?} {shape:?}");
                    let err = max_diff(a, b);
                    assert!(err < tol, "{name}: {kind:?} {shape:?} {use_:?} differs by {err}");
                }
                // A part of the projection that feeds no used output gets an exactly zero gradient.
                let grad = &fused[3];
                let width = grad.size()[2] / 3;
                for (j, used) in use_.iter().enumerate() {
                    let part = grad.narrow(2, j as i64 * width, width).abs().sum(Kind::Double).double_value(&[]);
                    assert_eq!(part == 0.0, !used, "{shape:?} {use_:?}: part {j} of the gradient");
                }
            }
        }
    }
}

#[test]
fn qkv_heads_rotates_q_and_k_by_rope_and_copies_v() {
    let (b, t, h, hd) = (2i64, 6i64, 2i64, 8i64);
    let x = with_seed(9, || Tensor::randn([b, t, 3 * h * hd], (Kind::Double, Device::Cpu)));
    let inv = attn_core::rope::rope_inv_freq(500.0, hd as usize).unwrap();
    let ang = Tensor::arange(t, (Kind::Double, Device::Cpu)).unsqueeze(1) * Tensor::from_slice(&inv).unsqueeze(0);
    let (q, k, v) = qkv_heads(&x, &ang.cos(), &ang.sin(), h).unwrap();
    // attn-core's rotation, on the heads cut out of the projection by hand.
    let head = |j: i64| x.narrow(2, j * h * hd, h * hd).view([b, t, h, hd]).permute([0, 2, 1, 3]).contiguous();
    for (j, got) in [(0, &q), (1, &k)] {
        let xa: Vec<f64> = Vec::try_from(head(j).flatten(0, -1)).unwrap();
        let xa = ndarray::Array4::from_shape_vec((b as usize, h as usize, t as usize, hd as usize), xa).unwrap();
        let want = attn_core::rope::rope_apply(&xa, 500.0, 0).unwrap();
        let want = Tensor::from_slice(want.as_slice().unwrap()).view([b, h, t, hd]);
        assert!(max_diff(got, &want) < 1e-12, "part {j}");
    }
    assert_eq!(max_diff(&v, &head(2)), 0.0);
}

#[test]
fn qkv_heads_refuses_bad_shapes_with_a_message() {
    let opts = (Kind::Float, Device::Cpu);
    let table = Tensor::zeros([4, 2], opts);
    for fused in [true, false] {
        let call = |x: &Tensor, c: &Tensor, h: i64| {
            if fused { qkv_heads(x, c, c, h) } else { qkv_heads_ops(x, c, c, h) }.map(|_| ()).unwrap_err()
        };
        let err = call(&Tensor::zeros([2, 4, 25], opts), &table, 2);
        assert!(err.contains("3 x heads"), "{err}");
        let err = call(&Tensor::zeros([2, 4, 18], opts), &table, 2); // head dim 3
        assert!(err.contains("head dim"), "{err}");
        let err = call(&Tensor::zeros([4, 24], opts), &table, 2);
        assert!(err.contains("(B, T, 3d)"), "{err}");
        let err = call(&Tensor::zeros([2, 4, 24], opts), &Tensor::zeros([3, 2], opts), 2);
        assert!(err.contains("RoPE tables"), "{err}");
    }
}

#[test]
fn initial_loss_is_close_to_ln_vocab() {
    let cfg = ModelConfig { vocab_size: 512, ..tiny("lssa", AttnImpl::Fused) };
    let (_vs, model) = build(&cfg, 0, Kind::Float);
    let x = tokens(4, 32, 512, 1);
    let y = tokens(4, 32, 512, 2);
    let loss = model.loss(&x, &y, &ForwardOptions::default()).unwrap().double_value(&[]);
    assert!((loss - 512f64.ln()).abs() < 0.1, "loss {loss} vs ln(512) {}", 512f64.ln());
}

#[test]
fn tiny_model_overfits_one_sequence() {
    for attention in ["softmax", "lssa", "lssa+rw15"] {
        let cfg = tiny(attention, AttnImpl::Fused);
        let (vs, model) = build(&cfg, 3, Kind::Float);
        let seq = tokens(1, 65, 64, 4);
        let (x, y) = (seq.narrow(1, 0, 64), seq.narrow(1, 1, 64));
        let mut opt = nn::AdamW::default().build(&vs, 3e-3).unwrap();
        let mut loss = f64::INFINITY;
        for _ in 0..150 {
            let l = model.loss(&x, &y, &ForwardOptions::default()).unwrap();
            opt.backward_step(&l);
            loss = l.double_value(&[]);
        }
        // From ln 64 = 4.16. Softmax and LSSA reach about 0.005 here; LSSAR (p = 15) levels off near
        // 0.05 (0.052 at step 150, 0.048 at 250, measured at 24e9a76), where a bound of 0.05 failed
        // on rounding alone. 0.1 keeps 2x margin to that floor and 40x to the start.
        assert!(loss < 0.1, "{attention}: loss after 150 steps {loss}");
    }
}

#[test]
fn kv_cache_generation_matches_the_full_forward() {
    for attention in ["softmax", "lssa", "lssa+rw15", "sigmoid-rowbias-l1+rw3"] {
        let cfg = tiny(attention, AttnImpl::Reference);
        let (_vs, model) = build(&cfg, 5, Kind::Double);
        let x = tokens(1, 20, 64, 6);
        let opts = ForwardOptions::default();
        let _g = tch::no_grad_guard();
        let full = model.forward(&x, &opts).unwrap();
        let mut cache = KvCache::default();
        let first = model.forward_cached(&x.narrow(1, 0, 5), &mut cache, &opts).unwrap();
        let mut pieces = vec![first];
        for t in 5..20 {
            pieces.push(model.forward_cached(&x.narrow(1, t, 1), &mut cache, &opts).unwrap());
        }
        let cached = Tensor::cat(&pieces, 1);
        assert!(max_diff(&full, &cached) < 1e-10, "{attention}: {}", max_diff(&full, &cached));
        // Greedy generation is deterministic and extends the prompt.
        let out = model.generate(&[1, 2, 3], 5, None, &opts).unwrap();
        assert_eq!(out.len(), 8);
        assert_eq!(out, model.generate(&[1, 2, 3], 5, None, &opts).unwrap());
    }
}

/// A user's activation: softplus written out by hand under a name of its own.
#[derive(Debug)]
struct HandSoftplus;

impl attn_core::Activation for HandSoftplus {
    fn name(&self) -> &str {
        "hand-softplus"
    }
    fn value(&self, x: f64) -> f64 {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }
    fn derivative(&self, x: f64) -> f64 {
        1.0 / (1.0 + (-x).exp())
    }
    fn is_non_negative(&self) -> bool {
        true
    }
}

#[test]
fn a_custom_activation_trains_fused_on_the_cpu_and_decodes_with_the_kv_cache() {
    let variant =
        attn_core::Variant::builder().preset("lssa").unwrap().activation(HandSoftplus).reweight(3).build().unwrap();
    let cfg = tiny("lssa+rw3", AttnImpl::Fused);
    let vs = VarStore::new(Device::Cpu);
    let model = gpt_model::model::with_seed(7, || Gpt::with_variant(&vs.root(), &cfg, variant)).unwrap();
    assert!(model.config().attention.to_string().starts_with("custom("), "{}", model.config().attention);
    let (builtin_vs, builtin) = build(&cfg, 7, Kind::Float); // the same weights, the built-in softplus
    let seq = tokens(2, 33, 64, 8);
    let (x, y) = (seq.narrow(1, 0, 32), seq.narrow(1, 1, 32));
    let opts = ForwardOptions::default();

    // The fused CPU kernels run it (through its own f64 methods) and agree with the built-in.
    let fused_before = path_counts().fused;
    let logits = model.forward(&x, &opts).unwrap();
    assert_eq!(path_counts().fused - fused_before, cfg.n_layer, "every layer ran fused");
    let want = builtin.forward(&x, &opts).unwrap();
    assert!(max_diff(&logits, &want) < 1e-4, "custom vs built-in softplus: {}", max_diff(&logits, &want));
    drop(builtin_vs);

    // It trains.
    let mut opt = nn::AdamW::default().build(&vs, 3e-3).unwrap();
    let first = model.loss(&x, &y, &opts).unwrap().double_value(&[]);
    let mut last = first;
    for _ in 0..40 {
        let l = model.loss(&x, &y, &opts).unwrap();
        opt.backward_step(&l);
        last = l.double_value(&[]);
    }
    assert!(last < first - 1.0, "loss {first} -> {last}");

    // KV-cached decoding (the fused kernels again, on query rows that continue the cache) equals the
    // full fused forward, and never materialises a row.
    let _g = tch::no_grad_guard();
    let full = model.forward(&x, &opts).unwrap();
    let before = path_counts();
    let mut cache = KvCache::default();
    let mut pieces = vec![model.forward_cached(&x.narrow(1, 0, 4), &mut cache, &opts).unwrap()];
    for t in 4..32 {
        pieces.push(model.forward_cached(&x.narrow(1, t, 1), &mut cache, &opts).unwrap());
    }
    let after = path_counts();
    assert_eq!(after.fused - before.fused, 29 * cfg.n_layer, "every cached step of every layer ran fused");
    assert_eq!((after.reference_full, after.reference_chunked), (before.reference_full, before.reference_chunked));
    let cached = Tensor::cat(&pieces, 1);
    assert!(max_diff(&full, &cached) < 1e-4, "cached vs full: {}", max_diff(&full, &cached));
    let out = model.generate(&[1, 2, 3], 6, None, &opts).unwrap();
    assert_eq!(out.len(), 9);
}

/// relu-seqlen divides each row by the length of the window being processed, so a position's
/// hidden state depends on the window it was computed in, and the KV cache (whose step `t` divides
/// by the `t + 1` keys so far) cannot equal one full forward. What holds: a cached step is the last
/// row of a full forward over its prefix when nothing else came from another window (one layer);
/// with more layers the cached keys and values of earlier positions were computed in shorter
/// windows, and token-by-token decoding is exactly relu-rowlen's full forward (`L = N_i` on every
/// row and layer).
#[test]
fn kv_cache_with_relu_seqlen_is_the_last_row_of_each_prefix() {
    let opts = ForwardOptions::default();
    let _g = tch::no_grad_guard();
    let x = tokens(1, 20, 64, 6);
    // One layer: the cached step t equals the last row of the full forward over tokens 0..=t.
    let cfg = ModelConfig { n_layer: 1, ..tiny("relu-seqlen", AttnImpl::Reference) };
    let (_vs, model) = build(&cfg, 5, Kind::Double);
    let mut cache = KvCache::default();
    let first = model.forward_cached(&x.narrow(1, 0, 5), &mut cache, &opts).unwrap();
    let prefix = model.forward(&x.narrow(1, 0, 5), &opts).unwrap();
    assert!(max_diff(&first, &prefix) < 1e-10, "prefill: {}", max_diff(&first, &prefix));
    for t in 5..20 {
        let step = model.forward_cached(&x.narrow(1, t, 1), &mut cache, &opts).unwrap();
        let last = model.forward(&x.narrow(1, 0, t + 1), &opts).unwrap().narrow(1, t, 1);
        assert!(max_diff(&step, &last) < 1e-10, "step {t}: {}", max_diff(&step, &last));
    }
    // Two layers, token by token: relu-rowlen's full forward, and not relu-seqlen's.
    let cfg = tiny("relu-seqlen", AttnImpl::Reference);
    assert!(cfg.n_layer >= 2);
    let (_vs, seqlen) = build(&cfg, 5, Kind::Double);
    let (_vs2, rowlen) = build(&tiny("relu-rowlen", AttnImpl::Reference), 5, Kind::Double);
    let mut cache = KvCache::default();
    let steps: Vec<Tensor> =
        (0..20).map(|t| seqlen.forward_cached(&x.narrow(1, t, 1), &mut cache, &opts).unwrap()).collect();
    let cached = Tensor::cat(&steps, 1);
    let by_rowlen = rowlen.forward(&x, &opts).unwrap();
    assert!(max_diff(&cached, &by_rowlen) < 1e-10, "{}", max_diff(&cached, &by_rowlen));
    let by_seqlen = seqlen.forward(&x, &opts).unwrap();
    assert!(max_diff(&cached, &by_seqlen) > 1e-6, "relu-seqlen's full forward does not depend on the window?");
}

#[test]
fn fused_and_reference_agree_on_logits_loss_and_every_gradient() {
    // Every variant of Tables 3 and 4 (sigmoid-bias gets T_train from the config).
    for attention in [
        "softmax",
        "relu-l1",
        "relu2-l1",
        "relu6-l1",
        "gelu-l1",
        "sigmoid-l1",
        "softplus-l1",
        "mish-l1",
        "sigmoid-bias",
        "sigmoid-rowbias",
        "sigmoid-rowbias-l1",
        "relu-seqlen",
        "relu-rowlen",
        "relu-ln",
        "lssa",
        "softmax+rw3",
        "sigmoid-rowbias-l1+rw3",
        "lssa+rw3",
        "softmax+rw15",
        "sigmoid-rowbias-l1+rw15",
        "lssa+rw15",
    ] {
        // One model, both implementations (ForwardOptions::attn_impl), so the weights are identical.
        let cfg = tiny(attention, AttnImpl::Reference);
        let (vs, model) = build(&cfg, 7, Kind::Float);
        let x = tokens(2, 24, 64, 8);
        let y = tokens(2, 24, 64, 9);
        let mut grads = Vec::new();
        let mut losses = Vec::new();
        // FusedOwn: our kernel for every variant (Fused would run libtorch's SDPA for short softmax rows).
        for imp in [AttnImpl::Reference, AttnImpl::FusedOwn] {
            let before = path_counts();
            let opts = ForwardOptions { attn_impl: Some(imp), ..Default::default() };
            let loss = model.loss(&x, &y, &opts).unwrap();
            let took = path_counts();
            let fused_calls = took.fused - before.fused;
            assert_eq!(
                fused_calls,
                if imp == AttnImpl::FusedOwn { cfg.n_layer } else { 0 },
                "{attention} {imp:?}: path taken"
            );
            vs.trainable_variables().iter_mut().for_each(|v| v.zero_grad());
            loss.backward();
            losses.push(loss.double_value(&[]));
            let mut g: Vec<(String, Tensor)> = vs.variables().into_iter().map(|(n, v)| (n, v.grad().copy())).collect();
            g.sort_by(|a, b| a.0.cmp(&b.0));
            grads.push(g);
        }
        assert!((losses[0] - losses[1]).abs() < 1e-5, "{attention}: loss {} vs {}", losses[0], losses[1]);
        for ((name, a), (_, b)) in grads[0].iter().zip(&grads[1]) {
            let scale = a.abs().max().double_value(&[]).max(1e-3);
            let err = max_diff(a, b);
            assert!(err <= 2e-4 * scale, "{attention}: gradient of {name} differs by {err} (scale {scale})");
        }
    }
}

#[test]
fn full_model_gradients_match_finite_differences_in_f64() {
    for attention in ["softmax", "lssa", "lssa+rw3"] {
        let cfg = ModelConfig {
            n_layer: 1,
            n_head: 2,
            d_model: 16,
            vocab_size: 11,
            context_len: 6,
            attention: attention.parse().unwrap(),
            attn_impl: AttnImpl::Reference,
            ..ModelConfig::preset("tiny").unwrap()
        };
        let (vs, model) = build(&cfg, 11, Kind::Double);
        let x = tokens(1, 6, 11, 12);
        let y = tokens(1, 6, 11, 13);
        let opts = ForwardOptions::default();
        let loss_f64 = |m: &Gpt| {
            let logits = m.forward(&x, &opts).unwrap().narrow(-1, 0, 11).to_kind(Kind::Double);
            logits
                .reshape([-1, 11])
                .log_softmax(-1, Kind::Double)
                .gather(1, &y.reshape([-1, 1]), false)
                .mean(Kind::Double)
                .neg()
        };
        loss_f64(&model).backward();
        let vars = vs.variables();
        for name in ["wte", "h.0.attn.c_attn.weight", "h.0.mlp.c_fc.bias", "ln_f.weight"] {
            let mut var = vars[name].shallow_clone();
            let grad = var.grad();
            let n = var.numel() as i64;
            for idx in [0, n / 3, n - 1] {
                let flat = var.view([-1]);
                let orig = flat.double_value(&[idx]);
                let eps = 1e-6;
                let at = |val: f64| {
                    let _g = tch::no_grad_guard();
                    let _ = var.view([-1]).get(idx).fill_(val);
                    loss_f64(&model).double_value(&[])
                };
                let numeric = (at(orig + eps) - at(orig - eps)) / (2.0 * eps);
                at(orig);
                let analytic = grad.view([-1]).double_value(&[idx]);
                let err = (numeric - analytic).abs() / analytic.abs().max(1e-4);
                assert!(err < 1e-5, "{attention} {name}[{idx}]: autograd {analytic} vs finite differences {numeric}");
                let _ = &mut var;
            }
        }
    }
}

#[test]
fn long_context_evaluation_never_materialises_t_by_t() {
    let cfg = tiny("lssa+rw15", AttnImpl::Fused);
    let (_vs, model) = build(&cfg, 14, Kind::Float);
    let t = 16 * cfg.context_len as i64; // 16x the training length
    let x = tokens(1, t, 64, 15);
    let before = path_counts();
    let opts = ForwardOptions { length_scale: Some(16.0), ntk: true, ..Default::default() };
    let logits = tch::no_grad(|| model.forward(&x, &opts).unwrap());
    assert!(logits.isfinite().all().int64_value(&[]) == 1);
    let after = path_counts();
    assert_eq!(after.reference_full, before.reference_full, "a T x T weight matrix was materialised");
    assert!(after.fused >= before.fused + cfg.n_layer);
    // The reference implementation evaluates long contexts chunked, also without T x T.
    let cfg_ref = ModelConfig { attn_impl: AttnImpl::Reference, ..cfg.clone() };
    let (_vs2, model_ref) = build(&cfg_ref, 14, Kind::Float);
    let before = path_counts();
    let logits_ref = tch::no_grad(|| model_ref.forward(&x, &opts).unwrap());
    let after = path_counts();
    assert_eq!(after.reference_full, before.reference_full);
    assert!(after.reference_chunked >= before.reference_chunked + cfg.n_layer);
    assert!(max_diff(&logits, &logits_ref) < 1e-3, "{}", max_diff(&logits, &logits_ref));
}

#[test]
fn post_hoc_reweighting_changes_the_model_without_retraining() {
    let cfg = tiny("lssa", AttnImpl::Fused);
    let (_vs, model) = build(&cfg, 16, Kind::Float);
    let x = tokens(1, 32, 64, 17);
    let _g = tch::no_grad_guard();
    let plain = model.forward(&x, &ForwardOptions::default()).unwrap();
    let rw = model.forward(&x, &ForwardOptions { reweight: Some(15), ..Default::default() }).unwrap();
    assert!(max_diff(&plain, &rw) > 1e-4);
    // ... and equals a model configured as lssa+rw15 with the same weights.
    let cfg15 = tiny("lssa+rw15", AttnImpl::Fused);
    let (_vs15, model15) = build(&cfg15, 16, Kind::Float);
    let d15 = max_diff(&rw, &model15.forward(&x, &ForwardOptions::default()).unwrap());
    assert!(d15 < 1e-6, "{d15}");
}

#[test]
fn checkpoints_round_trip_and_refuse_another_model() {
    let dir = std::env::temp_dir().join(format!("gpt-model-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    let cfg = tiny("lssa+rw15", AttnImpl::Fused);
    let (vs, model) = build(&cfg, 18, Kind::Float);
    let extra = HashMap::from([("step".to_string(), "42".to_string())]);
    checkpoint::save(&vs, &cfg, &extra, &path).unwrap();
    let (mut vs2, model2) = build(&cfg, 19, Kind::Float);
    let x = tokens(1, 16, 64, 20);
    let _g = tch::no_grad_guard();
    assert!(
        max_diff(&model.forward(&x, &Default::default()).unwrap(), &model2.forward(&x, &Default::default()).unwrap())
            > 1e-3
    );
    let meta = checkpoint::load(&mut vs2, &cfg, &path).unwrap();
    assert_eq!(meta["step"], "42");
    assert_eq!(meta["variant"], "lssa+rw15");
    assert_eq!(model.forward(&x, &Default::default()).unwrap(), model2.forward(&x, &Default::default()).unwrap());
    assert_eq!(checkpoint::read_config(&path).unwrap(), cfg);
    // Another model: refused, naming the field.
    let other = ModelConfig { attention: "softmax".parse().unwrap(), ..cfg.clone() };
    let (mut vs3, _m3) = build(&other, 21, Kind::Float);
    let err = checkpoint::load(&mut vs3, &other, &path).unwrap_err();
    assert!(matches!(&err, CheckpointError::ConfigMismatch { field, .. } if field == "attention"), "{err}");
    assert!(err.to_string().contains("model.safetensors"));
    // Not a checkpoint.
    std::fs::write(dir.join("junk.safetensors"), b"not a checkpoint").unwrap();
    assert!(matches!(
        checkpoint::load(&mut vs3, &other, &dir.join("junk.safetensors")),
        Err(CheckpointError::Format { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}
