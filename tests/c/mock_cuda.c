/*
 * A mock of the CUDA driver API (libcuda) over host memory, for kiln's tests of its `cuda`
 * backend on machines without a GPU (tests/device_cuda.rs loads it through KILN_CUDA_DRIVER).
 *
 * It implements the entry points kiln resolves, with the driver's signatures (cuda.h), its
 * error codes, and the rules kiln must follow, so that mistakes show as errors:
 *
 * - cuInit first (else CUDA_ERROR_NOT_INITIALIZED); MOCK_CUDA_DEVICES devices (default 1; 0
 *   makes cuInit fail with CUDA_ERROR_NO_DEVICE), each an H100: sm_90, 132 SMs, 1024 threads
 *   per block, block dims 1024/1024/64, grid dims 2147483647/65535/65535, 48 KiB shared memory
 *   per block, 227 KiB opt-in, warp 32, 80 GiB.
 * - Calls that act on the current context fail with CUDA_ERROR_INVALID_CONTEXT on a thread
 *   where none is current (cuCtxSetCurrent), and streams, modules and functions must belong to
 *   the current context.
 * - Device pointers are host addresses (aligned_alloc, 256 bytes); every copy and memset checks
 *   its ranges against the live allocations (CUDA_ERROR_INVALID_VALUE otherwise). Copies are
 *   memcpy, done at once.
 * - Host functions (cuLaunchHostFunc) run on one worker thread, in order; synchronizing a stream,
 *   an event or the context waits for the queued ones. A synchronize from inside one is
 *   CUDA_ERROR_NOT_PERMITTED.
 * - cuModuleLoadDataEx reads `.entry name(` declarations, their `.param` sizes, `.maxntid` and
 *   `.shared` arrays out of the PTX; text containing INVALID fails with CUDA_ERROR_INVALID_PTX
 *   and a line in the error-log buffer.
 * - cuLaunchKernel checks the limits as the driver does (dynamic shared memory above the
 *   function's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 48 KiB minus its static shared
 *   memory until raised, fails), records the launch per kernel name, and runs nothing; a kernel
 *   whose name ends in `_fault` leaves its context faulted: every later call in it returns
 *   CUDA_ERROR_ILLEGAL_ADDRESS (700), a sticky error.
 *
 * The `mock_cuda_*` functions at the end let a test read what happened.
 */

#include <ctype.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void (*CUhostFn)(void *);

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    NO_DEVICE = 100,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    INVALID_PTX = 218,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    NOT_READY = 600,
    ILLEGAL_ADDRESS = 700,
    NOT_PERMITTED = 800,
};

#define MAX_DEVICES 8
#define MAX_PARAMS 32
#define MAX_FUNCS 64
#define TOTAL_MEM (80ULL << 30)
#define SHARED_DEFAULT (48 << 10)
#define SHARED_OPTIN (227 << 10)
#define STREAM_MAGIC 0x5354524dU
#define EVENT_MAGIC 0x4556544eU
#define MODULE_MAGIC 0x4d4f444cU
#define FUNC_MAGIC 0x46554e43U

struct ctx {
    int device;
    int faulted; /* atomic */
    int busy;    /* atomic: streams and events report NOT_READY */
    int retains;
    unsigned long long used;
};

struct stream {
    unsigned magic;
    struct ctx *ctx;
    unsigned flags;
};

struct event {
    unsigned magic;
    struct ctx *ctx;
    unsigned flags;
    int recorded;
    double ms;
};

struct func {
    unsigned magic;
    struct module *mod;
    char name[128];
    int nparams;
    int psize[MAX_PARAMS];
    int maxntid;
    int static_smem;
    int max_dyn;
};

struct module {
    unsigned magic;
    struct ctx *ctx;
    int nfuncs;
    struct func funcs[MAX_FUNCS];
};

struct alloc {
    CUdeviceptr ptr;
    size_t size;
    int device;
};

/* What tests read back, per kernel (entry) name. */
struct mock_launch {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared;
    unsigned long long stream;
    int nparams;
    unsigned long long params[MAX_PARAMS];
    int count;
};

