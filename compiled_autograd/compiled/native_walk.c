/* The two walks of a compiled-autograd cache hit, in C (see native_walk.py).

   discover():      GraphTask._discover (engine.py), line for line.
   collect_nodes(): the node loop of compiled_args.collect with record=False, for the
                    common nodes: a prim's backward node or an AccumulateGrad with
                    no hooks, whose saved variables are plain, unchanged arrays.
                    It writes what CompiledNodeArgs.collect_prim_node and
                    collect_leaf write; every other node, and every other saved
                    variable, goes to the Python code itself (the ``slow`` and
                    ``saved_slow`` callables), so the rules are written once.

   Only what a Python object exposes is read: attributes by name, or a
   __slots__ member at the offset its type's member descriptor gives (get_attr),
   no other struct layout. A plain node's ``shapes`` and ``saved``, every shape, and each
   ``next_functions`` entry are tuples (as PrimBackward and Node make them);
   anything else is a TypeError, never a guess. Every function returns NULL with
   the Python error set on failure. */

/* Built after native_walk_tables.c, in the same translation unit: the includes,
   the interned names (s_*), get_attr/Attr, shared_tuple, key_hash and rank_int
   come from there. */

/* ------------------------------------------------------------------ discover */

/* discover(root_fns, index, ranked, nodes, all_edges): every node reachable from
   root_fns, depth first; index: node -> rank (order of first sight); ranked: the
   nodes in rank order; nodes: pop order; all_edges: per node, a tuple of
   (rank, input_nr) or None per next function. */
static PyObject *discover(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "discover takes 5 arguments");
        return NULL;
    }
    PyObject *roots = args[0], *index = args[1], *ranked = args[2], *nodes = args[3],
             *all_edges = args[4];
    if (!PyList_Check(roots) || !PyDict_Check(index) || !PyList_Check(ranked) ||
        !PyList_Check(nodes) || !PyList_Check(all_edges)) {
        PyErr_SetString(PyExc_TypeError, "discover: lists and a dict expected");
        return NULL;
    }
    PyObject *stack = PyList_New(0);
    if (stack == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(roots); i++) {
        PyObject *fn = PyList_GET_ITEM(roots, i);
        int seen = PyDict_Contains(index, fn);
        if (seen < 0)
            goto fail;
        if (!seen) {
            PyObject *rank = rank_int(PyList_GET_SIZE(ranked));
            int bad = rank == NULL || PyDict_SetItem(index, fn, rank) < 0 ||
                      PyList_Append(ranked, fn) < 0 || PyList_Append(stack, fn) < 0;
            Py_XDECREF(rank);
            if (bad)
                goto fail;
        }
    }
    while (PyList_GET_SIZE(stack) > 0) {
        Py_ssize_t top = PyList_GET_SIZE(stack) - 1;
        PyObject *fn = PyList_GET_ITEM(stack, top);
        Py_INCREF(fn);
        if (PyList_SetSlice(stack, top, top + 1, NULL) < 0 || PyList_Append(nodes, fn) < 0) {
            Py_DECREF(fn);
            goto fail;
        }
        PyObject *next = get_attr(fn, &a_next_functions);
        Py_DECREF(fn);
        if (next == NULL)
            goto fail;
        PyObject *seq = PySequence_Tuple(next);   /* (itself, for a tuple): not mutable */
        Py_DECREF(next);
        if (seq == NULL)
            goto fail;
        Py_ssize_t n = PyTuple_GET_SIZE(seq), j = 0;
        /* the edges, as a tuple: the key's edges item reuses it */
        PyObject *small[8], **items = n <= 8 ? small : PyMem_New(PyObject *, n), *edges;
        if (items == NULL) {
            PyErr_NoMemory();
            Py_DECREF(seq);
            goto fail;
        }
        for (; j < n; j++) {
            PyObject *pair = PyTuple_GET_ITEM(seq, j);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                PyErr_SetString(PyExc_TypeError, "next_functions: (node, input_nr) pairs expected");
                goto fail_edge;
            }
            PyObject *nxt = PyTuple_GET_ITEM(pair, 0), *nr = PyTuple_GET_ITEM(pair, 1);
            if (nxt == Py_None) {
                Py_INCREF(Py_None);
                items[j] = Py_None;
                continue;
            }
            PyObject *rank = PyDict_GetItemWithError(index, nxt);   /* borrowed */
            if (rank != NULL) {
                Py_INCREF(rank);
            } else {
                if (PyErr_Occurred())
                    goto fail_edge;
                rank = rank_int(PyList_GET_SIZE(ranked));
                if (rank == NULL)
                    goto fail_edge;
                if (PyDict_SetItem(index, nxt, rank) < 0 || PyList_Append(ranked, nxt) < 0 ||
                    PyList_Append(stack, nxt) < 0) {
                    Py_DECREF(rank);
                    goto fail_edge;
                }
            }
            PyObject *pair_items[2] = {rank, nr};
            items[j] = shared_tuple(pair_items, 2);
            Py_DECREF(rank);
            if (items[j] == NULL)
                goto fail_edge;
        }
        Py_DECREF(seq);
        edges = shared_tuple(items, n);
        for (Py_ssize_t k = 0; k < n; k++)
            Py_DECREF(items[k]);
        if (items != small)
            PyMem_Free(items);
        if (edges == NULL || PyList_Append(all_edges, edges) < 0) {
            Py_XDECREF(edges);
            goto fail;
        }
        Py_DECREF(edges);
        continue;
    fail_edge:      /* items[0..j) are held */
        Py_DECREF(seq);
        for (Py_ssize_t k = 0; k < j; k++)
            Py_DECREF(items[k]);
        if (items != small)
            PyMem_Free(items);
        goto fail;
    }
    Py_DECREF(stack);
    Py_RETURN_NONE;
