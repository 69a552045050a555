//! The CUDA C that RLX writes: a header of conversions and math helpers (no CUDA headers: f16
//! and bf16 go through bit manipulation, f16 to f32 on the device through one PTX `cvt`, so the
//! driver and `libnvrtc` are all a machine needs),
//! one generated kernel per elementwise body, and the fixed kernels (strided copy, gather,
//! scatter-add, reductions, softmax, cumsum, top-k, the tiled product).
//!
//! Every kernel is `extern "C" __global__ void k(const M m)` where `M` holds `N` 64-bit words
//! (`struct M { i64 w[N]; }`), filled at lowering: element counts, dims and strides, and the
//! device addresses of the values, fixed by the arena. Shapes that change the code (ranks,
//! which operands broadcast, the element type) are in the source; sizes are in the words, so one
//! kernel serves every step of the same kind.

use rlx_ir::{Activation, BinaryOp, CmpOp, DType, Graph, NodeId, Op, ReduceKind};

mod attention;
mod matvec;
mod mma;
pub use attention::{
    attention, attention_decode, ATTENTION_DECODE_WORDS, ATTENTION_KEYS, ATTENTION_MAX_D,
    ATTENTION_ROWS, ATTENTION_STAGE, ATTENTION_THREADS, ATTENTION_WORDS,
};
pub use matvec::{
    dequant_matvec, group_decoder, matvec_split, norm_fuses, DEQUANT_MATVEC_WORDS, MATVEC_GRID,
    MATVEC_STAGE, MATVEC_WARPS,
};
pub use mma::{dequant_mma, DEQUANT_MMA_WORDS, MMA_THREADS, MMA_TILE};

/// Threads per block of the one-thread-per-element kernels.
pub const BLOCK: u32 = 256;

/// The header every kernel starts with.
pub(crate) const HEADER: &str = r#"typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
#define INF_F32 __int_as_float(0x7f800000)
__device__ __forceinline__ float h2f(u16 h) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
    u32 s = ((u32)h & 0x8000u) << 16, e = ((u32)h >> 10) & 0x1fu, m = (u32)h & 0x3ffu;
    if (e == 0u) { float f = (float)m * 5.9604644775390625e-8f; return s ? -f : f; }
    if (e == 31u) return __uint_as_float(s | 0x7f800000u | (m << 13));
    return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}
