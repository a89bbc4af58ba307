//! Probes: what the driver made of each kernel, and the wgmma and TMA layout probes.

use half::bf16;

use attn_core::Variant;

use super::compile::Generation;
use super::config::Config;
use super::device::{GpuExec, cuda_err, module};
use super::launch::Exec;
use super::plan::{KParams, KParams10, Kern, Tensor4, TmaDesc, TmaSpec};
use crate::error::{Error, Result};
use crate::params::Dtype;

/// What the driver made of one kernel (after its JIT of the PTX): for reading timings.
#[derive(Clone, Debug)]
pub struct KernelResources {
    /// The kernel's `extern "C"` name.
    pub name: &'static str,
    /// Threads per block at launch.
    pub threads: u32,
    /// Registers per thread.
    pub registers: i32,
    /// Local memory per thread in bytes (spills and stack).
    pub local_bytes: i32,
    /// Static plus dynamic shared memory per block in bytes.
    pub shared_bytes: usize,
    /// Blocks that fit on one multiprocessor at once (the occupancy calculator's answer).
    pub blocks_per_sm: u32,
}

/// [`KernelResources`] of every kernel of one specialisation on this thread's GPU (the whole lab).
pub fn kernel_resources(variant: &Variant, head_dim: usize, dtype: Dtype) -> Result<Vec<KernelResources>> {
    use cudarc::driver::sys::CUfunction_attribute_enum as A;
    let cfg = Config::new(variant, head_dim)?;
    let m = module(&cfg, head_dim, dtype, Generation::Lab)?;
    let mut out = Vec::new();
    for k in Kern::ALL {
        let Some(f) = m.functions.get(&k) else { continue };
        let dynamic = k.smem(head_dim);
        out.push(KernelResources {
            name: k.name(),
            threads: k.threads(head_dim),
            registers: f.num_regs().map_err(cuda_err)?,
            local_bytes: f.get_attribute(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES).map_err(cuda_err)?,
            shared_bytes: f.shared_size_bytes().map_err(cuda_err)? as usize + dynamic,
            blocks_per_sm: f
                .occupancy_max_active_blocks_per_multiprocessor(k.threads(head_dim), dynamic, None)
                .map_err(cuda_err)?,
        });
    }
    Ok(out)
}

/// The driver's verbose JIT info log for the lab's kernels of `variant` on this thread's GPU (see
/// `bench-cuda speed`): ptxas says there where it serialised `wgmma` or spilled.
pub fn jit_info_log(variant: &Variant, head_dim: usize, dtype: Dtype) -> Result<String> {
    let cfg = Config::new(variant, head_dim)?;
    super::device::jit_info_log(&cfg, head_dim, dtype, Generation::Lab)
}

/// The modes of the wgmma layout probe (`lssa_wg_probe` in `lab/v8_fwd.cu`), and whether each must
/// match. Modes 0-4 are one m64n64k16 product in each operand layout v8 and v9 assume (and two
/// misreadings); modes 5-9 are v8's own products on a 64 x 64 tile, each isolating one suspect for
/// v8's fault on the hardware (LAB.md): chained k steps and scale-d, accumulating onto values,
/// the tile's alignment, two commit groups with `wait_group 1`, and the compiler moving arithmetic
/// on accumulators above their wait when no operand fence stops it.
pub const WGMMA_PROBE_MODES: [(&str, bool); 10] = [
    ("A registers, B K-major (v8 Q K^T, v9 K Q^T)", true),
    ("  the same, descriptor offsets swapped", false),
    ("A registers, B MN-major (v8 P V, v9 dv, dk)", true),
    ("  the same, descriptor offsets swapped", false),
    ("A MN-major shared, B MN-major (v9 dq)", true),
    ("v8 Q K^T: K = 64 in 4 chained steps, scale-d 0 then 1", true),
    ("v8 P V: 4 chained steps, scale-d 1 onto nonzero O", true),
    ("v8 Q K^T with the tile 16 bytes past a 128-byte line", true),
    ("v8 pipeline: two halves, two groups, first read after wait_group 1", true),
    ("  the same, arithmetic on the first half without an operand fence", true),
];

