//! Token chips: one coloured box per token, wrapped like text. The colour encodes the
//! probability, the entropy or the surprise of the step that chose the token; hovering
//! shows the alternatives the model considered.

use egui::{Color32, CornerRadius, RichText, Sense, Stroke, StrokeKind, Ui};
use wgllm::tokenizer::Tokenizer;

use crate::gen::TokenRecord;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColorMode {
    Probability,
    Entropy,
    Surprise,
}

impl ColorMode {
    pub const ALL: [ColorMode; 3] = [
        ColorMode::Probability,
        ColorMode::Entropy,
        ColorMode::Surprise,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ColorMode::Probability => "probability",
            ColorMode::Entropy => "entropy",
            ColorMode::Surprise => "surprise",
        }
    }
}

/// Entropy (bits) shown as the hottest colour; above it everything is equally uncertain.
const MAX_ENTROPY_BITS: f32 = 6.0;
/// Surprise (-log2 p, bits) shown as the hottest colour.
const MAX_SURPRISE_BITS: f32 = 10.0;

/// 0 = confident / expected (green), 1 = unsure / surprising (red).
pub fn heat(mode: ColorMode, rec: &TokenRecord) -> Option<f32> {
    let t = match mode {
        ColorMode::Probability => 1.0 - rec.prob?,
        ColorMode::Entropy => rec.entropy? / MAX_ENTROPY_BITS,
        ColorMode::Surprise => -rec.prob?.max(1e-30).log2() / MAX_SURPRISE_BITS,
    };
    Some(if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        1.0
    })
}

/// Pastel green → yellow → red, light enough for dark text.
pub fn heat_color(t: f32) -> Color32 {
    let t = t.clamp(0.0, 1.0);
    let (r, g) = if t < 0.5 {
        (0.55 + 0.9 * t, 0.95)
    } else {
        (1.0, 0.95 - 1.1 * (t - 0.5))
    };
    Color32::from_rgb((r.min(1.0) * 255.0) as u8, (g * 255.0) as u8, 110)
}

const PROMPT_COLOR: Color32 = Color32::from_rgb(190, 196, 210);

/// A token's text for display: control characters made visible, never empty.
pub fn display_text(tok: &Tokenizer, id: u32) -> String {
    let raw = String::from_utf8_lossy(tok.token_bytes(id)).into_owned();
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    if out.is_empty() {
        format!("<{id}>")
    } else {
        out
    }
}

/// What the user did with the chips this frame.
#[derive(Default)]
pub struct ChipAction {
    pub select: Option<usize>,
}

/// Draw every token of `tokens`; `selected` gets an outline.
pub fn show(
    ui: &mut Ui,
    tok: &Tokenizer,
    tokens: &[TokenRecord],
    mode: ColorMode,
    selected: Option<usize>,
) -> ChipAction {
    let mut action = ChipAction::default();
    ui.horizontal_wrapped(|ui| {
        ui.spacing_mut().item_spacing = egui::vec2(2.0, 3.0);
        for (i, rec) in tokens.iter().enumerate() {
            let text = display_text(tok, rec.id);
            let fill = heat(mode, rec).map(heat_color).unwrap_or(PROMPT_COLOR);
            let resp = chip(ui, &text, fill, selected == Some(i));
            let resp = resp.on_hover_ui(|ui| hover(ui, tok, i, rec));
            if resp.clicked() {
                action.select = Some(i);
            }
        }
    });
    action
}

