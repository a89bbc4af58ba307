//! Compilation: the CUDA sources, one specialisation's source, NVRTC discovery and the PTX compile.

use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::nvrtc::{CompileOptions, Ptx};

#[cfg(feature = "lab")]
use attn_core::Variant;

use super::config::Config;
use crate::error::{Error, Result};
use crate::params::Dtype;

/// The CUDA sources of the kernels `Kernel::Auto` can launch, in the order they are concatenated:
/// the production files. The lab's kernels live in `lab/` ([`lab`]), compiled only with the `lab`
/// feature.
const COMMON_SRC: &str = include_str!("common.cuh");
/// SIMT kernels (lab v1), Auto's fallback.
const SIMT_SRC: &str = include_str!("v1_simt.cu");
/// Tensor-core forward (lab v2), Auto's fallback for rows that are not 16-byte aligned.
const MMA_SRC: &str = include_str!("v2_fwd.cu");
/// Tensor-core forward with cp.async and ldmatrix (lab v3): Auto's forward at head dimension 128.
const MMA3_SRC: &str = include_str!("v3_fwd.cu");
/// The tensor-core backward's tile helpers (first written for lab v4).
const BWD_TILES: &str = include_str!("bwd_tiles.cu");
/// Tensor-core forward, 2 x 16 rows per warp, log2-domain activations (lab v5): Auto's forward at
/// head dimension 64, its body shared with lab v8.
const V5_FWD: &str = include_str!("v5_fwd.cu");
/// Tensor-core backward, dq accumulated by the keys kernel (lab v7): Auto's backward, on the bodies
/// it shares with lab v6 and v9.
const V7_BWD: &str = include_str!("v7_bwd.cu");

/// The lab's own files (`src/cuda/lab/`): the kernels no `Kernel::Auto` module holds.
#[cfg(feature = "lab")]
pub mod lab {
    /// The warpgroup (`wgmma`) helpers of v8 and v9, placed before `v5_fwd.cu`.
    pub const WGMMA: &str = include_str!("lab/wgmma.cuh");
    /// The entry points: v3 away from head dimension 128, v4, v6, v8 (and the wgmma probe), v9, v10
    /// and its TMA probe.
    pub const KERNELS: [&str; 7] = [
        include_str!("lab/v3_fwd.cu"),
        include_str!("lab/v4_bwd.cu"),
        include_str!("lab/v6_bwd.cu"),
        include_str!("lab/v8_fwd.cu"),
        include_str!("lab/v9_bwd.cu"),
        include_str!("lab/v10_fwd.cu"),
        include_str!("lab/v10_probe.cu"),
    ];
}

/// The kernel files one compiled module holds: each [`Kernel`](super::Kernel) request compiles only the generations
/// it can select, so production (`Auto`) modules carry no lab kernel (see `LAB.md`). The generations
/// are cumulative: each holds the files of those before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Generation {
    /// `common.cuh` and `v1_simt.cu`: the inverse norms and lab v1.
    Simt,
    /// And `v2_fwd.cu`: lab v2.
    V2,
    /// And the rest of what [`Kernel::Auto`](super::Kernel::Auto) launches: `v3_fwd.cu` (v3's body;
    /// its kernel at head dimension 128), `bwd_tiles.cu`, `v5_fwd.cu` (v5) and `v7_bwd.cu` (v7):
    /// lab v7.
    First,
    /// And, with the `lab` feature, the files of `lab/`: v3 at head dimension 64, v4, v6, and where
    /// the PTX is sm_90a's (or emulated) the warpgroup helpers and kernels v8 and v9 and the wgmma
    /// probe: lab v3 to v6, v8 and v9. (Without the feature no request selects it.)
    Lab,
}

