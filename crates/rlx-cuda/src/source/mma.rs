//! Prompt-sized GGUF products on tensor cores: `mma.sync` over TF32, each operand split in two
//! (`x = big + small`, both TF32) and three products summed (`small·big + big·small + big·big`,
//! CUTLASS's "3xTF32"), so a result is as close to the exact product as an f32 sum is, while
//! the tensor cores do the multiplying.
//!
//! A block of 4 warps computes a 64 × 32 tile of the result; each k-step stages 32 columns of
//! the activations and 32 decoded weights of each of the tile's 32 rows in shared memory (the
//! weights decoded once for the tile's 64 rows). Every result sums its k-steps in the same order
//! whatever the number of rows, so a row's result does not depend on the rows beside it (batch
//! invariance, as the CPU's).
//!
//! `m16n8k8` fragment layouts (PTX ISA, `mma.m16n8k8` with `.tf32`), lane `l`, `g = l / 4`,
//! `q = l % 4`: A (16 × 8, row-major) `a0 = A[g][q]`, `a1 = A[g + 8][q]`, `a2 = A[g][q + 4]`,
//! `a3 = A[g + 8][q + 4]`; B (8 × 8) `b0 = B[q][g]`, `b1 = B[q + 4][g]`; C (16 × 8, f32)
//! `c0 = C[g][2q]`, `c1 = C[g][2q + 1]`, `c2 = C[g + 8][2q]`, `c3 = C[g + 8][2q + 1]`. Host
//! emulation plays a warp's k-step (three products per column tile) with the same layouts
//! (`emu_mma_tf32`), its lanes' fragments exchanged once.

use super::{fit, gguf_decoder, kernel, real, storage, store, BYTES};
use rlx_ir::DType;

/// Words of the product: `[rows, k, n, x, w, row_bytes, out]`.
pub const DEQUANT_MMA_WORDS: usize = 7;

/// Result rows and columns of one block.
pub const MMA_TILE: [usize; 2] = [64, 32];

/// Threads of one block (4 warps, 16 result rows each).
pub const MMA_THREADS: u32 = 128;

const MMA: &str = r#"// x rounded to TF32 (10 mantissa bits; the nearest, ties away from zero).
__device__ __forceinline__ u32 tf32(float x) {
    u32 u = __float_as_uint(x);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;
    return u & 0xffffe000u;
}
#ifdef __CUDA_ARCH__
// c += A B for one m16n8k8 TF32 fragment set (see the layouts above).
__device__ __forceinline__ void mma8(float* c, const u32* a, const u32* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    // Before Ampere: the same sums from the lanes' fragments by shuffles.
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    for (int k = 0; k < 8; ++k) {
        const int from = g * 4 + (k & 3);
        const float r0 = __uint_as_float(__shfl_sync(0xffffffffu, k < 4 ? a[0] : a[2], from));
        const float r1 = __uint_as_float(__shfl_sync(0xffffffffu, k < 4 ? a[1] : a[3], from));
        const float b0 = __uint_as_float(__shfl_sync(0xffffffffu, k < 4 ? b[0] : b[1], 8 * q + (k & 3)));
        const float b1 = __uint_as_float(__shfl_sync(0xffffffffu, k < 4 ? b[0] : b[1], 8 * q + 4 + (k & 3)));
        c[0] += r0 * b0; c[1] += r0 * b1; c[2] += r1 * b0; c[3] += r1 * b1;
    }
#endif
}
#endif
// One k-step of 8 for the warp's NT column tiles: c[j] += small(A) big(B_j) + big(A) small(B_j)
// + big(A) big(B_j), in that order.
__device__ __forceinline__ void mma_step(float (*c)[4], const u32* ab, const u32* as, const u32 (*bb)[2], const u32 (*bs)[2]) {
#ifdef __CUDA_ARCH__
    #pragma unroll
    for (int j = 0; j < NT; ++j) {
        mma8(c[j], as, bb[j]);
        mma8(c[j], ab, bs[j]);
        mma8(c[j], ab, bb[j]);
    }
#else
    emu_mma_tf32(&c[0][0], NT, ab, as, &bb[0][0], &bs[0][0]);
#endif
}
"#;

