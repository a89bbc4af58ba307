//! GPT-2 with RoPE (NTK-scaled at long lengths) and any attention variant: the model, its forward,
//! the KV-cached forward for generation, and the loss.

use tch::nn;

/// What [`Gpt::forward_probed`] calls per layer: `(layer, q, k, attention)`.
pub type AttnProbe<'a> = dyn FnMut(usize, &Tensor, &Tensor, &Attention) + 'a;

use tch::{Device, Kind, Tensor};

use crate::attention::{self, Attention, AttentionError};
use crate::config::{AttnImpl, ConfigError, Init, ModelConfig};

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
    attention: Attention,
    /// The attention with a post-hoc power, prepared at the first forward that asks for it.
    posthoc: std::sync::Mutex<Vec<(u32, Attention)>>,
    wte: Tensor,
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
}

/// `x` through the linear layer `l`: [`project`] on its weight and bias.
fn apply_linear(x: &Tensor, l: &nn::Linear) -> Result<Tensor, ModelError> {
    project(x, &l.ws, l.bs.as_ref())
}

/// `x Wᵀ (+ b)`. Float32 CPU tensors on a CPU with AMX (attn-kernels' `cpu::gemm::available`) run
/// one autograd node whose three products run on AMX tiles at f32 accuracy (`csrc/fused_linear.cpp`:
/// within `2^-22` of the terms' magnitudes, where an f32 chain of fused multiply-adds is within
/// `k 2^-24`), unless `LSSA_CPU_LINEAR=torch`; everything else runs libtorch's `linear`. On one core
/// of an Intel Xeon with AMX at the `small` model's shapes its products ran at 280-360 GFLOP/s
/// where MKL's `sgemm` ran at 102-190 (`docs/bench/train-cpu-notes.md`).
pub fn project(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor, ModelError> {
    static AMX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let amx = *AMX.get_or_init(|| {
        attn_kernels::cpu::gemm::available() && std::env::var("LSSA_CPU_LINEAR").as_deref() != Ok("torch")
    });
    let kinds =
        [Some(x), Some(w), b].into_iter().flatten().all(|t| t.kind() == Kind::Float && t.device() == Device::Cpu);
    if amx && kinds {
        return crate::ffi::linear::amx_linear(x, w, b).map_err(ModelError::Input);
    }
    Ok(x.linear(w, b))
}

/// A linear layer from `i` to `o` features, drawn by `init`: GPT-2's normal(0, `std`) weight and
/// zero bias, or `nn.Linear`'s uniform weight and bias in `+-1/sqrt(i)` (`std` unused).
fn linear(p: nn::Path<'_>, i: usize, o: usize, init: Init, std: f64) -> nn::Linear {
    let (ws_init, bs_init) = match init {
        Init::Gpt2 => (nn::Init::Randn { mean: 0.0, stdev: std }, nn::Init::Const(0.0)),
        Init::TorchDefault => {
            let bound = 1.0 / (i as f64).sqrt();
            (nn::Init::Uniform { lo: -bound, up: bound }, nn::Init::Uniform { lo: -bound, up: bound })
        }
    };
    let cfg = nn::LinearConfig { ws_init, bs_init: Some(bs_init), bias: true };
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
    /// drawn as the config's [`Init`] says: GPT-2's by default (normal(0, 0.02), residual projections
    /// normal(0, 0.02 / sqrt(2 L)), zero biases, unit LayerNorms), or `nn.Linear`'s.
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

    /// [`Gpt::new`] with the attention variant given apart from the config: a variant built in code,
    /// such as one with a user's own [`attn_core::Activation`] (which runs on every path: the fused
    /// CPU kernels through its own f64 methods, the reference and KV-cached decoding through
    /// [`crate::attention::torch_ops`]; CUDA falls back to the reference). It replaces the config's
    /// `attention` (a checkpoint stores a user's activation as `custom(...)`, which does not parse
    /// back: restore such a model with this constructor and the same variant). For a seeded build,
    /// call it inside [`with_seed`].
    ///
    /// Errors when the variant misses a parameter (`sigmoid-bias` gets `T_train` from the config).
    pub fn with_variant(vs: &nn::Path<'_>, cfg: &ModelConfig, variant: attn_core::Variant) -> Result<Self, ModelError> {
        let cfg = ModelConfig { attention: variant, ..cfg.clone() };
        exclusive_init(|| Self::build(vs, &cfg))
    }

    fn build(vs: &nn::Path<'_>, cfg: &ModelConfig) -> Result<Self, ModelError> {
        cfg.validate_sizes()?;
        // Every parameter set and valid, and the plan derived: refused here, not at the first forward.
        let attention = Attention::new(cfg.variant()?, cfg.attn_impl)?;
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
                    c_attn: linear(&b / "attn" / "c_attn", d, 3 * d, cfg.init, std),
                    attn_proj: linear(&b / "attn" / "c_proj", d, d, cfg.init, resid_std),
                    ln_2: layer_norm(&b / "ln_2", d),
                    c_fc: linear(&b / "mlp" / "c_fc", d, cfg.mlp_ratio * d, cfg.init, std),
                    mlp_proj: linear(&b / "mlp" / "c_proj", cfg.mlp_ratio * d, d, cfg.init, resid_std),
                }
            })
            .collect();
        let ln_f = layer_norm(vs / "ln_f", d);
        Ok(Self { cfg: cfg.clone(), attention, posthoc: Default::default(), wte, blocks, ln_f })
    }

    /// The config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The attention variant the model was built with (its `sigmoid-bias` training length filled in).
    pub fn variant(&self) -> &attn_core::Variant {
        self.attention.variant()
    }

    /// The model's prepared attention: its variant, plan, implementation and CUDA kernels.
    pub fn attention(&self) -> &Attention {
        &self.attention
    }

    /// Runs the CUDA kernels `kernel` from now on ([`cuda::Kernel::Auto`] unless set; a lab version
    /// needs attn-kernels' `lab` feature).
    ///
    /// [`cuda::Kernel::Auto`]: attn_kernels::cuda::Kernel::Auto
    pub fn set_cuda_kernel(&mut self, kernel: attn_kernels::cuda::Kernel) {
        self.attention = self.attention.clone().with_cuda_kernel(kernel);
        self.posthoc.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    }

    /// The model's attention with post-hoc power `p`, prepared once per power.
    fn posthoc_attention(&self, p: u32) -> Result<Attention, ModelError> {
        let mut cache = self.posthoc.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, att)) = cache.iter().find(|(q, _)| *q == p) {
            return Ok(att.clone());
        }
        let att = self.attention.with_reweight(p)?;
        cache.push((p, att.clone()));
        Ok(att)
    }

    /// Logits `(B, T, V_pad)` of token ids `idx` `(B, T)` (int64).
    pub fn forward(&self, idx: &Tensor, opts: &ForwardOptions) -> Result<Tensor, ModelError> {
        self.forward_from(idx, 0, None, opts, None)
    }

    /// [`Gpt::forward`] that also hands every layer's queries and keys (after RoPE, `(B, H, T, hd)`)
    /// and the attention in use (its variant and plan) to `probe(layer, q, k, attention)`: for attention statistics
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
        self.loss_from_logits(&logits, targets)
    }

    /// Cross-entropy of `(B, T, V_pad)` logits against `(B, T)` targets over the real vocabulary
    /// ([`crate::loss::cross_entropy`]); a target outside the vocabulary is an input error.
    pub fn loss_from_logits(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor, ModelError> {
        let v = self.cfg.vocab_size as i64;
        // Drop the padding columns, if any: a narrow that keeps every column still costs its backward
        // a zero-filled copy of the whole gradient (`slice_backward`; 16 MB a shard and step at the
        // `small` shape, whose 2048 tokens need no padding).
        let logits = if logits.size().last() == Some(&v) { logits.shallow_clone() } else { logits.narrow(-1, 0, v) };
        let logits = logits.reshape([-1, v]).to_kind(Kind::Float);
        crate::loss::cross_entropy(&logits, &targets.reshape([-1])).map_err(ModelError::Input)
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
        let h = self.cfg.n_head as i64;
        // The model's attention, or one prepared once for this call's post-hoc power or implementation.
        let posthoc;
        let mut att = &self.attention;
        if let Some(p) = opts.reweight {
            posthoc = self.posthoc_attention(p)?;
            att = &posthoc;
        }
        let other_impl;
        if let Some(imp) = opts.attn_impl.filter(|&imp| imp != att.imp()) {
            other_impl = att.with_impl(imp);
            att = &other_impl;
        }
        let device = self.wte.device();
        let (cos, sin) = self.rope_tables(offset, t, opts, device);
        let mut x = Tensor::embedding(&self.wte, idx, -1, false, false); // (B, T, d)
        for (layer, blk) in self.blocks.iter().enumerate() {
            let qkv = apply_linear(&x.apply(&blk.ln_1), &blk.c_attn)?; // (B, T, 3d)
            let (q, mut k, mut v) = qkv_heads(&qkv, &cos, &sin, h).map_err(ModelError::Input)?; // (B, H, T, hd)
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
                probe(layer, &q, &k, att);
            }
            let y = attention::attend(&q, &k, &v, att, offset)?; // (B, H, T, hd)
            let y = y.transpose(1, 2).contiguous().view([b, t, self.cfg.d_model as i64]);
            // Not `+=`: on a tch tensor that is an in-place add, which breaks autograd (the LayerNorm
            // saved `x` for its backward).
            x = x + apply_linear(&y, &blk.attn_proj)?;
            let m = apply_linear(&apply_linear(&x.apply(&blk.ln_2), &blk.c_fc)?.gelu("none"), &blk.mlp_proj)?;
            x = x + m;
        }
        let x = x.apply(&self.ln_f);
        project(&x, &self.wte, None) // (B, T, V_pad), tied weights
    }

    /// `cos`, `sin` of the RoPE angles for positions `offset..offset + t`: `(t, hd/2)` each, in the
    /// model's dtype. Rotate-half pairing, `inv_freq_c = base^(-2c/d)` (as `attn_core::rope::rope_apply`).
    fn rope_tables(&self, offset: i64, t: i64, opts: &ForwardOptions, device: Device) -> (Tensor, Tensor) {
        let hd = self.cfg.head_dim();
        let s = opts.length_scale.unwrap_or(1.0);
        let base =
            if opts.ntk { attn_core::rope::ntk_rope_base(self.cfg.rope_base, hd, s) } else { self.cfg.rope_base };
        let inv_freq = attn_core::rope::rope_inv_freq(base, hd).expect("head dim validated even");
        let inv_freq = Tensor::from_slice(&inv_freq).to_device(device); // (hd/2,) f64
        let pos = Tensor::arange_start(offset, offset + t, (Kind::Double, device)); // (t,)
        let angles = pos.unsqueeze(1) * inv_freq.unsqueeze(0); // (t, hd/2), f64 so long positions stay exact
        let kind = self.wte.kind();
        (angles.cos().to_kind(kind), angles.sin().to_kind(kind))
    }

    /// Generates `max_new` tokens after `prompt` (one sequence) with the KV cache; greedy when
    /// `temperature` is `None`, else sampled from `softmax(logits / temperature)` with libtorch's
    /// process-wide generator (seed it through [`with_seed`], never a bare `tch::manual_seed`, which
    /// races other threads). For batches, top-k / top-p, stop tokens and a generator of its own per
    /// sequence, see [`Gpt::generate_batch`].
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

    /// Continues every prompt of `prompts` (token ids, all of one length: the model has no padding
    /// mask, so a caller groups its prompts by length) by up to `opts.max_new` tokens, in one batch
    /// with the KV cache. Row `r` draws from its own generator seeded with `seeds[r]`
    /// ([`SampleRng`]), so its tokens depend on its prompt, its seed and `opts` only, not on the other
    /// rows (up to the rounding of a batched forward) nor on any other thread. A row stops at the
    /// first token of `opts.stop` (not included in its output); finished rows leave the batch.
    ///
    /// Ids must lie in `0..vocab_size`; sampling is over the real vocabulary (never a padding id).
    pub fn generate_batch(
        &self,
        prompts: &[Vec<i64>],
        seeds: &[u64],
        opts: &GenerateOptions,
    ) -> Result<Vec<Generation>, ModelError> {
        opts.sampling.validate()?;
        let Some(first) = prompts.first() else { return Ok(Vec::new()) };
        if seeds.len() != prompts.len() {
            return Err(ModelError::Input(format!("{} prompts but {} seeds", prompts.len(), seeds.len())));
        }
        let t0 = first.len();
        if t0 == 0 {
            return Err(ModelError::Input("generation needs a non-empty prompt".into()));
        }
        if let Some(p) = prompts.iter().find(|p| p.len() != t0) {
            return Err(ModelError::Input(format!(
                "a batch of prompts must share one length (the model has no padding mask): {t0} and {} tokens",
                p.len()
            )));
        }
        let v = self.cfg.vocab_size as i64;
        if let Some(bad) = prompts.iter().flatten().find(|&&id| !(0..v).contains(&id)) {
            return Err(ModelError::Input(format!("token id {bad} is outside the vocabulary 0..{v}")));
        }
        let device = self.wte.device();
        let _guard = tch::no_grad_guard();
        let mut rngs: Vec<SampleRng> = seeds.iter().map(|&s| SampleRng::new(s)).collect();
        let mut out: Vec<Generation> = prompts.iter().map(|_| Generation::default()).collect();
        // `live[i]`: the prompt index of batch row i (rows leave the batch as they stop).
        let mut live: Vec<usize> = (0..prompts.len()).collect();
        let flat: Vec<i64> = prompts.iter().flatten().copied().collect();
        let mut next_in = Tensor::from_slice(&flat).view([prompts.len() as i64, t0 as i64]).to_device(device);
        let mut cache = KvCache::default();
        let mut logits_row = Vec::new();
        for _ in 0..opts.max_new {
            let logits = self.forward_cached(&next_in, &mut cache, &opts.forward)?; // (B, T, V_pad)
            let last = logits.select(1, -1).narrow(-1, 0, v).to_kind(Kind::Float).to_device(Device::Cpu);
            let last: Vec<f32> = Vec::try_from(last.reshape([-1]))
                .map_err(|e| ModelError::Input(format!("reading the logits back: {e}")))?;
            let mut keep = Vec::with_capacity(live.len());
            let mut next = Vec::with_capacity(live.len());
            for (row, &r) in live.iter().enumerate() {
                logits_row.clear();
                logits_row.extend_from_slice(&last[row * v as usize..(row + 1) * v as usize]);
                let tok = opts.sampling.pick(&mut logits_row, &mut rngs[r])? as i64;
                if opts.stop.contains(&tok) {
                    out[r].stopped = true;
                    continue;
                }
                out[r].tokens.push(tok);
                keep.push(row as i64);
                next.push(tok);
            }
            if next.is_empty() {
                break;
            }
            if keep.len() < live.len() {
                let idx = Tensor::from_slice(&keep).to_device(device);
                cache.retain_rows(&idx);
                live = keep.iter().map(|&row| live[row as usize]).collect();
            }
            next_in = Tensor::from_slice(&next).view([next.len() as i64, 1]).to_device(device);
        }
        Ok(out)
    }
}

