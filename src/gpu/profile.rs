//! Per-kernel GPU time of a forward step, for finding where a step's time goes.
//!
//! With `WGLLM_PROFILE=1` every dispatch of a step runs in its own compute pass bracketed
//! by timestamp queries; the times are added up per kernel label (the label up to its
//! first space, e.g. `mul_mat`) and printed to stderr when the model is dropped. Passes
//! per dispatch cost a little, so profile figures are for comparison, not for speed.

use std::collections::BTreeMap;

use super::GpuContext;
use crate::ops::{Dispatch, StepInfo};
use crate::Result;

/// Environment variable that turns profiling on.
pub const PROFILE_ENV: &str = "WGLLM_PROFILE";

/// Timestamp queries for one step's dispatches and the totals gathered so far.
pub struct Profiler {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    capacity: u32,
    period_ns: f64,
    /// Labels of the dispatches recorded in the pending step.
    pending: Vec<String>,
    /// Label -> (seconds, dispatches).
    totals: BTreeMap<String, (f64, u64)>,
    steps: u64,
}

impl Profiler {
    /// A profiler when `WGLLM_PROFILE` is set and the device has timestamp queries.
    pub fn from_env(ctx: &GpuContext, max_dispatches: usize) -> Option<Profiler> {
        if !env_on(PROFILE_ENV) {
            return None;
        }
        if !ctx.has_timestamps {
            eprintln!("{PROFILE_ENV}: {} has no timestamp queries", ctx.info.name);
            return None;
        }
        // Two queries per dispatch; wgpu caps a query set at 4096.
        let capacity = (max_dispatches * 2).clamp(2, 4096) as u32;
        let bytes = capacity as u64 * 8;
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: capacity,
        });
        let buffer = |label, usage| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Some(Profiler {
            set,
            resolve: buffer(
                "profile resolve",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            read: buffer(
                "profile read",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
            capacity,
            period_ns: ctx.queue.get_timestamp_period() as f64,
            pending: Vec::new(),
            totals: BTreeMap::new(),
            steps: 0,
        })
    }

    /// Start a step: drop what an unfinished one recorded.
    pub fn begin_step(&mut self) {
        self.pending.clear();
    }

    /// Record `dispatches`, each in its own timed pass (those past the query capacity
    /// and empty grids run untimed). A step may record its dispatches in several
    /// encoders; the last one calls [`finish`](Self::finish).
    pub fn record<'a>(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        dispatches: impl Iterator<Item = &'a Dispatch>,
        info: &StepInfo,
    ) -> crate::Result<()> {
        for d in dispatches {
            let i = self.pending.len() as u32 * 2;
            let timed = i + 1 < self.capacity && !d.grid(info).contains(&0);
            d.record_copies(enc, info);
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(&d.label),
                timestamp_writes: timed.then_some(wgpu::ComputePassTimestampWrites {
                    query_set: &self.set,
                    beginning_of_pass_write_index: Some(i),
                    end_of_pass_write_index: Some(i + 1),
                }),
            });
            d.record(&mut pass, info)?;
            drop(pass);
            if timed {
                self.pending.push(d.label.clone());
            }
        }
        Ok(())
    }

    /// Copy the step's timestamps out for [`collect`](Self::collect), at the end of its
    /// last encoder.
    pub fn finish(&self, enc: &mut wgpu::CommandEncoder) {
        let n = self.pending.len() as u32 * 2;
        if n > 0 {
            enc.resolve_query_set(&self.set, 0..n, &self.resolve, 0);
            enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, n as u64 * 8);
        }
    }

    /// After the step's submission completed: add its times to the totals.
    pub fn collect(&mut self, ctx: &GpuContext) -> Result<()> {
        let n = self.pending.len() * 2;
        if n == 0 {
            return Ok(());
        }
        let ticks: Vec<u64> = super::readback::map_read(ctx, &self.read, n)?;
        let pending = std::mem::take(&mut self.pending);
        for (k, label) in pending.iter().enumerate() {
            let dt = ticks[2 * k + 1].saturating_sub(ticks[2 * k]) as f64 * self.period_ns;
            let key = layer_free(label);
            let e = self.totals.entry(key).or_default();
            e.0 += dt * 1e-9;
            e.1 += 1;
        }
        self.steps += 1;
        Ok(())
    }

    /// The totals as a table: kernel, ms per step, share, dispatches per step.
    pub fn report(&self) -> String {
        let total: f64 = self.totals.values().map(|v| v.0).sum();
        let steps = self.steps.max(1) as f64;
        let mut rows: Vec<_> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        let mut out = format!(
            "GPU profile over {} steps ({:.2} ms per step):\n",
            self.steps,
            total * 1e3 / steps
        );
        for (label, (secs, count)) in rows {
            out.push_str(&format!(
                "  {label:<36} {:>9.3} ms/step {:>5.1}% {:>6.1} dispatches/step\n",
                secs * 1e3 / steps,
                100.0 * secs / total.max(f64::MIN_POSITIVE),
                *count as f64 / steps
            ));
        }
        out
    }
}

/// Whether the environment variable `name` is set to something other than "" or "0".
fn env_on(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v != "0" && !v.is_empty())
}

/// `label` with every run of digits replaced by `N`, so a kernel's layers add up.
fn layer_free(label: &str) -> String {
    let mut out = String::with_capacity(label.len());
    let mut in_digits = false;
    for ch in label.chars() {
        if ch.is_ascii_digit() {
            if !in_digits {
                out.push('N');
            }
            in_digits = true;
        } else {
            out.push(ch);
            in_digits = false;
        }
    }
    out
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if self.steps > 0 {
            eprint!("{}", self.report());
        }
    }
}

/// Environment variable that turns on [`HostTimes`].
pub const HOST_TIMES_ENV: &str = "WGLLM_HOST_TIMES";

/// Where the host's time goes in a step (`WGLLM_HOST_TIMES=1`): recording dispatches
/// into command buffers, submitting them, and waiting for the results, per step and
/// separately for single-token steps (decode) and batches; printed to stderr when the
/// model is dropped. A step whose recording takes as long as its kernels leaves the
/// device idle while the host records.
#[derive(Default)]
pub struct HostTimes {
    /// [single tokens, batches]: (steps, record, submit, wait) in seconds.
    kinds: [(u64, f64, f64, f64); 2],
}

/// One step's host phases, in seconds.
#[derive(Clone, Copy, Default)]
pub struct StepPhases {
    pub record: f64,
    pub submit: f64,
    pub wait: f64,
}

impl HostTimes {
    /// Host timing when `WGLLM_HOST_TIMES` is set.
    pub fn from_env() -> Option<HostTimes> {
        env_on(HOST_TIMES_ENV).then(HostTimes::default)
    }

    /// Add a step of `n_tokens`.
    pub fn add(&mut self, n_tokens: u32, p: StepPhases) {
        let k = &mut self.kinds[usize::from(n_tokens > 1)];
        k.0 += 1;
        k.1 += p.record;
        k.2 += p.submit;
        k.3 += p.wait;
    }

    /// The averages as lines of text.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for (name, (n, rec, sub, wait)) in ["single-token", "batch"].iter().zip(self.kinds) {
            if n == 0 {
                continue;
            }
            let ms = |s: f64| s * 1e3 / n as f64;
            out.push_str(&format!(
                "host, {n} {name} steps: record {:.3} ms, submit {:.3} ms, wait {:.3} ms per step\n",
                ms(rec),
                ms(sub),
                ms(wait)
            ));
        }
        out
    }
}

impl Drop for HostTimes {
    fn drop(&mut self) {
        eprint!("{}", self.report());
    }
}