struct stat {
    char name[128];
    int loads;
    int unloads;
    int set_attr_calls;
    int set_attr_value;
    struct mock_launch last;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_ndev = -1;
static struct ctx g_ctx[MAX_DEVICES];
static __thread struct ctx *t_cur;
static struct alloc *g_allocs;
static size_t g_nallocs, g_cap_allocs;
static struct stat g_stats[512];
static int g_nstats;

/* ------------------------------------------------------------------ host-function worker */

struct job {
    CUhostFn fn;
    void *data;
    struct job *next;
};

static pthread_cond_t q_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t q_idle = PTHREAD_COND_INITIALIZER;
static struct job *q_head, *q_tail;
static int q_running, q_started;
static pthread_t q_thread;

static void *worker(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        while (!q_head) pthread_cond_wait(&q_work, &g_lock);
        struct job *j = q_head;
        q_head = j->next;
        if (!q_head) q_tail = NULL;
        q_running = 1;
        pthread_mutex_unlock(&g_lock);
        j->fn(j->data);
        free(j);
        pthread_mutex_lock(&g_lock);
        q_running = 0;
        pthread_cond_broadcast(&q_idle);
    }
    return NULL;
}

static int on_worker(void) {
    return q_started && pthread_equal(pthread_self(), q_thread);
}

/* Waits until every queued host function ran. */
static void drain(void) {
    pthread_mutex_lock(&g_lock);
    while (q_head || q_running) pthread_cond_wait(&q_idle, &g_lock);
    pthread_mutex_unlock(&g_lock);
}

static int pending(void) {
    pthread_mutex_lock(&g_lock);
    int p = q_head != NULL || q_running;
    pthread_mutex_unlock(&g_lock);
    return p;
}

/* ------------------------------------------------------------------ helpers */

static int faulted(struct ctx *c) { return __atomic_load_n(&c->faulted, __ATOMIC_SEQ_CST); }

static CUresult current(struct ctx **out) {
    if (g_ndev < 0) return NOT_INITIALIZED;
    if (!t_cur) return INVALID_CONTEXT;
    if (faulted(t_cur)) return ILLEGAL_ADDRESS;
    *out = t_cur;
    return SUCCESS;
}

static CUresult check_stream(struct ctx *c, struct stream *s) {
    if (!s) return SUCCESS; /* the legacy default stream of the current context */
    if (s->magic != STREAM_MAGIC) return INVALID_HANDLE;
    if (s->ctx != c) return INVALID_HANDLE;
    return SUCCESS;
}

/* Whether [p, p + n) lies inside one live allocation of `device` (-1: any). Locked. */
static int in_alloc(CUdeviceptr p, size_t n, int device) {
    for (size_t i = 0; i < g_nallocs; i++) {
        struct alloc *a = &g_allocs[i];
        if (p >= a->ptr && p - a->ptr <= a->size && n <= a->size - (p - a->ptr)) {
            return device < 0 || a->device == device;
        }
    }
    return 0;
}

