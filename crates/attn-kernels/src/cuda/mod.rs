//! Fused attention on NVIDIA GPUs, with the API of [`crate::cpu`]: CUDA C++ kept in this crate as
//! source (`common.cuh`, `simt.cu`, `mma.cu`), specialised per variant with preprocessor macros,
//! compiled by NVRTC at first use and cached per (variant configuration, head dimension, dtype,
//! architecture). The driver and NVRTC are loaded at run time through `cudarc`, so this crate builds
//! and its tests run on machines without CUDA; there every call returns [`Error::Cuda`].
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
//! [`emu`] runs the same kernels, and the same host code (the `Exec` trait), in a CPU emulator:
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

pub mod emu;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, Ptx};
use half::{bf16, f16};
use ndarray::{Array4, ArrayView4, AsArray, Ix4};

use attn_core::{Bias, Builtin, Norm, OutputNorm, Phi, Scale, Transform, Variant};

use crate::cpu::{Params, STATS_PER_ROW};
use crate::{Error, Grads, Result};

/// The CUDA sources, in the order they are concatenated.
pub const COMMON_SRC: &str = include_str!("common.cuh");
/// SIMT kernels (lab v1).
pub const SIMT_SRC: &str = include_str!("simt.cu");
/// Tensor-core forward (lab v2).
pub const MMA_SRC: &str = include_str!("mma.cu");
/// Tensor-core forward with cp.async and ldmatrix (lab v3).
pub const MMA3_SRC: &str = include_str!("mma3.cu");
/// Tensor-core forward, 2 x 16 rows per warp, log2-domain activations (lab v5).
pub const MMA5_SRC: &str = include_str!("mma5.cu");
/// Tensor-core backward (lab v4).
pub const MMA_BWD_SRC: &str = include_str!("mma_bwd.cu");
/// Tensor-core backward with log2-domain, branch-free entry maths (lab v6).
pub const MMA_BWD6_SRC: &str = include_str!("mma_bwd6.cu");
/// v6 with dq accumulated by the keys kernel (lab v7).
pub const MMA_BWD7_SRC: &str = include_str!("mma_bwd7.cu");

/// Element type of `q`, `k`, `v`, `o` and the gradients on the device. Arithmetic is f32 in every case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl Dtype {
    fn code(self) -> u32 {
        match self {
            Dtype::F32 => 0,
            Dtype::F16 => 1,
            Dtype::Bf16 => 2,
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        if self == Dtype::F32 { 4 } else { 2 }
    }
}

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

/// A variant resolved into the macros and constants of the kernels.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    act: u32,
    norm: u32,
    running_max: bool,
    signed: bool,
    cosine: bool,
    p: u32,
    scale_c: f32,
    scale_log: bool,
    bias_c: f32,
    bias_log: bool,
}

fn not_fused(variant: &Variant, reason: &'static str) -> Error {
    Error::NotFused { variant: variant.to_string(), reason }
}

impl Config {
    /// Resolves `variant` for head dimension `head_dim`, or says why it has no CUDA kernel.
    pub fn new(variant: &Variant, head_dim: usize) -> Result<Self> {
        let plan = variant.plan()?;
        match plan.transform {
            Transform::None => {}
            Transform::Inverse | Transform::Recentered | Transform::RecenteredL1 => {
                return Err(not_fused(variant, "the Table-1 transforms (inverse, recentered) need the whole row"));
            }
        }
        match plan.output_norm {
            OutputNorm::None => {}
            OutputNorm::LayerNorm => {
                return Err(not_fused(variant, "the output layer norm (relu-ln) has no CUDA kernel"));
            }
        }
        // The codes of `ACT` and `NORM` in common.cuh.
        let norm = match plan.norm {
            Norm::L1 => 0,
            Norm::None => 1,
            Norm::DivN => 2,
            Norm::DivLen => {
                return Err(not_fused(variant, "the sequence-length divisor (relu-seqlen) has no CUDA kernel"));
            }
        };
        let act = match plan.phi {
            Phi::Builtin(Builtin::Exp) => 0,
            Phi::Builtin(Builtin::Softplus) => 1,
            Phi::Builtin(Builtin::Relu) => 2,
            Phi::Builtin(Builtin::Relu2) => 3,
            Phi::Builtin(Builtin::Relu6) => 4,
            Phi::Builtin(Builtin::Gelu) => 5,
            Phi::Builtin(Builtin::Sigmoid) => 6,
            Phi::Builtin(Builtin::Mish) => 7,
            Phi::Builtin(Builtin::Identity) => 8,
            Phi::Custom(_) => return Err(not_fused(variant, "user-defined activations have no CUDA kernel")),
        };
        let d = head_dim as f64;
        let (scale_c, scale_log) = match plan.scale {
            Scale::InvSqrtD => (1.0 / d.sqrt(), false),
            Scale::LssaLog { d_factor } => (d_factor.unwrap_or_else(|| d.ln()), true),
            Scale::LogNOverSqrtD => (1.0 / d.sqrt(), true),
        };
        let (bias_c, bias_log) = match plan.bias {
            Bias::None => (0.0, false),
            Bias::LogTrainLen { .. } => (plan.bias.value(1)?, false),
            Bias::LogRowLen => (0.0, true),
        };
        Ok(Self {
            act,
            norm,
            running_max: plan.running_max,
            signed: plan.signed,
            cosine: plan.cosine(),
            p: plan.reweight.unwrap_or(0),
            scale_c: scale_c as f32,
            scale_log,
            bias_c: bias_c as f32,
            bias_log,
        })
    }

    /// The compile-time part: what a compiled module is specialised on.
    fn key(&self, head_dim: usize, dtype: Dtype) -> String {
        format!(
            "act{}-norm{}-max{}-signed{}-cos{}-p{}-hd{}-dt{}",
            self.act,
            self.norm,
            self.running_max as u8,
            self.signed as u8,
            self.cosine as u8,
            self.p,
            head_dim,
            dtype.code()
        )
    }
}

/// Whether the tensor-core forward exists for this head dimension and dtype.
pub fn has_tensor_core_forward(head_dim: usize, dtype: Dtype) -> bool {
    dtype != Dtype::F32 && (head_dim == 64 || head_dim == 128)
}

