/* The call of a compiled C backward in C (see c_run.py); its callback sites
   are c_sites.c, which follows this file in one translation unit.

   Runner(spec) holds what CBackward.build derived from the program; calling it,
   runner(inputs, sizes, scalars, hooks, packed_data), does what CBackward.__call__'s
   Python path does, in the same order:
     1. take each Python object the C needs out of the boxes (an ``inputs``,
        ``hooks`` or ``packed_data`` slot becomes None: the call owns the object
        from here; sizes and scalars are read, not taken);
     2. read each input array (a leaf Tensor through its ``_data``), and check it
        has the traced shape, dtype and layout (C-contiguous, or the strides a
        saved view had when traced); any other value goes
        to the Python ``fix_input`` (which raises, or copies it into the layout
        the C was compiled for);
     3. read the sizes and scalars (if the program reads any: ``reads``), and
        allocate the arena, the output arrays and the arena blocks the call
        starts with (an output or block a callback allocates waits for it);
     4. call ca_backward (without the GIL: the C touches only array memory). At
        each callback site (``site_callback``, under the GIL) run the site's ops
        -- accumulations due before it, arrays past their last use released,
        arena blocks closed, outputs allocated -- then its hook, one vectorcall
        with the arguments made here, its results checked (another layout goes
        to the Python ``fix_result``) and handed to C, then the blocks it opens;
     5. hand the remaining gradients to the Python ``accumulate``
        (node.accumulate_into), in the program's order, so that the .grad rules
        are written once;
     6. return the results.
   On an error the objects taken stay taken, as on the Python path; an exception
   a hook raised is raised once the C function has returned. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/pool.h"

typedef int (*ca_callback)(int site, void **results, int *done);
typedef int (*backward_fn)(void **in, void **out, char *arena, const int64_t *sizes,
                           const double *scalars, const int64_t *offsets, ca_callback cb);

typedef struct {
    int ndim, type;
    npy_intp dims[NPY_MAXDIMS];
} Layout;

/* A callback site's work (see CBackward._native_runner): its ops before the hook
   (deferred accumulations, releases, arena blocks closed, outputs allocated), the
   hook with its arguments, where its results go, and its ops after (blocks opened). */
enum { OP_FLUSH, OP_RELEASE_IN, OP_RELEASE_EXT, OP_CLOSE, OP_ALLOC, OP_OPEN };
enum { ARG_LITERAL, ARG_REF, ARG_WHOLE, ARG_VIEW };
enum { AT_IN, AT_OUT, AT_EXT, AT_ARENA };

typedef struct {
    int kind, at, copy;
    PyObject *literal;        /* borrowed from the Runner's ``sites`` tuple */
    Py_ssize_t index;         /* ARG_REF: ref slot; else the storage (or block, -1: arena) */
    Py_ssize_t offset;        /* ARG_VIEW: bytes from the storage's first byte */
    Layout layout;
    npy_intp strides[NPY_MAXDIMS];
} Arg;

typedef struct {
    Py_ssize_t item, ext;     /* item -1: the value itself, else value[item] */
    Layout layout;
    npy_intp strides[NPY_MAXDIMS];   /* the bytes strides the C reads it with */
} Result;

typedef struct {
    PyObject *fn;             /* borrowed; NULL: a release site */
    Py_ssize_t n_pre, n_post, n_args, n_res;
    int *op;                  /* n_pre ops, then n_post */
    Py_ssize_t *op_arg;
    Arg *args;
    Result *res;
} Site;

