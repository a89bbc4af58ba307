//! Building a shard directory: [`build`] tokenizes a corpus's documents, after the hold-out, into
//! shards of both splits with the tokenizer and `manifest.json`, written beside the output and
//! swapped into place at the end.

use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;

use super::{Corpus, DOCUMENT_ORDER, Document, HOLDOUT_RULE, SourceMeta, holdout};
use crate::data::shard::{
    DEFAULT_SHARD_TOKENS, MANIFEST_FILE, MANIFEST_FORMAT, MANIFEST_VERSION, Manifest, ShardWriter, SourceInfo,
    SplitInfo, TokenizerInfo,
};
use crate::data::tokenizer::{DEFAULT_BPE_VOCAB, TOKENIZER_FILE, Tokenizer};
use crate::data::{DataError, Result, Split};

/// Which tokenizer [`build`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerChoice {
    /// GPT-2 (llm.c / FineWeb compatible).
    Gpt2,
    /// A byte-level BPE of this many ids, trained on the training documents only.
    Bpe {
        /// Vocabulary size, `<|endoftext|>` included.
        vocab_size: usize,
    },
}

impl Default for TokenizerChoice {
    fn default() -> Self {
        TokenizerChoice::Bpe { vocab_size: DEFAULT_BPE_VOCAB }
    }
}

/// What [`build`] writes and how.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// The shard directory (created or replaced; a non-empty directory without `manifest.json` is
    /// never replaced).
    pub out: PathBuf,
    /// Shard file prefix (`<name>_train_000000.bin`).
    pub name: String,
    /// The tokenizer.
    pub tokenizer: TokenizerChoice,
    /// Tokens per shard file (llm.c: 100M).
    pub shard_tokens: usize,
    /// The command line, for the manifest.
    pub command: Vec<String>,
    /// Draw progress bars on stderr.
    pub progress: bool,
}

impl BuildOptions {
    /// Defaults: `name` from the directory's file name, BPE 8192, 100M tokens per shard, no progress.
    pub fn new(out: &Path) -> BuildOptions {
        let name = out.file_name().map_or_else(|| "data".to_string(), |n| n.to_string_lossy().into_owned());
        BuildOptions {
            out: out.to_path_buf(),
            name,
            tokenizer: TokenizerChoice::default(),
            shard_tokens: DEFAULT_SHARD_TOKENS,
            command: Vec::new(),
            progress: false,
        }
    }
}

/// The result of [`build`]: the manifest written and where the time went.
#[derive(Clone, Debug)]
pub struct BuildReport {
    /// The manifest as written.
    pub manifest: Manifest,
    /// Seconds spent making the tokenizer (training the BPE).
    pub tokenizer_seconds: f64,
    /// Seconds spent tokenizing and writing shards.
    pub encode_seconds: f64,
}

fn bar(progress: bool, len: u64, msg: &str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{msg:<28} [{bar:40}] {pos}/{len} docs {elapsed}") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg.to_string());
    pb
}

/// Tokenizes `corpus` into `opts.out`: the hold-out, the tokenizer (a BPE is trained on the training
/// documents only and saved as `tokenizer.json`), the shards of both splits, and `manifest.json`.
/// Everything is written into a sibling scratch directory first and renamed into place at the end,
/// so an interrupted run leaves the previous directory intact.
pub fn build(corpus: Corpus, opts: &BuildOptions) -> Result<BuildReport> {
    let (train, val) = holdout(corpus.documents)?;
    check_splits(&corpus.sources, &train, &val)?;
    let (parent, out_name) = output_place(opts)?;

    // 1. The tokenizer.
    let t0 = Instant::now();
    let tokenizer = make_tokenizer(opts, &train)?;
    let tokenizer_seconds = t0.elapsed().as_secs_f64();

    // 2. Shards, into a scratch directory next to the output.
    let t1 = Instant::now();
    let stage = parent.join(format!(".{out_name}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage).map_err(DataError::io(&stage))?;
    let manifest = match write_stage(&stage, &tokenizer, &corpus.sources, &train, &val, opts) {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&stage);
            return Err(e);
        }
    };

    // 3. Swap the new directory in.
    if opts.out.exists() {
        let old = parent.join(format!(".{out_name}.old-{}", std::process::id()));
        std::fs::rename(&opts.out, &old).map_err(DataError::io(&opts.out))?;
        std::fs::rename(&stage, &opts.out).map_err(DataError::io(&opts.out))?;
        let _ = std::fs::remove_dir_all(&old);
    } else {
        std::fs::rename(&stage, &opts.out).map_err(DataError::io(&opts.out))?;
    }
    Ok(BuildReport { manifest, tokenizer_seconds, encode_seconds: t1.elapsed().as_secs_f64() })
}

/// Both splits have a document, and every document a source entry.
fn check_splits(sources: &[SourceMeta], train: &[Document], val: &[Document]) -> Result<()> {
    if train.is_empty() || val.is_empty() {
        return Err(DataError::Corpus(format!(
            "{} training and {} validation documents: both splits need at least one (give at least 2 files)",
            train.len(),
            val.len()
        )));
    }
    for d in train.iter().chain(val) {
        if !sources.iter().any(|s| s.name == d.source) {
            return Err(DataError::Corpus(format!("document {}/{} has no source entry", d.source, d.name)));
        }
    }
    Ok(())
}

