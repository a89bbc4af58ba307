//! Model weights as safetensors, with the model config (and so the attention variant) in the
//! metadata; loading refuses a file whose config differs, naming the field.
//!
//! Metadata keys: `format` = `lssa-gpt`, `format_version` = `1`, `config` (the [`ModelConfig`] as
//! TOML), `variant` (its attention name, for humans and other tools), plus whatever the caller adds
//! (the trainer stores `kind`, step, data position, tokenizer). Tensors are stored under the VarStore's
//! names (`wte`, `h.0.attn.c_attn.weight`, ...) in their own dtype. Files are written to a
//! temporary name, synced and renamed, so a crash never leaves a half-written checkpoint (and a file
//! is never changed in place, which is what makes memory-mapping one safe).
//!
//! Reading: a [`Checkpoint`] holds the file's bytes once (read, or memory-mapped by the caller: any
//! `AsRef<[u8]>`, e.g. a `memmap2::Mmap`) and answers the metadata, the config, the weights and any
//! other tensors from them. The path-taking functions are shorthands: [`read_metadata`] and
//! [`read_config`] read the header only (a few KB, not the 1.5 GB of a 124M training checkpoint with
//! its optimiser moments), [`load`] and [`read_tensors`] read the file once each.
//!
//! Two kinds of file share this format: a trainer's training state (weights, optimiser moments under
//! `optim.`, data position) and a weights-only export ([`Checkpoint::export`], `kind` =
//! [`WEIGHTS_KIND`]). Both load into a model the same way.
//!
//! Checksum: every file written here (by [`write_tensors`], [`save`], [`save_with`] and
//! [`Checkpoint::export`]; so also the trainer's checkpoints and the `model.safetensors` of a Hugging
//! Face export) records [`CHECKSUM_KEY`] = `xxh3-128:<32 hex digits>` in its metadata: XXH3's 128-bit
//! hash of the tensor data, each tensor's bytes in the order of the tensors' names (byte order), which
//! covers the whole data section (safetensors' own check makes the tensors tile it) but not the
//! header. [`Checkpoint::from_bytes`] (and so [`Checkpoint::read`], [`load`], [`read_tensors`] and the
//! trainer's memory-mapped opens) verifies it before answering anything, and refuses a mismatch with
//! [`CheckpointError::Checksum`], naming the file: a checkpoint whose length is right but whose bytes
//! are not (a flipped bit on disk or in a copy) no longer loads silently. A memory-mapped file is read
//! once by the check, and its tensors are then served from the page cache. A file without the key
//! (written before checksums were recorded) still loads, with a one-line note on stderr, once per file
//! and process. [`read_metadata`] reads the header alone and checks nothing beyond it.
//!
//! Why XXH3-128, by measurement (release build, a 2-core VM shared with a training job; medians of 9,
//! `checksum_cost` in `tests/checksum.rs`, run before and after the checksum existed). A `small`-scale
//! training checkpoint (4 layers, width 128, vocabulary 2048: 1.05M parameters, 12.7 MB with the two
//! AdamW moments) opens in 1.3 ms instead of 0.12 ms (the bytes already read), a `gpu`-scale one (6
//! layers, width 384, vocabulary 8192: 13.8M parameters, 166 MB) in 23.5 ms instead of 0.2 ms, against
//! 1-4 ms and 80-100 ms to read the file from the page cache and 350-400 ms and 800 ms to copy it
//! into tensors. A save hashes the bytes it writes once (+1.2 ms, +23 ms), within the noise of the
//! write and `fsync` (19-29 ms and 300-1200 ms with or without it). Of the candidates hashed alone on
//! the same data, CRC32C was as fast (0.55 ms, 15 ms) but 32 bits wide with a build script of its
//! own, and BLAKE3 2-3x slower (2.2 ms, 42-73 ms) for a cryptographic strength nothing here needs;
//! XXH3 (`xxhash-rust`: pure Rust, no dependencies) hashed at 0.65 ms and 23-48 ms, and its 128 bits
//! leave no practical chance of a corruption going unseen.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tch::{Kind, Tensor, nn::VarStore};

use crate::config::ModelConfig;

/// `format` metadata value.
pub const FORMAT: &str = "lssa-gpt";
/// `format_version` metadata value.
pub const FORMAT_VERSION: &str = "1";
/// `kind` metadata value of a weights-only file (no optimiser state, no data position): what
/// [`Checkpoint::export`] writes.
pub const WEIGHTS_KIND: &str = "lssa-weights";

