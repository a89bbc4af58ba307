//! What the results were measured on and with: CPU model, git revision, date, exact command.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (this crate lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("benches/ lives inside the workspace").to_path_buf()
}

/// The first `model name` of `/proc/cpuinfo`, with the logical CPU count and the widest SIMD seen in its
/// flags, e.g. `Intel(R) Xeon(R) Processor (2 logical CPUs, AVX-512)`.
pub fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".to_string());
    let flags = info.lines().find_map(|l| l.strip_prefix("flags").and_then(|r| r.split_once(':')).map(|(_, f)| f));
    let has = |flag: &str| flags.is_some_and(|f| f.split_whitespace().any(|x| x == flag));
    let simd = if has("avx512f") {
        "AVX-512"
    } else if has("avx2") && has("fma") {
        "AVX2+FMA"
    } else {
        "no AVX2"
    };
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("{model} ({cpus} logical CPUs, {simd})")
}

/// `git rev-parse --short=12 HEAD` in the workspace, with `-dirty` when the tree has changes;
/// `unknown` outside a git checkout. Taken once a process, at the first call: the benchmarks call it
/// as they start, so a report names the tree its code was built from, not one edited while it ran
/// (a tree edited during a 20-minute `bench-train` had labelled its report `-dirty`).
pub fn git_revision() -> String {
    static REVISION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    REVISION.get_or_init(read_git_revision).clone()
}

fn read_git_revision() -> String {
    let root = workspace_root();
    let git = |args: &[&str]| {
        Command::new("git").arg("-C").arg(&root).args(args).output().ok().filter(|o| o.status.success())
    };
    let Some(rev) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".to_string();
    };
    let rev = String::from_utf8_lossy(&rev.stdout).trim().to_string();
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|o| !o.stdout.is_empty());
    if dirty { format!("{rev}-dirty") } else { rev }
}

/// The current UTC time as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

/// Days since 1970-01-01 to a (year, month, day) civil date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The command line of this process, for the record.
pub fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
    }
}

/// The provenance every report's JSON opens with (flattened into it): its format, and the revision,
/// command, date and CPU of the run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Header {
    /// The report's format name, e.g. `lssa-bench-train`.
    pub format: &'static str,
    /// Its version (bumped when a field changes meaning).
    pub format_version: u32,
    /// [`git_revision`].
    pub git_revision: String,
    /// [`command_line`].
    pub command: String,
    /// [`utc_now`].
    pub date: String,
    /// [`cpu_model`].
    pub cpu: String,
}

impl Header {
    /// This run's header for a report of `format` at `format_version`.
    pub fn now(format: &'static str, format_version: u32) -> Self {
        Self {
            format,
            format_version,
            git_revision: git_revision(),
            command: command_line(),
            date: utc_now(),
            cpu: cpu_model(),
        }
    }
}
