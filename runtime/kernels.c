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

/* float_input(arg) in *x and a new array of its shape and dtype in *out: 1; 0
   (nothing set) where the kernel does not apply; -1 with an exception. */
static int float_input_output(PyObject *arg, PyArrayObject **x, PyObject **out)
{
    *x = float_input(arg);
    if (*x == NULL)
        return PyErr_Occurred() ? -1 : 0;
    *out = PyArray_SimpleNew(PyArray_NDIM(*x), PyArray_DIMS(*x), PyArray_TYPE(*x));
    if (*out == NULL) {
        Py_DECREF(*x);
        return -1;
    }
    return 1;
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
    PyArrayObject *x;
    PyObject *out;
    int made = float_input_output(args[0], &x, &out);
    if (made <= 0)
        return made < 0 ? NULL : not_implemented();
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

/* softmax over the last dim: e = exp(x - max), e / sum(e); log: (x - max) - log(sum(e)).
   A row holding a NaN is NaN throughout (as numpy's: its max is NaN): filled
   so, before the exp, whose argument x - max is then <= 0 or an invalid
   operation's NaN (inf - inf), which float's ca_exp_neg_f takes. */
#define SOFTMAX(T, EXP, LOG) do { \
    const T *restrict src = PyArray_DATA(x); T *restrict dst = PyArray_DATA((PyArrayObject *)out); \
    for (npy_intp r = 0; r < rows; r++, src += len, dst += len) { \
        T m, s = 0; ROW_MAX(T, src, len, m); \
        if (m != m) { \
            for (npy_intp j = 0; j < len; j++) dst[j] = (T)NAN; \
        } else if (log_) { \
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
    PyArrayObject *x;
    PyObject *out;
    int made = float_input_output(args[0], &x, &out);
    if (made <= 0)
        return made < 0 ? NULL : not_implemented();
    npy_intp rows, len;
    last_dims(x, 1, &rows, &len);
    PyThreadState *ts = PyArray_SIZE(x) >= CA_NOGIL_MIN ? PyEval_SaveThread() : NULL;
    if (PyArray_TYPE(x) == NPY_FLOAT32)
        SOFTMAX(float, ca_exp_neg_f, logf);
    else
        SOFTMAX(double, exp, log);
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    Py_DECREF(x);
    return out;
}

/* scaled softmax over the last dim: v = x * scale (rounded to T, as numpy's mul),
   and -inf past a row's first `valid` entries (all, or with causal the row's index
   within its matrix + 1), as the reference's where(), whose exp is then 0. A row
   whose valid part holds a NaN is NaN throughout (its max is NaN): filled so
   before the exp, whose argument is then <= 0, or inf - inf's NaN where the row
   holds an inf (float's ca_exp_neg_f takes both). The loops run over
   whole vectors: up to `valid` rounded up to CA_ROW_VECTOR (at most the row), a
   select in the vector loop past `valid` (not a shorter loop with a scalar tail);
   the rest of a causal row is exp(-inf - max) / sum, written without its exp: 0,
   or NaN where the sum is (an inf in the row), as the reference's. */
#define CA_ROW_VECTOR 16
#define SCALED(T, j) ((j) < valid ? (T)(src[j] * sc) : (T)-INFINITY)
#define SCALED_SOFTMAX(T, EXP) do { \
    const T *restrict src = PyArray_DATA(x); T *restrict dst = PyArray_DATA((PyArrayObject *)out); \
    const T sc = (T)scale; \
    for (npy_intp r = 0; r < rows; r++, src += len, dst += len) { \
        npy_intp valid = len; \
        if (causal && r % n_rows + 1 < len) valid = r % n_rows + 1; \
        npy_intp span = (valid + CA_ROW_VECTOR - 1) / CA_ROW_VECTOR * CA_ROW_VECTOR; \
        if (span > len) span = len; \
        T m = -INFINITY, s = 0; int nan_ = 0; \
        _Pragma("omp simd reduction(max:m) reduction(|:nan_)") \
        for (npy_intp j = 0; j < span; j++) { T v = SCALED(T, j); m = m > v ? m : v; nan_ |= v != v; } \
        if (nan_) { \
            for (npy_intp j = 0; j < len; j++) dst[j] = (T)NAN; \
            continue; \
        } \
        _Pragma("omp simd reduction(+:s)") \
        for (npy_intp j = 0; j < span; j++) { \
            T e = EXP((T)(src[j] * sc) - m); e = j < valid ? e : 0; dst[j] = e; s += e; } \
        for (npy_intp j = 0; j < span; j++) dst[j] /= s; \
        const T fill = (T)0 / s; \
        for (npy_intp j = span; j < len; j++) dst[j] = fill; \
    } } while (0)

/* scaled_softmax(x, scale, causal): softmax(x * scale) over the last dim, with
   causal the entries above the diagonal of the last two dims masked (0). */
/* (GCC's -O3 would split the row loops at `valid`, leaving scalar tails: 2x slower) */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-split-loops")))
#endif
static PyObject *k_scaled_softmax(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scaled_softmax(x, scale, causal) takes 3 arguments");
        return NULL;
    }
    double scale = PyFloat_AsDouble(args[1]);
    int causal = PyObject_IsTrue(args[2]);
    if ((scale == -1.0 && PyErr_Occurred()) || causal < 0)
        return NULL;
    if (!PyArray_CheckExact(args[0]) || PyArray_SIZE((PyArrayObject *)args[0]) == 0)
        return not_implemented();
    int nd = PyArray_NDIM((PyArrayObject *)args[0]);
    if (nd < (causal ? 2 : 1))
        return not_implemented();
    PyArrayObject *x;
    PyObject *out;
    int made = float_input_output(args[0], &x, &out);
    if (made <= 0)
        return made < 0 ? NULL : not_implemented();
    npy_intp rows, len, n_rows = causal ? PyArray_DIM(x, nd - 2) : 1;
    last_dims(x, 1, &rows, &len);
    PyThreadState *ts = PyArray_SIZE(x) >= CA_NOGIL_MIN ? PyEval_SaveThread() : NULL;
    if (PyArray_TYPE(x) == NPY_FLOAT32)
        SCALED_SOFTMAX(float, ca_exp_neg_f);
    else
        SCALED_SOFTMAX(double, exp);
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    Py_DECREF(x);
    return out;
}

