//! Graph builder methods. Every builder has a `try_` form returning [`Result`] and a short form
//! that panics with the same message; a macro writes the short forms.

use crate::{
    Activation, BinaryOp, CmpOp, ConvAttrs, CustomFn, DType, DotDims, Graph, MaskKind, NodeId, Op,
    PoolAttrs, ReduceKind, Result, Shape,
};

/// Writes the panicking short form of each listed `try_` builder.
macro_rules! short_forms {
    ($( fn $name:ident => $try_name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty; )*) => {
        impl Graph {
            $(
                #[doc = concat!("Short form of [`Graph::", stringify!($try_name), "`]; panics with its error.")]
                #[track_caller]
                pub fn $name(&mut self, $($arg: $ty),*) -> $ret {
                    match self.$try_name($($arg),*) {
                        Ok(v) => v,
                        Err(e) => panic!("{e}"),
                    }
                }
            )*
        }
    };
}

short_forms! {
    fn op => try_op(op: Op, inputs: &[NodeId]) -> NodeId;
    fn input => try_input(name: &str, shape: Shape) -> NodeId;
    fn param => try_param(name: &str, shape: Shape) -> NodeId;
    fn constant_bytes => try_constant_bytes(shape: Shape, data: Vec<u8>) -> NodeId;
    fn scalar => try_scalar(value: f64, dtype: DType) -> NodeId;
    fn matmul => try_matmul(lhs: NodeId, rhs: NodeId, expected: Shape) -> NodeId;
    fn dot => try_dot(lhs: NodeId, rhs: NodeId) -> NodeId;
    fn reshape => try_reshape(x: NodeId, dims: &[usize]) -> NodeId;
    fn transpose => try_transpose(x: NodeId, perm: &[usize]) -> NodeId;
    fn binary => try_binary(op: BinaryOp, a: NodeId, b: NodeId) -> NodeId;
    fn add => try_add(a: NodeId, b: NodeId) -> NodeId;
    fn sub => try_sub(a: NodeId, b: NodeId) -> NodeId;
    fn mul => try_mul(a: NodeId, b: NodeId) -> NodeId;
    fn div => try_div(a: NodeId, b: NodeId) -> NodeId;
    fn maximum => try_maximum(a: NodeId, b: NodeId) -> NodeId;
    fn minimum => try_minimum(a: NodeId, b: NodeId) -> NodeId;
    fn pow => try_pow(a: NodeId, b: NodeId) -> NodeId;
    fn compare => try_compare(op: CmpOp, a: NodeId, b: NodeId) -> NodeId;
    fn select => try_select(cond: NodeId, a: NodeId, b: NodeId) -> NodeId;
    fn activation => try_activation(act: Activation, x: NodeId) -> NodeId;
    fn cast => try_cast(x: NodeId, to: DType) -> NodeId;
    fn dot_general => try_dot_general(lhs: NodeId, rhs: NodeId, dims: DotDims) -> NodeId;
    fn reduce => try_reduce(kind: ReduceKind, x: NodeId, axes: &[usize], keepdims: bool) -> NodeId;
    fn sum => try_sum(x: NodeId, axes: &[usize], keepdims: bool) -> NodeId;
    fn mean => try_mean(x: NodeId, axes: &[usize], keepdims: bool) -> NodeId;
    fn softmax => try_softmax(x: NodeId, axis: usize) -> NodeId;
    fn layer_norm => try_layer_norm(x: NodeId, gamma: NodeId, beta: NodeId, eps: f32) -> NodeId;
    fn rms_norm => try_rms_norm(x: NodeId, gamma: NodeId, eps: f32) -> NodeId;
    fn narrow => try_narrow(x: NodeId, axis: usize, start: usize, len: usize) -> NodeId;
    fn concat => try_concat(xs: &[NodeId], axis: usize) -> NodeId;
    fn expand => try_expand(x: NodeId, dims: &[usize]) -> NodeId;
    fn gather => try_gather(x: NodeId, indices: NodeId, axis: usize) -> NodeId;
    fn scatter_add => try_scatter_add(x: NodeId, indices: NodeId, updates: NodeId, axis: usize) -> NodeId;
    fn complex => try_complex(re: NodeId, im: NodeId) -> NodeId;
    fn real => try_real(z: NodeId) -> NodeId;
    fn imag => try_imag(z: NodeId) -> NodeId;
    fn conj => try_conj(z: NodeId) -> NodeId;
    fn angle => try_angle(z: NodeId) -> NodeId;
    fn fft => try_fft(x: NodeId, axis: usize, n: Option<usize>) -> NodeId;
    fn ifft => try_ifft(x: NodeId, axis: usize, n: Option<usize>) -> NodeId;
    fn rfft => try_rfft(x: NodeId, axis: usize, n: Option<usize>) -> NodeId;
    fn irfft => try_irfft(x: NodeId, axis: usize, n: Option<usize>) -> NodeId;
    fn fft2 => try_fft2(x: NodeId) -> NodeId;
    fn ifft2 => try_ifft2(x: NodeId) -> NodeId;
    fn rfft2 => try_rfft2(x: NodeId) -> NodeId;
    fn irfft2 => try_irfft2(x: NodeId, s: Option<(usize, usize)>) -> NodeId;
    fn stft => try_stft(x: NodeId, n_fft: usize, hop: usize, window: Option<NodeId>) -> NodeId;
    fn istft => try_istft(z: NodeId, n_fft: usize, hop: usize, window: Option<NodeId>) -> NodeId;
    fn cumsum => try_cumsum(x: NodeId, axis: usize) -> NodeId;
    fn attention => try_attention(q: NodeId, k: NodeId, v: NodeId, mask: MaskKind, scale: f32) -> NodeId;
    fn attention_masked => try_attention_masked(q: NodeId, k: NodeId, v: NodeId, mask: NodeId, scale: f32) -> NodeId;
    fn rope => try_rope(x: NodeId, positions: NodeId, theta: f32, interleaved: bool) -> NodeId;
    fn conv => try_conv(x: NodeId, w: NodeId, attrs: ConvAttrs) -> NodeId;
    fn pool => try_pool(x: NodeId, attrs: PoolAttrs) -> NodeId;
    fn custom => try_custom(f: CustomFn, args: &[NodeId]) -> NodeId;
}

