//! Named attention variants (`Variant`): presets of SPEC section 4, the name grammar
//! (`FromStr`/`Display`), and a builder for custom variants.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::activation::{self, Activation};
use crate::error::{Error, Result};
use crate::stage::{Bias, MAX_REWEIGHT_POWER, Norm, OutputNorm, Scale, Scores, Stage1, Transform};

/// Stage 1 of softmax: exp, l1 normalisation, raw scores over sqrt(d).
fn softmax() -> Stage1 {
    Stage1::new(Arc::new(activation::Exp))
}

/// Stage 1 of activation `a` with normaliser `norm` and softmax's other parts.
fn act(a: Arc<dyn Activation>, norm: Norm) -> Stage1 {
    Stage1 { norm, ..Stage1::new(a) }
}

/// A preset: its name and its stage 1.
type Preset = (&'static str, fn() -> Stage1);

/// Every stage-1 preset of SPEC section 4, in table order, with its parameters unset: one list,
/// from which [`STAGE1_NAMES`] and [`Stage1::preset`] are derived, so a new preset is one line.
const PRESETS: [Preset; 23] = {
    use activation::*;
    [
        ("softmax", softmax),
        ("inverse", || Stage1 { transform: Transform::Inverse, ..softmax() }),
        ("recentered", || Stage1 { transform: Transform::Recentered, ..softmax() }),
        ("recentered-l1", || Stage1 { transform: Transform::RecenteredL1, ..softmax() }),
        ("linear", || act(Arc::new(Identity), Norm::None)),
        ("exp-nonorm", || act(Arc::new(Exp), Norm::None)),
        ("linear-l1", || act(Arc::new(Identity), Norm::L1)),
        ("relu-l1", || act(Arc::new(Relu), Norm::L1)),
        ("relu2-l1", || act(Arc::new(Relu2), Norm::L1)),
        ("relu6-l1", || act(Arc::new(Relu6), Norm::L1)),
        ("gelu-l1", || act(Arc::new(Gelu), Norm::L1)),
        ("sigmoid-l1", || act(Arc::new(Sigmoid), Norm::L1)),
        ("softplus-l1", || act(Arc::new(Softplus), Norm::L1)),
        ("mish-l1", || act(Arc::new(Mish), Norm::L1)),
        ("sigmoid-bias", || Stage1 { bias: Bias::LogTrainLen { t_train: None }, ..act(Arc::new(Sigmoid), Norm::None) }),
        ("sigmoid-rowbias", || Stage1 { bias: Bias::LogRowLen, ..act(Arc::new(Sigmoid), Norm::None) }),
        ("sigmoid-rowbias-l1", || Stage1 { bias: Bias::LogRowLen, ..act(Arc::new(Sigmoid), Norm::L1) }),
        ("relu-seqlen", || act(Arc::new(Relu), Norm::DivLen)),
        ("relu-rowlen", || act(Arc::new(Relu), Norm::DivN)),
        ("relu-ln", || Stage1 { output_norm: OutputNorm::LayerNorm, ..act(Arc::new(Relu), Norm::None) }),
        ("lssa", || Stage1 {
            scores: Scores::Cosine,
            scale: Scale::LssaLog { d_factor: None },
            ..act(Arc::new(Softplus), Norm::L1)
        }),
        // The ablations of LSSA's ingredients: its scores with exp in place of softplus, and
        // softmax with only the length scale (Chiang & Cholak; Scalable-Softmax).
        ("lssa-exp", || Stage1 { scores: Scores::Cosine, scale: Scale::LssaLog { d_factor: None }, ..softmax() }),
        ("softmax-logn", || Stage1 { scale: Scale::LogNOverSqrtD, ..softmax() }),
    ]
};

/// Every stage-1 preset name of SPEC section 4, in table order.
pub const STAGE1_NAMES: [&str; PRESETS.len()] = {
    let mut names = [""; PRESETS.len()];
    let mut i = 0;
    while i < PRESETS.len() {
        names[i] = PRESETS[i].0;
        i += 1;
    }
    names
};

/// The variant-name grammar, as shown in error messages.
pub const GRAMMAR: &str = "<stage1>[:<key>=<value>[,<key>=<value>]...][+rw<p>] with keys d_factor=<f64> (lssa) and t_train=<usize> (sigmoid-bias), 1 <= p <= 1024";

impl Stage1 {
    /// The stage 1 of a preset name of SPEC section 4 (parameters unset), or `None`.
    pub fn preset(name: &str) -> Option<Stage1> {
        PRESETS.iter().find(|(n, _)| *n == name).map(|(_, make)| make())
    }

    /// The preset name this stage 1 is (ignoring its `d_factor`/`t_train` values), if any.
    pub fn preset_name(&self) -> Option<&'static str> {
        let mut bare = self.clone();
        if let Scale::LssaLog { .. } = bare.scale {
            bare.scale = Scale::LssaLog { d_factor: None };
        }
        if let Bias::LogTrainLen { .. } = bare.bias {
            bare.bias = Bias::LogTrainLen { t_train: None };
        }
        STAGE1_NAMES.iter().copied().find(|name| Stage1::preset(name).is_some_and(|p| p == bare))
    }
}

