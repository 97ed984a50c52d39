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
   apply (another dtype, byte-swapped, or misaligned: a view of a byte buffer). */
static PyArrayObject *float_input(PyObject *x)
{
    if (!PyArray_CheckExact(x))
        return NULL;
    PyArrayObject *a = (PyArrayObject *)x;
    int type = PyArray_TYPE(a);
    if ((type != NPY_FLOAT32 && type != NPY_FLOAT64) || !PyArray_ISNOTSWAPPED(a)
        || !PyArray_ISALIGNED(a))
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

/* The rows of x over its last dims: x's size is rows * len. */
static int last_dims(PyArrayObject *x, int k, npy_intp *rows, npy_intp *len)
{
    int nd = PyArray_NDIM(x);
    if (k < 0 || k > nd)
        return -1;
    *len = 1;
    for (int i = nd - k; i < nd; i++)
        *len *= PyArray_DIM(x, i);
    *rows = *len == 0 ? 0 : PyArray_SIZE(x) / *len;
    return 0;
}

/* One row's largest value, NaN if any is NaN (numpy's amax). */
#define ROW_MAX(T, row, len, out) do { \
    T m_ = -INFINITY; int nan_ = 0; \
    _Pragma("omp simd reduction(max:m_) reduction(|:nan_)") \
    for (npy_intp j = 0; j < (len); j++) { \
        T v_ = (row)[j]; m_ = m_ > v_ ? m_ : v_; nan_ |= v_ != v_; } \
    (out) = nan_ ? (T)NAN : m_; } while (0)

/* softmax over the last dim: e = exp(x - max), e / sum(e); log: (x - max) - log(sum(e)). */
#define SOFTMAX(T, EXP, LOG) do { \
    const T *restrict src = PyArray_DATA(x); T *restrict dst = PyArray_DATA((PyArrayObject *)out); \
    for (npy_intp r = 0; r < rows; r++, src += len, dst += len) { \
        T m, s = 0; ROW_MAX(T, src, len, m); \
        if (log_) { \
            _Pragma("omp simd reduction(+:s)") \
            for (npy_intp j = 0; j < len; j++) { T d = src[j] - m; dst[j] = d; s += EXP(d); } \
            T l = LOG(s); \
            for (npy_intp j = 0; j < len; j++) dst[j] -= l; \
        } else { \
            _Pragma("omp simd reduction(+:s)") \
            for (npy_intp j = 0; j < len; j++) { T e = EXP(src[j] - m); dst[j] = e; s += e; } \
            for (npy_intp j = 0; j < len; j++) dst[j] /= s; \
        } \
    } } while (0)

/* softmax(x, dim, log): softmax or log_softmax over dim, when dim is the last. */
static PyObject *k_softmax(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "softmax(x, dim, log) takes 3 arguments");
        return NULL;
    }
    long dim = PyLong_AsLong(args[1]);
    int log_ = PyObject_IsTrue(args[2]);
    if ((dim == -1 && PyErr_Occurred()) || log_ < 0)
        return NULL;
    if (!PyArray_CheckExact(args[0]) || PyArray_SIZE((PyArrayObject *)args[0]) == 0)
        return not_implemented();
    int nd = PyArray_NDIM((PyArrayObject *)args[0]);
    if (nd == 0 || (dim != nd - 1 && dim != -1))
        return not_implemented();
    PyArrayObject *x = float_input(args[0]);
    if (x == NULL)
        return PyErr_Occurred() ? NULL : not_implemented();
    PyObject *out = PyArray_SimpleNew(nd, PyArray_DIMS(x), PyArray_TYPE(x));
    if (out == NULL) {
        Py_DECREF(x);
        return NULL;
    }
    npy_intp rows, len;
    last_dims(x, 1, &rows, &len);
    PyThreadState *ts = PyArray_SIZE(x) >= CA_NOGIL_MIN ? PyEval_SaveThread() : NULL;
    if (PyArray_TYPE(x) == NPY_FLOAT32)
        SOFTMAX(float, ca_expf, logf);
    else
        SOFTMAX(double, exp, log);
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    Py_DECREF(x);
    return out;
}

/* (x - mean) / sqrt(var + eps) over each row, the variance of the centred row
   (two passes, as numpy's reference). */
#define LAYER_NORM(T, SQRT) do { \
    const T *restrict src = PyArray_DATA(x); T *restrict dst = PyArray_DATA((PyArrayObject *)out); \
    T e = (T)eps; \
    for (npy_intp r = 0; r < rows; r++, src += len, dst += len) { \
        T s = 0, v = 0; \
        _Pragma("omp simd reduction(+:s)") \
        for (npy_intp j = 0; j < len; j++) s += src[j]; \
        T mean = s / (T)len; \
        _Pragma("omp simd reduction(+:v)") \
        for (npy_intp j = 0; j < len; j++) { T c = src[j] - mean; dst[j] = c; v += c * c; } \
        T std = SQRT(v / (T)len + e); \
        for (npy_intp j = 0; j < len; j++) dst[j] /= std; \
    } } while (0)

