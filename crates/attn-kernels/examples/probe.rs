//! Quick throughput probe of the fused CPU kernels (GFLOP/s, FlashAttention convention).
use std::time::Instant;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let t: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let name = args.get(2).cloned().unwrap_or("lssa".into());
    let v: attn_core::Variant = name.parse().unwrap();
    let (q, k, val) = attn_core::fixtures::random_qkv::<f32>([1, 12, t, 64], 1);
    let flops = 4.0 * 12.0 * (t * t) as f64 * 64.0 / 2.0;
    let _ = attn_kernels::cpu::forward(&v, &q, &k, &val).unwrap();
    let reps = 3;
    let s = Instant::now();
    for _ in 0..reps {
        let _ = attn_kernels::cpu::forward(&v, &q, &k, &val).unwrap();
    }
    let fwd = s.elapsed().as_secs_f64() / reps as f64;
    let s = Instant::now();
    let _ = attn_kernels::cpu::backward(&v, &q, &k, &val, &val).unwrap();
    let bwd = s.elapsed().as_secs_f64();
    println!(
        "{name} T={t}: fwd {:.1} ms ({:.1} GFLOP/s), fwd+bwd {:.1} ms ({:.1} GFLOP/s)",
        fwd * 1e3,
        flops / fwd / 1e9,
        bwd * 1e3,
        3.5 * flops / bwd / 1e9
    );
}
