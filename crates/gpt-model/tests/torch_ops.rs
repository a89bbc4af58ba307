//! Tests of the materialised tch attention (`gpt_model::attention::torch_ops`): against the `attn-core`
//! f64 reference (forward and backward), and independent checks that need no reference (row 1, causal
//! distributions, the empty-row fall-back, sharpening, causality, finite differences).

use std::sync::Arc;

use attn_core::{Activation, Variant};
use gpt_model::attention::torch_ops;
use ndarray::{Array4, ArrayView4};
use tch::{Device, Kind, Tensor};

// ---------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------

/// Deterministic pseudo-normal numbers (splitmix64, sum of 4 uniforms), so every test sees fixed data
/// whatever order the test threads run in (tch's global RNG is shared between threads).
fn pseudo_normal(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    let mut uniform = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    };
    // Sum of 4 uniforms on [0,1): mean 2, variance 1/3; rescaled to mean 0, variance 1.
    (0..n).map(|_| ((0..4).map(|_| uniform()).sum::<f64>() - 2.0) * 3f64.sqrt()).collect()
}

/// A `(B, H, T, d)` f64 tensor of pseudo-normal numbers times `scale`.
fn input(shape: [i64; 4], seed: u64, scale: f64) -> Tensor {
    let n = shape.iter().product::<i64>() as usize;
    Tensor::from_slice(&pseudo_normal(n, seed)).reshape(shape) * scale
}

fn to_array(t: &Tensor) -> Array4<f64> {
    let size: Vec<usize> = t.size().iter().map(|&s| s as usize).collect();
    let data = Vec::<f64>::try_from(t.to_kind(Kind::Double).contiguous().view([-1])).expect("f64 tensor to vec");
    Array4::from_shape_vec((size[0], size[1], size[2], size[3]), data).expect("4-D shape")
}

fn to_tensor(a: ArrayView4<'_, f64>) -> Tensor {
    let shape: Vec<i64> = a.shape().iter().map(|&s| s as i64).collect();
    Tensor::from_slice(&a.iter().copied().collect::<Vec<_>>()).reshape(shape)
}

/// Runs a variant by name through `torch_ops` (the names `attn-core` parses).
fn torch_forward(name: &str, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
    let (base, p) = match name.split_once("+rw") {
        Some((base, p)) => (base, Some(p.parse::<u32>().expect("p is an integer"))),
        None => (name, None),
    };
    match base {
        "lssa" => torch_ops::lssa(q, k, v, p),
        "softmax" => torch_ops::softmax(q, k, v, p),
        other => panic!("torch_ops has no variant `{other}` yet"),
    }
}

/// Largest absolute difference, scaled by the largest magnitude of `want` (at least 1).
fn rel_err(got: &Tensor, want: &Tensor) -> f64 {
    let diff = f64::try_from((got - want).abs().max()).unwrap();
    let scale = f64::try_from(want.abs().max()).unwrap().max(1.0);
    diff / scale
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.size(), want.size(), "{what}: shapes differ");
    let err = rel_err(got, want);
    assert!(err <= tol, "{what}: relative error {err:e} > {tol:e}");
}

const VARIANTS: [&str; 5] = ["softmax", "lssa", "lssa+rw3", "lssa+rw15", "softmax+rw3"];

/// (shape, seed, input scale): awkward sizes (a single row, head dims 8/40/72, T not a power of two)
/// and large-logit inputs for softmax.
const CASES: [([i64; 4], u64, f64); 5] = [
    ([1, 1, 1, 8], 1, 1.0),
    ([2, 3, 17, 8], 2, 1.0),
    ([1, 2, 40, 72], 3, 1.0),
    ([1, 1, 70, 40], 4, 1.0),
    ([1, 2, 33, 16], 5, 6.0),
];

// ---------------------------------------------------------------------------------------------------
// Against the attn-core f64 reference
// ---------------------------------------------------------------------------------------------------

