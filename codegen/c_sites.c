/* The callback sites of a compiled C backward, run by c_call.c's Runner (this
   file follows c_call.c in one translation unit: codegen/c_run.py's C_CALL).

   A site's spec, made by c_run._site_specs when the program is built, is read
   once (``read_site``) into a ``Site``: its ops before the hook, the hook
   (``hook_calls.CALL_HOOK[kind]``, NULL for a release), its arguments, where its
   results go, its ops after. At run time the generated code's ``cb`` is
   ``site_callback``: it takes the GIL, runs the site (``run_site``) in the order
   CBackward._on_callback runs it on the Python path, and gives the GIL back. */

/* A layout and its byte strides: ((shape, type number), strides). */
static int read_strided(PyObject *layout, PyObject *strides, Layout *l, npy_intp *out)
{
    if (read_layout(layout, l) < 0)
        return -1;
    if (!PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != l->ndim) {
        PyErr_SetString(PyExc_ValueError, "Runner: strides of the wrong length");
        return -1;
    }
    for (int d = 0; d < l->ndim; d++)
        if ((out[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, d))) == -1 && PyErr_Occurred())
            return -1;
    return 0;
}

/* One callback site's spec: (fn or None, pre ops, post ops, args, results); ops
   are (op, argument) pairs, checked against the Runner's sizes. */
static int read_site(Runner *r, PyObject *spec, Site *s)
{
    PyObject *fn, *pre, *post, *args, *res;
    if (!PyArg_ParseTuple(spec, "OO!O!O!O!", &fn, &PyTuple_Type, &pre, &PyTuple_Type, &post,
                          &PyTuple_Type, &args, &PyTuple_Type, &res))
        return -1;
    s->fn = fn == Py_None ? NULL : fn;
    s->n_pre = PyTuple_GET_SIZE(pre);
    s->n_post = PyTuple_GET_SIZE(post);
    s->n_args = PyTuple_GET_SIZE(args);
    s->n_res = PyTuple_GET_SIZE(res);
    if (ALLOC(s->op, s->n_pre + s->n_post) || ALLOC(s->op_arg, s->n_pre + s->n_post)
        || ALLOC(s->args, s->n_args) || ALLOC(s->res, s->n_res)) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < s->n_pre + s->n_post; k++) {
        PyObject *op = k < s->n_pre ? PyTuple_GET_ITEM(pre, k) : PyTuple_GET_ITEM(post, k - s->n_pre);
        if (!PyArg_ParseTuple(op, "in", &s->op[k], &s->op_arg[k]))
            return -1;
        Py_ssize_t i = s->op_arg[k], limit;
        switch (s->op[k]) {
        case OP_FLUSH: limit = r->n_acc + 1; break;
        case OP_RELEASE_IN: limit = r->n_in; break;
        case OP_RELEASE_EXT: limit = r->n_ext; break;
        case OP_ALLOC: limit = r->n_out; break;
        case OP_CLOSE: case OP_OPEN: limit = r->n_blocks; break;
        default: limit = -1;
        }
        if (i < 0 || i >= limit)
            goto range;
    }
    for (Py_ssize_t k = 0; k < s->n_args; k++) {
        PyObject *item = PyTuple_GET_ITEM(args, k), *layout, *strides;
        Arg *a = &s->args[k];
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 2) {
            PyErr_SetString(PyExc_ValueError, "Runner: a bad argument spec");
            return -1;
        }
        a->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
        if (a->kind == ARG_LITERAL) {
            a->literal = PyTuple_GET_ITEM(item, 1);
        } else if (a->kind == ARG_REF) {
            if (!PyArg_ParseTuple(item, "in", &a->kind, &a->index))
                return -1;
            if (a->index < 0 || a->index >= r->n_refs)
                goto range;
        } else if (a->kind == ARG_WHOLE) {
            if (!PyArg_ParseTuple(item, "iin", &a->kind, &a->at, &a->index))
                return -1;
        } else if (a->kind == ARG_VIEW) {
            if (!PyArg_ParseTuple(item, "iinnOOp", &a->kind, &a->at, &a->index, &a->offset,
                                  &layout, &strides, &a->copy)
                || read_strided(layout, strides, &a->layout, a->strides) < 0)
                return -1;
        } else {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "Runner: a bad argument kind");
            return -1;
        }
        if (a->kind == ARG_WHOLE || a->kind == ARG_VIEW) {
            Py_ssize_t limit = a->at == AT_IN ? r->n_in : a->at == AT_OUT ? r->n_out
                               : a->at == AT_EXT ? r->n_ext : a->at == AT_ARENA ? r->n_blocks : -1;
            if (a->index >= limit || a->index < (a->at == AT_ARENA && a->kind == ARG_VIEW ? -1 : 0)
                || (a->kind == ARG_WHOLE && a->at == AT_ARENA))
                goto range;
        }
    }
    for (Py_ssize_t k = 0; k < s->n_res; k++) {
        PyObject *layout, *strides;
        Result *t = &s->res[k];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(res, k), "nnOO", &t->item, &t->ext, &layout,
                              &strides) || read_strided(layout, strides, &t->layout, t->strides) < 0)
            return -1;
        if (t->ext < 0 || t->ext >= r->n_ext || t->item < -1)
            goto range;
    }
    return 0;
