/* The saved values of a compiled backward, read and released in one C pass
   (runtime/slots.py; the reference is Python's, in autograd/node.py).

   Reader(held, data, released, inner) is made from four slot descriptors (the
   member descriptors Python makes for ``__slots__``): a saved value's ``held``
   object (a tensor, or None), its ``data`` (an array, or None) and ``released``
   flag, and the tensor's ``inner`` array. ``reader(values, release)`` returns
   the list of each value's array -- ``data`` when ``held`` is None, else
   ``held.inner`` -- and with ``release`` true sets ``held`` and ``data`` to None
   and ``released`` to True on each, as it goes. Slots are read at the offsets
   the descriptors give (PyMemberDef: public API): each value must be exactly of
   the descriptors' class and each held tensor an instance of the inner one's,
   else TypeError, and a slot that is unset is an AttributeError, as in Python;
   a released value (its array None) is a LookupError.
   Each value is read, then released, in turn (as the reference loop does): on an
   error the values before it are released. What the releases let go of is
   dropped after the loop, so no finalizer runs inside it. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyTypeObject *value_type, *tensor_type;
    Py_ssize_t held, data, released, inner;
} Reader;

static int slot_offset(PyObject *descr, PyTypeObject **owner, Py_ssize_t *offset)
{
    if (!PyObject_TypeCheck(descr, &PyMemberDescr_Type)) {
        PyErr_SetString(PyExc_TypeError, "Reader: expected a __slots__ member descriptor");
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "Reader: %s is not a writable object slot", m->name);
        return -1;
    }
    *owner = ((PyDescrObject *)descr)->d_type;
    *offset = m->offset;
    return 0;
}

static int reader_init(Reader *r, PyObject *args, PyObject *kwds)
{
    PyObject *held, *data, *released, *inner;
    PyTypeObject *t1, *t2, *t3, *t4;
    Py_ssize_t o1, o2, o3, o4;
    if (!PyArg_ParseTuple(args, "OOOO", &held, &data, &released, &inner))
        return -1;
    if (slot_offset(held, &t1, &o1) < 0 || slot_offset(data, &t2, &o2) < 0
        || slot_offset(released, &t3, &o3) < 0 || slot_offset(inner, &t4, &o4) < 0)
        return -1;
    if (t1 != t2 || t1 != t3) {
        PyErr_SetString(PyExc_TypeError, "Reader: held, data and released are slots of one class");
        return -1;
    }
    /* (all checked first: a failed __init__ leaves the reader as it was) */
    r->held = o1;
    r->data = o2;
    r->released = o3;
    r->inner = o4;
    Py_XSETREF(r->value_type, (PyTypeObject *)Py_NewRef(t1));
    Py_XSETREF(r->tensor_type, (PyTypeObject *)Py_NewRef(t4));
    return 0;
}

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

static PyObject *unset(PyObject *obj, const char *what)
{
    PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute set for %s",
                 Py_TYPE(obj)->tp_name, what);
    return NULL;
}

static PyObject *reader_call(Reader *r, PyObject *args, PyObject *kwds)
{
    PyObject *values;
    int release;
    static char *names[] = {"values", "release", NULL};
    if (r->value_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Reader: not initialised");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!p", names, &PyList_Type, &values, &release))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values), done = 0;
    /* The arrays, and what the releases let go of (3 a value), dropped at the end. */
    PyObject **arrays = PyMem_Calloc((size_t)n * 4 + 1, sizeof(PyObject *));
    if (arrays == NULL)
        return PyErr_NoMemory();
    PyObject **dropped = arrays + n, *out = NULL;
    for (; done < n; done++) {      /* (no Python code runs in here: the list stays) */
        PyObject *sv = PyList_GET_ITEM(values, done);
        if (Py_TYPE(sv) != r->value_type) {
            PyErr_Format(PyExc_TypeError, "Reader: expected %s, got %s", r->value_type->tp_name,
                         Py_TYPE(sv)->tp_name);
            goto finish;
        }
        PyObject *held = SLOT(sv, r->held), *array;
        if (held == NULL) {
            unset(sv, "its tensor");
            goto finish;
        }
        if (held == Py_None) {
            array = SLOT(sv, r->data);
        } else if (PyObject_TypeCheck(held, r->tensor_type)) {
            array = SLOT(held, r->inner);
        } else {
            PyErr_Format(PyExc_TypeError, "Reader: a saved tensor of type %s",
                         Py_TYPE(held)->tp_name);
            goto finish;
        }
        if (array == NULL) {
            unset(sv, "its array");
            goto finish;
        }
        if (array == Py_None) {     /* (released: another thread's backward freed it) */
            PyErr_SetString(PyExc_LookupError, "Reader: a released value");
            goto finish;
        }
        arrays[done] = Py_NewRef(array);
        if (release) {
            dropped[3 * done] = SLOT(sv, r->held);
            dropped[3 * done + 1] = SLOT(sv, r->data);
            dropped[3 * done + 2] = SLOT(sv, r->released);
            SLOT(sv, r->held) = Py_NewRef(Py_None);
            SLOT(sv, r->data) = Py_NewRef(Py_None);
            SLOT(sv, r->released) = Py_NewRef(Py_True);
        }
    }
    if ((out = PyList_New(n)) != NULL)
        for (Py_ssize_t i = 0; i < n; i++) {
            PyList_SET_ITEM(out, i, arrays[i]);     /* (the list's reference now) */
            arrays[i] = NULL;
        }
finish:
    for (Py_ssize_t i = 0; i < done; i++) {
        Py_XDECREF(arrays[i]);
        Py_XDECREF(dropped[3 * i]);
        Py_XDECREF(dropped[3 * i + 1]);
        Py_XDECREF(dropped[3 * i + 2]);
    }
    PyMem_Free(arrays);
    return out;
}

static int reader_traverse(Reader *r, visitproc visit, void *arg)
{
    Py_VISIT(r->value_type);
    Py_VISIT(r->tensor_type);
    return 0;
}

static int reader_clear(Reader *r)
{
    Py_CLEAR(r->value_type);
    Py_CLEAR(r->tensor_type);
    return 0;
}

static void reader_dealloc(Reader *r)
{
    PyObject_GC_UnTrack(r);
    reader_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_slots.Reader",
    .tp_doc = "Saved values' arrays, read (and released) in one pass (runtime/slots.c).",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_call = (ternaryfunc)reader_call,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_slots", NULL, -1, NULL,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__slots(void)
{
    if (PyType_Ready(&ReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
