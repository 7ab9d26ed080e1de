/* runner.ml.ggml._f16_rows: f16 rows times several rows, each product exactly GGML's for a row alone.

   Attention's products (K^T Q and V by the scores) multiply f16 rows of the KV cache by rows of
   activations. GGML's CPU backend takes a lone activation row to ggml_vec_dot_f16, once per
   cache row, and 2 rows or more to llamafile's tiles, which sum each product in another order:
   a verified draft's rows (issue 26) then differ from the same tokens decoded one at a time,
   and a near-tie can part the text. Laying the rows apart sends every row to the dot products
   (pollama did that first), at the price of a call per product of 64 numbers: a 16-row step cost
   ~30% more than with the tiles.

   product() here forms every sum exactly as ggml_vec_dot_f16 forms it, operation for operation,
   for several cache rows and activation rows at a time: the activations converted to f16 first
   (as mul_mat converts them; the caller records GGML's own cast before this op), then, per step of
   4 vectors, one FMA into each of 4 accumulators; the accumulators added (0+2, 1+3, then the two)
   and their lanes summed in GGML's order (x86 simd-mappings.h: _mm512_reduce_add_ps's tree, or
   AVX's two hadds); the elements past the last whole step added in double. Float addition is
   commutative bit for bit, so only the tree matters, and the tree is GGML's. Tiles of 2 x 3
   products hold their accumulators in registers (long rows: V by the scores); for rows of 128
   numbers or fewer (K·Q) a column of 16 (AVX-512) or 8 (AVX2) cache rows by one activation row
   sums its products' lanes together, the vectors transposed as they are added, in the same
   tree. Which of the two x86
   variants the loaded libggml-cpu was built with (AVX-512: 16 lanes, steps of 64; AVX2: 8 lanes,
   steps of 32) is found by check(), which compares each against the library's own
   ggml_vec_dot_f16 on random rows; the caller uses a variant only where nothing differs
   (runner/ml/ggml/f16_rows.py).

   setup(ne, nb, src, data) -> None
     Byte offsets of struct ggml_tensor's fields (from the ctypes binding).
   variants() -> tuple
     The variants this CPU runs ("avx512", "avx2"); empty: none.
   check(vec_dot, variant) -> int
     How many of the random products differ in any bit from GGML's ggml_vec_dot_f16 (at the given
     address) by that variant; -1 where the CPU does not run it.
   use(variant) -> bool
     The variant product_op computes with from now on.
   reference(variant) -> int
     The variant's single product (its 1 x 1 tile) as a vec_dot function: check(reference(v), v)
     holds the variant's columns and larger tiles to it, where the library runs another variant.
   product_op() -> int
     Address of the ggml_custom_op_t callback (ggml_custom_4d): dst f32 [m, n, n2, n3] contiguous,
     src[0] f16 [k, m, a2, a3] (rows of stride nb[1], any nb[2], nb[3]; broadcast over dims 2, 3
     as mul_mat broadcasts), src[1] f16 [k, n, n2, n3] contiguous: dst[., j, i2, i3][i] = row i
     of src[0] (of its matrix i2 / (n2 / a2), i3 / (n3 / a3)) . row j of src[1]. The work is
     split among threads in chunks of CHUNK cache rows of one matrix.
   f32_rows_op(ggml_cpu_fp32_to_fp16) -> int
     Address of the same product as a ggml_custom_op_t whose src[1] is f32 rows of any strides,
     converted by each thread with the given function (GGML's); userdata: an int32 set to 1 where
     a thread's memory for them cannot be had. For llama.cpp's graph (the old engine). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_parts.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define F16R_X86 1
#include <immintrin.h>
#endif

typedef void (*vec_dot_fn)(int n, float *s, size_t bs, const uint16_t *x, size_t bx, const uint16_t *y,
                           size_t by, int nrc);
/* RA rows of x (stride xs elements) times RB rows of y (stride ys), k elements each:
   dst[b * ds + a] */
typedef void (*tile_fn)(const uint16_t *x, size_t xs, const uint16_t *y, size_t ys, int64_t k, float *dst,
                        size_t ds);

#define MAX_RA 2
#define MAX_RB 3
#define CHUNK 32

typedef const tile_fn (*tile_table)[MAX_RB + 1];

