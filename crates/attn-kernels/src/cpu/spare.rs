//! Large per-call buffers kept between calls: the packed key and value tiles, the backward's `dq`
//! partials and `backward_with`'s internal forward output, tens of MB at `T = 4096`, which a call
//! otherwise takes fresh from the allocator.
//!
//! Fresh means page faults. glibc serves a block this size from a thread's arena or from `mmap`,
//! and gives the pages back to the kernel when the block is freed (`MADV_DONTNEED` when a rayon
//! worker's arena top passes the trim threshold, `munmap` for a mapped block), so every call faulted
//! its 25 MB of pack and output in again: on an Intel Xeon (2 threads, `B = 1, H = 12, T = 4096,
//! d = 64`) the forward took 100 ms with them and 86-89 ms without (glibc told to keep its pages,
//! `MALLOC_TRIM_THRESHOLD_` and `MALLOC_MMAP_THRESHOLD_` set high), while SDPA's one output block
//! stays under the threshold and reuses its pages.
//!
//! The shelf keeps what calls give back, up to [`KEEP_BYTES`] in all (the oldest go first), and
//! [`release_spare_buffers`] empties it. A buffer comes back with its values unspecified: whoever
//! takes one writes every value before reading it (the packing and the forward do; the partials are
//! zeroed by their tasks).
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, PoisonError};

/// Most bytes the shelf keeps between calls: a 12-head `T = 4096, d = 64` backward's packed keys,
/// values and `dq` partials (3 x 12.6 MB), twice. A larger buffer is freed when given back.
pub(crate) const KEEP_BYTES: usize = 96 << 20;

/// Buffers smaller than this come from the allocator and go back to it (glibc keeps the pages of
/// most).
const MIN_BYTES: usize = 256 << 10;

/// The buffers kept, oldest first.
struct Shelf(Vec<Vec<f32>>);

impl Shelf {
    /// The smallest buffer of at least `len` floats' capacity and at most twice that, off the shelf
    /// (a larger one stays for a larger request: under AMX a call's 3-part operands are 3x its
    /// other buffers, and serving an output from them made the next call's operands fresh).
    fn take(&mut self, len: usize) -> Option<Vec<f32>> {
        let fits = |b: &Vec<f32>| (len..=2 * len).contains(&b.capacity());
        let best = self.0.iter().enumerate().filter(|(_, b)| fits(b)).min_by_key(|(_, b)| b.capacity());
        best.map(|(i, _)| i).map(|i| self.0.remove(i))
    }

    /// Keeps `buf` if its size is in bounds, then frees the oldest until the shelf holds at most
    /// [`KEEP_BYTES`].
    fn give(&mut self, buf: Vec<f32>) {
        if !(MIN_BYTES..=KEEP_BYTES).contains(&(buf.capacity() * 4)) {
            return;
        }
        self.0.push(buf);
        while self.bytes() > KEEP_BYTES {
            self.0.remove(0);
        }
    }

    fn bytes(&self) -> usize {
        self.0.iter().map(|b| b.capacity() * 4).sum()
    }
}

static SHELF: Mutex<Shelf> = Mutex::new(Shelf(Vec::new()));

fn shelf() -> std::sync::MutexGuard<'static, Shelf> {
    // A panic elsewhere cannot leave the list itself inconsistent.
    SHELF.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `len` floats of unspecified value (each written before it is read), from the shelf when it
/// holds one large enough (the smallest such), else fresh; back to the shelf on drop.
pub(crate) struct Spare(Vec<f32>);

impl Spare {
    pub(crate) fn take(len: usize) -> Self {
        let found = if len * 4 < MIN_BYTES { None } else { shelf().take(len) };
        match found {
            Some(mut buf) => {
                // Within the capacity: no reallocation; only values past the old length are written.
                buf.resize(len, 0.0);
                Self(buf)
            }
            // calloc: the pages are faulted in by whoever first writes them (the parallel packing).
            None => Self(vec![0.0; len]),
        }
    }

    /// No buffer (a call that packs no values).
    pub(crate) const fn none() -> Self {
        Self(Vec::new())
    }
}

impl Deref for Spare {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.0
    }
}

