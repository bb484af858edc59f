//! The attention heatmap of one token: how much it attended to each earlier position,
//! per layer and head, from the probabilities captured during that token's step.

use egui::{Color32, Rect, Sense, Ui};

use crate::gen::Attention;

/// Which slice of [layer][head][n_kv] the heatmap shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// `None`: rows are the layers. `Some(l)`: rows are the heads of layer `l`.
    pub layer: Option<usize>,
    /// With rows = layers: `None` averages the heads, `Some(h)` shows head `h`.
    pub head: Option<usize>,
    /// Scale each row to its own maximum (the first position often takes most of the
    /// weight and would wash out the rest).
    pub row_normalize: bool,
}

/// One heatmap row: a label and the weights over positions.
pub struct Row {
    pub label: String,
    pub weights: Vec<f32>,
}

/// Mean over heads of one layer's weights: [n_kv].
fn head_mean(heads: &[Vec<f32>]) -> Vec<f32> {
    let n = heads.iter().map(|h| h.len()).max().unwrap_or(0);
    let mut out = vec![0.0f32; n];
    for h in heads {
        for (o, &w) in out.iter_mut().zip(h) {
            *o += w;
        }
    }
    let k = heads.len().max(1) as f32;
    out.iter_mut().for_each(|o| *o /= k);
    out
}

/// The rows `sel` asks for.
pub fn rows(att: &Attention, sel: &Selection) -> Vec<Row> {
    match sel.layer {
        None => att
            .iter()
            .enumerate()
            .map(|(l, heads)| Row {
                label: format!("L{l}"),
                weights: match sel.head {
                    None => head_mean(heads),
                    Some(h) => heads.get(h).cloned().unwrap_or_default(),
                },
            })
            .collect(),
        Some(l) => {
            let Some(heads) = att.get(l) else {
                return Vec::new();
            };
            let mut out: Vec<Row> = heads
                .iter()
                .enumerate()
                .map(|(h, w)| Row {
                    label: format!("H{h}"),
                    weights: w.clone(),
                })
                .collect();
            out.push(Row {
                label: "avg".into(),
                weights: head_mean(heads),
            });
            out
        }
    }
}

/// Black → blue → orange → yellow-white: dark for nothing, bright for all the weight.
pub fn weight_color(t: f32) -> Color32 {
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let stops: [(f32, [f32; 3]); 4] = [
        (0.0, [10.0, 10.0, 30.0]),
        (0.35, [40.0, 70.0, 190.0]),
        (0.7, [240.0, 130.0, 40.0]),
        (1.0, [255.0, 250.0, 200.0]),
    ];
    let mut c = stops[3].1;
    for w in stops.windows(2) {
        let (a, b) = (w[0], w[1]);
        if t <= b.0 {
            let f = (t - a.0) / (b.0 - a.0);
            c = [0, 1, 2].map(|i| a.1[i] + (b.1[i] - a.1[i]) * f);
            break;
        }
    }
    Color32::from_rgb(c[0] as u8, c[1] as u8, c[2] as u8)
}

/// Controls for `sel` given the model's shape.
pub fn controls(ui: &mut Ui, sel: &mut Selection, n_layer: usize, n_head: usize) {
    ui.horizontal(|ui| {
        egui::ComboBox::from_label("rows")
            .selected_text(match sel.layer {
                None => "all layers".to_string(),
                Some(l) => format!("heads of layer {l}"),
            })
            .show_ui(ui, |ui| {
                ui.selectable_value(&mut sel.layer, None, "all layers");
                for l in 0..n_layer {
                    ui.selectable_value(&mut sel.layer, Some(l), format!("heads of layer {l}"));
                }
            });
        if sel.layer.is_none() {
            egui::ComboBox::from_label("head")
                .selected_text(match sel.head {
                    None => "average".to_string(),
                    Some(h) => format!("head {h}"),
                })
                .show_ui(ui, |ui| {
                    ui.selectable_value(&mut sel.head, None, "average");
                    for h in 0..n_head {
                        ui.selectable_value(&mut sel.head, Some(h), format!("head {h}"));
                    }
                });
        }
        ui.checkbox(&mut sel.row_normalize, "scale rows to their max");
    });
}

