//! RLX on FPGAs: an int8 model as a synthesizable SystemVerilog datapath.
//!
//! [`emit_sv`] takes the [`IntegerCore`] of a quantized graph at batch 1
//! (`rlx_opt::quant::integer_core` of what `quant_propagate` made) and writes one module,
//! `rlx_model`:
//! - a streaming interface: the int8 input arrives on `in_valid / in_ready / in_data`, one value
//!   per accepted cycle, and the int8 output leaves on `out_valid / out_ready / out_data`;
//! - one RAM per value (synchronous read), written by the layer that computes it and read by the
//!   one that consumes it; a reshape shares its operand's RAM;
//! - per layer, its weights in `macs` ROM banks (bank `p` holds output channels `p, p + macs,
//!   ...`), its biases, multipliers and shifts in small ROMs;
//! - `macs` multiply-accumulate lanes with `int32` accumulators, shared by the layers, each lane
//!   one output channel: a `qlinear` or `qconv2d` layer walks its output positions and, for each
//!   group of `macs` channels, its `K` products one per cycle, then requantizes the group
//!   through one requantization unit (the fixed-point arithmetic of `rlx_ir::quant::fixed`,
//!   ReLU as its clamp); a `qpool` walks its windows one value per cycle (max, or sum and count
//!   then a rounded division for the mean); a `qadd` reads both operands' element each other
//!   cycle and writes TFLite's int8 sum (each operand shifted and rescaled, the sum
//!   requantized).
//!
//! `macs` trades multipliers for cycles: a layer of `N` channels, `K` products and `S`
//! positions takes about `S · ⌈N / macs⌉ · (K + macs + 2)` cycles. The ops it writes are
//! `qlinear`, `qconv2d`, `qadd`, `qpool` (max and mean) and `reshape`; any other op (and a
//! batch above 1) is an error naming it. [`sim::testbench_cpp`] writes a Verilator testbench that streams inputs through
//! the module and prints each output and the cycles it took.

#![deny(missing_docs)]

use rlx_ir::eval::Tensor;
use rlx_ir::ops::{QAdd, QConv2d, QLinear, QPool, QADD_LEFT_SHIFT};
use rlx_ir::{Error, Graph, NodeId, Op, PoolKind, Result};
use rlx_opt::quant::IntegerCore;
use std::fmt::Write;

pub mod sim;

/// A model written as SystemVerilog.
#[derive(Clone, Debug)]
pub struct SvModel {
    /// The module `rlx_model`.
    pub source: String,
    /// Multiply-accumulate lanes.
    pub macs: usize,
    /// Input values per inference.
    pub input_len: usize,
    /// Output values per inference.
    pub output_len: usize,
    /// Bits of weight, bias, multiplier and shift ROM.
    pub rom_bits: usize,
    /// Bits of activation RAM.
    pub ram_bits: usize,
    /// Cycles of compute per inference the schedule gives (between the last input and the
    /// first output), by the formula in the crate documentation.
    pub compute_cycles: usize,
}

/// One layer of the datapath.
enum Layer {
    Linear {
        q: QLinear,
        n: usize,
        k: usize,
        rows: usize,
    },
    Conv {
        q: QConv2d,
        x: [usize; 3],
        n: usize,
        kh: usize,
        kw: usize,
        out: [usize; 2],
    },
    /// Max or mean pooling: one window value per cycle.
    Pool {
        q: QPool,
        x: [usize; 3],
        out: [usize; 2],
    },
    /// `qadd` of two values of `n` elements: one element per two cycles.
    Add { q: QAdd, n: usize },
}

fn dims(g: &Graph, id: NodeId) -> Vec<usize> {
    g.shape(id).static_dims().unwrap_or_default()
}

fn consts(g: &Graph, id: NodeId) -> Result<Vec<i64>> {
    match &g.node(id).op {
        Op::Constant { data } => Ok(Tensor::from_bytes(g.shape(id), data)?.i64s()),
        op => Err(Error::Invalid(format!(
            "the FPGA writer needs constant weights, {id} is {}",
            op.name()
        ))),
    }
}

