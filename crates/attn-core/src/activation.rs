//! Positivity maps `phi`: the `Activation` trait, the nine built-ins (their types, [`Builtin`] and
//! lookups by name); the scalar functions they evaluate are in [`crate::math`].

use std::fmt::{self, Debug};
use std::sync::Arc;

use crate::math::{normal_cdf, sigmoid, softplus};
/// `1 / sqrt(2 pi)`.
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// A scalar activation `phi` of stage 1 (`f_ij = phi(s_ij)`), with its derivative.
///
/// Implementations must be pure functions of `x`. `value` and `derivative` may return an infinity
/// for huge inputs (e.g. `exp(1e4)`) but must never return NaN for a finite input, and must be
/// finite for `|x| <= 88` (checked by `testing::check_activation`, feature `testing`).
/// Equality (`PartialEq` of [`crate::Stage1`], hence of [`crate::Variant`]): a built-in equals only
/// itself; two user activations with the same [`name`](Activation::name) are treated as the same.
pub trait Activation: Send + Sync + Debug {
    /// A short stable name (`"softplus"`); used in messages and variant display.
    fn name(&self) -> &str;
    /// `phi(x)`.
    fn value(&self, x: f64) -> f64;
    /// `phi'(x)`. At a kink, return either one-sided derivative (the built-ins return the left one,
    /// e.g. ReLU'(0) = 0).
    fn derivative(&self, x: f64) -> f64;
    /// Whether `phi(x) >= 0` for every `x`. Non-negative activations under an l1 normaliser give
    /// row-stochastic weights, may be re-weighted in a single extra sweep, and use `Z = sum f`
    /// (no absolute value) in the l1 Jacobian. Default: `false`.
    fn is_non_negative(&self) -> bool {
        false
    }
    /// Whether a streaming kernel needs a running row maximum: true only for exponential-type
    /// activations with `phi(x - c) = phi(x) * exp(-c)` (i.e. `exp`). Under an l1 normaliser the
    /// reference then evaluates `phi(s - max_j s)` and `phi'(s - max_j s)`; the maximum cancels in
    /// the ratio and in the gradient. Default: `false`.
    fn needs_running_max(&self) -> bool {
        false
    }
    /// Which of attn-core's built-ins this is. Only attn-core's own types return `Some`; kernels run
    /// their own code for a built-in instead of calling `value` and `derivative`, so a user type
    /// must keep the default `None` (it is then run through its own methods, whatever its name).
    fn builtin(&self) -> Option<Builtin> {
        None
    }
}

/// `exp(x)`; the only built-in that [needs a running maximum](Activation::needs_running_max).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exp;
/// Softplus `ln(1 + e^x)`, evaluated stably; derivative `sigmoid(x)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Softplus;
/// `max(x, 0)`; derivative 0 at 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Relu;
/// `max(x, 0)^2`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Relu2;
/// `min(max(x, 0), 6)`; derivative 1 on `(0, 6)`, else 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Relu6;
/// GELU, erf form: `x * Phi(x)`; derivative `Phi(x) + x * exp(-x^2/2)/sqrt(2 pi)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gelu;
/// Logistic sigmoid, overflow-free; derivative `sigmoid(x) * sigmoid(-x)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sigmoid;
/// Mish `x * tanh(softplus(x))`, with softplus stable and `sech^2` from `e^{-2 softplus(x)}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mish;
/// The identity `phi(x) = x`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Identity;

