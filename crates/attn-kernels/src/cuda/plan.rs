//! Launch planning: the kernels by name, the kernels' argument struct, the alignment checks,
//! shared-memory sizes and the choice of kernel version, for a variant resolved by [`Config`].

use cudarc::driver::DeviceRepr;

use super::compile::{Generation, has_tensor_core_forward};
use super::config::Config;
use super::kernel::{Kernel, Version};
use crate::error::{Error, Result};
use crate::params::Dtype;
use crate::params::Params;

/// A launch of a kernel its module does not hold (its generation, head dimension, dtype or
/// architecture left it out): a bug of the host code, which picks kernels by those same rules.
pub(crate) fn not_compiled(k: Kern) -> Error {
    Error::Cuda(format!("{} is not compiled in this module (generation {})", k.name(), k.generation().name()))
}

attn_core::listed_enum! {
    /// The kernels of the sources, by their `extern "C"` names: one list, so a new kernel is one
    /// line here and the compiler points at each `match` that must place it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub(crate) enum Kern {
        InvNorms => "lssa_inv_norms",
        FwdSimt => "lssa_fwd_simt",
        FwdMma => "lssa_fwd_mma",
        FwdMma3 => "lssa_fwd_mma3",
        FwdMma5 => "lssa_fwd_mma5",
        FwdStats5 => "lssa_fwd_stats5",
        FwdRw5 => "lssa_fwd_rw5",
        FwdWg8 => "lssa_fwd_wg8",
        FwdStats8 => "lssa_fwd_stats8",
        FwdRw8 => "lssa_fwd_rw8",
        FwdWs10 => "lssa_fwd_ws10",
        FwdStats10 => "lssa_fwd_stats10",
        FwdRw10 => "lssa_fwd_rw10",
        TmaProbe => "lssa_tma_probe",
        BwdRows => "lssa_bwd_rows",
        BwdKeys => "lssa_bwd_keys",
        BwdRowsMma => "lssa_bwd_rows_mma",
        BwdKeysMma => "lssa_bwd_keys_mma",
        BwdRowsMma6 => "lssa_bwd_rows_mma6",
        BwdKeysMma6 => "lssa_bwd_keys_mma6",
        BwdRowStats7 => "lssa_bwd_rowstats7",
        BwdKeysMma7 => "lssa_bwd_keys_mma7",
        BwdRowStats9 => "lssa_bwd_rowstats9",
        BwdKeysWg9 => "lssa_bwd_keys_wg9",
        WgProbe => "lssa_wg_probe",
        BwdDq7 => "lssa_bwd_dq7",
    }
}

impl Kern {
    /// Threads per block at `head_dim` (each kernel's `__launch_bounds__`).
    pub(crate) fn threads(self, head_dim: usize) -> u32 {
        match self {
            Kern::InvNorms | Kern::FwdMma3 => 256,
            // A producer warpgroup and two consumers.
            Kern::FwdWs10 | Kern::FwdStats10 | Kern::FwdRw10 => 384,
            Kern::FwdWg8 | Kern::FwdStats8 | Kern::FwdRw8 if head_dim == 128 => 256, // two warpgroups of one m64 half each
            Kern::FwdSimt | Kern::BwdRows | Kern::BwdKeys | Kern::BwdDq7 => 32 * ROWS_PER_BLOCK,
            Kern::FwdMma
            | Kern::FwdMma5
            | Kern::FwdStats5
            | Kern::FwdRw5
            | Kern::FwdWg8
            | Kern::FwdStats8
            | Kern::FwdRw8
            | Kern::BwdRowsMma
            | Kern::BwdKeysMma
            | Kern::BwdRowsMma6
            | Kern::BwdKeysMma6
            | Kern::BwdRowStats7
            | Kern::BwdKeysMma7
            | Kern::BwdRowStats9
            | Kern::BwdKeysWg9
            | Kern::WgProbe
            | Kern::TmaProbe => 128,
        }
    }