fn bits_for(n: usize) -> usize {
    (usize::BITS - n.max(2).saturating_sub(1).leading_zeros()) as usize
}

/// Write `core` (batch 1) as SystemVerilog with `macs` MAC lanes (at least 1).
pub fn emit_sv(core: &IntegerCore, macs: usize) -> Result<SvModel> {
    let g = &core.graph;
    let p = macs.max(1);
    let mut unsupported = Vec::new();
    let mut layers: Vec<(NodeId, Layer)> = Vec::new();
    for id in g.ids() {
        let node = g.node(id);
        let def = match &node.op {
            Op::Input { .. } | Op::Constant { .. } | Op::Reshape { .. } => continue,
            Op::Defined(d) => d,
            op => {
                unsupported.push(format!("{id} ({} : {})", op.name(), node.shape));
                continue;
            }
        };
        let ins = &node.inputs;
        if let Some(q) = def.downcast::<QLinear>() {
            let wd = dims(g, ins[1]);
            let rows = node.shape.numel().unwrap_or(0) / wd[0].max(1);
            layers.push((
                id,
                Layer::Linear {
                    q: *q,
                    n: wd[0],
                    k: wd[1],
                    rows,
                },
            ));
        } else if let Some(q) = def.downcast::<QConv2d>() {
            let (xd, wd, od) = (dims(g, ins[0]), dims(g, ins[1]), dims(g, id));
            if xd[0] != 1 {
                unsupported.push(format!(
                    "{id} (qconv2d of batch {}; the datapath takes batch 1)",
                    xd[0]
                ));
                continue;
            }
            layers.push((
                id,
                Layer::Conv {
                    q: *q,
                    x: [xd[1], xd[2], xd[3]],
                    n: wd[0],
                    kh: wd[2],
                    kw: wd[3],
                    out: [od[2], od[3]],
                },
            ));
        } else if let Some(q) = def.downcast::<QAdd>() {
            layers.push((
                id,
                Layer::Add {
                    q: *q,
                    n: node.shape.numel().unwrap_or(0),
                },
            ));
        } else if let Some(q) = def.downcast::<QPool>() {
            let (xd, od) = (dims(g, ins[0]), dims(g, id));
            if xd[0] != 1 {
                unsupported.push(format!(
                    "{id} (qpool of batch {}; the datapath takes batch 1)",
                    xd[0]
                ));
                continue;
            }
            layers.push((
                id,
                Layer::Pool {
                    q: *q,
                    x: [xd[1], xd[2], xd[3]],
                    out: [od[2], od[3]],
                },
            ));
        } else {
            unsupported.push(format!("{id} ({} : {})", def.name(), node.shape));
        }
    }
    if !unsupported.is_empty() {
        return Err(Error::Invalid(format!(
            "the FPGA writer has no datapath for {} (it writes qlinear, qconv2d, qadd, qpool and reshape)",
            unsupported.join(", ")
        )));
    }
    let inputs = g.inputs();
    let [(_, x)] = inputs[..] else {
        return Err(Error::Invalid(format!(
            "the FPGA writer takes one input, graph \"{}\" has {}",
            g.name(),
            inputs.len()
        )));
    };
    let [y] = g.outputs()[..] else {
        return Err(Error::Invalid("the FPGA writer takes one output".into()));
    };
    if layers.is_empty() {
        return Err(Error::Invalid(
            "the FPGA writer needs at least one layer".into(),
        ));
    }
    // Values: reshapes share their operand's RAM.
    let mut root: Vec<NodeId> = g.ids().collect();
    for id in g.ids() {
        if matches!(g.node(id).op, Op::Reshape { .. }) {
            root[id.index()] = root[g.node(id).inputs[0].index()];
        }
    }
    let r = |id: NodeId| root[id.index()];
    let len = |id: NodeId| g.shape(id).numel().unwrap_or(0);
    let (input_len, output_len) = (len(x), len(y));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "// Generated by RLX from graph \"{}\": an int8 datapath with {p} MAC lane(s).\n\
         // Streams: input int8[{input_len}] (scale {:e}, zero point {}), output int8[{output_len}] (scale {:e}, zero point {}).",
        g.name(), core.input.0, core.input.1, core.output.0, core.output.1
    );
    s.push_str(
        "module rlx_model (\n    input  logic clk,\n    input  logic rst,\n    input  logic in_valid,\n    output logic in_ready,\n    input  logic [7:0] in_data,\n    output logic out_valid,\n    input  logic out_ready,\n    output logic [7:0] out_data\n);\n",
    );
    s.push_str(REQUANT_SV);
    // RAMs: the input, and each layer's result.
    let mut rams: Vec<NodeId> = vec![r(x)];
    rams.extend(layers.iter().map(|(id, _)| *id));
    let mut ram_bits = 0;
    for &v in &rams {
        let n = len(v);
        ram_bits += 8 * n;
        let a = bits_for(n);
        let _ = writeln!(
            s,
            "    // value {v}: int8[{n}]\n    logic [7:0] v{i} [0:{m}];\n    logic [{a1}:0] v{i}_ra, v{i}_wa;\n    logic [7:0] v{i}_q, v{i}_wd;\n    logic v{i}_we;\n    always_ff @(posedge clk) begin\n        v{i}_q <= v{i}[v{i}_ra];\n        if (v{i}_we) v{i}[v{i}_wa] <= v{i}_wd;\n    end",
            i = v.0,
            m = n.max(1) - 1,
            a1 = a - 1
        );
    }
    // ROMs.
    let mut rom_bits = 0;
    let mut compute_cycles = 0;
    for (li, (id, l)) in layers.iter().enumerate() {
        let ins = &g.node(*id).inputs;
        let (n, k, positions) = match l {
            Layer::Linear { n, k, rows, .. } => (*n, *k, *rows),
            Layer::Conv {
                x, n, kh, kw, out, ..
            } => (*n, x[0] * kh * kw, out[0] * out[1]),
            Layer::Pool { x, q, out } => {
                compute_cycles += x[0] * out[0] * out[1] * (q.kernel[0] * q.kernel[1] + 2) + 1;
                continue;
            }
            Layer::Add { n, .. } => {
                compute_cycles += 2 * n + 1;
                continue;
            }
        };
        let groups = n.div_ceil(p);
        compute_cycles += positions * groups * (k + p + 2) + 1;
        let w = consts(g, ins[1])?;
        let (bias, mult, shift) = (consts(g, ins[2])?, consts(g, ins[3])?, consts(g, ins[4])?);
        for lane in 0..p {
            let _ = writeln!(
                s,
                "    // layer {li} ({id}): weights of channels {lane} + {p}·g\n    logic [7:0] w{li}_{lane} [0:{m}];\n    logic [7:0] w{li}_{lane}_q;\n    initial begin",
                m = groups * k - 1
            );
            for gi in 0..groups {
                let ch = gi * p + lane;
                for kk in 0..k {
                    let v = if ch < n { w[ch * k + kk] } else { 0 };
                    let _ = writeln!(
                        s,
                        "        w{li}_{lane}[{}] = 8'h{:02x};",
                        gi * k + kk,
                        v as i8 as u8
                    );
                }
            }
            let _ = writeln!(s, "    end");
            rom_bits += 8 * groups * k;
        }
        for (name, vals) in [("b", &bias), ("m", &mult), ("s", &shift)] {
            let _ = writeln!(
                s,
                "    logic [31:0] {name}{li} [0:{}];\n    initial begin",
                n - 1
            );
            for (i, v) in vals.iter().enumerate() {
                let _ = writeln!(s, "        {name}{li}[{i}] = 32'h{:08x};", *v as i32 as u32);
            }
            let _ = writeln!(s, "    end");
            rom_bits += 32 * n;
        }
    }
    // Control: one state per layer between loading and sending.
    let nl = layers.len();
    let _ = writeln!(
        s,
        "    localparam S_LOAD = 0, S_SEND = {send}, S_HOLD = {hold};\n    localparam PH_MAC = 0, PH_DRAIN = 1, PH_REQ = 2;\n    logic [7:0] state;\n    logic [1:0] phase;\n    logic [15:0] pos0, pos1, pos2, grp, kf, k0, k1, k2, r, io;\n    logic mac_d, pad_d;\n    logic signed [31:0] acc [0:{pm}];\n    logic signed [31:0] best, psum, pcnt;",
        send = nl + 1,
        hold = nl + 2,
        pm = p - 1
    );
    // Read addresses and the datapath's operands, by state.
    s.push_str("    logic pad_now;\n    logic signed [8:0] x_c;\n    logic signed [31:0] zp_x;\n    logic signed [17:0] iy, ix;\n");
    for lane in 0..p {
        let _ = writeln!(s, "    logic signed [7:0] w_c{lane};");
    }
    s.push_str("    always_comb begin\n        pad_now = 1'b0;\n        zp_x = 0;\n        x_c = 0;\n        iy = 0;\n        ix = 0;\n");
    for &v in &rams {
        let _ = writeln!(s, "        v{}_ra = '0;", v.0);
    }
    for lane in 0..p {
        let _ = writeln!(s, "        w_c{lane} = 0;");
    }
    s.push_str("        case (state)\n");
    for (li, (id, l)) in layers.iter().enumerate() {
        let src = r(g.node(*id).inputs[0]).0;
        let _ = writeln!(s, "        {}: begin", li + 1);
        match l {
            Layer::Linear { q, k, .. } => {
                let _ = writeln!(
                    s,
                    "            v{src}_ra = pos0 * {k} + kf;\n            zp_x = {};",
                    q.x_zero_point
                );
            }
            Layer::Conv { q, x, .. } => {
                let _ = writeln!(
                    s,
                    "            iy = $signed({{2'b0, pos0}}) * {sh} + $signed({{2'b0, k1}}) - {pt};\n            ix = $signed({{2'b0, pos1}}) * {sw} + $signed({{2'b0, k2}}) - {pl};\n            pad_now = (iy < 0) || (iy >= {h}) || (ix < 0) || (ix >= {w});\n            v{src}_ra = pad_now ? '0 : (k0 * {h} + iy[15:0]) * {w} + ix[15:0];\n            zp_x = {zp};",
                    sh = q.stride[0], sw = q.stride[1], pt = q.padding[0].0, pl = q.padding[1].0,
                    h = x[1], w = x[2], zp = q.x_zero_point
                );
            }
            Layer::Add { .. } => {
                let b = r(g.node(*id).inputs[1]).0;
                let _ = writeln!(
                    s,
                    "            v{src}_ra = pos0;\n            v{b}_ra = pos0;"
                );
            }
            Layer::Pool { q, x, .. } => {
                let _ = writeln!(
                    s,
                    "            iy = $signed({{2'b0, pos1}}) * {sh} + $signed({{2'b0, k1}}) - {pt};\n            ix = $signed({{2'b0, pos2}}) * {sw} + $signed({{2'b0, k2}}) - {pl};\n            pad_now = (iy < 0) || (iy >= {h}) || (ix < 0) || (ix >= {w});\n            v{src}_ra = pad_now ? '0 : (pos0 * {h} + iy[15:0]) * {w} + ix[15:0];",
                    sh = q.stride[0], sw = q.stride[1], pt = q.padding[0].0, pl = q.padding[1].0,
                    h = x[1], w = x[2]
                );
            }
        }
        if matches!(l, Layer::Linear { .. } | Layer::Conv { .. }) {
            let _ = writeln!(
                s,
                "            x_c = $signed({{v{src}_q[7], v{src}_q}}) - $signed(zp_x[8:0]);"
            );
            for lane in 0..p {
                let _ = writeln!(s, "            w_c{lane} = w{li}_{lane}_q;");
            }
        }
        s.push_str("        end\n");
    }
    let _ = writeln!(
        s,
        "        {}, {}: v{}_ra = io;\n        default: ;\n        endcase\n    end",
        nl + 1,
        nl + 2,
        r(y).0
    );
    // ROM reads (synchronous), addressed by the group and the product index.
    s.push_str("    always_ff @(posedge clk) begin\n");
    for (li, (_, l)) in layers.iter().enumerate() {
        let k = match l {
            Layer::Linear { k, .. } => *k,
            Layer::Conv { x, kh, kw, .. } => x[0] * kh * kw,
            Layer::Pool { .. } | Layer::Add { .. } => continue,
        };
        for lane in 0..p {
            let _ = writeln!(s, "        w{li}_{lane}_q <= w{li}_{lane}[grp * {k} + kf];");
        }
    }
    s.push_str("    end\n");
    // The write ports: the input stream, and each layer's requantized results.
    s.push_str("    always_comb begin\n");
    for &v in &rams {
        let _ = writeln!(
            s,
            "        v{i}_we = 1'b0; v{i}_wa = '0; v{i}_wd = '0;",
            i = v.0
        );
    }
    let _ = writeln!(
        s,
        "        if (state == S_LOAD) begin v{i}_we = in_valid; v{i}_wa = io; v{i}_wd = in_data; end",
        i = r(x).0
    );
    for (li, (id, l)) in layers.iter().enumerate() {
        let v = id.0;
        match l {
            Layer::Linear { q, n, .. } => {
                let _ = writeln!(
                    s,
                    "        if (state == {st} && phase == PH_REQ && grp * {p} + r < {n}) begin\n            v{v}_we = 1'b1;\n            v{v}_wa = pos0 * {n} + grp * {p} + r;\n            v{v}_wd = rlx_requant(acc_r + $signed(b{li}[grp * {p} + r]), m{li}[grp * {p} + r], s{li}[grp * {p} + r], {zp}, {lo}, {hi});\n        end",
                    st = li + 1, zp = q.out.zero_point, lo = q.out.lo, hi = q.out.hi
                );
            }
            Layer::Conv { q, n, out, .. } => {
                let _ = writeln!(
                    s,
                    "        if (state == {st} && phase == PH_REQ && grp * {p} + r < {n}) begin\n            v{v}_we = 1'b1;\n            v{v}_wa = ((grp * {p} + r) * {ho} + pos0) * {wo} + pos1;\n            v{v}_wd = rlx_requant(acc_r + $signed(b{li}[grp * {p} + r]), m{li}[grp * {p} + r], s{li}[grp * {p} + r], {zp}, {lo}, {hi});\n        end",
                    st = li + 1, ho = out[0], wo = out[1], zp = q.out.zero_point, lo = q.out.lo, hi = q.out.hi
                );
            }
            Layer::Pool { q, out, .. } => {
                let value = match q.kind {
                    PoolKind::Max => "best[7:0]",
                    PoolKind::Mean => "rlx_mean(psum, pcnt)",
                };
                let _ = writeln!(
                    s,
                    "        if (state == {st} && phase == PH_REQ) begin\n            v{v}_we = 1'b1;\n            v{v}_wa = (pos0 * {ho} + pos1) * {wo} + pos2;\n            v{v}_wd = {value};\n        end",
                    st = li + 1, ho = out[0], wo = out[1]
                );
            }
            Layer::Add { q, .. } => {
                let ins = &g.node(*id).inputs;
                let (a, b) = (r(ins[0]).0, r(ins[1]).0);
                let part = |v: u32, zp: i32, (m, sh): (i32, i32)| {
                    format!(
                        "rlx_mbqm(($signed({{{{24{{v{v}_q[7]}}}}, v{v}_q}}) - {zp}) <<< {QADD_LEFT_SHIFT}, 32'h{:08x}, 32'h{:08x})",
                        m as u32, sh as u32
                    )
                };
                let _ = writeln!(
                    s,
                    "        if (state == {st} && phase == PH_REQ) begin\n            v{v}_we = 1'b1;\n            v{v}_wa = pos0;\n            v{v}_wd = rlx_requant({pa} + {pb}, 32'h{om:08x}, 32'h{os:08x}, {zp}, {lo}, {hi});\n        end",
                    st = li + 1,
                    pa = part(a, q.a_zero_point, q.a_scale),
                    pb = part(b, q.b_zero_point, q.b_scale),
                    om = q.out_scale.0 as u32,
                    os = q.out_scale.1 as u32,
                    zp = q.out.zero_point,
                    lo = q.out.lo,
                    hi = q.out.hi
                );
            }
        }
    }
    s.push_str("    end\n");
    // The accumulator the requantization unit reads: lane r.
    s.push_str("    logic signed [31:0] acc_r;\n    always_comb begin\n        acc_r = acc[0];\n");
    for lane in 1..p {
        let _ = writeln!(s, "        if (r == {lane}) acc_r = acc[{lane}];");
    }
    s.push_str("    end\n");
    let _ = writeln!(
        s,
        "    assign in_ready = (state == S_LOAD);\n    assign out_valid = (state == S_HOLD);\n    assign out_data = v{}_q;",
        r(y).0
    );
    // The sequencer.
    s.push_str("    always_ff @(posedge clk) begin\n        if (rst) begin\n            state <= S_LOAD; phase <= PH_MAC; io <= 0; mac_d <= 1'b0; pad_d <= 1'b0;\n            pos0 <= 0; pos1 <= 0; pos2 <= 0; grp <= 0; kf <= 0; k0 <= 0; k1 <= 0; k2 <= 0; r <= 0; best <= -128; psum <= 0; pcnt <= 0;\n");
    for lane in 0..p {
        let _ = writeln!(s, "            acc[{lane}] <= 0;");
    }
    let _ = writeln!(
        s,
        "        end else begin\n            case (state)\n            S_LOAD: if (in_valid) begin\n                io <= io + 1;\n                if (io == {last}) begin io <= 0; state <= 1; end\n            end",
        last = input_len - 1
    );
    for (li, (_, l)) in layers.iter().enumerate() {
        let st = li + 1;
        let _ = writeln!(s, "            {st}: begin");
        match l {
            Layer::Linear { n, k, rows, .. } => {
                emit_mac(&mut s, p, *n, &[*k], &[*rows], st + 1);
            }
            Layer::Conv {
                x, n, kh, kw, out, ..
            } => {
                emit_mac(&mut s, p, *n, &[x[0], *kh, *kw], &[out[0], out[1]], st + 1);
            }
            Layer::Pool { q, x, out } => {
                let src = format!("v{}", r(g.node(layers[li].0).inputs[0]).0);
                let val = format!("$signed({{{{24{{{src}_q[7]}}}}, {src}_q}})");
                // Take the value read last cycle into the window's max or sum and count.
                let (take, reset) = match q.kind {
                    PoolKind::Max => (format!("if ({val} > best) best <= {val};"), "best <= -128;"),
                    PoolKind::Mean => (
                        format!("begin psum <= psum + {val}; pcnt <= pcnt + 1; end"),
                        "psum <= 0; pcnt <= 0;",
                    ),
                };
                let _ = writeln!(
                    s,
                    "                case (phase)\n                PH_MAC: begin\n                    mac_d <= 1'b1; pad_d <= pad_now;\n                    if (mac_d && !pad_d) {take}\n                    if (k2 == {kw1}) begin k2 <= 0; if (k1 == {kh1}) begin k1 <= 0; phase <= PH_DRAIN; end else k1 <= k1 + 1; end else k2 <= k2 + 1;\n                end\n                PH_DRAIN: begin\n                    mac_d <= 1'b0;\n                    if (!pad_d) {take}\n                    phase <= PH_REQ;\n                end\n                default: begin\n                    {reset} phase <= PH_MAC;\n                    if (pos2 == {wo1}) begin pos2 <= 0; if (pos1 == {ho1}) begin pos1 <= 0; if (pos0 == {c1}) begin pos0 <= 0; state <= {next}; end else pos0 <= pos0 + 1; end else pos1 <= pos1 + 1; end else pos2 <= pos2 + 1;\n                end\n                endcase",
                    kh1 = q.kernel[0] - 1, kw1 = q.kernel[1] - 1,
                    ho1 = out[0] - 1, wo1 = out[1] - 1, c1 = x[0] - 1, next = st + 1
                );
            }
            Layer::Add { n, .. } => {
                // Read element pos0 of both operands; write the sum a cycle later.
                let _ = writeln!(
                    s,
                    "                if (phase == PH_MAC) phase <= PH_REQ;\n                else begin\n                    phase <= PH_MAC;\n                    if (pos0 == {last}) begin pos0 <= 0; state <= {next}; end else pos0 <= pos0 + 1;\n                end",
                    last = n - 1,
                    next = st + 1
                );
            }
        }
        s.push_str("            end\n");
    }
    let _ = writeln!(
        s,
        "            S_SEND: state <= S_HOLD;\n            S_HOLD: if (out_ready) begin\n                if (io == {last}) begin io <= 0; state <= S_LOAD; end\n                else begin io <= io + 1; state <= S_SEND; end\n            end\n            default: state <= S_LOAD;\n            endcase\n        end\n    end\nendmodule",
        last = output_len - 1
    );
    let out = s;
    Ok(SvModel {
        source: out,
        macs: p,
        input_len,
        output_len,
        rom_bits,
        ram_bits,
        compute_cycles,
    })
}

