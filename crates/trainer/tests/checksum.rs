//! The `trainer` binary and a checkpoint whose bytes changed after it was written: every command that
//! reads one refuses it by name, `--resume latest` names the newest intact one; and a checkpoint
//! written before checksums were recorded still loads, with a note.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

const TRAINER: &str = env!("CARGO_BIN_EXE_trainer");

fn trainer(args: &[&str]) -> Output {
    Command::new(TRAINER).args(args).env("RUST_LOG", "warn").output().unwrap()
}

fn train(config: &Path, extra: &[&str]) -> Output {
    let config = config.to_str().unwrap();
    let mut args = vec!["train", "--no-progress", "--eval-lengths", "1", "--config", config];
    args.extend_from_slice(extra);
    trainer(&args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A tiny run of 20 steps trained into `root/run`, a checkpoint every 10 steps, both kept; its config.
fn finished_run(root: &Path) -> PathBuf {
    common::tiny_data(root);
    let cfg = common::tiny_config(root, "run", 20, 10, 2);
    let out = train(&cfg, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    cfg
}

/// Flips one bit of the data section's middle byte (the header, and so the length, stay as they were).
fn flip_a_data_bit(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let start = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let at = (start + bytes.len()) / 2;
    bytes[at] ^= 0x04;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_flipped_data_bit_is_refused_by_resume_eval_and_export_and_resume_latest_names_the_intact_one() {
    let root = tempfile::tempdir().unwrap();
    let cfg = finished_run(root.path());
    let dir = root.path().join("run");
    let newest = dir.join("ckpt_00000020.safetensors");
    let intact = dir.join("ckpt_00000010.safetensors");
    flip_a_data_bit(&newest);
    let name = newest.display().to_string();
    let refuses = |what: &str, o: &Output| {
        assert!(!o.status.success(), "{what} accepted a corrupt checkpoint");
        let err = stderr(o);
        assert!(err.contains(&name) && err.contains("checksum"), "{what}: {err}");
    };
    refuses("train --resume PATH", &train(&cfg, &["--resume", &name, "--set", "max_steps=30"]));
    refuses("eval", &trainer(&["eval", "--lengths", "1", "--json", "--checkpoint", &name]));
    let out = root.path().join("weights.safetensors");
    refuses("export", &trainer(&["export", "--checkpoint", &name, "--out", out.to_str().unwrap()]));
    assert!(!out.exists(), "export wrote a file from a corrupt checkpoint");
    refuses("sample", &trainer(&["sample", "--checkpoint", &name, "--prompt", "the", "--max-tokens", "2"]));

    // --resume latest: refused, naming the damaged file and the intact one with its command.
    let latest = train(&cfg, &["--resume", "latest", "--set", "max_steps=30"]);
    assert!(!latest.status.success());
    let err = stderr(&latest);
    assert!(err.contains(&name) && err.contains("truncated or corrupt") && err.contains("checksum"), "{err}");
    let command = format!("--resume {}", intact.display());
    assert!(err.contains(&command), "the refusal does not name `{command}`: {err}");
    // That command resumes, to the end.
    let resumed = train(&cfg, &["--resume", intact.to_str().unwrap(), "--set", "max_steps=30"]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert!(dir.join("ckpt_00000030.safetensors").exists());
}

/// Rewrites a checkpoint as the writer did before checksums: the same tensors and metadata, without
/// the `checksum` key (the header edited as JSON and padded to 8 bytes, as safetensors writes it).
fn strip_checksum(from: &Path, to: &Path) {
    let bytes = std::fs::read(from).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let removed = header["__metadata__"].as_object_mut().unwrap().remove(gpt_model::checkpoint::CHECKSUM_KEY);
    assert!(removed.is_some(), "{} had no checksum to remove", from.display());
    let mut text = serde_json::to_vec(&header).unwrap();
    text.resize(text.len().next_multiple_of(8), b' ');
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(to, out).unwrap();
}

#[test]
fn a_checkpoint_without_a_checksum_loads_with_one_note() {
    let root = tempfile::tempdir().unwrap();
    finished_run(root.path());
    let old = root.path().join("old.safetensors");
    strip_checksum(&root.path().join("run").join("ckpt_00000020.safetensors"), &old);
    let name = old.display().to_string();
    let eval = trainer(&["eval", "--lengths", "1", "--json", "--checkpoint", &name]);
    assert!(eval.status.success(), "{}", stderr(&eval));
    let err = stderr(&eval);
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("carries no checksum")).collect();
    assert_eq!(notes.len(), 1, "one note per file: {err}");
    assert!(notes[0].contains(&name), "{}", notes[0]);
    // Exported by today's code, the weights carry one again.
    let out = root.path().join("weights.safetensors");
    let export = trainer(&["export", "--checkpoint", &name, "--out", out.to_str().unwrap()]);
    assert!(export.status.success(), "{}", stderr(&export));
    let meta = gpt_model::checkpoint::read_metadata(&out).unwrap();
    assert!(meta[gpt_model::checkpoint::CHECKSUM_KEY].starts_with("xxh3-128:"), "{meta:?}");
    let again = trainer(&["eval", "--lengths", "1", "--json", "--checkpoint", out.to_str().unwrap()]);
    assert!(again.status.success() && !stderr(&again).contains("carries no checksum"), "{}", stderr(&again));
}
