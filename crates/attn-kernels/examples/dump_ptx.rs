//! Writes the PTX of one specialisation, for reading the compiler's resource report offline:
//! `cargo run -p attn-kernels --example dump_ptx -- lssa 64 bf16 out.ptx`, then `ptxas -arch=sm_90 -v out.ptx`.
use attn_kernels::cuda::{self, Dtype};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (variant, hd, dt, out) = (&a[1], a[2].parse().unwrap(), &a[3], &a[4]);
    let dt = match dt.as_str() {
        "f32" => Dtype::F32,
        "f16" => Dtype::F16,
        _ => Dtype::Bf16,
    };
    let ptx = cuda::compile_ptx(&variant.parse().unwrap(), hd, dt, "compute_90").unwrap();
    std::fs::write(out, ptx).unwrap();
}