__device__ __forceinline__ u16 f2h(float f) {
    u32 u = __float_as_uint(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (u16)(s | 0x7e00u);
    if (a >= 0x477ff000u) return (u16)(s | 0x7c00u);
    if (a >= 0x38800000u) return (u16)(s | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
    return (u16)(s | (u32)rintf(__uint_as_float(a) * 16777216.0f));
}
__device__ __forceinline__ float b2f(u16 h) { return __uint_as_float((u32)h << 16); }
__device__ __forceinline__ u16 f2b(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
    return (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float r16(float x) { return h2f(f2h(x)); }
__device__ __forceinline__ float rb16(float x) { return b2f(f2b(x)); }
__device__ __forceinline__ float rmaxf(float a, float b) { return (a >= b || a != a) ? a : b; }
__device__ __forceinline__ float rminf(float a, float b) { return (a <= b || a != a) ? a : b; }
__device__ __forceinline__ double rmax(double a, double b) { return (a >= b || a != a) ? a : b; }
__device__ __forceinline__ double rmin(double a, double b) { return (a <= b || a != a) ? a : b; }
__device__ __forceinline__ float sigmf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ __forceinline__ float geluuf(float x) { return 0.7978845608f * (x + 0.044715f * x * x * x); }
__device__ __forceinline__ double geluu(double x) { return 0.7978845608028654 * (x + 0.044715 * x * x * x); }
__device__ __forceinline__ float gelugf(float x) {
    float s = sigmf(2.0f * geluuf(x));
    return s * (1.0f + 2.0f * x * (1.0f - s) * 0.7978845608f * (1.0f + 0.134145f * x * x));
}
__device__ __forceinline__ double gelug(double x) {
    double s = sigm(2.0 * geluu(x));
    return s * (1.0 + 2.0 * x * (1.0 - s) * 0.7978845608028654 * (1.0 + 0.134145 * x * x));
}
__device__ __forceinline__ int sat_int(float x, float lo, float hi) {
    return x != x ? 0 : (int)fminf(fmaxf(x, lo), hi);
}
__device__ __forceinline__ int sat_intd(double x, double lo, double hi) {
    return x != x ? 0 : (int)fmin(fmax(x, lo), hi);
}
__device__ __forceinline__ int sat_i32(double x) {
    return x != x ? 0 : x >= 2147483647.0 ? 2147483647 : x <= -2147483648.0 ? (-2147483647 - 1) : (int)x;
}
__device__ __forceinline__ u32 sat_u32(double x) {
    return x != x ? 0u : x >= 4294967295.0 ? 4294967295u : x <= 0.0 ? 0u : (u32)x;
}
__device__ __forceinline__ i64 sat_i64(double x) {
    return x != x ? 0 : x >= 9223372036854775807.0 ? (i64)0x7fffffffffffffffull : x <= -9223372036854775808.0 ? (i64)0x8000000000000000ull : (i64)x;
}
"#;

/// The kernel's word struct and signature, then `body`.
pub(crate) fn kernel(words: usize, body: &str) -> String {
    format!(
        "{HEADER}struct M {{ i64 w[{n}]; }};\nextern \"C\" __global__ void k(const M m) {{\n{body}}}\n",
        n = words.max(1)
    )
}

/// A kernel of `words` words running `body` for each item `i` in `0..w[0]` (a grid-stride
/// loop): the form of registered kernels ([`crate::registered`]).
pub(crate) fn grid_kernel(words: usize, body: &str) -> String {
    kernel(words, &format!("{GRID_LOOP}{body}    }}\n"))
}

/// The loop of a one-thread-per-element kernel over `w[0]` items, numbered `i`.
const GRID_LOOP: &str =
    "    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < m.w[0]; i += (i64)gridDim.x * blockDim.x) {\n";

/// How values of a dtype are stored in device memory.
pub fn storage(dt: DType) -> Option<&'static str> {
    Some(match dt {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 => "u16",
        DType::I64 => "i64",
        DType::I32 => "int",
        DType::I16 => "short",
        DType::I8 => "signed char",
        DType::U32 => "u32",
        DType::U8 | DType::Bool => "unsigned char",
        DType::C64 => return None,
    })
}

/// The type values of a dtype are computed in.
pub fn compute(dt: DType) -> Option<&'static str> {
    Some(match dt {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        DType::F64 => "double",
        DType::I64 => "i64",
        DType::I32 | DType::I16 | DType::I8 => "int",
        DType::U32 | DType::U8 => "u32",
        DType::Bool => "bool",
        DType::C64 => return None,
    })
}

/// The value stored at `p` (an lvalue of [`storage`] type) as its [`compute`] type.
pub(crate) fn load(dt: DType, p: &str) -> String {
    match dt {
        DType::F16 => format!("h2f({p})"),
        DType::BF16 => format!("b2f({p})"),
        DType::Bool => format!("({p} != 0)"),
        DType::I16 | DType::I8 => format!("(int)({p})"),
        DType::U8 => format!("(u32)({p})"),
        DType::F32 | DType::F64 | DType::I64 | DType::I32 | DType::U32 | DType::C64 => {
            p.to_string()
        }
    }
}

/// Computed value `v` as the stored form of `dt`.
pub(crate) fn store(dt: DType, v: &str) -> String {
    match dt {
        DType::F16 => format!("f2h({v})"),
        DType::BF16 => format!("f2b({v})"),
        DType::Bool | DType::U8 => format!("(unsigned char)({v})"),
        DType::I8 => format!("(signed char)({v})"),
        DType::I16 => format!("(short)({v})"),
        DType::F32 | DType::F64 | DType::I64 | DType::I32 | DType::U32 | DType::C64 => {
            v.to_string()
        }
    }
}

/// `x` (of `dt`'s compute type) rounded or wrapped to `dt`, as the IR computes each node.
fn fit(dt: DType, x: String) -> String {
    match dt {
        DType::F16 => format!("r16({x})"),
        DType::BF16 => format!("rb16({x})"),
        DType::I8 => format!("(int)(signed char)({x})"),
        DType::I16 => format!("(int)(short)({x})"),
        DType::U8 => format!("(({x}) & 0xffu)"),
        DType::F32
        | DType::F64
        | DType::I64
        | DType::I32
        | DType::U32
        | DType::Bool
        | DType::C64 => x,
    }
}

/// Whether `dt` computes in `float` or `double`.
fn real(dt: DType) -> bool {
    matches!(compute(dt), Some("float") | Some("double"))
}

/// The C expression of a float binary op (`f`: the float suffix, "f" or "").
fn float_binary(op: BinaryOp, a: &str, b: &str, f: &str) -> String {
    match op {
        BinaryOp::Add => format!("({a} + {b})"),
        BinaryOp::Sub => format!("({a} - {b})"),
        BinaryOp::Mul => format!("({a} * {b})"),
        BinaryOp::Div => format!("({a} / {b})"),
        BinaryOp::Max => format!("rmax{f}({a}, {b})"),
        BinaryOp::Min => format!("rmin{f}({a}, {b})"),
        BinaryOp::Pow => format!("pow{f}({a}, {b})"),
    }
}

/// The C expression of an integer binary op on values of compute type `ty` (before wrapping):
/// wrapping arithmetic through the unsigned type, `x / 0` all bits set.
fn int_binary(op: BinaryOp, a: &str, b: &str, ty: &str) -> Option<String> {
    let (u, minus1) = match ty {
        "i64" => ("u64", "(i64)-1"),
        "int" => ("u32", "-1"),
        _ => ("u32", "0xffffffffu"),
    };
    Some(match op {
        BinaryOp::Add => format!("({ty})(({u}){a} + ({u}){b})"),
        BinaryOp::Sub => format!("({ty})(({u}){a} - ({u}){b})"),
        BinaryOp::Mul => format!("({ty})(({u}){a} * ({u}){b})"),
        BinaryOp::Div if ty == "u32" => format!("({b} == 0u ? {minus1} : {a} / {b})"),
        // i64::MIN / -1 wraps to i64::MIN (a C division would overflow).
        BinaryOp::Div if ty == "i64" => {
            format!("({b} == 0 ? {minus1} : ({b} == -1 ? (i64)(0ull - (u64){a}) : {a} / {b}))")
        }
        BinaryOp::Div => format!("({b} == 0 ? {minus1} : (int)((i64){a} / (i64){b}))"),
        BinaryOp::Max => format!("({a} > {b} ? {a} : {b})"),
        BinaryOp::Min => format!("({a} < {b} ? {a} : {b})"),
        BinaryOp::Pow => return None,
    })
}

/// The C expression of a float activation.
fn float_activation(act: Activation, x: &str, f: &str) -> String {
    let one = if f == "f" { "1.0f" } else { "1.0" };
    match act {
        Activation::Gelu => format!("(0.5{f} * {x} * erfc{f}(-{x} * 0.70710678118654752{f}))"),
        // 0.5 x (1 + tanh u) = x sigmoid(2u): no cancellation at negative x.
        Activation::GeluApprox => {
            let (s, u) = if f == "f" {
                ("sigmf", "geluuf")
            } else {
                ("sigm", "geluu")
            };
            format!("({x} * {s}(2.0{f} * {u}({x})))")
        }
        Activation::GeluApproxGrad => {
            format!("{}({x})", if f == "f" { "gelugf" } else { "gelug" })
        }
        Activation::Silu => format!("({x} / ({one} + exp{f}(-{x})))"),
        Activation::Relu => format!("fmax{f}({x}, 0.0{f})"),
        Activation::Sigmoid => format!("({one} / ({one} + exp{f}(-{x})))"),
        Activation::Tanh => format!("tanh{f}({x})"),
        Activation::Exp => format!("exp{f}({x})"),
        Activation::Log => format!("log{f}({x})"),
        Activation::Sqrt => format!("sqrt{f}({x})"),
        Activation::Rsqrt => format!("({one} / sqrt{f}({x}))"),
        Activation::Neg => format!("(-{x})"),
        Activation::Abs => format!("fabs{f}({x})"),
        Activation::Sin => format!("sin{f}({x})"),
        Activation::Cos => format!("cos{f}({x})"),
        Activation::Tan => format!("tan{f}({x})"),
        Activation::Atan => format!("atan{f}({x})"),
        Activation::Round => format!("rint{f}({x})"),
        Activation::Erf => format!("erf{f}({x})"),
    }
}

/// `x` (a value of `from`'s compute type) cast to `to` as the IR casts: floats to integers
/// toward zero, saturated, NaN to 0; integers wrap; to Bool is `!= 0`.
fn cast(from: DType, to: DType, x: &str) -> Option<String> {
    let (fc, tc) = (compute(from)?, compute(to)?);
    Some(match (fc, tc) {
        ("bool", "bool") => x.to_string(),
        (_, "bool") => format!("({x} != 0)"),
        ("bool", t) => fit(to, format!("({t})({x} ? 1 : 0)")),
        ("float" | "double", "float" | "double") => fit(to, format!("({tc})({x})")),
        ("float" | "double", _) => {
            let sat = if fc == "float" { "sat_int" } else { "sat_intd" };
            let d = if fc == "float" { "f" } else { "" };
            match to {
                DType::I8 => format!("{sat}({x}, -128.0{d}, 127.0{d})"),
                DType::I16 => format!("{sat}({x}, -32768.0{d}, 32767.0{d})"),
                DType::U8 => format!("(u32){sat}({x}, 0.0{d}, 255.0{d})"),
                DType::I32 => format!("sat_i32({x})"),
                DType::U32 => format!("sat_u32({x})"),
                DType::I64 => format!("sat_i64({x})"),
                DType::F32 | DType::F16 | DType::BF16 | DType::F64 | DType::Bool | DType::C64 => {
                    return None
                }
            }
        }
        (_, t) => fit(to, format!("({t})({x})")),
    })
}

/// The C expression of node `op` (result `out`, operands `a` of dtypes `ins`), or `None` when
/// the backend has no form for it.
pub(crate) fn expr(op: &Op, out: DType, a: &[String], ins: &[DType]) -> Option<String> {
    let f = |d: DType| {
        if compute(d) == Some("double") {
            ""
        } else {
            "f"
        }
    };
    let e = match op {
        Op::Binary(b) if real(out) => fit(out, float_binary(*b, &a[0], &a[1], f(out))),
        Op::Binary(b) if compute(out)? != "bool" => {
            fit(out, int_binary(*b, &a[0], &a[1], compute(out)?)?)
        }
        Op::Activation(act) if real(out) => fit(out, float_activation(*act, &a[0], f(out))),
        Op::Activation(act) if compute(out)? != "bool" => {
            let (x, ty) = (&a[0], compute(out)?);
            let u = if ty == "i64" { "u64" } else { "u32" };
            match (act, ty) {
                (Activation::Neg, _) => fit(out, format!("({ty})(0 - ({u}){x})")),
                (Activation::Abs, "u32") | (Activation::Relu, "u32") => x.clone(),
                (Activation::Abs, _) => {
                    fit(out, format!("({ty})({x} < 0 ? 0 - ({u}){x} : ({u}){x})"))
                }
                (Activation::Relu, _) => format!("({x} > 0 ? {x} : 0)"),
                _ => return None,
            }
        }
        Op::Compare(c) => {
            let o = match c {
                CmpOp::Eq => "==",
                CmpOp::Ne => "!=",
                CmpOp::Lt => "<",
                CmpOp::Le => "<=",
                CmpOp::Gt => ">",
                CmpOp::Ge => ">=",
            };
            compute(ins[0])?;
            format!("({} {o} {})", a[0], a[1])
        }
        Op::Where => format!("({} ? {} : {})", a[0], a[1], a[2]),
        Op::Cast { to } => cast(ins[0], *to, &a[0])?,
        _ => return None,
    };
    Some(e)
}

/// Whether node `op` (result `out`, operands `ins`) has a CUDA C form here.
pub fn elementwise_op(op: &Op, out: DType, ins: &[DType]) -> bool {
    let a: Vec<String> = (0..ins.len()).map(|k| format!("a{k}")).collect();
    compute(out).is_some()
        && ins.iter().all(|d| compute(*d).is_some())
        && expr(op, out, &a, ins).is_some()
}

/// How an operand of an elementwise kernel is indexed (part of the source).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Element `i` (dense, the result's shape).
    Dense,
    /// Element 0 (one element, broadcast).
    Scalar,
    /// Through the result's dims and the operand's strides (broadcast, or a view).
    Strided,
}

/// Words of an elementwise step of result rank `rank` and `operands` operands: `[n, out,
/// dims[rank], (addr, strides[rank]) per operand, further result addresses...]`.
pub fn elementwise_words(rank: usize, operands: usize, extra: usize) -> usize {
    2 + rank + operands * (1 + rank) + extra
}

/// The kernel of an elementwise `body` (its inputs: the operands, read as `access` says; its
/// outputs: result 0 at word 1, the others at the words after the operands'), over a result of
/// rank `rank`. `None` if an op of the body has no CUDA C form.
pub fn elementwise(body: &Graph, rank: usize, access: &[Access]) -> Option<String> {
    let ids: Vec<NodeId> = body.ids().collect();
    let n_ops = access.len();
    let mut s = String::from(GRID_LOOP);
    let mut name = vec![String::new(); body.len()];
    let mut k = 0;
    for &id in &ids {
        let n = body.node(id);
        let dt = n.shape.dtype();
        let ty = compute(dt)?;
        let e = match &n.op {
            Op::Input { .. } => {
                let acc = *access.get(k)?;
                let base = 2 + rank + k * (1 + rank);
                let at = match acc {
                    Access::Dense => "i".to_string(),
                    Access::Scalar => "0".to_string(),
                    Access::Strided => {
                        let mut w = String::from("(0");
                        // Index digits from the innermost axis out.
                        w.push_str(&format!(
                            "{})",
                            (0..rank)
                                .map(|d| format!(
                                    " + ((i / d{d}) % m.w[{}]) * m.w[{}]",
                                    2 + d,
                                    base + 1 + d
                                ))
                                .collect::<String>()
                        ));
                        w
                    }
                };
                k += 1;
                load(dt, &format!("(({}*)m.w[{base}])[{at}]", storage(dt)?))
            }
            op => {
                let a: Vec<String> = n.inputs.iter().map(|x| name[x.index()].clone()).collect();
                let ins: Vec<DType> = n.inputs.iter().map(|x| body.shape(*x).dtype()).collect();
                if ins.iter().any(|d| compute(*d).is_none()) {
                    return None;
                }
                expr(op, dt, &a, &ins)?
            }
        };
        s.push_str(&format!("        const {ty} v{} = {e};\n", id.0));
        name[id.index()] = format!("v{}", id.0);
    }
    if k != n_ops {
        return None;
    }
    // d{a}: the product of the result's dims after axis a (the divisor of its index digit).
    let mut pre = String::new();
    if access.contains(&Access::Strided) {
        for d in (0..rank).rev() {
            let e = if d + 1 == rank {
                "1".to_string()
            } else {
                format!("d{} * m.w[{}]", d + 1, 2 + d + 1)
            };
            pre.push_str(&format!("    const i64 d{d} = {e};\n"));
        }
    }
    for (r, o) in body.outputs().iter().enumerate() {
        let dt = body.shape(*o).dtype();
        let w = if r == 0 {
            1
        } else {
            elementwise_words(rank, n_ops, 0) + r - 1
        };
        s.push_str(&format!(
            "        (({}*)m.w[{w}])[i] = {};\n",
            storage(dt)?,
            store(dt, &name[o.index()])
        ));
    }
    s.push_str("    }\n");
    let words = elementwise_words(rank, n_ops, body.outputs().len() - 1);
    Some(kernel(words, &format!("{pre}{s}")))
}

/// The unsigned type of an element of `bytes` bytes.
pub(crate) fn word_type(bytes: usize) -> Option<&'static str> {
    Some(match bytes {
        1 => "unsigned char",
        2 => "u16",
        4 => "u32",
        8 => "u64",
        _ => return None,
    })
}

