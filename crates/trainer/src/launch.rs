//! The built-in launcher behind `trainer --nproc-per-node N`: torchrun's single-node job for users
//! without Python.
//!
//! [`spawn`] picks a free port on 127.0.0.1 and starts N copies of a program with torchrun's
//! variables (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR=127.0.0.1`,
//! `MASTER_PORT`), so [`crate::dist::ProcessGroup::from_env`] in each finds the others; rank 0 hosts
//! the TCPStore. Like torchrun it sets `OMP_NUM_THREADS=1` for N > 1 unless the caller set it (N
//! processes with a full thread pool each oversubscribe the cores).
//!
//! Output: stdout is inherited unchanged (by convention only rank 0 prints results); every stderr
//! line is prefixed with `[rank r] `, and the last lines of each rank are kept for the error.
//!
//! Failure: when a child exits unsuccessfully, the others get SIGKILL at once (not SIGTERM: a
//! training answers SIGTERM by saving together with its peers, which would wait on the dead rank),
//! and [`spawn`] returns [`LaunchError::Failed`] naming the first rank that failed, its exit status
//! and its last stderr lines. Children also get SIGKILL if the launcher itself dies
//! (`PR_SET_PDEATHSIG`), so no orphaned rank keeps a GPU or a port.
//!
//! Pre-emption ([`spawn_stoppable`]): once the launcher's stop flag is set (a SIGTERM, SIGINT or
//! SIGUSR1 to it, [`crate::process::install_stop_handlers`]), it forwards SIGTERM to every rank and
//! waits up to [`preempt_grace`] for them to save and exit with
//! [`crate::process::PREEMPTED_EXIT`], then returns [`LaunchError::Preempted`]; ranks still running
//! after the grace period get SIGKILL.
//!
//! A binary offers the flag by re-executing itself without it (the children see `RANK` and must not
//! launch again):
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use trainer::launch;
//! let args: Vec<String> = std::env::args().skip(1).collect();
//! let nproc = 2; // parsed from `--nproc-per-node`
//! if nproc > 1 && std::env::var_os("RANK").is_none() {
//!     let child_args = launch::remove_option(&args, "--nproc-per-node");
//!     return Ok(launch::spawn(nproc, &std::env::current_exe()?, &child_args)?);
//! }
//! // ... this process is one rank: `trainer::dist::ProcessGroup::from_env()` ...
//! # Ok(())
//! # }
//! ```
//!
//! Exit order is observed without races: one thread per child waits with `waitid(WNOWAIT)`, which
//! reports an exit without reaping, so a child's pid stays reserved until the launcher reaps it and a
//! signal can never reach a recycled pid.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long ranks get to save and exit after a forwarded stop signal before SIGKILL:
/// `LSSA_PREEMPT_GRACE_S` seconds, default 300 (schedulers give 30 s to a few minutes; set it below
/// yours).
pub fn preempt_grace() -> Duration {
    let s = std::env::var("LSSA_PREEMPT_GRACE_S").ok().and_then(|v| v.parse::<f64>().ok()).filter(|s| *s >= 0.0);
    Duration::from_secs_f64(s.unwrap_or(300.0))
}
/// How many stderr lines of each rank are kept for the error.
pub const STDERR_TAIL: usize = 20;

