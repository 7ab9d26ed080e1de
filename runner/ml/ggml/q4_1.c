/* runner.ml.ggml._q4_1: Q4_1 weights times several rows, each row's numbers exactly GGML's.

   GGML's CPU backend has no batched kernel for Q4_1 (none in llamafile's tiles, none repacked):
   mul_mat quantizes each activation row to Q8_1 and calls ggml_vec_dot_q4_1_q8_1 once per
   (weight row, activation row), unpacking the weight row's nibbles again for every activation
   row. A step of n rows then costs about n one-row steps' arithmetic, which is what keeps
   guessed tokens (issue 26) and prompts dear on such models (SmolLM2-135M Q4_1: a 16-row step
   7.6x a one-row step, where Q4_K_M or Q8_0 weights cost ~5.5x).

   The two ops here compute the same product with each weight block unpacked once for 4
   activation rows and 4 weight rows held at a time (16 sums in registers); on AVX-512 machines
   runs of 5 to 8 activation rows go to wide tiles, two rows to a 512-bit register, which take
   0.56 ns a block product against the 4x4 tiles' 0.67-0.71 (one thread, Zen 4; for 4 rows or
   fewer the 4x4 tiles are the faster, and keep them). Every sum is
   formed in exactly the order ggml_vec_dot_q4_1_q8_1's AVX2 path forms it (x86 quants.c):
   per block, the 32 products' integer sum in 8 lanes, converted to float and added as
   fma(d_w * d_x, lanes, acc); m_w * s_x added with a scalar fma; at the end the 8 lanes summed
   as hsum_float_8 does, then the m*s sum added. Integer sums are exact whichever instruction
   forms them (maddubs + madd, or VNNI's dpbusd, never saturating at 4 bits times 8), so the
   results are bit for bit GGML's for a row alone, however many rows come together. The
   activations are quantized by GGML's own quantize_row_q8_1 (its address is handed in).

   Whether this build and CPU give GGML's numbers is checked, not assumed: check() compares
   every tile shape against GGML's own dot product on random blocks, and the caller uses the ops
   only where it finds no difference (runner/ml/ggml/q4_1.py).

   setup(ne, nb, src, data, quantize) -> None
     Byte offsets of struct ggml_tensor's fields (from the ctypes binding, the one place that
     spells the layout) and the address of GGML's quantize_row_q8_1.
   variant() -> str
     "avx512-vnni", "avx2" or "" (this CPU or build has neither: no ops).
   variants() -> tuple
     The variants this CPU runs, the one in use first (a VNNI machine runs both).
   check(vec_dot[, variant]) -> int
     How many of the random products differ from GGML's ggml_vec_dot_q4_1_q8_1 (at the given
     address) in any bit, by the variant in use or the one named; -1 without it.
   quantize_op() -> int, product_op() -> int
     Addresses of the two ggml_custom_op_t callbacks (ggml_custom_4d):
     quantize: dst I8 [rows * K/32 * 36], src[0] f32 [K, rows] (rows of stride nb[1]): each
               row quantized to Q8_1 blocks, rows split among the threads.
     product:  dst f32 [M, rows], src[0] Q4_1 [K, M] contiguous, src[1] the quantize op's
               output: dst[j][i] = weight row i . activation row j; weight rows split among
               the threads, 4 at a time. The wide tiles take a thread's scratch of K/32 * 288
               bytes (malloc'd per call; without it the 4x4 tiles do the rows).
   mul_mat_op() -> int
     Address of a ggml_custom_op_t doing both (dst f32 [M, rows], src[0] Q4_1 [K, M] contiguous,
     src[1] f32 [K, rows]), each thread quantizing every row itself; userdata: an int32 set to 1
     where a thread's memory for them cannot be had. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_parts.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define Q41_X86 1
#include <immintrin.h>
#endif

typedef struct { uint16_t d, m; uint8_t qs[16]; } block_q4_1;   /* GGML's block_q4_1 */
typedef struct { uint16_t d, s; int8_t qs[32]; } block_q8_1;    /* GGML's block_q8_1 */
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 is 20 bytes");
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1 is 36 bytes");

typedef void (*quantize_fn)(const float *x, void *y, int64_t k);
typedef void (*vec_dot_fn)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by,
                           int nrc);
/* W weight rows (stride xs blocks) times A activation rows (stride ys blocks), nb blocks each;
   dst[a * ds + w] */
