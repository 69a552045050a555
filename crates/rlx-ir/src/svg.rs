//! A picture of a graph: [`to_svg`] draws every node as a box labelled with its op and shape,
//! fused regions as wider boxes listing the ops of their body, and edges from each operand to
//! its reader, in rows from the inputs down.

use crate::{Graph, NodeId, Op};
use std::fmt::Write;

const CHAR_W: f64 = 7.2;
const LINE_H: f64 = 15.0;
const PAD: f64 = 8.0;
const GAP_X: f64 = 18.0;
const GAP_Y: f64 = 42.0;
/// Rows between a leaf and a reader beyond which the edge is drawn as a labelled stub.
const FAR_ROWS: usize = 4;
/// Ops listed per line inside a fused box.
const OPS_PER_LINE: usize = 6;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Text lines and style class of a node's box.
fn label(g: &Graph, id: NodeId) -> (Vec<String>, &'static str) {
    let n = g.node(id);
    let shape = n.shape.to_string();
    match &n.op {
        Op::Fused(r) => {
            let title = if r.output == 0 {
                format!("{id} fused {}", r.kind.name())
            } else {
                match g.fused_head(id) {
                    Some(head) => format!("{id} result {} of {head}", r.output),
                    None => format!("{id} result {} of a region", r.output),
                }
            };
            let mut lines = vec![title];
            if r.output == 0 {
                let ops = r.op_names();
                lines.extend(ops.chunks(OPS_PER_LINE).map(|c| c.join(" \u{b7} ")));
            }
            lines.push(shape);
            (lines, if r.output == 0 { "fused" } else { "result" })
        }
        Op::Input { name } | Op::Param { name } => (
            vec![format!("{id} {} \"{name}\"", n.op.name()), shape],
            "leaf",
        ),
        Op::Constant { .. } => (vec![format!("{id} constant"), shape], "leaf"),
        op => {
            let class = match op {
                Op::MatMul | Op::DotGeneral(_) | Op::DequantMatMul { .. } | Op::Conv(_) => {
                    "product"
                }
                Op::Attention { .. } | Op::CachedAttention { .. } | Op::PagedAttention { .. } => {
                    "product"
                }
                _ => "op",
            };
            (vec![format!("{id} {}", op.name()), shape], class)
        }
    }
}