/* layer_norm(x, ndim, eps): normalised over the last ndim dims. */
static PyObject *k_layer_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "layer_norm(x, ndim, eps) takes 3 arguments");
        return NULL;
    }
    long k = PyLong_AsLong(args[1]);
    double eps = PyFloat_AsDouble(args[2]);
    if ((k == -1 || eps == -1.0) && PyErr_Occurred())
        return NULL;
    if (!PyArray_CheckExact(args[0]) || PyArray_SIZE((PyArrayObject *)args[0]) == 0)
        return not_implemented();
    PyArrayObject *x = float_input(args[0]);
    if (x == NULL)
        return PyErr_Occurred() ? NULL : not_implemented();
    npy_intp rows, len;
    if (k > INT_MAX || last_dims(x, (int)k, &rows, &len) < 0) {
        Py_DECREF(x);
        return not_implemented();
    }
    PyObject *out = PyArray_SimpleNew(PyArray_NDIM(x), PyArray_DIMS(x), PyArray_TYPE(x));
    if (out == NULL) {
        Py_DECREF(x);
        return NULL;
    }
    PyThreadState *ts = PyArray_SIZE(x) >= CA_NOGIL_MIN ? PyEval_SaveThread() : NULL;
    if (PyArray_TYPE(x) == NPY_FLOAT32)
        LAYER_NORM(float, sqrtf);
    else
        LAYER_NORM(double, sqrt);
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    Py_DECREF(x);
    return out;
}

/* axpy(out, a, alpha, b): out = a + alpha * b, in place, in one pass (an
   optimizer's update; numpy makes two, b * alpha into a temporary, then the add).
   The same roundings as numpy's two passes: alpha cast to the arrays' dtype, the
   product rounded, then the sum (-std=c11: no fused multiply-add). All three
   C-contiguous native float32 or float64 arrays of one dtype and size (out may be
   a or b, but overlap neither shifted), out writeable; else NotImplemented.
   Returns None. */
static PyObject *k_axpy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "axpy(out, a, alpha, b) takes 4 arguments");
        return NULL;
    }
    double alpha = PyFloat_AsDouble(args[2]);
    if (alpha == -1.0 && PyErr_Occurred())
        return NULL;
    PyObject *arrays[3] = {args[0], args[1], args[3]};
    int type = -1;
    npy_intp n = -1;
    for (int k = 0; k < 3; k++) {
        if (!PyArray_CheckExact(arrays[k]))
            return not_implemented();
        PyArrayObject *x = (PyArrayObject *)arrays[k];
        int t = PyArray_TYPE(x);
        if ((t != NPY_FLOAT32 && t != NPY_FLOAT64) || (type >= 0 && t != type)
            || !PyArray_IS_C_CONTIGUOUS(x) || !PyArray_ISALIGNED(x)
            || !PyArray_ISNOTSWAPPED(x) || (n >= 0 && PyArray_SIZE(x) != n))
            return not_implemented();
        type = t;
        n = PyArray_SIZE(x);
    }
    if (!PyArray_ISWRITEABLE((PyArrayObject *)args[0]))
        return not_implemented();
    /* out may be a or b, element for element; an input that overlaps out shifted
       (views of one buffer) would read what this pass already wrote. */
    const char *o = PyArray_BYTES((PyArrayObject *)args[0]);
    const npy_intp bytes = n * PyArray_ITEMSIZE((PyArrayObject *)args[0]);
    for (int k = 1; k < 3; k++) {
        const char *x = PyArray_BYTES((PyArrayObject *)arrays[k]);
        if (x != o && x < o + bytes && o < x + bytes)
            return not_implemented();
    }
    PyThreadState *ts = n >= CA_NOGIL_MIN ? PyEval_SaveThread() : NULL;
    if (type == NPY_FLOAT32) {
        float *out = PyArray_DATA((PyArrayObject *)args[0]);
        const float *a = PyArray_DATA((PyArrayObject *)args[1]);
        const float *b = PyArray_DATA((PyArrayObject *)args[3]);
        const float al = (float)alpha;
        for (npy_intp i = 0; i < n; i++) {
            float t = al * b[i];
            out[i] = a[i] + t;
        }
    } else {
        double *out = PyArray_DATA((PyArrayObject *)args[0]);
        const double *a = PyArray_DATA((PyArrayObject *)args[1]);
        const double *b = PyArray_DATA((PyArrayObject *)args[3]);
        for (npy_intp i = 0; i < n; i++) {
            double t = alpha * b[i];
            out[i] = a[i] + t;
        }
    }
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"axpy", (PyCFunction)(void (*)(void))k_axpy, METH_FASTCALL,
     "axpy(out, a, alpha, b): out = a + alpha * b in one pass, or NotImplemented"},
    {"gelu", (PyCFunction)(void (*)(void))k_gelu, METH_FASTCALL,
     "gelu(x, tanh): GELU of a float32/float64 ndarray in one pass, or NotImplemented"},
    {"softmax", (PyCFunction)(void (*)(void))k_softmax, METH_FASTCALL,
     "softmax(x, dim, log): (log_)softmax over the last dim, or NotImplemented"},
    {"layer_norm", (PyCFunction)(void (*)(void))k_layer_norm, METH_FASTCALL,
     "layer_norm(x, ndim, eps): normalised over the last ndim dims, or NotImplemented"},
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
