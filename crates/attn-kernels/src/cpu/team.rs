//! Runs `n` tasks on the calling thread, with helpers joining as they wake up: the work split of a
//! decoding step ([`super::decode`]), and on the OpenMP team that of every phase of a longer call
//! ([`Helpers::tasks`]). The helpers come from the calling thread's rayon pool or from the OpenMP
//! runtime the process has loaded ([`Helpers`]).
//!
//! A rayon `par_iter` from a thread outside the pool, or `install`, hands the whole job to the pool
//! and blocks the caller; a pool worker that must be woken wakes another for the second half, and the
//! caller is woken again at the end. A futex wake took 40 us and more on a 2-core VM whenever the
//! workers had gone to sleep during the model's other operations (a decoding step after a matrix
//! product: 122 us against 54 us back to back, `docs/bench/decode-cpu-notes.md`), more than a 1K-key
//! step's work. Here the caller starts at once and takes tasks from a shared counter; helpers spawned
//! into the pool take the tasks that are left when they arrive; the caller waits only for tasks a
//! helper has started, never for a helper to wake. A helper that arrives after the last task has
//! been taken finds the counter past `n` and returns without touching the tasks.
//!
//! Under PyTorch, a rayon pool is a second set of threads beside libtorch's intra-op pool (OpenMP in
//! PyTorch's Linux wheels): on 2 cores the two took the cores from each other, and rayon's workers
//! were asleep whenever a step followed the model's other operations. [`Helpers::OpenMp`] runs the
//! step on the OpenMP team of the calling thread instead (`GOMP_parallel`, what `at::parallel_for`
//! runs), the threads libtorch's operations have just used and that spin for a while after each.

use std::ffi::{c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use rayon::prelude::*;

/// The threads a call runs on: where a short call's (a decoding step's) helpers come from, and
/// what splits the phases of a longer one (`Helpers::tasks`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Helpers {
    /// Tasks spawned into the calling thread's rayon pool (the global one off any pool), as many
    /// as it has threads.
    #[default]
    Rayon,
    /// The team of the OpenMP runtime the process has loaded, `threads` threads with the caller
    /// (libgomp's `GOMP_parallel`: libtorch's intra-op pool when libtorch runs on libgomp). Made by
    /// [`Helpers::openmp`], which checks that the runtime is there.
    OpenMp {
        /// Threads of the team, the caller included.
        threads: usize,
    },
}

/// libgomp's entry of a parallel region: `fn(data)` runs on every thread of a team of `threads`
/// threads (0: the caller's default), the caller included, and the call returns when all are done.
type GompParallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint);

/// `GOMP_parallel` of the libgomp in the process's global symbol scope (looked up once; libtorch's
/// wheels load theirs there), or `None`.
fn gomp_parallel() -> Option<GompParallel> {
    static SYMBOL: OnceLock<Option<GompParallel>> = OnceLock::new();
    *SYMBOL.get_or_init(|| {
        let this = libloading::os::unix::Library::this();
        // SAFETY: the symbol, where present, is libgomp's `GOMP_parallel`, of this signature since
        // GCC 4.9 (libgomp's ABI `GOMP_4.0`).
        let f = unsafe { this.get::<GompParallel>(b"GOMP_parallel\0") }.ok().map(|f| *f);
        // The library handle of the process itself: closing it unloads nothing.
        std::mem::forget(this);
        f
    })
}

impl Helpers {
    /// The OpenMP team of `threads` threads, when the process has loaded libgomp; `None` otherwise.
    pub fn openmp(threads: usize) -> Option<Helpers> {
        gomp_parallel().map(|_| Helpers::OpenMp { threads: threads.max(1) })
    }

    /// The threads a call has, the caller included.
    pub(crate) fn threads(self) -> usize {
        match self {
            Helpers::Rayon => rayon::current_num_threads(),
            Helpers::OpenMp { threads } => threads,
        }
    }

    /// Runs `f(0)`, ..., `f(n - 1)` on this thread and its helpers; returns when every task is
    /// done, and raises a task's panic here once the others have finished.
    pub(crate) fn run(self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        match self {
            Helpers::Rayon => run(n, self.threads() - 1, f),
            Helpers::OpenMp { threads } => match gomp_parallel() {
                Some(parallel) if threads > 1 && n > 1 => run_openmp(parallel, n, threads.min(n), f),
                _ => run(n, 0, f),
            },
        }
    }

