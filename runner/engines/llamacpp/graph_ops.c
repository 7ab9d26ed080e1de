/* runner.engines.llamacpp._graph_ops: our kernels in llama.cpp's graph (the old engine).

   The old engine cannot change the graph llama.cpp builds, but llama.cpp's scheduler calls an
   eval callback (llama_context_params.cb_eval) about each node, in order, before computing it,
   asking whether the caller wants to see it; the nodes up to a wanted one are computed together,
   then the callback is called again with the wanted node's numbers. Asked about a node it takes,
   this callback turns the node, for that one compute, into a custom op running one of our
   kernels on GGML's threads, and called again it puts the node's op and parameters back, so the
   graph is llama.cpp's again (llama.cpp may reuse it). Three kinds of node are taken:

   - Q4_1 weights times 2 activation rows or more (any batch), where GGML runs one dot product
     per weight row and activation row: our Q4_1 kernels (runner/ml/ggml/q4_1.c) give the same
     numbers, bit for bit, several rows at a time.
   - In a batch of decoded tokens (``decoded``, set by the engine: a sampled token and its
     drafted ones), attention's products ("kq-<layer>", K^T Q, and "kqv-<layer>", V by the
     scores: f16 cache rows times several f32 rows), which GGML takes to llamafile's tiles: our
     f16 kernels (runner/ml/ggml/f16_rows.c) sum each as a lone row's, so a verified draft's
     logits are the ones decoding its tokens one at a time gives.
   - In a batch of decoded tokens, the other weight products whose batched kernels sum a row
     otherwise than GGML's one-row dot products (the weight types in ``lone_types``; repacked
     weights of the types in ``repacked_types``, the layouts lone_rows.c was set up with):
     runner/ml/ggml/lone_rows.c computes each row with those one-row functions.

   Every other node, and attention in other batches, is llama.cpp's own; so is every node whose
   numbers or operands are not in host memory (a build with a GPU backend computes those there,
   offloaded layers or large products, and a GPU backend has no custom ops), repacked weights
   (CPU memory in a buffer of their own) apart. The kernels are checked against the loaded
   library's own dot products before they are handed in (their modules).

   new(offsets, ops, is_host, q4_1_op, f16_op, lone) -> int
     A state (the callback's user data): offsets of struct ggml_tensor's type, buffer, ne, nb, op,
     op_params, src, data and name; enum ggml_op's MUL_MAT and CUSTOM; the address of
     ggml_backend_buffer_is_host; the op addresses (0: that kind is not taken); lone: (plain
     op, repacked op, their types' bit masks, ggml_backend_buffer_get_type's address, the
     repacked weights' buffer type), zeros where lone products are not taken. Its first int32
     is ``decoded``, which the engine flips before a decode.
   free(state), failed(state) -> bool (after a decode: a kernel could not get its memory since
     the last call, so the decode's numbers are not to be read; it also puts back a node a
     stopped compute left custom), taken(state) -> (Q4_1 products, attention ones, lone-row ones).
   callback() -> int
     The ggml_backend_sched_eval_callback's address. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { F32 = 0, F16 = 1, Q4_1 = 3 };  /* enum ggml_type: fixed in GGML's file format */
#define OP_PARAMS 64                  /* GGML_MAX_OP_PARAMS: the bytes put back */

typedef void (*custom_op)(void *dst, int ith, int nth, void *userdata);
typedef struct { custom_op fun; int n_tasks; void *userdata; } custom_params; /* ggml_custom_op_params */

typedef struct {
    volatile int32_t decoded; /* first: the engine sets it (ctypes, at the state's address) */
    volatile int32_t failed;  /* set by a kernel (its userdata) */
    struct { size_t type, buffer, ne, nb, op, op_params, src, data, name; } off;
    int32_t mul_mat, custom;
    _Bool (*is_host)(void *buffer);
    custom_op q4_1_op, f16_op, lone_op, lone_repacked_op;
    unsigned long long lone_types, repacked_types; /* bit t: enum ggml_type t */
    void *(*buffer_type)(void *buffer); /* ggml_backend_buffer_get_type */
    void *repacked;                     /* the repacked weights' buffer type */
    void *node; /* the node turned custom, until it is put back */
    int32_t saved_op;
    unsigned char saved_params[OP_PARAMS];
    int64_t taken_q4_1, taken_attention, taken_lone;
} state_t;