/// The sequencer of a MAC layer: output positions `pos` (outer, row-major over `positions`),
/// channel groups, then the products (`ks`, row-major) one per cycle, a drain cycle, and `p`
/// requantization cycles. Moves to the next state when done.
fn emit_mac(s: &mut String, p: usize, n: usize, ks: &[usize], positions: &[usize], next: usize) {
    let groups = n.div_ceil(p);
    let kf_last: usize = ks.iter().product::<usize>() - 1;
    // The product counters k0.. (row-major), kf the flat index.
    let kc = ["k0", "k1", "k2"];
    let mut adv = String::new();
    for (i, &d) in ks.iter().enumerate().rev() {
        let c = kc[i];
        let _ = write!(adv, "if ({c} == {}) begin {c} <= 0; ", d - 1);
    }
    // Close from the outermost: each level's else increments.
    let mut tail = String::new();
    for (i, _) in ks.iter().enumerate() {
        let _ = write!(tail, "end else {c} <= {c} + 1; ", c = kc[i]);
    }
    let pc = ["pos0", "pos1"];
    let mut padv = String::new();
    for (i, &d) in positions.iter().enumerate().rev() {
        let _ = write!(padv, "if ({c} == {}) begin {c} <= 0; ", d - 1, c = pc[i]);
    }
    let mut ptail = String::new();
    for (i, _) in positions.iter().enumerate() {
        let _ = write!(ptail, "end else {c} <= {c} + 1; ", c = pc[i]);
    }
    let zero_acc: String = (0..p).map(|l| format!("acc[{l}] <= 0; ")).collect();
    let add_acc: String = (0..p)
        .map(|l| format!("acc[{l}] <= acc[{l}] + (pad_d ? 32'sd0 : x_c * w_c{l}); "))
        .collect();
    let _ = writeln!(
        s,
        "                case (phase)\n                PH_MAC: begin\n                    mac_d <= 1'b1; pad_d <= pad_now;\n                    if (mac_d) begin {add_acc}end\n                    if (kf == {kf_last}) begin kf <= 0; phase <= PH_DRAIN; end else kf <= kf + 1;\n                    {adv}{tail}\n                end\n                PH_DRAIN: begin\n                    mac_d <= 1'b0;\n                    {add_acc}\n                    phase <= PH_REQ; r <= 0;\n                end\n                default: begin\n                    if (r == {pl}) begin\n                        r <= 0; phase <= PH_MAC; {zero_acc}\n                        if (grp == {gl}) begin grp <= 0; {padv}state <= {next}; {ptail}end else grp <= grp + 1;\n                    end else r <= r + 1;\n                end\n                endcase",
        pl = p - 1,
        gl = groups - 1
    );
}

