//! One long-lived GPU context: instance, adapter, device and queue, with the adapter's
//! real limits and the optional features (f16, subgroups, timestamps) we use when present.

use std::sync::Arc;

use super::upload::WeightMemory;
use crate::{Error, Result};

/// How to pick the adapter.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// `N` (index in `wgllm devices`) or a case-insensitive substring of the adapter name.
    pub device: Option<String>,
    /// Use SHADER_F16 / SUBGROUP only if the adapter has them *and* this allows it
    /// (tests turn them off to exercise the portable paths on any adapter).
    pub disable_f16: bool,
    pub disable_subgroups: bool,
    /// Restrict the requested limits to wgpu's defaults (simulates a small device).
    pub default_limits: bool,
    /// Treat storage bindings as at most this many bytes (splits tensors sooner; tests
    /// use it to exercise split weights with small tensors).
    pub max_binding: Option<u64>,
    /// Request at most this many storage buffers per shader stage (simulates a device
    /// with few, as GLES 3.1's minimum of 4).
    pub max_storage_buffers: Option<u32>,
    /// Hold every weight matrix here; `None`: as `WGLLM_WEIGHTS` says if set, else per
    /// type as the tuning file says ([`GpuContext::matrix_memory`]).
    pub weights: Option<WeightMemory>,
    /// Add up reductions through workgroup memory even where one subgroup could alone
    /// (`ops::mul_mat::mr_shape`; tests run both paths on one adapter).
    pub workgroup_reductions: bool,
    /// Single-token `mul_mat_ks1` products dot one row at a time on all of a
    /// subgroup's lanes, even where rows on fewer lanes each would keep more of them
    /// busy (`ops::mul_mat::ks1_shape`; tests run both paths on one adapter).
    pub one_row_at_a_time: bool,
    /// Single-token `mul_mat_ks1` products read a lane's run of chunks' small fields
    /// (scales, fifth bits; for the K-quants, what a lane's pairs share in a block)
    /// once per row (`Some(true)`), or each chunk's with a load of its own
    /// (`Some(false)`); `None`: on CPU-hosted drivers only ([`GpuContext::field_runs`];
    /// tests run both paths on one adapter).
    pub field_runs: Option<bool>,
    /// Single tokens of rows too long for one subgroup of `mul_mat_ks1` split each row
    /// over a workgroup's subgroups there (`Some(true)`), or run `mul_mat_ks`
    /// (`Some(false)`); `None`: on CPU-hosted drivers only ([`GpuContext::split_rows`];
    /// tests run both paths on one adapter).
    pub split_rows: Option<bool>,
    /// Batches of rows too long for one subgroup of `mul_mat_ks1` run its tile builds
    /// over slices of the columns, each slice adding into the output (`Some(true)`),
    /// or run `mul_mat_ks` (`Some(false)`); `None`: where [`DeviceOptions::split_rows`]
    /// holds ([`GpuContext::sliced_batches`]; tests run both paths on one adapter).
    pub sliced_batches: Option<bool>,
    /// Single tokens of rows too long for one subgroup of `mul_mat_ks1` walk each row
    /// in slices of the columns in one subgroup (`Some(true)`), or split it over a
    /// workgroup's subgroups (`Some(false)`); `None`: where [`DeviceOptions::split_rows`]
    /// holds ([`GpuContext::sliced_tokens`]; tests run both paths on one adapter).
    pub sliced_tokens: Option<bool>,
    /// Aim for about this many workgroups per single-token `mul_mat_ks1` product on
    /// CPU-hosted drivers, instead of one per driver thread (`ops::mul_mat::ks1_rows`;
    /// the bench compares counts in one process).
    pub ks1_groups: Option<u32>,
    /// The most rows one such workgroup takes, instead of `ops::mul_mat::KS1_MAX_ROWS`.
    pub ks1_max_rows: Option<u32>,
    /// Run this mul_mat variant (an `ops::mul_mat::Variant` name) for every weight
    /// type, whatever `WGLLM_MUL_MAT` and the tuning file say (tests run a GPU's
    /// kernels on any adapter).
    pub mul_mat: Option<String>,
    /// Choose top-k sampling's candidates on the device (`Some(true)`), or read every
    /// logit back and choose them on the host (`Some(false)`); `None`: as
    /// `WGLLM_TOP_K` says (`device` or `host`) if set, else as suits the device
    /// ([`GpuContext::top_k_on_device`]). Tests run the passes on lavapipe this way.
    pub top_k_on_device: Option<bool>,
    /// Run runs of single-token kernels as chains, one dispatch each (`ops::chain`):
    /// `Some(true)` or `Some(false)`; `None`: as `WGLLM_CHAINS` says (`on` or `off`)
    /// if set, else on lavapipe only ([`GpuContext::chains`]), and there not where
    /// `few_tokens` says the run is short.
    pub chains: Option<bool>,
    /// The caller will decode fewer than [`FEW_TOKENS`] single tokens (`wgllm run -n
    /// N`): too few to repay the chains' compilation, so they stay off unless `chains`
    /// or `WGLLM_CHAINS` turns them on.
    pub few_tokens: bool,
}