impl KvCache {
    /// Keeps the batch rows `idx` (int64 indices on the cache's device) of every layer.
    fn retain_rows(&mut self, idx: &Tensor) {
        for l in &mut self.layers {
            l.k = l.k.take().map(|k| k.index_select(0, idx));
            l.v = l.v.take().map(|v| v.index_select(0, idx));
        }
    }
}

/// How [`Gpt::generate_batch`] picks each next token from the logits over the real vocabulary.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// `0`: greedy (the most likely token, the lowest id on a tie; `top_k` and `top_p` are then
    /// irrelevant). Otherwise tokens are drawn from `softmax(logits / temperature)`, restricted by
    /// `top_k` then `top_p`.
    pub temperature: f64,
    /// Keep only the `k` most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability (after
    /// `top_k`) reaches `p`, `p` in `(0, 1]` (`None` or 1: all).
    pub top_p: Option<f64>,
}

impl Sampling {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_k: None, top_p: None }
    }

    /// Checks the ranges: temperature finite and `>= 0`, `top_k >= 1`, `top_p` in `(0, 1]`.
    pub fn validate(&self) -> Result<(), ModelError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ModelError::Input(format!(
                "temperature {} must be finite and >= 0 (0: greedy)",
                self.temperature
            )));
        }
        if self.top_k == Some(0) {
            return Err(ModelError::Input("top-k 0 keeps no token; use k >= 1 (or none for all)".into()));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(ModelError::Input(format!("top-p {p} must lie in (0, 1]")));
        }
        Ok(())
    }

    /// The next token from one row of logits (`logits` is used as scratch space).
    fn pick(&self, logits: &mut [f32], rng: &mut SampleRng) -> Result<usize, ModelError> {
        if logits.iter().any(|x| x.is_nan()) {
            return Err(ModelError::Input("the model produced NaN logits".into()));
        }
        let argmax = |xs: &[f32]| {
            let mut best = 0;
            for (i, &x) in xs.iter().enumerate() {
                if x > xs[best] {
                    best = i;
                }
            }
            best
        };
        if self.temperature == 0.0 {
            return Ok(argmax(logits));
        }
        // Candidates, most likely first (ties by id), cut by top-k; scaled logits in f64.
        let t = self.temperature;
        let mut cand: Vec<(usize, f64)> = logits.iter().enumerate().map(|(i, &x)| (i, f64::from(x) / t)).collect();
        let by_logit = |a: &(usize, f64), b: &(usize, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let restrict = self.top_k.is_some_and(|k| k < cand.len()) || self.top_p.is_some_and(|p| p < 1.0);
        if let Some(k) = self.top_k
            && k < cand.len()
        {
            cand.select_nth_unstable_by(k - 1, by_logit);
            cand.truncate(k);
        }
        if restrict {
            cand.sort_unstable_by(by_logit);
        }
        let max = cand.iter().map(|c| c.1).fold(f64::NEG_INFINITY, f64::max);
        if max.is_infinite() {
            // An infinite logit dominates (or every logit is -inf): the most likely token.
            return Ok(argmax(logits));
        }
        let mut probs: Vec<f64> = cand.iter().map(|c| (c.1 - max).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        let mut n = probs.len();
        if let Some(top_p) = self.top_p
            && top_p < 1.0
        {
            let mut acc = 0.0;
            n = probs
                .iter()
                .position(|&p| {
                    acc += p;
                    acc >= top_p
                })
                .map_or(probs.len(), |i| i + 1);
        }
        let mass: f64 = probs[..n].iter().sum();
        let mut u = rng.next_f64() * mass;
        for (c, p) in cand[..n].iter().zip(&probs[..n]) {
            if u < *p {
                return Ok(c.0);
            }
            u -= p;
        }
        Ok(cand[n - 1].0) // rounding left `u` just past the last candidate
    }
}

/// [`Gpt::generate_batch`]'s settings.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// New tokens per prompt, at most.
    pub max_new: usize,
    /// Greedy or sampled, and how.
    pub sampling: Sampling,
    /// Token ids that end a row (e.g. the tokenizer's end-of-text); not included in the output.
    pub stop: Vec<i64>,
    /// RoPE scaling and post-hoc re-weighting (see [`ForwardOptions`]).
    pub forward: ForwardOptions,
}

