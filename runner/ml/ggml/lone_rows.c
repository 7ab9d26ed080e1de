/* runner.ml.ggml._lone_rows: a weight matrix times several rows, each row computed as GGML
   computes a row alone.

   For a batch of 2 rows or more GGML's CPU backend multiplies most weight types with batched
   kernels (llamafile's tiles: F32, F16, BF16, Q4_0, Q5_0, IQ4_NL; its tiled K-quants from 8
   rows; repacked weights, 4 rows at a time), and for one row with one dot product per weight
   row. The two sum in different orders, so a verified draft's rows (issue 26) got other logits,
   in the last bits, than its tokens decoded one at a time. The ops here compute a batch with
   GGML's one-row functions themselves, looked up in the loaded library, so each row's numbers
   are the library's for that row alone by construction:

   - plain weights: the row quantized to the weight type's dot product type with that type's
     from_float, then the type's vec_dot once per weight row (ggml_get_type_traits_cpu, as
     ggml_compute_forward_mul_mat does for one row);
   - repacked weights (what llama.cpp's CPU_REPACK buffers hold; on x86 every layout is 8 rows
     interleaved: Q4_0, IQ4_NL and MXFP4 with Q8_0 rows, Q4_K and Q2_K with Q8_K ones): the row
     quantized to the layout's row type, then the layout's ggml_gemv_<type>_8x8_<row type> over
     the weight rows (as the repacked mul_mat does for a row of its own). The caller says which
     layouts: the library picks them by CPU, and these gemv functions read x86's.

   Each thread takes a share of the weight rows and goes through every activation row for a
   run of CHUNK weight rows before the next, so the weights are read from memory once, not once
   a row; a row still costs its dot products' arithmetic, which the batched kernels share
   between rows. An op has no barrier between its threads, so each quantizes every activation
   row itself, into memory of its own kept for its next products.

   The one exception to calling the library: Q5_0 weights (most of gemma-3-270m's products),
   which the plain op takes to tiles of our own on x86, 4 weight rows by 4 activation rows, each
   sum formed in ggml_vec_dot_q5_0_q8_0's order (below), so a step of 16 rows costs what GGML's
   batched kernels cost instead of ~20% more. They are used only after check_q5_0 found them
   equal to the library's function on random blocks.

   setup(type, ne, nb, src, data, traits, row_size, layouts) -> None
     Byte offsets of struct ggml_tensor's fields, the addresses of ggml_get_type_traits_cpu and
     ggml_row_size, and the repacked layouts: ((weight type, row type, gemv address), ...).
   plain_op() -> int, repacked_op() -> int
     ggml_custom_op_t addresses: dst f32 [M, n], src[0] the weights [K, M] (2D, rows of stride
     nb[1]; repacked_op: in one of setup's layouts, M a multiple of 8), src[1] f32 [K, n] (rows
     of stride nb[1]); userdata: an int32 set to 1 where a thread's memory for the quantized
     rows cannot be had (dst is then not computed).
   q5_0_variants() -> tuple
     The Q5_0 tiles' variants this CPU runs ("avx512-vnni", "avx2"), the fastest first.
   check_q5_0(vec_dot, variant) -> int
     How many random products of the variant's tiles differ in any bit from the function at
     vec_dot (GGML's ggml_vec_dot_q5_0_q8_0); -1: no such variant, or before setup.
   use_q5_0(variant or None) -> bool, q5_0_variant() -> str
     Which tiles the plain op takes Q5_0 weights to from now on (None, "": the library's
     vec_dot, as before any call). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_parts.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define LONE_X86 1
#include <immintrin.h>
#endif

enum { F32 = 0, Q5_0 = 6, Q8_0 = 8, TYPES = 64 }; /* enum ggml_type: fixed in GGML's file format; fewer than 64 */
#define CHUNK 64             /* weight rows (a multiple of 8) a thread takes through all rows at once */

typedef void (*from_float_fn)(const float *x, void *y, int64_t k);
typedef void (*vec_dot_fn)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by,
                           int nrc);