fail:
    Py_DECREF(stack);
    return NULL;
}

/* ------------------------------------------------------------ collect_nodes */

/* list.extend(seq) for a tuple of sizes. */
static int extend(PyObject *list, PyObject *tuple)
{
    if (!PyTuple_Check(tuple)) {
        PyErr_SetString(PyExc_TypeError, "a tuple of sizes expected");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++)
        if (PyList_Append(list, PyTuple_GET_ITEM(tuple, i)) < 0)
            return -1;
    return 0;
}

/* bool(getattr(obj, name)), -1 on error. */
static int attr_true(PyObject *obj, Attr *a)
{
    PyObject *v = get_attr(obj, a);
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

#if PY_VERSION_HEX >= 0x030D0000
#define lookup_attr PyObject_GetOptionalAttr
#else
#define lookup_attr _PyObject_LookupAttr
#endif

/* hooks.has_hooks: "_hooked" in fn.__dict__ (read as an attribute: no node
   class defines one; and asking for ``__dict__`` would make each node build the
   dict object it does not have yet), or a leaf with tensor hooks. */
static int has_hooks(PyObject *fn, int is_leaf_sink)
{
    PyObject *flag;
    int hooked = lookup_attr(fn, s_hooked, &flag);   /* no AttributeError when absent */
    if (hooked < 0)
        return -1;
    Py_XDECREF(flag);
    if (hooked || !is_leaf_sink)
        return hooked;
    PyObject *variable = get_attr(fn, &a_variable);
    if (variable == NULL)
        return -1;
    hooked = attr_true(variable, &a_backward_hooks);
    if (hooked == 0)
        hooked = attr_true(variable, &a_post_acc_hooks);
    Py_DECREF(variable);
    return hooked;
}

/* Key items that repeat, made once: a fresh tuple per node is work for the
   allocator and, worse, for the garbage collector, whose young-generation pass
   each hit's allocations set off. */
#define MAX_NDIM 15                 /* ndims 0..14, and None, fit one hex digit */
#define MAX_SHAPES 3
static PyObject *ndims_cache[1 << (4 * MAX_SHAPES)][MAX_SHAPES + 1];

/* The ndims tuple of a node's shapes (None for a non-tensor input), or NULL with
   *code < 0 when it is not cacheable. */
static PyObject *cached_ndims(PyObject *shapes, long *code)
{
    Py_ssize_t n = PyTuple_GET_SIZE(shapes);
    *code = -1;
    if (n > MAX_SHAPES)
        return NULL;
    long c = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *shape = PyTuple_GET_ITEM(shapes, i);
        long digit = shape == Py_None ? 0 : PyTuple_GET_SIZE(shape) + 1;
        if (digit > MAX_NDIM)
            return NULL;
        c = c * 16 + digit;
    }
    *code = c;
    return ndims_cache[c][n];
}

