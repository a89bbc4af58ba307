//! A checkpoint in the Hugging Face layout: a folder that stock transformers loads with
//! `AutoModelForCausalLM.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)`, without
//! `trust_remote_code` (`trainer export --format hf`).
//!
//! ## Which architecture
//!
//! transformers' GPT-NeoX computes exactly this model when configured so: pre-LayerNorm blocks with
//! `use_parallel_residual = false` (`x + attn(ln_1 x)`, then `x + mlp(ln_2 x)`, GPT-2's order), exact
//! GELU (`hidden_act = "gelu"`), biases on every projection (`attention_bias`), LayerNorm eps 1e-5
//! (libtorch's default, ours), tied input and output embeddings (`tie_word_embeddings = true`; its
//! default is false), and rotate-half RoPE over the whole head (`partial_rotary_factor = 1`; its
//! default is 0.25) with base `rope_theta`. Softmax attention scales scores by `1 / sqrt(head_dim)` in
//! both. GPT-2 itself (learned positions, `Conv1D`) and Llama (RMSNorm, no biases, gated MLP) do not
//! fit. Two things differ in layout only:
//!
//! - GPT-NeoX splits its fused `query_key_value` output per head (`(H, 3, head_dim)`), ours per part
//!   (`(3, H, head_dim)`): [`neox_tensors`] permutes the rows of the weight and the bias.
//! - Our embedding is padded to a multiple of 64 rows; the padding rows are never trained, and the
//!   trainer's softmax leaves their columns out. transformers' (and lm-evaluation-harness's) softmax
//!   takes every column, so the export cuts the embedding to the real vocabulary: the same
//!   log-likelihoods, not a softmax that leaks mass to untrained ids.
//!
//! ## The attention
//!
//! Plain `softmax` is GPT-NeoX's own attention, so its export loads and runs anywhere. Every other
//! variant is recorded as `attn_implementation` in `config.json`: after `import lssa.hf`,
//! `from_pretrained(dir)` runs it (lssa.hf registers any name attn-core parses), and
//! `attn_implementation="lssa+rw15"` applies re-weighting post hoc. Without lssa.hf, transformers
//! refuses the unknown implementation: an LSSA model never silently runs as softmax.
//!
//! ## NTK-scaled RoPE
//!
//! The project's NTK-scaled evaluation of a whole window of `L = s T_train` tokens uses the base
//! `b s^(d/(d-2))` ([`attn_core::rope::ntk_rope_base`]). transformers' `dynamic` rope type with `factor = 1`
//! and `max_position_embeddings = T_train` computes `b (L / T_train)^(d/(d-2))` for a forward of `L`
//! tokens, the same; set `rope_parameters = {"rope_type": "dynamic", "factor": 1.0, "rope_theta": b}`
//! on the loaded config to get it. It rebases at every decoding step (the length so far), so greedy
//! decoding beyond `T_train` matches `trainer sample` only with plain RoPE.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use gpt_model::ModelConfig;
use serde_json::{Value, json};
use tch::{Kind, Tensor};

use crate::data::tokenizer::{EOT_TEXT, GPT2_EOT, Tokenizer};

/// LayerNorm's epsilon in the model (libtorch's default, which `gpt_model` keeps).
pub const LAYER_NORM_EPS: f64 = 1e-5;

/// Files of an export, in the order they are written.
pub const FILES: [&str; 6] = [
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
];

/// Why `variant` cannot leave for transformers, or `None` when lssa.hf can register it: a user's own
/// activation (`custom(...)`) has no name attn-core can parse back.
pub fn unexportable_reason(variant: &attn_core::Variant) -> Option<String> {
    // What `config.json` records is the name; it must parse back to this variant.
    match variant.to_string().parse::<attn_core::Variant>() {
        Ok(back) if &back == variant => None,
        Ok(_) => Some(format!("the attention variant `{variant}` cannot be exported: its name does not name it")),
        Err(e) => Some(format!(
            "the attention variant `{variant}` cannot be exported: lssa.hf registers only the variants attn-core parses by name ({e})"
        )),
    }
}