fn chip(ui: &mut Ui, text: &str, fill: Color32, selected: bool) -> egui::Response {
    let galley = ui.painter().layout_no_wrap(
        text.to_owned(),
        egui::FontId::monospace(13.0),
        Color32::BLACK,
    );
    let pad = egui::vec2(3.0, 2.0);
    let size = galley.size() + 2.0 * pad;
    let (rect, resp) = ui.allocate_exact_size(size, Sense::click());
    let p = ui.painter();
    p.rect_filled(rect, CornerRadius::same(3), fill);
    if selected {
        p.rect_stroke(
            rect,
            CornerRadius::same(3),
            Stroke::new(2.0, Color32::from_rgb(40, 110, 255)),
            StrokeKind::Outside,
        );
    } else if resp.hovered() {
        p.rect_stroke(
            rect,
            CornerRadius::same(3),
            Stroke::new(1.0, Color32::WHITE),
            StrokeKind::Outside,
        );
    }
    p.galley(rect.min + pad, galley, Color32::BLACK);
    resp
}

/// The tooltip: the token's own numbers and the top alternatives.
fn hover(ui: &mut Ui, tok: &Tokenizer, index: usize, rec: &TokenRecord) {
    ui.label(
        RichText::new(format!(
            "#{index}  id {}  {:?}",
            rec.id,
            display_text(tok, rec.id)
        ))
        .monospace(),
    );
    if rec.prompt {
        ui.label("prompt token");
        return;
    }
    if let Some(p) = rec.prob {
        ui.label(format!(
            "p = {:.4}   surprise = {:.2} bits",
            p,
            -p.max(1e-30).log2()
        ));
    }
    if let Some(h) = rec.entropy {
        ui.label(format!("entropy = {h:.2} bits"));
    }
    alternatives_table(ui, tok, rec, |_, _| {});
}

/// The top alternatives of `rec` as rows with a bar; `on_click(id, prob)` is called for
/// the row the user clicks (when the caller renders it interactively).
pub fn alternatives_table(
    ui: &mut Ui,
    tok: &Tokenizer,
    rec: &TokenRecord,
    mut on_click: impl FnMut(u32, f32),
) {
    egui::Grid::new(("alts", rec.id, rec.top.len()))
        .striped(true)
        .show(ui, |ui| {
            for &(id, p) in &rec.top {
                let text = display_text(tok, id);
                let label = if id == rec.id {
                    RichText::new(format!("> {text}")).monospace().strong()
                } else {
                    RichText::new(text).monospace()
                };
                if ui.add(egui::Button::new(label).small()).clicked() {
                    on_click(id, p);
                }
                let (rect, _) = ui.allocate_exact_size(egui::vec2(90.0, 10.0), Sense::hover());
                let mut bar = rect;
                bar.set_width(rect.width() * p.clamp(0.0, 1.0));
                ui.painter().rect_filled(rect, 0.0, Color32::from_gray(60));
                ui.painter().rect_filled(bar, 0.0, heat_color(1.0 - p));
                ui.label(format!("{:.4}", p));
                ui.end_row();
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(prob: f32, entropy: f32) -> TokenRecord {
        TokenRecord {
            id: 0,
            prompt: false,
            prob: Some(prob),
            entropy: Some(entropy),
            top: Vec::new(),
            attention: None,
            step_ms: 0.0,
        }
    }

    #[test]
    fn heat_follows_the_mode() {
        let sure = rec(0.99, 0.1);
        let unsure = rec(0.01, 5.0);
        for mode in ColorMode::ALL {
            let a = heat(mode, &sure).unwrap_or(f32::NAN);
            let b = heat(mode, &unsure).unwrap_or(f32::NAN);
            assert!(a < b, "{mode:?}: {a} vs {b}");
        }
        // 1/1024 is 10 bits of surprise: the top of the scale.
        assert!(
            (heat(ColorMode::Surprise, &rec(1.0 / 1024.0, 0.0)).unwrap_or(0.0) - 1.0).abs() < 1e-4
        );
        // Prompt tokens have no distribution.
        let mut p = rec(0.5, 1.0);
        p.prob = None;
        assert_eq!(heat(ColorMode::Probability, &p), None);
    }

    #[test]
    fn heat_colors_go_from_green_to_red() {
        let g = heat_color(0.0);
        let r = heat_color(1.0);
        assert!(g.g() > g.r());
        assert!(r.r() > r.g());
    }
}