/// The complete CUDA source of one specialisation.
pub fn source(cfg: &Config, head_dim: usize, dtype: Dtype) -> String {
    let mut s = format!(
        "#define ACT {}\n#define NORM {}\n#define RUNNING_MAX {}\n#define SIGNED {}\n#define COSINE {}\n#define P {}\n#define DTYPE {}\n#define HD {}\n",
        cfg.act,
        cfg.norm,
        cfg.running_max as u8,
        cfg.signed as u8,
        cfg.cosine as u8,
        cfg.p,
        dtype.code(),
        head_dim
    );
    s.push_str(COMMON_SRC);
    s.push_str(SIMT_SRC);
    if has_tensor_core_forward(head_dim, dtype) {
        s.push_str(MMA_SRC);
        s.push_str(MMA3_SRC);
        s.push_str(MMA5_SRC);
        s.push_str(MMA_BWD_SRC);
        s.push_str(MMA_BWD6_SRC);
        s.push_str(MMA_BWD7_SRC);
    }
    s
}

/// Directories where a `libnvrtc.so.13` may be: `$LSSA_NVRTC_DIR`, the torch venv that `LIBTORCH`
/// points into (`site-packages/nvidia/cu13/lib`), the GPU machines' torch venv, `/usr/local/cuda`.
fn nvrtc_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("LSSA_NVRTC_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(t) = std::env::var_os("LIBTORCH") {
        let t = PathBuf::from(t);
        let t = t.canonicalize().unwrap_or(t);
        if let Some(sp) = t.parent() {
            dirs.push(sp.join("nvidia/cu13/lib"));
        }
    }
    dirs.push(PathBuf::from("/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib"));
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs
}

/// Loads NVRTC (and its builtins library, which NVRTC opens by name) by absolute path once, so that
/// cudarc's later `dlopen("libnvrtc.so.13")` finds it without `LD_LIBRARY_PATH`. Returns where from.
fn preload_nvrtc() -> Result<PathBuf> {
    static LOADED: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let tried = nvrtc_dirs();
            for dir in &tried {
                let lib = dir.join("libnvrtc.so.13");
                if !lib.exists() {
                    continue;
                }
                let builtins =
                    std::fs::read_dir(dir).ok().into_iter().flatten().flatten().map(|e| e.path()).find(|p| {
                        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so.13"))
                    });
                // SAFETY: loading NVIDIA's shared libraries runs only their initialisers.
                unsafe {
                    if let Some(Ok(l)) = builtins.map(|b| libloading::Library::new(&b)) {
                        std::mem::forget(l);
                    }
                    match libloading::Library::new(&lib) {
                        Ok(l) => std::mem::forget(l),
                        Err(e) => return Err(format!("cannot load {}: {e}", lib.display())),
                    }
                }
                return Ok(dir.clone());
            }
            // Last chance: whatever the loader finds by name.
            // SAFETY: as above.
            if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Ok(PathBuf::from("(system search path)"));
            }
            Err(format!(
                "no libnvrtc.so.13 in {} (set LSSA_NVRTC_DIR, or run `cargo xtask setup`, whose torch venv ships it)",
                tried.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            ))
        })
        .clone()
        .map_err(Error::Cuda)
}

/// Where NVRTC was loaded from (loads it on first call).
pub fn nvrtc_location() -> Result<PathBuf> {
    preload_nvrtc()
}

/// Compiles one specialisation to PTX for `arch` (e.g. `"compute_90"`); needs NVRTC only, no GPU.
/// The test suite calls this for every fused variant, so a kernel that does not compile fails CI.
pub fn compile_ptx(variant: &Variant, head_dim: usize, dtype: Dtype, arch: &'static str) -> Result<String> {
    let cfg = Config::new(variant, head_dim)?;
    Ok(compile(&cfg, head_dim, dtype, arch)?.to_src())
}

fn compile(cfg: &Config, head_dim: usize, dtype: Dtype, arch: &'static str) -> Result<Ptx> {
    preload_nvrtc()?;
    let opts = CompileOptions {
        arch: Some(arch),
        options: vec!["--std=c++17".into(), "-lineinfo".into()],
        name: Some(format!("lssa-{}.cu", cfg.key(head_dim, dtype))),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source(cfg, head_dim, dtype), opts)
        .map_err(|e| Error::Cuda(format!("NVRTC failed on {}: {e:?}", cfg.key(head_dim, dtype))))
}

/// The NVRTC architecture name for a compute capability (PTX, so newer GPUs JIT it).
fn arch_name(major: i32, minor: i32) -> Result<&'static str> {
    Ok(match (major, minor) {
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        // Arch-specific PTX (wgmma, lab v8) for sm_90 itself; it does not JIT to later GPUs.
        (9, 0) => "compute_90a",
        (9, _) => "compute_90",
        (10, _) | (11, _) | (12, _) => "compute_90", // PTX for sm_90 runs on later GPUs (JIT)
        _ => return Err(Error::Cuda(format!("compute capability {major}.{minor}: the kernels need sm_80 or newer"))),
    })
}

/// Whether PTX for `arch` may use sm_90a's warpgroup instructions (lab v8).
fn has_wgmma(arch: &str) -> bool {
    arch == "compute_90a"
}

/// The kernels of the sources, by their `extern "C"` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kern {
    InvNorms,
    FwdSimt,
    FwdMma,
    FwdMma3,
    FwdMma5,
    FwdWg8,
    BwdRows,
    BwdKeys,
    BwdRowsMma,
    BwdKeysMma,
    BwdRowsMma6,
    BwdKeysMma6,
    BwdRowStats7,
    BwdKeysMma7,
    BwdRowStats9,
    BwdKeysWg9,
    WgProbe,
    BwdDq7,
}

