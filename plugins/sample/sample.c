/*
 * The sample kiln device plugin: a simulated accelerator.
 *
 *   cc -shared -fPIC -O2 -Iinclude -o libkiln_sample.so plugins/sample/sample.c -lpthread
 *
 * - Device memory lives in host buffers, but the addresses handed out are NOT host pointers:
 *   they are handles into the plugin's own address range (from 0x7a0000000000, one 64 GiB range
 *   per device), resolved on every copy. A host dereference of one faults instead of silently
 *   reading memory, and every range is checked.
 * - Streams are real: one worker thread per stream runs the queued copies, event records, event
 *   waits and host callbacks in order (pthreads). Events are generation counters.
 * - Errors: per-thread last error string. A queued copy that fails marks its stream; the next
 *   synchronize_stream reports the failure once, with the copy's message.
 * - Failure injection: the kernels `<type>.inject_alloc_failure(n)` / `<type>.inject_copy_failure(n)`
 *   (also exported as C functions for dlsym) make the n-th device allocation / copy from now fail.
 * - Kernels: `<type>.add(x, y, z)` adds two float32 tensors on a device into a third.
 *
 * Compile-time variants (used by kiln's tests to build bad plugins from the same source):
 *   SAMPLE_DEVICE_TYPE="name"   the device type name (default "sample")
 *   SAMPLE_MINIMAL              only the required entries (exercises every kiln fallback)
 *   SAMPLE_TABLE_1_0            an ABI 1.0 table (struct_size of 1.0, no attributes or kernels)
 *   SAMPLE_ABI_MAJOR=n          claim another major ABI version
 *   SAMPLE_DROP_REQUIRED        leave two required entries NULL
 *   SAMPLE_FAIL_INIT            initialize() fails
 * Faulty variants (kiln must refuse what they return, with a message, and never abort):
 *   SAMPLE_FAULT_DEVICE_COUNT=n get_device_count reports n devices (e.g. 2^40)
 *   SAMPLE_FAULT_DEVICE_LIST    get_device_list gives 2^40 as the second id
 *   SAMPLE_FAULT_ATTR_NO_NUL    the device_name attribute fills all 256 bytes, no NUL
 *   SAMPLE_FAULT_NAME_NO_NUL    sub_device_type has no NUL within kiln's bound
 *   SAMPLE_FAULT_NULL_STREAM    create_stream succeeds with a NULL stream
 *   SAMPLE_FAULT_KERNEL_COUNT   get_kernels reports 2^40 kernels
 *   SAMPLE_FAULT_WRAP_ALLOC     device_memory_allocate returns a range that wraps around
 *   SAMPLE_FAULT_MEMORY_STATS   device_memory_stats reports SIZE_MAX total memory
 *   SAMPLE_ENTRY_FAILS          kiln_device_plugin_init fails with a message
 *   SAMPLE_NULL_DEVICE_TYPE     the entry leaves device_type NULL
 *   SAMPLE_NULL_TABLE           the entry leaves interface NULL
 *   SAMPLE_SHORT_TABLE          the table claims 64 bytes (smaller than ABI 1.0)
 *   SAMPLE_REFUSE_KILN          the entry refuses kiln as a plugin built for ABI 2 would
 *   SAMPLE_NO_QUERY_STREAM      leave query_stream NULL (kiln's blocking fallback)
 *   SAMPLE_NO_ASYNC_MEMSET      leave the 1.2 entry async_memory_set NULL
 *   SAMPLE_TABLE_1_1            an ABI 1.1 table (async_memory_set past its end)
 *   SAMPLE_NO_PINNED            leave host_memory_allocate/deallocate NULL (no pinned staging)
 *   SAMPLE_PINNED_STAGING       answer KILN_ATTR_KIND_PINNED_STAGING with 1 (kiln stages async
 *                               host<->device copies through host_memory_allocate buffers)
 */
#include "kiln/device_plugin.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SAMPLE_DEVICE_TYPE
#define SAMPLE_DEVICE_TYPE "sample"
#endif
#ifndef SAMPLE_ABI_MAJOR
#define SAMPLE_ABI_MAJOR KILN_PLUGIN_ABI_MAJOR
#endif
#define SAMPLE_DEVICES 2
#define SAMPLE_CAPACITY ((size_t)256 << 20)
#define SAMPLE_BASE 0x7a0000000000ull
#define SAMPLE_RANGE (1ull << 36)

#define EXPORT __attribute__((visibility("default")))

#ifdef SAMPLE_MINIMAL
#pragma GCC diagnostic ignored "-Wunused-function" /* the optional entries are left out */
#endif

/* ------------------------------------------------------------------ errors */

static __thread char t_error[512];

static KilnStatus fail(KilnStatus s, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_error, sizeof t_error, fmt, ap);
  va_end(ap);
  return s;
}

static const char* sample_get_last_error(void) { return t_error[0] ? t_error : NULL; }

/* ------------------------------------------------------------------ state */

