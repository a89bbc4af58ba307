//! The FlexAttention baseline (`benches/flex_lssa.py`) computes exactly what attn-core computes, so
//! its timings in the benchmarks compare like with like. Eager FlexAttention in f64 on the CPU
//! (forward only: PyTorch 2.11's FlexAttention has no CPU backward).
//!
//! Needs a Python with torch: `cargo xtask test` has made one and sets `LSSA_REQUIRE_TORCH_PYTHON`,
//! so there a missing interpreter fails the test; elsewhere it is skipped with a message.

use std::path::Path;

use attn_core::Variant;
use attn_core::fixtures::{max_abs, max_abs_diff, random_qkv};
use lssa_benches::flex;
use ndarray::Array4;

fn write(path: &Path, a: &Array4<f64>) {
    let bytes: Vec<u8> = a.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

fn read(path: &Path, shape: [usize; 4]) -> Array4<f64> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let values: Vec<f64> = bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
    Array4::from_shape_vec(shape, values).unwrap()
}

#[test]
fn flex_attention_lssa_and_lssar_match_attn_core() {
    // Two batches and heads (the log-sum-exp is indexed by both), a length past the first rows'
    // special cases and not a multiple of FlexAttention's 128-wide blocks, the paper's head dim.
    let shape = [2, 2, 150, 64];
    let (q, k, v) = random_qkv::<f64>(shape, 11);
    let dir = tempfile::tempdir().unwrap();
    for (name, a) in [("q", &q), ("k", &k), ("v", &v)] {
        write(&dir.path().join(format!("{name}.f64")), a);
    }
    let meta = serde_json::json!({"shape": shape, "p": [1, 3, 15]});
    std::fs::write(dir.path().join("meta.json"), meta.to_string()).unwrap();
    if let Err(e) = flex::check(dir.path()) {
        if std::env::var_os("LSSA_REQUIRE_TORCH_PYTHON").is_some() {
            panic!("{e:#}");
        }
        eprintln!("skipped: no Python with torch 2.11 ({e:#})");
        return;
    }
    for (file, variant) in
        [("lssa", "lssa"), ("lssa_rw1", "lssa+rw1"), ("lssa_rw3", "lssa+rw3"), ("lssa_rw15", "lssa+rw15")]
    {
        let variant: Variant = variant.parse().unwrap();
        let want = attn_core::forward(&variant, &q, &k, &v).unwrap();
        let got = read(&dir.path().join(format!("{file}.f64")), shape);
        let err = max_abs_diff(&got, &want) / max_abs(&want);
        assert!(err < 1e-10, "{variant}: FlexAttention differs from attn-core by {err:e} (relative to max |y|)");
    }
}

#[test]
fn the_compiled_speed_path_is_correct_and_pairs_its_cells_by_round() {
    // The path the benchmarks time: torch.compile'd FlexAttention, with SDPA in the same rounds.
    let req = flex::SpeedRequest {
        device: "cpu".into(),
        dtype: "f32".into(),
        head_dim: 64,
        heads: 2,
        lengths: vec![200],
        batch: 1,
        tokens: 0,
        threads: 2,
        reps: 3,
        min_reps: 3,
        budget_s: 0.0,
        lead_in_below_s: 1.0,
        backward: false,
        sdpa: true,
    };
    let rows = match flex::speed(&req) {
        Ok(rows) => rows,
        Err(e) if std::env::var_os("LSSA_REQUIRE_TORCH_PYTHON").is_none() => {
            eprintln!("skipped: no Python with torch 2.11 ({e:#})");
            return;
        }
        Err(e) => panic!("{e:#}"),
    };
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!((row.t, row.b), (200, 1));
    // A zero budget still gives every cell min_reps rounds, and no more than reps.
    for cell in [flex::LSSA_FWD, flex::SDPA_FWD] {
        assert_eq!(row.samples_ms.get(cell).map(Vec::len), Some(3), "{cell}: {row:?}");
    }
    let ratio = row.time_vs_sdpa(flex::LSSA_FWD).expect("paired with SDPA");
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}");
    // The compiled LSSA agrees with the materialised f32 formula (rounding only).
    let err = row.rel_err_vs_materialised.expect("checked at the first length");
    assert!(err < 1e-5, "compiled FlexAttention LSSA differs from the materialised formula by {err:e}");
    // LSSAR either ran or says why not (PyTorch 2.11 compiles no `return_lse` on the CPU).
    assert!(row.samples_ms.contains_key(flex::LSSAR15_FWD) || row.errors.contains_key(flex::LSSAR15_FWD));
}
