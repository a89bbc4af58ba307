//! Lab v10, the warp-specialised Hopper forward (issue 63), in the CPU emulator: against attn-core's
//! f64 reference on the check cases in both thread orders, each of Hopper's pipeline rules broken
//! once in v10 itself and reported by name, the TMA layout probe, and its work beside v5's.
//!
//! Needs the host C++ compiler (`$CXX` or `c++`), which building tch already requires.

use attn_kernels::cuda::{Dtype, Kernel, Options, Version, emu};
use emu::Lab;

mod emu_cases;
use emu_cases::{Case, bounds, case, case_b, kernel_jobs_b, rel_err, replace_first, run_all};

/// Lab v10 (warp-specialised: a TMA producer warp, two consumer warpgroups in a ping-pong) against
/// the reference on every case of `bench-cuda check`'s table it runs (16-bit, d = 64): each fused
/// stage-1 activation at T = 77 in bf16, and LSSA, LSSAR (p = 1, 3, 15, 64), softmax, softmax + rw15
/// and sigmoid-rowbias-l1 + rw15 at T = 1, 5, 130 and 300 in f16 and bf16, in both thread orders;
/// plus two batch entries of two heads (every stride of the tensor maps), every rule of the
/// emulator on.
#[test]
fn v10_matches_the_reference() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let v10 = [Kernel::Lab(Version::V10)];
    let both = [false, true];
    let mut jobs = Vec::new();
    for name in attn_core::variant::STAGE1_NAMES {
        let name = if name.starts_with("sigmoid-bias") { format!("{name}:t_train=64") } else { name.to_string() };
        if attn_kernels::cuda::Config::new(&name.parse().unwrap(), 64).is_ok() {
            jobs.extend(kernel_jobs_b(&name, 1, 77, 64, Dtype::Bf16, &v10, &[], &[false]));
        }
    }
    let named = [
        "lssa",
        "lssa+rw1",
        "lssa+rw3",
        "lssa+rw15",
        "lssa+rw64",
        "softmax",
        "softmax+rw15",
        "sigmoid-rowbias-l1+rw15",
    ];
    for name in named {
        for dt in [Dtype::F16, Dtype::Bf16] {
            for t in [1, 5, 130, 300] {
                jobs.extend(kernel_jobs_b(name, 1, t, 64, dt, &v10, &[], &both));
            }
        }
    }
    jobs.extend(kernel_jobs_b("lssa+rw15", 2, 70, 64, Dtype::Bf16, &v10, &[], &both));
    assert!(jobs.len() >= 18 + 8 * 2 * 4 * 2, "{} jobs", jobs.len());
    run_all(jobs);
}