static struct { size_t ne, nb, src, data; } OFF;
#define T_NE(t, i) (((const int64_t *)((const char *)(t) + OFF.ne))[i])
#define T_NB(t, i) (((const size_t *)((const char *)(t) + OFF.nb))[i])
#define T_SRC(t, i) (((void *const *)((const char *)(t) + OFF.src))[i])
#define T_DATA(t) (*(void *const *)((const char *)(t) + OFF.data))

static float half_to_float(uint16_t h) {  /* exact, as GGML's table */
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1f, mant = h & 0x3ffu, u;
    if (e == 0x1f) u = sign | 0x7f800000u | (mant << 13);
    else if (e) u = sign | ((e + 112) << 23) | (mant << 13);
    else if (!mant) u = sign;
    else {
        e = 113;
        while (!(mant & 0x400u)) mant <<= 1, e--;
        u = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* the elements past the last whole step, in double, after the vector part ``r`` */
static float tail(float r, const uint16_t *x, const uint16_t *y, int64_t from, int64_t k) {
    double sum = r;
    for (int64_t i = from; i < k; i++) sum += (double)(half_to_float(x[i]) * half_to_float(y[i]));
    return (float)sum;
}

#ifdef F16R_X86
#define T512 "avx512f,fma,f16c"
#define T256 "avx2,fma,f16c"

/* GGML_F32Cx16_REDUCE: 0+2, 1+3, the two, then _mm512_reduce_add_ps's halves */
__attribute__((target(T512))) static inline float reduce512(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    a0 = _mm512_add_ps(a0, a2);
    a1 = _mm512_add_ps(a1, a3);
    a0 = _mm512_add_ps(a0, a1);
    const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(a0),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a0), 1)));
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 v = _mm_add_ps(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(v) + _mm_cvtss_f32(_mm_shuffle_ps(v, v, _MM_SHUFFLE(1, 1, 1, 1)));
}

/* GGML_F32x8_REDUCE: 0+2, 1+3, the two, then the halves and two hadds */
__attribute__((target(T256))) static inline float reduce256(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    a0 = _mm256_add_ps(a0, a2);
    a1 = _mm256_add_ps(a1, a3);
    a0 = _mm256_add_ps(a0, a1);
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

#define LOAD512(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define LOAD256(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))

/* V: vector type, EPR: lanes, LOAD, FMA, ZERO, REDUCE; RA x RB products, 4 accumulators each */
#define TILE(NAME, TARGET, V, EPR, LOAD, FMA, ZERO, REDUCE, RA, RB)                                      \
    __attribute__((target(TARGET))) static void tile_##NAME##_##RA##_##RB(                               \
        const uint16_t *x, size_t xs, const uint16_t *y, size_t ys, int64_t k, float *dst, size_t ds) {  \
        V acc[RA][RB][4];                                                                                \
        for (int a = 0; a < RA; a++)                                                                     \
            for (int b = 0; b < RB; b++)                                                                 \
                for (int j = 0; j < 4; j++) acc[a][b][j] = ZERO();                                       \
        const int64_t np = k & ~(int64_t)(4 * EPR - 1);                                                  \
        for (int64_t i = 0; i < np; i += 4 * EPR)                                                        \
            for (int j = 0; j < 4; j++) {                                                                \
                V vx[RA], vy[RB];                                                                        \
                for (int a = 0; a < RA; a++) vx[a] = LOAD(x + a * xs + i + j * EPR);                     \
                for (int b = 0; b < RB; b++) vy[b] = LOAD(y + b * ys + i + j * EPR);                     \
                for (int a = 0; a < RA; a++)                                                             \
                    for (int b = 0; b < RB; b++) acc[a][b][j] = FMA(vx[a], vy[b], acc[a][b][j]);         \
            }                                                                                            \
        for (int a = 0; a < RA; a++)                                                                     \
            for (int b = 0; b < RB; b++) {                                                               \
                const float r = REDUCE(acc[a][b][0], acc[a][b][1], acc[a][b][2], acc[a][b][3]);          \
                dst[b * ds + a] = np < k ? tail(r, x + a * xs, y + b * ys, np, k) : r;                   \
            }                                                                                            \
    }

/* Short rows (K·Q: 64 numbers a head) spend more on the lanes' sums than on the products: a
   column kernel sums COLUMN products' lanes together, in the same trees, one instruction
   taking a step of several products (the vectors transposed as they are added). */

