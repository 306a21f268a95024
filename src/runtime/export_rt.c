/*
 * kiln's runtime for the libraries `kiln build` exports, when the host that loads them fills
 * none of the context slots (`__TVMBackendParallelLaunch`, `__TVMBackendAllocWorkspace`): a
 * plain C host with dlopen, Python's tvm_ffi without TVM. kiln's own loader and TVM's runtime
 * fill the slots with their pools, and then nothing here runs.
 *
 * It is compiled once, when kiln is built (build.rs), and linked into every exported library
 * with hidden visibility: each library has its own pool and nothing leaks into the host's
 * symbol namespace.
 *
 * Parallel launches (`__kiln_rt_parallel_launch`, TVMBackendParallelLaunch's signature):
 *   - a persistent pool, started on the first launch that needs it: KILN_NUM_THREADS threads
 *     in all, else TVM_NUM_THREADS, else the CPUs this process may run on (sched_getaffinity);
 *     the caller is one of them and runs tasks too. No thread is created after that.
 *   - workers spin briefly for the next launch, then park on a futex;
 *   - tasks are claimed from a shared counter tagged with the launch's generation, so a worker
 *     that another process delays does not hold up the launch and a worker late from one
 *     launch never takes a task of the next; the caller waits for the last task (spin, then
 *     futex);
 *   - launches from several host threads take turns (one launch at a time); a launch from
 *     inside a task, or with one thread, runs serially on the caller;
 *   - a task failing on a worker makes the launch return -2 (the generated code raises
 *     "a parallel task failed on a thread of the pool"); failing on the caller, -1 with the
 *     task's own error already raised;
 *   - fork(): the child starts its own pool on its first launch (pthread_atfork);
 *   - unloading the library (dlclose, exit) stops and joins the workers.
 *
 * Workspaces (`__kiln_rt_alloc_workspace` / `__kiln_rt_free_workspace`): 64-byte-aligned
 * blocks, kept per thread in a small cache on free and handed out again, so a kernel called
 * in a loop does not malloc/free its workspaces on every call. A thread's cache is freed when
 * the thread exits (and keeps the library loaded until then).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HIDDEN __attribute__((visibility("hidden")))
#define MAX_THREADS 256
#define SPIN_ITERS 20000

typedef struct {
  void *sync_handle;
  int32_t num_task;
} kiln_env;
typedef int32_t (*kiln_lambda)(int32_t, kiln_env *, void *);

static void futex_wait(_Atomic uint32_t *w, uint32_t v) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *w) {
  syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* ----- the pool ------------------------------------------------------------------------ */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t launch_mu = PTHREAD_MUTEX_INITIALIZER;
static int pool_threads = 1;    /* threads in all, the caller included */
static int workers_started = 0; /* worker threads running (under launch_mu) */
static pthread_t workers[MAX_THREADS];
static _Thread_local int in_task = 0;

static struct {
  _Atomic uint32_t gen;  /* bumped for every launch (and to stop); workers wait on it */
  _Atomic uint32_t done; /* set by whoever finishes the last task; the caller waits on it */
  /* (launch generation << 32) | next task to claim. A claim is a compare-and-swap that keeps
   * the generation, so a worker still leaving the previous launch can never take (and run
   * twice) a task of the next one. */
  _Atomic uint64_t claim;
  _Atomic int32_t remaining;
  _Atomic int32_t worker_failed;
  _Atomic int32_t quit;
  /* Written by the caller before it publishes `claim`, read only after a successful claim of
   * this generation (which ends only after every task of it finished). */
  kiln_lambda lambda;
  void *cdata;
  int32_t num_task;
} job;

static int env_threads(const char *name) {
  const char *s = getenv(name);
  if (s == NULL || *s == 0) return 0;
  char *end;
  long v = strtol(s, &end, 10);
  return (*end == 0 && v > 0) ? (int)(v > MAX_THREADS ? MAX_THREADS : v) : 0;
}