typedef void (*gemv_fn)(int n, float *s, size_t bs, const void *vx, const void *vy, int nr, int nc);
typedef struct { from_float_fn from_float; vec_dot_fn vec_dot; int32_t vec_dot_type; int64_t nrows; } traits_t;
typedef const traits_t *(*traits_fn)(int32_t type); /* ggml_get_type_traits_cpu */
typedef size_t (*row_size_fn)(int32_t type, int64_t ne);

static struct { size_t type, ne, nb, src, data; } OFF;
static traits_fn traits_of;
static row_size_fn row_size;
/* by weight type: the repacked layout's gemv and row type (gemv NULL: no such layout) */
static struct { gemv_fn gemv; int32_t rows; } LAYOUT[TYPES];

#define T_TYPE(t) (*(const int32_t *)((const char *)(t) + OFF.type))
#define T_NE(t, i) (((const int64_t *)((const char *)(t) + OFF.ne))[i])
#define T_NB(t, i) (((const size_t *)((const char *)(t) + OFF.nb))[i])
#define T_SRC(t, i) (((void *const *)((const char *)(t) + OFF.src))[i])
#define T_DATA(t) (*(void *const *)((const char *)(t) + OFF.data))

static __thread char *own_rows;
static __thread size_t own_bytes;

/* src[1]'s rows in type `type` (f32: as they are), each row_bytes apart; NULL where the memory
   cannot be had */
static const char *rows_as(const void *b, int32_t type, size_t *row_bytes, void *userdata) {
    const int64_t k = T_NE(b, 0), n = T_NE(b, 1);
    if (type == F32) {
        *row_bytes = T_NB(b, 1);
        return T_DATA(b);
    }
    *row_bytes = row_size(type, k);
    if ((size_t)n * *row_bytes > own_bytes) {
        char *rows = realloc(own_rows, (size_t)n * *row_bytes);
        if (!rows) {
            *(volatile int32_t *)userdata = 1;
            return NULL;
        }
        own_rows = rows, own_bytes = (size_t)n * *row_bytes;
    }
    const from_float_fn quantize = traits_of(type)->from_float;
    for (int64_t j = 0; j < n; j++)
        quantize((const float *)((const char *)T_DATA(b) + j * T_NB(b, 1)), own_rows + j * *row_bytes, k);
    return own_rows;
}

/* ------------------------------------------------------------------ Q5_0 rows, 4 x 4 at a time */

/* Q5_0 is most of gemma-3-270m's products. Its one-row function, ggml_vec_dot_q5_0_q8_0 (x86
   quants.c, AVX2 path), forms per block the 32 products of the weights' 5-bit values (-16..15)
   and the row's Q8_0 bytes as 8 lanes of integer sums of 4 products each, converts them to
   float and adds them as fma(d_w * d_x, lanes, acc); at the end it sums the 8 lanes as
   hsum_float_8 does. The tiles here form each of those sums in that order for 4 weight rows by
   4 activation rows at a time, each weight block unpacked once for the 4 rows. Integer sums
   are exact whichever instructions form them, so the lanes are taken as the unsigned values
   (0..31) times the row's bytes less 16 times the row's bytes (one sum per activation block,
   shared by the weight rows): one VNNI instruction a product, as for Q4_1 (q4_1.c). Whether
   the tiles give the library's numbers on this CPU is checked against its own function
   (check_q5_0()); the op uses them only where nothing differs. */

typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } block_q5_0; /* GGML's block_q5_0 */
typedef struct { uint16_t d; int8_t qs[32]; } block_q8_0;                  /* GGML's block_q8_0 */
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 is 22 bytes");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 is 34 bytes");

#define TILE 4 /* weight rows and activation rows a tile holds */
/* W weight rows (xs blocks apart) times A activation rows (ys blocks apart), nb blocks each:
   dst[a * ds + w] */
typedef void (*tile_fn)(const block_q5_0 *x, size_t xs, const block_q8_0 *y, size_t ys, int nb, float *dst,
                        size_t ds);
typedef const tile_fn (*tile_table)[TILE + 1];
/* the variants this CPU runs, the fastest first, and the tiles the op takes (NULL: the
   library's vec_dot, until check_q5_0 finds the tiles give its numbers) */
static struct { const char *name; tile_table tiles; } Q5_0_RUNS[2];
static int q5_0_runs;
static tile_table q5_0_tiles;

