//! [`DataLoader`]: per-rank `(x, y)` batches over one split, as seeded random windows or as a stream
//! with epochs, with a resumable [`Position`]; and [`validation_tokens`] / [`validation_spans`], the
//! fixed text every evaluation length is scored on.
//!
//! # Which tokens a rank reads
//!
//! The shards of a split, in order, form one token stream of `N` tokens (a window may cross a shard
//! boundary: shards are arbitrary cuts of a stream of `<|endoftext|>`-separated documents, as in
//! llm.c). A *window* is `T + 1` consecutive tokens: `x` = the first `T`, `y` = the same shifted by
//! one. With `B` sequences per batch and `W` ranks, one *step* covers `W * B` windows, `B` on each
//! rank. [`WindowSampling`] says how they are chosen:
//!
//! - **Random** (the trainer's default): global window `j` starts at a uniformly random token of
//!   `0 ..= N - (T + 1)` ([`random_window_start`], a hash of the seed and `j`), and at step `k` rank
//!   `r` reads the windows `j = (k * W + r) * B + i`, `i < B`. Windows are drawn with replacement,
//!   so there are no epochs: a run reads windows spread over the whole split, whatever its length.
//!   A window depends only on its index, so one process that accumulates two micro-batches of `B`
//!   per optimiser step reads exactly the windows of two ranks of `B`, in the same order.
//! - **Stream**: consecutive windows, as in llm.c. Global batch `g` starts at `g * B * T` and reads
//!   `B * T + 1` tokens (its rows are consecutive: row `i`'s last target is row `i + 1`'s first
//!   input); rank `r` takes the batches `g = r, r + W, r + 2W, ...`. So in one epoch of
//!   `S = floor((N - 1) / (W * B * T))` steps every token of the first `S * W * B * T` is an input
//!   exactly once, on exactly one rank; the tail (fewer than `W * B * T + 1` tokens) is skipped, and
//!   the next epoch starts again at token 0 (same order: no shuffling; the corpus builder shuffles
//!   documents once, deterministically).
//!
//! # Seeded order
//!
//! [`DataLoader::seeded`] orders the windows by a seed, as the trainer does with its `seed`. Random
//! ([`DataLoader::random`]): the seed keys the hash, so the same seed gives the same windows, window
//! for window, and another seed an independent draw. Stream ([`DataLoader::rotated`]): the stream is
//! read from token `r` = [`seed_rotation`] of the seed (logical offset `g` is stream token
//! `(g + r) mod N`, so a window that runs past the end continues at token 0): two seeds see the
//! documents in another order cut into other windows, with the epoch structure above unchanged, but a
//! run shorter than an epoch reads one seed-chosen stretch of the split. With `r = 0` (as opened) the
//! loader is the plain stream.
//!
//! # Resuming
//!
//! [`DataLoader::position`] is where the next *step* begins, the same on every rank: rank 0 stores it
//! in the checkpoint and every rank [`DataLoader::seek`]s to it, so a resume reads exactly the windows
//! the uninterrupted run would have read next. In random sampling it is [`Position::Random`], the
//! global windows drawn so far (`k * W * B` after `k` steps); in the stream, [`Position::Stream`], the
//! stream token (shard and offset) and the epoch. A position of the other sampling is an error.
//!
//! Token ids are validated against the directory's vocabulary the first time the loader enters a shard
//! (so opening a large dataset is cheap); a bad shard surfaces as an error from
//! [`DataLoader::next_batch`] naming the file.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::shard::{Shard, ShardDir};
use super::{DataError, Result, Split};

/// Per-rank batch shape and the rank's place in the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Sequences per batch on this rank (B).
    pub batch: usize,
    /// Tokens per sequence (T).
    pub seq: usize,
    /// This rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks (W).
    pub world_size: usize,
}

impl Geometry {
    /// Checks the sizes: all positive, `rank < world_size`.
    pub fn new(batch: usize, seq: usize, rank: usize, world_size: usize) -> Result<Geometry> {
        let g = Geometry { batch, seq, rank, world_size };
        g.check()?;
        Ok(g)
    }

    /// A single-process geometry (rank 0 of 1).
    pub fn single(batch: usize, seq: usize) -> Result<Geometry> {
        Self::new(batch, seq, 0, 1)
    }

    fn check(&self) -> Result<()> {
        let bad = |name, message: String| Err(DataError::InvalidArgument { name, message });
        if self.batch == 0 {
            return bad("batch", "must be at least 1".into());
        }
        if self.seq == 0 {
            return bad("seq", "must be at least 1".into());
        }
        if self.world_size == 0 {
            return bad("world_size", "must be at least 1".into());
        }
        if self.rank >= self.world_size {
            return bad("rank", format!("rank {} is not below the world size {}", self.rank, self.world_size));
        }
        if (self.batch as u64)
            .checked_mul(self.seq as u64)
            .and_then(|bt| bt.checked_mul(self.world_size as u64))
            .is_none()
        {
            return bad("batch", "batch x seq x world size overflows".into());
        }
        Ok(())
    }