/// Runs the wgmma layout probe on `x`: for each of [`WGMMA_PROBE_MODES`], the largest error of
/// its products against the exact ones, relative to the largest exact entry.
pub(super) fn wgmma_probe_on(x: &dyn Exec) -> Result<Vec<f64>> {
    if !x.wgmma() {
        return Err(Error::Cuda("no warpgroup MMA here (needs sm_90)".into()));
    }
    let mut rng = attn_core::fixtures::Rng::new(5);
    let mut rand = |n: usize| -> Vec<bf16> { (0..n).map(|_| bf16::from_f32(rng.normal() as f32)).collect() };
    // Modes 0-4: A 64 x 16 and B 16 x 64. Modes 5-9: A 128 x 64 and a tile of 64 keys x 64 dims.
    let (a, b, a2, tile) = (rand(64 * 16), rand(16 * 64), rand(128 * 64), rand(64 * 64));
    let bytes = |v: &[bf16]| v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect::<Vec<u8>>();
    let (da, db, da2, dt) =
        (x.upload(&bytes(&a))?, x.upload(&bytes(&b))?, x.upload(&bytes(&a2))?, x.upload(&bytes(&tile))?);
    let f = |v: &[bf16], i: usize| v[i].to_f64();
    let mut errs = Vec::new();
    for mode in 0..WGMMA_PROBE_MODES.len() {
        // The exact result per mode, over the rows the mode writes.
        let rows = if mode >= 8 { 128 } else { 64 };
        let exact: Vec<f64> = (0..rows * 64)
            .map(|e| {
                let (m, n) = (e / 64, e % 64);
                match mode {
                    0..=4 => (0..16).map(|k| f(&a, m * 16 + k) * f(&b, k * 64 + n)).sum(),
                    // A V: the tile's row k is key k, its column n dimension n.
                    6 => {
                        (m as f64 - n as f64) / 64.0
                            + (0..64).map(|k| f(&a2, m * 64 + k) * f(&tile, k * 64 + n)).sum::<f64>()
                    }
                    // A K^T, and mode 9's first half 0.5 S + 1.
                    _ => {
                        let s: f64 = (0..64).map(|k| f(&a2, m * 64 + k) * f(&tile, n * 64 + k)).sum();
                        if mode == 9 && m < 64 { 0.5 * s + 1.0 } else { s }
                    }
                }
            })
            .collect();
        let out = x.upload(&vec![0xffu8; 128 * 64 * 4])?; // NaN where nothing is written
        let mut kp = KParams { b: mode as i32, ..KParams::default() };
        kp.q.ptr = da.addr();
        kp.k.ptr = db.addr();
        kp.v.ptr = da2.addr();
        kp.g.ptr = dt.addr();
        kp.o.ptr = out.addr();
        x.launch(Kern::WgProbe, (1, 1), &kp)?;
        errs.push(rel_err_of(&exact, &x.download(&out)?));
    }
    Ok(errs)
}

/// A probe's largest error against `exact`, relative to `exact`'s largest entry: `got` holds the f32
/// results as bytes (NaN, where nothing was written, counts as infinite).
fn rel_err_of(exact: &[f64], got: &[u8]) -> f64 {
    let scale = exact.iter().fold(0f64, |m, v| m.max(v.abs()));
    let err = exact
        .iter()
        .zip(got.chunks_exact(4))
        .map(|(e, g)| (f32::from_le_bytes(g.try_into().unwrap()) as f64 - e).abs())
        .fold(0f64, |m, d| if d.is_nan() { f64::INFINITY } else { m.max(d) });
    err / scale
}

/// The wgmma layout probe on this thread's GPU (needs sm_90): the relative error of each of
/// [`WGMMA_PROBE_MODES`]. The modes marked `true` are the layouts lab v8 and v9 assume (about
/// 1e-7 where the assumption holds), the others their likeliest misreadings (order 1).
pub fn wgmma_probe() -> Result<Vec<f64>> {
    let cfg = Config::new(&"lssa".parse().expect("a stage-1 name"), 64)?;
    wgmma_probe_on(&GpuExec::new(&cfg, 64, Dtype::Bf16, Generation::Lab)?)
}

/// The modes of the TMA layout probe (`lssa_tma_probe` in `lab/v10_fwd.cu`), and whether each must
/// match: what lab v10 assumes of a TMA copy with the 128-byte swizzle from a (d, T, H, B) map, and
/// of `wgmma` reading such tiles through swizzled descriptors, each beside a likely misreading.
pub const TMA_PROBE_MODES: [(&str, bool); 6] = [
    ("TMA box of a 4-D map, 128-byte swizzle, rows past T zero", true),
    ("  the same bytes read as unswizzled", false),
    ("Q K^T through swizzled K-major descriptors (v10)", true),
    ("  the same, stride byte offset 512", false),
    ("P V, V MN-major through a swizzled descriptor (v10)", true),
    ("  the same, blocks of 16 keys 1024 bytes apart", false),
];