typedef void (*tile_fn)(const block_q4_1 *x, size_t xs, const block_q8_1 *y, size_t ys, int nb, float *dst,
                        size_t ds);

#define TILE_W 4  /* weight rows a tile holds */
#define TILE_A 4  /* activation rows a tile holds */
#define CHUNK 64  /* weight rows a thread takes through all activation rows before the next ones */

typedef const tile_fn (*tile_table)[TILE_A + 1];

/* The wide tiles (AVX-512): W weight rows times up to 2P activation rows, two activation rows
   to a 512-bit register (row 2p in the low 8 lanes, row 2p + 1 in the high 8). yr: the
   activation rows, 2P of them (the last repeated where A is odd); dp: per block, P vectors of
   16 floats, the rows' scales d (row 2p's in lanes 0-7, row 2p + 1's in lanes 8-15); sa: per
   block, the 8 rows' scaled sums s. */
typedef void (*wide_fn)(const block_q4_1 *x, size_t xs, const block_q8_1 *const *yr, int nb, float *dst,
                        size_t ds, int A, const float *dp, const float *sa);
#define WIDE_A 8     /* activation rows a wide tile holds */
#define WIDE_MIN 5   /* fewer rows than this go to the 4-row tiles (which are faster there) */
#define WIDE_P (WIDE_A / 2)
typedef const wide_fn (*wide_table)[WIDE_P + 1];

static struct { size_t ne, nb, src, data; } OFF;
static quantize_fn quantize_q8_1;
/* a variant: its 4x4 tiles, and its wide tiles or NULL */
typedef struct { const char *name; tile_table tiles; wide_table wide; } run_t;
/* the variants this CPU runs, the fastest first; the ops use the first */
static run_t RUNS[2];
static int n_runs;
static const run_t *RUN;
static const char *VARIANT = "";

#define T_NE(t, i) (((const int64_t *)((const char *)(t) + OFF.ne))[i])
#define T_NB(t, i) (((const size_t *)((const char *)(t) + OFF.nb))[i])
#define T_SRC(t, i) (((void *const *)((const char *)(t) + OFF.src))[i])
#define T_DATA(t) (*(void *const *)((const char *)(t) + OFF.data))

#ifdef Q41_X86
#define AVX2 "avx2,fma,f16c"
#define VNNI "avx2,fma,f16c,avx512vnni,avx512vl"

/* 8 lanes of integer sums of 4 products each, as floats (mul_sum_us8_pairs_float) */
__attribute__((target(AVX2))) static inline __m256 lanes_avx2(__m256i qx, __m256i qy) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(qx, qy), _mm256_set1_epi16(1)));
}

__attribute__((target(VNNI))) static inline __m256 lanes_vnni(__m256i qx, __m256i qy) {
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), qx, qy));
}

#define TILE(V, TARGET, W, A)                                                                          \
    __attribute__((target(TARGET))) static void tile_##V##_##W##_##A(                                  \
        const block_q4_1 *x, size_t xs, const block_q8_1 *y, size_t ys, int nb, float *dst, size_t ds) { \
        __m256 acc[W][A];                                                                              \
        __m128 ms[W]; /* lane a: the m * s sum of weight row w and activation row a */                  \
        for (int w = 0; w < W; w++) {                                                                  \
            ms[w] = _mm_setzero_ps();                                                                  \
            for (int a = 0; a < A; a++) acc[w][a] = _mm256_setzero_ps();                               \
        }                                                                                              \
        for (int ib = 0; ib < nb; ib++) {                                                              \
            uint16_t sh[4] = {0, 0, 0, 0};                                                             \
            for (int a = 0; a < A; a++) sh[a] = y[a * ys + ib].s;                                      \
            const __m128 s = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)sh));                       \
            __m256i qx[W];                                                                             \
            __m256 dw[W];                                                                              \
            for (int w = 0; w < W; w++) {                                                              \
                const block_q4_1 *b = x + w * xs + ib;                                                 \
                qx[w] = nibbles_avx2(b->qs);                                                           \
                dw[w] = _mm256_set1_ps(_cvtsh_ss(b->d));                                               \
                ms[w] = _mm_fmadd_ps(_mm_set1_ps(_cvtsh_ss(b->m)), s, ms[w]);                          \
            }                                                                                          \
            for (int a = 0; a < A; a++) {                                                              \
                const block_q8_1 *c = y + a * ys + ib;                                                 \
                const __m256i qy = _mm256_loadu_si256((const __m256i *)c->qs);                         \
                const __m256 da = _mm256_set1_ps(_cvtsh_ss(c->d));                                     \
                for (int w = 0; w < W; w++)                                                            \
                    acc[w][a] = _mm256_fmadd_ps(_mm256_mul_ps(dw[w], da), lanes_##V(qx[w], qy), acc[w][a]); \
            }                                                                                          \
        }                                                                                              \
        for (int w = 0; w < W; w++) {                                                                  \
            float m[4];                                                                                \
            _mm_storeu_ps(m, ms[w]);                                                                   \
            for (int a = 0; a < A; a++) dst[a * ds + w] = hsum8_avx2(acc[w][a]) + m[a];                \
        }                                                                                              \
    }

