//! Batched generation with per-row generators (`Gpt::generate_batch`) and the read-once checkpoint
//! (`checkpoint::Checkpoint`: header-only metadata, weights-only export).

use std::collections::HashMap;

use gpt_model::checkpoint::{self, Checkpoint, CheckpointError, WEIGHTS_KIND};
use gpt_model::config::{AttnImpl, ModelConfig};
use gpt_model::model::{ForwardOptions, GenerateOptions, Gpt, Sampling};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

fn tiny(attention: &str) -> ModelConfig {
    ModelConfig {
        attention: attention.parse().unwrap(),
        attn_impl: AttnImpl::Reference,
        vocab_size: 64,
        context_len: 32,
        ..ModelConfig::preset("tiny").unwrap()
    }
}

fn build(cfg: &ModelConfig, seed: i64) -> (VarStore, Gpt) {
    let mut vs = VarStore::new(Device::Cpu);
    let model = Gpt::new_seeded(&vs.root(), cfg, seed).unwrap();
    vs.set_kind(Kind::Double); // rows of a batch then agree with their own runs to ~1e-15
    (vs, model)
}

fn opts(sampling: Sampling, max_new: usize) -> GenerateOptions {
    GenerateOptions { max_new, sampling, stop: Vec::new(), forward: ForwardOptions::default() }
}

fn sampled(temperature: f64) -> Sampling {
    Sampling { temperature, top_k: None, top_p: None }
}

#[test]
fn greedy_batches_equal_single_runs_and_the_old_generate() {
    for attention in ["lssa+rw15", "softmax"] {
        let (_vs, model) = build(&tiny(attention), 3);
        let prompts: Vec<Vec<i64>> = vec![vec![1, 2, 3, 4], vec![9, 8, 7, 6], vec![5, 5, 5, 5]];
        let o = opts(Sampling::greedy(), 10);
        let batch = model.generate_batch(&prompts, &[0, 1, 2], &o).unwrap();
        for (p, g) in prompts.iter().zip(&batch) {
            assert_eq!(g.tokens.len(), 10);
            assert!(!g.stopped);
            assert_eq!(&model.generate_batch(std::slice::from_ref(p), &[7], &o).unwrap()[0], g, "{attention}");
            let old = model.generate(p, 10, None, &ForwardOptions::default()).unwrap();
            assert_eq!(&old[p.len()..], &g.tokens[..], "{attention}: generate_batch's greedy is generate's");
        }
    }
}

#[test]
fn sampling_is_a_function_of_the_seed_and_the_row_alone() {
    let (_vs, model) = build(&tiny("lssa+rw15"), 4);
    let p = vec![vec![1, 2, 3]];
    let o = opts(sampled(1.0), 20);
    let run = |seed: u64| model.generate_batch(&p, &[seed], &o).unwrap().remove(0).tokens;
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
    // In a batch, a row draws the same tokens as alone with its seed.
    let prompts = vec![vec![1, 2, 3], vec![4, 5, 6], vec![1, 2, 3]];
    let batch = model.generate_batch(&prompts, &[6, 11, 5], &o).unwrap();
    assert_eq!(batch[0].tokens, run(6));
    assert_eq!(batch[2].tokens, run(5));
    // top-k 1 and a tiny top-p are greedy.
    let greedy = model.generate_batch(&p, &[0], &opts(Sampling::greedy(), 20)).unwrap();
    for s in [Sampling { top_k: Some(1), ..sampled(1.0) }, Sampling { top_p: Some(1e-9), ..sampled(2.0) }] {
        assert_eq!(model.generate_batch(&p, &[9], &opts(s.clone(), 20)).unwrap(), greedy, "{s:?}");
    }
    // top-k 2: only ever one of the two most likely next tokens.
    let logits = model.forward(&Tensor::from_slice(&p[0]).view([1, 3]), &ForwardOptions::default()).unwrap();
    let last = logits.select(1, -1).squeeze_dim(0).narrow(0, 0, 64);
    let top2: Vec<i64> = Vec::try_from(last.topk(2, -1, true, true).1).unwrap();
    let s = Sampling { top_k: Some(2), ..sampled(5.0) };
    let firsts: std::collections::BTreeSet<i64> =
        (0..40).map(|seed| model.generate_batch(&p, &[seed], &opts(s.clone(), 1)).unwrap()[0].tokens[0]).collect();
    assert!(firsts.iter().all(|t| top2.contains(t)), "{firsts:?} outside {top2:?}");
    assert_eq!(firsts.len(), 2, "at temperature 5 both come up in 40 draws");
}

#[test]
fn rows_stop_at_a_stop_token_and_leave_the_batch() {
    let (_vs, model) = build(&tiny("lssa+rw15"), 5);
    let prompts = vec![vec![1, 2, 3], vec![3, 2, 1]];
    let free = model.generate_batch(&prompts, &[0, 0], &opts(Sampling::greedy(), 8)).unwrap();
    // Stop at row 0's third token: row 0 ends there, row 1 runs on unchanged (unless it meets it).
    let stop = free[0].tokens[2];
    let o = GenerateOptions { stop: vec![stop], ..opts(Sampling::greedy(), 8) };
    let out = model.generate_batch(&prompts, &[0, 0], &o).unwrap();
    let cut = |t: &[i64]| t.iter().position(|&x| x == stop).map_or(t.to_vec(), |i| t[..i].to_vec());
    for (f, g) in free.iter().zip(&out) {
        assert_eq!(g.tokens, cut(&f.tokens));
        assert_eq!(g.stopped, f.tokens.contains(&stop));
    }
    assert!(out[0].stopped && out[0].tokens.len() <= 2);
}

