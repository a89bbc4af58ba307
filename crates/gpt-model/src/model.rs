//! GPT-2 with RoPE (NTK-scaled at long lengths) and any attention variant: the model, its forward,
//! the KV-cached forward for generation, and the loss.

use tch::nn;

/// What [`Gpt::forward_probed`] calls per layer: `(layer, q, k, variant)`.
pub type AttnProbe<'a> = dyn FnMut(usize, &Tensor, &Tensor, &attn_core::Variant) + 'a;

use tch::{Device, Kind, Tensor};

use crate::attention::{self, AttentionError};
use crate::config::{AttnImpl, ConfigError, ModelConfig};

/// Errors of the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The config is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The attention failed.
    #[error(transparent)]
    Attention(#[from] AttentionError),
    /// The attention variant does not parse or misses a parameter.
    #[error(transparent)]
    Variant(#[from] attn_core::Error),
    /// Bad input to a forward call.
    #[error("{0}")]
    Input(String),
}

/// Evaluation-time knobs; `Default` is the training forward.
#[derive(Clone, Debug, Default)]
pub struct ForwardOptions {
    /// Evaluation length as a multiple `s` of the training length: the RoPE base becomes
    /// `b s^(d/(d-2))` when `ntk` is set and `s > 1` (SPEC section 7). `None` means 1.
    pub length_scale: Option<f64>,
    /// Apply NTK scaling of the RoPE base (default false: plain RoPE).
    pub ntk: bool,
    /// Post-hoc re-weighting: replace the variant's power `p` (or add one) at evaluation, without
    /// retraining (SPEC section 3 \[choice\]).
    pub reweight: Option<u32>,
    /// Override the configured attention implementation.
    pub attn_impl: Option<AttnImpl>,
}

/// One layer's cached keys (after RoPE) and values, `(B, H, T_cached, d)`.
#[derive(Debug, Default)]
pub struct LayerCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
}

/// The KV cache of a generation: one [`LayerCache`] per block.
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<LayerCache>,
}

impl KvCache {
    /// Tokens already in the cache.
    pub fn len(&self) -> i64 {
        self.layers.first().and_then(|l| l.k.as_ref()).map_or(0, |k| k.size()[2])
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug)]
struct Block {
    ln_1: nn::LayerNorm,
    c_attn: nn::Linear,
    attn_proj: nn::Linear,
    ln_2: nn::LayerNorm,
    c_fc: nn::Linear,
    mlp_proj: nn::Linear,
}

/// GPT-2 with RoPE: token embedding tied with the output layer, pre-LayerNorm blocks, GELU MLP,
/// RoPE on `q` and `k` before any normalisation the attention variant applies.
#[derive(Debug)]
pub struct Gpt {
    cfg: ModelConfig,
    variant: attn_core::Variant,
    wte: Tensor,
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
}

fn linear(p: nn::Path<'_>, i: usize, o: usize, std: f64) -> nn::Linear {
    let cfg = nn::LinearConfig {
        ws_init: nn::Init::Randn { mean: 0.0, stdev: std },
        bs_init: Some(nn::Init::Const(0.0)),
        bias: true,
    };
    nn::linear(p, i as i64, o as i64, cfg)
}

fn layer_norm(p: nn::Path<'_>, d: usize) -> nn::LayerNorm {
    nn::layer_norm(p, vec![d as i64], Default::default())
}

/// Runs `f` with libtorch's process-wide generator seeded to `seed`, while no other thread
/// initialises a model (through [`Gpt::new`] or another `with_seed`): what `f` draws is a function of
/// `seed` alone. Several trainings in one process (the experiment runner's parallel jobs, tests)
/// need this; `tch::manual_seed` followed by an initialisation is a race there, since any other
/// thread's [`Gpt::new`] (a model built to load a checkpoint into, say) draws from the same generator.
pub fn with_seed<T>(seed: i64, f: impl FnOnce() -> T) -> T {
    exclusive_init(|| {
        tch::manual_seed(seed);
        f()
    })
}