/// An attention variant: stage 1 plus optional re-weighting with power `p` (SPEC sections 2-4).
///
/// Parse one from its name (`"lssa+rw15".parse::<Variant>()`), build one from parts with
/// [`Variant::builder`] or [`Variant::new`]; read it through [`Variant::stage1`] and
/// [`Variant::reweight`]. `Display` prints the name back; a stage 1
/// that is no preset prints as `custom(...)`, which does not parse.
#[derive(Clone, Debug, PartialEq)]
pub struct Variant {
    stage1: Stage1,
    reweight: Option<u32>,
}

impl Variant {
    /// Stage 1: the positivity map and the scores, scale, bias, normaliser, transform and output
    /// norm around it.
    pub fn stage1(&self) -> &Stage1 {
        &self.stage1
    }

    /// Re-weighting power `p` of stage 2 (`None`: no re-weighting), in `1..=MAX_REWEIGHT_POWER`.
    pub fn reweight(&self) -> Option<u32> {
        self.reweight
    }

    /// A variant from a stage 1 and an optional re-weighting power (checked).
    pub fn new(stage1: Stage1, reweight: Option<u32>) -> Result<Self> {
        let v = Variant { stage1, reweight };
        v.check_power()?;
        Ok(v)
    }

    /// A builder starting from `softmax` (exp, dot, `1/sqrt(d)`, no bias, l1, no re-weighting).
    pub fn builder() -> VariantBuilder {
        VariantBuilder { stage1: Stage1::new(Arc::new(activation::Exp)), reweight: None }
    }

    /// The named preset without parameters or re-weighting (`None` for unknown names).
    pub fn preset(name: &str) -> Option<Self> {
        Stage1::preset(name).map(|stage1| Variant { stage1, reweight: None })
    }

    /// This variant with `p` re-weighting (replacing any previous `p`).
    pub fn with_reweight(mut self, p: u32) -> Result<Self> {
        self.reweight = Some(p);
        self.check_power()?;
        Ok(self)
    }

    /// This variant without re-weighting.
    pub fn without_reweight(mut self) -> Self {
        self.reweight = None;
        self
    }

    /// Fill in `T_train` of a [`Bias::LogTrainLen`] bias if it is unset; otherwise unchanged.
    pub fn with_train_len(mut self, t_train: usize) -> Self {
        if let Bias::LogTrainLen { t_train: t @ None } = &mut self.stage1.bias {
            *t = Some(t_train);
        }
        self
    }

    /// The activation `phi`.
    pub fn activation(&self) -> &dyn Activation {
        &*self.stage1.activation
    }

    /// Whether a streaming kernel needs a running row maximum (only exp under l1, e.g. softmax).
    pub fn needs_running_max(&self) -> bool {
        self.stage1.needs_running_max()
    }

