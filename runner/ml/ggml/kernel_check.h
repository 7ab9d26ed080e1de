/* What our GGML kernels (q4_1.c, f16_rows.c) share: whether the CPU runs them, and the random
   numbers their checks against GGML's own dot products are made of. */

#ifndef POLLAMA_KERNEL_CHECK_H
#define POLLAMA_KERNEL_CHECK_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
/* AVX2, FMA and F16C, which every variant of the kernels needs */
static int cpu_runs_avx2_kernels(void) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0;
    /* F16C has no __builtin_cpu_supports name in every GCC: CPUID leaf 1, ECX bit 29 */
    unsigned int a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    return (c & (1u << 29)) != 0;
}
#endif

static uint32_t rng_state = 2463534242u;
static uint32_t rng(void) {  /* xorshift32: the same numbers on every machine */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static uint16_t half_of(float f) {  /* round to nearest even fp16, finite normal range only */
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (e <= 0) return (uint16_t)sign;
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(rng() >> 8) / 16777216.0f; }

#endif