/* (x - mean) / sqrt(var + eps) over each row, the variance of the centred row
   (two passes, as numpy's reference). */
#define LAYER_NORM(T, SQRT) do { \
    const T *restrict src = PyArray_DATA(x); T *restrict dst = PyArray_DATA((PyArrayObject *)out); \
    const T *restrict w = wa ? PyArray_DATA(wa) : NULL, *restrict b = ba ? PyArray_DATA(ba) : NULL; \
    T e = (T)eps; \
    for (npy_intp r = 0; r < rows; r++, src += len, dst += len) { \
        T s = 0, v = 0; \
        _Pragma("omp simd reduction(+:s)") \
        for (npy_intp j = 0; j < len; j++) s += src[j]; \
        T mean = s / (T)len; \
        _Pragma("omp simd reduction(+:v)") \
        for (npy_intp j = 0; j < len; j++) { T c = src[j] - mean; dst[j] = c; v += c * c; } \
        T std = SQRT(v / (T)len + e); \
        if (w == NULL) \
            for (npy_intp j = 0; j < len; j++) dst[j] /= std; \
        else \
            for (npy_intp j = 0; j < len; j++) { T t = dst[j] / std; t = t * w[j]; dst[j] = t + b[j]; } \
    } } while (0)

/* w or b of layer_norm: C-contiguous, aligned, native, of x's dtype and n elements. */
static PyArrayObject *affine_operand(PyObject *o, int type, npy_intp n)
{
    if (!PyArray_CheckExact(o))
        return NULL;
    PyArrayObject *a = (PyArrayObject *)o;
    if (PyArray_TYPE(a) != type || !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a)
        || !PyArray_ISNOTSWAPPED(a) || PyArray_SIZE(a) != n)
        return NULL;
    return a;
}

/* layer_norm(x, ndim, eps[, w, b]): normalised over the last ndim dims (then times
   w plus b: each rounded as numpy's mul and add, no fused multiply-add). */
