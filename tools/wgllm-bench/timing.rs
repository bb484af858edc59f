//! Timing GPU work: one compute pass per repetition, bracketed by timestamp queries when
//! the device has them (else host time around a submission that is waited for).

use std::time::Instant;

use wgllm::gpu::GpuContext;
use wgllm::{Error, Result};

/// Durations of the timed repetitions, in seconds, and how they were taken.
#[derive(Clone, Debug)]
pub struct Samples {
    pub secs: Vec<f64>,
    pub gpu_clock: bool,
}

impl Samples {
    pub fn median(&self) -> f64 {
        let mut v = self.secs.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
        }
    }

    pub fn min(&self) -> f64 {
        self.secs.iter().copied().fold(f64::INFINITY, f64::min)
    }

    pub fn max(&self) -> f64 {
        self.secs.iter().copied().fold(0.0, f64::max)
    }

    /// (max - min) / median: how much the repetitions disagree.
    pub fn spread(&self) -> f64 {
        (self.max() - self.min()) / self.median()
    }
}

/// Timestamp query set with its resolve and readback buffers, made once per context.
pub struct Timer {
    queries: Option<(wgpu::QuerySet, wgpu::Buffer, wgpu::Buffer)>,
    period_ns: f64,
}

impl Timer {
    pub fn new(ctx: &GpuContext, use_gpu_clock: bool) -> Timer {
        let queries = (ctx.has_timestamps && use_gpu_clock).then(|| {
            let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("bench timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            });
            let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamp resolve"),
                size: 16,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            let read = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("timestamp read"),
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            (set, resolve, read)
        });
        Timer {
            queries,
            period_ns: ctx.queue.get_timestamp_period() as f64,
        }
    }

    /// Run `record` in its own pass `warmup + reps` times; return the last `reps` times.
    pub fn time(
        &self,
        ctx: &GpuContext,
        warmup: usize,
        reps: usize,
        record: &dyn Fn(&mut wgpu::ComputePass<'_>) -> Result<()>,
    ) -> Result<Samples> {
        let mut secs = Vec::with_capacity(reps);
        for i in 0..warmup + reps {
            let s = self.once(ctx, record)?;
            if i >= warmup {
                secs.push(s);
            }
        }
        Ok(Samples {
            secs,
            gpu_clock: self.gpu_clock(),
        })
    }

    /// Whether times come from GPU timestamps (else the host clock).
    pub fn gpu_clock(&self) -> bool {
        self.queries.is_some()
    }

    /// Run `record` in its own pass once; its time in seconds.
    pub fn once(
        &self,
        ctx: &GpuContext,
        record: &dyn Fn(&mut wgpu::ComputePass<'_>) -> Result<()>,
    ) -> Result<f64> {
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        {
            let writes =
                self.queries
                    .as_ref()
                    .map(|(set, _, _)| wgpu::ComputePassTimestampWrites {
                        query_set: set,
                        beginning_of_pass_write_index: Some(0),
                        end_of_pass_write_index: Some(1),
                    });
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("bench"),
                timestamp_writes: writes,
            });
            record(&mut pass)?;
        }
        if let Some((set, resolve, read)) = &self.queries {
            enc.resolve_query_set(set, 0..2, resolve, 0);
            enc.copy_buffer_to_buffer(resolve, 0, read, 0, 16);
        }
        let t0 = Instant::now();
        ctx.queue.submit([enc.finish()]);
        wait(ctx)?;
        let host = t0.elapsed().as_secs_f64();
        let Some((_, _, read)) = &self.queries else {
            return Ok(host);
        };
        let slice = read.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        wait(ctx)?;
        rx.recv()
            .map_err(|_| Error::gpu("timestamp readback never completed"))?
            .map_err(|e| Error::gpu(format!("mapping timestamps: {e}")))?;
        let ticks: Vec<u64> = {
            let view = slice
                .get_mapped_range()
                .map_err(|e| Error::gpu(format!("reading timestamps: {e}")))?;
            bytemuck::cast_slice::<u8, u64>(&view).to_vec()
        };
        read.unmap();
        let (a, b) = match ticks.as_slice() {
            [a, b, ..] => (*a, *b),
            _ => return Ok(host),
        };
        // A driver that does not advance its timestamps inside a pass yields 0; fall
        // back to the host clock then.
        if b <= a {
            return Ok(host);
        }
        Ok((b - a) as f64 * self.period_ns * 1e-9)
    }
}

/// Block until the queue is idle.
pub fn wait(ctx: &GpuContext) -> Result<()> {
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map(|_| ())
        .map_err(|e| Error::gpu(format!("waiting for the GPU: {e}")))
}