#define TILES_OF(V, TARGET)                                                                            \
    TILE(V, TARGET, 1, 1) TILE(V, TARGET, 1, 2) TILE(V, TARGET, 1, 3) TILE(V, TARGET, 1, 4)            \
    TILE(V, TARGET, 2, 1) TILE(V, TARGET, 2, 2) TILE(V, TARGET, 2, 3) TILE(V, TARGET, 2, 4)            \
    TILE(V, TARGET, 3, 1) TILE(V, TARGET, 3, 2) TILE(V, TARGET, 3, 3) TILE(V, TARGET, 3, 4)            \
    TILE(V, TARGET, 4, 1) TILE(V, TARGET, 4, 2) TILE(V, TARGET, 4, 3) TILE(V, TARGET, 4, 4)            \
    static const tile_fn TILES_##V[TILE_W + 1][TILE_A + 1] = {                                         \
        {0},                                                                                           \
        {0, tile_##V##_1_1, tile_##V##_1_2, tile_##V##_1_3, tile_##V##_1_4},                           \
        {0, tile_##V##_2_1, tile_##V##_2_2, tile_##V##_2_3, tile_##V##_2_4},                           \
        {0, tile_##V##_3_1, tile_##V##_3_2, tile_##V##_3_3, tile_##V##_3_4},                           \
        {0, tile_##V##_4_1, tile_##V##_4_2, tile_##V##_4_3, tile_##V##_4_4},                           \
    };

TILES_OF(avx2, AVX2)
TILES_OF(vnni, VNNI)

/* The same sums as TILE's, 16 lanes at a time: each lane still adds its own block's products in
   GGML's order (lanes of different rows never meet before the final hsum_float_8 of each half).
   The m * s sums are added in a second pass over the blocks, each row's in its own lane. */
#define WIDE_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define WIDE(W, P)                                                                                     \
    __attribute__((target(WIDE_TARGET))) static void wide_##W##_##P(                                   \
        const block_q4_1 *x, size_t xs, const block_q8_1 *const *yr, int nb, float *dst, size_t ds,    \
        int A, const float *dp, const float *sa) {                                                     \
        __m512 acc[W][P];                                                                              \
        for (int w = 0; w < W; w++)                                                                    \
            for (int p = 0; p < P; p++) acc[w][p] = _mm512_setzero_ps();                               \
        const __m512i low = _mm512_set1_epi8(0xF);                                                     \
        for (int ib = 0; ib < nb; ib++) {                                                              \
            __m512i qx[W];                                                                             \
            __m512 dw[W];                                                                              \
            for (int w = 0; w < W; w++) {                                                              \
                const block_q4_1 *b = x + w * xs + ib;                                                 \
                /* the nibbles as bytes in each half: low ones, then high ones (lanes 1 and 3) */      \
                __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)b->qs));           \
                qx[w] = _mm512_and_si512(_mm512_mask_srli_epi16(t, 0xFF00FF00u, t, 4), low);           \
                dw[w] = _mm512_set1_ps(_cvtsh_ss(b->d));                                               \
            }                                                                                          \
            for (int p = 0; p < P; p++) {                                                              \
                const __m512i qy = _mm512_inserti64x4(                                                 \
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)yr[2 * p][ib].qs)),     \
                    _mm256_loadu_si256((const __m256i *)yr[2 * p + 1][ib].qs), 1);                     \
                const __m512 da = _mm512_load_ps(dp + ((size_t)ib * WIDE_P + p) * 16);                 \
                for (int w = 0; w < W; w++)                                                            \
                    acc[w][p] = _mm512_fmadd_ps(                                                       \
                        _mm512_mul_ps(dw[w], da),                                                      \
                        _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qx[w], qy)), acc[w][p]); \
            }                                                                                          \
        }                                                                                              \
        for (int w = 0; w < W; w++) {                                                                  \
            __m256 ms = _mm256_setzero_ps();                                                           \
            for (int ib = 0; ib < nb; ib++)                                                            \
                ms = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[w * xs + ib].m)), _mm256_load_ps(sa + (size_t)ib * 8), ms); \
            float m[8];                                                                                \
            _mm256_storeu_ps(m, ms);                                                                   \
            for (int p = 0; p < P; p++) {                                                              \
                const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[w][p]), 1)); \
                dst[2 * p * ds + w] = hsum8_avx2(_mm512_castps512_ps256(acc[w][p])) + m[2 * p];        \
                if (2 * p + 1 < A) dst[(2 * p + 1) * ds + w] = hsum8_avx2(high) + m[2 * p + 1];        \
            }                                                                                          \
        }                                                                                              \
    }