static int ranges_ok(CUdeviceptr p, size_t n, int device) {
    pthread_mutex_lock(&g_lock);
    int ok = in_alloc(p, n, device);
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* The stats of kernel `name`. Locked. */
static struct stat *stat_for(const char *name) {
    for (int i = 0; i < g_nstats; i++)
        if (strcmp(g_stats[i].name, name) == 0) return &g_stats[i];
    if (g_nstats == (int)(sizeof g_stats / sizeof g_stats[0])) return NULL;
    struct stat *s = &g_stats[g_nstats++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    return s;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ------------------------------------------------------------------ init, devices */

CUresult cuInit(unsigned flags) {
    if (flags != 0) return INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (g_ndev < 0) {
        const char *e = getenv("MOCK_CUDA_DEVICES");
        int n = e ? atoi(e) : 1;
        if (n < 0) n = 0;
        if (n > MAX_DEVICES) n = MAX_DEVICES;
        for (int i = 0; i < n; i++) g_ctx[i].device = i;
        g_ndev = n;
    }
    int n = g_ndev;
    pthread_mutex_unlock(&g_lock);
    return n == 0 ? NO_DEVICE : SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
    if (!v) return INVALID_VALUE;
    *v = 12080;
    return SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
    if (g_ndev < 0) return NOT_INITIALIZED;
    if (!n) return INVALID_VALUE;
    *n = g_ndev;
    return SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (g_ndev < 0) return NOT_INITIALIZED;
    if (!d) return INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_ndev) return INVALID_DEVICE;
    *d = ordinal;
    return SUCCESS;
}

static CUresult check_device(CUdevice d) {
    if (g_ndev < 0) return NOT_INITIALIZED;
    if (d < 0 || d >= g_ndev) return INVALID_DEVICE;
    return SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    CUresult r = check_device(d);
    if (r) return r;
    if (!name || len <= 0) return INVALID_VALUE;
    snprintf(name, (size_t)len, "NVIDIA H100 80GB HBM3 (kiln mock)");
    return SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    CUresult r = check_device(d);
    if (r) return r;
    if (!v) return INVALID_VALUE;
    switch (attr) {
    case 1: *v = 1024; break;                     /* MAX_THREADS_PER_BLOCK */
    case 2: *v = 1024; break;                     /* MAX_BLOCK_DIM_X */
    case 3: *v = 1024; break;                     /* MAX_BLOCK_DIM_Y */
    case 4: *v = 64; break;                       /* MAX_BLOCK_DIM_Z */
    case 5: *v = 2147483647; break;               /* MAX_GRID_DIM_X */
    case 6: *v = 65535; break;                    /* MAX_GRID_DIM_Y */
    case 7: *v = 65535; break;                    /* MAX_GRID_DIM_Z */
    case 8: *v = SHARED_DEFAULT; break;           /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 10: *v = 32; break;                      /* WARP_SIZE */
    case 12: *v = 65536; break;                   /* MAX_REGISTERS_PER_BLOCK */
    case 13: *v = 1980000; break;                 /* CLOCK_RATE, kHz */
    case 16: *v = 132; break;                     /* MULTIPROCESSOR_COUNT */
    case 38: *v = 50 << 20; break;                /* L2_CACHE_SIZE */
    case 75: *v = 9; break;                       /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = 0; break;                       /* COMPUTE_CAPABILITY_MINOR */
    case 97: *v = SHARED_OPTIN; break;            /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    default: return INVALID_VALUE;
    }
    return SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    CUresult r = check_device(d);
    if (r) return r;
    if (!bytes) return INVALID_VALUE;
    *bytes = (size_t)TOTAL_MEM;
    return SUCCESS;
}

/* ------------------------------------------------------------------ contexts */

CUresult cuDevicePrimaryCtxRetain(struct ctx **c, CUdevice d) {
    CUresult r = check_device(d);
    if (r) return r;
    if (!c) return INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    g_ctx[d].retains++;
    pthread_mutex_unlock(&g_lock);
    *c = &g_ctx[d];
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    CUresult r = check_device(d);
    if (r) return r;
    pthread_mutex_lock(&g_lock);
    r = g_ctx[d].retains > 0 ? SUCCESS : INVALID_CONTEXT;
    if (!r) g_ctx[d].retains--;
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult cuCtxSetCurrent(struct ctx *c) {
    if (g_ndev < 0) return NOT_INITIALIZED;
    if (c && (c < g_ctx || c >= g_ctx + g_ndev)) return INVALID_CONTEXT;
    t_cur = c;
    return SUCCESS;
}

CUresult cuCtxGetCurrent(struct ctx **c) {
    if (g_ndev < 0) return NOT_INITIALIZED;
    if (!c) return INVALID_VALUE;
    *c = t_cur;
    return SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    if (on_worker()) return NOT_PERMITTED;
    drain();
    return faulted(c) ? ILLEGAL_ADDRESS : SUCCESS;
}

/* ------------------------------------------------------------------ memory */

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    if (!p || n == 0) return INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (n > TOTAL_MEM - c->used) {
        pthread_mutex_unlock(&g_lock);
        return OUT_OF_MEMORY;
    }
    void *m = aligned_alloc(256, (n + 255) / 256 * 256);
    if (!m) {
        pthread_mutex_unlock(&g_lock);
        return OUT_OF_MEMORY;
    }
    if (g_nallocs == g_cap_allocs) {
        g_cap_allocs = g_cap_allocs ? 2 * g_cap_allocs : 64;
        g_allocs = realloc(g_allocs, g_cap_allocs * sizeof *g_allocs);
    }
    g_allocs[g_nallocs++] = (struct alloc){(CUdeviceptr)(uintptr_t)m, n, c->device};
    c->used += n;
    pthread_mutex_unlock(&g_lock);
    *p = (CUdeviceptr)(uintptr_t)m;
    return SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i].ptr == p) {
            if (g_allocs[i].device != c->device) break;
            c->used -= g_allocs[i].size;
            free((void *)(uintptr_t)p);
            g_allocs[i] = g_allocs[--g_nallocs];
            pthread_mutex_unlock(&g_lock);
            return SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return INVALID_VALUE;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    if (!free_bytes || !total) return INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    *free_bytes = (size_t)(TOTAL_MEM - c->used);
    pthread_mutex_unlock(&g_lock);
    *total = (size_t)TOTAL_MEM;
    return SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, struct stream *s) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (!src || !ranges_ok(dst, n, c->device)) return INVALID_VALUE;
    memcpy((void *)(uintptr_t)dst, src, n);
    return SUCCESS;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, struct stream *s) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (!dst || !ranges_ok(src, n, c->device)) return INVALID_VALUE;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return SUCCESS;
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, struct stream *s) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (!ranges_ok(dst, n, c->device) || !ranges_ok(src, n, c->device)) return INVALID_VALUE;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return SUCCESS;
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, struct ctx *dctx, CUdeviceptr src,
                           struct ctx *sctx, size_t n, struct stream *s) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (!dctx || !sctx || dctx < g_ctx || dctx >= g_ctx + g_ndev || sctx < g_ctx ||
        sctx >= g_ctx + g_ndev)
        return INVALID_CONTEXT;
    if (faulted(dctx) || faulted(sctx)) return ILLEGAL_ADDRESS;
    if (!ranges_ok(dst, n, dctx->device) || !ranges_ok(src, n, sctx->device))
        return INVALID_VALUE;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, struct stream *s) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (!ranges_ok(dst, n, c->device)) return INVALID_VALUE;
    memset((void *)(uintptr_t)dst, v, n);
    return SUCCESS;
}

