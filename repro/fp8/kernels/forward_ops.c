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

/* One e4m3 byte that is not NaN (the callers clamp below it) as fp32, exactly: its magnitude bits << 20 read as
 * fp32 are the value times 2^-120 (fn, bias 7) or 2^-119 (fnuz, bias 8), subnormals included. */
static inline __attribute__((always_inline)) float fp8_value(uint32_t b, int fnuz) {
    const float v = float_of((b & 0x7Fu) << 20) * (fnuz ? 0x1p119f : 0x1p120f);
    return float_of(bits_of(v) | ((b & 0x80u) << 24));
}

/* numerics.fake_quant_activation on fp32 rows: x [rows, width] -> out, groups of g channels, per group
 * s = max(amax, eps) / limit, q = fp8(clamp(x / s, +-limit)), out = float(q) * s. Returns 1 (out unfinished)
 * if a group's amax is not finite. */
int repro_fake_quant_f32(const float *x, float *out, int64_t rows, int64_t width, int64_t g, float limit,
                         float eps, int fnuz) {
    const int64_t n = rows * width;
    for (int64_t c0 = 0; c0 < n; c0 += g) {
        const float *xg = x + c0;
        float *og = out + c0;
        float amax = 0.0f;
        int bad = 0;
#pragma omp simd reduction(max : amax) reduction(| : bad)
        for (int64_t c = 0; c < g; c++) {
            const float a = fabsf(xg[c]);
            amax = a > amax ? a : amax;
            bad |= !(a <= 0x1.fffffep127f); /* NaN or inf */
        }
        if (bad) return 1;
        const float s = (amax > eps ? amax : eps) / limit;
#pragma omp simd
        for (int64_t c = 0; c < g; c++) {
            float y = xg[c] / s;
            y = y < -limit ? -limit : (y > limit ? limit : y);
            og[c] = fp8_value(to_fp8(bits_of(y), fnuz), fnuz) * s;
        }
    }
    return 0;
}

/* numerics.round_to_bf16 on fp32: out = bf16(x), n values. Returns 1 (out unfinished) on a NaN: torch's
 * vectorised cast writes 0xFFFF for it, its scalar tail 0x7FC0. */
int repro_bf16_round_f32(const float *x, float *out, int64_t n) {
    int nan = 0;
#pragma omp simd reduction(| : nan)
    for (int64_t i = 0; i < n; i++) {
        nan |= x[i] != x[i];
        out[i] = bf16_round(x[i]);
    }
    return nan;
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
            int bad = 0;
#pragma omp simd reduction(max : amax) reduction(| : bad)
            for (int64_t c = c0; c < c0 + block; c++) {
                o[c] = bf16_round(xr[c]);
                const float a = fabsf(o[c]);
                amax = a > amax ? a : amax;
                bad |= !(fabsf(xr[c]) <= 0x1.fffffep127f);
            }
            if (bad || !(amax <= 0x1.fffffep127f)) return 1; /* a non-finite input, or one rounded to inf */
            const int e = ceil_log2((amax > amax_floor ? amax : amax_floor) / fp8_max);
            if (e == 1000 || e < -126 || e > 127) return 1;
            const float inverse = ldexpf(1.0f, -e), scale = ldexpf(1.0f, e);
#pragma omp simd
            for (int64_t c = c0; c < c0 + block; c++) {
                float y = o[c] * inverse;
                y = y < -fp8_max ? -fp8_max : (y > fp8_max ? fp8_max : y);
                o[c] = fp8_value(to_fp8(bits_of(y), 0), 0) * scale;
            }
        }
        int bad = 0;
#pragma omp simd reduction(| : bad)
        for (int64_t c = nope; c < width; c++) {
            bad |= xr[c] != xr[c];
            o[c] = bf16_round(xr[c]);
        }
        if (bad) return 1;
    }
    return 0;
}

/* The Sinkhorn loop works on CHUNK positions at a time laid out entry-major ([n*n][CHUNK]), so that each addition
 * and division runs across positions in vector registers; every position still gets the entrywise ops, in order:
 * columns normalised first, then iters - 1 times rows and columns, each line divided by
 * ((line[0] + line[1]) + ...) + eps. */
#define CHUNK 256

/* One normalisation of m into o (both [n*n][CHUNK], `len` positions used); the line totals into t [n][CHUNK]. */
static void normalise(const float *m, float *o, float *t, int64_t n, int64_t len, int by_rows, float eps) {
    for (int64_t a = 0; a < n; a++) {
        const int64_t stride = by_rows ? 1 : n, first = by_rows ? a * n : a;
        float *total = t + a * CHUNK;
        const float *m0 = m + first * CHUNK;
#pragma omp simd
        for (int64_t p = 0; p < len; p++) total[p] = m0[p];
        for (int64_t b = 1; b < n; b++) {
            const float *mb = m + (first + b * stride) * CHUNK;
#pragma omp simd
            for (int64_t p = 0; p < len; p++) total[p] = total[p] + mb[p];
        }
#pragma omp simd
        for (int64_t p = 0; p < len; p++) total[p] = total[p] + eps;
        for (int64_t b = 0; b < n; b++) {
            const int64_t i = (first + b * stride) * CHUNK;
#pragma omp simd
            for (int64_t p = 0; p < len; p++) o[i + p] = m[i + p] / total[p];
        }
    }
}

