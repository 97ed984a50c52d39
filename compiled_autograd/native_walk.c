/* The two walks of a compiled-autograd cache hit, in C (see native_walk.py).

   discover():      GraphTask._discover (engine.py), line for line.
   collect_nodes(): the node loop of tracer.collect with record=False, for the
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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyObject *s_next_functions, *s_params, *s_shapes, *s_dtypes, *s_saved,
    *s_hooked, *s_variable, *s_backward_hooks, *s_post_acc_hooks, *s_data, *s_tensor,
    *s_unpack_hook, *s_released, *s_version_counter, *s_value, *s_saved_version,
    *s_shape, *s_dtype, *s_node, *s_edges, *s_scalar, *s_leaf, *s__saved;

/* ------------------------------------------------------------ attribute reads */

/* The walks read about fifteen attributes per node, nearly all __slots__ members
   (Node, PrimBackward, AccumulateGrad, SavedVariable, VersionCounter, Tensor).
   PyObject_GetAttr finds a member through the type's method cache and then its
   descriptor, about 10 ns; but a member lives at a fixed offset for its type, so
   the offset is kept per type and the member read there. A type's entry holds
   while the type's version tag does (CPython gives a type a new tag whenever it
   or a base changes). Anything else -- a type with its own getattr, a property,
   an instance-dict attribute, an unset slot -- is read by PyObject_GetAttr. */
#ifdef Py_AUDIT_READ
#define AUDITED_READ Py_AUDIT_READ
#else
#define AUDITED_READ READ_RESTRICTED
#endif
#define ATTR_TYPES 32
typedef struct {
    PyTypeObject *type;
    unsigned int tag;
    Py_ssize_t offset;           /* -1: not a plain member for this type */
} AttrEntry;
typedef struct {
    PyObject *name;
    AttrEntry entries[ATTR_TYPES];
} Attr;

static Attr a_next_functions, a_params, a_shapes, a_dtypes, a_saved, a_variable, a_backward_hooks, a_post_acc_hooks, a_data, a_tensor, a_unpack_hook, a_released, a_version_counter, a_value, a_saved_version, a_shape, a_dtype;

/* getattr(obj, a->name). New reference. */
static PyObject *get_attr(PyObject *obj, Attr *a)
{
    PyTypeObject *tp = Py_TYPE(obj);
    AttrEntry *e = &a->entries[((uintptr_t)tp >> 6) % ATTR_TYPES];
    if (e->type != tp || e->tag != tp->tp_version_tag ||
        !PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)) {
        Py_ssize_t offset = -1;
        e->type = NULL;
        if (tp->tp_getattro == PyObject_GenericGetAttr) {
            PyObject *d = _PyType_Lookup(tp, a->name);     /* borrowed; sets the tag */
            /* A member of this type or a base (a class may hold another class's
               descriptor: Python then raises, so must we), not audited. */
            if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                PyType_IsSubtype(tp, PyDescr_TYPE(d))) {
                PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
                if (m->type == T_OBJECT_EX && !(m->flags & AUDITED_READ))
                    offset = m->offset;
            }
        }
        if (!PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG))
            return PyObject_GetAttr(obj, a->name);
        e->type = tp;
        e->tag = tp->tp_version_tag;
        e->offset = offset;
    }
    if (e->offset >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + e->offset);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(obj, a->name);   /* (an unset slot: its AttributeError) */
}

/* ------------------------------------------------------------ shared tuples */

/* Every tuple a hit builds is built again, equal, at the next hit of the same
   graph. Building it anew costs an allocation and, worse, work for the garbage
   collector (a hit's allocations set off a young-generation pass over everything
   the forward just made), and the cache lookup then compares it item by item. So
   tuples are shared: a hash table keyed by the identity of the items. A tuple in
   the table holds its items, so while it is there no other object can take an
   item's address: identical items mean an equal tuple. The table is exact (open
   addressing, linear probing), so the same items always find the same tuple and
   the key stored at a miss stays identical, item by item, to every later hit's;
   when it is half full it is emptied and fills again. It keeps at most
   TUPLE_LIMIT small tuples of key items (types, dtypes, ints, strings). */
#define TUPLE_SLOTS 32768                /* a power of two */
#define TUPLE_LIMIT (TUPLE_SLOTS / 2)
typedef struct {
    PyObject *tuple;                     /* NULL: an empty slot */
    Py_uhash_t ids;                      /* the hash of its items' identities */
    Py_hash_t hash;                      /* hash(tuple), once asked; -1 before */
} SharedSlot;
static SharedSlot shared_slots[TUPLE_SLOTS];
static Py_ssize_t shared_count;

static Py_uhash_t identity_hash(PyObject *const *items, Py_ssize_t n)
{
    Py_uhash_t h = (Py_uhash_t)n;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ ((Py_uhash_t)(uintptr_t)items[i] >> 4)) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

/* The slot holding the tuple of exactly these items, or the empty slot where it
   belongs. */
static SharedSlot *shared_find(PyObject *const *items, Py_ssize_t n, Py_uhash_t ids)
{
    for (size_t i = ids;; i++) {
        SharedSlot *slot = &shared_slots[i & (TUPLE_SLOTS - 1)];
        PyObject *t = slot->tuple;
        if (t == NULL)
            return slot;
        if (slot->ids == ids && PyTuple_GET_SIZE(t) == n) {
            Py_ssize_t j = 0;
            while (j < n && PyTuple_GET_ITEM(t, j) == items[j])
                j++;
            if (j == n)
                return slot;
        }
    }
}