fn check_against_reference(name: &str, q: &Tensor, k: &Tensor, v: &Tensor, g: &Tensor, label: &str) {
    let variant: Variant = name.parse().unwrap_or_else(|e| panic!("attn-core does not parse `{name}`: {e:?}"));
    let (qa, ka, va, ga) = (to_array(q), to_array(k), to_array(v), to_array(g));

    let want = attn_core::forward(&variant, qa.view(), ka.view(), va.view()).expect("attn-core forward");
    let (qg, kg, vg) = (q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true));
    let out = torch_forward(name, &qg, &kg, &vg);
    assert_close(&format!("{name} {label} forward"), &out.detach(), &to_tensor(want.view()), 1e-10);

    let grads = attn_core::backward(&variant, qa.view(), ka.view(), va.view(), ga.view()).expect("attn-core backward");
    let loss = (&out * g).sum(Kind::Double); // dL/do = g
    let got = Tensor::run_backward(&[loss], &[&qg, &kg, &vg], false, false);
    for (which, got, want) in [("dq", &got[0], &grads.dq), ("dk", &got[1], &grads.dk), ("dv", &got[2], &grads.dv)] {
        assert_close(&format!("{name} {label} {which}"), got, &to_tensor(want.view()), 1e-8);
    }
}

#[test]
fn forward_and_backward_match_attn_core_f64() {
    for name in VARIANTS {
        for (shape, seed, scale) in CASES {
            let q = input(shape, 10 * seed, scale);
            let k = input(shape, 10 * seed + 1, scale);
            let v = input(shape, 10 * seed + 2, 1.0);
            let g = input(shape, 10 * seed + 3, 1.0);
            check_against_reference(name, &q, &k, &v, &g, &format!("{shape:?} x{scale}"));
        }
    }
}

#[test]
fn zero_queries_match_attn_core_including_the_empty_row_fallback() {
    // q = 0 gives cosine 0, so every LSSA row is exactly uniform and every row past 3 is "empty" in
    // the re-weighting stage: the fall-back w = a must agree with the reference, gradients included.
    let shape = [1, 2, 12, 8];
    let q = Tensor::zeros(shape, (Kind::Double, Device::Cpu));
    let (k, v, g) = (input(shape, 7, 1.0), input(shape, 8, 1.0), input(shape, 9, 1.0));
    for name in ["lssa", "lssa+rw15"] {
        check_against_reference(name, &q, &k, &v, &g, "zero q");
    }
}

// ---------------------------------------------------------------------------------------------------
// Independent checks (no reference needed)
// ---------------------------------------------------------------------------------------------------

#[test]
fn row_one_output_is_its_own_value() {
    let shape = [2, 3, 9, 16];
    let (q, k, v) = (input(shape, 21, 3.0), input(shape, 22, 3.0), input(shape, 23, 1.0));
    for name in VARIANTS {
        let out = torch_forward(name, &q, &k, &v);
        assert_close(&format!("{name} row 1"), &out.narrow(2, 0, 1), &v.narrow(2, 0, 1), 1e-14);
    }
}

/// Non-negative, zero above the diagonal, rows summing to one.
fn assert_causal_distribution(what: &str, w: &Tensor) {
    let t = w.size()[2];
    let min = f64::try_from(w.min()).unwrap();
    assert!(min >= 0.0, "{what}: negative weight {min}");
    let above = f64::try_from(w.triu(1).abs().max()).unwrap();
    assert_eq!(above, 0.0, "{what}: weight on a future key");
    let sums = w.sum_dim_intlist(&[-1i64][..], false, Kind::Double);
    assert_close(&format!("{what} row sums"), &sums, &sums.ones_like(), 1e-14);
    assert!(t > 1);
}

#[test]
fn weights_are_causal_distributions() {
    let shape = [1, 4, 50, 32];
    let (q, k) = (input(shape, 31, 2.0), input(shape, 32, 2.0));
    let lssa = torch_ops::lssa_weights(&q, &k);
    let softmax = torch_ops::softmax_weights(&q, &k);
    assert_causal_distribution("lssa", &lssa);
    assert_causal_distribution("softmax", &softmax);
    for p in [1, 3, 15] {
        assert_causal_distribution(&format!("lssa+rw{p}"), &torch_ops::reweight(&lssa, p));
        assert_causal_distribution(&format!("softmax+rw{p}"), &torch_ops::reweight(&softmax, p));
    }
}

