//! What a training shares with the rest of its process and machine, handled in one place.
//!
//! - [`claim_threads`]: libtorch's CPU thread count, one setting per process, held by a training and
//!   restored when the last training that holds it returns.
//! - [`keep_freed_memory`], [`limit_openmp_spinning`]: the allocator's and OpenMP's settings.
//! - [`RunLock`]: one writer per run directory.
//! - [`install_stop_handlers`], [`StopFlag`]: SIGTERM, SIGINT and SIGUSR1 ask a training to save and
//!   stop at its next step boundary (a scheduler's pre-emption); a second SIGINT stops at once.
//! - [`free_bytes`]: the space left on a directory's file system, for a check before a long run.
//!
//! A training holds an exclusive advisory lock
//! (`flock(2)`) on `<out_dir>/.lock` for its whole life, so a second training started into the same
//! directory (a job submitted twice, two shells) is refused at once, naming the directory and the
//! holder's pid, before it deletes or writes anything. The kernel drops the lock when its holder exits,
//! however it exits, so a run killed with SIGKILL leaves nothing that blocks its `--resume`.
//!
//! Two trainings in one process into one directory are refused too: `flock` locks belong to open file
//! descriptions, and each [`RunLock::acquire`] opens its own.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use gpt_model::runtime::{SettingGuard, SharedSetting};

/// The lock file's name inside a run directory.
pub const LOCK_FILE: &str = ".lock";

/// The exclusive lock of one run directory, released when dropped (or when the process ends).
#[derive(Debug)]
pub struct RunLock {
    file: File,
    dir: PathBuf,
}

impl RunLock {
    /// Creates `dir` if needed and locks it, or fails at once when another writer holds it: the error
    /// names the directory and the holder's pid. Writes this process's pid into the lock file.
    pub fn acquire(dir: &Path) -> Result<RunLock> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: `flock` on a file descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(err).with_context(|| format!("locking {}", path.display()));
            }
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "another process".to_string(),
                pid => format!("process {pid}"),
            };
            bail!(
                "{} is in use: {holder} is training into it (it holds {}); wait for it to finish, or train into another --out-dir",
                dir.display(),
                path.display()
            );
        }
        file.set_len(0).and_then(|()| file.rewind()).with_context(|| format!("writing {}", path.display()))?;
        writeln!(file, "{}", std::process::id()).with_context(|| format!("writing {}", path.display()))?;
        Ok(RunLock { file, dir: dir.to_path_buf() })
    }

    /// The locked directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // The pid goes with the lock; the file stays (deleting it would race with a writer opening it).
        let _ = self.file.set_len(0);
        // SAFETY: as in `acquire`; closing the file would release the lock anyway.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// glibc's `mmap` threshold that [`keep_freed_memory`] sets, in bytes: blocks under it come from the heap
/// (`i32`: `mallopt` takes a C `int`, so no cast can truncate it).
pub const MALLOC_MMAP_THRESHOLD: i32 = 256 << 20;
/// glibc's trim threshold that [`keep_freed_memory`] sets, in bytes: free heap under it is kept.
pub const MALLOC_TRIM_THRESHOLD: i32 = 1 << 30;

/// Keeps freed tensor memory in the process instead of handing it back to the OS after every step
/// (glibc's `malloc`: no `mmap` for blocks under 256 MiB, no heap trimming under 1 GiB free), once per
/// process; a no-op elsewhere. A process setting with no way back, so the binaries call it in `main`
/// (`trainer`, `reproduce`, `bench-train`), never [`crate::train::train`]. What it saves: a training step allocates and frees the same few
/// megabyte-sized tensors (logits and their gradient are 8 MiB each at the `small` shape), and with
/// glibc's defaults many of them are fresh `mmap`s or trimmed heap, so every step page-faults them
/// back in (about 10% of a `small` step under `perf`: `clear_page`, `exc_page_fault`,
/// `unmap_page_range`). `docs/bench/train-cpu.md` also times the PyTorch loop with the same settings
/// (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`: its "tuned malloc" column).
/// The cost: the process keeps its peak heap until it exits, as with jemalloc or tcmalloc, which
/// PyTorch's CPU tuning guide recommends for the same reason.
pub fn keep_freed_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes allocator parameters, under the allocator's own lock.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD);
        }
    });
}

/// The spin count this crate's binaries give libgomp (libtorch's OpenMP run time), unless the user
/// set `GOMP_SPINCOUNT` or `OMP_WAIT_POLICY`: see [`limit_openmp_spinning`].
pub const OPENMP_SPIN_COUNT: &str = "20000";

