/* Foreign packed functions for tests/packed_func.rs, built with the system C compiler.
 * They follow the tvm-ffi safe-call ABI and raise errors through the context slot that kiln's
 * loader fills (no libtvm_ffi needed). */
#include <stdint.h>
#include <stddef.h>

typedef struct { int32_t type_index; uint32_t pad; union { int64_t i; double f; void* p; } v; } Any;
typedef struct { void* data; int32_t dt, di; int32_t ndim; uint8_t code, bits; uint16_t lanes;
                 int64_t* shape; int64_t* strides; uint64_t byte_offset; } DLTensor;

void* __TVMFFIErrorSetRaisedFromCStr = NULL;
typedef void (*set_raised_t)(const char*, const char*);

static int raise(const char* kind, const char* msg) {
  if (__TVMFFIErrorSetRaisedFromCStr) ((set_raised_t)__TVMFFIErrorSetRaisedFromCStr)(kind, msg);
  return -1;
}

/* add(a: int, b: int) -> int */
int __tvm_ffi_add(void* self, const Any* args, int32_t n, Any* ret) {
  if (n != 2) return raise("TypeError", "add expects 2 arguments");
  if (args[0].type_index != 1 || args[1].type_index != 1) return raise("TypeError", "add expects ints");
  ret->type_index = 1; ret->pad = 0; ret->v.i = args[0].v.i + args[1].v.i;
  return 0;
}

/* raises a ValueError */
int __tvm_ffi_fail_value(void* self, const Any* args, int32_t n, Any* ret) {
  return raise("ValueError", "value out of range: 42");
}

/* returns non-zero without raising: a callee bug kiln must survive */
int __tvm_ffi_fail_silent(void* self, const Any* args, int32_t n, Any* ret) { return 7; }

/* sum3(a, b, c: DLTensor* or Tensor) -> float: sums the first element of each float32 tensor */
int __tvm_ffi_sum3(void* self, const Any* args, int32_t n, Any* ret) {
  double s = 0;
  if (n != 3) return raise("TypeError", "sum3 expects 3 arguments");
  for (int i = 0; i < 3; ++i) {
    const DLTensor* t;
    if (args[i].type_index == 7) t = (const DLTensor*)args[i].v.p;
    else if (args[i].type_index == 70) t = (const DLTensor*)((char*)args[i].v.p + 24);
    else return raise("TypeError", "sum3 expects tensors");
    s += *(const float*)((const char*)t->data + t->byte_offset);
  }
  ret->type_index = 3; ret->pad = 0; ret->v.f = s;
  return 0;
}

/* nop3(a, b, c): the cheapest 3-tensor safe-call, for the call-overhead benchmark */
int __tvm_ffi_nop3(void* self, const Any* args, int32_t n, Any* ret) {
  if (n != 3) return raise("TypeError", "nop3 expects 3 arguments");
  return 0;
}

/* direct C version of nop3 for the baseline */
int nop3_direct(DLTensor* a, DLTensor* b, DLTensor* c) { return a->ndim + b->ndim + c->ndim == 0; }