impl Kern {
    const ALL: [Kern; 18] = [
        Kern::InvNorms,
        Kern::FwdSimt,
        Kern::FwdMma,
        Kern::FwdMma3,
        Kern::FwdMma5,
        Kern::FwdWg8,
        Kern::BwdRows,
        Kern::BwdKeys,
        Kern::BwdRowsMma,
        Kern::BwdKeysMma,
        Kern::BwdRowsMma6,
        Kern::BwdKeysMma6,
        Kern::BwdRowStats7,
        Kern::BwdKeysMma7,
        Kern::BwdRowStats9,
        Kern::BwdKeysWg9,
        Kern::WgProbe,
        Kern::BwdDq7,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kern::InvNorms => "lssa_inv_norms",
            Kern::FwdSimt => "lssa_fwd_simt",
            Kern::FwdMma => "lssa_fwd_mma",
            Kern::FwdMma3 => "lssa_fwd_mma3",
            Kern::FwdMma5 => "lssa_fwd_mma5",
            Kern::FwdWg8 => "lssa_fwd_wg8",
            Kern::BwdRows => "lssa_bwd_rows",
            Kern::BwdKeys => "lssa_bwd_keys",
            Kern::BwdRowsMma => "lssa_bwd_rows_mma",
            Kern::BwdKeysMma => "lssa_bwd_keys_mma",
            Kern::BwdRowsMma6 => "lssa_bwd_rows_mma6",
            Kern::BwdKeysMma6 => "lssa_bwd_keys_mma6",
            Kern::BwdRowStats7 => "lssa_bwd_rowstats7",
            Kern::BwdKeysMma7 => "lssa_bwd_keys_mma7",
            Kern::BwdRowStats9 => "lssa_bwd_rowstats9",
            Kern::BwdKeysWg9 => "lssa_bwd_keys_wg9",
            Kern::WgProbe => "lssa_wg_probe",
            Kern::BwdDq7 => "lssa_bwd_dq7",
        }
    }

    /// Threads per block at `head_dim` (each kernel's `__launch_bounds__`).
    pub(crate) fn threads(self, head_dim: usize) -> u32 {
        match self {
            Kern::InvNorms | Kern::FwdMma3 => 256,
            Kern::FwdWg8 if head_dim == 128 => 256, // two warpgroups of one m64 half each
            Kern::FwdSimt | Kern::BwdRows | Kern::BwdKeys | Kern::BwdDq7 => 32 * ROWS_PER_BLOCK,
            _ => 128,
        }
    }

    /// Dynamic shared memory of one block, in bytes.
    pub(crate) fn smem(self, head_dim: usize) -> usize {
        match self {
            Kern::FwdMma3
            | Kern::FwdMma5
            | Kern::FwdWg8
            | Kern::BwdRowsMma
            | Kern::BwdRowsMma6
            | Kern::BwdRowStats7
            | Kern::BwdRowStats9 => mma3_smem(head_dim),
            Kern::BwdKeysMma | Kern::BwdKeysMma6 => bwd_keys_smem(head_dim),
            // One more tile: dS on its way to the dq product.
            Kern::BwdKeysMma7 | Kern::BwdKeysWg9 => bwd_keys_smem(head_dim) / 6 * 7,
            // Room for the probe's misread operands (offsets swapped) too.
            Kern::WgProbe => 16 * 1024,
            _ => 0,
        }
    }

    /// The kernels one specialisation's source defines (the tensor-core files are included only
    /// where [`has_tensor_core_forward`]); `wgmma`: compiled for sm_90a (or the emulator).
    pub(crate) fn present(head_dim: usize, dtype: Dtype, wgmma: bool) -> impl Iterator<Item = Kern> {
        let tc = has_tensor_core_forward(head_dim, dtype);
        Self::ALL.into_iter().filter(move |k| match k {
            Kern::FwdMma5 => tc && head_dim == 64,
            Kern::FwdWg8 => tc && wgmma,
            Kern::BwdRowStats9 | Kern::BwdKeysWg9 | Kern::WgProbe => tc && head_dim == 64 && wgmma,
            Kern::FwdMma | Kern::FwdMma3 | Kern::BwdRowsMma | Kern::BwdKeysMma => tc,
            Kern::BwdRowsMma6 | Kern::BwdKeysMma6 => tc,
            Kern::BwdRowStats7 | Kern::BwdKeysMma7 | Kern::BwdDq7 => tc,
            Kern::InvNorms | Kern::FwdSimt | Kern::BwdRows | Kern::BwdKeys => true,
        })
    }
}

/// One compiled specialisation on a GPU.
struct Module {
    _module: Arc<CudaModule>,
    functions: HashMap<Kern, CudaFunction>,
    /// Compiled for sm_90a, with the warpgroup kernels (lab v8, v9).
    wgmma: bool,
}

/// The state of one GPU: its primary context, that context's legacy default stream, the module cache.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: &'static str,
    cache: Mutex<HashMap<String, Arc<Module>>>,
}

/// Number of CUDA devices, or why there are none.
fn device_count() -> Result<usize> {
    static COUNT: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    COUNT
        .get_or_init(|| {
            // SAFETY: probing for the driver library only loads it.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Err("no CUDA driver (libcuda.so) on this machine".into());
            }
            let n = CudaContext::device_count().map_err(|e| format!("cuInit / device count: {e:?}"))?;
            if n < 1 {
                return Err("no CUDA device".into());
            }
            Ok(n as usize)
        })
        .clone()
        .map_err(Error::Cuda)
}

thread_local! {
    /// The device the calls of this thread run on: set by the raw entry points from their tensors'
    /// memory (so each data-parallel rank uses its own GPU), 0 for the ndarray entry points.
    static DEVICE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs `f` with this thread's kernels on `ordinal`, restoring the previous device afterwards.
fn on_device<T>(ordinal: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let before = DEVICE.with(|d| d.replace(ordinal));
    let out = f();
    DEVICE.with(|d| d.set(before));
    out
}

/// The device ordinal that holds the device memory at `ptr`.
fn device_of(ptr: u64) -> Result<usize> {
    device_count()?;
    let mut ordinal: i32 = -1;
    // SAFETY: the driver writes one int for this attribute; `ptr` is only looked up, never dereferenced.
    let r = unsafe {
        cudarc::driver::sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            cudarc::driver::sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS || ordinal < 0 {
        return Err(Error::BadParams(format!("{ptr:#x} is not CUDA device memory ({r:?})")));
    }
    Ok(ordinal as usize)
}

/// The device of a raw call: the one holding `q`. Should the driver not answer for the pointer, the
/// thread's current device (0 unless set), which is what every call used before devices were told apart.
fn device_for(p: &Params) -> Result<usize> {
    device_count()?;
    Ok(device_of(p.q.ptr as u64).unwrap_or_else(|_| DEVICE.with(std::cell::Cell::get)))
}

/// The GPU this thread's calls run on (see [`on_device`]).
fn gpu() -> Result<&'static Gpu> {
    static GPUS: OnceLock<Vec<OnceLock<std::result::Result<Gpu, String>>>> = OnceLock::new();
    let n = device_count()?;
    let gpus = GPUS.get_or_init(|| (0..n).map(|_| OnceLock::new()).collect());
    let ordinal = DEVICE.with(std::cell::Cell::get);
    let slot = gpus.get(ordinal).ok_or_else(|| Error::Cuda(format!("no CUDA device {ordinal} (there are {n})")))?;
    slot.get_or_init(|| {
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("primary context of device {ordinal}: {e:?}"))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| format!("{e:?}"))?;
        let arch = arch_name(major, minor).map_err(|e| e.to_string())?;
        let stream = ctx.default_stream();
        Ok(Gpu { ctx, stream, arch, cache: Mutex::new(HashMap::new()) })
    })
    .as_ref()
    .map_err(|e| Error::Cuda(e.clone()))
}