/* COLUMN rows of x (stride xs) times one row y: dst[0 .. COLUMN), before the tails (x86) */
__attribute__((target(T512))) static void column_avx512(const uint16_t *x, size_t xs, const uint16_t *y,
                                                         int64_t np, float *dst) {
    __m512 s[16];
    if (np == 64) { /* one step: y's vectors held for the 16 rows */
        const __m512 y0 = LOAD512(y), y1 = LOAD512(y + 16), y2 = LOAD512(y + 32), y3 = LOAD512(y + 48);
        for (int r = 0; r < 16; r++) {
            const uint16_t *xr = x + r * xs;
            const __m512 z = _mm512_setzero_ps();
            const __m512 a0 = _mm512_fmadd_ps(LOAD512(xr), y0, z), a1 = _mm512_fmadd_ps(LOAD512(xr + 16), y1, z);
            const __m512 a2 = _mm512_fmadd_ps(LOAD512(xr + 32), y2, z), a3 = _mm512_fmadd_ps(LOAD512(xr + 48), y3, z);
            s[r] = _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
        }
    } else {
        for (int r = 0; r < 16; r++) {
            const uint16_t *xr = x + r * xs;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t i = 0; i < np; i += 64) {
                a0 = _mm512_fmadd_ps(LOAD512(xr + i), LOAD512(y + i), a0);
                a1 = _mm512_fmadd_ps(LOAD512(xr + i + 16), LOAD512(y + i + 16), a1);
                a2 = _mm512_fmadd_ps(LOAD512(xr + i + 32), LOAD512(y + i + 32), a2);
                a3 = _mm512_fmadd_ps(LOAD512(xr + i + 48), LOAD512(y + i + 48), a3);
            }
            s[r] = _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
        }
    }
    /* reduce512's tree for 16 vectors at once: t = low 8 lanes + high 8 (two products a vector) */
    __m512 t[8], u[4], w[2];
    for (int p = 0; p < 8; p++)
        t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], 0xEE));
    /* u = t's low 4 lanes + high 4: quarter q of u[p] is product 4p + q */
    for (int p = 0; p < 4; p++)
        u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0xDD));
    /* lanes 0 + 2 and 1 + 3 of each u: quarter q of w[p] holds products 8p + q and 8p + 4 + q */
    for (int p = 0; p < 2; p++)
        w[p] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0xEE));
    /* (0 + 2) + (1 + 3): lane 4q + j is product q + 4j */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(dst, _mm512_permutexvar_ps(order, r));
}

