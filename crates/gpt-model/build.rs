//! Links this crate's tests and binaries against the project's libtorch (see `torch-build`) and
//! compiles the C++ autograd bridge of the fused attention (`csrc/fused_attention.cpp`) the fused
//! cross-entropy (`csrc/fused_loss.cpp`), the fused RoPE head split (`csrc/fused_rope.cpp`) and the
//! linear layers on AMX tiles (`csrc/fused_linear.cpp`).
fn main() {
    torch_build::link_libtorch();
    let (includes, flags) = torch_build::cpp_settings();
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/fused_attention.cpp")
        .file("csrc/fused_loss.cpp")
        .file("csrc/fused_rope.cpp")
        .file("csrc/fused_linear.cpp")
        .includes(&includes)
        .warnings(false);
    for flag in flags {
        build.flag(flag);
    }
    build.compile("gpt_model_bridge");
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-changed={}", torch_build::FFI_INCLUDE);
}