/// Single tokens below which chains do not repay their compilation, which runs beside
/// the first tokens. On lavapipe (`wgllm run -n N`, chains on and off alternated three
/// times, docs/perf.md, "Builds without their dead code") SmolLM2 reads 33.4-35.1 t/s
/// with chains against 28.3-36.2 without at N = 32 and 40.3-41.3 against 35.7-36.0 at
/// 64; Gemma 3 22.0-22.9 against 24.2-25.0 at 32 and 24.4-26.2 against 24.7-25.3 at
/// 64.
pub const FEW_TOKENS: usize = 64;

/// Environment variable holding every weight matrix in `buffer`s or `texture`s,
/// whatever the tuning file says.
pub const WEIGHTS_ENV: &str = "WGLLM_WEIGHTS";

/// Environment variable choosing where top-k sampling's candidates are chosen:
/// `device` or `host` ([`DeviceOptions::top_k_on_device`]).
pub const TOP_K_ENV: &str = "WGLLM_TOP_K";

/// Environment variable switching chains of single-token kernels `on` or `off`
/// ([`DeviceOptions::chains`]).
pub const CHAINS_ENV: &str = "WGLLM_CHAINS";

/// Whether decode steps run their runs of single-token kernels as chains (`ops::chain`),
/// as `opts` or `WGLLM_CHAINS` say, else on llvmpipe's Vulkan driver (lavapipe) only.
/// Chains are for CPU-hosted drivers, whose dispatches are handed to worker threads that
/// sleep between them (lavapipe: 9-41 us a dispatch against 2-5 us a phase of one,
/// `wgllm-bench sync`); there they decode SmolLM2 1.3x and Gemma 3 1.11x faster. Their
/// pipelines (one for SmolLM2, two for Gemma 3: `ops::chain::Shape`) compile beside the
/// first single tokens, about 0.5 s of a core each model, and raise peak memory by
/// 50-80 MiB (docs/perf.md, "Chains cut to need few pipelines"). Their
/// budgets (loop trips, workgroups per thread) are llvmpipe's, and their members read
/// the subgroup broadcast of a zero ([`crate::gpu::wgsl_link::index_uniforms`]). A GPU's
/// dispatch costs little, and its workgroups have no promise of running beside each
/// other.
fn chains_here(opts: &DeviceOptions, info: &wgpu::AdapterInfo, subgroups: bool) -> Result<bool> {
    let lavapipe = info.device_type == wgpu::DeviceType::Cpu
        && info.backend == wgpu::Backend::Vulkan
        && info.name.contains("llvmpipe")
        && subgroups;
    match opts.chains {
        Some(on) => Ok(on),
        None => Ok(env_switch(CHAINS_ENV, ["on", "off"])?.unwrap_or(lavapipe && !opts.few_tokens)),
    }
}

/// Whether sampled steps choose top-k's candidates on the device rather than read
/// every logit back (`ops::top_k`), as `opts` or `WGLLM_TOP_K` say, else not on
/// CPU-hosted devices: their readback is a copy within the host's memory, cheaper than
/// three small passes (Gemma 3 on lavapipe: 1.05 ms of passes a step, docs/perf.md).
fn top_k_on_device(opts: &DeviceOptions, info: &wgpu::AdapterInfo) -> Result<bool> {
    let from_env = || env_switch(TOP_K_ENV, ["device", "host"]);
    match opts.top_k_on_device {
        Some(on) => Ok(on),
        None => Ok(from_env()?.unwrap_or(info.device_type != wgpu::DeviceType::Cpu)),
    }
}