/// Runs `f` holding the process's initialisation lock (re-entrant on the thread that holds it).
fn exclusive_init<T>(f: impl FnOnce() -> T) -> T {
    use std::cell::Cell;
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    thread_local!(static HELD: Cell<bool> = const { Cell::new(false) });
    if HELD.get() {
        return f();
    }
    let _lock = INIT.lock().unwrap_or_else(|e| e.into_inner());
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            HELD.set(false);
        }
    }
    HELD.set(true);
    let _release = Release;
    f()
}

impl Gpt {
    /// Builds the model's parameters under `vs` (names follow GPT-2: `wte`, `h.{i}.attn.c_attn`, ...),
    /// initialised as GPT-2: normal(0, 0.02), residual projections normal(0, 0.02 / sqrt(2 L)),
    /// zero biases, unit LayerNorms.
    ///
    /// Initialisation draws from libtorch's process-wide generator; it runs under
    /// [`with_seed`]'s lock, so it never draws between another thread's seeding and that thread's
    /// initialisation.
    pub fn new(vs: &nn::Path<'_>, cfg: &ModelConfig) -> Result<Self, ModelError> {
        exclusive_init(|| Self::build(vs, cfg))
    }

    /// [`Gpt::new`] with the generator seeded to `seed` first: the initial weights are a function of
    /// `seed` alone, whatever other threads of the process initialise meanwhile.
    pub fn new_seeded(vs: &nn::Path<'_>, cfg: &ModelConfig, seed: i64) -> Result<Self, ModelError> {
        with_seed(seed, || Self::build(vs, cfg))
    }

    fn build(vs: &nn::Path<'_>, cfg: &ModelConfig) -> Result<Self, ModelError> {
        cfg.validate()?;
        let variant = cfg.variant()?;
        let d = cfg.d_model;
        let std = 0.02;
        let resid_std = 0.02 / (2.0 * cfg.n_layer as f64).sqrt();
        let wte = vs.var("wte", &[cfg.padded_vocab() as i64, d as i64], nn::Init::Randn { mean: 0.0, stdev: std });
        let h = vs / "h";
        let blocks = (0..cfg.n_layer)
            .map(|i| {
                let b = &h / i;
                Block {
                    ln_1: layer_norm(&b / "ln_1", d),
                    c_attn: linear(&b / "attn" / "c_attn", d, 3 * d, std),
                    attn_proj: linear(&b / "attn" / "c_proj", d, d, resid_std),
                    ln_2: layer_norm(&b / "ln_2", d),
                    c_fc: linear(&b / "mlp" / "c_fc", d, cfg.mlp_ratio * d, std),
                    mlp_proj: linear(&b / "mlp" / "c_proj", cfg.mlp_ratio * d, d, resid_std),
                }
            })
            .collect();
        let ln_f = layer_norm(vs / "ln_f", d);
        Ok(Self { cfg: cfg.clone(), variant, wte, blocks, ln_f })
    }

    /// The config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The attention variant the model was built with.
    pub fn variant(&self) -> &attn_core::Variant {
        &self.variant
    }

    /// Logits `(B, T, V_pad)` of token ids `idx` `(B, T)` (int64).
    pub fn forward(&self, idx: &Tensor, opts: &ForwardOptions) -> Result<Tensor, ModelError> {
        self.forward_from(idx, 0, None, opts, None)
    }

    /// [`Gpt::forward`] that also hands every layer's queries and keys (after RoPE, `(B, H, T, hd)`)
    /// and the attention variant in use to `probe(layer, q, k, variant)`: for attention statistics
    /// (sinks, entropy, maps) without a second copy of the model's forward pass.
    pub fn forward_probed(
        &self,
        idx: &Tensor,
        opts: &ForwardOptions,
        probe: &mut AttnProbe<'_>,
    ) -> Result<Tensor, ModelError> {
        self.forward_from(idx, 0, None, opts, Some(probe))
    }