/// Runs this program again, in place (`exec`, same pid, arguments and environment), with
/// `GOMP_SPINCOUNT` = [`OPENMP_SPIN_COUNT`], unless `GOMP_SPINCOUNT` or `OMP_WAIT_POLICY` is already
/// set (the user's choice, or this call's in the program it started). Call it first in `main`: it
/// does not return when it re-runs the program, and libgomp reads the variable only when it is
/// loaded, before `main`, so no later call can change it. If `exec` fails it warns and returns,
/// and the program goes on with libgomp's default. A no-op outside Linux.
///
/// Why: libgomp's idle workers spin for 300,000 iterations (about a millisecond) after each parallel
/// region before they sleep. The fused attention kernels run on rayon threads between libtorch's
/// OpenMP regions, so on a CPU with as many cores as threads each kernel shared its cores with a
/// spinning OpenMP worker. At the `small` scale on 2 cores (`docs/bench/train-cpu-notes.md`) a
/// short spin gave LSSAR's training about a sixth more tokens/s and left softmax's unchanged; no spin
/// at all (`OMP_WAIT_POLICY=PASSIVE`) was slower, as every region then wakes its workers through the
/// kernel. PyTorch users of `lssa` can set the same variable.
pub fn limit_openmp_spinning() {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        if std::env::var_os("GOMP_SPINCOUNT").is_some() || std::env::var_os("OMP_WAIT_POLICY").is_some() {
            return;
        }
        let err = match std::env::current_exe() {
            Ok(exe) => {
                let mut args = std::env::args_os();
                let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
                std::process::Command::new(&exe).arg0(arg0).args(args).env("GOMP_SPINCOUNT", OPENMP_SPIN_COUNT).exec()
            }
            Err(e) => e,
        };
        eprintln!(
            "warning: could not run this program again with GOMP_SPINCOUNT={OPENMP_SPIN_COUNT} ({err}); going on with libgomp's default"
        );
    }
}

/// libtorch's CPU thread count, one setting shared by every training of the process
/// (`reproduce --jobs N` trains on threads of one process).
static THREADS: SharedSetting<i32> = SharedSetting::new(tch::get_num_threads, tch::set_num_threads);

/// A claim on libtorch's thread count ([`claim_threads`]): while any claim is held the count is the
/// claimed one; when the last is dropped the count the first found is restored, so a training leaves
/// the process as it found it.
pub type ThreadClaim = SettingGuard<i32>;

/// Claims `threads` (0: no preference, no claim) for a training of this process: the first claim sets
/// libtorch's count, concurrent claims of the same count share it, a concurrent claim of another
/// count is an error (rather than changing the count under the first), and the last claim dropped
/// restores the count the first found.
pub fn claim_threads(threads: usize) -> Result<Option<ThreadClaim>> {
    claim_threads_in(&THREADS, threads)
}