    /// `B * T`: tokens in one batch (`x` or `y`).
    pub fn batch_tokens(&self) -> usize {
        self.batch * self.seq
    }

    /// `W * B * T`: tokens one step advances the stream by.
    pub fn step_tokens(&self) -> u64 {
        (self.batch * self.seq) as u64 * self.world_size as u64
    }
}

/// How a loader chooses its windows (see the module docs); the trainer's config key `sampling`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowSampling {
    /// Each window at a uniformly random token of the whole split, keyed by (seed, window index).
    #[default]
    Random,
    /// Consecutive windows of the stream read from a seed-derived token, in epochs.
    Stream,
}

/// The config spelling: `random` or `stream`.
impl fmt::Display for WindowSampling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if *self == WindowSampling::Random { "random" } else { "stream" })
    }
}

/// Where the next step begins, in the loader's sampling. Serializable, for checkpoints: the stream
/// form is `{"epoch", "shard", "offset"}` (as before random sampling existed), the random one
/// `{"windows"}`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(untagged, deny_unknown_fields)]
pub enum Position {
    /// [`WindowSampling::Stream`]: a token offset into a shard, and the epoch.
    Stream {
        /// Completed passes over the split.
        epoch: u64,
        /// Index of the shard, in the split's order.
        shard: usize,
        /// Token offset inside that shard.
        offset: u64,
    },
    /// [`WindowSampling::Random`]: the global window index the next step starts at.
    Random {
        /// Global windows drawn before the next step (over all ranks).
        windows: u64,
    },
}

impl Position {
    /// The sampling this position belongs to.
    pub fn sampling(&self) -> WindowSampling {
        match self {
            Position::Stream { .. } => WindowSampling::Stream,
            Position::Random { .. } => WindowSampling::Random,
        }
    }
}

/// One rank's batch: `B * T` inputs and targets, row-major `(B, T)`, as `i64` (what embedding and
/// cross-entropy take).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Input ids, `(B, T)` row-major.
    pub x: Vec<i64>,
    /// Target ids, `x` shifted by one token, `(B, T)` row-major.
    pub y: Vec<i64>,
}

/// The loader's order and where it is in it.
#[derive(Clone, Copy, Debug)]
enum Order {
    /// Consecutive windows; `next` is the logical offset of the next step (stream token
    /// `(next + rotation) mod N`), `rotation` in `0..N`.
    Stream { rotation: u64, next: u64, epoch: u64 },
    /// Random windows keyed by `seed`; `drawn` global windows precede the next step.
    Random { seed: u64, drawn: u64 },
}

/// Reads one split of a shard directory for one rank. See the module docs for the layout.
#[derive(Debug)]
pub struct DataLoader {
    dir: PathBuf,
    split: Split,
    shards: Vec<Shard>,
    /// `starts[i]`: the stream offset of shard `i`'s first token; `starts[n]` = total.
    starts: Vec<u64>,
    validated: Vec<bool>,
    vocab_size: usize,
    geometry: Geometry,
    order: Order,
}

/// The stream rotation of a seed: a SplitMix64 hash of `seed`, reduced modulo `total` tokens.
pub fn seed_rotation(seed: u64, total: u64) -> u64 {
    if total == 0 { 0 } else { attn_core::fixtures::Rng::new(seed).next_u64() % total }
}

/// SplitMix64's increment (the golden ratio in 64 bits).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a bijection of `u64` that mixes every input bit into every output bit.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The first token of random window `index` under `seed`, in a split of `total` tokens with windows
/// of `seq + 1` tokens: uniform over `0 ..= total - (seq + 1)` (up to a bias below `total / 2^64`),
/// and a pure function of its arguments. It is output `index` of a SplitMix64 generator whose state
/// starts at a hash of `seed` (so consecutive windows are independent draws, and another seed is
/// another generator), scaled to the range by a 128-bit multiply. Panics when `total <= seq`.
pub fn random_window_start(seed: u64, index: u64, total: u64, seq: usize) -> u64 {
    let starts = total.saturating_sub(seq as u64);
    assert!(starts > 0, "{total} tokens hold no window of {} tokens", seq + 1);
    // Another key than `seed_rotation`'s generator, so the two samplings never share draws.
    let state = mix64(seed ^ 0xD1B5_4A32_D192_ED03);
    let h = mix64(state.wrapping_add(index.wrapping_add(1).wrapping_mul(GOLDEN)));
    ((u128::from(h) * u128::from(starts)) >> 64) as u64
}

