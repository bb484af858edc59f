//! The visualizer's state and its one UI function, shared by the window and the
//! screenshot path.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use egui::{RichText, Ui};
use wgllm::gpu::GpuContext;
use wgllm::sampling::SamplingParams;

use crate::attention::{self, Selection};
use crate::chips::{self, ColorMode};
use crate::gen::{Cmd, Event, LoadReq, ModelInfo, RunState, TokenRecord};
use crate::timing::Timing;

/// One sequence of tokens; branches fork from a parent at a token index.
pub struct Branch {
    pub name: String,
    pub parent: Option<usize>,
    /// Tokens shared with the parent.
    pub fork: usize,
    pub tokens: Vec<TokenRecord>,
}

/// Load settings that come from the command line.
#[derive(Clone)]
pub struct LoadSettings {
    pub gpu_layers: Option<u32>,
    pub n_ctx: u32,
    pub n_batch: u32,
}

pub struct App {
    tx: Sender<Cmd>,
    rx: Receiver<Event>,
    /// The window's device, lent to the model (None: CPU only).
    gpu: Option<Arc<GpuContext>>,
    load: LoadSettings,
    pub model_path: String,
    pub model: Option<ModelInfo>,
    pub loading: bool,
    pub status: String,
    pub error: Option<String>,
    pub prompt: String,
    pub params: SamplingParams,
    pub max_new: usize,
    pub color_mode: ColorMode,
    pub branches: Vec<Branch>,
    pub current: usize,
    pub selected: Option<usize>,
    pub att: Selection,
    pub state: RunState,
    epoch: u64,
    pub timing: Timing,
}

impl App {
    pub fn new(
        tx: Sender<Cmd>,
        rx: Receiver<Event>,
        gpu: Option<Arc<GpuContext>>,
        load: LoadSettings,
    ) -> App {
        App {
            tx,
            rx,
            gpu,
            load,
            model_path: String::new(),
            model: None,
            loading: false,
            status: "no model loaded".into(),
            error: None,
            prompt: "The capital of France is".into(),
            params: SamplingParams {
                seed: 42,
                ..SamplingParams::default()
            },
            max_new: 32,
            color_mode: ColorMode::Probability,
            branches: Vec::new(),
            current: 0,
            selected: None,
            att: Selection {
                row_normalize: true,
                ..Default::default()
            },
            state: RunState::Idle,
            epoch: 0,
            timing: Timing::default(),
        }
    }

    fn send(&mut self, c: Cmd) {
        if self.tx.send(c).is_err() {
            self.error = Some("the generation thread has stopped".into());
        }
    }

    /// Ask the worker to stop after its current step.
    pub fn quit(&mut self) {
        let _ = self.tx.send(Cmd::Quit);
    }

    pub fn request_load(&mut self) {
        let path = PathBuf::from(self.model_path.trim());
        if path.as_os_str().is_empty() {
            self.error = Some("enter the path of a GGUF model".into());
            return;
        }
        self.loading = true;
        self.error = None;
        self.model = None;
        self.branches.clear();
        self.selected = None;
        self.status = format!("loading {} …", path.display());
        let ctx = if self.load.gpu_layers == Some(0) {
            None
        } else {
            self.gpu.clone()
        };
        self.send(Cmd::Load(LoadReq {
            path,
            gpu_layers: self.load.gpu_layers,
            n_ctx: self.load.n_ctx,
            n_batch: self.load.n_batch,
            ctx,
        }));
    }

    pub fn request_start(&mut self) {
        self.epoch += 1;
        self.error = None;
        self.selected = None;
        self.timing.reset();
        let prompt = self.prompt.clone();
        let (params, max_new, epoch) = (self.params.clone(), self.max_new, self.epoch);
        self.send(Cmd::Start {
            prompt,
            params,
            max_new,
            epoch,
        });
        self.state = RunState::Running;
    }

