/* The forward's C kernels (runtime/kernels.py): one pass over memory where a prim's
   numpy kernel makes many (GELU's erf: about 40 numpy passes and temporaries). Each
   takes what its numpy kernel takes and returns a fresh C-contiguous array of the
   input's dtype, or NotImplemented where it does not apply (not an ndarray of
   native float32/float64), and the caller runs the numpy kernel, which stays the
   reference (tests/test_forward_kernels.py compares the two).
   The math is runtime/ca_math.h's, the same helpers the C backend's generated
   code calls (its forward recomputations and GELU's derivative). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include "ca_math.h"

/* Below this many elements the loop keeps the GIL (releasing it costs more). */
#define CA_NOGIL_MIN 16384

/* x as a C-contiguous native float32/float64 ndarray (a new reference: x itself,
   or a contiguous copy), or NULL without an exception where the kernel does not
   apply. */
static PyArrayObject *float_input(PyObject *x)
{
    if (!PyArray_CheckExact(x))
        return NULL;
    PyArrayObject *a = (PyArrayObject *)x;
    int type = PyArray_TYPE(a);
    if ((type != NPY_FLOAT32 && type != NPY_FLOAT64) || !PyArray_ISNOTSWAPPED(a))
        return NULL;
    return (PyArrayObject *)PyArray_GETCONTIGUOUS(a);
}

static PyObject *not_implemented(void)
{
    Py_RETURN_NOTIMPLEMENTED;
}

/* gelu(x, tanh): 0.5 x (1 + erf(x / sqrt 2)), or the tanh approximation. */
static PyObject *k_gelu(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "gelu(x, tanh) takes 2 arguments");
        return NULL;
    }
    int tanh_ = PyObject_IsTrue(args[1]);
    if (tanh_ < 0)
        return NULL;
    PyArrayObject *x = float_input(args[0]);
    if (x == NULL)
        return PyErr_Occurred() ? NULL : not_implemented();
    PyObject *out = PyArray_SimpleNew(PyArray_NDIM(x), PyArray_DIMS(x), PyArray_TYPE(x));
    if (out == NULL) {
        Py_DECREF(x);
        return NULL;
    }
    npy_intp n = PyArray_SIZE(x);
    PyThreadState *ts = n >= CA_NOGIL_MIN ? PyEval_SaveThread() : NULL;
    if (PyArray_TYPE(x) == NPY_FLOAT32) {
        const float *restrict src = PyArray_DATA(x);
        float *restrict dst = PyArray_DATA((PyArrayObject *)out);
        if (tanh_)
            for (npy_intp i = 0; i < n; i++) dst[i] = ca_gelu_tanh_f(src[i]);
        else
            for (npy_intp i = 0; i < n; i++) dst[i] = ca_gelu_f(src[i]);
    } else {
        const double *restrict src = PyArray_DATA(x);
        double *restrict dst = PyArray_DATA((PyArrayObject *)out);
        if (tanh_)
            for (npy_intp i = 0; i < n; i++) dst[i] = ca_gelu_tanh_d(src[i]);
        else
            for (npy_intp i = 0; i < n; i++) dst[i] = ca_gelu_d(src[i]);
    }
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    Py_DECREF(x);
    return out;
}

static PyMethodDef methods[] = {
    {"gelu", (PyCFunction)(void (*)(void))k_gelu, METH_FASTCALL,
     "gelu(x, tanh): GELU of a float32/float64 ndarray in one pass, or NotImplemented"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels",
                                    "The forward's C kernels (runtime/kernels.py).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kernels(void)
{
    import_array();
    return PyModule_Create(&module);
}
