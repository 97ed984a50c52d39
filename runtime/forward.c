/* The forward's common case in C: a prim called on Tensors, its result Tensor and
   its backward node (runtime/forward.py; the reference is Python's,
   compiled_autograd/autograd/dispatch.py: ``apply_prim_reference``).

   ``Forward(config)`` is made once by the front end, which hands it its classes
   and the ``__slots__`` member descriptors of every field it reads or writes
   (PyMemberDef offsets: public API, as runtime/slots.c reads them), and one plan
   per prim: (node class or None, view, differentiable, save spec). A prim's
   kernel is read from the prim at each call.
   Calling it, ``forward(prim, args, params)``, does what the reference does:
   - the kernel on the arguments' arrays; the result made C-contiguous and wrapped
     in a fresh Tensor (a new version counter, no history) -- or, for a view prim
     whose result shares its first argument's memory, wrapped as a view of it
     (forward_objects.c's new_view: the base's counter);
   - when the prim is differentiable, the result floating, grad mode on and some
     argument needs a gradient: the edges (a view's grad_fn and a leaf's
     AccumulateGrad are asked of Python), the node (next_functions,
     input_metadata, a sequence number, params, shapes, dtypes), its saved values
     as SavedVariables (the result saved after it has the node as grad_fn).
   Anything else -- an interceptor, memory accounting, a kernel hook,
   saved-tensor hooks, an argument that is not a plain Tensor -- goes to the
   reference before anything runs. */
#include "forward.h"

static int offsets(PyObject *descrs, Py_ssize_t *out, Py_ssize_t n, PyTypeObject **owner)
{
    if (!PyTuple_Check(descrs) || PyTuple_GET_SIZE(descrs) != n) {
        PyErr_Format(PyExc_TypeError, "Forward: expected a tuple of %zd slot descriptors", n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyTuple_GET_ITEM(descrs, i);
        if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
            PyErr_SetString(PyExc_TypeError, "Forward: expected __slots__ member descriptors");
            return -1;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
            PyErr_Format(PyExc_TypeError, "Forward: %s is not a writable object slot", m->name);
            return -1;
        }
        out[i] = m->offset;
        if (owner != NULL)
            *owner = ((PyDescrObject *)d)->d_type;
    }
    return 0;
}

static void plan_free(PyObject *capsule)
{
    Plan *p = PyCapsule_GetPointer(capsule, "forward.plan");
    if (p == NULL)
        return;
    Py_XDECREF(p->cls);
    Py_XDECREF(p->name);
    PyMem_Free(p->save);
    PyMem_Free(p);
}

/* plan: (node class or None, view, differentiable, ((kind, index, cond), ...)) */
static PyObject *make_plan(PyObject *spec, PyTypeObject *node_type)
{
    PyObject *cls, *save;
    int view, differentiable;
    if (!PyArg_ParseTuple(spec, "OppO!", &cls, &view, &differentiable, &PyTuple_Type, &save))
        return NULL;
    Plan *p = PyMem_Calloc(1, sizeof(Plan));
    if (p == NULL)
        return PyErr_NoMemory();
    Py_ssize_t n = PyTuple_GET_SIZE(save);
    p->save = PyMem_Calloc((size_t)n + 1, sizeof(SaveItem));
    if (p->save == NULL) {
        PyMem_Free(p);
        return PyErr_NoMemory();
    }
    PyObject *capsule = PyCapsule_New(p, "forward.plan", plan_free);
    if (capsule == NULL) {
        PyMem_Free(p->save);
        PyMem_Free(p);
        return NULL;
    }
    p->cls = Py_NewRef(cls);
    p->view = view;
    p->differentiable = differentiable;
    p->n_save = (int)n;
    if (cls != Py_None) {
        p->name = PyObject_GetAttrString(cls, "__name__");
        if (p->name == NULL || !PyType_Check(cls)
            || !PyType_IsSubtype((PyTypeObject *)cls, node_type)) {
            if (!PyErr_Occurred())   /* (its fields are written at node_type's offsets) */
                PyErr_SetString(PyExc_TypeError, "Forward: a node class is a subclass of the "
                                "class whose slots were given");
            Py_DECREF(capsule);
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        SaveItem *s = &p->save[i];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(save, i), "iii", &s->kind, &s->index, &s->cond)) {
            Py_DECREF(capsule);
            return NULL;
        }
        if (s->kind == SAVE_ARG && s->index + 1 > p->min_args)
            p->min_args = s->index + 1;
        if (s->cond + 1 > p->min_args)
            p->min_args = s->cond + 1;
    }
    return capsule;
}

