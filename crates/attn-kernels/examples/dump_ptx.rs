//! Writes the PTX of one specialisation, for reading the compiler's resource report offline:
//! `cargo run -p attn-kernels --features lab --example dump_ptx -- lssa 64 bf16 out.ptx [compute_90a]`, then
//! `ptxas -arch=sm_90a -v out.ptx` (the architecture defaults to compute_90a, whose PTX has lab v8;
//! every generation of the lab is compiled).
use attn_kernels::cuda::{self, Dtype};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (variant, hd, dt, out) = (&a[1], a[2].parse().unwrap(), &a[3], &a[4]);
    let dt = match dt.as_str() {
        "f32" => Dtype::F32,
        "f16" => Dtype::F16,
        _ => Dtype::Bf16,
    };
    let arch = cuda::ARCHES.into_iter().find(|x| a.get(5).is_some_and(|y| y == x)).unwrap_or("compute_90a");
    let ptx = cuda::compile_ptx(&variant.parse().unwrap(), hd, dt, arch, cuda::Generation::Lab).unwrap();
    std::fs::write(out, ptx).unwrap();
}