/// A two-way switch in environment variable `name`: `Some(true)` for its first word,
/// `Some(false)` for its second, `None` where it is not set.
pub(crate) fn env_switch(name: &str, words: [&str; 2]) -> Result<Option<bool>> {
    parse_switch(name, std::env::var(name).ok().as_deref(), words)
}

/// An `on|off` setting in the environment variable `name`, by default on for
/// CPU-hosted devices only (what runs on the host's own cores and memory).
pub(crate) fn cpu_hosted_switch(name: &str, device_type: wgpu::DeviceType) -> Result<bool> {
    let set = env_switch(name, ["on", "off"])?;
    Ok(set.unwrap_or(device_type == wgpu::DeviceType::Cpu))
}

/// [`env_switch`] given the variable's value, if set.
fn parse_switch(name: &str, value: Option<&str>, [on, off]: [&str; 2]) -> Result<Option<bool>> {
    match value {
        None => Ok(None),
        Some(v) if v == on => Ok(Some(true)),
        Some(v) if v == off => Ok(Some(false)),
        Some(v) => Err(Error::invalid(format!(
            "{name}={v:?}: expected {on} or {off}"
        ))),
    }
}

/// [`GpuContext::fixed_subgroup`] from the device's subgroup sizes.
fn fixed_size(has_subgroups: bool, min: u32, max: u32) -> Option<u32> {
    (has_subgroups && min == max && min >= 4).then_some(min)
}

/// Read-only storage textures a kernel binds with its weights in a texture (the same
/// texture at both weight bindings: `ops::mul_mat::weight_layout`).
const WEIGHT_STORAGE_TEXTURES: u32 = 2;

/// Why weight textures (rows of `gpu::upload::TEX_W` texels, bound as read-only storage
/// textures) do not fit the device, if they do not.
fn textures_unfit(limits: &wgpu::Limits) -> Option<String> {
    if limits.max_texture_dimension_2d < super::upload::TEX_W {
        return Some(format!(
            "textures only {} texels wide, {} needed",
            limits.max_texture_dimension_2d,
            super::upload::TEX_W
        ));
    }
    if limits.max_storage_textures_per_shader_stage < WEIGHT_STORAGE_TEXTURES {
        return Some(format!(
            "{} storage textures per shader stage, {WEIGHT_STORAGE_TEXTURES} needed",
            limits.max_storage_textures_per_shader_stage
        ));
    }
    None
}

/// Whether weight textures fit the device ([`textures_unfit`]).
fn textures_fit(limits: &wgpu::Limits) -> bool {
    textures_unfit(limits).is_none()
}

/// The memory `opts` or `WGLLM_WEIGHTS` forces for every matrix, if any.
fn forced_weights(
    opts: &DeviceOptions,
    info: &wgpu::AdapterInfo,
    limits: &wgpu::Limits,
) -> Result<Option<WeightMemory>> {
    let forced = match (opts.weights, std::env::var(WEIGHTS_ENV)) {
        (Some(m), _) => m,
        (None, Err(_)) => return Ok(None),
        (None, Ok(v)) => WeightMemory::parse(&v).ok_or_else(|| {
            Error::invalid(format!("{WEIGHTS_ENV}={v:?}: expected buffer or texture"))
        })?,
    };
    if forced == WeightMemory::Texture {
        if let Some(why) = textures_unfit(limits) {
            return Err(Error::Unsupported(format!(
                "weights in textures: {} allows {why}",
                info.name
            )));
        }
    }
    Ok(Some(forced))
}

/// Storage buffers a mul_mat kernel binds with the outputs of fused products (weights
/// twice, activations, three outputs); devices with fewer run the products apart.
pub(crate) const FUSED_STORAGE_BUFFERS: u32 = 6;

/// What `wgllm devices` prints for one adapter.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub index: usize,
    pub info: wgpu::AdapterInfo,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
}