static void load_chunk(const float *comb, float *m, int64_t p0, int64_t len, int64_t nn) {
    for (int64_t p = 0; p < len; p++)
        for (int64_t i = 0; i < nn; i++) m[i * CHUNK + p] = comb[(p0 + p) * nn + i];
}

static void store_chunk(const float *m, float *out, int64_t p0, int64_t len, int64_t nn) {
    for (int64_t p = 0; p < len; p++)
        for (int64_t i = 0; i < nn; i++) out[(p0 + p) * nn + i] = m[i * CHUNK + p];
}

/* hyper_connection.sinkhorn_entrywise on fp32 comb [count, n, n] (n <= 4) into out. */
void repro_sinkhorn_f32(const float *comb, float *out, int64_t count, int64_t n, int64_t iters, float eps) {
    float a[16 * CHUNK], b[16 * CHUNK], t[4 * CHUNK];
    const int64_t nn = n * n, steps = 2 * iters - 1;
    for (int64_t p0 = 0; p0 < count; p0 += CHUNK) {
        const int64_t len = min64(CHUNK, count - p0);
        load_chunk(comb, a, p0, len, nn);
        float *m = a, *o = b;
        for (int64_t it = 0; it < steps; it++) {
            normalise(m, o, t, n, len, it % 2 == 1, eps);
            float *swap = m; m = o; o = swap;
        }
        store_chunk(m, out, p0, len, nn);
    }
}

/* The same under autograd: out as repro_sinkhorn_f32, and for the backward every step's matrix in states
 * [chunks][steps + 1][n*n][CHUNK] and its line totals in totals [chunks][steps][n][CHUNK] (chunks = ceil(count /
 * CHUNK); the last chunk's unused positions are left unwritten). */
void repro_sinkhorn_save_f32(const float *comb, float *out, float *states, float *totals, int64_t count, int64_t n,
                             int64_t iters, float eps) {
    const int64_t nn = n * n, steps = 2 * iters - 1;
    for (int64_t p0 = 0, c = 0; p0 < count; p0 += CHUNK, c++) {
        const int64_t len = min64(CHUNK, count - p0);
        float *s = states + c * (steps + 1) * 16 * CHUNK, *t = totals + c * steps * 4 * CHUNK;
        load_chunk(comb, s, p0, len, nn);
        for (int64_t it = 0; it < steps; it++)
            normalise(s + it * 16 * CHUNK, s + (it + 1) * 16 * CHUNK, t + it * 4 * CHUNK, n, len, it % 2 == 1, eps);
        store_chunk(s + steps * 16 * CHUNK, out, p0, len, nn);
    }
}

/* Autograd's backward of the entrywise loop, op for op: each division out = x / total gives x the gradient
 * g / total and total -g * ((x / total) / total); a line's total adds its n such terms in the order autograd's
 * engine runs the divisions (the last created first), and passes the sum unchanged down the chain of additions to
 * every x of the line, where it meets the x's own term (two terms: either order). The gradient of comb ends as
 * autograd's select-backward leaves it: each value plus zeros, so -0 becomes +0. gout, gin: [count, n, n]. */
void repro_sinkhorn_backward_f32(const float *states, const float *totals, const float *gout, float *gin,
                                 int64_t count, int64_t n, int64_t iters) {
    const int64_t nn = n * n, steps = 2 * iters - 1;
    float g[16 * CHUNK], next[16 * CHUNK], gt[CHUNK];
    for (int64_t p0 = 0, c = 0; p0 < count; p0 += CHUNK, c++) {
        const int64_t len = min64(CHUNK, count - p0);
        const float *s = states + c * (steps + 1) * 16 * CHUNK, *tt = totals + c * steps * 4 * CHUNK;
        load_chunk(gout, g, p0, len, nn);
        for (int64_t it = steps - 1; it >= 0; it--) {
            const float *x = s + it * 16 * CHUNK;
            const int by_rows = it % 2 == 1;
            for (int64_t a = 0; a < n; a++) {
                const int64_t stride = by_rows ? 1 : n, first = by_rows ? a * n : a;
                const float *total = tt + it * 4 * CHUNK + a * CHUNK;
                for (int64_t b = n - 1; b >= 0; b--) {
                    const int64_t i = (first + b * stride) * CHUNK;
                    if (b == n - 1) {
#pragma omp simd
                        for (int64_t p = 0; p < len; p++) gt[p] = (-g[i + p]) * ((x[i + p] / total[p]) / total[p]);
                    } else {
#pragma omp simd
                        for (int64_t p = 0; p < len; p++)
                            gt[p] = gt[p] + (-g[i + p]) * ((x[i + p] / total[p]) / total[p]);
                    }
                }
                for (int64_t b = 0; b < n; b++) {
                    const int64_t i = (first + b * stride) * CHUNK;
#pragma omp simd
                    for (int64_t p = 0; p < len; p++) next[i + p] = g[i + p] / total[p] + gt[p];
                }
            }
            memcpy(g, next, sizeof(g));
        }
#pragma omp simd
        for (int64_t i = 0; i < 16 * CHUNK; i++) g[i] = g[i] + 0.0f;
        store_chunk(g, gin, p0, len, nn);
    }
}
