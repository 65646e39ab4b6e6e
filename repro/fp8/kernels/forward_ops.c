/* The embedded engine's per-forward elementwise storms as single calls, built and loaded by repro/fp8/fused.py
 * (ctypes releases the GIL while they run): the rollout numerics of repro/rollout/numerics.py and the
 * hyper-connections' Sinkhorn loop of repro/model/hyper_connection.py. Each function performs, per element, the
 * same IEEE fp32 operations in the same order as the torch ops it replaces, so its output has the same bits
 * (tests/test_forward_ops.py). Where torch's result hangs on a rounding this code does not reproduce (a
 * non-finite input, a log2 too close to an integer) a function returns 1 and the caller uses the torch ops.
 * Build with -ffp-contract=off and without -ffast-math. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp8_round.h"

/* fp32 -> bf16 -> fp32 as c10's round_to_nearest_even, for a value that is not NaN. */
static inline float bf16_round(float v) {
    const uint32_t u = bits_of(v);
    return float_of(((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16);
}

/* One e4m3 byte (fn: bias 7, S.1111.111 NaN; fnuz: bias 8, 0x80 NaN) as fp32, exactly. */
static inline float fp8_value(uint32_t b, int fnuz) {
    const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
    float v;
    if (fnuz && b == 0x80u) return NAN;
    if (!fnuz && (b & 0x7Fu) == 0x7Fu) return NAN;
    if (e == 0) v = ldexpf((float)m, fnuz ? -10 : -9);
    else v = ldexpf((float)(8u + m), (int)e - (fnuz ? 8 : 7) - 3);
    return (b & 0x80u) ? -v : v;
}

/* numerics.fake_quant_activation on fp32 rows: x [rows, width] -> out, groups of g channels, per group
 * s = max(amax, eps) / limit, q = fp8(clamp(x / s, +-limit)), out = float(q) * s. Returns 1 (out unfinished)
 * if a group's amax is not finite. */
int repro_fake_quant_f32(const float *x, float *out, int64_t rows, int64_t width, int64_t g, float limit,
                         float eps, int fnuz) {
    const int64_t n = rows * width;
    for (int64_t c0 = 0; c0 < n; c0 += g) {
        float amax = 0.0f;
        for (int64_t c = c0; c < c0 + g; c++) {
            const float a = fabsf(x[c]);
            amax = a > amax ? a : amax;
            if (a != a) return 1;
        }
        if (!isfinite(amax)) return 1;
        const float s = (amax > eps ? amax : eps) / limit;
        for (int64_t c = c0; c < c0 + g; c++) {
            float y = x[c] / s;
            y = y < -limit ? -limit : (y > limit ? limit : y);
            out[c] = fp8_value(to_fp8(bits_of(y), fnuz), fnuz) * s;
        }
    }
    return 0;
}

/* numerics.round_to_bf16 on fp32: out = bf16(x), n values. Returns 1 (out unfinished) on a NaN: torch's
 * vectorised cast writes 0xFFFF for it, its scalar tail 0x7FC0. */
int repro_bf16_round_f32(const float *x, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) return 1;
        out[i] = bf16_round(x[i]);
    }
    return 0;
}

/* ceil(log2(r)) as torch's fp32 log2 then ceil give it, for a normal r > 0, or 1000 when the fp32 log2's
 * rounding could decide it (r just above a power of two: log2(r) within a few fp32 ulps of the integer below). */
static inline int ceil_log2(float r) {
    int k;
    const float m = frexpf(r, &k); /* r = m * 2^k, m in [0.5, 1) */
    if (m == 0.5f) return k - 1;   /* a power of two: log2 is exact */
    const double above = log2((double)m * 2.0); /* log2(r) - (k - 1), in (0, 1) */
    const int below = k - 1;
    const double ulp = below == 0 ? 0.0 : ldexp(1.0, ilogb((double)below) - 23);
    if (above < 8.0 * ulp || 1.0 - above < 8.0 * ulp) return 1000;
    return k;
}

/* numerics.kv_cache_round_trip on fp32 rows [rows, width]: the first width - rope channels in blocks of `block`
 * through e4m3fn with a UE8M0 scale 2^ceil(log2(max(amax, floor) / 448)) of the BF16-rounded values, the last
 * `rope` channels BF16-rounded. rope = 0 is numerics.ue8m0_fp8_round_trip. Returns 1 (out unfinished) on a
 * non-finite block or an exponent whose log2 rounding this code does not decide. */
