//! Fused attention on NVIDIA GPUs, with the API of [`crate::cpu`]: CUDA C++ kept in this crate as
//! source (`common.cuh`, `v1_simt.cu`, `v2_fwd.cu`), specialised per variant with preprocessor macros,
//! compiled by NVRTC at first use and cached per (variant configuration, head dimension, dtype,
//! architecture, generation of kernel files): a module holds only the kernel files its [`Kernel`]
//! request can select, so the default one carries only the kernels `Auto` launches (no v4, v6, v8 or
//! v9, which only the `lab` feature can ask for). The driver and NVRTC are loaded at run time
//! through `cudarc`, so this crate builds and its tests run on machines without CUDA; there every
//! call returns [`Error::Cuda`].
//!
//! Kernels (the version numbers of the kernel lab, `src/cuda/LAB.md`):
//!
//! - v1 `lssa_fwd_simt`, `lssa_bwd_rows`, `lssa_bwd_keys`: f32 arithmetic on CUDA cores, any dtype
//!   and head dimension. The f32 forward and every backward, and the only kernels that take a KV
//!   cache or grouped-query attention ([`crate::Params::kv_len`], [`crate::Params::kv_heads`]): the
//!   host runs them there whatever the dtype.
//! - v2 `lssa_fwd_mma`: the f16 / bf16 forward at head dimension 64 or 128 on tensor cores
//!   (`mma.sync` m16n8k16, f32 accumulation), FlashAttention-2 tiling, synchronous loads.
//! - v3 `lssa_fwd_mma3`: v2's maths with cp.async double buffering, ldmatrix and 128-row blocks; the
//!   default forward at head dimension 128 where rows are 16-byte aligned.
//! - v4 `lssa_bwd_rows_mma` + `lssa_bwd_keys_mma`: the tensor-core backward (dq and `E_i` per query
//!   block; dk and dv per key block; no atomics), Auto's until v7 replaced it (the lab request `v4`).
//! - v5 `lssa_fwd_mma5` (d = 64) and v7 (`lssa_bwd_rowstats7`, `lssa_bwd_keys_mma7`,
//!   `lssa_bwd_dq7`): the second generation, the default forward at head dimension 64 and the
//!   default backward at 64 and 128, where rows are 16-byte aligned.
//!
//! With the `lab` feature, `Kernel::Lab` picks any of them, and also:
//!
//! - v6 (`lssa_bwd_{rows,keys}_mma6`): v7 without its dq accumulation, the lab request `v5` (v5 + v6).
//! - v8 `lssa_fwd_wg8` (d = 64 and 128) and v9 `lssa_bwd_rowstats9` + `lssa_bwd_keys_wg9` (d = 64),
//!   sm_90a (the PTX for compute capability 9.0 is arch-specific): v5 and v7 on Hopper's warpgroup tensor cores
//!   (`wgmma.mma_async`, tiles read from shared memory by descriptor); the lab request `v8`.
//!   Passes the emulator; on an H200 it failed at d = 64 and passed at 128 (`docs/bench/cuda.md`),
//!   because ptxas reused the registers of Q's fragments inside the loop; it now reads Q from shared
//!   memory, not yet re-run on a GPU.
//!
//! Other head dimensions and f32 run v1.
//!
//! `emu` (with the `lab` feature) runs the same kernels, and the same host code (the `Exec` trait), in a CPU emulator:
//! how the test suite checks them on machines without a GPU.
//!
//! Numerics: scores, activations, row sums and outputs are accumulated in f32 whatever the input
//! dtype; the tensor-core kernel rounds the weights to the input dtype before `P V`, as
//! FlashAttention does. The row statistics have [`crate::cpu::STATS_PER_ROW`] entries laid out as
//! the CPU kernels lay them out, so a forward's statistics feed the backward of either.
//!
//! Devices, streams and contexts: the raw entry points run on the GPU that holds `q` (asked of the
//! driver from the pointer, so each data-parallel rank uses its own GPU; the ndarray entry points use
//! device 0), in that device's primary context (the one libtorch's runtime API uses) on its legacy
//! default stream, which is libtorch's current stream unless a
//! caller installed another: work on tensors libtorch produced is therefore ordered after it, and
//! libtorch's later work after ours, with no synchronisation. A caller that runs libtorch on a
//! side stream must synchronise that stream before calling in.

#[cfg(feature = "lab")]
pub mod emu;

mod compile;
mod config;
mod device;
mod launch;
mod plan;
#[cfg(feature = "lab")]
mod probe;
mod ptx_cache;
mod staging;