#ifdef LONE_X86
#define AVX2 "avx2,fma,f16c"
#define VNNI "avx2,fma,f16c,avx512vnni,avx512vl"

/* a block's 32 values plus 16 (0..31) as bytes: element i is nibble i (the low nibbles first)
   with bit i of qh as its fifth bit */
__attribute__((target(AVX2))) static inline __m256i values_q5_0(const block_q5_0 *b) {
    const __m256i low = nibbles_avx2(b->qs);
    uint32_t h;
    memcpy(&h, b->qh, sizeof h);
    /* byte i gets qh's byte i / 8; it is all ones where bit i % 8 is set */
    const __m256i bytes = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)h), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    return _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

/* the lanes' sums of 4 products (weights plus 16, unsigned) x (row bytes, signed), plus off */
__attribute__((target(AVX2))) static inline __m256i dot4_avx2(__m256i off, __m256i qx, __m256i qy) {
    return _mm256_add_epi32(off, _mm256_madd_epi16(_mm256_maddubs_epi16(qx, qy), _mm256_set1_epi16(1)));
}

__attribute__((target(VNNI))) static inline __m256i dot4_vnni(__m256i off, __m256i qx, __m256i qy) {
    return _mm256_dpbusd_epi32(off, qx, qy);
}

#define Q5_0_TILE(V, TARGET, W, A)                                                                     \
    __attribute__((target(TARGET))) static void q5_0_##V##_##W##_##A(                                  \
        const block_q5_0 *x, size_t xs, const block_q8_0 *y, size_t ys, int nb, float *dst, size_t ds) { \
        __m256 acc[W][A];                                                                              \
        for (int w = 0; w < W; w++)                                                                    \
            for (int a = 0; a < A; a++) acc[w][a] = _mm256_setzero_ps();                               \
        for (int ib = 0; ib < nb; ib++) {                                                              \
            __m256i qx[W];                                                                             \
            __m256 dw[W];                                                                              \
            for (int w = 0; w < W; w++) {                                                              \
                qx[w] = values_q5_0(x + w * xs + ib);                                                  \
                dw[w] = _mm256_set1_ps(_cvtsh_ss(x[w * xs + ib].d));                                   \
            }                                                                                          \
            for (int a = 0; a < A; a++) {                                                              \
                const block_q8_0 *c = y + a * ys + ib;                                                 \
                const __m256i qy = _mm256_loadu_si256((const __m256i *)c->qs);                         \
                /* -16 times the sum of each lane's 4 bytes: the values' offset taken back */          \
                const __m256i off = _mm256_sub_epi32(                                                  \
                    _mm256_setzero_si256(), dot4_##V(_mm256_setzero_si256(), _mm256_set1_epi8(16), qy)); \
                const __m256 da = _mm256_set1_ps(_cvtsh_ss(c->d));                                     \
                for (int w = 0; w < W; w++)                                                            \
                    acc[w][a] = _mm256_fmadd_ps(_mm256_mul_ps(dw[w], da),                              \
                                                _mm256_cvtepi32_ps(dot4_##V(off, qx[w], qy)), acc[w][a]); \
            }                                                                                          \
        }                                                                                              \
        for (int w = 0; w < W; w++)                                                                    \
            for (int a = 0; a < A; a++) dst[a * ds + w] = hsum8_avx2(acc[w][a]);                       \
    }

#define Q5_0_TILES_OF(V, TARGET)                                                                       \
    Q5_0_TILE(V, TARGET, 1, 1) Q5_0_TILE(V, TARGET, 1, 2) Q5_0_TILE(V, TARGET, 1, 3)                   \
    Q5_0_TILE(V, TARGET, 1, 4) Q5_0_TILE(V, TARGET, 2, 1) Q5_0_TILE(V, TARGET, 2, 2)                   \
    Q5_0_TILE(V, TARGET, 2, 3) Q5_0_TILE(V, TARGET, 2, 4) Q5_0_TILE(V, TARGET, 3, 1)                   \
    Q5_0_TILE(V, TARGET, 3, 2) Q5_0_TILE(V, TARGET, 3, 3) Q5_0_TILE(V, TARGET, 3, 4)                   \
    Q5_0_TILE(V, TARGET, 4, 1) Q5_0_TILE(V, TARGET, 4, 2) Q5_0_TILE(V, TARGET, 4, 3)                   \
    Q5_0_TILE(V, TARGET, 4, 4)                                                                         \
    static const tile_fn Q5_0_##V[TILE + 1][TILE + 1] = {                                              \
        {0},                                                                                           \
        {0, q5_0_##V##_1_1, q5_0_##V##_1_2, q5_0_##V##_1_3, q5_0_##V##_1_4},                           \
        {0, q5_0_##V##_2_1, q5_0_##V##_2_2, q5_0_##V##_2_3, q5_0_##V##_2_4},                           \
        {0, q5_0_##V##_3_1, q5_0_##V##_3_2, q5_0_##V##_3_3, q5_0_##V##_3_4},                           \
        {0, q5_0_##V##_4_1, q5_0_##V##_4_2, q5_0_##V##_4_3, q5_0_##V##_4_4},                           \
    };

Q5_0_TILES_OF(avx2, AVX2)
Q5_0_TILES_OF(vnni, VNNI)

static void q5_0_variants(void) {
    if (!cpu_runs_avx2_kernels()) return;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl"))
        Q5_0_RUNS[q5_0_runs].name = "avx512-vnni", Q5_0_RUNS[q5_0_runs++].tiles = Q5_0_vnni;
    Q5_0_RUNS[q5_0_runs].name = "avx2", Q5_0_RUNS[q5_0_runs++].tiles = Q5_0_avx2;
}
#else
static void q5_0_variants(void) {}
#endif

/* weight rows [r0, r1) (xs blocks apart) times activation rows [0, n) (nb blocks apart, nb
   blocks each): dst[j * ds + i], by ``tiles`` */
static void q5_0_rows(tile_table tiles, const block_q5_0 *x, size_t xs, int nb, int64_t r0, int64_t r1,
                      const block_q8_0 *y, int64_t n, float *dst, size_t ds) {
    for (int64_t j = 0; j < n; j += TILE) {
        const int A = n - j < TILE ? (int)(n - j) : TILE;
        for (int64_t i = r0; i < r1; i += TILE) {
            const int W = r1 - i < TILE ? (int)(r1 - i) : TILE;
            tiles[W][A](x + i * xs, xs, y + j * nb, nb, nb, dst + j * ds + i, ds);
        }
    }
}

/* How many random products of ``tiles`` differ in any bit from ``vec_dot`` (GGML's
   ggml_vec_dot_q5_0_q8_0, or another function of its signature): every tile shape (weight rows
   11, 6, 5; activation rows 1-5, 8, 13), a few row lengths, the rows quantized by ``quantize``
   (GGML's quantize_row_q8_0); -2: no memory */
static long check_q5_0_tiles(tile_table tiles, vec_dot_fn vec_dot, from_float_fn quantize) {
    static const int lengths[] = {32, 64, 640, 2048};
    static const int64_t weights[] = {11, 6, 5}, rows[] = {1, 2, 3, 4, 5, 8, 13};
    const int64_t m = 11, n = 13; /* the most of each */
    long differ = 0;
    rng_state = 2463534242u;
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        const int k = lengths[li], nb = k / 32;
        block_q5_0 *x = malloc(sizeof *x * nb * m);
        block_q8_0 *y = malloc(sizeof *y * nb * n);
        float *a = malloc(sizeof *a * k), *ours = malloc(sizeof *ours * m * n);
        if (!x || !y || !a || !ours) {
            free(x), free(y), free(a), free(ours);
            return -2;
        }
        for (int64_t i = 0; i < nb * m; i++) {
            x[i].d = half_of(uniform(1e-4f, 0.05f));
            for (int b = 0; b < 4; b++) x[i].qh[b] = (uint8_t)rng();
            for (int b = 0; b < 16; b++) x[i].qs[b] = (uint8_t)rng();
        }
        random_rows(quantize, (char *)y, sizeof *y * nb, n, k, a);
        for (size_t wi = 0; wi < sizeof weights / sizeof *weights; wi++)
            for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++) {
                const int64_t mw = weights[wi], nr = rows[ri];
                q5_0_rows(tiles, x, nb, nb, 0, mw, y, nr, ours, mw);
                differ += differing(vec_dot, k, (const char *)x, sizeof *x * nb, mw, (const char *)y, sizeof *y * nb,
                                    nr, ours);
            }
        free(x), free(y), free(a), free(ours);
    }
    return differ;
}

/* thread ith of nth's weight rows [*r0, *r1): runs of 8 (a repacked block's rows) */
static int share(int64_t m, int ith, int nth, int64_t *r0, int64_t *r1) {
    const int64_t blocks = (m + 7) / 8, per = (blocks + nth - 1) / nth;
    *r0 = ith * per * 8;
    *r1 = (ith + 1) * per * 8 < m ? (ith + 1) * per * 8 : m;
    return *r0 < *r1;
}

/* thread ith of nth's share of dst = w times b, each row as GGML computes it alone: with
   ``repacked``, w in its type's repacked layout (its gemv over runs of 8-row blocks), else w's
   type's vec_dot once per weight row */
static void products(void *dst, int ith, int nth, void *userdata, int repacked) {
    const void *w = T_SRC(dst, 0), *b = T_SRC(dst, 1);
    const int64_t k = T_NE(w, 0), m = T_NE(w, 1), n = T_NE(b, 1);
    int64_t r0, r1;
    if (!share(m, ith, nth, &r0, &r1)) return;
    const int32_t type = T_TYPE(w);
    const traits_t *t = repacked ? NULL : traits_of(type);
    const gemv_fn gemv = repacked ? LAYOUT[type].gemv : NULL;
    size_t rb;
    const char *q = rows_as(b, repacked ? LAYOUT[type].rows : t->vec_dot_type, &rb, userdata);
    if (!q) return;
    const char *x = T_DATA(w);
    const size_t xs = T_NB(w, 1), ds = T_NB(dst, 1);
    char *d = T_DATA(dst);
    const int tiled = !repacked && type == Q5_0 && q5_0_tiles && xs % sizeof(block_q5_0) == 0 &&
                      ds % sizeof(float) == 0;
    for (int64_t c0 = r0; c0 < r1; c0 += CHUNK) {
        const int64_t c1 = c0 + CHUNK < r1 ? c0 + CHUNK : r1;
        if (tiled) { /* the same numbers, 4 x 4 at a time (above) */
            q5_0_rows(q5_0_tiles, (const block_q5_0 *)x, xs / sizeof(block_q5_0), (int)(k / 32), c0, c1,
                      (const block_q8_0 *)q, n, (float *)d, ds / sizeof(float));
            continue;
        }
        for (int64_t j = 0; j < n; j++) {
            float *out = (float *)(d + j * ds);
            if (repacked)
                gemv((int)k, out + c0, (size_t)m, x + c0 * xs, q + j * rb, 1, (int)(c1 - c0));
            else
                for (int64_t i = c0; i < c1; i++) t->vec_dot((int)k, out + i, 0, x + i * xs, 0, q + j * rb, 0, 1);
        }
    }
}

static void plain_op(void *dst, int ith, int nth, void *userdata) { products(dst, ith, nth, userdata, 0); }

static void repacked_op(void *dst, int ith, int nth, void *userdata) { products(dst, ith, nth, userdata, 1); }

/* ------------------------------------------------------------------------------- Python */
static PyObject *setup(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long traits, size;
    PyObject *layouts;
    if (!PyArg_ParseTuple(args, "nnnnnKKO", &OFF.type, &OFF.ne, &OFF.nb, &OFF.src, &OFF.data, &traits, &size,
                          &layouts))
        return NULL;
    if (!traits || !size) {
        PyErr_SetString(PyExc_ValueError, "no ggml_get_type_traits_cpu or ggml_row_size");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(layouts, "layouts: a sequence of (weight type, row type, gemv)");
    if (!seq) return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        int type, rows;
        unsigned long long gemv;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiK", &type, &rows, &gemv)) {
            Py_DECREF(seq);
            return NULL;
        }
        if (type < 0 || type >= TYPES || rows < 0 || rows >= TYPES || !gemv) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "a layout's types out of range, or no gemv");
            return NULL;
        }
        LAYOUT[type].gemv = (gemv_fn)(uintptr_t)gemv, LAYOUT[type].rows = rows;
    }
    Py_DECREF(seq);
    traits_of = (traits_fn)(uintptr_t)traits, row_size = (row_size_fn)(uintptr_t)size;
    Py_RETURN_NONE;
}

static PyObject *plain_address(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong(traits_of ? (uintptr_t)plain_op : 0);
}

static PyObject *repacked_address(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong(traits_of ? (uintptr_t)repacked_op : 0);
}

static tile_table q5_0_run(const char *name) {
    for (int i = 0; i < q5_0_runs; i++)
        if (strcmp(Q5_0_RUNS[i].name, name) == 0) return Q5_0_RUNS[i].tiles;
    return NULL;
}

static PyObject *q5_0_variants_of(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *names = PyTuple_New(q5_0_runs);
    for (int i = 0; names && i < q5_0_runs; i++) PyTuple_SET_ITEM(names, i, PyUnicode_FromString(Q5_0_RUNS[i].name));
    return names;
}

static PyObject *check_q5_0(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long vec_dot;
    const char *name;
    if (!PyArg_ParseTuple(args, "Ks", &vec_dot, &name)) return NULL;
    const tile_table tiles = q5_0_run(name);
    if (!tiles || !traits_of || !vec_dot) return PyLong_FromLong(-1);
    const from_float_fn quantize = traits_of(Q8_0)->from_float;
    long differ;
    Py_BEGIN_ALLOW_THREADS
    differ = check_q5_0_tiles(tiles, (vec_dot_fn)(uintptr_t)vec_dot, quantize);
    Py_END_ALLOW_THREADS
    if (differ == -2) return PyErr_NoMemory();
    return PyLong_FromLong(differ);
}

static PyObject *q5_0_variant(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    for (int i = 0; i < q5_0_runs; i++)
        if (Q5_0_RUNS[i].tiles == q5_0_tiles) return PyUnicode_FromString(Q5_0_RUNS[i].name);
    return PyUnicode_FromString("");
}

static PyObject *use_q5_0(PyObject *self, PyObject *args) {
    (void)self;
    const char *name;
    if (!PyArg_ParseTuple(args, "z", &name)) return NULL;
    q5_0_tiles = name ? q5_0_run(name) : NULL;
    return PyBool_FromLong(q5_0_tiles != NULL);
}

static PyMethodDef methods[] = {
    {"q5_0_variants", q5_0_variants_of, METH_NOARGS,
     "q5_0_variants() -> the Q5_0 tiles' variants this CPU runs ('avx512-vnni', 'avx2'), the fastest first."},
    {"check_q5_0", check_q5_0, METH_VARARGS,
     "check_q5_0(vec_dot, variant) -> how many random products of the variant's Q5_0 tiles differ in any bit "
     "from the function at vec_dot (GGML's ggml_vec_dot_q5_0_q8_0); -1: no such variant, or before setup."},
    {"q5_0_variant", q5_0_variant, METH_NOARGS,
     "q5_0_variant() -> the variant the plain op takes Q5_0 weights to ('': the library's vec_dot)."},
    {"use_q5_0", use_q5_0, METH_VARARGS,
     "use_q5_0(variant or None) -> whether the plain op now takes Q5_0 weights to that variant's tiles "
     "(None: to the library's vec_dot)."},
    {"setup", setup, METH_VARARGS,
     "setup(type, ne, nb, src, data, traits, row_size, layouts): struct ggml_tensor's field offsets, the "
     "addresses of ggml_get_type_traits_cpu and ggml_row_size, and ((weight type, row type, gemv), ...)."},
    {"plain_op", plain_address, METH_NOARGS, "plain_op() -> the plain weights' op address (0 before setup)."},
    {"repacked_op", repacked_address, METH_NOARGS, "repacked_op() -> the repacked weights' op address (0 before setup)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lone_rows",
                                    "Several rows times a weight matrix, each row as GGML computes it alone.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__lone_rows(void) {
    q5_0_variants();
    return PyModule_Create(&module);
}
