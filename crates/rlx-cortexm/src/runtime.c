/* RLX int8 kernels for ARMv7E-M (Cortex-M4, M7, M33, M55): the arithmetic of RLX's integer
 * ops (rlx_ir::ops::qint), TFLite's reference int8 kernels and CMSIS-NN. Products use the DSP
 * extension's SMLAD (two 16x16 multiply-accumulates per instruction) where the compiler
 * targets it (__ARM_FEATURE_DSP), plain C elsewhere (the same results on any host). */
#include <stdint.h>
#include <string.h>
#if defined(__ARM_FEATURE_DSP)
#include <arm_acle.h>
#endif

/* A model uses some of the kernels. */
#define RLX_KERNEL static __attribute__((unused)) void

/* gemmlowp SaturatingRoundingDoublingHighMul. */
static inline int32_t rlx_dhm(int32_t a, int32_t b) {
    if (a == INT32_MIN && b == INT32_MIN) return INT32_MAX;
    int64_t ab = (int64_t)a * (int64_t)b;
    int64_t nudge = ab >= 0 ? (1LL << 30) : (1 - (1LL << 30));
    return (int32_t)((ab + nudge) / (1LL << 31));
}

/* gemmlowp RoundingDivideByPOT. */
static inline int32_t rlx_rshift(int32_t x, int32_t e) {
    int32_t mask = (int32_t)((1LL << e) - 1);
    int32_t rem = x & mask;
    int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
    return (x >> e) + (rem > threshold ? 1 : 0);
}

/* TFLite MultiplyByQuantizedMultiplier; the left shift saturates. */
static inline int32_t rlx_mbqm(int32_t x, int32_t m, int32_t shift) {
    int32_t left = shift > 0 ? shift : 0, right = shift > 0 ? 0 : -shift;
    int64_t s = (int64_t)x * ((int64_t)1 << left);
    if (s > INT32_MAX) s = INT32_MAX;
    if (s < INT32_MIN) s = INT32_MIN;
    return rlx_rshift(rlx_dhm((int32_t)s, m), right);
}

static inline int8_t rlx_requant(int32_t acc, int32_t m, int32_t s, int32_t zp, int32_t lo, int32_t hi) {
    int64_t v = (int64_t)rlx_mbqm(acc, m, s) + zp;
    if (v < lo) v = lo;
    if (v > hi) v = hi;
    return (int8_t)v;
}

/* A row of k values less the zero point as int16, stored so that each 32-bit word holds the
 * pair SMLAD multiplies with a word of weights unpacked by SXTB16: (x0, x2), (x1, x3), ... per
 * group of four; the tail (k % 4) in order. */
static inline void rlx_put(int16_t *row, int32_t k, int32_t i, int32_t v) {
    int32_t g = i & ~3, r = i & 3;
    int32_t at = i;
    if (g + 4 <= k) at = g + ((r & 1) << 1) + (r >> 1);
    row[at] = (int16_t)v;
}

/* The sum over k of row (as rlx_put stored it) times int8 weights w. */
static int32_t rlx_dot(const int16_t *row, const int8_t *w, int32_t k) {
    int32_t acc = 0;
    int32_t groups = k >> 2;
#if defined(__ARM_FEATURE_DSP)
    for (int32_t g = 0; g < groups; g++) {
        uint32_t w4, xa, xb;
        memcpy(&w4, w + 4 * g, 4);
        memcpy(&xa, row + 4 * g, 4);
        memcpy(&xb, row + 4 * g + 2, 4);
        /* (w0, w2) and (w1, w3), sign-extended to halfwords. */
        int32_t wa = (int32_t)__sxtb16(w4);
        int32_t wb = (int32_t)__sxtb16((w4 >> 8) | (w4 << 24));
        acc = __smlad((int32_t)xa, wa, acc);
        acc = __smlad((int32_t)xb, wb, acc);
    }
#else
    for (int32_t g = 0; g < groups; g++) {
        const int16_t *x = row + 4 * g;
        const int8_t *v = w + 4 * g;
        acc += x[0] * v[0] + x[1] * v[2] + x[2] * v[1] + x[3] * v[3];
    }
#endif
    for (int32_t i = groups << 2; i < k; i++) acc += row[i] * w[i];
    return acc;
}

