/* The types of the forward's C path (forward.c, forward_objects.c: one
   translation unit, runtime/forward.py's FORWARD): the slots it writes, a prim's
   plan and the Forward object. */
#ifndef CA_FORWARD_H
#define CA_FORWARD_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "pool.h"

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* Tensor fields, in the order of TENSOR_SLOTS (forward.py). */
enum { T_DATA, T_REQUIRES_GRAD, T_GRAD_FN, T_OUTPUT_NR, T_VERSION_COUNTER, T_BASE,
       T_VIEW_VERSION, T_GRAD, T_GRAD_ACC_REF, T_RETAINS_GRAD, T_BACKWARD_HOOKS,
       T_POST_ACC_HOOKS, T_CREATION, T_GRAD_LOCK, T_N };
/* Node fields (NODE_SLOTS). */
enum { N_NEXT, N_INPUT_META, N_SEQUENCE, N_METADATA, N_SAVED, N_PARAMS, N_SHAPES, N_DTYPES,
       N_N };
/* SavedVariable fields (SAVED_SLOTS). */
enum { S_TENSOR, S_DATA, S_VERSION_COUNTER, S_SAVED_VERSION, S_IS_OUTPUT, S_REQUIRES_GRAD,
       S_OUTPUT_NR, S_GRAD_FN_NAME, S_RELEASED, S_SHAPE, S_DTYPE, S_PACKED, S_UNPACK_HOOK,
       S_GRAD_FN, S_LEAF, S_PACKED_KIND, S_TENSOR_REF, S_N };

/* A save-spec entry: an argument, the result, or every argument after the first;
   ``cond``: saved only when that argument's edge has a node (-1: always). */
enum { SAVE_ARG, SAVE_OUT, SAVE_TAIL };
typedef struct { int kind, index, cond; } SaveItem;

typedef struct {
    PyObject *cls, *name;               /* name: the node class's, for a saved output */
    int view, differentiable, n_save;
    int min_args;                       /* the save spec's largest index + 1 */
    SaveItem *save;
} Plan;

typedef struct {
    PyObject_HEAD
    PyTypeObject *tensor_base, *tensor, *saved, *counter;
    Py_ssize_t t[T_N], n[N_N], s[S_N], counter_value;
    Py_ssize_t kernel;        /* Prim.kernel's slot: read at each call (tests wrap it) */
    PyObject *plans;          /* dict: prim -> capsule of a Plan */
    PyObject *reference;      /* apply_prim_reference(prim, args, params) */
    PyObject *grad_accumulator, *sequence;
    PyObject *interceptors, *trackers;      /* lists: non-empty -> the reference */
    PyObject *prims_globals;  /* _kernel_hook */
    PyObject *grad_enabled, *hooks_stack;   /* ContextVars: grad mode, hook stack */
    PyObject *no_edge;        /* (None, 0) */
} Forward;

static PyObject *s_kernel_hook, *s_grad_fn, *s_requires_grad, *s_no_grad;
#endif /* CA_FORWARD_H */