/* ------------------------------------------------------------------ streams, events */

CUresult cuStreamCreate(struct stream **out, unsigned flags) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    if (!out || flags > 1) return INVALID_VALUE;
    struct stream *s = calloc(1, sizeof *s);
    s->magic = STREAM_MAGIC;
    s->ctx = c;
    s->flags = flags;
    *out = s;
    return SUCCESS;
}

CUresult cuStreamDestroy_v2(struct stream *s) {
    if (!s || s->magic != STREAM_MAGIC) return INVALID_HANDLE;
    s->magic = 0;
    free(s);
    return SUCCESS;
}

CUresult cuStreamSynchronize(struct stream *s) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (on_worker()) return NOT_PERMITTED;
    drain();
    return faulted(c) ? ILLEGAL_ADDRESS : SUCCESS;
}

CUresult cuStreamQuery(struct stream *s) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (__atomic_load_n(&c->busy, __ATOMIC_SEQ_CST) || pending()) return NOT_READY;
    return SUCCESS;
}

CUresult cuStreamWaitEvent(struct stream *s, struct event *e, unsigned flags) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (!e || e->magic != EVENT_MAGIC || flags != 0) return INVALID_HANDLE;
    return SUCCESS;
}

CUresult cuLaunchHostFunc(struct stream *s, CUhostFn fn, void *data) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (!fn) return INVALID_VALUE;
    struct job *j = calloc(1, sizeof *j);
    j->fn = fn;
    j->data = data;
    pthread_mutex_lock(&g_lock);
    if (!q_started) {
        pthread_create(&q_thread, NULL, worker, NULL);
        pthread_detach(q_thread);
        q_started = 1;
    }
    if (q_tail)
        q_tail->next = j;
    else
        q_head = j;
    q_tail = j;
    pthread_cond_signal(&q_work);
    pthread_mutex_unlock(&g_lock);
    return SUCCESS;
}