typedef struct {
    PyObject_HEAD
    backward_fn fn;
    Py_ssize_t n_refs, n_in, n_out, n_acc, n_res, arena_bytes;
    Py_ssize_t n_ext, n_blocks, n_sites;
    Py_ssize_t *ref_box;      /* per ref slot: its box (0 inputs .. 4 packed_data) */
    Py_ssize_t *ref_index;    /* ... its index in that list */
    char *ref_take;           /* ... whether the call takes it (the slot becomes None) */
    Py_ssize_t *in_slot;      /* per input of the C: its ref slot */
    char *in_keep;            /* ... whether the object itself is needed later */
    Layout *in_layout, *out_layout;
    npy_intp (*in_strides)[NPY_MAXDIMS];  /* per input: its byte strides ... */
    char *in_strided;         /* ... if it is read strided (else C-contiguous) */
    char *out_late;           /* per output: allocated at a callback, not at the start */
    Py_ssize_t *acc_slot, *acc_out;
    char *acc_owned, *acc_drop;
    Py_ssize_t *res_kind, *res_index;     /* kind 0: None, 1: ref slot, 2: output */
    npy_intp *block_bytes;    /* per arena block (codegen/arena.py) */
    char *block_at_start;
    Site *sites;
    int reads_sizes, reads_scalars;       /* (a program without symbols reads neither) */
    PyObject *errors, *accumulate, *fix_input, *fix_result, *site_specs;
} Runner;

/* One running call: what its callbacks need. The generated code's callback has
   no context argument: the thread's innermost call is ``current_call`` (a hook
   that runs another compiled backward nests one inside). */
typedef struct Call {
    Runner *r;
    PyThreadState *tstate;    /* saved while the C runs without the GIL */
    PyObject **refs, **in, **out, **ext;     /* out: the outputs, then the arena blocks */
    char *arena;
    PyObject *sizes;
    Py_ssize_t flushed;       /* accumulations done */
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *error;
#else
    PyObject *etype, *evalue, *etb;
#endif
    int failed;
    struct Call *outer;
} Call;

static _Thread_local Call *current_call;

/* The callback sites' work (c_sites.c, later in this translation unit). */
static int read_site(Runner *r, PyObject *spec, Site *s);
static int read_strided(PyObject *layout, PyObject *strides, Layout *l, npy_intp *out);
static int flush(Call *c, Py_ssize_t upto);
static PyObject *new_block(npy_intp bytes);
static int site_callback(int site, void **results, int *done);
static PyObject *output_array(const Layout *l);

static void runner_free_arrays(Runner *r)
{
    PyMem_Free(r->ref_box); PyMem_Free(r->ref_index); PyMem_Free(r->ref_take);
    PyMem_Free(r->in_slot); PyMem_Free(r->in_keep);
    PyMem_Free(r->in_layout); PyMem_Free(r->out_layout); PyMem_Free(r->out_late);
    PyMem_Free(r->in_strides); PyMem_Free(r->in_strided);
    PyMem_Free(r->acc_slot); PyMem_Free(r->acc_out); PyMem_Free(r->acc_owned);
    PyMem_Free(r->acc_drop); PyMem_Free(r->res_kind); PyMem_Free(r->res_index);
    PyMem_Free(r->block_bytes); PyMem_Free(r->block_at_start);
    if (r->sites != NULL)
        for (Py_ssize_t k = 0; k < r->n_sites; k++) {
            PyMem_Free(r->sites[k].op); PyMem_Free(r->sites[k].op_arg);
            PyMem_Free(r->sites[k].args); PyMem_Free(r->sites[k].res);
        }
    PyMem_Free(r->sites);
}

/* The Python objects a Runner holds: the collector sees them (a fix_input that
   reaches back to the runner's owner makes a cycle). */
static int runner_traverse(Runner *r, visitproc visit, void *arg)
{
    Py_VISIT(r->errors);
    Py_VISIT(r->accumulate);
    Py_VISIT(r->fix_input);
    Py_VISIT(r->fix_result);
    Py_VISIT(r->site_specs);
    return 0;
}

static int runner_clear(Runner *r)
{
    Py_CLEAR(r->errors);
    Py_CLEAR(r->accumulate);
    Py_CLEAR(r->fix_input);
    Py_CLEAR(r->fix_result);
    Py_CLEAR(r->site_specs);
    return 0;
}