pub use compile::nvrtc_location;
// The lab: kernel sources, PTX and the probes (benches, the emulator tests).
#[cfg(feature = "lab")]
pub use compile::{
    ARCHES, COMMON_SRC, Generation, MMA_BWD_SRC, MMA_BWD6_SRC, MMA_BWD7_SRC, MMA_SRC, MMA3_SRC, MMA5_SRC, SIMT_SRC,
    compile_ptx, has_tensor_core_forward, source,
};
pub use config::Config;
pub(crate) use device::{backward_configured, forward_configured};
pub use device::{backward_raw, forward_raw, versions};
pub use device::{device_description, is_available, synchronize};
#[cfg(not(feature = "lab"))]
use plan::Version;
#[cfg(feature = "lab")]
pub use plan::{Version, kernels_present};
#[cfg(feature = "lab")]
pub use probe::{KernelResources, WGMMA_PROBE_MODES, jit_info_log, kernel_resources, wgmma_probe};
pub use staging::{backward, backward_with, forward, forward_with};

#[cfg(not(feature = "lab"))]
use compile::{Generation, has_tensor_core_forward};

// The crate-internal host side, for the emulator (`emu`, with the `lab` feature).
#[cfg(feature = "lab")]
pub(crate) use launch::{Buf, Exec};
#[cfg(feature = "lab")]
use launch::{backward_exec, check_params, forward_exec};
#[cfg(feature = "lab")]
pub(crate) use plan::{KParams, Kern};
#[cfg(feature = "lab")]
use probe::wgmma_probe_on;
#[cfg(feature = "lab")]
use staging::checked;
#[cfg(feature = "lab")]
pub(crate) use staging::{backward_on, forward_on};

use crate::{Error, Result};

pub use crate::Dtype;

/// The largest head dimension the CUDA kernels take.
pub const MAX_HEAD_DIM: usize = 256;

/// Which kernels run: [`Kernel::Auto`], the measured default, or (with the `lab` feature) one
/// version of the kernel lab by its number, for benchmarks and the emulator tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Kernel {
    /// The fastest measured kernels that apply: forward v5 at head dimension 64 and v3 at 128
    /// (16-byte aligned rows), else v2 (even strides), else v1; backward v7 where v3 or v5 is the
    /// forward, else v1.
    #[default]
    Auto,
    /// The forward and backward pair of the lab that holds this version (`LAB.md`), refused where a
    /// tensor-core version does not apply to the dtype, head dimension or strides:
    ///
    /// | request | forward | backward |
    /// |---|---|---|
    /// | v1 | v1 | v1 |
    /// | v2 | v2 | v1 |
    /// | v3, v4 | v3 | v4 |
    /// | v5, v6 | v5 (v3 at d = 128) | v6 |
    /// | v7 | v5 (v3 at d = 128) | v7 |
    /// | v8, v9 | v8 on sm_90, else as v7 | v9 at d = 64 on sm_90, else v7 |
    ///
    /// Versions 5 to 9 pass the emulator; on the GPU (`docs/bench/cuda.md`) v5 to v7 pass every check
    /// case and v8 failed at d = 64 (its fix is not yet re-run there).
    #[cfg(feature = "lab")]
    Lab(Version),
}

#[cfg(feature = "lab")]
impl Kernel {
    /// Every distinct request: [`Kernel::Auto`], then one per pair of the lab, in order.
    pub const ALL: [Kernel; 7] = [
        Kernel::Auto,
        Kernel::Lab(Version::V1),
        Kernel::Lab(Version::V2),
        Kernel::Lab(Version::V3),
        Kernel::Lab(Version::V5),
        Kernel::Lab(Version::V7),
        Kernel::Lab(Version::V8),
    ];
}

