//! Model configuration: a serde/TOML struct with documented defaults and named presets.

use attn_core::Variant;
use serde::{Deserialize, Serialize};

/// Which attention implementation the model runs. Both give the same results (tested); they differ
/// in memory and speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AttnImpl {
    /// Plain tch ops with a materialised `T x T` weight matrix, autograd-native; every variant.
    Reference,
    /// `attn-kernels` through the C++ autograd bridge: O(T·d) memory, on the CPU and on CUDA. Variants
    /// without a fused kernel fall back to `Reference` with a one-time warning. Plain `softmax` on a
    /// GPU runs libtorch's `scaled_dot_product_attention` (FlashAttention), the baseline a nanoGPT
    /// user gets, so that comparisons with LSSA are against the best softmax; on the CPU it runs SDPA
    /// up to `attention::SDPA_CPU_MAX_LEN` rows, where SDPA is faster, and our kernel beyond, where
    /// ours is (`docs/bench/train-cpu.md`, `docs/bench/kernels-cpu.md`).
    #[default]
    Fused,
    /// As `Fused`, but softmax on a GPU runs our own kernel too (to benchmark it against SDPA).
    #[serde(rename = "fused-own")]
    FusedOwn,
}

/// How a model's parameters are drawn before training ([`ModelConfig::init`]; `model.init` in TOML).
///
/// Both schemes draw, in order, the embedding `wte`, then per block the query-key-value projection
/// `c_attn`, the attention output `attn.c_proj`, the MLP input `mlp.c_fc` and the MLP output
/// `mlp.c_proj` (weight, then bias); LayerNorms are ones (gain) and zeros (bias) in both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Init {
    /// GPT-2's (`"gpt2"`, the default): `wte` and every weight normal(0, 0.02), except the two
    /// residual projections (`attn.c_proj`, `mlp.c_proj`), normal(0, 0.02 / sqrt(2 n_layer)); biases
    /// zero.
    #[default]
    #[serde(rename = "gpt2")]
    Gpt2,
    /// What a PyTorch user's own model gets (`"torch-default"`): every linear layer as `nn.Linear`
    /// initialises it, weight and bias uniform in `[-1/sqrt(fan_in), 1/sqrt(fan_in)]` (`fan_in`: the
    /// layer's input width); `wte` normal(0, 0.02) as in GPT-2, since the embedding is tied with the
    /// output layer and PyTorch's normal(0, 1) embedding would make the initial logits useless.
    #[serde(rename = "torch-default")]
    TorchDefault,
}

impl Init {
    /// Every scheme, by its TOML name.
    pub const ALL: [Init; 2] = [Init::Gpt2, Init::TorchDefault];

    /// The name in TOML (`gpt2`, `torch-default`).
    pub fn name(self) -> &'static str {
        match self {
            Init::Gpt2 => "gpt2",
            Init::TorchDefault => "torch-default",
        }
    }
}

impl std::fmt::Display for Init {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Init {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Init::ALL
            .into_iter()
            .find(|i| i.name() == s)
            .ok_or_else(|| format!("unknown initialisation `{s}`: expected {}", Init::ALL.map(Init::name).join(" or ")))
    }
}

/// GPT-2 with RoPE. Every field has a default (GPT-2 small, SPEC section 7) so a TOML file only
/// lists what it changes; unknown keys are an error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads per block.
    pub n_head: usize,
    /// Residual stream width; the head dimension is `d_model / n_head` (64 in every preset, since
    /// LSSA's `ln(d)` factor was only validated at 64).
    pub d_model: usize,
    /// The tokenizer's vocabulary size (50257 for GPT-2); the embedding is padded to a multiple of 64.
    pub vocab_size: usize,
    /// Training context length `T_train`.
    pub context_len: usize,
    /// RoPE base `b` (10000, SPEC section 7 \[choice\]); scaled as `b s^(d/(d-2))` at `s x T_train`.
    pub rope_base: f64,
    /// Attention variant, written by name in TOML (attn-core grammar, e.g. `lssa+rw15`) and parsed
    /// when the config is read (a bad name is an error naming this key); the training-time
    /// re-weighting, if any, is part of the name.
    #[serde(with = "variant_name")]
    pub attention: Variant,
    /// Attention implementation.
    pub attn_impl: AttnImpl,
    /// MLP hidden width as a multiple of `d_model`.
    pub mlp_ratio: usize,
    /// How the parameters are drawn ([`Init`]: `"gpt2"` by default, or `"torch-default"`).
    pub init: Init,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self::gpt2_124m()
    }
}

/// Error of [`ModelConfig::validate`] and the TOML loader.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A field has an unusable value.
    #[error("model config field `{field}` = {value}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is required.
        reason: String,
    },
    /// The TOML does not parse (unknown keys included).
    #[error("model config: {0}")]
    Toml(#[from] toml::de::Error),
    /// An unknown preset name.
    #[error("unknown model preset `{0}`; presets: {presets}", presets = PRESETS.join(", "))]
    UnknownPreset(String),
}

/// Names accepted by [`ModelConfig::preset`].
pub const PRESETS: &[&str] = &["gpt2-124m", "tiny", "cpu-small", "cpu-medium"];

