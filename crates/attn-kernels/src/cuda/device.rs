//! Devices and contexts: the CUDA devices, each one's primary context and stream, the device of a
//! call, the module cache, [`GpuExec`] (the kernels' launches on a GPU), and the raw entry points
//! and [`versions`], which run on a GPU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use attn_core::Variant;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

use super::compile::{Generation, has_tensor_core_forward};
use super::compile::{arch_name, compile, has_wgmma};
use super::config::Config;
use super::kernel::Kernel;
use super::launch::{Buf, Exec, backward_exec, check_params, forward_exec};
use super::plan::{KParams, KParams10, Kern, TmaDesc, TmaSpec, backward_version, forward_version, not_compiled};
use crate::error::{Error, Result};
use crate::params::Dtype;
use crate::params::Params;

/// One compiled specialisation on a GPU.
pub(super) struct Module {
    _module: Arc<CudaModule>,
    pub(super) functions: HashMap<Kern, CudaFunction>,
    /// Compiled for sm_90a, with the warpgroup kernels (lab v8, v9).
    pub(super) wgmma: bool,
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
pub(super) fn on_device<T>(ordinal: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
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
pub(super) fn device_for(p: &Params) -> Result<usize> {
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
        keep_pool_memory(&ctx);
        Ok(Gpu { ctx, stream, arch, cache: Mutex::new(HashMap::new()) })
    })
    .as_ref()
    .map_err(|e| Error::Cuda(e.clone()))
}

/// Workspaces are reused across calls: cudarc allocates them with `cuMemAllocAsync` from the
/// device's default memory pool, and this keeps the pool's freed memory (release threshold: never)
/// instead of returning it to the driver at every synchronisation, so after the first call a
/// call's workspaces come from the pool without a driver allocation. Best effort: where the driver
/// has no memory pools, allocation works as before.
fn keep_pool_memory(ctx: &CudaContext) {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: `pool` and `threshold` are valid for the calls; the attribute takes a u64.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS {
            let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
            let _ = sys::cuMemPoolSetAttribute(pool, attr, (&mut threshold as *mut u64).cast());
        }
    }
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

pub(super) fn cuda_err(e: impl std::fmt::Debug) -> Error {
    Error::Cuda(format!("{e:?}"))
}

/// The driver's JIT info log (verbose) for one specialisation's `generation` compiled for this
/// thread's GPU: where ptxas says it serialised `wgmma` (C7515 and kin) or spilled. The module is
/// loaded once more for the log and unloaded; the cached module is untouched.
#[cfg(feature = "lab")]
pub(super) fn jit_info_log(cfg: &Config, head_dim: usize, dtype: Dtype, generation: Generation) -> Result<String> {
    use cudarc::driver::sys;
    use std::ffi::c_void;
    let g = gpu()?;
    g.ctx.bind_to_thread().map_err(cuda_err)?;
    let ptx = compile(cfg, head_dim, dtype, g.arch, generation)?;
    let image = std::ffi::CString::new(ptx.to_src()).map_err(|e| Error::Cuda(format!("PTX with a NUL: {e}")))?;
    let mut log = vec![0u8; 1 << 20];
    let mut opts = [
        sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        sys::CUjit_option::CU_JIT_LOG_VERBOSE,
    ];
    // Scalar option values travel in the pointer slots themselves, as the driver API specifies.
    let scalar = std::ptr::without_provenance_mut::<c_void>;
    let mut values: [*mut c_void; 3] = [log.as_mut_ptr().cast(), scalar(log.len()), scalar(1)];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `image` is a NUL-terminated PTX string; `opts` and `values` have the length passed and
    // `log` outlives the call; the module is unloaded below.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            image.as_ptr().cast(),
            opts.len() as u32,
            opts.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(log.len())]).into_owned();
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::Cuda(format!("cuModuleLoadDataEx: {r:?}\n{text}")));
    }
    // SAFETY: `module` was loaded above and nothing else holds it.
    let _ = unsafe { sys::cuModuleUnload(module) };
    Ok(text)
}