static int forward_init(Forward *f, PyObject *args, PyObject *kwds)
{
    PyObject *tslots, *nslots, *sslots, *cslot, *kslot, *plans, *reference, *grad_accumulator,
        *sequence, *interceptors, *trackers, *prims_globals, *grad_enabled, *hooks_stack;
    PyTypeObject *tensor;
    Py_ssize_t t[T_N], n[N_N], s[S_N], cv, kv;
    if (!PyArg_ParseTuple(args, "O!OOOOOO!OOOO!O!O!OO", &PyType_Type, &tensor, &tslots,
                          &nslots, &sslots, &cslot, &kslot, &PyDict_Type, &plans, &reference,
                          &grad_accumulator, &sequence, &PyList_Type, &interceptors,
                          &PyList_Type, &trackers, &PyDict_Type, &prims_globals, &grad_enabled,
                          &hooks_stack))
        return -1;
    if (!PyContextVar_CheckExact(grad_enabled) || !PyContextVar_CheckExact(hooks_stack)) {
        PyErr_SetString(PyExc_TypeError, "Forward: grad mode and the hook stack are ContextVars");
        return -1;
    }
    PyTypeObject *tensor_base, *saved_type, *counter_type, *node_type, *prim_type;
    if (offsets(tslots, t, T_N, &tensor_base) < 0 || offsets(nslots, n, N_N, &node_type) < 0
        || offsets(sslots, s, S_N, &saved_type) < 0
        || !PyTuple_Check(cslot) || offsets(cslot, &cv, 1, &counter_type) < 0
        || !PyTuple_Check(kslot) || offsets(kslot, &kv, 1, &prim_type) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "Forward: the counter's and the kernel's slots, "
                            "each in a tuple");
        return -1;
    }
    PyObject *compiled = PyDict_New();
    if (compiled == NULL)
        return -1;
    PyObject *prim, *spec;
    Py_ssize_t pos = 0;
    while (PyDict_Next(plans, &pos, &prim, &spec)) {
        if (!PyObject_TypeCheck(prim, prim_type)) {     /* (its kernel is read at an offset) */
            PyErr_SetString(PyExc_TypeError, "Forward: a plan's key is not a prim");
            Py_DECREF(compiled);
            return -1;
        }
        PyObject *capsule = make_plan(spec, node_type);
        if (capsule == NULL || PyDict_SetItem(compiled, prim, capsule) < 0) {
            Py_XDECREF(capsule);
            Py_DECREF(compiled);
            return -1;
        }
        Py_DECREF(capsule);
    }
    memcpy(f->t, t, sizeof t);
    memcpy(f->n, n, sizeof n);
    memcpy(f->s, s, sizeof s);
    f->counter_value = cv;
    f->kernel = kv;
    Py_XSETREF(f->tensor_base, (PyTypeObject *)Py_NewRef(tensor_base));
    Py_XSETREF(f->tensor, (PyTypeObject *)Py_NewRef(tensor));
    Py_XSETREF(f->saved, (PyTypeObject *)Py_NewRef(saved_type));
    Py_XSETREF(f->counter, (PyTypeObject *)Py_NewRef(counter_type));
    Py_XSETREF(f->plans, compiled);
    Py_XSETREF(f->reference, Py_NewRef(reference));
    Py_XSETREF(f->grad_accumulator, Py_NewRef(grad_accumulator));
    Py_XSETREF(f->sequence, Py_NewRef(sequence));
    Py_XSETREF(f->interceptors, Py_NewRef(interceptors));
    Py_XSETREF(f->trackers, Py_NewRef(trackers));
    Py_XSETREF(f->prims_globals, Py_NewRef(prims_globals));
    Py_XSETREF(f->grad_enabled, Py_NewRef(grad_enabled));
    Py_XSETREF(f->hooks_stack, Py_NewRef(hooks_stack));
    if (f->no_edge == NULL)
        f->no_edge = Py_BuildValue("(Oi)", Py_None, 0);
    return f->no_edge == NULL ? -1 : 0;
}


