//! Launches: the memory and launches the host code is written against ([`Exec`]), the kernels'
//! arguments prepared, and the forward and backward on an [`Exec`] (the GPU entry points that run
//! them are in `device.rs`).

use super::compile::has_tensor_core_forward;
use super::config::Config;
use super::kernel::{Kernel, MAX_HEAD_DIM, Version};
use super::plan::{
    KParams, KParams10, Kern, MMA_ROWS, MMA3_ROWS, MMA5_ROWS, ROWS_PER_BLOCK, Tensor4, TmaDesc, TmaSpec, aligned,
    backward_version, forward_version, kparams, pairs_aligned, rows_aligned16, t4, t4m,
};
use crate::error::{Error, Result};
use crate::params::Dtype;
use crate::params::Params;

/// Bytes of one row's backward constants (`RowK6` in `v7_bwd.cu`, which asserts the size).
const ROWK_BYTES: usize = 64;

pub(super) fn check_params(p: &Params) -> Result<()> {
    if p.batch == 0 || p.heads == 0 || p.seq_len == 0 || p.head_dim == 0 {
        return Err(Error::BadParams(format!(
            "empty tensor: B={} H={} T={} d={}",
            p.batch, p.heads, p.seq_len, p.head_dim
        )));
    }
    p.check_kv()?;
    if p.head_dim > MAX_HEAD_DIM {
        return Err(Error::BadParams(format!("head dimension {} > {} has no CUDA kernel", p.head_dim, MAX_HEAD_DIM)));
    }
    Ok(())
}

/// A buffer in the memory the kernels run on: device memory, or host memory aligned to 16 bytes for
/// the emulator (`emu`, with the `lab` feature).
pub(crate) enum Buf {
    Device {
        mem: cudarc::driver::CudaSlice<u8>,
        addr: u64,
    },
    #[cfg_attr(not(feature = "lab"), allow(dead_code))] // built by the emulator only
    Host(Vec<u128>),
}

impl Buf {
    /// The address the kernels see.
    pub(crate) fn addr(&self) -> u64 {
        match self {
            Buf::Device { addr, .. } => *addr,
            Buf::Host(v) => v.as_ptr() as u64,
        }
    }
}

/// Where the kernels of one specialisation run: a GPU (`GpuExec`, in `device.rs`) or the CPU emulator
/// ([`emu`](super::emu)). The host logic (kernel choice, grids, scratch, checks) is written once against this,
/// so the emulator tests it too.
pub(crate) trait Exec {
    /// Queues kernel `k` on a `grid` of blocks of [`Kern::threads`], with `k`'s dynamic shared memory.
    fn launch(&self, k: Kern, grid: (u32, u32), kp: &KParams) -> Result<()>;
    /// [`Exec::launch`] of lab v10, whose argument carries TMA tensor maps too.
    fn launch_tma(&self, k: Kern, grid: (u32, u32), args: &KParams10) -> Result<()>;
    /// `bytes` zeroed bytes.
    fn zeros(&self, bytes: usize) -> Result<Buf>;
    /// `bytes` bytes that the kernels write before they read them: not zeroed on a GPU (one memset
    /// fewer per call); the emulator fills them with NaN bytes, so a read before the write shows.
    fn scratch(&self, bytes: usize) -> Result<Buf>;
    /// A copy of `bytes`.
    fn upload(&self, bytes: &[u8]) -> Result<Buf>;
    /// The contents of `b` (after the work queued before).
    fn download(&self, b: &Buf) -> Result<Vec<u8>>;
    /// Whether the warpgroup kernels (lab v8) are there.
    fn wgmma(&self) -> bool;
    /// The TMA tensor map lab v10 reads through, as `spec` describes it.
    fn tensor_map(&self, spec: &TmaSpec) -> Result<TmaDesc>;
}

/// Kernel arguments ready for launches: the inverse norms of cosine variants computed (their buffer
/// must outlive the launches), and the grid's `B·H`.
struct Call {
    kp: KParams,
    _norms: Option<Buf>,
    bh: u32,
}

fn prepare(x: &dyn Exec, cfg: &Config, p: &Params) -> Result<Call> {
    let mut kp = kparams(cfg, p)?;
    let bh = u32::try_from(p.batch * p.heads).map_err(|_| Error::BadParams("B*H too large".into()))?;
    if !cfg.cosine {
        return Ok(Call { kp, _norms: None, bh });
    }
    let rows = p.batch * (p.heads * p.seq_len + p.kv_heads * p.kv_len);
    let norms = x.scratch(rows * 4)?; // every row's norm is written first
    kp.inv_norms = norms.addr();
    let blocks = (rows as u64).div_ceil(Kern::InvNorms.threads(p.head_dim) as u64 / 32); // a warp per row
    let blocks = u32::try_from(blocks).map_err(|_| Error::BadParams("too many rows".into()))?;
    x.launch(Kern::InvNorms, (blocks, 1), &kp)?;
    Ok(Call { kp, _norms: Some(norms), bh })
}