CUresult cuEventCreate(struct event **out, unsigned flags) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    if (!out || (flags & ~3u)) return INVALID_VALUE;
    struct event *e = calloc(1, sizeof *e);
    e->magic = EVENT_MAGIC;
    e->ctx = c;
    e->flags = flags;
    *out = e;
    return SUCCESS;
}

CUresult cuEventRecord(struct event *e, struct stream *s) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (!e || e->magic != EVENT_MAGIC || e->ctx != c) return INVALID_HANDLE;
    e->recorded = 1;
    e->ms = now_ms();
    return SUCCESS;
}

CUresult cuEventQuery(struct event *e) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    if (!e || e->magic != EVENT_MAGIC) return INVALID_HANDLE;
    if (e->recorded && (__atomic_load_n(&c->busy, __ATOMIC_SEQ_CST) || pending()))
        return NOT_READY;
    return SUCCESS;
}

CUresult cuEventSynchronize(struct event *e) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    if (!e || e->magic != EVENT_MAGIC) return INVALID_HANDLE;
    if (on_worker()) return NOT_PERMITTED;
    drain();
    return faulted(c) ? ILLEGAL_ADDRESS : SUCCESS;
}

CUresult cuEventElapsedTime(float *ms, struct event *a, struct event *b) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    if (!ms) return INVALID_VALUE;
    if (!a || !b || a->magic != EVENT_MAGIC || b->magic != EVENT_MAGIC) return INVALID_HANDLE;
    if (!a->recorded || !b->recorded || (a->flags & 2) || (b->flags & 2)) return INVALID_HANDLE;
    if (__atomic_load_n(&c->busy, __ATOMIC_SEQ_CST)) return NOT_READY;
    *ms = (float)(b->ms - a->ms);
    return SUCCESS;
}

CUresult cuEventDestroy_v2(struct event *e) {
    if (!e || e->magic != EVENT_MAGIC) return INVALID_HANDLE;
    e->magic = 0;
    free(e);
    return SUCCESS;
}

/* ------------------------------------------------------------------ modules, launches */

static int type_bytes(const char *t) {
    if (!strncmp(t, ".u64", 4) || !strncmp(t, ".s64", 4) || !strncmp(t, ".b64", 4) ||
        !strncmp(t, ".f64", 4))
        return 8;
    if (!strncmp(t, ".u32", 4) || !strncmp(t, ".s32", 4) || !strncmp(t, ".b32", 4) ||
        !strncmp(t, ".f32", 4))
        return 4;
    if (!strncmp(t, ".u16", 4) || !strncmp(t, ".s16", 4) || !strncmp(t, ".b16", 4) ||
        !strncmp(t, ".f16", 4))
        return 2;
    if (!strncmp(t, ".u8", 3) || !strncmp(t, ".s8", 3) || !strncmp(t, ".b8", 3)) return 1;
    return 0;
}

/* The bytes a declaration in [p, end) takes: its type times its `[N]`, if any. */
static int decl_bytes(const char *p, const char *end) {
    int elem = 0, count = 1;
    for (const char *q = p; q < end; q++) {
        if (*q == '.' && !elem) elem = type_bytes(q);
        if (*q == '[') count = atoi(q + 1);
    }
    return elem * count;
}