    /// Mean cross-entropy (nats/token) of predicting `targets` `(B, T)` from `idx` `(B, T)`, over the
    /// real (unpadded) vocabulary.
    pub fn loss(&self, idx: &Tensor, targets: &Tensor, opts: &ForwardOptions) -> Result<Tensor, ModelError> {
        let logits = self.forward(idx, opts)?;
        Ok(self.loss_from_logits(&logits, targets))
    }

    /// Cross-entropy of `(B, T, V_pad)` logits against `(B, T)` targets over the real vocabulary.
    pub fn loss_from_logits(&self, logits: &Tensor, targets: &Tensor) -> Tensor {
        let v = self.cfg.vocab_size as i64;
        let logits = logits.narrow(-1, 0, v); // drop the padding columns
        logits.reshape([-1, v]).to_kind(Kind::Float).cross_entropy_for_logits(&targets.reshape([-1]))
    }

    /// Logits of new tokens `idx` `(B, T_new)` continuing what `cache` holds (positions
    /// `cache.len()..`), appending their keys and values to it. With LSSA/LSSAR the scores of row `i`
    /// depend on its absolute position through `ln(N_i)`, which the cached path passes on, so the
    /// logits equal the full forward's (tested).
    ///
    /// Except with `relu-seqlen` (`ReLU(s) / L`, `L` the length of the window being processed):
    /// each call divides its rows by the number of keys so far, so a cached step equals the last
    /// row of a full forward over its prefix only in a one-layer model. With more layers the cached
    /// keys and values of earlier positions come from shorter windows than a full forward's, and
    /// token-by-token decoding computes `relu-rowlen`'s full forward instead (tested).
    pub fn forward_cached(
        &self,
        idx: &Tensor,
        cache: &mut KvCache,
        opts: &ForwardOptions,
    ) -> Result<Tensor, ModelError> {
        if cache.layers.is_empty() {
            cache.layers = (0..self.cfg.n_layer).map(|_| LayerCache::default()).collect();
        }
        let offset = cache.len();
        self.forward_from(idx, offset, Some(cache), opts, None)
    }

    #[allow(clippy::assign_op_pattern)] // `x = x + ..` is out of place on purpose (see below)
    fn forward_from(
        &self,
        idx: &Tensor,
        offset: i64,
        mut cache: Option<&mut KvCache>,
        opts: &ForwardOptions,
        mut probe: Option<&mut AttnProbe<'_>>,
    ) -> Result<Tensor, ModelError> {
        let size = idx.size();
        if size.len() != 2 {
            return Err(ModelError::Input(format!("token ids must be (B, T), got shape {size:?}")));
        }
        let (b, t) = (size[0], size[1]);
        let (h, hd) = (self.cfg.n_head as i64, self.cfg.head_dim() as i64);
        let variant = match opts.reweight {
            Some(p) => self.variant.clone().with_reweight(p)?,
            None => self.variant.clone(),
        };
        let imp = opts.attn_impl.unwrap_or(self.cfg.attn_impl);
        let device = self.wte.device();
        let (cos, sin) = self.rope_tables(offset, t, opts, device);
        let mut x = Tensor::embedding(&self.wte, idx, -1, false, false); // (B, T, d)
        for (layer, blk) in self.blocks.iter().enumerate() {
            let qkv = x.apply(&blk.ln_1).apply(&blk.c_attn); // (B, T, 3d)
            let split = qkv.split(self.cfg.d_model as i64, 2);
            let heads = |t_: &Tensor| t_.view([b, t, h, hd]).transpose(1, 2); // (B, H, T, hd)
            let q = rope(&heads(&split[0]), &cos, &sin);
            let mut k = rope(&heads(&split[1]), &cos, &sin);
            let mut v = heads(&split[2]);
            if let Some(cache) = cache.as_deref_mut() {
                let lc = &mut cache.layers[layer];
                if let (Some(pk), Some(pv)) = (&lc.k, &lc.v) {
                    k = Tensor::cat(&[pk, &k], 2);
                    v = Tensor::cat(&[pv, &v], 2);
                }
                lc.k = Some(k.shallow_clone());
                lc.v = Some(v.shallow_clone());
            }
            if let Some(probe) = probe.as_deref_mut() {
                probe(layer, &q, &k, &variant);
            }
            let y = attention::attend(&q, &k, &v, &variant, imp, offset)?; // (B, H, T, hd)
            let y = y.transpose(1, 2).contiguous().view([b, t, self.cfg.d_model as i64]);
            // Not `+=`: on a tch tensor that is an in-place add, which breaks autograd (the LayerNorm
            // saved `x` for its backward).
            x = x + y.apply(&blk.attn_proj);
            let m = x.apply(&blk.ln_2).apply(&blk.c_fc).gelu("none").apply(&blk.mlp_proj);
            x = x + m;
        }
        let x = x.apply(&self.ln_f);
        Ok(x.matmul(&self.wte.tr())) // (B, T, V_pad), tied weights
    }