/// Words of a strided copy of rank `rank`: `[n, src, dst, dims[rank], src_strides[rank],
/// dst_strides[rank]]` (addresses in bytes, strides in elements).
pub fn copy_words(rank: usize) -> usize {
    3 + 3 * rank
}

/// A strided copy of elements of `bytes` bytes over `rank` dims.
pub fn copy(bytes: usize, rank: usize) -> Option<String> {
    let t = word_type(bytes)?;
    let mut s = String::new();
    s.push_str(GRID_LOOP);
    s.push_str("        i64 r = i, so = 0, dst = 0;\n");
    for d in (0..rank).rev() {
        s.push_str(&format!(
            "        {{ const i64 c = r % m.w[{dim}]; r /= m.w[{dim}]; so += c * m.w[{ss}]; dst += c * m.w[{ds}]; }}\n",
            dim = 3 + d,
            ss = 3 + rank + d,
            ds = 3 + 2 * rank + d
        ));
    }
    s.push_str(&format!(
        "        (({t}*)m.w[2])[dst] = ((const {t}*)m.w[1])[so];\n    }}\n"
    ));
    Some(kernel(copy_words(rank), &s))
}

/// Words of a gather over a result of rank `rank`: `[n, x, idx, out, len, axis_stride,
/// dims[rank], x_strides[rank], idx_strides[rank]]`.
pub fn gather_words(rank: usize) -> usize {
    6 + 3 * rank
}

/// `take(x, idx, axis)` for elements of `bytes` bytes and indices of dtype `idx` (clamped to
/// the axis, as the reference evaluator does): each result element walks the result's dims with
/// the strides of `x` (0 over the index dims) and of the indices (0 elsewhere).
pub fn gather(bytes: usize, idx: DType, rank: usize) -> Option<String> {
    let t = word_type(bytes)?;
    let it = storage(idx)?;
    if idx.is_float() || idx == DType::Bool {
        return None;
    }
    let mut s = String::from(GRID_LOOP);
    s.push_str("        i64 r = i, xo = 0, io = 0;\n");
    for d in (0..rank).rev() {
        s.push_str(&format!(
            "        {{ const i64 c = r % m.w[{dim}]; r /= m.w[{dim}]; xo += c * m.w[{xs}]; io += c * m.w[{is}]; }}\n",
            dim = 6 + d,
            xs = 6 + rank + d,
            is = 6 + 2 * rank + d
        ));
    }
    s.push_str(&format!(
        "        i64 row = (i64)((const {it}*)m.w[2])[io];\n        row = row < 0 ? 0 : (row >= m.w[4] ? m.w[4] - 1 : row);\n        (({t}*)m.w[3])[i] = ((const {t}*)m.w[1])[xo + row * m.w[5]];\n    }}\n"
    ));
    Some(kernel(gather_words(rank), &s))
}

/// Words of a scatter-add over a result of rank `rank`: `[n, x, u, idx, out, count, axis,
/// dims[rank], u_strides[rank]]`.
pub fn scatter_add_words(rank: usize) -> usize {
    7 + 2 * rank
}

/// `x` plus `u` added at rows `idx` (1-d) along an axis: each result element adds, in index
/// order, the updates whose index names its row (indices outside the axis add nothing).
pub fn scatter_add(out: DType, idx: DType, rank: usize) -> Option<String> {
    if out == DType::Bool || idx.is_float() || idx == DType::Bool {
        return None;
    }
    let (st, it) = (storage(out)?, storage(idx)?);
    // Floats add in their compute type; integers wrap, through i64.
    let (ct, add) = if real(out) {
        (compute(out)?, "acc += X")
    } else {
        ("i64", "acc = (i64)((u64)acc + (u64)(X))")
    };
    let mut s = String::from(GRID_LOOP);
    s.push_str("        i64 r = i, uo = 0, row = 0;\n");
    for d in (0..rank).rev() {
        s.push_str(&format!(
            "        {{ const i64 c = r % m.w[{dim}]; r /= m.w[{dim}]; if ({d} == m.w[6]) row = c; else uo += c * m.w[{us}]; }}\n",
            dim = 7 + d,
            us = 7 + rank + d
        ));
    }
    let x = load(out, &format!("((const {st}*)m.w[1])[i]"));
    let u = load(out, &format!("((const {st}*)m.w[2])[uo + j * us]"));
    let add = add.replace('X', &u);
    let val = fit(out, format!("({})acc", compute(out)?));
    s.push_str(&format!(
        "        {ct} acc = {x};\n        i64 us = 0;\n{pick}        for (i64 j = 0; j < m.w[5]; ++j) if ((i64)((const {it}*)m.w[3])[j] == row) {add};\n        (({st}*)m.w[4])[i] = {};\n    }}\n",
        store(out, &val),
        pick = (0..rank)
            .map(|d| format!("        if ({d} == m.w[6]) us = m.w[{}];\n", 7 + rank + d))
            .collect::<String>()
    ));
    Some(kernel(scatter_add_words(rank), &s))
}

/// Threads that reduce one row together: a warp, or a block of 256 for long rows.
pub fn row_threads(len: usize, rows: usize) -> u32 {
    if len >= 2048 && rows < 4096 {
        256
    } else {
        32
    }
}

/// Device code reducing `v` (a `ty`) over the `t` threads of a row with `op` (a C function or
/// operator applied as `op(a, b)`), leaving the result in every thread of the row; needs
/// `__shared__ ty sh[8]` when `t` is 256.
fn row_reduce(v: &str, t: u32, op: &str) -> String {
    let mut s = format!(
        "        for (int o = 16; o > 0; o >>= 1) {v} = {op}({v}, __shfl_xor_sync(0xffffffffu, {v}, o));\n"
    );
    if t == 256 {
        s.push_str(&format!(
            "        __syncthreads();\n        if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = {v};\n        __syncthreads();\n        {v} = sh[0];\n        for (int o = 1; o < 8; ++o) {v} = {op}({v}, sh[o]);\n",
        ));
    }
    s
}

/// The loop over the rows of a row kernel (`t` threads a row): `row` the row, `lane` the
/// thread's place in it; rows are `w[0]`.
fn row_loop(t: u32) -> String {
    if t == 256 {
        "    for (i64 row = blockIdx.x; row < m.w[0]; row += gridDim.x) {\n        const int lane = threadIdx.x;\n".to_string()
    } else {
        "    const int lane = threadIdx.x & 31;\n    for (i64 row = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; row < m.w[0]; row += ((i64)gridDim.x * blockDim.x) >> 5) {\n".to_string()
    }
}

/// Words of a reduction with `outer` kept and `inner` reduced axes: `[n_out, count, x, out,
/// outer_dims, outer_strides, inner_dims, inner_strides]` (strides of `x`, in elements).
pub fn reduce_words(outer: usize, inner: usize) -> usize {
    4 + 2 * outer + 2 * inner
}

/// The source offset of a digit walk: `idx` split over dims at word `dims` with strides at
/// word `strides` (`rank` of them), into `var`.
fn walk(var: &str, idx: &str, rank: usize, dims: usize, strides: usize) -> String {
    let mut s = format!("        i64 {var} = 0;\n        {{ i64 r = {idx};\n");
    for d in (0..rank).rev() {
        s.push_str(&format!(
            "          {{ const i64 c = r % m.w[{}]; r /= m.w[{}]; {var} += c * m.w[{}]; }}\n",
            dims + d,
            dims + d,
            strides + d
        ));
    }
    s.push_str("        }\n");
    s
}