    /// Whether the final rows are non-negative and sum to 1 (or are all zero for a zero-sum l1
    /// row): stage 1 [rows sum to one](Stage1::rows_sum_to_one); re-weighting keeps it.
    pub fn rows_sum_to_one(&self) -> bool {
        self.stage1.rows_sum_to_one()
    }

    /// Whether a fused kernel can stream the row: stage 1 [is streamable](Stage1::is_streamable)
    /// and, with re-weighting, stage 1 is a non-negative l1 without transform, so that
    /// `m_i = N_i max_j f_ij / Z_i - off_i` follows from the first sweep (SPEC section 6).
    pub fn is_streamable(&self) -> bool {
        self.stage1.is_streamable() && (self.reweight.is_none() || self.stage1.rows_sum_to_one())
    }

    /// Check every parameter (`p` range, `t_train` set, `d_factor` finite).
    pub fn validate(&self) -> Result<()> {
        self.check_power()?;
        self.stage1.validate()
    }

    fn check_power(&self) -> Result<()> {
        match self.reweight {
            Some(p) if p == 0 || p > MAX_REWEIGHT_POWER => {
                Err(Error::InvalidPower { p: u64::from(p), max: MAX_REWEIGHT_POWER })
            }
            _ => Ok(()),
        }
    }

    /// Final weights of one row from its `N_i = scores.len()` unmasked scores (stage 1, then
    /// stage 2 if set). `p` is not checked here. As [`Stage1::weights_from_scores`], the row is the
    /// last of its sequence: [`Norm::DivLen`] divides by `L = N_i`.
    pub fn weights_from_scores(&self, scores: &[f64]) -> Vec<f64> {
        crate::stage::row_forward(&self.stage1, self.reweight, scores, scores.len(), false).w().to_vec()
    }

    /// Every preset of SPEC section 4 without re-weighting (`sigmoid-bias` with `t_train` unset).
    pub fn all_presets() -> Vec<Variant> {
        STAGE1_NAMES.iter().filter_map(|n| Variant::preset(n)).collect()
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stage1;
        match s.preset_name() {
            Some(name) => {
                f.write_str(name)?;
                let mut params = Vec::new();
                if let Scale::LssaLog { d_factor: Some(x) } = s.scale {
                    params.push(format!("d_factor={x:?}"));
                }
                if let Bias::LogTrainLen { t_train: Some(t) } = s.bias {
                    params.push(format!("t_train={t}"));
                }
                if !params.is_empty() {
                    write!(f, ":{}", params.join(","))?;
                }
            }
            None => write!(
                f,
                "custom(activation={},scores={:?},scale={:?},bias={:?},norm={:?},transform={:?},output_norm={:?})",
                s.activation.name(),
                s.scores,
                s.scale,
                s.bias,
                s.norm,
                s.transform,
                s.output_norm
            )?,
        }
        if let Some(p) = self.reweight {
            write!(f, "+rw{p}")?;
        }
        Ok(())
    }
}