#[test]
fn lssa_weights_match_a_hand_computation() {
    // T = 3, d = 4: row i has scale ln(4) ln(i) and cosine scores; compute every weight by hand.
    let qv = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]];
    let kv = [[0.0, 3.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]];
    let q = Tensor::from_slice(qv.as_flattened()).reshape([1, 1, 3, 4]);
    let k = Tensor::from_slice(kv.as_flattened()).reshape([1, 1, 3, 4]);
    let w = to_array(&torch_ops::lssa_weights(&q, &k));
    let norm = |x: &[f64; 4]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
    let softplus = |x: f64| (1.0 + x.exp()).ln();
    for i in 0..3 {
        let scale = 4f64.ln() * ((i + 1) as f64).ln();
        let f: Vec<f64> = (0..=i)
            .map(|j| {
                let cos = (0..4).map(|c| qv[i][c] * kv[j][c]).sum::<f64>() / (norm(&qv[i]) * norm(&kv[j]));
                softplus(scale * cos)
            })
            .collect();
        let z: f64 = f.iter().sum();
        for j in 0..3 {
            let want = if j <= i { f[j] / z } else { 0.0 };
            assert!((w[[0, 0, i, j]] - want).abs() < 1e-15, "a[{i}][{j}] = {} want {want}", w[[0, 0, i, j]]);
        }
    }
    // Row 2: cos(q2, k1) = 1/sqrt(2), cos(q2, k2) = 1/sqrt(2): equal scores, so equal weights.
    assert!((w[[0, 0, 1, 0]] - 0.5).abs() < 1e-15);
}

#[test]
fn uniform_rows_fall_back_to_stage_one_weights() {
    // Zero queries: every LSSA row is uniform (1/i), so past row 3 no key is above the mean and the
    // re-weighting falls back to a; rows 1-3 (no offset) stay uniform too. The output is the prefix
    // mean of v, and nothing is NaN.
    let shape = [1, 1, 10, 8];
    let q = Tensor::zeros(shape, (Kind::Double, Device::Cpu));
    let (k, v) = (input(shape, 41, 1.0), input(shape, 42, 1.0));
    let prefix_mean =
        v.cumsum(2, Kind::Double) / Tensor::arange_start(1, 11, (Kind::Double, Device::Cpu)).view([10, 1]);
    for p in [3, 15] {
        let out = torch_ops::lssa(&q, &k, &v, Some(p));
        assert_close(&format!("lssa+rw{p} on uniform rows"), &out, &prefix_mean, 1e-14);
    }
}

#[test]
fn reweighting_keeps_above_mean_keys_in_order_and_tends_to_the_arg_max() {
    // One row (i = 5) with hand-picked stage-1 weights; the other rows are uniform.
    let t = 5;
    let mut a = Tensor::ones([t, t], (Kind::Double, Device::Cpu)).tril(0);
    a = &a / a.sum_dim_intlist(&[-1i64][..], true, Kind::Double);
    let row = Tensor::from_slice(&[0.05, 0.30, 0.10, 0.40, 0.15]);
    let a = a.index_put_(&[Some(Tensor::from_slice(&[4i64]))], &row.unsqueeze(0), false).reshape([1, 1, t, t]);
    for p in [1, 3, 15] {
        let w = Vec::<f64>::try_from(torch_ops::reweight(&a, p).get(0).get(0).get(4)).unwrap();
        // u = 5a - 1 = [-0.75, 0.5, -0.5, 1.0, -0.25]: only keys 2 and 4 survive, in the same order.
        assert_eq!([w[0], w[2], w[4]], [0.0, 0.0, 0.0], "p={p}: below-mean keys must be dropped");
        let want_ratio = 0.5f64.powi(p as i32); // w_2 / w_4 = (0.5 / 1.0)^p
        assert!((w[1] / w[3] - want_ratio).abs() < 1e-14, "p={p}: ratio {} want {want_ratio}", w[1] / w[3]);
    }
    let w = Vec::<f64>::try_from(torch_ops::reweight(&a, 200).get(0).get(0).get(4)).unwrap();
    assert!(w[3] > 1.0 - 1e-12, "p=200 must be (nearly) one-hot on the arg-max, got {w:?}");
}