pub struct GpuContext {
    pub adapter: wgpu::Adapter,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    /// `enable f16;` is allowed in shaders.
    pub has_f16: bool,
    /// Subgroup builtins and operations are allowed in shaders.
    pub has_subgroups: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub has_timestamps: bool,
    /// [`DeviceOptions::workgroup_reductions`].
    pub workgroup_reductions: bool,
    /// [`DeviceOptions::one_row_at_a_time`].
    pub one_row_at_a_time: bool,
    /// Whether single-token `mul_mat_ks1` products read a lane's run of small fields
    /// once per row, and the K-quants what a lane's pairs share in a block
    /// ([`DeviceOptions::field_runs`]). By default on CPU-hosted drivers, where every
    /// field read fetches a whole texel for every lane (on lavapipe, field runs decode
    /// Gemma 3 1.07-1.09x faster, the K-quants' blocks a synthetic 8B model 1.04-1.09x,
    /// docs/perf.md); a GPU's cached loads of 4 bytes are cheap, and there the selects
    /// that pick a run's fields were not measured.
    pub field_runs: bool,
    /// Whether single tokens of rows past a subgroup's `mul_mat_ks1` slots split each
    /// row over a workgroup's subgroups there ([`DeviceOptions::split_rows`],
    /// `ops::mul_mat::ks1_split`). By default on CPU-hosted drivers, where `mul_mat_ks`
    /// read such rows (8B shapes) at about half the rate (docs/perf.md); not measured on
    /// a GPU.
    pub split_rows: bool,
    /// Whether batches of rows past a subgroup's `mul_mat_ks1` slots run its tile builds
    /// over slices of the columns ([`DeviceOptions::sliced_batches`],
    /// `ops::mul_mat::ks1_slices`). By default where single tokens split such rows
    /// ([`GpuContext::split_rows`]), whose builds run the tokens the tiles leave.
    pub sliced_batches: bool,
    /// Whether single tokens of rows past a subgroup's `mul_mat_ks1` slots, where
    /// [`GpuContext::split_rows`] runs them there, walk each row in slices in one
    /// subgroup rather than split it over several ([`DeviceOptions::sliced_tokens`],
    /// `ops::mul_mat::ks1_token_slices`). By default where rows split.
    pub sliced_tokens: bool,
    /// [`DeviceOptions::ks1_groups`].
    pub ks1_groups: Option<u32>,
    /// [`DeviceOptions::ks1_max_rows`].
    pub ks1_max_rows: Option<u32>,
    /// [`DeviceOptions::mul_mat`].
    pub forced_mul_mat: Option<String>,
    /// Where top-k sampling's candidates are chosen ([`DeviceOptions::top_k_on_device`]).
    top_k_here: bool,
    /// Whether decode steps run chains ([`GpuContext::chains`]).
    chains_here: bool,
    /// Whether the driver's worker threads are pinned, one per core
    /// ([`super::pin`]).
    pins_threads: bool,
    /// Whether device memory is the host's, to be backed by huge pages
    /// ([`GpuContext::advise_huge_pages`]).
    huge_pages: bool,
    /// Kernel variants measured fastest on this adapter (`wgllm-bench kernels --save`).
    pub tuned: super::tuning::Choices,
    pub pipelines: super::pipelines::PipelineCache,
    /// A small storage buffer bound where a kernel's layout has an output that a
    /// dispatch does not write (the second and third outputs of an unfused mul_mat).
    pub unused_output: wgpu::Buffer,
    /// Where every weight matrix is held, when set ([`DeviceOptions::weights`]).
    forced_weights: Option<WeightMemory>,
    binding_cap: Option<u64>,
    lost: Arc<std::sync::atomic::AtomicBool>,
    /// The staging buffers every weight is uploaded through ([`super::staging`]).
    pub(crate) staging: std::sync::Mutex<super::staging::StagingRing>,
}

/// The adapters of the backends `WGPU_BACKEND` names (e.g. `vulkan`, `gl`), else of
/// `default` (those compiled in among them), real GPUs first, then integrated, virtual,
/// CPU (software) and others.
fn ranked_adapters(default: wgpu::Backends) -> Vec<wgpu::Adapter> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    if std::env::var_os("WGPU_BACKEND").is_none() {
        desc.backends = default;
    }
    let instance = wgpu::Instance::new(desc);
    let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    adapters.sort_by_key(|a| device_rank(a.get_info().device_type));
    adapters
}

/// Every adapter, in the order `wgllm devices` lists them: those of the primary
/// backends (Vulkan, Metal, DX12) in [`ranked_adapters`]' order, then those of the
/// secondary ones (GL), ranked the same way. With `WGPU_BACKEND` set, the adapters of
/// the backends it names, ranked.
pub fn enumerate() -> Vec<wgpu::Adapter> {
    let mut all = adapter_group(Group::Primary);
    all.extend(adapter_group(Group::Secondary));
    all
}

