//! The interactive window: winit events, one wgpu surface, and egui drawn with the same
//! device the model runs on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use winit::application::ApplicationHandler;
use winit::event::WindowEvent;
use winit::event_loop::{ActiveEventLoop, ControlFlow, EventLoop, EventLoopProxy};
use winit::window::{Window, WindowId};

use wgllm::gpu::{DeviceOptions, GpuContext};
use wgllm::{Error, Result};

use crate::app::{App, LoadSettings};
use crate::gen;
use crate::screenshot::paint;

/// What the window needs from the command line.
pub struct WindowOptions {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub device: Option<String>,
    pub load: LoadSettings,
    pub params: wgllm::sampling::SamplingParams,
    pub max_new: usize,
}

/// Sent by the worker thread to wake the event loop.
#[derive(Debug, Clone, Copy)]
struct Wake;

struct Gfx {
    window: Arc<Window>,
    surface: wgpu::Surface<'static>,
    config: wgpu::SurfaceConfiguration,
    ctx: Arc<GpuContext>,
    renderer: egui_wgpu::Renderer,
    egui_ctx: egui::Context,
    egui_state: egui_winit::State,
}

struct Handler {
    opts: WindowOptions,
    proxy: EventLoopProxy<Wake>,
    gfx: Option<Gfx>,
    app: Option<App>,
    worker: Option<std::thread::JoinHandle<()>>,
    error: Option<Error>,
}

/// Open the window and run until it is closed.
pub fn run(opts: WindowOptions) -> Result<()> {
    let event_loop = EventLoop::<Wake>::with_user_event()
        .build()
        .map_err(|e| Error::invalid(format!("cannot open a window: {e}")))?;
    let mut h = Handler {
        proxy: event_loop.create_proxy(),
        opts,
        gfx: None,
        app: None,
        worker: None,
        error: None,
    };
    event_loop
        .run_app(&mut h)
        .map_err(|e| Error::invalid(format!("window event loop: {e}")))?;
    // Drop the UI (its channel) first so that the worker sees the end, then give a running
    // step a moment to finish; the process exit ends it otherwise.
    h.app = None;
    if let Some(w) = h.worker.take() {
        let t0 = Instant::now();
        while !w.is_finished() && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    match h.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// An adapter from `instance` that can present to `surface`, chosen like the CLI's
/// `--device` (index or part of the name), real GPUs first.
fn pick_adapter(
    instance: &wgpu::Instance,
    surface: &wgpu::Surface<'_>,
    want: Option<&str>,
) -> Result<wgpu::Adapter> {
    let mut all = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    all.sort_by_key(|a| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    });
    let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
    let usable: Vec<wgpu::Adapter> = all
        .into_iter()
        .filter(|a| a.is_surface_supported(surface))
        .collect();
    let found = match want {
        None => usable.into_iter().next(),
        Some(w) => match w.parse::<usize>() {
            Ok(i) => usable.into_iter().nth(i),
            Err(_) => {
                let w = w.to_lowercase();
                usable
                    .into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&w))
            }
        },
    };
    found.ok_or_else(|| {
        Error::gpu(format!(
            "no adapter{} can draw to this window (adapters: {})",
            want.map(|w| format!(" matching {w:?}")).unwrap_or_default(),
            names.join(", ")
        ))
    })
}