    /// Whether the worker is busy with a sequence (so that edits to it must wait).
    pub fn busy(&self) -> bool {
        self.state == RunState::Running || self.loading
    }

    /// Apply every event that has arrived. Returns whether anything changed.
    pub fn poll(&mut self) -> bool {
        let mut any = false;
        while let Ok(e) = self.rx.try_recv() {
            any = true;
            self.apply(e);
        }
        any
    }

    fn apply(&mut self, e: Event) {
        match e {
            Event::Loaded(info) => {
                self.loading = false;
                self.status = format!(
                    "{}: {} layers, {} heads, {} in {:.1} s",
                    self.model_path.trim(),
                    info.config.n_layer,
                    info.config.n_head,
                    info.description,
                    info.load_ms / 1000.0
                );
                self.model = Some(*info);
            }
            Event::LoadFailed(msg) => {
                self.loading = false;
                self.status = "no model loaded".into();
                self.error = Some(format!("cannot load the model: {msg}"));
            }
            Event::Prompt { epoch, tokens, ms } => {
                if epoch != self.epoch {
                    return;
                }
                self.timing.prompt(tokens.len(), ms);
                let n = self.branches.iter().filter(|b| b.parent.is_none()).count();
                self.branches.push(Branch {
                    name: format!("prompt {}", n + 1),
                    parent: None,
                    fork: 0,
                    tokens,
                });
                self.current = self.branches.len() - 1;
            }
            Event::Token { epoch, record } => {
                if epoch != self.epoch {
                    return;
                }
                self.timing.step(record.step_ms);
                if let Some(b) = self.branches.get_mut(self.current) {
                    b.tokens.push(record);
                }
            }
            Event::Processed {
                epoch,
                index,
                attention,
                step_ms,
            } => {
                if epoch != self.epoch {
                    return;
                }
                self.timing.step(step_ms);
                if let Some(r) = self
                    .branches
                    .get_mut(self.current)
                    .and_then(|b| b.tokens.get_mut(index))
                {
                    r.attention = attention;
                    r.step_ms = step_ms;
                }
            }
            Event::State(s) => self.state = s,
            Event::Error(msg) => self.error = Some(msg),
        }
    }

    /// Continue from alternative `id` at position `index` of the current branch.
    fn branch_at(&mut self, index: usize, id: u32, prob: f32) {
        let Some(cur) = self.branches.get(self.current) else {
            return;
        };
        let Some(orig) = cur.tokens.get(index) else {
            return;
        };
        if orig.id == id || orig.prompt {
            return;
        }
        let mut tokens: Vec<TokenRecord> = cur.tokens[..index].to_vec();
        // Same step, same distribution: only the chosen token differs.
        tokens.push(TokenRecord {
            id,
            prob: Some(prob),
            attention: None,
            step_ms: 0.0,
            ..orig.clone()
        });
        let name = format!("{} / {}", cur.name, self.branches.len());
        self.branches.push(Branch {
            name,
            parent: Some(self.current),
            fork: index,
            tokens,
        });
        self.current = self.branches.len() - 1;
        self.selected = Some(index);
        self.epoch += 1;
        let epoch = self.epoch;
        self.send(Cmd::Branch {
            keep: index,
            token: id,
            epoch,
        });
        self.state = RunState::Running;
    }

    fn switch_to(&mut self, b: usize) {
        if b == self.current || b >= self.branches.len() {
            return;
        }
        self.current = b;
        self.selected = None;
        self.epoch += 1;
        let epoch = self.epoch;
        let tokens = self.branches[b].tokens.iter().map(|r| r.id).collect();
        self.send(Cmd::Switch { tokens, epoch });
    }