/// Draw the heatmap; `labels[i]` names position `i`. Returns the position hovered.
pub fn heatmap(ui: &mut Ui, rows: &[Row], labels: &[String], normalize: bool) -> Option<usize> {
    let n_kv = rows.iter().map(|r| r.weights.len()).max().unwrap_or(0);
    if n_kv == 0 || rows.is_empty() {
        ui.label("no attention recorded for this token");
        return None;
    }
    let label_w = 34.0;
    let avail = (ui.available_width() - label_w - 8.0).max(50.0);
    let cell_w = (avail / n_kv as f32).clamp(2.0, 28.0);
    let cell_h = if rows.len() > 24 { 7.0 } else { 12.0 };
    let size = egui::vec2(label_w + cell_w * n_kv as f32, cell_h * rows.len() as f32);
    let (rect, resp) = ui.allocate_exact_size(size, Sense::hover());
    let p = ui.painter_at(rect);
    let font = egui::FontId::monospace(cell_h.min(10.0));
    for (r, row) in rows.iter().enumerate() {
        let y = rect.top() + r as f32 * cell_h;
        // Label every row when they are tall enough, else every fourth.
        if cell_h >= 10.0 || r % 4 == 0 {
            p.text(
                egui::pos2(rect.left(), y),
                egui::Align2::LEFT_TOP,
                &row.label,
                font.clone(),
                ui.visuals().text_color(),
            );
        }
        let max = if normalize {
            row.weights.iter().copied().fold(0.0f32, f32::max)
        } else {
            1.0
        };
        for (c, &w) in row.weights.iter().enumerate() {
            let x = rect.left() + label_w + c as f32 * cell_w;
            let cell = Rect::from_min_size(egui::pos2(x, y), egui::vec2(cell_w, cell_h));
            let t = if max > 0.0 { w / max } else { 0.0 };
            p.rect_filled(
                cell.shrink(if cell_w > 4.0 { 0.5 } else { 0.0 }),
                0.0,
                weight_color(t),
            );
        }
    }
    let hovered = resp.hover_pos().and_then(|pos| {
        let c = ((pos.x - rect.left() - label_w) / cell_w).floor();
        let r = ((pos.y - rect.top()) / cell_h).floor();
        if c < 0.0 || r < 0.0 {
            return None;
        }
        let (c, r) = (c as usize, r as usize);
        let row = rows.get(r)?;
        let w = *row.weights.get(c)?;
        Some((c, r, w, row))
    });
    if let Some((c, _, w, row)) = hovered {
        let name = labels.get(c).map(String::as_str).unwrap_or("?");
        resp.on_hover_text(format!("{}  position {c} {name:?}: {w:.4}", row.label));
        return Some(c);
    }
    // Column labels under the map when there is room for them.
    if cell_w >= 14.0 {
        let (lr, _) = ui.allocate_exact_size(egui::vec2(size.x, 12.0), Sense::hover());
        for (c, l) in labels.iter().take(n_kv).enumerate() {
            let short: String = l.chars().take(3).collect();
            let x = lr.left() + label_w + (c as f32 + 0.5) * cell_w;
            ui.painter().text(
                egui::pos2(x, lr.top()),
                egui::Align2::CENTER_TOP,
                short,
                egui::FontId::monospace(8.0),
                ui.visuals().weak_text_color(),
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn att() -> Attention {
        // 2 layers, 2 heads, 3 positions.
        vec![
            vec![vec![1.0, 0.0, 0.0], vec![0.0, 0.0, 1.0]],
            vec![vec![0.5, 0.5, 0.0], vec![0.5, 0.5, 0.0]],
        ]
    }

    #[test]
    fn layer_rows_average_heads() {
        let r = rows(&att(), &Selection::default());
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].weights, vec![0.5, 0.0, 0.5]);
        assert_eq!(r[1].weights, vec![0.5, 0.5, 0.0]);
    }

    #[test]
    fn head_rows_of_one_layer_end_with_the_average() {
        let sel = Selection {
            layer: Some(0),
            ..Default::default()
        };
        let r = rows(&att(), &sel);
        assert_eq!(r.len(), 3);
        assert_eq!(r[1].weights, vec![0.0, 0.0, 1.0]);
        assert_eq!(r[2].label, "avg");
        // A layer past the end gives nothing rather than a panic.
        let sel = Selection {
            layer: Some(9),
            ..Default::default()
        };
        assert!(rows(&att(), &sel).is_empty());
    }

    #[test]
    fn single_head_and_color_ends() {
        let sel = Selection {
            head: Some(1),
            ..Default::default()
        };
        assert_eq!(rows(&att(), &sel)[0].weights, vec![0.0, 0.0, 1.0]);
        assert!(weight_color(1.0).r() > weight_color(0.0).r());
        assert_eq!(weight_color(f32::NAN), weight_color(0.0));
    }
}