/// The model's tensors (`wte`, `h.{i}...`, `ln_f`, as the checkpoint stores them) renamed and
/// permuted for GPT-NeoX. The output embedding is tied to `gpt_neox.embed_in.weight` and not written.
pub fn neox_tensors(tensors: &[(String, Tensor)], cfg: &ModelConfig) -> Result<Vec<(String, Tensor)>> {
    let by_name: HashMap<&str, &Tensor> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let get = |name: &str| -> Result<Tensor> {
        by_name.get(name).map(|t| t.shallow_clone()).with_context(|| format!("the checkpoint has no tensor `{name}`"))
    };
    let (h, hd, d) = (cfg.n_head as i64, cfg.head_dim() as i64, cfg.d_model as i64);
    // (3, H, hd, ...) -> (H, 3, hd, ...): rows part-major to head-major.
    let per_head = |t: Tensor| -> Tensor {
        let rest: Vec<i64> = t.size()[1..].to_vec();
        let mut shape = vec![3, h, hd];
        shape.extend(&rest);
        let t = t.reshape(shape.as_slice()).transpose(0, 1).contiguous();
        let mut flat = vec![3 * d];
        flat.extend(&rest);
        t.reshape(flat.as_slice())
    };
    let wte = get("wte")?;
    ensure!(
        wte.size().first().is_some_and(|&rows| rows >= cfg.vocab_size as i64),
        "the embedding has {:?} rows, fewer than the vocabulary of {}",
        wte.size(),
        cfg.vocab_size
    );
    // The real vocabulary only: the padding rows are untrained (see the module's documentation).
    let mut out = vec![("gpt_neox.embed_in.weight".to_string(), wte.narrow(0, 0, cfg.vocab_size as i64).contiguous())];
    for i in 0..cfg.n_layer {
        let (ours, theirs) = (format!("h.{i}"), format!("gpt_neox.layers.{i}"));
        let pairs = [
            ("ln_1", "input_layernorm"),
            ("ln_2", "post_attention_layernorm"),
            ("attn.c_proj", "attention.dense"),
            ("mlp.c_fc", "mlp.dense_h_to_4h"),
            ("mlp.c_proj", "mlp.dense_4h_to_h"),
        ];
        for (a, b) in pairs {
            for p in ["weight", "bias"] {
                out.push((format!("{theirs}.{b}.{p}"), get(&format!("{ours}.{a}.{p}"))?));
            }
        }
        for p in ["weight", "bias"] {
            out.push((
                format!("{theirs}.attention.query_key_value.{p}"),
                per_head(get(&format!("{ours}.attn.c_attn.{p}"))?),
            ));
        }
    }
    for p in ["weight", "bias"] {
        out.push((format!("gpt_neox.final_layer_norm.{p}"), get(&format!("ln_f.{p}"))?));
    }
    let expected = 1 + cfg.n_layer * 12 + 2;
    ensure!(out.len() == expected, "{} tensors mapped, {expected} expected", out.len());
    Ok(out)
}

/// What the model card and the config record about the run.
#[derive(Clone, Debug, Default)]
pub struct Provenance {
    /// The checkpoint exported.
    pub checkpoint: PathBuf,
    /// The checkpoint's metadata (`step`, `train_loss`, `val_loss`, `git_revision`, `train_config`...).
    pub meta: HashMap<String, String>,
}

/// `config.json`: GPT-NeoX configured to compute this model (see the module's documentation).
pub fn config_json(cfg: &ModelConfig, tok: &Tokenizer, prov: &Provenance) -> Value {
    let variant = cfg.attention.to_string();
    let mut c = json!({
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "intermediate_size": cfg.mlp_ratio * cfg.d_model,
        "hidden_act": "gelu",
        "layer_norm_eps": LAYER_NORM_EPS,
        "use_parallel_residual": false,
        "tie_word_embeddings": true,
        "attention_bias": true,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "max_position_embeddings": cfg.context_len,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base, "partial_rotary_factor": 1.0},
        // transformers 4.x reads these two instead.
        "rotary_pct": 1.0,
        "rotary_emb_base": cfg.rope_base,
        "initializer_range": 0.02,
        "bos_token_id": tok.eot(),
        "eos_token_id": tok.eot(),
        "use_cache": true,
        "dtype": "float32",
        "lssa": {
            "variant": variant,
            "t_train": cfg.context_len,
            "vocab_size": cfg.vocab_size,
            "tokenizer": tok.id(),
            "git_revision": prov.meta.get("git_revision").cloned().unwrap_or_else(|| "unknown".into()),
            "export_git_revision": crate::git_revision(),
        },
    });
    if variant != "softmax" {
        c["attn_implementation"] = json!(variant);
    }
    c
}