impl FromStr for Variant {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        let bad = |reason: String| Error::ParseVariant { name: name.to_string(), reason };
        let (head, reweight) = match name.split_once('+') {
            None => (name, None),
            Some((head, tail)) => {
                let digits = tail
                    .strip_prefix("rw")
                    .ok_or_else(|| bad(format!("expected `+rw<p>` after the stage-1 name, found `+{tail}`")))?;
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad(format!("`+rw{digits}`: p must be a positive integer")));
                }
                let p: u64 = digits.parse().unwrap_or(u64::MAX);
                if p == 0 || p > u64::from(MAX_REWEIGHT_POWER) {
                    return Err(Error::InvalidPower { p, max: MAX_REWEIGHT_POWER });
                }
                (head, Some(p as u32))
            }
        };
        let (base, params) = match head.split_once(':') {
            None => (head, None),
            Some((b, p)) => (b, Some(p)),
        };
        let mut stage1 = Stage1::preset(base).ok_or_else(|| Error::UnknownVariant {
            name: name.to_string(),
            valid: STAGE1_NAMES.join(", "),
            grammar: GRAMMAR,
        })?;
        if let Some(params) = params {
            let mut seen: Vec<&str> = Vec::new();
            for kv in params.split(',') {
                let (key, value) =
                    kv.split_once('=').ok_or_else(|| bad(format!("parameter `{kv}` is not `<key>=<value>`")))?;
                if seen.contains(&key) {
                    return Err(bad(format!("parameter `{key}` given twice")));
                }
                seen.push(key);
                match (key, &mut stage1.scale, &mut stage1.bias) {
                    ("d_factor", Scale::LssaLog { d_factor }, _) => {
                        let x: f64 = value.parse().map_err(|_| Error::InvalidParameter {
                            param: "d_factor",
                            value: value.to_string(),
                            reason: "not a number",
                        })?;
                        if !x.is_finite() {
                            return Err(Error::InvalidParameter {
                                param: "d_factor",
                                value: value.to_string(),
                                reason: "must be finite",
                            });
                        }
                        *d_factor = Some(x);
                    }
                    ("t_train", _, Bias::LogTrainLen { t_train }) => {
                        let t: usize = value.parse().map_err(|_| Error::InvalidParameter {
                            param: "t_train",
                            value: value.to_string(),
                            reason: "not a non-negative integer",
                        })?;
                        if t == 0 {
                            return Err(Error::InvalidParameter {
                                param: "t_train",
                                value: value.to_string(),
                                reason: "the training length must be >= 1",
                            });
                        }
                        *t_train = Some(t);
                    }
                    _ => {
                        return Err(bad(format!(
                            "`{base}` takes no parameter `{key}` (d_factor: lssa only; t_train: sigmoid-bias only)"
                        )));
                    }
                }
            }
        }
        Ok(Variant { stage1, reweight })
    }
}

/// Builds a [`Variant`] from parts; starts from `softmax`. See [`Variant::builder`].
#[derive(Clone, Debug)]
pub struct VariantBuilder {
    stage1: Stage1,
    reweight: Option<u32>,
}

impl VariantBuilder {
    /// Start from a named preset's stage 1 instead of softmax (unknown names give an error).
    pub fn preset(mut self, name: &str) -> Result<Self> {
        self.stage1 = Stage1::preset(name).ok_or_else(|| Error::UnknownVariant {
            name: name.to_string(),
            valid: STAGE1_NAMES.join(", "),
            grammar: GRAMMAR,
        })?;
        Ok(self)
    }
    /// Set `phi` (any [`Activation`], e.g. your own).
    pub fn activation(mut self, activation: impl Activation + 'static) -> Self {
        self.stage1.activation = Arc::new(activation);
        self
    }
    /// Set `phi` from a shared pointer.
    pub fn activation_arc(mut self, activation: Arc<dyn Activation>) -> Self {
        self.stage1.activation = activation;
        self
    }
    /// Set the score kind.
    pub fn scores(mut self, scores: Scores) -> Self {
        self.stage1.scores = scores;
        self
    }
    /// Set the scale.
    pub fn scale(mut self, scale: Scale) -> Self {
        self.stage1.scale = scale;
        self
    }
    /// Set the bias.
    pub fn bias(mut self, bias: Bias) -> Self {
        self.stage1.bias = bias;
        self
    }
    /// Set the normaliser.
    pub fn norm(mut self, norm: Norm) -> Self {
        self.stage1.norm = norm;
        self
    }
    /// Set the transform.
    pub fn transform(mut self, transform: Transform) -> Self {
        self.stage1.transform = transform;
        self
    }
    /// Set the output normalisation.
    pub fn output_norm(mut self, output_norm: OutputNorm) -> Self {
        self.stage1.output_norm = output_norm;
        self
    }
    /// Set the re-weighting power `p` (checked by [`build`](Self::build)).
    pub fn reweight(mut self, p: u32) -> Self {
        self.reweight = Some(p);
        self
    }
    /// The variant; errors on `p` out of range (parameters such as `t_train` are checked at use).
    pub fn build(self) -> Result<Variant> {
        Variant::new(self.stage1, self.reweight)
    }
}