impl Handler {
    fn init(&mut self, el: &ActiveEventLoop) -> Result<()> {
        let attrs = Window::default_attributes()
            .with_title("wgllm-viz")
            .with_inner_size(winit::dpi::LogicalSize::new(1280.0, 820.0));
        let window = Arc::new(
            el.create_window(attrs)
                .map_err(|e| Error::invalid(format!("cannot open a window: {e}")))?,
        );
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_with_display_handle_from_env(
                Box::new(el.owned_display_handle()),
            ));
        let surface = instance
            .create_surface(window.clone())
            .map_err(|e| Error::gpu(format!("cannot draw to the window: {e}")))?;
        let adapter = pick_adapter(&instance, &surface, self.opts.device.as_deref())?;
        // The model's context is made from this adapter, so UI and model share one device.
        let ctx = Arc::new(GpuContext::from_adapter(
            adapter,
            &DeviceOptions::default(),
        )?);
        let size = window.inner_size();
        let caps = surface.get_capabilities(&ctx.adapter);
        let format = caps
            .formats
            .iter()
            .copied()
            .find(|f| !f.is_srgb())
            .or_else(|| caps.formats.first().copied())
            .ok_or_else(|| Error::gpu("the window surface offers no format"))?;
        let config = wgpu::SurfaceConfiguration {
            usage: wgpu::TextureUsages::RENDER_ATTACHMENT,
            format,
            width: size.width.max(1),
            height: size.height.max(1),
            present_mode: wgpu::PresentMode::AutoVsync,
            desired_maximum_frame_latency: 2,
            alpha_mode: caps
                .alpha_modes
                .first()
                .copied()
                .unwrap_or(wgpu::CompositeAlphaMode::Auto),
            view_formats: vec![],
            color_space: wgpu::SurfaceColorSpace::Auto,
        };
        surface.configure(&ctx.device, &config);
        let renderer =
            egui_wgpu::Renderer::new(&ctx.device, format, egui_wgpu::RendererOptions::default());
        let egui_ctx = egui::Context::default();
        let egui_state = egui_winit::State::new(
            egui_ctx.clone(),
            egui::ViewportId::ROOT,
            &window,
            Some(window.scale_factor() as f32),
            None,
            Some(ctx.limits.max_texture_dimension_2d as usize),
        );
        let proxy = self.proxy.clone();
        let (tx, rx, handle) = gen::spawn(Box::new(move || {
            let _ = proxy.send_event(Wake);
        }))?;
        let mut app = App::new(tx, rx, Some(ctx.clone()), self.opts.load.clone());
        app.params = self.opts.params.clone();
        app.max_new = self.opts.max_new;
        if let Some(p) = &self.opts.prompt {
            app.prompt = p.clone();
        }
        if let Some(m) = &self.opts.model {
            app.model_path = m.clone();
            app.request_load();
        }
        self.worker = Some(handle);
        self.app = Some(app);
        self.gfx = Some(Gfx {
            window,
            surface,
            config,
            ctx,
            renderer,
            egui_ctx,
            egui_state,
        });
        Ok(())
    }

    fn resize(&mut self, w: u32, h: u32) {
        let Some(g) = &mut self.gfx else { return };
        // A minimised window reports 0×0; a surface cannot have that size.
        if w == 0 || h == 0 {
            return;
        }
        g.config.width = w.min(g.ctx.limits.max_texture_dimension_2d);
        g.config.height = h.min(g.ctx.limits.max_texture_dimension_2d);
        g.surface.configure(&g.ctx.device, &g.config);
        g.window.request_redraw();
    }

    fn redraw(&mut self, el: &ActiveEventLoop) {
        let (Some(g), Some(app)) = (&mut self.gfx, &mut self.app) else {
            return;
        };
        let input = g.egui_state.take_egui_input(&g.window);
        let mut out = g.egui_ctx.run_ui(input, |ui| app.ui(ui));
        let platform = std::mem::take(&mut out.platform_output);
        g.egui_state.handle_platform_output(&g.window, platform);
        let delay = out
            .viewport_output
            .get(&egui::ViewportId::ROOT)
            .map(|v| v.repaint_delay)
            .unwrap_or(Duration::MAX);
        let frame = match g.surface.get_current_texture() {
            wgpu::CurrentSurfaceTexture::Success(t)
            | wgpu::CurrentSurfaceTexture::Suboptimal(t) => t,
            wgpu::CurrentSurfaceTexture::Outdated | wgpu::CurrentSurfaceTexture::Lost => {
                g.surface.configure(&g.ctx.device, &g.config);
                g.window.request_redraw();
                return;
            }
            _ => {
                g.window.request_redraw();
                return;
            }
        };
        let view = frame
            .texture
            .create_view(&wgpu::TextureViewDescriptor::default());
        let size = [g.config.width, g.config.height];
        paint(
            &g.ctx.device,
            &g.ctx.queue,
            &mut g.renderer,
            &g.egui_ctx,
            out,
            &view,
            size,
        );
        g.window.pre_present_notify();
        g.ctx.queue.present(frame);
        if delay.is_zero() {
            g.window.request_redraw();
        } else if let Some(at) = Instant::now().checked_add(delay) {
            el.set_control_flow(ControlFlow::WaitUntil(at));
        } else {
            el.set_control_flow(ControlFlow::Wait);
        }
    }
}

impl ApplicationHandler<Wake> for Handler {
    fn resumed(&mut self, el: &ActiveEventLoop) {
        if self.gfx.is_some() {
            return;
        }
        if let Err(e) = self.init(el) {
            self.error = Some(e);
            el.exit();
        }
    }

    fn user_event(&mut self, _el: &ActiveEventLoop, _e: Wake) {
        if let Some(g) = &self.gfx {
            g.window.request_redraw();
        }
    }

    fn window_event(&mut self, el: &ActiveEventLoop, _id: WindowId, event: WindowEvent) {
        if let Some(g) = &mut self.gfx {
            let r = g.egui_state.on_window_event(&g.window, &event);
            if r.repaint {
                g.window.request_redraw();
            }
        }
        match event {
            WindowEvent::CloseRequested => {
                if let Some(app) = &mut self.app {
                    app.quit();
                }
                el.exit();
            }
            WindowEvent::Resized(s) => self.resize(s.width, s.height),
            WindowEvent::RedrawRequested => self.redraw(el),
            _ => {}
        }
    }

    fn new_events(&mut self, _el: &ActiveEventLoop, cause: winit::event::StartCause) {
        // A repaint egui asked for after a delay (animations, tooltips).
        if let winit::event::StartCause::ResumeTimeReached { .. } = cause {
            if let Some(g) = &self.gfx {
                g.window.request_redraw();
            }
        }
    }
}
