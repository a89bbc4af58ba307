//! The `trainer` binary as a user runs it: a repeated command and a kill lose nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

const TRAINER: &str = env!("CARGO_BIN_EXE_trainer");

/// A tiny run of `steps` steps into `root/name`, checkpointing every 10; its config file.
fn config(root: &Path, name: &str, steps: usize) -> PathBuf {
    common::tiny_config(root, name, steps, 10, 2)
}

fn trainer(config: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(TRAINER);
    cmd.args(["train", "--no-progress", "--eval-lengths", "1", "--config"]).arg(config).args(extra);
    cmd.env("RUST_LOG", "warn");
    cmd
}

fn run(config: &Path, extra: &[&str]) -> Output {
    trainer(config, extra).output().unwrap()
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    out.sort();
    out
}

/// Every complete line of `metrics.jsonl`, parsed. A line without its newline is one the trainer
/// is still writing (or was killed writing): read while the run goes on, the file can end in one,
/// and parsing it failed this test once in CI.
fn logged_lines(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .collect()
}

/// The `step` of every step line of `metrics.jsonl` (events, such as a pre-emption, left out).
fn logged_steps(dir: &Path) -> Vec<usize> {
    logged_lines(dir)
        .iter()
        .filter(|l| l.get("event").is_none())
        .map(|l| l["step"].as_u64().unwrap() as usize)
        .collect()
}

/// The final checkpoints of two runs hold the same tensors, bit for bit (weights and optimiser).
fn assert_same_final_state(a: &Path, b: &Path) {
    let tensors = |p: &Path| {
        let mut t = gpt_model::checkpoint::read_tensors(p, "").unwrap();
        t.sort_by(|x, y| x.0.cmp(&y.0));
        t
    };
    let (a, b) = (tensors(a), tensors(b));
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert!(ta.equal(tb), "{na} differs from the uninterrupted run");
    }
}

#[test]
fn a_second_run_into_a_directory_with_checkpoints_is_refused_unless_told() {
    let root = tempfile::tempdir().unwrap();
    let cfg = finished_run(root.path(), 20);
    let out = root.path().join("run");
    let before = files(&out);
    assert!(before.iter().any(|(n, _)| n == "ckpt_00000020.safetensors"));

    // The same command again: refused, naming the checkpoints and both ways on; nothing touched.
    let again = run(&cfg, &[]);
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    for needle in ["ckpt_00000010.safetensors", "ckpt_00000020.safetensors", "--resume", "--overwrite"] {
        assert!(err.contains(needle), "the refusal lacks `{needle}`: {err}");
    }
    assert!(files(&out) == before, "a refused run changed the directory");

    // --overwrite starts over: one log line per step of the new run, not of both.
    let over = run(&cfg, &["--overwrite"]);
    assert!(over.status.success(), "{}", String::from_utf8_lossy(&over.stderr));
    assert_eq!(logged_steps(&out), (1..=20).collect::<Vec<_>>());
    // --resume and --overwrite together make no sense.
    assert!(!run(&cfg, &["--overwrite", "--resume", "latest"]).status.success());
}

