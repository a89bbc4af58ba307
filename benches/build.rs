//! Links this crate's tests and binaries against the project's libtorch (see `torch-build`).
fn main() {
    torch_build::link_libtorch();
}
