/* What our GGML kernels (q4_1.c, f16_rows.c, lone_rows.c) share: whether the CPU runs them, the
   steps of GGML's x86 dot products that they repeat operation for operation, and the random
   numbers their checks against GGML's own dot products are made of. */

#ifndef POLLAMA_KERNEL_PARTS_H
#define POLLAMA_KERNEL_PARTS_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* hsum_float_8 of GGML's x86 quants.c, operation for operation: how its quantized dot products
   sum their 8 lanes at the end */
__attribute__((target("avx2,fma,f16c"))) static inline float hsum8_avx2(__m256 x) {
    __m128 r = _mm256_extractf128_ps(x, 1);
    r = _mm_add_ps(r, _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* a block's 32 nibbles (16 bytes) as bytes, the low ones first (bytes_from_nibbles_32) */
__attribute__((target("avx2,fma,f16c"))) static inline __m256i nibbles_avx2(const uint8_t *p) {
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0xF));
}

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

/* GGML's one-row dot products (ggml_vec_dot_<type>_<row type>) and row quantizers
   (quantize_row_<type>), the functions the checks hold the kernels to */
typedef void (*one_row_fn)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by,
                           int nrc);
typedef void (*quantize_row_fn)(const float *x, void *y, int64_t k);

/* n rows of k random numbers, each row of a random scale, quantized by ``quantize`` into y,
   row_bytes apart; a: room for k floats */
static inline void random_rows(quantize_row_fn quantize, char *y, size_t row_bytes, int64_t n, int k, float *a) {
    for (int64_t j = 0; j < n; j++) {
        const float scale = uniform(0.01f, 30.0f);
        for (int i = 0; i < k; i++) a[i] = uniform(-scale, scale);
        quantize(a, y + j * row_bytes, k);
    }
}

/* how many of ours[j * m + i] differ in any bit from ``vec_dot``'s product of weight row i (x,
   xr bytes apart) and row j (y, yr bytes apart), k numbers each */
static inline long differing(one_row_fn vec_dot, int k, const char *x, size_t xr, int64_t m, const char *y, size_t yr,
                             int64_t n, const float *ours) {
    long differ = 0;
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            float theirs;
            vec_dot(k, &theirs, 0, x + i * xr, 0, y + j * yr, 0, 1);
            differ += memcmp(&theirs, ours + j * m + i, sizeof theirs) != 0;
        }
    return differ;
}

#endif
