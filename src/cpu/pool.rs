//! A persistent thread pool for the CPU kernels.
//!
//! A forward step runs a few hundred small parallel ops (a 576x576 matrix takes tens of
//! microseconds), so waking threads through the OS for each one would cost as much as
//! the op. Workers are made once and spin on a state word between jobs, falling asleep
//! on a condition variable only after a stretch of idleness.
//!
//! A job is `n_threads` items, `f(i, n_threads)` for every i, each run once by whichever
//! thread claims it first, the caller included. The caller returns once every item is
//! done: a worker the OS has not scheduled (the machine is busy with other work) does
//! not hold the job up, it finds the job closed when it gets to run, and skips it.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_millis(2);

/// The job type as workers see it. Its lifetime is erased: `Pool::run` does not return
/// while a worker is inside it.
type Job = *const (dyn Fn(usize, usize) + Sync);

struct Shared {
    /// Job number times two, plus one while the job is open to workers.
    state: AtomicU64,
    job: UnsafeCell<Option<Job>>,
    /// Next item to claim, and items finished, of the current job.
    next: AtomicUsize,
    done: AtomicUsize,
    /// Workers between announcing themselves and leaving a job (or skipping it).
    inflight: AtomicUsize,
    /// Workers asleep (or about to be) on `wake`.
    sleeping: AtomicUsize,
    panicked: AtomicBool,
    quit: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread inside `Pool::run`, while the state is
// closed and no worker is in flight; a worker reads it only after announcing itself in
// `inflight` and then seeing the state open (both SeqCst), and the caller closes the
// state and waits for `inflight` to drain before the job's closure goes away.
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
            state: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            inflight: AtomicUsize::new(0),
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
                    .spawn(move || worker(&s, n))
                    .ok()
            })
            .collect::<Vec<_>>();
        Pool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// Items per job: the threads, the caller included.
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(thread, item)` for every item in `0..n_items`, each claimed in turn by
    /// whichever thread is free: a thread the OS pauses holds up one item only, and
    /// threads that finish early take more.
    pub fn run_items(&self, n_items: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        let next = AtomicUsize::new(0);
        self.run(&|ith, _| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n_items {
                break;
            }
            f(ith, i);
        });
    }

    /// Runs `f(pieces)` over `0..n` in contiguous pieces that cover it exactly once, for
    /// work that streams through memory: each thread walks a range of its own from the
    /// front, so its reads stay one sequential stream, and a thread done with its own
    /// range takes pieces from the back of the others'. Pieces are at least `grain`
    /// long (where that much is left) and at most `max_piece`; the owner takes a quarter
    /// of what is left of its range, a thief half of it, so the pieces shrink toward
    /// the end and the threads finish together.
    pub fn run_ranges(
        &self,
        n: usize,
        grain: usize,
        max_piece: usize,
        f: &(dyn Fn(std::ops::Range<usize>) + Sync),
    ) {
        let nth = self.n_threads();
        if n == 0 {
            return;
        }
        // A range's front and back are packed in 32 bits each; a job of more pieces than
        // that (none a model makes) runs on this thread.
        if nth == 1 || n <= grain || u32::try_from(n).is_err() {
            return f(0..n);
        }
        let (grain, max_piece) = (grain.max(1), max_piece.max(grain.max(1)));
        let ranges: Vec<Ranges> = (0..nth)
            .map(|i| {
                let r = split(n, i, nth);
                Ranges::new(r.start, r.end)
            })
            .collect();
        self.run(&|i, nth| {
            let own = &ranges[i];
            while let Some(r) = own.take_front(grain, max_piece) {
                f(r);
            }
            for other in (1..nth).map(|k| &ranges[(i + k) % nth]) {
                while let Some(r) = other.take_back(grain) {
                    f(r);
                }
            }
        });
    }

    /// Runs `f(items, part)` over the items of `out`, `item_len` values each: the items
    /// split into one contiguous range per thread, `part` being their values. On this
    /// thread alone, with all of them, when `out` holds fewer than 32768 values: below
    /// that, waking the other threads costs more than they save.
    pub fn split_out<T: Send>(
        &self,
        out: &mut [T],
        item_len: usize,
        f: &(dyn Fn(std::ops::Range<usize>, &mut [T]) + Sync),
    ) {
        let n_items = out.len() / item_len.max(1);
        if out.len() < 1 << 15 || self.n_threads() == 1 {
            return f(0..n_items, out);
        }
        let o = SharedMut::new(out);
        self.run(&|ith, nth| {
            let items = split(n_items, ith, nth);
            // SAFETY: the ranges of `split` do not overlap.
            let part = unsafe { o.slice(items.start * item_len, items.len() * item_len) };
            f(items, part);
        });
    }

    /// Runs `f(i, n_threads)` once for every `i` in `0..n_threads`, spread over the
    /// pool's threads, and returns when all are done. A panic in any of them is
    /// re-raised here.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.n_threads();
        if n == 1 {
            f(0, 1);
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let epoch = (s.state.load(Ordering::Relaxed) >> 1) + 1;
        // SAFETY: see `Shared`: the state is closed and nobody is in flight (the last
        // job's guard waited), and the pointer outlives its use because the guard below
        // waits again, also when `f` panics on this thread.
        unsafe {
            let job: Job = std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), Job>(f);
            *s.job.get() = Some(job);
        }
        s.next.store(0, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        s.state.store(epoch << 1 | 1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let guard = CloseGuard(s, epoch);
        while let Some(i) = claim(s, n) {
            f(i, n);
            s.done.fetch_add(1, Ordering::Release);
        }
        // Items other threads claimed and are still running.
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < n {
            spins = spins.wrapping_add(1);
            backoff(spins);
        }
        drop(guard);
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a CPU worker thread panicked");
        }
    }
}

fn claim(s: &Shared, n: usize) -> Option<usize> {
    let i = s.next.fetch_add(1, Ordering::Relaxed);
    (i < n).then_some(i)
}

/// Spin, and every so often give the core away: on a busy machine the thread we wait
/// for may be waiting for this core.
fn backoff(spins: u32) {
    if spins % 256 == 0 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Closes the job and waits for the workers inside it to leave, even while unwinding.
struct CloseGuard<'a>(&'a Shared, u64);

impl Drop for CloseGuard<'_> {
    fn drop(&mut self) {
        let s = self.0;
        s.state.store(self.1 << 1, Ordering::SeqCst);
        let mut spins = 0u32;
        while s.inflight.load(Ordering::SeqCst) != 0 {
            spins = spins.wrapping_add(1);
            backoff(spins);
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

fn worker(s: &Shared, n: usize) {
    let mut seen = 0u64;
    while wait_for_job(s, seen) {
        s.inflight.fetch_add(1, Ordering::SeqCst);
        let st = s.state.load(Ordering::SeqCst);
        seen = st >> 1;
        if st & 1 == 1 {
            // SAFETY: the state is open and we are in flight, so the caller keeps the
            // closure alive and does not replace it until we leave (see `Shared`).
            if let Some(job) = unsafe { *s.job.get() } {
                let f = unsafe { &*job };
                while let Some(i) = claim(s, n) {
                    if catch_unwind(AssertUnwindSafe(|| f(i, n))).is_err() {
                        s.panicked.store(true, Ordering::Relaxed);
                    }
                    s.done.fetch_add(1, Ordering::Release);
                }
            }
        }
        s.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Spins, then sleeps, until a job newer than `seen` is published; false when the pool
/// quits.
fn wait_for_job(s: &Shared, seen: u64) -> bool {
    let start = Instant::now();
    let mut spins = 0u32;
    let fresh = |s: &Shared| s.state.load(Ordering::SeqCst) >> 1 != seen;
    loop {
        if fresh(s) {
            return true;
        }
        if s.quit.load(Ordering::Relaxed) {
            return false;
        }
        spins = spins.wrapping_add(1);
        if spins % 1024 != 0 || start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
        s.sleeping.fetch_add(1, Ordering::SeqCst);
        while !fresh(s) && !s.quit.load(Ordering::SeqCst) {
            g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        s.sleeping.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What is left of one thread's range in [`Pool::run_ranges`]: its front and back in
/// one word, so that the owner taking from the front and thieves taking from the back
/// never hand out the same index. Aligned to its own pair of cache lines: threads
/// claiming pieces of neighbouring ranges in one line took turns fetching it, a miss
/// per claim.
#[repr(align(128))]
struct Ranges(AtomicU64);

impl Ranges {
    fn new(front: usize, back: usize) -> Ranges {
        Ranges(AtomicU64::new(pack(front, back)))
    }

    /// A quarter of what is left, within `grain..=max_piece`, from the front.
    fn take_front(&self, grain: usize, max_piece: usize) -> Option<std::ops::Range<usize>> {
        self.take(|left| (left / 4).clamp(grain, max_piece), false)
    }

    /// Half of what is left, at least `grain`, from the back.
    fn take_back(&self, grain: usize) -> Option<std::ops::Range<usize>> {
        self.take(|left| (left / 2).max(grain), true)
    }

    fn take(&self, size: impl Fn(usize) -> usize, back: bool) -> Option<std::ops::Range<usize>> {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let (f, b) = unpack(cur);
            if f >= b {
                return None;
            }
            let k = size(b - f).min(b - f);
            let (next, piece) = if back {
                (pack(f, b - k), b - k..b)
            } else {
                (pack(f + k, b), f..f + k)
            };
            match self
                .0
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(piece),
                Err(now) => cur = now,
            }
        }
    }
}

/// Front and back of a range below 2^32 in one word.
fn pack(front: usize, back: usize) -> u64 {
    (front as u64) << 32 | back as u64
}

fn unpack(v: u64) -> (usize, usize) {
    ((v >> 32) as usize, (v & 0xffff_ffff) as usize)
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
    fn every_item_runs_once_per_job() {
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
    fn ranges_cover_every_index_once() {
        for nth in [1, 2, 3, 4] {
            let pool = Pool::new(nth);
            for (n, grain, max_piece) in [
                (0, 1, 8),
                (1, 1, 1),
                (7, 2, 3),
                (577, 4, 64),
                (10000, 1, 5000),
            ] {
                for _ in 0..20 {
                    let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    pool.run_ranges(n, grain, max_piece, &|r| {
                        assert!(r.start < r.end && r.end <= n, "{r:?} of {n}");
                        for i in r {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        }
                    });
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                }
            }
        }
    }

    #[test]
    fn a_stalled_thread_has_its_range_taken() {
        // Item 0's thread stalls on its first piece until the rest of 0..n is done: only
        // the others taking from the back of its range lets the job finish.
        let pool = Pool::new(2);
        let n = 4000;
        let done = AtomicUsize::new(0);
        pool.run_ranges(n, 10, 100, &|r| {
            if r.start == 0 {
                while done.load(Ordering::Acquire) < n - r.len() {
                    std::hint::spin_loop();
                }
            }
            done.fetch_add(r.len(), Ordering::AcqRel);
        });
        assert_eq!(done.load(Ordering::Relaxed), n);
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