__attribute__((target(T256))) static void column_avx2(const uint16_t *x, size_t xs, const uint16_t *y,
                                                       int64_t np, float *dst) {
    __m256 s[8];
    for (int r = 0; r < 8; r++) {
        const uint16_t *xr = x + r * xs;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < np; i += 32) {
            a0 = _mm256_fmadd_ps(LOAD256(xr + i), LOAD256(y + i), a0);
            a1 = _mm256_fmadd_ps(LOAD256(xr + i + 8), LOAD256(y + i + 8), a1);
            a2 = _mm256_fmadd_ps(LOAD256(xr + i + 16), LOAD256(y + i + 16), a2);
            a3 = _mm256_fmadd_ps(LOAD256(xr + i + 24), LOAD256(y + i + 24), a3);
        }
        s[r] = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    }
    /* reduce256's tree for 8 vectors at once: t = low 4 lanes + high 4 (two products a vector) */
    __m256 t[4], h[2];
    for (int p = 0; p < 4; p++)
        t[p] = _mm256_add_ps(_mm256_permute2f128_ps(s[2 * p], s[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(s[2 * p], s[2 * p + 1], 0x31));
    /* the two hadds: lane 4h + j of the last is product h + 2j */
    for (int p = 0; p < 2; p++) h[p] = _mm256_hadd_ps(t[2 * p], t[2 * p + 1]);
    const __m256 r = _mm256_hadd_ps(h[0], h[1]);
    _mm256_storeu_ps(dst, _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

#define TILES_OF(NAME, TARGET, V, EPR, LOAD, FMA, ZERO, REDUCE)                                          \
    TILE(NAME, TARGET, V, EPR, LOAD, FMA, ZERO, REDUCE, 1, 1)                                            \
    TILE(NAME, TARGET, V, EPR, LOAD, FMA, ZERO, REDUCE, 1, 2)                                            \
    TILE(NAME, TARGET, V, EPR, LOAD, FMA, ZERO, REDUCE, 1, 3)                                            \
    TILE(NAME, TARGET, V, EPR, LOAD, FMA, ZERO, REDUCE, 2, 1)                                            \
    TILE(NAME, TARGET, V, EPR, LOAD, FMA, ZERO, REDUCE, 2, 2)                                            \
    TILE(NAME, TARGET, V, EPR, LOAD, FMA, ZERO, REDUCE, 2, 3)                                            \
    static const tile_fn TILES_##NAME[MAX_RA + 1][MAX_RB + 1] = {                                        \
        {0},                                                                                             \
        {0, tile_##NAME##_1_1, tile_##NAME##_1_2, tile_##NAME##_1_3},                                    \
        {0, tile_##NAME##_2_1, tile_##NAME##_2_2, tile_##NAME##_2_3},                                    \
    };

/* GGML's FMA(a, b, c) is fmadd(b, c, a): the product of the two rows' elements plus the sum */
#define FMA512(x, y, acc) _mm512_fmadd_ps(x, y, acc)
#define FMA256(x, y, acc) _mm256_fmadd_ps(x, y, acc)

TILES_OF(avx512, T512, __m512, 16, LOAD512, FMA512, _mm512_setzero_ps, reduce512)
TILES_OF(avx2, T256, __m256, 8, LOAD256, FMA256, _mm256_setzero_ps, reduce256)

typedef void (*column_fn)(const uint16_t *x, size_t xs, const uint16_t *y, int64_t np, float *dst);
typedef struct { const char *name; tile_table tiles; column_fn column; int column_rows, step; } run_t;
static run_t RUNS[2];
static int n_runs;

static void find_variants(void) {
    if (!cpu_runs_avx2_kernels()) return;
    if (__builtin_cpu_supports("avx512f")) {
        RUNS[n_runs++] = (run_t){"avx512", TILES_avx512, column_avx512, 16, 64};
    }
    RUNS[n_runs++] = (run_t){"avx2", TILES_avx2, column_avx2, 8, 32};
}
#else
typedef void (*column_fn)(const uint16_t *x, size_t xs, const uint16_t *y, int64_t np, float *dst);
typedef struct { const char *name; tile_table tiles; column_fn column; int column_rows, step; } run_t;
static run_t RUNS[1];
static int n_runs;
static void find_variants(void) {}
#endif

/* rows this long or shorter go to the column kernel, where a variant has one (gemma-3-270m's
   K·Q rows of 256 ran 1-3% slower by columns than by the tiles, bench_attention_rows.py) */
#define COLUMN_MAX_K 128

static const run_t *RUN;

static const run_t *run_of(const char *name) {
    for (int i = 0; i < n_runs; i++)
        if (strcmp(RUNS[i].name, name) == 0) return &RUNS[i];
    return NULL;
}

/* rows [r0, r1) of x (stride xs) times the n rows of y (stride ys): dst[j * ds + i] */
static void product_rows(const run_t *run, const uint16_t *x, size_t xs, int64_t r0, int64_t r1,
                         const uint16_t *y, size_t ys, int64_t n, int64_t k, float *dst, size_t ds) {
    if (run->column && k <= COLUMN_MAX_K) {
        const int64_t np = k & ~(int64_t)(run->step - 1), c = run->column_rows;
        for (; r0 + c <= r1; r0 += c)
            for (int64_t j = 0; j < n; j++) {
                float *out = dst + j * ds + r0;
                run->column(x + r0 * xs, xs, y + j * ys, np, out);
                for (int64_t i = 0; np < k && i < c; i++) out[i] = tail(out[i], x + (r0 + i) * xs, y + j * ys, np, k);
            }
    }
    for (int64_t j = 0; j < n; j += MAX_RB) {
        const int RB = n - j < MAX_RB ? (int)(n - j) : MAX_RB;
        for (int64_t i = r0; i < r1; i += MAX_RA) {
            const int RA = r1 - i < MAX_RA ? (int)(r1 - i) : MAX_RA;
            run->tiles[RA][RB](x + i * xs, xs, y + j * ys, ys, k, dst + j * ds + i, ds);
        }
    }
}

/* thread ith of nth's share of dst (f32 [m, n, n2, n3]) = src[0] (f16 [k, m, a2, a3], rows of any
   stride, broadcast over dims 2 and 3 as mul_mat broadcasts) times src[1]'s rows [k, n, n2, n3]: f16
   ones as they are, or, given ``to_f16`` and room ``y`` for k x n f16 numbers, f32 ones of any
   strides, converted a matrix at a time (as mul_mat converts them). Chunks of CHUNK cache rows of
   one matrix go to the threads in turn. */
static void products(void *dst, int ith, int nth, void (*to_f16)(const float *, uint16_t *, int64_t),
                     uint16_t *y) {
    const void *a = T_SRC(dst, 0), *b = T_SRC(dst, 1);
    const int64_t k = T_NE(a, 0), m = T_NE(a, 1), a2 = T_NE(a, 2), a3 = T_NE(a, 3);
    const int64_t n = T_NE(b, 1), n2 = T_NE(b, 2), n3 = T_NE(b, 3);
    const int64_t r2 = n2 / a2, r3 = n3 / a3, chunks = (m + CHUNK - 1) / CHUNK;
    const char *x = T_DATA(a), *src = T_DATA(b);
    char *out = T_DATA(dst);
    int64_t held = -1; /* the matrix whose rows y holds */
    for (int64_t u = ith; u < chunks * n2 * n3; u += nth) {
        const int64_t c = u % chunks, i2 = (u / chunks) % n2, i3 = u / (chunks * n2);
        const char *rows = src + i2 * T_NB(b, 2) + i3 * T_NB(b, 3);
        size_t ys = T_NB(b, 1) / 2;
        if (to_f16) {
            if (held != u / chunks)
                for (int64_t j = 0; j < n; j++) to_f16((const float *)(rows + j * T_NB(b, 1)), y + j * k, k);
            held = u / chunks, rows = (const char *)y, ys = (size_t)k;
        }
        const int64_t r0 = c * CHUNK, r1 = r0 + CHUNK < m ? r0 + CHUNK : m;
        product_rows(RUN, (const uint16_t *)(x + i2 / r2 * T_NB(a, 2) + i3 / r3 * T_NB(a, 3)), T_NB(a, 1) / 2,
                     r0, r1, (const uint16_t *)rows, ys, n, k,
                     (float *)(out + i2 * T_NB(dst, 2) + i3 * T_NB(dst, 3)), T_NB(dst, 1) / 4);
    }
}

static void product_op(void *dst, int ith, int nth, void *userdata) {
    (void)userdata;
    products(dst, ith, nth, NULL, NULL);
}

/* The product with f32 activation rows, for a graph we do not build (llama.cpp's: the old
   engine, runner/engines/llamacpp/graph_ops.c), where mul_mat's own conversion cannot be left
   to GGML: each thread converts the rows of the matrices it takes to f16 with GGML's own
   function (as mul_mat converts them), into its own memory, kept for its next products.
   userdata: an int32 set to 1 where that memory cannot be had (dst is then not computed). */
static void (*fp32_to_fp16)(const float *x, uint16_t *y, int64_t n);
static __thread uint16_t *own_rows;
static __thread size_t own_len;

static void f32_rows_op(void *dst, int ith, int nth, void *userdata) {
    const size_t need = (size_t)(T_NE(T_SRC(dst, 0), 0) * T_NE(T_SRC(dst, 1), 1));
    if (need > own_len) {
        uint16_t *rows = realloc(own_rows, need * sizeof *rows);
        if (!rows) {
            *(volatile int32_t *)userdata = 1;
            return;
        }
        own_rows = rows, own_len = need;
    }
    products(dst, ith, nth, fp32_to_fp16, own_rows);
}

/* ------------------------------------------------------------------------------ the check */
/* ------------------------------------------------------------------------------ the check */

/* every tile shape and row lengths with and without a tail, against GGML's own dot product */
static long check_products(const run_t *run, vec_dot_fn vec_dot) {
    static const int lengths[] = {8, 32, 64, 100, 128, 256, 264, 768, 1536};
    const int64_t m = 39, n = 8; /* columns of 16 and tiles of 2 and 1 cache rows; 3 and 2 activation rows */
    long differ = 0;
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        const int k = lengths[li];
        uint16_t *x = malloc(sizeof *x * k * m), *y = malloc(sizeof *y * k * n);
        float *ours = malloc(sizeof *ours * m * n);
        if (!x || !y || !ours) {
            free(x), free(y), free(ours);
            return -2;
        }
        for (int64_t i = 0; i < k * m; i++) x[i] = half_of(uniform(-3.0f, 3.0f));
        for (int64_t j = 0; j < n; j++) {
            /* rows as attention's: queries of any size, or softmax weights (most near 0) */
            const float scale = j % 2 ? uniform(0.5f, 20.0f) : 1.0f;
            for (int i = 0; i < k; i++) {
                const float v = uniform(-scale, scale);
                y[j * k + i] = half_of(j % 2 ? v : v * v * v * v);
            }
        }
        product_rows(run, x, k, 0, m, y, k, n, k, ours, m);
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                float theirs;
                vec_dot(k, &theirs, 0, x + i * k, 0, y + j * k, 0, 1);
                differ += memcmp(&theirs, ours + j * m + i, sizeof theirs) != 0;
            }
        free(x), free(y), free(ours);
    }
    return differ;
}

/* one product by a variant's 1 x 1 tile, as a vec_dot_fn: check(reference(v), v) holds a variant's
   columns and larger tiles to its own single products where the library was built for another */
#define DOT_OF(NAME)                                                                                     \
    static void dot_##NAME(int n, float *s, size_t bs, const uint16_t *x, size_t bx, const uint16_t *y,  \
                           size_t by, int nrc) {                                                         \
        (void)bs, (void)bx, (void)by, (void)nrc;                                                         \
        TILES_##NAME[1][1](x, 0, y, 0, n, s, 0);                                                         \
    }
#ifdef F16R_X86
DOT_OF(avx512)
DOT_OF(avx2)
#endif

/* ------------------------------------------------------------------------------- Python */
static PyObject *setup(PyObject *self, PyObject *args) {
    (void)self;
    if (!PyArg_ParseTuple(args, "nnnn", &OFF.ne, &OFF.nb, &OFF.src, &OFF.data)) return NULL;
    Py_RETURN_NONE;
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
    const char *name;
    if (!PyArg_ParseTuple(args, "Ks", &vec_dot, &name)) return NULL;
    const run_t *run = run_of(name);
    if (!run || !vec_dot) return PyLong_FromLong(-1);
    long differ;
    Py_BEGIN_ALLOW_THREADS
    differ = check_products(run, (vec_dot_fn)(uintptr_t)vec_dot);
    Py_END_ALLOW_THREADS
    if (differ == -2) return PyErr_NoMemory();
    return PyLong_FromLong(differ);
}

static PyObject *use(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    const run_t *run = run_of(name);
    if (run) RUN = run;
    return PyBool_FromLong(run != NULL);
}

static PyObject *reference(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    uintptr_t dot = 0;
#ifdef F16R_X86
    if (run_of(name)) dot = strcmp(name, "avx512") == 0 ? (uintptr_t)dot_avx512 : (uintptr_t)dot_avx2;
#endif
    return PyLong_FromUnsignedLongLong(dot);
}

static PyObject *product_address(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong((uintptr_t)product_op);
}

static PyObject *f32_rows_address(PyObject *self, PyObject *arg) {
    (void)self;
    const unsigned long long to_f16 = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    fp32_to_fp16 = (void (*)(const float *, uint16_t *, int64_t))(uintptr_t)to_f16;
    return PyLong_FromUnsignedLongLong((uintptr_t)f32_rows_op);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "setup(ne, nb, src, data): struct ggml_tensor's field offsets."},
    {"variants", variants, METH_NOARGS, "variants() -> the variants this CPU runs ('avx512', 'avx2')."},
    {"check", check, METH_VARARGS,
     "check(vec_dot, variant) -> how many random products differ from GGML's ggml_vec_dot_f16 at that "
     "address (-1: the CPU does not run the variant)."},
    {"use", use, METH_VARARGS, "use(variant) -> whether product_op now computes with it."},
    {"reference", reference, METH_VARARGS,
     "reference(variant) -> the address of the variant's one-product kernel as a ggml_vec_dot_f16 (0: none)."},
    {"product_op", product_address, METH_NOARGS, "product_op() -> the product callback's address."},
    {"f32_rows_op", f32_rows_address, METH_O,
     "f32_rows_op(ggml_cpu_fp32_to_fp16) -> the address of the product callback converting f32 rows itself."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_f16_rows",
                                    "f16 rows times several rows with GGML's one-row numbers.", -1, methods};

PyMODINIT_FUNC PyInit__f16_rows(void) {
    find_variants();
    return PyModule_Create(&module);
}