/// `x [R, K] (f32) @ decode(w)^T` for packed GGUF rows `w [N, row_bytes]`, the activations as
/// they are (prompt-sized products, which the CPU does not round): see the module docs.
pub fn dequant_mma(scheme: rlx_ir::QuantScheme, out: DType) -> Option<String> {
    if !real(out) || out == DType::F64 {
        return None;
    }
    let dec = gguf_decoder(scheme)?;
    let st = storage(out)?;
    let val = store(out, &fit(out, "acc[j][i]".into()));
    let [bm, bn] = MMA_TILE;
    let s = format!(
        r#"    __shared__ float xb[{bm}][36], xs[{bm}][36], wb[{bn}][36], ws[{bn}][36];
    const int tid = threadIdx.x, warp = tid >> 5, g = (tid & 31) >> 2, q = tid & 3;
    const i64 rows = m.w[0], k = m.w[1], n = m.w[2], rb = m.w[5];
    const float* x = (const float*)m.w[3];
    const unsigned char* wq = (const unsigned char*)m.w[4];
    const i64 m0 = (i64)blockIdx.y * {bm}, n0 = (i64)blockIdx.x * {bn};
    float acc[{nt}][4];
    #pragma unroll
    for (int j = 0; j < {nt}; ++j) {{
        #pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
    }}
    for (i64 k0 = 0; k0 < k; k0 += 32) {{
        for (int e = tid; e < {bm} * 32; e += {threads}) {{
            const int r = e >> 5, c = e & 31;
            const i64 gr = m0 + r, gc = k0 + c;
            const float v = (gr < rows && gc < k) ? x[gr * k + gc] : 0.0f;
            const u32 big = tf32(v);
            xb[r][c] = __uint_as_float(big);
            xs[r][c] = __uint_as_float(tf32(v - __uint_as_float(big)));
        }}
        for (int e = tid; e < {bn} * 32; e += {threads}) {{
            const int r = e >> 5, c = e & 31;
            const i64 gn = n0 + r, gc = k0 + c;
            const float v = (gn < n && gc < k) ? deq(wq + gn * rb, (u32)gc) : 0.0f;
            const u32 big = tf32(v);
            wb[r][c] = __uint_as_float(big);
            ws[r][c] = __uint_as_float(tf32(v - __uint_as_float(big)));
        }}
        __syncthreads();
        for (int kk = 0; kk < 32; kk += 8) {{
            const int r = warp * 16 + g;
            const u32 ab[4] = {{__float_as_uint(xb[r][kk + q]), __float_as_uint(xb[r + 8][kk + q]), __float_as_uint(xb[r][kk + q + 4]), __float_as_uint(xb[r + 8][kk + q + 4])}};
            const u32 as[4] = {{__float_as_uint(xs[r][kk + q]), __float_as_uint(xs[r + 8][kk + q]), __float_as_uint(xs[r][kk + q + 4]), __float_as_uint(xs[r + 8][kk + q + 4])}};
            u32 bb[{nt}][2], bs[{nt}][2];
            #pragma unroll
            for (int j = 0; j < {nt}; ++j) {{
                bb[j][0] = __float_as_uint(wb[j * 8 + g][kk + q]);
                bb[j][1] = __float_as_uint(wb[j * 8 + g][kk + q + 4]);
                bs[j][0] = __float_as_uint(ws[j * 8 + g][kk + q]);
                bs[j][1] = __float_as_uint(ws[j * 8 + g][kk + q + 4]);
            }}
            mma_step(acc, ab, as, bb, bs);
        }}
        __syncthreads();
    }}
    #pragma unroll
    for (int j = 0; j < {nt}; ++j) {{
        #pragma unroll
        for (int i = 0; i < 4; ++i) {{
            const i64 row = m0 + warp * 16 + g + (i >= 2 ? 8 : 0), col = n0 + j * 8 + 2 * q + (i & 1);
            if (row < rows && col < n) (({st}*)m.w[6])[row * n + col] = {val};
        }}
    }}
"#,
        nt = bn / 8,
        threads = MMA_THREADS,
    );
    let src = kernel(DEQUANT_MMA_WORDS, &s);
    let mma = MMA.replace("NT", &(bn / 8).to_string());
    Some(src.replacen("struct M", &format!("{BYTES}{dec}\n{mma}struct M"), 1))
}
