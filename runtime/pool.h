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

/* The PoolApi in ``capsule`` (None: NULL, the pool off), or -1 with an error. */
static inline int pool_api_from(PyObject *capsule, const PoolApi **out)
{
    if (capsule == Py_None) {
        *out = NULL;
        return 0;
    }
    const PoolApi *api = PyCapsule_GetPointer(capsule, "compiled_autograd.pool");
    if (api == NULL)
        return -1;
    *out = api;
    return 0;
}
#endif