/// Errors of the launcher.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// `nproc` was 0.
    #[error("the number of processes must be at least 1")]
    NoProcesses,
    /// No free port could be found.
    #[error("picking a free port on 127.0.0.1: {0}")]
    Port(#[source] std::io::Error),
    /// A child could not be started (the ranks started before it have been killed).
    #[error("starting rank {rank} ({}): {source}", program.display())]
    Spawn {
        /// The rank that could not be started.
        rank: usize,
        /// The program.
        program: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Waiting for a child failed.
    #[error("waiting for rank {rank}: {source}")]
    Wait {
        /// The rank.
        rank: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// A stop signal reached the launcher (or every rank) and the ranks saved and stopped.
    #[error("stopped by {signal}: the ranks saved and exited; continue with the same command and --resume latest")]
    Preempted {
        /// The signal the launcher received, or `a signal to the ranks`.
        signal: String,
    },
    /// A rank exited unsuccessfully; the other ranks were stopped.
    #[error("rank {rank} failed ({status}){}", format_tail(.stderr_tail))]
    Failed {
        /// The first rank seen to fail.
        rank: usize,
        /// Its exit status.
        status: ExitStatus,
        /// Its last stderr lines (at most [`STDERR_TAIL`]).
        stderr_tail: Vec<String>,
    },
}

fn format_tail(tail: &[String]) -> String {
    if tail.is_empty() {
        return "; it wrote nothing to stderr".into();
    }
    let mut s = String::from("; its last stderr lines:");
    for line in tail {
        s.push_str("\n  ");
        s.push_str(line);
    }
    s
}

/// Runs `program args...` as `nproc` ranks of one job on this machine (see the module docs) and
/// waits for all of them. `Ok` only if every rank exits with status 0.
pub fn spawn(nproc: usize, program: &Path, args: &[String]) -> Result<(), LaunchError> {
    spawn_stoppable(nproc, program, args, None)
}

/// [`spawn`] that forwards a stop signal to its ranks: see the module docs on pre-emption.
pub fn spawn_stoppable(
    nproc: usize,
    program: &Path,
    args: &[String],
    stop: Option<crate::process::StopFlag>,
) -> Result<(), LaunchError> {
    if nproc == 0 {
        return Err(LaunchError::NoProcesses);
    }
    let port = free_port().map_err(LaunchError::Port)?;
    let set_omp = nproc > 1 && std::env::var_os("OMP_NUM_THREADS").is_none();
    // SAFETY: getpid has no preconditions.
    let launcher_pid = unsafe { libc::getpid() };

    let mut children: Vec<Child> = Vec::with_capacity(nproc);
    for rank in 0..nproc {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", nproc.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            // If this launcher itself runs under torchrun, its children must not use torchrun's store.
            .env_remove("TORCHELASTIC_USE_AGENT_STORE")
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        if set_omp {
            cmd.env("OMP_NUM_THREADS", "1");
        }
        // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
        // system calls (prctl, getppid).
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher died between fork and prctl: the signal would never come.
                if libc::getppid() != launcher_pid {
                    return Err(std::io::Error::other("the launcher exited"));
                }
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(child) => children.push(child),
            Err(source) => {
                for child in &mut children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Err(LaunchError::Spawn { rank, program: program.to_path_buf(), source });
            }
        }
    }
    supervise(children, stop)
}

/// The first free TCP port the kernel hands out on 127.0.0.1. It is released before the ranks start,
/// so another process could take it in between; rank 0 then fails to bind and the job fails cleanly.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

/// Forwards stderr, waits for every child, stops the rest after the first failure.
fn supervise(mut children: Vec<Child>, stop: Option<crate::process::StopFlag>) -> Result<(), LaunchError> {
    let n = children.len();
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    let tails: Vec<Mutex<VecDeque<String>>> = (0..n).map(|_| Mutex::new(VecDeque::new())).collect();
    let stderrs: Vec<_> = children.iter_mut().map(|c| c.stderr.take()).collect();
    let (tx, rx) = mpsc::channel::<usize>();

    let outcome = std::thread::scope(|scope| {
        for (rank, stderr) in stderrs.into_iter().enumerate() {
            if let Some(stderr) = stderr {
                let tail = &tails[rank];
                scope.spawn(move || forward_stderr(rank, stderr, tail));
            }
        }
        for (rank, &pid) in pids.iter().enumerate() {
            let tx = tx.clone();
            scope.spawn(move || {
                wait_exit_without_reaping(pid);
                let _ = tx.send(rank);
            });
        }
        drop(tx);

        let mut exited = vec![false; n];
        let mut failure: Option<(usize, ExitStatus)> = None;
        let mut kill_at: Option<Instant> = None;
        let mut error = None;
        // The signal forwarded to the ranks, once the stop flag is seen.
        let mut forwarded: Option<String> = None;
        let mut preempted_ranks = 0;
        // How often the stop flag is looked at while waiting.
        const POLL: Duration = Duration::from_millis(100);
        for _ in 0..n {
            let rank = loop {
                if forwarded.is_none()
                    && let Some(sig) = stop.and_then(|s| s.signal())
                {
                    for (other, &pid) in pids.iter().enumerate() {
                        if !exited[other] {
                            // SAFETY: `pid` is an unreaped child of ours (reaping happens only below,
                            // on this thread), so it cannot have been recycled.
                            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                        }
                    }
                    eprintln!(
                        "trainer: {} received: the ranks save and stop (at most {:.0} s)",
                        crate::process::signal_name(sig),
                        preempt_grace().as_secs_f64()
                    );
                    forwarded = Some(crate::process::signal_name(sig));
                    kill_at = Some(Instant::now() + preempt_grace());
                }
                let deadline = match (kill_at, stop.is_some() && forwarded.is_none()) {
                    (Some(at), true) => Some(at.min(Instant::now() + POLL)),
                    (Some(at), false) => Some(at),
                    (None, true) => Some(Instant::now() + POLL),
                    (None, false) => None,
                };
                let received = match deadline {
                    Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                };
                match received {
                    Ok(rank) => break Some(rank),
                    Err(RecvTimeoutError::Timeout) if kill_at.is_some_and(|at| Instant::now() >= at) => {
                        for (rank, child) in children.iter_mut().enumerate() {
                            if !exited[rank] {
                                let _ = child.kill(); // SIGKILL; the child is not reaped yet
                            }
                        }
                        kill_at = None;
                    }
                    Err(RecvTimeoutError::Timeout) => {} // look at the stop flag again
                    Err(RecvTimeoutError::Disconnected) => break None,
                }
            };
            let Some(rank) = rank else { break };
            // The waiter saw it exit; reaping it now cannot block.
            let status = match children[rank].wait() {
                Ok(status) => status,
                Err(source) => {
                    error.get_or_insert(LaunchError::Wait { rank, source });
                    exited[rank] = true;
                    continue;
                }
            };
            exited[rank] = true;
            if status.code() == Some(crate::process::PREEMPTED_EXIT) {
                // Saved and stopped on a signal (forwarded by us, or sent to the ranks directly).
                preempted_ranks += 1;
            } else if !status.success() && failure.is_none() {
                failure = Some((rank, status));
                for (other, &pid) in pids.iter().enumerate() {
                    if !exited[other] {
                        // SAFETY: `pid` is an unreaped child of ours (reaping happens only above, on
                        // this thread), so it cannot have been recycled.
                        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                    }
                }
            }
        }
        let preempted = (failure.is_none() && preempted_ranks > 0)
            .then(|| forwarded.unwrap_or_else(|| "a signal to the ranks".to_string()));
        (failure, error, preempted)
    });

    match outcome {
        (None, None, Some(signal)) => Err(LaunchError::Preempted { signal }),
        (Some((rank, status)), ..) => {
            let stderr_tail = tails[rank].lock().map(|t| t.iter().cloned().collect()).unwrap_or_default();
            Err(LaunchError::Failed { rank, status, stderr_tail })
        }
        (None, Some(error), _) => Err(error),
        (None, None, None) => Ok(()),
    }
}

/// Blocks until process `pid` (our child) has exited, leaving it unreaped.
fn wait_exit_without_reaping(pid: u32) {
    loop {
        // SAFETY: an all-zero siginfo_t is a valid out-parameter.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits on our own child; WNOWAIT leaves it a zombie for `Child::wait` to reap.
        let r = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Copies `stderr` line by line to ours with a `[rank r] ` prefix, keeping the last lines in `tail`.
fn forward_stderr(rank: usize, stderr: impl Read, tail: &Mutex<VecDeque<String>>) {
    let prefix = format!("[rank {rank}] ");
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        {
            let mut out = std::io::stderr().lock();
            let _ = out.write_all(prefix.as_bytes()).and_then(|()| out.write_all(&line));
        }
        if let Ok(mut tail) = tail.lock() {
            if tail.len() == STDERR_TAIL {
                tail.pop_front();
            }
            tail.push_back(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
        }
    }
}

/// `args` without the option `name` and its value (`name V` or `name=V`), for a binary that
/// re-executes itself as the ranks: `remove_option(&args, "--nproc-per-node")`.
pub fn remove_option(args: &[String], name: &str) -> Vec<String> {
    let with_eq = format!("{name}=");
    let mut out = Vec::with_capacity(args.len());
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == name {
            iter.next();
        } else if !arg.starts_with(&with_eq) {
            out.push(arg.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_option_drops_both_spellings() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let cases = [
            ("--nproc-per-node 2 --steps 10", "--steps 10"),
            ("--steps 10 --nproc-per-node=4", "--steps 10"),
            ("--steps 10", "--steps 10"),
            ("--nproc-per-node", ""),
            ("--nproc-per-node-x 3", "--nproc-per-node-x 3"),
        ];
        for (input, want) in cases {
            assert_eq!(remove_option(&args(input), "--nproc-per-node"), args(want), "{input}");
        }
    }

    #[test]
    fn failure_message_names_rank_status_and_tail() {
        use std::os::unix::process::ExitStatusExt;
        let err = LaunchError::Failed {
            rank: 2,
            status: ExitStatus::from_raw(3 << 8),
            stderr_tail: vec!["Error: boom".into()],
        };
        let msg = err.to_string();
        assert!(msg.starts_with("rank 2 failed (exit status: 3)") && msg.ends_with("\n  Error: boom"), "{msg}");
    }
}