/* y[r, n] = requant(bias[n] + sum_k (x[r, k] - xzp) w[n, k]). */
RLX_KERNEL rlx_qlinear(const int8_t *x, const int8_t *w, const int32_t *bias, const int32_t *mult,
                        const int32_t *shift, int8_t *y, int32_t rows, int32_t n, int32_t k, int32_t xzp,
                        int32_t ozp, int32_t lo, int32_t hi, int16_t *scratch) {
    for (int32_t r = 0; r < rows; r++) {
        for (int32_t i = 0; i < k; i++) rlx_put(scratch, k, i, x[r * k + i] - xzp);
        for (int32_t c = 0; c < n; c++) {
            int32_t acc = rlx_dot(scratch, w + c * k, k) + bias[c];
            y[r * n + c] = rlx_requant(acc, mult[c], shift[c], ozp, lo, hi);
        }
    }
}

/* NCHW convolution, weights [O, C, KH, KW]; padding reads the zero point (adds nothing). */
RLX_KERNEL rlx_qconv2d(const int8_t *x, const int8_t *w, const int32_t *bias, const int32_t *mult,
                        const int32_t *shift, int8_t *y, int32_t b, int32_t c, int32_t h, int32_t wd,
                        int32_t o, int32_t kh, int32_t kw, int32_t ho, int32_t wo, int32_t sh, int32_t sw,
                        int32_t pt, int32_t pl, int32_t xzp, int32_t ozp, int32_t lo, int32_t hi,
                        int16_t *scratch) {
    int32_t k = c * kh * kw;
    for (int32_t bi = 0; bi < b; bi++)
        for (int32_t oy = 0; oy < ho; oy++)
            for (int32_t ox = 0; ox < wo; ox++) {
                for (int32_t ci = 0; ci < c; ci++)
                    for (int32_t ky = 0; ky < kh; ky++) {
                        int32_t iy = oy * sh + ky - pt;
                        for (int32_t kx = 0; kx < kw; kx++) {
                            int32_t ix = ox * sw + kx - pl;
                            int32_t v = 0;
                            if (iy >= 0 && iy < h && ix >= 0 && ix < wd)
                                v = x[((bi * c + ci) * h + iy) * wd + ix] - xzp;
                            rlx_put(scratch, k, (ci * kh + ky) * kw + kx, v);
                        }
                    }
                for (int32_t oc = 0; oc < o; oc++) {
                    int32_t acc = rlx_dot(scratch, w + oc * k, k) + bias[oc];
                    y[((bi * o + oc) * ho + oy) * wo + ox] = rlx_requant(acc, mult[oc], shift[oc], ozp, lo, hi);
                }
            }
}

/* TFLite's int8 ADD with 20 bits of headroom. */
RLX_KERNEL rlx_qadd(const int8_t *a, const int8_t *b, int8_t *y, int32_t n, int32_t azp, int32_t bzp,
                     int32_t am, int32_t as, int32_t bm, int32_t bs, int32_t om, int32_t os, int32_t ozp,
                     int32_t lo, int32_t hi) {
    for (int32_t i = 0; i < n; i++) {
        int32_t va = rlx_mbqm((a[i] - azp) * (1 << 20), am, as);
        int32_t vb = rlx_mbqm((b[i] - bzp) * (1 << 20), bm, bs);
        y[i] = rlx_requant((int32_t)((uint32_t)va + (uint32_t)vb), om, os, ozp, lo, hi);
    }
}

/* Max (kind 0) or mean (kind 1, rounded half away from zero) over each window, padding left
 * out. */
RLX_KERNEL rlx_qpool(const int8_t *x, int8_t *y, int32_t planes, int32_t h, int32_t wd, int32_t ho, int32_t wo,
                      int32_t kh, int32_t kw, int32_t sh, int32_t sw, int32_t pt, int32_t pl, int32_t kind) {
    for (int32_t p = 0; p < planes; p++)
        for (int32_t oy = 0; oy < ho; oy++)
            for (int32_t ox = 0; ox < wo; ox++) {
                int32_t y0 = oy * sh - pt, x0 = ox * sw - pl;
                int32_t best = -128, sum = 0, cnt = 0;
                for (int32_t iy = y0 < 0 ? 0 : y0; iy < y0 + kh && iy < h; iy++)
                    for (int32_t ix = x0 < 0 ? 0 : x0; ix < x0 + kw && ix < wd; ix++) {
                        int32_t v = x[(p * h + iy) * wd + ix];
                        if (v > best) best = v;
                        sum += v;
                        cnt++;
                    }
                int32_t r = best;
                if (kind == 1) {
                    if (cnt == 0) r = 0;
                    else r = sum > 0 ? (sum + cnt / 2) / cnt : (sum - cnt / 2) / cnt;
                }
                y[(p * ho + oy) * wo + ox] = (int8_t)r;
            }
}
