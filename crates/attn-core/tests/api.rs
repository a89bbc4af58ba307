//! The public surface: variant names (grammar, round trip, errors), typed input errors,
//! activation values, RoPE, and (feature `testing`) the property-test kit on every built-in.

use std::sync::Arc;

use attn_core::activation::{Exp, builtin_activations};
use attn_core::fixtures::{random_array, random_qkv};
use attn_core::math::{erf, erfc};
use attn_core::rope::{ntk_rope_base, rope_apply, rope_inv_freq};
use attn_core::variant::STAGE1_NAMES;
use attn_core::{Activation, Error, Norm, Stage1, Variant, backward, forward, weights};
use ndarray::{Array4, s};

// ---------------------------------------------------------------- names

#[test]
fn every_name_round_trips_through_display_and_from_str() {
    let mut names: Vec<String> = Vec::new();
    for base in STAGE1_NAMES {
        for suffix in ["", "+rw1", "+rw3", "+rw15", "+rw1024"] {
            names.push(format!("{base}{suffix}"));
        }
    }
    names.extend(
        [
            "lssa:d_factor=4.0",
            "lssa:d_factor=4.0+rw15",
            "lssa:d_factor=-0.5",
            "lssa:d_factor=1e-7",
            "sigmoid-bias:t_train=1024",
            "sigmoid-bias:t_train=1+rw3",
        ]
        .map(String::from),
    );
    for name in names {
        let v: Variant = name.parse().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(v.to_string(), name, "Display of `{name}`");
        assert_eq!(v.to_string().parse::<Variant>().unwrap(), v, "round trip of `{name}`");
    }
}

#[test]
fn presets_are_the_spec_definitions() {
    let v: Variant = "lssa+rw15".parse().unwrap();
    assert_eq!(v.reweight(), Some(15));
    assert_eq!(v.activation().name(), "softplus");
    assert_eq!(v.stage1().scores, attn_core::Scores::Cosine);
    assert!(v.rows_sum_to_one() && v.is_streamable() && !v.needs_running_max());
    let softmax: Variant = "softmax".parse().unwrap();
    assert!(softmax.needs_running_max() && softmax.is_streamable());
    assert!(!"exp-nonorm".parse::<Variant>().unwrap().needs_running_max());
    assert!(!"recentered".parse::<Variant>().unwrap().is_streamable());
    assert!(!"linear-l1+rw3".parse::<Variant>().unwrap().is_streamable());
    assert_eq!(Variant::all_presets().len(), STAGE1_NAMES.len());
}

#[test]
fn unknown_names_list_the_valid_ones() {
    let err = "softmaxx".parse::<Variant>().unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::UnknownVariant { .. }));
    for name in STAGE1_NAMES {
        assert!(msg.contains(name), "{msg} lacks {name}");
    }
    assert!(msg.contains("+rw<p>"));
}