static void parse_entries(const char *text, struct module *m) {
    const char *p = text;
    while ((p = strstr(p, ".entry")) != NULL && m->nfuncs < MAX_FUNCS) {
        p += 6;
        if (!isspace((unsigned char)*p)) continue;
        while (isspace((unsigned char)*p)) p++;
        const char *name = p;
        while (isalnum((unsigned char)*p) || *p == '_' || *p == '$') p++;
        size_t len = (size_t)(p - name);
        if (len == 0 || len >= sizeof m->funcs[0].name) continue;
        struct func *f = &m->funcs[m->nfuncs++];
        memset(f, 0, sizeof *f);
        f->magic = FUNC_MAGIC;
        f->mod = m;
        memcpy(f->name, name, len);
        while (isspace((unsigned char)*p)) p++;
        if (*p == '(') {
            const char *close = strchr(p, ')');
            const char *q = p + 1;
            while (close && q < close && f->nparams < MAX_PARAMS) {
                const char *comma = memchr(q, ',', (size_t)(close - q));
                const char *stop = comma ? comma : close;
                const char *param = strstr(q, ".param");
                if (param && param < stop) f->psize[f->nparams++] = decl_bytes(param + 6, stop);
                q = stop + 1;
            }
            if (close) p = close + 1;
        }
        const char *brace = strchr(p, '{');
        const char *maxntid = strstr(p, ".maxntid");
        if (maxntid && brace && maxntid < brace) {
            int x = 1, y = 1, z = 1;
            sscanf(maxntid + 8, " %d , %d , %d", &x, &y, &z);
            f->maxntid = x * (y > 0 ? y : 1) * (z > 0 ? z : 1);
        }
        if (brace) {
            const char *next = strstr(brace, ".entry");
            const char *end = next ? next : brace + strlen(brace);
            for (const char *s = strstr(brace, ".shared"); s && s < end; s = strstr(s + 7, ".shared")) {
                const char *semi = strchr(s, ';');
                if (semi && semi < end) f->static_smem += decl_bytes(s + 7, semi);
            }
        }
        f->max_dyn = SHARED_DEFAULT - f->static_smem;
        p = brace ? brace : p;
    }
}

static void write_log(void *buf, size_t cap, const char *text) {
    if (buf && cap > 0) snprintf((char *)buf, cap, "%s", text);
}

CUresult cuModuleLoadDataEx(struct module **out, const void *image, unsigned n, int *options,
                            void **values) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    if (!out || !image || (n && (!options || !values))) return INVALID_VALUE;
    void *err_buf = NULL, *info_buf = NULL;
    size_t err_cap = 0, info_cap = 0;
    for (unsigned i = 0; i < n; i++) {
        switch (options[i]) {
        case 3: info_buf = values[i]; break;
        case 4: info_cap = (size_t)(uintptr_t)values[i]; break;
        case 5: err_buf = values[i]; break;
        case 6: err_cap = (size_t)(uintptr_t)values[i]; break;
        default: break;
        }
    }
    const char *text = image;
    const char *bad = strstr(text, "INVALID");
    if (bad) {
        int line = 1;
        for (const char *q = text; q < bad; q++) line += *q == '\n';
        char msg[160];
        snprintf(msg, sizeof msg,
                 "ptxas application ptx input, line %d; error   : Unknown symbol 'INVALID' "
                 "(kiln mock)",
                 line);
        write_log(err_buf, err_cap, msg);
        write_log(info_buf, info_cap, "ptxas info    : 0 bytes gmem (kiln mock)");
        return INVALID_PTX;
    }
    struct module *m = calloc(1, sizeof *m);
    m->magic = MODULE_MAGIC;
    m->ctx = c;
    parse_entries(text, m);
    write_log(info_buf, info_cap, "ptxas info    : compiled by the kiln mock");
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < m->nfuncs; i++) {
        struct stat *s = stat_for(m->funcs[i].name);
        if (s) s->loads++;
    }
    pthread_mutex_unlock(&g_lock);
    *out = m;
    return SUCCESS;
}

CUresult cuModuleUnload(struct module *m) {
    if (g_ndev < 0) return NOT_INITIALIZED;
    if (!m || m->magic != MODULE_MAGIC) return INVALID_HANDLE;
    if (m->ctx != t_cur) return INVALID_CONTEXT;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < m->nfuncs; i++) {
        struct stat *s = stat_for(m->funcs[i].name);
        if (s) s->unloads++;
    }
    pthread_mutex_unlock(&g_lock);
    int was_faulted = faulted(m->ctx);
    m->magic = 0;
    free(m);
    return was_faulted ? ILLEGAL_ADDRESS : SUCCESS;
}

CUresult cuModuleGetFunction(struct func **out, struct module *m, const char *name) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r) return r;
    if (!out || !name) return INVALID_VALUE;
    if (!m || m->magic != MODULE_MAGIC) return INVALID_HANDLE;
    if (m->ctx != c) return INVALID_CONTEXT;
    for (int i = 0; i < m->nfuncs; i++) {
        if (strcmp(m->funcs[i].name, name) == 0) {
            *out = &m->funcs[i];
            return SUCCESS;
        }
    }
    return NOT_FOUND;
}

