//! Generation speed: tokens per second over the recent steps and the last step's wall
//! time (host-measured: sampling, submission and readback included).

use std::collections::VecDeque;

use egui::Ui;

/// Steps averaged for the tokens/s figure.
const WINDOW: usize = 16;

#[derive(Default)]
pub struct Timing {
    pub prompt_tokens: usize,
    pub prompt_ms: f64,
    recent: VecDeque<f64>,
    pub total_tokens: usize,
    pub total_ms: f64,
}

impl Timing {
    pub fn reset(&mut self) {
        *self = Timing::default();
    }

    pub fn prompt(&mut self, tokens: usize, ms: f64) {
        self.prompt_tokens = tokens;
        self.prompt_ms = ms;
    }

    /// One generation step of `ms` milliseconds (ignored when nothing was run).
    pub fn step(&mut self, ms: f64) {
        if ms <= 0.0 || !ms.is_finite() {
            return;
        }
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(ms);
        self.total_tokens += 1;
        self.total_ms += ms;
    }

    pub fn last_ms(&self) -> Option<f64> {
        self.recent.back().copied()
    }

    /// Tokens per second over the last [`WINDOW`] steps.
    pub fn recent_tps(&self) -> Option<f64> {
        let sum: f64 = self.recent.iter().sum();
        (sum > 0.0).then(|| self.recent.len() as f64 * 1000.0 / sum)
    }

    pub fn show(&self, ui: &mut Ui) {
        egui::Grid::new("timing").show(ui, |ui| {
            ui.label("prompt");
            ui.label(if self.prompt_tokens > 0 {
                format!(
                    "{} tokens in {:.0} ms ({:.1} tok/s)",
                    self.prompt_tokens,
                    self.prompt_ms,
                    self.prompt_tokens as f64 * 1000.0 / self.prompt_ms.max(1e-9)
                )
            } else {
                "-".into()
            });
            ui.end_row();
            ui.label("generation");
            ui.label(match self.recent_tps() {
                Some(t) => format!("{t:.2} tok/s (last {})", self.recent.len()),
                None => "-".into(),
            });
            ui.end_row();
            ui.label("last step");
            ui.label(match self.last_ms() {
                Some(ms) => format!("{ms:.1} ms"),
                None => "-".into(),
            });
            ui.end_row();
        });
        // A bar per recent step, scaled to the slowest.
        let max = self.recent.iter().copied().fold(0.0f64, f64::max);
        if max > 0.0 {
            let (rect, _) = ui.allocate_exact_size(
                egui::vec2(ui.available_width().min(240.0), 30.0),
                egui::Sense::hover(),
            );
            let w = rect.width() / WINDOW as f32;
            for (i, &ms) in self.recent.iter().enumerate() {
                let h = (ms / max) as f32 * rect.height();
                let r = egui::Rect::from_min_max(
                    egui::pos2(rect.left() + i as f32 * w, rect.bottom() - h),
                    egui::pos2(rect.left() + (i as f32 + 0.8) * w, rect.bottom()),
                );
                ui.painter()
                    .rect_filled(r, 0.0, egui::Color32::from_rgb(90, 160, 230));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Timing;

    #[test]
    fn rate_over_a_window() {
        let mut t = Timing::default();
        assert_eq!(t.recent_tps(), None);
        t.step(500.0);
        t.step(1500.0);
        // Two tokens in two seconds.
        assert!((t.recent_tps().unwrap_or(0.0) - 1.0).abs() < 1e-9);
        assert_eq!(t.last_ms(), Some(1500.0));
        for _ in 0..40 {
            t.step(100.0);
        }
        // Only the last 16 count: 10 tok/s.
        assert!((t.recent_tps().unwrap_or(0.0) - 10.0).abs() < 1e-9);
        assert_eq!(t.total_tokens, 42);
        t.step(0.0);
        assert_eq!(t.total_tokens, 42);
    }
}