static PyObject *k_layer_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "layer_norm(x, ndim, eps[, w, b]) takes 3 or 5 "
                        "arguments");
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
    PyArrayObject *wa = NULL, *ba = NULL;
    if (nargs == 5) {
        wa = affine_operand(args[3], PyArray_TYPE(x), len);
        ba = affine_operand(args[4], PyArray_TYPE(x), len);
        if (wa == NULL || ba == NULL) {
            Py_DECREF(x);
            return not_implemented();
        }
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

/* linear(x, w, b): x @ w.T + b (torch's addmm) as one GEMM that writes its
   destination: the rows of the output start as b and the BLAS adds x @ w.T to
   them (beta 1), as the C backend's linear does; numpy's path makes three passes
   over the output (the BLAS zeroes it for beta 0, the product, then += b). The
   BLAS is numpy's own OpenBLAS, whose gemm symbols kernels.py hands over once
   (set_gemm). x: C-contiguous, at least 2-d; w: 2-d, C- or Fortran-contiguous
   (a transposed view); b: None or 1-d of w's rows; one float dtype, native and
   aligned; no size 0; else NotImplemented (numpy's path). */
typedef void (*gemm64_f)(int, int, int, int64_t, int64_t, int64_t, float, const float *,
                         int64_t, const float *, int64_t, float, float *, int64_t);
typedef void (*gemm32_f)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
typedef void (*dgemm64_f)(int, int, int, int64_t, int64_t, int64_t, double, const double *,
                          int64_t, const double *, int64_t, double, double *, int64_t);
typedef void (*dgemm32_f)(int, int, int, int, int, int, double, const double *, int,
                          const double *, int, double, double *, int);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
static void *gemm_s, *gemm_d;       /* the BLAS's sgemm and dgemm, or NULL */
static int gemm_int64;              /* 1: its sizes are int64_t, 0: int */

/* set_gemm(sgemm address, dgemm address, int64): the BLAS linear calls. */
static PyObject *k_set_gemm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_gemm(sgemm, dgemm, int64) takes 3 arguments");
        return NULL;
    }
    void *s = PyLong_AsVoidPtr(args[0]), *d = PyLong_AsVoidPtr(args[1]);
    int wide = PyObject_IsTrue(args[2]);
    if (PyErr_Occurred() || wide < 0)
        return NULL;
    gemm_s = s;
    gemm_d = d;
    gemm_int64 = wide;
    Py_RETURN_NONE;
}

/* One BLAS call C = op(A) op(B) (+ beta C) of the given dtype, with the BLAS's
   integer width (checked by the caller). */
static void gemm_call(int type, int ta, int tb, npy_intp M, npy_intp N, npy_intp K,
                      const void *a, npy_intp lda, const void *b, npy_intp ldb, double beta,
                      void *c, npy_intp ldc)
{
    if (type == NPY_FLOAT32) {
        if (gemm_int64)
            ((gemm64_f)gemm_s)(ROW_MAJOR, ta, tb, M, N, K, 1.0f, a, lda, b, ldb, (float)beta,
                               c, ldc);
        else
            ((gemm32_f)gemm_s)(ROW_MAJOR, ta, tb, (int)M, (int)N, (int)K, 1.0f, a, (int)lda, b,
                               (int)ldb, (float)beta, c, (int)ldc);
    } else {
        if (gemm_int64)
            ((dgemm64_f)gemm_d)(ROW_MAJOR, ta, tb, M, N, K, 1.0, a, lda, b, ldb, beta, c, ldc);
        else
            ((dgemm32_f)gemm_d)(ROW_MAJOR, ta, tb, (int)M, (int)N, (int)K, 1.0, a, (int)lda, b,
                                (int)ldb, beta, c, (int)ldc);
    }
}

/* x, w or b as linear takes it: an exact ndarray of the dtype, native, aligned. */
static int linear_operand(PyObject *o, int type)
{
    if (!PyArray_CheckExact(o))
        return 0;
    PyArrayObject *a = (PyArrayObject *)o;
    return PyArray_TYPE(a) == type && PyArray_ISNOTSWAPPED(a) && PyArray_ISALIGNED(a);
}