#[test]
fn bad_generation_input_is_an_error() {
    let (_vs, model) = build(&tiny("lssa"), 6);
    let g = |prompts: Vec<Vec<i64>>, seeds: &[u64], s: Sampling| {
        model.generate_batch(&prompts, seeds, &opts(s, 2)).map(|_| ()).unwrap_err().to_string()
    };
    assert!(g(vec![vec![1, 2], vec![1]], &[0, 0], Sampling::greedy()).contains("one length"));
    assert!(g(vec![vec![]], &[0], Sampling::greedy()).contains("non-empty"));
    assert!(g(vec![vec![1, 64]], &[0], Sampling::greedy()).contains("outside the vocabulary"));
    assert!(g(vec![vec![1]], &[0, 1], Sampling::greedy()).contains("seeds"));
    assert!(g(vec![vec![1]], &[0], sampled(-1.0)).contains("temperature"));
    assert!(g(vec![vec![1]], &[0], sampled(f64::NAN)).contains("temperature"));
    assert!(g(vec![vec![1]], &[0], Sampling { top_k: Some(0), ..sampled(1.0) }).contains("top-k"));
    for p in [0.0, 1.5, -1.0, f64::NAN] {
        assert!(g(vec![vec![1]], &[0], Sampling { top_p: Some(p), ..sampled(1.0) }).contains("top-p"), "{p}");
    }
    assert!(model.generate_batch(&[], &[], &opts(Sampling::greedy(), 2)).unwrap().is_empty());
}

#[test]
fn a_checkpoint_is_read_once_and_exports_its_weights_alone() {
    let dir = std::env::temp_dir().join(format!("gpt-model-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.safetensors");
    let cfg = tiny("lssa+rw15");
    let vs = VarStore::new(Device::Cpu);
    let model = Gpt::new_seeded(&vs.root(), &cfg, 8).unwrap();
    let moments = vec![("optim.m.wte".to_string(), Tensor::ones([3], (Kind::Float, Device::Cpu)))];
    let meta = HashMap::from([("kind".to_string(), "train".to_string()), ("step".to_string(), "7".to_string())]);
    checkpoint::save_with(&vs, &cfg, &meta, &moments, &path).unwrap();

    // The header alone gives the metadata the whole file gives.
    let ckpt = Checkpoint::read(&path).unwrap();
    assert_eq!(&checkpoint::read_metadata(&path).unwrap(), ckpt.metadata());
    assert_eq!(ckpt.config().unwrap(), cfg);
    assert_eq!(ckpt.kind(), Some("train"));
    assert!(ckpt.names().unwrap().contains(&"optim.m.wte".to_string()));

    // Weights only: no moments, kind set, the rest of the metadata as given, loads into a model.
    let out = dir.join("weights.safetensors");
    let extra = HashMap::from([("step".to_string(), "7".to_string()), ("kind".to_string(), "ignored".to_string())]);
    let n = ckpt.export(&out, &|name| !name.starts_with("optim."), extra).unwrap();
    let w = Checkpoint::read(&out).unwrap();
    assert_eq!(n, vs.variables().len());
    assert!(w.is_weights_only() && w.kind() == Some(WEIGHTS_KIND));
    assert!(w.names().unwrap().iter().all(|n| !n.starts_with("optim.")));
    assert_eq!((w.metadata()["step"].as_str(), w.metadata()["variant"].as_str()), ("7", "lssa+rw15"));
    assert_eq!(w.config().unwrap(), cfg);
    let mut vs2 = VarStore::new(Device::Cpu);
    let model2 = Gpt::new_seeded(&vs2.root(), &cfg, 9).unwrap();
    w.load_into(&mut vs2, &cfg).unwrap();
    let x = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
    let o = ForwardOptions::default();
    assert!(model.forward(&x, &o).unwrap().equal(&model2.forward(&x, &o).unwrap()));
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    // Never over the file it reads.
    assert!(matches!(ckpt.export(&path, &|_| true, HashMap::new()), Err(CheckpointError::Refused { .. })));

    // A cut or foreign file is a format error naming the file, by header or whole.
    let bytes = std::fs::read(&path).unwrap();
    for (name, content) in [("short", &bytes[..5]), ("cut", &bytes[..bytes.len() - 10]), ("junk", &b"junk file"[..])] {
        let p = dir.join(format!("{name}.safetensors"));
        std::fs::write(&p, content).unwrap();
        let err = Checkpoint::read(&p).unwrap_err();
        assert!(matches!(err, CheckpointError::Format { .. }) && err.to_string().contains(name), "{name}: {err}");
        if name != "cut" {
            // The header of a cut file is intact: its metadata still reads; the others' does not.
            assert!(matches!(checkpoint::read_metadata(&p), Err(CheckpointError::Format { .. })), "{name}");
        }
    }
    assert!(checkpoint::read_metadata(&dir.join("cut.safetensors")).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}