/// [`claim_threads`] on `setting` (a test's own, so it never touches the process's).
fn claim_threads_in(setting: &'static SharedSetting<i32>, threads: usize) -> Result<Option<ThreadClaim>> {
    if threads == 0 {
        return Ok(None);
    }
    setting.claim(threads as i32).map(Some).map_err(|n| {
        anyhow::anyhow!(
            "threads = {threads}: another training of this process runs on {n} libtorch threads, a setting shared by the whole process; give concurrent trainings of one process the same `threads` (or 0)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_claims_share_a_count_refuse_another_and_the_last_restores_the_first_found() {
        // A stand-in for libtorch's setting, so the test never touches the process's.
        static COUNT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(7);
        fn get() -> i32 {
            COUNT.load(std::sync::atomic::Ordering::SeqCst)
        }
        fn set(n: i32) {
            COUNT.store(n, std::sync::atomic::Ordering::SeqCst);
        }
        static SETTING: SharedSetting<i32> = SharedSetting::new(get, set);
        let claim = |n| claim_threads_in(&SETTING, n);
        assert!(claim(0).unwrap().is_none(), "0 asks for nothing");
        assert_eq!(get(), 7);
        let first = claim(2).unwrap();
        let second = claim(2).unwrap();
        assert_eq!(get(), 2);
        let err = claim(3).unwrap_err().to_string();
        assert!(err.contains("threads = 3") && err.contains("runs on 2"), "{err}");
        drop(first);
        assert_eq!(get(), 2, "the second claim still holds it");
        drop(second);
        assert_eq!(get(), 7, "the last claim restored the count the first found");
        let third = claim(3).unwrap();
        assert_eq!(get(), 3, "another count once nobody holds one");
        drop(third);
        assert_eq!(get(), 7);
    }

    #[test]
    fn free_bytes_answers_for_a_path_not_made_yet_from_its_file_system() {
        let root = tempfile::tempdir().unwrap();
        let free = free_bytes(root.path()).unwrap();
        assert!(free > 0);
        // A directory a run will create: its nearest existing ancestor's file system.
        let later = free_bytes(&root.path().join("runs/small")).unwrap();
        // (Other processes write meanwhile: the same file system within 1 GiB.)
        assert!(free.abs_diff(later) < 1 << 30, "{free} vs {later}");
        assert!(free_bytes(std::path::Path::new("relative/not/made")).unwrap() > 0);
    }

    #[test]
    fn a_second_writer_is_refused_with_the_holders_pid_until_the_first_lets_go() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("run");
        let first = RunLock::acquire(&dir).unwrap();
        assert_eq!(first.dir(), dir);
        let err = RunLock::acquire(&dir).unwrap_err().to_string();
        assert!(err.contains(&dir.display().to_string()), "{err}");
        assert!(err.contains(&format!("process {}", std::process::id())), "{err}");
        // Another directory is free; the first again once its lock is dropped.
        RunLock::acquire(&root.path().join("other")).unwrap();
        drop(first);
        let again = RunLock::acquire(&dir).unwrap();
        drop(again);
        assert_eq!(std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(), "", "no pid left behind");
    }
}

/// The exit status of a training that a signal stopped after saving (`EX_TEMPFAIL`: try again,
/// with `--resume latest`). A scheduler's requeue script can tell it from a failure (1) and from a
/// process killed outright (128 + the signal).
pub const PREEMPTED_EXIT: i32 = 75;

/// The first stop signal received (0: none), set by the handlers of [`install_stop_handlers`].
static STOP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    use std::sync::atomic::Ordering;
    // A second SIGINT (Ctrl-C twice) stops at once; `_exit` is async-signal-safe.
    if sig == libc::SIGINT && STOP.load(Ordering::SeqCst) != 0 {
        // SAFETY: `_exit` is async-signal-safe and takes no memory.
        unsafe { libc::_exit(128 + libc::SIGINT) };
    }
    let _ = STOP.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// Installs the stop handlers for SIGTERM, SIGINT and SIGUSR1 (SLURM's `--signal=USR1@60`) and
/// returns the flag they set. For a binary's `main`: a training reads the flag it is handed
/// ([`crate::train::RunOptions::stop`]) at every step boundary and installs nothing itself.
pub fn install_stop_handlers() -> Result<StopFlag> {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGUSR1] {
        // SAFETY: a zeroed sigaction with a handler that only touches an atomic (or calls `_exit`),
        // an empty mask, and SA_RESTART so that interrupted system calls resume.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("installing the handler of signal {sig}"));
        }
    }
    Ok(StopFlag(&STOP))
}

/// The flag a stop signal sets ([`install_stop_handlers`]); tests make their own with
/// [`StopFlag::new_static`] and set it by hand.
#[derive(Clone, Copy, Debug)]
pub struct StopFlag(&'static std::sync::atomic::AtomicI32);

impl StopFlag {
    /// A flag of its own, never set by a signal (leaked: a few bytes per call, for tests).
    pub fn new_static() -> StopFlag {
        StopFlag(Box::leak(Box::new(std::sync::atomic::AtomicI32::new(0))))
    }

    /// The signal that asked to stop, if any.
    pub fn signal(&self) -> Option<i32> {
        match self.0.load(std::sync::atomic::Ordering::SeqCst) {
            0 => None,
            s => Some(s),
        }
    }

    /// Asks to stop as `sig` would (tests; the handlers do it for signals).
    pub fn raise(&self, sig: i32) {
        let _ =
            self.0.compare_exchange(0, sig, std::sync::atomic::Ordering::SeqCst, std::sync::atomic::Ordering::SeqCst);
    }
}

/// `SIGTERM`, `SIGINT`, `SIGUSR1`, or `signal N`.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        s => format!("signal {s}"),
    }
}

/// Bytes available to this (unprivileged) user on the file system that holds `path`, or would hold
/// it: `statvfs(3)` of `path`'s nearest existing ancestor (`f_bavail x f_frsize`).
pub fn free_bytes(path: &Path) -> Result<u64> {
    let existing = path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("."));
    let dir = if existing.as_os_str().is_empty() { Path::new(".") } else { existing };
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
        .with_context(|| format!("{}: a path with a NUL byte", dir.display()))?;
    // SAFETY: a zeroed statvfs for the call to fill, and a NUL-terminated path that outlives it.
    let (rc, st) = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c.as_ptr(), &mut st), st)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("asking the free space of {}'s file system", dir.display()));
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ by platform
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}
