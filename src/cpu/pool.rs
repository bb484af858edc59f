//! A persistent thread pool for the CPU kernels.
//!
//! A forward step runs a few hundred small parallel ops (a 576x576 matrix takes tens of
//! microseconds), so waking threads through the OS for each one would cost as much as
//! the op. Workers are made once and spin on an epoch counter between jobs, falling
//! asleep on a condition variable only after a stretch of idleness. A job is broadcast:
//! every thread, the caller included, runs it once with its index and the thread count,
//! and splits the work itself.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_millis(2);

/// The job type as workers see it. Its lifetime is erased: `Pool::run` does not return
/// before every worker has finished with it.
type Job = *const (dyn Fn(usize, usize) + Sync);

struct Shared {
    /// Bumped once per job; workers compare it with the last one they ran.
    epoch: AtomicU64,
    job: UnsafeCell<Option<Job>>,
    /// Workers that have not finished the current job.
    pending: AtomicUsize,
    /// Workers asleep (or about to be) on `wake`.
    sleeping: AtomicUsize,
    panicked: AtomicBool,
    quit: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread inside `Pool::run` while no worker reads it
// (all workers finished the previous job, `pending == 0`), and published to workers by
// the Release increment of `epoch` they Acquire before reading it.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// A fixed set of worker threads plus the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `run` calls from different threads.
    run_lock: Mutex<()>,
}

impl Pool {
    /// A pool of `n_threads` threads in all (the caller counts as one); 0 means one per
    /// available core.
    pub fn new(n_threads: usize) -> Pool {
        let n = if n_threads == 0 {
            default_threads()
        } else {
            n_threads
        };
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            pending: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            quit: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let workers = (1..n)
            .filter_map(|ith| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("wgllm-cpu-{ith}"))
                    .spawn(move || worker(&s, ith, n))
                    .ok()
            })
            .collect::<Vec<_>>();
        Pool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// Threads that run each job, the caller included.
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(ith, n_threads)` once on every thread of the pool and returns when all
    /// are done. A panic in any of them is re-raised here.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.n_threads();
        if n == 1 {
            f(0, 1);
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: see `Shared`; the pointer outlives its use because we wait below
        // (also when `f` panics on this thread, through `WaitGuard`).
        unsafe {
            let job: Job = std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), Job>(f);
            *s.job.get() = Some(job);
        }
        s.pending.store(self.workers.len(), Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let guard = WaitGuard(s);
        f(0, n);
        drop(guard);
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a CPU worker thread panicked");
        }
    }
}

/// Waits for the workers to finish the current job, even while unwinding.
struct WaitGuard<'a>(&'a Shared);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let mut spins = 0u32;
        while self.0.pending.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins % 4096 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Threads the machine offers.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn worker(s: &Shared, ith: usize, n: usize) {
    let mut seen = 0u64;
    loop {
        match wait_for_job(s, seen) {
            Some(e) => seen = e,
            None => return,
        }
        // SAFETY: the epoch we acquired was published after `job` was written, and the
        // caller keeps the closure alive until `pending` reaches zero.
        let job = unsafe { *s.job.get() };
        if let Some(job) = job {
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(ith, n))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

/// Spins, then sleeps, until the epoch moves past `seen`; `None` when the pool quits.
fn wait_for_job(s: &Shared, seen: u64) -> Option<u64> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let e = s.epoch.load(Ordering::Acquire);
        if e != seen {
            return Some(e);
        }
        if s.quit.load(Ordering::Relaxed) {
            return None;
        }
        spins = spins.wrapping_add(1);
        if spins % 1024 != 0 || start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
        s.sleeping.fetch_add(1, Ordering::SeqCst);
        while s.epoch.load(Ordering::SeqCst) == seen && !s.quit.load(Ordering::SeqCst) {
            g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        s.sleeping.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The part of `0..n` thread `ith` of `nth` takes: contiguous, sizes differing by at most one.
pub fn split(n: usize, ith: usize, nth: usize) -> std::ops::Range<usize> {
    let nth = nth.max(1);
    let (q, r) = (n / nth, n % nth);
    let start = ith * q + ith.min(r);
    let len = q + usize::from(ith < r);
    start.min(n)..(start + len).min(n)
}

/// A mutable slice that threads of one `Pool::run` write through at disjoint indices.
pub struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: access goes through the unsafe methods whose callers promise disjointness.
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}
unsafe impl<T: Send> Send for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    pub fn new(s: &'a mut [T]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _life: std::marker::PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The first element, for kernels that write through raw pointers.
    pub fn ptr(&self) -> *mut T {
        self.ptr
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `v` at `i` (ignored when out of bounds).
    ///
    /// # Safety
    /// No other thread may access index `i` during the same job.
    pub unsafe fn write(&self, i: usize, v: T) {
        if i < self.len {
            *self.ptr.add(i) = v;
        }
    }

    /// The sub-slice `start..start + len` (clamped to the slice).
    ///
    /// # Safety
    /// No other thread may access these indices during the same job.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        let start = start.min(self.len);
        let len = len.min(self.len - start);
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_each_job_once() {
        for n in [1, 2, 3, 5] {
            let pool = Pool::new(n);
            assert_eq!(pool.n_threads(), n);
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(&|ith, nth| {
                    assert_eq!(nth, n);
                    hits[ith].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn sleeping_workers_wake_up() {
        let pool = Pool::new(2);
        std::thread::sleep(SPIN * 5);
        let sum = AtomicUsize::new(0);
        pool.run(&|ith, _| {
            sum.fetch_add(ith + 1, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn split_covers_the_range() {
        for n in [0, 1, 7, 64, 577] {
            for nth in 1..6 {
                let mut next = 0;
                for ith in 0..nth {
                    let r = split(n, ith, nth);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn worker_panic_is_reported() {
        let pool = Pool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|ith, _| {
                if ith == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        // The pool still works afterwards.
        let c = AtomicUsize::new(0);
        pool.run(&|_, _| {
            c.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(c.load(Ordering::Relaxed), 2);
    }
}
