//! Quick throughput probe of the fused CPU kernels (GFLOP/s, FlashAttention convention):
//! `probe [T] [variant] [block_q] [block_k] [score_cache_bytes] [reweight_helper: 0 or 1] [heads, 12]`.
use std::time::Instant;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let t: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let name = args.get(2).cloned().unwrap_or("lssa".into());
    let v: attn_core::Variant = name.parse().unwrap();
    let bq: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let bk: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(64);
    let opts = attn_kernels::cpu::Options {
        tuning: attn_kernels::cpu::Tuning {
            block_q: bq,
            block_k: bk,
            score_cache_bytes: args.get(5).and_then(|s| s.parse().ok()).unwrap_or(16 << 20),
            reweight_helper: args.get(6).is_none_or(|s| s != "0"),
            ..Default::default()
        },
        ..Default::default()
    };
    let heads: usize = args.get(7).and_then(|s| s.parse().ok()).unwrap_or(12);
    let (q, k, val) = attn_core::fixtures::random_qkv::<f32>([1, heads, t, 64], 1);
    let flops = 4.0 * heads as f64 * (t * t) as f64 * 64.0 / 2.0;
    let _ = attn_kernels::cpu::forward_with(&v, &q, &k, &val, &opts).unwrap();
    let reps = 3;
    let s = Instant::now();
    for _ in 0..reps {
        let _ = attn_kernels::cpu::forward_with(&v, &q, &k, &val, &opts).unwrap();
    }
    let fwd = s.elapsed().as_secs_f64() / reps as f64;
    let s = Instant::now();
    let _ = attn_kernels::cpu::backward_with(&v, &q, &k, &val, &val, &opts).unwrap();
    let bwd = s.elapsed().as_secs_f64();
    println!(
        "{name} T={t}: fwd {:.1} ms ({:.1} GFLOP/s), fwd+bwd {:.1} ms ({:.1} GFLOP/s)",
        fwd * 1e3,
        flops / fwd / 1e9,
        bwd * 1e3,
        3.5 * flops / bwd / 1e9
    );
}
