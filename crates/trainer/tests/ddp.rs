//! The `trainer` binary end to end on real processes: data built by `lssa-data` from generated text,
//! 2 Gloo ranks on 127.0.0.1 against one process with the same global batch (same losses, same final
//! weights), from the trainer's own launcher and from two torchrun "nodes" at a c10d rendezvous, a rank killed mid-run (the launcher fails fast, naming it; rank 0's checkpoint survives),
//! and the clear errors of bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TRAINER: &str = env!("CARGO_BIN_EXE_trainer");
const LSSA_DATA: &str = env!("CARGO_BIN_EXE_lssa-data");

/// The multi-process tests bind ports and use both cores: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lssa-ddp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Generated English-like text files (deterministic), tokenized by `lssa-data` with a 320-token BPE.
fn build_data(root: &Path) -> PathBuf {
    let text_dir = root.join("text");
    trainer::data::corpus::write_generated_text(&text_dir, 12, 3000, 12345).unwrap();
    let out = root.join("shards");
    let st = Command::new(LSSA_DATA)
        .args(["--input", text_dir.to_str().unwrap(), "--out", out.to_str().unwrap(), "--vocab-size", "320", "--quiet"])
        .status()
        .unwrap();
    assert!(st.success(), "lssa-data failed");
    out
}