/// `generation_config.json`: greedy by default, stopping at the end-of-text token, as `trainer sample
/// --temperature 0` does.
pub fn generation_config_json(tok: &Tokenizer) -> Value {
    json!({
        "bos_token_id": tok.eot(),
        "eos_token_id": tok.eot(),
        "pad_token_id": tok.eot(),
        "do_sample": false,
    })
}

/// `tokenizer.json` (HF tokenizers' format) and `tokenizer_config.json` of `tok`: a trained BPE's own
/// file, or GPT-2's rebuilt from tiktoken's ranks ([`gpt2_tokenizer_json`]).
pub fn tokenizer_files(tok: &Tokenizer, t_train: usize) -> Result<(String, Value)> {
    let json = match tok.json() {
        Some(j) => j.to_string(),
        None => gpt2_tokenizer_json()?,
    };
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT_TEXT,
        "eos_token": EOT_TEXT,
        "unk_token": EOT_TEXT,
        "pad_token": EOT_TEXT,
        "add_prefix_space": false,
        "add_bos_token": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": t_train,
    });
    Ok((json, config))
}

/// GPT-2's byte-to-unicode table (printable bytes map to themselves, the others to 256 + n).
fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut n = 0;
    for b in 0..256u32 {
        table[b as usize] = if printable(b) {
            char::from_u32(b).expect("a byte is a char")
        } else {
            n += 1;
            char::from_u32(255 + n).expect("below U+0200")
        };
    }
    table
}

/// GPT-2's tokenizer (r50k_base) as an HF tokenizer.json: the byte-level vocabulary read back from
/// tiktoken, and its merges rebuilt from the ranks (every split of a token into two tokens of lower
/// rank is a merge, ordered by the token's rank, then by its parts'), with `<|endoftext|>` as id
/// 50256. Encodes as tiktoken does (tested).
pub fn gpt2_tokenizer_json() -> Result<String> {
    let bpe = tiktoken_rs::r50k_base().map_err(|e| anyhow::anyhow!("GPT-2's tokenizer: {e}"))?;
    let to_unicode = bytes_to_unicode();
    let mut pieces: Vec<String> = Vec::with_capacity(GPT2_EOT as usize);
    for id in 0..GPT2_EOT {
        let bytes = bpe.decode_bytes(&[id]).map_err(|e| anyhow::anyhow!("GPT-2 token {id}: {e}"))?;
        pieces.push(bytes.iter().map(|&b| to_unicode[b as usize]).collect());
    }
    let rank: HashMap<&str, usize> = pieces.iter().enumerate().map(|(i, p)| (p.as_str(), i)).collect();
    let mut merges: Vec<(usize, usize, usize)> = Vec::new(); // (token rank, left rank, right rank)
    for (r, piece) in pieces.iter().enumerate() {
        let chars: Vec<(usize, char)> = piece.char_indices().collect();
        let mut local = Vec::new();
        for &(at, _) in &chars[1..] {
            if let (Some(&l), Some(&rr)) = (rank.get(&piece[..at]), rank.get(&piece[at..])) {
                local.push((r, l, rr));
            }
        }
        local.sort_by_key(|&(_, l, rr)| (l, rr));
        merges.extend(local);
    }
    merges.sort_by_key(|&(r, _, _)| r); // stable: each token's merges keep their order
    let vocab: serde_json::Map<String, Value> = pieces
        .iter()
        .enumerate()
        .map(|(i, p)| (p.clone(), json!(i)))
        .chain([(EOT_TEXT.to_string(), json!(GPT2_EOT))])
        .collect();
    let merges: Vec<Value> = merges.iter().map(|&(_, l, r)| json!(format!("{} {}", pieces[l], pieces[r]))).collect();
    let tok = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{
            "id": GPT2_EOT, "content": EOT_TEXT, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": true
        }],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges
        }
    });
    Ok(tok.to_string())
}