/// The two groups [`enumerate`] lists.
#[derive(Clone, Copy, PartialEq)]
enum Group {
    Primary,
    Secondary,
}

fn adapter_group(g: Group) -> Vec<wgpu::Adapter> {
    if std::env::var_os("WGPU_BACKEND").is_some() {
        return match g {
            Group::Primary => ranked_adapters(wgpu::Backends::all()),
            Group::Secondary => Vec::new(),
        };
    }
    ranked_adapters(match g {
        Group::Primary => wgpu::Backends::PRIMARY,
        Group::Secondary => wgpu::Backends::SECONDARY,
    })
}

/// Worker threads of llvmpipe: `LP_NUM_THREADS` if set (0 runs every workgroup on the
/// submitting thread), else one per core.
pub fn driver_threads() -> u32 {
    std::env::var("LP_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or_else(host_cores)
        .max(1)
}

/// The host's cores: the threads a CPU-hosted driver (lavapipe) runs workgroups on, one
/// per core unless told otherwise (`LP_NUM_THREADS`).
pub fn host_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as u32
}

/// The best hardware GPU (anything but a software, CPU-type adapter) of the primary
/// backends (Vulkan, Metal, DX12), or of those `WGPU_BACKEND` names, if there is one.
/// Leaves out the GL backend unless named: starting it (EGL and a GL driver) costs
/// 20-30 ms and about 15 MiB on lavapipe machines.
pub fn hardware_adapter() -> Option<wgpu::Adapter> {
    // Asking the Vulkan loader loads every installed driver, about 50 MiB that stay
    // mapped; where the kernel shows no GPU at all, none of them can find one.
    if std::env::var_os("WGPU_BACKEND").is_none() && !gpu_device_nodes() {
        return None;
    }
    ranked_adapters(wgpu::Backends::PRIMARY)
        .into_iter()
        .find(|a| a.get_info().device_type != wgpu::DeviceType::Cpu)
}

/// Whether the kernel exposes a GPU: a DRM node (every Mesa driver, virtio-gpu), an
/// NVIDIA device or WSL's D3D12 bridge. Linux only; elsewhere assumed.
fn gpu_device_nodes() -> bool {
    if !cfg!(target_os = "linux") {
        return true;
    }
    let dev = std::path::Path::new("/dev");
    has_entry(&dev.join("dri"), &["renderD", "card"]) || has_entry(dev, &["nvidia", "dxg"])
}

/// Whether `dir` holds an entry whose name starts with one of `prefixes`.
fn has_entry(dir: &std::path::Path, prefixes: &[&str]) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            prefixes.iter().any(|p| name.starts_with(p))
        })
    })
}

fn device_rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

pub fn list_adapters() -> Vec<AdapterSummary> {
    enumerate()
        .into_iter()
        .enumerate()
        .map(|(index, a)| AdapterSummary {
            index,
            info: a.get_info(),
            features: a.features(),
            limits: a.limits(),
        })
        .collect()
}

const NO_ADAPTER_HELP: &str = "no GPU adapter found. Install a Vulkan driver (on Debian/Ubuntu: \
     apt-get install mesa-vulkan-drivers libvulkan1 for the CPU-based lavapipe), or run on the CPU \
     with --gpu-layers 0";

/// The error for an empty adapter list: where `WGPU_BACKEND` narrowed the search, that
/// is the likelier cause (a misspelt name selects no backend at all), so it says so.
fn no_adapter() -> Error {
    match std::env::var("WGPU_BACKEND") {
        Ok(v) => Error::gpu(format!(
            "{NO_ADAPTER_HELP}. WGPU_BACKEND={v:?} narrows the search to the backends it names \
             (a comma-separated list of vulkan, metal, dx12, gl): unset it to search them all"
        )),
        Err(_) => Error::gpu(NO_ADAPTER_HELP),
    }
}

