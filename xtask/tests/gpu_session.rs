//! `benches/gpu-session.sh` is run on a GPU machine that has no Rust toolchain, where a mistake costs
//! scarce GPU time: its dry run (`DRY_RUN=1`, no GPU or binary needed) must name every stage's command,
//! a real run without a GPU must stop at once and say so, and the kernel switch's two calls (`ship1`,
//! `ship2`) must reach their verdict and the files they promise. (The `science` stage runs the
//! reproduction binary: `crates/experiments/tests/gpu_science.rs` rehearses it.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace")
}

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lssa-gpu-session-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).expect("temporary directory");
    dir
}

/// The script run from `cwd` on `stage` with `env` (and no `nvidia-smi` unless `env` names one).
fn session(cwd: &Path, stage: &str, env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("benches/gpu-session.sh")).arg(stage).current_dir(cwd);
    cmd.env_remove("DRY_RUN").env("NVIDIA_SMI", "/nonexistent/nvidia-smi");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("bash runs")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn the_gpu_session_dry_run_prints_every_stage_and_runs_nothing() {
    let out = std::env::temp_dir().join(format!("lssa-gpu-session-dry-{}", std::process::id()));
    let dry = [("DRY_RUN", Path::new("1")), ("OUT", &out), ("BIN", Path::new("/nonexistent/bench-cuda"))];
    let o = session(root(), "all", &dry);
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    for stage in ["check", "lab", "model", "full64", "full128", "flex", "pytest"] {
        assert!(all.contains(&format!("would run ({stage}, at most ")), "no {stage} in:\n{all}");
    }
    assert!(all.contains("--head-dims 128") && all.contains("--flex") && all.contains("pytest -q"), "{all}");
    // The check of Auto's kernels: the plan, then its two calls, each with its limits, and the GPU it
    // lacks here.
    let plan = session(root(), "ship", &dry);
    let plan_text = text(&plan);
    assert!(plan.status.success(), "{plan_text}");
    for what in [
        "benches/gpu-session.sh ship1",
        "benches/gpu-session.sh ship2",
        "maturin build --release)",
        "bench-cuda warm --arch compute_90a --kernels v7,v8 --python-suite crates/lssa-py/tests/test_cuda.py",
    ] {
        assert!(plan_text.contains(what), "no {what} in:\n{plan_text}");
    }
    let ship1 = session(root(), "ship1", &dry);
    let ship1_text = text(&ship1);
    assert!(ship1.status.success(), "{ship1_text}");
    // The PTX cache warmed first, then the check beside the ordered tests, each within its limit.
    let warm = ship1_text.find("would run (ship-warm, at most 80 s)").expect(&ship1_text);
    let check = ship1_text.find("would run (ship-check, at most 150 s)").expect(&ship1_text);
    assert!(warm < check, "{ship1_text}");
    assert!(
        ship1_text.contains("warm --kernels v7,v8 --python-suite crates/lssa-py/tests/test_cuda.py"),
        "{ship1_text}"
    );
    assert!(ship1_text.contains("check --kernels v7,v8"), "{ship1_text}");
    assert!(ship1_text.contains("would run (ship-pytest, at most 150 s"), "{ship1_text}");
    assert!(
        ship1_text.contains("pytest -v -rs -p pytest_auto_first crates/lssa-py/tests/test_cuda.py"),
        "{ship1_text}"
    );
    assert!(ship1_text.contains("no .gpu/ptx-cache.tar.xz"), "{ship1_text}");
    assert!(ship1_text.contains("no GPU on this machine") && ship1_text.contains("exit 2"), "{ship1_text}");
    let ship2 = session(root(), "ship2", &dry);
    let ship2_text = text(&ship2);
    assert!(ship2.status.success(), "{ship2_text}");
    assert!(ship2_text.contains("would run (ship-speed64, at most 220 s)"), "{ship2_text}");
    assert!(ship2_text.contains("--head-dims 64 --lengths 4096,16384 --flex"), "{ship2_text}");
    assert!(ship2_text.contains("would run (ship-speed128, at most 130 s)"), "{ship2_text}");
    // Lab v10's call: the probes and the check, then the speed beside v5, each within its limit.
    let v10 = session(root(), "v10", &dry);
    let v10_text = text(&v10);
    assert!(v10.status.success(), "{v10_text}");
    let check = v10_text.find("would run (v10-check, at most 170 s)").expect(&v10_text);
    let speed = v10_text.find("would run (v10-speed, at most 170 s)").expect(&v10_text);
    assert!(check < speed, "{v10_text}");
    assert!(v10_text.contains("check --kernels v10 --only-t 77,300"), "{v10_text}");
    assert!(v10_text.contains("speed --head-dims 64 --lengths 4096,16384 --kernels v5,v10"), "{v10_text}");
    assert!(!out.exists(), "a dry run wrote {}", out.display());
    // An unknown stage is refused, naming the stages.
    let bad = session(root(), "everything", &[("DRY_RUN", Path::new("1"))]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("science, ship, ship1"));
}