#[test]
fn outputs_do_not_depend_on_future_keys_or_values() {
    let shape = [1, 2, 24, 16];
    let (q, k, v) = (input(shape, 51, 1.0), input(shape, 52, 1.0), input(shape, 53, 1.0));
    let keep = 10;
    let future = Tensor::arange(24, (Kind::Double, Device::Cpu)).ge(keep as f64).view([24, 1]);
    let k2 = k.where_self(&future.logical_not(), &input(shape, 54, 5.0));
    let v2 = v.where_self(&future.logical_not(), &input(shape, 55, 5.0));
    for name in VARIANTS {
        let a = torch_forward(name, &q, &k, &v).narrow(2, 0, keep);
        let b = torch_forward(name, &q, &k2, &v2).narrow(2, 0, keep);
        assert_close(&format!("{name} causality"), &b, &a, 0.0);
    }
    // Every stage-1 variant through the generic path the model trains with (sign-changing and
    // unnormalised ones included: a leak there would show up as a suspiciously low loss).
    for name in attn_core::variant::STAGE1_NAMES {
        let variant = name.parse::<attn_core::Variant>().unwrap().with_train_len(16);
        let a = torch_ops::attention(&q, &k, &v, &variant.plan().unwrap(), 0).unwrap().narrow(2, 0, keep);
        let b = torch_ops::attention(&q, &k2, &v2, &variant.plan().unwrap(), 0).unwrap().narrow(2, 0, keep);
        assert_close(&format!("{name} causality"), &b, &a, 0.0);
    }
}

#[test]
fn autograd_gradients_match_central_differences() {
    // L = sum(o * g) in f64; compare autograd with central differences on every input entry.
    let shape = [1, 1, 6, 4];
    let (q, k, v, g) = (input(shape, 61, 1.5), input(shape, 62, 1.5), input(shape, 63, 1.0), input(shape, 64, 1.0));
    let loss = |name: &str, q: &Tensor, k: &Tensor, v: &Tensor| {
        f64::try_from((torch_forward(name, q, k, v) * &g).sum(Kind::Double)).unwrap()
    };
    let h = 1e-6;
    for name in ["softmax", "lssa", "lssa+rw3", "softmax+rw3"] {
        let (qg, kg, vg) = (q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true));
        let l = (torch_forward(name, &qg, &kg, &vg) * &g).sum(Kind::Double);
        let grads = Tensor::run_backward(&[l], &[&qg, &kg, &vg], false, false);
        for (which, grad) in grads.iter().enumerate() {
            let grad = Vec::<f64>::try_from(grad.reshape([-1])).unwrap();
            for idx in 0..grad.len() {
                let bump = |delta: f64| {
                    let mut one_hot = vec![0.0; grad.len()];
                    one_hot[idx] = delta;
                    let mut xs = [q.shallow_clone(), k.shallow_clone(), v.shallow_clone()];
                    xs[which] = &xs[which] + Tensor::from_slice(&one_hot).reshape(shape);
                    loss(name, &xs[0], &xs[1], &xs[2])
                };
                let fd = (bump(h) - bump(-h)) / (2.0 * h);
                let err = (grad[idx] - fd).abs() / fd.abs().max(1.0);
                assert!(
                    err < 1e-6,
                    "{name}: d{}[{idx}] autograd {} vs central difference {fd}",
                    ["q", "k", "v"][which],
                    grad[idx]
                );
            }
        }
    }
}

#[test]
fn gradients_flow_in_f32_at_p15() {
    let shape = [1, 2, 128, 64];
    let f = |seed| input(shape, seed, 1.0).to_kind(Kind::Float).set_requires_grad(true);
    let (q, k, v) = (f(71), f(72), f(73));
    let out = torch_ops::lssa(&q, &k, &v, Some(15));
    assert_eq!(out.kind(), Kind::Float);
    let grads = Tensor::run_backward(&[out.square().sum(Kind::Float)], &[&q, &k, &v], false, false);
    for (name, g) in ["dq", "dk", "dv"].iter().zip(&grads) {
        assert_eq!(g.size(), q.size(), "{name} shape");
        let finite = bool::try_from(g.isfinite().all()).unwrap();
        assert!(finite, "{name} has a non-finite entry");
        let norm = f64::try_from(g.norm()).unwrap();
        assert!(norm > 1e-3, "{name} is (nearly) zero: norm {norm}");
    }
}