/// The largest header a safetensors reader accepts (the `safetensors` crate's limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Metadata key of the checksum of the tensor data (see the module docs): `xxh3-128:<hex>`.
pub const CHECKSUM_KEY: &str = "checksum";
/// The algorithm prefix of [`CHECKSUM_KEY`]'s value.
const CHECKSUM_ALGORITHM: &str = "xxh3-128";

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
    /// The disk filled up while the file was written: the partial temporary file was removed and
    /// the file (and every older one) is as it was.
    #[error(
        "{path}: the disk is full: writing it needs {needed} bytes ({mib:.1} MiB): {source}; nothing was replaced (the earlier checkpoints are intact); free space, then continue with --resume latest",
        mib = *.needed as f64 / 1048576.0
    )]
    DiskFull {
        /// The file.
        path: String,
        /// Bytes the file needs (tensors and header).
        needed: u64,
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
    /// An operation that would destroy data (writing a file over the checkpoint it reads).
    #[error("{path}: {reason}")]
    Refused {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The tensor data does not hash to the checksum recorded when the file was written: its bytes
    /// changed since (a flipped bit on disk or in a copy).
    #[error(
        "{path}: corrupt: its tensor data does not match the checksum recorded when it was written ({CHECKSUM_ALGORITHM} {found}, recorded {expected}); the file changed on disk or in a copy: use another checkpoint, or copy it again from an intact source"
    )]
    Checksum {
        /// The file.
        path: String,
        /// The recorded checksum (hex).
        expected: String,
        /// The checksum of the data as read (hex).
        found: String,
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
    meta.insert("variant".into(), cfg.attention.to_string());
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
    write_views_atomic(views, meta, path)
}

/// Serialises `views` and `meta` to `path` through [`crate::io::write_atomic_with`] (a uniquely
/// named temporary file beside it, synced, renamed; removed on error). Streams the tensors: no copy
/// of the whole file in memory.
fn write_views_atomic(
    views: Vec<(String, TensorView<'_>)>,
    meta: HashMap<String, String>,
    path: &Path,
) -> Result<(), CheckpointError> {
    let mut meta = meta;
    meta.insert(
        CHECKSUM_KEY.into(),
        format!("{CHECKSUM_ALGORITHM}:{}", data_checksum(views.iter().map(|(n, v)| (n.as_str(), v.data())))),
    );
    // What the file needs: the tensors' bytes, and a header of about 100 bytes per tensor plus the
    // metadata (an estimate, for the error message of a full disk).
    let needed = views.iter().map(|(_, v)| v.data().len() as u64 + 100).sum::<u64>()
        + meta.iter().map(|(k, v)| (k.len() + v.len() + 8) as u64).sum::<u64>();
    let mut format_error = None;
    let written = crate::io::write_atomic_with(path, |tmp| {
        safetensors::serialize_to_file(views, Some(meta), tmp).map_err(|e| match e {
            safetensors::SafeTensorError::IoError(source) => source,
            e => {
                let reason = e.to_string();
                format_error = Some(reason.clone());
                std::io::Error::other(reason)
            }
        })
    });
    match (written, format_error) {
        (Ok(()), _) => Ok(()),
        (Err(_), Some(reason)) => Err(CheckpointError::Format { path: path.display().to_string(), reason }),
        (Err(e), None) if e.source.kind() == std::io::ErrorKind::StorageFull => {
            Err(CheckpointError::DiskFull { path: path.display().to_string(), needed, source: e.source })
        }
        (Err(e), None) => Err(CheckpointError::Io { path: e.path.display().to_string(), source: e.source }),
    }
}

/// A checkpoint file read once: its bytes (`B`: a `Vec<u8>` from [`Checkpoint::read`], or a memory
/// map from [`Checkpoint::from_bytes`]), whose header was checked, and its metadata. Every method
/// answers from these bytes; a memory-mapped file is only read where its tensors are used (loading
/// the weights of a training checkpoint leaves its optimiser moments on disk).
pub struct Checkpoint<B = Vec<u8>> {
    path: PathBuf,
    bytes: B,
    meta: HashMap<String, String>,
}

impl<B> std::fmt::Debug for Checkpoint<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint").field("path", &self.path).field("kind", &self.meta.get("kind")).finish()
    }
}

impl Checkpoint<Vec<u8>> {
    /// Reads `path` into memory, once.
    pub fn read(path: &Path) -> Result<Self, CheckpointError> {
        let bytes =
            std::fs::read(path).map_err(|source| CheckpointError::Io { path: path.display().to_string(), source })?;
        Self::from_bytes(path, bytes)
    }
}