#[test]
fn a_real_run_without_a_gpu_stops_at_once_and_says_why() {
    let dir = scratch("nogpu");
    let out = dir.join("out");
    for stage in ["science", "ship1", "ship2", "check", "pytest"] {
        let o = session(&dir, stage, &[("OUT", &out), ("BIN", Path::new("/nonexistent/bench-cuda"))]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{stage}: {}", text(&o));
        assert!(err.contains("no GPU on this machine: /nonexistent/nvidia-smi is not installed"), "{stage}: {err}");
        if stage != "pytest" {
            assert!(err.contains("no /nonexistent/bench-cuda"), "{stage}: {err}");
        }
    }
    // A driver that lists no device counts as no GPU.
    let smi = fake(&dir, "nvidia-smi", "echo 'No devices were found'");
    let o = session(&dir, "check", &[("OUT", &out), ("NVIDIA_SMI", &smi), ("BIN", &smi)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("lists no CUDA device (No devices were found)"));
    assert!(!out.exists(), "a refused run wrote {}", out.display());
    std::fs::remove_dir_all(&dir).ok();
}

/// An executable shell script `name` in `dir` with `body`.
fn fake(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write a script");
    let chmod = Command::new("chmod").arg("+x").arg(&path).status().expect("chmod runs");
    assert!(chmod.success());
    path
}

/// ship1 and ship2 on stand-ins for the driver, bench-cuda and Python: the check and the tests run
/// side by side, the tests under Auto, and every promised file is there with the verdict, which
/// reads Auto's rows of the check (v5 + v7, v3 + v7) and not the lab's (v8).
#[test]
fn the_ship_calls_write_their_files_and_verdicts() {
    let dir = scratch("ship");
    std::fs::create_dir_all(dir.join(".gpu")).unwrap();
    std::fs::write(dir.join(".gpu/lssa-0.1.0-cp39-abi3-linux_x86_64.whl"), "").unwrap();
    let smi = fake(&dir, "nvidia-smi", r#"[ "$1" = -L ] && echo 'GPU 0: Stand-in (UUID: GPU-0)' || echo 'name, 0'"#);
    // Writes its --out as bench-cuda does; with FAIL_CHECK set the check prints a failing row of that
    // pair and exits 1, as bench-cuda does when any row fails.
    let bin = fake(
        &dir,
        "bench-cuda",
        r#"out=; prev=; for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
echo "bench-cuda $*"; echo '{"partial": false}' > "$out"
[ "$1" = check ] && echo "lssa  77  64  Bf16  v5+v7 | 2e-3 | ok" && [ -n "${FAIL_CHECK:-}" ] &&
  echo "lssa  77  64  Bf16  $FAIL_CHECK | 0.5 | FAIL"
[ "$1" = check ] && echo "wrote $out" && [ -n "${FAIL_CHECK:-}" ] && exit 1; exit 0"#,
    );
    let py = fake(
        &dir,
        "python",
        r#"case "$*" in *"pip install"*) echo installed ;; *"-c "*) echo "$LSSA_CUDA_KERNEL" ;;
*pytest*) echo "pytest $* under $LSSA_CUDA_KERNEL"; echo "test_cuda.py::t[77-64-lssa-dtype2] PASSED"
  [ -n "${CUT_PYTEST:-}" ] && exit 124; echo '114 passed' ;; esac"#,
    );
    let out = dir.join("out");
    let env = [("OUT", out.as_path()), ("NVIDIA_SMI", &smi), ("BIN", &bin), ("PYTHON", &py)];
    let o = session(&dir, "ship1", &env);
    let ship1 = text(&o);
    assert!(o.status.success(), "{ship1}");
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(read("ship-check.txt").contains("bench-cuda check --kernels v7,v8 --out"), "{ship1}");
    assert!(read("ship-check.json").contains("\"partial\": false"));
    assert!(read("ship-pytest.txt").contains("tests/test_cuda.py under auto"), "{ship1}");
    assert!(read("ship-pytest.txt").starts_with("installed"), "the wheel's install opens the tests' file");
    assert!(read("ship-warm.txt").contains("bench-cuda warm --kernels v7,v8 --python-suite"), "{ship1}");
    assert!(read("ship1-verdict.txt").starts_with("ship1: PASS (Auto's check rows failed: 0, the lab's v8 rows: 0"));
    assert!(read("ship1-verdict.txt").contains("tests passed: 1, failed: 0"), "{}", read("ship1-verdict.txt"));
    assert!(read("gpu.txt").contains("name"));
    assert!(ship1.trim_end().ends_with("hold on this GPU."), "{ship1}");
    let o = session(&dir, "ship2", &env);
    let ship2 = text(&o);
    assert!(o.status.success(), "{ship2}");
    assert!(read("ship-speed64.txt").contains("speed --head-dims 64 --lengths 4096,16384 --flex"), "{ship2}");
    assert!(read("ship-speed128.txt").contains("speed --head-dims 128 --lengths 4096,16384"), "{ship2}");
    assert!(read("ship2-verdict.txt").contains("speed64 exit 0, speed128 exit 0"), "{ship2}");
    // A failing row of the lab's v8 fails the check but not Auto's verdict; one of Auto's pairs fails both.
    let lab_failed = session(&dir, "ship1", &[env.as_slice(), &[("FAIL_CHECK", Path::new("v8+v9"))]].concat());
    assert!(lab_failed.status.success(), "{}", text(&lab_failed));
    assert!(
        read("ship1-verdict.txt")
            .starts_with("ship1: PASS (Auto's check rows failed: 0, the lab's v8 rows: 1; check exit 1")
    );
    // Tests cut by their limit with nothing failed: incomplete, not a failure of the kernels.
    let cut = session(&dir, "ship1", &[env.as_slice(), &[("CUT_PYTEST", Path::new("1"))]].concat());
    assert_eq!(cut.status.code(), Some(1), "{}", text(&cut));
    assert!(read("ship1-verdict.txt").starts_with("ship1: INCOMPLETE (Auto's check rows failed: 0"), "{}", text(&cut));
    assert!(text(&cut).contains("what ran passed"), "{}", text(&cut));
    // The v10 call: PASS on a clean check, FAIL on a failing v10 row, the speed rows of v5 and v10 in
    // its verdict.
    let o = session(&dir, "v10", &env);
    assert!(o.status.success(), "{}", text(&o));
    assert!(read("v10-check.txt").contains("bench-cuda check --kernels v10 --only-t 77,300 --out"));
    assert!(read("v10-speed.txt").contains("bench-cuda speed --head-dims 64 --lengths 4096,16384 --kernels v5,v10"));
    assert!(read("v10-verdict.txt").starts_with("v10: PASS (probe modes failed: 0, v10 rows failed: 0"));
    let o = session(&dir, "v10", &[env.as_slice(), &[("FAIL_CHECK", Path::new("v10+v7"))]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(read("v10-verdict.txt").starts_with("v10: FAIL (probe modes failed: 0, v10 rows failed: 1"));
    let failed = session(&dir, "ship1", &[env.as_slice(), &[("FAIL_CHECK", Path::new("v3+v7"))]].concat());
    let failed_text = text(&failed);
    assert_eq!(failed.status.code(), Some(1), "{failed_text}");
    assert!(read("ship1-verdict.txt").starts_with("ship1: FAIL (Auto's check rows failed: 1"), "{failed_text}");
    assert!(failed_text.contains("Kernel::Auto's kernels FAIL on this GPU"), "{failed_text}");
    std::fs::remove_dir_all(&dir).ok();
}