    /// `cos`, `sin` of the RoPE angles for positions `offset..offset + t`: `(t, hd/2)` each, in the
    /// model's dtype. Rotate-half pairing, `inv_freq_c = base^(-2c/d)` (as `attn_core::rope_apply`).
    fn rope_tables(&self, offset: i64, t: i64, opts: &ForwardOptions, device: Device) -> (Tensor, Tensor) {
        let hd = self.cfg.head_dim();
        let s = opts.length_scale.unwrap_or(1.0);
        let base = if opts.ntk { attn_core::ntk_rope_base(self.cfg.rope_base, hd, s) } else { self.cfg.rope_base };
        let inv_freq = attn_core::rope_inv_freq(base, hd).expect("head dim validated even");
        let inv_freq = Tensor::from_slice(&inv_freq).to_device(device); // (hd/2,) f64
        let pos = Tensor::arange_start(offset, offset + t, (Kind::Double, device)); // (t,)
        let angles = pos.unsqueeze(1) * inv_freq.unsqueeze(0); // (t, hd/2), f64 so long positions stay exact
        let kind = self.wte.kind();
        (angles.cos().to_kind(kind), angles.sin().to_kind(kind))
    }

    /// Generates `max_new` tokens after `prompt` (one sequence) with the KV cache; greedy when
    /// `temperature` is `None`, else sampled from `softmax(logits / temperature)` with tch's RNG
    /// (seed it with `tch::manual_seed`).
    pub fn generate(
        &self,
        prompt: &[i64],
        max_new: usize,
        temperature: Option<f64>,
        opts: &ForwardOptions,
    ) -> Result<Vec<i64>, ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Input("generation needs a non-empty prompt".into()));
        }
        let device = self.wte.device();
        let _guard = tch::no_grad_guard();
        let mut cache = KvCache::default();
        let mut out = prompt.to_vec();
        let mut next_in = Tensor::from_slice(prompt).to_device(device).unsqueeze(0);
        let v = self.cfg.vocab_size as i64;
        for _ in 0..max_new {
            let logits = self.forward_cached(&next_in, &mut cache, opts)?; // (1, T, V_pad)
            let last = logits.select(1, -1).narrow(-1, 0, v).to_kind(Kind::Float); // (1, V)
            let tok = match temperature {
                None => last.argmax(-1, false),
                Some(temp) => (last / temp).softmax(-1, Kind::Float).multinomial(1, false).squeeze_dim(-1),
            };
            let tok_id = tok.int64_value(&[0]);
            out.push(tok_id);
            next_in = Tensor::from_slice(&[tok_id]).to_device(device).unsqueeze(0);
        }
        Ok(out)
    }
}

/// RoPE, rotate-half: `(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)` on `(B, H, T, hd)` with
/// `(T, hd/2)` tables.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    let x1 = x.narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    Tensor::cat(&[&x1 * cos - &x2 * sin, &x2 * cos + &x1 * sin], 3)
}