/// Whether a CUDA device and driver are present (NVRTC is checked at first compile).
pub fn is_available() -> bool {
    gpu().is_ok()
}

/// The device's name and architecture, e.g. `"NVIDIA H100 80GB HBM3 (compute_90)"`.
pub fn device_description() -> Result<String> {
    let g = gpu()?;
    Ok(format!("{} ({})", g.ctx.name().map_err(cuda_err)?, g.arch))
}

fn cuda_err(e: impl std::fmt::Debug) -> Error {
    Error::Cuda(format!("{e:?}"))
}

fn module(cfg: &Config, head_dim: usize, dtype: Dtype) -> Result<Arc<Module>> {
    let g = gpu()?;
    let key = cfg.key(head_dim, dtype);
    if let Some(m) = g.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(Arc::clone(m));
    }
    let load = |arch: &'static str| -> Result<Module> {
        let ptx = compile(cfg, head_dim, dtype, arch)?;
        let module = g.ctx.load_module(ptx).map_err(cuda_err)?;
        let wgmma = has_wgmma(arch);
        let mut functions = HashMap::new();
        for k in Kern::present(head_dim, dtype, wgmma) {
            let f = module.load_function(k.name()).map_err(cuda_err)?;
            let smem = k.smem(head_dim);
            functions.insert(k, if smem > 0 { with_smem(f, smem)? } else { f });
        }
        Ok(Module { _module: module, functions, wgmma })
    };
    // The arch-specific PTX (sm_90a) holds the not yet measured warpgroup kernels: should the
    // driver refuse it, the other kernels still run, from plain compute_90 PTX.
    let m = match load(g.arch) {
        Err(e) if has_wgmma(g.arch) => {
            eprintln!("attn-kernels: {} failed to load ({e}); falling back to compute_90 (no lab v8, v9)", g.arch);
            load("compute_90")?
        }
        r => r?,
    };
    let m = Arc::new(m);
    g.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, Arc::clone(&m));
    Ok(m)
}

/// One `(B, H, T, d)` tensor as the kernels see it (must match `Tensor4` in `common.cuh`).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct Tensor4 {
    ptr: u64,
    sb: i64,
    sh: i64,
    st: i64,
}

/// The kernels' only argument (must match `KParams` in `common.cuh`).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct KParams {
    b: i32,
    h: i32,
    t: i32,
    d: i32,
    q: Tensor4,
    k: Tensor4,
    v: Tensor4,
    o: Tensor4,
    g: Tensor4,
    dq: Tensor4,
    dk: Tensor4,
    dv: Tensor4,
    stats: u64,
    inv_norms: u64,
    rowgrad: u64,
    dq_acc: u64,
    scale_c: f32,
    scale_log: i32,
    bias_c: f32,
    bias_log: i32,
}

// SAFETY: plain old data with the C layout the kernels declare.
unsafe impl DeviceRepr for KParams {}

fn t4<P>(x: crate::cpu::RawTensor<*const P>) -> Tensor4 {
    Tensor4 { ptr: x.ptr as u64, sb: x.strides[0] as i64, sh: x.strides[1] as i64, st: x.strides[2] as i64 }
}
fn t4m<P>(x: crate::cpu::RawTensor<*mut P>) -> Tensor4 {
    t4(x.as_const())
}

fn kparams(cfg: &Config, p: &Params) -> Result<KParams> {
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
        scale_c: cfg.scale_c,
        scale_log: cfg.scale_log as i32,
        bias_c: cfg.bias_c,
        bias_log: cfg.bias_log as i32,
    })
}

/// Whether the tensor-core kernel can read these tensors: 32-bit aligned pairs of 16-bit values.
fn pairs_aligned(p: &Params) -> bool {
    [t4(p.q), t4(p.k), t4(p.v), t4m(p.o)].iter().all(|x| aligned(x, 4, 2))
}

/// Whether `x` starts on a `bytes`-byte boundary and every row, head and batch stride is a multiple
/// of `elems` elements.
fn aligned(x: &Tensor4, bytes: u64, elems: i64) -> bool {
    x.ptr.is_multiple_of(bytes) && [x.sb, x.sh, x.st].iter().all(|s| s % elems == 0)
}

/// Whether v3 can read these tensors: 16-byte aligned rows of 16-bit values.
fn rows_aligned16(p: &Params) -> bool {
    [t4(p.q), t4(p.k), t4(p.v)].iter().all(|x| aligned(x, 16, 8)) && pairs_aligned(p)
}

const ROWS_PER_BLOCK: u32 = 8; // ROWS in simt.cu
const MMA_ROWS: u32 = 64; // BQ in mma.cu
const MMA3_ROWS: u32 = 128; // BQ3 in mma3.cu
const MMA5_ROWS: u32 = 128; // BQ5 in mma5.cu

/// Dynamic shared memory of v3 and of the v4 rows kernel: two stages of two tiles (K and V), each
/// 64 rows of `d + 8` 16-bit values.
fn mma3_smem(head_dim: usize) -> usize {
    2 * 2 * 64 * (head_dim + 8) * 2
}

/// Dynamic shared memory of the v4 keys kernel: the block's K and V, then two stages of Q and G tiles.
fn bwd_keys_smem(head_dim: usize) -> usize {
    6 * 64 * (head_dim + 8) * 2
}

