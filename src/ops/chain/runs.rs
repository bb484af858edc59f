//! Runs: the stretches of a step's plan that could become chains, and what each
//! would bind and take in loop trips.

use super::*;

impl Bindings {
    /// The chain's own group: its counters, its parameters and the members' step.
    pub(super) const CHAIN: Bindings = Bindings {
        uniform: 1,
        storage: 2,
        textures: 0,
    };

    fn of(layout: &[Binding]) -> Bindings {
        let count = |f: fn(&Binding) -> bool| layout.iter().filter(|b| f(b)).count() as u32;
        Bindings {
            uniform: count(|b| *b == Binding::Uniform),
            storage: count(|b| matches!(b, Binding::Read | Binding::ReadWrite)),
            textures: count(|b| matches!(b, Binding::Texture | Binding::TextureWrite)),
        }
    }

    fn add(self, o: Bindings) -> Bindings {
        Bindings {
            uniform: self.uniform + o.uniform,
            storage: self.storage + o.storage,
            textures: self.textures + o.textures,
        }
    }

    fn fits(self, ctx: &GpuContext) -> bool {
        let l = &ctx.limits;
        self.uniform <= l.max_uniform_buffers_per_shader_stage
            && self.storage <= l.max_storage_buffers_per_shader_stage
            && self.textures <= l.max_storage_textures_per_shader_stage
    }
}

impl Run {
    /// Trips its first phase adds at `n_kv` cached positions, all its items taken by
    /// one workgroup (`chain_spin` in shaders/common/chain.wgsl counts them each step).
    #[cfg(test)]
    pub(super) fn kv_work(&self, n_kv: u32) -> u64 {
        self.kv.map_or(0, |(items, k)| {
            items * u64::from(k.per_8) * u64::from(n_kv.div_ceil(8))
        })
    }

    /// This run with dispatch `i` (of `grid`, `work` trips and `bindings`) after it.
    fn then(&self, i: usize, grid: [u32; 3], work: u64, bindings: Bindings) -> Run {
        let mut r = self.clone();
        r.range.end = i + 1;
        r.members.push(i);
        r.grids.push(grid);
        r.work += work;
        r.bindings = r.bindings.add(bindings);
        r
    }

    /// Whether it makes a chain within the device's limits and `cap` phases: bindings,
    /// and a trip budget that leaves every wait its fewest reads and an optional first
    /// phase at least [`KV_MIN`] positions.
    fn fits(&self, ctx: &GpuContext, cap: usize) -> bool {
        let phases = self.members.len() as u64;
        self.members.len() <= cap.min(MAX_PHASES)
            && self.bindings.fits(ctx)
            && self.fixed() + phases * MIN_SPIN <= TRIP_BUDGET
            && self.kv_max().is_none_or(|n| n >= KV_MIN)
    }

    /// Its chain's parameters: its counters from `base`, the counters of the chain
    /// before (`prev`, from `prev_base`) to zero, its trip budget and its phases' grids.
    pub(super) fn params(&self, base: u32, prev_base: u32, prev: &Run) -> ChainParams {
        let mut params = ChainParams {
            base,
            clear: prev_base,
            clear_n: 2 * prev.members.len() as u32,
            spin: MAX_SPIN as u32,
            kv_max: self.kv_max().unwrap_or(u32::MAX),
            left: u32::try_from(TRIP_BUDGET.saturating_sub(self.fixed())).unwrap_or(0),
            kv_8: self.kv.map_or(0, |(items, k)| items as u32 * k.per_8),
            phases: self.members.len() as u32,
            zero: [0; 4],
            grid: [[0; 4]; MAX_PHASES],
        };
        for (k, g) in self.grids.iter().enumerate() {
            params.grid[k] = [g[0], g[1], g[2], g[0] * g[1] * g[2]];
        }
        params
    }

    /// Trips it may take before its waits: its work and the chain's own loops.
    pub(super) fn fixed(&self) -> u64 {
        self.work + self.members.len() as u64 * TRIPS_PER_PHASE + 64
    }

    /// The most cached positions at which its optional first phase runs in it: what the
    /// budget leaves after the rest and the fewest waits, up to the kernel's own
    /// `max_kv`. `None` where it has no such phase.
    pub(super) fn kv_max(&self) -> Option<u32> {
        let (items, k) = self.kv?;
        let phases = self.members.len() as u64;
        let left = TRIP_BUDGET.saturating_sub(self.fixed() + phases * MIN_SPIN);
        let eighths = left / (items * u64::from(k.per_8)).max(1);
        Some(u32::try_from(eighths * 8).unwrap_or(u32::MAX).min(k.max_kv))
    }