#[test]
fn malformed_names_are_typed_errors() {
    type Case = (&'static str, fn(&Error) -> bool);
    let cases: &[Case] = &[
        ("lssa+rw0", |e| matches!(e, Error::InvalidPower { p: 0, .. })),
        ("lssa+rw1025", |e| matches!(e, Error::InvalidPower { p: 1025, .. })),
        ("lssa+rw99999999999999999999999", |e| matches!(e, Error::InvalidPower { .. })),
        ("lssa+rw", |e| matches!(e, Error::ParseVariant { .. })),
        ("lssa+rw-3", |e| matches!(e, Error::ParseVariant { .. })),
        ("lssa+foo", |e| matches!(e, Error::ParseVariant { .. })),
        ("lssa+rw3+rw3", |e| matches!(e, Error::ParseVariant { .. })),
        ("lssa:t_train=5", |e| matches!(e, Error::ParseVariant { .. })),
        ("softmax:d_factor=2", |e| matches!(e, Error::ParseVariant { .. })),
        ("lssa:d_factor", |e| matches!(e, Error::ParseVariant { .. })),
        ("lssa:d_factor=1,d_factor=2", |e| matches!(e, Error::ParseVariant { .. })),
        ("lssa:d_factor=abc", |e| matches!(e, Error::InvalidParameter { param: "d_factor", .. })),
        ("lssa:d_factor=inf", |e| matches!(e, Error::InvalidParameter { param: "d_factor", .. })),
        ("sigmoid-bias:t_train=0", |e| matches!(e, Error::InvalidParameter { param: "t_train", .. })),
        ("sigmoid-bias:t_train=-4", |e| matches!(e, Error::InvalidParameter { param: "t_train", .. })),
        ("", |e| matches!(e, Error::UnknownVariant { .. })),
        ("LSSA", |e| matches!(e, Error::UnknownVariant { .. })),
    ];
    for (name, ok) in cases {
        let err = name.parse::<Variant>().expect_err(name);
        assert!(ok(&err), "`{name}` gave {err:?}");
    }
}

#[test]
fn sigmoid_bias_needs_t_train_until_filled_in() {
    let (q, k, v) = random_qkv::<f64>([1, 1, 4, 2], 1);
    let bare: Variant = "sigmoid-bias".parse().unwrap();
    assert_eq!(bare.to_string(), "sigmoid-bias");
    let err = forward(&bare, &q, &k, &v).unwrap_err();
    assert!(matches!(err, Error::MissingParameter { param: "t_train", .. }), "{err:?}");
    assert!(backward(&bare, &q, &k, &v, &v).is_err());
    let filled = bare.with_train_len(1024);
    assert_eq!(filled.to_string(), "sigmoid-bias:t_train=1024");
    assert!(forward(&filled, &q, &k, &v).is_ok());
    // An explicit t_train is kept; other variants are unchanged.
    assert_eq!(filled.clone().with_train_len(8), filled);
    let lssa: Variant = "lssa".parse().unwrap();
    assert_eq!(lssa.clone().with_train_len(8), lssa);
}

#[test]
fn builder_takes_a_user_activation() {
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
    let v = Variant::builder().activation(Square).reweight(3).build().unwrap();
    assert!(v.to_string().starts_with("custom(activation=square"));
    assert!(v.to_string().ends_with("+rw3"));
    assert!(v.to_string().parse::<Variant>().is_err());
    let (q, k, x) = random_qkv::<f64>([1, 1, 5, 3], 2);
    assert!(forward(&v, &q, &k, &x).unwrap().iter().all(|y| y.is_finite()));
    // Stage1 built by hand equals the preset.
    let by_hand = Variant::new(Stage1::new(Arc::new(Exp)), None).unwrap();
    assert_eq!(by_hand.to_string(), "softmax");
    assert!(Variant::builder().reweight(0).build().is_err());
    assert!(Variant::builder().preset("nope").is_err());
    let relu_row = Variant::builder().preset("relu-l1").unwrap().norm(Norm::DivN).build().unwrap();
    assert_eq!(relu_row.to_string(), "relu-rowlen");
    let relu_seq = Variant::builder().preset("relu-l1").unwrap().norm(Norm::DivLen).build().unwrap();
    assert_eq!(relu_seq.to_string(), "relu-seqlen");
    assert_eq!("relu-seqlen+rw3".parse::<Variant>().unwrap(), relu_seq.with_reweight(3).unwrap());
}

// ---------------------------------------------------------------- input errors

#[test]
fn bad_inputs_are_typed_errors_naming_argument_and_sizes() {
    let softmax: Variant = "softmax".parse().unwrap();
    let (q, k, v) = random_qkv::<f64>([1, 2, 4, 3], 3);
    let other = random_array::<f64>([1, 2, 5, 3], 4);

    // k may be a longer cache (T_k = 5 >= T_q = 4) or have fewer heads (grouped-query attention), but
    // its B and d are q's, T_k >= T_q, and H is a multiple of H_kv; v follows k.
    let wide_d = random_array::<f64>([1, 2, 4, 5], 5);
    let err = forward(&softmax, &q, &wide_d, &v).unwrap_err();
    assert!(matches!(&err, Error::ShapeMismatch { arg: "k", .. }), "{err:?}");
    assert!(err.to_string().contains("[1, 2, 4, 5]") && err.to_string().contains("H_kv"), "{err}");
    let short = random_array::<f64>([1, 2, 3, 3], 6);
    assert!(matches!(forward(&softmax, &q, &short, &short), Err(Error::ShapeMismatch { arg: "k", .. })));
    let three_heads = random_array::<f64>([1, 3, 4, 3], 7);
    assert!(matches!(forward(&softmax, &three_heads, &k, &v), Err(Error::ShapeMismatch { arg: "k", .. })));
    let err = forward(&softmax, &q, &other, &v).unwrap_err();
    assert!(matches!(&err, Error::ShapeMismatch { arg: "v", .. }), "{err:?}");
    let err = forward(&softmax, &q, &k, &other).unwrap_err();
    assert!(matches!(&err, Error::ShapeMismatch { arg: "v", .. }), "{err:?}");
    let err = backward(&softmax, &q, &k, &v, &other).unwrap_err();
    assert!(matches!(&err, Error::ShapeMismatch { arg: "d_out", .. }), "{err:?}");
    assert_eq!(weights(&softmax, &q, &other).unwrap().shape(), &[1, 2, 4, 5], "T_q x T_k weights of a cache");
    let err = weights(&softmax, &q, &wide_d).unwrap_err();
    assert!(matches!(&err, Error::ShapeMismatch { arg: "k", .. }), "{err:?}");

    let empty_t = Array4::<f64>::zeros((1, 2, 0, 3));
    let err = forward(&softmax, &empty_t, &empty_t, &empty_t).unwrap_err();
    assert!(matches!(&err, Error::EmptyAxis { axis: "T", got: 0, .. }), "{err:?}");
    assert!(err.to_string().contains("T = 0"));
    let empty_d = Array4::<f64>::zeros((1, 2, 4, 0));
    let err = forward(&softmax, &empty_d, &empty_d, &empty_d).unwrap_err();
    assert!(matches!(&err, Error::EmptyAxis { axis: "d", .. }), "{err:?}");
    let err = forward(&softmax, &q, &k, &Array4::<f64>::zeros((1, 2, 4, 0))).unwrap_err();
    assert!(matches!(&err, Error::EmptyAxis { arg: "v", .. }), "{err:?}");

    // A power out of range cannot be built, so no entry point sees one.
    assert!(matches!(Variant::new(softmax.stage1().clone(), Some(0)), Err(Error::InvalidPower { p: 0, .. })));
    assert!(softmax.clone().with_reweight(0).is_err());
    assert!(softmax.clone().with_reweight(1025).is_err());

    for (arg, bad) in [("q", f64::NAN), ("k", f64::INFINITY), ("v", f64::NEG_INFINITY), ("d_out", f64::NAN)] {
        let mut xs = [q.clone(), k.clone(), v.clone(), v.clone()];
        let which = ["q", "k", "v", "d_out"].iter().position(|a| *a == arg).unwrap();
        xs[which][[0, 1, 2, 0]] = bad;
        let err = backward(&softmax, &xs[0], &xs[1], &xs[2], &xs[3]).unwrap_err();
        match err {
            Error::NonFinite { arg: a, index, .. } => {
                assert_eq!(a, arg);
                assert_eq!(index, [0, 1, 2, 0]);
            }
            e => panic!("{arg}: {e:?}"),
        }
        if which < 3 {
            assert!(forward(&softmax, &xs[0], &xs[1], &xs[2]).is_err());
        }
    }
    let mut qf = random_array::<f32>([1, 1, 3, 2], 5);
    qf[[0, 0, 1, 1]] = f32::NAN;
    assert!(matches!(forward(&softmax, &qf, &qf, &qf), Err(Error::NonFinite { arg: "q", .. })));

    // The same checks, public for kernels.
    let err =
        attn_core::reference::check_inputs(&softmax, &q.view(), &k.view(), &v.view(), Some(&other.view())).unwrap_err();
    assert!(matches!(&err, Error::ShapeMismatch { arg: "d_out", .. }), "{err:?}");
    assert!(attn_core::reference::check_inputs(&softmax, &q.view(), &k.view(), &v.view(), None).is_ok());
    // The kernels' checks take whole sequences with a key head per query head; the cached ones more.
    let err = attn_core::reference::check_inputs(&softmax, &q.view(), &other.view(), &other.view(), None).unwrap_err();
    assert!(matches!(&err, Error::ShapeMismatch { arg: "k", .. }), "{err:?}");
    assert!(attn_core::reference::check_inputs_cached(&softmax, &q.view(), &other.view(), &other.view(), None).is_ok());

    // B = 0 or H = 0 is not an error: empty output.
    let none = Array4::<f64>::zeros((0, 2, 4, 3));
    assert_eq!(forward(&softmax, &none, &none, &none).unwrap().shape(), &[0, 2, 4, 3]);
}

// ---------------------------------------------------------------- activations

#[test]
fn activation_values_and_stability() {
    let acts = builtin_activations();
    let get = |n: &str| acts.iter().find(|a| a.name() == n).unwrap().clone();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-15 * b.abs().max(1.0);
    assert!(close(get("softplus").value(0.0), 2f64.ln()));
    assert_eq!(get("softplus").value(1e4), 1e4);
    assert_eq!(get("softplus").value(-1e4), 0.0);
    assert!(close(get("softplus").value(-40.0), (-40f64).exp()));
    assert_eq!(get("sigmoid").value(-1e30), 0.0);
    assert_eq!(get("sigmoid").value(1e30), 1.0);
    assert!(close(get("sigmoid").value(-745.0), 5e-324) || get("sigmoid").value(-745.0) >= 0.0);
    assert!(close(get("gelu").value(1.0), 0.841_344_746_068_542_9));
    assert!(close(get("gelu").value(-1.0), -0.158_655_253_931_457_05));
    assert!(close(get("mish").value(1.0), 0.865_098_388_267_310_3));
    assert_eq!(get("relu6").value(7.0), 6.0);
    assert_eq!(get("relu2").value(-3.0), 0.0);
    assert_eq!(get("relu2").value(3.0), 9.0);
    assert_eq!(get("relu").derivative(0.0), 0.0);
    assert!(close(erf(0.5), 0.520_499_877_813_046_5));
    assert!(close(erfc(2.0), 0.004_677_734_981_047_265));
    assert!((erfc(3.0) / 2.209_049_699_858_543_8e-5 - 1.0).abs() < 1e-14);
    assert!((erfc(5.0) / 1.537_459_794_428_035_1e-12 - 1.0).abs() < 1e-14);
    assert!((erfc(2.0001) / 0.004_675_668_695_803_339_4 - 1.0).abs() < 1e-14);
    assert_eq!(erf(-0.5), -erf(0.5));
    for a in &acts {
        for x in [-1e300, -1e30, -1e4, -88.0, 0.0, 88.0, 1e4, 1e30, 1e300] {
            assert!(!a.value(x).is_nan() && !a.derivative(x).is_nan(), "{} at {x}", a.name());
        }
    }
}

// ---------------------------------------------------------------- RoPE

#[test]
fn ntk_rope_base_formula() {
    assert_eq!(ntk_rope_base(10000.0, 64, 1.0), 10000.0);
    assert_eq!(ntk_rope_base(10000.0, 64, 0.5), 10000.0);
    let b = ntk_rope_base(10000.0, 64, 4.0);
    assert!((b - 10000.0 * 4f64.powf(64.0 / 62.0)).abs() < 1e-9 * b);
    assert_eq!(ntk_rope_base(10000.0, 2, 4.0), 10000.0);
}

#[test]
fn rope_is_rotate_half_with_offsets() {
    assert!(matches!(rope_inv_freq(10000.0, 5), Err(Error::OddHeadDim { head_dim: 5 })));
    assert!(rope_inv_freq(10000.0, 0).is_err());
    assert!(rope_inv_freq(-1.0, 4).is_err());
    let f = rope_inv_freq(10000.0, 8).unwrap();
    assert_eq!(f[0], 1.0);
    assert!((f[2] - 10000f64.powf(-0.5)).abs() < 1e-15);

    let x = random_array::<f64>([2, 3, 9, 8], 6);
    assert!(matches!(rope_apply(&random_array::<f64>([1, 1, 2, 3], 1), 10000.0, 0), Err(Error::OddHeadDim { .. })));
    let y = rope_apply(&x, 10000.0, 0).unwrap();
    // Position 0 is the identity; pairs (c, c + d/2) keep their norm.
    assert_eq!(y.slice(s![.., .., 0, ..]), x.slice(s![.., .., 0, ..]));
    for c in 0..4 {
        let n = |a: &Array4<f64>| a[[1, 2, 5, c]].hypot(a[[1, 2, 5, c + 4]]);
        assert!((n(&x) - n(&y)).abs() < 1e-12);
    }
    // Explicit rotate-half at position 3, pair c = 1.
    let theta = 3.0 * f[1];
    let (x1, x2) = (x[[0, 0, 3, 1]], x[[0, 0, 3, 5]]);
    assert!((y[[0, 0, 3, 1]] - (x1 * theta.cos() - x2 * theta.sin())).abs() < 1e-14);
    assert!((y[[0, 0, 3, 5]] - (x2 * theta.cos() + x1 * theta.sin())).abs() < 1e-14);
    // An offset equals slicing a longer sequence.
    let tail = rope_apply(x.slice(s![.., .., 4.., ..]), 10000.0, 4).unwrap();
    assert!(attn_core::fixtures::max_abs_diff(&tail, &y.slice(s![.., .., 4.., ..])) < 1e-14);
    // Relative: <rope(q, m), rope(k, n)> depends only on m - n.
    let q1 = x.slice(s![0..1, 0..1, 0..1, ..]).to_owned();
    let k1 = x.slice(s![0..1, 0..1, 1..2, ..]).to_owned();
    let dot_at = |m: usize, n: usize| {
        let a = rope_apply(&q1, 10000.0, m).unwrap();
        let b = rope_apply(&k1, 10000.0, n).unwrap();
        (a * b).sum()
    };
    assert!((dot_at(7, 3) - dot_at(104, 100)).abs() < 1e-10);
}

// ---------------------------------------------------------------- property-test kit

#[cfg(feature = "testing")]
mod kit {
    use super::*;
    use attn_core::testing::{check_activation, check_activation_arc, check_variant};

    #[test]
    fn check_activation_passes_on_every_builtin() {
        for act in builtin_activations() {
            check_activation_arc(act);
        }
        check_activation(&attn_core::activation::Softplus);
    }

    #[test]
    fn check_variant_passes_on_lssar_and_sigmoid_rowbias() {
        for name in ["lssa+rw15", "sigmoid-rowbias-l1+rw3", "relu-ln"] {
            check_variant(&name.parse().unwrap());
        }
    }

    #[derive(Debug, Clone)]
    struct WrongDerivative;
    impl Activation for WrongDerivative {
        fn name(&self) -> &str {
            "wrong"
        }
        fn value(&self, x: f64) -> f64 {
            attn_core::math::softplus(x)
        }
        fn derivative(&self, x: f64) -> f64 {
            1.01 * attn_core::math::sigmoid(x)
        }
        fn is_non_negative(&self) -> bool {
            true
        }
    }

    #[test]
    #[should_panic(expected = "derivative does not match")]
    fn check_activation_catches_a_wrong_derivative() {
        check_activation(&WrongDerivative);
    }

    #[derive(Debug, Clone)]
    struct NaiveExp;
    impl Activation for NaiveExp {
        fn name(&self) -> &str {
            "naive-exp"
        }
        fn value(&self, x: f64) -> f64 {
            x.exp()
        }
        fn derivative(&self, x: f64) -> f64 {
            x.exp()
        }
        fn is_non_negative(&self) -> bool {
            true
        }
    }

    #[test]
    #[should_panic(expected = "needs_running_max")]
    fn check_activation_catches_an_unshifted_exp() {
        check_activation(&NaiveExp);
    }

    #[derive(Debug, Clone)]
    struct NaiveSoftplus;
    impl Activation for NaiveSoftplus {
        fn name(&self) -> &str {
            "naive-softplus"
        }
        fn value(&self, x: f64) -> f64 {
            x.exp().ln_1p()
        }
        fn derivative(&self, x: f64) -> f64 {
            x.exp() / (1.0 + x.exp()) // inf / inf = NaN for large x
        }
        fn is_non_negative(&self) -> bool {
            true
        }
    }

    #[test]
    #[should_panic(expected = "NaN at x")]
    fn check_activation_catches_an_unstable_formula() {
        check_activation(&NaiveSoftplus);
    }
}