/// A reduction of `kind` from `x` to `out` over `inner` axes (the `outer` others kept), `t`
/// threads per result ([`row_threads`]).
pub fn reduce(
    kind: ReduceKind,
    x: DType,
    out: DType,
    outer: usize,
    inner: usize,
    t: u32,
) -> Option<String> {
    if x == DType::Bool || out == DType::Bool {
        return None;
    }
    let acc = match compute(out)? {
        "float" | "double" => compute(out)?,
        _ => "i64",
    };
    let float = real(out);
    let f = if acc == "float" { "f" } else { "" };
    let (init, op) = match kind {
        ReduceKind::Sum | ReduceKind::Mean => ("0".to_string(), "radd"),
        ReduceKind::Prod => ("1".to_string(), "rmul"),
        ReduceKind::Max if float => ("-INF_F32".to_string(), "rmax"),
        ReduceKind::Min if float => ("INF_F32".to_string(), "rmin"),
        ReduceKind::Max => ("(i64)0x8000000000000000ull".into(), "imax"),
        ReduceKind::Min => ("(i64)0x7fffffffffffffffll".into(), "imin"),
    };
    let op = match op {
        "rmax" | "rmin" => format!("{op}{f}"),
        o => o.to_string(),
    };
    let funcs = if float {
        format!(
            "__device__ __forceinline__ {acc} radd({acc} a, {acc} b) {{ return a + b; }}\n__device__ __forceinline__ {acc} rmul({acc} a, {acc} b) {{ return a * b; }}\n"
        )
    } else {
        // Integer sums and products wrap.
        "__device__ __forceinline__ i64 radd(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }\n__device__ __forceinline__ i64 rmul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }\n__device__ __forceinline__ i64 imax(i64 a, i64 b) { return a > b ? a : b; }\n__device__ __forceinline__ i64 imin(i64 a, i64 b) { return a < b ? a : b; }\n".to_string()
    };
    let xs = storage(x)?;
    let mut s = String::new();
    if t == 256 {
        s.push_str(&format!("    __shared__ {acc} sh[8];\n"));
    }
    s.push_str(&row_loop(t));
    s.push_str(&walk("ob", "row", outer, 4, 4 + outer));
    let wi = 4 + 2 * outer;
    s.push_str(&format!(
        "        {acc} v = {init};\n        for (i64 j = lane; j < m.w[1]; j += {t}) {{\n"
    ));
    s.push_str(&walk("ib", "j", inner, wi, wi + inner).replace("        ", "            "));
    let xv = load(x, &format!("((const {xs}*)m.w[2])[ob + ib]"));
    s.push_str(&format!(
        "            v = {op}(v, ({acc})({xv}));\n        }}\n"
    ));
    s.push_str(&row_reduce("v", t, &op));
    let mut r = "v".to_string();
    if kind == ReduceKind::Mean {
        r = if float {
            format!("(v / ({acc})m.w[1])")
        } else {
            "(m.w[1] == 0 ? (i64)-1 : v / m.w[1])".into()
        };
    }
    let val = fit(out, format!("({})({r})", compute(out)?));
    s.push_str(&format!(
        "        if (lane == 0) (({}*)m.w[3])[row] = {};\n",
        storage(out)?,
        store(out, &val)
    ));
    if t == 256 {
        s.push_str("        __syncthreads();\n");
    }
    s.push_str("    }\n");
    let src = kernel(reduce_words(outer, inner), &s);
    Some(src.replacen("struct M", &format!("{funcs}struct M"), 1))
}

/// Words of a row kernel along an axis (softmax, cumsum): `[rows, len, x, out, inner]`: row
/// `r`'s element `j` is at `(r / inner) * len * inner + r % inner + j * inner` of a dense value.
pub const ROW_WORDS: usize = 5;

const ROW_BASE: &str =
    "        const i64 base = (row / m.w[4]) * m.w[1] * m.w[4] + row % m.w[4];\n";

/// Softmax along an axis, `t` threads a row (f32 arithmetic for f32/f16/bf16, f64 for f64).
pub fn softmax(dt: DType, t: u32) -> Option<String> {
    if !real(dt) {
        return None;
    }
    let (st, acc) = (storage(dt)?, compute(dt)?);
    let f = if acc == "float" { "f" } else { "" };
    let ld = |j: &str| load(dt, &format!("((const {st}*)m.w[2])[base + {j} * m.w[4]]"));
    let mut s = String::new();
    if t == 256 {
        s.push_str(&format!("    __shared__ {acc} sh[8];\n"));
    }
    s.push_str(&format!(
        "{}{ROW_BASE}        {acc} mx = -INF_F32;\n        for (i64 j = lane; j < m.w[1]; j += {t}) mx = rmax{f}(mx, {});\n",
        row_loop(t),
        ld("j")
    ));
    s.push_str(&row_reduce("mx", t, &format!("rmax{f}")));
    s.push_str(&format!(
        "        {acc} sum = 0;\n        for (i64 j = lane; j < m.w[1]; j += {t}) sum += exp{f}({} - mx);\n",
        ld("j")
    ));
    s.push_str(&row_reduce("sum", t, "radd"));
    s.push_str(&format!(
        "        for (i64 j = lane; j < m.w[1]; j += {t}) (({st}*)m.w[3])[base + j * m.w[4]] = {};\n",
        store(dt, &format!("(exp{f}({} - mx) / sum)", ld("j")))
    ));
    if t == 256 {
        s.push_str("        __syncthreads();\n");
    }
    s.push_str("    }\n");
    let src = kernel(ROW_WORDS, &s);
    Some(src.replacen(
        "struct M",
        &format!(
            "__device__ __forceinline__ {acc} radd({acc} a, {acc} b) {{ return a + b; }}\nstruct M"
        ),
        1,
    ))
}

/// Inclusive prefix sum along an axis: one thread a row, in order (as the CPU sums).
pub fn cumsum(dt: DType) -> Option<String> {
    if dt == DType::Bool {
        return None;
    }
    let (st, acc) = (storage(dt)?, if real(dt) { compute(dt)? } else { "i64" });
    let add = if real(dt) {
        "acc + x"
    } else {
        "(i64)((u64)acc + (u64)x)"
    };
    let x = load(dt, &format!("((const {st}*)m.w[2])[base + j * m.w[4]]"));
    let v = fit(dt, format!("({})acc", compute(dt)?));
    let s = format!(
        "    for (i64 row = blockIdx.x * (i64)blockDim.x + threadIdx.x; row < m.w[0]; row += (i64)gridDim.x * blockDim.x) {{\n{ROW_BASE}        {acc} acc = 0;\n        for (i64 j = 0; j < m.w[1]; ++j) {{\n            const {acc} x = ({acc})({x});\n            acc = {add};\n            (({st}*)m.w[3])[base + j * m.w[4]] = {};\n        }}\n    }}\n",
        store(dt, &v)
    );
    Some(kernel(ROW_WORDS, &s))
}

/// Words of top-k: `[rows, k, len, x, out]` (rows dense along the last axis).
pub const TOPK_WORDS: usize = 5;

/// Threads of a block of [`topk`].
pub const TOPK_THREADS: u32 = 256;

/// Top-k along the last axis, a block of [`TOPK_THREADS`] per row taking the results in `k`
/// passes: pass `t` finds, among the elements after result `t - 1` in descending order (NaN
/// largest, the lower index first among equals, as the reference evaluator sorts), the first,
/// each thread over every `TOPK_THREADS`-th element, then across the warp by shuffles and
/// across the block through shared memory. `k * len / 256` steps a thread instead of a thread a
/// result ranking every element against every other (`len²`). `indices`: the position (i32),
/// else the value.
pub fn topk(x: DType, indices: bool) -> Option<String> {
    if x == DType::Bool {
        return None;
    }
    let st = storage(x)?;
    // Keys in a type the shuffles take: doubles (NaN largest) or 64-bit integers.
    let (kt, key) = if real(x) {
        let v = load(x, "p[j]");
        (
            "double",
            format!("({v} != {v} ? (double)INF_F32 : (double)({v}))"),
        )
    } else {
        ("i64", "(i64)(p[j])".to_string())
    };
    let put = if indices {
        "((int*)m.w[4])[row * k + t] = (int)ci".to_string()
    } else {
        format!("(({st}*)m.w[4])[row * k + t] = p[ci]")
    };
    let warps = TOPK_THREADS / 32;
    let s = format!(
        r#"    __shared__ {kt} bk[{warps}];
    __shared__ i64 bi[{warps}];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i64 k = m.w[1], len = m.w[2];
    for (i64 row = blockIdx.x; row < m.w[0]; row += gridDim.x) {{
        const {st}* p = (const {st}*)m.w[3] + row * len;
        {kt} pk = 0;
        i64 pi = -1;
        for (i64 t = 0; t < k; ++t) {{
            {kt} ck = 0;
            i64 ci = -1;
            for (i64 j = threadIdx.x; j < len; j += {TOPK_THREADS}) {{
                const {kt} kj = {key};
                const bool after = pi < 0 || kj < pk || (kj == pk && j > pi);
                if (after && (ci < 0 || kj > ck)) {{ ck = kj; ci = j; }}
            }}
            for (int o = 16; o > 0; o >>= 1) {{
                const {kt} ok = __shfl_xor_sync(0xffffffffu, ck, o);
                const i64 oi = __shfl_xor_sync(0xffffffffu, ci, o);
                if (oi >= 0 && (ci < 0 || ok > ck || (ok == ck && oi < ci))) {{ ck = ok; ci = oi; }}
            }}
            if (lane == 0) {{ bk[warp] = ck; bi[warp] = ci; }}
            __syncthreads();
            ck = bk[0];
            ci = bi[0];
            for (int w = 1; w < {warps}; ++w) {{
                const {kt} ok = bk[w];
                const i64 oi = bi[w];
                if (oi >= 0 && (ci < 0 || ok > ck || (ok == ck && oi < ci))) {{ ck = ok; ci = oi; }}
            }}
            __syncthreads();
            if (ci < 0) break;
            if (threadIdx.x == 0) {put};
            pk = ck;
            pi = ci;
        }}
    }}
"#
    );
    Some(kernel(TOPK_WORDS, &s))
}

