//! Fused attention on NVIDIA GPUs, with the API of [`crate::cpu`]: CUDA C++ kept in this crate as
//! source (`common.cuh`, `v1_simt.cu`, `v2_fwd.cu`), specialised per variant with preprocessor macros,
//! compiled by NVRTC at first use and cached per (variant configuration, head dimension, dtype,
//! architecture, [`Generation`]): a module holds only the kernel files its [`Kernel`] request can
//! select, so the default one carries no lab version. The driver and NVRTC are loaded at run time
//! through `cudarc`, so this crate builds and its tests run on machines without CUDA; there every
//! call returns [`Error::Cuda`].
//!
//! Kernels (the version numbers of the kernel lab, `src/cuda/LAB.md`):
//!
//! - v1 `lssa_fwd_simt`, `lssa_bwd_rows`, `lssa_bwd_keys`: f32 arithmetic on CUDA cores, any dtype
//!   and head dimension. The f32 forward and every backward.
//! - v2 `lssa_fwd_mma`: the f16 / bf16 forward at head dimension 64 or 128 on tensor cores
//!   (`mma.sync` m16n8k16, f32 accumulation), FlashAttention-2 tiling, synchronous loads.
//! - v3 `lssa_fwd_mma3`: v2's maths with cp.async double buffering, ldmatrix and 128-row blocks; the
//!   default forward where rows are 16-byte aligned.
//! - v4 `lssa_bwd_rows_mma` + `lssa_bwd_keys_mma`: the tensor-core backward (dq and `E_i` per query
//!   block; dk and dv per key block; no atomics). The default backward where v3 applies.
//!
//! - v5 `lssa_fwd_mma5` (d = 64), v6 (`lssa_bwd_{rows,keys}_mma6`) and v7 (`lssa_bwd_rowstats7`,
//!   `lssa_bwd_keys_mma7`, `lssa_bwd_dq7`): the second generation, selected by
//!   [`Kernel::TensorCoreV5`] (v5 + v6) and [`Kernel::TensorCoreV7`] (v5 + v7); checked in the
//!   emulator, not yet timed on a GPU.
//! - v8 `lssa_fwd_wg8` (d = 64 and 128) and v9 `lssa_bwd_rowstats9` + `lssa_bwd_keys_wg9` (d = 64),
//!   sm_90a (the PTX for compute capability 9.0 is arch-specific): v5 and v7 on Hopper's warpgroup tensor cores
//!   (`wgmma.mma_async`, tiles read from shared memory by descriptor); [`Kernel::TensorCoreV8`].
//!   Checked in the emulator, not yet timed.
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
mod device;
mod launch;
mod plan;
#[cfg(feature = "lab")]
mod probe;
mod staging;

pub use compile::nvrtc_location;
// The lab: kernel sources, PTX and the probes (benches, the emulator tests).
#[cfg(feature = "lab")]
pub use compile::{
    ARCHES, COMMON_SRC, MMA_BWD_SRC, MMA_BWD6_SRC, MMA_BWD7_SRC, MMA_SRC, MMA3_SRC, MMA5_SRC, SIMT_SRC, compile_ptx,
    has_tensor_core_forward, source,
};
pub use device::{backward_raw, forward_raw, versions};
pub use device::{device_description, is_available, synchronize};
pub use plan::Config;
#[cfg(feature = "lab")]
pub use probe::{KernelResources, WGMMA_PROBE_MODES, jit_info_log, kernel_resources, wgmma_probe};
pub use staging::{backward, backward_with, forward, forward_with};

#[cfg(not(feature = "lab"))]
use compile::has_tensor_core_forward;

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

/// Which forward kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Kernel {
    /// The fastest that applies: v3 (16-byte aligned rows), else v2 (even strides), else SIMT.
    #[default]
    Auto,
    /// The SIMT kernel (lab v1) in every case.
    Simt,
    /// Tensor cores, lab v2 (synchronous loads); an error where it does not apply.
    TensorCoreV2,
    /// Tensor cores, lab v3 (cp.async pipeline, ldmatrix); an error where it does not apply.
    TensorCore,
    /// The second generation of tensor-core kernels: forward lab v5 (v3 with 2 x 16 rows per warp,
    /// log2-domain activations, one special-function op per softplus score; at head dimension 64,
    /// v3 at 128) and backward lab v6 (v4 with two special-function ops per entry instead
    /// of four, no branch per entry; where v4 applies). Checked in the emulator, not yet timed on a
    /// GPU, so [`Kernel::Auto`] does not choose them yet.
    TensorCoreV5,
    /// Forward as [`Kernel::TensorCoreV5`], backward lab v7: v6 with dq accumulated in f32 by the
    /// keys kernel (atomics), so S, G V^T and the entry gradients are computed once instead of
    /// twice. Checked in the emulator, not yet timed on a GPU.
    TensorCoreV7,
    /// The Hopper generation, on warpgroup tensor cores (`wgmma.mma_async`) on sm_90: forward lab v8
    /// (v5's maths; head dimension 64 or 128), backward v9 (v7's kernels; 64); elsewhere what
    /// [`Kernel::TensorCoreV7`] runs (v5 + v7, v3 + v7 at 128). Checked in the emulator, not yet timed on a GPU.
    TensorCoreV8,
}

