/* runner.sample._best: the k best logits of a row, in one pass of C.

   Right after GGML has computed a token, each NumPy call pays again for its code and data (the
   weights have streamed through the caches): NumPy's top pass over a 49k row, about a dozen
   calls, took ~150 us there, and ~210 us over gemma3's 262k. This pass reads the row once
   (the maximum of each block of 64 logits with 4-wide vector compares; a block whose maximum
   cannot enter is skipped) and keeps the k best in a heap: ~32 us and ~78 us in the same
   place (bench/README.md, "The fifth pass").

   best(row, k, out) -> count
     row: a C-contiguous buffer of float32 logits (a NumPy array, a ctypes float array, a
          memoryview of either).
     out: a writable buffer of at least k records {int32 id; float32 logit; float32 p}, the
          layout of llama.cpp's llama_token_data.
     Writes the k best (fewer when fewer are above -inf) sorted by logit, descending, equal
     logits by id, ascending (a stable sort's order: the first k of NumPy's stable argsort of
     the negated row), with p = 0, and returns how many. (The old engine's llama.cpp chain
     reads them there.) A row holding a NaN raises ValueError, as the samplers do (k > 0).

   best_lists(row, k) -> (ids, logits)
     The same k best as two Python lists, int and float (what the new engine's sampler reads). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int32_t id;
    float logit;
    float p;
} Candidate;
_Static_assert(sizeof(Candidate) == 12, "llama_token_data is 12 bytes");

/* a ranks above b: a larger logit, or the same logit and a smaller id */
static inline int above(const Candidate *a, const Candidate *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* heap[0] is the lowest ranked of the heap */
static void sift_down(Candidate *heap, Py_ssize_t size, Py_ssize_t i) {
    for (;;) {
        Py_ssize_t low = i, left = 2 * i + 1, right = left + 1;
        if (left < size && above(&heap[low], &heap[left])) low = left;
        if (right < size && above(&heap[low], &heap[right])) low = right;
        if (low == i) return;
        Candidate t = heap[i];
        heap[i] = heap[low];
        heap[low] = t;
        i = low;
    }
}

static void sift_up(Candidate *heap, Py_ssize_t i) {
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!above(&heap[parent], &heap[i])) return;
        Candidate t = heap[i];
        heap[i] = heap[parent];
        heap[parent] = t;
        i = parent;
    }
}

#define BLOCK 64
typedef float f4 __attribute__((vector_size(16)));
typedef int32_t i4 __attribute__((vector_size(16)));

/* lane by lane, v where it is above m, else m (a NaN in v compares false: m stays) */
static inline f4 larger(f4 m, f4 v) {
    i4 gt = v > m;
    return (f4)(((i4)v & gt) | ((i4)m & ~gt));
}

static inline f4 load(const float *x) {
    f4 v;
    memcpy(&v, x, sizeof v);
    return v;
}

/* the largest of BLOCK logits, NaN ignored (lanes holding a NaN are set in *nan); four running
   maxima, so that the compares do not wait on each other */
static float block_max(const float *x, i4 *nan) {
    const f4 none = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    f4 a = none, b = none, c = none, d = none;
    i4 unordered = {0, 0, 0, 0};
    for (int j = 0; j < BLOCK; j += 16) {
        f4 va = load(x + j), vb = load(x + j + 4), vc = load(x + j + 8), vd = load(x + j + 12);
        unordered |= (va != va) | (vb != vb) | (vc != vc) | (vd != vd);
        a = larger(a, va);
        b = larger(b, vb);
        c = larger(c, vc);
        d = larger(d, vd);
    }
    *nan |= unordered;
    a = larger(larger(a, b), larger(c, d));
    float best = a[0];
    for (int j = 1; j < 4; j++) best = a[j] > best ? a[j] : best;
    return best;
}

/* The k best of row[0..n) into out, sorted (see the header); -1 when the row holds a NaN. */
static Py_ssize_t top(const float *row, Py_ssize_t n, Py_ssize_t k, Candidate *out) {
    Py_ssize_t size = 0;
    float bar = -INFINITY; /* a logit must be above it to enter: the lowest kept once full */
    i4 nan = {0, 0, 0, 0};
    int tail_nan = 0;
    if (k <= 0) return 0;
    for (Py_ssize_t start = 0; start < n; start += BLOCK) {
        Py_ssize_t end = start + BLOCK < n ? start + BLOCK : n;
        if (end - start == BLOCK) {
            if (!(block_max(row + start, &nan) > bar)) continue;
        } else {
            for (Py_ssize_t i = start; i < end; i++) tail_nan |= row[i] != row[i];
        }
        for (Py_ssize_t i = start; i < end; i++) {
            float v = row[i];
            if (!(v > bar)) continue; /* also -inf and NaN */
            if (size < k) {
                out[size].id = (int32_t)i;
                out[size].logit = v;
                out[size].p = 0.0f;
                sift_up(out, size++);
                if (size == k) bar = out[0].logit;
            } else { /* above the lowest kept: an equal logit's earlier id stays */
                out[0].id = (int32_t)i;
                out[0].logit = v;
                sift_down(out, k, 0);
                bar = out[0].logit;
            }
        }
    }
    if (tail_nan || nan[0] || nan[1] || nan[2] || nan[3]) return -1;
    for (Py_ssize_t last = size - 1; last > 0; last--) { /* heap sort: best first */
        Candidate t = out[0];
        out[0] = out[last];
        out[last] = t;
        sift_down(out, last, 0);
    }
    return size;
}

