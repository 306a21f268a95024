/* A plain C host (dlopen, no context slot filled: no thread pool, no workspace allocator) for
 * the runtime kiln links into exported libraries (src/runtime/export_rt.c).
 *
 * Usage:
 *   pool_host threads LIB      vadd (float32, [n]) at n = 1 and 1M, then 1000 calls more;
 *                              prints "threads: <after first call> <after 1000 calls>"
 *   pool_host workspace LIB M  matmul M x M x M (M at most 128; packs B in a workspace) 1000
 *                              times; counts the library's aligned_alloc calls (interposed by
 *                              this host): prints "aligned_alloc: <first call> <1000 calls more>"
 *   pool_host inc LIB          `inc` (C[i] += 1 over [n] in parallel, n = 65536) 2000 times back to
 *                              back; every element must be 2000: a task run twice or skipped
 *                              by a late worker shows; prints "inc: ok"
 *   pool_host bench LIB        ns per call of a 1-element vadd through __tvm_ffi_vadd, and of
 *                              a C function decoding the same three DLTensor arguments and
 *                              adding one float; prints "call_ns: <kiln> <c> <ratio>" (medians)
 * Exits 1 on a wrong result. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { int32_t type_index; uint32_t pad; union { int64_t i; double f; void* p; } v; } Any;
typedef struct { void* data; int32_t dt, di; int32_t ndim; uint8_t code, bits; uint16_t lanes;
                 int64_t* shape; int64_t* strides; uint64_t byte_offset; } DLTensor;
typedef int (*safe_call)(void*, const Any*, int32_t, Any*);

static long allocs = 0;
/* Interposes the libc function the library's runtime allocates workspaces with. */
void* aligned_alloc(size_t align, size_t size) {
  allocs++;
  return memalign(align, size);
}