static void runner_dealloc(Runner *r)
{
    PyObject_GC_UnTrack(r);
    runner_free_arrays(r);
    runner_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* A (shape tuple, numpy type number) pair into a Layout. */
static int read_layout(PyObject *item, Layout *out)
{
    PyObject *shape;
    if (!PyArg_ParseTuple(item, "O!i", &PyTuple_Type, &shape, &out->type))
        return -1;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    if (nd > NPY_MAXDIMS) {
        PyErr_Format(PyExc_ValueError, "Runner: %zd dimensions (at most %d)", nd, NPY_MAXDIMS);
        return -1;
    }
    PyArray_Descr *descr = PyArray_DescrFromType(out->type);     /* a known type number */
    if (descr == NULL)
        return -1;
    Py_DECREF(descr);
    out->ndim = (int)nd;
    for (Py_ssize_t d = 0; d < nd; d++) {
        out->dims[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (out->dims[d] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* A zeroed PyMem array of n (+1, so never of size 0) elements; true on failure. */
#define ALLOC(ptr, n) (((ptr) = PyMem_Calloc((size_t)(n) + 1, sizeof *(ptr))) == NULL)

static int runner_init(Runner *r, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"fn", "refs", "inputs", "outputs", "accumulations", "results",
                            "arena_bytes", "errors", "accumulate", "fix_input", "reads",
                            "late", "blocks", "n_ext", "sites", "fix_result", NULL};
    unsigned long long fn;
    PyObject *refs, *inputs, *outputs, *accs, *results, *errors, *accumulate, *fix_input;
    PyObject *late = NULL, *blocks = NULL, *sites = NULL, *fix_result = Py_None;
    if (r->fn != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Runner is initialised once");
        return -1;
    }
    r->reads_sizes = r->reads_scalars = 1;
    r->n_ext = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KO!O!O!O!O!nO!OO|(pp)O!O!nO!O", names, &fn,
                                     &PyTuple_Type, &refs, &PyTuple_Type, &inputs,
                                     &PyTuple_Type, &outputs, &PyTuple_Type, &accs,
                                     &PyTuple_Type, &results, &r->arena_bytes,
                                     &PyTuple_Type, &errors, &accumulate, &fix_input,
                                     &r->reads_sizes, &r->reads_scalars, &PyTuple_Type, &late,
                                     &PyTuple_Type, &blocks, &r->n_ext, &PyTuple_Type, &sites,
                                     &fix_result))
        return -1;
    r->n_refs = PyTuple_GET_SIZE(refs);
    r->n_in = PyTuple_GET_SIZE(inputs);
    r->n_out = PyTuple_GET_SIZE(outputs);
    r->n_acc = PyTuple_GET_SIZE(accs);
    r->n_res = PyTuple_GET_SIZE(results);
    r->n_blocks = blocks ? PyTuple_GET_SIZE(blocks) : 0;
    r->n_sites = sites ? PyTuple_GET_SIZE(sites) : 0;
    if ((late && PyTuple_GET_SIZE(late) != r->n_out) || r->n_ext < 0) {
        PyErr_SetString(PyExc_ValueError, "Runner: late must say it of every output");
        goto fail;
    }
    if (ALLOC(r->ref_box, r->n_refs) || ALLOC(r->ref_index, r->n_refs)
        || ALLOC(r->ref_take, r->n_refs) || ALLOC(r->in_slot, r->n_in) || ALLOC(r->in_keep, r->n_in)
        || ALLOC(r->in_layout, r->n_in) || ALLOC(r->out_layout, r->n_out)
        || ALLOC(r->in_strides, r->n_in) || ALLOC(r->in_strided, r->n_in)
        || ALLOC(r->out_late, r->n_out) || ALLOC(r->acc_slot, r->n_acc)
        || ALLOC(r->acc_out, r->n_acc) || ALLOC(r->acc_owned, r->n_acc)
        || ALLOC(r->acc_drop, r->n_acc) || ALLOC(r->res_kind, r->n_res)
        || ALLOC(r->res_index, r->n_res) || ALLOC(r->block_bytes, r->n_blocks)
        || ALLOC(r->block_at_start, r->n_blocks) || ALLOC(r->sites, r->n_sites)) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < r->n_refs; k++) {
        int take;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(refs, k), "nnp", &r->ref_box[k], &r->ref_index[k],
                              &take))
            goto fail;
        r->ref_take[k] = (char)take;
        if (r->ref_box[k] < 0 || r->ref_box[k] > 4 || r->ref_index[k] < 0)
            goto range;
    }
    for (Py_ssize_t j = 0; j < r->n_in; j++) {
        PyObject *layout, *strides;
        int keep;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(inputs, j), "npOO", &r->in_slot[j], &keep,
                              &layout, &strides))
            goto fail;
        r->in_keep[j] = (char)keep;
        r->in_strided[j] = strides != Py_None;
        if (r->in_strided[j] ? read_strided(layout, strides, &r->in_layout[j], r->in_strides[j])
                             : read_layout(layout, &r->in_layout[j]))
            goto fail;
    }
    for (Py_ssize_t j = 0; j < r->n_out; j++) {
        if (read_layout(PyTuple_GET_ITEM(outputs, j), &r->out_layout[j]) < 0)
            goto fail;
        if (late && (r->out_late[j] = (char)PyObject_IsTrue(PyTuple_GET_ITEM(late, j))) < 0)
            goto fail;
    }
    for (Py_ssize_t k = 0; k < r->n_acc; k++) {
        int owned, drop = 0;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(accs, k), "nnp|p", &r->acc_slot[k], &r->acc_out[k],
                              &owned, &drop))
            goto fail;
        r->acc_owned[k] = (char)owned;
        r->acc_drop[k] = (char)drop;
    }
    for (Py_ssize_t k = 0; k < r->n_res; k++)
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(results, k), "nn", &r->res_kind[k],
                              &r->res_index[k]))
            goto fail;
    for (Py_ssize_t k = 0; k < r->n_blocks; k++) {
        int at_start;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(blocks, k), "np", &r->block_bytes[k], &at_start))
            goto fail;
        r->block_at_start[k] = (char)at_start;
        if (r->block_bytes[k] < 0)
            goto range;
    }
    /* Every index in range, so that a call never reads outside its arrays. */
    for (Py_ssize_t j = 0; j < r->n_in; j++)
        if (r->in_slot[j] < 0 || r->in_slot[j] >= r->n_refs)
            goto range;
    for (Py_ssize_t k = 0; k < r->n_acc; k++)
        if (r->acc_slot[k] < 0 || r->acc_slot[k] >= r->n_refs || r->acc_out[k] < 0 ||
            r->acc_out[k] >= r->n_out)
            goto range;
    for (Py_ssize_t k = 0; k < r->n_res; k++) {
        Py_ssize_t kind = r->res_kind[k], i = r->res_index[k];
        if (kind < 0 || kind > 2 || (kind == 1 && (i < 0 || i >= r->n_refs)) ||
            (kind == 2 && (i < 0 || i >= r->n_out)))
            goto range;
    }
    if (fn == 0 || r->arena_bytes < 0)
        goto range;
    for (Py_ssize_t e = 0; e < PyTuple_GET_SIZE(errors); e++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(errors, e))) {
            PyErr_SetString(PyExc_TypeError, "Runner: errors must be strings");
            goto fail;
        }
    for (Py_ssize_t k = 0; k < r->n_sites; k++)
        if (read_site(r, PyTuple_GET_ITEM(sites, k), &r->sites[k]) < 0)
            goto fail;
    r->fn = (backward_fn)(uintptr_t)fn;
    r->errors = Py_NewRef(errors);
    r->accumulate = Py_NewRef(accumulate);
    r->fix_input = Py_NewRef(fix_input);
    r->fix_result = Py_NewRef(fix_result);
    r->site_specs = sites ? Py_NewRef(sites) : NULL;   /* (holds the sites' objects) */
    return 0;