static void reset_after_fork(void) {
  /* Only the forking thread exists in the child: its pool starts again on first use. */
  pthread_mutex_init(&launch_mu, NULL);
  workers_started = 0;
  atomic_store(&job.quit, 0);
  in_task = 0;
}

static void init(void) {
  int n = env_threads("KILN_NUM_THREADS");
  if (n == 0) n = env_threads("TVM_NUM_THREADS");
  if (n == 0) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  }
  if (n <= 0) n = 1;
  pool_threads = n > MAX_THREADS ? MAX_THREADS : n;
  pthread_atfork(NULL, NULL, reset_after_fork);
}

/* Runs tasks of launch `g` until none is left. Returns 1 if one failed. On a worker a failure
 * is recorded before the task counts as finished, so the caller, who reads it once every task
 * has finished, cannot miss it. */
static int run_tasks(uint32_t g, int is_worker) {
  int failed = 0;
  for (;;) {
    uint64_t w = atomic_load(&job.claim);
    if ((uint32_t)(w >> 32) != g) break; /* a later launch (or none): nothing of ours left */
    int32_t t = (int32_t)(uint32_t)w;
    int32_t nt = job.num_task;
    if (t >= nt) break;
    if (!atomic_compare_exchange_weak(&job.claim, &w, w + 1)) continue;
    kiln_env env = {NULL, nt};
    if (job.lambda(t, &env, job.cdata) != 0) {
      failed = 1;
      if (is_worker) atomic_store(&job.worker_failed, 1);
    }
    if (atomic_fetch_sub(&job.remaining, 1) == 1) {
      atomic_store(&job.done, 1);
      futex_wake(&job.done);
    }
  }
  return failed;
}

static void *worker_main(void *arg) {
  uint32_t seen = (uint32_t)(uintptr_t)arg;
  in_task = 1;
  for (;;) {
    uint32_t g;
    int spins = 0;
    while ((g = atomic_load(&job.gen)) == seen) {
      if (++spins < SPIN_ITERS) {
        cpu_relax();
      } else {
        futex_wait(&job.gen, seen);
      }
    }
    seen = g;
    if (atomic_load(&job.quit)) return NULL;
    run_tasks(g, 1);
  }
}

/* Starts the workers (under launch_mu); fewer if the system refuses threads. */
static void start_workers(void) {
  uint32_t g = atomic_load(&job.gen);
  while (workers_started < pool_threads - 1) {
    if (pthread_create(&workers[workers_started], NULL, worker_main, (void *)(uintptr_t)g) != 0) {
      break;
    }
    workers_started++;
  }
  if (workers_started < pool_threads - 1) pool_threads = workers_started + 1;
}

static int32_t run_serial(kiln_lambda f, void *cdata) {
  kiln_env env = {NULL, 1};
  int saved = in_task;
  in_task = 1;
  int32_t rc = f(0, &env, cdata);
  in_task = saved;
  return rc == 0 ? 0 : -1;
}

HIDDEN int32_t __kiln_rt_parallel_launch(kiln_lambda f, void *cdata, int32_t num_task) {
  if (in_task) return run_serial(f, cdata);
  pthread_once(&init_once, init);
  if (pool_threads <= 1) return run_serial(f, cdata);
  pthread_mutex_lock(&launch_mu);
  if (workers_started == 0) start_workers();
  if (pool_threads <= 1) {
    pthread_mutex_unlock(&launch_mu);
    return run_serial(f, cdata);
  }
  int32_t nt = num_task > 0 ? num_task : pool_threads;
  uint32_t g = atomic_load(&job.gen) + 1;
  job.lambda = f;
  job.cdata = cdata;
  job.num_task = nt;
  atomic_store(&job.remaining, nt);
  atomic_store(&job.done, 0);
  atomic_store(&job.worker_failed, 0);
  atomic_store(&job.claim, (uint64_t)g << 32);
  atomic_store(&job.gen, g);
  futex_wake(&job.gen);
  in_task = 1;
  int caller_failed = run_tasks(g, 0);
  in_task = 0;
  int spins = 0;
  while (atomic_load(&job.remaining) > 0) {
    if (++spins < SPIN_ITERS) {
      cpu_relax();
    } else {
      futex_wait(&job.done, 0);
    }
  }
  int worker_failed = atomic_load(&job.worker_failed);
  pthread_mutex_unlock(&launch_mu);
  if (caller_failed) return -1;
  return worker_failed ? -2 : 0;
}

