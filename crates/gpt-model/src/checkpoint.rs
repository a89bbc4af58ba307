//! Model weights as safetensors, with the model config (and so the attention variant) in the
//! metadata; loading refuses a file whose config differs, naming the field.
//!
//! Metadata keys: `format` = `lssa-gpt`, `format_version` = `1`, `config` (the [`ModelConfig`] as
//! TOML), `variant` (its attention name, for humans and other tools), plus whatever the caller adds
//! (the trainer stores step, data position, tokenizer). Tensors are stored under the VarStore's
//! names (`wte`, `h.0.attn.c_attn.weight`, ...) in their own dtype. Files are written to a
//! temporary name, synced and renamed, so a crash never leaves a half-written checkpoint.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tch::{Kind, Tensor, nn::VarStore};

use crate::config::ModelConfig;

/// `format` metadata value.
pub const FORMAT: &str = "lssa-gpt";
/// `format_version` metadata value.
pub const FORMAT_VERSION: &str = "1";

/// Checkpoint failures, each naming the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Not a safetensors file, or not one of ours.
    #[error("{path}: not a model checkpoint: {reason}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint's model config differs from the one expected.
    #[error("{path}: checkpoint is for a different model: `{field}` is {found} in the file but {expected} here")]
    ConfigMismatch {
        /// The file.
        path: String,
        /// The first differing config field.
        field: String,
        /// Its value in the file.
        found: String,
        /// The expected value.
        expected: String,
    },
}

fn dtype_of(kind: Kind) -> Option<Dtype> {
    Some(match kind {
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Half => Dtype::F16,
        _ => return None,
    })
}

/// Writes every variable of `vs` and the metadata to `path` atomically.
pub fn save(
    vs: &VarStore,
    cfg: &ModelConfig,
    extra: &HashMap<String, String>,
    path: &Path,
) -> Result<(), CheckpointError> {
    save_with(vs, cfg, extra, &[], path)
}

/// [`save`] plus `more` named tensors stored beside the model's (the trainer's optimiser moments, under
/// names that cannot clash with the model's, e.g. `optim.m.<var>`). [`load`] ignores them;
/// [`read_tensors`] reads them back.
pub fn save_with(
    vs: &VarStore,
    cfg: &ModelConfig,
    extra: &HashMap<String, String>,
    more: &[(String, Tensor)],
    path: &Path,
) -> Result<(), CheckpointError> {
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.extend(more.iter().map(|(n, t)| (n.clone(), t.shallow_clone())));
    let mut meta = extra.clone();
    meta.insert("format".into(), FORMAT.into());
    meta.insert("format_version".into(), FORMAT_VERSION.into());
    meta.insert("config".into(), cfg.to_toml());
    meta.insert("variant".into(), cfg.attention.clone());
    write_tensors(&named, meta, path)
}

/// Writes named tensors (any device; f32, f64, bf16 or f16) and string metadata to a safetensors file
/// atomically: a temporary file in the same directory, `fsync`, then `rename`, so a crash never leaves a
/// half-written file under `path`.
pub fn write_tensors(
    named: &[(String, Tensor)],
    meta: HashMap<String, String>,
    path: &Path,
) -> Result<(), CheckpointError> {
    let p = path.display().to_string();
    let io = |source| CheckpointError::Io { path: p.clone(), source };
    let mut named: Vec<&(String, Tensor)> = named.iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let mut buffers = Vec::with_capacity(named.len());
    for (name, t) in named {
        let t = t.detach().to_device(tch::Device::Cpu).contiguous();
        let dtype = dtype_of(t.kind()).ok_or_else(|| CheckpointError::Format {
            path: p.clone(),
            reason: format!("tensor {name} has unsupported dtype {:?}", t.kind()),
        })?;
        let mut bytes = vec![0u8; t.numel() * t.kind().elt_size_in_bytes()];
        t.copy_data_u8(&mut bytes, t.numel());
        buffers.push((name.clone(), dtype, t.size().iter().map(|&s| s as usize).collect::<Vec<_>>(), bytes));
    }
    let views: Vec<(String, TensorView<'_>)> = buffers
        .iter()
        .map(|(n, dt, shape, bytes)| (n.clone(), TensorView::new(*dt, shape.clone(), bytes).expect("sizes match")))
        .collect();
    let data = safetensors::serialize(views, Some(meta))
        .map_err(|e| CheckpointError::Format { path: p.clone(), reason: e.to_string() })?;
    let tmp = path.with_extension("safetensors.tmp");
    {
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&data).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all(); // make the rename durable; not every filesystem supports it
    }
    Ok(())
}