    /// Dynamic shared memory of one block, in bytes.
    pub(crate) fn smem(self, head_dim: usize) -> usize {
        match self {
            Kern::FwdMma3
            | Kern::FwdMma5
            | Kern::FwdStats5
            | Kern::FwdRw5
            | Kern::BwdRowsMma
            | Kern::BwdRowsMma6
            | Kern::BwdRowStats7
            | Kern::BwdRowStats9 => mma3_smem(head_dim),
            // And the block's 128 query rows, which v8's Q K^T reads from shared memory.
            Kern::FwdWg8 | Kern::FwdStats8 | Kern::FwdRw8 => mma3_smem(head_dim) + 128 * head_dim * 2,
            Kern::BwdKeysMma | Kern::BwdKeysMma6 => bwd_keys_smem(head_dim),
            // One more tile: dS on its way to the dq product.
            Kern::BwdKeysMma7 | Kern::BwdKeysWg9 => bwd_keys_smem(head_dim) / 6 * 7,
            // Q's 128 rows and 4 stages of K and V (64 rows each), aligned to 1 KiB for the swizzle.
            Kern::FwdWs10 | Kern::FwdStats10 | Kern::FwdRw10 => 1024 + (2 + 4 * 2) * 64 * head_dim * 2,
            // Its two tiles, aligned to 1 KiB.
            Kern::TmaProbe => 1024 + 2 * 64 * head_dim * 2,
            // Room for the probe's misread operands (offsets swapped) too.
            Kern::WgProbe => 16 * 1024,
            Kern::InvNorms | Kern::FwdSimt | Kern::FwdMma | Kern::BwdRows | Kern::BwdKeys | Kern::BwdDq7 => 0,
        }
    }

    /// Whether the kernel's one argument is a `KParams10` (with TMA tensor maps: lab v10 and its
    /// probe) rather than a `KParams`.
    pub(crate) const fn takes_tma(self) -> bool {
        matches!(self, Kern::FwdWs10 | Kern::FwdStats10 | Kern::FwdRw10 | Kern::TmaProbe)
    }

    /// The C type of the kernel's one argument.
    pub(crate) const fn argument(self) -> &'static str {
        if self.takes_tma() { "KParams10" } else { "KParams" }
    }

    /// An error unless the kernel takes the argument a launch gives it (`KParams10` when `tma`): a
    /// bug of the host code.
    pub(crate) fn check_argument(self, tma: bool) -> Result<()> {
        if self.takes_tma() == tma {
            return Ok(());
        }
        Err(Error::Cuda(format!("{} takes a {}, not what its launch gave", self.name(), self.argument())))
    }

    /// The generation whose files define this kernel.
    pub(crate) const fn generation(self) -> Generation {
        match self {
            Kern::InvNorms | Kern::FwdSimt | Kern::BwdRows | Kern::BwdKeys => Generation::Simt,
            Kern::FwdMma => Generation::V2,
            // (v3's forward is in the first generation at head dimension 128 only, where Auto runs it.)
            Kern::FwdMma3
            | Kern::FwdMma5
            | Kern::FwdStats5
            | Kern::FwdRw5
            | Kern::BwdRowStats7
            | Kern::BwdKeysMma7
            | Kern::BwdDq7 => Generation::First,
            Kern::BwdRowsMma
            | Kern::BwdKeysMma
            | Kern::BwdRowsMma6
            | Kern::BwdKeysMma6
            | Kern::FwdWg8
            | Kern::FwdStats8
            | Kern::FwdRw8
            | Kern::BwdRowStats9
            | Kern::BwdKeysWg9
            | Kern::WgProbe
            | Kern::FwdWs10
            | Kern::FwdStats10
            | Kern::FwdRw10
            | Kern::TmaProbe => Generation::Lab,
        }
    }

    /// The kernels one specialisation's source of `generation` defines (the tensor-core files are
    /// included only where [`has_tensor_core_forward`]); `wgmma`: compiled for sm_90a (or the emulator).
    pub(crate) fn present(
        head_dim: usize,
        dtype: Dtype,
        wgmma: bool,
        generation: Generation,
    ) -> impl Iterator<Item = Kern> {
        let tc = has_tensor_core_forward(head_dim, dtype);
        Self::ALL.into_iter().filter(move |k| k.generation() <= generation).filter(move |k| match k {
            Kern::FwdMma5 | Kern::FwdStats5 | Kern::FwdRw5 => tc && head_dim == 64,
            Kern::FwdWg8 | Kern::FwdStats8 | Kern::FwdRw8 => tc && wgmma,
            Kern::BwdRowStats9 | Kern::BwdKeysWg9 | Kern::WgProbe => tc && head_dim == 64 && wgmma,
            Kern::FwdWs10 | Kern::FwdStats10 | Kern::FwdRw10 | Kern::TmaProbe => tc && head_dim == 64 && wgmma,
            // Auto's modules hold v3 only at head dimension 128, where it is their forward.
            Kern::FwdMma3 => tc && (head_dim == 128 || generation >= Generation::Lab),
            Kern::FwdMma | Kern::BwdRowsMma | Kern::BwdKeysMma => tc,
            Kern::BwdRowsMma6 | Kern::BwdKeysMma6 => tc,
            Kern::BwdRowStats7 | Kern::BwdKeysMma7 | Kern::BwdDq7 => tc,
            Kern::InvNorms | Kern::FwdSimt | Kern::BwdRows | Kern::BwdKeys => true,
        })
    }
}