#[test]
#[should_panic(expected = "v must have the shape of q")]
fn mismatched_shapes_are_rejected_up_front() {
    let q = Tensor::zeros([1, 1, 4, 8], (Kind::Double, Device::Cpu));
    let v = Tensor::zeros([1, 1, 4, 16], (Kind::Double, Device::Cpu));
    let _ = torch_ops::lssa(&q, &q, &v, None);
}

// ---------------------------------------------------------------------------------------------------
// The general path (`torch_ops::attention`): every named variant, query offsets, chunking, errors
// ---------------------------------------------------------------------------------------------------

/// Every stage-1 name of SPEC section 4, plus the re-weighted rows of Table 4 and Figure 2.
fn every_variant() -> Vec<Variant> {
    let mut names: Vec<String> = attn_core::variant::STAGE1_NAMES
        .iter()
        .map(|n| if *n == "sigmoid-bias" { "sigmoid-bias:t_train=8".to_string() } else { n.to_string() })
        .collect();
    for base in ["softmax", "lssa", "sigmoid-rowbias-l1", "sigmoid-l1", "relu-l1"] {
        for p in [1, 3, 15] {
            names.push(format!("{base}+rw{p}"));
        }
    }
    // Stage 2 on a stage 1 divided by the sequence length (and, in the chunked test, on blocks that
    // see fewer keys than the sequence has).
    names.push("relu-seqlen+rw3".into());
    let mut variants: Vec<Variant> = names.iter().map(|n| n.parse().unwrap_or_else(|e| panic!("{n}: {e}"))).collect();
    // Users' activations, run through their own f64 methods: plain, re-weighted on cosine scores.
    let customs: [Arc<dyn Activation>; 3] = [Arc::new(Square), Arc::new(TwiceExp), Arc::new(Impostor)];
    for phi in customs {
        variants.push(Variant::builder().activation_arc(Arc::clone(&phi)).build().unwrap());
        variants.push(Variant::builder().preset("lssa").unwrap().activation_arc(phi).reweight(3).build().unwrap());
    }
    variants
}

/// A user's activation: `x^2`.
#[derive(Debug)]
struct Square;

impl Activation for Square {
    fn name(&self) -> &str {
        "square"
    }
    fn value(&self, x: f64) -> f64 {
        x * x
    }
    fn derivative(&self, x: f64) -> f64 {
        2.0 * x
    }
    fn is_non_negative(&self) -> bool {
        true
    }
}

/// A user's exponential-type activation, `2 e^x`: evaluated under a running maximum, so its masked
/// scores reach it as `-inf`.
#[derive(Debug)]
struct TwiceExp;

impl Activation for TwiceExp {
    fn name(&self) -> &str {
        "twice-exp"
    }
    fn value(&self, x: f64) -> f64 {
        2.0 * x.exp()
    }
    fn derivative(&self, x: f64) -> f64 {
        2.0 * x.exp()
    }
    fn is_non_negative(&self) -> bool {
        true
    }
    fn needs_running_max(&self) -> bool {
        true
    }
}

/// A user's activation that borrows a built-in's name: it must run as itself, `x^2 + 1`, never as
/// softplus.
#[derive(Debug)]
struct Impostor;

impl Activation for Impostor {
    fn name(&self) -> &str {
        "softplus"
    }
    fn value(&self, x: f64) -> f64 {
        x * x + 1.0
    }
    fn derivative(&self, x: f64) -> f64 {
        2.0 * x
    }
    fn is_non_negative(&self) -> bool {
        true
    }
}