fn with_smem(f: CudaFunction, bytes: usize) -> Result<CudaFunction> {
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .map_err(cuda_err)?;
    Ok(f)
}

fn check_params(p: &Params) -> Result<()> {
    if p.batch == 0 || p.heads == 0 || p.seq_len == 0 || p.head_dim == 0 {
        return Err(Error::BadParams(format!(
            "empty tensor: B={} H={} T={} d={}",
            p.batch, p.heads, p.seq_len, p.head_dim
        )));
    }
    if p.head_dim > 256 {
        return Err(Error::BadParams(format!("head dimension {} > 256 has no CUDA kernel", p.head_dim)));
    }
    Ok(())
}

/// A buffer in the memory the kernels run on: device memory, or host memory aligned to 16 bytes for
/// the emulator ([`emu`]).
pub(crate) enum Buf {
    Device { mem: cudarc::driver::CudaSlice<u8>, addr: u64 },
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

/// Where the kernels of one specialisation run: a GPU ([`GpuExec`]) or the CPU emulator
/// ([`emu`]). The host logic (kernel choice, grids, scratch, checks) is written once against this,
/// so the emulator tests it too.
pub(crate) trait Exec {
    /// Queues kernel `k` on a `grid` of blocks of [`Kern::threads`], with `k`'s dynamic shared memory.
    fn launch(&self, k: Kern, grid: (u32, u32), kp: &KParams) -> Result<()>;
    /// `bytes` zeroed bytes.
    fn zeros(&self, bytes: usize) -> Result<Buf>;
    /// A copy of `bytes`.
    fn upload(&self, bytes: &[u8]) -> Result<Buf>;
    /// The contents of `b` (after the work queued before).
    fn download(&self, b: &Buf) -> Result<Vec<u8>>;
    /// Whether the warpgroup kernels (lab v8) are there.
    fn wgmma(&self) -> bool;
}

/// The kernels of one specialisation on this thread's GPU.
struct GpuExec {
    gpu: &'static Gpu,
    module: Arc<Module>,
    head_dim: usize,
}

impl GpuExec {
    fn new(cfg: &Config, head_dim: usize, dtype: Dtype) -> Result<Self> {
        Ok(Self { gpu: gpu()?, module: module(cfg, head_dim, dtype)?, head_dim })
    }

    fn device(&self, mem: cudarc::driver::CudaSlice<u8>) -> Buf {
        let (addr, sync) = cudarc::driver::DevicePtr::device_ptr(&mem, &self.gpu.stream);
        drop(sync);
        Buf::Device { mem, addr }
    }
}

impl Exec for GpuExec {
    fn launch(&self, k: Kern, grid: (u32, u32), kp: &KParams) -> Result<()> {
        let f = self.module.functions.get(&k).ok_or_else(|| Error::Cuda(format!("{} is not compiled", k.name())))?;
        let smem = k.smem(self.head_dim) as u32;
        let cfg = LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (k.threads(self.head_dim), 1, 1),
            shared_mem_bytes: smem,
        };
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(kp);
        // SAFETY: the kernel reads and writes only through the pointers in `kp`, whose validity the raw
        // entry points' callers guarantee; `kp` is copied at launch.
        unsafe { b.launch(cfg) }.map_err(cuda_err)?;
        Ok(())
    }

    fn zeros(&self, bytes: usize) -> Result<Buf> {
        Ok(self.device(self.gpu.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(cuda_err)?))
    }

    fn upload(&self, bytes: &[u8]) -> Result<Buf> {
        Ok(self.device(self.gpu.stream.clone_htod(bytes).map_err(cuda_err)?))
    }

    fn download(&self, b: &Buf) -> Result<Vec<u8>> {
        match b {
            Buf::Device { mem, .. } => self.gpu.stream.clone_dtoh(mem).map_err(cuda_err),
            Buf::Host(_) => Err(Error::Cuda("a host buffer given to the GPU".into())),
        }
    }

    fn wgmma(&self) -> bool {
        self.module.wgmma
    }
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
    let rows = p.batch * p.heads * p.seq_len;
    let norms = x.zeros(2 * rows * 4)?;
    kp.inv_norms = norms.addr();
    let blocks = (2 * rows as u64).div_ceil(Kern::InvNorms.threads(p.head_dim) as u64 / 32); // a warp per row
    let blocks = u32::try_from(blocks).map_err(|_| Error::BadParams("too many rows".into()))?;
    x.launch(Kern::InvNorms, (blocks, 1), &kp)?;
    Ok(Call { kp, _norms: Some(norms), bh })
}

/// Fused forward on device memory: writes `o` and the row statistics. `kernel` picks the forward.
///
/// # Safety
/// As [`crate::cpu::forward_raw`], with device pointers holding `dtype` elements (the `Params`
/// pointer types are nominal here); `stats` holds f32. Work is queued on the legacy default stream
/// of the GPU holding `q` and not waited for.
pub unsafe fn forward_raw(variant: &Variant, p: &Params, dtype: Dtype, kernel: Kernel) -> Result<()> {
    check_params(p)?;
    let cfg = Config::new(variant, p.head_dim)?;
    on_device(device_for(p)?, || {
        let x = GpuExec::new(&cfg, p.head_dim, dtype)?;
        // SAFETY: forwarded from our caller.
        unsafe { forward_exec(&x, &cfg, p, dtype, kernel) }
    })
}

/// The forward lab version `kernel` runs (1, 2, 3, 5 or 8) for inputs whose rows allow `[v2, v3]`
/// (even strides; 16-byte aligned rows) on a module with (`wgmma`) or without the sm_90 kernels.
fn forward_version(kernel: Kernel, head_dim: usize, dtype: Dtype, [v2, v3]: [bool; 2], wgmma: bool) -> Result<u32> {
    let refuse = |what: &str| {
        Err(Error::BadParams(format!(
            "no tensor-core forward ({what}) for {dtype:?} at head dimension {head_dim} with these strides"
        )))
    };
    Ok(match kernel {
        Kernel::Auto if v3 => 3,
        Kernel::Auto if v2 => 2,
        Kernel::Auto | Kernel::Simt => 1,
        Kernel::TensorCoreV2 if v2 => 2,
        Kernel::TensorCoreV2 => return refuse("v2"),
        Kernel::TensorCore if v3 => 3,
        Kernel::TensorCore => return refuse("v3"),
        Kernel::TensorCoreV8 if v3 && wgmma => 8,
        Kernel::TensorCoreV5 | Kernel::TensorCoreV7 | Kernel::TensorCoreV8 if v3 && head_dim == 64 => 5,
        // v5 exists at head dimension 64 only, v8 on sm_90 only.
        Kernel::TensorCoreV5 | Kernel::TensorCoreV7 | Kernel::TensorCoreV8 if v3 => 3,
        Kernel::TensorCoreV5 | Kernel::TensorCoreV7 | Kernel::TensorCoreV8 => return refuse("v5"),
    })
}