/// The names of the kernels a module of `generation` defines for one specialisation, as the host
/// expects them (`Kern::present`); the compile tests hold the compiled PTX to it.
#[cfg(feature = "lab")]
pub fn kernels_present(head_dim: usize, dtype: Dtype, wgmma: bool, generation: Generation) -> Vec<&'static str> {
    Kern::present(head_dim, dtype, wgmma, generation).map(Kern::name).collect()
}

/// One `(B, H, T, d)` tensor as the kernels see it (must match `Tensor4` in `common.cuh`).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct Tensor4 {
    pub(super) ptr: u64,
    pub(super) sb: i64,
    pub(super) sh: i64,
    pub(super) st: i64,
}

/// The kernels' only argument (must match `KParams` in `common.cuh`).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct KParams {
    pub(super) b: i32,
    pub(super) h: i32,
    pub(super) t: i32,
    pub(super) d: i32,
    pub(super) q: Tensor4,
    pub(super) k: Tensor4,
    pub(super) v: Tensor4,
    pub(super) o: Tensor4,
    pub(super) g: Tensor4,
    pub(super) dq: Tensor4,
    pub(super) dk: Tensor4,
    pub(super) dv: Tensor4,
    pub(super) stats: u64,
    pub(super) inv_norms: u64,
    pub(super) rowgrad: u64,
    pub(super) dq_acc: u64,
    pub(super) rowk: u64,
    pub(super) tilemax: u64,
    pub(super) scale_c: f32,
    pub(super) scale_log: i32,
    pub(super) bias_c: f32,
    pub(super) bias_log: i32,
    pub(super) h_kv: i32,
    pub(super) t_k: i32,
}

/// A TMA tensor map's bytes (must match `TmaDesc` in `lab/v10_fwd.cu`: a CUtensorMap, 128-byte
/// aligned as CUDA 13 declares it).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(128))]
pub(crate) struct TmaDesc(pub(super) [u64; 16]);

/// What one TMA tensor map of lab v10 describes, for both executors to encode alike: a tensor of
/// 16-bit values at `base` with dimensions `dims` = (d, T, H, B), the byte strides of its row, head
/// and batch dimensions, copied in boxes of 64 values x 64 rows with the 128-byte swizzle, zeros
/// outside (the GPU encodes it with `cuTensorMapEncodeTiled`, the emulator keeps it as its own map).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TmaSpec {
    pub(super) base: u64,
    pub(super) dims: [u64; 4],
    pub(super) strides: [u64; 3],
    pub(super) boxes: [u32; 4],
    /// Bytes of the swizzle pattern (`wg_desc_sw128` in `lab/v10_fwd.cu` reads tiles with 128).
    pub(super) swizzle: u32,
}