/// A tiny run of `steps` steps trained to the end in `root/run` (data built first); its config.
fn finished_run(root: &Path, steps: usize) -> PathBuf {
    common::tiny_data(root);
    let cfg = config(root, "run", steps);
    let out = run(&cfg, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cfg
}

/// A run of `steps` steps trained whole into `root/whole`, and the config of the same run into
/// `root/cut` (not started), with its directory: what the interruption tests compare.
fn whole_and_cut(root: &Path, steps: usize) -> (PathBuf, PathBuf) {
    common::tiny_data(root);
    let out = run(&config(root, "whole", steps), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (config(root, "cut", steps), root.join("cut"))
}

#[test]
fn a_killed_run_resumed_logs_every_step_once_and_ends_with_the_uninterrupted_weights() {
    let root = tempfile::tempdir().unwrap();
    let steps = 100;
    // The same run, killed (SIGKILL) once it has logged 25 steps, so its log runs past its last
    // checkpoint (step 20 or later).
    let (cut, dir) = whole_and_cut(root.path(), steps);
    let mut child = trainer(&cut, &[]).stderr(std::process::Stdio::null()).spawn().unwrap();
    let killed_at = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before it could be killed: make it longer");
        }
        let logged = logged_steps(&dir).len();
        if logged >= 25 {
            child.kill().unwrap();
            child.wait().unwrap();
            break logged_steps(&dir).len();
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    assert!(killed_at < steps, "killed at step {killed_at}: the run had finished");
    let last_ckpt = trainer::train::list_checkpoints(&dir).unwrap().pop().expect("a checkpoint before the kill");
    let resumed = run(&cut, &["--resume", "latest"]);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));

    assert_eq!(logged_steps(&dir), (1..=steps).collect::<Vec<_>>(), "resumed from {}", last_ckpt.display());
    // Same final weights and optimiser state, bit for bit, and the same logged losses.
    let name = format!("ckpt_{steps:08}.safetensors");
    assert_same_final_state(&root.path().join("whole").join(&name), &dir.join(&name));
    let losses = |d: &Path| -> Vec<f64> {
        std::fs::read_to_string(d.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].as_f64().unwrap())
            .collect()
    };
    assert_eq!(losses(&dir), losses(&root.path().join("whole")));
}

#[test]
fn a_second_training_into_a_running_ones_directory_is_refused_and_touches_nothing() {
    let root = tempfile::tempdir().unwrap();
    common::tiny_data(root.path());
    let long = config(root.path(), "run", 100_000);
    let dir = root.path().join("run");
    let mut first = trainer(&long, &[]).stderr(std::process::Stdio::null()).spawn().unwrap();
    while logged_steps(&dir).is_empty() {
        assert!(first.try_wait().unwrap().is_none(), "the first run ended early");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The same directory from another config (another length): refused at once, naming the directory
    // and the first run's pid; its config.toml is still the first run's.
    let other = common::tiny_config(root.path(), "run", 30, 10, 2);
    let config_before = std::fs::read(dir.join("config.toml")).unwrap();
    let second = run(&other, &["--overwrite"]);
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains(&dir.display().to_string()) && err.contains(&format!("process {}", first.id())), "{err}");
    assert_eq!(std::fs::read(dir.join("config.toml")).unwrap(), config_before, "the refused run wrote its config");
    assert!(trainer::train::list_checkpoints(&dir).unwrap().iter().all(|c| c.exists()));
    // Killed, the first run's lock dies with it: the next training there is not blocked.
    first.kill().unwrap();
    first.wait().unwrap();
    let after = run(&other, &["--overwrite"]);
    assert!(after.status.success(), "{}", String::from_utf8_lossy(&after.stderr));
}

#[test]
fn off_a_terminal_training_prints_a_plain_line_per_tenth_and_per_evaluation() {
    let root = tempfile::tempdir().unwrap();
    common::tiny_data(root.path());
    let cfg = config(root.path(), "run", 20);
    // Without --no-progress, stderr piped to this test: no bar, plain lines.
    let out = Command::new(TRAINER)
        .args(["train", "--eval-lengths", "1", "--config"])
        .arg(&cfg)
        .args(["--set", "eval_every=10"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("trainer: step ")).collect();
    assert_eq!(lines.len(), 10, "one line per tenth of 20 steps: {err}");
    for (i, l) in lines.iter().enumerate() {
        assert!(l.starts_with(&format!("trainer: step {}/20, loss ", 2 * (i + 1))), "{l}");
        assert!(l.contains("tok/s") && l.ends_with("min left"), "{l}");
    }
    // Steps 10 and 20 evaluate: their lines carry the validation loss.
    assert!(lines[4].contains(", val ") && lines[9].contains(", val ") && !lines[0].contains(", val "), "{lines:?}");
    assert!(!err.contains('\r') && !err.contains('\u{1b}'), "bar output in a log");
}

#[test]
fn version_names_the_git_revision_and_closed_choices_are_checked() {
    let v = Command::new(TRAINER).arg("--version").output().unwrap();
    assert!(v.status.success());
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(text.starts_with("trainer ") && text.contains("(git "), "{text}");
    let bad = Command::new(TRAINER).args(["eval", "--checkpoint", "x", "--rope", "sideways"]).output().unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("ntk") && err.contains("plain") && err.contains("both"), "{err}");
}