/// Tile edge of the product kernel.
pub const TILE: u32 = 16;

/// Words of a product with `batch` batch axes: `[m, k, n, a, b, c, batches, c_batch_dims,
/// a_batch_strides, b_batch_strides]` (batch strides in elements; 0 for broadcast axes).
pub fn matmul_words(batch: usize) -> usize {
    7 + 3 * batch
}

/// Batched `C = A B` (`[m, k] x [k, n]`) in 16×16 tiles of shared memory, accumulating in f32
/// (f64 for f64); block `(x, y)` computes tile `(y, x)`, `z` strides over the batches.
pub fn matmul(dt: DType, batch: usize) -> Option<String> {
    if !real(dt) {
        return None;
    }
    let (st, acc) = (storage(dt)?, compute(dt)?);
    let la = load(dt, "A[(i64)r * m.w[1] + c]");
    let lb = load(dt, "B[(i64)r2 * m.w[2] + c2]");
    let mut s = format!("    __shared__ {acc} ta[{TILE}][{TILE}], tb[{TILE}][{TILE}];\n");
    s.push_str(
        "    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;\n    const int row = blockIdx.y * 16 + ty, col = blockIdx.x * 16 + tx;\n    for (i64 z = blockIdx.z; z < m.w[6]; z += gridDim.z) {\n",
    );
    s.push_str(&walk("ao", "z", batch, 7, 7 + batch).replace("i64 ao = 0;", "i64 ao = 0, bo = 0;"));
    // The walk above computes only ao; bo from the same digits.
    let mut bo = String::from("        { i64 r = z;\n");
    for d in (0..batch).rev() {
        bo.push_str(&format!(
            "          {{ const i64 c = r % m.w[{}]; r /= m.w[{}]; bo += c * m.w[{}]; }}\n",
            7 + d,
            7 + d,
            7 + 2 * batch + d
        ));
    }
    bo.push_str("        }\n");
    s.push_str(&bo);
    s.push_str(&format!(
        "        const {st}* A = (const {st}*)m.w[3] + ao * m.w[0] * m.w[1];\n        const {st}* B = (const {st}*)m.w[4] + bo * m.w[1] * m.w[2];\n        {acc} acc = 0;\n        for (i64 t0 = 0; t0 < m.w[1]; t0 += 16) {{\n            {{ const i64 r = row, c = t0 + tx; ta[ty][tx] = (r < m.w[0] && c < m.w[1]) ? ({acc})({la}) : ({acc})0; }}\n            {{ const i64 r2 = t0 + ty, c2 = col; tb[ty][tx] = (r2 < m.w[1] && c2 < m.w[2]) ? ({acc})({lb}) : ({acc})0; }}\n            __syncthreads();\n            #pragma unroll\n            for (int q = 0; q < 16; ++q) acc += ta[ty][q] * tb[q][tx];\n            __syncthreads();\n        }}\n        if (row < m.w[0] && col < m.w[2]) (({st}*)m.w[5])[z * m.w[0] * m.w[2] + (i64)row * m.w[2] + col] = {};\n    }}\n",
        store(dt, "acc")
    ));
    Some(kernel(matmul_words(batch), &s))
}

/// Byte helpers of the GGUF decoders.
const BYTES: &str = r#"__device__ __forceinline__ u32 u16at(const unsigned char* b) { return (u32)b[0] | ((u32)b[1] << 8); }
__device__ __forceinline__ u32 u32at(const unsigned char* b) { return u16at(b) | (u16at(b + 2) << 16); }
__device__ __forceinline__ float f16at(const unsigned char* b) { return h2f((u16)u16at(b)); }
__device__ __forceinline__ u32 nib(const unsigned char* b, u32 j) { return j >= 16u ? ((u32)b[j - 16u] >> 4) : ((u32)b[j] & 0xfu); }
// Scale and min of sub-block j of a Q4_K / Q5_K block whose 12 scale bytes start at s.
__device__ __forceinline__ void scmin(const unsigned char* s, u32 j, u32* sc, u32* mn) {
    if (j < 4u) { *sc = s[j] & 63u; *mn = s[j + 4u] & 63u; return; }
    *sc = (s[j + 4u] & 0xfu) | ((u32)(s[j - 4u] >> 6) << 4);
    *mn = ((u32)s[j + 4u] >> 4) | ((u32)(s[j] >> 6) << 4);
}
"#;

/// CUDA C `deq(row, e)`: element `e` of the packed GGUF row starting at `row`, for every GGUF
/// block type (`None` for the other schemes).
pub fn gguf_decoder(scheme: rlx_ir::QuantScheme) -> Option<&'static str> {
    use rlx_ir::QuantScheme::*;
    Some(match scheme {
        GgufF16 => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { return f16at(row + e * 2u); }",
        GgufBF16 => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { return b2f((u16)u16at(row + e * 2u)); }",
        GgufQ4_0 => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 32u) * 18u; return ((float)nib(b + 2, e % 32u) - 8.0f) * f16at(b); }",
        GgufQ4_1 => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 32u) * 20u; return (float)nib(b + 4, e % 32u) * f16at(b) + f16at(b + 2); }",
        GgufQ5_0 => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 32u) * 22u; const u32 j = e % 32u; const u32 h = (u32at(b + 2) >> j) & 1u; return ((float)(nib(b + 6, j) | (h << 4)) - 16.0f) * f16at(b); }",
        GgufQ5_1 => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 32u) * 24u; const u32 j = e % 32u; const u32 h = (u32at(b + 4) >> j) & 1u; return (float)(nib(b + 8, j) | (h << 4)) * f16at(b) + f16at(b + 2); }",
        GgufQ8_0 => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 32u) * 34u; return (float)(signed char)b[2u + e % 32u] * f16at(b); }",
        // K-quants: 256 elements a block; element e sits in a sub-block with its own scale.
        GgufQ2K => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 256u) * 84u; const u32 w = e % 256u, h = w / 128u, j = (w % 128u) / 32u, r = w % 32u; const u32 sc = b[h * 8u + j * 2u + r / 16u]; const u32 q = ((u32)b[16u + h * 32u + r] >> (2u * j)) & 3u; return f16at(b + 80) * (float)(sc & 0xfu) * (float)q - f16at(b + 82) * (float)(sc >> 4); }",
        GgufQ3K => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 256u) * 110u; const u32 w = e % 256u, h = w / 128u, j = (w % 128u) / 32u, r = w % 32u; const u32 is = h * 8u + j * 2u + r / 16u; const unsigned char* s = b + 96; const u32 lo = is < 8u ? (s[is] & 0xfu) : ((u32)s[is - 8u] >> 4); const u32 hi = ((u32)s[8u + is % 4u] >> (2u * (is / 4u))) & 3u; const int sc = (int)(lo | (hi << 4)) - 32; const int q = (int)(((u32)b[32u + h * 32u + r] >> (2u * j)) & 3u) - ((((u32)b[r] >> (h * 4u + j)) & 1u) == 1u ? 0 : 4); return f16at(b + 108) * (float)sc * (float)q; }",
        GgufQ4K => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 256u) * 144u; const u32 w = e % 256u, c = w / 64u, hi = (w % 64u) / 32u, l = w % 32u; const u32 q = b[16u + c * 32u + l]; const u32 nb = hi == 1u ? q >> 4 : q & 0xfu; u32 sc, mn; scmin(b + 4, 2u * c + hi, &sc, &mn); return f16at(b) * (float)sc * (float)nb - f16at(b + 2) * (float)mn; }",
        GgufQ5K => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 256u) * 176u; const u32 w = e % 256u, c = w / 64u, hi = (w % 64u) / 32u, l = w % 32u; const u32 q = b[48u + c * 32u + l]; const u32 nb = (hi == 1u ? q >> 4 : q & 0xfu) + 16u * (((u32)b[16u + l] >> (2u * c + hi)) & 1u); u32 sc, mn; scmin(b + 4, 2u * c + hi, &sc, &mn); return f16at(b) * (float)sc * (float)nb - f16at(b + 2) * (float)mn; }",
        GgufQ6K => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 256u) * 210u; const u32 w = e % 256u, h = w / 128u, quad = (w % 128u) / 32u, l = w % 32u; const u32 ql = b[h * 64u + l + (quad & 1u) * 32u]; const u32 nb = quad >= 2u ? ql >> 4 : ql & 0xfu; const u32 qh = ((u32)b[128u + h * 32u + l] >> (2u * quad)) & 3u; const int q = (int)(nb | (qh << 4)) - 32; const int sc = (int)(signed char)b[192u + h * 8u + l / 16u + 2u * quad]; return f16at(b + 208) * (float)sc * (float)q; }",
        GgufQ8K => "__device__ __forceinline__ float deq(const unsigned char* row, u32 e) { const unsigned char* b = row + (e / 256u) * 292u; return __uint_as_float(u32at(b)) * (float)(signed char)b[4u + e % 256u]; }",
        _ => return None,
    })
}