#define AT(s, t, field, type) (*(type *)((char *)(t) + (s)->off.field))
#define TYPE(s, t) AT(s, t, type, int32_t)
#define NE(s, t, i) (((int64_t *)((char *)(t) + (s)->off.ne))[i])
#define NB(s, t, i) (((size_t *)((char *)(t) + (s)->off.nb))[i])
#define SRC(s, t, i) (((void **)((char *)(t) + (s)->off.src))[i])

static int in_host_memory(const state_t *s, void *t) {
    void *buffer = AT(s, t, buffer, void *);
    return buffer && s->is_host(buffer);
}

static int repacked(const state_t *s, void *t) {
    void *buffer = AT(s, t, buffer, void *);
    return buffer && s->repacked && s->buffer_type(buffer) == s->repacked;
}

/* dst = a times b, with b's rows f32 (nb[0] 4), dst f32 and [a's rows, b's rows, b's ne2, ne3],
   b and dst in host memory (a: the caller asks) */
static int plain_product(const state_t *s, void *t, void *a, void *b) {
    return a && b && !SRC(s, t, 2) && AT(s, t, op, int32_t) == s->mul_mat && TYPE(s, b) == F32 &&
           TYPE(s, t) == F32 && NB(s, b, 0) == 4 && NB(s, t, 0) == 4 && NE(s, a, 0) == NE(s, b, 0) &&
           NE(s, t, 0) == NE(s, a, 1) && NE(s, t, 1) == NE(s, b, 1) && NE(s, t, 2) == NE(s, b, 2) &&
           NE(s, t, 3) == NE(s, b, 3) && NE(s, b, 1) > 1 && in_host_memory(s, t) && in_host_memory(s, b);
}

/* a decoded batch's weight product (2D weights, 2D rows) for lone_rows.c, or NULL */
static custom_op lone(const state_t *s, void *a, void *b) {
    const int32_t type = TYPE(s, a);
    if (!s->decoded || NE(s, a, 2) * NE(s, a, 3) * NE(s, b, 2) * NE(s, b, 3) != 1 || type < 0 || type >= 64)
        return NULL;
    if (repacked(s, a)) /* 8 rows interleaved */
        return (s->repacked_types >> type & 1) && NE(s, a, 1) % 8 == 0 ? s->lone_repacked_op : NULL;
    return in_host_memory(s, a) && (s->lone_types >> type & 1) ? s->lone_op : NULL;
}

/* the op to run node t with, or NULL: llama.cpp's own */
static custom_op take(const state_t *s, void *t) {
    void *a = SRC(s, t, 0), *b = SRC(s, t, 1);
    if (!plain_product(s, t, a, b)) return NULL;
    if (s->q4_1_op && TYPE(s, a) == Q4_1 && in_host_memory(s, a)) /* weights [K, M], contiguous; rows [K, n] */
        return NE(s, a, 0) % 32 == 0 && NB(s, a, 0) == 20 && NB(s, a, 1) == (size_t)NE(s, a, 0) / 32 * 20 &&
                       NE(s, a, 2) * NE(s, a, 3) * NE(s, b, 2) * NE(s, b, 3) == 1
                   ? s->q4_1_op
                   : NULL;
    const char *name = &AT(s, t, name, char);
    if (name[0] == 'k' && name[1] == 'q' && (name[2] == '-' || (name[2] == 'v' && name[3] == '-')))
        return s->f16_op && s->decoded && TYPE(s, a) == F16 && NB(s, a, 0) == 2 && in_host_memory(s, a) &&
                       NE(s, b, 2) % NE(s, a, 2) == 0 && NE(s, b, 3) % NE(s, a, 3) == 0
                   ? s->f16_op
                   : NULL;
    return lone(s, a, b);
}

/* the node turned custom made llama.cpp's again, if one still is */
static void put_back(state_t *s) {
    if (!s->node) return;
    AT(s, s->node, op, int32_t) = s->saved_op;
    memcpy(&AT(s, s->node, op_params, char), s->saved_params, OP_PARAMS);
    s->node = NULL;
}