    /// `f(i, &mut items[i])` for every `i`, as [`Helpers::run`] runs tasks.
    pub(crate) fn for_each_mut<T: Send>(self, items: &mut [T], f: &(dyn Fn(usize, &mut T) + Sync)) {
        let base = Base(items.as_mut_ptr());
        let base = &base;
        // SAFETY: `i < items.len()` and task `i` runs once (see `Base`).
        self.run(items.len(), &|i| f(i, unsafe { &mut *base.0.add(i) }));
    }

    /// Tasks `0..n` of one phase of a longer call (the forward's query tiles, the backward's
    /// phases): split by rayon's work stealing on the current pool ([`Helpers::Rayon`], what
    /// `par_iter` does), or taken from a shared counter by the OpenMP team ([`Helpers::OpenMp`]:
    /// under PyTorch, libtorch's intra-op threads, so that no second pool competes with them).
    pub(crate) fn tasks(self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        match self {
            Helpers::Rayon => (0..n).into_par_iter().for_each(f),
            Helpers::OpenMp { .. } => self.run(n, f),
        }
    }

    /// `f(i, chunk)` for chunk `i` of `items` in chunks of `len` (the last may be shorter; `len >= 1`),
    /// the chunks run as [`Helpers::tasks`] runs tasks.
    pub(crate) fn chunks_mut<T: Send>(self, items: &mut [T], len: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
        match self {
            Helpers::Rayon => items.par_chunks_mut(len).enumerate().for_each(|(i, c)| f(i, c)),
            Helpers::OpenMp { .. } => {
                let total = items.len();
                let base = Base(items.as_mut_ptr());
                let base = &base;
                self.run(total.div_ceil(len), &|i| {
                    let start = i * len;
                    // SAFETY: the chunks of distinct tasks are disjoint ranges inside `items`, and task
                    // `i` runs once (see `Base`).
                    f(i, unsafe { std::slice::from_raw_parts_mut(base.0.add(start), len.min(total - start)) })
                });
            }
        }
    }

    /// `(0..n).map(f)` collected, the calls made as [`Helpers::run`] runs tasks.
    pub(crate) fn map<T: Send>(self, n: usize, f: &(dyn Fn(usize) -> T + Sync)) -> Vec<T> {
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
        self.for_each_mut(&mut out, &|i, slot| *slot = Some(f(i)));
        out.into_iter().map(|x| x.expect("every task ran")).collect()
    }
}

/// The start of a slice whose disjoint parts tasks take.
struct Base<T>(*mut T);
// SAFETY: each element (or chunk) is handed to one task only (`run` runs every task once), so the
// `&mut` made from it is unique; `T: Send` moves the access across threads.
unsafe impl<T: Send> Sync for Base<T> {}

/// What the caller and its helpers share; kept alive by the helpers' `Arc`s after the caller returns.
struct Shared {
    /// The next task to take.
    next: AtomicUsize,
    /// Tasks finished (or abandoned by a panic).
    done: AtomicUsize,
    panicked: AtomicBool,
    n: usize,
    /// The tasks' function, its lifetime erased: called only for a task taken below `n`, and the
    /// caller does not return before every such task is done.
    f: *const (dyn Fn(usize) + Sync),
}

// SAFETY: `f` points to a `Sync` closure that outlives every call through it (see `run`); the rest
// is atomics and plain data.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    /// Takes and runs tasks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            // SAFETY: task i < n was taken here, so the caller is still waiting in `run` (it returns
            // only once `done` reaches n), and `f` is alive.
            let f = unsafe { &*self.f };
            if catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// Runs `f(0)`, ..., `f(n - 1)` on this thread and on up to `helpers` tasks spawned into the current