static PyObject *saved_meta_cache;   /* dtype -> list: ndim -> (dtype, False, ndim) */

/* The key item (dtype, False, ndim) of a plain saved array. */
static PyObject *saved_meta(PyObject *dtype, Py_ssize_t ndim)
{
    if (ndim >= MAX_NDIM)
        return Py_BuildValue("(OOn)", dtype, Py_False, ndim);
    PyObject *by_ndim = PyDict_GetItemWithError(saved_meta_cache, dtype);
    if (by_ndim == NULL) {
        if (PyErr_Occurred())
            return NULL;
        by_ndim = PyList_New(MAX_NDIM);
        if (by_ndim == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < MAX_NDIM; i++) {
            Py_INCREF(Py_None);
            PyList_SET_ITEM(by_ndim, i, Py_None);
        }
        int bad = PyDict_SetItem(saved_meta_cache, dtype, by_ndim) < 0;
        Py_DECREF(by_ndim);    /* the dict holds it */
        if (bad)
            return NULL;
    }
    PyObject *item = PyList_GET_ITEM(by_ndim, ndim);
    if (item == Py_None) {
        item = Py_BuildValue("(OOn)", dtype, Py_False, ndim);
        if (item == NULL)
            return NULL;
        Py_INCREF(item);
        /* SetItem (not SET_ITEM): releases whatever the slot holds by now, since
           the allocation above may have run other Python code */
        if (PyList_SetItem(by_ndim, ndim, item) < 0) {
            Py_DECREF(item);
            return NULL;
        }
        return item;
    }
    Py_INCREF(item);
    return item;
}

typedef struct {
    PyObject *args;          /* the CompiledNodeArgs */
    PyObject *key, *saved, *inputs, *sizes, *scalars;   /* its lists */
    PyObject *sv_type;       /* SavedVariable */
    PyObject *splits;        /* compiled_args._PARAM_SPLITS */
    PyObject *split_fn;      /* compiled_args._params_split */
    PyObject *no_params;     /* compiled_args._NO_PARAMS */
    PyObject *saved_slow;    /* CompiledNodeArgs._saved, bound */
} Walk;

/* The plain case of CompiledNodeArgs._saved: an array saved without hooks, not
   released, unchanged since. Returns its key item (dtype, False, ndim), or, for
   any other case, what the Python method returns. */