/* ggml_backend_sched_eval_callback */
static _Bool callback(void *t, _Bool ask, void *user) {
    state_t *s = user;
    if (ask) {
        const custom_op op = take(s, t);
        if (!op) return 0;
        const custom_params p = {op, -1 /* GGML_N_TASKS_MAX: every thread */, (void *)&s->failed};
        s->node = t, s->saved_op = AT(s, t, op, int32_t);
        memcpy(s->saved_params, &AT(s, t, op_params, char), OP_PARAMS);
        memcpy(&AT(s, t, op_params, char), &p, sizeof p);
        AT(s, t, op, int32_t) = s->custom;
        if (op == s->q4_1_op) s->taken_q4_1++;
        else if (op == s->f16_op) s->taken_attention++;
        else s->taken_lone++;
        return 1;
    }
    if (s->node == t) put_back(s); /* computed: llama.cpp's node again */
    return 1;
}

/* ------------------------------------------------------------------------------- Python */
static PyObject *new(PyObject *self, PyObject *args) {
    (void)self;
    state_t *s = calloc(1, sizeof *s);
    if (!s) return PyErr_NoMemory();
    unsigned long long is_host, q4_1_op, f16_op, lone_op, lone_repacked_op, buffer_type, repacked_type;
    if (!PyArg_ParseTuple(args, "(nnnnnnnnn)(ii)KKK(KKKKKK)", &s->off.type, &s->off.buffer, &s->off.ne, &s->off.nb,
                          &s->off.op, &s->off.op_params, &s->off.src, &s->off.data, &s->off.name, &s->mul_mat,
                          &s->custom, &is_host, &q4_1_op, &f16_op, &lone_op, &lone_repacked_op, &s->lone_types,
                          &s->repacked_types, &buffer_type, &repacked_type)) {
        free(s);
        return NULL;
    }
    if (!is_host) {
        free(s);
        PyErr_SetString(PyExc_ValueError, "no ggml_backend_buffer_is_host");
        return NULL;
    }
    s->is_host = (_Bool (*)(void *))(uintptr_t)is_host;
    s->q4_1_op = (custom_op)(uintptr_t)q4_1_op, s->f16_op = (custom_op)(uintptr_t)f16_op;
    s->lone_op = (custom_op)(uintptr_t)lone_op;
    /* repacked weights need the buffer type to be recognized by */
    if (buffer_type && repacked_type) {
        s->lone_repacked_op = (custom_op)(uintptr_t)lone_repacked_op;
        s->buffer_type = (void *(*)(void *))(uintptr_t)buffer_type, s->repacked = (void *)(uintptr_t)repacked_type;
    }
    return PyLong_FromVoidPtr(s);
}

static state_t *state_of(PyObject *arg) {
    state_t *s = PyLong_AsVoidPtr(arg);
    if (!s && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "no state");
    return s;
}

static PyObject *free_state(PyObject *self, PyObject *arg) {
    (void)self;
    state_t *s = state_of(arg);
    if (!s) return NULL;
    free(s);
    Py_RETURN_NONE;
}

static PyObject *failed(PyObject *self, PyObject *arg) {
    (void)self;
    state_t *s = state_of(arg);
    if (!s) return NULL;
    put_back(s); /* a graph whose compute stopped early never called back with the node */
    const int was = s->failed;
    s->failed = 0;
    return PyBool_FromLong(was);
}

static PyObject *taken(PyObject *self, PyObject *arg) {
    (void)self;
    const state_t *s = state_of(arg);
    if (!s) return NULL;
    return Py_BuildValue("(LLL)", (long long)s->taken_q4_1, (long long)s->taken_attention,
                         (long long)s->taken_lone);
}

static PyObject *callback_address(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong((uintptr_t)callback);
}

static PyMethodDef methods[] = {
    {"new", new, METH_VARARGS,
     "new((type, buffer, ne, nb, op, op_params, src, data, name offsets), (MUL_MAT, CUSTOM), is_host, q4_1_op, "
     "f16_op, (lone_op, lone_repacked_op, lone_types, repacked_types, buffer_get_type, repacked_type)) -> state"},
    {"free", free_state, METH_O, "free(state)"},
    {"failed", failed, METH_O, "failed(state) -> whether a kernel lacked memory since the last call"},
    {"taken", taken, METH_O, "taken(state) -> (Q4_1 products, attention products, lone-row products) computed by our kernels"},
    {"callback", callback_address, METH_NOARGS, "callback() -> the eval callback's address"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_graph_ops", "Our kernels in llama.cpp's graph.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__graph_ops(void) { return PyModule_Create(&module); }