typedef struct alloc {
  unsigned long long addr;
  size_t size;
  unsigned char* host;
  int unified;
  struct alloc* next;
} alloc_t;

typedef struct KilnPluginEvent_st {
  int device;
  unsigned long long record_gen; /* last recorded point */
  unsigned long long done_gen;   /* last completed point */
  int refs;                      /* queued ops that use it */
  int destroyed;
} event_t;

enum { OP_COPY, OP_CALLBACK, OP_RECORD, OP_WAIT, OP_MEMSET };
enum { K_H2D, K_D2H, K_D2D, K_P2P };
static const char* kind_name[] = {"h2d", "d2h", "d2d", "p2p"};

typedef struct op {
  int kind;
  int copy_kind, dst_dev, src_dev;
  void* dst;
  const void* src;
  size_t size;
  KilnStreamCallback cb;
  void* user;
  event_t* ev;
  unsigned long long gen;
  struct op* next;
} op_t;

typedef struct KilnPluginStream_st {
  int device;
  pthread_t thread;
  pthread_cond_t work;
  op_t *head, *tail;
  unsigned long long submitted, completed;
  int stop;
  int has_error;
  char error[600];
  struct KilnPluginStream_st* next_stream;
} stream_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_done = PTHREAD_COND_INITIALIZER;
static alloc_t* g_allocs[SAMPLE_DEVICES];
static unsigned long long g_next[SAMPLE_DEVICES];
static size_t g_used[SAMPLE_DEVICES];
static stream_t* g_streams;
static int g_initialized;
static long g_fail_alloc_at, g_fail_copy_at, g_alloc_count, g_copy_count;
static __thread int t_device;

EXPORT void sample_inject_alloc_failure(long nth) {
  pthread_mutex_lock(&g_mu);
  g_fail_alloc_at = nth;
  pthread_mutex_unlock(&g_mu);
}

EXPORT void sample_inject_copy_failure(long nth) {
  pthread_mutex_lock(&g_mu);
  g_fail_copy_at = nth;
  pthread_mutex_unlock(&g_mu);
}

static int bad_device(int d) { return d < 0 || d >= SAMPLE_DEVICES; }

/* The host bytes behind [addr, addr + size) on `dev`, or NULL. Call with g_mu held. */
static unsigned char* resolve(int dev, const void* p, size_t size) {
  unsigned long long a = (unsigned long long)(size_t)p;
  if (bad_device(dev)) return NULL;
  for (alloc_t* x = g_allocs[dev]; x; x = x->next)
    if (a >= x->addr && a - x->addr <= x->size && size <= x->size - (a - x->addr))
      return x->host + (a - x->addr);
  return NULL;
}

/* ------------------------------------------------------------------ device */

static KilnStatus sample_initialize(void) {
#ifdef SAMPLE_FAIL_INIT
  return fail(KILN_STATUS_ERROR, "sample: firmware image not found (injected init failure)");
#else
  pthread_mutex_lock(&g_mu);
  for (int d = 0; d < SAMPLE_DEVICES; ++d) g_next[d] = SAMPLE_BASE + (unsigned long long)d * SAMPLE_RANGE;
  g_initialized = 1;
  pthread_mutex_unlock(&g_mu);
  return KILN_STATUS_SUCCESS;
#endif
}

static KilnStatus sample_finalize(void) { return KILN_STATUS_SUCCESS; }

static KilnStatus sample_init_device(int32_t d) {
  if (bad_device(d)) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: no device %d", d);
  return g_initialized ? KILN_STATUS_SUCCESS : fail(KILN_STATUS_ERROR, "sample: not initialized");
}

static KilnStatus sample_deinit_device(int32_t d) { return bad_device(d) ? KILN_STATUS_INVALID_ARGUMENT : KILN_STATUS_SUCCESS; }