/// The adapter `opts` names (an index into [`enumerate`]'s list, or part of a name: the
/// first that matches), else the best ranked of all. The secondary backends (GL: EGL
/// and a GL driver, about 10 MiB and tens of milliseconds to start on lavapipe
/// machines) start only when the primary ones' adapters do not settle the choice.
pub fn pick_adapter(opts: &DeviceOptions) -> Result<wgpu::Adapter> {
    let want = opts.device.as_deref();
    let mut adapters = adapter_group(Group::Primary);
    if !settles(&adapters, want) {
        adapters.extend(adapter_group(Group::Secondary));
    }
    if adapters.is_empty() {
        return Err(no_adapter());
    }
    let Some(want) = want else {
        // The best rank; of equals, the first (a primary backend's).
        return adapters
            .into_iter()
            .min_by_key(|a| device_rank(a.get_info().device_type))
            .ok_or_else(no_adapter);
    };
    let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
    if let Ok(i) = want.parse::<usize>() {
        let n = adapters.len();
        return adapters.into_iter().nth(i).ok_or_else(|| {
            Error::gpu(format!(
                "--device {i}: only {n} adapter(s): {}",
                names.join(", ")
            ))
        });
    }
    adapters
        .into_iter()
        .find(|a| name_matches(a, want))
        .ok_or_else(|| {
            Error::gpu(format!(
                "--device {want:?} matches no adapter; available: {}",
                names.join(", ")
            ))
        })
}

/// Whether the primary backends' `adapters` decide [`pick_adapter`]'s choice for
/// `want` whatever the secondary backends hold: a discrete GPU where none is named (a
/// secondary backend's would tie at best), an index within them, or a name one of them
/// has.
fn settles(adapters: &[wgpu::Adapter], want: Option<&str>) -> bool {
    match want {
        None => adapters
            .first()
            .is_some_and(|a| device_rank(a.get_info().device_type) == 0),
        Some(w) => match w.parse::<usize>() {
            Ok(i) => i < adapters.len(),
            Err(_) => adapters.iter().any(|a| name_matches(a, w)),
        },
    }
}

/// Whether `want` is part of the adapter's name, ignoring case.
fn name_matches(a: &wgpu::Adapter, want: &str) -> bool {
    a.get_info()
        .name
        .to_lowercase()
        .contains(&want.to_lowercase())
}

impl GpuContext {
    pub fn new(opts: &DeviceOptions) -> Result<GpuContext> {
        let adapter = pick_adapter(opts)?;
        Self::from_adapter(adapter, opts)
    }