range:
    PyErr_SetString(PyExc_ValueError, "Runner: an index out of range");
    return -1;
}

/* Gradient accumulations up to ``upto`` (node.accumulate_into), in order. */
static int flush(Call *c, Py_ssize_t upto)
{
    Runner *r = c->r;
    while (c->flushed < upto) {
        Py_ssize_t k = c->flushed++;
        PyObject *variable = c->refs[r->acc_slot[k]], *grad = c->out[r->acc_out[k]];
        if (variable == NULL || grad == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "Runner: an accumulation's value was dropped");
            return -1;
        }
        PyObject *call_args[3] = {variable, grad, r->acc_owned[k] ? Py_True : Py_False};
        PyObject *none = PyObject_Vectorcall(r->accumulate, call_args, 3, NULL);
        if (none == NULL)
            return -1;
        Py_DECREF(none);
        if (r->acc_drop[k])      /* nothing reads it later: .grad holds it alone */
            Py_CLEAR(c->out[r->acc_out[k]]);
    }
    return 0;
}

static PyObject *new_block(npy_intp bytes)
{
    npy_intp n = bytes > 0 ? bytes : 1;
    return empty_array(1, &n, NPY_UINT8, (size_t)n);
}

static int run_ops(Call *c, const int *op, const Py_ssize_t *arg, Py_ssize_t n)
{
    Runner *r = c->r;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = arg[k];
        switch (op[k]) {
        case OP_FLUSH:
            if (flush(c, i) < 0)
                return -1;
            break;
        case OP_RELEASE_IN: Py_CLEAR(c->in[i]); break;
        case OP_RELEASE_EXT: Py_CLEAR(c->ext[i]); break;
        case OP_CLOSE: Py_CLEAR(c->out[r->n_out + i]); break;
        case OP_ALLOC:
            Py_XDECREF(c->out[i]);
            if ((c->out[i] = output_array(&r->out_layout[i])) == NULL)
                return -1;
            break;
        case OP_OPEN:
            Py_XDECREF(c->out[r->n_out + i]);
            if ((c->out[r->n_out + i] = new_block(r->block_bytes[i])) == NULL)
                return -1;
            break;
        }
    }
    return 0;
}

static PyObject *storage_object(Call *c, int at, Py_ssize_t i)
{
    PyObject *obj = at == AT_IN ? c->in[i] : at == AT_OUT ? c->out[i]
                    : at == AT_EXT ? c->ext[i] : c->out[c->r->n_out + i];
    if (obj == NULL)
        PyErr_SetString(PyExc_RuntimeError, "Runner: a hook's argument was released");
    return obj;
}

/* A hook's argument, a new reference: a constant, a Python object of the boxes,
   an array the call holds, or a window on one (a copy where it is in the arena,
   whose memory the backward reuses), as CBackward._resolve makes it. */