static PyObject *reference(Forward *f, PyObject *prim, PyObject *args, PyObject *params)
{
    return PyObject_CallFunctionObjArgs(f->reference, prim, args, params, NULL);
}

/* Whether the reference must run: an interceptor, memory accounting, a kernel
   hook, saved-tensor hooks (-1: an error). */
static int unusual(Forward *f)
{
    if (PyList_GET_SIZE(f->interceptors) || PyList_GET_SIZE(f->trackers))
        return 1;
    PyObject *hook = PyDict_GetItemWithError(f->prims_globals, s_kernel_hook);
    if (hook != NULL && hook != Py_None)
        return 1;
    PyObject *stack;        /* (the variable's own default where unset) */
    if (PyContextVar_Get(f->hooks_stack, NULL, &stack) < 0)
        return -1;
    int hooked = stack != NULL && stack != Py_None && PyObject_IsTrue(stack);
    Py_XDECREF(stack);
    return hooked;
}

static PyMethodDef module_methods[] = {
    {"use_allocator", use_allocator, METH_O,
     "The caching allocator's capsule (runtime/pool.py) large results are made "
     "under, or None: numpy's own."},
    {NULL, NULL, 0, NULL}};

static PyObject *forward_call(Forward *f, PyObject *call_args, PyObject *kwds)
{
    PyObject *prim, *args, *params;
    if (f->plans == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Forward: not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(call_args, "OO!O!", &prim, &PyTuple_Type, &args, &PyDict_Type,
                          &params))
        return NULL;
    PyObject *capsule = PyDict_GetItemWithError(f->plans, prim);
    if (capsule == NULL)
        return PyErr_Occurred() ? NULL : reference(f, prim, args, params);
    Plan *p = PyCapsule_GetPointer(capsule, "forward.plan");
    if (p == NULL)
        return NULL;
    int u = unusual(f);
    if (u != 0)
        return u < 0 ? NULL : reference(f, prim, args, params);
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (n < p->min_args)        /* (fewer arguments than the save spec reads) */
        return reference(f, prim, args, params);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        if (is_tensor(f, a) && !plain_fields(f, a))
            return reference(f, prim, args, params);
    }
    /* A view prim's result is a view of its first argument where it shares its
       memory (a reshape may copy instead): made as make_view does. */
    PyObject *source = p->view && n > 0 && is_tensor(f, PyTuple_GET_ITEM(args, 0))
                           ? PyTuple_GET_ITEM(args, 0) : NULL;
    if (source != NULL && !viewable(f, source))
        return reference(f, prim, args, params);

    /* the kernel, on the arrays */
    PyObject *arrays = PyTuple_New(n);
    if (arrays == NULL)
        return NULL;
    /* The result is made under the caching allocator (runtime/pool.h's ``pool``)
       where an argument is as large as the pool's blocks (then the result likely
       is too): entering and leaving cost ~0.4 us, and small arrays come from
       malloc's bins anyway, without page faults. */
    const PoolApi *from = pool;      /* (read once: the kernel may set another) */
    int pooled = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        PyObject *data = is_tensor(f, a) ? SLOT(a, f->t[T_DATA]) : a;
        pooled |= from != NULL && PyArray_Check(data)
                  && (size_t)PyArray_NBYTES((PyArrayObject *)data) >= from->min_bytes;
        PyTuple_SET_ITEM(arrays, i, Py_NewRef(data));
    }
    PyObject *kernel = SLOT(prim, f->kernel);
    if (kernel == NULL) {
        Py_DECREF(arrays);
        PyErr_SetString(PyExc_AttributeError, "Forward: a prim without its kernel");
        return NULL;
    }
    Py_INCREF(kernel);      /* (the kernel may replace itself) */
    PyObject *numpy_handler = NULL;      /* the result's memory from the pool */
    if (pooled && (numpy_handler = from->enter()) == NULL) {
        Py_DECREF(kernel);
        Py_DECREF(arrays);
        return NULL;
    }
    PyObject *out = PyObject_Call(kernel, arrays, PyDict_GET_SIZE(params) ? params : NULL);
    Py_DECREF(kernel);
    if (out != NULL && !PyArray_CheckExact(out))    /* np.asarray: a base-class array */
        Py_SETREF(out, PyArray_FromAny(out, NULL, 0, 0, NPY_ARRAY_ENSUREARRAY, NULL));
    int as_view = out != NULL && source != NULL
                  && may_share_memory((PyArrayObject *)out,
                                      (PyArrayObject *)PyTuple_GET_ITEM(arrays, 0));
    Py_DECREF(arrays);
    if (out != NULL && !as_view && !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)out))
        Py_SETREF(out, PyArray_NewCopy((PyArrayObject *)out, NPY_CORDER));
    if (numpy_handler != NULL && from->leave(numpy_handler) < 0)
        Py_CLEAR(out);
    if (out == NULL)
        return NULL;
    PyObject *result;
    if (as_view) {
        PyObject *enabled;
        if (PyContextVar_Get(f->grad_enabled, NULL, &enabled) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        int on = enabled == NULL || PyObject_IsTrue(enabled);
        Py_XDECREF(enabled);
        result = on < 0 ? NULL : new_view(f, out, source, on);
    } else {
        result = new_tensor(f, out, NULL);
    }
    if (result == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    char kind = PyArray_DESCR((PyArrayObject *)out)->kind;
    if (!p->differentiable || (kind != 'f' && kind != 'c')) {
        Py_DECREF(out);
        return result;
    }
    PyObject *enabled;
    if (PyContextVar_Get(f->grad_enabled, NULL, &enabled) < 0)
        goto fail_out;
    int on = enabled == NULL || PyObject_IsTrue(enabled);
    Py_XDECREF(enabled);
    if (on <= 0) {
        Py_DECREF(out);
        if (on < 0)
            Py_CLEAR(result);
        return result;
    }

    /* the edges (gradient_edge of each argument) */
    PyObject *edges = nones(n), *node = NULL;
    if (edges == NULL)
        goto fail_out;
    int wants = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i), *edge;
        if (!is_tensor(f, a)) {
            PyTuple_SetItem(edges, i, Py_NewRef(f->no_edge));
            continue;
        }
        PyObject *base = SLOT(a, f->t[T_BASE]);
        PyObject *fn = base != NULL && base != Py_None ? PyObject_GetAttr(a, s_grad_fn)
                                                       : Py_XNewRef(SLOT(a, f->t[T_GRAD_FN]));
        if (fn == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_AttributeError, "Forward: a tensor without its grad_fn");
            goto fail_edges;
        }
        if (fn != Py_None) {
            PyObject *nr = SLOT(a, f->t[T_OUTPUT_NR]);
            edge = nr != NULL ? PyTuple_Pack(2, fn, nr) : NULL;
            if (nr == NULL)
                PyErr_SetString(PyExc_AttributeError, "Forward: a tensor without its output_nr");
            wants = 1;
        } else if (SLOT(a, f->t[T_REQUIRES_GRAD]) == Py_True) {
            PyObject *acc = PyObject_CallOneArg(f->grad_accumulator, a);
            edge = acc ? Py_BuildValue("(Oi)", acc, 0) : NULL;
            Py_XDECREF(acc);
            wants = 1;
        } else {
            /* (a view made in no-grad mode of a tensor needing grad: no grad_fn of
               its own, but requires_grad, its base's: a node, the edge empty) */
            if (base != NULL && base != Py_None) {
                PyObject *rg = PyObject_GetAttr(a, s_requires_grad);
                int needs = rg == NULL ? -1 : PyObject_IsTrue(rg);
                Py_XDECREF(rg);
                if (needs < 0) {
                    Py_DECREF(fn);
                    goto fail_edges;
                }
                wants |= needs;
            }
            edge = Py_NewRef(f->no_edge);
        }
        Py_DECREF(fn);
        if (edge == NULL)
            goto fail_edges;
        PyTuple_SetItem(edges, i, edge);
    }
    if (!wants) {
        Py_DECREF(edges);
        Py_DECREF(out);
        return result;
    }
    if (p->cls == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "Forward: a differentiable prim without a node class");
        goto fail_edges;
    }

    /* the node */
    PyTypeObject *cls = (PyTypeObject *)p->cls;
    PyObject *shape = shape_tuple((PyArrayObject *)out);
    PyObject *pair = shape ? PyTuple_Pack(2, shape, (PyObject *)PyArray_DESCR((PyArrayObject *)out))
                           : NULL;
    Py_XDECREF(shape);
    PyObject *meta = pair ? PyTuple_Pack(1, pair) : NULL;
    Py_XDECREF(pair);
    PyObject *sequence = meta ? PyIter_Next(f->sequence) : NULL;
    PyObject *shapes = sequence ? nones(n) : NULL, *dtypes = shapes ? nones(n) : NULL;
    if (dtypes == NULL) {
        Py_XDECREF(meta);
        Py_XDECREF(sequence);
        Py_XDECREF(shapes);
        goto fail_edges;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i);
        if (is_tensor(f, a)) {
            PyObject *data = Py_XNewRef(SLOT(a, f->t[T_DATA]));   /* (held: see new_saved) */
            PyObject *s = data != NULL && PyArray_CheckExact(data)
                              ? shape_tuple((PyArrayObject *)data) : NULL;
            if (s == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "Forward: a tensor without its array");
                Py_XDECREF(data);
                Py_DECREF(meta);
                Py_DECREF(sequence);
                Py_DECREF(shapes);
                Py_DECREF(dtypes);
                goto fail_edges;
            }
            PyTuple_SetItem(shapes, i, s);
            PyTuple_SetItem(dtypes, i, Py_NewRef((PyObject *)PyArray_DESCR((PyArrayObject *)data)));
            Py_DECREF(data);
        }
    }
    node = cls->tp_alloc(cls, 0);
    if (node == NULL) {
        Py_DECREF(meta);
        Py_DECREF(sequence);
        Py_DECREF(shapes);
        Py_DECREF(dtypes);
        goto fail_edges;
    }
    SLOT(node, f->n[N_NEXT]) = edges;       /* (the node's reference now) */
    SLOT(node, f->n[N_INPUT_META]) = meta;
    SLOT(node, f->n[N_SEQUENCE]) = sequence;
    SLOT(node, f->n[N_METADATA]) = Py_NewRef(Py_None);
    SLOT(node, f->n[N_PARAMS]) = Py_NewRef(params);
    SLOT(node, f->n[N_SHAPES]) = shapes;
    SLOT(node, f->n[N_DTYPES]) = dtypes;
    SLOT(node, f->n[N_SAVED]) = PyTuple_New(0);     /* (the reference's saved=() first) */

    /* its saved values (an input before the result exists; the result after),
       attached as a whole once made, as the reference's ``node.saved = ...`` */
    PyObject *saved = nones(p->n_save);
    if (saved == NULL)
        goto fail_node;
    for (int k = 0; k < p->n_save; k++) {
        SaveItem *s = &p->save[k];
        PyObject *value;
        if (s->kind == SAVE_OUT
            || (s->cond >= 0 && PyTuple_GET_ITEM(PyTuple_GET_ITEM(edges, s->cond), 0) == Py_None))
            continue;        /* (the result: below; an unneeded value: None) */
        if (s->kind == SAVE_ARG) {
            value = save_value(f, PyTuple_GET_ITEM(args, s->index));  /* (index < n: min_args) */
        } else {             /* SAVE_TAIL */
            value = nones(n > 0 ? n - 1 : 0);
            for (Py_ssize_t i = 1; value != NULL && i < n; i++) {
                PyObject *v = save_value(f, PyTuple_GET_ITEM(args, i));
                if (v == NULL)
                    Py_CLEAR(value);
                else
                    PyTuple_SetItem(value, i - 1, v);
            }
        }
        if (value == NULL)
            goto fail_saved;
        PyTuple_SetItem(saved, k, value);
    }
    put(result, f->t[T_GRAD_FN], Py_NewRef(node));
    for (int k = 0; k < p->n_save; k++) {
        SaveItem *s = &p->save[k];
        if (s->kind != SAVE_OUT
            || (s->cond >= 0 && PyTuple_GET_ITEM(PyTuple_GET_ITEM(edges, s->cond), 0) == Py_None))
            continue;
        PyObject *value = new_saved(f, result, 1, p->name);
        if (value == NULL)
            goto fail_saved;
        PyTuple_SetItem(saved, k, value);
    }
    put(node, f->n[N_SAVED], saved);
    Py_DECREF(out);
    Py_DECREF(node);
    return result;

