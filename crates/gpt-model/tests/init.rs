//! The two initialisation schemes (`model.init`) draw what their definitions in
//! `gpt_model::config::Init` state, family by family, on a freshly built model.

use gpt_model::config::{Init, ModelConfig};
use gpt_model::model::Gpt;
use tch::Device;
use tch::nn::VarStore;

/// 4 blocks of width 256 (so 65,536 draws in the smallest weight matrix), MLP ratio 4.
fn config(init: Init) -> ModelConfig {
    ModelConfig {
        n_layer: 4,
        n_head: 4,
        d_model: 256,
        vocab_size: 2048,
        context_len: 64,
        init,
        ..ModelConfig::preset("tiny").unwrap()
    }
}

/// Every variable by name, flattened to f64.
fn variables(init: Init, seed: i64) -> Vec<(String, Vec<f64>)> {
    let vs = VarStore::new(Device::Cpu);
    let _model = Gpt::new_seeded(&vs.root(), &config(init), seed).unwrap();
    let mut out: Vec<(String, Vec<f64>)> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, Vec::<f64>::try_from(t.to_kind(tch::Kind::Double).flatten(0, -1)).unwrap()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

fn std(x: &[f64]) -> f64 {
    let m = mean(x);
    (x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / x.len() as f64).sqrt()
}

/// Checks that `x` looks drawn with standard deviation `sd` around 0: its sample sd within 5 standard
/// errors of `sd` (the sd's relative standard error is `sqrt((kurtosis - 1) / (4 n))`: kurtosis 3
/// for a normal, 1.8 for a uniform) and its mean within 5 standard errors of 0.
fn assert_drawn(name: &str, x: &[f64], sd: f64, kurtosis: f64) {
    let n = x.len() as f64;
    let rel = 5.0 * ((kurtosis - 1.0) / (4.0 * n)).sqrt();
    let s = std(x);
    assert!((s / sd - 1.0).abs() < rel, "{name}: sd {s:.6}, expected {sd:.6} within a relative {rel:.4}");
    let m = mean(x);
    assert!(m.abs() < 5.0 * sd / n.sqrt(), "{name}: mean {m:.2e} is not centred (sd {sd:.4}, n {n})");
}

/// A weight family's input width (`fan_in`) and whether it is a residual projection.
fn family(name: &str, d: usize) -> (usize, bool) {
    if name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_attn.bias") {
        (d, false)
    } else if name.ends_with("attn.c_proj.weight") || name.ends_with("attn.c_proj.bias") {
        (d, true)
    } else if name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_fc.bias") {
        (d, false)
    } else if name.ends_with("mlp.c_proj.weight") || name.ends_with("mlp.c_proj.bias") {
        (4 * d, true)
    } else {
        panic!("unexpected linear layer {name}")
    }
}

/// LayerNorms are ones and zeros under both schemes, and the embedding normal(0, 0.02).
fn assert_common(vars: &[(String, Vec<f64>)]) {
    for (name, x) in vars {
        if name.contains("ln_") {
            let want = if name.ends_with(".weight") { 1.0 } else { 0.0 };
            assert!(x.iter().all(|&v| v == want), "{name} is not all {want}");
        } else if name == "wte" {
            assert_drawn(name, x, 0.02, 3.0);
        }
    }
}

#[test]
fn gpt2_init_draws_normal_weights_with_scaled_residual_projections_and_zero_biases() {
    let d = 256;
    let vars = variables(Init::Gpt2, 7);
    assert_common(&vars);
    let mut seen = 0;
    for (name, x) in vars.iter().filter(|(n, _)| n.starts_with("h.") && !n.contains("ln_")) {
        let (_, residual) = family(name, d);
        if name.ends_with(".bias") {
            assert!(x.iter().all(|&v| v == 0.0), "{name}: GPT-2's biases start at zero");
        } else {
            let sd = if residual { 0.02 / (2.0 * 4.0f64).sqrt() } else { 0.02 };
            assert_drawn(name, x, sd, 3.0);
        }
        seen += 1;
    }
    assert_eq!(seen, 4 * 4 * 2, "4 linear layers (weight and bias) per block");
}

#[test]
fn torch_default_init_draws_uniform_weights_and_biases_within_one_over_root_fan_in() {
    let d = 256;
    let vars = variables(Init::TorchDefault, 7);
    assert_common(&vars);
    let mut seen = 0;
    for (name, x) in vars.iter().filter(|(n, _)| n.starts_with("h.") && !n.contains("ln_")) {
        let (fan_in, _) = family(name, d);
        let bound = 1.0 / (fan_in as f64).sqrt();
        let largest = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(largest <= bound * (1.0 + 1e-6), "{name}: |x| up to {largest}, bound {bound}");
        // A uniform draw of n values leaves a gap of about bound / n at each end; 256 values or more
        // reach past 0.9 of the bound with probability 1 - 2 x 0.9^256 (about 1 - 4e-12).
        assert!(largest > 0.9 * bound, "{name}: |x| only up to {largest}, bound {bound}: not the full range");
        assert_drawn(name, x, bound / 3f64.sqrt(), 1.8);
        seen += 1;
    }
    assert_eq!(seen, 4 * 4 * 2, "4 linear layers (weight and bias) per block");
}

#[test]
fn the_scheme_is_a_config_key_that_round_trips_and_rejects_unknown_names() {
    let cfg = config(Init::TorchDefault);
    let text = cfg.to_toml();
    assert!(text.contains("init = \"torch-default\""), "{text}");
    assert_eq!(ModelConfig::from_toml(&text).unwrap().init, Init::TorchDefault);
    // A config written before the key existed reads as GPT-2's.
    let old: String =
        config(Init::Gpt2).to_toml().lines().filter(|l| !l.starts_with("init")).collect::<Vec<_>>().join("\n");
    assert_eq!(ModelConfig::from_toml(&old).unwrap().init, Init::Gpt2);
    let err = ModelConfig::from_toml(&text.replace("torch-default", "xavier")).unwrap_err().to_string();
    assert!(err.contains("xavier"), "{err}");
    // The schemes differ, and each is a function of the seed alone.
    let (a, b) = (variables(Init::Gpt2, 3), variables(Init::TorchDefault, 3));
    assert_ne!(a, b);
    assert_eq!(variables(Init::TorchDefault, 3), b);
}