CUresult cuFuncGetAttribute(int *v, int attr, struct func *f) {
    if (!v) return INVALID_VALUE;
    if (!f || f->magic != FUNC_MAGIC) return INVALID_HANDLE;
    switch (attr) {
    case 0: *v = f->maxntid > 0 && f->maxntid < 1024 ? f->maxntid : 1024; break;
    case 1: *v = f->static_smem; break;
    case 8: *v = f->max_dyn; break;
    default: *v = 0; break;
    }
    return SUCCESS;
}

CUresult cuFuncSetAttribute(struct func *f, int attr, int value) {
    if (!f || f->magic != FUNC_MAGIC) return INVALID_HANDLE;
    if (attr != 8) return SUCCESS;
    if (value < 0 || value + f->static_smem > SHARED_OPTIN) return INVALID_VALUE;
    f->max_dyn = value;
    pthread_mutex_lock(&g_lock);
    struct stat *s = stat_for(f->name);
    if (s) {
        s->set_attr_calls++;
        s->set_attr_value = value;
    }
    pthread_mutex_unlock(&g_lock);
    return SUCCESS;
}

CUresult cuLaunchKernel(struct func *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, struct stream *s,
                        void **params, void **extra) {
    struct ctx *c;
    CUresult r = current(&c);
    if (r || (r = check_stream(c, s))) return r;
    if (!f || f->magic != FUNC_MAGIC) return INVALID_HANDLE;
    if (f->mod->ctx != c) return INVALID_CONTEXT;
    if (extra) return INVALID_VALUE;
    if (!gx || !gy || !gz || !bx || !by || !bz) return INVALID_VALUE;
    if (bx > 1024 || by > 1024 || bz > 64 || gx > 2147483647u || gy > 65535 || gz > 65535)
        return INVALID_VALUE;
    unsigned long long threads = (unsigned long long)bx * by * bz;
    int fmax = f->maxntid > 0 && f->maxntid < 1024 ? f->maxntid : 1024;
    if (threads > (unsigned long long)fmax) return INVALID_VALUE;
    if ((long long)shared > (long long)f->max_dyn) return INVALID_VALUE;
    if (f->nparams > 0 && !params) return INVALID_VALUE;
    struct mock_launch l;
    memset(&l, 0, sizeof l);
    l.grid[0] = gx, l.grid[1] = gy, l.grid[2] = gz;
    l.block[0] = bx, l.block[1] = by, l.block[2] = bz;
    l.shared = shared;
    l.stream = (unsigned long long)(uintptr_t)s;
    l.nparams = f->nparams;
    for (int i = 0; i < f->nparams; i++) {
        if (!params[i]) return INVALID_VALUE;
        int b = f->psize[i] > 8 ? 8 : f->psize[i];
        memcpy(&l.params[i], params[i], (size_t)b);
    }
    pthread_mutex_lock(&g_lock);
    struct stat *st = stat_for(f->name);
    if (st) {
        l.count = st->last.count + 1;
        st->last = l;
    }
    pthread_mutex_unlock(&g_lock);
    size_t n = strlen(f->name);
    if (n >= 6 && strcmp(f->name + n - 6, "_fault") == 0)
        __atomic_store_n(&c->faulted, 1, __ATOMIC_SEQ_CST);
    return SUCCESS;
}

/* ------------------------------------------------------------------ errors */

