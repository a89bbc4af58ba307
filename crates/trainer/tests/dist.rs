//! Data parallelism end to end: real c10d process groups in 2-3 processes on 127.0.0.1, started by
//! `trainer::launch::spawn` (the `dist_selftest` helper binary checks the results on every rank), and
//! the parsing of torchrun's environment.
//!
//! The multi-process tests run one at a time (a lock) so their time bounds hold on a small machine;
//! each is bounded by [`LIMIT`] even if the launcher hangs.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use trainer::dist::{DistEnv, DistError, GlooDevice, Rendezvous};
use trainer::launch::{self, LaunchError};

const SELFTEST: &str = env!("CARGO_BIN_EXE_dist_selftest");
/// Upper bound on one launched job, failure detection included.
const LIMIT: Duration = Duration::from_secs(30);
static ONE_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `dist_selftest args...` as `nproc` ranks; panics if the launcher has not returned within
/// [`LIMIT`] (its children then die with this process: the launcher sets `PR_SET_PDEATHSIG`).
fn launch(nproc: usize, args: &[&str]) -> (Result<(), LaunchError>, Duration) {
    let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(launch::spawn(nproc, Path::new(SELFTEST), &args)));
    let result = rx.recv_timeout(LIMIT).unwrap_or_else(|_| panic!("the launcher did not return within {LIMIT:?}"));
    (result, start.elapsed())
}

#[test]
fn collectives_three_ranks_small_buckets() {
    // 4 kB buckets: several buckets per call, a tensor larger than a bucket, dtype changes.
    let (result, elapsed) =
        launch(3, &["collectives", "--expect-world", "3", "--bucket-bytes", "4096", "--timeout-s", "20"]);
    result.unwrap_or_else(|e| panic!("{e}"));
    assert!(elapsed < LIMIT, "{elapsed:?}");
}