impl TmaSpec {
    /// The map of `t` (16-bit values) with dimensions `dims`.
    pub(super) fn of(t: &Tensor4, dims: [u64; 4]) -> Self {
        Self {
            base: t.ptr,
            dims,
            strides: [t.st, t.sh, t.sb].map(|s| s as u64 * 2),
            boxes: [64, 64, 1, 1],
            swizzle: 128,
        }
    }
}

/// Lab v10's argument (must match `KParams10` in `lab/v10_fwd.cu`): the kernels' usual one and the
/// TMA tensor maps of q, k and v. The other kernels keep their smaller argument.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct KParams10 {
    pub(super) kp: KParams,
    pub(super) tmap: [TmaDesc; 3],
}

// SAFETY: plain old data with the C layout the kernels declare.
unsafe impl DeviceRepr for KParams10 {}

// SAFETY: plain old data with the C layout the kernels declare.
unsafe impl DeviceRepr for KParams {}

pub(super) fn t4<P>(x: crate::params::RawTensor<*const P>) -> Tensor4 {
    Tensor4 { ptr: x.ptr as u64, sb: x.strides[0] as i64, sh: x.strides[1] as i64, st: x.strides[2] as i64 }
}
pub(super) fn t4m<P>(x: crate::params::RawTensor<*mut P>) -> Tensor4 {
    t4(x.as_const())
}

pub(super) fn kparams(cfg: &Config, p: &Params) -> Result<KParams> {
    let fits =
        |x: usize| i32::try_from(x).map_err(|_| Error::BadParams(format!("size {x} does not fit the kernels' i32")));
    Ok(KParams {
        b: fits(p.batch)?,
        h: fits(p.heads)?,
        t: fits(p.seq_len)?,
        d: fits(p.head_dim)?,
        q: t4(p.q),
        k: t4(p.k),
        v: t4(p.v),
        o: t4m(p.o),
        g: t4(p.d_out),
        dq: t4m(p.dq),
        dk: t4m(p.dk),
        dv: t4m(p.dv),
        stats: p.stats as u64,
        inv_norms: 0,
        rowgrad: 0,
        dq_acc: 0,
        rowk: 0,
        tilemax: 0,
        scale_c: cfg.scale_c,
        scale_log: cfg.scale_log as i32,
        bias_c: cfg.bias_c,
        bias_log: cfg.bias_log as i32,
        h_kv: fits(p.kv_heads)?,
        t_k: fits(p.kv_len)?,
    })
}

/// Whether the tensor-core kernel can read these tensors: 32-bit aligned pairs of 16-bit values.
pub(super) fn pairs_aligned(p: &Params) -> bool {
    [t4(p.q), t4(p.k), t4(p.v), t4m(p.o)].iter().all(|x| aligned(x, 4, 2))
}

/// Whether `x` starts on a `bytes`-byte boundary and every row, head and batch stride is a multiple
/// of `elems` elements.
pub(super) fn aligned(x: &Tensor4, bytes: u64, elems: i64) -> bool {
    x.ptr.is_multiple_of(bytes) && [x.sb, x.sh, x.st].iter().all(|s| s % elems == 0)
}

/// Whether v3 can read these tensors: 16-byte aligned rows of 16-bit values.
pub(super) fn rows_aligned16(p: &Params) -> bool {
    [t4(p.q), t4(p.k), t4(p.v)].iter().all(|x| aligned(x, 16, 8)) && pairs_aligned(p)
}

pub(super) const ROWS_PER_BLOCK: u32 = 8; // ROWS in v1_simt.cu
pub(super) const MMA_ROWS: u32 = 64; // BQ in v2_fwd.cu
pub(super) const MMA3_ROWS: u32 = 128; // BQ3 in v3_fwd.cu
pub(super) const MMA5_ROWS: u32 = 128; // BQ5 in v5_fwd.cu