impl ModelConfig {
    /// GPT-2 small (124M) exactly as SPEC section 7: 12 layers, 12 heads, width 768, head dim 64,
    /// vocabulary 50257 (padded to 50304), context 1024, RoPE base 10000, softmax attention.
    pub fn gpt2_124m() -> Self {
        Self {
            n_layer: 12,
            n_head: 12,
            d_model: 768,
            vocab_size: 50257,
            context_len: 1024,
            rope_base: 10000.0,
            attention: Variant::preset("softmax").expect("softmax is a preset"),
            attn_impl: AttnImpl::Fused,
            mlp_ratio: 4,
            init: Init::Gpt2,
        }
    }

    /// A named preset: `gpt2-124m`; `tiny` (2 x 128, 2 heads, for tests: trains in seconds);
    /// `cpu-small` (4 x 256, 4 heads, 8K vocabulary, T = 128: minutes on 2 cores);
    /// `cpu-medium` (6 x 384, 6 heads, 8K vocabulary, T = 256). Head dim 64 in all.
    pub fn preset(name: &str) -> Result<Self, ConfigError> {
        let base = Self::gpt2_124m();
        Ok(match name {
            "gpt2-124m" => base,
            "tiny" => Self { n_layer: 2, n_head: 2, d_model: 128, vocab_size: 256, context_len: 64, ..base },
            "cpu-small" => Self { n_layer: 4, n_head: 4, d_model: 256, vocab_size: 8192, context_len: 128, ..base },
            "cpu-medium" => Self { n_layer: 6, n_head: 6, d_model: 384, vocab_size: 8192, context_len: 256, ..base },
            other => return Err(ConfigError::UnknownPreset(other.to_string())),
        })
    }

    /// Parses a TOML document (missing fields take the defaults; unknown keys are errors) and
    /// validates it.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let cfg: Self = toml::from_str(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The config as TOML (what checkpoints and results embed).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a ModelConfig always serialises")
    }

    /// Checks sizes and the attention variant's parameters.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_sizes()?;
        if let Err(e) = self.variant() {
            let reason = e.to_string();
            return Err(ConfigError::Invalid { field: "attention", value: self.attention.to_string(), reason });
        }
        Ok(())
    }

    /// Checks every field but the attention variant.
    pub(crate) fn validate_sizes(&self) -> Result<(), ConfigError> {
        let bad =
            |field, value: String, reason: &str| Err(ConfigError::Invalid { field, value, reason: reason.into() });
        if self.n_layer == 0 {
            return bad("n_layer", "0".into(), "need at least one block");
        }
        if self.n_head == 0 || !self.d_model.is_multiple_of(self.n_head) {
            return bad("n_head", self.n_head.to_string(), &format!("must divide d_model = {}", self.d_model));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad("d_model", self.d_model.to_string(), "the head dimension must be even for RoPE");
        }
        if self.vocab_size == 0 {
            return bad("vocab_size", "0".into(), "need a vocabulary");
        }
        if self.context_len == 0 {
            return bad("context_len", "0".into(), "need a context");
        }
        if !(self.rope_base > 1.0 && self.rope_base.is_finite()) {
            return bad("rope_base", self.rope_base.to_string(), "must be a finite number > 1");
        }
        if self.mlp_ratio == 0 {
            return bad("mlp_ratio", "0".into(), "must be >= 1");
        }
        Ok(())
    }

    /// Head dimension `d_model / n_head`.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_head
    }

    /// Vocabulary rounded up to a multiple of 64 (50257 -> 50304), the embedding's row count.
    pub fn padded_vocab(&self) -> usize {
        self.vocab_size.div_ceil(64) * 64
    }

    /// The attention variant, with the training length filled in for `sigmoid-bias`, validated.
    pub fn variant(&self) -> Result<Variant, attn_core::Error> {
        let v = self.attention.clone().with_train_len(self.context_len);
        v.validate()?;
        Ok(v)
    }

    /// Trainable parameters (the tied embedding counted once): embedding `V_pad d`, per block
    /// `12 d^2 + 13 d` for `mlp_ratio = 4` (attention `4 d^2 + 4 d`, MLP `2 r d^2 + (r + 1) d`, two
    /// LayerNorms `4 d`), final LayerNorm `2 d`. No position embedding (RoPE).
    pub fn n_params(&self) -> usize {
        let (d, r) = (self.d_model, self.mlp_ratio);
        let block = (4 * d * d + 4 * d) + (2 * r * d * d + (r + 1) * d) + 4 * d;
        self.padded_vocab() * d + self.n_layer * block + 2 * d
    }

    /// Training FLOPs per token at context `t`: `6 N + 12 L d_model t` (PaLM appendix B; the
    /// second term is the attention scores and weighted sum, forward and backward). Used for MFU.
    pub fn flops_per_token(&self, t: usize) -> f64 {
        6.0 * self.n_params() as f64 + 12.0 * (self.n_layer * self.d_model * t) as f64
    }
}

/// [`ModelConfig::attention`] as its name in TOML: written with `Display`, read with `FromStr`, so a
/// config holds a parsed [`Variant`] from the moment it is read.
mod variant_name {
    use attn_core::Variant;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(variant: &Variant, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(variant)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Variant, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(|e| D::Error::custom(format!("attention = {name:?}: {e}")))
    }
}
