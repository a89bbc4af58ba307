//! `trainer sample`, `trainer export` and `trainer eval --tasks / --passkey` on a tiny checkpoint, as a
//! user runs them: deterministic text, an export that evaluates like its checkpoint, one scorer for
//! the tasks, and clear errors for bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;
use trainer::tasks::{self, LogLikelihood, ModelScorer};

mod common;

const TRAINER: &str = env!("CARGO_BIN_EXE_trainer");

/// A directory of this test binary's run, a tiny data set and a 20-step LSSAR run trained in it
/// once (shared by the tests); the checkpoint.
fn checkpoint() -> &'static Path {
    static CKPT: OnceLock<PathBuf> = OnceLock::new();
    CKPT.get_or_init(|| {
        tch::set_num_threads(1); // what the binary runs with below (--threads 1), and a loaded machine
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        // Earlier runs' directories, once their process is gone (where /proc tells).
        if Path::new("/proc/self").exists() {
            for e in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = name.strip_prefix("trainer-tools-")
                    && !Path::new("/proc").join(pid).exists()
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let root = tmp.join(format!("trainer-tools-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        common::tiny_data(&root);
        let config = common::tiny_config(&root, "run", 20, 20, 1);
        let out = Command::new(TRAINER)
            .args(["train", "--no-progress", "--eval-lengths", "1", "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(out.status.success(), "training failed: {}", String::from_utf8_lossy(&out.stderr));
        root.join("run").join("ckpt_00000020.safetensors")
    })
}

/// A scratch directory beside the checkpoint.
fn scratch(name: &str) -> PathBuf {
    let dir = checkpoint().parent().unwrap().parent().unwrap().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn trainer(args: &[&str]) -> Output {
    Command::new(TRAINER).args(args).env("RUST_LOG", "warn").output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = trainer(args);
    assert!(out.status.success(), "trainer {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The stderr of a command that must fail cleanly (an `error:` line, exit 1 or clap's 2, no panic).
fn fails(args: &[&str]) -> String {
    let out = trainer(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "trainer {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
    assert!(matches!(out.status.code(), Some(1 | 2)), "trainer {args:?}: {:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "trainer {args:?} panicked: {err}");
    assert!(err.contains("error"), "trainer {args:?}: no error message: {err}");
    err
}

fn ckpt() -> &'static str {
    checkpoint().to_str().unwrap()
}

/// `trainer sample` on the checkpoint, 16 new tokens unless `extra` says otherwise.
fn sample(extra: &[&str]) -> String {
    let mut args = vec!["sample", "--checkpoint", ckpt(), "--threads", "1"];
    if !extra.contains(&"--max-tokens") {
        args.extend(["--max-tokens", "16"]);
    }
    args.extend_from_slice(extra);
    ok(&args)
}

#[test]
fn sampling_is_deterministic_under_a_seed() {
    let prompt = ["--prompt", "the old house"];
    let one = sample(&[&prompt[..], &["--seed", "1"]].concat());
    assert!(one.starts_with("the old house"), "{one}");
    assert_eq!(one, sample(&[&prompt[..], &["--seed", "1"]].concat()), "the same seed, the same text");
    assert_ne!(one, sample(&[&prompt[..], &["--seed", "2"]].concat()), "another seed, another text");
    let top =
        sample(&[&prompt[..], &["--seed", "3", "--top-k", "5", "--top-p", "0.9", "--temperature", "0.7"]].concat());
    assert_eq!(
        top,
        sample(&[&prompt[..], &["--seed", "3", "--top-k", "5", "--top-p", "0.9", "--temperature", "0.7"]].concat())
    );
    // Greedy: stable, whatever the seed.
    let greedy = sample(&[&prompt[..], &["--temperature", "0", "--seed", "1"]].concat());
    assert_eq!(greedy, sample(&[&prompt[..], &["--temperature", "0", "--seed", "9"]].concat()));

    // A file of prompts is one batch per token length; greedy, each equals its own run, and the
    // JSON says how each ended.
    let dir = scratch("prompts");
    let file = dir.join("prompts.txt");
    let prompts = ["the old house", "", "a man", "the old road"];
    std::fs::write(&file, prompts.join("\n")).unwrap();
    let json: Value =
        serde_json::from_str(&sample(&["--prompts", file.to_str().unwrap(), "--temperature", "0", "--json"])).unwrap();
    assert_eq!(json["format"], "lssa-sample");
    assert_eq!(json["format_version"], 1);
    assert_eq!(json["variant"], "lssa+rw15");
    let samples = json["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 3, "the blank line is skipped");
    for s in samples {
        let p = s["prompt"].as_str().unwrap();
        let alone = sample(&["--prompt", p, "--temperature", "0"]);
        assert_eq!(alone.trim_end_matches('\n'), format!("{p}{}", s["completion"].as_str().unwrap()), "{p}");
        let n = s["completion_tokens"].as_u64().unwrap();
        match s["finish_reason"].as_str().unwrap() {
            "length" => assert_eq!(n, 16),
            "eot" => assert!(n < 16),
            other => panic!("finish_reason {other}"),
        }
    }
    // Beyond the training length (32 tokens) with --length-scale (NTK RoPE), and post-hoc p.
    let long = sample(&["--prompt", "the old house", "--max-tokens", "80", "--length-scale", "4", "--seed", "1"]);
    assert!(long.starts_with("the old house"));
    sample(&["--prompt", "the old house", "--reweight", "3", "--seed", "1"]);
}

#[test]
fn an_export_evaluates_like_its_checkpoint_and_cannot_be_resumed() {
    let dir = scratch("export");
    let out = dir.join("weights.safetensors");
    let said = ok(&["export", "--checkpoint", ckpt(), "--out", out.to_str().unwrap()]);
    assert!(said.contains("weights only"), "{said}");
    // Weights only, the model's metadata kept.
    let full = gpt_model::checkpoint::Checkpoint::read(checkpoint()).unwrap();
    let weights = gpt_model::checkpoint::Checkpoint::read(&out).unwrap();
    assert!(weights.is_weights_only() && !full.is_weights_only());
    assert!(weights.names().unwrap().iter().all(|n| !n.starts_with("optim.")));
    assert!(full.names().unwrap().iter().any(|n| n.starts_with("optim.")));
    assert_eq!(weights.config().unwrap(), full.config().unwrap());
    for key in ["tokenizer", "train_config", "step"] {
        assert_eq!(weights.metadata()[key], full.metadata()[key], "{key}");
    }
    assert!(!weights.metadata().contains_key("data_position"));
    assert!(std::fs::metadata(&out).unwrap().len() * 2 < std::fs::metadata(checkpoint()).unwrap().len());
    for (a, b) in
        weights.tensors("").unwrap().iter().zip(full.tensors("").unwrap().iter().filter(|t| !t.0.starts_with("optim.")))
    {
        assert_eq!(a.0, b.0);
        assert!(a.1.equal(&b.1), "{} differs", a.0);
    }

    // eval of either gives the same losses.
    let eval = |path: &str| -> Value {
        let args = [
            "eval",
            "--checkpoint",
            path,
            "--lengths",
            "1,2",
            "--val-tokens",
            "512",
            "--rope",
            "ntk",
            "--threads",
            "1",
            "--json",
        ];
        serde_json::from_str(&ok(&args)).unwrap()
    };
    let (a, b) = (eval(ckpt()), eval(out.to_str().unwrap()));
    assert_eq!(a["format"], "lssa-eval");
    assert_eq!(a["lengths"].as_array().unwrap().len(), 2);
    assert_eq!(a["lengths"], b["lengths"]);
    assert!(a.get("tasks").is_none() && a.get("passkey").is_none(), "sections not asked for are absent");
    // Without --json: a table, one row per length, one column per setting, the JSON's numbers.
    let file = scratch("eval-json").join("eval.json");
    let table = ok(&[
        "eval",
        "--checkpoint",
        ckpt(),
        "--lengths",
        "1,2",
        "--val-tokens",
        "512",
        "--reweight",
        "15",
        "--threads",
        "1",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert!(table.starts_with("validation loss (nats/token"), "{table}");
    let header = table.lines().nth(1).unwrap();
    for col in ["ntk", "plain", "ntk rw15", "plain rw15"] {
        assert!(header.contains(col), "{header}");
    }
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let lengths = written["lengths"].as_array().unwrap();
    assert_eq!(lengths.len(), 2 * 4, "2 lengths x (2 RoPE x 2 powers)");
    for (m, line) in [(1, table.lines().nth(2).unwrap()), (2, table.lines().nth(3).unwrap())] {
        assert!(line.trim_start().starts_with(&format!("{m}x")), "{line}");
        let first =
            lengths.iter().find(|l| l["multiple"] == m && l["rope"] == "ntk" && l["reweight"].is_null()).unwrap();
        assert!(line.contains(&format!("{:.4}", first["loss"].as_f64().unwrap())), "{line} vs {first}");
    }

    // sample reads it too (its tokenizer from the recorded training data), with the same text.
    let s = |path: &str| ok(&["sample", "--checkpoint", path, "--prompt", "the", "--max-tokens", "8", "--seed", "4"]);
    assert_eq!(s(ckpt()), s(out.to_str().unwrap()));

    // Resuming from it is refused, saying why; exporting over the checkpoint itself too.
    let run_dir = checkpoint().parent().unwrap();
    let config = run_dir.parent().unwrap().join("run.toml");
    let err =
        fails(&["train", "--no-progress", "--config", config.to_str().unwrap(), "--resume", out.to_str().unwrap()]);
    assert!(err.contains("weights-only") && err.contains("optimiser"), "{err}");
    let err = fails(&["export", "--checkpoint", ckpt(), "--out", ckpt()]);
    assert!(err.contains("overwrite the checkpoint"), "{err}");
}

/// Scores one choice at a time: the unbatched path of the shared scorer.
struct OneByOne<'a>(ModelScorer<'a>);
impl LogLikelihood for OneByOne<'_> {
    fn loglik(&mut self, context: &str, continuation: &str) -> anyhow::Result<f64> {
        self.0.loglik(context, continuation)
    }
}

#[test]
fn eval_tasks_and_passkey_use_the_shared_scorer_in_one_json() {
    let dir = scratch("mc");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments/tests/fixtures/downstream");
    for (from, to) in [
        ("arc.jsonl", "arc_easy.jsonl"),
        ("arc.jsonl", "arc_challenge.jsonl"),
        ("hellaswag.jsonl", "hellaswag.jsonl"),
        ("piqa.jsonl", "piqa.jsonl"),
        ("sciq.jsonl", "sciq.jsonl"),
        ("mmlu.jsonl", "mmlu.jsonl"),
    ] {
        std::fs::copy(fixtures.join(from), dir.join(to)).unwrap();
    }
    let args = [
        "eval",
        "--checkpoint",
        ckpt(),
        "--tasks",
        dir.to_str().unwrap(),
        "--passkey",
        "--passkey-lengths",
        "1,8",
        "--passkey-depths",
        "0,1",
        "--passkey-prompts",
        "2",
        "--rope",
        "ntk",
        "--lengths",
        "1",
        "--val-tokens",
        "256",
        "--threads",
        "1",
        "--json",
    ];
    let json: Value = serde_json::from_str(&ok(&args)).unwrap();
    assert_eq!((json["format"].as_str(), json["format_version"].as_u64()), (Some("lssa-eval"), Some(1)));
    assert_eq!(json["lengths"].as_array().unwrap().len(), 1);

    // The same scores as the shared scorer (what the reproduction calls) on the same checkpoint,
    // batched over the choices or one choice at a time.
    let loaded = trainer::sample::load(checkpoint(), None, tch::Device::Cpu).unwrap();
    let row = &json["tasks"][0];
    assert_eq!(row["reweight"], Value::Null);
    for (task, path) in tasks::task_files(&dir).unwrap() {
        let items = tasks::read_items(&task, &path).unwrap();
        let mut batched = ModelScorer::new(&loaded.model, &loaded.tokenizer, loaded.device);
        let s = tasks::score(&items, &mut batched).unwrap();
        let mut single = OneByOne(ModelScorer::new(&loaded.model, &loaded.tokenizer, loaded.device));
        let one = tasks::score(&items, &mut single).unwrap();
        // (NaN != NaN: a one-item file has no standard error; compare by bits.)
        let bits = |s: &tasks::Scores| [s.acc, s.acc_stderr, s.acc_norm, s.acc_norm_stderr].map(f64::to_bits);
        assert_eq!((one.n, bits(&one)), (s.n, bits(&s)), "{task}: batched and unbatched differ");
        for item in &items {
            let b = batched.loglik_batch(&item.context, &item.choices).unwrap();
            for (c, lb) in item.choices.iter().zip(&b) {
                let l1 = batched.loglik(&item.context, c).unwrap();
                assert!((l1 - lb).abs() < 1e-4, "{task}: {c:?}: {l1} alone, {lb} batched");
            }
        }
        let got = &row["scores"][&task];
        assert_eq!(got["n"].as_u64().unwrap() as usize, s.n, "{task}");
        assert_eq!(got["acc"].as_f64().unwrap(), s.acc, "{task}");
        assert_eq!(got["acc_norm"].as_f64().unwrap(), s.acc_norm, "{task}");
        assert_eq!(row["lm_eval"]["results"][&task]["acc,none"].as_f64().unwrap(), s.acc);
    }

    // Passkey: 1x (32 tokens) cannot hold the prompt and is reported; 8x is scored per depth.
    let pk = &json["passkey"]["results"][0];
    assert_eq!(pk["rope"], "ntk");
    assert!(pk["skipped"][0].as_str().unwrap().starts_with("1x"), "{pk}");
    let cells = pk["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    for c in cells {
        assert_eq!(
            (c["multiple"].as_u64(), c["seq_len"].as_u64(), c["prompts"].as_u64()),
            (Some(8), Some(256), Some(2))
        );
        let acc = c["accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&acc));
    }
    // Deterministic under its seed: the same prompts and answers in process.
    let opts =
        tasks::PasskeyOptions { multiples: vec![8], depths: vec![0.0, 1.0], prompts: 2, seed: 0, batch_tokens: 16_384 };
    let r = tasks::passkey(&loaded.model, &loaded.tokenizer, &opts, trainer::eval::Rope::Ntk, None).unwrap();
    assert_eq!(serde_json::to_value(&r.cells).unwrap(), pk["cells"]);
    assert_eq!(r.example, pk["example"].as_str().unwrap());
}

#[test]
fn bad_inputs_are_clear_errors() {
    let missing = checkpoint().parent().unwrap().join("nope.safetensors");
    let missing = missing.to_str().unwrap();
    for cmd in ["sample", "eval", "export"] {
        let mut args = vec![cmd, "--checkpoint", missing];
        match cmd {
            "sample" => args.extend(["--prompt", "hi"]),
            "export" => args.extend(["--out", "/tmp/never-written.safetensors"]),
            _ => {}
        }
        let err = fails(&args);
        assert!(err.contains("nope.safetensors") && err.contains("No such file"), "{cmd}: {err}");
    }
    let junk = scratch("junk").join("junk.safetensors");
    std::fs::write(&junk, b"not a checkpoint").unwrap();
    let err = fails(&["sample", "--checkpoint", junk.to_str().unwrap(), "--prompt", "hi"]);
    assert!(err.contains("not a model checkpoint"), "{err}");

    let s = |extra: &[&str]| {
        let mut args = vec!["sample", "--checkpoint", ckpt()];
        args.extend_from_slice(extra);
        fails(&args)
    };
    assert!(s(&["--prompt", ""]).contains("empty"));
    for p in ["0", "1.5", "-0.1", "nan"] {
        let err = s(&["--prompt", "hi", "--top-p", p]);
        assert!(err.contains("top-p") && err.contains("(0, 1]"), "{p}: {err}");
    }
    assert!(s(&["--prompt", "hi", "--top-k", "0"]).contains("top-k"));
    assert!(s(&["--prompt", "hi", "--temperature", "-1"]).contains("temperature"));
    let err = s(&["--prompt", "hi", "--max-tokens", "100"]);
    assert!(err.contains("window of 32") && err.contains("--length-scale"), "{err}");
    assert!(s(&["--prompt", "hi", "--length-scale", "0.5"]).contains("--length-scale"));
    assert!(s(&["--prompt", "hi", "--reweight", "0"]).contains("--reweight 0"));
    assert!(s(&[]).contains("--prompt"), "a prompt is required");
    let empty = scratch("empty-prompts").join("p.txt");
    std::fs::write(&empty, "\n\n").unwrap();
    assert!(s(&["--prompts", empty.to_str().unwrap()]).contains("no prompts"));
    assert!(s(&["--prompt", "hi", "--data-dir", "/nonexistent-dir"]).contains("/nonexistent-dir"));

    let err = fails(&["eval", "--checkpoint", ckpt(), "--tasks", "/nonexistent-tasks"]);
    assert!(err.contains("/nonexistent-tasks") && err.contains("not a directory"), "{err}");
    let err = fails(&["eval", "--checkpoint", ckpt(), "--passkey-lengths", "2"]);
    assert!(err.contains("--passkey"), "{err}");
}