impl Kernel {
    /// The request's name as [`FromStr`](std::str::FromStr) reads it (and [`Kernel::ENV`]):
    /// `auto`, or the lab version `v1` to `v9`.
    pub const fn name(self) -> &'static str {
        match self {
            Kernel::Auto => "auto",
            #[cfg(feature = "lab")]
            Kernel::Lab(v) => v.name(),
        }
    }

    /// The generation whose module this request runs from: the least one holding every kernel the
    /// request can select (on any device, for any strides).
    pub const fn generation(self) -> Generation {
        match self.lab_version() {
            // Auto falls back to v2 and v1 for rows that are not 16-byte aligned.
            None | Some(Version::V7) => Generation::First,
            Some(Version::V1) => Generation::Simt,
            Some(Version::V2) => Generation::V2,
            Some(Version::V3 | Version::V4 | Version::V5 | Version::V6 | Version::V8 | Version::V9) => Generation::Lab,
        }
    }

    /// The environment variable that names the kernel request of a process: `auto`, or `v1` to `v9`
    /// (as [`FromStr`](std::str::FromStr) reads them) in a build with the `lab` feature.
    pub const ENV: &'static str = "LSSA_CUDA_KERNEL";

    /// The request [`Kernel::ENV`] names, or [`Kernel::Auto`] where it is unset: the one place the
    /// variable is read (the libtorch bridge and the Python extension ask here, once each). A
    /// version in a build without the `lab` feature, or a name that is no request, is an error that
    /// says so.
    pub fn from_env() -> Result<Self> {
        Self::from_var(std::env::var(Self::ENV))
    }

    /// [`Kernel::from_env`] on the variable's value.
    fn from_var(var: std::result::Result<String, std::env::VarError>) -> Result<Self> {
        let named = |what: String| Error::BadParams(format!("{}: {what}", Self::ENV));
        match var {
            Ok(s) => s.parse().map_err(|e| match e {
                Error::BadParams(what) => named(what),
                e => e,
            }),
            Err(std::env::VarError::NotPresent) => Ok(Kernel::Auto),
            Err(e) => Err(named(e.to_string())),
        }
    }

    /// The lab version asked for; `None` for [`Kernel::Auto`].
    pub(crate) const fn lab_version(self) -> Option<Version> {
        match self {
            Kernel::Auto => None,
            #[cfg(feature = "lab")]
            Kernel::Lab(v) => Some(v),
        }
    }
}

impl std::str::FromStr for Kernel {
    type Err = Error;

    /// `auto`, or `v1` (also `simt`) to `v9`, case-insensitive; a version needs the `lab` feature.
    fn from_str(s: &str) -> Result<Self> {
        let name = s.trim().to_ascii_lowercase();
        if name == "auto" {
            return Ok(Kernel::Auto);
        }
        let version = match name.as_str() {
            "simt" => Some(Version::V1),
            _ => Version::ALL.into_iter().find(|v| v.name() == name),
        };
        match version {
            #[cfg(feature = "lab")]
            Some(v) => Ok(Kernel::Lab(v)),
            #[cfg(not(feature = "lab"))]
            Some(v) => Err(Error::BadParams(format!(
                "CUDA kernel {}: the lab's versions need attn-kernels' `lab` feature; this build runs `auto`",
                v.name()
            ))),
            None => Err(Error::BadParams(format!("unknown CUDA kernel {s:?}: auto or v1 to v9"))),
        }
    }
}

/// Options of the ndarray entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// The dtype the f32 inputs are converted to on upload (results come back as f32).
    pub dtype: Dtype,
    /// The forward kernel.
    pub kernel: Kernel,
}

impl Default for Options {
    fn default() -> Self {
        Self { dtype: Dtype::F32, kernel: Kernel::Auto }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Production builds know the lab's names but refuse them, saying which feature runs them.
    #[test]
    fn lab_requests_need_the_lab_feature() {
        assert_eq!(" AUTO ".parse::<Kernel>().unwrap(), Kernel::Auto);
        assert_eq!(Kernel::default().name(), "auto");
        let v5 = "v5".parse::<Kernel>();
        #[cfg(feature = "lab")]
        assert_eq!(v5.unwrap(), Kernel::Lab(Version::V5));
        #[cfg(not(feature = "lab"))]
        {
            let err = v5.unwrap_err().to_string();
            assert!(err.contains("v5") && err.contains("`lab` feature"), "{err}");
        }
        let err = "v0".parse::<Kernel>().unwrap_err().to_string();
        assert!(err.contains("unknown CUDA kernel \"v0\""), "{err}");
    }

    /// `LSSA_CUDA_KERNEL` is read in one place, which names the variable in its errors.
    #[test]
    fn the_kernel_request_comes_from_one_variable() {
        let err = Kernel::from_var(Ok("v0".into())).unwrap_err().to_string();
        assert!(err.starts_with("invalid kernel parameters: LSSA_CUDA_KERNEL: unknown CUDA kernel"), "{err}");
        assert_eq!(Kernel::from_var(Ok(" auto ".into())).unwrap(), Kernel::Auto);
        assert_eq!(Kernel::from_var(Err(std::env::VarError::NotPresent)).unwrap(), Kernel::Auto);
        #[cfg(not(feature = "lab"))]
        {
            let err = Kernel::from_var(Ok("v7".into())).unwrap_err().to_string();
            assert!(err.contains("LSSA_CUDA_KERNEL: CUDA kernel v7") && err.contains("`lab` feature"), "{err}");
        }
        #[cfg(feature = "lab")]
        assert_eq!(Kernel::from_var(Ok("v7".into())).unwrap(), Kernel::Lab(Version::V7));
    }
}