static const char *error_text(CUresult r, int name) {
    switch (r) {
    case SUCCESS: return name ? "CUDA_SUCCESS" : "no error";
    case INVALID_VALUE: return name ? "CUDA_ERROR_INVALID_VALUE" : "invalid argument";
    case OUT_OF_MEMORY: return name ? "CUDA_ERROR_OUT_OF_MEMORY" : "out of memory";
    case NOT_INITIALIZED:
        return name ? "CUDA_ERROR_NOT_INITIALIZED" : "initialization error";
    case NO_DEVICE: return name ? "CUDA_ERROR_NO_DEVICE" : "no CUDA-capable device is detected";
    case INVALID_DEVICE: return name ? "CUDA_ERROR_INVALID_DEVICE" : "invalid device ordinal";
    case INVALID_CONTEXT: return name ? "CUDA_ERROR_INVALID_CONTEXT" : "invalid device context";
    case INVALID_PTX:
        return name ? "CUDA_ERROR_INVALID_PTX" : "a PTX JIT compilation failed";
    case INVALID_HANDLE: return name ? "CUDA_ERROR_INVALID_HANDLE" : "invalid resource handle";
    case NOT_FOUND: return name ? "CUDA_ERROR_NOT_FOUND" : "named symbol not found";
    case NOT_READY: return name ? "CUDA_ERROR_NOT_READY" : "device not ready";
    case ILLEGAL_ADDRESS:
        return name ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "an illegal memory access was encountered";
    case NOT_PERMITTED: return name ? "CUDA_ERROR_NOT_PERMITTED" : "operation not permitted";
    default: return NULL;
    }
}

CUresult cuGetErrorName(CUresult r, const char **out) {
    if (!out) return INVALID_VALUE;
    *out = error_text(r, 1);
    return *out ? SUCCESS : INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **out) {
    if (!out) return INVALID_VALUE;
    *out = error_text(r, 0);
    return *out ? SUCCESS : INVALID_VALUE;
}

/* ------------------------------------------------------------------ what tests read */

/* The last launch of kernel `name` into `out`; returns how many there were. */
int mock_cuda_last_launch(const char *name, struct mock_launch *out) {
    pthread_mutex_lock(&g_lock);
    int n = 0;
    for (int i = 0; i < g_nstats; i++) {
        if (strcmp(g_stats[i].name, name) == 0) {
            if (out) *out = g_stats[i].last;
            n = g_stats[i].last.count;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* How many times a module with entry `name` was loaded (cuModuleLoadDataEx), and unloaded. */
int mock_cuda_module_loads(const char *name) {
    pthread_mutex_lock(&g_lock);
    int n = 0;
    for (int i = 0; i < g_nstats; i++)
        if (strcmp(g_stats[i].name, name) == 0) n = g_stats[i].loads;
    pthread_mutex_unlock(&g_lock);
    return n;
}

int mock_cuda_module_unloads(const char *name) {
    pthread_mutex_lock(&g_lock);
    int n = 0;
    for (int i = 0; i < g_nstats; i++)
        if (strcmp(g_stats[i].name, name) == 0) n = g_stats[i].unloads;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* How many times CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES was set on kernel `name`, and
 * the last value. */
int mock_cuda_set_attr_calls(const char *name, int *last_value) {
    pthread_mutex_lock(&g_lock);
    int n = 0;
    for (int i = 0; i < g_nstats; i++) {
        if (strcmp(g_stats[i].name, name) == 0) {
            n = g_stats[i].set_attr_calls;
            if (last_value) *last_value = g_stats[i].set_attr_value;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* The flags a stream was created with (-1 for the NULL stream or a dead handle). */
int mock_cuda_stream_flags(unsigned long long stream) {
    struct stream *s = (struct stream *)(uintptr_t)stream;
    if (!s || s->magic != STREAM_MAGIC) return -1;
    return (int)s->flags;
}

/* While set, every stream and recorded event of `device` reports NOT_READY. */
void mock_cuda_set_busy(int device, int busy) {
    if (device >= 0 && device < MAX_DEVICES)
        __atomic_store_n(&g_ctx[device].busy, busy, __ATOMIC_SEQ_CST);
}

/* How many retains the primary context of `device` holds. */
int mock_cuda_primary_retains(int device) {
    if (device < 0 || device >= MAX_DEVICES) return -1;
    pthread_mutex_lock(&g_lock);
    int n = g_ctx[device].retains;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* The device of the calling thread's current context (-1: none). */
int mock_cuda_current_device(void) { return t_cur ? t_cur->device : -1; }

/* Live allocations of `device`. */
int mock_cuda_live_allocations(int device) {
    pthread_mutex_lock(&g_lock);
    int n = 0;
    for (size_t i = 0; i < g_nallocs; i++) n += g_allocs[i].device == device;
    pthread_mutex_unlock(&g_lock);
    return n;
}
