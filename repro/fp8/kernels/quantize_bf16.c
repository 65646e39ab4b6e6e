/* Block-wise FP8 quantisation of a BF16 slab in two passes over its bits, with the error check; built and
 * loaded by repro/fp8/fused.py (ctypes releases the GIL while it runs). Bytes identical to repro/fp8/quant.py's
 * torch ops: every fp32 operation below is the single IEEE operation torch performs, and the fp32 -> fp8
 * rounding follows c10's fp8e4m3fn_from_fp32_value / fp8e4m3fnuz_from_fp32_value
 * (torch/headeronly/util/Float8_e4m3fn{,uz}.h), written without branches so that the compiler vectorises it.
 * Build with -ffp-contract=off (no fused multiply-adds) and without -ffast-math. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_round.h"

/* One row: q[c] = fp8(x[c] * inv[block of c]), and the error figures: adds the sums of (|deq| - |x|)^2 and of
 * x^2 into sums, keeps the largest ||deq| - |x|| (as fp32 bits: non-negative floats order as their bits) and
 * whether a byte is the format's NaN. |deq| is the byte's magnitude bits << 20 read as fp32 (= |q| /
 * deq_factor, subnormals included) times deq_factor times the block scale. A block whose scale is within
 * 2^+-40 computes it in fp32 as (bits * 2^100) * (scale * deq_factor / 2^100), where no factor or square can
 * overflow or vanish, into d (block floats), and sums the squares in fp32 (`omp simd reduction` lets only
 * those sums be reordered); other blocks use doubles. Three loops per block, not one: the fused loop with its
 * four reductions measured 1.6x slower. x and q must not overlap. */
static inline __attribute__((always_inline)) void quantize_row(
    const uint16_t *restrict x, uint8_t *restrict q, const float *inv, const float *scale, int64_t cols,
    int64_t block, int fnuz, double deq_factor, float *restrict d, double *sums, uint32_t *worst, uint32_t *nan) {
    const uint32_t nan_mask = fnuz ? 0xFFu : 0x7Fu, nan_byte = fnuz ? 0x80u : 0x7Fu; /* fnuz 1.0000.000, fn S.1111.111 */
    for (int64_t j = 0, c0 = 0; c0 < cols; j++, c0 += block) {
        const float s = scale[j], inv_j = inv[j];
        const int64_t c1 = min64(cols, c0 + block);
        if (s >= 0x1p-40f && s <= 0x1p40f) {
            const float step = s * (float)(deq_factor * 0x1p-100);
            float err = 0.0f, ref = 0.0f;
            uint32_t w = 0, n = 0;
            for (int64_t c = c0; c < c1; c++) {
                const uint32_t xb = (uint32_t)x[c] << 16;
                q[c] = (uint8_t)to_fp8(bits_of(float_of(xb) * inv_j), fnuz);
            }
            for (int64_t c = c0; c < c1; c++) {
                const uint32_t r = q[c];
                const float a = float_of(((uint32_t)x[c] << 16) & 0x7FFFFFFFu);
                d[c - c0] = (float_of((r & 0x7Fu) << 20) * 0x1p100f) * step - a;
                const uint32_t e = bits_of(d[c - c0]) & 0x7FFFFFFFu;
                w = e > w ? e : w;
                n |= (r & nan_mask) == nan_byte;
            }
#pragma omp simd reduction(+ : err, ref)
            for (int64_t c = c0; c < c1; c++) {
                const float a = float_of((uint32_t)x[c] << 16);
                err += d[c - c0] * d[c - c0];
                ref += a * a;
            }
            sums[0] += err;
            sums[1] += ref;
            *worst = w > *worst ? w : *worst;
            *nan |= n;
        } else {
            const double step = (double)s * deq_factor;
            for (int64_t c = c0; c < c1; c++) {
                const uint32_t xb = (uint32_t)x[c] << 16;
                const uint32_t r = to_fp8(bits_of(float_of(xb) * inv_j), fnuz);
                q[c] = (uint8_t)r;
                const double a = float_of(xb & 0x7FFFFFFFu);
                const double diff = (double)float_of((r & 0x7Fu) << 20) * step - a;
                sums[0] += diff * diff;
                sums[1] += a * a;
                const uint32_t e = bits_of((float)fabs(diff));
                *worst = e > *worst ? e : *worst;
                *nan |= (r & nan_mask) == nan_byte;
            }
        }
    }
}