static const char NAN_ERROR[] = "sample: logits hold NaN, check model output";

/* The arguments both functions share: the row (args[0], a float32 buffer, released by the
   caller on success) and k (args[1], 0..max_k). 0, or -1 with the error set. */
static int row_and_k(PyObject *const *args, const char *name, Py_ssize_t max_k, Py_buffer *row, Py_ssize_t *k) {
    *k = PyLong_AsSsize_t(args[1]);
    if (*k == -1 && PyErr_Occurred()) return -1;
    if (*k < 0 || *k > max_k) {
        PyErr_Format(PyExc_ValueError, "%s: k out of range", name);
        return -1;
    }
    if (PyObject_GetBuffer(args[0], row, PyBUF_C_CONTIGUOUS) != 0) return -1;
    if (row->len % (Py_ssize_t)sizeof(float) != 0 || row->len / (Py_ssize_t)sizeof(float) > INT32_MAX) {
        PyBuffer_Release(row);
        PyErr_Format(PyExc_ValueError, "%s: row is not a float32 buffer", name);
        return -1;
    }
    return 0;
}

static PyObject *best(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "best(row, k, out) takes 3 arguments");
        return NULL;
    }
    Py_buffer row, out;
    Py_ssize_t k;
    if (row_and_k(args, "best", INT32_MAX, &row, &k) != 0) return NULL;
    if (PyObject_GetBuffer(args[2], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
        PyBuffer_Release(&row);
        return NULL;
    }
    PyObject *result = NULL;
    if (out.len < k * (Py_ssize_t)sizeof(Candidate)) {
        PyErr_SetString(PyExc_ValueError, "best: out holds fewer than k candidates");
    } else {
        Py_ssize_t count = top((const float *)row.buf, row.len / (Py_ssize_t)sizeof(float), k, (Candidate *)out.buf);
        if (count < 0)
            PyErr_SetString(PyExc_ValueError, NAN_ERROR);
        else
            result = PyLong_FromSsize_t(count);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&row);
    return result;
}

static PyObject *best_lists(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "best_lists(row, k) takes 2 arguments");
        return NULL;
    }
    Py_buffer row;
    Py_ssize_t k;
    if (row_and_k(args, "best_lists", 1 << 20, &row, &k) != 0) return NULL;
    PyObject *result = NULL, *ids = NULL, *logits = NULL;
    Candidate *heap = PyMem_Malloc((size_t)(k > 0 ? k : 1) * sizeof(Candidate));
    if (heap == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t count = top((const float *)row.buf, row.len / (Py_ssize_t)sizeof(float), k, heap);
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, NAN_ERROR);
        goto done;
    }
    ids = PyList_New(count);
    logits = PyList_New(count);
    if (ids == NULL || logits == NULL) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *id = PyLong_FromLong(heap[i].id), *logit = PyFloat_FromDouble(heap[i].logit);
        if (id == NULL || logit == NULL) {
            Py_XDECREF(id);
            Py_XDECREF(logit);
            goto done;
        }
        PyList_SET_ITEM(ids, i, id);
        PyList_SET_ITEM(logits, i, logit);
    }
    result = PyTuple_Pack(2, ids, logits);
done:
    Py_XDECREF(ids);
    Py_XDECREF(logits);
    PyMem_Free(heap);
    PyBuffer_Release(&row);
    return result;
}

static PyMethodDef methods[] = {
    {"best", (PyCFunction)(void (*)(void))best, METH_FASTCALL,
     "best(row, k, out) -> count: the k best float32 logits of row as {int32 id, float32 logit, "
     "float32 p = 0} records in out, by logit descending, equal logits by id; -inf never enters, "
     "NaN raises ValueError."},
    {"best_lists", (PyCFunction)(void (*)(void))best_lists, METH_FASTCALL,
     "best_lists(row, k) -> (ids, logits): the k best float32 logits of row as two lists, by "
     "logit descending, equal logits by id; -inf never enters, NaN raises ValueError."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_best",
    .m_doc = "The k best logits of a row (see best.c).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__best(void) { return PyModule_Create(&module); }
