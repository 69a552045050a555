//! RLX on microcontrollers: an int8 model as one self-contained C file for ARMv7E-M cores
//! (Cortex-M4, M7, M33, M55).
//!
//! [`emit_c`] takes the [`IntegerCore`] of a quantized graph (`rlx_opt::quant::integer_core` of
//! what `quant_propagate` made) and writes C with
//! - the weights, biases and requantization multipliers as `const` arrays (in flash),
//! - one static arena for the activations and the kernels' scratch, laid out by RLX's memory
//!   planner (`rlx_opt::plan_memory`: values whose lifetimes do not meet share bytes), no heap,
//! - the int8 kernels (`runtime.c`: `SMLAD` on pairs of 16-bit values where the compiler
//!   targets the DSP extension, with the requantization arithmetic of `rlx_ir::quant::fixed`),
//! - the entry point `void rlx_model_run(const int8_t *input, int8_t *output)`.
//!
//! The ops it writes are `qlinear`, `qconv2d`, `qadd`, `qpool` and `reshape`; any other op is an
//! error naming every such node. The same file builds for the host with any C compiler (plain C
//! products instead of `SMLAD`), which gives the same integers.

#![deny(missing_docs)]

use rlx_ir::eval::Tensor;
use rlx_ir::ops::{QAdd, QConv2d, QLinear, QPool};
use rlx_ir::{Error, Graph, NodeId, Op, PoolKind, Result};
use rlx_opt::quant::IntegerCore;
use rlx_opt::{plan_memory, BufferRequest};

pub mod qemu;
use std::fmt::Write;

/// The kernels every model file holds.
pub const RUNTIME_C: &str = include_str!("runtime.c");

/// A model written as C.
#[derive(Clone, Debug)]
pub struct CModel {
    /// The C source: kernels, constants, arena and `rlx_model_run`.
    pub source: String,
    /// Bytes of the static arena (activations and scratch).
    pub arena_bytes: usize,
    /// Bytes of the constant arrays (weights, biases, multipliers, shifts).
    pub constant_bytes: usize,
    /// Input elements (`int8`).
    pub input_len: usize,
    /// Output elements (`int8`).
    pub output_len: usize,
    /// The input's scale and zero point.
    pub input_quant: (f32, i32),
    /// The output's scale and zero point.
    pub output_quant: (f32, i32),
}

