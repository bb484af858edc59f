//! Finding the CPU-hosted driver's worker threads over the first single-token steps and
//! pinning each to a core of its own (`crate::gpu::pin`).

use super::*;

/// Single-token steps over which a model looks for the driver's workers, the threads
/// that ran most, and how many times it looks before it gives up.
const PIN_STEPS: u32 = 4;

const PIN_TRIES: u32 = 4;

/// What a model keeps while it looks for the driver's workers ([`GpuModel::pin`]).
#[derive(Default)]
pub(crate) struct PinWatch {
    /// The threads' run times when the current look began.
    census: Option<crate::gpu::pin::Census>,
    steps: u32,
    tries: u32,
}

impl GpuModel {
    /// After a step of `n_tokens`: look for the driver's workers over [`PIN_STEPS`]
    /// single-token steps, from the first single token on (the driver compiles each
    /// kernel at its first dispatch, on its submitting thread, which then outruns the
    /// workers), and pin them ([`crate::gpu::pin`]); look again, at most
    /// [`PIN_TRIES`] times, where a look does not find them (the chains' first dispatch
    /// compiles theirs).
    pub(super) fn pin_workers(&mut self, n_tokens: u32) {
        let Some(w) = self.pin.as_mut() else {
            return;
        };
        if n_tokens != 1 {
            return;
        }
        // One worker, or none (`LP_NUM_THREADS=0`), has no other to share a core with.
        let workers = crate::gpu::context::driver_threads() as usize;
        if workers < 2 {
            self.pin = None;
            return;
        }
        let Some(census) = w.census.as_ref() else {
            w.census = Some(crate::gpu::pin::Census::take());
            return;
        };
        w.steps += 1;
        if w.steps < PIN_STEPS {
            return;
        }
        match census.pin_busiest(workers) {
            Some(pins) => {
                self.pinned = pins;
                self.pin = None;
            }
            None if w.tries + 1 >= PIN_TRIES => self.pin = None,
            None => {
                w.tries += 1;
                w.steps = 0;
                w.census = Some(crate::gpu::pin::Census::take());
            }
        }
    }
}