static PyObject *collect_saved(Walk *w, PyObject *fn, PyObject *sv)
{
    PyObject *hook = get_attr(sv, &a_unpack_hook);
    if (hook == NULL)
        return NULL;
    int plain = hook == Py_None;
    Py_DECREF(hook);
    if (plain) {
        PyObject *released = get_attr(sv, &a_released);
        if (released == NULL)
            return NULL;
        plain = released == Py_False;
        Py_DECREF(released);
    }
    if (plain) {
        PyObject *counter = get_attr(sv, &a_version_counter);
        PyObject *now = counter ? get_attr(counter, &a_value) : NULL;
        PyObject *then = now ? get_attr(sv, &a_saved_version) : NULL;
        plain = then ? PyObject_RichCompareBool(now, then, Py_EQ) : -1;
        Py_XDECREF(counter);
        Py_XDECREF(now);
        Py_XDECREF(then);
        if (plain < 0)
            return NULL;
    }
    if (!plain) {
        if (PyObject_SetAttr(w->args, s_node, fn) < 0)    /* names the node in errors */
            return NULL;
        return PyObject_CallOneArg(w->saved_slow, sv);
    }
    PyObject *tensor = get_attr(sv, &a_tensor);
    if (tensor == NULL)
        return NULL;
    PyObject *data = get_attr(tensor == Py_None ? sv : tensor, &a_data);
    Py_DECREF(tensor);
    if (data == NULL)
        return NULL;
    int bad = PyList_Append(w->saved, sv) < 0 || PyList_Append(w->inputs, data) < 0;
    Py_DECREF(data);
    if (bad)
        return NULL;
    PyObject *shape = get_attr(sv, &a_shape);
    if (shape == NULL)
        return NULL;
    PyObject *item = NULL;
    if (extend(w->sizes, shape) == 0) {
        PyObject *dtype = get_attr(sv, &a_dtype);
        if (dtype != NULL) {
            item = saved_meta(dtype, PyTuple_GET_SIZE(shape));
            Py_DECREF(dtype);
        }
    }
    Py_DECREF(shape);
    return item;
}