#define FILL_ROWS(T) do { \
    T *restrict dst = PyArray_DATA((PyArrayObject *)out); \
    const char *src = PyArray_DATA(b); npy_intp bs = PyArray_STRIDE(b, 0); \
    for (npy_intp j = 0; j < n_out; j++) dst[j] = *(const T *)(src + j * bs); \
    for (npy_intp r = 1; r < rows; r++) memcpy(dst + r * n_out, dst, n_out * sizeof(T)); \
    } while (0)

static PyObject *k_linear(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "linear(x, w, b) takes 3 arguments");
        return NULL;
    }
    if (gemm_s == NULL || gemm_d == NULL || !PyArray_CheckExact(args[0]))
        return not_implemented();
    int type = PyArray_TYPE((PyArrayObject *)args[0]);
    if ((type != NPY_FLOAT32 && type != NPY_FLOAT64) || !linear_operand(args[0], type)
        || !linear_operand(args[1], type) || (args[2] != Py_None && !linear_operand(args[2], type)))
        return not_implemented();
    PyArrayObject *x = (PyArrayObject *)args[0], *w = (PyArrayObject *)args[1];
    PyArrayObject *b = args[2] == Py_None ? NULL : (PyArrayObject *)args[2];
    int nd = PyArray_NDIM(x);
    if (nd < 2 || nd > NPY_MAXDIMS || !PyArray_IS_C_CONTIGUOUS(x) || PyArray_NDIM(w) != 2)
        return not_implemented();
    npy_intp n_in = PyArray_DIM(x, nd - 1), n_out = PyArray_DIM(w, 0);
    npy_intp rows = PyArray_SIZE(x) / (n_in ? n_in : 1);
    if (PyArray_DIM(w, 1) != n_in || n_in == 0 || n_out == 0 || rows == 0
        || (b != NULL && (PyArray_NDIM(b) != 1 || PyArray_DIM(b, 0) != n_out)))
        return not_implemented();
    int tb;
    npy_intp ldb;
    if (PyArray_IS_C_CONTIGUOUS(w)) {            /* w (out, in) row-major: op(B) = w^T */
        tb = TRANS;
        ldb = n_in;
    } else if (PyArray_IS_F_CONTIGUOUS(w)) {     /* a transposed view: w^T is row-major */
        tb = NO_TRANS;
        ldb = n_out;
    } else {
        return not_implemented();
    }
    if (!gemm_int64 && (rows > INT_MAX || n_in > INT_MAX || n_out > INT_MAX))
        return not_implemented();
    npy_intp dims[NPY_MAXDIMS];
    for (int i = 0; i < nd - 1; i++)
        dims[i] = PyArray_DIM(x, i);
    dims[nd - 1] = n_out;
    PyObject *out = PyArray_SimpleNew(nd, dims, type);
    if (out == NULL)
        return NULL;
    void *c = PyArray_DATA((PyArrayObject *)out);
    const void *a = PyArray_DATA(x), *bw = PyArray_DATA(w);
    PyThreadState *ts = rows * n_out * n_in >= CA_NOGIL_MIN ? PyEval_SaveThread() : NULL;
    if (b != NULL) {
        if (type == NPY_FLOAT32)
            FILL_ROWS(float);
        else
            FILL_ROWS(double);
    }
    gemm_call(type, NO_TRANS, tb, rows, n_out, n_in, a, n_in, bw, ldb, b != NULL ? 1.0 : 0.0,
              c, n_out);
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    return out;
}

/* The BLAS layout of a matrix's last two dims (rows x cols, strides in bytes):
   row-major (NO_TRANS) or column-major (TRANS) with its leading dimension in
   elements; 0 where it is neither (the caller gives NotImplemented). */
static int blas_layout(npy_intp sr, npy_intp sc, npy_intp rows, npy_intp cols, npy_intp isz,
                       int *trans, npy_intp *ld)
{
    if (rows == 0 || cols == 0) {     /* nothing is read */
        *trans = NO_TRANS;
        *ld = cols > 1 ? cols : 1;
        return 1;
    }
    if (sr % isz || sc % isz)
        return 0;
    if ((sc == isz || cols == 1) && (rows == 1 || sr >= cols * isz)) {
        *trans = NO_TRANS;
        *ld = rows != 1 ? sr / isz : cols;
        return *ld >= (cols > 1 ? cols : 1);
    }
    if ((sr == isz || rows == 1) && (cols == 1 || sc >= rows * isz)) {
        *trans = TRANS;
        *ld = cols != 1 ? sc / isz : rows;
        return *ld >= (rows > 1 ? rows : 1);
    }
    return 0;
}