int repro_kv_round_trip_f32(const float *x, float *out, int64_t rows, int64_t width, int64_t rope, int64_t block,
                            float amax_floor, float fp8_max) {
    const int64_t nope = width - rope;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * width;
        float *o = out + r * width;
        for (int64_t c0 = 0; c0 < nope; c0 += block) {
            float amax = 0.0f;
            for (int64_t c = c0; c < c0 + block; c++) {
                if (xr[c] != xr[c]) return 1;
                o[c] = bf16_round(xr[c]);
                const float a = fabsf(o[c]);
                amax = a > amax ? a : amax;
            }
            if (!isfinite(amax)) return 1;
            const int e = ceil_log2((amax > amax_floor ? amax : amax_floor) / fp8_max);
            if (e == 1000 || e < -126 || e > 127) return 1;
            const float inverse = ldexpf(1.0f, -e), scale = ldexpf(1.0f, e);
            for (int64_t c = c0; c < c0 + block; c++) {
                float y = o[c] * inverse;
                y = y < -fp8_max ? -fp8_max : (y > fp8_max ? fp8_max : y);
                o[c] = fp8_value(to_fp8(bits_of(y), 0), 0) * scale;
            }
        }
        for (int64_t c = nope; c < width; c++) {
            if (xr[c] != xr[c]) return 1;
            o[c] = bf16_round(xr[c]);
        }
    }
    return 0;
}

/* hyper_connection.sinkhorn_entrywise on fp32 comb [count, n, n] (in place): columns normalised, then iters - 1
 * times rows and columns, each line divided by ((line[0] + line[1]) + ...) + eps, added left to right. */
void repro_sinkhorn_f32(float *comb, int64_t count, int64_t n, int64_t iters, float eps) {
    for (int64_t p = 0; p < count; p++) {
        float *m = comb + p * n * n;
        for (int64_t it = 0; it < 2 * iters - 1; it++) {
            const int by_rows = it % 2 == 1; /* columns first */
            for (int64_t a = 0; a < n; a++) {
                const int64_t step = by_rows ? 1 : n, first = by_rows ? a * n : a;
                float total = m[first];
                for (int64_t b = 1; b < n; b++) total = total + m[first + b * step];
                total = total + eps;
                for (int64_t b = 0; b < n; b++) m[first + b * step] = m[first + b * step] / total;
            }
        }
    }
}

/* The same loop with autograd's backward: forward as repro_sinkhorn_f32, keeping every step's matrix in
 * states [count, steps + 1, n, n] and its line totals in totals [count, steps, n] (steps = 2 iters - 1). */
void repro_sinkhorn_save_f32(const float *comb, float *states, float *totals, int64_t count, int64_t n,
                             int64_t iters, float eps) {
    const int64_t steps = 2 * iters - 1, nn = n * n;
    for (int64_t p = 0; p < count; p++) {
        float *s = states + p * (steps + 1) * nn, *t = totals + p * steps * n;
        memcpy(s, comb + p * nn, (size_t)nn * sizeof(float));
        for (int64_t it = 0; it < steps; it++) {
            const float *m = s + it * nn;
            float *o = s + (it + 1) * nn;
            const int by_rows = it % 2 == 1;
            for (int64_t a = 0; a < n; a++) {
                const int64_t step = by_rows ? 1 : n, first = by_rows ? a * n : a;
                float total = m[first];
                for (int64_t b = 1; b < n; b++) total = total + m[first + b * step];
                total = total + eps;
                t[it * n + a] = total;
                for (int64_t b = 0; b < n; b++) o[first + b * step] = m[first + b * step] / total;
            }
        }
    }
}

/* Autograd's backward of the entrywise loop, op for op: each division out = x / total gives x the gradient
 * g / total and total -g * ((x / total) / total); a line's total adds its n such terms in the order autograd's
 * engine runs the divisions (the last created first), and passes the sum unchanged down the chain of additions to
 * every x of the line, where it meets the x's own term (two terms: either order). The gradient of comb ends as
 * autograd's select-backward leaves it: each value plus zeros, so -0 becomes +0. gout, gin: [count, n, n]. */
void repro_sinkhorn_backward_f32(const float *states, const float *totals, const float *gout, float *gin,
                                 int64_t count, int64_t n, int64_t iters) {
    const int64_t steps = 2 * iters - 1, nn = n * n;
    float g[16], next[16];
    for (int64_t p = 0; p < count; p++) {
        const float *s = states + p * (steps + 1) * nn, *t = totals + p * steps * n;
        memcpy(g, gout + p * nn, (size_t)nn * sizeof(float));
        for (int64_t it = steps - 1; it >= 0; it--) {
            const float *x = s + it * nn;
            const int by_rows = it % 2 == 1;
            for (int64_t a = 0; a < n; a++) {
                const int64_t step = by_rows ? 1 : n, first = by_rows ? a * n : a;
                const float total = t[it * n + a];
                float gt = 0.0f;
                for (int64_t b = n - 1; b >= 0; b--) {
                    const int64_t i = first + b * step;
                    const float c = (-g[i]) * ((x[i] / total) / total);
                    gt = b == n - 1 ? c : gt + c;
                }
                for (int64_t b = 0; b < n; b++) {
                    const int64_t i = first + b * step;
                    next[i] = g[i] / total + gt;
                }
            }
            memcpy(g, next, (size_t)nn * sizeof(float));
        }
        for (int64_t i = 0; i < nn; i++) gin[p * nn + i] = g[i] + 0.0f;
    }
}