range:
    PyErr_SetString(PyExc_ValueError, "Runner: an index out of range");
fail:
    runner_free_arrays(r);
    memset(&r->fn, 0, sizeof *r - offsetof(Runner, fn));
    return -1;
}

/* Does an array have layout ``l``: its shape and dtype, and ``strides`` (bytes,
   over the dims of more than one element) or, with NULL, C-contiguity? */
static int has_layout(PyArrayObject *a, const Layout *l, const npy_intp *strides)
{
    if (PyArray_NDIM(a) != l->ndim || PyArray_TYPE(a) != l->type || !PyArray_ISNOTSWAPPED(a))
        return 0;
    for (int d = 0; d < l->ndim; d++)
        if (PyArray_DIM(a, d) != l->dims[d])
            return 0;
    if (strides == NULL)
        return PyArray_IS_C_CONTIGUOUS(a);
    if (PyArray_SIZE(a) > 1)
        for (int d = 0; d < l->ndim; d++)
            if (l->dims[d] > 1 && PyArray_STRIDE(a, d) != strides[d])
                return 0;
    return 1;
}

static PyObject *data_name;     /* "_data", interned once */

/* The array of input ``j``, a new reference: ``obj`` itself, its ``_data`` (a
   leaf Tensor), or what fix_input(j, value, sizes) returns. */