/// The tensors of `path` whose names start with `prefix`, as CPU tensors in their stored dtype.
pub fn read_tensors(path: &Path, prefix: &str) -> Result<Vec<(String, Tensor)>, CheckpointError> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io { path: p.clone(), source })?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| CheckpointError::Format { path: p.clone(), reason: e.to_string() })?;
    let mut out = Vec::new();
    for name in st.names() {
        if !name.starts_with(prefix) {
            continue;
        }
        let view = st.tensor(name).map_err(|e| CheckpointError::Format { path: p.clone(), reason: e.to_string() })?;
        out.push((name.to_string(), tensor_of(&view, name, &p)?));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn tensor_of(view: &TensorView<'_>, name: &str, p: &str) -> Result<Tensor, CheckpointError> {
    let shape: Vec<i64> = view.shape().iter().map(|&s| s as i64).collect();
    let kind = match view.dtype() {
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F16 => Kind::Half,
        other => {
            return Err(CheckpointError::Format {
                path: p.to_string(),
                reason: format!("tensor `{name}` has dtype {other:?}"),
            });
        }
    };
    Ok(Tensor::from_data_size(view.data(), &shape, kind))
}

/// Reads the metadata of a checkpoint (config included) without loading the weights.
pub fn read_metadata(path: &Path) -> Result<HashMap<String, String>, CheckpointError> {
    let p = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io { path: p.clone(), source })?;
    let (_, meta) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| CheckpointError::Format { path: p.clone(), reason: e.to_string() })?;
    let meta = meta.metadata().clone().unwrap_or_default();
    if meta.get("format").map(String::as_str) != Some(FORMAT) {
        return Err(CheckpointError::Format { path: p, reason: format!("metadata `format` is not `{FORMAT}`") });
    }
    Ok(meta)
}

/// The model config stored in a checkpoint.
pub fn read_config(path: &Path) -> Result<ModelConfig, CheckpointError> {
    let meta = read_metadata(path)?;
    let p = path.display().to_string();
    let text = meta
        .get("config")
        .ok_or_else(|| CheckpointError::Format { path: p.clone(), reason: "no `config` in the metadata".into() })?;
    ModelConfig::from_toml(text).map_err(|e| CheckpointError::Format { path: p, reason: e.to_string() })
}

/// The first field where two configs differ, as `(field, a's value, b's value)`.
pub fn config_diff(a: &ModelConfig, b: &ModelConfig) -> Option<(String, String, String)> {
    let (ta, tb): (toml::Table, toml::Table) =
        (toml::from_str(&a.to_toml()).expect("valid"), toml::from_str(&b.to_toml()).expect("valid"));
    let mut keys: Vec<&String> = ta.keys().chain(tb.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().find_map(|k| {
        let (va, vb) = (ta.get(k).map(|v| v.to_string()), tb.get(k).map(|v| v.to_string()));
        (va != vb).then(|| (k.clone(), va.unwrap_or("missing".into()), vb.unwrap_or("missing".into())))
    })
}

/// Loads the weights of `path` into `vs`, after checking that its config equals `cfg` (the
/// attention implementation excepted: it does not change the weights). Returns the metadata.
pub fn load(vs: &mut VarStore, cfg: &ModelConfig, path: &Path) -> Result<HashMap<String, String>, CheckpointError> {
    let p = path.display().to_string();
    let found = read_config(path)?;
    let ignore_impl = ModelConfig { attn_impl: cfg.attn_impl, ..found };
    if let Some((field, found, expected)) = config_diff(&ignore_impl, cfg) {
        return Err(CheckpointError::ConfigMismatch { path: p, field, found, expected });
    }
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io { path: p.clone(), source })?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| CheckpointError::Format { path: p.clone(), reason: e.to_string() })?;
    let _guard = tch::no_grad_guard();
    for (name, mut var) in vs.variables() {
        let view = st
            .tensor(&name)
            .map_err(|_| CheckpointError::Format { path: p.clone(), reason: format!("missing tensor `{name}`") })?;
        let shape: Vec<i64> = view.shape().iter().map(|&s| s as i64).collect();
        if shape != var.size() {
            return Err(CheckpointError::Format {
                path: p.clone(),
                reason: format!("tensor `{name}` has shape {shape:?}, the model has {:?}", var.size()),
            });
        }
        let t = tensor_of(&view, &name, &p)?;
        var.copy_(&t.to_kind(var.kind()).to_device(var.device()));
    }
    read_metadata(path)
}