/// The model card.
pub fn model_card(cfg: &ModelConfig, tok: &Tokenizer, prov: &Provenance) -> String {
    let m = |k: &str| prov.meta.get(k).cloned().unwrap_or_else(|| "-".into());
    let variant = &cfg.attention;
    let attn_note = if variant.to_string() == "softmax" {
        "Plain softmax attention: GPT-NeoX's own, so stock transformers runs it as it is.".to_string()
    } else {
        format!(
            "The attention is `{variant}` (recorded as `attn_implementation` in config.json). Run `import lssa.hf` \
             (the `lssa` Python package, `pip install lssa[hf]`) before loading: it registers the variant with \
             transformers. Without it, transformers refuses the unknown implementation rather than running softmax."
        )
    };
    format!(
        "# {variant} GPT model ({layers} layers, width {d}, {heads} heads)\n\n\
         Trained with the `trainer` of the lssa repository (Softplus attention with re-weighting, arXiv 2501.13428) \
         and exported by `trainer export --format hf`.\n\n\
         | | |\n|---|---|\n\
         | attention variant | `{variant}` |\n\
         | training length T_train | {t} tokens |\n\
         | layers, width, heads | {layers}, {d}, {heads} (head dimension {hd}) |\n\
         | vocabulary | {vocab} tokens (`{tok_id}`) |\n\
         | steps trained | {step} |\n\
         | last training loss | {train_loss} |\n\
         | validation loss at 1x | {val_loss} |\n\
         | data | {data} |\n\
         | trained at git revision | {rev} |\n\
         | exported at git revision | {erev} |\n\
         | from checkpoint | `{ckpt}` |\n\n\
         Architecture: GPT-NeoX in transformers' terms (pre-LayerNorm, `use_parallel_residual = false`, exact GELU, \
         tied embeddings, rotary embeddings over the whole head with base {base}).\n\n\
         {attn_note}\n\n\
         ```python\n\
         import lssa.hf  # registers the attention variants with transformers\n\
         from transformers import AutoModelForCausalLM, AutoTokenizer\n\n\
         model = AutoModelForCausalLM.from_pretrained(\"PATH\")\n\
         tok = AutoTokenizer.from_pretrained(\"PATH\")\n\
         ids = tok(\"Once upon a time\", return_tensors=\"pt\").input_ids\n\
         print(tok.decode(model.generate(ids, max_new_tokens=32)[0]))\n\
         # post-hoc re-weighting (LSSAR p = 15) of an LSSA model:\n\
         model = AutoModelForCausalLM.from_pretrained(\"PATH\", attn_implementation=\"lssa+rw15\")\n\
         ```\n\n\
         Beyond T_train, the project's NTK-scaled evaluation of a whole window corresponds to \
         `rope_parameters = {{\"rope_type\": \"dynamic\", \"factor\": 1.0, \"rope_theta\": {base}}}` \
         (transformers rebases it at every decoding step).\n",
        layers = cfg.n_layer,
        d = cfg.d_model,
        heads = cfg.n_head,
        hd = cfg.head_dim(),
        t = cfg.context_len,
        vocab = cfg.vocab_size,
        tok_id = tok.id(),
        step = m("step"),
        train_loss = m("train_loss"),
        val_loss = m("val_loss"),
        data = data_line(&prov.meta),
        rev = m("git_revision"),
        erev = crate::git_revision(),
        ckpt = prov.checkpoint.display(),
        base = cfg.rope_base,
    )
}

fn data_line(meta: &HashMap<String, String>) -> String {
    match crate::sample::train_data_dir(meta) {
        Ok(Some(dir)) => format!("`{}`", dir.display()),
        _ => "-".into(),
    }
}