static void zero_rows(char *c, npy_intp ldc_bytes, npy_intp r0, npy_intp r1, npy_intp c0,
                      npy_intp c1, npy_intp isz)
{
    if (c1 > c0)
        for (npy_intp r = r0; r < r1; r++)
            memset(c + r * ldc_bytes + c0 * isz, 0, (size_t)(c1 - c0) * isz);
}

/* matmul_tri(a, b, tri): the block-triangular product of matmul's `tri` (1..6:
   ca_math.h's CA_TRI_*), by ca_tri_block's blocks, one BLAS call each, over a
   broadcast batch; NotImplemented where it does not apply (not two float32 or two
   float64 native ndarrays, a matrix the BLAS cannot read, no BLAS). */
static PyObject *k_matmul_tri(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "matmul_tri(a, b, tri) takes 3 arguments");
        return NULL;
    }
    long tri = PyLong_AsLong(args[2]);
    if (tri == -1 && PyErr_Occurred())
        return NULL;
    if (tri < CA_TRI_A_LOWER || tri > CA_TRI_OUT_UPPER) {
        PyErr_Format(PyExc_ValueError, "matmul_tri: tri must be 1..6, got %ld", tri);
        return NULL;
    }
    if (gemm_s == NULL || gemm_d == NULL || !PyArray_CheckExact(args[0])
        || !PyArray_CheckExact(args[1]))
        return not_implemented();
    PyArrayObject *a = (PyArrayObject *)args[0], *b = (PyArrayObject *)args[1];
    int type = PyArray_TYPE(a), nda = PyArray_NDIM(a), ndb = PyArray_NDIM(b);
    if ((type != NPY_FLOAT32 && type != NPY_FLOAT64) || !linear_operand(args[0], type)
        || !linear_operand(args[1], type) || nda < 2 || ndb < 2)
        return not_implemented();
    npy_intp isz = PyArray_ITEMSIZE(a);
    npy_intp M = PyArray_DIM(a, nda - 2), K = PyArray_DIM(a, nda - 1), N = PyArray_DIM(b, ndb - 1);
    if (PyArray_DIM(b, ndb - 2) != K)
        return not_implemented();
    int ta, tb;
    npy_intp lda, ldb;
    if (!blas_layout(PyArray_STRIDE(a, nda - 2), PyArray_STRIDE(a, nda - 1), M, K, isz, &ta, &lda)
        || !blas_layout(PyArray_STRIDE(b, ndb - 2), PyArray_STRIDE(b, ndb - 1), K, N, isz, &tb,
                        &ldb))
        return not_implemented();
    if (!gemm_int64 && (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX
                        || ldb > INT_MAX))
        return not_implemented();
    /* the broadcast batch: out's dims, and each operand's byte stride per dim (0
       where it is broadcast) */
    int nb = (nda > ndb ? nda : ndb) - 2;
    npy_intp dims[NPY_MAXDIMS], sa[NPY_MAXDIMS], sb[NPY_MAXDIMS], total = 1;
    for (int d = 0; d < nb; d++) {
        int da = d - (nb - (nda - 2)), db = d - (nb - (ndb - 2));
        npy_intp na = da >= 0 ? PyArray_DIM(a, da) : 1, nbd = db >= 0 ? PyArray_DIM(b, db) : 1;
        if (na != nbd && na != 1 && nbd != 1)
            return not_implemented();
        dims[d] = na > nbd ? na : nbd;
        if (na == 0 || nbd == 0)
            dims[d] = 0;
        sa[d] = da >= 0 && na != 1 ? PyArray_STRIDE(a, da) : 0;
        sb[d] = db >= 0 && nbd != 1 ? PyArray_STRIDE(b, db) : 0;
        total *= dims[d];
    }
    dims[nb] = M;
    dims[nb + 1] = N;
    PyObject *out = PyArray_SimpleNew(nb + 2, dims, type);
    if (out == NULL || total == 0 || M == 0 || N == 0)
        return out;
    char *c = PyArray_DATA((PyArrayObject *)out);
    const char *a0 = PyArray_DATA(a), *b0 = PyArray_DATA(b);
    npy_intp ldc_bytes = N * isz, idx[NPY_MAXDIMS] = {0};
    int out_tri = tri == CA_TRI_OUT_LOWER || tri == CA_TRI_OUT_UPPER;
    PyThreadState *ts = total * M * N * K >= CA_NOGIL_MIN ? PyEval_SaveThread() : NULL;
    for (npy_intp t = 0; t < total; t++) {
        npy_intp oa = 0, ob = 0;
        for (int d = 0; d < nb; d++) {
            oa += idx[d] * sa[d];
            ob += idx[d] * sb[d];
        }
        char *ct = c + t * M * ldc_bytes;
        int64_t bl[6];
        for (int64_t i = 0; ca_tri_block((int)tri, i, M, N, K, bl); i++) {
            npy_intp r0 = bl[0], r1 = bl[1], c0 = bl[2], c1 = bl[3], k0 = bl[4], k1 = bl[5];
            if (r1 > r0 && c1 > c0) {
                if (k1 > k0) {
                    npy_intp ea = ta == NO_TRANS ? r0 * lda + k0 : k0 * lda + r0;
                    npy_intp eb = tb == NO_TRANS ? k0 * ldb + c0 : c0 * ldb + k0;
                    gemm_call(type, ta, tb, r1 - r0, c1 - c0, k1 - k0, a0 + oa + ea * isz, lda,
                              b0 + ob + eb * isz, ldb, 0.0, ct + r0 * ldc_bytes + c0 * isz, N);
                } else {
                    zero_rows(ct, ldc_bytes, r0, r1, c0, c1, isz);
                }
            }
            if (out_tri) {
                zero_rows(ct, ldc_bytes, r0, r1, 0, c0, isz);
                zero_rows(ct, ldc_bytes, r0, r1, c1, N, isz);
            }
        }
        for (int d = nb - 1; d >= 0; d--) {       /* the next batch index */
            if (++idx[d] < dims[d])
                break;
            idx[d] = 0;
        }
    }
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    return out;
}