/// The backward lab version `kernel` runs (1, 4, 6, 7 or 9) where the tensor-core backward applies
/// (`tc`: its dtype, head dimension and 16-byte aligned rows) or not.
fn backward_version(kernel: Kernel, head_dim: usize, dtype: Dtype, tc: bool, wgmma: bool) -> Result<u32> {
    let newer =
        matches!(kernel, Kernel::TensorCore | Kernel::TensorCoreV5 | Kernel::TensorCoreV7 | Kernel::TensorCoreV8);
    if newer && !tc {
        return Err(Error::BadParams(format!(
            "no tensor-core backward for {dtype:?} at head dimension {head_dim} with these strides"
        )));
    }
    Ok(match kernel {
        _ if !tc => 1,
        Kernel::TensorCoreV8 if head_dim == 64 && wgmma => 9,
        Kernel::TensorCoreV7 | Kernel::TensorCoreV8 => 7,
        Kernel::TensorCoreV5 => 6,
        Kernel::Auto | Kernel::TensorCore => 4,
        Kernel::Simt | Kernel::TensorCoreV2 => 1,
    })
}

/// The lab versions, `(forward, backward)`, that `kernel` runs on this thread's GPU for `variant` at
/// `head_dim` in `dtype` with contiguous inputs: what a benchmark of `kernel` measures (on other
/// devices than sm_90, for instance, [`Kernel::TensorCoreV8`] runs v5 + v7).
pub fn versions(variant: &Variant, head_dim: usize, dtype: Dtype, kernel: Kernel) -> Result<(u32, u32)> {
    let cfg = Config::new(variant, head_dim)?;
    let wgmma = module(&cfg, head_dim, dtype)?.wgmma;
    let tc = has_tensor_core_forward(head_dim, dtype);
    Ok((
        forward_version(kernel, head_dim, dtype, [tc, tc], wgmma)?,
        backward_version(kernel, head_dim, dtype, tc, wgmma)?,
    ))
}

/// The forward on `x`: picks the kernel and launches it.
///
/// # Safety
/// As [`forward_raw`], with addresses of `x`'s memory.
unsafe fn forward_exec(x: &dyn Exec, cfg: &Config, p: &Params, dtype: Dtype, kernel: Kernel) -> Result<()> {
    check_params(p)?;
    let tc = has_tensor_core_forward(p.head_dim, dtype);
    let version =
        forward_version(kernel, p.head_dim, dtype, [tc && pairs_aligned(p), tc && rows_aligned16(p)], x.wgmma())?;
    let Call { kp, _norms, bh } = prepare(x, cfg, p)?;
    let t = p.seq_len as u32;
    match version {
        8 => x.launch(Kern::FwdWg8, (t.div_ceil(MMA5_ROWS), bh), &kp),
        5 => x.launch(Kern::FwdMma5, (t.div_ceil(MMA5_ROWS), bh), &kp),
        3 => x.launch(Kern::FwdMma3, (t.div_ceil(MMA3_ROWS), bh), &kp),
        2 => x.launch(Kern::FwdMma, (t.div_ceil(MMA_ROWS), bh), &kp),
        _ => x.launch(Kern::FwdSimt, (t.div_ceil(ROWS_PER_BLOCK), bh), &kp),
    }
}

/// Fused backward on device memory: reads `q`, `k`, `v`, `o`, `stats`, `d_out`; writes `dq`, `dk`,
/// `dv`. `kernel`: [`Kernel::Auto`] and [`Kernel::TensorCore`] run the tensor-core backward (lab
/// v4) where it applies (as v3: f16/bf16, d 64 or 128, 16-byte aligned rows), [`Kernel::TensorCoreV5`]
/// its successor v6 there, [`Kernel::TensorCoreV7`] v7, [`Kernel::TensorCoreV8`] v9 (v7 where v9 does
/// not apply), [`Kernel::Simt`] and
/// [`Kernel::TensorCoreV2`] the SIMT one (v1).
///
/// # Safety
/// As [`forward_raw`], for every pointer of `p`.
pub unsafe fn backward_raw(variant: &Variant, p: &Params, dtype: Dtype, kernel: Kernel) -> Result<()> {
    check_params(p)?;
    let cfg = Config::new(variant, p.head_dim)?;
    on_device(device_for(p)?, || {
        let x = GpuExec::new(&cfg, p.head_dim, dtype)?;
        // SAFETY: forwarded from our caller.
        unsafe { backward_exec(&x, &cfg, p, dtype, kernel) }
    })
}