/// Rows of `x` one warp of the quantized product computes: each decoded weight serves them all.
pub const QROWS: usize = 8;

/// Words of the quantized product: `[rows, k, n, x, w, row_bytes, out, tiles, sums]`.
pub const DEQUANT_MATMUL_WORDS: usize = 9;

/// For the block types whose weights carry an offset (Q4_1, Q5_1): `deq(row, e)` without it
/// and `mof(row, e)`, the offset of `e`'s block, which a product of rounded activations
/// multiplies by their block's `Q8_1` sum, as the CPU does (`None` for the others).
pub fn offset_decoder(scheme: rlx_ir::QuantScheme) -> Option<String> {
    let bytes = match scheme {
        rlx_ir::QuantScheme::GgufQ4_1 => 20,
        rlx_ir::QuantScheme::GgufQ5_1 => 24,
        _ => return None,
    };
    let full = gguf_decoder(scheme)?;
    let bare = full.replace(" + f16at(b + 2); }", "; }");
    (bare != full).then(|| {
        format!(
            "{bare}\n__device__ __forceinline__ float mof(const unsigned char* row, u32 e) {{ return f16at(row + (e / 32u) * {bytes}u + 2); }}"
        )
    })
}

/// `x [R, K] (f32) @ decode(w)^T` for packed GGUF rows `w [N, row_bytes]`: a warp per result
/// column and tile of [`QROWS`] rows; its lanes split the row's elements, each weight decoded
/// once for the tile's rows, and the warp's partial sums reduced by shuffles. `sums` (the
/// activations rounded to 32-blocks, a Q4_1 / Q5_1 product): each block's offset times the
/// rows' `Q8_1` block sums (word `sums`), as the CPU takes them, not in each weight.
pub fn dequant_matmul(scheme: rlx_ir::QuantScheme, out: DType, sums: bool) -> Option<String> {
    if !real(out) || out == DType::F64 {
        return None;
    }
    let dec = match sums {
        true => offset_decoder(scheme)?,
        false => gguf_decoder(scheme)?.to_string(),
    };
    let offsets = if sums {
        r#"            if (p % 32 == 0) {
                const float mo = mof(row, (u32)p);
                const float* sm = (const float*)m.w[8];
                #pragma unroll
                for (int t = 0; t < QROWS; ++t) if (t < cnt) acc[t] += mo * sm[(r0 + t) * (k / 32) + p / 32];
            }
"#
        .replace("QROWS", &QROWS.to_string())
    } else {
        String::new()
    };
    let st = storage(out)?;
    let val = store(out, &fit(out, "acc[t]".into()));
    let s = format!(
        r#"    const int lane = threadIdx.x & 31;
    const i64 rows = m.w[0], k = m.w[1], n = m.w[2];
    const float* x = (const float*)m.w[3];
    for (i64 item = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; item < m.w[7] * n; item += ((i64)gridDim.x * blockDim.x) >> 5) {{
        const i64 j = item % n, r0 = (item / n) * {QROWS};
        const int cnt = rows - r0 < {QROWS} ? (int)(rows - r0) : {QROWS};
        const unsigned char* row = (const unsigned char*)m.w[4] + j * m.w[5];
        float acc[{QROWS}];
        #pragma unroll
        for (int t = 0; t < {QROWS}; ++t) acc[t] = 0.0f;
        for (i64 p = lane; p < k; p += 32) {{
            const float w = deq(row, (u32)p);
            #pragma unroll
            for (int t = 0; t < {QROWS}; ++t) if (t < cnt) acc[t] += x[(r0 + t) * k + p] * w;
{offsets}        }}
        #pragma unroll
        for (int t = 0; t < {QROWS}; ++t) {{
            for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
            if (lane == 0 && t < cnt) (({st}*)m.w[6])[(r0 + t) * n + j] = {val};
        }}
    }}
"#
    );
    let src = kernel(DEQUANT_MATMUL_WORDS, &s);
    Some(src.replacen("struct M", &format!("{BYTES}{dec}\nstruct M"), 1))
}

/// Words of a norm: `[rows, d, x, gamma, beta, out, eps_bits]` (`beta` 0 for RMSNorm).
pub const NORM_WORDS: usize = 7;

/// LayerNorm (`rms` false) or RMSNorm over the last axis of `x [rows, d]`, `t` threads a row
/// ([`row_threads`]): the mean and the variance summed across the row's threads, computed in
/// f32 and rounded to the result's dtype once.
pub fn norm(
    x: DType,
    gamma: DType,
    beta: Option<DType>,
    out: DType,
    rms: bool,
    t: u32,
) -> Option<String> {
    // Computed in f32: f64 norms run as their decomposition.
    let f32ish = |d: DType| real(d) && d != DType::F64;
    if !f32ish(x)
        || !f32ish(gamma)
        || !f32ish(out)
        || beta.is_some_and(|b| !f32ish(b))
        || rms == beta.is_some()
    {
        return None;
    }
    let (xs, gs, os) = (storage(x)?, storage(gamma)?, storage(out)?);
    let xv = format!("(float)({})", load(x, "xr[e]"));
    let gv = format!(
        "(float)({})",
        load(gamma, "((const GS*)m.w[3])[e]".replace("GS", gs).as_str())
    );
    let bv = match beta {
        Some(b) => format!(
            " + (float)({})",
            load(b, &format!("((const {}*)m.w[4])[e]", storage(b)?))
        ),
        None => String::new(),
    };
    let y = store(out, &fit(out, format!("(({xv}) - mean) * inv * {gv}{bv}")));
    let mut s = String::new();
    if t == 256 {
        s.push_str("    __shared__ float sh[8];\n");
    }
    s.push_str(&row_loop(t));
    s.push_str(&format!(
        "        const i64 d = m.w[1];\n        const {xs}* xr = (const {xs}*)m.w[2] + row * d;\n        float mean = 0.0f;\n"
    ));
    if !rms {
        s.push_str(&format!(
            "        for (i64 e = lane; e < d; e += {t}) mean += {xv};\n"
        ));
        s.push_str(&row_reduce("mean", t, "radd"));
        s.push_str("        mean = mean / (float)d;\n");
    }
    s.push_str(&format!(
        "        float v = 0.0f;\n        for (i64 e = lane; e < d; e += {t}) {{ const float c = {xv} - mean; v += c * c; }}\n"
    ));
    s.push_str(&row_reduce("v", t, "radd"));
    s.push_str(&format!(
        "        const float inv = 1.0f / sqrtf(v / (float)d + __int_as_float((int)m.w[6]));\n        for (i64 e = lane; e < d; e += {t}) (({os}*)m.w[5])[row * d + e] = {y};\n"
    ));
    if t == 256 {
        s.push_str("        __syncthreads();\n");
    }
    s.push_str("    }\n");
    let src = kernel(NORM_WORDS, &s);
    Some(src.replacen(
        "struct M",
        "__device__ __forceinline__ float radd(float a, float b) { return a + b; }\nstruct M",
        1,
    ))
}

/// Words of rotary embedding: `[pairs, s, half, x, pos, out, theta_bits, interleaved, at,
/// row, t]`; the last three for a rotation written into a cache (`at`: where the cache
/// write's position is; `row`, `t`: the cache's row length and rows), 0 otherwise.
pub const ROPE_WORDS: usize = 11;