/// The requantization unit: `rlx_ir::quant::fixed::multiply_by_quantized_multiplier` and
/// `requantize` as functions, and `QPool`'s rounded mean.
const REQUANT_SV: &str = r#"    // gemmlowp's rounding doubling high multiply, rounding right shift: TFLite's
    // MultiplyByQuantizedMultiplier.
    function automatic logic signed [31:0] rlx_mbqm(input logic signed [31:0] acc,
                                                    input logic [31:0] mult,
                                                    input logic [31:0] shift);
        logic signed [31:0] sh, m, xs, hi32, mask, rem, thr;
        logic signed [63:0] wide, ab, nudged, q;
        integer left, right;
        begin
            sh = $signed(shift);
            m = $signed(mult);
            left = sh > 0 ? sh : 0;
            right = sh > 0 ? 0 : -sh;
            wide = $signed({{32{acc[31]}}, acc}) <<< left;
            if (wide > 64'sh000000007fffffff) xs = 32'sh7fffffff;
            else if (wide < -64'sh0000000080000000) xs = 32'sh80000000;
            else xs = wide[31:0];
            if (xs == 32'sh80000000 && m == 32'sh80000000) hi32 = 32'sh7fffffff;
            else begin
                ab = $signed({{32{xs[31]}}, xs}) * $signed({{32{m[31]}}, m});
                nudged = ab + (ab >= 0 ? 64'sd1073741824 : 64'sd1 - 64'sd1073741824);
                // Division by 2^31 truncating toward zero.
                q = nudged >= 0 ? (nudged >>> 31) : -((-nudged) >>> 31);
                hi32 = q[31:0];
            end
            mask = (32'sd1 <<< right) - 1;
            rem = hi32 & mask;
            thr = (mask >>> 1) + (hi32 < 0 ? 32'sd1 : 32'sd0);
            rlx_mbqm = (hi32 >>> right) + (rem > thr ? 32'sd1 : 32'sd0);
        end
    endfunction
    // The scaled accumulator offset by the zero point and clamped: an int8 result.
    function automatic logic [7:0] rlx_requant(input logic signed [31:0] acc, input logic [31:0] mult,
                                               input logic [31:0] shift, input integer zp,
                                               input integer lo, input integer hi);
        logic signed [31:0] v;
        logic signed [63:0] vz;
        begin
            v = rlx_mbqm(acc, mult, shift);
            vz = $signed({{32{v[31]}}, v}) + zp;
            if (vz < lo) vz = lo;
            if (vz > hi) vz = hi;
            rlx_requant = vz[7:0];
        end
    endfunction
    // A window's mean: the sum divided by the elements counted, rounded half away from zero.
    function automatic logic [7:0] rlx_mean(input logic signed [31:0] sum, input logic signed [31:0] n);
        logic signed [31:0] q;
        begin
            if (n == 0) q = 0;
            else if (sum > 0) q = (sum + (n >>> 1)) / n;
            else q = (sum - (n >>> 1)) / n;
            rlx_mean = q[7:0];
        end
    endfunction
"#;