impl Generation {
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

/// Whether the tensor-core forward exists for this head dimension and dtype.
pub fn has_tensor_core_forward(head_dim: usize, dtype: Dtype) -> bool {
    dtype != Dtype::F32 && (head_dim == 64 || head_dim == 128)
}

/// The complete CUDA source of one specialisation: the files of `generation` (the tensor-core files
/// only where [`has_tensor_core_forward`]).
pub fn source(cfg: &Config, head_dim: usize, dtype: Dtype, generation: Generation) -> String {
    let mut s = format!(
        "#define ACT {}\n#define NORM {}\n#define RUNNING_MAX {}\n#define SIGNED {}\n#define COSINE {}\n#define P {}\n#define DTYPE {}\n#define HD {}\n",
        cfg.act.code,
        cfg.norm,
        cfg.running_max as u8,
        cfg.signed as u8,
        cfg.cosine as u8,
        cfg.p,
        dtype.code(),
        head_dim
    );
    // The activation's device code, from its one definition (`config.rs`).
    s.push_str(&format!("#define ACT_BODY {}\n#define ACT_GRAD_BODY {}\n", cfg.act.body, cfg.act.grad_body));
    // attn-core's constants, by name: the CUDA sources write none of them again.
    s.push_str(&format!(
        "#define L2_NORM_EPS {:e}f\n#define OFFSET_FREE_ROWS {}\n",
        attn_core::stage::L2_NORM_EPS as f32,
        attn_core::stage::OFFSET_FREE_ROWS
    ));
    s.push_str(COMMON_SRC);
    s.push_str(SIMT_SRC);
    if !has_tensor_core_forward(head_dim, dtype) {
        return s;
    }
    if generation >= Generation::V2 {
        s.push_str(MMA_SRC);
    }
    if generation >= Generation::First {
        // What `Kernel::Auto` launches, and no lab kernel: v3's forward at d = 128, v5's at 64, v7.
        s.push_str(MMA3_SRC);
        s.push_str(BWD_TILES);
        #[cfg(feature = "lab")]
        if generation == Generation::Lab {
            s.push_str(lab::WGMMA);
        }
        s.push_str(V5_FWD);
        s.push_str(V7_BWD);
    }
    #[cfg(feature = "lab")]
    if generation == Generation::Lab {
        lab::KERNELS.iter().for_each(|k| s.push_str(k));
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

/// Compiles one specialisation's `generation` to PTX for `arch` (e.g. `"compute_90"`); needs NVRTC
/// only, no GPU. The test suite calls this for every fused variant, so a kernel that does not
/// compile fails CI.
#[cfg(feature = "lab")]
pub fn compile_ptx(
    variant: &Variant,
    head_dim: usize,
    dtype: Dtype,
    arch: &'static str,
    generation: Generation,
) -> Result<String> {
    let cfg = Config::new(variant, head_dim)?;
    Ok(compile(&cfg, head_dim, dtype, arch, generation)?.to_src())
}

/// One specialisation's PTX: from the on-disk cache ([`ptx_cache`](super::ptx_cache)) when it holds
/// it, else from NVRTC (then cached).
pub(super) fn compile(
    cfg: &Config,
    head_dim: usize,
    dtype: Dtype,
    arch: &'static str,
    generation: Generation,
) -> Result<Ptx> {
    compile_in(cfg, head_dim, dtype, arch, generation, super::ptx_cache::dir().as_deref())
}

/// [`compile`] with the cache in `cache` (`None`: no cache).
fn compile_in(
    cfg: &Config,
    head_dim: usize,
    dtype: Dtype,
    arch: &'static str,
    generation: Generation,
    cache: Option<&std::path::Path>,
) -> Result<Ptx> {
    use super::ptx_cache;
    preload_nvrtc()?;
    let key = cfg.key(head_dim, dtype, generation.name());
    let options: Vec<String> = vec!["--std=c++17".into(), "-lineinfo".into()];
    let src = source(cfg, head_dim, dtype, generation);
    let cached = cache.map(|dir| {
        let version = nvrtc_version();
        let h = ptx_cache::hash(&[src.as_bytes(), arch.as_bytes(), options.join(" ").as_bytes(), version.as_bytes()]);
        (ptx_cache::path(dir, &key, h), h)
    });
    if let Some(ptx) = cached.as_ref().and_then(|(path, h)| ptx_cache::read(path, *h)) {
        return Ok(Ptx::from_src(ptx));
    }
    let opts = CompileOptions { arch: Some(arch), options, name: Some(format!("lssa-{key}.cu")), ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(src, opts)
        .map_err(|e| Error::Cuda(format!("NVRTC failed on {key}: {e:?}")))?;
    if let Some((path, h)) = &cached {
        ptx_cache::write(path, *h, &ptx.to_src());
    }
    Ok(ptx)
}

/// NVRTC's version, as "major.minor" (a part of the cache's hash: another NVRTC may emit other PTX).
fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (preload_nvrtc); the call writes two ints it is given pointers to.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        format!("{major}.{minor}")
    } else {
        format!("unknown ({r:?})")
    }
}

/// The NVRTC architecture name for a compute capability (PTX, so newer GPUs JIT it).
pub(super) fn arch_name(major: i32, minor: i32) -> Result<&'static str> {
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
pub(super) fn has_wgmma(arch: &str) -> bool {
    arch == "compute_90a"
}

/// Every architecture name the kernels are compiled for (CI compiles each kernel for each).
#[cfg(feature = "lab")]
pub const ARCHES: [&str; 3] = ["compute_80", "compute_90", "compute_90a"];

#[cfg(test)]
mod tests {
    use super::super::ptx_cache;
    use super::*;

    /// NVRTC is there, or the test says why it did nothing (CI sets LSSA_REQUIRE_NVRTC: it must be).
    fn nvrtc() -> bool {
        match preload_nvrtc() {
            Ok(_) => true,
            Err(e) if std::env::var_os("LSSA_REQUIRE_NVRTC").is_none() => {
                eprintln!("SKIPPED: {e}");
                false
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_second_compile_reads_the_cache_and_a_damaged_entry_is_compiled_again() {
        if !nvrtc() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("lssa-compile-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = Config::new(&"lssa".parse().unwrap(), 64).unwrap();
        let run = || compile_in(&cfg, 64, Dtype::Bf16, "compute_80", Generation::Simt, Some(&dir)).unwrap().to_src();
        let fresh = run();
        assert!(fresh.contains(".entry lssa_fwd_simt"), "NVRTC's PTX");
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(files.len(), 1, "one module, one file: {files:?}");
        let file = &files[0];
        let stem = file.file_stem().unwrap().to_str().unwrap();
        let h = u128::from_str_radix(stem.rsplit('-').next().unwrap(), 16).unwrap();
        assert_eq!(ptx_cache::read(file, h).as_deref(), Some(fresh.as_str()), "what NVRTC made is what was stored");
        // A second compile takes the file, not NVRTC: plant another body under the same hash.
        ptx_cache::write(file, h, "// planted\n");
        assert_eq!(run(), "// planted\n");
        // A damaged file (its header's length no longer matches) is compiled again and replaced.
        std::fs::write(file, std::fs::read_to_string(file).unwrap() + "tail").unwrap();
        assert_eq!(run(), fresh);
        assert_eq!(ptx_cache::read(file, h).as_deref(), Some(fresh.as_str()));
        // Another architecture is another hash, so another file.
        compile_in(&cfg, 64, Dtype::Bf16, "compute_90", Generation::Simt, Some(&dir)).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
