/* The objects the forward's C path makes (forward.c calls these; one translation
   unit, this file first): Tensors, views of them, SavedVariables, and the tuples
   a node holds, each field as the reference (dispatch.py) sets it. */
#include "forward.h"

/* Set a slot to a new reference (stolen), dropping what it held. */
static inline void put(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    PyObject *old = SLOT(obj, offset);
    SLOT(obj, offset) = value;
    Py_XDECREF(old);
}

static PyObject *nones(Py_ssize_t n);

static PyObject *shape_tuple(PyArrayObject *a)
{
    int nd = PyArray_NDIM(a);
    PyObject *t = nones(nd);
    for (int i = 0; t != NULL && i < nd; i++) {
        PyObject *d = PyLong_FromSsize_t(PyArray_DIM(a, i));
        if (d == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SetItem(t, i, d);
    }
    return t;
}

/* Tensor._make(data): a fresh Tensor with no history, on ``counter`` (a new
   reference, stolen; NULL: a new version counter at 0). */
static PyObject *new_tensor(Forward *f, PyObject *data, PyObject *counter)
{
    if (counter == NULL) {
        if ((counter = f->counter->tp_alloc(f->counter, 0)) == NULL)
            return NULL;
        SLOT(counter, f->counter_value) = PyLong_FromLong(0);
    }
    PyObject *t = f->tensor->tp_alloc(f->tensor, 0);
    if (t == NULL) {
        Py_DECREF(counter);
        return NULL;
    }
    const Py_ssize_t *o = f->t;
    SLOT(t, o[T_DATA]) = Py_NewRef(data);
    SLOT(t, o[T_REQUIRES_GRAD]) = Py_NewRef(Py_False);
    SLOT(t, o[T_GRAD_FN]) = Py_NewRef(Py_None);
    SLOT(t, o[T_OUTPUT_NR]) = PyLong_FromLong(0);
    SLOT(t, o[T_VERSION_COUNTER]) = counter;
    SLOT(t, o[T_BASE]) = Py_NewRef(Py_None);
    SLOT(t, o[T_VIEW_VERSION]) = PyLong_FromLong(0);
    SLOT(t, o[T_GRAD]) = Py_NewRef(Py_None);
    SLOT(t, o[T_GRAD_ACC_REF]) = Py_NewRef(Py_None);
    SLOT(t, o[T_RETAINS_GRAD]) = Py_NewRef(Py_False);
    SLOT(t, o[T_BACKWARD_HOOKS]) = Py_NewRef(Py_None);
    SLOT(t, o[T_POST_ACC_HOOKS]) = Py_NewRef(Py_None);
    SLOT(t, o[T_CREATION]) = Py_NewRef(Py_None);
    SLOT(t, o[T_GRAD_LOCK]) = Py_NewRef(Py_None);
    return t;
}

/* SavedVariable(tensor, is_output, grad_fn_name) without saved-tensor hooks. */
static PyObject *new_saved(Forward *f, PyObject *tensor, int is_output, PyObject *name)
{
    const Py_ssize_t *o = f->s, *t = f->t;
    /* (held, not borrowed: the requires_grad property and the allocations below
       may run Python code, a garbage collection's callbacks too) */
    PyObject *data = Py_XNewRef(SLOT(tensor, t[T_DATA]));
    PyObject *grad_fn = Py_XNewRef(SLOT(tensor, t[T_GRAD_FN]));
    PyObject *counter = Py_XNewRef(SLOT(tensor, t[T_VERSION_COUNTER]));
    PyObject *output_nr = Py_XNewRef(SLOT(tensor, t[T_OUTPUT_NR]));
    PyObject *base = SLOT(tensor, t[T_BASE]);
    PyObject *requires_grad = NULL, *version = NULL, *shape = NULL, *sv = NULL;
    if (data == NULL || grad_fn == NULL || base == NULL || counter == NULL
        || output_nr == NULL || !PyArray_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "Forward: a saved tensor without its fields");
        goto done;
    }
    if (base != Py_None) {
        requires_grad = PyObject_GetAttr(tensor, s_requires_grad);   /* (a view's) */
        if (requires_grad == NULL)
            goto done;
    } else {
        PyObject *own = SLOT(tensor, t[T_REQUIRES_GRAD]);
        requires_grad = Py_NewRef((own == Py_True || grad_fn != Py_None) ? Py_True : Py_False);
    }
    version = Py_XNewRef(SLOT(counter, f->counter_value));
    shape = version ? shape_tuple((PyArrayObject *)data) : NULL;
    sv = shape ? f->saved->tp_alloc(f->saved, 0) : NULL;
    if (sv == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_AttributeError, "Forward: a version counter without its value");
        goto done;
    }
    /* (no allocation from here on: nothing runs while the fields are being set) */
    SLOT(sv, o[S_PACKED]) = Py_NewRef(Py_None);
    SLOT(sv, o[S_UNPACK_HOOK]) = Py_NewRef(Py_None);
    SLOT(sv, o[S_GRAD_FN]) = Py_NewRef(Py_None);
    SLOT(sv, o[S_LEAF]) = Py_NewRef(Py_None);
    SLOT(sv, o[S_PACKED_KIND]) = Py_NewRef(Py_None);
    SLOT(sv, o[S_TENSOR_REF]) = Py_NewRef(Py_None);
    SLOT(sv, o[S_VERSION_COUNTER]) = Py_NewRef(counter);
    SLOT(sv, o[S_SAVED_VERSION]) = Py_NewRef(version);
    SLOT(sv, o[S_IS_OUTPUT]) = Py_NewRef(is_output ? Py_True : Py_False);
    SLOT(sv, o[S_SHAPE]) = Py_NewRef(shape);
    SLOT(sv, o[S_DTYPE]) = Py_NewRef((PyObject *)PyArray_DESCR((PyArrayObject *)data));
    SLOT(sv, o[S_RELEASED]) = Py_NewRef(Py_False);
    SLOT(sv, o[S_OUTPUT_NR]) = Py_NewRef(output_nr);
    SLOT(sv, o[S_GRAD_FN_NAME]) = Py_NewRef(name != NULL ? name : Py_None);
    SLOT(sv, o[S_REQUIRES_GRAD]) = Py_NewRef(requires_grad);
    if (is_output && grad_fn != Py_None) {
        SLOT(sv, o[S_TENSOR]) = Py_NewRef(Py_None);     /* (no node -> tensor -> node) */
        SLOT(sv, o[S_DATA]) = Py_NewRef(data);
    } else {
        SLOT(sv, o[S_TENSOR]) = Py_NewRef(tensor);
        SLOT(sv, o[S_DATA]) = Py_NewRef(Py_None);
    }
