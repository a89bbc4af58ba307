//! [`Tokenizer`]: GPT-2's BPE (`tiktoken-rs`, embedded r50k_base ranks) or a byte-level BPE trained
//! on the corpus (HF `tokenizers`, saved as `tokenizer.json`), behind one small API with a stable
//! identity string that shard directories and checkpoints record.
//!
//! Both treat the literal text `<|endoftext|>` in their input as the end-of-text token (the HF
//! tokenizer always extracts its added tokens, and GPT-2 is made to match), so the two agree on what
//! a document separator is. The corpus text contains no such string.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;
use tokenizers::AddedToken;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use super::io::{MANIFEST_FILE, Manifest, write_atomic};
use super::{DataError, Result, sha256_hex};

/// The end-of-text token's text.
pub const EOT_TEXT: &str = "<|endoftext|>";
/// [`Tokenizer::id`] of GPT-2.
pub const GPT2_ID: &str = "gpt2";
/// GPT-2's vocabulary size (50,000 merges + 256 bytes + `<|endoftext|>`).
pub const GPT2_VOCAB_SIZE: usize = 50257;
/// GPT-2's `<|endoftext|>`.
pub const GPT2_EOT: u32 = 50256;
/// The file a trained BPE is saved as, inside its shard directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The default size of a trained BPE (small enough for a small corpus and small models; a
/// multiple of 64 so that embedding matrices need no padding).
pub const DEFAULT_BPE_VOCAB: usize = 8192;

/// A tokenizer: GPT-2 or a trained byte-level BPE.
#[derive(Clone)]
pub struct Tokenizer(Inner);

#[derive(Clone)]
enum Inner {
    Gpt2(&'static CoreBPE),
    Bpe {
        tok: Box<tokenizers::Tokenizer>,
        /// The exact bytes of tokenizer.json (what the id hashes).
        json: String,
        eot: u32,
        vocab_size: usize,
    },
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("id", &self.id()).field("vocab_size", &self.vocab_size()).finish()
    }
}

fn tok_err(what: impl Into<String>) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> DataError {
    let what = what.into();
    move |e| DataError::Tokenizer { what, message: e.to_string() }
}

impl Tokenizer {
    /// GPT-2 (r50k_base, embedded in `tiktoken-rs`: no download). Built once per process.
    pub fn gpt2() -> Result<Tokenizer> {
        static GPT2: OnceLock<std::result::Result<CoreBPE, String>> = OnceLock::new();
        match GPT2.get_or_init(|| tiktoken_rs::r50k_base().map_err(|e| e.to_string())) {
            Ok(bpe) => Ok(Tokenizer(Inner::Gpt2(bpe))),
            Err(message) => Err(DataError::Tokenizer { what: "gpt2 (r50k_base)".into(), message: message.clone() }),
        }
    }

    /// Trains a byte-level BPE (GPT-2's pre-tokenisation, no prefix space) of `vocab_size` ids, id 0
    /// being `<|endoftext|>`, on `documents`. Training stops early if no pair of tokens occurs twice
    /// any more (a tiny corpus): [`Tokenizer::vocab_size`] is the size reached. Deterministic: the same documents give the same
    /// tokenizer.json, hence the same [`Tokenizer::id`].
    pub fn train_bpe<S: AsRef<str> + Send>(
        documents: impl Iterator<Item = S> + Send,
        vocab_size: usize,
    ) -> Result<Tokenizer> {
        // 256 byte symbols + the special token, plus at least one merge.
        if !(258..=65536).contains(&vocab_size) {
            return Err(DataError::InvalidArgument {
                name: "vocab_size",
                message: format!("{vocab_size} is not in 258..=65536 (256 bytes + <|endoftext|> + merges; u16 shards)"),
            });
        }
        let byte_level = ByteLevel::default().add_prefix_space(false).trim_offsets(false);
        let mut tok = tokenizers::Tokenizer::new(BPE::default());
        tok.with_pre_tokenizer(Some(byte_level))
            .with_post_processor(Some(byte_level))
            .with_decoder(Some(ByteLevelDecoder::default()));
        let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .special_tokens(vec![AddedToken::from(EOT_TEXT, true)])
            .initial_alphabet(alphabet)
            .build()
            .into();
        tok.train(&mut trainer, documents).map_err(tok_err("training the BPE"))?;
        let json = tok.to_string(false).map_err(tok_err("serialising the BPE"))?;
        Self::from_json(json, "the trained BPE")
    }