/// One prompt's continuation from [`Gpt::generate_batch`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Generation {
    /// The new tokens (without the prompt, without the stop token).
    pub tokens: Vec<i64>,
    /// Whether a stop token ended it (else it ran to `max_new`).
    pub stopped: bool,
}

/// The generator of one sampled sequence: SplitMix64 (Steele, Lea and Flood, 2014), a 64-bit state
/// stepped by a constant and mixed; the same seed gives the same stream on every platform, with no
/// global state.
#[derive(Clone, Debug)]
pub struct SampleRng(attn_core::fixtures::Rng);

impl SampleRng {
    /// A generator seeded with `seed` (attn-core's SplitMix64).
    pub fn new(seed: u64) -> Self {
        Self(attn_core::fixtures::Rng::new(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A uniform draw from `[0, 1)` (53 bits).
    pub fn next_f64(&mut self) -> f64 {
        self.0.uniform()
    }

    /// A uniform draw from `lo..hi` (`lo < hi`; the modulo bias is below `(hi - lo) / 2^64`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo < hi, "empty range {lo}..{hi}");
        lo + self.next_u64() % (hi - lo)
    }
}

/// A block's `q`, `k`, `v` `(B, H, T, hd)` from its projection `qkv` `(B, T, 3d)` (`q`, `k`, `v` in that
/// order along the last axis, `H` heads of `hd` each), `q` and `k` rotated by [`rope`] with `(T, hd/2)`
/// tables `cos`, `sin` (which get no gradient). The three are transposed views of `(B, T, H, hd)`
/// memory.
///
/// On the CPU in float32 and float64 this is one autograd node (`csrc/fused_rope.cpp`): one pass
/// forward and one backward, where the same thing as tensor ops records about twenty nodes whose
/// backward fills and sums zero matrices for every slice (4% of a `small` training step with
/// softmax, 8% with LSSAR, `docs/bench/train-cpu-notes.md`). Elsewhere (CUDA, bf16 autocast) it runs those tensor ops
/// ([`qkv_heads_ops`]). Errors name a bad shape.
pub fn qkv_heads(qkv: &Tensor, cos: &Tensor, sin: &Tensor, heads: i64) -> Result<(Tensor, Tensor, Tensor), String> {
    let fused =
        qkv.device() == Device::Cpu && matches!(qkv.kind(), Kind::Float | Kind::Double) && cos.kind() == qkv.kind();
    if !fused {
        return qkv_heads_ops(qkv, cos, sin, heads);
    }
    let [q, k, v] = crate::ffi::rope::qkv_heads(qkv, cos, sin, heads)?;
    Ok((q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)))
}

/// [`qkv_heads`] as tensor ops, on any device and dtype: `q` and `k` rotate in one [`rope`] call.
pub fn qkv_heads_ops(qkv: &Tensor, cos: &Tensor, sin: &Tensor, heads: i64) -> Result<(Tensor, Tensor, Tensor), String> {
    let size = qkv.size();
    let [b, t, three_d] = size[..] else {
        return Err(format!("qkv_heads: the projection must be (B, T, 3d), got {size:?}"));
    };
    if heads <= 0 || three_d % (3 * heads) != 0 || (three_d / (3 * heads)) % 2 != 0 {
        return Err(format!("qkv_heads: last axis {three_d} is not 3 x heads ({heads}) x an even head dim"));
    }
    let (d, hd) = (three_d / 3, three_d / (3 * heads));
    let table = |x: &Tensor| {
        x.f_view([t, 1, 1, hd / 2]).map_err(|e| format!("qkv_heads: RoPE tables must be ({t}, {}): {e}", hd / 2))
    };
    let (cos, sin) = (table(cos)?, table(sin)?);
    let qk = rope(&qkv.narrow(2, 0, 2 * d).view([b, t, 2, heads, hd]), &cos, &sin); // (B, T, 2, H, hd)
    let q = qk.select(2, 0).transpose(1, 2);
    let k = qk.select(2, 1).transpose(1, 2);
    let v = qkv.narrow(2, 2 * d, d).view([b, t, heads, hd]).transpose(1, 2);
    Ok((q, k, v))
}

/// RoPE, rotate-half: `(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)` on the last axis (`hd`) of
/// `x`, with tables that broadcast against `x` without that axis' second half: `(T, hd/2)` tables
/// for `(B, H, T, hd)` heads; [`qkv_heads_ops`] rotates q and k in one call, `(B, T, 2, H, hd)` with
/// `(T, 1, 1, hd/2)` tables.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[&x1 * cos - &x2 * sin, &x2 * cos + &x1 * sin], -1)
}