__attribute__((destructor)) static void stop_workers(void) {
  if (workers_started == 0) return;
  atomic_store(&job.quit, 1);
  atomic_fetch_add(&job.gen, 1);
  futex_wake(&job.gen);
  for (int i = 0; i < workers_started; i++) pthread_join(workers[i], NULL);
  workers_started = 0;
}

/* ----- workspaces ---------------------------------------------------------------------- */

#define WS_SLOTS 8
#define WS_HEADER 64

typedef struct {
  void *block[WS_SLOTS];
  size_t size[WS_SLOTS];
} ws_cache;

/* The calling thread's cache, freed when the thread exits. The exit hook is registered with
 * glibc's __cxa_thread_atexit_impl (what C++ thread_local destructors use), which keeps this
 * library loaded until every thread that has a cache has exited: a pthread key destructor
 * would be left pointing into an unloaded library after dlclose. */
extern void *__dso_handle;
extern int __cxa_thread_atexit_impl(void (*dtor)(void *), void *obj, void *dso_symbol);
static _Thread_local ws_cache *thread_cache;

static void ws_destroy(void *p) {
  ws_cache *c = p;
  for (int i = 0; i < WS_SLOTS; i++) free(c->block[i]);
  free(c);
  thread_cache = NULL;
}

static ws_cache *cache(void) {
  if (thread_cache == NULL) {
    ws_cache *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    if (__cxa_thread_atexit_impl(ws_destroy, c, &__dso_handle) != 0) {
      free(c);
      return NULL;
    }
    thread_cache = c;
  }
  return thread_cache;
}

/* A block of at least `nbytes` (64-byte aligned), or NULL. Its usable size is stored in a
 * 64-byte header before it. */
HIDDEN void *__kiln_rt_alloc_workspace(uint64_t nbytes) {
  if (nbytes > ((uint64_t)1 << 46)) return NULL;
  size_t n = (size_t)((nbytes + 63) & ~(uint64_t)63);
  if (n == 0) n = 64;
  ws_cache *c = cache();
  if (c != NULL) {
    int best = -1;
    for (int i = 0; i < WS_SLOTS; i++) {
      /* The smallest cached block that fits without wasting more than half of it. */
      if (c->block[i] != NULL && c->size[i] >= n && c->size[i] / 2 <= n &&
          (best < 0 || c->size[i] < c->size[best])) {
        best = i;
      }
    }
    if (best >= 0) {
      char *b = c->block[best];
      c->block[best] = NULL;
      return b + WS_HEADER;
    }
  }
  char *b = aligned_alloc(64, n + WS_HEADER);
  if (b == NULL) return NULL;
  memcpy(b, &n, sizeof n);
  return b + WS_HEADER;
}

HIDDEN void __kiln_rt_free_workspace(void *p) {
  if (p == NULL) return;
  char *b = (char *)p - WS_HEADER;
  size_t n;
  memcpy(&n, b, sizeof n);
  ws_cache *c = cache();
  if (c != NULL) {
    int slot = -1;
    for (int i = 0; i < WS_SLOTS; i++) {
      if (c->block[i] == NULL) {
        slot = i;
        break;
      }
    }
    if (slot < 0) {
      /* Full: replace the smallest cached block if this one is larger. */
      slot = 0;
      for (int i = 1; i < WS_SLOTS; i++)
        if (c->size[i] < c->size[slot]) slot = i;
      if (c->size[slot] >= n) {
        free(b);
        return;
      }
      free(c->block[slot]);
    }
    c->block[slot] = b;
    c->size[slot] = n;
    return;
  }
  free(b);
}