static int threads(void) {
  DIR* d = opendir("/proc/self/task");
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static safe_call lookup(void* h, const char* name) {
  char sym[128];
  snprintf(sym, sizeof sym, "__tvm_ffi_%s", name);
  safe_call f = (safe_call)dlsym(h, sym);
  if (!f) { printf("no %s\n", sym); exit(1); }
  return f;
}

static void pack(Any* args, DLTensor** ts, int n) {
  for (int i = 0; i < n; ++i) { args[i].type_index = 7; args[i].pad = 0; args[i].v.p = ts[i]; }
}

static int vadd(safe_call f, int64_t n) {
  float* a = malloc(sizeof(float) * n);
  float* b = malloc(sizeof(float) * n);
  float* c = malloc(sizeof(float) * n);
  for (int64_t i = 0; i < n; ++i) { a[i] = (float)i; b[i] = 1.0f; c[i] = 0.0f; }
  int64_t shape[1] = {n};
  DLTensor ta = {a, 1, 0, 1, 2, 32, 1, shape, NULL, 0}, tb = ta, tc = ta;
  tb.data = b; tc.data = c;
  DLTensor* ts[3] = {&ta, &tb, &tc};
  Any args[3], ret = {0};
  pack(args, ts, 3);
  int rc = f(NULL, args, 3, &ret);
  int ok = rc == 0;
  for (int64_t i = 0; i < n; ++i) ok &= c[i] == (float)i + 1.0f;
  free(a); free(b); free(c);
  return ok;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

/* What any host must do per call at least: check and decode three DLTensor arguments. */
__attribute__((noinline)) static int c_add(void* self, const Any* args, int32_t n, Any* ret) {
  (void)self; (void)ret;
  if (n != 3) return -1;
  float* p[3];
  for (int i = 0; i < 3; ++i) {
    if (args[i].type_index != 7) return -1;
    const DLTensor* t = (const DLTensor*)args[i].v.p;
    if (t->ndim != 1 || t->code != 2 || t->bits != 32 || t->lanes != 1 || t->dt != 1) return -1;
    if (t->shape[0] != ((const DLTensor*)args[0].v.p)->shape[0]) return -1;
    p[i] = (float*)((char*)t->data + t->byte_offset);
  }
  p[2][0] = p[0][0] + p[1][0];
  return 0;
}

static int cmp(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y;
  return (a > b) - (a < b);
}

static double per_call(safe_call f, const Any* args) {
  enum { BATCH = 20000, ROUNDS = 15 };
  double t[ROUNDS];
  Any ret = {0};
  for (int r = 0; r < ROUNDS; ++r) {
    double t0 = now();
    for (int i = 0; i < BATCH; ++i) f(NULL, args, 3, &ret);
    t[r] = (now() - t0) / BATCH;
  }
  qsort(t, ROUNDS, sizeof t[0], cmp);
  return t[ROUNDS / 2];
}

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  void* h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
  if (strcmp(argv[1], "threads") == 0) {
    safe_call f = lookup(h, "vadd");
    if (!vadd(f, 1) || !vadd(f, 1 << 20)) { printf("wrong vadd\n"); return 1; }
    int first = threads();
    for (int i = 0; i < 1000; ++i) {
      if (!vadd(f, i % 2 ? 1 << 16 : 3)) { printf("wrong vadd\n"); return 1; }
    }
    printf("threads: %d %d\n", first, threads());
    return 0;
  }
  if (strcmp(argv[1], "workspace") == 0) {
    safe_call f = lookup(h, "matmul");
    enum { MAX = 128 };
    int M = argc > 3 ? atoi(argv[3]) : 64;
    if (M < 1 || M > MAX) { printf("M must be 1 to %d\n", MAX); return 1; }
    static float a[MAX * MAX], b[MAX * MAX], c[MAX * MAX];
    for (int i = 0; i < M * M; ++i) { a[i] = (float)(i % 7); b[i] = (float)(i % 5); }
    int64_t shape[2] = {M, M};
    DLTensor ta = {a, 1, 0, 2, 2, 32, 1, shape, NULL, 0}, tb = ta, tc = ta;
    tb.data = b; tc.data = c;
    DLTensor* ts[3] = {&ta, &tb, &tc};
    Any args[3], ret = {0};
    pack(args, ts, 3);
    long before = allocs;
    if (f(NULL, args, 3, &ret) != 0) { printf("matmul failed\n"); return 1; }
    long first = allocs - before;
    for (int i = 0; i < 1000; ++i) {
      if (f(NULL, args, 3, &ret) != 0) { printf("matmul failed\n"); return 1; }
    }
    for (int i = 0; i < M; ++i) {
      for (int j = 0; j < M; ++j) {
        float s = 0;
        for (int k = 0; k < M; ++k) s += a[i * M + k] * b[k * M + j];
        if (c[i * M + j] != s) { printf("wrong matmul at %d,%d\n", i, j); return 1; }
      }
    }
    printf("aligned_alloc: %ld %ld\n", first, allocs - before - first);
    return 0;
  }
  if (strcmp(argv[1], "inc") == 0) {
    safe_call f = lookup(h, "inc");
    enum { N = 1 << 16, CALLS = 2000 };
    static float c[N];
    int64_t shape[1] = {N};
    DLTensor tc = {c, 1, 0, 1, 2, 32, 1, shape, NULL, 0};
    DLTensor* ts[1] = {&tc};
    Any args[1], ret = {0};
    pack(args, ts, 1);
    for (int i = 0; i < CALLS; ++i) {
      if (f(NULL, args, 1, &ret) != 0) { printf("inc failed\n"); return 1; }
    }
    for (int i = 0; i < N; ++i) {
      if (c[i] != (float)CALLS) { printf("c[%d] = %g after %d calls\n", i, c[i], CALLS); return 1; }
    }
    printf("inc: ok\n");
    return 0;
  }
  if (strcmp(argv[1], "bench") == 0) {
    safe_call f = lookup(h, "vadd");
    /* 64-byte aligned: a TVM-built vadd (run for comparison) uses aligned vector loads. */
    static _Alignas(64) float a[16] = {1}, b[16] = {2}, c[16] = {0};
    int64_t shape[1] = {1};
    DLTensor ta = {a, 1, 0, 1, 2, 32, 1, shape, NULL, 0}, tb = ta, tc = ta;
    tb.data = b; tc.data = c;
    DLTensor* ts[3] = {&ta, &tb, &tc};
    Any args[3];
    pack(args, ts, 3);
    per_call(f, args);
    double k = per_call(f, args), cc = per_call(c_add, args);
    k = per_call(f, args) < k ? per_call(f, args) : k;
    if (c[0] != 3.0f) { printf("wrong vadd\n"); return 1; }
    printf("call_ns: %.2f %.2f %.2f\n", k, cc, k / cc);
    return 0;
  }
  return 2;
}