static PyObject *input_array(Runner *r, Py_ssize_t j, PyObject *obj, PyObject *sizes)
{
    PyObject *arr;
    if (PyArray_CheckExact(obj)) {
        arr = Py_NewRef(obj);
    } else if ((arr = PyObject_GetAttr(obj, data_name)) == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
        arr = Py_NewRef(obj);
    }
    if (PyArray_CheckExact(arr)
        && has_layout((PyArrayObject *)arr, &r->in_layout[j],
                      r->in_strided[j] ? r->in_strides[j] : NULL))
        return arr;
    PyObject *index = PyLong_FromSsize_t(j);
    PyObject *fixed = index ? PyObject_CallFunctionObjArgs(r->fix_input, index, arr, sizes, NULL)
                            : NULL;
    Py_XDECREF(index);
    Py_DECREF(arr);
    if (fixed != NULL && !PyArray_Check(fixed)) {
        PyErr_SetString(PyExc_TypeError, "Runner: fix_input did not return an array");
        Py_CLEAR(fixed);
    }
    return fixed;
}

/* The caching allocator (runtime/pool.h's ``pool``): the arena and every array
   of the pool's size or more (a large gradient, an arena block) come from it. A
   training step drops its gradients (zero_grad(set_to_none)) and the next
   backward makes them again: a kept block costs neither page faults nor the
   kernel's zeroing of fresh pages. Each use reads ``pool`` once: Python code
   may run in between (a garbage collection's finalizers, a hook) and may set
   another allocator (``use_allocator``); what was taken from one goes back to it. */

/* An uninitialised C-contiguous array, from the pool when it is large. */
static PyObject *empty_array(int nd, npy_intp const *dims, int type, size_t nbytes)
{
    const PoolApi *from = pool;
    PyObject *previous = NULL;
    if (from != NULL && nbytes >= from->min_bytes && (previous = from->enter()) == NULL)
        return NULL;
    PyObject *arr = PyArray_EMPTY(nd, (npy_intp *)dims, type, 0);
    if (previous != NULL && from->leave(previous) < 0)
        Py_CLEAR(arr);
    return arr;
}

