//! `benches/gpu-session.sh` is run on a GPU machine that has no Rust toolchain, where a mistake costs
//! scarce GPU time: its dry run (`DRY_RUN=1`, no GPU or binary needed) must name every stage's command.

use std::path::Path;
use std::process::Command;

#[test]
fn the_gpu_session_dry_run_prints_every_stage_and_runs_nothing() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace");
    let out = tempfile_dir();
    let o = Command::new("bash")
        .arg(root.join("benches/gpu-session.sh"))
        .arg("all")
        .current_dir(root)
        .env("DRY_RUN", "1")
        .env("OUT", &out)
        .env("BIN", "/nonexistent/bench-cuda")
        .output()
        .expect("bash runs");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}{}", String::from_utf8_lossy(&o.stderr));
    for stage in ["check", "lab", "model", "full64", "full128", "flex", "pytest"] {
        assert!(text.contains(&format!("would run ({stage}, at most ")), "no {stage} in:\n{text}");
    }
    assert!(text.contains("--head-dims 128") && text.contains("--flex") && text.contains("pytest -q"), "{text}");
    assert!(!out.exists(), "a dry run wrote {}", out.display());
    // An unknown stage is refused, naming the stages.
    let bad = Command::new("bash")
        .arg(root.join("benches/gpu-session.sh"))
        .arg("everything")
        .current_dir(root)
        .env("DRY_RUN", "1")
        .output()
        .expect("bash runs");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("pytest, all"));
}

fn tempfile_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("lssa-gpu-session-dry-{}", std::process::id()))
}
