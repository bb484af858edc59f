//! A plan's chains made (their parameters, bindings and pipelines' builds), and the
//! questions a step asks of them.

use super::*;

impl Chains {
    /// The chains of `plan`, where the context runs chains and the plan has at least
    /// two runs to join (each chain zeroes the counters of the one before, the first
    /// those of the last).
    pub fn link(ctx: &GpuContext, plan: &[Dispatch]) -> Result<Option<Chains>> {
        if !ctx.chains() {
            return Ok(None);
        }
        let (runs, keys): (Vec<Run>, Vec<String>) = Shape::choose(ctx, plan).into_iter().unzip();
        if runs.len() < 2 {
            return Ok(None);
        }
        let (bases, counters) = counter_bases(&runs);
        let bytes = 4 * u64::from(counters.max(1));
        let counts = crate::gpu::upload::storage(ctx, "chain counters", bytes)?;
        let mut builds = Builds::default();
        let mut chains = Vec::with_capacity(runs.len());
        for (c, r) in runs.iter().enumerate() {
            let members = run_members(plan, r);
            let (build, layout) = builds.get(ctx, &keys[c], &members)?;
            let prev = (c + runs.len() - 1) % runs.len();
            let params = r.params(bases[c], bases[prev], &runs[prev]);
            let params = crate::gpu::upload::storage_init(
                ctx,
                "chain params",
                std::slice::from_ref(&params),
            );
            let own = [&counts, &params];
            let bind_group = bind(ctx, plan, r, &members, &layout, own)?;
            chains.push(Chain {
                range: r.range.clone(),
                members: r.members.clone(),
                grids: r.grids.clone(),
                kv_max: r.kv_max(),
                build,
                bind_group,
            });
        }
        Ok(Some(Chains {
            chains,
            n_builds: builds.list.len(),
            workgroups: crate::gpu::context::driver_threads(),
            builds: Arc::new(OnceLock::new()),
            pending: Mutex::new(Some((ctx.device.clone(), builds.list))),
            compiling: Mutex::new(None),
            steps: Default::default(),
        }))
    }

    /// Starts compiling the chains' pipelines on a thread of their own, if not yet
    /// started. Single-token steps start it: on lavapipe it takes about 0.5 s of a core
    /// for SmolLM2's pipeline or Gemma 3's two ([`Shape`], docs/perf.md), which a
    /// prompt's batch, run first, would share its cores with.
    pub(super) fn start(&self) -> Result<()> {
        let poisoned = || Error::gpu("chains: their compilation's state poisoned");
        let Some((device, builds)) = self.pending.lock().map_err(|_| poisoned())?.take() else {
            return Ok(());
        };
        let handle = compile_apart(device, builds, self.builds.clone())?;
        *self.compiling.lock().map_err(|_| poisoned())? = Some(handle);
        Ok(())
    }

    /// The chains' pipelines, once compiled; `None` while they are being compiled.
    pub(super) fn pipelines(&self) -> Result<Option<&[Arc<wgpu::ComputePipeline>]>> {
        match self.builds.get() {
            None => Ok(None),
            Some(Ok(p)) => Ok(Some(p)),
            Some(Err(e)) => Err(Error::gpu(format!("chains: {e}"))),
        }
    }

    /// The fewest and the most cached positions up to which a chain runs its optional
    /// first phase (attention, [`KvTrips`]); `None` where no chain has one.
    pub fn kv_limits(&self) -> Option<(u32, u32)> {
        let limits = self.chains.iter().filter_map(|c| c.kv_max);
        Some((limits.clone().min()?, limits.max()?))
    }