impl DataLoader {
    /// Opens `split` of `dir` for `geometry`, reading the plain stream from token 0 (see
    /// [`DataLoader::seeded`] for the trainer's orders). With `expected_tokenizer` (e.g. the id a
    /// checkpoint stores), a directory written with another tokenizer is refused. The split must hold
    /// at least one step of the stream (`W * B * T + 1` tokens), in either sampling.
    pub fn open(dir: &Path, split: Split, geometry: Geometry, expected_tokenizer: Option<&str>) -> Result<DataLoader> {
        geometry.check()?;
        let sd = ShardDir::open(dir)?;
        if let Some(id) = expected_tokenizer {
            sd.expect_tokenizer(id)?;
        }
        let shards = sd.open_shards(split)?;
        let mut starts = Vec::with_capacity(shards.len() + 1);
        let mut total = 0u64;
        for s in &shards {
            starts.push(total);
            total += s.len();
        }
        starts.push(total);
        let needed = geometry.step_tokens() + 1;
        if total < needed {
            return Err(DataError::TooFewTokens { dir: dir.to_path_buf(), split, needed, available: total });
        }
        Ok(DataLoader {
            dir: dir.to_path_buf(),
            split,
            validated: vec![false; shards.len()],
            shards,
            starts,
            vocab_size: sd.vocab_size(),
            geometry,
            order: Order::Stream { rotation: 0, next: 0, epoch: 0 },
        })
    }

    /// This loader in `sampling`'s order for `seed`: [`DataLoader::random`]`(seed)`, or
    /// [`DataLoader::rotated`] by [`seed_rotation`]`(seed, N)`. It restarts at the first step.
    pub fn seeded(self, sampling: WindowSampling, seed: u64) -> DataLoader {
        match sampling {
            WindowSampling::Random => self.random(seed),
            WindowSampling::Stream => {
                let rotation = seed_rotation(seed, self.total_tokens());
                self.rotated(rotation)
            }
        }
    }

    /// This loader reading random windows keyed by `seed` (see "Which tokens a rank reads" above); it
    /// restarts at the first step.
    pub fn random(mut self, seed: u64) -> DataLoader {
        self.order = Order::Random { seed, drawn: 0 };
        self
    }

    /// This loader reading the stream from token `offset mod N` on (see "Seeded order" above); it
    /// restarts at the first step.
    pub fn rotated(mut self, offset: u64) -> DataLoader {
        self.order = Order::Stream { rotation: offset % self.total_tokens(), next: 0, epoch: 0 };
        self
    }

    /// How this loader chooses its windows.
    pub fn sampling(&self) -> WindowSampling {
        match self.order {
            Order::Stream { .. } => WindowSampling::Stream,
            Order::Random { .. } => WindowSampling::Random,
        }
    }

