//! The CUDA C that RLX writes: a header of conversions and math helpers (no CUDA headers: f16
//! and bf16 go through bit manipulation, so the driver and `libnvrtc` are all a machine needs),
//! one generated kernel per elementwise body, and the fixed kernels (strided copy, gather,
//! scatter-add, reductions, softmax, cumsum, top-k, the tiled product).
//!
//! Every kernel is `extern "C" __global__ void k(const M m)` where `M` holds `N` 64-bit words
//! (`struct M { i64 w[N]; }`), filled at lowering: element counts, dims and strides, and the
//! device addresses of the values, fixed by the arena. Shapes that change the code (ranks,
//! which operands broadcast, the element type) are in the source; sizes are in the words, so one
//! kernel serves every step of the same kind.

use rlx_ir::{Activation, BinaryOp, CmpOp, DType, Graph, NodeId, Op, ReduceKind};

/// Threads per block of the one-thread-per-element kernels.
pub const BLOCK: u32 = 256;

/// The header every kernel starts with.
pub(crate) const HEADER: &str = r#"typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
#define INF_F32 __int_as_float(0x7f800000)
__device__ __forceinline__ float h2f(u16 h) {
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
fn row_reduce(v: &str, ty: &str, t: u32, op: &str) -> String {
    let mut s = format!(
        "        for (int o = 16; o > 0; o >>= 1) {v} = {op}({v}, __shfl_xor_sync(0xffffffffu, {v}, o));\n"
    );
    if t == 256 {
        s.push_str(&format!(
            "        __syncthreads();\n        if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = {v};\n        __syncthreads();\n        {v} = sh[0];\n        for (int o = 1; o < 8; ++o) {v} = {op}({v}, sh[o]);\n",
        ));
        let _ = ty;
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
    s.push_str(&row_reduce("v", acc, t, &op));
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
    s.push_str(&row_reduce("mx", acc, t, &format!("rmax{f}")));
    s.push_str(&format!(
        "        {acc} sum = 0;\n        for (i64 j = lane; j < m.w[1]; j += {t}) sum += exp{f}({} - mx);\n",
        ld("j")
    ));
    s.push_str(&row_reduce("sum", acc, t, "radd"));
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

/// Words of top-k: `[n_out, k, len, x, out]` (rows dense along the last axis).
pub const TOPK_WORDS: usize = 5;

/// Top-k along the last axis: result `t` of a row is its element of rank `t` in descending
/// order (NaN largest, the lower index first among equals, as the reference evaluator sorts);
/// `indices`: the position (i32), else the value.
pub fn topk(x: DType, indices: bool) -> Option<String> {
    if x == DType::Bool {
        return None;
    }
    let st = storage(x)?;
    let key = if real(x) {
        let v = load(x, "p[j]");
        format!("        #define KEY(j) ({v} != {v} ? (double)INF_F32 : (double)({v}))\n")
    } else {
        "        #define KEY(j) (p[j])\n".to_string()
    };
    let put = if indices {
        "((int*)m.w[4])[i] = (int)j".to_string()
    } else {
        format!("(({st}*)m.w[4])[i] = p[j]")
    };
    let s = format!(
        "{GRID_LOOP}        const i64 t = i % m.w[1], len = m.w[2];\n        const {st}* p = (const {st}*)m.w[3] + (i / m.w[1]) * len;\n{key}        for (i64 j = 0; j < len; ++j) {{\n            i64 rank = 0;\n            for (i64 o = 0; o < len; ++o) {{ if (KEY(o) > KEY(j) || (KEY(o) == KEY(j) && o < j)) ++rank; }}\n            if (rank == t) {{ {put}; break; }}\n        }}\n        #undef KEY\n    }}\n"
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
