//! Links this crate's tests and binaries against the project's libtorch (see `torch-build`) and
//! compiles the c10d shim (`csrc/dist_shim.cpp`) and the optimiser shim (`csrc/optim_shim.cpp`): Gloo always, NCCL when its headers are present.
//!
//! NCCL is a compile-time option decided here, not a cargo feature, so `--all-features` still builds
//! on a machine without the CUDA headers. `LSSA_NCCL` chooses: `0` never, `1` always (the build fails
//! naming the missing header), unset: when every header below is found. The headers come from the
//! torch venv (`nvidia/cu13/include`, `nvidia/nccl/include`; the header wheels `nvidia-cuda-crt` and
//! `nvidia-cuda-cccl` add `crt/` and `cccl/` there) or from the directories listed in
//! `LSSA_CUDA_INCLUDE` (`:`-separated). Without NCCL, a collective on a CUDA tensor returns a
//! "built without NCCL" error; `trainer::dist::ProcessGroup::has_nccl()` says which build this is.
use std::path::{Path, PathBuf};

/// Headers the NCCL process group's header pulls in, one per source of them.
const NCCL_HEADERS: [&str; 4] = [
    "cuda_runtime_api.h",   // the CUDA runtime (nvidia/cu13/include)
    "crt/host_defines.h",   // nvidia-cuda-crt
    "cuda/std/type_traits", // nvidia-cuda-cccl
    "nccl.h",               // nvidia/nccl/include
];

fn main() {
    torch_build::link_libtorch();
    let (includes, flags) = torch_build::cpp_settings();
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/dist_shim.cpp")
        .file("csrc/optim_shim.cpp")
        .includes(&includes)
        .include("csrc/gloo-decl")
        .define("USE_C10D_GLOO", None)
        .warnings(false);
    for flag in flags {
        build.flag(flag);
    }

    println!("cargo::rustc-check-cfg=cfg(trainer_nccl)");
    if let Some(dirs) = nccl_include_dirs() {
        build.includes(&dirs).define("USE_C10D_NCCL", None).define("USE_CUDA", None).define("LSSA_DIST_NCCL", None);
        println!("cargo:rustc-cfg=trainer_nccl");
    }
    build.compile("trainer_dist_shim");

    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-changed={}", torch_build::FFI_INCLUDE);
    println!("cargo:rerun-if-env-changed=LSSA_NCCL");
    println!("cargo:rerun-if-env-changed=LSSA_CUDA_INCLUDE");
}

/// The include directories for the NCCL build, or `None` to build without NCCL (see the crate docs).
fn nccl_include_dirs() -> Option<Vec<PathBuf>> {
    let mode = std::env::var("LSSA_NCCL").unwrap_or_default();
    if mode == "0" {
        return None;
    }
    let mut candidates = Vec::new();
    if let Ok(lib) = torch_build::torch_lib_dir() {
        let lib = lib.canonicalize().unwrap_or(lib);
        // <site-packages>/torch/lib -> <site-packages>/nvidia
        if let Some(site) = lib.parent().and_then(Path::parent) {
            let nvidia = site.join("nvidia");
            candidates.push(nvidia.join("cu13/include"));
            candidates.push(nvidia.join("cu13/include/cccl"));
            candidates.push(nvidia.join("nccl/include"));
        }
    }
    for dir in std::env::var("LSSA_CUDA_INCLUDE").unwrap_or_default().split(':').filter(|d| !d.is_empty()) {
        candidates.push(PathBuf::from(dir));
        candidates.push(PathBuf::from(dir).join("cccl"));
    }
    let mut dirs = Vec::new();
    for header in NCCL_HEADERS {
        match candidates.iter().find(|dir| dir.join(header).exists()) {
            Some(dir) => {
                if !dirs.contains(dir) {
                    dirs.push(dir.clone());
                }
            }
            None if mode == "1" => panic!(
                "LSSA_NCCL=1 but `{header}` is in none of {candidates:?}: install the header wheels \
                 (`pip install nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85` into the torch venv) \
                 or list their directories in LSSA_CUDA_INCLUDE"
            ),
            None => return None,
        }
    }
    Some(dirs)
}