static PyObject *output_array(const Layout *l)
{
    npy_intp n = 1;
    for (int d = 0; d < l->ndim; d++)
        n *= l->dims[d];
    PyArray_Descr *descr = PyArray_DescrFromType(l->type);
    if (descr == NULL)
        return NULL;
    size_t nbytes = (size_t)n * (size_t)PyDataType_ELSIZE(descr);
    Py_DECREF(descr);
    return empty_array(l->ndim, l->dims, l->type, nbytes);
}

/* The call's arena: raw memory, seen by tracemalloc as PyMem_RawMalloc's is;
   ``*from`` is the allocator it came from (NULL: malloc), for ``arena_free``. */
static char *arena_alloc(size_t bytes, const PoolApi **from)
{
    *from = pool;
    char *p = *from != NULL ? (*from)->alloc(bytes) : malloc(bytes);
    if (p == NULL)
        return NULL;
    PyTraceMalloc_Track(0, (uintptr_t)p, bytes);
    return p;
}

static void arena_free(char *p, const PoolApi *from)
{
    if (p == NULL)
        return;
    PyTraceMalloc_Untrack(0, (uintptr_t)p);
    if (from != NULL)
        from->free(p);
    else
        free(p);
}

/* The numbers of a list as a C array (PyMem; NULL with no error when empty). */
static int read_numbers(PyObject *list, int as_double, void **out)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    *out = NULL;
    if (n == 0)
        return 0;
    if ((*out = PyMem_Malloc((size_t)n * 8)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i >= PyList_GET_SIZE(list)) {
            PyErr_SetString(PyExc_RuntimeError, "compiled C backward: sizes changed size");
            return -1;
        }
        PyObject *v = Py_NewRef(PyList_GET_ITEM(list, i));  /* __index__ may run code */
        int failed;
        if (as_double) {
            double x = ((double *)*out)[i] = PyFloat_AsDouble(v);
            failed = x == -1.0 && PyErr_Occurred();
        } else {
            int64_t x = ((int64_t *)*out)[i] = PyLong_AsLongLong(v);
            failed = x == -1 && PyErr_Occurred();
        }
        Py_DECREF(v);
        if (failed)
            return -1;
    }
    return 0;
}