    /// The whole window.
    pub fn ui(&mut self, ui: &mut Ui) {
        self.poll();
        egui::Panel::top("top").show(ui, |ui| self.top_bar(ui));
        egui::Panel::left("controls")
            .default_size(280.0)
            .show(ui, |ui| {
                egui::ScrollArea::vertical().show(ui, |ui| self.controls(ui));
            });
        egui::CentralPanel::default().show(ui, |ui| {
            egui::ScrollArea::vertical().show(ui, |ui| self.central(ui));
        });
    }

    fn top_bar(&mut self, ui: &mut Ui) {
        ui.horizontal(|ui| {
            ui.label("model");
            let edit = ui.add(
                egui::TextEdit::singleline(&mut self.model_path)
                    .desired_width(420.0)
                    .hint_text("path to a .gguf file"),
            );
            let enter = edit.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            let can = !self.busy();
            if (ui.add_enabled(can, egui::Button::new("Load")).clicked() || (enter && can))
                && !self.loading
            {
                self.request_load();
            }
            if self.loading {
                ui.spinner();
            }
            ui.label(RichText::new(&self.status).weak());
        });
        if let Some(e) = &self.error {
            ui.colored_label(egui::Color32::from_rgb(255, 110, 110), e);
        }
    }

    fn controls(&mut self, ui: &mut Ui) {
        ui.heading("Prompt");
        ui.add(
            egui::TextEdit::multiline(&mut self.prompt)
                .desired_rows(4)
                .desired_width(f32::INFINITY),
        );
        let ready = self.model.is_some() && !self.loading;
        ui.horizontal_wrapped(|ui| {
            if ui
                .add_enabled(ready && !self.busy(), egui::Button::new("Generate"))
                .clicked()
            {
                self.request_start();
            }
            let running = self.state == RunState::Running;
            if ui
                .add_enabled(ready && running, egui::Button::new("Pause"))
                .clicked()
            {
                self.send(Cmd::Pause);
            }
            let has_seq = !self.branches.is_empty();
            let label = if self.state == RunState::Paused {
                "Resume"
            } else {
                "Continue"
            };
            if ui
                .add_enabled(ready && !running && has_seq, egui::Button::new(label))
                .clicked()
            {
                self.send(Cmd::Resume);
            }
            if ui
                .add_enabled(ready && !running && has_seq, egui::Button::new("Step"))
                .clicked()
            {
                self.send(Cmd::Step);
            }
            if ui
                .add_enabled(
                    ready && self.state != RunState::Idle,
                    egui::Button::new("Stop"),
                )
                .clicked()
            {
                self.send(Cmd::Stop);
            }
        });
        ui.label(format!("state: {:?}", self.state));
        ui.separator();
        self.sampling(ui);
        ui.separator();
        ui.heading("Colour chips by");
        for m in ColorMode::ALL {
            ui.radio_value(&mut self.color_mode, m, m.label());
        }
        ui.separator();
        ui.heading("Branches");
        self.branch_list(ui);
        ui.separator();
        ui.heading("Timing");
        self.timing.show(ui);
    }

    fn sampling(&mut self, ui: &mut Ui) {
        ui.heading("Sampling");
        let before = (self.params.clone(), self.max_new);
        let p = &mut self.params;
        ui.add(egui::Slider::new(&mut p.temperature, 0.0..=2.0).text("temperature"));
        ui.add(egui::Slider::new(&mut p.top_k, 0..=200).text("top-k"));
        ui.add(egui::Slider::new(&mut p.top_p, 0.0..=1.0).text("top-p"));
        ui.add(egui::Slider::new(&mut p.min_p, 0.0..=1.0).text("min-p"));
        ui.horizontal(|ui| {
            ui.label("seed");
            ui.add(egui::DragValue::new(&mut p.seed));
        });
        ui.add(egui::Slider::new(&mut self.max_new, 1..=512).text("max new tokens"));
        let changed = before.1 != self.max_new
            || before.0.temperature != self.params.temperature
            || before.0.top_k != self.params.top_k
            || before.0.top_p != self.params.top_p
            || before.0.min_p != self.params.min_p
            || before.0.seed != self.params.seed;
        if changed {
            let (p, n) = (self.params.clone(), self.max_new);
            self.send(Cmd::SetParams(p));
            self.send(Cmd::SetMaxNew(n));
        }
    }

