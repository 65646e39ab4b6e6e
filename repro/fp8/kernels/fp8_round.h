/* Bit helpers and c10's fp32 -> fp8 rounding, shared by the kernels in this folder (repro/fp8/fused.py builds
 * each .c with this folder on the include path). Build with -ffp-contract=off and without -ffast-math. */
#ifndef REPRO_FP8_ROUND_H
#define REPRO_FP8_ROUND_H
#include <stdint.h>
#include <string.h>

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* c10's fp32 -> fp8 rounding of the bits y of one value. fnuz: >= 256 is NaN (0x80), below 2^-7 subnormal, no
 * -0; fn: >= 480 saturates to 0x7E (NaN stays NaN), below 2^-6 subnormal. Subnormals are rounded by adding
 * and removing a magic fp32 number; normals by adding 0x7FFFF plus the lowest kept bit. */
static inline __attribute__((always_inline)) uint32_t to_fp8(uint32_t y, int fnuz) {
    const uint32_t top = fnuz ? 0x87u << 23 : 1087u << 20, low = fnuz ? 0x78u << 23 : 121u << 23;
    const uint32_t magic = fnuz ? 0x8Cu << 23 : 141u << 23;
    const uint32_t rebias = (fnuz ? (uint32_t)(8 - 127) : (uint32_t)(7 - 127)) << 23; /* wraps: adds to the exponent */
    const uint32_t sign = (y >> 24) & 0x80u, b = y & 0x7FFFFFFFu;
    uint32_t normal = ((b + rebias + 0x7FFFFu + ((b >> 20) & 1u)) >> 20) & 0xFFu;
    const uint32_t sub = (bits_of(float_of(b) + float_of(magic)) - magic) & 0xFFu;
    if (fnuz) {
        const uint32_t r = b < low ? sub : normal;
        return b >= top ? 0x80u : (r ? r | sign : 0u);
    }
    normal = normal == 0x7Fu ? 0x7Eu : normal; /* a carry into the NaN pattern saturates */
    const uint32_t r = b < low ? sub : normal;
    return (b >= top ? (b > 0x7F800000u ? 0x7Fu : 0x7Eu) : r) | sign;
}

#endif