/// The directory `opts.out` goes in (created) and its file name; refuses an output that exists, is
/// not empty and has no manifest (not written by lssa-data).
fn output_place(opts: &BuildOptions) -> Result<(&Path, String)> {
    let out_name = opts
        .out
        .file_name()
        .ok_or_else(|| DataError::InvalidArgument {
            name: "out",
            message: format!("{} has no file name", opts.out.display()),
        })?
        .to_string_lossy()
        .into_owned();
    let parent = opts.out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(DataError::io(parent))?;
    if opts.out.exists() && !opts.out.join(MANIFEST_FILE).exists() {
        let empty = std::fs::read_dir(&opts.out).map_err(DataError::io(&opts.out))?.next().is_none();
        if !empty {
            return Err(DataError::Corpus(format!(
                "refusing to replace {}: it exists and has no {MANIFEST_FILE} (not written by lssa-data)",
                opts.out.display()
            )));
        }
    }
    Ok((parent, out_name))
}

/// GPT-2's tokenizer, or a BPE trained on the training documents `train`.
fn make_tokenizer(opts: &BuildOptions, train: &[Document]) -> Result<Tokenizer> {
    Ok(match opts.tokenizer {
        TokenizerChoice::Gpt2 => Tokenizer::gpt2()?,
        TokenizerChoice::Bpe { vocab_size } => {
            let spinner = if opts.progress { ProgressBar::new_spinner() } else { ProgressBar::hidden() };
            spinner.set_message(format!("training a {vocab_size}-id byte-level BPE on {} documents", train.len()));
            spinner.enable_steady_tick(std::time::Duration::from_millis(200));
            let t = Tokenizer::train_bpe(train.iter().map(|d| d.text.as_str()), vocab_size);
            spinner.finish_and_clear();
            t?
        }
    })
}

/// Writes into `stage` the tokenizer's file (if it has one), the shards of both splits and the
/// manifest, which it returns.
fn write_stage(
    stage: &Path,
    tokenizer: &Tokenizer,
    sources: &[SourceMeta],
    train: &[Document],
    val: &[Document],
    opts: &BuildOptions,
) -> Result<Manifest> {
    let file = tokenizer.save(stage)?.map(|_| TOKENIZER_FILE.to_string());
    let train_info = write_split(stage, tokenizer, Split::Train, train, opts)?;
    let val_info = write_split(stage, tokenizer, Split::Val, val, opts)?;
    let sources = sources
        .iter()
        .map(|s| {
            let count = |docs: &[Document]| docs.iter().filter(|d| d.source == s.name).count();
            let chars =
                train.iter().chain(val).filter(|d| d.source == s.name).map(|d| d.text.chars().count() as u64).sum();
            SourceInfo {
                name: s.name.clone(),
                origin: s.origin.clone(),
                sha256: s.sha256.clone(),
                train_documents: count(train),
                val_documents: count(val),
                chars,
            }
        })
        .collect();
    let manifest = Manifest {
        format: MANIFEST_FORMAT.into(),
        version: MANIFEST_VERSION,
        name: opts.name.clone(),
        tokenizer: TokenizerInfo { id: tokenizer.id(), vocab_size: tokenizer.vocab_size(), eot: tokenizer.eot(), file },
        sources,
        holdout: HOLDOUT_RULE.into(),
        document_order: DOCUMENT_ORDER.into(),
        train: train_info,
        val: val_info,
        created_by: format!("lssa-data {}", env!("CARGO_PKG_VERSION")),
        command: opts.command.clone(),
    };
    manifest.write(stage)?;
    Ok(manifest)
}

/// The shards of one split in `stage`: each document `<|endoftext|>` and its tokens, in order.
fn write_split(
    stage: &Path,
    tokenizer: &Tokenizer,
    split: Split,
    docs: &[Document],
    opts: &BuildOptions,
) -> Result<SplitInfo> {
    let mut writer = ShardWriter::new(stage, &opts.name, split, opts.shard_tokens)?;
    let pb = bar(opts.progress, docs.len() as u64, &format!("tokenizing {split} ({})", tokenizer.id()));
    let mut tokens = 0u64;
    // Bounded memory: a chunk of documents is encoded in parallel, then appended in order.
    for chunk in docs.chunks(64) {
        let encoded: Vec<Vec<u32>> = chunk
            .par_iter()
            .map(|d| {
                let ids = tokenizer.encode(&d.text);
                pb.inc(1);
                ids
            })
            .collect();
        for ids in encoded {
            writer.push(&[tokenizer.eot()])?;
            writer.push(&ids)?;
            tokens += 1 + ids.len() as u64;
        }
    }
    pb.finish_and_clear();
    Ok(SplitInfo { documents: docs.len(), tokens, shards: writer.finish()? })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::corpus::{input_documents, write_generated_text};

    #[test]
    fn the_bpe_never_sees_the_validation_documents() {
        // ARCHITECTURE.md invariant 9. The validation file (the last of few input files) repeats a
        // word whose letters the training files never hold: a BPE trained on it would merge them.
        let root = tempfile::tempdir().unwrap();
        let text = root.path().join("text");
        write_generated_text(&text, 4, 2000, 11).unwrap();
        std::fs::write(text.join("zz_val.txt"), "xqxqxqxq ".repeat(3000)).unwrap();
        let dir = root.path().join("data");
        let opts = BuildOptions { tokenizer: TokenizerChoice::Bpe { vocab_size: 320 }, ..BuildOptions::new(&dir) };
        build(input_documents(&[text]).unwrap(), &opts).unwrap();
        let tok = Tokenizer::load_for_dir(&dir).unwrap();
        assert_eq!(tok.encode("xqxqxqxq").len(), 8, "no merge learned from validation text");
        assert!(tok.encode("the cat sat").len() < 11, "merges learned from the training text");
    }
}