fail_saved:
    Py_DECREF(saved);
fail_node:
    put(result, f->t[T_GRAD_FN], Py_NewRef(Py_None));
    Py_DECREF(node);
    Py_DECREF(out);
    Py_DECREF(result);
    return NULL;
fail_edges:
    Py_DECREF(edges);
fail_out:
    Py_DECREF(out);
    Py_DECREF(result);
    return NULL;
}

static int forward_traverse(Forward *f, visitproc visit, void *arg)
{
    Py_VISIT(f->tensor_base);
    Py_VISIT(f->tensor);
    Py_VISIT(f->saved);
    Py_VISIT(f->counter);
    Py_VISIT(f->plans);
    Py_VISIT(f->reference);
    Py_VISIT(f->grad_accumulator);
    Py_VISIT(f->sequence);
    Py_VISIT(f->interceptors);
    Py_VISIT(f->trackers);
    Py_VISIT(f->prims_globals);
    Py_VISIT(f->grad_enabled);
    Py_VISIT(f->hooks_stack);
    Py_VISIT(f->no_edge);
    return 0;
}

static int forward_clear(Forward *f)
{
    Py_CLEAR(f->tensor_base);
    Py_CLEAR(f->tensor);
    Py_CLEAR(f->saved);
    Py_CLEAR(f->counter);
    Py_CLEAR(f->plans);
    Py_CLEAR(f->reference);
    Py_CLEAR(f->grad_accumulator);
    Py_CLEAR(f->sequence);
    Py_CLEAR(f->interceptors);
    Py_CLEAR(f->trackers);
    Py_CLEAR(f->prims_globals);
    Py_CLEAR(f->grad_enabled);
    Py_CLEAR(f->hooks_stack);
    Py_CLEAR(f->no_edge);
    return 0;
}