done:
    Py_XDECREF(data);
    Py_XDECREF(grad_fn);
    Py_XDECREF(counter);
    Py_XDECREF(output_nr);
    Py_XDECREF(requires_grad);
    Py_XDECREF(version);
    Py_XDECREF(shape);
    return sv;
}

static inline int is_tensor(Forward *f, PyObject *a)
{
    return PyObject_TypeCheck(a, f->tensor_base);
}

/* Whether tensor ``a`` is one the C writes and reads as the reference would: its
   fields set (a proxy's _data is no slot) and its storage a base-class ndarray (a
   numpy scalar or an ndarray subclass goes to the reference). */
static int plain_fields(Forward *f, PyObject *a)
{
    const Py_ssize_t *t = f->t;
    PyObject *data = SLOT(a, t[T_DATA]);
    return data != NULL && PyArray_CheckExact(data) && SLOT(a, t[T_GRAD_FN]) != NULL
           && SLOT(a, t[T_BASE]) != NULL && SLOT(a, t[T_OUTPUT_NR]) != NULL
           && SLOT(a, t[T_REQUIRES_GRAD]) != NULL && SLOT(a, t[T_VERSION_COUNTER]) != NULL;
}

/* A tuple of ``n`` Nones: filled item by item (PyTuple_SetItem), so that no tuple
   with a NULL item is ever seen -- an allocation in between may run a garbage
   collection, and its callbacks may look at every object. */
static PyObject *nones(Py_ssize_t n)
{
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t i = 0; t != NULL && i < n; i++)
        PyTuple_SET_ITEM(t, i, Py_NewRef(Py_None));
    return t;
}

/* The value saved for ``a``: a SavedVariable for a tensor, else ``a`` itself. */
static PyObject *save_value(Forward *f, PyObject *a)
{
    return is_tensor(f, a) ? new_saved(f, a, 0, NULL) : Py_NewRef(a);
}

/* np.may_share_memory(a, b): whether their byte ranges overlap (numpy's bounds
   check; an empty array shares nothing). */
static void byte_range(PyArrayObject *a, char **lo, char **hi)
{
    *lo = PyArray_BYTES(a);
    *hi = *lo + PyArray_ITEMSIZE(a);
    for (int d = 0; d < PyArray_NDIM(a); d++) {
        npy_intp extent = (PyArray_DIM(a, d) - 1) * PyArray_STRIDE(a, d);
        if (extent < 0)
            *lo += extent;
        else
            *hi += extent;
    }
}

static int may_share_memory(PyArrayObject *a, PyArrayObject *b)
{
    if (PyArray_SIZE(a) == 0 || PyArray_SIZE(b) == 0)
        return 0;
    char *a_lo, *a_hi, *b_lo, *b_hi;
    byte_range(a, &a_lo, &a_hi);
    byte_range(b, &b_lo, &b_hi);
    return a_lo < b_hi && b_lo < a_hi;
}

/* Whether a view of ``source`` can be made here: its base (itself, or its
   ``_base``) a plain tensor with a version counter of the counter class. */
static int viewable(Forward *f, PyObject *source)
{
    PyObject *base = SLOT(source, f->t[T_BASE]);
    if (base == Py_None)
        base = source;
    else if (!is_tensor(f, base) || !plain_fields(f, base))
        return 0;
    PyObject *counter = SLOT(base, f->t[T_VERSION_COUNTER]);
    return Py_TYPE(counter) == f->counter && SLOT(counter, f->counter_value) != NULL;
}

/* dispatch.make_view(data, source): a Tensor over ``data``, a view of ``source``'s
   storage (``viewable``): it shares the base's version counter, notes the
   version it was made at, and how it was made (``_creation``: "no_grad" in
   no-grad mode, else what ``source`` was made by, if anything). */
static PyObject *new_view(Forward *f, PyObject *data, PyObject *source, int grad_on)
{
    const Py_ssize_t *o = f->t;
    PyObject *base = SLOT(source, o[T_BASE]);
    if (base == Py_None)
        base = source;
    PyObject *counter = SLOT(base, o[T_VERSION_COUNTER]);
    PyObject *t = new_tensor(f, data, Py_NewRef(counter));
    if (t == NULL)
        return NULL;
    put(t, o[T_BASE], Py_NewRef(base));
    put(t, o[T_VIEW_VERSION], Py_NewRef(SLOT(counter, f->counter_value)));
    PyObject *creation = SLOT(source, o[T_CREATION]);
    if (!grad_on)
        creation = s_no_grad;
    else if (creation != NULL && PyTuple_CheckExact(creation))
        creation = PyTuple_GET_SIZE(creation) ? PyTuple_GET_ITEM(creation, 0) : NULL;
    if (creation != NULL && creation != Py_None)
        put(t, o[T_CREATION], Py_NewRef(creation));
    return t;
}