/* x [rows, cols] BF16 bits (row stride x_stride) -> q [rows, cols] FP8 bits (row stride q_stride), scale [gb, nb]
 * fp32 (row stride scale_stride), figures[6] = {||deq| - |x||_2, ||x||_2, max ||deq| - |x||, the same, NaN code
 * if a byte is the format's NaN else 0, max |x| (inf if x holds NaN/Inf, and then q is not finished)}.
 * rows is a multiple of block, or the slab is one partial block-row. q may overlay x (the converter writes FP8
 * over its read buffer, q's byte i at x's byte i): a row whose bytes overlap its own input is copied out first,
 * and row r's bytes overlay only input of rows <= r / 2, which its block-row's amax pass has already read.
 * Returns 0, or -1 if scratch memory could not be allocated. */
int repro_fp8_quantize_bf16(const uint16_t *x, int64_t x_stride, uint8_t *q, int64_t q_stride, int64_t rows, int64_t cols,
                            float *scale, int64_t scale_stride, int64_t gb, int64_t nb, int64_t block, float fp8_max,
                            float min_scale, int pow2, int fnuz, double deq_factor, double nan_code, double *figures) {
    uint16_t *row = malloc((size_t)cols * sizeof(uint16_t) + 64);
    float *d = malloc((size_t)block * sizeof(float) + 64);
    uint32_t *top = malloc((size_t)nb * sizeof(uint32_t) + 64);
    float *inv = malloc((size_t)nb * sizeof(float) + 64);
    if (!row || !d || !top || !inv) {
        free(row), free(d), free(top), free(inv);
        return -1;
    }
    const int64_t rb = rows / gb;
    double sums[2] = {0.0, 0.0};
    uint32_t worst = 0, nan = 0, largest = 0;
    for (int64_t g = 0; g < gb; g++) {
        memset(top, 0, (size_t)nb * sizeof(uint32_t));
        for (int64_t r = g * rb; r < (g + 1) * rb; r++) { /* |a| < |b| iff (a & 0x7FFF) < (b & 0x7FFF), finite BF16 */
            const uint16_t *line = x + r * x_stride;
            for (int64_t j = 0, c0 = 0; c0 < cols; j++, c0 += block) {
                const int64_t c1 = min64(cols, c0 + block);
                uint16_t m = 0;
                for (int64_t c = c0; c < c1; c++) {
                    const uint16_t v = line[c] & 0x7FFFu;
                    m = v > m ? v : m;
                }
                top[j] = m > top[j] ? m : top[j];
            }
        }
        float *s_row = scale + g * scale_stride;
        for (int64_t j = 0; j < nb; j++) {
            largest = top[j] > largest ? top[j] : largest;
            float s = float_of(top[j] << 16) / fp8_max;
            if (s < min_scale) s = min_scale;
            const uint32_t sb = bits_of(s);
            if (pow2 && (sb & 0x7FFFFFu)) s = float_of((sb & 0x7F800000u) + (1u << 23)); /* next power of two */
            s_row[j] = s;
            inv[j] = 1.0f / s;
        }
        if (largest >= 0x7F80u) break; /* NaN or Inf: the caller raises */
        for (int64_t r = g * rb; r < (g + 1) * rb; r++) {
            const uint16_t *src = x + r * x_stride;
            uint8_t *dst = q + r * q_stride;
            if ((const char *)dst < (const char *)(src + cols) && (const char *)src < (const char *)(dst + cols)) {
                memcpy(row, src, (size_t)cols * sizeof(uint16_t));
                src = row;
            }
            if (fnuz) /* two copies of the row loop, each with its format's constants */
                quantize_row(src, dst, inv, s_row, cols, block, 1, deq_factor, d, sums, &worst, &nan);
            else
                quantize_row(src, dst, inv, s_row, cols, block, 0, deq_factor, d, sums, &worst, &nan);
        }
    }
    figures[0] = sqrt(sums[0]);
    figures[1] = sqrt(sums[1]);
    figures[2] = figures[3] = float_of(worst);
    figures[4] = nan ? nan_code : 0.0;
    figures[5] = largest >= 0x7F80u ? INFINITY : (double)float_of(largest << 16);
    free(row), free(d), free(top), free(inv);
    return 0;
}

/* The cast alone, for tests and benchmarks/bench_fp8_fused.py: q[i] = fp8 bits of y[i] by the rounding above. */
void repro_fp8_cast_f32(const float *y, uint8_t *q, int64_t n, int fnuz) {
    if (fnuz)
        for (int64_t i = 0; i < n; i++) q[i] = (uint8_t)to_fp8(bits_of(y[i]), 1);
    else
        for (int64_t i = 0; i < n; i++) q[i] = (uint8_t)to_fp8(bits_of(y[i]), 0);
}
