//! A CPU-hosted driver's worker threads, each kept on a core of its own.
//!
//! lavapipe runs a dispatch's workgroups on llvmpipe's worker threads, one per core,
//! which sleep between dispatches. When the scheduler wakes two of them on one core,
//! it leaves them there while the other core idles: a woken thread counts as hot in
//! its cache, so the idle core does not pull it over. A chain's workgroups then take
//! turns on one core, spinning while the other works. `perf record -a` over a decode
//! showed it as stretches with the cores 35-50% idle and both workers on both cores,
//! against 15-20% idle with each worker staying on its own core. Pinned, SmolLM2
//! decoded 1.19x and Gemma 3 1.05x faster on average in alternated runs, with far
//! fewer slow repetitions (docs/perf.md, "Worker threads pinned").
//!
//! The driver names no thread it would let us find, so [`Census::pin_busiest`] takes
//! them as the threads that ran most over a few single-token steps, and pins them, one
//! per allowed core in turn. Those steps come after the first single token: the
//! driver's own submitting thread compiles each kernel at its first dispatch and then
//! outruns the workers (a model looks again where that spoils a look). Threads of ours
//! are named and left alone.
//! `WGLLM_PIN_THREADS=off` turns this off (a machine shared with other work may want
//! the scheduler free to move them); `on` asks for it on any device.

use crate::error::Result;

/// Environment variable overriding whether workers are pinned: `on` or `off`.
pub const ENV: &str = "WGLLM_PIN_THREADS";

/// Whether to pin the driver's workers: as `WGLLM_PIN_THREADS` says if set, else on
/// CPU-hosted devices only (a GPU's work runs on no thread of ours).
pub fn wanted(device_type: wgpu::DeviceType) -> Result<bool> {
    super::context::cpu_hosted_switch(ENV, device_type)
}

/// Threads that ran at least this share of the busiest one's time since the census,
/// count as the driver's workers.
const WORKER_SHARE: f64 = 0.25;

/// The run time so far of each of this process's threads, by thread id.
pub struct Census {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    ran: Vec<(i32, u64)>,
}

impl Census {
    /// Every thread's run time now (none where the platform does not tell).
    pub fn take() -> Census {
        #[cfg(target_os = "linux")]
        return Census {
            ran: linux::threads()
                .into_iter()
                .map(|t| (t.tid, t.ran_ns))
                .collect(),
        };
        #[cfg(not(target_os = "linux"))]
        Census { ran: Vec::new() }
    }

    /// Pin the `workers` threads that ran most since this census, one per core this
    /// process may use, in turn: the calling thread and the named threads of the
    /// process are not among them. `None` where that does not pick `workers` threads
    /// (the others ran less than a quarter of the busiest one's time), and on
    /// platforms without thread affinity; else the threads and their cores.
    pub fn pin_busiest(&self, workers: usize) -> Option<Vec<(i32, usize)>> {
        #[cfg(target_os = "linux")]
        {
            let before: std::collections::HashMap<i32, u64> = self.ran.iter().copied().collect();
            let now = linux::threads();
            let chosen = busiest(&before, &now, workers)?;
            let cores = linux::allowed_cores();
            if cores.len() < 2 {
                return None;
            }
            let pins: Vec<(i32, usize)> = chosen
                .into_iter()
                .zip(cores.iter().cycle())
                .map(|(tid, &core)| (tid, core))
                .collect();
            pins.iter()
                .all(|&(tid, core)| linux::pin(tid, core))
                .then_some(pins)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = workers;
            None
        }
    }
}

/// One thread of the process: its id, whether someone named it, and its run time.
#[derive(Clone, Debug)]
struct Thread {
    tid: i32,
    named: bool,
    ran_ns: u64,
}

/// The `workers` threads among `now` (the calling thread left out beforehand) that
/// are unnamed and ran most since `before`, if exactly that many ran at least
/// [`WORKER_SHARE`] of the busiest one's time.
fn busiest(
    before: &std::collections::HashMap<i32, u64>,
    now: &[Thread],
    workers: usize,
) -> Option<Vec<i32>> {
    let mut ran: Vec<(u64, i32)> = now
        .iter()
        .filter(|t| !t.named)
        .map(|t| {
            (
                t.ran_ns.saturating_sub(*before.get(&t.tid).unwrap_or(&0)),
                t.tid,
            )
        })
        .collect();
    ran.sort_unstable_by(|a, b| b.cmp(a));
    let top = ran.first()?.0;
    let busy = ran
        .iter()
        .take_while(|(ns, _)| *ns as f64 >= top as f64 * WORKER_SHARE && *ns > 0)
        .count();
    (workers > 0 && busy == workers).then(|| ran[..workers].iter().map(|&(_, t)| t).collect())
}

#[cfg(target_os = "linux")]
mod linux {
    use super::Thread;

    /// This process's threads but the calling one, with their run times
    /// (`/proc/self/task/*/schedstat`, in nanoseconds). A thread is named where its
    /// name is neither the main thread's nor the calling thread's, which threads that
    /// no one names inherit from the thread that started them.
    pub fn threads() -> Vec<Thread> {
        // SAFETY: gettid and getpid take no arguments and cannot fail.
        let (me, pid) = unsafe { (libc::gettid(), libc::getpid()) };
        let name_of =
            |tid: i32| std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok();
        let plain = [name_of(pid), name_of(me)];
        let Ok(entries) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        entries
            .filter_map(|e| {
                let tid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
                if tid == me {
                    return None;
                }
                let dir = format!("/proc/self/task/{tid}");
                let stat = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
                let ran_ns = stat.split_whitespace().next()?.parse().ok()?;
                let name = name_of(tid)?;
                let named = !plain.iter().any(|p| p.as_deref() == Some(name.as_str()));
                Some(Thread { tid, named, ran_ns })
            })
            .collect()
    }

    /// The cores this process may run on.
    pub fn allowed_cores() -> Vec<usize> {
        // SAFETY: a zeroed cpu_set_t is a valid empty set, and sched_getaffinity writes
        // at most its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Vec::new();
            }
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    /// Keep thread `tid` on `core`; false where the system refused.
    pub fn pin(tid: i32, core: usize) -> bool {
        // SAFETY: as in `allowed_cores`; sched_setaffinity reads the set only.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(core, &mut set);
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn t(tid: i32, named: bool, ran_ns: u64) -> Thread {
        Thread { tid, named, ran_ns }
    }

    #[test]
    fn picks_the_workers_that_ran_most_since_the_census() {
        let before = HashMap::from([(10, 5_000_000), (11, 1_000), (12, 0), (13, 900_000_000)]);
        // 13 ran long before the census and little since; 14 is one of ours.
        let now = [
            t(10, false, 45_000_000),
            t(11, false, 38_000_000),
            t(12, false, 2_000_000),
            t(13, false, 901_000_000),
            t(14, true, 500_000_000),
        ];
        let mut got = busiest(&before, &now, 2).expect("two workers");
        got.sort();
        assert_eq!(got, vec![10, 11]);
    }

    #[test]
    fn refuses_when_the_busy_threads_are_not_as_many_as_the_workers() {
        let before = HashMap::new();
        let now = [t(1, false, 40), t(2, false, 39), t(3, false, 38)];
        assert_eq!(busiest(&before, &now, 2), None);
        let idle = [t(1, false, 0), t(2, false, 0)];
        assert_eq!(busiest(&before, &idle, 2), None);
        assert_eq!(busiest(&before, &[], 2), None);
        assert_eq!(busiest(&before, &now, 0), None);
    }
}
