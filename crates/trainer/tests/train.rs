//! The training loop on synthetic data: the loss falls, resume is exact, bad resumes are refused, old
//! checkpoints are pruned, and multi-length evaluation scores the same tokens at every length.

use std::path::PathBuf;

use gpt_model::ModelConfig;
use gpt_model::config::AttnImpl;
use trainer::config::{DeviceChoice, TrainConfig};
use trainer::eval::{self, Rope};
use trainer::train::{self, MemorySource, RunOptions, Single};

/// A learnable stream: a noisy periodic sequence over a 64-token vocabulary (LCG noise, deterministic).
fn synthetic_tokens(n: usize, seed: u64) -> Vec<u16> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|i| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if (state >> 60) == 0 { ((state >> 33) % 64) as u16 } else { ((i * 7) % 23) as u16 }
        })
        .collect()
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lssa-trainer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn tiny_cfg(name: &str, attention: &str, steps: usize) -> TrainConfig {
    TrainConfig {
        model: ModelConfig {
            vocab_size: 64,
            context_len: 32,
            attention: attention.parse().unwrap(),
            attn_impl: AttnImpl::Fused,
            ..ModelConfig::preset("tiny").unwrap()
        },
        out_dir: out_dir(name),
        batch_size: 4,
        tokens_per_step: 2 * 4 * 32, // two micro-batches: gradient accumulation is exercised
        max_steps: steps,
        lr: 3e-3,
        warmup_steps: 5,
        eval_every: 10,
        eval_tokens: 2048,
        ckpt_every: 10,
        keep_last: 2,
        device: DeviceChoice::Cpu,
        ..TrainConfig::default()
    }
}

fn source(cfg: &TrainConfig) -> MemorySource {
    MemorySource::new(synthetic_tokens(40_000, 1), cfg.batch_size, cfg.model.context_len, 0, 1, "synthetic-64").unwrap()
}

#[test]
fn loss_falls_and_checkpoints_are_pruned() {
    let cfg = tiny_cfg("falls", "lssa+rw15", 40);
    let opts = RunOptions { val_tokens: synthetic_tokens(4096, 2), ..Default::default() };
    let run = train::train(&cfg, &mut source(&cfg), &Single, &opts).unwrap();
    assert_eq!(run.steps.len(), 40);
    let first = run.steps[0].loss;
    let last = run.steps.last().unwrap().loss;
    assert!((first - 64f64.ln()).abs() < 0.3, "initial loss {first} should be near ln(64)");
    assert!(last < first - 1.0, "loss must fall: {first} -> {last}");
    assert!(run.steps.last().unwrap().val_loss.unwrap() < first - 1.0);
    // ckpt_every 10 over 40 steps wrote 4; keep_last 2 keeps steps 30 and 40.
    let kept = train::list_checkpoints(&cfg.out_dir).unwrap();
    let names: Vec<_> = kept.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["ckpt_00000030.safetensors", "ckpt_00000040.safetensors"]);
    let lines = std::fs::read_to_string(cfg.out_dir.join("metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 40);
    assert!(std::fs::read_to_string(cfg.out_dir.join("config.toml")).unwrap().contains("lssa+rw15"));
    std::fs::remove_dir_all(&cfg.out_dir).unwrap();
}

#[test]
fn divergence_is_a_typed_error_with_a_marker_file() {
    // Unnormalised exp attention with an absurd learning rate overflows within a few steps.
    let cfg = TrainConfig { lr: 50.0, warmup_steps: 0, eval_every: 0, ..tiny_cfg("diverges", "exp-nonorm", 30) };
    let err = train::train(&cfg, &mut source(&cfg), &Single, &RunOptions::default()).unwrap_err();
    let d = err.downcast_ref::<train::Diverged>().unwrap_or_else(|| panic!("not a divergence: {err:#}"));
    assert!(!d.loss.is_finite() && d.step >= 1 && d.step < 30, "{d:?}");
    let marker: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cfg.out_dir.join(train::DIVERGED_FILE)).unwrap()).unwrap();
    assert_eq!(marker["step"], d.step);
    // A training that starts in the same directory removes the stale marker.
    let ok = TrainConfig { lr: 1e-3, max_steps: 2, ..cfg.clone() };
    train::train(&ok, &mut source(&ok), &Single, &RunOptions::default()).unwrap();
    assert!(!ok.out_dir.join(train::DIVERGED_FILE).exists());
    std::fs::remove_dir_all(&ok.out_dir).unwrap();
}