static PyObject *make_arg(Call *c, const Arg *a)
{
    if (a->kind == ARG_LITERAL)
        return Py_NewRef(a->literal);
    if (a->kind == ARG_REF)
        return Py_NewRef(c->refs[a->index] != NULL ? c->refs[a->index] : Py_None);
    PyObject *base = NULL;
    char *data;
    if (a->kind == ARG_VIEW && a->at == AT_ARENA && a->index < 0) {
        data = c->arena;
    } else {
        if ((base = storage_object(c, a->at, a->index)) == NULL)
            return NULL;
        if (a->kind == ARG_WHOLE)
            return Py_NewRef(base);
        data = PyArray_BYTES((PyArrayObject *)base);
    }
    PyArray_Descr *descr = PyArray_DescrFromType(a->layout.type);
    if (descr == NULL)
        return NULL;
    PyObject *view = PyArray_NewFromDescr(&PyArray_Type, descr, a->layout.ndim,
                                          (npy_intp *)a->layout.dims, (npy_intp *)a->strides,
                                          data + a->offset, NPY_ARRAY_WRITEABLE, NULL);
    if (view == NULL)
        return NULL;
    if (a->copy) {
        PyObject *copy = PyArray_NewCopy((PyArrayObject *)view, NPY_CORDER);
        Py_DECREF(view);
        return copy;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)view, Py_NewRef(base)) < 0) {   /* (steals) */
        Py_DECREF(view);
        return NULL;
    }
    return view;
}

/* An array the C reads as compiled: its shape, dtype and (where it matters) strides. */
static int conforms_strided(PyObject *obj, const Layout *l, const npy_intp *strides)
{
    return PyArray_Check(obj) && has_layout((PyArrayObject *)obj, l, strides);
}

/* Callback site ``index``: its ops, its hook, its results handed to C, its ops after. */
static int run_site(Call *c, int index, void **results)
{
    Runner *r = c->r;
    if (index < 0 || index >= r->n_sites) {
        PyErr_Format(PyExc_RuntimeError, "Runner: no callback site %d", index);
        return -1;
    }
    const Site *s = &r->sites[index];
    if (run_ops(c, s->op, s->op_arg, s->n_pre) < 0)
        return -1;
    if (s->fn != NULL) {
        PyObject *stack[8], **argv = stack;
        if (s->n_args > 8 && (argv = PyMem_Malloc((size_t)s->n_args * sizeof *argv)) == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        Py_ssize_t made = 0;
        while (made < s->n_args && (argv[made] = make_arg(c, &s->args[made])) != NULL)
            made++;
        PyObject *value = made == s->n_args ? PyObject_Vectorcall(s->fn, argv, made, NULL) : NULL;
        for (Py_ssize_t k = 0; k < made; k++)
            Py_DECREF(argv[k]);
        if (argv != stack)
            PyMem_Free(argv);
        if (value == NULL)
            return -1;
        for (Py_ssize_t j = 0; j < s->n_res; j++) {
            const Result *t = &s->res[j];
            PyObject *item = t->item < 0 ? Py_NewRef(value) : PySequence_GetItem(value, t->item);
            if (item != NULL && !conforms_strided(item, &t->layout, t->strides)) {
                /* CBackward._checked: its error, or a copy in the compiled layout */
                PyObject *fixed = PyObject_CallFunction(r->fix_result, "inOO", index, j, item,
                                                        c->sizes);
                Py_DECREF(item);
                if (fixed != NULL && !conforms_strided(fixed, &t->layout, t->strides)) {
                    PyErr_SetString(PyExc_TypeError, "Runner: fix_result gave another layout");
                    Py_CLEAR(fixed);
                }
                item = fixed;
            }
            if (item == NULL) {
                Py_DECREF(value);
                return -1;
            }
            Py_XSETREF(c->ext[t->ext], item);
            results[j] = PyArray_DATA((PyArrayObject *)item);
        }
        Py_DECREF(value);
    }
    return run_ops(c, s->op + s->n_pre, s->op_arg + s->n_pre, s->n_post);
}

/* The generated code's ``cb``: the site's work under the GIL. A failure's
   exception is kept for runner_call, which raises it once C has returned. */
static int site_callback(int site, void **results, int *done)
{
    Call *c = current_call;
    PyEval_RestoreThread(c->tstate);
    int failed = run_site(c, site, results) < 0;
    if (failed && !c->failed) {
        c->failed = 1;
#if PY_VERSION_HEX >= 0x030C0000
        c->error = PyErr_GetRaisedException();
#else
        PyErr_Fetch(&c->etype, &c->evalue, &c->etb);
#endif
    }
    PyErr_Clear();
    c->tstate = PyEval_SaveThread();
    if (!failed)
        *done = 1;
    return failed;
}

