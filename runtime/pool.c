/* A caching allocator for the arrays compiled autograd's own ops make: a numpy
   memory handler (NEP 49) that keeps freed blocks for the next request of their
   size class, as torch's CUDA caching allocator keeps freed device memory.

   Why: a training step frees everything its forward and backward made and the next
   step makes it all again. Given back to glibc, that memory is returned to the
   kernel (the heap is trimmed once its free top exceeds a threshold that glibc
   derives from past mmaps), and the next step faults every page in again, zeroed:
   the transformer's step took ~1,600 minor faults, 3-6 ms of it (benchmarks/step.py,
   "c no pool"). Kept here, a block is reused warm.

   Only the arrays made while this handler is the context's numpy handler come
   from it: the C forward sets it around a prim's kernel (runtime/forward.c), the
   C backward around its call (codegen/c_call.c); a user's own numpy arrays use
   numpy's handler as before. Each array keeps its handler (numpy holds a
   reference), so it comes back here whoever frees it.

   Requests below POOL_MIN bytes go to malloc (glibc's bins serve them without
   faults); larger ones take a block of their size class: a quarter step between
   powers of two (at most 25% over), at least 64-aligned; one of 4 MB or more is
   2 MB aligned and asks for huge pages (2 faults for 4 MB instead of ~1,000).
   Every block's data follows a header (its size class, the bytes asked for), so
   free needs no size: numpy passes one, but the header is what free trusts.
   At most ``limit`` bytes are kept (1 GiB unless set); ``empty_cache()`` frees
   them all. A mutex guards the lists: numpy may allocate without the GIL (a fork
   waits for it, so that the child does not inherit it held). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CA_POOL_IMPL
#include "pool.h"

/* Under AddressSanitizer a kept block is poisoned, and a taken one past the
   bytes asked for: an overflow within a block's class is still caught. */
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)0)
#define UNPOISON(p, n) ((void)0)
#endif

#define POOL_MIN ((size_t)32 << 10)
#define SMALL_HEADER 16                  /* malloc's own alignment is kept */
#define BLOCK_HEADER 64                  /* a pooled block's data is 64-aligned */
#define HUGE_FROM ((size_t)4 << 20)
#define HUGE_ALIGN ((size_t)2 << 20)
#define N_CLASSES (4 * 64)

/* Before every block's data: its size class (-1: a malloc'd small one) and the
   bytes asked for (realloc copies that much). Before that header, a pooled
   block's link in its free list: a kept block's data is never written (under
   ASan it is poisoned from its first byte: a write through a freed array is
   caught, and cannot corrupt the list). */
typedef struct { size_t size; int cls; } Header;
_Static_assert(sizeof(Header) <= SMALL_HEADER, "a small block's header");
_Static_assert(SMALL_HEADER + sizeof(void *) <= BLOCK_HEADER, "a pooled block's link");

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *lists[N_CLASSES];           /* free blocks, linked through their data */
static size_t cached, in_use, limit = (size_t)1 << 30;
static unsigned long long hits, misses;

static inline Header *header_of(void *data) { return (Header *)data - 1; }
static inline void **link_of(void *data) { return (void **)((char *)data - SMALL_HEADER) - 1; }

/* Size class c holds (4 + c % 4) quarters of 2^(c / 4) bytes of data; from
   HUGE_FROM on, rounded up to whole huge pages. */
