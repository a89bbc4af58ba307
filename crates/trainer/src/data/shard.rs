//! llm.c `.bin` token shards (memory-mapped, validated, written atomically) and [`ShardDir`], which
//! tells a directory's tokenizer and shard files (`manifest.json` and the atomic writer are in
//! [`super::io`], re-exported here).
//!
//! The format is llm.c's (`dev/data/data_common.py`): a header of 256 little-endian `i32`
//! (`[0]` = magic 20240520, `[1]` = version 1, `[2]` = token count, the rest zero), then the tokens as
//! little-endian `u16`. A file is valid when the magic and version match and its size is exactly
//! `1024 + 2 * count` bytes; token ids are checked against the vocabulary separately
//! ([`Shard::validate_tokens`]), because that reads the whole file (the loader does it the first
//! time it enters a shard, so opening FineWeb-10B's 20 GB does not read 20 GB up front).

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use sha2::{Digest, Sha256};

pub use super::io::{
    MANIFEST_FILE, MANIFEST_FORMAT, MANIFEST_VERSION, Manifest, ShardInfo, SourceInfo, SplitInfo, TokenizerInfo,
    write_atomic,
};
use super::tokenizer::{GPT2_ID, GPT2_VOCAB_SIZE, Tokenizer};
use super::{DataError, Result, Split, hex};

/// llm.c's magic number, the header's first `i32`.
pub const MAGIC: i32 = 20240520;
/// The shard version for `u16` tokens.
pub const VERSION: i32 = 1;
/// Header length in `i32` words.
pub const HEADER_INTS: usize = 256;
/// Header length in bytes.
pub const HEADER_BYTES: usize = HEADER_INTS * 4;
/// llm.c's shard size (100M tokens, 200 MB), the default for [`ShardWriter`].
pub const DEFAULT_SHARD_TOKENS: usize = 100_000_000;

/// `<name>_<split>_<index:06>.bin`, llm.c's naming (`fineweb_val_000000.bin`).
pub fn shard_file_name(name: &str, split: Split, index: usize) -> String {
    format!("{name}_{}_{index:06}.bin", split.as_str())
}

/// Splits an llm.c shard file name into (name, split, index); `None` for anything else.
pub fn parse_shard_file_name(file: &str) -> Option<(&str, Split, usize)> {
    let stem = file.strip_suffix(".bin")?;
    let (rest, index) = stem.rsplit_once('_')?;
    if index.len() != 6 || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (name, split) = rest.rsplit_once('_')?;
    let split = match split {
        "train" => Split::Train,
        "val" => Split::Val,
        _ => return None,
    };
    if name.is_empty() {
        return None;
    }
    Some((name, split, index.parse().ok()?))
}

/// Writes one shard atomically and returns the sha256 of the file's bytes.
pub fn write_shard(path: &Path, tokens: &[u16]) -> Result<String> {
    let count = i32::try_from(tokens.len())
        .map_err(|_| DataError::ShardTooLarge { path: path.to_path_buf(), count: tokens.len() })?;
    let mut header = [0i32; HEADER_INTS];
    header[0] = MAGIC;
    header[1] = VERSION;
    header[2] = count;
    let mut hasher = Sha256::new();
    write_atomic(path, |out| {
        let mut put = |bytes: &[u8]| -> std::io::Result<()> {
            hasher.update(bytes);
            out.write_all(bytes)
        };
        let header_bytes: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
        put(&header_bytes)?;
        let mut buf = Vec::with_capacity(1 << 16);
        for chunk in tokens.chunks(1 << 15) {
            buf.clear();
            buf.extend(chunk.iter().flat_map(|t| t.to_le_bytes()));
            put(&buf)?;
        }
        Ok(())
    })?;
    Ok(hex(&hasher.finalize()))
}

/// Opens, fully validates (header, size, every token below `vocab_size`) and copies one shard.
pub fn read_shard(path: &Path, vocab_size: usize) -> Result<Vec<u16>> {
    let shard = Shard::open(path)?;
    shard.validate_tokens(vocab_size)?;
    Ok(shard.to_vec())
}

/// A memory-mapped, header-checked shard.
#[derive(Debug)]
pub struct Shard {
    path: PathBuf,
    map: Mmap,
    len: u64,
}