/// The backward on `x`.
///
/// # Safety
/// As [`backward_raw`], with addresses of `x`'s memory.
unsafe fn backward_exec(x: &dyn Exec, cfg: &Config, p: &Params, dtype: Dtype, kernel: Kernel) -> Result<()> {
    check_params(p)?;
    let all16 =
        rows_aligned16(p) && [t4(p.d_out), t4m(p.dq), t4m(p.dk), t4m(p.dv), t4m(p.o)].iter().all(|x| aligned(x, 16, 8));
    let tc = has_tensor_core_forward(p.head_dim, dtype) && all16;
    let version = backward_version(kernel, p.head_dim, dtype, tc, x.wgmma())?;
    let Call { mut kp, _norms, bh } = prepare(x, cfg, p)?;
    let rowgrad = x.zeros(2 * p.batch * p.heads * p.seq_len * 4)?;
    kp.rowgrad = rowgrad.addr();
    let t = p.seq_len as u32;
    match version {
        7 | 9 => {
            let dq_acc = x.zeros(p.batch * p.heads * p.seq_len * p.head_dim * 4)?;
            kp.dq_acc = dq_acc.addr();
            let (rows, keys) = if version == 9 {
                (Kern::BwdRowStats9, Kern::BwdKeysWg9)
            } else {
                (Kern::BwdRowStats7, Kern::BwdKeysMma7)
            };
            x.launch(rows, (t.div_ceil(64), bh), &kp)?;
            x.launch(keys, (t.div_ceil(64), bh), &kp)?;
            x.launch(Kern::BwdDq7, (t.div_ceil(ROWS_PER_BLOCK), bh), &kp)
        }
        6 => {
            x.launch(Kern::BwdRowsMma6, (t.div_ceil(64), bh), &kp)?;
            x.launch(Kern::BwdKeysMma6, (t.div_ceil(64), bh), &kp)
        }
        4 => {
            x.launch(Kern::BwdRowsMma, (t.div_ceil(64), bh), &kp)?;
            x.launch(Kern::BwdKeysMma, (t.div_ceil(64), bh), &kp)
        }
        _ => {
            let grid = (t.div_ceil(ROWS_PER_BLOCK), bh);
            x.launch(Kern::BwdRows, grid, &kp)?;
            x.launch(Kern::BwdKeys, grid, &kp)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ndarray entry points: upload, run, download (for tests, the kernel lab and small users), written
// once for the GPU and the emulator.

/// An f32 array (any layout) as the bytes of a standard-layout array in `dtype`.
fn to_bytes(x: &ArrayView4<'_, f32>, dtype: Dtype) -> Vec<u8> {
    let x = x.as_standard_layout();
    let data = x.as_slice().expect("standard layout");
    match dtype {
        Dtype::F32 => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => data.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
        Dtype::Bf16 => data.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
    }
}

fn from_bytes(bytes: &[u8], dtype: Dtype, shape: (usize, usize, usize, usize)) -> Result<Array4<f32>> {
    let data: Vec<f32> = match dtype {
        Dtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::Bf16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
    };
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let data = data.into_iter().take(n).collect();
    Array4::from_shape_vec(shape, data).map_err(|e| Error::BadParams(e.to_string()))
}

/// Checks the ndarray inputs and resolves the variant for their head dimension.
fn checked(
    variant: &Variant,
    q: &ArrayView4<'_, f32>,
    k: &ArrayView4<'_, f32>,
    v: &ArrayView4<'_, f32>,
    d_out: Option<&ArrayView4<'_, f32>>,
) -> Result<Config> {
    attn_core::check_inputs(variant, q, k, v, d_out)?;
    if v.shape() != q.shape() {
        return Err(not_fused(variant, "the fused kernels need v to have the head dimension of q and k"));
    }
    Config::new(variant, q.shape()[3])
}

fn contiguous<P>(addr: u64, shape: (usize, usize, usize, usize)) -> crate::cpu::RawTensor<*mut P> {
    let (_, h, t, d) = shape;
    crate::cpu::RawTensor { ptr: addr as *mut P, strides: [h * t * d, t * d, d] }
}

/// The inputs, output and statistics of one forward in `x`'s memory.
struct Staged {
    shape: (usize, usize, usize, usize),
    _inputs: [Buf; 3],
    o: Buf,
    _stats: Buf,
    params: Params,
}

fn staged_forward(x: &dyn Exec, cfg: &Config, [q, k, v]: [&ArrayView4<'_, f32>; 3], opts: &Options) -> Result<Staged> {
    let sh = q.shape();
    let shape = (sh[0], sh[1], sh[2], sh[3]);
    let n = sh.iter().product::<usize>();
    let inputs =
        [x.upload(&to_bytes(q, opts.dtype))?, x.upload(&to_bytes(k, opts.dtype))?, x.upload(&to_bytes(v, opts.dtype))?];
    let o = x.zeros(n * opts.dtype.size())?;
    let stats = x.zeros(sh[0] * sh[1] * sh[2] * STATS_PER_ROW * 4)?;
    let null_c = crate::cpu::RawTensor { ptr: std::ptr::null(), strides: [0; 3] };
    let null_m = crate::cpu::RawTensor { ptr: std::ptr::null_mut(), strides: [0; 3] };
    let params = Params {
        batch: sh[0],
        heads: sh[1],
        seq_len: sh[2],
        head_dim: sh[3],
        q: contiguous::<f32>(inputs[0].addr(), shape).as_const(),
        k: contiguous::<f32>(inputs[1].addr(), shape).as_const(),
        v: contiguous::<f32>(inputs[2].addr(), shape).as_const(),
        o: contiguous(o.addr(), shape),
        stats: stats.addr() as *mut f32,
        rw_aux: std::ptr::null_mut(),
        d_out: null_c,
        dq: null_m,
        dk: null_m,
        dv: null_m,
    };
    // SAFETY: every pointer is a live buffer of `x` of the shape given, in `opts.dtype`.
    unsafe { forward_exec(x, cfg, &params, opts.dtype, opts.kernel)? };
    Ok(Staged { shape, _inputs: inputs, o, _stats: stats, params })
}

/// The forward of the ndarray entry points on `x`.
pub(crate) fn forward_on(
    x: &dyn Exec,
    cfg: &Config,
    qkv: [&ArrayView4<'_, f32>; 3],
    opts: &Options,
) -> Result<Array4<f32>> {
    let s = staged_forward(x, cfg, qkv, opts)?;
    from_bytes(&x.download(&s.o)?, opts.dtype, s.shape)
}

/// The backward of the ndarray entry points on `x` (runs the forward for its statistics).
pub(crate) fn backward_on(
    x: &dyn Exec,
    cfg: &Config,
    qkv: [&ArrayView4<'_, f32>; 3],
    d_out: &ArrayView4<'_, f32>,
    opts: &Options,
) -> Result<Grads> {
    let s = staged_forward(x, cfg, qkv, opts)?;
    let n = s.shape.0 * s.shape.1 * s.shape.2 * s.shape.3;
    let g = x.upload(&to_bytes(d_out, opts.dtype))?;
    let (dq, dk, dv) =
        (x.zeros(n * opts.dtype.size())?, x.zeros(n * opts.dtype.size())?, x.zeros(n * opts.dtype.size())?);
    let mut p = s.params;
    p.d_out = contiguous::<f32>(g.addr(), s.shape).as_const();
    p.dq = contiguous(dq.addr(), s.shape);
    p.dk = contiguous(dk.addr(), s.shape);
    p.dv = contiguous(dv.addr(), s.shape);
    // SAFETY: as in `staged_forward`; the gradient buffers are fresh.
    unsafe { backward_exec(x, cfg, &p, opts.dtype, opts.kernel)? };
    Ok(Grads {
        dq: from_bytes(&x.download(&dq)?, opts.dtype, s.shape)?,
        dk: from_bytes(&x.download(&dk)?, opts.dtype, s.shape)?,
        dv: from_bytes(&x.download(&dv)?, opts.dtype, s.shape)?,
    })
}

/// Causal attention output of `variant` on the GPU (inputs converted to `opts.dtype`), as f32.
pub fn forward_with<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
    opts: &Options,
) -> Result<Array4<f32>> {
    let (q, k, v) = (q.into(), k.into(), v.into());
    let cfg = checked(variant, &q, &k, &v, None)?;
    forward_on(&GpuExec::new(&cfg, q.shape()[3], opts.dtype)?, &cfg, [&q, &k, &v], opts)
}

/// [`forward_with`] in f32 with the default kernel; see [`crate::cpu::forward`].
pub fn forward<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
) -> Result<Array4<f32>> {
    forward_with(variant, q, k, v, &Options::default())
}

/// Gradients of `sum(d_out * forward(q, k, v))` on the GPU (runs the forward for its statistics).
pub fn backward_with<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
    d_out: impl AsArray<'a, f32, Ix4>,
    opts: &Options,
) -> Result<Grads> {
    let (q, k, v, g) = (q.into(), k.into(), v.into(), d_out.into());
    let cfg = checked(variant, &q, &k, &v, Some(&g))?;
    backward_on(&GpuExec::new(&cfg, q.shape()[3], opts.dtype)?, &cfg, [&q, &k, &v], &g, opts)
}

/// [`backward_with`] in f32; see [`crate::cpu::backward`].
pub fn backward<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
    d_out: impl AsArray<'a, f32, Ix4>,
) -> Result<Grads> {
    backward_with(variant, q, k, v, d_out, &Options::default())
}

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

/// [`KernelResources`] of every kernel of one specialisation on this thread's GPU.
pub fn kernel_resources(variant: &Variant, head_dim: usize, dtype: Dtype) -> Result<Vec<KernelResources>> {
    use cudarc::driver::sys::CUfunction_attribute_enum as A;
    let cfg = Config::new(variant, head_dim)?;
    let m = module(&cfg, head_dim, dtype)?;
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

/// The modes of the wgmma layout probe (`lssa_wg_probe` in `mma5.cu`), and whether each must match.
pub const WGMMA_PROBE_MODES: [(&str, bool); 5] = [
    ("A registers, B K-major (v8 Q K^T, v9 K Q^T)", true),
    ("  the same, descriptor offsets swapped", false),
    ("A registers, B MN-major (v8 P V, v9 dv, dk)", true),
    ("  the same, descriptor offsets swapped", false),
    ("A MN-major shared, B MN-major (v9 dq)", true),
];

/// Runs the wgmma layout probe on `x`: for each of [`WGMMA_PROBE_MODES`], the largest error of
/// one m64n64k16 bf16 product against the exact one, relative to the largest exact entry.
fn wgmma_probe_on(x: &dyn Exec) -> Result<Vec<f64>> {
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
    wgmma_probe_on(&GpuExec::new(&cfg, 64, Dtype::Bf16)?)
}

/// Waits for every kernel queued so far (the kernels run on the legacy default stream).
pub fn synchronize() -> Result<()> {
    gpu()?.stream.synchronize().map_err(cuda_err)
}

/// Every architecture name the kernels are compiled for (CI compiles each kernel for each).
pub const ARCHES: [&str; 3] = ["compute_80", "compute_90", "compute_90a"];

#[cfg(test)]
mod tests {
    use super::*;

    /// What a benchmark labels a run with (`versions`) and what the launches run are the same
    /// functions; these are the rules they must keep whatever the next generation adds.
    #[test]
    fn versions_follow_the_device_and_the_strides() {
        for kernel in Kernel::ALL {
            for hd in [64, 128] {
                for dt in [Dtype::Bf16, Dtype::F16] {
                    for wgmma in [false, true] {
                        let f = forward_version(kernel, hd, dt, [true, true], wgmma).unwrap();
                        let b = backward_version(kernel, hd, dt, true, wgmma).unwrap();
                        // The warpgroup kernels run only where the module has them, and only when asked.
                        assert_eq!(f == 8, kernel == Kernel::TensorCoreV8 && wgmma, "{kernel:?} {hd} {wgmma}");
                        assert_eq!(b == 9, kernel == Kernel::TensorCoreV8 && wgmma && hd == 64);
                        // v5 (and its backwards v6, v7) exist at head dimension 64; v7 also at 128.
                        assert!(f != 5 || hd == 64);
                        assert!(b != 6 || hd == 64 || kernel == Kernel::TensorCoreV5);
                        // The default stays the measured generation until a GPU run says otherwise.
                        if kernel == Kernel::Auto {
                            assert_eq!((f, b), (3, 4));
                        }
                    }
                    // Unaligned rows: every explicitly requested tensor-core kernel is refused, the
                    // default falls back.
                    for wgmma in [false, true] {
                        let tc_only = !matches!(kernel, Kernel::Auto | Kernel::Simt);
                        assert_eq!(forward_version(kernel, hd, dt, [false, false], wgmma).is_err(), tc_only);
                        let asked = !matches!(kernel, Kernel::Auto | Kernel::Simt | Kernel::TensorCoreV2);
                        assert_eq!(backward_version(kernel, hd, dt, false, wgmma).is_err(), asked);
                    }
                    assert_eq!(forward_version(Kernel::Auto, hd, dt, [true, false], false).unwrap(), 2);
                }
            }
        }
        // The SIMT kernels in f32 (no tensor-core forward), whatever was asked.
        assert_eq!(forward_version(Kernel::Auto, 64, Dtype::F32, [false, false], true).unwrap(), 1);
        assert_eq!(backward_version(Kernel::Auto, 64, Dtype::F32, false, true).unwrap(), 1);
    }
}