    /// Steps recorded with the chains so far (the others ran each member apart).
    pub fn steps(&self) -> usize {
        self.steps.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until the chains' pipelines are compiled (starting their compilation if no
    /// single token has), and says whether they were (their compilation's error if
    /// not). Steps before then run without chains.
    pub fn wait(&self) -> Result<()> {
        self.start()?;
        let handle = self
            .compiling
            .lock()
            .map_err(|_| Error::gpu("chains: compiling thread's handle poisoned"))?
            .take();
        if let Some(h) = handle {
            h.join()
                .map_err(|_| Error::gpu("chains: the compiling thread panicked"))?;
        }
        match self.pipelines()? {
            Some(_) => Ok(()),
            None => Err(Error::gpu(
                "chains: compiling thread ended without a result",
            )),
        }
    }

    /// The chains' distinct pipelines, each compiled once ([`Shape`]).
    pub fn builds(&self) -> usize {
        self.n_builds
    }

    /// Dispatches the chains spare a single-token step (their members less one each).
    pub fn saved(&self) -> usize {
        self.chains.iter().map(|c| c.members.len() - 1).sum()
    }

    /// Whether `step` runs the chains: every member with the grid its chain was built
    /// for, and nothing else in a chain's range; but where a chain's optional first
    /// phase is skipped ([`Chain::skips_lead`]), whatever its range holds before the
    /// second member, recorded apart.
    pub(super) fn run_in(&self, plan: &[Dispatch], step: &StepInfo) -> bool {
        step.n_tokens == 1
            && self.chains.iter().all(|c| {
                let apart = c.lead_apart(step);
                c.range.clone().all(|i| {
                    let d = &plan[i];
                    let member = c.members.iter().position(|&m| m == i);
                    let grid = d.grid(step);
                    apart.contains(&i)
                        || !d.copies_in(step)
                            && match member {
                                Some(k) => grid == c.grids[k],
                                None => grid.contains(&0),
                            }
                })
            })
    }
}

/// Where each run's counters start in the chains' counter buffer, two per member
/// (claims, then items done), one run after another; and how many there are in all.
fn counter_bases(runs: &[Run]) -> (Vec<u32>, u32) {
    let mut at = 0u32;
    let bases = runs
        .iter()
        .map(|r| {
            let base = at;
            at += 2 * r.members.len() as u32;
            base
        })
        .collect();
    (bases, at)
}

/// The chains' distinct pipelines' builds, by their members' key ([`build_key`]):
/// every layer's chain shares one.
#[derive(Default)]
struct Builds {
    by_key: HashMap<String, (usize, wgpu::BindGroupLayout)>,
    list: Vec<Build>,
}

impl Builds {
    /// The build of a chain of `members` whose key is `key` (made now if it is the
    /// first such chain), and its group's layout.
    fn get(
        &mut self,
        ctx: &GpuContext,
        key: &str,
        members: &[&Arc<Deferred>],
    ) -> Result<(usize, wgpu::BindGroupLayout)> {
        if let Some(made) = self.by_key.get(key) {
            return Ok(made.clone());
        }
        let b = build(ctx, members)?;
        let made = (self.list.len(), b.layout.clone());
        self.list.push(b);
        self.by_key.insert(key.to_string(), made.clone());
        Ok(made)
    }
}

/// Run `r`'s chain's bind group: each member's resources where the chain lays them out
/// ([`member_bases`]), the members' step once at 2, and the chain's counters and
/// parameters (`own`) at 0 and 1.
fn bind(
    ctx: &GpuContext,
    plan: &[Dispatch],
    r: &Run,
    members: &[&Arc<Deferred>],
    layout: &wgpu::BindGroupLayout,
    own: [&wgpu::Buffer; 2],
) -> Result<wgpu::BindGroup> {
    let mut entries = Vec::new();
    let member_at = member_bases(members);
    for (k, &m) in r.members.iter().enumerate() {
        for (b, h) in (0u32..).zip(&plan[m].resources).skip(1) {
            entries.push(wgpu::BindGroupEntry {
                binding: member_at[k] + b,
                resource: h.resource(),
            });
        }
    }
    // Every member binds the same step (`runs`): the first's, once.
    let step = plan[r.members[0]].resources.first();
    let step = step.ok_or_else(|| Error::gpu("chain: a member binds no step"))?;
    entries.push(wgpu::BindGroupEntry {
        binding: 2,
        resource: step.resource(),
    });
    for (binding, buffer) in (0u32..).zip(own) {
        entries.push(wgpu::BindGroupEntry {
            binding,
            resource: buffer.as_entire_binding(),
        });
    }
    ctx.scoped("binding a chain", || {
        ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("chain"),
            layout,
            entries: &entries,
        })
    })
}