/// The forward on `x`: picks the kernel and launches it.
///
/// # Safety
/// As [`forward_raw`](super::forward_raw), with addresses of `x`'s memory.
pub(super) unsafe fn forward_exec(x: &dyn Exec, cfg: &Config, p: &Params, dtype: Dtype, kernel: Kernel) -> Result<()> {
    check_params(p)?;
    // A KV cache or grouped heads: the SIMT kernels only.
    let tc = has_tensor_core_forward(p.head_dim, dtype) && p.is_plain();
    let version =
        forward_version(kernel, p.head_dim, dtype, [tc && pairs_aligned(p), tc && rows_aligned16(p)], x.wgmma())?;
    let Call { mut kp, _norms, bh } = prepare(x, cfg, p)?;
    let t = p.seq_len as u32;
    match version {
        // Re-weighting in the lab: the first sweep as a statistics kernel of its own, then the second.
        Version::V10 if cfg.p > 0 => {
            let tilemax = x.scratch(p.batch * p.heads * tilemax_len(p.seq_len) * 4)?;
            kp.tilemax = tilemax.addr();
            let args = with_tensor_maps(x, kp, p)?;
            x.launch_tma(Kern::FwdStats10, (t.div_ceil(MMA5_ROWS), bh), &args)?;
            x.launch_tma(Kern::FwdRw10, (t.div_ceil(MMA5_ROWS), bh), &args)
        }
        Version::V10 => x.launch_tma(Kern::FwdWs10, (t.div_ceil(MMA5_ROWS), bh), &with_tensor_maps(x, kp, p)?),
        Version::V8 | Version::V5 if cfg.p > 0 => {
            let (stats, rw) =
                if version == Version::V8 { (Kern::FwdStats8, Kern::FwdRw8) } else { (Kern::FwdStats5, Kern::FwdRw5) };
            let tilemax = x.scratch(p.batch * p.heads * tilemax_len(p.seq_len) * 4)?;
            kp.tilemax = tilemax.addr();
            x.launch(stats, (t.div_ceil(MMA5_ROWS), bh), &kp)?;
            x.launch(rw, (t.div_ceil(MMA5_ROWS), bh), &kp)
        }
        Version::V8 => x.launch(Kern::FwdWg8, (t.div_ceil(MMA5_ROWS), bh), &kp),
        Version::V5 => x.launch(Kern::FwdMma5, (t.div_ceil(MMA5_ROWS), bh), &kp),
        Version::V3 => x.launch(Kern::FwdMma3, (t.div_ceil(MMA3_ROWS), bh), &kp),
        Version::V2 => x.launch(Kern::FwdMma, (t.div_ceil(MMA_ROWS), bh), &kp),
        Version::V1 => x.launch(Kern::FwdSimt, (t.div_ceil(ROWS_PER_BLOCK), bh), &kp),
        Version::V4 | Version::V6 | Version::V7 | Version::V9 => Err(not_a(version, "forward")),
    }
}

/// Lab v10's argument: `kp` and the tensor maps of q, k and v, (d, T, H, B) of plain shapes
/// (`p.is_plain()`: the key and value heads and lengths are the queries').
fn with_tensor_maps(x: &dyn Exec, kp: KParams, p: &Params) -> Result<KParams10> {
    let dims = [p.head_dim, p.seq_len, p.heads, p.batch].map(|n| n as u64);
    let map = |t: &Tensor4| x.tensor_map(&TmaSpec::of(t, dims));
    Ok(KParams10 { kp, tmap: [map(&kp.q)?, map(&kp.k)?, map(&kp.v)?] })
}

/// The most key tiles whose maxima a v5/v8 block keeps (`MAX_TILES5` in `v5_fwd.cu`).
const MAX_TILES5: usize = 2048;

/// Tile maxima the v5/v8 statistics kernel leaves per head at length `t`: query blocks of 128 rows,
/// block `q` with `min(C, 2 q + 2)` causal tiles of 64 keys, `C = min(tiles, MAX_TILES5)`
/// (`tilemax_before5` in `v5_fwd.cu` counts the same way).
fn tilemax_len(t: usize) -> usize {
    let (blocks, c) = (t.div_ceil(MMA5_ROWS as usize), t.div_ceil(64).min(MAX_TILES5));
    let m = blocks.min(c / 2);
    m * (m + 1) + (blocks - m) * c
}