impl DerefMut for Spare {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        if buf.capacity() * 4 >= MIN_BYTES {
            shelf().give(buf);
        }
    }
}

/// Frees every buffer the kernels keep between calls (at most 96 MiB: packed key and value tiles,
/// the backward's `dq` partials); returns the bytes freed. The next long call allocates afresh.
pub fn release_spare_buffers() -> usize {
    let freed = std::mem::replace(&mut *shelf(), Shelf(Vec::new()));
    freed.bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = (1 << 20) / 4;

    #[test]
    fn the_shelf_gives_the_smallest_buffer_that_fits_and_frees_the_oldest_past_its_bound() {
        let mut shelf = Shelf(Vec::new());
        for mib in [8, 2, 4] {
            shelf.give(Vec::with_capacity(mib * MIB));
        }
        shelf.give(Vec::with_capacity(MIB / 8)); // under MIN_BYTES: not kept
        shelf.give(Vec::with_capacity(KEEP_BYTES / 4 + 1)); // over KEEP_BYTES: not kept
        assert_eq!(shelf.bytes(), 14 << 20);
        assert_eq!(shelf.take(3 * MIB).map(|b| b.capacity()), Some(4 * MIB));
        assert_eq!(shelf.take(9 * MIB), None);
        assert_eq!(shelf.bytes(), 10 << 20);
        // 8 + 2 + 90 MiB > 96: the oldest (8 MiB) goes.
        shelf.give(Vec::with_capacity(90 * MIB));
        assert_eq!(shelf.0.iter().map(|b| b.capacity() / MIB).collect::<Vec<_>>(), [2, 90]);
    }

    #[test]
    fn a_spare_has_the_length_asked_whatever_the_shelf_held() {
        for len in [16, 3 * MIB + 5, 3 * MIB - 3, 5 * MIB] {
            let mut a = Spare::take(len);
            assert_eq!(a.len(), len);
            a.fill(1.0);
        }
        assert_eq!(&*Spare::take(16), &[0.0; 16]);
    }

    /// Every call writes each value of a buffer off the shelf before reading it: with the shelf
    /// holding NaN-filled buffers of the lengths the calls take, the outputs and gradients are those
    /// of calls on fresh buffers, bit for bit, on every ISA, self-attention and grouped.
    #[test]
    fn calls_on_buffers_full_of_nan_give_the_results_of_calls_on_fresh_ones() {
        use crate::cpu::{self, Isa, Options, Tuning};
        use ndarray::s;
        // T off the tile sizes (padded last tiles); packed keys 5 x 64 x 128 floats a head at the
        // AVX-512 tiles, and the dq partials, over MIN_BYTES.
        let (t, d) = (520, 64);
        let (q, k, v) = attn_core::fixtures::random_qkv::<f32>([1, 4, t, d], 5);
        let g = attn_core::fixtures::random_qkv::<f32>([1, 4, t, d], 6).0;
        for isa in Isa::all_supported() {
            let opts = Options { tuning: Tuning::for_isa(isa), isa, ..Options::default() };
            for (name, kv_heads) in [("lssa", 4), ("lssa+rw15", 4), ("softmax", 4), ("lssa", 2)] {
                let var: attn_core::Variant = name.parse().unwrap();
                let (k, v) = (k.slice(s![.., ..kv_heads, .., ..]), v.slice(s![.., ..kv_heads, .., ..]));
                let run = || {
                    let o = cpu::forward_with(&var, &q, k, v, &opts).unwrap();
                    let gr = cpu::backward_with(&var, &q, k, v, &g, &opts).unwrap();
                    (o, gr.dq, gr.dk, gr.dv)
                };
                release_spare_buffers();
                let fresh = run();
                // The lengths the calls take: what they gave back.
                let lens: Vec<usize> = shelf().0.iter().map(Vec::len).collect();
                assert!(!lens.is_empty(), "{name}: the calls kept no buffer");
                release_spare_buffers();
                for len in lens {
                    shelf().give(vec![f32::NAN; len]);
                }
                assert_eq!(run(), fresh, "{name}, {kv_heads} key heads, {isa:?}");
            }
        }
    }
}