impl Shard {
    /// Maps `path` and checks its header (magic, version, count) and its size. Token ids are not
    /// checked here; see [`Shard::validate_tokens`].
    pub fn open(path: &Path) -> Result<Shard> {
        let file = File::open(path).map_err(DataError::io(path))?;
        let actual = file.metadata().map_err(DataError::io(path))?.len();
        if actual < HEADER_BYTES as u64 {
            return Err(DataError::Truncated {
                path: path.to_path_buf(),
                count: None,
                expected: HEADER_BYTES as u64,
                actual,
            });
        }
        // SAFETY: the map is read-only. Shards are immutable once written: our writer replaces files
        // by rename (a new inode), so a live map is never modified. If another program truncates a
        // mapped shard in place, reads past the new end fault; that is documented, not guarded.
        let map = unsafe { Mmap::map(&file) }.map_err(DataError::io(path))?;
        let word = |i: usize| i32::from_le_bytes([map[4 * i], map[4 * i + 1], map[4 * i + 2], map[4 * i + 3]]);
        let path = path.to_path_buf();
        if word(0) != MAGIC {
            return Err(DataError::BadMagic { path, found: word(0) });
        }
        if word(1) != VERSION {
            return Err(DataError::BadVersion { path, found: word(1) });
        }
        let count = u64::try_from(word(2)).map_err(|_| DataError::BadCount { path: path.clone(), count: word(2) })?;
        let expected = HEADER_BYTES as u64 + 2 * count;
        if actual < expected {
            return Err(DataError::Truncated { path, count: Some(count), expected, actual });
        }
        if actual > expected {
            return Err(DataError::TrailingBytes { path, count, expected, actual });
        }
        Ok(Shard { path, map, len: count })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of tokens.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the shard holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The token bytes (little-endian `u16` pairs).
    fn token_bytes(&self) -> &[u8] {
        &self.map[HEADER_BYTES..]
    }

    /// Token `i`. Panics if `i >= len()`.
    pub fn token(&self, i: u64) -> u16 {
        let b = self.token_bytes();
        let i = usize::try_from(i).expect("token index fits in usize") * 2;
        u16::from_le_bytes([b[i], b[i + 1]])
    }

    /// Appends tokens `start .. start + n` to `out`, converted with `f`. Panics if the range is out of
    /// bounds (callers check it once).
    pub fn extend_from<T>(&self, start: u64, n: usize, out: &mut Vec<T>, f: impl Fn(u16) -> T) {
        let s = usize::try_from(start).expect("token index fits in usize") * 2;
        let bytes = &self.token_bytes()[s..s + 2 * n];
        out.extend(bytes.chunks_exact(2).map(|c| f(u16::from_le_bytes([c[0], c[1]]))));
    }

    /// All tokens, copied.
    pub fn to_vec(&self) -> Vec<u16> {
        let mut v = Vec::with_capacity(self.len as usize);
        self.extend_from(0, self.len as usize, &mut v, |t| t);
        v
    }

    /// Checks every token id against `vocab_size`; the error names the first offender and its index.
    pub fn validate_tokens(&self, vocab_size: usize) -> Result<()> {
        if vocab_size > u16::MAX as usize {
            return Ok(()); // every u16 is a valid id
        }
        let bytes = self.token_bytes();
        // Find the largest id per block first (a tight, vectorisable loop); locate only on failure.
        for (block_index, block) in bytes.chunks(1 << 16).enumerate() {
            let max = block.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).max().unwrap_or(0);
            if max as usize >= vocab_size {
                let within = block
                    .chunks_exact(2)
                    .position(|c| u16::from_le_bytes([c[0], c[1]]) as usize >= vocab_size)
                    .unwrap_or(0);
                let index = (block_index as u64) * (1 << 15) + within as u64;
                return Err(DataError::TokenOutOfRange {
                    path: self.path.clone(),
                    token: self.token(index) as u32,
                    index,
                    vocab_size,
                });
            }
        }
        Ok(())
    }

    /// sha256 of the whole file (header included), as the manifest records it.
    pub fn sha256(&self) -> String {
        let mut h = Sha256::new();
        h.update(&self.map[..]);
        hex(&h.finalize())
    }
}

/// Accumulates a split's tokens and writes them as shards of at most `shard_tokens` tokens,
/// `<name>_<split>_000000.bin`, `..._000001.bin`, ...
#[derive(Debug)]
pub struct ShardWriter {
    dir: PathBuf,
    name: String,
    split: Split,
    shard_tokens: usize,
    buf: Vec<u16>,
    written: Vec<ShardInfo>,
}