/* Empty the table. The tuples are released only after it is consistent: their
   deallocation may run Python code, which may come back here. */
static void shared_clear(void)
{
    Py_ssize_t n = 0, cap = shared_count > 0 ? shared_count : 1;
    PyObject **old = PyMem_Malloc(cap * sizeof(PyObject *));
    for (size_t i = 0; i < TUPLE_SLOTS; i++) {
        PyObject *t = shared_slots[i].tuple;
        shared_slots[i].tuple = NULL;
        if (t != NULL && old != NULL && n < cap)
            old[n++] = t;       /* (with no memory for the array, they stay alive) */
    }
    shared_count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(old[i]);
    PyMem_Free(old);
}

/* The shared tuple of these items. New reference. */
static PyObject *shared_tuple(PyObject *const *items, Py_ssize_t n)
{
    Py_uhash_t ids = identity_hash(items, n);
    SharedSlot *slot = shared_find(items, n, ids);
    if (slot->tuple != NULL) {
        Py_INCREF(slot->tuple);
        return slot->tuple;
    }
    PyObject *t = PyTuple_New(n);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(items[i]);
        PyTuple_SET_ITEM(t, i, items[i]);
    }
    /* The allocation may have run the garbage collector, hence Python code, hence
       another thread's walk: look again before inserting. */
    if (shared_count >= TUPLE_LIMIT)
        shared_clear();
    slot = shared_find(items, n, ids);
    if (slot->tuple != NULL) {
        PyObject *found = slot->tuple;
        Py_INCREF(found);
        Py_DECREF(t);
        return found;
    }
    slot->tuple = t;
    slot->ids = ids;
    slot->hash = -1;
    shared_count++;
    Py_INCREF(t);
    return t;
}

/* key_hash(key): hash(key) for a tuple of key items, equal to tuple.__hash__
   (CPython's xxHash-based tuplehash, on the items' hashes) but with the hash of
   each shared item computed once and kept in the table: a hit's key has hundreds
   of nested tuples, and tuples do not keep their hash. This assumes, as every
   dict key does, that the items' hashes do not change: key items are types,
   dtypes, ints, floats, strings and tuples of them. (An item whose hash did change
   would give a cache miss, never a wrong graph: the lookup still compares keys.) */
#if SIZEOF_PY_UHASH_T > 4
#define XXPRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define XXPRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define XXPRIME_5 ((Py_uhash_t)2870177450012600261ULL)
#define XXROTATE(x) ((x << 31) | (x >> 33))
#else
#define XXPRIME_1 ((Py_uhash_t)2654435761UL)
#define XXPRIME_2 ((Py_uhash_t)2246822519UL)
#define XXPRIME_5 ((Py_uhash_t)374761393UL)
#define XXROTATE(x) ((x << 13) | (x >> 19))
#endif

static Py_hash_t item_hash(PyObject *item)
{
    Py_ssize_t n = PyTuple_CheckExact(item) ? PyTuple_GET_SIZE(item) : 0;
    if (n == 0)
        return PyObject_Hash(item);
    PyObject *const *items = &PyTuple_GET_ITEM(item, 0);
    Py_uhash_t ids = identity_hash(items, n);
    SharedSlot *slot = shared_find(items, n, ids);
    if (slot->tuple != item)
        return PyObject_Hash(item);
    if (slot->hash != -1)
        return slot->hash;
    Py_hash_t h = PyObject_Hash(item);
    if (h == -1)
        return -1;
    slot = shared_find(items, n, ids);   /* the hash may have run Python code */
    if (slot->tuple == item)
        slot->hash = h;
    return h;
}

static PyObject *key_hash(PyObject *self, PyObject *key)
{
    (void)self;
    if (!PyTuple_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "key_hash: the key is a tuple");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(key);
    Py_uhash_t acc = XXPRIME_5;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_hash_t lane = item_hash(PyTuple_GET_ITEM(key, i));
        if (lane == -1)
            return NULL;
        acc += (Py_uhash_t)lane * XXPRIME_2;
        acc = XXROTATE(acc);
        acc *= XXPRIME_1;
    }
    acc += (Py_uhash_t)n ^ (XXPRIME_5 ^ 3527539UL);
    if (acc == (Py_uhash_t)-1)
        return PyLong_FromSsize_t(1546275796);
    return PyLong_FromSsize_t((Py_hash_t)acc);
}

/* The int ``rank``, the same object at every hit (ranks past 256 are not cached
   by CPython). New reference. */
static PyObject *rank_ints;

static PyObject *rank_int(Py_ssize_t rank)
{
    while (PyList_GET_SIZE(rank_ints) <= rank) {
        PyObject *v = PyLong_FromSsize_t(PyList_GET_SIZE(rank_ints));
        int bad = v == NULL || PyList_Append(rank_ints, v) < 0;
        Py_XDECREF(v);
        if (bad)
            return NULL;
    }
    PyObject *v = PyList_GET_ITEM(rank_ints, rank);
    Py_INCREF(v);
    return v;
}

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
     "tracer.collect's node loop (record=False) in C."},
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