#[test]
fn collectives_two_ranks_default_buckets() {
    let (result, _) = launch(2, &["collectives", "--expect-world", "2", "--timeout-s", "20"]);
    result.unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn world_size_one_needs_no_process_group() {
    let (result, _) = launch(1, &["single", "--expect-world", "1"]);
    result.unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_rank_that_dies_is_named_and_nobody_hangs() {
    // The survivors' timeout (20 s) is longer than the bound, so passing needs the death to be noticed.
    let (result, elapsed) = launch(3, &["die", "--expect-world", "3", "--timeout-s", "20"]);
    match result {
        Err(LaunchError::Failed { rank: 1, status, .. }) => assert_eq!(status.code(), Some(3), "{status}"),
        other => panic!("expected rank 1 to be reported with status 3, got {other:?}"),
    }
    assert!(elapsed < LIMIT, "{elapsed:?}");
}

#[test]
fn a_rank_that_stalls_times_out_the_others_and_is_killed() {
    // Rank 1 sleeps for 120 s: the others' all-reduce must time out (3 s) and the launcher must kill
    // rank 1, or the job could not end within the bound.
    let (result, elapsed) = launch(3, &["stall", "--expect-world", "3", "--timeout-s", "3"]);
    let err = result.expect_err("a stalled rank must fail the job");
    let msg = err.to_string();
    match &err {
        LaunchError::Failed { rank, stderr_tail, .. } => {
            assert!(*rank == 0 || *rank == 2, "{msg}");
            let last = stderr_tail.last().map(String::as_str).unwrap_or_default();
            assert!(last.contains(&format!("rank {rank}: all_reduce failed")), "{msg}");
        }
        other => panic!("expected a failed rank, got {other:?}"),
    }
    assert!(elapsed < LIMIT, "{elapsed:?}");
}

#[test]
fn a_missing_program_is_a_spawn_error() {
    let err = launch::spawn(2, Path::new("/nonexistent/dist_selftest"), &[]).unwrap_err();
    assert!(matches!(err, LaunchError::Spawn { rank: 0, .. }), "{err:?}");
    assert!(matches!(launch::spawn(0, Path::new(SELFTEST), &[]), Err(LaunchError::NoProcesses)));
}

// torchrun's environment -------------------------------------------------------------------------

fn parse(pairs: &[(&str, &str)]) -> Result<Option<DistEnv>, DistError> {
    let vars: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    DistEnv::from_vars(|name| vars.get(name).cloned())
}

/// What torchrun 2.11 set for `--standalone --nproc-per-node=2 --no-python`, rank 1 (observed by
/// running `env` under it; the run id and error file are left out).
const TORCHRUN: &[(&str, &str)] = &[
    ("GROUP_RANK", "0"),
    ("GROUP_WORLD_SIZE", "1"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "2"),
    ("MASTER_ADDR", "localhost"),
    ("MASTER_PORT", "35295"),
    ("OMP_NUM_THREADS", "1"),
    ("RANK", "1"),
    ("ROLE_RANK", "1"),
    ("ROLE_WORLD_SIZE", "2"),
    ("TORCHELASTIC_MAX_RESTARTS", "0"),
    ("TORCHELASTIC_RESTART_COUNT", "0"),
    ("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"),
    ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ("WORLD_SIZE", "2"),
];

/// Variables to change: `Some(value)` sets, `None` removes.
type Changes<'a> = &'a [(&'a str, Option<&'a str>)];

fn with<'a>(base: &[(&'a str, &'a str)], changes: &[(&'a str, Option<&'a str>)]) -> Vec<(&'a str, &'a str)> {
    let mut out: Vec<_> = base.to_vec();
    for &(k, v) in changes {
        out.retain(|&(name, _)| name != k);
        if let Some(v) = v {
            out.push((k, v));
        }
    }
    out
}

#[test]
fn torchrun_environment_uses_the_agent_store() {
    let env = parse(TORCHRUN).unwrap().expect("a process group");
    assert_eq!(
        env,
        DistEnv {
            rank: 1,
            world_size: 2,
            local_rank: 1,
            local_world_size: Some(2),
            master_addr: "localhost".into(),
            master_port: 35295,
            rendezvous: Rendezvous::AgentStore { restart_count: 0 },
            gloo_device: GlooDevice::Hostname("127.0.0.1".into()),
        }
    );
    assert!(!env.hosts_store(), "with the agent store every rank is a client");
    assert_eq!(env.store_prefix(), "/worker/attempt_0");

    let rank0 = parse(&with(TORCHRUN, &[("RANK", Some("0")), ("LOCAL_RANK", Some("0"))])).unwrap().unwrap();
    assert!(!rank0.hosts_store(), "not even rank 0 hosts it under torchrun");
    let restarted = parse(&with(TORCHRUN, &[("TORCHELASTIC_RESTART_COUNT", Some("3"))])).unwrap().unwrap();
    assert_eq!(restarted.store_prefix(), "/worker/attempt_3");
}

#[test]
fn plain_environment_has_rank_0_host_the_store() {
    // Our launcher's variables; anything but exactly "True" is not torchrun's agent store.
    for agent in [None, Some("False"), Some("true"), Some("1")] {
        let vars =
            with(TORCHRUN, &[("TORCHELASTIC_USE_AGENT_STORE", agent), ("RANK", Some("0")), ("LOCAL_RANK", Some("0"))]);
        let env = parse(&vars).unwrap().unwrap();
        assert_eq!(env.rendezvous, Rendezvous::Rank0Hosts, "{agent:?}");
        assert!(env.hosts_store());
        assert_eq!(env.store_prefix(), "");
    }
    let rank1 = parse(&with(TORCHRUN, &[("TORCHELASTIC_USE_AGENT_STORE", None)])).unwrap().unwrap();
    assert!(!rank1.hosts_store());
}

#[test]
fn single_process_environments_give_no_group() {
    assert!(parse(&[]).unwrap().is_none());
    assert!(parse(&with(TORCHRUN, &[("WORLD_SIZE", None)])).unwrap().is_none());
    let one = with(TORCHRUN, &[("WORLD_SIZE", Some("1")), ("RANK", Some("0")), ("LOCAL_RANK", Some("0"))]);
    assert!(parse(&one).unwrap().is_none());
    // Nothing else is needed for one process.
    assert!(parse(&[("WORLD_SIZE", "1")]).unwrap().is_none());
}

#[test]
fn gloo_binds_where_the_environment_says() {
    let cases: &[(Changes<'_>, GlooDevice)] = &[
        (&[("MASTER_ADDR", Some("localhost"))], GlooDevice::Hostname("127.0.0.1".into())),
        (&[("MASTER_ADDR", Some("127.0.0.1"))], GlooDevice::Hostname("127.0.0.1".into())),
        (&[("MASTER_ADDR", Some("::1"))], GlooDevice::Hostname("::1".into())),
        (&[("MASTER_ADDR", Some("10.1.2.3"))], GlooDevice::Default),
        (&[("MASTER_ADDR", Some("node-0.cluster"))], GlooDevice::Default),
        (
            &[("MASTER_ADDR", Some("10.1.2.3")), ("GLOO_SOCKET_IFNAME", Some("eth1,eth2"))],
            GlooDevice::Interface("eth1".into()),
        ),
    ];
    for (changes, want) in cases {
        let env = parse(&with(TORCHRUN, changes)).unwrap().unwrap();
        assert_eq!(&env.gloo_device, want, "{changes:?}");
    }
}

#[test]
fn bad_environments_name_the_variable() {
    let cases: &[(Changes<'_>, &str)] = &[
        (&[("RANK", None)], "RANK is not set"),
        (&[("LOCAL_RANK", None)], "LOCAL_RANK is not set"),
        (&[("MASTER_ADDR", None)], "MASTER_ADDR is not set"),
        (&[("MASTER_PORT", None)], "MASTER_PORT is not set"),
        (&[("TORCHELASTIC_RESTART_COUNT", None)], "TORCHELASTIC_RESTART_COUNT is not set"),
        (&[("RANK", Some("2"))], "RANK=\"2\": must be below WORLD_SIZE=2"),
        (&[("RANK", Some("-1"))], "RANK=\"-1\""),
        (&[("WORLD_SIZE", Some("two"))], "WORLD_SIZE=\"two\""),
        (&[("WORLD_SIZE", Some("0"))], "WORLD_SIZE=\"0\": must be at least 1"),
        (&[("MASTER_PORT", Some("0"))], "MASTER_PORT=\"0\""),
        (&[("MASTER_PORT", Some("70000"))], "MASTER_PORT=\"70000\""),
        (&[("LOCAL_RANK", Some("2"))], "LOCAL_RANK=\"2\": must be below LOCAL_WORLD_SIZE=2"),
        (&[("MASTER_ADDR", Some(""))], "MASTER_ADDR=\"\""),
    ];
    for (changes, want) in cases {
        let err = parse(&with(TORCHRUN, changes)).expect_err(want).to_string();
        assert!(err.contains(want), "{changes:?}: {err}");
    }
}