impl ShardWriter {
    /// A writer into `dir` (which must exist). `shard_tokens` must be in `1..=i32::MAX`.
    pub fn new(dir: &Path, name: &str, split: Split, shard_tokens: usize) -> Result<Self> {
        if shard_tokens == 0 || shard_tokens > i32::MAX as usize {
            return Err(DataError::InvalidArgument {
                name: "shard_tokens",
                message: format!("{shard_tokens} is not in 1..={}", i32::MAX),
            });
        }
        if name.is_empty() || name.contains(['/', '\\']) {
            return Err(DataError::InvalidArgument {
                name: "name",
                message: format!("`{name}` must be a non-empty file-name prefix"),
            });
        }
        Ok(ShardWriter {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            split,
            shard_tokens,
            buf: Vec::new(),
            written: Vec::new(),
        })
    }

    fn next_path(&self) -> PathBuf {
        self.dir.join(shard_file_name(&self.name, self.split, self.written.len()))
    }

    /// Appends tokens (each must fit in `u16`), writing every shard that fills up.
    pub fn push(&mut self, tokens: &[u32]) -> Result<()> {
        for &t in tokens {
            let t16 = u16::try_from(t).map_err(|_| DataError::TokenTooWide { path: self.next_path(), token: t })?;
            self.buf.push(t16);
            if self.buf.len() == self.shard_tokens {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let path = self.next_path();
        let sha256 = write_shard(&path, &self.buf)?;
        self.written.push(ShardInfo {
            file: shard_file_name(&self.name, self.split, self.written.len()),
            tokens: self.buf.len() as u64,
            sha256,
        });
        self.buf.clear();
        Ok(())
    }

    /// Writes the last, partial shard and returns every shard written, in order.
    pub fn finish(mut self) -> Result<Vec<ShardInfo>> {
        if !self.buf.is_empty() || self.written.is_empty() {
            self.flush()?;
        }
        Ok(self.written)
    }
}

/// A shard directory: ours (with `manifest.json`) or llm.c's (without; GPT-2 tokens assumed).
#[derive(Debug, Clone)]
pub struct ShardDir {
    dir: PathBuf,
    manifest: Option<Manifest>,
}

impl ShardDir {
    /// Opens `dir`, reading `manifest.json` if there is one.
    pub fn open(dir: &Path) -> Result<ShardDir> {
        let meta = std::fs::metadata(dir).map_err(DataError::io(dir))?;
        if !meta.is_dir() {
            return Err(DataError::Io { path: dir.to_path_buf(), error: std::io::Error::other("not a directory") });
        }
        let manifest = if dir.join(MANIFEST_FILE).exists() { Some(Manifest::read(dir)?) } else { None };
        Ok(ShardDir { dir: dir.to_path_buf(), manifest })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The manifest, if the directory has one.
    pub fn manifest(&self) -> Option<&Manifest> {
        self.manifest.as_ref()
    }

    /// The tokenizer identity: the manifest's, else `gpt2` (llm.c shards).
    pub fn tokenizer_id(&self) -> &str {
        self.manifest.as_ref().map_or(GPT2_ID, |m| m.tokenizer.id.as_str())
    }

    /// The vocabulary size token ids are checked against.
    pub fn vocab_size(&self) -> usize {
        self.manifest.as_ref().map_or(GPT2_VOCAB_SIZE, |m| m.tokenizer.vocab_size)
    }

    /// Refuses the directory unless its tokenizer is `expected` (e.g. the id a checkpoint stores).
    pub fn expect_tokenizer(&self, expected: &str) -> Result<()> {
        if self.tokenizer_id() == expected {
            Ok(())
        } else {
            Err(DataError::TokenizerMismatch {
                dir: self.dir.clone(),
                expected: expected.to_string(),
                found: self.tokenizer_id().to_string(),
            })
        }
    }

    /// Loads the directory's tokenizer (see [`Tokenizer::load_for_dir`]).
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Tokenizer::load_for_manifest(&self.dir, self.manifest.as_ref())
    }

    /// The split's shard files in order: the manifest's list, or else every `<name>_<split>_NNNNNN.bin`
    /// sorted by index (one `<name>` per directory).
    pub fn shard_paths(&self, split: Split) -> Result<Vec<PathBuf>> {
        let paths: Vec<PathBuf> = match &self.manifest {
            Some(m) => m.split(split).shards.iter().map(|s| self.dir.join(&s.file)).collect(),
            None => {
                let mut found: Vec<(String, usize, PathBuf)> = Vec::new();
                for entry in std::fs::read_dir(&self.dir).map_err(DataError::io(&self.dir))? {
                    let entry = entry.map_err(DataError::io(&self.dir))?;
                    let file = entry.file_name();
                    let Some(file) = file.to_str() else { continue };
                    if let Some((name, s, index)) = parse_shard_file_name(file)
                        && s == split
                    {
                        found.push((name.to_string(), index, entry.path()));
                    }
                }
                let mut names: Vec<String> = found.iter().map(|f| f.0.clone()).collect();
                names.sort();
                names.dedup();
                if names.len() > 1 {
                    return Err(DataError::AmbiguousShards { dir: self.dir.clone(), split, names });
                }
                found.sort_by_key(|f| f.1);
                found.into_iter().map(|f| f.2).collect()
            }
        };
        if paths.is_empty() {
            return Err(DataError::NoShards { dir: self.dir.clone(), split });
        }
        Ok(paths)
    }

    /// Maps the split's shards (headers and sizes checked; token ids not yet, see
    /// [`Shard::validate_tokens`]). With a manifest, the token counts must match it.
    pub fn open_shards(&self, split: Split) -> Result<Vec<Shard>> {
        let paths = self.shard_paths(split)?;
        let mut shards = Vec::with_capacity(paths.len());
        for (i, path) in paths.iter().enumerate() {
            let shard = Shard::open(path)?;
            if let Some(m) = &self.manifest {
                let want = m.split(split).shards[i].tokens;
                if shard.len() != want {
                    return Err(DataError::Manifest {
                        path: self.dir.join(MANIFEST_FILE),
                        message: format!(
                            "records {want} tokens for {}, the file holds {}",
                            path.display(),
                            shard.len()
                        ),
                    });
                }
            }
            shards.push(shard);
        }
        Ok(shards)
    }

    /// Full check of both splits: headers, sizes, every token id, and (with a manifest) every sha256
    /// and the tokenizer file. Returns (train tokens, val tokens).
    pub fn verify(&self) -> Result<(u64, u64)> {
        let mut totals = [0u64; 2];
        for (k, split) in [Split::Train, Split::Val].into_iter().enumerate() {
            for (i, shard) in self.open_shards(split)?.iter().enumerate() {
                shard.validate_tokens(self.vocab_size())?;
                if let Some(m) = &self.manifest {
                    let expected = &m.split(split).shards[i].sha256;
                    let found = shard.sha256();
                    if &found != expected {
                        return Err(DataError::ChecksumMismatch {
                            path: shard.path().to_path_buf(),
                            expected: expected.clone(),
                            found,
                        });
                    }
                }
                totals[k] += shard.len();
            }
        }
        if self.manifest.is_some() {
            // Loading re-hashes tokenizer.json against the manifest's id.
            self.tokenizer()?;
        }
        Ok((totals[0], totals[1]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_word(bytes: &mut [u8], i: usize, value: i32) {
        bytes[4 * i..4 * i + 4].copy_from_slice(&value.to_le_bytes());
    }

    #[test]
    fn shards_round_trip_in_llm_c_layout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(shard_file_name("x", Split::Train, 3));
        assert!(path.ends_with("x_train_000003.bin"));
        let tokens: Vec<u16> = (0..5000u32).map(|i| (i * 7919 % 50257) as u16).collect();
        let sha = write_shard(&path, &tokens).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        // llm.c's layout, byte for byte: magic, version, count, zeros, then little-endian u16.
        assert_eq!(bytes.len(), 1024 + 2 * tokens.len());
        assert_eq!(&bytes[..12], [20240520i32, 1, 5000].iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>());
        assert!(bytes[12..1024].iter().all(|&b| b == 0));
        assert_eq!(u16::from_le_bytes([bytes[1024 + 2], bytes[1024 + 3]]), tokens[1]);
        assert_eq!(sha, crate::data::sha256_hex(&bytes));
        assert_eq!(read_shard(&path, 50257).unwrap(), tokens);
        let shard = Shard::open(&path).unwrap();
        assert_eq!((shard.len(), shard.token(4999), shard.sha256()), (5000, tokens[4999], sha));
        // No scratch file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // An empty shard is valid.
        write_shard(&path, &[]).unwrap();
        assert!(read_shard(&path, 1).unwrap().is_empty());
    }

    /// Each corruption of a valid 100-token shard, and the start of the message it must give.
    #[test]
    fn each_corruption_gets_its_named_error() {
        type Corrupt = fn(&mut Vec<u8>);
        let cases: [(&str, Corrupt, &str); 7] = [
            ("bad magic", |b| header_word(b, 0, 123), "bad magic 123 (expected 20240520)"),
            ("bad version", |b| header_word(b, 1, 2), "unsupported version 2 (expected 1)"),
            ("negative count", |b| header_word(b, 2, -5), "negative token count -5 in the header"),
            (
                "truncated tokens",
                |b| b.truncate(1024 + 150),
                "truncated: 1174 bytes, but the header (100 tokens) needs 1224",
            ),
            ("truncated header", |b| b.truncate(10), "truncated: 10 bytes, but the header needs 1024"),
            (
                "trailing bytes",
                |b| b.extend([0, 0, 0]),
                "trailing bytes: 1227 bytes, but the header (100 tokens) needs exactly 1224",
            ),
            (
                "token >= vocab",
                |b| b[1024 + 2 * 42..1024 + 2 * 43].copy_from_slice(&1000u16.to_le_bytes()),
                "token 1000 at index 42 is not below the vocabulary size 1000",
            ),
        ];
        let dir = tempfile::tempdir().unwrap();
        for (what, corrupt, message) in cases {
            let path = dir.path().join("data_train_000001.bin");
            write_shard(&path, &[7; 100]).unwrap();
            let mut bytes = std::fs::read(&path).unwrap();
            corrupt(&mut bytes);
            std::fs::write(&path, &bytes).unwrap();
            let err = read_shard(&path, 1000).unwrap_err();
            let expected = format!("{}: {message}", path.display());
            assert_eq!(err.to_string(), expected, "{what}");
            let variant_ok = match what {
                "bad magic" => matches!(err, DataError::BadMagic { found: 123, .. }),
                "bad version" => matches!(err, DataError::BadVersion { found: 2, .. }),
                "negative count" => matches!(err, DataError::BadCount { count: -5, .. }),
                "truncated tokens" | "truncated header" => matches!(err, DataError::Truncated { .. }),
                "trailing bytes" => matches!(err, DataError::TrailingBytes { .. }),
                _ => matches!(err, DataError::TokenOutOfRange { token: 1000, index: 42, vocab_size: 1000, .. }),
            };
            assert!(variant_ok, "{what}: {err:?}");
        }
    }

    #[test]
    fn a_token_past_the_first_block_is_located() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b_val_000000.bin");
        let mut tokens = vec![1u16; 100_000];
        tokens[70_001] = 9;
        write_shard(&path, &tokens).unwrap();
        let err = read_shard(&path, 9).unwrap_err();
        assert!(matches!(err, DataError::TokenOutOfRange { token: 9, index: 70_001, .. }), "{err}");
    }

    #[test]
    fn shard_names_parse_like_llm_c() {
        assert_eq!(parse_shard_file_name("fineweb_train_000001.bin"), Some(("fineweb", Split::Train, 1)));
        assert_eq!(parse_shard_file_name("my_data_val_000000.bin"), Some(("my_data", Split::Val, 0)));
        for bad in
            ["fineweb_train_1.bin", "fineweb_test_000001.bin", "_val_000000.bin", "x_val_000000.txt", "val_000000.bin"]
        {
            assert_eq!(parse_shard_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_directory_without_manifest_is_gpt2_llm_c_shards() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // modded-nanogpt numbering: val 000000, train from 000001.
        for (file, n) in
            [("fineweb_train_000002.bin", 3), ("fineweb_val_000000.bin", 4), ("fineweb_train_000001.bin", 5)]
        {
            write_shard(&d.join(file), &vec![50256; n]).unwrap();
        }
        std::fs::write(d.join("README.txt"), "other files are ignored").unwrap();
        let sd = ShardDir::open(d).unwrap();
        assert_eq!((sd.tokenizer_id(), sd.vocab_size()), ("gpt2", 50257));
        let train: Vec<u64> = sd.open_shards(Split::Train).unwrap().iter().map(Shard::len).collect();
        assert_eq!(train, [5, 3], "sorted by index");
        assert_eq!(sd.verify().unwrap(), (8, 4));
        // Two datasets in one directory are ambiguous; a missing split is named.
        write_shard(&d.join("other_train_000000.bin"), &[1]).unwrap();
        let err = sd.shard_paths(Split::Train).unwrap_err();
        assert!(matches!(&err, DataError::AmbiguousShards { names, .. } if names == &["fineweb", "other"]), "{err}");
        let empty = tempfile::tempdir().unwrap();
        let err = ShardDir::open(empty.path()).unwrap().shard_paths(Split::Val).unwrap_err();
        assert!(err.to_string().ends_with("no val shards (expected files named <name>_val_000000.bin, ...)"), "{err}");
    }

    #[test]
    fn manifests_of_another_format_or_version_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for (text, message) in [
            ("{}", "format `<none>`, expected `lssa-shards`"),
            (r#"{"format": "lssa-shards", "version": 9}"#, "version Some(9), this reader understands 1"),
            ("not json", "not JSON"),
        ] {
            std::fs::write(dir.path().join(MANIFEST_FILE), text).unwrap();
            let err = ShardDir::open(dir.path()).unwrap_err();
            assert!(err.to_string().contains(message), "{err}");
        }
    }
}
