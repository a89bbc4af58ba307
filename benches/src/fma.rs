//! The CPU's f32 fused multiply-add peak, measured: the most GFLOP/s any kernel's products can reach
//! on this machine with this many threads, printed beside the kernels' own GFLOP/s so a table says
//! how far each cell is from the machine's limit, not only from SDPA.
//!
//! Each thread runs independent chains of vector FMAs (`acc = acc * a + b`, enough chains to cover
//! the instruction's latency on every core seen: 12 on AVX2, 16 on AVX-512) on registers only, no
//! memory traffic; all threads start together and the rate is the FLOP of all of them over the
//! slowest one's time, best of `ROUNDS` (5). Counted as two FLOP per lane per FMA, the convention
//! of the tables' FlashAttention count (whose FLOP are the products' multiply-adds).
//!
//! Measured at the ISA the fused kernels run (`attn_kernels::cpu::Isa::detect`, which
//! `ATTN_KERNELS_ISA` can lower): on a CPU that slows its clock under 512-bit work, the AVX-512
//! peak is the one the AVX-512 kernels meet.

use std::sync::Barrier;
use std::time::Instant;

use attn_kernels::cpu::Isa;

/// Repetitions; the best is kept (a burst of load elsewhere only lowers a round).
const ROUNDS: usize = 5;
/// Target duration of one round, seconds.
const ROUND_S: f64 = 0.2;

/// The measured peak.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct FmaPeak {
    /// GFLOP/s of all threads together.
    pub gflops: f64,
    /// Threads that ran at once.
    pub threads: usize,
    /// f32 lanes of the vectors (8: AVX2, 16: AVX-512).
    pub lanes: usize,
}

/// The peak at the fused kernels' ISA on `threads` threads at once; `None` where that ISA has no
/// vector FMA this module knows (the portable path, non-x86 CPUs).
pub fn peak(threads: usize) -> Option<FmaPeak> {
    let kernel = Kernel::for_isa(Isa::detect())?;
    let threads = threads.max(1);
    // Calibrate on one thread, then size the rounds to ROUND_S.
    let probe = 1u64 << 16;
    let t0 = Instant::now();
    std::hint::black_box(kernel.run(probe));
    let per_iter = t0.elapsed().as_secs_f64() / probe as f64;
    let iters = ((ROUND_S / per_iter.max(1e-12)) as u64).clamp(probe, 1 << 32);
    let flop_per_thread = iters as f64 * kernel.flop_per_iter();
    let best = (0..ROUNDS).map(|_| round(kernel, threads, iters)).fold(f64::INFINITY, f64::min);
    Some(FmaPeak { gflops: flop_per_thread * threads as f64 / best / 1e9, threads, lanes: kernel.lanes })
}

/// One round: `threads` threads released together, each `iters` iterations; the slowest's seconds.
fn round(kernel: Kernel, threads: usize, iters: u64) -> f64 {
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let t0 = Instant::now();
                    std::hint::black_box(kernel.run(iters));
                    t0.elapsed().as_secs_f64()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("an FMA thread panicked")).fold(0.0, f64::max)
    })
}

/// A chain kernel for one ISA.
#[derive(Clone, Copy)]
struct Kernel {
    lanes: usize,
    chains: usize,
    #[cfg(target_arch = "x86_64")]
    isa: Isa,
}