/// One checkpoint, one validation number: `trainer train`'s final evaluation (its result.json) and
/// `trainer eval` score the same spans spread over the validation split, so they print the same 1x
/// loss; and both say which tokens they scored.
#[test]
fn trainer_eval_prints_the_1x_loss_of_the_runs_result() {
    let root = tempfile::tempdir().unwrap();
    common::tiny_data(root.path());
    let out = run(&config(root.path(), "run", 10), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("spread over the validation split"));
    let dir = root.path().join("run");
    let result: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("result.json")).unwrap()).unwrap();
    let trained = result["lengths"][0]["loss"].as_f64().unwrap();
    assert_eq!(result["lengths"][0]["multiple"], 1);
    let ckpt = result["checkpoint"].as_str().unwrap();
    let eval = Command::new(TRAINER)
        .args(["eval", "--lengths", "1", "--rope", "ntk", "--json", "--checkpoint", ckpt])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(eval.status.success(), "{}", String::from_utf8_lossy(&eval.stderr));
    let e: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    let evaluated = e["lengths"][0]["loss"].as_f64().unwrap();
    assert!((evaluated - trained).abs() < 1e-9, "trainer eval {evaluated} against the run's {trained}");
    assert!(e["validation"].as_str().unwrap().contains("targets in"), "{}", e["validation"]);
}

/// Every file of `dir` but the lock file, with its bytes.
fn files_but_lock(dir: &Path) -> Vec<(String, Vec<u8>)> {
    files(dir).into_iter().filter(|(n, _)| n != trainer::process::LOCK_FILE).collect()
}