static KilnStatus sample_set_device(int32_t d) {
  if (bad_device(d)) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: no device %d", d);
  t_device = d;
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_get_device(int32_t* d) {
  *d = t_device;
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_get_device_count(size_t* n) {
#ifdef SAMPLE_FAULT_DEVICE_COUNT
  *n = (size_t)(SAMPLE_FAULT_DEVICE_COUNT);
  return KILN_STATUS_SUCCESS;
#endif
  *n = SAMPLE_DEVICES;
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_get_device_list(size_t* ids) {
  for (int d = 0; d < SAMPLE_DEVICES; ++d) ids[d] = (size_t)d;
#ifdef SAMPLE_FAULT_DEVICE_LIST
  ids[1] = (size_t)1 << 40;
#endif
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_get_compute_capability(int32_t d, size_t* cc) {
  (void)d;
  *cc = 12; /* "1.2" */
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_get_runtime_version(size_t* v) {
  *v = 1000;
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_get_driver_version(size_t* v) {
  *v = 1001;
  return KILN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ memory */

static KilnStatus add_alloc(int d, void** ptr, size_t size, int unified) {
  if (bad_device(d)) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: no device %d", d);
  if (size == 0) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: zero-size allocation");
  pthread_mutex_lock(&g_mu);
  long nth = ++g_alloc_count;
  if (g_fail_alloc_at > 0 && --g_fail_alloc_at == 0) {
    pthread_mutex_unlock(&g_mu);
    return fail(KILN_STATUS_OUT_OF_MEMORY,
                "sample: allocation #%ld of %zu bytes on device %d failed (injected failure)", nth,
                size, d);
  }
  if (size > SAMPLE_CAPACITY - g_used[d]) {
    size_t used = g_used[d];
    pthread_mutex_unlock(&g_mu);
    return fail(KILN_STATUS_OUT_OF_MEMORY,
                "sample: device %d is out of memory (%zu bytes asked, %zu of %zu in use)", d, size,
                used, SAMPLE_CAPACITY);
  }
  alloc_t* a = calloc(1, sizeof *a);
  unsigned char* host = a ? malloc(size) : NULL;
  if (!host) {
    free(a);
    pthread_mutex_unlock(&g_mu);
    return fail(KILN_STATUS_OUT_OF_MEMORY, "sample: host memory exhausted");
  }
  memset(host, 0xcd, size);
  a->host = host;
  a->size = size;
  a->unified = unified;
  if (unified) {
    a->addr = (unsigned long long)(size_t)host; /* unified memory is host-visible */
  } else {
    a->addr = g_next[d];
    g_next[d] += ((size + 4095) & ~(size_t)4095) + 4096; /* 4 KiB aligned, with a guard gap */
  }
  a->next = g_allocs[d];
  g_allocs[d] = a;
  g_used[d] += size;
  pthread_mutex_unlock(&g_mu);
  *ptr = (void*)(size_t)a->addr;
  return KILN_STATUS_SUCCESS;
}

static KilnStatus remove_alloc(int d, void* p, size_t size, int unified) {
  if (bad_device(d)) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: no device %d", d);
  pthread_mutex_lock(&g_mu);
  for (alloc_t** x = &g_allocs[d]; *x; x = &(*x)->next) {
    if ((*x)->addr == (unsigned long long)(size_t)p && (*x)->unified == unified) {
      alloc_t* a = *x;
      if (a->size != size) {
        pthread_mutex_unlock(&g_mu);
        return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: freeing %p with size %zu, allocated %zu", p,
                    size, a->size);
      }
      *x = a->next;
      g_used[d] -= a->size;
      pthread_mutex_unlock(&g_mu);
      free(a->host);
      free(a);
      return KILN_STATUS_SUCCESS;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: %p is not an allocation on device %d", p, d);
}

static KilnStatus sample_device_allocate(int32_t d, void** p, size_t n) {
#ifdef SAMPLE_FAULT_WRAP_ALLOC
  if (n > ((size_t)1 << 20)) { /* the initial chunk is fine; later ones wrap */
    *p = (void*)(uintptr_t)0xffffffffffff0000ull;
    return KILN_STATUS_SUCCESS;
  }
#endif
  return add_alloc(d, p, n, 0);
}
static KilnStatus sample_device_deallocate(int32_t d, void* p, size_t n) { return remove_alloc(d, p, n, 0); }
static KilnStatus sample_unified_allocate(int32_t d, void** p, size_t n) { return add_alloc(d, p, n, 1); }
static KilnStatus sample_unified_deallocate(int32_t d, void* p, size_t n) { return remove_alloc(d, p, n, 1); }

static KilnStatus sample_host_allocate(int32_t d, void** p, size_t n) {
  (void)d;
  if (posix_memalign(p, 64, n ? n : 1) != 0) return fail(KILN_STATUS_OUT_OF_MEMORY, "sample: no host memory");
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_host_deallocate(int32_t d, void* p, size_t n) {
  (void)d;
  (void)n;
  free(p);
  return KILN_STATUS_SUCCESS;
}

/* Runs one copy now. `dst_dev`/`src_dev` are the devices of device-side pointers. */
static KilnStatus do_copy(int kind, int dst_dev, int src_dev, void* dst, const void* src, size_t n) {
  pthread_mutex_lock(&g_mu);
  long nth = ++g_copy_count;
  if (g_fail_copy_at > 0 && --g_fail_copy_at == 0) {
    pthread_mutex_unlock(&g_mu);
    return fail(KILN_STATUS_ERROR, "sample: %s copy #%ld of %zu bytes failed (injected failure)",
                kind_name[kind], nth, n);
  }
  unsigned char* d = kind == K_D2H ? (unsigned char*)dst : resolve(dst_dev, dst, n);
  const unsigned char* s = kind == K_H2D ? (const unsigned char*)src : resolve(src_dev, src, n);
  pthread_mutex_unlock(&g_mu);
  if (!d) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: %s copy: destination %p + %zu bytes is not inside an allocation on device %d", kind_name[kind], dst, n, dst_dev);
  if (!s) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: %s copy: source %p + %zu bytes is not inside an allocation on device %d", kind_name[kind], src, n, src_dev);
  memmove(d, s, n);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_h2d(int32_t d, void* dst, const void* src, size_t n) { return do_copy(K_H2D, d, -1, dst, src, n); }
static KilnStatus sample_d2h(int32_t d, void* dst, const void* src, size_t n) { return do_copy(K_D2H, -1, d, dst, src, n); }
static KilnStatus sample_d2d(int32_t d, void* dst, const void* src, size_t n) { return do_copy(K_D2D, d, d, dst, src, n); }

static KilnStatus sample_memset(int32_t dev, void* p, unsigned char v, size_t n) {
  pthread_mutex_lock(&g_mu);
  unsigned char* h = resolve(dev, p, n);
  pthread_mutex_unlock(&g_mu);
  if (!h) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: memset of %p + %zu bytes outside an allocation", p, n);
  memset(h, v, n);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_memory_stats(int32_t d, size_t* total, size_t* free_bytes) {
  if (bad_device(d)) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: no device %d", d);
  pthread_mutex_lock(&g_mu);
  *total = SAMPLE_CAPACITY;
  *free_bytes = SAMPLE_CAPACITY - g_used[d];
#ifdef SAMPLE_FAULT_MEMORY_STATS
  *total = (size_t)-1;
#endif
  pthread_mutex_unlock(&g_mu);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_min_chunk(int32_t d, size_t* s) { (void)d; *s = 256; return KILN_STATUS_SUCCESS; }
static KilnStatus sample_max_chunk(int32_t d, size_t* s) { (void)d; *s = (size_t)32 << 20; return KILN_STATUS_SUCCESS; }
static KilnStatus sample_max_alloc(int32_t d, size_t* s) { (void)d; *s = SAMPLE_CAPACITY; return KILN_STATUS_SUCCESS; }
static KilnStatus sample_padding(int32_t d, size_t* s) { (void)d; *s = 64; return KILN_STATUS_SUCCESS; }
static KilnStatus sample_init_alloc(int32_t d, size_t* s) { (void)d; *s = (size_t)1 << 20; return KILN_STATUS_SUCCESS; }
static KilnStatus sample_realloc(int32_t d, size_t* s) { (void)d; *s = (size_t)4 << 20; return KILN_STATUS_SUCCESS; }

/* ------------------------------------------------------------------ streams */

static void* worker(void* arg) {
  stream_t* s = arg;
  pthread_mutex_lock(&g_mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->work, &g_mu);
    if (!s->head) break; /* stopping, and drained */
    op_t* o = s->head;
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    switch (o->kind) {
      case OP_COPY: {
        pthread_mutex_unlock(&g_mu);
        KilnStatus st = do_copy(o->copy_kind, o->dst_dev, o->src_dev, o->dst, o->src, o->size);
        pthread_mutex_lock(&g_mu);
        if (st != KILN_STATUS_SUCCESS && !s->has_error) {
          s->has_error = 1;
          snprintf(s->error, sizeof s->error, "%s (queued on a stream of device %d)", t_error, s->device);
        }
        break;
      }
      case OP_MEMSET: {
        pthread_mutex_unlock(&g_mu);
        KilnStatus st = sample_memset(o->dst_dev, o->dst, (unsigned char)o->gen, o->size);
        pthread_mutex_lock(&g_mu);
        if (st != KILN_STATUS_SUCCESS && !s->has_error) {
          s->has_error = 1;
          snprintf(s->error, sizeof s->error, "%s (queued on a stream of device %d)", t_error, s->device);
        }
        break;
      }
      case OP_CALLBACK: {
        KilnStatus st = s->has_error ? KILN_STATUS_ERROR : KILN_STATUS_SUCCESS;
        pthread_mutex_unlock(&g_mu);
        o->cb(o->user, st);
        pthread_mutex_lock(&g_mu);
        break;
      }
      case OP_RECORD:
        if (o->ev->done_gen < o->gen) o->ev->done_gen = o->gen;
        break;
      case OP_WAIT:
        while (o->ev->done_gen < o->gen) pthread_cond_wait(&g_done, &g_mu);
        break;
    }
    if (o->ev && --o->ev->refs == 0 && o->ev->destroyed) free(o->ev);
    free(o);
    s->completed++;
    pthread_cond_broadcast(&g_done);
  }
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

/* Queues `o` (heap-allocated) on `s`. Call with g_mu held. */
static void enqueue(stream_t* s, op_t* o) {
  o->next = NULL;
  if (o->ev) o->ev->refs++;
  if (s->tail) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  s->submitted++;
  pthread_cond_signal(&s->work);
}

static KilnStatus sample_create_stream(int32_t d, KilnStream* out) {
  if (bad_device(d)) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: no device %d", d);
  stream_t* s = calloc(1, sizeof *s);
  if (!s) return fail(KILN_STATUS_OUT_OF_MEMORY, "sample: no memory for a stream");
  s->device = d;
  pthread_cond_init(&s->work, NULL);
  if (pthread_create(&s->thread, NULL, worker, s) != 0) {
    free(s);
    return fail(KILN_STATUS_ERROR, "sample: cannot start a stream worker thread");
  }
  pthread_mutex_lock(&g_mu);
  s->next_stream = g_streams;
  g_streams = s;
  pthread_mutex_unlock(&g_mu);
  *out = s;
#ifdef SAMPLE_FAULT_NULL_STREAM
  if (g_streams && g_streams->next_stream) *out = NULL; /* the default stream is fine */
#endif
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_destroy_stream(int32_t d, KilnStream s) {
  (void)d;
  pthread_mutex_lock(&g_mu);
  s->stop = 1;
  pthread_cond_signal(&s->work);
  for (stream_t** x = &g_streams; *x; x = &(*x)->next_stream)
    if (*x == s) {
      *x = s->next_stream;
      break;
    }
  pthread_mutex_unlock(&g_mu);
  pthread_join(s->thread, NULL); /* the worker drains the queue (callbacks run) first */
  pthread_cond_destroy(&s->work);
  free(s);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_query_stream(int32_t d, KilnStream s) {
  (void)d;
  pthread_mutex_lock(&g_mu);
  int done = s->completed == s->submitted;
  pthread_mutex_unlock(&g_mu);
  return done ? KILN_STATUS_SUCCESS : KILN_STATUS_NOT_READY;
}

static KilnStatus sample_synchronize_stream(int32_t d, KilnStream s) {
  (void)d;
  pthread_mutex_lock(&g_mu);
  unsigned long long target = s->submitted;
  while (s->completed < target) pthread_cond_wait(&g_done, &g_mu);
  if (s->has_error) {
    s->has_error = 0;
    KilnStatus st = fail(KILN_STATUS_ERROR, "%s", s->error);
    pthread_mutex_unlock(&g_mu);
    return st;
  }
  pthread_mutex_unlock(&g_mu);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_synchronize_device(int32_t d) {
  pthread_mutex_lock(&g_mu);
  for (stream_t* s = g_streams; s; s = s->next_stream)
    if (s->device == d) {
      unsigned long long target = s->submitted;
      while (s->completed < target) pthread_cond_wait(&g_done, &g_mu);
    }
  pthread_mutex_unlock(&g_mu);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus queue_copy(KilnStream s, int kind, int dst_dev, int src_dev, void* dst, const void* src, size_t n) {
  op_t* o = calloc(1, sizeof *o);
  if (!o) return fail(KILN_STATUS_OUT_OF_MEMORY, "sample: no memory to queue a copy");
  o->kind = OP_COPY;
  o->copy_kind = kind;
  o->dst_dev = dst_dev;
  o->src_dev = src_dev;
  o->dst = dst;
  o->src = src;
  o->size = n;
  pthread_mutex_lock(&g_mu);
  enqueue(s, o);
  pthread_mutex_unlock(&g_mu);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_async_h2d(int32_t d, KilnStream s, void* dst, const void* src, size_t n) { return queue_copy(s, K_H2D, d, -1, dst, src, n); }
static KilnStatus sample_async_d2h(int32_t d, KilnStream s, void* dst, const void* src, size_t n) { return queue_copy(s, K_D2H, -1, d, dst, src, n); }
static KilnStatus sample_async_d2d(int32_t d, KilnStream s, void* dst, const void* src, size_t n) { return queue_copy(s, K_D2D, d, d, dst, src, n); }

static KilnStatus sample_async_memset(int32_t d, KilnStream s, void* p, unsigned char v, size_t n) {
  op_t* o = calloc(1, sizeof *o);
  if (!o) return fail(KILN_STATUS_OUT_OF_MEMORY, "sample: no memory to queue a memset");
  o->kind = OP_MEMSET;
  o->dst_dev = d;
  o->dst = p;
  o->gen = v;
  o->size = n;
  pthread_mutex_lock(&g_mu);
  enqueue(s, o);
  pthread_mutex_unlock(&g_mu);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_add_callback(int32_t d, KilnStream s, KilnStreamCallback cb, void* user) {
  (void)d;
  op_t* o = calloc(1, sizeof *o);
  if (!o) return fail(KILN_STATUS_OUT_OF_MEMORY, "sample: no memory to queue a callback");
  o->kind = OP_CALLBACK;
  o->cb = cb;
  o->user = user;
  pthread_mutex_lock(&g_mu);
  enqueue(s, o);
  pthread_mutex_unlock(&g_mu);
  return KILN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ events */

static KilnStatus sample_create_event(int32_t d, KilnEvent* out) {
  event_t* e = calloc(1, sizeof *e);
  if (!e) return fail(KILN_STATUS_OUT_OF_MEMORY, "sample: no memory for an event");
  e->device = d;
  *out = e;
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_destroy_event(int32_t d, KilnEvent e) {
  (void)d;
  pthread_mutex_lock(&g_mu);
  e->destroyed = 1;
  int free_now = e->refs == 0;
  pthread_mutex_unlock(&g_mu);
  if (free_now) free(e);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_record_event(int32_t d, KilnStream s, KilnEvent e) {
  (void)d;
  op_t* o = calloc(1, sizeof *o);
  if (!o) return fail(KILN_STATUS_OUT_OF_MEMORY, "sample: no memory to record an event");
  o->kind = OP_RECORD;
  o->ev = e;
  pthread_mutex_lock(&g_mu);
  o->gen = ++e->record_gen;
  enqueue(s, o);
  pthread_mutex_unlock(&g_mu);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_query_event(int32_t d, KilnEvent e) {
  (void)d;
  pthread_mutex_lock(&g_mu);
  int done = e->done_gen >= e->record_gen;
  pthread_mutex_unlock(&g_mu);
  return done ? KILN_STATUS_SUCCESS : KILN_STATUS_NOT_READY;
}

static KilnStatus sample_synchronize_event(int32_t d, KilnEvent e) {
  (void)d;
  pthread_mutex_lock(&g_mu);
  unsigned long long target = e->record_gen;
  while (e->done_gen < target) pthread_cond_wait(&g_done, &g_mu);
  pthread_mutex_unlock(&g_mu);
  return KILN_STATUS_SUCCESS;
}

static KilnStatus sample_stream_wait_event(int32_t d, KilnStream s, KilnEvent e) {
  (void)d;
  pthread_mutex_lock(&g_mu);
  if (e->done_gen < e->record_gen) {
    op_t* o = calloc(1, sizeof *o);
    if (!o) {
      pthread_mutex_unlock(&g_mu);
      return fail(KILN_STATUS_OUT_OF_MEMORY, "sample: no memory to queue a wait");
    }
    o->kind = OP_WAIT;
    o->ev = e;
    o->gen = e->record_gen;
    enqueue(s, o);
  }
  pthread_mutex_unlock(&g_mu);
  return KILN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ attributes */

static KilnStatus sample_get_attribute(int32_t d, int32_t kind, KilnAttrValue* v) {
  if (bad_device(d)) return fail(KILN_STATUS_INVALID_ARGUMENT, "sample: no device %d", d);
  switch (kind) {
    case 1: v->type = KILN_ATTR_INT; v->int_value = 1024; return KILN_STATUS_SUCCESS; /* max threads per block */
    case 2: v->type = KILN_ATTR_INT; v->int_value = 32; return KILN_STATUS_SUCCESS;   /* warp size */
    case 4: v->type = KILN_ATTR_STRING; snprintf(v->string_value, sizeof v->string_value, "1.2"); return KILN_STATUS_SUCCESS;
    case 5: v->type = KILN_ATTR_STRING; snprintf(v->string_value, sizeof v->string_value, "Sample Accelerator #%d", d);
#ifdef SAMPLE_FAULT_ATTR_NO_NUL
      memset(v->string_value, 'x', sizeof v->string_value);
#endif
      return KILN_STATUS_SUCCESS;
    case 7: v->type = KILN_ATTR_INT; v->int_value = 4; return KILN_STATUS_SUCCESS;    /* multiprocessors */
    case 14: v->type = KILN_ATTR_INT; v->int_value = (int64_t)SAMPLE_CAPACITY; return KILN_STATUS_SUCCESS;
    case 15: {
      pthread_mutex_lock(&g_mu);
      v->int_value = (int64_t)(SAMPLE_CAPACITY - g_used[d]);
      pthread_mutex_unlock(&g_mu);
      v->type = KILN_ATTR_INT;
      return KILN_STATUS_SUCCESS;
    }
#ifdef SAMPLE_PINNED_STAGING
    case KILN_ATTR_KIND_PINNED_STAGING: v->type = KILN_ATTR_INT; v->int_value = 1; return KILN_STATUS_SUCCESS;
#endif
    default: return KILN_STATUS_UNSUPPORTED;
  }
}

/* ------------------------------------------------------------------ kernels (tvm-ffi safe calls) */

typedef struct { int32_t type_index; uint32_t pad; union { int64_t i; double f; void* p; } v; } Any;
typedef struct { void* data; int32_t device_type, device_id; int32_t ndim; uint8_t code, bits; uint16_t lanes;
                 int64_t* shape; int64_t* strides; uint64_t byte_offset; } DLTensor;

/* Context slot filled by kiln's loader. */
EXPORT void* __TVMFFIErrorSetRaisedFromCStr = NULL;
typedef void (*set_raised_t)(const char*, const char*);

static int raise_error(const char* kind, const char* msg) {
  if (__TVMFFIErrorSetRaisedFromCStr) ((set_raised_t)__TVMFFIErrorSetRaisedFromCStr)(kind, msg);
  return -1;
}

static const DLTensor* tensor_arg(const Any* a) {
  if (a->type_index == 7) return (const DLTensor*)a->v.p;
  if (a->type_index == 70) return (const DLTensor*)((const char*)a->v.p + 24);
  return NULL;
}

/* add(x, y, z): z = x + y, float32, compact, same shape, on one device of this plugin. */
static int32_t kernel_add(void* self, const void* args_, int32_t n, void* ret_) {
  (void)self;
  const Any* args = args_;
  Any* ret = ret_;
  char msg[256];
  if (n != 3) return raise_error("TypeError", SAMPLE_DEVICE_TYPE ".add expects 3 tensors (x, y, z)");
  const DLTensor* t[3];
  size_t numel = 1;
  for (int i = 0; i < 3; ++i) {
    t[i] = tensor_arg(&args[i]);
    if (!t[i]) {
      snprintf(msg, sizeof msg, SAMPLE_DEVICE_TYPE ".add: argument #%d is not a tensor", i);
      return raise_error("TypeError", msg);
    }
    if (t[i]->code != 2 || t[i]->bits != 32 || t[i]->lanes != 1) {
      snprintf(msg, sizeof msg, SAMPLE_DEVICE_TYPE ".add: argument #%d is not float32", i);
      return raise_error("TypeError", msg);
    }
    if (t[i]->ndim != t[0]->ndim || t[i]->device_id != t[0]->device_id) {
      snprintf(msg, sizeof msg, SAMPLE_DEVICE_TYPE ".add: argument #%d differs in rank or device", i);
      return raise_error("ValueError", msg);
    }
  }
  for (int k = 0; k < t[0]->ndim; ++k) {
    for (int i = 1; i < 3; ++i)
      if (t[i]->shape[k] != t[0]->shape[k]) return raise_error("ValueError", SAMPLE_DEVICE_TYPE ".add: shapes differ");
    numel *= (size_t)t[0]->shape[k];
  }
  int dev = t[0]->device_id;
  /* Kernels run synchronously: finish queued copies first. */
  sample_synchronize_device(dev);
  pthread_mutex_lock(&g_mu);
  float* p[3];
  for (int i = 0; i < 3; ++i)
    p[i] = (float*)resolve(dev, (const char*)t[i]->data + t[i]->byte_offset, numel * 4);
  pthread_mutex_unlock(&g_mu);
  for (int i = 0; i < 3; ++i)
    if (!p[i]) {
      snprintf(msg, sizeof msg, SAMPLE_DEVICE_TYPE ".add: argument #%d is not memory of device %d", i, dev);
      return raise_error("ValueError", msg);
    }
  for (size_t j = 0; j < numel; ++j) p[2][j] = p[0][j] + p[1][j];
  ret->type_index = 0;
  ret->pad = 0;
  ret->v.i = 0;
  return 0;
}

static int32_t kernel_inject(void* self, const void* args_, int32_t n, void* ret_) {
  const Any* args = args_;
  Any* ret = ret_;
  if (n != 1 || args[0].type_index != 1) return raise_error("TypeError", "inject_*_failure expects one int (n >= 1, or 0 to disable)");
  if (self == (void*)1) sample_inject_alloc_failure((long)args[0].v.i);
  else sample_inject_copy_failure((long)args[0].v.i);
  ret->type_index = 0;
  ret->pad = 0;
  ret->v.i = 0;
  return 0;
}

static const KilnPluginKernel g_kernels[] = {
    {sizeof(KilnPluginKernel), KILN_PLUGIN_ABI_MAJOR, KILN_PLUGIN_ABI_MINOR, "add", kernel_add, NULL},
    {sizeof(KilnPluginKernel), KILN_PLUGIN_ABI_MAJOR, KILN_PLUGIN_ABI_MINOR, "inject_alloc_failure", kernel_inject, (void*)1},
    {sizeof(KilnPluginKernel), KILN_PLUGIN_ABI_MAJOR, KILN_PLUGIN_ABI_MINOR, "inject_copy_failure", kernel_inject, (void*)2},
};

static KilnStatus sample_get_kernels(const KilnPluginKernel** k, size_t* n) {
  *k = g_kernels;
  *n = sizeof g_kernels / sizeof g_kernels[0];
#ifdef SAMPLE_FAULT_KERNEL_COUNT
  *n = (size_t)1 << 40;
#endif
  return KILN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ the table and the entry */

static KilnDeviceInterface g_iface;

#ifdef SAMPLE_FAULT_NAME_NO_NUL
static char g_long_name[8192];
#endif

EXPORT KilnStatus kiln_device_plugin_init(KilnPluginParams* params) {
#ifdef SAMPLE_REFUSE_KILN
  /* What KILN_PLUGIN_CHECK_PARAMS does in a plugin built against an ABI 2 header. */
  if (params == NULL || params->abi_major != 2) return KILN_STATUS_VERSION_MISMATCH;
#endif
  KILN_PLUGIN_CHECK_PARAMS(params);
  KilnDeviceInterface* t = &g_iface;
  memset(t, 0, sizeof *t);
  t->struct_size = KILN_DEVICE_INTERFACE_SIZE;
  t->abi_major = SAMPLE_ABI_MAJOR;
  t->abi_minor = KILN_PLUGIN_ABI_MINOR;
  /* required */
  t->get_device_count = sample_get_device_count;
  t->device_memory_allocate = sample_device_allocate;
  t->device_memory_deallocate = sample_device_deallocate;
  t->memory_copy_h2d = sample_h2d;
  t->memory_copy_d2h = sample_d2h;
  t->memory_copy_d2d = sample_d2d;
  t->create_stream = sample_create_stream;
  t->destroy_stream = sample_destroy_stream;
  t->synchronize_stream = sample_synchronize_stream;
  t->stream_wait_event = sample_stream_wait_event;
  t->create_event = sample_create_event;
  t->destroy_event = sample_destroy_event;
  t->record_event = sample_record_event;
  t->synchronize_event = sample_synchronize_event;
  t->initialize = sample_initialize; /* the minimal variant needs the address ranges too */
#ifndef SAMPLE_MINIMAL
  t->finalize = sample_finalize;
  t->init_device = sample_init_device;
  t->deinit_device = sample_deinit_device;
  t->set_device = sample_set_device;
  t->get_device = sample_get_device;
  t->synchronize_device = sample_synchronize_device;
  t->get_device_list = sample_get_device_list;
  t->get_compute_capability = sample_get_compute_capability;
  t->get_runtime_version = sample_get_runtime_version;
  t->get_driver_version = sample_get_driver_version;
#ifndef SAMPLE_NO_PINNED
  t->host_memory_allocate = sample_host_allocate;
  t->host_memory_deallocate = sample_host_deallocate;
#endif
  t->unified_memory_allocate = sample_unified_allocate;
  t->unified_memory_deallocate = sample_unified_deallocate;
  /* memory_copy_p2p and async_memory_copy_p2p are left out: kiln bounces through the host. */
  t->async_memory_copy_h2d = sample_async_h2d;
  t->async_memory_copy_d2h = sample_async_d2h;
  t->async_memory_copy_d2d = sample_async_d2d;
  t->device_memory_set = sample_memset;
  t->device_memory_stats = sample_memory_stats;
  t->device_min_chunk_size = sample_min_chunk;
  t->device_max_chunk_size = sample_max_chunk;
  t->device_max_alloc_size = sample_max_alloc;
  t->device_extra_padding_size = sample_padding;
  t->device_init_alloc_size = sample_init_alloc;
  t->device_realloc_size = sample_realloc;
  t->query_stream = sample_query_stream;
  t->stream_add_callback = sample_add_callback;
  t->query_event = sample_query_event;
  t->get_last_error = sample_get_last_error;
  t->get_attribute = sample_get_attribute;
  t->get_kernels = sample_get_kernels;
#ifndef SAMPLE_NO_ASYNC_MEMSET
  t->async_memory_set = sample_async_memset;
#endif
#else
  t->get_last_error = sample_get_last_error;
#endif
#ifdef SAMPLE_TABLE_1_0
  /* An old plugin: its header ended at get_last_error. The entries past the end are still set in
   * memory here, which kiln must not read. */
  t->struct_size = KILN_DEVICE_INTERFACE_SIZE_1_0;
  t->abi_minor = 0;
#endif
#ifdef SAMPLE_TABLE_1_1
  /* A 1.1 plugin: async_memory_set lies past its table's end (set in memory, not to be read). */
  t->struct_size = KILN_DEVICE_INTERFACE_SIZE_1_1;
  t->abi_minor = 1;
#endif
#ifdef SAMPLE_DROP_REQUIRED
  t->memory_copy_d2h = NULL;
  t->create_event = NULL;
#endif
#ifdef SAMPLE_NO_QUERY_STREAM
  t->query_stream = NULL;
#endif
#ifdef SAMPLE_SHORT_TABLE
  t->struct_size = 64;
#endif
  params->device_type = SAMPLE_DEVICE_TYPE;
  params->sub_device_type = "simulated";
  params->plugin_version_major = 0;
  params->plugin_version_minor = 3;
  params->plugin_version_patch = 1;
  params->interface = t;
#ifdef SAMPLE_FAULT_NAME_NO_NUL
  memset(g_long_name, 'n', sizeof g_long_name);
  params->sub_device_type = g_long_name;
#endif
#ifdef SAMPLE_NULL_DEVICE_TYPE
  params->device_type = NULL;
#endif
#ifdef SAMPLE_NULL_TABLE
  params->interface = NULL;
#endif
#ifdef SAMPLE_ENTRY_FAILS
  return fail(KILN_STATUS_ERROR, "sample: this plugin needs driver 9.9 (injected entry failure)");
#endif
  return KILN_STATUS_SUCCESS;
}
