/* A plain C host for kiln-exported libraries: no libtvm_ffi, no kiln. It dlopens the library,
 * fills the error context slot with its own function, calls `add16` with DLTensor pointers
 * (type index 7), then makes a bad call and checks it returns non-zero with an error.
 * Usage: host LIBRARY [FUNCTION]; FUNCTION (default `add16`) is a float32 `C = A + B` of
 * shape [16] or [n]. `.ci/valgrind` runs it under valgrind on a `kiln build` of vadd. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct { int32_t type_index; uint32_t pad; union { int64_t i; double f; void* p; } v; } Any;
typedef struct { void* data; int32_t dt, di; int32_t ndim; uint8_t code, bits; uint16_t lanes;
                 int64_t* shape; int64_t* strides; uint64_t byte_offset; } DLTensor;
typedef int (*safe_call)(void*, const Any*, int32_t, Any*);

static char last_kind[64], last_msg[512];
static void set_raised(const char* kind, const char* msg) {
  snprintf(last_kind, sizeof last_kind, "%s", kind);
  snprintf(last_msg, sizeof last_msg, "%s", msg);
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
  void** slot = (void**)dlsym(h, "__TVMFFIErrorSetRaisedFromCStr");
  if (slot) *slot = (void*)set_raised;
  const char* name = argc > 2 ? argv[2] : "add16";
  char sym[256];
  snprintf(sym, sizeof sym, "__tvm_ffi_%s", name);
  safe_call f = (safe_call)dlsym(h, sym);
  if (!f) { printf("no %s\n", sym); return 1; }
  float a[16], b[16], c[16];
  int64_t shape[1] = {16};
  for (int i = 0; i < 16; ++i) { a[i] = 1; b[i] = 2; c[i] = 0; }
  DLTensor ta = {a, 1, 0, 1, 2, 32, 1, shape, NULL, 0}, tb = ta, tc = ta;
  tb.data = b; tc.data = c;
  Any args[3], ret;
  DLTensor* ts[3] = {&ta, &tb, &tc};
  for (int i = 0; i < 3; ++i) { args[i].type_index = 7; args[i].pad = 0; args[i].v.p = ts[i]; }
  ret.type_index = 0;
  int rc = f(NULL, args, 3, &ret);
  int good = rc == 0;
  for (int i = 0; i < 16; ++i) good &= c[i] == 3.0f;
  if (!good) { printf("wrong result rc=%d\n", rc); return 1; }
  printf("ok: c[0..16] = 3\n");
  rc = f(NULL, args, 2, &ret);
  printf("bad call returned %d: %s: %s\n", rc, last_kind, last_msg);
  int ok = rc == -1;
  dlclose(h);
  return ok ? 0 : 1;
}
