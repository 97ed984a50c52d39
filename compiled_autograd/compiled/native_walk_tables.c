/* The tables of native_walk.c's walks: reading __slots__ members by offset, the
   tuples shared between cache hits, the key's hash, and the rank ints. Built as
   one translation unit with native_walk.c, this file first (native_walk.source()).
   Every function returns NULL (or -1) with the Python error set on failure. */
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