impl Kernel {
    /// Every kernel request, [`Kernel::Auto`] first, then by generation.
    pub const ALL: [Kernel; 7] = [
        Kernel::Auto,
        Kernel::Simt,
        Kernel::TensorCoreV2,
        Kernel::TensorCore,
        Kernel::TensorCoreV5,
        Kernel::TensorCoreV7,
        Kernel::TensorCoreV8,
    ];

    /// The request's name as [`FromStr`](std::str::FromStr) reads it (and `LSSA_CUDA_KERNEL`):
    /// `auto`, `v1`, `v2`, `v3`, `v5`, `v7`, `v8`.
    pub const fn name(self) -> &'static str {
        match self {
            Kernel::Auto => "auto",
            Kernel::Simt => "v1",
            Kernel::TensorCoreV2 => "v2",
            Kernel::TensorCore => "v3",
            Kernel::TensorCoreV5 => "v5",
            Kernel::TensorCoreV7 => "v7",
            Kernel::TensorCoreV8 => "v8",
        }
    }
}

impl std::str::FromStr for Kernel {
    type Err = Error;

    /// `auto`, `v1` (or `simt`), `v2`, `v3` (the first tensor-core generation, v3 + v4), `v5` (the
    /// second, v5 + v6), `v7` (v5 + v7), `v8` or `v9` (v8 + v9), case-insensitive.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Kernel::Auto,
            "v1" | "simt" => Kernel::Simt,
            "v2" => Kernel::TensorCoreV2,
            "v3" | "v4" => Kernel::TensorCore,
            "v5" | "v6" => Kernel::TensorCoreV5,
            "v7" => Kernel::TensorCoreV7,
            "v8" | "v9" => Kernel::TensorCoreV8,
            _ => return Err(Error::BadParams(format!("unknown CUDA kernel {s:?}: auto, v1, v2, v3, v5, v7 or v8"))),
        })
    }
}

/// The kernel files one compiled module holds: each [`Kernel`] request compiles only the generations
/// it can select, so production (`Auto`) modules carry no lab kernel (see `LAB.md`). The generations
/// are cumulative: each holds the files of those before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Generation {
    /// `common.cuh` and `v1_simt.cu`: the inverse norms and lab v1.
    Simt,
    /// And `v2_fwd.cu`: lab v2.
    V2,
    /// And `v3_fwd.cu` and `v4_bwd.cu`: lab v3 and v4, what [`Kernel::Auto`] runs.
    First,
    /// And `v5_v8_fwd.cu`, `v6_bwd.cu` and `v7_v9_bwd.cu`: lab v5 to v9 and the wgmma probe.
    Lab,
}

impl Generation {
    /// Every generation, in order.
    pub const ALL: [Generation; 4] = [Generation::Simt, Generation::V2, Generation::First, Generation::Lab];

    /// The short name in a module's cache key.
    pub const fn name(self) -> &'static str {
        match self {
            Generation::Simt => "simt",
            Generation::V2 => "v2",
            Generation::First => "first",
            Generation::Lab => "lab",
        }
    }
}

impl Kernel {
    /// The generation whose module this request runs from: the least one holding every kernel the
    /// request can select (on any device, for any strides).
    pub const fn generation(self) -> Generation {
        match self {
            Kernel::Simt => Generation::Simt,
            Kernel::TensorCoreV2 => Generation::V2,
            // Auto falls back to v2 for rows that are not 16-byte aligned.
            Kernel::Auto | Kernel::TensorCore => Generation::First,
            Kernel::TensorCoreV5 | Kernel::TensorCoreV7 | Kernel::TensorCoreV8 => Generation::Lab,
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
