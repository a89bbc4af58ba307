//! Probes: what the driver made of each kernel, and the wgmma layout probe.

use half::bf16;

use attn_core::Variant;

use super::device::{GpuExec, cuda_err, module};
use super::launch::Exec;
use super::plan::{KParams, Kern};
use super::{Config, Dtype, Generation};
use crate::{Error, Result};

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

/// The modes of the wgmma layout probe (`lssa_wg_probe` in `v5_v8_fwd.cu`), and whether each must match.
pub const WGMMA_PROBE_MODES: [(&str, bool); 5] = [
    ("A registers, B K-major (v8 Q K^T, v9 K Q^T)", true),
    ("  the same, descriptor offsets swapped", false),
    ("A registers, B MN-major (v8 P V, v9 dv, dk)", true),
    ("  the same, descriptor offsets swapped", false),
    ("A MN-major shared, B MN-major (v9 dq)", true),
];

/// Runs the wgmma layout probe on `x`: for each of [`WGMMA_PROBE_MODES`], the largest error of
/// one m64n64k16 bf16 product against the exact one, relative to the largest exact entry.
pub(super) fn wgmma_probe_on(x: &dyn Exec) -> Result<Vec<f64>> {
    if !x.wgmma() {
        return Err(Error::Cuda("no warpgroup MMA here (needs sm_90)".into()));
    }
    let mut rng = attn_core::fixtures::Rng::new(5);
    let mut rand = |n: usize| -> Vec<bf16> { (0..n).map(|_| bf16::from_f32(rng.normal() as f32)).collect() };
    let (a, b) = (rand(64 * 16), rand(16 * 64));
    let bytes = |v: &[bf16]| v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect::<Vec<u8>>();
    let (da, db) = (x.upload(&bytes(&a))?, x.upload(&bytes(&b))?);
    let mut exact = vec![0f64; 64 * 64];
    for (m, row) in exact.chunks_mut(64).enumerate() {
        for (n, e) in row.iter_mut().enumerate() {
            *e = (0..16).map(|k| a[m * 16 + k].to_f64() * b[k * 64 + n].to_f64()).sum();
        }
    }
    let scale = exact.iter().fold(0f64, |m, v| m.max(v.abs()));
    let mut errs = Vec::new();
    for mode in 0..WGMMA_PROBE_MODES.len() {
        let out = x.upload(&vec![0xffu8; 64 * 64 * 4])?; // NaN where nothing is written
        let mut kp = KParams { b: mode as i32, ..KParams::default() };
        kp.q.ptr = da.addr();
        kp.k.ptr = db.addr();
        kp.o.ptr = out.addr();
        x.launch(Kern::WgProbe, (1, 1), &kp)?;
        let got = x.download(&out)?;
        let err = exact
            .iter()
            .zip(got.chunks_exact(4))
            .map(|(e, g)| (f32::from_le_bytes(g.try_into().unwrap()) as f64 - e).abs())
            .fold(0f64, |m, d| if d.is_nan() { f64::INFINITY } else { m.max(d) });
        errs.push(err / scale);
    }
    Ok(errs)
}

/// The wgmma layout probe on this thread's GPU (needs sm_90): the relative error of each of
/// [`WGMMA_PROBE_MODES`]. The modes marked `true` are the layouts lab v8 and v9 assume (about
/// 1e-7 where the assumption holds), the others their likeliest misreadings (order 1).
pub fn wgmma_probe() -> Result<Vec<f64>> {
    let cfg = Config::new(&"lssa".parse().expect("a stage-1 name"), 64)?;
    wgmma_probe_on(&GpuExec::new(&cfg, 64, Dtype::Bf16, Generation::Lab)?)
}