impl Graph {
    /// Elementwise `op` with numpy broadcasting.
    pub fn try_binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.try_op(Op::Binary(op), &[a, b])
    }
    /// `a + b`, broadcasting.
    pub fn try_add(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.try_binary(BinaryOp::Add, a, b)
    }
    /// `a - b`, broadcasting.
    pub fn try_sub(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.try_binary(BinaryOp::Sub, a, b)
    }
    /// `a * b`, broadcasting.
    pub fn try_mul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.try_binary(BinaryOp::Mul, a, b)
    }
    /// `a / b`, broadcasting.
    pub fn try_div(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.try_binary(BinaryOp::Div, a, b)
    }
    /// Elementwise maximum, broadcasting.
    pub fn try_maximum(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.try_binary(BinaryOp::Max, a, b)
    }
    /// Elementwise minimum, broadcasting.
    pub fn try_minimum(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.try_binary(BinaryOp::Min, a, b)
    }
    /// `a ** b`, broadcasting (floats).
    pub fn try_pow(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.try_binary(BinaryOp::Pow, a, b)
    }
    /// Elementwise comparison producing bool.
    pub fn try_compare(&mut self, op: CmpOp, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.try_op(Op::Compare(op), &[a, b])
    }
    /// `where(cond, a, b)`.
    pub fn try_select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.try_op(Op::Where, &[cond, a, b])
    }
    /// Elementwise unary function.
    pub fn try_activation(&mut self, act: Activation, x: NodeId) -> Result<NodeId> {
        self.try_op(Op::Activation(act), &[x])
    }
    /// Convert to `to`.
    pub fn try_cast(&mut self, x: NodeId, to: DType) -> Result<NodeId> {
        self.try_op(Op::Cast { to }, &[x])
    }
    /// General contraction with JAX dimension numbers.
    pub fn try_dot_general(&mut self, lhs: NodeId, rhs: NodeId, dims: DotDims) -> Result<NodeId> {
        self.try_op(Op::DotGeneral(dims), &[lhs, rhs])
    }
    /// Reduce over sorted, distinct `axes`.
    pub fn try_reduce(
        &mut self,
        kind: ReduceKind,
        x: NodeId,
        axes: &[usize],
        keepdims: bool,
    ) -> Result<NodeId> {
        self.try_op(
            Op::Reduce {
                kind,
                axes: axes.to_vec(),
                keepdims,
            },
            &[x],
        )
    }
    /// Sum over `axes`.
    pub fn try_sum(&mut self, x: NodeId, axes: &[usize], keepdims: bool) -> Result<NodeId> {
        self.try_reduce(ReduceKind::Sum, x, axes, keepdims)
    }
    /// Mean over `axes`.
    pub fn try_mean(&mut self, x: NodeId, axes: &[usize], keepdims: bool) -> Result<NodeId> {
        self.try_reduce(ReduceKind::Mean, x, axes, keepdims)
    }
    /// Softmax along `axis`.
    pub fn try_softmax(&mut self, x: NodeId, axis: usize) -> Result<NodeId> {
        self.try_op(Op::Softmax { axis }, &[x])
    }
    /// Layer normalization over the last axis.
    pub fn try_layer_norm(
        &mut self,
        x: NodeId,
        gamma: NodeId,
        beta: NodeId,
        eps: f32,
    ) -> Result<NodeId> {
        self.try_op(Op::LayerNorm { eps }, &[x, gamma, beta])
    }
    /// RMS normalization over the last axis.
    pub fn try_rms_norm(&mut self, x: NodeId, gamma: NodeId, eps: f32) -> Result<NodeId> {
        self.try_op(Op::RmsNorm { eps }, &[x, gamma])
    }
    /// Slice `[start, start + len)` of `axis`.
    pub fn try_narrow(
        &mut self,
        x: NodeId,
        axis: usize,
        start: usize,
        len: usize,
    ) -> Result<NodeId> {
        self.try_op(Op::Narrow { axis, start, len }, &[x])
    }
    /// Join along `axis`.
    pub fn try_concat(&mut self, xs: &[NodeId], axis: usize) -> Result<NodeId> {
        self.try_op(Op::Concat { axis }, xs)
    }
    /// Broadcast to `dims`.
    pub fn try_expand(&mut self, x: NodeId, dims: &[usize]) -> Result<NodeId> {
        self.try_op(
            Op::Expand {
                shape: dims.to_vec(),
            },
            &[x],
        )
    }
    /// `take(x, indices, axis)`.
    pub fn try_gather(&mut self, x: NodeId, indices: NodeId, axis: usize) -> Result<NodeId> {
        self.try_op(Op::Gather { axis }, &[x, indices])
    }
    /// `x` with `updates` added at `indices` along `axis`.
    pub fn try_scatter_add(
        &mut self,
        x: NodeId,
        indices: NodeId,
        updates: NodeId,
        axis: usize,
    ) -> Result<NodeId> {
        self.try_op(Op::ScatterAdd { axis }, &[x, indices, updates])
    }
    /// Inclusive cumulative sum.
    pub fn try_cumsum(&mut self, x: NodeId, axis: usize) -> Result<NodeId> {
        self.try_op(Op::Cumsum { axis }, &[x])
    }
    /// Attention with a built-in mask kind (use [`Graph::try_attention_masked`] for a custom mask).
    pub fn try_attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        mask: MaskKind,
        scale: f32,
    ) -> Result<NodeId> {
        self.try_op(Op::Attention { mask, scale }, &[q, k, v])
    }
    /// Attention with an additive mask tensor.
    pub fn try_attention_masked(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        mask: NodeId,
        scale: f32,
    ) -> Result<NodeId> {
        self.try_op(
            Op::Attention {
                mask: MaskKind::Custom,
                scale,
            },
            &[q, k, v, mask],
        )
    }
    /// Rotary embedding of `x [..., S, D]` at integer `positions [S]`.
    pub fn try_rope(
        &mut self,
        x: NodeId,
        positions: NodeId,
        theta: f32,
        interleaved: bool,
    ) -> Result<NodeId> {
        self.try_op(Op::Rope { theta, interleaved }, &[x, positions])
    }
    /// Convolution (channels first).
    pub fn try_conv(&mut self, x: NodeId, w: NodeId, attrs: ConvAttrs) -> Result<NodeId> {
        self.try_op(Op::Conv(attrs), &[x, w])
    }
    /// Pooling (channels first).
    pub fn try_pool(&mut self, x: NodeId, attrs: PoolAttrs) -> Result<NodeId> {
        self.try_op(Op::Pool(attrs), &[x])
    }
    /// Apply a [`CustomFn`] to `args`.
    pub fn try_custom(&mut self, f: CustomFn, args: &[NodeId]) -> Result<NodeId> {
        self.try_op(Op::Custom(f), args)
    }
}