/// Writes the export of `tensors` (the model's, as stored) into `out`: every file of [`FILES`] into a
/// fresh temporary directory beside it, then one rename, so an interrupted export leaves no partial
/// folder under `out`. An existing `out` is replaced only when it is an export of ours (its
/// config.json has the `lssa` key), and refused otherwise. Returns the files written.
pub fn write_export(
    out: &Path,
    tensors: &[(String, Tensor)],
    cfg: &ModelConfig,
    tok: &Tokenizer,
    prov: &Provenance,
) -> Result<Vec<PathBuf>> {
    if let Some(why) = unexportable_reason(&cfg.attention) {
        bail!("{why}");
    }
    ensure!(
        tok.vocab_size() <= cfg.vocab_size,
        "the tokenizer `{}` has {} tokens but the model only {}",
        tok.id(),
        tok.vocab_size(),
        cfg.vocab_size
    );
    if out.exists() {
        let ours = std::fs::read_to_string(out.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|c| c.get("lssa").is_some());
        let empty = out.read_dir().map(|mut d| d.next().is_none()).unwrap_or(false);
        ensure!(
            ours || empty,
            "{} exists and is not an export of ours (no config.json with an `lssa` key): choose another --out, or remove it",
            out.display()
        );
    }
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let name = out.file_name().context("--out needs a directory name")?.to_string_lossy().to_string();
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let written = (|| -> Result<()> {
        let named: Vec<(String, Tensor)> =
            neox_tensors(tensors, cfg)?.into_iter().map(|(n, t)| (n, t.to_kind(Kind::Float))).collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        gpt_model::checkpoint::write_tensors(&named, meta, &tmp.join(FILES[0]))?;
        let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("JSON values serialise") + "\n";
        let (tok_json, tok_config) = tokenizer_files(tok, cfg.context_len)?;
        let files = [
            (FILES[1], pretty(&config_json(cfg, tok, prov))),
            (FILES[2], pretty(&generation_config_json(tok))),
            (FILES[3], tok_json),
            (FILES[4], pretty(&tok_config)),
            (FILES[5], model_card(cfg, tok, prov)),
        ];
        for (file, text) in files {
            std::fs::write(tmp.join(file), text).with_context(|| format!("writing {}", tmp.join(file).display()))?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // Replace: the old folder moves aside first, so a crash between the renames loses neither.
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    if out.exists() {
        std::fs::rename(out, &old).with_context(|| format!("moving the old {} aside", out.display()))?;
    }
    std::fs::rename(&tmp, out).with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(FILES.iter().map(|f| out.join(f)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> ModelConfig {
        ModelConfig {
            n_layer: 2,
            n_head: 2,
            d_model: 8,
            vocab_size: 50,
            context_len: 16,
            attention: "lssa".parse().unwrap(),
            ..ModelConfig::default()
        }
    }

    #[test]
    fn query_key_value_rows_go_from_part_major_to_head_major() {
        let cfg = tiny();
        let (d, hd) = (cfg.d_model as i64, cfg.head_dim() as i64);
        // Row r of our c_attn holds the value r: part r / d, head (r % d) / hd, element r % hd.
        let w = Tensor::arange(3 * d, (Kind::Float, tch::Device::Cpu)).unsqueeze(1).repeat([1, d]);
        let b = Tensor::arange(3 * d, (Kind::Float, tch::Device::Cpu));
        let mut tensors = vec![
            ("wte".to_string(), Tensor::zeros([64, d], (Kind::Float, tch::Device::Cpu))),
            ("ln_f.weight".into(), Tensor::ones([d], (Kind::Float, tch::Device::Cpu))),
            ("ln_f.bias".into(), Tensor::zeros([d], (Kind::Float, tch::Device::Cpu))),
        ];
        for i in 0..cfg.n_layer {
            for (n, shape) in [
                ("ln_1", vec![d]),
                ("ln_2", vec![d]),
                ("attn.c_proj", vec![d, d]),
                ("mlp.c_fc", vec![4 * d, d]),
                ("mlp.c_proj", vec![d, 4 * d]),
            ] {
                tensors.push((
                    format!("h.{i}.{n}.weight"),
                    Tensor::zeros(shape.as_slice(), (Kind::Float, tch::Device::Cpu)),
                ));
                tensors.push((format!("h.{i}.{n}.bias"), Tensor::zeros([shape[0]], (Kind::Float, tch::Device::Cpu))));
            }
            tensors.push((format!("h.{i}.attn.c_attn.weight"), w.shallow_clone()));
            tensors.push((format!("h.{i}.attn.c_attn.bias"), b.shallow_clone()));
        }
        let out = neox_tensors(&tensors, &cfg).unwrap();
        let find = |n: &str| out.iter().find(|(k, _)| k == n).map(|(_, t)| t.shallow_clone()).unwrap();
        let qkv_w = find("gpt_neox.layers.1.attention.query_key_value.weight");
        let qkv_b = find("gpt_neox.layers.1.attention.query_key_value.bias");
        // GPT-NeoX's row for (head, part, element) is head * 3 hd + part * hd + element.
        for head in 0..cfg.n_head as i64 {
            for part in 0..3 {
                for e in 0..hd {
                    let neox = head * 3 * hd + part * hd + e;
                    let ours = (part * d + head * hd + e) as f64;
                    assert_eq!(qkv_b.double_value(&[neox]), ours, "bias row {neox}");
                    assert_eq!(qkv_w.double_value(&[neox, 3]), ours, "weight row {neox}");
                }
            }
        }
        assert_eq!(out.len(), 1 + 2 * 12 + 2);
        assert_eq!(find("gpt_neox.embed_in.weight").size(), [50, d], "the embedding cut to the real vocabulary");
        assert!(out.iter().all(|(n, _)| !n.starts_with("embed_out")), "the output embedding is tied, not written");
    }

    #[test]
    fn a_custom_activation_cannot_be_exported_and_says_why() {
        /// A user's activation: its name is no built-in's, so the variant prints as `custom(...)`.
        #[derive(Debug)]
        struct Hinge;
        impl attn_core::Activation for Hinge {
            fn name(&self) -> &str {
                "hinge"
            }
            fn value(&self, x: f64) -> f64 {
                x.max(0.0)
            }
            fn derivative(&self, x: f64) -> f64 {
                f64::from(u8::from(x > 0.0))
            }
        }
        for name in ["lssa+rw15", "softmax", "sigmoid-bias:t_train=64"] {
            assert!(unexportable_reason(&name.parse().unwrap()).is_none(), "{name}");
        }
        let custom = attn_core::Variant::builder().activation(Hinge).build().unwrap();
        let why = unexportable_reason(&custom).unwrap();
        assert!(why.contains("custom(") && why.contains("hinge") && why.contains("lssa.hf"), "{why}");
    }

    #[test]
    fn the_config_names_the_attention_only_when_it_is_not_softmax() {
        let tok = Tokenizer::gpt2().unwrap();
        let prov = Provenance::default();
        let c = config_json(&tiny(), &tok, &prov);
        assert_eq!(c["attn_implementation"], "lssa");
        assert_eq!(c["vocab_size"], 50, "the real vocabulary: the padding rows are not exported");
        assert_eq!(c["lssa"]["vocab_size"], 50);
        assert_eq!(c["rope_parameters"]["partial_rotary_factor"], 1.0);
        assert_eq!(c["tie_word_embeddings"], true);
        assert_eq!(c["use_parallel_residual"], false);
        let soft = config_json(&ModelConfig { attention: "softmax".parse().unwrap(), ..tiny() }, &tok, &prov);
        assert!(soft.get("attn_implementation").is_none(), "{soft}");
    }

    /// GPT-2's rebuilt tokenizer.json encodes and decodes as tiktoken's r50k_base does.
    #[test]
    fn gpt2_tokenizer_json_encodes_as_tiktoken() {
        let json = gpt2_tokenizer_json().unwrap();
        let hf = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap();
        let ours = Tokenizer::gpt2().unwrap();
        let texts = [
            "Hello world! The quick brown fox jumps over the lazy dog.",
            "  Spaces,\ttabs\nand newlines;   numbers 12345 and 3.14159, unicode: café, naïve, 東京, 🙂.",
            "<|endoftext|>A document after the end-of-text token. don't won't it's",
            "supercalifragilisticexpialidocious antidisestablishmentarianism",
        ];
        for t in texts {
            let want = ours.encode(t);
            let got = hf.encode(t, false).unwrap().get_ids().to_vec();
            assert_eq!(got, want, "{t:?}");
            assert_eq!(hf.decode(&got, false).unwrap(), t);
        }
    }
}