fn base_args(data: &Path, out: &Path) -> Vec<String> {
    [
        "train",
        "--data-dir",
        data.to_str().unwrap(),
        "--out-dir",
        out.to_str().unwrap(),
        "--no-progress",
        "--eval-lengths",
        "1,2",
        "--set",
        "model.preset=\"tiny\"",
        "--set",
        "model.vocab_size=320",
        "--set",
        "model.context_len=32",
        "--set",
        "device=\"cpu\"",
        "--set",
        "threads=1",
        "--set",
        "lr=0.003",
        "--set",
        "warmup_steps=2",
        "--set",
        "eval_tokens=512",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run(args: &[String], envs: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(TRAINER);
    cmd.args(args).env("LSSA_DIST_TIMEOUT_S", "20").env("RUST_LOG", "warn");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The loss of every complete step line of `metrics.jsonl` (events, such as a pre-emption, left out).
fn losses(out: &Path) -> Vec<f64> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("event").is_none())
        .map(|v| v["loss"].as_f64().unwrap())
        .collect()
}

/// `trainer` with `args` (the launcher of a multi-rank run), stderr piped, not waited for.
fn spawn_trainer(args: &[String], dist_timeout_s: &str) -> std::process::Child {
    Command::new(TRAINER)
        .args(args)
        .env("LSSA_DIST_TIMEOUT_S", dist_timeout_s)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn weights(path: &Path) -> Vec<(String, tch::Tensor)> {
    let mut w: Vec<(String, tch::Tensor)> = gpt_model::checkpoint::read_tensors(path, "").unwrap();
    w.retain(|(n, _)| !n.starts_with("optim."));
    w
}

/// Arguments of the 6-step runs compared below: 128 tokens per step, `batch` sequences per rank.
fn equal_run_args(data: &Path, out: &Path, batch: usize) -> Vec<String> {
    let mut a = base_args(data, out);
    a.extend(["--set", "max_steps=6", "--set", "ckpt_every=0", "--set", "tokens_per_step=128"].map(String::from));
    a.extend(["--set".to_string(), format!("batch_size={batch}")]);
    a
}

/// One process, batch 4 (tokens_per_step = 4 x 32): the run two ranks of batch 2 must equal.
fn train_one_process(data: &Path, out: &Path) {
    let o = run(&equal_run_args(data, out, 4), &[]);
    assert!(o.status.success(), "1 process: {}", String::from_utf8_lossy(&o.stderr));
}

/// The two runs of [`equal_run_args`] in `one` (1 process) and `two` (2 ranks) took the same steps.
fn assert_same_training(one: &Path, two: &Path) {
    let (l1, l2) = (losses(one), losses(two));
    assert_eq!(l1.len(), 6);
    assert_eq!(l2.len(), 6, "rank 0 alone writes metrics");
    for (s, (a, b)) in l1.iter().zip(&l2).enumerate() {
        assert!((a - b).abs() < 1e-5, "step {}: 1 process {a} vs 2 ranks {b}", s + 1);
    }
    let (w1, w2) = (weights(&one.join("ckpt_00000006.safetensors")), weights(&two.join("ckpt_00000006.safetensors")));
    assert_eq!(w1.len(), w2.len());
    for ((n1, t1), (n2, t2)) in w1.iter().zip(&w2) {
        assert_eq!(n1, n2);
        let diff = (t1 - t2).abs().max().double_value(&[]);
        // The two runs sum the same gradients in a different order (accumulation vs all-reduce), and
        // AdamW divides by sqrt(v): where a gradient entry is nearly zero, rounding moves its update
        // by a visible fraction of lr. 1e-4 is 30x below one step (lr 3e-3); seen: 1.25e-5.
        assert!(diff < 1e-4, "final weight {n1} differs by {diff}");
    }
    // result.json records the run, with both evaluation lengths.
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(two.join("result.json")).unwrap()).unwrap();
    assert_eq!(result["format"], "lssa-train-result");
    assert_eq!(result["world_size"], 2);
    assert_eq!(result["lengths"].as_array().unwrap().len(), 2);
}

#[test]
fn two_gloo_ranks_equal_one_process_with_the_same_global_batch() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("equal");
    let data = build_data(&root);
    let one = root.join("one");
    train_one_process(&data, &one);
    // Two ranks, batch 2 each: the same 128 tokens per step, split by the loader.
    let two = root.join("two");
    let mut a = equal_run_args(&data, &two, 2);
    a.extend(["--nproc-per-node", "2"].map(String::from));
    let o = run(&a, &[]);
    assert!(o.status.success(), "2 ranks: {}", String::from_utf8_lossy(&o.stderr));
    assert_same_training(&one, &two);
    std::fs::remove_dir_all(&root).unwrap();
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn two_torchrun_nodes_equal_one_process_with_the_same_global_batch() {
    // torchrun's multi-node launch (dist.rs's runbook): two agents that meet at a c10d rendezvous,
    // each starting one rank with LOCAL_RANK 0, the store hosted by the agents. Both "nodes" are
    // on this machine, so the rendezvous, the agent store and Gloo all go over 127.0.0.1.
    let (python, why) = gpt_model::runtime::torch_python();
    let has_torch = Command::new(&python)
        .args(["-c", "import torch.distributed.run"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_torch {
        assert!(
            std::env::var_os("LSSA_REQUIRE_TORCH_PYTHON").is_none(),
            "{} ({why}) cannot import torch.distributed.run",
            python.display()
        );
        eprintln!("skipped: no Python with torch for torchrun ({} from {why})", python.display());
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("torchrun");
    let data = build_data(&root);
    let one = root.join("one");
    train_one_process(&data, &one);
    let two = root.join("two");
    let endpoint = format!("127.0.0.1:{}", free_port());
    let node = |n: usize| {
        Command::new(&python)
            .args(["-W", "ignore", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"])
            .args(["--rdzv-backend=c10d", &format!("--rdzv-endpoint={endpoint}"), "--rdzv-id=ddp-test"])
            .args(["--no-python", TRAINER])
            .args(equal_run_args(&data, &two, 2))
            .env("LSSA_DIST_TIMEOUT_S", "20")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(root.join(format!("node{n}.log"))).unwrap())
            .spawn()
            .unwrap()
    };
    let mut nodes = [node(0), node(1)];
    let log = |n: usize| std::fs::read_to_string(root.join(format!("node{n}.log"))).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(180);
    while nodes.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        if Instant::now() > deadline {
            for c in &mut nodes {
                let _ = c.kill();
            }
            panic!("torchrun nodes still running after 180 s:\n{}\n{}", log(0), log(1));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (n, c) in nodes.iter_mut().enumerate() {
        let status = c.wait().unwrap();
        assert!(status.success(), "torchrun node {n}: {status}\n{}", log(n));
    }
    assert_same_training(&one, &two);
    std::fs::remove_dir_all(&root).unwrap();
}

/// Pids of the direct children of `parent` whose environment has `RANK=<rank>`.
fn child_with_rank(parent: u32, rank: usize) -> Option<u32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // Fields after the ")" closing the command name: state, ppid, ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.split(|&b| b == 0).any(|kv| kv == format!("RANK={rank}").as_bytes()) {
            return Some(pid);
        }
    }
    None
}

#[test]
fn a_killed_rank_stops_the_run_fast_and_rank_zero_checkpoints_survive() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("kill");
    let data = build_data(&root);
    let out = root.join("run");
    let mut a = base_args(&data, &out);
    a.extend(
        [
            "--set",
            "max_steps=100000",
            "--set",
            "ckpt_every=2",
            "--set",
            "batch_size=2",
            "--set",
            "tokens_per_step=128",
            "--nproc-per-node",
            "2",
        ]
        .map(String::from),
    );
    let mut launcher = spawn_trainer(&a, "10");
    // Wait for a checkpoint, then kill rank 1 with SIGKILL.
    let start = Instant::now();
    while !out.join("ckpt_00000002.safetensors").exists() {
        assert!(start.elapsed() < Duration::from_secs(120), "no checkpoint after 120 s");
        assert!(launcher.try_wait().unwrap().is_none(), "the run ended before the kill");
        std::thread::sleep(Duration::from_millis(50));
    }
    let victim = child_with_rank(launcher.id(), 1).expect("rank 1 is a child of the launcher");
    let killed_at = Instant::now();
    Command::new("kill").args(["-9", &victim.to_string()]).status().unwrap();
    let status = loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            break s;
        }
        assert!(killed_at.elapsed() < Duration::from_secs(60), "the run did not stop within 60 s of the kill");
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = killed_at.elapsed();
    let stderr = {
        use std::io::Read;
        let mut s = String::new();
        launcher.stderr.take().unwrap().read_to_string(&mut s).unwrap();
        s
    };
    assert!(!status.success());
    assert!(stderr.contains("rank 1"), "the error must name the killed rank: {stderr}");
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?} to stop");
    // Every checkpoint left behind is complete and loadable; no temporary file remains.
    let ckpts = trainer::train::list_checkpoints(&out).unwrap();
    assert!(!ckpts.is_empty());
    for c in &ckpts {
        let meta = gpt_model::checkpoint::read_metadata(c).unwrap();
        assert_eq!(meta["kind"], "lssa-train-state");
    }
    let leftovers: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn bad_input_gives_one_clear_error() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("bad");
    let data = build_data(&root);
    let out = root.join("run");
    let err_in = |data: &Path, extra: &[&str]| {
        let mut a = base_args(data, &out);
        a.extend(extra.iter().map(|s| s.to_string()));
        let o = run(&a, &[]);
        assert!(!o.status.success(), "{extra:?} should fail");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = |extra: &[&str]| err_in(&data, extra);
    // Unknown config key, named.
    assert!(err(&["--set", "max_stepz=3"]).contains("max_stepz"));
    // Missing data directory, named.
    let e = err_in(&root.join("nowhere"), &[]);
    assert!(e.contains("nowhere"), "{e}");
    // Vocabulary mismatch between data and model, both named.
    let e = err(&["--set", "model.vocab_size=100"]);
    assert!(e.contains("vocab_size") && e.contains("100"), "{e}");
    // A corrupt shard, named.
    let shard = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("_train_"))
        .unwrap();
    let good = std::fs::read(&shard).unwrap();
    let mut bad = good.clone();
    bad[0] ^= 0xff; // the magic number
    std::fs::write(&shard, &bad).unwrap();
    let e = err(&["--set", "max_steps=2"]);
    assert!(e.contains(shard.file_name().unwrap().to_str().unwrap()) && e.contains("magic"), "{e}");
    std::fs::write(&shard, &good).unwrap();
    // A checkpoint of another world size: refused, and it is not overwritten.
    let mut a = base_args(&data, &out);
    a.extend(["--set", "max_steps=2", "--set", "ckpt_every=2"].map(String::from));
    assert!(run(&a, &[]).status.success());
    let ckpt = out.join("ckpt_00000002.safetensors");
    let before = std::fs::read(&ckpt).unwrap();
    let e = err(&[
        "--set",
        "max_steps=4",
        "--set",
        "batch_size=1",
        "--set",
        "tokens_per_step=64",
        "--resume",
        "latest",
        "--nproc-per-node",
        "2",
    ]);
    assert!(e.contains("world size"), "{e}");
    assert_eq!(std::fs::read(&ckpt).unwrap(), before, "a refused resume must not touch the checkpoint");
    // A checkpoint of another model: refused, naming the field.
    let e = err(&["--set", "max_steps=4", "--set", "model.n_layer=3", "--resume", "latest"]);
    assert!(e.contains("n_layer"), "{e}");
    // A checkpoint of the other window sampling: refused, naming the setting that resumes it.
    let e = err(&["--set", "max_steps=4", "--set", "sampling=\"stream\"", "--resume", "latest"]);
    assert!(
        e.contains("`random` sampling, but this loader has `stream`") && e.contains("sampling = \"random\""),
        "{e}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// SIGTERM to the launcher of 2 Gloo ranks: it forwards the signal, both ranks agree on the step to
/// stop at (through the per-step all-reduce), rank 0 saves there, the launcher exits with 75, and
/// `--resume latest` on 2 ranks ends with the uninterrupted 2-rank run's weights, bit for bit.
#[test]
fn sigterm_to_the_launcher_saves_on_every_rank_and_resumes_exactly() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = scratch("preempt");
    let data = build_data(&root);
    let args = |out: &Path| {
        let mut a = base_args(&data, out);
        a.extend(
            ["--set", "max_steps=40", "--set", "ckpt_every=0", "--set", "batch_size=2", "--set", "tokens_per_step=128"]
                .map(String::from),
        );
        a.extend(["--nproc-per-node", "2"].map(String::from));
        a
    };
    let whole = root.join("whole");
    let o = run(&args(&whole), &[]);
    assert!(o.status.success(), "uninterrupted: {}", String::from_utf8_lossy(&o.stderr));

    let cut = root.join("cut");
    let mut launcher = spawn_trainer(&args(&cut), "20");
    let start = Instant::now();
    while std::fs::read_to_string(cut.join("metrics.jsonl")).unwrap_or_default().lines().count() < 8 {
        assert!(start.elapsed() < Duration::from_secs(120), "no 8 steps after 120 s");
        assert!(launcher.try_wait().unwrap().is_none(), "the run ended before the signal");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: the launcher is our unreaped child.
    unsafe { libc::kill(launcher.id() as libc::pid_t, libc::SIGTERM) };
    let signalled = Instant::now();
    let output = launcher.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(trainer::process::PREEMPTED_EXIT), "{stderr}");
    assert!(signalled.elapsed() < Duration::from_secs(30), "took {:?} to save and stop", signalled.elapsed());
    let stopped = losses(&cut).len();
    assert!(stopped < 40, "stopped at {stopped}");
    let ckpts = trainer::train::list_checkpoints(&cut).unwrap();
    assert_eq!(ckpts.last().unwrap().file_name().unwrap().to_string_lossy(), format!("ckpt_{stopped:08}.safetensors"));

    let mut resume = args(&cut);
    resume.extend(["--resume", "latest"].map(String::from));
    let o = run(&resume, &[]);
    assert!(o.status.success(), "resumed: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(losses(&cut), losses(&whole), "the resumed run's losses differ");
    let (a, b) = (weights(&whole.join("ckpt_00000040.safetensors")), weights(&cut.join("ckpt_00000040.safetensors")));
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert!(ta.equal(tb), "{na} differs from the uninterrupted run");
    }
    std::fs::remove_dir_all(&root).unwrap();
}