    /// The stream token the logical stream starts at (0 in random sampling).
    pub fn rotation(&self) -> u64 {
        if let Order::Stream { rotation, .. } = self.order { rotation } else { 0 }
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Tokens in the split.
    pub fn total_tokens(&self) -> u64 {
        self.starts[self.shards.len()]
    }

    /// Steps per epoch of the stream: `floor((N - 1) / (W * B * T))` (random sampling has no epochs).
    pub fn steps_per_epoch(&self) -> u64 {
        (self.total_tokens() - 1) / self.geometry.step_tokens()
    }

    /// The next step's batch for this rank; the loader then advances one step (in the stream,
    /// wrapping to the next epoch when the rest of the split cannot fill a step).
    pub fn next_batch(&mut self) -> Result<Batch> {
        let Geometry { batch, seq, rank, .. } = self.geometry;
        let bt = self.geometry.batch_tokens();
        match self.order {
            Order::Stream { rotation, next, epoch } => {
                let mut x = Vec::with_capacity(bt + 1);
                self.read(rotation, next + (rank * bt) as u64, bt + 1, &mut x)?;
                let y = x[1..].to_vec();
                x.truncate(bt);
                self.order = Order::Stream { rotation, next: next + self.geometry.step_tokens(), epoch };
                self.wrap_if_at_end();
                Ok(Batch { x, y })
            }
            Order::Random { seed, drawn } => {
                let (total, first) = (self.total_tokens(), drawn + (rank * batch) as u64);
                let (mut x, mut y) = (Vec::with_capacity(bt), Vec::with_capacity(bt));
                let mut window = Vec::with_capacity(seq + 1);
                for j in first..first + batch as u64 {
                    window.clear();
                    self.read_stream(random_window_start(seed, j, total, seq), seq + 1, &mut window)?;
                    x.extend_from_slice(&window[..seq]);
                    y.extend_from_slice(&window[1..]);
                }
                self.order = Order::Random { seed, drawn: drawn + (batch * self.geometry.world_size) as u64 };
                Ok(Batch { x, y })
            }
        }
    }

    fn wrap_if_at_end(&mut self) {
        let (step, total) = (self.geometry.step_tokens(), self.total_tokens());
        if let Order::Stream { next, epoch, .. } = &mut self.order
            && *next + step + 1 > total
        {
            *next = 0;
            *epoch += 1;
        }
    }

    /// The shard holding stream offset `g < total` (the last shard starting at or before `g`, which
    /// is never an empty one).
    fn shard_of(&self, g: u64) -> usize {
        self.starts[..self.shards.len()].partition_point(|&s| s <= g) - 1
    }

    /// Appends logical tokens `g .. g + n` (`g + n <= N`) of the stream rotated by `rotation` to `out`.
    fn read(&mut self, rotation: u64, g: u64, n: usize, out: &mut Vec<i64>) -> Result<()> {
        let total = self.total_tokens();
        let start = (g + rotation) % total;
        let first = n.min((total - start) as usize);
        self.read_stream(start, first, out)?;
        self.read_stream(0, n - first, out)
    }

    /// Appends stream tokens `g .. g + n` to `out` (validating each shard on first use).
    fn read_stream(&mut self, mut g: u64, mut n: usize, out: &mut Vec<i64>) -> Result<()> {
        while n > 0 {
            let i = self.shard_of(g);
            if !self.validated[i] {
                self.shards[i].validate_tokens(self.vocab_size)?;
                self.validated[i] = true;
            }
            let offset = g - self.starts[i];
            let take = n.min((self.shards[i].len() - offset) as usize);
            self.shards[i].extend_from(offset, take, out, i64::from);
            g += take as u64;
            n -= take;
        }
        Ok(())
    }

    /// Where the next step begins (the same on every rank). A stream position is the stream token,
    /// so it is only meaningful to a loader with the same rotation; a random one is only meaningful
    /// to a loader with the same seed.
    pub fn position(&self) -> Position {
        match self.order {
            Order::Stream { rotation, next, epoch } => {
                let g = (next + rotation) % self.total_tokens();
                let shard = self.shard_of(g);
                Position::Stream { epoch, shard, offset: g - self.starts[shard] }
            }
            Order::Random { drawn, .. } => Position::Random { windows: drawn },
        }
    }

    /// Continues from `pos` (from [`DataLoader::position`], possibly of another run with the same data
    /// and order). A position of the other sampling is an error.
    pub fn seek(&mut self, pos: Position) -> Result<()> {
        let invalid = |message| Err(DataError::InvalidArgument { name: "position", message });
        match (pos, self.order) {
            (Position::Random { windows }, Order::Random { seed, .. }) => {
                self.order = Order::Random { seed, drawn: windows };
            }
            (Position::Stream { epoch, shard, offset }, Order::Stream { rotation, .. }) => {
                let Some(s) = self.shards.get(shard) else {
                    let (dir, n, split) = (self.dir.display(), self.shards.len(), self.split);
                    return invalid(format!("shard {shard} does not exist: {dir} has {n} {split} shards"));
                };
                if offset > s.len() {
                    let (path, len) = (s.path().display(), s.len());
                    return invalid(format!("offset {offset} is past the end of {path} ({len} tokens)"));
                }
                let total = self.total_tokens();
                let next = (self.starts[shard] + offset + total - rotation) % total;
                self.order = Order::Stream { rotation, next, epoch };
                self.wrap_if_at_end();
            }
            (pos, _) => {
                let (theirs, ours) = (pos.sampling(), self.sampling());
                return invalid(format!(
                    "{pos:?} is a position of `{theirs}` sampling, but this loader has `{ours}` sampling: \
                     resume with `sampling = \"{theirs}\"`, as the run that wrote it"
                ));
            }
        }
        Ok(())
    }
}

/// The first `max_tokens` tokens of the validation split of `dir` (all of them if it has fewer):
/// a fixed span, so that every evaluation length is scored on the same text. Checks the tokenizer
/// like [`DataLoader::open`] and every token id it returns.
pub fn validation_tokens(dir: &Path, max_tokens: usize, expected_tokenizer: Option<&str>) -> Result<Vec<u16>> {
    let sd = ShardDir::open(dir)?;
    if let Some(id) = expected_tokenizer {
        sd.expect_tokenizer(id)?;
    }
    let mut out = Vec::new();
    for shard in sd.open_shards(Split::Val)? {
        if out.len() >= max_tokens {
            break;
        }
        shard.validate_tokens(sd.vocab_size())?;
        let take = (max_tokens - out.len()).min(shard.len() as usize);
        shard.extend_from(0, take, &mut out, |t| t);
    }
    Ok(out)
}

/// `count` non-overlapping spans of `span_len` tokens of the validation split of `dir`, spread evenly
/// over the whole split (the first at its start, the last at its end), so that they sample every part
/// of it (the corpus builder interleaves the held-out documents of every source) rather than a prefix.
/// The same arguments always give the same spans. Checks the tokenizer like [`DataLoader::open`] and
/// every token id it returns; errors when the split holds fewer than `count x span_len` tokens.
pub fn validation_spans(
    dir: &Path,
    span_len: usize,
    count: usize,
    expected_tokenizer: Option<&str>,
) -> Result<Vec<Vec<u16>>> {
    if span_len == 0 || count == 0 {
        return Err(DataError::InvalidArgument {
            name: "validation spans",
            message: format!("{count} spans of {span_len} tokens: both must be at least 1"),
        });
    }
    let mut l = DataLoader::open(dir, Split::Val, Geometry::single(1, 1)?, expected_tokenizer)?;
    let total = l.total_tokens();
    let needed = count as u64 * span_len as u64;
    if total < needed {
        return Err(DataError::InvalidArgument {
            name: "validation spans",
            message: format!(
                "{} holds {total} validation tokens, fewer than {count} spans of {span_len} need ({needed})",
                dir.display()
            ),
        });
    }
    let gap = if count == 1 { 0 } else { (total - span_len as u64) / (count as u64 - 1) };
    let mut out = Vec::with_capacity(count);
    let mut buf = Vec::with_capacity(span_len);
    for k in 0..count as u64 {
        buf.clear();
        l.read_stream(k * gap, span_len, &mut buf)?;
        out.push(buf.iter().map(|&t| t as u16).collect());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::shard::{shard_file_name, write_shard};

    /// A directory without manifest (GPT-2 ids, vocab 50257) whose train split holds the tokens
    /// 0, 1, 2, ... (so a token's value is its stream offset), cut into shards of the given lengths.
    fn counting_dir(lengths: &[usize]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut next = 0u16;
        for (i, &len) in lengths.iter().enumerate() {
            let tokens: Vec<u16> = (0..len)
                .map(|_| {
                    next += 1;
                    next - 1
                })
                .collect();
            write_shard(&dir.path().join(shard_file_name("t", Split::Train, i)), &tokens).unwrap();
        }
        write_shard(&dir.path().join(shard_file_name("t", Split::Val, 0)), &(100..200).collect::<Vec<u16>>()).unwrap();
        dir
    }

    fn loader(dir: &Path, b: usize, t: usize, rank: usize, w: usize) -> DataLoader {
        DataLoader::open(dir, Split::Train, Geometry::new(b, t, rank, w).unwrap(), None).unwrap()
    }

    #[test]
    fn every_token_is_an_input_once_per_epoch_across_two_ranks() {
        // 1000 tokens over uneven shards, an empty one included; B=3, T=7, W=2: step = 42,
        // 23 steps per epoch cover tokens 0..966.
        let dir = counting_dir(&[400, 0, 1, 350, 249]);
        let (b, t, w) = (3, 7, 2);
        let mut seen = vec![0u32; 1000];
        let mut loaders: Vec<DataLoader> = (0..w).map(|r| loader(dir.path(), b, t, r, w)).collect();
        let steps = loaders[0].steps_per_epoch();
        assert_eq!(steps, 999 / 42);
        for _ in 0..steps {
            for l in &mut loaders {
                let batch = l.next_batch().unwrap();
                assert_eq!((batch.x.len(), batch.y.len()), (b * t, b * t));
                for (x, y) in batch.x.iter().zip(&batch.y) {
                    assert_eq!(*y, x + 1, "y is x shifted by one");
                    seen[*x as usize] += 1;
                }
            }
        }
        let covered = (steps * 42) as usize;
        assert!(seen[..covered].iter().all(|&c| c == 1), "every token of the epoch exactly once");
        assert!(seen[covered..].iter().all(|&c| c == 0), "the short tail is skipped");
        // Then the next epoch starts over, rank r at batch r.
        for (r, l) in loaders.iter_mut().enumerate() {
            assert_eq!(l.position(), Position::Stream { epoch: 1, shard: 0, offset: 0 });
            assert_eq!(l.next_batch().unwrap().x[0], (r * b * t) as i64);
        }
    }

    #[test]
    fn position_and_seek_resume_identically_across_epochs() {
        let dir = counting_dir(&[300, 200, 123]);
        for (b, t, rank, w) in [(2, 5, 0, 1), (2, 5, 1, 3), (1, 64, 0, 2)] {
            let mut a = loader(dir.path(), b, t, rank, w);
            for _ in 0..(a.steps_per_epoch() + 3) {
                a.next_batch().unwrap();
            }
            let saved = serde_json::to_string(&a.position()).unwrap();
            let expected: Vec<Batch> = (0..2 * a.steps_per_epoch() + 1).map(|_| a.next_batch().unwrap()).collect();
            let mut resumed = loader(dir.path(), b, t, rank, w);
            resumed.seek(serde_json::from_str(&saved).unwrap()).unwrap();
            let got: Vec<Batch> = (0..expected.len()).map(|_| resumed.next_batch().unwrap()).collect();
            assert_eq!(got, expected, "B={b} T={t} rank {rank}/{w}");
            assert_eq!(resumed.position(), a.position());
        }
    }

    #[test]
    fn a_rotated_loader_reads_the_same_epoch_from_another_token() {
        // 100 tokens, B=2, T=5: 9 steps of 10 per epoch; rotation 37 starts at token 37 and wraps.
        let dir = counting_dir(&[60, 40]);
        let mut plain = loader(dir.path(), 2, 5, 0, 1);
        let mut l = loader(dir.path(), 2, 5, 0, 1).rotated(137);
        assert_eq!(l.rotation(), 37);
        let first = l.next_batch().unwrap();
        assert_eq!(first.x, (37..47).collect::<Vec<i64>>());
        assert_ne!(first.x, plain.next_batch().unwrap().x);
        // The sixth step's window crosses the end of the stream and continues at token 0.
        for _ in 1..6 {
            l.next_batch().unwrap();
        }
        let wrapped = l.next_batch().unwrap();
        assert_eq!(wrapped.x, (97..100).chain(0..7).collect::<Vec<i64>>());
        assert_eq!(wrapped.y, (98..100).chain(0..8).collect::<Vec<i64>>());
        // Position and seek round-trip through the rotation, across the wrap and the epoch.
        let saved = l.position();
        let expected: Vec<Batch> = (0..12).map(|_| l.next_batch().unwrap()).collect();
        let mut resumed = loader(dir.path(), 2, 5, 0, 1).rotated(137);
        resumed.seek(saved).unwrap();
        assert_eq!((0..12).map(|_| resumed.next_batch().unwrap()).collect::<Vec<_>>(), expected);
        // Seeds give different rotations, each within the stream.
        let r: Vec<u64> = (0..4).map(|s| seed_rotation(s, 100)).collect();
        assert!(r.iter().all(|&x| x < 100) && r.windows(2).any(|w| w[0] != w[1]), "{r:?}");
    }

    /// The first token of each row of `b` (rows of `t` tokens) from a counting directory, after
    /// checking that every row is consecutive tokens (across shard boundaries) and `y` is `x` shifted.
    fn row_starts(b: &Batch, t: usize) -> Vec<u64> {
        let consecutive = |x: &[i64], y: &[i64]| (0..t).all(|k| x[k] == x[0] + k as i64 && y[k] == x[k] + 1);
        b.x.chunks(t)
            .zip(b.y.chunks(t))
            .inspect(|(x, y)| assert!(consecutive(x, y), "{x:?} {y:?}"))
            .map(|(x, _)| x[0] as u64)
            .collect()
    }

    #[test]
    fn random_windows_are_a_pure_function_of_seed_and_window_index() {
        let dir = counting_dir(&[400, 0, 1, 350, 249]);
        let read = |seed| {
            let mut l = loader(dir.path(), 3, 7, 0, 1).seeded(WindowSampling::Random, seed);
            assert_eq!((l.sampling(), l.rotation()), (WindowSampling::Random, 0));
            (0..20).map(|_| l.next_batch().unwrap()).collect::<Vec<_>>()
        };
        let a = read(5);
        assert_eq!(read(5), a);
        assert_ne!(read(6), a);
        // Window j of the run starts at random_window_start(seed, j), whatever shard it is in.
        let starts: Vec<u64> = a.iter().flat_map(|b| row_starts(b, 7)).collect();
        assert_eq!(starts, (0..60).map(|j| random_window_start(5, j, 1000, 7)).collect::<Vec<_>>());
        // Stream sampling under a seed is the stream rotated by the seed's token.
        let s = loader(dir.path(), 3, 7, 0, 1).seeded(WindowSampling::Stream, 5);
        assert_eq!((s.sampling(), s.rotation()), (WindowSampling::Stream, seed_rotation(5, 1000)));
    }

    #[test]
    fn random_windows_cover_the_whole_split_and_read_across_shards() {
        // 1000 tokens in uneven shards (an empty one included): windows of 8 tokens start in 0..=992.
        let dir = counting_dir(&[400, 0, 1, 350, 249]);
        let mut l = loader(dir.path(), 10, 7, 0, 1).random(2026);
        let mut hits = vec![0u32; 993];
        for _ in 0..2000 {
            for s in row_starts(&l.next_batch().unwrap(), 7) {
                hits[s as usize] += 1; // out of bounds past 992
            }
        }
        // 20,000 windows: every start is drawn, the first and the last (N - T - 1) included, and each
        // tenth of the range gets its share within 15% (2,000 expected, standard deviation about 42).
        assert!(hits.iter().all(|&h| h > 0), "never drawn: {:?}", hits.iter().position(|&h| h == 0));
        let tenths: Vec<u32> = (0..10).map(|k| hits[k * 993 / 10..(k + 1) * 993 / 10].iter().sum()).collect();
        assert!(tenths.iter().all(|&n| (1700..=2300).contains(&n)), "{tenths:?}");
        // Many windows cross one of the shard boundaries (tokens 400, 401, 751) and read on (row_starts).
        let crossing: u32 =
            (0..993).filter(|&s| [400, 401, 751].iter().any(|&b| s < b && s + 8 > b)).map(|s| hits[s]).sum();
        assert!(crossing > 200, "{crossing}"); // about 15 starts x 20 draws each
    }

    #[test]
    fn random_windows_of_a_step_do_not_depend_on_the_ranks() {
        // One process reading two batches of B = two ranks reading one each = one batch of 2B.
        let dir = counting_dir(&[300, 200, 123]);
        let mut one = loader(dir.path(), 3, 5, 0, 1).random(7);
        let mut ranks: Vec<DataLoader> = (0..2).map(|r| loader(dir.path(), 3, 5, r, 2).random(7)).collect();
        let mut wide = loader(dir.path(), 6, 5, 0, 1).random(7);
        for _ in 0..4 {
            let (a, b) = (one.next_batch().unwrap(), one.next_batch().unwrap());
            assert_eq!(ranks[0].next_batch().unwrap(), a);
            assert_eq!(ranks[1].next_batch().unwrap(), b);
            assert_eq!(wide.next_batch().unwrap(), Batch { x: [a.x, b.x].concat(), y: [a.y, b.y].concat() });
        }
        for l in ranks.iter().chain([&one, &wide]) {
            assert_eq!(l.position(), Position::Random { windows: 24 });
        }
    }

    #[test]
    fn random_position_and_seek_resume_identically_through_json() {
        let dir = counting_dir(&[300, 200, 123]);
        for (b, t, rank, w) in [(2, 5, 0, 1), (2, 5, 1, 3), (1, 64, 0, 2)] {
            let mut a = loader(dir.path(), b, t, rank, w).random(9);
            for _ in 0..37 {
                a.next_batch().unwrap();
            }
            let saved = serde_json::to_string(&a.position()).unwrap();
            assert_eq!(saved, format!("{{\"windows\":{}}}", 37 * b * w));
            let expected: Vec<Batch> = (0..50).map(|_| a.next_batch().unwrap()).collect();
            let mut resumed = loader(dir.path(), b, t, rank, w).random(9);
            resumed.seek(serde_json::from_str(&saved).unwrap()).unwrap();
            let got: Vec<Batch> = (0..50).map(|_| resumed.next_batch().unwrap()).collect();
            assert_eq!(got, expected, "B={b} T={t} rank {rank}/{w}");
            assert_eq!(resumed.position(), a.position());
        }
    }

    #[test]
    fn a_position_of_the_other_sampling_is_refused() {
        let dir = counting_dir(&[100]);
        let mut stream = loader(dir.path(), 2, 5, 0, 1);
        let mut random = loader(dir.path(), 2, 5, 0, 1).random(1);
        let err = random.seek(stream.position()).unwrap_err().to_string();
        assert!(err.contains("`stream` sampling, but this loader has `random`"), "{err}");
        assert!(err.contains("sampling = \"stream\""), "{err}");
        let err = stream.seek(random.position()).unwrap_err().to_string();
        assert!(err.contains("`random` sampling, but this loader has `stream`"), "{err}");
        // Stream positions of older checkpoints still parse; a mix of the two forms does not.
        let old: Position = serde_json::from_str(r#"{"epoch":2,"shard":0,"offset":7}"#).unwrap();
        assert_eq!(old, Position::Stream { epoch: 2, shard: 0, offset: 7 });
        for bad in [r#"{"windows":3,"epoch":1}"#, r#"{"epoch":2,"shard":0,"offset":7,"windows":1}"#, "{}"] {
            assert!(serde_json::from_str::<Position>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn validation_spans_are_spread_over_the_split_and_never_overlap() {
        let dir = tempfile::tempdir().unwrap();
        write_shard(&dir.path().join("v_val_000000.bin"), &(0..70).collect::<Vec<u16>>()).unwrap();
        write_shard(&dir.path().join("v_val_000001.bin"), &(70..100).collect::<Vec<u16>>()).unwrap();
        write_shard(&dir.path().join("v_train_000000.bin"), &[1, 2]).unwrap();
        let spans = validation_spans(dir.path(), 10, 4, None).unwrap();
        // Starts 0, 30, 60, 90: the first at the start, the last ending at the end, one crossing shards.
        let starts: Vec<u16> = spans.iter().map(|s| s[0]).collect();
        assert_eq!(starts, [0, 30, 60, 90]);
        assert!(spans.iter().all(|s| s.len() == 10 && s.windows(2).all(|w| w[1] == w[0] + 1)));
        assert_eq!(validation_spans(dir.path(), 10, 4, None).unwrap(), spans);
        assert_eq!(validation_spans(dir.path(), 100, 1, None).unwrap()[0], (0..100).collect::<Vec<u16>>());
        let err = validation_spans(dir.path(), 10, 11, None).unwrap_err();
        assert!(err.to_string().contains("100 validation tokens, fewer than 11 spans of 10 need (110)"), "{err}");
        assert!(validation_spans(dir.path(), 0, 1, None).is_err());
    }

    #[test]
    fn windows_cross_shard_boundaries() {
        let dir = counting_dir(&[5, 3, 9]);
        let mut l = loader(dir.path(), 1, 6, 0, 1);
        assert_eq!(l.next_batch().unwrap().x, (0..6).collect::<Vec<i64>>());
        assert_eq!(l.position(), Position::Stream { epoch: 0, shard: 1, offset: 1 });
        assert_eq!(l.next_batch().unwrap().y, (7..13).collect::<Vec<i64>>());
        assert_eq!(l.position(), Position::Stream { epoch: 1, shard: 0, offset: 0 });
    }

    #[test]
    fn bad_geometry_and_too_little_data_are_refused() {
        let dir = counting_dir(&[50]);
        for (b, t, r, w, name) in
            [(0, 4, 0, 1, "batch"), (1, 0, 0, 1, "seq"), (1, 4, 2, 2, "rank"), (1, 4, 0, 0, "world_size")]
        {
            let err = Geometry::new(b, t, r, w).unwrap_err();
            assert!(matches!(err, DataError::InvalidArgument { name: n, .. } if n == name), "{err}");
        }
        let err = DataLoader::open(dir.path(), Split::Train, Geometry::new(5, 5, 0, 2).unwrap(), None).unwrap_err();
        assert!(matches!(err, DataError::TooFewTokens { needed: 51, available: 50, .. }), "{err}");
        let mut l = loader(dir.path(), 1, 7, 0, 1);
        let err = l.seek(Position::Stream { epoch: 0, shard: 1, offset: 0 }).unwrap_err();
        assert!(err.to_string().contains("shard 1 does not exist"), "{err}");
    }

    #[test]
    fn tokenizer_mismatch_is_refused() {
        let dir = counting_dir(&[100]);
        let g = Geometry::single(2, 8).unwrap();
        assert!(DataLoader::open(dir.path(), Split::Train, g, Some("gpt2")).is_ok());
        let err = DataLoader::open(dir.path(), Split::Train, g, Some("bpe-8192-0123456789ab")).unwrap_err();
        assert!(
            matches!(&err, DataError::TokenizerMismatch { expected, found, .. }
            if expected == "bpe-8192-0123456789ab" && found == "gpt2"),
            "{err}"
        );
        assert!(err.to_string().contains("`gpt2`") && err.to_string().contains("`bpe-8192-0123456789ab`"), "{err}");
        assert!(matches!(validation_tokens(dir.path(), 10, Some("bpe-1")), Err(DataError::TokenizerMismatch { .. })));
    }

    #[test]
    fn a_bad_token_surfaces_when_the_loader_enters_its_shard() {
        let dir = tempfile::tempdir().unwrap();
        write_shard(&dir.path().join("t_train_000000.bin"), &[1; 40]).unwrap();
        let mut bad = vec![2u16; 40];
        bad[17] = 50257; // GPT-2's vocabulary is 0..50257
        write_shard(&dir.path().join("t_train_000001.bin"), &bad).unwrap();
        let mut l = loader(dir.path(), 1, 10, 0, 1);
        for _ in 0..3 {
            l.next_batch().unwrap(); // tokens 0..31 are in the good shard
        }
        let err = l.next_batch().unwrap_err();
        assert!(matches!(&err, DataError::TokenOutOfRange { token: 50257, index: 17, vocab_size: 50257, .. }), "{err}");
        assert!(err.to_string().contains("t_train_000001.bin: token 50257 at index 17"), "{err}");
    }

    #[test]
    fn validation_tokens_is_a_fixed_prefix_across_shards() {
        let dir = tempfile::tempdir().unwrap();
        write_shard(&dir.path().join("v_val_000000.bin"), &[5, 6, 7]).unwrap();
        write_shard(&dir.path().join("v_val_000001.bin"), &[8, 9]).unwrap();
        write_shard(&dir.path().join("v_train_000000.bin"), &[1, 2]).unwrap();
        assert_eq!(validation_tokens(dir.path(), 4, None).unwrap(), vec![5, 6, 7, 8]);
        assert_eq!(validation_tokens(dir.path(), 100, None).unwrap(), vec![5, 6, 7, 8, 9]);
        assert_eq!(validation_tokens(dir.path(), 4, None).unwrap(), validation_tokens(dir.path(), 4, None).unwrap());
    }
}
