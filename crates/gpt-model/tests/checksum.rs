//! The checksum of a checkpoint's tensor data (`checkpoint::CHECKSUM_KEY`): recorded by every writer,
//! verified by every read, the header left out; files written before it existed still load. And what
//! it costs (`checksum_cost`, ignored: it prints timings).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpt_model::checkpoint::{self, CHECKSUM_KEY, Checkpoint, CheckpointError};
use gpt_model::config::{AttnImpl, ModelConfig};
use gpt_model::model::Gpt;
use safetensors::tensor::{Dtype, TensorView};
use tch::nn::VarStore;
use tch::{Device, Tensor};

fn tiny() -> ModelConfig {
    ModelConfig {
        attention: "lssa".parse().unwrap(),
        attn_impl: AttnImpl::Reference,
        vocab_size: 64,
        context_len: 32,
        ..ModelConfig::preset("tiny").unwrap()
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpt-model-checksum-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A training-state-like file: the model and one moment per variable.
fn write_state(cfg: &ModelConfig, path: &Path, seed: i64) -> VarStore {
    let vs = VarStore::new(Device::Cpu);
    let _model = Gpt::new_seeded(&vs.root(), cfg, seed).unwrap();
    let moments: Vec<(String, Tensor)> =
        vs.variables().into_iter().map(|(n, t)| (format!("optim.m.{n}"), t.detach().ones_like())).collect();
    let meta = HashMap::from([("kind".to_string(), "test-state".to_string())]);
    checkpoint::save_with(&vs, cfg, &meta, &moments, path).unwrap();
    vs
}

/// Where the tensor data starts: after the 8-byte length and the header.
fn data_start(bytes: &[u8]) -> usize {
    8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

#[test]
fn a_flipped_data_byte_is_refused_by_every_read_naming_the_file() {
    let dir = scratch("flip");
    let cfg = tiny();
    let path = dir.join("state.safetensors");
    write_state(&cfg, &path, 1);
    let ckpt = Checkpoint::read(&path).unwrap();
    let recorded = ckpt.checksum().expect("a new file records its checksum").to_string();
    assert!(recorded.starts_with("xxh3-128:") && recorded.len() == "xxh3-128:".len() + 32, "{recorded}");
    let bytes = std::fs::read(&path).unwrap();
    let start = data_start(&bytes);
    // The first, a middle and the last byte of the data section, one bit each.
    for (i, at) in [start, (start + bytes.len()) / 2, bytes.len() - 1].into_iter().enumerate() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        let p = dir.join(format!("flipped{i}.safetensors"));
        std::fs::write(&p, &bad).unwrap();
        let err = Checkpoint::read(&p).unwrap_err();
        assert!(matches!(err, CheckpointError::Checksum { .. }), "byte {at}: {err}");
        let msg = err.to_string();
        assert!(msg.contains(&p.display().to_string()) && msg.contains("corrupt"), "{msg}");
        let mut vs = VarStore::new(Device::Cpu);
        let _m = Gpt::new(&vs.root(), &cfg).unwrap();
        assert!(matches!(checkpoint::load(&mut vs, &cfg, &p), Err(CheckpointError::Checksum { .. })));
        assert!(matches!(checkpoint::read_tensors(&p, "optim."), Err(CheckpointError::Checksum { .. })));
        // The header alone is intact, and says so.
        assert_eq!(checkpoint::read_metadata(&p).unwrap()[CHECKSUM_KEY], recorded);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_checksum_covers_the_tensors_not_the_header() {
    let dir = scratch("cover");
    let cfg = tiny();
    let (a, b, c) = (dir.join("a.safetensors"), dir.join("b.safetensors"), dir.join("c.safetensors"));
    let vs = write_state(&cfg, &a, 2);
    // The same tensors under other metadata: the same checksum.
    let moments: Vec<(String, Tensor)> =
        vs.variables().into_iter().map(|(n, t)| (format!("optim.m.{n}"), t.detach().ones_like())).collect();
    let meta = HashMap::from([("kind".to_string(), "other".to_string()), ("step".to_string(), "9".to_string())]);
    checkpoint::save_with(&vs, &cfg, &meta, &moments, &b).unwrap();
    // Other weights: another checksum.
    write_state(&cfg, &c, 3);
    let sum = |p: &Path| Checkpoint::read(p).unwrap().checksum().unwrap().to_string();
    assert_eq!(sum(&a), sum(&b));
    assert_ne!(sum(&a), sum(&c));
    // A weights-only export records the checksum of what it holds, and verifies.
    let out = dir.join("weights.safetensors");
    Checkpoint::read(&a).unwrap().export(&out, &|n| !n.starts_with("optim."), HashMap::new()).unwrap();
    let w = Checkpoint::read(&out).unwrap();
    assert_ne!(w.checksum().unwrap(), sum(&a));
    // write_tensors (the Hugging Face export's writer) records one too.
    let hf = dir.join("model.safetensors");
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    checkpoint::write_tensors(&[("x".to_string(), Tensor::from_slice(&[1f32, 2.0]))], meta, &hf).unwrap();
    // (Not a checkpoint of ours: its header read as plain safetensors.)
    let bytes = std::fs::read(&hf).unwrap();
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..data_start(&bytes)]).unwrap();
    assert!(header["__metadata__"][CHECKSUM_KEY].as_str().unwrap().starts_with("xxh3-128:"), "{header}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_checkpoint_written_before_checksums_still_loads() {
    let dir = scratch("old");
    let cfg = tiny();
    let vs = VarStore::new(Device::Cpu);
    let model = Gpt::new_seeded(&vs.root(), &cfg, 4).unwrap();
    // What the writer did before: the same format, no checksum key.
    let named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    let buffers: Vec<(String, Vec<usize>, Vec<u8>)> = named
        .iter()
        .map(|(n, t)| {
            let t = t.detach().contiguous();
            let mut bytes = vec![0u8; t.numel() * 4];
            t.copy_data_u8(&mut bytes, t.numel());
            (n.clone(), t.size().iter().map(|&s| s as usize).collect(), bytes)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> =
        buffers.iter().map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap())).collect();
    let meta = HashMap::from([
        ("format".to_string(), checkpoint::FORMAT.to_string()),
        ("format_version".to_string(), checkpoint::FORMAT_VERSION.to_string()),
        ("config".to_string(), cfg.to_toml()),
    ]);
    let path = dir.join("old.safetensors");
    safetensors::serialize_to_file(views, Some(meta), &path).unwrap();
    let ckpt = Checkpoint::read(&path).unwrap();
    assert_eq!(ckpt.checksum(), None);
    let mut vs2 = VarStore::new(Device::Cpu);
    let model2 = Gpt::new_seeded(&vs2.root(), &cfg, 5).unwrap();
    ckpt.load_into(&mut vs2, &cfg).unwrap();
    let x = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
    let o = gpt_model::ForwardOptions::default();
    assert!(model.forward(&x, &o).unwrap().equal(&model2.forward(&x, &o).unwrap()));
    // Saved again by today's writer, it carries one.
    let again = dir.join("again.safetensors");
    checkpoint::save(&vs2, &cfg, &HashMap::new(), &again).unwrap();
    assert!(Checkpoint::read(&again).unwrap().checksum().is_some());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The model of a scale with its two AdamW moments, as the trainer saves it.
fn scale_state(n_layer: usize, n_head: usize, d_model: usize, context_len: usize, vocab: usize) -> StateOf {
    let cfg = ModelConfig {
        n_layer,
        n_head,
        d_model,
        context_len,
        vocab_size: vocab,
        attention: "lssa".parse().unwrap(),
        ..ModelConfig::preset("cpu-small").unwrap()
    };
    let vs = VarStore::new(Device::Cpu);
    let _model = Gpt::new_seeded(&vs.root(), &cfg, 1).unwrap();
    let mut moments = Vec::new();
    for (n, t) in vs.variables() {
        moments.push((format!("optim.m.{n}"), t.detach().randn_like()));
        moments.push((format!("optim.v.{n}"), t.detach().randn_like().abs()));
    }
    StateOf { cfg, vs, moments }
}

struct StateOf {
    cfg: ModelConfig,
    vs: VarStore,
    moments: Vec<(String, Tensor)>,
}

/// Save and load times at the `small` and `gpu` scales' sizes (medians of 9; loads from the page
/// cache, as a resume or an evaluation right after training reads it): the save, the open of the
/// bytes already in memory (header checks, and the checksum where there is one), and the copy of
/// weights and moments into tensors. Run on the commit before the checksum and on this one to
/// compare: `cargo test -p gpt-model --release --test checksum -- --ignored --nocapture checksum_cost`.
#[test]
#[ignore = "timing, prints numbers"]
fn checksum_cost() {
    let dir = scratch("cost");
    for (name, state) in [("small", scale_state(4, 2, 128, 64, 2048)), ("gpu", scale_state(6, 6, 384, 512, 8192))] {
        let path = dir.join(format!("{name}.safetensors"));
        let meta = HashMap::from([("kind".to_string(), "timing".to_string())]);
        let median = |f: &mut dyn FnMut()| {
            let mut t: Vec<f64> = (0..9)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            t.sort_by(f64::total_cmp);
            t[4]
        };
        let save = median(&mut || checkpoint::save_with(&state.vs, &state.cfg, &meta, &state.moments, &path).unwrap());
        let bytes = std::fs::read(&path).unwrap();
        let read = median(&mut || drop(std::fs::read(&path).unwrap()));
        let open = median(&mut || drop(Checkpoint::from_bytes(&path, bytes.as_slice()).unwrap()));
        let ckpt = Checkpoint::from_bytes(&path, bytes.as_slice()).unwrap();
        let mut vs = VarStore::new(Device::Cpu);
        let _m = Gpt::new(&vs.root(), &state.cfg).unwrap();
        let copy = median(&mut || {
            ckpt.load_into(&mut vs, &state.cfg).unwrap();
            drop(ckpt.tensors("optim.").unwrap());
        });
        println!(
            "{name}: {} bytes: save {save:.1} ms; load: read {read:.1} ms, open {open:.2} ms, copy into tensors {copy:.1} ms",
            bytes.len()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
