/* The caching allocator's interface for the other extensions (runtime/pool.c
   defines it; runtime/pool.py hands its capsule, "compiled_autograd.pool", to
   each extension's ``use_allocator``). */
#ifndef CA_POOL_H
#define CA_POOL_H
#include <Python.h>

typedef struct {
    size_t min_bytes;                   /* smaller requests: malloc, not the pool */
    void *(*alloc)(size_t n);           /* raw memory (not an array), and its free */
    void (*free)(void *data);
    PyObject *(*enter)(void);           /* the pool the context's numpy handler: the one
                                           before it, or NULL on an error */
    int (*leave)(PyObject *previous);   /* that one back (stolen); keeps an exception set */
} PoolApi;

#ifndef CA_POOL_IMPL
/* A client extension's pool (NULL: numpy's own allocator and malloc), set by its
   module function ``use_allocator(capsule or None)``, which its Python side
   calls once the module is loaded. */
static const PoolApi *pool;

static PyObject *use_allocator(PyObject *module, PyObject *capsule)
{
    (void)module;
    if (capsule == Py_None) {
        pool = NULL;
        Py_RETURN_NONE;
    }
    const PoolApi *api = PyCapsule_GetPointer(capsule, "compiled_autograd.pool");
    if (api == NULL)
        return NULL;
    pool = api;
    Py_RETURN_NONE;
}
#endif
#endif
