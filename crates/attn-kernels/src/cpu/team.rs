//! Runs `n` tasks on the calling thread, with helpers from its rayon pool joining as they wake up:
//! the work split of a decoding step ([`super::decode`]).
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

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
