//! `reproduce` under a scheduler: a SIGTERM while two trainings run makes both save at their step and
//! the command exit with status 75; the same command then finishes with the numbers and report of an
//! uninterrupted run. And a plan that does not fit the output's free space is refused before anything
//! is trained.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const REPRODUCE: &str = env!("CARGO_BIN_EXE_reproduce");

/// Two variants, one seed each, long enough to be caught mid-training (checkpoints every 50 steps,
/// so the stop falls between two of them), two at a time.
const ARGS: [&str; 14] = [
    "--scale",
    "smoke",
    "--only",
    "softmax,lssa",
    "--seeds",
    "1",
    "--jobs",
    "2",
    "--set",
    "max_steps=300",
    "--set",
    "ckpt_every=50",
    "--set",
    "keep_last=2",
];

/// How long the stopped trainings may take to save and exit (the smoke model saves in milliseconds).
const GRACE: Duration = Duration::from_secs(30);

fn reproduce(out: &Path, log: &Path) -> Command {
    let mut cmd = Command::new(REPRODUCE);
    cmd.args(ARGS).arg("--out").arg(out).env("RUST_LOG", "warn");
    // A file, not a pipe: the progress lines of two trainings would fill a pipe nobody reads yet.
    cmd.stdout(Stdio::null()).stderr(std::fs::File::create(log).unwrap());
    cmd
}

fn run_dirs(out: &Path) -> [PathBuf; 2] {
    ["softmax", "lssa"].map(|v| experiments::runner::run_dir(out, v, 0))
}

/// The complete lines of a run's `metrics.jsonl`, parsed (the last may be half written).
fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A run's result with what differs between two runs of the same numbers blanked: the times, the
/// throughput, the command and revisions, and the output directory inside paths.
fn numbers(out: &Path, dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("result.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text.replace(&out.display().to_string(), "OUT")).unwrap();
    for k in ["train_wall_s", "eval_wall_s", "tokens_per_s", "command", "git_revision"] {
        v.as_object_mut().unwrap().remove(k).unwrap_or_else(|| panic!("result.json has no `{k}`"));
    }
    assert!(!v["evals"].as_array().unwrap().is_empty(), "{}: no evaluations", dir.display());
    v
}

/// The report without its wall-time line and the runs table's time and throughput columns.
fn report(out: &Path) -> String {
    let text = std::fs::read_to_string(out.join("REPRODUCTION.md")).unwrap();
    let text = text.replace(&out.display().to_string(), "OUT");
    let mut kept = Vec::new();
    for line in text.lines().filter(|l| !l.contains("run time:")) {
        let mut cells: Vec<&str> = line.split('|').collect();
        // `| variant | seed | lr | final | late drop | train s | eval s | tokens/s | git | note |`
        if cells.len() == 12 && cells[1].trim_start().starts_with('`') {
            cells[6..9].fill(" - ");
        }
        kept.push(cells.join("|"));
    }
    kept.join("\n")
}

#[test]
fn sigterm_saves_every_training_and_the_same_command_ends_with_the_uninterrupted_numbers() {
    let root = tempfile::tempdir().unwrap();
    let (cut, whole) = (root.path().join("cut"), root.path().join("whole"));
    let log = root.path().join("cut.log");
    let mut child = reproduce(&cut, &log).spawn().unwrap();
    // Both trainings under way, past their first checkpoint.
    let dirs = run_dirs(&cut);
    let started = Instant::now();
    while dirs.iter().any(|d| metrics(d).len() < 60) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "reproduce ended first: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(started.elapsed() < Duration::from_secs(120), "the trainings did not progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: `child` is our unreaped child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let signalled = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(signalled.elapsed() < GRACE, "no exit within {GRACE:?} of SIGTERM");
        std::thread::sleep(Duration::from_millis(5));
    };
    let stop_s = signalled.elapsed().as_secs_f64();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(trainer::process::PREEMPTED_EXIT), "{stderr}");
    assert!(stderr.contains("stopped by SIGTERM") && stderr.contains("continue with the same command"), "{stderr}");
    assert!(stderr.contains(&format!("--out {}", cut.display())), "the command shown lacks --out: {stderr}");
    for dir in &dirs {
        let lines = metrics(dir);
        let events: Vec<&serde_json::Value> = lines.iter().filter(|l| l.get("event").is_some()).collect();
        assert_eq!(events.len(), 1, "{}: {events:?}", dir.display());
        assert_eq!((events[0]["event"].as_str(), events[0]["signal"].as_str()), (Some("preempted"), Some("SIGTERM")));
        let step = events[0]["step"].as_u64().unwrap() as usize;
        assert!(step < 300, "{}: trained to the end before the signal", dir.display());
        // Its newest checkpoint is the step it stopped at (not the last periodic one), and whole.
        let newest = trainer::train::list_checkpoints(dir).unwrap().pop().unwrap();
        assert_eq!(newest, trainer::train::checkpoint_path(dir, step), "{}", dir.display());
        assert_eq!(gpt_model::checkpoint::read_metadata(&newest).unwrap()["step"], step.to_string());
        gpt_model::checkpoint::Checkpoint::read(&newest).unwrap();
        // No result: it is written once the training ends.
        assert!(!dir.join("result.json").exists(), "{}: a result of a stopped training", dir.display());
        let temporary: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp"))
            .collect();
        assert!(temporary.is_empty(), "{}: partial files {temporary:?}", dir.display());
    }

    // The same command again continues to the end.
    let rerun_start = Instant::now();
    let again = reproduce(&cut, &log).status().unwrap();
    let rerun_s = rerun_start.elapsed().as_secs_f64();
    assert!(again.success(), "{}", std::fs::read_to_string(&log).unwrap());
    let whole_start = Instant::now();
    let uninterrupted = reproduce(&whole, &root.path().join("whole.log")).status().unwrap();
    let whole_s = whole_start.elapsed().as_secs_f64();
    assert!(uninterrupted.success(), "{}", std::fs::read_to_string(root.path().join("whole.log")).unwrap());
    eprintln!("SIGTERM to exit {stop_s:.2} s; rerun {rerun_s:.1} s; uninterrupted run {whole_s:.1} s");
    for (a, b) in run_dirs(&cut).iter().zip(&run_dirs(&whole)) {
        assert_eq!(numbers(&cut, a), numbers(&whole, b), "{} differs from the uninterrupted run", a.display());
    }
    assert_eq!(report(&cut), report(&whole));
}

#[test]
fn a_plan_larger_than_the_free_space_is_refused_before_anything_is_trained() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    let o = Command::new(REPRODUCE)
        .args(["--scale", "smoke", "--only", "softmax", "--seeds", "1", "--out"])
        .arg(&out)
        // The free space the check sees: 1 MB, less than one smoke run's files.
        .env("LSSA_TEST_FREE_BYTES", "1000000")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for needle in ["not enough disk space", "checkpoints", "more", "976.6 KiB free", &out.display().to_string()] {
        assert!(err.contains(needle), "`{needle}` missing: {err}");
    }
    // Nothing trained, nothing generated.
    assert!(!out.join("softmax").exists() && !out.join("data").exists(), "{err}");
}