#[test]
fn a_user_activation_with_a_builtin_name_runs_as_itself() {
    let (q, k, v) = (input([1, 2, 9, 8], 5, 1.0), input([1, 2, 9, 8], 6, 1.0), input([1, 2, 9, 8], 7, 1.0));
    let lssa: Variant = "lssa".parse().unwrap();
    let impostor = Variant::builder().preset("lssa").unwrap().activation(Impostor).build().unwrap();
    let want = attn_core::forward(&impostor, to_array(&q).view(), to_array(&k).view(), to_array(&v).view()).unwrap();
    let got = torch_ops::attention(&q, &k, &v, &impostor.plan().unwrap(), 0).unwrap();
    assert_close("impostor", &got, &to_tensor(want.view()), 1e-10);
    let softplus = torch_ops::attention(&q, &k, &v, &lssa.plan().unwrap(), 0).unwrap();
    assert!(rel_err(&got, &softplus) > 1e-2, "the impostor ran as softplus");
}

#[test]
fn every_variant_matches_attn_core_forward_and_backward() {
    for (shape, seed) in [([1, 2, 13, 8], 81u64), ([2, 1, 6, 40], 82)] {
        let (q, k, v, g) = (
            input(shape, seed, 1.5),
            input(shape, seed + 1, 1.5),
            input(shape, seed + 2, 1.0),
            input(shape, seed + 3, 1.0),
        );
        let (qa, ka, va, ga) = (to_array(&q), to_array(&k), to_array(&v), to_array(&g));
        for variant in every_variant() {
            let want = attn_core::forward(&variant, qa.view(), ka.view(), va.view()).unwrap();
            let (qg, kg, vg) = (q.set_requires_grad(true), k.set_requires_grad(true), v.set_requires_grad(true));
            let out = torch_ops::attention(&qg, &kg, &vg, &variant.plan().unwrap(), 0).unwrap();
            assert_close(&format!("{variant} {shape:?} forward"), &out.detach(), &to_tensor(want.view()), 1e-10);
            let grads = attn_core::backward(&variant, qa.view(), ka.view(), va.view(), ga.view()).unwrap();
            let got = Tensor::run_backward(&[(&out * &g).sum(Kind::Double)], &[&qg, &kg, &vg], false, false);
            for (which, got, want) in
                [("dq", &got[0], &grads.dq), ("dk", &got[1], &grads.dk), ("dv", &got[2], &grads.dv)]
            {
                assert_close(&format!("{variant} {shape:?} {which}"), got, &to_tensor(want.view()), 1e-8);
            }
        }
    }
}

#[test]
fn query_offsets_and_chunks_equal_the_full_computation() {
    // Rows at absolute positions offset.. see every earlier key: the last rows of a full call, exactly.
    let shape = [1, 2, 37, 16];
    let (q, k, v) = (input(shape, 91, 1.0), input(shape, 92, 1.0), input(shape, 93, 1.0));
    for variant in every_variant() {
        let full = torch_ops::attention(&q, &k, &v, &variant.plan().unwrap(), 0).unwrap();
        for offset in [1, 3, 4, 20, 36] {
            let tail =
                torch_ops::attention(&q.narrow(2, offset, 37 - offset), &k, &v, &variant.plan().unwrap(), offset)
                    .unwrap();
            assert_close(&format!("{variant} offset {offset}"), &tail, &full.narrow(2, offset, 37 - offset), 1e-12);
        }
        for chunk in [1, 5, 16, 64] {
            let chunked = torch_ops::attention_chunked(&q, &k, &v, &variant.plan().unwrap(), 0, chunk).unwrap();
            assert_close(&format!("{variant} chunk {chunk}"), &chunked, &full, 1e-12);
        }
    }
}

#[test]
fn the_general_path_reports_bad_input() {
    let q = input([1, 1, 4, 8], 1, 1.0);
    let lssa: Variant = "lssa".parse().unwrap();
    let err =
        torch_ops::attention(&q, &input([1, 1, 5, 8], 2, 1.0), &input([1, 1, 5, 8], 3, 1.0), &lssa.plan().unwrap(), 0)
            .unwrap_err();
    assert!(err.to_string().contains("q_offset + T_q = 0 + 4") && err.to_string().contains("5"), "{err}");
    let err = torch_ops::attention(&q, &q, &input([1, 1, 4, 4], 3, 1.0), &lssa.plan().unwrap(), 0).unwrap_err();
    assert!(err.to_string().contains("v must have the shape of k"), "{err}");
    // A parameter left unset is an error, not a silent default.
    let bias: Variant = "sigmoid-bias".parse().unwrap();
    assert!(bias.plan().is_err(), "its plan is refused, so no attention runs without it");
}

