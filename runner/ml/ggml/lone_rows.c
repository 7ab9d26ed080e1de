/* runner.ml.ggml._lone_rows: a weight matrix times several rows, each row computed as GGML
   computes a row alone.

   For a batch of 2 rows or more GGML's CPU backend multiplies most weight types with batched
   kernels (llamafile's tiles: F32, F16, BF16, Q4_0, Q5_0, IQ4_NL; its tiled K-quants from 8
   rows; repacked weights, 4 rows at a time), and for one row with one dot product per weight
   row. The two sum in different orders, so a verified draft's rows (issue 26) got other logits,
   in the last bits, than its tokens decoded one at a time. The ops here compute a batch with
   GGML's one-row functions themselves, looked up in the loaded library, so each row's numbers
   are the library's for that row alone by construction (nothing here does arithmetic):

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

   setup(type, ne, nb, src, data, traits, row_size, layouts) -> None
     Byte offsets of struct ggml_tensor's fields, the addresses of ggml_get_type_traits_cpu and
     ggml_row_size, and the repacked layouts: ((weight type, row type, gemv address), ...).
   plain_op() -> int, repacked_op() -> int
     ggml_custom_op_t addresses: dst f32 [M, n], src[0] the weights [K, M] (2D, rows of stride
     nb[1]; repacked_op: in one of setup's layouts, M a multiple of 8), src[1] f32 [K, n] (rows
     of stride nb[1]); userdata: an int32 set to 1 where a thread's memory for the quantized
     rows cannot be had (dst is then not computed). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

enum { F32 = 0, TYPES = 64 }; /* enum ggml_type: F32 fixed in GGML's file format; fewer than 64 */
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
    for (int64_t c0 = r0; c0 < r1; c0 += CHUNK) {
        const int64_t c1 = c0 + CHUNK < r1 ? c0 + CHUNK : r1;
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

static PyMethodDef methods[] = {
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

PyMODINIT_FUNC PyInit__lone_rows(void) { return PyModule_Create(&module); }