/* WIDE_MIN..WIDE_A rows: 3 or 4 pairs */
WIDE(1, 3) WIDE(1, 4) WIDE(2, 3) WIDE(2, 4) WIDE(3, 3) WIDE(3, 4) WIDE(4, 3) WIDE(4, 4)
static const wide_fn WIDE_TILES[TILE_W + 1][WIDE_P + 1] = {
    {0}, {0, 0, 0, wide_1_3, wide_1_4}, {0, 0, 0, wide_2_3, wide_2_4}, {0, 0, 0, wide_3_3, wide_3_4},
    {0, 0, 0, wide_4_3, wide_4_4},
};

/* dp and sa of a wide tile (above) for the WIDE_A rows yr */
__attribute__((target(WIDE_TARGET))) static void wide_scales(const block_q8_1 *const *yr, int nb, float *dp,
                                                             float *sa) {
    for (int ib = 0; ib < nb; ib++) {
        for (int a = 0; a < WIDE_A; a++) {
            const block_q8_1 *c = yr[a] + ib;
            const float d = _cvtsh_ss(c->d);
            for (int l = 0; l < 8; l++) dp[((size_t)ib * WIDE_P + a / 2) * 16 + (a % 2) * 8 + l] = d;
            sa[(size_t)ib * 8 + a] = _cvtsh_ss(c->s);
        }
    }
}

static void pick_variant(void) {
    if (!cpu_runs_avx2_kernels()) return;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw")) {
        RUNS[n_runs++] = (run_t){"avx512-vnni", TILES_vnni, WIDE_TILES};
    }
    RUNS[n_runs++] = (run_t){"avx2", TILES_avx2, NULL};
    RUN = &RUNS[0];
    VARIANT = RUN->name;
}
#else
static void pick_variant(void) {}
static void wide_scales(const block_q8_1 *const *yr, int nb, float *dp, float *sa) {
    (void)yr, (void)nb, (void)dp, (void)sa;
}
#endif

/* weight rows [r0, r1) times activation rows [0, n): dst[j * ds + i], by the tiles of ``run``: the
   wide ones for runs of WIDE_MIN or more rows where the variant has them, else the 4x4 ones */
static void product_rows(const run_t *run, const block_q4_1 *x, size_t xs, int nb, int64_t r0, int64_t r1,
                         const block_q8_1 *y, int64_t n, float *dst, size_t ds) {
    float *dp = NULL, *sa = NULL;
    if (run->wide && n >= WIDE_MIN) {
        dp = aligned_alloc(64, (size_t)nb * WIDE_P * 16 * sizeof(float));
        sa = aligned_alloc(64, ((size_t)nb * 8 * sizeof(float) + 63) / 64 * 64);
        if (!dp || !sa) free(dp), free(sa), dp = sa = NULL;  /* the 4x4 tiles need no memory */
    }
    for (int64_t c0 = r0; c0 < r1; c0 += CHUNK) {
        const int64_t c1 = c0 + CHUNK < r1 ? c0 + CHUNK : r1;
        for (int64_t j = 0; j < n;) {
            const int64_t left = n - j;
            if (dp && left >= WIDE_MIN) {
                const int A = left < WIDE_A ? (int)left : WIDE_A, P = (A + 1) / 2;
                const block_q8_1 *yr[WIDE_A];
                for (int a = 0; a < WIDE_A; a++) yr[a] = y + (j + (a < A ? a : A - 1)) * nb;
                wide_scales(yr, nb, dp, sa);
                for (int64_t i = c0; i < c1; i += TILE_W) {
                    const int W = c1 - i < TILE_W ? (int)(c1 - i) : TILE_W;
                    run->wide[W][P](x + i * xs, xs, yr, nb, dst + j * ds + i, ds, A, dp, sa);
                }
                j += A;
                continue;
            }
            const int A = left < TILE_A ? (int)left : TILE_A;
            for (int64_t i = c0; i < c1; i += TILE_W) {
                const int W = c1 - i < TILE_W ? (int)(c1 - i) : TILE_W;
                run->tiles[W][A](x + i * xs, xs, y + j * nb, nb, nb, dst + j * ds + i, ds);
            }
            j += A;
        }
    }
    free(dp), free(sa);
}