/// `x^2 + c` under one name for every `c`: two users' activations that share a name.
#[derive(Debug)]
struct Lifted(f64);

impl Activation for Lifted {
    fn name(&self) -> &str {
        "lifted-square"
    }
    fn value(&self, x: f64) -> f64 {
        x * x + self.0
    }
    fn derivative(&self, x: f64) -> f64 {
        2.0 * x
    }
    fn is_non_negative(&self) -> bool {
        true
    }
}

#[test]
fn the_fused_bridge_keeps_two_user_activations_of_one_name_apart() {
    use gpt_model::attention::fused;
    let shape = [1, 2, 7, 8];
    let (q, k, v) = (input(shape, 11, 1.0), input(shape, 12, 1.0), input(shape, 13, 1.0));
    let (qf, kf, vf) = (q.to_kind(Kind::Float), k.to_kind(Kind::Float), v.to_kind(Kind::Float));
    for c in [0.5, 4.0, 0.5] {
        let variant = Variant::builder().activation(Lifted(c)).build().unwrap();
        let want = attn_core::forward(&variant, to_array(&q).view(), to_array(&k).view(), to_array(&v).view()).unwrap();
        let att = gpt_model::attention::Attention::new(variant.clone(), gpt_model::AttnImpl::Fused).unwrap();
        let got = fused::attention(&qf, &kf, &vf, &att).unwrap().to_kind(Kind::Double);
        assert_close(&format!("lifted {c}"), &got, &to_tensor(want.view()), 1e-5);
    }
}

/// On the CPU the fused forward writes its `(B, H, T, d)` output as a view of `(B, T, H, d)` rows,
/// so that the model's `transpose(1, 2).contiguous()` before the output projection copies nothing;
/// the values are the reference's all the same, and so is the gradient that comes back through that
/// layout.
#[test]
fn the_fused_output_on_the_cpu_is_in_the_rows_the_projection_reads() {
    use gpt_model::attention::fused;
    let shape = [2, 3, 9, 8];
    let (q, k, v) = (input(shape, 21, 1.0), input(shape, 22, 1.0), input(shape, 23, 1.0));
    let variant = Variant::builder().preset("lssa").unwrap().build().unwrap();
    let att = gpt_model::attention::Attention::new(variant.clone(), gpt_model::AttnImpl::Fused).unwrap();
    let (qf, kf, vf) = (q.to_kind(Kind::Float), k.to_kind(Kind::Float), v.to_kind(Kind::Float));
    let qf = qf.set_requires_grad(true);
    let out = fused::attention(&qf, &kf, &vf, &att).unwrap();
    assert!(!out.is_contiguous() && out.transpose(1, 2).is_contiguous(), "strides {:?}", out.stride());
    let want = attn_core::forward(&variant, to_array(&q).view(), to_array(&k).view(), to_array(&v).view()).unwrap();
    assert_close("output", &out.to_kind(Kind::Double), &to_tensor(want.view()), 1e-5);
    // The same weighted sum, its gradient arriving in the projection's rows (a transposed view) or
    // as contiguous heads: the same `dq`.
    let rows = out.transpose(1, 2).contiguous();
    let w = input([2, 9, 3, 8], 24, 1.0).to_kind(Kind::Float); // (B, T, H, d)
    let dq = Tensor::run_backward(&[(&rows * &w).sum(Kind::Float)], &[&qf], false, false).remove(0);
    let qh = q.to_kind(Kind::Float).set_requires_grad(true);
    let heads = fused::attention(&qh, &kf, &vf, &att).unwrap();
    let w_heads = w.transpose(1, 2).contiguous(); // (B, H, T, d)
    let dq_heads = Tensor::run_backward(&[(&heads * &w_heads).sum(Kind::Float)], &[&qh], false, false).remove(0);
    assert_close("dq", &dq.to_kind(Kind::Double), &dq_heads.to_kind(Kind::Double), 1e-6);
}