/// The module of one specialisation's `generation` on this thread's GPU, compiled at first use.
pub(super) fn module(cfg: &Config, head_dim: usize, dtype: Dtype, generation: Generation) -> Result<Arc<Module>> {
    let g = gpu()?;
    let key = cfg.key(head_dim, dtype, generation.name());
    if let Some(m) = g.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(Arc::clone(m));
    }
    let load = |arch: &'static str| -> Result<Module> {
        let ptx = compile(cfg, head_dim, dtype, arch, generation)?;
        let module = g.ctx.load_module(ptx).map_err(cuda_err)?;
        let wgmma = has_wgmma(arch);
        let mut functions = HashMap::new();
        for k in Kern::present(head_dim, dtype, wgmma, generation) {
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

fn with_smem(f: CudaFunction, bytes: usize) -> Result<CudaFunction> {
    f.set_attribute(
        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .map_err(cuda_err)?;
    Ok(f)
}

/// The kernels of one specialisation on this thread's GPU.
pub(super) struct GpuExec {
    gpu: &'static Gpu,
    module: Arc<Module>,
    head_dim: usize,
    dtype: Dtype,
}

impl GpuExec {
    pub(super) fn new(cfg: &Config, head_dim: usize, dtype: Dtype, generation: Generation) -> Result<Self> {
        Ok(Self { gpu: gpu()?, module: module(cfg, head_dim, dtype, generation)?, head_dim, dtype })
    }

    fn device(&self, mem: cudarc::driver::CudaSlice<u8>) -> Buf {
        let (addr, sync) = cudarc::driver::DevicePtr::device_ptr(&mem, &self.gpu.stream);
        drop(sync);
        Buf::Device { mem, addr }
    }
}

impl GpuExec {
    /// Queues kernel `k` with its one argument `args`.
    fn launch_with<T: DeviceRepr>(&self, k: Kern, grid: (u32, u32), args: &T) -> Result<()> {
        let f = self.module.functions.get(&k).ok_or_else(|| not_compiled(k))?;
        let smem = k.smem(self.head_dim) as u32;
        let cfg = LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (k.threads(self.head_dim), 1, 1),
            shared_mem_bytes: smem,
        };
        let mut b = self.gpu.stream.launch_builder(f);
        b.arg(args);
        // SAFETY: the kernel reads and writes only through the pointers in `args`, whose validity the
        // raw entry points' callers guarantee; `args` is copied at launch.
        unsafe { b.launch(cfg) }.map_err(cuda_err)?;
        Ok(())
    }
}

impl Exec for GpuExec {
    fn launch(&self, k: Kern, grid: (u32, u32), kp: &KParams) -> Result<()> {
        k.check_argument(false)?;
        self.launch_with(k, grid, kp)
    }

    fn launch_tma(&self, k: Kern, grid: (u32, u32), args: &KParams10) -> Result<()> {
        k.check_argument(true)?;
        self.launch_with(k, grid, args)
    }

    fn zeros(&self, bytes: usize) -> Result<Buf> {
        Ok(self.device(self.gpu.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(cuda_err)?))
    }

    fn scratch(&self, bytes: usize) -> Result<Buf> {
        // SAFETY: u8 has no invalid bit patterns, and the kernels write these bytes before reading them.
        Ok(self.device(unsafe { self.gpu.stream.alloc::<u8>(bytes.max(1)) }.map_err(cuda_err)?))
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

    fn tensor_map(&self, spec: &TmaSpec) -> Result<TmaDesc> {
        use cudarc::driver::sys;
        let data_type = match self.dtype {
            Dtype::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            Dtype::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            Dtype::F32 => return Err(Error::Cuda("lab v10 reads 16-bit values only".into())),
        };
        let swizzle = match spec.swizzle {
            128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            s => return Err(Error::Cuda(format!("lab v10's tiles use the 128-byte swizzle, not {s}"))),
        };
        // (The strides are multiples of 16 bytes: rows_aligned16.)
        let ones = [1u32; 4];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: every pointer addresses a live local of the length the rank (4) implies; the
        // driver only reads them and writes `map`.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                data_type,
                4,
                spec.base as *mut std::ffi::c_void,
                spec.dims.as_ptr(),
                spec.strides.as_ptr(),
                spec.boxes.as_ptr(),
                ones.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .map_err(cuda_err)?;
        Ok(TmaDesc(map.opaque))
    }
}

/// Waits for every kernel queued so far (the kernels run on the legacy default stream).
pub fn synchronize() -> Result<()> {
    gpu()?.stream.synchronize().map_err(cuda_err)
}

/// Fused forward on device memory: writes `o` and the row statistics. `kernel` picks the forward.
///
/// # Safety
/// As [`crate::cpu::forward_raw`], with device pointers holding `dtype` elements (`p.dtype`, which
/// must be `dtype`); `stats` holds f32. Work is queued on the legacy default stream
/// of the GPU holding `q` and not waited for.
pub unsafe fn forward_raw(variant: &Variant, p: &Params, dtype: Dtype, kernel: Kernel) -> Result<()> {
    same_dtype(p, dtype)?;
    check_params(p)?;
    // SAFETY: forwarded from our caller.
    unsafe { on_gpu(&Config::new(variant, p.head_dim)?, p, dtype, kernel, forward_exec) }
}

/// [`forward_raw`] of a variant already resolved for `p.head_dim` ([`Kernels::prepared`](crate::Kernels::prepared)).
///
/// # Safety
/// As [`forward_raw`].
pub(crate) unsafe fn forward_configured(cfg: &Config, p: &Params, dtype: Dtype, kernel: Kernel) -> Result<()> {
    same_dtype(p, dtype)?;
    check_params(p)?;
    // SAFETY: forwarded from our caller.
    unsafe { on_gpu(cfg, p, dtype, kernel, forward_exec) }
}

/// Fused backward on device memory: reads `q`, `k`, `v`, `o`, `stats`, `d_out`; writes `dq`, `dk`,
/// `dv`. `kernel`: [`Kernel::Auto`] runs the tensor-core backward (lab v7) where it applies
/// (f16/bf16, d 64 or 128, 16-byte aligned rows), else the SIMT one (v1); a lab request runs the
/// backward of its pair (see [`Kernel`]).
///
/// # Safety
/// As [`forward_raw`], for every pointer of `p`.
pub unsafe fn backward_raw(variant: &Variant, p: &Params, dtype: Dtype, kernel: Kernel) -> Result<()> {
    same_dtype(p, dtype)?;
    check_params(p)?;
    // SAFETY: forwarded from our caller.
    unsafe { on_gpu(&Config::new(variant, p.head_dim)?, p, dtype, kernel, backward_exec) }
}

/// [`backward_raw`] of a variant already resolved for `p.head_dim` ([`Kernels::prepared`](crate::Kernels::prepared)).
///
/// # Safety
/// As [`backward_raw`].
pub(crate) unsafe fn backward_configured(cfg: &Config, p: &Params, dtype: Dtype, kernel: Kernel) -> Result<()> {
    same_dtype(p, dtype)?;
    check_params(p)?;
    // SAFETY: forwarded from our caller.
    unsafe { on_gpu(cfg, p, dtype, kernel, backward_exec) }
}

/// The host logic of one direction ([`forward_exec`] or [`backward_exec`]).
type HostEntry = unsafe fn(&dyn Exec, &Config, &Params, Dtype, Kernel) -> Result<()>;

/// Runs `entry` on the GPU holding `p`'s tensors, in the module of `kernel`'s generation for `cfg`.
///
/// # Safety
/// As [`forward_raw`] or [`backward_raw`], whichever `entry` is.
unsafe fn on_gpu(cfg: &Config, p: &Params, dtype: Dtype, kernel: Kernel, entry: HostEntry) -> Result<()> {
    on_device(device_for(p)?, || {
        let x = GpuExec::new(cfg, p.head_dim, dtype, kernel.generation())?;
        // SAFETY: forwarded from our caller.
        unsafe { entry(&x, cfg, p, dtype, kernel) }
    })
}

/// The call's dtype is the one the parameters say their tensors hold.
fn same_dtype(p: &Params, dtype: Dtype) -> Result<()> {
    if p.dtype == dtype {
        Ok(())
    } else {
        Err(Error::BadParams(format!("the tensors hold {:?} but the call asks for {dtype:?}", p.dtype)))
    }
}

/// The lab versions, `(forward, backward)`, that `kernel` runs on this thread's GPU for `variant` at
/// `head_dim` in `dtype` with contiguous inputs: what a benchmark of `kernel` measures (on other
/// devices than sm_90, for instance, the lab's v8 request runs v5 + v7).
pub fn versions(variant: &Variant, head_dim: usize, dtype: Dtype, kernel: Kernel) -> Result<(u32, u32)> {
    let cfg = Config::new(variant, head_dim)?;
    let wgmma = module(&cfg, head_dim, dtype, kernel.generation())?.wgmma;
    let tc = has_tensor_core_forward(head_dim, dtype);
    Ok((
        forward_version(kernel, head_dim, dtype, [tc, tc], wgmma)?.number(),
        backward_version(kernel, head_dim, dtype, tc, wgmma)?.number(),
    ))
}