/* One saved item of a prim node: its key item (see collect_prim_node). */
static PyObject *collect_saved_item(Walk *w, PyObject *fn, PyObject *item)
{
    if (Py_IS_TYPE(item, (PyTypeObject *)w->sv_type))
        return collect_saved(w, fn, item);
    if (PyTuple_CheckExact(item)) {
        Py_ssize_t n = PyTuple_GET_SIZE(item);
        PyObject *out = PyTuple_New(n);
        if (out == NULL)
            return NULL;
        if (PyObject_SetAttr(w->args, s_node, fn) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *sub = PyObject_CallOneArg(w->saved_slow, PyTuple_GET_ITEM(item, i));
            if (sub == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            PyTuple_SET_ITEM(out, i, sub);
        }
        return out;
    }
    if (PyFloat_CheckExact(item)) {     /* a saved Python float: lifted, not keyed */
        if (PyList_Append(w->scalars, item) < 0)
            return NULL;
        Py_INCREF(s_scalar);
        return s_scalar;
    }
    Py_INCREF(item);
    return item;
}

/* The key items of a node's saved items, as one (shared) tuple. */
static PyObject *collect_saved_items(Walk *w, PyObject *fn, PyObject *saved)
{
    Py_ssize_t n = PyTuple_GET_SIZE(saved), i = 0;
    PyObject *small[8], **keys = n <= 8 ? small : PyMem_New(PyObject *, n), *out = NULL;
    if (keys == NULL)
        return PyErr_NoMemory();
    for (; i < n; i++) {
        keys[i] = collect_saved_item(w, fn, PyTuple_GET_ITEM(saved, i));
        if (keys[i] == NULL)
            break;
    }
    if (i == n)
        out = shared_tuple(keys, n);
    for (Py_ssize_t k = 0; k < i; k++)
        Py_DECREF(keys[k]);
    if (keys != small)
        PyMem_Free(keys);
    return out;
}

/* CompiledNodeArgs.collect_prim_node with record=False. */
static int collect_prim(Walk *w, PyObject *fn)
{
    PyObject *params = get_attr(fn, &a_params), *split = NULL;
    if (params == NULL)
        return -1;
    int nonempty = PyObject_IsTrue(params);
    if (nonempty > 0 && PyDict_CheckExact(params)) {
        PyObject *list = PyDict_Items(params);
        PyObject *items = list ? PyList_AsTuple(list) : NULL;
        Py_XDECREF(list);
        if (items != NULL) {
            split = PyDict_GetItemWithError(w->splits, items);
            Py_XINCREF(split);
            Py_DECREF(items);
        }
        if (split == NULL && !PyErr_Occurred())
            split = PyObject_CallOneArg(w->split_fn, params);
    } else if (nonempty > 0) {
        split = PyObject_CallOneArg(w->split_fn, params);
    } else if (nonempty == 0) {
        split = w->no_params;
        Py_INCREF(split);
    }
    Py_DECREF(params);
    if (split == NULL)
        return -1;
    PyObject *shapes = NULL, *ndims = NULL, *saved = NULL, *saved_keys = NULL,
             *dtypes = NULL, *item = NULL;
    int rc = -1;
    if (!PyTuple_Check(split) || PyTuple_GET_SIZE(split) != 2) {
        PyErr_SetString(PyExc_TypeError, "a params split is a (key, ints) pair");
        goto done;
    }
    if (extend(w->sizes, PyTuple_GET_ITEM(split, 1)) < 0)
        goto done;
    shapes = get_attr(fn, &a_shapes);
    if (shapes == NULL || !PyTuple_Check(shapes)) {
        if (shapes != NULL)
            PyErr_SetString(PyExc_TypeError, "node.shapes must be a tuple");
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shapes); i++) {
        PyObject *shape = PyTuple_GET_ITEM(shapes, i);
        if (shape != Py_None && extend(w->sizes, shape) < 0)
            goto done;
    }
    long code;
    ndims = cached_ndims(shapes, &code);
    if (ndims != NULL) {
        Py_INCREF(ndims);
    } else {
        ndims = PyTuple_New(PyTuple_GET_SIZE(shapes));
        if (ndims == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shapes); i++) {
            PyObject *shape = PyTuple_GET_ITEM(shapes, i);
            PyObject *nd = shape == Py_None ? (Py_INCREF(Py_None), Py_None)
                                            : PyLong_FromSsize_t(PyTuple_GET_SIZE(shape));
            if (nd == NULL)
                goto done;
            PyTuple_SET_ITEM(ndims, i, nd);
        }
        if (code >= 0 && ndims_cache[code][PyTuple_GET_SIZE(shapes)] == NULL) {
            /* kept for good: at most 4096 x 4 small tuples */
            Py_INCREF(ndims);
            ndims_cache[code][PyTuple_GET_SIZE(shapes)] = ndims;
        }
    }
    saved = get_attr(fn, &a_saved);
    if (saved == NULL || !PyTuple_Check(saved)) {
        if (saved != NULL)
            PyErr_SetString(PyExc_TypeError, "node.saved must be a tuple");
        goto done;
    }
    saved_keys = collect_saved_items(w, fn, saved);
    if (saved_keys == NULL)
        goto done;
    dtypes = get_attr(fn, &a_dtypes);
    if (dtypes == NULL)
        goto done;
    if (PyTuple_CheckExact(dtypes) && PyTuple_GET_SIZE(dtypes) > 0)
        Py_SETREF(dtypes, shared_tuple(&PyTuple_GET_ITEM(dtypes, 0), PyTuple_GET_SIZE(dtypes)));
    if (dtypes == NULL)
        goto done;
    PyObject *parts[5] = {(PyObject *)Py_TYPE(fn), PyTuple_GET_ITEM(split, 0), ndims, dtypes,
                          saved_keys};
    item = shared_tuple(parts, 5);
    if (item != NULL && PyList_Append(w->key, item) == 0)
        rc = 0;
done:
    Py_DECREF(split);
    Py_XDECREF(shapes);
    Py_XDECREF(ndims);
    Py_XDECREF(saved);
    Py_XDECREF(saved_keys);
    Py_XDECREF(dtypes);
    Py_XDECREF(item);
    return rc;
}

