//! Fused attention on NVIDIA GPUs, with the API of [`crate::cpu`]: CUDA C++ kept in this crate as
//! source (`common.cuh`, `v1_simt.cu`, `v2_fwd.cu`, `v3_fwd.cu`, `bwd_tiles.cu`, `v5_fwd.cu`,
//! `v7_bwd.cu`; the lab's own kernels in `lab/`), specialised per variant with preprocessor macros,
//! compiled by NVRTC at first use and cached per (variant configuration, head dimension, dtype,
//! architecture, generation of kernel files): a module holds only the kernel files its [`Kernel`]
//! request can select, so the default one carries only the kernels `Auto` launches (no v4, v6, v8 or
//! v9, whose files only the `lab` feature builds in). The driver and NVRTC are loaded at run time
//! through `cudarc`, so this crate builds and its tests run on machines without CUDA; there every
//! call returns [`Error::Cuda`](crate::Error::Cuda).
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
mod kernel;
mod launch;
mod plan;
#[cfg(feature = "lab")]
mod probe;
mod ptx_cache;
mod staging;

pub use compile::nvrtc_location;
// The lab: kernel sources, PTX and the probes (benches, the emulator tests).
#[cfg(feature = "lab")]
pub use compile::{ARCHES, Generation, compile_ptx, has_tensor_core_forward, source};
pub use config::Config;
pub(crate) use device::{backward_configured, forward_configured};
pub use device::{backward_raw, forward_raw, versions};
pub use device::{device_description, is_available, synchronize};
#[cfg(feature = "lab")]
pub use kernel::Version;
pub use kernel::{Kernel, MAX_HEAD_DIM, Options};
#[cfg(feature = "lab")]
pub use plan::kernels_present;
#[cfg(feature = "lab")]
pub use probe::{
    KernelResources, TMA_PROBE_MODES, WGMMA_PROBE_MODES, jit_info_log, kernel_resources, tma_probe, wgmma_probe,
};
pub use staging::{backward, backward_with, forward, forward_with};

pub use crate::params::Dtype;