static PyMethodDef methods[] = {
    {"axpy", (PyCFunction)(void (*)(void))k_axpy, METH_FASTCALL,
     "axpy(out, a, alpha, b): out = a + alpha * b in one pass, or NotImplemented"},
    {"gelu", (PyCFunction)(void (*)(void))k_gelu, METH_FASTCALL,
     "gelu(x, tanh): GELU of a float32/float64 ndarray in one pass, or NotImplemented"},
    {"softmax", (PyCFunction)(void (*)(void))k_softmax, METH_FASTCALL,
     "softmax(x, dim, log): (log_)softmax over the last dim, or NotImplemented"},
    {"linear", (PyCFunction)(void (*)(void))k_linear, METH_FASTCALL,
     "linear(x, w, b): x @ w.T + b as one GEMM onto rows of b, or NotImplemented"},
    {"matmul_tri", (PyCFunction)(void (*)(void))k_matmul_tri, METH_FASTCALL,
     "matmul_tri(a, b, tri): a block-triangular product (matmul's tri), or NotImplemented"},
    {"set_gemm", (PyCFunction)(void (*)(void))k_set_gemm, METH_FASTCALL,
     "set_gemm(sgemm, dgemm, int64): the BLAS's gemm addresses, for linear"},
    {"scaled_softmax", (PyCFunction)(void (*)(void))k_scaled_softmax, METH_FASTCALL,
     "scaled_softmax(x, scale, causal): softmax(x * scale), causally masked, or "
     "NotImplemented"},
    {"layer_norm", (PyCFunction)(void (*)(void))k_layer_norm, METH_FASTCALL,
     "layer_norm(x, ndim, eps[, w, b]): normalised over the last ndim dims (times w plus "
     "b), or NotImplemented"},
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