    fn branch_list(&mut self, ui: &mut Ui) {
        if self.branches.is_empty() {
            ui.label("none yet: generate, then click an alternative of a token");
            return;
        }
        let mut pick = None;
        for (i, b) in self.branches.iter().enumerate() {
            let depth = depth(&self.branches, i);
            ui.horizontal(|ui| {
                ui.add_space(12.0 * depth as f32);
                let text = format!("{} ({} tokens, from #{})", b.name, b.tokens.len(), b.fork);
                if ui.selectable_label(i == self.current, text).clicked() {
                    pick = Some(i);
                }
            });
        }
        if let Some(i) = pick {
            if !self.busy() {
                self.switch_to(i);
            }
        }
    }

    fn central(&mut self, ui: &mut Ui) {
        let Some(model) = &self.model else {
            ui.label("Load a model to begin.");
            return;
        };
        let tok = model.tokenizer.clone();
        let (n_layer, n_head) = (model.config.n_layer as usize, model.config.n_head as usize);
        let has_attention = model.attention;
        let Some(branch) = self.branches.get(self.current) else {
            ui.label("Enter a prompt and press Generate.");
            return;
        };
        ui.heading(format!("Tokens — {}", branch.name));
        let action = chips::show(ui, &tok, &branch.tokens, self.color_mode, self.selected);
        if let Some(i) = action.select {
            self.selected = Some(i);
        }
        ui.separator();
        let sel = self
            .selected
            .filter(|&i| i < branch.tokens.len())
            .or_else(|| branch.tokens.len().checked_sub(1));
        let Some(sel) = sel else {
            return;
        };
        let Some(rec) = branch.tokens.get(sel).cloned() else {
            return;
        };
        let labels: Vec<String> = branch
            .tokens
            .iter()
            .map(|r| chips::display_text(&tok, r.id))
            .collect();
        ui.horizontal(|ui| {
            ui.heading(format!("Token #{sel}"));
            ui.label(RichText::new(format!("{:?}", chips::display_text(&tok, rec.id))).monospace());
            if let Some(p) = rec.prob {
                ui.label(format!("p = {p:.4}"));
            }
            if let Some(h) = rec.entropy {
                ui.label(format!("entropy = {h:.2} bits"));
            }
        });
        ui.columns(2, |cols| {
            let ui = &mut cols[0];
            ui.label(RichText::new("Alternatives (click to branch)").strong());
            if rec.prompt {
                ui.label("prompt token: nothing was sampled");
            } else {
                let mut clicked = None;
                chips::alternatives_table(ui, &tok, &rec, |id, p| clicked = Some((id, p)));
                if let Some((id, p)) = clicked {
                    if self.busy() {
                        self.error = Some("pause or stop generation before branching".into());
                    } else {
                        self.branch_at(sel, id, p);
                    }
                }
            }
            let ui = &mut cols[1];
            ui.label(RichText::new("Attention of this token").strong());
            if !has_attention {
                ui.label("attention capture needs the whole model on the GPU (not --gpu-layers 0)");
            } else if let Some(att) = &rec.attention {
                attention::controls(ui, &mut self.att, n_layer, n_head);
                let rows = attention::rows(att, &self.att);
                attention::heatmap(ui, &rows, &labels, self.att.row_normalize);
            } else {
                ui.label("not captured for this token (prompt tokens are processed as one batch: only the last one has it)");
            }
        });
    }
}

fn depth(branches: &[Branch], mut i: usize) -> usize {
    let mut d = 0;
    while let Some(p) = branches.get(i).and_then(|b| b.parent) {
        d += 1;
        i = p;
        if d > branches.len() {
            break;
        }
    }
    d
}