/// Each of Hopper's pipeline rules, broken once in v10 itself, is reported by name (LSSA and
/// LSSAR, bf16, T = 600, d = 64: ten key tiles, so the ring of four stages wraps): the emulator's
/// rules (LAB.md) hold for the kernel they were built for, not only for their own small ring.
#[test]
fn v10s_broken_pipelines_are_reported_by_name() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    for name in ["lssa", "lssa+rw15"] {
        let c = case(name, 600, 64, Dtype::Bf16, 31);
        let opts = Options { dtype: c.dt, kernel: Kernel::Lab(Version::V10) };
        let run = |edit: &dyn Fn(String) -> String| {
            emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &Lab { edit: Some(edit), ..Lab::default() })
        };
        assert!(rel_err(&run(&|s| s).unwrap(), &c.o) < bounds(&c).0, "{name}: v10 as written passes every rule");
        let planted: [(&str, &str, &str, &str); 6] = [
            (
                "        mbar_wait(&full[i % NS10], (i / NS10) & 1);\n",
                "",
                "a consumer that does not wait for its stage",
                "reads a stage before the mbarrier phase its TMA copy completes|reads a TMA-written stage before this \
                 thread waited for the mbarrier phase",
            ),
            (
                "        mbar_wait(&full[i % NS10], (i / NS10) & 1);\n",
                "        mbar_wait(&full[i % NS10], 0);\n",
                "a consumer whose phase bit never flips",
                "which this thread has already waited for",
            ),
            (
                "mbar_arrive_expect_tx(&full[s], (want_v ? 2 : 1) * TILE10 * 2);",
                "mbar_arrive_expect_tx(&full[s], (want_v ? 2 : 1) * TILE10 * 2 + 16);",
                "expect_tx over the tile's bytes",
                "misses 0 arrivals and 16 transaction bytes",
            ),
            (
                "| ((u64)(sbo >> 4) << 32) |\n           (1ull << 62);",
                "| ((u64)(sbo >> 4) << 32) |\n           (2ull << 62);",
                "descriptors of the 64-byte swizzle",
                "swizzle mismatch: TMA wrote the stage with a 128-byte swizzle, the wgmma descriptor reads it with 64",
            ),
            (
                "wg_wait<1>(); // S (P V of tile i - 1 may still run)",
                "; // (no wait)",
                "the scores used before the wait that covers their product",
                "accumulator registers of an in-flight",
            ),
            (
                "setmaxnreg_inc<240>();",
                "setmaxnreg_inc<248>();",
                "consumers asking for more registers than the file has",
                "setmaxnreg.inc to 248 registers",
            ),
        ];
        for (from, to, what, message) in planted {
            match run(&replace_first(from, to)) {
                Err(e) => assert!(message.split('|').any(|m| e.to_string().contains(m)), "{name}, {what}: {e}"),
                Ok(o) => panic!("{name}, {what}: not reported (error {:.2e})", rel_err(&o, &c.o)),
            }
        }
    }
    // A consumer that releases its stage as soon as it has waited for it (before its products; its
    // later arrival then comes too late to matter): the producer refills a stage of the ring under a
    // product that still reads it.
    let c = case("lssa", 600, 64, Dtype::Bf16, 37);
    let opts = Options { dtype: c.dt, kernel: Kernel::Lab(Version::V10) };
    let early = replace_first(
        "        mbar_wait(&full[i % NS10], (i / NS10) & 1);\n",
        "        mbar_wait(&full[i % NS10], (i / NS10) & 1);\n        mbar_arrive(&empty[i % NS10]);\n",
    );
    let e = emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &Lab { edit: Some(&early), ..Lab::default() });
    match e {
        Err(e) => assert!(e.to_string().contains("a TMA copy overwrote a stage this thread still reads"), "{e}"),
        Ok(o) => panic!("an early release: not reported (error {:.2e})", rel_err(&o, &c.o)),
    }
}

/// Lab v10's work beside v5's (LAB.md's profile table, printed with `--nocapture`), LSSA and LSSAR,
/// bf16, one head of T = 512 at d = 64 (two heads: `case_b` makes B x 2): the same products but for
/// the key tile past each block's first 64 rows (its consumer warpgroup skips it), no ldmatrix, every
/// tile by TMA, and a known number of mbarrier waits.
#[test]
fn v10s_work_beside_v5s() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let forward = |c: &Case, kernel: Kernel| {
        let p = std::cell::Cell::new(emu::Profile::default());
        let opts = Options { dtype: c.dt, kernel };
        emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &Lab { profile: Some(&p), ..Lab::default() }).unwrap();
        p.get()
    };
    // Key tiles per 128-row block up to the diagonal: 2, 4, 6, 8.
    let tiles: u64 = (0..4u64).map(|qb| 2 * qb + 2).sum();
    let mut table = String::from(
        "variant    version  mma.sync-eq  ldmatrix  TMA KiB  mbar waits  MUFU/score  (per 2 heads, T = 512)\n",
    );
    for name in ["lssa", "lssa+rw15"] {
        let c = case_b(name, 1, 512, 64, Dtype::Bf16, 17);
        let (f5, f10) = (forward(&c, Kernel::Lab(Version::V5)), forward(&c, Kernel::Lab(Version::V10)));
        // Scores computed: v5 all 128 rows of every tile, v10 64 rows fewer in each block's last tile.
        let (s5, s10) = ((tiles * 128 * 64 * 2) as f64, ((tiles * 128 - 4 * 64) * 64 * 2) as f64);
        let sweeps = if name.contains("+rw") { 2.0 } else { 1.0 };
        for (label, f, s) in [("v5", f5, s5), ("v10", f10, s10)] {
            table += &format!(
                "{name:<10} {label:<8} {:>11} {:>9} {:>8} {:>11} {:>11.3}\n",
                f.mma,
                f.ldmatrix,
                f.tma_bytes / 1024,
                f.mbar_waits,
                f.special as f64 / (s * sweeps)
            );
        }
        assert_eq!(f10.ldmatrix, 0, "{name}: v10 reads every operand by wgmma from shared memory");
        if name == "lssa" {
            assert_eq!(f10.mma * 10, f5.mma * 9, "v10 skips 4 of v5's 40 half-tiles of products");
            // Q (16 KiB) once per block, K and V (8 KiB each) per tile; two heads.
            assert_eq!(f10.tma_bytes, (2 * 4 + 2 * tiles) * 8192 * 2);
            // Per tile the producer's 32 lanes wait for its stage, the 256 consumers for its landing;
            // per block the consumers for Q.
            assert_eq!(f10.mbar_waits, ((32 + 256) * tiles + 256 * 4) * 2);
            let (m5, m10) = (f5.special as f64 / s5, f10.special as f64 / s10);
            assert!((m10 / m5 - 1.0).abs() < 0.03, "MUFU per computed score: v5 {m5:.3}, v10 {m10:.3}");
        }
    }
    eprintln!("{table}");
}