/// The graph as an SVG picture (see the module docs). Operands are drawn in the row above
/// their first reader; every other node one row below its deepest operand.
pub fn to_svg(g: &Graph) -> String {
    let n = g.len();
    let mut depth = vec![0usize; n];
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for id in g.ids() {
        let node = g.node(id);
        for x in &node.inputs {
            readers[x.index()].push(id.index());
        }
        if !node.op.is_leaf() {
            depth[id.index()] = node
                .inputs
                .iter()
                .filter(|x| !g.node(**x).op.is_leaf())
                .map(|x| depth[x.index()] + 1)
                .max()
                .unwrap_or(1);
        }
    }
    for id in g.ids() {
        if g.node(id).op.is_leaf() {
            depth[id.index()] = readers[id.index()]
                .iter()
                .map(|&r| depth[r])
                .min()
                .unwrap_or(1)
                .saturating_sub(1);
        }
    }
    let rows = depth.iter().copied().max().map_or(0, |d| d + 1);
    let mut row_nodes: Vec<Vec<usize>> = vec![Vec::new(); rows];
    for (i, &d) in depth.iter().enumerate() {
        row_nodes[d].push(i);
    }
    // Box sizes, then positions: rows centred on a common axis.
    let boxes: Vec<(Vec<String>, &str, f64, f64)> = g
        .ids()
        .map(|id| {
            let (lines, class) = label(g, id);
            let w = lines.iter().map(|l| l.chars().count()).max().unwrap_or(1) as f64 * CHAR_W
                + 2.0 * PAD;
            let h = lines.len() as f64 * LINE_H + PAD;
            (lines, class, w, h)
        })
        .collect();
    let row_w: Vec<f64> = row_nodes
        .iter()
        .map(|r| {
            r.iter().map(|&i| boxes[i].2).sum::<f64>() + GAP_X * r.len().saturating_sub(1) as f64
        })
        .collect();
    let width = row_w.iter().copied().fold(0.0, f64::max) + 2.0 * GAP_X;
    let mut pos = vec![(0.0, 0.0); n];
    let mut y = 40.0;
    for (r, nodes) in row_nodes.iter().enumerate() {
        let mut x = (width - row_w[r]) / 2.0;
        let h = nodes.iter().map(|&i| boxes[i].3).fold(0.0, f64::max);
        for &i in nodes {
            pos[i] = (x, y);
            x += boxes[i].2 + GAP_X;
        }
        y += h + GAP_Y;
    }
    let height = y;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="monospace" font-size="12">"#
    );
    let _ = writeln!(
        s,
        "<style>.op{{fill:#ffffff;stroke:#555}} .leaf{{fill:#eeeeee;stroke:#999}} .product{{fill:#dbe8fb;stroke:#3a6db5}} .fused{{fill:#fde9cf;stroke:#d07a12;stroke-width:2;stroke-dasharray:6 3}} .result{{fill:#fdf3e6;stroke:#d07a12;stroke-dasharray:2 2}} path{{fill:none;stroke:#888;stroke-width:1}}</style>"
    );
    let _ = writeln!(
        s,
        r##"<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" style="fill:#888;stroke:none"/></marker></defs>"##
    );
    let outputs: Vec<usize> = g.outputs().iter().map(|o| o.index()).collect();
    let _ = writeln!(
        s,
        r#"<text x="{GAP_X}" y="22" font-size="14">graph "{}": {} nodes, outputs {}</text>"#,
        escape(g.name()),
        n,
        escape(
            &outputs
                .iter()
                .map(|o| format!("%{o}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    );
    for id in g.ids() {
        let (x1, y1) = pos[id.index()];
        let (w1, _) = (boxes[id.index()].2, boxes[id.index()].3);
        for (k, x) in g.node(id).inputs.iter().enumerate() {
            let (x0, y0) = pos[x.index()];
            let (w0, h0) = (boxes[x.index()].2, boxes[x.index()].3);
            let (bx, by) = (x1 + w1 / 2.0, y1);
            if g.node(*x).op.is_leaf() && depth[id.index()] > depth[x.index()] + FAR_ROWS {
                // A leaf far above (positions read by every layer): a short labelled stub
                // instead of a line across the picture.
                let (ax, ay) = (bx + (k as f64 - 1.0) * 14.0, by - 16.0);
                let _ = writeln!(
                    s,
                    r##"<path d="M{ax:.1},{ay:.1} L{bx:.1},{by:.1}" marker-end="url(#arrow)"/><text x="{:.1}" y="{:.1}" font-size="10" fill="#777">{x}</text>"##,
                    ax - 8.0,
                    ay - 2.0
                );
                continue;
            }
            let (ax, ay) = (x0 + w0 / 2.0, y0 + h0);
            let mid = (ay + by) / 2.0;
            let _ = writeln!(
                s,
                r#"<path d="M{ax:.1},{ay:.1} C{ax:.1},{mid:.1} {bx:.1},{mid:.1} {bx:.1},{by:.1}" marker-end="url(#arrow)"/>"#
            );
        }
    }
    for id in g.ids() {
        let (x, y) = pos[id.index()];
        let (lines, class, w, h) = &boxes[id.index()];
        let stroke = if outputs.contains(&id.index()) {
            r#" style="stroke-width:3""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<g><title>{}</title><rect class="{class}" x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" rx="4"{stroke}/>"#,
            escape(&lines.join("\n"))
        );
        for (k, l) in lines.iter().enumerate() {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                x + PAD,
                y + PAD / 2.0 + LINE_H * (k as f64 + 0.8),
                escape(l)
            );
        }
        s.push_str("</g>\n");
    }
    s.push_str("</svg>\n");
    s
}