impl Activation for Exp {
    fn name(&self) -> &str {
        "exp"
    }
    fn builtin(&self) -> Option<Builtin> {
        Some(Builtin::Exp)
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
    fn needs_running_max(&self) -> bool {
        true
    }
}

impl Activation for Softplus {
    fn name(&self) -> &str {
        "softplus"
    }
    fn builtin(&self) -> Option<Builtin> {
        Some(Builtin::Softplus)
    }
    fn value(&self, x: f64) -> f64 {
        softplus(x)
    }
    fn derivative(&self, x: f64) -> f64 {
        sigmoid(x)
    }
    fn is_non_negative(&self) -> bool {
        true
    }
}

impl Activation for Relu {
    fn name(&self) -> &str {
        "relu"
    }
    fn builtin(&self) -> Option<Builtin> {
        Some(Builtin::Relu)
    }
    fn value(&self, x: f64) -> f64 {
        x.max(0.0)
    }
    fn derivative(&self, x: f64) -> f64 {
        if x > 0.0 { 1.0 } else { 0.0 }
    }
    fn is_non_negative(&self) -> bool {
        true
    }
}

impl Activation for Relu2 {
    fn name(&self) -> &str {
        "relu2"
    }
    fn builtin(&self) -> Option<Builtin> {
        Some(Builtin::Relu2)
    }
    fn value(&self, x: f64) -> f64 {
        let r = x.max(0.0);
        r * r
    }
    fn derivative(&self, x: f64) -> f64 {
        2.0 * x.max(0.0)
    }
    fn is_non_negative(&self) -> bool {
        true
    }
}

impl Activation for Relu6 {
    fn name(&self) -> &str {
        "relu6"
    }
    fn builtin(&self) -> Option<Builtin> {
        Some(Builtin::Relu6)
    }
    fn value(&self, x: f64) -> f64 {
        x.clamp(0.0, 6.0)
    }
    fn derivative(&self, x: f64) -> f64 {
        if x > 0.0 && x < 6.0 { 1.0 } else { 0.0 }
    }
    fn is_non_negative(&self) -> bool {
        true
    }
}

impl Activation for Gelu {
    fn name(&self) -> &str {
        "gelu"
    }
    fn builtin(&self) -> Option<Builtin> {
        Some(Builtin::Gelu)
    }
    fn value(&self, x: f64) -> f64 {
        let c = normal_cdf(x);
        if c == 0.0 { 0.0 } else { x * c } // avoid -inf * 0
    }
    fn derivative(&self, x: f64) -> f64 {
        let pdf = (-0.5 * x * x).exp() * FRAC_1_SQRT_2PI;
        normal_cdf(x) + if pdf == 0.0 { 0.0 } else { x * pdf }
    }
}

impl Activation for Sigmoid {
    fn name(&self) -> &str {
        "sigmoid"
    }
    fn builtin(&self) -> Option<Builtin> {
        Some(Builtin::Sigmoid)
    }
    fn value(&self, x: f64) -> f64 {
        sigmoid(x)
    }
    fn derivative(&self, x: f64) -> f64 {
        sigmoid(x) * sigmoid(-x)
    }
    fn is_non_negative(&self) -> bool {
        true
    }
}

impl Activation for Mish {
    fn name(&self) -> &str {
        "mish"
    }
    fn builtin(&self) -> Option<Builtin> {
        Some(Builtin::Mish)
    }
    fn value(&self, x: f64) -> f64 {
        let t = softplus(x).tanh();
        if t == 0.0 { 0.0 } else { x * t }
    }
    fn derivative(&self, x: f64) -> f64 {
        let sp = softplus(x); // >= 0
        let tanh = sp.tanh();
        let e = (-2.0 * sp).exp(); // in (0, 1]
        let sech2 = 4.0 * e / ((1.0 + e) * (1.0 + e));
        let rest = sech2 * sigmoid(x);
        tanh + if rest == 0.0 { 0.0 } else { x * rest }
    }
}

impl Activation for Identity {
    fn name(&self) -> &str {
        "identity"
    }
    fn builtin(&self) -> Option<Builtin> {
        Some(Builtin::Identity)
    }
    fn value(&self, x: f64) -> f64 {
        x
    }
    fn derivative(&self, _x: f64) -> f64 {
        1.0
    }
}

/// Every built-in activation, in a fixed order: exp, softplus, relu, relu2, relu6, gelu,
/// sigmoid, mish, identity.
pub fn builtin_activations() -> Vec<Arc<dyn Activation>> {
    Builtin::ALL.into_iter().map(Builtin::activation).collect()
}

/// The built-in activation with this [`Activation::name`], if any.
pub fn activation_by_name(name: &str) -> Option<Arc<dyn Activation>> {
    Builtin::from_name(name).map(Builtin::activation)
}

crate::listed_enum! {
    /// attn-core's built-in activations: every backend has its own code for each one. Declared
    /// with its names and [`Builtin::ALL`] in one list: a new built-in is one line here.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Builtin {
        /// [`Exp`].
        Exp => "exp",
        /// [`Softplus`].
        Softplus => "softplus",
        /// [`Relu`].
        Relu => "relu",
        /// [`Relu2`].
        Relu2 => "relu2",
        /// [`Relu6`].
        Relu6 => "relu6",
        /// [`Gelu`].
        Gelu => "gelu",
        /// [`Sigmoid`].
        Sigmoid => "sigmoid",
        /// [`Mish`].
        Mish => "mish",
        /// [`Identity`].
        Identity => "identity",
    }
}

impl Builtin {
    /// attn-core's implementation (the f64 ground truth every kernel is tested against).
    pub fn activation(self) -> Arc<dyn Activation> {
        match self {
            Builtin::Exp => Arc::new(Exp),
            Builtin::Softplus => Arc::new(Softplus),
            Builtin::Relu => Arc::new(Relu),
            Builtin::Relu2 => Arc::new(Relu2),
            Builtin::Relu6 => Arc::new(Relu6),
            Builtin::Gelu => Arc::new(Gelu),
            Builtin::Sigmoid => Arc::new(Sigmoid),
            Builtin::Mish => Arc::new(Mish),
            Builtin::Identity => Arc::new(Identity),
        }
    }

    /// The built-in with this name, if any.
    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::ALL.into_iter().find(|b| b.name() == name)
    }
}

impl fmt::Display for Builtin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