static void quantize_op(void *dst, int ith, int nth, void *userdata) {
    (void)userdata;
    const void *src = T_SRC(dst, 0);
    const int64_t k = T_NE(src, 0), rows = T_NE(src, 1);
    const size_t row_bytes = (size_t)(k / 32) * sizeof(block_q8_1);
    const char *x = T_DATA(src);
    char *q = T_DATA(dst);
    for (int64_t j = ith; j < rows; j += nth)
        quantize_q8_1((const float *)(x + j * T_NB(src, 1)), q + j * row_bytes, k);
}

/* thread ith of nth's share of dst (f32 [M, n]) = w (Q4_1 [K, M] contiguous) times n rows of
   Q8_1 blocks q: a run of whole tiles of weight rows */
static void product_share(void *dst, const void *w, const block_q8_1 *q, int64_t n, int ith, int nth) {
    const int64_t k = T_NE(w, 0), m = T_NE(w, 1);
    const int nb = (int)(k / 32);
    const int64_t tiles = (m + TILE_W - 1) / TILE_W, per = (tiles + nth - 1) / nth;
    const int64_t r0 = ith * per * TILE_W, r1 = (ith + 1) * per * TILE_W < m ? (ith + 1) * per * TILE_W : m;
    if (r0 >= r1) return;
    product_rows(RUN, T_DATA(w), T_NB(w, 1) / sizeof(block_q4_1), nb, r0, r1, q, n, T_DATA(dst),
                 T_NB(dst, 1) / sizeof(float));
}

static void product_op(void *dst, int ith, int nth, void *userdata) {
    (void)userdata;
    product_share(dst, T_SRC(dst, 0), T_DATA(T_SRC(dst, 1)), T_NE(dst, 1), ith, nth);
}

/* GGML's whole mul_mat (quantize, then multiply) as one op, for a graph we do not build
   (llama.cpp's: runner/engines/llamacpp/graph_ops.c). An op has no barrier between its threads,
   so each quantizes every activation row itself, into its own memory (a few hundred KB at
   most, kept for the thread's next products), then multiplies its share of weight rows: dst
   f32 [M, n], src[0] Q4_1 [K, M] contiguous, src[1] f32 [K, n] (rows of stride nb[1]).
   userdata: an int32 set to 1 where the memory cannot be had (dst is then not computed). */
static __thread block_q8_1 *own_rows;
static __thread size_t own_blocks;

static void mul_mat_op(void *dst, int ith, int nth, void *userdata) {
    const void *w = T_SRC(dst, 0), *b = T_SRC(dst, 1);
    const int64_t k = T_NE(w, 0), n = T_NE(b, 1), nb = k / 32;
    if ((size_t)(n * nb) > own_blocks) {
        block_q8_1 *rows = realloc(own_rows, (size_t)(n * nb) * sizeof *rows);
        if (!rows) {
            *(volatile int32_t *)userdata = 1;
            return;
        }
        own_rows = rows, own_blocks = (size_t)(n * nb);
    }
    const char *x = T_DATA(b);
    for (int64_t j = 0; j < n; j++) quantize_q8_1((const float *)(x + j * T_NB(b, 1)), own_rows + j * nb, k);
    product_share(dst, w, own_rows, n, ith, nth);
}

/* ------------------------------------------------------------------------------ the check */

/* every tile shape (weight rows 11, 6, 5: tiles of 4, 3, 2, 1; activation rows 1-8, 12, 13: the
   4x4 tiles' 1-4, the wide tiles' 5-8, and both in one product) and a few row lengths, against
   GGML's own dot product */