#[test]
fn resume_continues_exactly() {
    // 2N steps straight vs N, then a resume for N more: identical losses.
    let straight_cfg = tiny_cfg("straight", "lssa", 20);
    let straight = train::train(&straight_cfg, &mut source(&straight_cfg), &Single, &RunOptions::default()).unwrap();

    let half_cfg = TrainConfig { out_dir: out_dir("halves"), ..straight_cfg.clone() };
    let first = train::train(
        &TrainConfig { ckpt_every: 10, ..half_cfg.clone() },
        &mut source(&half_cfg),
        &Single,
        &RunOptions::default(),
    );
    // The first half is the same run stopped at step 10: train 20 steps but resume from the step-10 checkpoint.
    let first = first.unwrap();
    assert_eq!(first.steps.len(), 20);
    let ckpt10 = train::checkpoint_path(&half_cfg.out_dir, 10);
    let kept = train::list_checkpoints(&half_cfg.out_dir).unwrap();
    assert!(kept.contains(&ckpt10), "{kept:?}");
    let resumed_cfg = TrainConfig { out_dir: out_dir("resumed"), ..half_cfg.clone() };
    let resumed = train::train(
        &resumed_cfg,
        &mut source(&resumed_cfg),
        &Single,
        &RunOptions { resume: Some(ckpt10.clone()), ..Default::default() },
    )
    .unwrap();
    assert_eq!(resumed.steps.first().unwrap().step, 11);
    for (a, b) in straight.steps[10..].iter().zip(&resumed.steps) {
        assert_eq!(a.step, b.step);
        assert!((a.loss - b.loss).abs() < 1e-6, "step {}: straight {} vs resumed {}", a.step, a.loss, b.loss);
    }

    // Bad resumes: another world size, another tokenizer, another model.
    let err = train::train(
        &resumed_cfg,
        &mut MemorySource::new(synthetic_tokens(40_000, 1), 4, 32, 0, 1, "gpt2").unwrap(),
        &Single,
        &RunOptions { resume: Some(ckpt10.clone()), ..Default::default() },
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("tokenizer"), "{err:#}");
    let other = TrainConfig {
        model: ModelConfig { attention: "softmax".parse().unwrap(), ..resumed_cfg.model.clone() },
        ..resumed_cfg.clone()
    };
    let err = train::train(
        &other,
        &mut source(&other),
        &Single,
        &RunOptions { resume: Some(ckpt10.clone()), ..Default::default() },
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("attention"), "{err:#}");
    for d in [&straight_cfg.out_dir, &half_cfg.out_dir, &resumed_cfg.out_dir] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn multi_length_scores_the_same_tokens_at_every_length() {
    let cfg = tiny_cfg("eval", "lssa+rw15", 1);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let model = gpt_model::Gpt::new_seeded(&vs.root(), &cfg.model, 0).unwrap();
    let tokens = synthetic_tokens(16 * 32 * 2 + 50, 3);
    let res = eval::multi_length(&model, &tokens, &[1, 2, 4, 8, 16], Rope::Ntk, None, 4096, tch::Device::Cpu).unwrap();
    assert_eq!(res.len(), 5);
    for r in &res {
        assert_eq!(r.tokens, 16 * 32 * 2, "length {}", r.seq_len);
        assert_eq!(r.windows * r.seq_len, r.tokens);
        assert!((r.loss - 64f64.ln()).abs() < 0.3, "untrained model: loss {} near ln(64)", r.loss);
    }
    assert!(eval::multi_length(&model, &tokens[..100], &[16], Rope::Plain, None, 4096, tch::Device::Cpu).is_err());
}

#[test]
fn span_evaluation_keeps_windows_that_pair_across_lengths() {
    // T = 32; two spans of 4 x 32 + 1 tokens, scored at 1x, 2x and 4x with plain RoPE.
    let cfg = tiny_cfg("spans", "lssa+rw15", 1);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let model = gpt_model::Gpt::new_seeded(&vs.root(), &cfg.model, 0).unwrap();
    let t = cfg.model.context_len;
    let tokens = synthetic_tokens(2 * (4 * t + 1), 5);
    let spans: Vec<Vec<u16>> = tokens.chunks(4 * t + 1).map(<[u16]>::to_vec).collect();
    let cpu = tch::Device::Cpu;
    let res = eval::multi_length_spans(&model, &spans, &[1, 2, 4], 4, Rope::Plain, None, 4096, cpu).unwrap();
    let w: Vec<&eval::WindowLosses> = res.iter().map(|r| r.per_window.as_ref().unwrap()).collect();
    assert_eq!([w[0].first.len(), w[1].first.len(), w[2].first.len()], [8, 4, 2]);
    assert!(w[0].rest.is_empty() && w[0].tail.is_empty() && w[2].rest.len() == 2);
    for (r, w) in res.iter().zip(&w) {
        let m = r.multiple as f32;
        let mean =
            w.first.iter().zip(w.rest.iter().chain(std::iter::repeat(&0.0))).map(|(f, x)| (f + (m - 1.0) * x) / m);
        assert!((mean.sum::<f32>() / w.first.len() as f32 - r.loss as f32).abs() < 1e-4, "{}x", r.multiple);
        assert_eq!(r.tokens, 2 * 4 * t);
    }
    // The first T_train targets of a 4x window see exactly the context of the 1x window at its start
    // (causal attention, unscaled RoPE, row-wise ln N_i): windows 0 and 4 of 1x.
    for (i, j) in [(0, 0), (1, 4)] {
        assert!((w[2].first[i] - w[0].first[j]).abs() < 1e-4, "4x window {i} vs 1x window {j}");
    }
    // At 2x the last T_train targets are all the targets after the first T_train: tail = rest.
    assert_eq!(w[1].tail, w[1].rest);
    // Spans of another length, or a multiple that does not divide the span, are refused.
    assert!(eval::multi_length_spans(&model, &spans, &[3], 4, Rope::Plain, None, 4096, cpu).is_err());
    assert!(eval::multi_length_spans(&model, &spans[..1], &[1], 8, Rope::Plain, None, 4096, cpu).is_err());
}

#[test]
fn two_trainings_in_one_process_each_run_on_their_settings_and_leave_the_process_as_found() {
    // libtorch's thread count is the process's: each training holds its own while it runs and
    // restores what it found, so the second neither inherits the first's nor is refused for it.
    let found = tch::get_num_threads();
    for (name, threads) in [("first-of-two", found as usize + 1), ("second-of-two", found as usize + 2)] {
        let cfg = TrainConfig { threads, eval_every: 0, ..tiny_cfg(name, "lssa", 3) };
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let on_step =
            train::StepHook(std::sync::Arc::new(move |_| record.lock().unwrap().push(tch::get_num_threads())));
        let opts = RunOptions { on_step: Some(on_step), ..Default::default() };
        train::train(&cfg, &mut source(&cfg), &Single, &opts).unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![threads as i32; 3], "{name} ran on its own thread count");
        assert_eq!(tch::get_num_threads(), found, "{name} restored the count it found");
        std::fs::remove_dir_all(&cfg.out_dir).unwrap();
    }
}