/// A resume that is refused (here: a model that differs from the run's) leaves the directory
/// byte-identical: every check runs before anything is written.
#[test]
fn a_refused_resume_leaves_the_directory_byte_identical() {
    let root = tempfile::tempdir().unwrap();
    let cfg = finished_run(root.path(), 20);
    let dir = root.path().join("run");
    let before = files_but_lock(&dir);
    let refused = run(&cfg, &["--resume", "latest", "--set", "model.n_layer=5", "--set", "max_steps=30"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("model.n_layer") && err.contains("ckpt_00000020"), "{err}");
    assert_eq!(files_but_lock(&dir), before, "a refused resume changed the run's directory");
}

/// `--resume latest` whose newest checkpoint is cut short refuses, naming it and the newest intact
/// one with the command that resumes from it; it never starts over, and touches nothing.
#[test]
fn resume_latest_refuses_a_truncated_newest_checkpoint_and_names_the_intact_one() {
    let root = tempfile::tempdir().unwrap();
    let cfg = finished_run(root.path(), 20);
    let dir = root.path().join("run");
    let newest = dir.join("ckpt_00000020.safetensors");
    let len = std::fs::metadata(&newest).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&newest).unwrap().set_len(len / 2).unwrap();
    let before = files_but_lock(&dir);
    let refused = run(&cfg, &["--resume", "latest", "--set", "max_steps=30"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("ckpt_00000020.safetensors") && err.contains("truncated or corrupt"), "{err}");
    assert!(err.contains("--resume") && err.contains("ckpt_00000010.safetensors"), "{err}");
    assert_eq!(files_but_lock(&dir), before, "a refused resume changed the run's directory");
    // The command it names resumes.
    let intact = dir.join("ckpt_00000010.safetensors");
    std::fs::remove_file(&newest).unwrap();
    let resumed = run(&cfg, &["--resume", intact.to_str().unwrap(), "--set", "max_steps=30"]);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
}

/// SIGTERM mid-run (a scheduler's pre-emption): the run saves a checkpoint at the next step
/// boundary, logs a `preempted` event, exits with status 75, and `--resume latest` ends with the
/// uninterrupted run's weights and optimiser state, bit for bit.
#[test]
fn sigterm_saves_at_the_next_step_and_resume_latest_ends_with_the_uninterrupted_weights() {
    let root = tempfile::tempdir().unwrap();
    let steps = 60;
    let (cut, dir) = whole_and_cut(root.path(), steps);
    let mut child = trainer(&cut, &[]).stderr(std::process::Stdio::piped()).spawn().unwrap();
    loop {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before the signal: make it longer");
        if logged_steps(&dir).len() >= 13 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // SAFETY: `child` is our unreaped child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(trainer::process::PREEMPTED_EXIT), "{stderr}");
    assert!(stderr.contains("stopped by SIGTERM") && stderr.contains("--resume latest"), "{stderr}");
    let events: Vec<serde_json::Value> = logged_lines(&dir).into_iter().filter(|l| l.get("event").is_some()).collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!((events[0]["event"].as_str(), events[0]["signal"].as_str()), (Some("preempted"), Some("SIGTERM")));
    let stopped = events[0]["step"].as_u64().unwrap() as usize;
    assert!(stopped < steps && stopped == *logged_steps(&dir).last().unwrap(), "stopped at {stopped}");
    // Saved at the step it stopped at, not only at the last periodic checkpoint.
    assert!(dir.join(format!("ckpt_{stopped:08}.safetensors")).exists());

    let resumed = run(&cut, &["--resume", "latest"]);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(logged_steps(&dir), (1..=steps).collect::<Vec<_>>());
    let name = format!("ckpt_{steps:08}.safetensors");
    assert_same_final_state(&root.path().join("whole").join(&name), &dir.join(&name));
}

/// A disk that fills while a checkpoint is written (a fault injected after half its bytes): the
/// run stops with an error naming the file and the bytes it needs, the partial file is gone, the
/// earlier checkpoints are byte-identical, and `--resume latest` continues from the last of them.
#[test]
#[cfg_attr(not(feature = "failpoints"), ignore = "needs the `failpoints` feature, which `cargo xtask test` enables")]
fn a_full_disk_while_saving_loses_nothing_and_says_what_it_needs() {
    let root = tempfile::tempdir().unwrap();
    let cfg = finished_run(root.path(), 20);
    let dir = root.path().join("run");
    let size = std::fs::metadata(dir.join("ckpt_00000020.safetensors")).unwrap().len();
    let ckpts =
        |d: &Path| -> Vec<(String, Vec<u8>)> { files(d).into_iter().filter(|(n, _)| n.starts_with("ckpt_")).collect() };
    let before = ckpts(&dir);
    let full = trainer(&cfg, &["--resume", "latest", "--set", "max_steps=30"])
        .env("FAILPOINTS", format!("{}=return({})", gpt_model::io::WRITE_FAILPOINT, size / 2))
        .output()
        .unwrap();
    assert!(!full.status.success());
    let err = String::from_utf8_lossy(&full.stderr);
    assert!(
        err.contains("ckpt_00000030.safetensors") && err.contains("disk is full") && err.contains("bytes"),
        "{err}"
    );
    assert_eq!(ckpts(&dir), before, "the earlier checkpoints changed");
    let leftovers: Vec<String> = files(&dir).into_iter().map(|(n, _)| n).filter(|n| n.contains(".tmp")).collect();
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
    let resumed = run(&cfg, &["--resume", "latest", "--set", "max_steps=30"]);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert!(dir.join("ckpt_00000030.safetensors").exists());
}
