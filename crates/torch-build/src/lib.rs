//! Build-script helper shared by every crate whose binaries or tests link libtorch (through `tch`).
//!
//! `cargo:rustc-link-arg` does not propagate from `torch-sys` to its dependents, so each crate that
//! produces a linked artefact (binary, test, bench, example) calls [`link_libtorch`] from its own
//! `build.rs`. Doing it here, once, keeps the flags identical everywhere.
//!
//! What it adds to the link line, and why:
//!
//! - `-rpath <LIBTORCH>/lib`: cargo overrides `LD_LIBRARY_PATH` for `cargo run`/`cargo test`, so an
//!   environment variable cannot make the torch libraries findable; the rpath does.
//! - `-rpath /opt/torch/.venv/lib/python3.12/site-packages/torch/lib`: the GPU machine's torch, so a
//!   binary built here and carried there finds its libraries without any set-up.
//! - `--no-as-needed -ltorch_cuda -ltorch`: nothing in Rust references `libtorch_cuda` directly, so the
//!   default `--as-needed` drops it and CUDA then silently reports "unavailable" on GPU machines.
//!
//! This crate must never depend on anything: it is compiled for every build script that uses it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

use std::path::PathBuf;

/// Where the GPU machines keep torch (PyTorch 2.11 in a Python 3.12 venv). Absent paths in an rpath are
/// skipped by the dynamic loader, so this entry is harmless elsewhere.
pub const GPU_MACHINE_TORCH_LIB: &str = "/opt/torch/.venv/lib/python3.12/site-packages/torch/lib";

/// Emits the link arguments described in the crate docs. Call it from `build.rs` of any crate whose
/// tests or binaries link tch.
///
/// Panics (failing the build script with a readable message) when `LIBTORCH` is unset or does not
/// hold a libtorch, pointing the user to `cargo xtask setup`.
pub fn link_libtorch() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let lib = match torch_lib_dir() {
        Ok(lib) => lib,
        Err(msg) => panic!("{msg}"),
    };
    // Resolve the `.torch/libtorch` link so the rpath survives a fresh clone of the work tree.
    let lib = lib.canonicalize().unwrap_or(lib);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{GPU_MACHINE_TORCH_LIB}");
    println!("cargo:rustc-link-arg=-L{}", lib.display());
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,-ltorch,--as-needed");
}

/// The directory of the shims' shared header (`lssa_ffi_guard.h`: the error convention of every
/// `extern "C"` function of the workspace's C++), on [`cpp_settings`]' include path. A build script
/// that compiles a shim lists it in `cargo:rerun-if-changed`.
pub const FFI_INCLUDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/include");

/// Include directories and flags for C++ that uses libtorch's headers (the autograd bridge, the
/// c10d shim): `(include dirs, compiler flags)`, [`FFI_INCLUDE`] among the dirs. Hand them to `cc::Build`; tch already links
/// `torch_cpu` and `c10`.
///
/// Panics like [`link_libtorch`] when `LIBTORCH` holds no libtorch.
pub fn cpp_settings() -> (Vec<PathBuf>, Vec<&'static str>) {
    let lib = match torch_lib_dir() {
        Ok(lib) => lib,
        Err(msg) => panic!("{msg}"),
    };
    let root = lib.parent().expect("lib has a parent").to_path_buf();
    let root = root.canonicalize().unwrap_or(root);
    let include = root.join("include");
    let dirs = vec![include.join("torch/csrc/api/include"), include, PathBuf::from(FFI_INCLUDE)];
    // libtorch from PyPI is built with the C++11 ABI; C++17 is what its headers require.
    (dirs, vec!["-std=c++17", "-D_GLIBCXX_USE_CXX11_ABI=1", "-w"])
}

/// The `lib` directory of the libtorch named by `LIBTORCH`, checked to contain `libtorch_cpu.so`.
pub fn torch_lib_dir() -> Result<PathBuf, String> {
    let Some(root) = std::env::var_os("LIBTORCH") else {
        return Err("LIBTORCH is not set: run `cargo xtask setup` (it installs PyTorch 2.11.0 and links it)".into());
    };
    let lib = PathBuf::from(root).join("lib");
    if !lib.join("libtorch_cpu.so").exists() {
        return Err(format!(
            "no libtorch at {}: run `cargo xtask setup` to install PyTorch 2.11.0, or point LIBTORCH at one",
            lib.display()
        ));
    }
    Ok(lib)
}