static PyObject *runner_call(Runner *r, PyObject *args, PyObject *kwds)
{
    PyObject *boxes[5] = {NULL, NULL, NULL, NULL, NULL};
    static char *names[] = {"inputs", "sizes", "scalars", "hooks", "packed_data", NULL};
    if (r->fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Runner: not initialised");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!|O!O!", names, &PyList_Type, &boxes[0],
                                     &PyList_Type, &boxes[1], &PyList_Type, &boxes[2],
                                     &PyList_Type, &boxes[3], &PyList_Type, &boxes[4]))
        return NULL;
    PyObject *sizes = boxes[1], *scalars = boxes[2];
    PyObject *result = NULL;
    Py_ssize_t n_objs = r->n_refs + r->n_in + r->n_out + r->n_blocks + r->n_ext;
    PyObject **refs = PyMem_Calloc((size_t)n_objs + 1, sizeof(PyObject *));
    void *size_arr = NULL, *scalar_arr = NULL;
    char *arena = NULL;
    const PoolApi *arena_from = NULL;
    if (refs == NULL)
        return PyErr_NoMemory();
    PyObject **in = refs + r->n_refs, **out = in + r->n_in, **ext = out + r->n_out + r->n_blocks;
    for (Py_ssize_t k = 0; k < r->n_refs; k++) {
        PyObject *box = boxes[r->ref_box[k]];
        Py_ssize_t i = r->ref_index[k];
        if (box == NULL || i >= PyList_GET_SIZE(box)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");  /* as list[i] */
            goto done;
        }
        if (r->ref_take[k]) {
            refs[k] = PyList_GET_ITEM(box, i);          /* the list's reference, now ours */
            PyList_SET_ITEM(box, i, Py_NewRef(Py_None));
        } else {
            refs[k] = Py_NewRef(PyList_GET_ITEM(box, i));
        }
    }
    for (Py_ssize_t j = 0; j < r->n_in; j++) {
        Py_ssize_t slot = r->in_slot[j];
        if ((in[j] = input_array(r, j, refs[slot], sizes)) == NULL)
            goto done;
    }
    for (Py_ssize_t j = 0; j < r->n_in; j++)    /* the arrays are all the call keeps */
        if (!r->in_keep[j])
            Py_CLEAR(refs[r->in_slot[j]]);
    if ((r->reads_sizes && read_numbers(sizes, 0, &size_arr) < 0)
        || (r->reads_scalars && read_numbers(scalars, 1, &scalar_arr) < 0))
        goto done;
    if ((arena = arena_alloc((size_t)(r->arena_bytes > 0 ? r->arena_bytes : 1), &arena_from)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < r->n_out; j++) {
        Layout *l = &r->out_layout[j];
        if (!r->out_late[j] && (out[j] = output_array(l)) == NULL)
            goto done;
    }
    for (Py_ssize_t k = 0; k < r->n_blocks; k++)
        if (r->block_at_start[k] && (out[r->n_out + k] = new_block(r->block_bytes[k])) == NULL)
            goto done;
    Call c = {.r = r, .refs = refs, .in = in, .out = out, .ext = ext, .arena = arena,
              .sizes = sizes, .outer = current_call};
    current_call = &c;
    c.tstate = PyEval_SaveThread();
    int rc = r->fn((void **)in, (void **)out, arena, size_arr, scalar_arr, NULL,
                   r->n_sites ? site_callback : NULL);
    PyEval_RestoreThread(c.tstate);
    current_call = c.outer;
    if (c.failed) {              /* a callback's exception, as the Python path raises it */
#if PY_VERSION_HEX >= 0x030C0000
        PyErr_SetRaisedException(c.error);
#else
        PyErr_Restore(c.etype, c.evalue, c.etb);
#endif
        goto done;
    }
    if (rc != 0) {
        Py_ssize_t e = -(Py_ssize_t)rc - 1;
        if (rc > 0 || e >= PyTuple_GET_SIZE(r->errors))
            PyErr_Format(PyExc_RuntimeError, "compiled C backward: return code %d", rc);
        else
            PyErr_Format(PyExc_RuntimeError, "compiled C backward: %U",
                         PyTuple_GET_ITEM(r->errors, e));
        goto done;
    }
    if (flush(&c, r->n_acc) < 0)
        goto done;
    if ((result = PyTuple_New(r->n_res)) == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < r->n_res; k++) {
        Py_ssize_t kind = r->res_kind[k], i = r->res_index[k];
        PyObject *v = kind == 1 ? refs[i] : kind == 2 ? out[i] : Py_None;
        PyTuple_SET_ITEM(result, k, Py_NewRef(v != NULL ? v : Py_None));
    }
done:
    for (Py_ssize_t k = 0; k < n_objs; k++)
        Py_XDECREF(refs[k]);
    PyMem_Free(refs);
    PyMem_Free(size_arr);
    PyMem_Free(scalar_arr);
    arena_free(arena, arena_from);
    return result;
}

static PyTypeObject RunnerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_c_call.Runner",
    .tp_doc = "The call of one compiled C backward without callbacks (codegen/c_call.c).",
    .tp_basicsize = sizeof(Runner),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)runner_traverse,
    .tp_clear = (inquiry)runner_clear,
    .tp_init = (initproc)runner_init,
    .tp_dealloc = (destructor)runner_dealloc,
    .tp_call = (ternaryfunc)runner_call,
};

static PyMethodDef methods[] = {
    {"use_allocator", use_allocator, METH_O,
     "The caching allocator's capsule (runtime/pool.py) large arrays and the arena "
     "come from, or None: numpy's own and malloc."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_c_call", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__c_call(void)
{
    import_array();
    if (PyType_Ready(&RunnerType) < 0 || (data_name = PyUnicode_InternFromString("_data")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Runner", (PyObject *)&RunnerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