impl<B: AsRef<[u8]>> Checkpoint<B> {
    /// A checkpoint from the whole content of the file `path` (which only names it in errors): checks
    /// that it is a safetensors file whose sizes add up, with `format` = [`FORMAT`].
    ///
    /// Then verifies the tensor data against the checksum in the metadata (one pass over the bytes;
    /// see the module docs): a mismatch is [`CheckpointError::Checksum`]; a file without one loads,
    /// with a note on stderr (once per file and process).
    pub fn from_bytes(path: &Path, bytes: B) -> Result<Self, CheckpointError> {
        let p = path.display().to_string();
        let (_, header) = SafeTensors::read_metadata(bytes.as_ref())
            .map_err(|e| CheckpointError::Format { path: p.clone(), reason: e.to_string() })?;
        let meta = header.metadata().clone().unwrap_or_default();
        check_format(&meta, &p)?;
        let ckpt = Self { path: path.to_path_buf(), bytes, meta };
        ckpt.verify()?;
        Ok(ckpt)
    }

    /// Checks the tensor data against [`CHECKSUM_KEY`] (see [`Checkpoint::from_bytes`]).
    fn verify(&self) -> Result<(), CheckpointError> {
        let p = self.p();
        // Also checks that the tensors tile the data section exactly (a truncated file fails here).
        let st = self.tensors_view()?;
        let Some(recorded) = self.meta.get(CHECKSUM_KEY) else {
            note_no_checksum(&self.path);
            return Ok(());
        };
        let expected = recorded
            .strip_prefix(CHECKSUM_ALGORITHM)
            .and_then(|h| h.strip_prefix(':'))
            .ok_or_else(|| CheckpointError::Format {
                path: p.clone(),
                reason: format!(
                    "metadata `{CHECKSUM_KEY}` is {recorded:?}, not `{CHECKSUM_ALGORITHM}:<hex>` (written by a newer version?)"
                ),
            })?;
        let found = data_checksum(st.tensors().iter().map(|(n, v)| (n.as_str(), v.data())));
        if found != expected {
            return Err(CheckpointError::Checksum { path: p, expected: expected.to_string(), found });
        }
        Ok(())
    }

    /// The checksum recorded in the file (`xxh3-128:<hex>`), if it has one.
    pub fn checksum(&self) -> Option<&str> {
        self.meta.get(CHECKSUM_KEY).map(String::as_str)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The string metadata (config included).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.meta
    }

    /// The `kind` metadata: [`WEIGHTS_KIND`] for a weights-only file, the trainer's kind for a
    /// training state, `None` for a file written without one.
    pub fn kind(&self) -> Option<&str> {
        self.meta.get("kind").map(String::as_str)
    }

    /// Whether the file is a weights-only export.
    pub fn is_weights_only(&self) -> bool {
        self.kind() == Some(WEIGHTS_KIND)
    }

    /// The model config stored in the metadata.
    pub fn config(&self) -> Result<ModelConfig, CheckpointError> {
        config_of(&self.meta, &self.p())
    }

    fn p(&self) -> String {
        self.path.display().to_string()
    }

    fn tensors_view(&self) -> Result<SafeTensors<'_>, CheckpointError> {
        SafeTensors::deserialize(self.bytes.as_ref())
            .map_err(|e| CheckpointError::Format { path: self.p(), reason: e.to_string() })
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Result<Vec<String>, CheckpointError> {
        let mut names: Vec<String> = self.tensors_view()?.names().into_iter().map(str::to_string).collect();
        names.sort();
        Ok(names)
    }

    /// Copies the weights into `vs`, after checking that the stored config equals `cfg` (the attention
    /// implementation excepted: it does not change the weights) and every variable's shape. Tensors
    /// of the file that are no variable of `vs` (optimiser moments) are not read.
    pub fn load_into(&self, vs: &mut VarStore, cfg: &ModelConfig) -> Result<(), CheckpointError> {
        let p = self.p();
        let found = self.config()?;
        let ignore_impl = ModelConfig { attn_impl: cfg.attn_impl, ..found };
        if let Some((field, found, expected)) = config_diff(&ignore_impl, cfg) {
            return Err(CheckpointError::ConfigMismatch { path: p, field, found, expected });
        }
        let st = self.tensors_view()?;
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
        Ok(())
    }