/// Dynamic shared memory of v3 and of the v4 rows kernel: two stages of two tiles (K and V), each
/// 64 rows of `d + 8` 16-bit values.
fn mma3_smem(head_dim: usize) -> usize {
    2 * 2 * 64 * (head_dim + 8) * 2
}

/// Dynamic shared memory of the v4 keys kernel: the block's K and V, then two stages of Q and G tiles.
fn bwd_keys_smem(head_dim: usize) -> usize {
    6 * 64 * (head_dim + 8) * 2
}

/// The forward version `kernel` runs (1, 2, 3, 5, 8 or 10) for inputs whose rows allow `[v2, v3]`
/// (even strides; 16-byte aligned rows) on a module with (`wgmma`) or without the sm_90 kernels.
pub(super) fn forward_version(
    kernel: Kernel,
    head_dim: usize,
    dtype: Dtype,
    [v2, v3]: [bool; 2],
    wgmma: bool,
) -> Result<Version> {
    // v5 exists at head dimension 64 only; at 128, v3 is Auto's.
    let auto = if v3 && head_dim == 64 {
        Version::V5
    } else if v3 {
        Version::V3
    } else if v2 {
        Version::V2
    } else {
        Version::V1
    };
    let Some(asked) = kernel.lab_version() else {
        return Ok(auto);
    };
    let refuse = |what: &str| {
        Err(Error::BadParams(format!(
            "no tensor-core forward ({what}) for {dtype:?} at head dimension {head_dim} with these strides and \
             shapes (a KV cache or grouped heads runs v1 only)"
        )))
    };
    Ok(match asked {
        Version::V1 => Version::V1,
        Version::V2 if v2 => Version::V2,
        Version::V2 => return refuse("v2"),
        Version::V3 | Version::V4 if v3 => Version::V3,
        Version::V3 | Version::V4 => return refuse("v3"),
        Version::V8 | Version::V9 if v3 && wgmma => Version::V8,
        // v10 reads its tiles by TMA, whose strides must be multiples of 16 bytes (16-byte aligned rows).
        Version::V10 if v3 && wgmma && head_dim == 64 => Version::V10,
        Version::V5 | Version::V6 | Version::V7 | Version::V8 | Version::V9 | Version::V10 if v3 && head_dim == 64 => {
            Version::V5
        }
        // v5 exists at head dimension 64 only, v8 on sm_90 only, v10 at both.
        Version::V5 | Version::V6 | Version::V7 | Version::V8 | Version::V9 | Version::V10 if v3 => Version::V3,
        Version::V5 | Version::V6 | Version::V7 | Version::V8 | Version::V9 | Version::V10 => return refuse("v5"),
    })
}