/* CompiledNodeArgs.collect_leaf with record=False. */
static int collect_leaf(Walk *w, PyObject *fn)
{
    PyObject *variable = get_attr(fn, &a_variable);
    PyObject *data = variable ? get_attr(variable, &a_data) : NULL;
    PyObject *shape = data ? get_attr(data, &a_shape) : NULL;
    PyObject *dtype = shape ? get_attr(data, &a_dtype) : NULL;
    PyObject *item = NULL;
    int rc = -1;
    if (dtype == NULL)
        goto done;
    if (!PyTuple_Check(shape)) {
        PyErr_SetString(PyExc_TypeError, "a leaf's shape must be a tuple");
        goto done;
    }
    PyObject *ndim = PyLong_FromSsize_t(PyTuple_GET_SIZE(shape));
    if (ndim == NULL)
        goto done;
    PyObject *parts[4] = {(PyObject *)Py_TYPE(fn), s_leaf, dtype, ndim};
    item = shared_tuple(parts, 4);
    Py_DECREF(ndim);
    if (item != NULL && PyList_Append(w->key, item) == 0 && extend(w->sizes, shape) == 0 &&
        PyList_Append(w->inputs, variable) == 0)
        rc = 0;
done:
    Py_XDECREF(variable);
    Py_XDECREF(data);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(item);
    return rc;
}

enum { SLOW = 0, PRIM = 1, LEAF = 2 };

/* collect_nodes(nodes, all_edges, args, lists, kinds, sv_type, splits, split_fn,
                 no_params, slow)
   lists: (key, saved, inputs, sizes, scalars) of args; kinds: {node type: 1 for a
   plain prim node, 2 for AccumulateGrad}; slow(args, fn, edges): the Python loop
   body, for every other node and for any node with hooks. */
static PyObject *collect_nodes(PyObject *self, PyObject *const *a, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "collect_nodes takes 10 arguments");
        return NULL;
    }
    PyObject *lists = a[3], *kinds = a[4], *slow = a[9];
    if (!PyList_Check(a[0]) || !PyList_Check(a[1]) ||
        PyList_GET_SIZE(a[0]) != PyList_GET_SIZE(a[1]) || !PyTuple_Check(lists) ||
        PyTuple_GET_SIZE(lists) != 5 || !PyDict_Check(kinds) || !PyDict_Check(a[6])) {
        PyErr_SetString(PyExc_TypeError, "collect_nodes: bad arguments");
        return NULL;
    }
    Walk w = {a[2], PyTuple_GET_ITEM(lists, 0), PyTuple_GET_ITEM(lists, 1),
              PyTuple_GET_ITEM(lists, 2), PyTuple_GET_ITEM(lists, 3),
              PyTuple_GET_ITEM(lists, 4), a[5], a[6], a[7], a[8], NULL};
    /* Tuple copies: the Python code called back may change the lists. */
    PyObject *nodes = PyList_AsTuple(a[0]), *all_edges = PyList_AsTuple(a[1]);
    w.saved_slow = PyObject_GetAttr(w.args, s__saved);
    if (nodes == NULL || all_edges == NULL || w.saved_slow == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nodes); i++) {
        PyObject *fn = PyTuple_GET_ITEM(nodes, i), *edges = PyTuple_GET_ITEM(all_edges, i);
        PyObject *k = PyDict_GetItemWithError(kinds, (PyObject *)Py_TYPE(fn));
        long kind = k ? PyLong_AsLong(k) : SLOW;
        if (PyErr_Occurred())
            goto fail;
        if (kind != PRIM && kind != LEAF)
            kind = SLOW;
        if (kind != SLOW) {
            int hooked = has_hooks(fn, kind == LEAF);
            if (hooked < 0)
                goto fail;
            if (hooked)
                kind = SLOW;
        }
        if (kind == SLOW) {
            PyObject *r = PyObject_CallFunctionObjArgs(slow, w.args, fn, edges, NULL);
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
            continue;
        }
        if ((kind == PRIM ? collect_prim(&w, fn) : collect_leaf(&w, fn)) < 0)
            goto fail;
        PyObject *t = PyTuple_Check(edges) ? (Py_INCREF(edges), edges) : PySequence_Tuple(edges);
        PyObject *parts[2] = {s_edges, t};
        PyObject *item = t ? shared_tuple(parts, 2) : NULL;
        Py_XDECREF(t);
        int bad = item == NULL || PyList_Append(w.key, item) < 0;
        Py_XDECREF(item);
        if (bad)
            goto fail;
    }
    Py_DECREF(nodes);
    Py_DECREF(all_edges);
    Py_DECREF(w.saved_slow);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(nodes);
    Py_XDECREF(all_edges);
    Py_XDECREF(w.saved_slow);
    return NULL;
}