/// rayon pool (the global one off any pool). Returns when every task is done; a panic in a task is
/// raised here once the others have finished.
pub(crate) fn run(n: usize, helpers: usize, f: &(dyn Fn(usize) + Sync)) {
    if n == 0 {
        return;
    }
    // SAFETY (of the erased lifetime): `run` does not return before `done == n`, and no task is taken
    // at or past `n`, so no call through `f` outlives this frame.
    let f: *const (dyn Fn(usize) + Sync + '_) = f;
    let f: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    let shared = Arc::new(Shared {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
        n,
        f,
    });
    for _ in 0..helpers.min(n - 1) {
        let s = Arc::clone(&shared);
        rayon::spawn(move || s.work());
    }
    shared.work();
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < n {
        // A helper is finishing a task it took: a task lasts microseconds.
        if spins < 1 << 10 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
    if shared.panicked.load(Ordering::Relaxed) {
        panic!("a task of a fused CPU kernel panicked on a helper thread");
    }
}

/// [`run`] on an OpenMP team of `threads` threads (the caller is thread 0): every thread of the team
/// takes tasks from the counter; the region ends when all have returned.
fn run_openmp(parallel: GompParallel, n: usize, threads: usize, f: &(dyn Fn(usize) + Sync)) {
    extern "C" fn work(data: *mut c_void) {
        // SAFETY: `data` is the `Shared` below, alive until `parallel` returns.
        let shared = unsafe { &*(data as *const Shared) };
        shared.work();
    }
    // SAFETY (of the erased lifetime): `parallel` returns only when every thread of the team has
    // left `work`, so no call through `f` outlives this frame.
    let f: *const (dyn Fn(usize) + Sync + '_) = f;
    let f: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    let shared =
        Shared { next: AtomicUsize::new(0), done: AtomicUsize::new(0), panicked: AtomicBool::new(false), n, f };
    let threads = c_uint::try_from(threads).unwrap_or(c_uint::MAX);
    // SAFETY: libgomp's `GOMP_parallel` (see `gomp_parallel`); `work` catches every panic of a task
    // (`Shared::work`), so none unwinds through the C frames.
    unsafe { parallel(work, &shared as *const Shared as *mut c_void, threads, 0) };
    debug_assert_eq!(shared.done.load(Ordering::Acquire), n);
    if shared.panicked.load(Ordering::Relaxed) {
        panic!("a task of a fused CPU kernel panicked on a helper thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_with_or_without_helpers_on_any_pool() {
        for threads in [1, 2, 4] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            for (n, helpers) in [(0, 3), (1, 3), (7, 0), (7, 3), (100, 8)] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                let count = |i: usize| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                };
                // From a worker of the pool, and from this (outside) thread with the global pool.
                pool.install(|| run(n, helpers, &count));
                run(n, helpers, &count);
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 2), "n = {n}, helpers = {helpers}");
            }
        }
    }

    /// The OpenMP helpers with the system's libgomp loaded into the global scope (as libtorch's
    /// wheels load theirs): every task runs once, on more than one thread of the team, and a task's
    /// panic reaches the caller without unwinding through libgomp.
    #[test]
    fn openmp_helpers_run_every_task_once_on_several_threads() {
        // SAFETY: libgomp runs no initialiser that depends on anything but the C library.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some("libgomp.so.1"),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
            )
        }
        .expect("libgomp.so.1 (GCC's OpenMP runtime, which the C compiler of the build brings)");
        let helpers = Helpers::openmp(3).expect("GOMP_parallel in the global scope once libgomp is loaded");
        assert_eq!(helpers, Helpers::OpenMp { threads: 3 });
        let n = 40;
        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        let threads = std::sync::Mutex::new(std::collections::HashSet::new());
        helpers.run(n, &|i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
            threads.lock().unwrap().insert(std::thread::current().id());
            // Long enough that the team's other threads arrive before the caller has taken every task.
            std::thread::sleep(std::time::Duration::from_millis(2));
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        let seen = threads.into_inner().unwrap().len();
        assert!((2..=3).contains(&seen), "tasks ran on {seen} threads of a team of 3");
        let squares = helpers.map(n, &|i| i * i);
        assert_eq!(squares, (0..n).map(|i| i * i).collect::<Vec<_>>());
        let caught = catch_unwind(AssertUnwindSafe(|| helpers.run(n, &|i| assert_ne!(i, 7))));
        assert!(caught.is_err());
        std::mem::forget(lib); // the runtime's threads live on: never unload it
    }

    #[test]
    fn a_panicking_task_is_raised_in_the_caller_after_the_others() {
        let done = AtomicUsize::new(0);
        let caught = catch_unwind(AssertUnwindSafe(|| {
            run(20, 2, &|i| {
                if i == 13 {
                    panic!("task 13");
                }
                done.fetch_add(1, Ordering::Relaxed);
            })
        }));
        assert!(caught.is_err());
        assert_eq!(done.load(Ordering::Relaxed), 19);
    }
}