/// Rotary position embedding of `x [..., S, D]` at `positions [S]`, a thread per rotated pair:
/// pair `k` of row `s` turns by `pos[s] * theta^(-2k/D)` (the frequency computed in f64 and
/// rounded to f32, as the decomposition's constant table is), pairs `(k, k + D/2)` or, with
/// `interleaved`, `(2k, 2k + 1)`. With `cache` (`x` f32), the rotated values go into a KV cache
/// of that dtype instead, as `CacheWrite` writes them there (element `e` of the result at
/// element `e` of the cache from row `max(at, 0)` on, rows past the cache dropped), so a
/// rotation whose only reader is a cache write takes no launch of its own.
pub fn rope(dt: DType, pos: DType, cache: Option<DType>) -> Option<String> {
    if !real(dt) || dt == DType::F64 || pos == DType::Bool {
        return None;
    }
    if cache.is_some_and(|c| !real(c)) || (cache.is_some() && dt != DType::F32) {
        return None;
    }
    let (st, ps) = (storage(dt)?, storage(pos)?);
    let (a, b) = (load(dt, "xp[ia]"), load(dt, "xp[ib]"));
    let (out, oa, ob, at) = match cache {
        None => (
            st,
            store(dt, &fit(dt, "fa * c - fb * sn".into())),
            store(dt, &fit(dt, "fa * sn + fb * c".into())),
            String::new(),
        ),
        Some(c) => (
            storage(c)?,
            store(c, &format!("({})(fa * c - fb * sn)", compute(c)?)),
            store(c, &format!("({})(fa * sn + fb * c)", compute(c)?)),
            format!(
                "        const i64 at0 = (i64)((const {ps}*)m.w[8])[0], at = at0 < 0 ? 0 : at0;\n        if (at + ia / m.w[9] >= m.w[10] || at + ib / m.w[9] >= m.w[10]) continue;\n"
            ),
        ),
    };
    let base = if cache.is_some() {
        " + at * m.w[9]"
    } else {
        ""
    };
    Some(kernel(
        ROPE_WORDS,
        &format!(
            r#"{GRID_LOOP}        const i64 half = m.w[2], kk = i % half, row = i / half, srow = row % m.w[1];
        const float freq = (float)pow((double)__int_as_float((int)m.w[6]), -2.0 * (double)kk / (double)(2 * half));
        const float ang = (float)(((const {ps}*)m.w[4])[srow]) * freq;
        const float c = cosf(ang), sn = sinf(ang);
        const i64 ia = m.w[7] ? row * 2 * half + 2 * kk : row * 2 * half + kk;
        const i64 ib = m.w[7] ? ia + 1 : ia + half;
{at}        const {st}* xp = (const {st}*)m.w[3];
        const float fa = (float)({a}), fb = (float)({b});
        {out}* o = ({out}*)m.w[5]{base};
        o[ia] = {oa};
        o[ib] = {ob};
    }}
"#
        ),
    ))
}

/// Words of the activation rounding: `[blocks, x, out, sums]` (`sums` 0: none written).
pub const QUANTIZE_ACTS_WORDS: usize = 4;

/// Activations (f32) rounded to int8 blocks of `blk` and back, a thread per block, as the CPU
/// rounds them (llama.cpp's rule): blocks of 32 (`Q8_0`): `d = amax / 127` rounded to f16,
/// `q = round_even(x * 127 / amax)`; blocks of 256 (`Q8_K`): `q = min(round_even(x * -127 /
/// m), 127)` with `m` the first element of largest magnitude, `d = m / -127`. The result is
/// `d * q`; for blocks of 32, where the `sums` word asks, also each block's `d * sum(q)` with
/// `d` unrounded, rounded to f16 (`Q8_1`'s sum, which the CPU multiplies by `Q4_1` / `Q5_1`
/// blocks' offsets).
pub fn quantize_acts(blk: usize) -> Option<String> {
    let body = match blk {
        32 => {
            r#"        float amax = 0.0f;
        for (int e = 0; e < 32; ++e) amax = fmaxf(amax, fabsf(x[e]));
        const float d = r16(amax / 127.0f);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        float qs = 0.0f;
        for (int e = 0; e < 32; ++e) { const float q = rintf(x[e] * id); o[e] = d * q; qs += q; }
        if (m.w[3] != 0) ((float*)m.w[3])[i] = r16(amax / 127.0f * qs);
"#
        }
        256 => {
            r#"        float amax = 0.0f, mx = 0.0f;
        for (int e = 0; e < 256; ++e) { const float v = x[e]; if (fabsf(v) > amax) { amax = fabsf(v); mx = v; } }
        if (amax == 0.0f) { for (int e = 0; e < 256; ++e) o[e] = 0.0f; continue; }
        const float iscale = -127.0f / mx;
        const float d = 1.0f / iscale;
        for (int e = 0; e < 256; ++e) o[e] = d * fminf(rintf(iscale * x[e]), 127.0f);
"#
        }
        _ => return None,
    };
    Some(kernel(
        QUANTIZE_ACTS_WORDS,
        &format!(
            "{GRID_LOOP}        const float* x = (const float*)m.w[1] + i * {blk};\n        float* o = (float*)m.w[2] + i * {blk};\n{body}    }}\n"
        ),
    ))
}

/// Words of packed rows decoded: `[n, k, row_bytes, w, out]`.
pub const DEQUANTIZE_ROWS_WORDS: usize = 5;

/// Packed GGUF rows decoded, a thread per element.
pub fn dequantize_rows(scheme: rlx_ir::QuantScheme, out: DType) -> Option<String> {
    if !real(out) {
        return None;
    }
    let dec = gguf_decoder(scheme)?;
    let st = storage(out)?;
    let v = store(
        out,
        &fit(
            out,
            format!(
                "({})deq((const unsigned char*)m.w[3] + (i / m.w[1]) * m.w[2], (u32)(i % m.w[1]))",
                compute(out)?
            ),
        ),
    );
    let src = kernel(
        DEQUANTIZE_ROWS_WORDS,
        &format!("{GRID_LOOP}        (({st}*)m.w[4])[i] = {v};\n    }}\n"),
    );
    Some(src.replacen("struct M", &format!("{BYTES}{dec}\nstruct M"), 1))
}

/// Words of a cache write: `[n_upd, row, T, cache, upd, pos, slots]` (`slots` 1: the third
/// operand holds a cache row per update row, else one position).
pub const CACHE_WRITE_WORDS: usize = 7;

/// Rows of `upd [S, row]` into the cache `[T, row]` in place: from position `pos` (a negative
/// one counting as 0), or at rows `slots[i]`; rows outside the cache are dropped.
pub fn cache_write(cache: DType, upd: DType, pos: DType) -> Option<String> {
    if !real(cache) || !real(upd) || pos.is_float() || pos == DType::Bool {
        return None;
    }
    let (cs, us, ps) = (storage(cache)?, storage(upd)?, storage(pos)?);
    let u = load(upd, &format!("((const {us}*)m.w[4])[i]"));
    let v = store(cache, &format!("({})({u})", compute(cache)?));
    Some(kernel(
        CACHE_WRITE_WORDS,
        &format!(
            r#"{GRID_LOOP}        const {ps}* p = (const {ps}*)m.w[5];
        i64 r;
        if (m.w[6]) r = (i64)p[i / m.w[1]];
        else {{ const i64 at = (i64)p[0]; r = (at < 0 ? 0 : at) + i / m.w[1]; }}
        if (r < 0 || r >= m.w[2]) continue;
        (({cs}*)m.w[3])[r * m.w[1] + i % m.w[1]] = {v};
    }}
"#
        ),
    ))
}

/// Words of cached attention's steps: scores `[S*Hq*T, hq, d, t, hkv, q, k, pos, scores,
/// window, scale_bits]`; weights `[S*Hq, t, scores]` (a row kernel); values `[S*Hq*Dv, hq, dv,
/// t, hkv, v, weights, out]`.
pub const ATTENTION_SCORES_WORDS: usize = 11;

/// Cached attention, step 1, a score per thread, or with `warp` (few query rows: decode) a
/// warp per score whose lanes split the head dimension, so each key row is read in one
/// stretch: query row `i` of `q [S, Hq, D]` sees cache rows
/// `first ..= pos + i` (inside the window) of `k [T, Hkv, D]` (heads grouped); masked keys score
/// -inf. Queries are rounded to the cache's dtype first (the CPU's arithmetic for f16 / bf16
/// caches).
pub fn attention_scores(q: DType, cache: DType, pos: DType, warp: bool) -> Option<String> {
    if !real(q) || !real(cache) || pos.is_float() || pos == DType::Bool {
        return None;
    }
    let (qs, ks, ps) = (storage(q)?, storage(cache)?, storage(pos)?);
    let qv = fit(cache, format!("(float)({})", load(q, "qp[e]")));
    let kv = load(cache, "kp[e]");
    // Score `i`: its key `j`, head `h` and query row `qi`, the keys the row sees, and the rows.
    let (lane, head, masked, dot) = if warp {
        (
            "    const int lane = threadIdx.x & 31;\n    for (i64 i = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5; i < m.w[0]; i += ((i64)gridDim.x * blockDim.x) >> 5) {\n",
            "",
            "if (lane == 0) sc[i] = -INF_F32; continue;",
            "for (i64 e = lane; e < d; e += 32) s += QV * (float)(KV);\n        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);\n        if (lane == 0) ",
        )
    } else {
        (
            "",
            GRID_LOOP,
            "sc[i] = -INF_F32; continue;",
            "for (i64 e = 0; e < d; ++e) s += QV * (float)(KV);\n        ",
        )
    };
    let dot = dot.replace("QV", &qv).replace("KV", &kv);
    Some(kernel(
        ATTENTION_SCORES_WORDS,
        &format!(
            r#"{lane}{head}        const i64 hq = m.w[1], d = m.w[2], t = m.w[3], hkv = m.w[4];
        const i64 j = i % t, h = (i / t) % hq, qi = i / (t * hq);
        const i64 at = (i64)((const {ps}*)m.w[7])[0];
        const i64 pos = at < 0 ? 0 : at;
        const i64 last = pos + qi < t - 1 ? pos + qi : t - 1;
        const i64 first = (m.w[9] > 0 && last + 1 > m.w[9]) ? last + 1 - m.w[9] : 0;
        float* sc = (float*)m.w[8];
        if (j < first || j > last) {{ {masked} }}
        const {qs}* qp = (const {qs}*)m.w[5] + (qi * hq + h) * d;
        const {ks}* kp = (const {ks}*)m.w[6] + (j * hkv + h / (hq / hkv)) * d;
        float s = 0.0f;
        {dot}sc[i] = s * __int_as_float((int)m.w[10]);
    }}
"#
        ),
    ))
}

