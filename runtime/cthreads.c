/* The C backend's threads library (runtime/cthreads.py): built with -fopenmp and
   loaded once per process, next to the generated libraries, which link the same
   libgomp (one OpenMP pool per calling thread, shared by all of them).

   ca_openmp_probe: a parallel region runs (the build's OpenMP works).
   ca_blas_jobs: OpenBLAS's threads callback (openblas_set_threads_callback_function,
   OpenBLAS >= 0.3.27). Installed, the BLAS runs the threaded parts of a GEMM on
   this OpenMP team instead of its own pthreads, whose idle workers spin for a
   long while (2^28 cycles) after each call and would take the cores the
   generated loops' team needs. The partition of the work is OpenBLAS's, as
   before, so the results are the same bits. */
#define _GNU_SOURCE
#include <omp.h>
#include <pthread.h>
#include <stddef.h>

int ca_openmp_probe(void) {
  int n = 0;
  #pragma omp parallel num_threads(2) reduction(+:n)
  n += omp_get_num_threads() > 0;
  return n;
}

typedef void (*ca_dojob)(int thread, void *job, int data);

/* OpenBLAS runs job i as "thread" i: it marks slot i of its own pool busy while the
   job runs, and works in that slot's buffer. Its pool's workers use slots
   0 .. pool - 2, and a worker that finds its slot marked busy when its idle
   spin times out spins on (it never sleeps while the jobs keep coming: one
   spinning thread too many). So the jobs take the slots above the pool's, where
   there are enough (ca_blas_slots: the pool's size, read at each call, and how
   many slots there are); else from slot 0 (slower, not wrong). */
static const int *ca_pool_size;
static int ca_slots;

void ca_blas_slots(const int *pool_size, int slots) {
  ca_pool_size = pool_size;
  ca_slots = slots;
}

struct ca_job { ca_dojob dojob; int i; void *job; int data; };

static void *ca_job_thread(void *arg) {
  struct ca_job *j = arg;
  j->dojob(j->i, j->job, j->data);
  return NULL;
}

/* The jobs wait for each other (a level-3 job waits for the panels the others
   pack), so they must all run at once: on an OpenMP team of numjobs threads; or,
   where OpenMP cannot promise that many (inside a parallel region, where teams
   do not nest; dynamic teams; a thread limit), on threads started here. */
static void ca_run_jobs(ca_dojob dojob, int numjobs, char *base, size_t size, int data) {
  int first = ca_pool_size ? *ca_pool_size : 0;
  if (first + numjobs > ca_slots) first = 0;
  if (numjobs <= 1) {
    if (numjobs == 1) dojob(first, base, data);
    return;
  }
  if (!omp_in_parallel() && !omp_get_dynamic() && omp_get_thread_limit() >= numjobs) {
    #pragma omp parallel for num_threads(numjobs) schedule(static, 1)
    for (int i = 0; i < numjobs; i++) dojob(first + i, base + (size_t)i * size, data);
    return;
  }
  pthread_t threads[64];
  struct ca_job job[64];
  int started[64] = {0};
  for (int i = 1; i < numjobs && i < 64; i++) {
    job[i] = (struct ca_job){dojob, first + i, base + (size_t)i * size, data};
    started[i] = pthread_create(&threads[i], NULL, ca_job_thread, &job[i]) == 0;
    if (!started[i]) ca_job_thread(&job[i]);   /* (then a level-3 job may wait forever:
                                                  no thread could be started at all) */
  }
  dojob(first, base, data);
  for (int i = 1; i < numjobs && i < 64; i++)
    if (started[i]) pthread_join(threads[i], NULL);
}

/* Job i works in OpenBLAS's buffer i, whichever thread runs it: two BLAS calls
   from two threads at once (numpy releases the GIL) would share buffers, so the
   calls take turns (a level-3 call already holds OpenBLAS's own lock; each call
   uses every thread anyway). */
static pthread_mutex_t ca_blas_lock = PTHREAD_MUTEX_INITIALIZER;

void ca_blas_jobs(int sync, ca_dojob dojob, int numjobs, size_t size, void *jobs, int data) {
  (void)sync;   /* always 1: OpenBLAS waits for the jobs */
  pthread_mutex_lock(&ca_blas_lock);
  ca_run_jobs(dojob, numjobs, jobs, size, data);
  pthread_mutex_unlock(&ca_blas_lock);
}

/* In a child process after fork: libgomp's pool of the forking thread is gone
   (its next team would wait forever), so that thread's loops run on one thread. */
void ca_after_fork_in_child(void) {
  omp_set_num_threads(1);
}

/* The calling thread's OpenMP limit (the generated loops take at most this many). */
int ca_loop_threads(void) { return omp_get_max_threads(); }
void ca_set_loop_threads(int n) { omp_set_num_threads(n); }