/// The backward on `x`.
///
/// # Safety
/// As [`backward_raw`](super::backward_raw), with addresses of `x`'s memory.
pub(super) unsafe fn backward_exec(x: &dyn Exec, cfg: &Config, p: &Params, dtype: Dtype, kernel: Kernel) -> Result<()> {
    check_params(p)?;
    let all16 =
        rows_aligned16(p) && [t4(p.d_out), t4m(p.dq), t4m(p.dk), t4m(p.dv), t4m(p.o)].iter().all(|x| aligned(x, 16, 8));
    let tc = has_tensor_core_forward(p.head_dim, dtype) && all16 && p.is_plain();
    let version = backward_version(kernel, p.head_dim, dtype, tc, x.wgmma())?;
    let Call { mut kp, _norms, bh } = prepare(x, cfg, p)?;
    let t = p.seq_len as u32;
    // What the rows kernel hands the keys kernel: each row's whole 64-byte record (the lab's v6, v7,
    // v9), or D'_i and C_i (v1, v4), from which the keys kernel rebuilds the rest.
    let rows = p.batch * p.heads * p.seq_len;
    let _handover = match version {
        Version::V6 | Version::V7 | Version::V9 => {
            let buf = x.scratch(rows * ROWK_BYTES)?;
            kp.rowk = buf.addr();
            buf
        }
        Version::V4 | Version::V1 => {
            let buf = x.scratch(rows * 2 * 4)?;
            kp.rowgrad = buf.addr();
            buf
        }
        Version::V2 | Version::V3 | Version::V5 | Version::V8 | Version::V10 => return Err(not_a(version, "backward")),
    };
    match version {
        Version::V7 | Version::V9 => {
            let dq_acc = x.zeros(p.batch * p.heads * p.seq_len * p.head_dim * 4)?;
            kp.dq_acc = dq_acc.addr();
            let (rows, keys) = if version == Version::V9 {
                (Kern::BwdRowStats9, Kern::BwdKeysWg9)
            } else {
                (Kern::BwdRowStats7, Kern::BwdKeysMma7)
            };
            x.launch(rows, (t.div_ceil(64), bh), &kp)?;
            x.launch(keys, (t.div_ceil(64), bh), &kp)?;
            x.launch(Kern::BwdDq7, (t.div_ceil(ROWS_PER_BLOCK), bh), &kp)
        }
        Version::V6 => {
            x.launch(Kern::BwdRowsMma6, (t.div_ceil(64), bh), &kp)?;
            x.launch(Kern::BwdKeysMma6, (t.div_ceil(64), bh), &kp)
        }
        Version::V4 => {
            x.launch(Kern::BwdRowsMma, (t.div_ceil(64), bh), &kp)?;
            x.launch(Kern::BwdKeysMma, (t.div_ceil(64), bh), &kp)
        }
        Version::V1 => {
            x.launch(Kern::BwdRows, (t.div_ceil(ROWS_PER_BLOCK), bh), &kp)?;
            // One block per key head's rows: it sums dk, dv over the key head's group of query heads.
            let kv = u32::try_from(p.batch * p.kv_heads).map_err(|_| Error::BadParams("B*H_kv too large".into()))?;
            x.launch(Kern::BwdKeys, ((p.kv_len as u32).div_ceil(ROWS_PER_BLOCK), kv), &kp)
        }
        Version::V2 | Version::V3 | Version::V5 | Version::V8 | Version::V10 => Err(not_a(version, "backward")),
    }
}

/// A version resolved for the wrong direction: a bug of `forward_version` or `backward_version`.
fn not_a(version: Version, what: &str) -> Error {
    Error::Cuda(format!("lab {} is not a {what} kernel", version.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilemax_len_counts_every_blocks_kept_tiles() {
        for t in [1usize, 63, 64, 65, 127, 128, 129, 1000, 4096, 65_536, 131_072, 200_000, 300_001] {
            let tiles = t.div_ceil(64);
            // Block q's causal key tiles, as the kernel counts them, capped as it keeps them.
            let want: usize =
                (0..t.div_ceil(128)).map(|q| tiles.min((q * 128 + 128).div_ceil(64)).min(MAX_TILES5)).sum();
            assert_eq!(tilemax_len(t), want, "T = {t}");
        }
    }
}