    pub fn from_adapter(adapter: wgpu::Adapter, opts: &DeviceOptions) -> Result<GpuContext> {
        let info = adapter.get_info();
        let available = adapter.features();
        let mut features = wgpu::Features::empty();
        let has_f16 = !opts.disable_f16 && available.contains(wgpu::Features::SHADER_F16);
        let has_subgroups = !opts.disable_subgroups && available.contains(wgpu::Features::SUBGROUP);
        let has_timestamps = available.contains(wgpu::Features::TIMESTAMP_QUERY);
        if has_f16 {
            features |= wgpu::Features::SHADER_F16;
        }
        if has_subgroups {
            features |= wgpu::Features::SUBGROUP;
        }
        if has_timestamps {
            features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        // The adapter's real limits: wgpu's defaults cap storage bindings at 128 MiB and
        // buffers at 256 MiB, far below what real GPUs allow.
        let mut limits = if opts.default_limits {
            wgpu::Limits::default().using_resolution(adapter.limits())
        } else {
            adapter.limits()
        };
        if let Some(n) = opts.max_storage_buffers {
            let l = &mut limits.max_storage_buffers_per_shader_stage;
            *l = (*l).min(n);
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("wgllm"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&desc))
            .map_err(|e| Error::gpu(format!("cannot open device {}: {e}", info.name)))?;
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            if reason != wgpu::DeviceLostReason::Destroyed {
                eprintln!("error: GPU device lost ({reason:?}): {msg}");
            }
        });
        // Errors are captured with error scopes where they can happen; anything else is
        // reported rather than aborting the process.
        let flag = lost.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            // On a lost device every call fails; the loss itself is reported once, by
            // the operation that finds it (see `check_lost`).
            if !flag.load(std::sync::atomic::Ordering::SeqCst) {
                eprintln!("error: GPU: {e}");
            }
        }));
        let tuned = super::tuning::choices_for(&info);
        let unused_output = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("unused output"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let forced_weights = forced_weights(opts, &info, &limits)?;
        let top_k_here = top_k_on_device(opts, &info)?;
        let chains_here = chains_here(opts, &info, has_subgroups)?;
        let huge_pages = super::huge_pages::wanted(info.device_type)?;
        let pins_threads = super::pin::wanted(info.device_type)?;
        let field_runs = opts
            .field_runs
            .unwrap_or(info.device_type == wgpu::DeviceType::Cpu);
        let split_rows = opts
            .split_rows
            .unwrap_or(info.device_type == wgpu::DeviceType::Cpu);
        let sliced_batches = opts.sliced_batches.unwrap_or(split_rows);
        let sliced_tokens = opts.sliced_tokens.unwrap_or(split_rows);
        Ok(GpuContext {
            unused_output,
            forced_weights,
            huge_pages,
            pins_threads,
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            adapter,
            device,
            queue,
            info,
            limits,
            has_f16,
            has_subgroups,
            has_timestamps,
            workgroup_reductions: opts.workgroup_reductions,
            one_row_at_a_time: opts.one_row_at_a_time,
            field_runs,
            split_rows,
            sliced_batches,
            sliced_tokens,
            ks1_groups: opts.ks1_groups,
            ks1_max_rows: opts.ks1_max_rows,
            forced_mul_mat: opts.mul_mat.clone(),
            top_k_here,
            chains_here,
            tuned,
            pipelines: Default::default(),
            binding_cap: opts.max_binding,
            lost,
            staging: Default::default(),
        })
    }

    /// Whether mul_mat kernels bind the second and third outputs of fused products
    /// (`shaders/common/mul_mat_store.wgsl`).
    pub fn fused_outputs(&self) -> bool {
        self.limits.max_storage_buffers_per_shader_stage >= FUSED_STORAGE_BUFFERS
    }

    /// The subgroup size, where the device has subgroups of one fixed size (at least 4
    /// lanes): kernels whose workgroup is exactly one subgroup need it fixed.
    pub fn fixed_subgroup(&self) -> Option<u32> {
        fixed_size(
            self.has_subgroups,
            self.subgroup_min_size,
            self.subgroup_max_size,
        )
    }

    /// Where matrices of type `ty` are held: as forced ([`DeviceOptions::weights`],
    /// `WGLLM_WEIGHTS`), else as the tuning file measured fastest for the type on this
    /// adapter, else as [`Self::default_memory`] says.
    pub fn matrix_memory(&self, ty: crate::quant::GgmlType) -> WeightMemory {
        if let Some(m) = self.forced_weights {
            return m;
        }
        self.tuned
            .weights
            .get(ty.name())
            .and_then(|m| WeightMemory::parse(m))
            .filter(|&m| m == WeightMemory::Buffer || textures_fit(&self.limits))
            .unwrap_or_else(|| self.default_memory())
    }

    /// Where matrices go without a tuning file: textures on CPU-hosted Vulkan drivers
    /// (lavapipe), storage buffers elsewhere. llvmpipe gathers texels with SIMD loads but
    /// runs a storage load as a loop over the lanes; measured on lavapipe with the
    /// memories alternated (docs/perf.md, "Weights in textures"), decode ran 1.05-1.2x
    /// (SmolLM2) and 1.5x (Gemma 3) faster from textures, prompts at the same speed.
    pub fn default_memory(&self) -> WeightMemory {
        let cpu_vulkan = self.info.device_type == wgpu::DeviceType::Cpu
            && self.info.backend == wgpu::Backend::Vulkan;
        if cpu_vulkan && textures_fit(&self.limits) {
            WeightMemory::Texture
        } else {
            WeightMemory::Buffer
        }
    }

    /// Whether batches' attention reads Q and K from textures (`ops::attention::
    /// AttnTextures`): where matrices live in textures unless a tuning file says
    /// otherwise per type, that is where forced or by default.
    pub fn attention_in_textures(&self) -> bool {
        self.forced_weights.unwrap_or_else(|| self.default_memory()) == WeightMemory::Texture
    }

    /// Whether sampled steps choose top-k's candidates here rather than read every
    /// logit back (`ops::top_k`; [`DeviceOptions::top_k_on_device`]).
    pub fn top_k_on_device(&self) -> bool {
        self.top_k_here
    }

    /// Whether a model's decode steps run their runs of single-token products as chains,
    /// one dispatch each (`ops::chain`).
    pub fn chains(&self) -> bool {
        self.chains_here
    }

    /// On a CPU-hosted device, ask the host's kernel to back the device memory
    /// allocated so far with huge pages where it is not yet touched
    /// ([`super::huge_pages`]): call it after creating resources and before filling
    /// them. Does nothing on other devices or with `WGLLM_HUGE_PAGES=off`.
    pub fn advise_huge_pages(&self) {
        if self.huge_pages {
            super::huge_pages::advise();
        }
    }

    /// Whether models on this device pin the driver's worker threads, one per core
    /// ([`super::pin`]; `WGLLM_PIN_THREADS`).
    pub fn pins_threads(&self) -> bool {
        self.pins_threads
    }

    /// After [`Self::advise_huge_pages`]'s fills: memory touched from now on gets small
    /// pages again ([`super::huge_pages::end`]).
    pub fn end_huge_pages(&self) {
        if self.huge_pages {
            super::huge_pages::end();
        }
    }

    /// Largest range one storage binding may cover, in bytes.
    pub fn max_binding(&self) -> u64 {
        let device = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        // Bindings must start at offsets aligned to this; keep part sizes multiples of it.
        let cap = self.binding_cap.unwrap_or(u64::MAX).max(256);
        device.min(cap)
    }

    /// Frees the staging buffers weights are uploaded through, once a model's weights
    /// are all uploaded; the next upload creates them again.
    pub fn release_staging(&self) {
        let mut ring = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        *ring = Default::default();
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The error for work asked of a lost device: what happened and what to do.
    pub fn lost_error() -> Error {
        Error::gpu(
            "the GPU device was lost (driver reset, GPU removed or hung); \
             restart wgllm, or run on the CPU with --gpu-layers 0",
        )
    }

    /// `Err(lost_error())` once the device is lost. wgpu reports a loss (including a
    /// `destroy()`) through the lost callback only while it polls, so poll first.
    pub fn check_lost(&self) -> Result<()> {
        // A failed poll on a lost device is what this checks for; its error adds nothing.
        let _ = self.device.poll(wgpu::PollType::Poll);
        if self.is_lost() {
            return Err(Self::lost_error());
        }
        Ok(())
    }

    /// `r`, unless it failed because the device is gone: then the loss is the error the
    /// user should see, not its symptom (a failed map or submit).
    pub fn explain_loss<T>(&self, r: Result<T>) -> Result<T> {
        match r {
            Err(e) => match self.check_lost() {
                Err(lost) => Err(lost),
                Ok(()) => Err(e),
            },
            ok => ok,
        }
    }

    /// A one-line description: name, backend, type, driver.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?}, {} {}){}{}",
            self.info.name,
            self.info.backend,
            self.info.device_type,
            self.info.driver,
            self.info.driver_info,
            if self.has_f16 { " f16" } else { "" },
            if self.has_subgroups { " subgroups" } else { "" },
        )
    }

    /// Run `f` inside validation and out-of-memory error scopes and turn what they catch
    /// into an error naming `what`.
    pub fn scoped<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let v = pollster::block_on(val.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o {
            return Err(Error::gpu(format!(
                "{what}: out of GPU memory ({e}); use --gpu-layers to keep some layers on the CPU"
            )));
        }
        if let Some(e) = v {
            return Err(Error::gpu(format!("{what}: {e}")));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{has_entry, parse_switch};

    #[test]
    fn a_switch_reads_its_two_words_only() {
        let words = ["on", "off"];
        assert_eq!(parse_switch("X", None, words).unwrap(), None);
        assert_eq!(parse_switch("X", Some("on"), words).unwrap(), Some(true));
        assert_eq!(parse_switch("X", Some("off"), words).unwrap(), Some(false));
        let e = parse_switch("WGLLM_TOP_K", Some("gpu"), ["device", "host"]).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("WGLLM_TOP_K=\"gpu\": expected device or host"),
            "{e}"
        );
    }

    #[test]
    fn device_nodes_are_found_by_prefix() {
        let dir = std::env::temp_dir().join(format!("wgllm-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(!has_entry(&dir, &["renderD", "card"]));
        std::fs::write(dir.join("version"), b"").unwrap();
        assert!(!has_entry(&dir, &["renderD", "card"]));
        std::fs::write(dir.join("renderD128"), b"").unwrap();
        assert!(has_entry(&dir, &["renderD", "card"]));
        assert!(!has_entry(&dir.join("absent"), &["renderD"]));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
