//! `benches/gpu-session.sh science` (the `gpu` scale's headline rows on a GPU machine, with the
//! `reproduce` binary built here): its plan models the scale this crate defines, a real run without a
//! GPU or data stops at once and says why, and its rehearsal (`REHEARSAL=1`: the smoke scale on the
//! CPU) runs the same stage end to end, so the GPU call can only fail on the GPU: every run in
//! priority order, the results packed as they come, and the report rendered from the unpacked files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use experiments::runner::{RunResult, run_dir};
use experiments::scale::Scale;
use experiments::spec::EvalKey;

const REPRODUCE: &str = env!("CARGO_BIN_EXE_reproduce");

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/gpu-session.sh")
}

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lssa-gpu-science-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).expect("temporary directory");
    dir
}

/// The science stage run from `cwd` with `env`, with no `nvidia-smi` unless `env` names one.
fn science(cwd: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(script()).arg("science").current_dir(cwd);
    for k in ["DRY_RUN", "REHEARSAL", "RUNS", "SCIENCE_S", "SCIENCE_SEEDS", "LSSA_PTX_CACHE"] {
        cmd.env_remove(k);
    }
    cmd.env("NVIDIA_SMI", "/nonexistent/nvidia-smi").env("BIN", REPRODUCE).env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("bash runs")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

/// The number after `prefix` on the plan's line that holds it.
fn number_after(plan: &str, prefix: &str) -> f64 {
    let at = plan.find(prefix).unwrap_or_else(|| panic!("no `{prefix}` in:\n{plan}")) + prefix.len();
    let word: String = plan[at..].chars().take_while(|c| c.is_ascii_digit() || ".e+-".contains(*c)).collect();
    word.parse().unwrap_or_else(|e| panic!("`{prefix}{word}`: {e}"))
}

/// The plan's model is the `gpu` scale's own: its parameter count and training FLOPs per token are
/// `ModelConfig`'s, its validation targets the scale's, and it says that seed 0 of every row fits the
/// call, the reason the recipe is not shrunk.
#[test]
fn the_dry_run_plans_the_gpu_scale_and_runs_nothing() {
    let dir = scratch("dry");
    let out = dir.join("out");
    let o = science(&dir, &[("DRY_RUN", "1"), ("OUT", out.to_str().unwrap())]);
    let plan = text(&o);
    assert!(o.status.success(), "{plan}");
    let gpu = Scale::by_name("gpu").unwrap();
    let m = &gpu.train.model;
    assert_eq!(number_after(&plan, "parameters N = ") as usize, m.n_params(), "{plan}");
    let ftok = number_after(&plan, "6 N + 12 L d T = ");
    assert!((ftok / m.flops_per_token(m.context_len) - 1.0).abs() < 1e-4, "{ftok} in:\n{plan}");
    assert_eq!(number_after(&plan, "no autocast; ") as usize, gpu.val_targets, "{plan}");
    assert!(plan.contains(&format!("{} steps of {} tokens", gpu.train.max_steps, gpu.train.tokens_per_step)));
    // Priority order: softmax, LSSAR, LSSA, then the next seed.
    let rows: Vec<&str> = plan.lines().filter(|l| l.starts_with("  ") && l.ends_with("yes")).collect();
    let order: Vec<&str> = rows.iter().take(4).map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(order, ["softmax", "lssa+rw15", "lssa", "softmax"], "{plan}");
    assert!(plan.contains("(seed 0 of each row fits: the recipe is not shrunk)"), "{plan}");
    for what in
        ["--claims-only --only ROW --seeds K+1 --out runs/gpu --no-report", "--report-only", "REPRODUCTION-gpu.md"]
    {
        assert!(plan.contains(what), "no `{what}` in:\n{plan}");
    }
    // Here there is no GPU, and no data in this scratch directory: a real run would stop.
    assert!(plan.contains("no GPU on this machine") && plan.contains("no data/default/manifest.json"), "{plan}");
    assert!(!out.exists(), "a dry run wrote {}", out.display());
    std::fs::remove_dir_all(&dir).ok();
}

/// A real run stops with exit 2 and the reason: no GPU; then, with a driver that lists one, no data.
#[test]
fn a_real_run_without_a_gpu_or_data_stops_at_once_and_says_why() {
    let dir = scratch("refuse");
    let out = dir.join("out");
    let o = science(&dir, &[("OUT", out.to_str().unwrap())]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("gpu-session science: no GPU on this machine: /nonexistent/nvidia-smi is not installed"),
        "{err}"
    );
    let smi = dir.join("nvidia-smi");
    std::fs::write(&smi, "#!/bin/sh\necho 'GPU 0: Stand-in (UUID: GPU-0)'\n").unwrap();
    assert!(Command::new("chmod").arg("+x").arg(&smi).status().unwrap().success());
    let o = science(&dir, &[("OUT", out.to_str().unwrap()), ("NVIDIA_SMI", smi.to_str().unwrap())]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no data/default/manifest.json: carry data/default"), "{err}");
    assert!(!err.contains("no GPU"), "{err}");
    assert!(!out.exists(), "a refused run wrote {}", out.display());
    std::fs::remove_dir_all(&dir).ok();
}

/// A budget that no run fits starts none and says so (the plan's first run needs more).
#[test]
fn a_budget_that_fits_no_run_starts_none() {
    let dir = scratch("budget");
    let out = dir.join("out");
    let o = science(&dir, &[("REHEARSAL", "1"), ("OUT", out.to_str().unwrap()), ("SCIENCE_S", "5")]);
    let log = text(&o);
    assert_eq!(o.status.code(), Some(1), "{log}");
    assert!(log.contains("science: softmax seed 0 would take about ") && log.contains("s are left: stopping"), "{log}");
    let verdict = std::fs::read_to_string(out.join("science-verdict.txt")).unwrap();
    assert!(
        verdict.starts_with("science: 0 runs finished") && verdict.contains("seed 0 of every row: NO"),
        "{verdict}"
    );
    assert!(!out.join("science-results.tar").exists());
    assert!(!dir.join("runs").exists(), "nothing trained");
    std::fs::remove_dir_all(&dir).ok();
}

/// The keys every run of a row must have: 1x..16x under both RoPE treatments, and post hoc p = 15 at
/// every length for the post-hoc row (`lssa`).
fn assert_evaluated(r: &RunResult, posthoc: Option<u32>) {
    for m in [1, 2, 4, 8, 16] {
        for ntk in [true, false] {
            let key = EvalKey::new(ntk, posthoc, m);
            let l = r.eval(&key).unwrap_or_else(|| panic!("{} seed {}: no {key:?}", r.variant, r.seed_index));
            assert!(l.loss.is_finite() && l.per_window.is_some(), "{key:?}: {l:?}");
        }
    }
}

/// The rehearsal: the same stage on the CPU at the smoke scale, two seeds of each row, from a scratch
/// checkout's root (the runs directory relative, as on the GPU machine). Every run in priority order
/// finishes and is packed; the packed files, unpacked where the runs were, are what the report reads.
#[test]
fn a_rehearsal_runs_the_stage_end_to_end_and_its_files_render_the_report() {
    let dir = scratch("rehearsal");
    let out = dir.join("out");
    let runs = "runs/gpu-rehearsal";
    let env = [("REHEARSAL", "1"), ("OUT", out.to_str().unwrap()), ("RUNS", runs), ("SCIENCE_SEEDS", "2")];
    // The build's revision, staged beside the binary: no .git travels to the GPU machine.
    std::fs::create_dir_all(dir.join(".gpu")).unwrap();
    std::fs::write(dir.join(".gpu/REVISION"), "0123456789ab-dirty\n").unwrap();
    let o = science(&dir, &env);
    let log = text(&o);
    assert!(o.status.success(), "{log}");
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}\n{log}"));
    assert!(read("gpu.txt").contains("REHEARSAL=1"));
    assert!(read("science-plan.txt").contains("time model"));
    // One line per run, in priority order, each finished with its evaluations.
    let tsv = read("science-runs.tsv");
    let lines: Vec<Vec<&str>> = tsv.lines().skip(1).map(|l| l.split('\t').collect()).collect();
    let order: Vec<(&str, &str)> = lines.iter().map(|l| (l[0], l[1])).collect();
    assert_eq!(
        order,
        [("softmax", "0"), ("lssa+rw15", "0"), ("lssa", "0"), ("softmax", "1"), ("lssa+rw15", "1"), ("lssa", "1")],
        "{tsv}"
    );
    assert!(lines.iter().all(|l| l[2] == "0"), "a run failed:\n{tsv}\n{}", read("science.txt"));
    let verdict = read("science-verdict.txt");
    assert!(
        verdict.starts_with("science: 6 runs finished") && verdict.contains("seed 0 of every row: yes"),
        "{verdict}"
    );
    assert!(verdict.contains("--claims-only --seeds 2 --out runs/gpu-rehearsal --report-only"), "{verdict}");
    // The packed files replace the runs: unpacked as the verdict says, the report reads them.
    let trained = dir.join(runs);
    std::fs::rename(&trained, dir.join("trained-here")).unwrap();
    let unpack =
        Command::new("tar").arg("-xf").arg(out.join("science-results.tar")).arg("-C").arg(dir.join("runs")).status();
    assert!(unpack.unwrap().success());
    for (row, posthoc) in [("softmax", None), ("lssa+rw15", None), ("lssa", Some(15))] {
        for seed in 0..2 {
            let path = run_dir(&trained, row, seed).join("result.json");
            let r: RunResult = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!((r.variant.as_str(), r.seed_index, r.scale.as_str()), (row, seed, "smoke"));
            assert_eq!(r.git_revision, "0123456789ab-dirty", "the staged revision");
            assert_evaluated(&r, None);
            if posthoc.is_some() {
                assert_evaluated(&r, posthoc);
            }
            assert!(run_dir(&trained, row, seed).join("metrics.jsonl").exists());
        }
    }
    // The smoke scale's generated data is made again (in the runs directory), as data/default is there
    // on the machine that renders.
    let render = Command::new(REPRODUCE)
        .args(["--scale", "smoke", "--claims-only", "--seeds", "2", "--out", runs, "--report-only"])
        .current_dir(&dir)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(render.status.success(), "{}", text(&render));
    let report = std::fs::read_to_string(trained.join("REPRODUCTION.md")).unwrap();
    assert!(report.contains("**The premise.**"), "{report}");
    assert!(report.contains("Table 4") && report.contains("`softmax` (2 seeds)"), "{report}");
    for claim in [
        "lssar-beats-softmax",
        "lssar-posthoc-beats-softmax",
        "lssa-beats-softmax",
        "lssar-free-at-1x",
        "lssar-flat-paper",
    ] {
        assert!(report.contains(&format!("| **{claim}**")), "no verdict of {claim}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