/* ------------------------------------------------------------------ module */

static PyObject *clear_shared(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    shared_clear();
    Py_RETURN_NONE;
}


static PyMethodDef methods[] = {
    {"discover", (PyCFunction)(void (*)(void))discover, METH_FASTCALL,
     "GraphTask._discover in C."},
    {"collect_nodes", (PyCFunction)(void (*)(void))collect_nodes, METH_FASTCALL,
     "compiled_args.collect's node loop (record=False) in C."},
    {"key_hash", key_hash, METH_O, "hash(key), with the shared items' hashes kept."},
    {"clear_shared", clear_shared, METH_NOARGS,
     "Empty the table of shared tuples (as happens when it is half full)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native_walk", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

static int intern(PyObject **slot, const char *text)
{
    *slot = PyUnicode_InternFromString(text);
    return *slot == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__native_walk(void)
{
    if (intern(&s_next_functions, "next_functions") || intern(&s_params, "params") ||
        intern(&s_shapes, "shapes") || intern(&s_dtypes, "dtypes") ||
        intern(&s_saved, "saved") || intern(&s_hooked, "_hooked") || intern(&s_variable, "variable") ||
        intern(&s_backward_hooks, "_backward_hooks") ||
        intern(&s_post_acc_hooks, "_post_accumulate_grad_hooks") ||
        intern(&s_data, "_data") || intern(&s_tensor, "_tensor") ||
        intern(&s_unpack_hook, "unpack_hook") || intern(&s_released, "released") ||
        intern(&s_version_counter, "_version_counter") || intern(&s_value, "value") ||
        intern(&s_saved_version, "saved_version") || intern(&s_shape, "shape") ||
        intern(&s_dtype, "dtype") || intern(&s_node, "node") || intern(&s_edges, "edges") ||
        intern(&s_scalar, "scalar") || intern(&s_leaf, "leaf") || intern(&s__saved, "_saved"))
        return NULL;
    Attr *attrs[] = {&a_next_functions, &a_params, &a_shapes, &a_dtypes, &a_saved, &a_variable, &a_backward_hooks, &a_post_acc_hooks, &a_data, &a_tensor, &a_unpack_hook, &a_released, &a_version_counter, &a_value, &a_saved_version, &a_shape, &a_dtype};
    PyObject *attr_names[] = {s_next_functions, s_params, s_shapes, s_dtypes, s_saved, s_variable, s_backward_hooks, s_post_acc_hooks, s_data, s_tensor, s_unpack_hook, s_released, s_version_counter, s_value, s_saved_version, s_shape, s_dtype};
    for (size_t i = 0; i < sizeof attrs / sizeof *attrs; i++)
        attrs[i]->name = attr_names[i];
    saved_meta_cache = PyDict_New();
    rank_ints = PyList_New(0);
    if (saved_meta_cache == NULL || rank_ints == NULL)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod != NULL && PyModule_AddIntConstant(mod, "SHARED_TUPLE_LIMIT", TUPLE_LIMIT) < 0)
        Py_CLEAR(mod);
    return mod;
}