    /// The tensors whose names start with `prefix`, as CPU tensors in their stored dtype, sorted by name.
    pub fn tensors(&self, prefix: &str) -> Result<Vec<(String, Tensor)>, CheckpointError> {
        let p = self.p();
        let st = self.tensors_view()?;
        let mut out = Vec::new();
        for name in st.names() {
            if !name.starts_with(prefix) {
                continue;
            }
            let view =
                st.tensor(name).map_err(|e| CheckpointError::Format { path: p.clone(), reason: e.to_string() })?;
            out.push((name.to_string(), tensor_of(&view, name, &p)?));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Writes the tensors for which `keep(name)` holds, byte for byte in their stored dtype, to `out`
    /// atomically, with `meta` as metadata plus this file's `format`, `format_version`, `config` and
    /// `variant`, and `kind` = [`WEIGHTS_KIND`] (whatever `meta` says). Refuses `out` = this file.
    /// Returns the number of tensors written.
    pub fn export(
        &self,
        out: &Path,
        keep: &dyn Fn(&str) -> bool,
        mut meta: HashMap<String, String>,
    ) -> Result<usize, CheckpointError> {
        let same = match (std::fs::canonicalize(&self.path), std::fs::canonicalize(out)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if same {
            return Err(CheckpointError::Refused {
                path: out.display().to_string(),
                reason: "the export would overwrite the checkpoint it reads; choose another output file".into(),
            });
        }
        let st = self.tensors_view()?;
        let mut views: Vec<(String, TensorView<'_>)> =
            st.tensors().into_iter().filter(|(name, _)| keep(name)).collect();
        views.sort_by(|a, b| a.0.cmp(&b.0));
        for key in ["format", "format_version", "config", "variant"] {
            if let Some(v) = self.meta.get(key) {
                meta.insert(key.to_string(), v.clone());
            }
        }
        meta.insert("kind".into(), WEIGHTS_KIND.into());
        let n = views.len();
        write_views_atomic(views, meta, out)?;
        Ok(n)
    }
}

/// XXH3-128 of the tensors' bytes, tensors in name order, as 32 hex digits (see the module docs).
fn data_checksum<'a>(tensors: impl Iterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut tensors: Vec<(&str, &[u8])> = tensors.collect();
    tensors.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (_, data) in tensors {
        h.update(data);
    }
    format!("{:032x}", h.digest128())
}

/// The note for a file without a checksum, once per file (by its canonical path) and process.
fn note_no_checksum(path: &Path) {
    static NOTED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut noted = NOTED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !noted.contains(&key) {
        eprintln!(
            "note: {} carries no checksum (written before checkpoints recorded one): its tensor data cannot be verified",
            path.display()
        );
        noted.push(key);
    }
}

fn check_format(meta: &HashMap<String, String>, p: &str) -> Result<(), CheckpointError> {
    if meta.get("format").map(String::as_str) != Some(FORMAT) {
        return Err(CheckpointError::Format {
            path: p.to_string(),
            reason: format!("metadata `format` is not `{FORMAT}`"),
        });
    }
    Ok(())
}

fn config_of(meta: &HashMap<String, String>, p: &str) -> Result<ModelConfig, CheckpointError> {
    let text = meta
        .get("config")
        .ok_or_else(|| CheckpointError::Format { path: p.to_string(), reason: "no `config` in the metadata".into() })?;
    ModelConfig::from_toml(text).map_err(|e| CheckpointError::Format { path: p.to_string(), reason: e.to_string() })
}

/// The tensors of `path` whose names start with `prefix`, as CPU tensors in their stored dtype (one
/// read of the file; see [`Checkpoint::tensors`]).
pub fn read_tensors(path: &Path, prefix: &str) -> Result<Vec<(String, Tensor)>, CheckpointError> {
    Checkpoint::read(path)?.tensors(prefix)
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

/// Reads the metadata of a checkpoint (config included) from its header alone: the first `8 + n`
/// bytes (`n` the header's length), not the tensors.
pub fn read_metadata(path: &Path) -> Result<HashMap<String, String>, CheckpointError> {
    let p = path.display().to_string();
    let io = |source| CheckpointError::Io { path: p.clone(), source };
    let format = |reason: String| CheckpointError::Format { path: p.clone(), reason };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let file_len = f.metadata().map_err(io)?.len();
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => format(format!("{file_len} bytes, too short for a safetensors header")),
        _ => io(e),
    })?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES || n > file_len.saturating_sub(8) {
        return Err(format(format!("header length {n} does not fit a file of {file_len} bytes")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io)?;
    let json: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| format(format!("the header is not JSON: {e}")))?;
    let meta: HashMap<String, String> = match json.get("__metadata__") {
        None => HashMap::new(),
        Some(m) => serde_json::from_value(m.clone())
            .map_err(|e| format(format!("`__metadata__` is not a map of strings: {e}")))?,
    };
    check_format(&meta, &p)?;
    Ok(meta)
}

/// The model config stored in a checkpoint (from its header alone, as [`read_metadata`]).
pub fn read_config(path: &Path) -> Result<ModelConfig, CheckpointError> {
    config_of(&read_metadata(path)?, &path.display().to_string())
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
/// attention implementation excepted: it does not change the weights). Returns the metadata. Reads
/// the file once ([`Checkpoint::read`], [`Checkpoint::load_into`]).
pub fn load(vs: &mut VarStore, cfg: &ModelConfig, path: &Path) -> Result<HashMap<String, String>, CheckpointError> {
    let ckpt = Checkpoint::read(path)?;
    ckpt.load_into(vs, cfg)?;
    Ok(ckpt.meta)
}