    #[cfg(test)]
    /// Reads a wait may take at `n_kv` cached positions: what the budget leaves after
    /// its work there, shared among its phases (`chain_spin` in
    /// shaders/common/chain.wgsl computes the same each step).
    pub(super) fn spin(&self, n_kv: u32) -> u64 {
        let phases = self.members.len() as u64;
        let kv = match self.kv_max() {
            Some(m) if n_kv <= m => self.kv_work(n_kv),
            _ => 0,
        };
        let left = TRIP_BUDGET.saturating_sub(self.fixed() + kv);
        (left / phases.max(1)).min(MAX_SPIN)
    }
}

/// The pipeline a chain member runs, if it can join one: a chainable kernel that binds
/// every resource this keeps, the step first.
fn deferred(d: &Dispatch) -> Option<&Arc<Deferred>> {
    match (&d.pipeline, d.chainable) {
        (Pipe::Deferred(p), Some(_))
            if d.resources.len() == p.bindings().len()
                && p.bindings().first() == Some(&Binding::Uniform)
                && p.source().contains(STEP_DECL) =>
        {
            Some(p)
        }
        _ => None,
    }
}

/// The buffer a member binds as the step's values (its binding 0, [`STEP_DECL`]).
fn step_of(d: &Dispatch) -> Option<(&wgpu::Buffer, u64, Option<wgpu::BufferSize>)> {
    match d.resources.first() {
        Some(crate::ops::Held::Buffer {
            buffer,
            offset,
            size,
        }) => Some((buffer, *offset, *size)),
        _ => None,
    }
}

/// The runs of `plan` that single-token steps could run as chains, each of at most
/// `cap` members.
pub(super) fn runs(ctx: &GpuContext, plan: &[Dispatch], cap: usize) -> Vec<Run> {
    let step = probe_step();
    let mut out = Vec::new();
    let mut cur: Option<Run> = None;
    let close = |cur: &mut Option<Run>, out: &mut Vec<Run>| {
        if let Some(r) = cur.take().filter(|r| r.members.len() >= 2) {
            out.push(r);
        }
    };
    for (i, d) in plan.iter().enumerate() {
        let grid = d.grid(&step);
        // Idle in single-token steps (a batch's kernel): no break in a run.
        if grid.contains(&0) {
            continue;
        }
        let joins = deferred(d).zip(d.chainable).filter(|_| !d.copies_in(&step));
        let Some((pipe, c)) = joins else {
            close(&mut cur, &mut out);
            continue;
        };
        let items = u64::from(grid[0]) * u64::from(grid[1]) * u64::from(grid[2]);
        let work = items * (u64::from(c.trips) + TRIPS_PER_ITEM);
        // Binding 0, the step, is the chain's ([`STEP_DECL`]).
        let bindings = Bindings::of(&writable(&pipe.bindings()[1..]));
        // A kernel that walks the cached positions only leads a run; a run grows while
        // it fits the budget and the stage's bindings and its members share the step.
        let step_buf = step_of(d);
        let grown = cur
            .as_ref()
            .filter(|r| c.kv.is_none() && step_of(&plan[r.members[0]]) == step_buf)
            .map(|r| r.then(i, grid, work, bindings))
            .filter(|r| r.fits(ctx, cap));
        if grown.is_some() {
            cur = grown;
            continue;
        }
        close(&mut cur, &mut out);
        let lead = Run {
            range: i..i + 1,
            members: vec![i],
            grids: vec![grid],
            work,
            bindings: Bindings::CHAIN.add(bindings),
            kv: c.kv.map(|k| (items, k)),
        };
        cur = Some(lead).filter(|r| r.fits(ctx, cap));
    }
    close(&mut cur, &mut out);
    out
}

/// What tells two runs' pipelines apart: their members' kernels and constants.
pub(super) fn build_key(members: &[&Arc<Deferred>]) -> String {
    let key: Vec<String> = members
        .iter()
        .map(|d| format!("{}{:?}", d.label(), d.constants()))
        .collect();
    key.join("|")
}

/// The members of `run` that join a chain.
pub(super) fn run_members<'a>(plan: &'a [Dispatch], run: &Run) -> Vec<&'a Arc<Deferred>> {
    run.members
        .iter()
        .filter_map(|&m| deferred(&plan[m]))
        .collect()
}