static long check_products(const run_t *run, vec_dot_fn vec_dot) {
    static const int lengths[] = {32, 64, 576, 1536};
    static const int64_t weights[] = {11, 6, 5}, rows[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 13};
    const int64_t m = 11, n = 13; /* the most of each */
    long differ = 0;
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        const int k = lengths[li], nb = k / 32;
        block_q4_1 *x = malloc(sizeof *x * nb * m);
        block_q8_1 *y = malloc(sizeof *y * nb * n);
        float *a = malloc(sizeof *a * k), *ours = malloc(sizeof *ours * m * n);
        if (!x || !y || !a || !ours) {
            free(x), free(y), free(a), free(ours);
            return -2;
        }
        for (int64_t i = 0; i < nb * m; i++) {
            x[i].d = half_of(uniform(1e-4f, 0.05f));
            x[i].m = half_of(-uniform(0.0f, 0.4f));
            for (int b = 0; b < 16; b++) x[i].qs[b] = (uint8_t)rng();
        }
        random_rows(quantize_q8_1, (char *)y, sizeof *y * nb, n, k, a);
        for (size_t wi = 0; wi < sizeof weights / sizeof *weights; wi++)
            for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++) {
                const int64_t mw = weights[wi], nr = rows[ri];
                product_rows(run, x, nb, nb, 0, mw, y, nr, ours, mw);
                differ += differing(vec_dot, k, (const char *)x, sizeof *x * nb, mw, (const char *)y, sizeof *y * nb,
                                    nr, ours);
            }
        free(x), free(y), free(a), free(ours);
    }
    return differ;
}

/* ------------------------------------------------------------------------------- Python */
static PyObject *setup(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long quantize;
    if (!PyArg_ParseTuple(args, "nnnnK", &OFF.ne, &OFF.nb, &OFF.src, &OFF.data, &quantize))
        return NULL;
    quantize_q8_1 = (quantize_fn)(uintptr_t)quantize;
    Py_RETURN_NONE;
}

static PyObject *variant(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(VARIANT);
}

static PyObject *variants(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *names = PyTuple_New(n_runs);
    for (int i = 0; names && i < n_runs; i++) PyTuple_SET_ITEM(names, i, PyUnicode_FromString(RUNS[i].name));
    return names;
}

static PyObject *check(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long vec_dot;
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "K|s", &vec_dot, &name)) return NULL;
    const run_t *run = RUN;
    if (name) {
        run = NULL;
        for (int i = 0; i < n_runs; i++)
            if (strcmp(RUNS[i].name, name) == 0) run = &RUNS[i];
    }
    if (!run || !quantize_q8_1 || !vec_dot) return PyLong_FromLong(-1);
    long differ;
    Py_BEGIN_ALLOW_THREADS
    differ = check_products(run, (vec_dot_fn)(uintptr_t)vec_dot);
    Py_END_ALLOW_THREADS
    if (differ == -2) return PyErr_NoMemory();
    return PyLong_FromLong(differ);
}

static PyObject *quantize_address(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong((uintptr_t)quantize_op);
}

static PyObject *product_address(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong((uintptr_t)product_op);
}

static PyObject *mul_mat_address(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong((uintptr_t)mul_mat_op);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(ne, nb, src, data, quantize): struct ggml_tensor's field offsets and the address of "
     "GGML's quantize_row_q8_1."},
    {"variant", variant, METH_NOARGS, "variant() -> 'avx512-vnni', 'avx2' or '' (no kernels here)."},
    {"variants", variants, METH_NOARGS, "variants() -> the variants this CPU runs, the one in use first."},
    {"check", check, METH_VARARGS,
     "check(vec_dot[, variant]) -> how many random products differ from GGML's ggml_vec_dot_q4_1_q8_1 at "
     "that address, by the variant in use or the one named (-1: no kernels, or setup not called)."},
    {"quantize_op", quantize_address, METH_NOARGS, "quantize_op() -> the quantize callback's address."},
    {"mul_mat_op", mul_mat_address, METH_NOARGS, "mul_mat_op() -> the whole product's callback's address."},
    {"product_op", product_address, METH_NOARGS, "product_op() -> the product callback's address."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_q4_1",
                                    "Q4_1 weights times several rows with GGML's one-row numbers.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__q4_1(void) {
    pick_variant();
    return PyModule_Create(&module);
}
