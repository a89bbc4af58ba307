//! The emulator's Hopper machinery on small kernels of its own (`emu::run_standalone`): TMA copies
//! into a ring of stages with mbarrier hand-offs, read by two consumer warpgroups' `wgmma` through
//! 128-byte swizzled descriptors, `setmaxnreg` moving registers from the producer to the consumers,
//! and named barriers. Each correct kernel passes in both thread orders; each rule the emulator
//! enforces is shown by a planted break that it reports by name (issue 63, item 1).

use attn_kernels::cuda::emu;

/// The emulator's TMA tensor map (`emu::TensorMap` in emu.h): a tiled map of 16-bit elements of up
/// to 4 dimensions, used here in 2.
#[repr(C)]
#[derive(Clone, Copy)]
struct TensorMap {
    base: *const u16,
    dim: [u64; 4],
    stride: [u64; 3],
    r#box: [u32; 4],
    swizzle: u32,
}

#[repr(C)]
struct RingParams {
    map: TensorMap,
    out: *mut f32,
    tiles: i32,
    stages: i32,
}

#[repr(C)]
struct NamedParams {
    out: *mut i32,
}

fn bytes_of<T>(p: &T) -> &[u8] {
    // SAFETY: a plain `repr(C)` parameter block, read as its bytes.
    unsafe { std::slice::from_raw_parts((p as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// The ring: warpgroup 0's first thread loads 64 x 64 bf16 tiles (128-byte rows, 128-byte swizzle)
/// into `stages` stages, each with a full barrier (one arrival with the tile's bytes) and an empty
/// one (the 128 threads of the consumer that read it); warpgroups 1 and 2 take the tiles in turn and
/// multiply a 64 x 16 matrix of ones by each 16-column slice of the tile (`wgmma`, B K-major through
/// a swizzled descriptor), so that every row of the result holds the tile's row sums.
const RING: &str = r#"
struct RingParams { emu::TensorMap map; float* out; int tiles; int stages; };

static void ring(const void* pv) {
    const RingParams& p = *(const RingParams*)pv;
    __shared__ unsigned long long full[4], empty[4];
    unsigned char* smem = (unsigned char*)emu_dyn_smem();
    const int tid = threadIdx.x, wg = tid / 128;
    if (tid == 0)
        for (int s = 0; s < p.stages; s++) {
            emu::mbar_init(&full[s], 1);
            emu::mbar_init(&empty[s], 128);
        }
    __syncthreads();
    if (wg == 0) {
        emu::setmaxnreg(24, false);
        if (tid == 0)
            for (int t = 0; t < p.tiles; t++) {
                const int s = t % p.stages;
                emu::mbar_wait(&empty[s], ((t / p.stages) & 1) ^ 1);
                emu::mbar_arrive_expect_tx(&full[s], 64 * 64 * 2);
                emu::tma_load_2d(smem + s * 8192, &p.map, 0, t * 64, &full[s]);
            }
        return;
    }
    emu::setmaxnreg(240, true);
    unsigned a[4];
    for (int i = 0; i < 4; i++) a[i] = 0x3f803f80u; // bf16 ones
    float d[32];
    for (int t = wg - 1; t < p.tiles; t += 2) {
        const int s = t % p.stages;
        emu::mbar_wait(&full[s], (t / p.stages) & 1);
        const unsigned base = emu::smem_offset(smem + s * 8192);
        for (int kk = 0; kk < 4; kk++) {
            // K-major, 128-byte swizzle: 8 rows of 128 bytes an atom (stride byte offset 1024), each
            // 16-column slice 32 bytes further on within the rows.
            const unsigned long long desc = (unsigned long long)((base + kk * 32) >> 4) | (1ull << 16) |
                                            ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
            emu::wg_fence();
            emu::wgmma(d, a, desc, 64, kk > 0, false, false);
            emu::wg_commit();
            emu::wg_wait(0);
        }
        emu::mbar_arrive(&empty[s]);
        // Accumulator i of lane l: row (l / 4) + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 (l % 4) + (i & 1).
        const int l = tid & 31;
        if (((tid / 32) & 3) == 0 && l < 4)
            for (int i = 0; i < 32; i++)
                if (((i >> 1) & 1) == 0) p.out[t * 64 + 8 * (i >> 2) + 2 * l + (i & 1)] = d[i];
    }
}
"#;

/// Two groups of 4 warps exchange values through shared memory behind a named barrier each
/// (`bar.sync 1|2, 128`); then warps 0-3 write and `bar.arrive 3, 256` while warps 4-7 `bar.sync 3,
/// 256` and read.
const NAMED: &str = r#"
struct NamedParams { int* out; };

static void named(const void* pv) {
    const NamedParams& p = *(const NamedParams*)pv;
    int* buf = (int*)emu_dyn_smem();
    const int tid = threadIdx.x, group = tid / 128;
    buf[tid] = 3 * tid;
    emu::named_sync(1 + group, 128);
    p.out[tid] = buf[group * 128 + (tid + 1) % 128];
    __syncthreads();
    if (group == 0) {
        buf[256 + tid] = 7 * tid;
        emu::named_arrive(3, 256);
    } else {
        emu::named_sync(3, 256);
        p.out[256 + tid - 128] = buf[256 + (tid - 128)];
    }
}
"#;

/// The ring's matrix: `rows` x 64 small integers in bf16 (exact), and its row sums padded with zeros
/// to whole tiles (TMA fills rows past the tensor with zeros).
fn matrix(rows: usize, tiles: usize) -> (Vec<u16>, Vec<f32>) {
    let vals: Vec<f32> = (0..rows * 64).map(|i| ((i * 7 + i / 64 * 3) % 5) as f32 - 2.0).collect();
    let bits = vals.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
    let mut sums = vec![0f32; tiles * 64];
    for (r, s) in sums.iter_mut().enumerate().take(rows) {
        *s = vals[r * 64..(r + 1) * 64].iter().sum();
    }
    (bits, sums)
}

fn run_ring(src: &str, reverse: bool) -> Result<(Vec<f32>, Vec<f32>, emu::Profile), String> {
    let (tiles, stages) = (6usize, 2usize);
    let rows = tiles * 64 - 10;
    let (m, sums) = matrix(rows, tiles);
    let mut out = vec![f32::NAN; tiles * 64];
    let params = RingParams {
        map: TensorMap {
            base: m.as_ptr(),
            dim: [64, rows as u64, 1, 1],
            stride: [128, 128 * rows as u64, 128 * rows as u64],
            r#box: [64, 64, 1, 1],
            swizzle: 128,
        },
        out: out.as_mut_ptr(),
        tiles: tiles as i32,
        stages: stages as i32,
    };
    let p = emu::run_standalone(src, &["ring"], "ring", (1, 1), 384, stages * 8192, bytes_of(&params), reverse)?;
    Ok((out, sums, p))
}

fn ring_fails(edit: (&str, &str), reverse: bool) -> String {
    assert!(RING.contains(edit.0), "the edit's text is not in the kernel: {}", edit.0);
    let src = RING.replacen(edit.0, edit.1, 1);
    match run_ring(&src, reverse) {
        Err(e) => e,
        Ok((out, sums, _)) => panic!("the planted break {edit:?} passed: out == sums is {}", out == sums),
    }
}

#[test]
fn a_tma_ring_with_mbarriers_feeds_two_consumer_warpgroups_in_either_thread_order() {
    if !emu::is_available() {
        eprintln!("skipped: no host C++ compiler");
        return;
    }
    for reverse in [false, true] {
        let (out, sums, p) = run_ring(RING, reverse).unwrap();
        assert_eq!(out, sums, "reverse {reverse}");
        assert_eq!(p.tma_bytes, 6 * 8192, "six tiles of 8 KiB");
        // Each consumer thread waits once per tile of its own, the producer once per tile.
        assert_eq!(p.mbar_waits, 6 + 3 * 128 * 2);
    }
}

#[test]
fn the_emulator_reports_each_broken_pipeline_rule_by_name() {
    if !emu::is_available() {
        eprintln!("skipped: no host C++ compiler");
        return;
    }
    let waits_full = "emu::mbar_wait(&full[s], (t / p.stages) & 1);";
    // A consumer that does not wait for its stage's phase reads it before the copy lands.
    let e = ring_fails((waits_full, ""), false);
    assert!(e.contains("reads a stage before the mbarrier phase its TMA copy completes"), "{e}");
    // A consumer whose phase bit never flips waits again for a phase it has seen.
    let e = ring_fails((waits_full, "emu::mbar_wait(&full[s], 0);"), false);
    assert!(e.contains("which this thread has already waited for"), "{e}");
    // A consumer that releases its stage before reading it lets the producer overwrite it.
    let e = ring_fails(
        (
            "        const unsigned base = emu::smem_offset(smem + s * 8192);",
            "        emu::mbar_arrive(&empty[s]);\n        const unsigned base = emu::smem_offset(smem + s * 8192);",
        ),
        false,
    );
    assert!(e.contains("a TMA copy overwrote a stage this thread still reads"), "{e}");
    // An expect_tx larger than the copy never completes the phase; a smaller one is over-delivered.
    let expect = "emu::mbar_arrive_expect_tx(&full[s], 64 * 64 * 2);";
    let e = ring_fails((expect, "emu::mbar_arrive_expect_tx(&full[s], 64 * 64 * 2 + 16);"), false);
    assert!(e.contains("misses 0 arrivals and 16 transaction bytes"), "{e}");
    let e = ring_fails((expect, "emu::mbar_arrive_expect_tx(&full[s], 64 * 64 * 2 - 16);"), false);
    assert!(e.contains("delivered 16 bytes more than its expect_tx"), "{e}");
    // The descriptor reading with a 64-byte swizzle what TMA wrote with 128.
    let e = ring_fails(("(1ull << 62)", "(2ull << 62)"), false);
    assert!(
        e.contains(
            "swizzle mismatch: TMA wrote the stage with a 128-byte swizzle, the wgmma descriptor reads it with 64"
        ),
        "{e}"
    );
    // Consumers asking for more registers than the producer gave back.
    let e = ring_fails(("emu::setmaxnreg(240, true);", "emu::setmaxnreg(248, true);"), true);
    assert!(e.contains("setmaxnreg.inc to 248 registers in warpgroup 2"), "{e}");
}

fn run_named(src: &str, reverse: bool) -> Result<Vec<i32>, String> {
    let mut out = vec![-5i32; 384];
    let params = NamedParams { out: out.as_mut_ptr() };
    emu::run_standalone(src, &["named"], "named", (1, 1), 256, 512 * 4, bytes_of(&params), reverse)?;
    Ok(out)
}

#[test]
fn named_barriers_order_their_threads_and_report_wrong_counts() {
    if !emu::is_available() {
        eprintln!("skipped: no host C++ compiler");
        return;
    }
    let want: Vec<i32> =
        (0..256i32).map(|t| 3 * ((t / 128) * 128 + (t + 1) % 128)).chain((0..128i32).map(|t| 7 * t)).collect();
    for reverse in [false, true] {
        assert_eq!(run_named(NAMED, reverse).unwrap(), want, "reverse {reverse}");
    }
    // Without the group barrier, one of the two orders reads a neighbour's slot before it is written.
    let src = NAMED.replacen("emu::named_sync(1 + group, 128);", "", 1);
    assert!([false, true].iter().any(|&r| run_named(&src, r).unwrap() != want));
    let src = NAMED.replacen(
        "emu::named_sync(1 + group, 128);",
        "emu::named_sync(1 + group, tid % 128 < 32 ? 160 : 128);",
        1,
    );
    let e = run_named(&src, false).unwrap_err();
    assert!(e.contains("named barrier 1: threads arrive with different counts"), "{e}");
    let src = NAMED.replacen("emu::named_sync(1 + group, 128);", "emu::named_sync(1 + group, 160);", 1);
    let e = run_named(&src, false).unwrap_err();
    assert!(e.contains("waits at named barrier 1: 128 of 160 threads arrived"), "{e}");
}
