//! The crate's typed error (`attn_core::Error`): every failure reachable from the public API.

/// Everything the public API can refuse. Messages name the argument and the sizes involved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An input array does not have the shape the other inputs imply.
    #[error("shape mismatch: `{arg}` has shape {got:?} but {expected_from} implies {}", shape_pattern(.expected))]
    ShapeMismatch {
        /// The offending argument (`"k"`, `"v"`, `"d_out"`, ...).
        arg: &'static str,
        /// Its shape.
        got: Vec<usize>,
        /// The shape it should have (`usize::MAX` marks a free axis).
        expected: Vec<usize>,
        /// Which argument the expectation comes from.
        expected_from: &'static str,
    },
    /// An axis that must be non-empty has size 0 (`T = 0` or `d = 0`).
    #[error("`{arg}` has {axis} = {got}; need {axis} >= {min}")]
    EmptyAxis {
        /// The offending argument.
        arg: &'static str,
        /// The axis name (`"T"`, `"d"`).
        axis: &'static str,
        /// Its size (0).
        got: usize,
        /// The smallest size accepted.
        min: usize,
    },
    /// An input holds a NaN or an infinity.
    #[error("non-finite value {value} in `{arg}` at index {index:?}")]
    NonFinite {
        /// The offending argument.
        arg: &'static str,
        /// Index (b, h, t, c) of the first non-finite element.
        index: [usize; 4],
        /// The value found there.
        value: f64,
    },
    /// The re-weighting power `p` is outside `1..=max`.
    #[error("re-weighting power p = {p} is out of range; need 1 <= p <= {max}")]
    InvalidPower {
        /// The power given.
        p: u64,
        /// The largest power accepted ([`crate::stage::MAX_REWEIGHT_POWER`]).
        max: u32,
    },
    /// A variant needs a parameter it was not given (e.g. `sigmoid-bias` without `t_train`).
    #[error(
        "variant `{variant}` needs parameter `{param}`; write `{variant}:{param}=<value>` or call `Variant::with_train_len`"
    )]
    MissingParameter {
        /// The variant's stage-1 name.
        variant: String,
        /// The missing parameter.
        param: &'static str,
    },
    /// A parameter has a value outside its domain.
    #[error("invalid value `{value}` for `{param}`: {reason}")]
    InvalidParameter {
        /// The parameter name.
        param: &'static str,
        /// The value given, as text.
        value: String,
        /// What is required.
        reason: &'static str,
    },
    /// A variant name does not name any known stage 1.
    #[error("unknown attention variant `{name}`; valid stage-1 names: {valid}; grammar: {grammar}")]
    UnknownVariant {
        /// The name given.
        name: String,
        /// The valid stage-1 names, comma separated.
        valid: String,
        /// The name grammar.
        grammar: &'static str,
    },
    /// A variant name is malformed (bad `+rw<p>` suffix, bad or unknown parameter).
    #[error("cannot parse attention variant `{name}`: {reason}")]
    ParseVariant {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// RoPE needs an even, non-zero head dimension.
    #[error("RoPE needs an even head dimension d >= 2, got d = {head_dim}")]
    OddHeadDim {
        /// The head dimension given.
        head_dim: usize,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A shape with its free axes (`usize::MAX`) written `_`: `[1, 2, 9, _]`.
fn shape_pattern(shape: &[usize]) -> String {
    let axes: Vec<String> = shape.iter().map(|&n| if n == usize::MAX { "_".into() } else { n.to_string() }).collect();
    format!("[{}]", axes.join(", "))
}