static void forward_dealloc(Forward *f)
{
    PyObject_GC_UnTrack(f);
    forward_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

/* ``Forward.make(data)``: Tensor._make in C (tensor.py's ``_make`` is the reference). */
static PyObject *forward_make(Forward *f, PyObject *data)
{
    if (f->plans == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Forward: not initialised");
        return NULL;
    }
    return new_tensor(f, data, NULL);
}

static PyMethodDef forward_methods[] = {
    {"make", (PyCFunction)forward_make, METH_O,
     "make(data): a fresh Tensor over data with no history (Tensor._make)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ForwardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_forward.Forward",
    .tp_doc = "A prim called on Tensors: result, node and saved values (runtime/forward.c).",
    .tp_basicsize = sizeof(Forward),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)forward_traverse,
    .tp_clear = (inquiry)forward_clear,
    .tp_init = (initproc)forward_init,
    .tp_dealloc = (destructor)forward_dealloc,
    .tp_call = (ternaryfunc)forward_call,
    .tp_methods = forward_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_forward", NULL, -1, module_methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__forward(void)
{
    import_array();
    if (PyType_Ready(&ForwardType) < 0)
        return NULL;
    s_kernel_hook = PyUnicode_InternFromString("_kernel_hook");
    s_grad_fn = PyUnicode_InternFromString("grad_fn");
    s_requires_grad = PyUnicode_InternFromString("requires_grad");
    s_no_grad = PyUnicode_InternFromString("no_grad");
    if (!s_kernel_hook || !s_grad_fn || !s_requires_grad || !s_no_grad)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Forward", (PyObject *)&ForwardType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