/// Cached attention, step 2: each row of scores becomes its softmax weights (rounded to the
/// cache's dtype), in place; `t` threads a row ([`row_threads`]).
pub fn attention_weights(cache: DType, t: u32) -> Option<String> {
    if !real(cache) {
        return None;
    }
    // A row that sees no position (paged attention) has weights 0.
    let w = fit(
        cache,
        "(mx == -INF_F32 ? 0.0f : expf(r[j] - mx) / sum)".into(),
    );
    let mut s = String::new();
    if t == 256 {
        s.push_str("    __shared__ float sh[8];\n");
    }
    s.push_str(&format!(
        "{}        float* r = (float*)m.w[2] + row * m.w[1];\n        float mx = -INF_F32;\n        for (i64 j = lane; j < m.w[1]; j += {t}) mx = rmaxf(mx, r[j]);\n",
        row_loop(t)
    ));
    s.push_str(&row_reduce("mx", t, "rmaxf"));
    s.push_str(&format!(
        "        float sum = 0.0f;\n        for (i64 j = lane; j < m.w[1]; j += {t}) sum += expf(r[j] - mx);\n"
    ));
    s.push_str(&row_reduce("sum", t, "radd"));
    if t == 256 {
        s.push_str("        __syncthreads();\n");
    }
    s.push_str(&format!(
        "        for (i64 j = lane; j < m.w[1]; j += {t}) r[j] = {w};\n"
    ));
    if t == 256 {
        s.push_str("        __syncthreads();\n");
    }
    s.push_str("    }\n");
    let src = kernel(3, &s);
    Some(src.replacen(
        "struct M",
        "__device__ __forceinline__ float radd(float a, float b) { return a + b; }\nstruct M",
        1,
    ))
}

/// Words of step 3.
pub const ATTENTION_VALUES_WORDS: usize = 8;

/// Cached attention, step 3: the weighted sum of the value rows, a block of `threads` (256 or
/// 1024: few query rows, as in decode) per query row and head. Rows narrower than `threads`:
/// `threads / Dv` groups of `Dv` threads (one per result column), each group taking every
/// `threads / Dv`-th key, their sums added in group order through shared memory; wider rows: a
/// thread per column over every key. Keys weighing exactly 0 (masked) are not read.
pub fn attention_values(cache: DType, out: DType, threads: u32) -> Option<String> {
    if !real(cache) || !real(out) || !matches!(threads, 256 | 1024) {
        return None;
    }
    let (vs, os) = (storage(cache)?, storage(out)?);
    let vv = load(cache, "vp[j * hkv * dv]");
    let val = store(out, &fit(out, "s".into()));
    Some(kernel(
        ATTENTION_VALUES_WORDS,
        &format!(
            r#"    __shared__ float sh[{threads}];
    const i64 hq = m.w[1], dv = m.w[2], t = m.w[3], hkv = m.w[4];
    if (dv == 0) return;
    const i64 groups = dv >= {threads} ? 1 : {threads} / dv;
    for (i64 rh = blockIdx.x; rh < m.w[0] / dv; rh += gridDim.x) {{
        const i64 h = rh % hq;
        const float* w = (const float*)m.w[6] + rh * t;
        if (groups == 1) {{
            for (i64 c = threadIdx.x; c < dv; c += blockDim.x) {{
                const {vs}* vp = (const {vs}*)m.w[5] + (h / (hq / hkv)) * dv + c;
                float s = 0.0f;
                for (i64 j = 0; j < t; ++j) {{ const float p = w[j]; if (p != 0.0f) s += p * (float)({vv}); }}
                (({os}*)m.w[7])[rh * dv + c] = {val};
            }}
            continue;
        }}
        const i64 c = threadIdx.x % dv, g = threadIdx.x / dv;
        const {vs}* vp = (const {vs}*)m.w[5] + (h / (hq / hkv)) * dv + c;
        float acc = 0.0f;
        if (g < groups) {{
            #pragma unroll 4
            for (i64 j = g; j < t; j += groups) {{ const float p = w[j]; if (p != 0.0f) acc += p * (float)({vv}); }}
        }}
        sh[threadIdx.x] = acc;
        __syncthreads();
        if (g == 0) {{
            float s = 0.0f;
            for (i64 q = 0; q < groups; ++q) s += sh[q * dv + c];
            (({os}*)m.w[7])[rh * dv + c] = {val};
        }}
        __syncthreads();
    }}
"#
        ),
    ))
}

/// Words of paged attention's score step: `[S*Hq*L, hq, d, L, hkv, q, k, pos, table, scores,
/// window, scale_bits, block, m, blocks]` with `L = m * block` positions a query may see.
pub const PAGED_SCORES_WORDS: usize = 15;

/// The cache row of position `j` of query `qi` (`-1`: outside the pool), from its block-table
/// row (device code; needs `m`, `w` words at 8 = table, 12 = block, 13 = m, 14 = blocks).
const PAGED_ROW: &str = "        const i64 blk = (i64)((const int*)m.w[TABLE])[qi * m.w[M] + j / m.w[BLOCK]];\n        const i64 row = (blk >= 0 && blk < m.w[BLOCKS]) ? blk * m.w[BLOCK] + j % m.w[BLOCK] : -1;\n";

/// Paged attention, step 1, a thread per score: query `qi` at position `pos[qi]` of its
/// sequence sees positions `first ..= pos[qi]` (inside the window), each at the cache row its
/// block-table row names; positions in a block outside the pool, and every position of a query
/// with a negative position, score -inf.
pub fn paged_scores(q: DType, cache: DType) -> Option<String> {
    if !real(q) || !real(cache) {
        return None;
    }
    let (qs, ks) = (storage(q)?, storage(cache)?);
    let qv = fit(cache, format!("(float)({})", load(q, "qp[e]")));
    let kv = load(cache, "kp[e]");
    let row = PAGED_ROW
        .replace("TABLE", "8")
        .replace("BLOCKS", "14")
        .replace("BLOCK", "12")
        .replace("[M]", "[13]");
    Some(kernel(
        PAGED_SCORES_WORDS,
        &format!(
            r#"{GRID_LOOP}        const i64 hq = m.w[1], d = m.w[2], t = m.w[3], hkv = m.w[4];
        const i64 j = i % t, h = (i / t) % hq, qi = i / (t * hq);
        const i64 pos = (i64)((const int*)m.w[7])[qi];
        const i64 last = pos < t - 1 ? pos : t - 1;
        const i64 first = (m.w[10] > 0 && last + 1 > m.w[10]) ? last + 1 - m.w[10] : 0;
        float* sc = (float*)m.w[9];
        if (pos < 0 || j < first || j > last) {{ sc[i] = -INF_F32; continue; }}
{row}        if (row < 0) {{ sc[i] = -INF_F32; continue; }}
        const {qs}* qp = (const {qs}*)m.w[5] + (qi * hq + h) * d;
        const {ks}* kp = (const {ks}*)m.w[6] + (row * hkv + h / (hq / hkv)) * d;
        float s = 0.0f;
        for (i64 e = 0; e < d; ++e) s += {qv} * (float)({kv});
        sc[i] = s * __int_as_float((int)m.w[11]);
    }}
"#
        ),
    ))
}

/// Words of paged attention's value step: `[S*Hq*Dv, hq, dv, L, hkv, v, weights, out, table,
/// block, m, blocks]`.
pub const PAGED_VALUES_WORDS: usize = 12;

/// Paged attention, step 3, a thread per result: the weighted sum of the value rows the
/// positions of weight above 0 name (a query that sees no position gives zeros).
pub fn paged_values(cache: DType, out: DType) -> Option<String> {
    if !real(cache) || !real(out) {
        return None;
    }
    let (vs, os) = (storage(cache)?, storage(out)?);
    let vv = load(cache, "vp[row * hkv * dv]");
    let val = store(out, &fit(out, "acc".into()));
    let row = PAGED_ROW
        .replace("TABLE", "8")
        .replace("BLOCKS", "11")
        .replace("BLOCK", "9")
        .replace("[M]", "[10]")
        .replace("        ", "            ");
    Some(kernel(
        PAGED_VALUES_WORDS,
        &format!(
            r#"{GRID_LOOP}        const i64 hq = m.w[1], dv = m.w[2], t = m.w[3], hkv = m.w[4];
        const i64 c = i % dv, h = (i / dv) % hq, qi = i / (dv * hq);
        const float* w = (const float*)m.w[6] + (qi * hq + h) * t;
        const {vs}* vp = (const {vs}*)m.w[5] + (h / (hq / hkv)) * dv + c;
        float acc = 0.0f;
        for (i64 j = 0; j < t; ++j) {{
            const float p = w[j];
            if (p == 0.0f) continue;
{row}            if (row >= 0) acc += p * (float)({vv});
        }}
        (({os}*)m.w[7])[i] = {val};
    }}
"#
        ),
    ))
}