/// What a node of the core is, for the writer.
enum Step<'a> {
    Linear(&'a QLinear),
    Conv(&'a QConv2d),
    Add(&'a QAdd),
    Pool(&'a QPool),
}

fn step(g: &Graph, id: NodeId) -> Option<Step<'_>> {
    let Op::Defined(d) = &g.node(id).op else {
        return None;
    };
    d.downcast::<QLinear>()
        .map(Step::Linear)
        .or_else(|| d.downcast::<QConv2d>().map(Step::Conv))
        .or_else(|| d.downcast::<QAdd>().map(Step::Add))
        .or_else(|| d.downcast::<QPool>().map(Step::Pool))
}

fn dims(g: &Graph, id: NodeId) -> Vec<usize> {
    g.shape(id).static_dims().unwrap_or_default()
}

/// C's spelling of an `i64` (`INT32_MIN` needs care).
fn c_int(v: i64) -> String {
    if v == i32::MIN as i64 {
        "INT32_MIN".into()
    } else {
        v.to_string()
    }
}

/// Write `core` as C for a microcontroller (see the crate documentation): `rlx_model_run` is
/// the file's one external symbol; kernels, constants and the arena are `static`.
pub fn emit_c(core: &IntegerCore) -> Result<CModel> {
    let g = &core.graph;
    // Every node must be one the writer knows.
    let unsupported: Vec<String> = g
        .ids()
        .filter(|&id| {
            !matches!(
                g.node(id).op,
                Op::Input { .. } | Op::Constant { .. } | Op::Reshape { .. }
            ) && step(g, id).is_none()
        })
        .map(|id| format!("{id} ({} : {})", g.node(id).op.name(), g.shape(id)))
        .collect();
    if !unsupported.is_empty() {
        return Err(Error::Invalid(format!(
            "the Cortex-M writer has no kernel for {} (it writes qlinear, qconv2d, qadd, qpool and reshape)",
            unsupported.join(", ")
        )));
    }
    let inputs = g.inputs();
    let [(_, x)] = inputs[..] else {
        return Err(Error::Invalid(format!(
            "the Cortex-M writer takes one input, graph \"{}\" has {}",
            g.name(),
            inputs.len()
        )));
    };
    let [y] = g.outputs()[..] else {
        return Err(Error::Invalid(
            "the Cortex-M writer takes one output".into(),
        ));
    };

    // Values: each computed node (and the input) owns a buffer, reshapes alias their operand.
    let n = g.len();
    let mut root: Vec<NodeId> = g.ids().collect();
    for id in g.ids() {
        if matches!(g.node(id).op, Op::Reshape { .. }) {
            root[id.index()] = root[g.node(id).inputs[0].index()];
        }
    }
    let owns = |id: NodeId| root[id.index()] == id && (id == x || step(g, id).is_some());
    let mut start = vec![usize::MAX; n];
    let mut end = vec![0usize; n];
    for (t, id) in g.ids().enumerate() {
        if owns(id) {
            start[id.index()] = t;
            end[id.index()] = t;
        }
        for i in &g.node(id).inputs {
            let r = root[i.index()];
            end[r.index()] = end[r.index()].max(t);
        }
    }
    let yr = root[y.index()];
    end[yr.index()] = n;
    // Per step, the scratch row of int16 its products gather.
    let mut reqs = Vec::new();
    let mut slot = vec![usize::MAX; n];
    let mut scratch = vec![usize::MAX; n];
    for (t, id) in g.ids().enumerate() {
        if owns(id) {
            slot[id.index()] = reqs.len();
            reqs.push(BufferRequest {
                size: g.shape(id).numel().unwrap_or(0),
                start: start[id.index()],
                end: end[id.index()],
            });
        }
        let k = match step(g, id) {
            Some(Step::Linear(_)) => dims(g, g.node(id).inputs[1])[1],
            Some(Step::Conv(_)) => dims(g, g.node(id).inputs[1])[1..].iter().product(),
            _ => 0,
        };
        if k > 0 {
            scratch[id.index()] = reqs.len();
            reqs.push(BufferRequest {
                size: 2 * k,
                start: t,
                end: t,
            });
        }
    }
    let plan = plan_memory(&reqs, 4);

    let mut c = String::new();
    let _ = writeln!(
        c,
        "/* Generated by RLX from graph \"{}\": int8 inference for ARMv7E-M. */",
        g.name()
    );
    c.push_str(RUNTIME_C);
    let _ = writeln!(
        c,
        "\n/* Activations and scratch: {} bytes, laid out by RLX's memory planner. */",
        plan.arena_size
    );
    let _ = writeln!(
        c,
        "static int32_t rlx_arena[{}];\n#define rlx_mem ((int8_t *)rlx_arena)",
        plan.arena_size.div_ceil(4).max(1)
    );
    // Constants.
    let mut constant_bytes = 0;
    for id in g.ids() {
        let node = g.node(id);
        let Op::Constant { data } = &node.op else {
            continue;
        };
        let t = Tensor::from_bytes(&node.shape, data)?;
        let ty = match node.shape.dtype() {
            rlx_ir::DType::I8 => "int8_t",
            rlx_ir::DType::I32 => "int32_t",
            other => {
                return Err(Error::Invalid(format!(
                    "the Cortex-M writer takes int8 and int32 constants, {id} is {other}"
                )))
            }
        };
        constant_bytes += data.len();
        let vals: Vec<String> = t.i64s().into_iter().map(c_int).collect();
        let _ = write!(
            c,
            "static const {ty} rlx_c{} [{}] __attribute__((aligned(4))) = {{",
            id.0,
            vals.len().max(1)
        );
        for (i, v) in vals.iter().enumerate() {
            if i % 24 == 0 {
                c.push_str("\n    ");
            }
            c.push_str(v);
            c.push(',');
        }
        c.push_str("\n};\n");
    }
    let buf = |id: NodeId| -> String {
        let r = root[id.index()];
        if matches!(g.node(r).op, Op::Constant { .. }) {
            return format!("rlx_c{}", r.0);
        }
        format!("(rlx_mem + {})", plan.offsets[slot[r.index()]])
    };
    let scr = |id: NodeId| {
        format!(
            "(int16_t *)(rlx_mem + {})",
            plan.offsets[scratch[id.index()]]
        )
    };
    let input_len = g.shape(x).numel().unwrap_or(0);
    let output_len = g.shape(y).numel().unwrap_or(0);
    let _ = writeln!(
        c,
        "\n/* input: int8[{input_len}] (scale {:e}, zero point {}); output: int8[{output_len}] (scale {:e}, zero point {}). */",
        core.input.0, core.input.1, core.output.0, core.output.1
    );
    c.push_str("void rlx_model_run(const int8_t *input, int8_t *output) {\n");
    let _ = writeln!(c, "    memcpy({}, input, {input_len});", buf(x));
    for id in g.ids() {
        let ins = &g.node(id).inputs;
        let out = g.node(id).shape.clone();
        match step(g, id) {
            Some(Step::Linear(q)) => {
                let (wd, od) = (dims(g, ins[1]), dims(g, id));
                let rows: usize = od[..od.len() - 1].iter().product();
                let _ = writeln!(
                    c,
                    "    rlx_qlinear({}, {}, {}, {}, {}, {}, {rows}, {}, {}, {}, {}, {}, {}, {}); /* {id}: {out} */",
                    buf(ins[0]), buf(ins[1]), buf(ins[2]), buf(ins[3]), buf(ins[4]), buf(id),
                    wd[0], wd[1], q.x_zero_point, q.out.zero_point, q.out.lo, q.out.hi, scr(id)
                );
            }
            Some(Step::Conv(q)) => {
                let (xd, wd, od) = (dims(g, ins[0]), dims(g, ins[1]), dims(g, id));
                let _ = writeln!(
                    c,
                    "    rlx_qconv2d({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}); /* {id}: {out} */",
                    buf(ins[0]), buf(ins[1]), buf(ins[2]), buf(ins[3]), buf(ins[4]), buf(id),
                    xd[0], xd[1], xd[2], xd[3], wd[0], wd[2], wd[3], od[2], od[3],
                    q.stride[0], q.stride[1], q.padding[0].0, q.padding[1].0,
                    q.x_zero_point, q.out.zero_point, q.out.lo, q.out.hi, scr(id)
                );
            }
            Some(Step::Add(q)) => {
                let _ = writeln!(
                    c,
                    "    rlx_qadd({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}); /* {id}: {out} */",
                    buf(ins[0]), buf(ins[1]), buf(id), out.numel().unwrap_or(0),
                    q.a_zero_point, q.b_zero_point, c_int(q.a_scale.0 as i64), q.a_scale.1,
                    c_int(q.b_scale.0 as i64), q.b_scale.1, c_int(q.out_scale.0 as i64), q.out_scale.1,
                    q.out.zero_point, q.out.lo, q.out.hi
                );
            }
            Some(Step::Pool(q)) => {
                let (xd, od) = (dims(g, ins[0]), dims(g, id));
                let kind = match q.kind {
                    PoolKind::Max => 0,
                    PoolKind::Mean => 1,
                };
                let _ = writeln!(
                    c,
                    "    rlx_qpool({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {kind}); /* {id}: {out} */",
                    buf(ins[0]), buf(id), xd[0] * xd[1], xd[2], xd[3], od[2], od[3],
                    q.kernel[0], q.kernel[1], q.stride[0], q.stride[1], q.padding[0].0, q.padding[1].0
                );
            }
            None => {}
        }
    }
    let _ = writeln!(c, "    memcpy(output, {}, {output_len});\n}}", buf(y));
    Ok(CModel {
        source: c,
        arena_bytes: plan.arena_size,
        constant_bytes,
        input_len,
        output_len,
        input_quant: core.input,
        output_quant: core.output,
    })
}