impl Graph {
    /// `x [..., K] @ dequant(w)^T` for a packed GGUF weight `U8 [N, row_bytes]`.
    pub fn try_dequant_matmul(
        &mut self,
        x: NodeId,
        w: NodeId,
        scheme: crate::QuantScheme,
    ) -> Result<NodeId> {
        self.try_op(Op::DequantMatMul { scheme }, &[x, w])
    }
    /// Packed GGUF rows decoded to f32.
    pub fn try_dequantize_rows(&mut self, w: NodeId, scheme: crate::QuantScheme) -> Result<NodeId> {
        self.try_op(Op::DequantizeRows { scheme }, &[w])
    }
    /// Write `update [S, ...]` into the param `cache [T, ...]` at rows `pos..pos + S`.
    pub fn try_cache_write(
        &mut self,
        cache: NodeId,
        update: NodeId,
        pos: NodeId,
    ) -> Result<NodeId> {
        self.try_op(Op::CacheWrite, &[cache, update, pos])
    }
    /// Causal attention of `q [S, Hq, D]` over cache `k`, `v` at position `pos`.
    pub fn try_cached_attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        pos: NodeId,
        scale: f32,
        window: Option<usize>,
    ) -> Result<NodeId> {
        self.try_op(Op::CachedAttention { scale, window }, &[q, k, v, pos])
    }

    /// Attention of queries `q [S, Hq, D]` over a paged cache `k`, `v` of `block`-row blocks,
    /// query `i` at position `pos[i]` of the sequence whose block table is row `i` of `table`.
    #[allow(clippy::too_many_arguments)]
    pub fn try_paged_attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        pos: NodeId,
        table: NodeId,
        scale: f32,
        window: Option<usize>,
        block: usize,
    ) -> Result<NodeId> {
        let op = Op::PagedAttention {
            scale,
            window,
            block,
        };
        self.try_op(op, &[q, k, v, pos, table])
    }
}

short_forms! {
    fn dequant_matmul => try_dequant_matmul(x: NodeId, w: NodeId, scheme: crate::QuantScheme) -> NodeId;
    fn dequantize_rows => try_dequantize_rows(w: NodeId, scheme: crate::QuantScheme) -> NodeId;
    fn cache_write => try_cache_write(cache: NodeId, update: NodeId, pos: NodeId) -> NodeId;
    fn cached_attention => try_cached_attention(q: NodeId, k: NodeId, v: NodeId, pos: NodeId, scale: f32, window: Option<usize>) -> NodeId;
}