impl Kernel {
    #[cfg(target_arch = "x86_64")]
    fn for_isa(isa: Isa) -> Option<Kernel> {
        // AMX's FMA code is AVX-512's: its peak is the AVX-512 pipes'.
        match isa.simd() {
            Isa::Avx512 => Some(Kernel { lanes: 16, chains: x86::CHAINS_512, isa: Isa::Avx512 }),
            Isa::Avx2Fma => Some(Kernel { lanes: 8, chains: x86::CHAINS_256, isa: Isa::Avx2Fma }),
            _ => None,
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn for_isa(_: Isa) -> Option<Kernel> {
        None
    }

    fn flop_per_iter(self) -> f64 {
        (2 * self.lanes * self.chains) as f64
    }

    /// `iters` iterations of every chain; returns a value that depends on all of them.
    #[cfg(target_arch = "x86_64")]
    fn run(self, iters: u64) -> f32 {
        match self.isa {
            // SAFETY: `for_isa` built this kernel from the ISA the fused kernels detected on this CPU.
            Isa::Avx512 => unsafe { x86::chains_512(iters) },
            // SAFETY: as above.
            Isa::Avx2Fma => unsafe { x86::chains_256(iters) },
            _ => unreachable!("no kernel is built for {}", self.isa),
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn run(self, _: u64) -> f32 {
        unreachable!("no kernel is built off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// Independent chains on AVX2: Zen 1 to 4 and Intel's cores have an FMA latency of 4 or 5 cycles
    /// and at most two FMA pipes, so 10 cover them; 12 of the 16 registers.
    pub(super) const CHAINS_256: usize = 12;
    /// Independent chains on AVX-512 (latency 4, two pipes on the largest Xeons: 8 needed).
    pub(super) const CHAINS_512: usize = 16;

    // `acc = acc * a + b` with `a` just under 1 and `b` small: every chain converges to
    // `b / (1 - a)` = 1 and stays a normal number, whatever `iters`.
    const A: f32 = 0.999_999;
    const B: f32 = 1e-6;

    /// `unsafe fn $name(iters: u64) -> f32`: `$chains` chains of `$lanes`-lane vectors, `iters` FMAs
    /// each, and the sum of their lanes at the end.
    macro_rules! chains {
        ($(#[$doc:meta])* $name:ident, $feature:literal, $chains:expr, $lanes:literal, $set1:ident, $fmadd:ident, $store:ident) => {
            $(#[$doc])*
            #[target_feature(enable = $feature)]
            pub(super) unsafe fn $name(iters: u64) -> f32 {
                // Opaque to the compiler, which would otherwise fold the chains at their fixed point.
                let (a, b, one) = (black_box(A), black_box(B), black_box(1.0f32));
                let (a, b) = ($set1(a), $set1(b));
                let mut acc = [$set1(one); $chains];
                for _ in 0..iters {
                    for x in acc.iter_mut() {
                        *x = $fmadd(*x, a, b);
                    }
                }
                let mut lanes = [0.0f32; $lanes];
                let mut total = 0.0;
                for x in acc {
                    // SAFETY: `lanes` holds one vector's f32s.
                    unsafe { $store(lanes.as_mut_ptr(), x) };
                    total += lanes.iter().sum::<f32>();
                }
                total
            }
        };
    }

    chains!(
        /// # Safety
        ///
        /// The CPU has AVX2 and FMA.
        chains_256, "avx2,fma", CHAINS_256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps
    );
    chains!(
        /// # Safety
        ///
        /// The CPU has AVX-512F.
        chains_512, "avx512f", CHAINS_512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_a_finite_positive_rate_of_the_threads_asked_for() {
        let Some(p) = peak(1) else {
            return; // no vector FMA here: nothing to measure
        };
        assert!(p.gflops.is_finite() && p.gflops > 0.0, "{p:?}");
        assert_eq!((p.threads, p.lanes == 8 || p.lanes == 16), (1, true), "{p:?}");
        // No x86 core issues more than two vector FMAs a cycle, nor runs at 6 GHz: a rate above
        // that bound means the compiler folded the chains away and nothing was measured.
        let bound = (p.lanes * 2 * 2) as f64 * 6.0;
        assert!(p.gflops < bound, "{p:?}: above {bound} GFLOP/s for one thread");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_chain_converges_to_one_whatever_the_length() {
        for isa in [Isa::Avx2Fma, Isa::Avx512] {
            if !isa.is_supported() {
                continue;
            }
            let k = Kernel::for_isa(isa).unwrap();
            for iters in [0, 1, 1000, 1 << 20] {
                let sum = k.run(iters);
                let expected = (k.lanes * k.chains) as f32;
                assert!((sum - expected).abs() < 1e-3 * expected, "{isa:?}, {iters} iterations: {sum}");
            }
        }
    }
}