static size_t capacity(int c)
{
    size_t b = (size_t)(4 + c % 4) << (c / 4 - 2);
    return b >= HUGE_FROM ? (b + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN : b;
}

/* The smallest class that holds n (>= POOL_MIN) bytes; of classes whose
   capacities round to the same huge pages (5 and 6 MB, 7 and 8 MB), the last, so
   that blocks of one capacity share one list. */
static int size_class(size_t n)
{
    int k = 63 - __builtin_clzll((unsigned long long)n);       /* 2^k <= n */
    size_t step = (size_t)1 << (k - 2);
    int q = (int)((n + step - 1) / step);                      /* 4..8 */
    int c = q == 8 ? 4 * (k + 1) : 4 * k + q - 4;
    while (capacity(c + 1) == capacity(c))
        c++;
    return c;
}

/* Where a class's block starts before its data: the header's room, or for a huge
   one a whole huge page, so that the data is huge-page aligned (of that first
   page only the header's 4 kB page is ever touched). */
static inline size_t lead(int c) { return capacity(c) >= HUGE_FROM ? HUGE_ALIGN : BLOCK_HEADER; }

static void free_block(char *data)
{
    int c = header_of(data)->cls;
    UNPOISON(data, capacity(c));        /* (malloc's own poisoning takes over) */
    free(data - lead(c));
}

static char *new_block(int c)
{
    void *base;
    size_t cap = capacity(c), before = lead(c);
    if (posix_memalign(&base, before, before + cap) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (cap >= HUGE_FROM) {     /* hints: no huge pages is fine */
        (void)madvise((char *)base + before, cap, MADV_HUGEPAGE);
        /* the lead page holds only the header (and link): with huge pages
           "always", its one written word would fault in 2 MB */
        (void)madvise(base, before, MADV_NOHUGEPAGE);
    }
#endif
    return (char *)base + before;
}

static void *pool_alloc(size_t n, int zero)
{
    if (n < POOL_MIN) {
        char *base = zero ? calloc(1, n + SMALL_HEADER) : malloc(n + SMALL_HEADER);
        if (base == NULL)
            return NULL;
        Header *h = header_of(base + SMALL_HEADER);
        h->cls = -1;
        h->size = n;
        return base + SMALL_HEADER;
    }
    if (n > SIZE_MAX / 4)
        return NULL;
    int c = size_class(n);
    if (c >= N_CLASSES)
        return NULL;
    size_t cap = capacity(c);
    char *data = NULL;
    pthread_mutex_lock(&lock);
    if (lists[c] != NULL) {
        data = lists[c];
        lists[c] = *link_of(data);
        cached -= cap;
        hits++;
    } else {
        misses++;
    }
    in_use += cap;
    pthread_mutex_unlock(&lock);
    if (data == NULL && (data = new_block(c)) == NULL) {
        pthread_mutex_lock(&lock);
        in_use -= cap;
        pthread_mutex_unlock(&lock);
        return NULL;
    }
    Header *h = header_of(data);
    h->cls = c;
    h->size = n;
    UNPOISON(data, n);
    POISON(data + n, cap - n);
    if (zero)
        memset(data, 0, n);
    return data;
}

static void pool_free(void *data)
{
    if (data == NULL)
        return;
    int c = header_of(data)->cls;
    if (c < 0) {
        free((char *)data - SMALL_HEADER);
        return;
    }
    size_t cap = capacity(c);
    pthread_mutex_lock(&lock);
    in_use -= cap;
    if (cached + cap <= limit) {
        POISON(data, cap);
        *link_of(data) = lists[c];
        lists[c] = data;
        cached += cap;
        data = NULL;
    }
    pthread_mutex_unlock(&lock);
    if (data != NULL)
        free_block(data);
}

static void *h_malloc(void *ctx, size_t n) { (void)ctx; return pool_alloc(n, 0); }

static void *h_calloc(void *ctx, size_t count, size_t size)
{
    (void)ctx;
    if (size != 0 && count > SIZE_MAX / size)
        return NULL;
    return pool_alloc(count * size, 1);
}

static void h_free(void *ctx, void *data, size_t size)
{
    (void)ctx;
    (void)size;
    pool_free(data);
}

static void *h_realloc(void *ctx, void *data, size_t n)
{
    (void)ctx;
    if (data == NULL)
        return pool_alloc(n, 0);
    Header *h = header_of(data);
    if (h->cls < 0 && n < POOL_MIN) {               /* malloc'd, and stays small */
        char *base = realloc((char *)data - SMALL_HEADER, n + SMALL_HEADER);
        if (base == NULL)
            return NULL;
        header_of(base + SMALL_HEADER)->size = n;
        return base + SMALL_HEADER;
    }
    if (h->cls >= 0 && n >= POOL_MIN && size_class(n) == h->cls) {
        h->size = n;                                 /* the same class: the same block */
        UNPOISON(data, n);
        POISON((char *)data + n, capacity(h->cls) - n);
        return data;
    }
    void *moved = pool_alloc(n, 0);
    if (moved == NULL)
        return NULL;
    memcpy(moved, data, h->size < n ? h->size : n);
    pool_free(data);
    return moved;
}

static PyDataMem_Handler handler = {
    "compiled_autograd_pool", 1,
    {NULL, h_malloc, h_calloc, h_realloc, h_free}};

/* What the other extensions (runtime/forward.c, codegen/c_call.c) call, through
   the module's ``api`` capsule: ``enter`` makes the pool the context's numpy
   handler and returns the one before it (NULL: an error), ``leave`` sets that
   one back (keeping an exception already set; -1: an error of its own); raw
   ``alloc`` and ``free`` for memory that is not an array (the C backward's
   arena). Entering and leaving cost ~0.4 us, so callers do it only for requests
   of ``min_bytes`` or more: smaller ones come from malloc's bins anyway. */

static PyObject *handler_capsule;

static void *api_alloc(size_t n) { return pool_alloc(n, 0); }

/* Only numpy's own handler is replaced: a handler a user installed stays theirs
   (their arrays and ours go through it, as they asked), and inside a scope the
   pool already has (a recomputed checkpoint's forward in a backward) nothing is
   set. */
static PyObject *api_enter(void)
{
    PyObject *current = PyDataMem_GetHandler();
    if (current == NULL || current != PyDataMem_DefaultHandler)
        return current;
    Py_DECREF(current);
    return PyDataMem_SetHandler(handler_capsule);
}

static int api_leave(PyObject *previous)
{
    PyObject *current = PyDataMem_GetHandler();
    if (current == previous) {          /* (enter kept the handler it found) */
        Py_XDECREF(current);
        Py_DECREF(previous);
        return 0;
    }
    Py_XDECREF(current);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *ours = PyDataMem_SetHandler(previous);
    Py_DECREF(previous);
    if (ours == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    Py_DECREF(ours);
    PyErr_Restore(type, value, tb);
    return 0;
}

static PoolApi api = {POOL_MIN, api_alloc, pool_free, api_enter, api_leave};

static PyObject *empty_cache(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    void *free_lists[N_CLASSES];
    pthread_mutex_lock(&lock);
    size_t freed = cached;
    memcpy(free_lists, lists, sizeof lists);
    memset(lists, 0, sizeof lists);
    cached = 0;
    pthread_mutex_unlock(&lock);
    for (int c = 0; c < N_CLASSES; c++)
        for (char *data = free_lists[c]; data != NULL;) {
            char *next = *link_of(data);
            free_block(data);
            data = next;
        }
    return PyLong_FromSize_t(freed);
}

static PyObject *stats(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    pthread_mutex_lock(&lock);
    size_t c = cached, u = in_use, l = limit;
    unsigned long long h = hits, m = misses;
    pthread_mutex_unlock(&lock);
    return Py_BuildValue("{s:n,s:n,s:n,s:K,s:K}", "in_use", (Py_ssize_t)u,
                         "cached", (Py_ssize_t)c, "limit", (Py_ssize_t)l, "hits", h,
                         "misses", m);
}

static PyObject *set_limit(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "the pool's limit is a number of bytes >= 0");
        return NULL;
    }
    void *drop = NULL;          /* kept blocks past the new limit, largest first */
    pthread_mutex_lock(&lock);
    limit = (size_t)n;
    for (int c = N_CLASSES - 1; c >= 0 && cached > limit; c--)
        while (lists[c] != NULL && cached > limit) {
            char *data = lists[c];
            lists[c] = *link_of(data);
            cached -= capacity(header_of(data)->cls);
            *link_of(data) = drop;
            drop = data;
        }
    pthread_mutex_unlock(&lock);
    while (drop != NULL) {
        char *data = drop;
        drop = *link_of(data);
        free_block(data);
    }
    Py_RETURN_NONE;
}

static PyObject *py_enter(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return api_enter();
}

static PyObject *py_leave(PyObject *module, PyObject *previous)
{
    (void)module;
    if (api_leave(Py_NewRef(previous)) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* fork: the child must not inherit the lock held by a thread of the parent that
   was allocating without the GIL (it would wait for it forever). */
static void fork_prepare(void) { pthread_mutex_lock(&lock); }
static void fork_done(void) { pthread_mutex_unlock(&lock); }

static PyMethodDef methods[] = {
    {"enter", py_enter, METH_NOARGS,
     "Make the pool this context's numpy handler; returns the one before it."},
    {"leave", py_leave, METH_O, "Make ``previous`` (what enter returned) the handler again."},
    {"empty_cache", empty_cache, METH_NOARGS,
     "Free the blocks kept for reuse; returns their bytes."},
    {"stats", stats, METH_NOARGS, "The pool's bytes in use and kept, hits and misses."},
    {"set_limit", set_limit, METH_O,
     "Keep at most this many bytes for reuse (kept blocks past it are freed)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pool", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__pool(void)
{
    import_array();
    static int at_fork;             /* (the module may be initialised again: once) */
    if (!at_fork) {
        if (pthread_atfork(fork_prepare, fork_done, fork_done) != 0) {
            PyErr_SetString(PyExc_OSError, "the caching allocator: pthread_atfork failed");
            return NULL;
        }
        at_fork = 1;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    handler_capsule = PyCapsule_New(&handler, "mem_handler", NULL);
    PyObject *a = PyCapsule_New(&api, "compiled_autograd.pool", NULL);
    if (handler_capsule == NULL || a == NULL
        || PyModule_AddObjectRef(m, "handler", handler_capsule) < 0
        || PyModule_AddObjectRef(m, "api", a) < 0) {
        Py_XDECREF(a);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(a);
    return m;
}
