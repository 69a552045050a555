//! A readable text form of a graph (one node per line).

use crate::{Graph, Op};
use std::fmt::{self, Write};

fn attrs(op: &Op) -> String {
    match op {
        Op::Input { name } | Op::Param { name } => format!(" \"{name}\""),
        Op::Constant { data } => format!(" <{} bytes>", data.len()),
        Op::Cast { to } => format!(" to={to}"),
        Op::DotGeneral(d) => format!(
            " contract={:?}x{:?} batch={:?}x{:?}",
            d.lhs_contract, d.rhs_contract, d.lhs_batch, d.rhs_batch
        ),
        Op::Reduce { kind, axes, keepdims } => format!(" {kind:?} axes={axes:?} keepdims={keepdims}"),
        Op::Softmax { axis } | Op::Concat { axis } | Op::Gather { axis } | Op::ScatterAdd { axis } | Op::Cumsum { axis } => {
            format!(" axis={axis}")
        }
        Op::LayerNorm { eps } | Op::RmsNorm { eps } => format!(" eps={eps}"),
        Op::Reshape { shape } | Op::Expand { shape } => format!(" {shape:?}"),
        Op::Transpose { perm } => format!(" perm={perm:?}"),
        Op::Narrow { axis, start, len } => format!(" axis={axis} start={start} len={len}"),
        Op::TopK { k, output } => format!(" k={k} {output:?}"),
        Op::Attention { mask, scale } => format!(" mask={mask:?} scale={scale}"),
        Op::Rope { theta, interleaved } => format!(" theta={theta} interleaved={interleaved}"),
        Op::Conv(a) => format!(" stride={:?} pad={:?} dil={:?} groups={}", a.stride, a.padding, a.dilation, a.groups),
        Op::Custom(f) => format!(" \"{}\" ({} nodes{}{})", f.name, f.body.len(), if f.vjp.is_some() { ", vjp" } else { "" }, if f.jvp.is_some() { ", jvp" } else { "" }),
        Op::Pool(a) => format!(" {:?} kernel={:?} stride={:?} pad={:?}", a.kind, a.kernel, a.stride, a.padding),
        Op::DequantMatMul { scheme } | Op::DequantizeRows { scheme } => format!(" {scheme:?}"),
        Op::Quantize { axis } | Op::Dequantize { axis } | Op::FakeQuantize { axis } => format!(" axis={axis:?}"),
        Op::CachedAttention { scale, window } => format!(" scale={scale} window={window:?}"),
        _ => String::new(),
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "graph \"{}\" {{", self.name())?;
        for id in self.ids() {
            let n = self.node(id);
            let mut line = format!("  {id} = {}{}", n.op.name(), attrs(&n.op));
            for (i, x) in n.inputs.iter().enumerate() {
                let _ = write!(line, "{}{x}", if i == 0 { " " } else { ", " });
            }
            writeln!(f, "{line} : {}", n.shape)?;
        }
        let outs: Vec<String> = self.outputs().iter().map(|o| o.to_string()).collect();
        writeln!(f, "  return {}", outs.join(", "))?;
        f.write_str("}")
    }
}