    /// Loads a tokenizer.json written by [`Tokenizer::save`] (any HF byte-level tokenizer with an
    /// `<|endoftext|>` token works).
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let json = std::fs::read_to_string(path).map_err(DataError::io(path))?;
        Self::from_json(json, &path.display().to_string())
    }

    fn from_json(json: String, what: &str) -> Result<Tokenizer> {
        let tok = tokenizers::Tokenizer::from_bytes(json.as_bytes()).map_err(tok_err(format!("loading {what}")))?;
        let eot = tok.token_to_id(EOT_TEXT).ok_or_else(|| DataError::Tokenizer {
            what: format!("loading {what}"),
            message: format!("it has no {EOT_TEXT} token"),
        })?;
        let vocab_size = tok.get_vocab_size(true);
        if vocab_size > 65536 {
            return Err(DataError::Tokenizer {
                what: format!("loading {what}"),
                message: format!("vocabulary of {vocab_size} does not fit uint16 shards"),
            });
        }
        Ok(Tokenizer(Inner::Bpe { tok: Box::new(tok), json, eot, vocab_size }))
    }

    /// Writes `dir/tokenizer.json` atomically (trained BPE only; GPT-2 needs no file) and returns its
    /// path.
    pub fn save(&self, dir: &Path) -> Result<Option<PathBuf>> {
        match &self.0 {
            Inner::Gpt2(_) => Ok(None),
            Inner::Bpe { json, .. } => {
                let path = dir.join(TOKENIZER_FILE);
                write_atomic(&path, |out| out.write_all(json.as_bytes()))?;
                Ok(Some(path))
            }
        }
    }

    /// The tokenizer of a shard directory: the one its manifest records (`tokenizer.json` is
    /// re-hashed and must match the recorded id), or GPT-2 for an llm.c directory without manifest.
    pub fn load_for_dir(dir: &Path) -> Result<Tokenizer> {
        let meta = std::fs::metadata(dir).map_err(DataError::io(dir))?;
        if !meta.is_dir() {
            return Err(DataError::Io { path: dir.to_path_buf(), error: std::io::Error::other("not a directory") });
        }
        let manifest = if dir.join(MANIFEST_FILE).exists() { Some(Manifest::read(dir)?) } else { None };
        Self::load_for_manifest(dir, manifest.as_ref())
    }

    /// [`Tokenizer::load_for_dir`] for a directory whose manifest (if any) is already read.
    pub(crate) fn load_for_manifest(dir: &Path, manifest: Option<&Manifest>) -> Result<Tokenizer> {
        let Some(manifest) = manifest else { return Self::gpt2() };
        let info = &manifest.tokenizer;
        let tok = match &info.file {
            None if info.id == GPT2_ID => Self::gpt2()?,
            None => {
                return Err(DataError::Manifest {
                    path: dir.join(MANIFEST_FILE),
                    message: format!("tokenizer `{}` is not gpt2 but no tokenizer file is named", info.id),
                });
            }
            Some(file) => {
                let path = dir.join(file);
                let tok = Self::from_file(&path)?;
                if tok.id() != info.id {
                    return Err(DataError::TokenizerFileChanged { path, expected: info.id.clone(), found: tok.id() });
                }
                tok
            }
        };
        if tok.id() != info.id || tok.vocab_size() != info.vocab_size || tok.eot() != info.eot {
            return Err(DataError::Manifest {
                path: dir.join(MANIFEST_FILE),
                message: format!(
                    "records tokenizer {} (vocab {}, eot {}), the tokenizer is {} (vocab {}, eot {})",
                    info.id,
                    info.vocab_size,
                    info.eot,
                    tok.id(),
                    tok.vocab_size(),
                    tok.eot()
                ),
            });
        }
        Ok(tok)
    }

    /// Token ids of `text`; the literal `<|endoftext|>` becomes [`Tokenizer::eot`].
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match &self.0 {
            Inner::Gpt2(bpe) => bpe.encode_with_special_tokens(text),
            Inner::Bpe { tok, .. } => match tok.encode_fast(text, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                // The byte-level pipeline has no failure mode for valid UTF-8 (a `&str`); keep the
                // signature infallible but never silently drop text.
                Err(e) => panic!("byte-level BPE failed to encode valid UTF-8: {e}"),
            },
        }
    }

    /// The text of `ids`. Byte sequences that are not valid UTF-8 (a cut multi-byte character) and
    /// ids outside the vocabulary become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut out = String::new();
        // Decode maximal runs of valid ids together (so multi-byte characters spanning tokens
        // survive), and mark each invalid id.
        for (i, run) in ids.split(|&id| id as usize >= self.vocab_size()).enumerate() {
            if i > 0 {
                out.push(char::REPLACEMENT_CHARACTER);
            }
            if run.is_empty() {
                continue;
            }
            match &self.0 {
                Inner::Gpt2(bpe) => match bpe.decode_bytes(run) {
                    Ok(bytes) => out.push_str(&String::from_utf8_lossy(&bytes)),
                    Err(_) => out.push(char::REPLACEMENT_CHARACTER),
                },
                Inner::Bpe { tok, .. } => match tok.decode(run, false) {
                    Ok(s) => out.push_str(&s),
                    Err(_) => out.push(char::REPLACEMENT_CHARACTER),
                },
            }
        }
        out
    }

    /// Number of ids (the model's vocabulary size before padding).
    pub fn vocab_size(&self) -> usize {
        match &self.0 {
            Inner::Gpt2(_) => GPT2_VOCAB_SIZE,
            Inner::Bpe { vocab_size, .. } => *vocab_size,
        }
    }

    /// The `<|endoftext|>` id (50256 for GPT-2, 0 for a trained BPE).
    pub fn eot(&self) -> u32 {
        match &self.0 {
            Inner::Gpt2(_) => GPT2_EOT,
            Inner::Bpe { eot, .. } => *eot,
        }
    }

    /// Stable identity: `gpt2`, or `bpe-<vocab size>-<first 12 hex of sha256(tokenizer.json)>`.
    pub fn id(&self) -> String {
        match &self.0 {
            Inner::Gpt2(_) => GPT2_ID.to_string(),
            Inner::Bpe { json, vocab_size, .. } => format!("bpe-{vocab_size}-{}", &sha256_hex(json.as_bytes())[..12]),
        }
    }

    /// The tokenizer.json text of a trained BPE (`None` for GPT-2).
    pub fn json(&self) -> Option<&str> {
        match &self.0 {
            Inner::Gpt2(_) => None,
            Inner::Bpe { json, .. } => Some(json),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic English-like text: words from a small lexicon in a pseudo-random order.
    pub(crate) fn generated_text(seed: u64, words: usize) -> String {
        const LEXICON: &[&str] = &[
            "the",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "lazy",
            "dog",
            "and",
            "a",
            "cat",
            "sat",
            "on",
            "mat",
            "while",
            "rain",
            "fell",
            "softly",
            "across",
            "old",
            "town",
            "Hamlet",
            "said",
            "to",
            "be",
            "or",
            "not",
            "question",
            "naïve",
            "café",
            "über",
            "—",
            "“quoted”",
            "it's",
            "1961",
            "3.14",
            "\t",
            "\n",
        ];
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut out = String::new();
        for i in 0..words {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let w = LEXICON[(s >> 33) as usize % LEXICON.len()];
            if i > 0 && !w.starts_with(['\t', '\n']) {
                out.push(' ');
            }
            out.push_str(w);
            if (s >> 20).is_multiple_of(11) {
                out.push_str(".\n");
            }
        }
        out
    }

    #[test]
    fn gpt2_encodes_hello_world_like_tiktoken() {
        let t = Tokenizer::gpt2().unwrap();
        assert_eq!(t.encode("Hello world"), vec![15496, 995]);
        assert_eq!(t.decode(&[15496, 995]), "Hello world");
        assert_eq!((t.vocab_size(), t.eot(), t.id().as_str()), (50257, 50256, "gpt2"));
        assert_eq!(t.encode("<|endoftext|>"), vec![50256]);
    }

    #[test]
    fn decode_marks_ids_outside_the_vocabulary() {
        let t = Tokenizer::gpt2().unwrap();
        assert_eq!(t.decode(&[15496, 60000, 995]), "Hello\u{FFFD} world");
    }

    #[test]
    fn trained_bpe_round_trips_and_is_deterministic() {
        let docs: Vec<String> = (0..40).map(|i| generated_text(i, 400)).collect();
        let t = Tokenizer::train_bpe(docs.iter(), 320).unwrap();
        assert_eq!(t.vocab_size(), 320);
        assert_eq!(t.eot(), 0);
        assert!(t.id().starts_with("bpe-320-") && t.id().len() == "bpe-320-".len() + 12, "{}", t.id());
        for text in docs.iter().take(5).chain([&generated_text(999, 300), &"Unseen: Zebra ☃ ∑ 😀!".to_string()]) {
            let ids = t.encode(text);
            assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size()));
            assert_eq!(&t.decode(&ids), text);
        }
        // Merges were learnt: common text compresses well below one token per byte.
        let ids = t.encode(&docs[0]);
        assert!(ids.len() * 2 < docs[0].len(), "{} tokens for {} bytes", ids.len(), docs[0].len());
        // The end-of-text token is special, with id 0.
        assert_eq!(t.encode("a<|endoftext|>b").iter().filter(|&&i| i == 0).count(), 1);
        // Same documents, same tokenizer.json, same id.
        let again = Tokenizer::train_bpe(docs.iter(), 320).unwrap();
        assert_eq!(again.id(), t.id());
        // A corpus too small for the requested size stops when no pair occurs twice; the id and
        // vocab_size() report the size actually reached.
        let small = Tokenizer::train_bpe(docs.iter(), 5000).unwrap();
        assert!(small.vocab_size() < 5000 && small.id().starts_with(&format!("bpe-{}-", small.vocab_size())));
    }

    #[test]
    fn saved_bpe_loads_with_the_same_id() {
        let dir = tempfile::tempdir().unwrap();
        let docs: Vec<String> = (0..10).map(|i| generated_text(i, 300)).collect();
        let t = Tokenizer::train_bpe(docs.iter(), 300).unwrap();
        let path = t.save(dir.path()).unwrap().unwrap();
        let loaded = Tokenizer::from_file(&path).unwrap();
        assert_eq!(loaded.id(), t.id());
        assert_eq!(loaded.encode(&docs[3]), t.encode(&docs[3]));
    }

    #[test]
    fn bpe_vocab_size_is_checked() {
        let err = Tokenizer::train_bpe(["abc"].into_iter(), 100).unwrap_err();
        assert!(matches!(err, DataError::InvalidArgument { name: "vocab_size", .. }), "{err}");
    }
}