/// Re-weighting's second sweep skips the key tiles where no row of a block can have a weight (v5's
/// skip, which v10's producer and consumers must agree on tile by tile): queries along one direction
/// u, the first 64 keys along u and the rest along -u (bf16, T = 512, d = 64), so every row from 64
/// on puts its weight on the first tile. Right against the reference, and the skip is real: the
/// second kernel's TMA copies fewer tiles than the sweep has (block 0's rows are exactly uniform and
/// fall back, so that block needs every tile). Both thread orders.
#[test]
fn v10s_second_sweep_skips_the_tiles_no_row_needs() {
    assert!(emu::is_available(), "the CUDA emulator needs a C++ compiler ($CXX or c++)");
    let (t, d, dt) = (512, 64, Dtype::Bf16);
    let mut rng = emu_cases::Rng(19);
    let u: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
    let q = ndarray::Array4::from_shape_fn((1, 1, t, d), |(_, _, _, c)| emu_cases::round(dt, u[c]));
    let k = ndarray::Array4::from_shape_fn((1, 1, t, d), |(_, _, j, c)| {
        emu_cases::round(dt, if j < 64 { u[c] } else { -u[c] })
    });
    let (vv, g) = (rng.array((1, 1, t, d), 1.0, dt), rng.array((1, 1, t, d), 1.0, dt));
    let c = emu_cases::case_of("lssa+rw15".parse().unwrap(), dt, q, k, vv, g);
    let opts = Options { dtype: dt, kernel: Kernel::Lab(Version::V10) };
    let mut profiles = Vec::new();
    for reverse in [false, true] {
        let profile = std::cell::Cell::new(emu::Profile::default());
        let lab = Lab { profile: Some(&profile), reverse, ..Lab::default() };
        let o = emu::forward_lab(&c.v, &c.q, &c.k, &c.vv, &opts, &lab).unwrap();
        assert!(rel_err(&o, &c.o) < bounds(&c).0, "reverse {reverse}: error {:.2e}", rel_err(&o, &c.o));
        profiles.push(profile.get().tma_bytes);
    }
    // Without a skip: per block Q (16 KiB) in each kernel, K (8 KiB) per tile in the first, K and V
    // in the second; tiles 2, 4, 6, 8 per block. With it, the second kernel copies block 0's two tiles
    // and only the first tile of each other block.
    let tiles = 2 + 4 + 6 + 8;
    let first = 4 * 16 + tiles * 8;
    let (unskipped, skipped) = (first + 4 * 16 + tiles * 16, first + 4 * 16 + (2 + 1 + 1 + 1) * 16);
    assert_eq!(profiles, [skipped * 1024; 2], "bytes by TMA (without the skip: {unskipped} KiB)");
}
