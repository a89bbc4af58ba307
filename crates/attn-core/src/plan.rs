//! The backend-neutral plan of a variant: [`Plan`], the one description of what a kernel computes
//! that every backend (the CPU engine, the CUDA configuration and its emulator, the tch ops of
//! `gpt-model`) consumes with an exhaustive `match`, its activation a closed [`Builtin`] or a user's.
//!
//! Adding a built-in activation is a compiler-guided walk: add the type and its [`Builtin`] arm (in
//! `activation.rs`), then every backend's `match` on [`Builtin`] stops compiling until it has an arm too.
//! A user's own [`Activation`] is [`Phi::Custom`]: a backend runs it through `value` and
//! `derivative` (correct, slow) or refuses it with an error that says so; it is never mistaken for
//! a built-in, whatever its name.

use std::fmt;
use std::sync::Arc;

use crate::activation::{Activation, Builtin};
use crate::error::Result;
use crate::stage::{Bias, Norm, OutputNorm, Scale, Scores, Transform};
use crate::variant::Variant;

/// The activation `phi` as a backend sees it.
#[derive(Clone)]
pub enum Phi {
    /// One of attn-core's own activations ([`Activation::builtin`] returned it).
    Builtin(Builtin),
    /// Anything else: evaluate [`Activation::value`] and [`Activation::derivative`].
    Custom(Arc<dyn Activation>),
}

impl Phi {
    /// `Builtin` when `activation` is attn-core's own type, else `Custom` (a user's type is custom
    /// even when it reuses a built-in's name).
    pub fn of(activation: &Arc<dyn Activation>) -> Phi {
        match activation.builtin() {
            Some(b) => Phi::Builtin(b),
            None => Phi::Custom(Arc::clone(activation)),
        }
    }

    /// The activation's name.
    pub fn name(&self) -> &str {
        match self {
            Phi::Builtin(b) => b.name(),
            Phi::Custom(a) => a.name(),
        }
    }
}

impl fmt::Debug for Phi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phi::Builtin(b) => write!(f, "Builtin({b:?})"),
            Phi::Custom(a) => write!(f, "Custom({:?})", a.name()),
        }
    }
}

/// What a kernel computes for a variant (SPEC sections 2-3), resolved and validated once by
/// [`Variant::plan`]: the fields a backend branches on, each a closed enum or a flag derived from
/// attn-core's own rules, so that no backend re-derives them (or matches on a name).
#[derive(Clone, Debug)]
pub struct Plan {
    /// `phi`.
    pub phi: Phi,
    /// Dot or cosine scores.
    pub scores: Scores,
    /// `scale_i` (its parameters checked).
    pub scale: Scale,
    /// `b_i` (its parameters set and checked).
    pub bias: Bias,
    /// The row normaliser.
    pub norm: Norm,
    /// The Table-1 transform.
    pub transform: Transform,
    /// The output normalisation.
    pub output_norm: OutputNorm,
    /// Evaluate `phi(s - max s)` with a running maximum ([`crate::Stage1::needs_running_max`]).
    pub running_max: bool,
    /// `phi` may be negative: l1 sums `|f|` and its gradient carries `sign(f)`.
    pub signed: bool,
    /// Re-weighting power `p` (in `1..=MAX_REWEIGHT_POWER`), if any.
    pub reweight: Option<u32>,
}

impl Plan {
    /// Whether the scores are cosine similarities (`q` and `k` rows L2-normalised).
    pub fn cosine(&self) -> bool {
        self.scores == Scores::Cosine
    }

    /// `(scale_i, b_i)` for a row with `n = N_i` keys at head dimension `head_dim`: the same f64
    /// constants as the reference.
    pub fn row_constants(&self, n: usize, head_dim: usize) -> (f64, f64) {
        // `Variant::plan` validated the bias, so only `Bias::LogTrainLen { t_train: Some(t >= 1) }`
        // can reach here among the fallible ones.
        (self.scale.value(n, head_dim), self.bias.value(n).unwrap_or(0.0))
    }
}

impl Variant {
    /// The backend-neutral [`Plan`] of this variant; errors on an invalid or missing parameter.
    pub fn plan(&self) -> Result<Plan> {
        self.validate()?;
        let s1 = &self.stage1();
        Ok(Plan {
            phi: Phi::of(&s1.activation),
            scores: s1.scores,
            scale: s1.scale,
            bias: s1.bias,
            norm: s1.norm,
            transform: s1.transform,
            output_norm: s1.output_norm,
            running_max: s1.needs_running_max(),
            signed: !s1.activation.is_non_negative(),
            reweight: self.reweight(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Impostor; // a user's activation that takes a built-in's name

    impl Activation for Impostor {
        fn name(&self) -> &str {
            "softplus"
        }
        fn value(&self, x: f64) -> f64 {
            x * x
        }
        fn derivative(&self, x: f64) -> f64 {
            2.0 * x
        }
    }

    #[test]
    fn every_builtin_round_trips_through_its_type_and_name() {
        for b in Builtin::ALL {
            let a = b.activation();
            assert_eq!(a.builtin(), Some(b));
            assert_eq!(a.name(), b.name());
            assert_eq!(Builtin::from_name(b.name()), Some(b));
        }
        let listed: Vec<String> =
            crate::activation::builtin_activations().iter().map(|a| a.name().to_string()).collect();
        let all: Vec<String> = Builtin::ALL.iter().map(|b| b.name().to_string()).collect();
        assert_eq!(listed, all);
    }

    #[test]
    fn a_user_activation_with_a_builtin_name_is_custom() {
        let v = Variant::builder().preset("lssa").unwrap().activation(Impostor).build().unwrap();
        let plan = v.plan().unwrap();
        assert!(matches!(plan.phi, Phi::Custom(_)), "{:?}", plan.phi);
        assert!(plan.signed, "the impostor does not claim to be non-negative");
        // ... and it is not the `lssa` preset either.
        assert_ne!(v, "lssa".parse::<Variant>().unwrap());
        assert!(v.to_string().starts_with("custom("), "{v}");
    }

    #[test]
    fn plans_carry_the_stage_rules() {
        let lssar: Variant = "lssa+rw15".parse().unwrap();
        let p = lssar.plan().unwrap();
        assert!(matches!(p.phi, Phi::Builtin(Builtin::Softplus)));
        assert!(p.cosine() && !p.running_max && !p.signed);
        assert_eq!(p.reweight, Some(15));
        assert_eq!(p.row_constants(1, 64), (0.0, 0.0)); // ln(1) = 0
        let softmax = "softmax".parse::<Variant>().unwrap().plan().unwrap();
        assert!(softmax.running_max && !softmax.cosine());
        let sb: Variant = "sigmoid-bias".parse().unwrap();
        assert!(sb.plan().is_err(), "t_train unset must be refused when planning");
        let sb = sb.with_train_len(8).plan().unwrap();
        assert_eq!(sb.row_constants(5, 16).1, -(8f64).ln());
        assert!("gelu-l1".parse::<Variant>().unwrap().plan().unwrap().signed);
    }
}