/// The backward version `kernel` runs (1, 4, 6, 7 or 9) where the tensor-core backward applies
/// (`tc`: its dtype, head dimension and 16-byte aligned rows) or not.
pub(super) fn backward_version(
    kernel: Kernel,
    head_dim: usize,
    dtype: Dtype,
    tc: bool,
    wgmma: bool,
) -> Result<Version> {
    let Some(asked) = kernel.lab_version() else {
        return Ok(if tc { Version::V7 } else { Version::V1 });
    };
    Ok(match asked {
        Version::V1 | Version::V2 => Version::V1,
        _ if !tc => {
            return Err(Error::BadParams(format!(
                "no tensor-core backward for {dtype:?} at head dimension {head_dim} with these strides and shapes \
                 (a KV cache or grouped heads runs v1 only)"
            )));
        }
        Version::V3 | Version::V4 => Version::V4,
        Version::V5 | Version::V6 => Version::V6,
        Version::V8 | Version::V9 if head_dim == 64 && wgmma => Version::V9,
        Version::V7 | Version::V8 | Version::V9 | Version::V10 => Version::V7,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a benchmark labels a run with (`versions`) and what the launches run are the same
    /// functions; these are the rules they must keep whatever the next generation adds.
    #[cfg(feature = "lab")]
    #[test]
    fn versions_follow_the_device_and_the_strides() {
        let lab = |v| Kernel::Lab(v);
        for kernel in Kernel::ALL {
            for hd in [64, 128] {
                for dt in [Dtype::Bf16, Dtype::F16] {
                    for wgmma in [false, true] {
                        let f = forward_version(kernel, hd, dt, [true, true], wgmma).unwrap();
                        let b = backward_version(kernel, hd, dt, true, wgmma).unwrap();
                        // Forwards and backwards are the lab's, each in its own list.
                        assert!(matches!(
                            f,
                            Version::V1 | Version::V2 | Version::V3 | Version::V5 | Version::V8 | Version::V10
                        ));
                        assert!(matches!(b, Version::V1 | Version::V4 | Version::V6 | Version::V7 | Version::V9));
                        // The warpgroup kernels run only where the module has them, and only when asked.
                        assert_eq!(f == Version::V8, kernel == lab(Version::V8) && wgmma, "{kernel:?} {hd} {wgmma}");
                        assert_eq!(b == Version::V9, kernel == lab(Version::V8) && wgmma && hd == 64);
                        assert_eq!(f == Version::V10, kernel == lab(Version::V10) && wgmma && hd == 64);
                        // v5 (and its backwards v6, v7) exist at head dimension 64; v7 also at 128.
                        assert!(f != Version::V5 || hd == 64);
                        assert!(b != Version::V6 || hd == 64 || kernel == lab(Version::V5));
                        // A request of the pair's backward runs the same pair.
                        if let Some(pair) = match kernel.lab_version() {
                            Some(Version::V3) => Some(Version::V4),
                            Some(Version::V5) => Some(Version::V6),
                            Some(Version::V8) => Some(Version::V9),
                            _ => None,
                        } {
                            assert_eq!(forward_version(lab(pair), hd, dt, [true, true], wgmma).unwrap(), f);
                            assert_eq!(backward_version(lab(pair), hd, dt, true, wgmma).unwrap(), b);
                        }
                        // The default: v5 + v7 at head dimension 64, v3 + v7 at 128 (each checked on the
                        // GPU by `benches/gpu-session.sh ship1`); never the warpgroup pair.
                        if kernel == Kernel::Auto {
                            let want = if hd == 64 { (Version::V5, Version::V7) } else { (Version::V3, Version::V7) };
                            assert_eq!((f, b), want, "{hd} {wgmma}");
                        }
                    }
                    // Unaligned rows: every explicitly requested tensor-core kernel is refused, the
                    // default falls back.
                    for wgmma in [false, true] {
                        let v = kernel.lab_version();
                        let tc_only = !matches!(v, None | Some(Version::V1));
                        assert_eq!(forward_version(kernel, hd, dt, [false, false], wgmma).is_err(), tc_only);
                        let asked = !matches!(v, None | Some(Version::V1 | Version::V2));
                        assert_eq!(backward_version(kernel, hd, dt, false, wgmma).is_err(), asked);
                    }
                    assert_eq!(forward_version(Kernel::Auto, hd, dt, [true, false], false).unwrap(), Version::V2);
                }
            }
        }
        // The SIMT kernels in f32 (no tensor-core forward), whatever was asked.
        assert_eq!(forward_version(Kernel::Auto, 64, Dtype::F32, [false, false], true).unwrap(), Version::V1);
        assert_eq!(backward_version(Kernel::Auto, 64, Dtype::F32, false, true).unwrap(), Version::V1);
    }

    #[test]
    fn version_numbers_and_names_agree() {
        for (i, v) in Version::ALL.into_iter().enumerate() {
            assert_eq!(v.number() as usize, i + 1);
            assert_eq!(v.name(), format!("v{}", i + 1));
        }
    }
}