/// Runs the TMA layout probe on `x`: for each of [`TMA_PROBE_MODES`], the largest error against
/// the exact result, relative to its largest entry.
pub(super) fn tma_probe_on(x: &dyn Exec) -> Result<Vec<f64>> {
    if !x.wgmma() {
        return Err(Error::Cuda("no TMA here (needs sm_90)".into()));
    }
    let mut rng = attn_core::fixtures::Rng::new(7);
    let mut rand = |n: usize| -> Vec<bf16> { (0..n).map(|_| bf16::from_f32(rng.normal() as f32)).collect() };
    // A (d, T, H, B) = (64, 80, 2, 1) tensor, one 64 x 64 tile, and P (64 x 64, row-major).
    let (big, tile, pm) = (rand(2 * 80 * 64), rand(64 * 64), rand(64 * 64));
    let bytes = |v: &[bf16]| v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect::<Vec<u8>>();
    let (dbig, dtile, dpm) = (x.upload(&bytes(&big))?, x.upload(&bytes(&tile))?, x.upload(&bytes(&pm))?);
    let f = |v: &[bf16], i: usize| v[i].to_f64();
    // The box at row 32 of head 1: rows 32..96, zeros from row 80 (past T).
    let boxed = |r: usize, c: usize| if r + 32 < 80 { f(&big, (80 + r + 32) * 64 + c) } else { 0.0 };
    let map_big = Tensor4 { ptr: dbig.addr(), sb: 2 * 80 * 64, sh: 80 * 64, st: 64 };
    let map_tile = Tensor4 { ptr: dtile.addr(), sb: 64 * 64, sh: 64 * 64, st: 64 };
    let tmap = [
        TmaDesc::default(),
        x.tensor_map(&TmaSpec::of(&map_big, [64, 80, 2, 1]))?,
        x.tensor_map(&TmaSpec::of(&map_tile, [64, 64, 1, 1]))?,
    ];
    let mut errs = Vec::new();
    for mode in 0..TMA_PROBE_MODES.len() {
        let mut exact = vec![0f64; 64 * 64];
        for (e, x) in exact.iter_mut().enumerate() {
            let (m, n) = (e / 64, e % 64);
            *x = match mode {
                // The plain layout: element (row m, column n) at m * 64 + n.
                1 => boxed(m, n),
                2 | 3 => (0..64).map(|k| boxed(m, k) * f(&tile, n * 64 + k)).sum(),
                4 | 5 => {
                    (m as f64 - n as f64) / 64.0
                        + (0..64).map(|k| f(&pm, m * 64 + k) * f(&tile, k * 64 + n)).sum::<f64>()
                }
                _ => 0.0,
            };
        }
        if mode == 0 {
            // TMA's 128-byte swizzle: the 16-byte chunk c of row r (128 bytes) lands at chunk c ^ (r % 8).
            for r in 0..64 {
                for c in 0..64 {
                    let byte = r * 128 + c * 2;
                    exact[(byte ^ (((byte >> 7) & 7) << 4)) / 2] = boxed(r, c);
                }
            }
        }
        let out = x.upload(&vec![0xffu8; 64 * 64 * 4])?; // NaN where nothing is written
        let mut kp = KParams { b: mode as i32, ..KParams::default() };
        kp.q.ptr = dpm.addr();
        kp.o.ptr = out.addr();
        x.launch_tma(Kern::TmaProbe, (1, 1), &KParams10 { kp, tmap })?;
        errs.push(rel_err_of(&exact, &x.download(&out)?));
    }
    Ok(errs)
}

/// The TMA layout probe on this thread's GPU (needs sm_90): the relative error of each of
/// [`TMA_PROBE_MODES`]. The modes marked `true` are what lab v10 assumes (about 1e-7, or 0 for the
/// copied bytes, where the assumption holds), the others their likeliest misreadings (order 1).
pub fn tma_probe() -> Result<Vec<f64>> {
    let cfg = Config::new(&"lssa".parse().expect("a stage-1 name"), 64)?;
    tma_probe_on(&GpuExec::new(&cfg, 64, Dtype::Bf16, Generation::Lab)?)
}
