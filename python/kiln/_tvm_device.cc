// kiln's device backends as TVM `DeviceAPI`s: compiled by `kiln.tvm` against the installed
// TVM's own headers (so the class layout is that TVM's), loaded into the process, and
// registered as the global `device_api.<name>` that TVM's runtime looks a device type up by.
//
// Every method calls kiln's C table (`KilnDeviceTable`, python/native/src/tvm_device.rs): TVM's
// tensors of that device are then allocated, copied and freed by kiln, which is what kiln's
// kernels check their buffers against. A kiln error becomes a TVM error (a C++ exception that
// TVM's FFI turns into the caller's Python exception) carrying kiln's message.

#include <dlpack/dlpack.h>
#include <tvm/ffi/function.h>
#include <tvm/runtime/device_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

// Keep in step with python/native/src/tvm_device.rs (`DeviceTable`, `TABLE_VERSION`).
constexpr uint32_t kKilnTableVersion = 1;

struct KilnDeviceTable {
  uint32_t version;
  int32_t (*attr)(int32_t, int32_t, int32_t, int64_t*, const char**);
  int32_t (*alloc)(int32_t, int32_t, uint64_t, uint64_t, DLDataType, void**);
  int32_t (*free)(int32_t, int32_t, void*);
  int32_t (*copy)(const DLTensor*, const DLTensor*, void*);
  int32_t (*sync)(int32_t, int32_t, void*);
  const char* (*last_error)();
  int32_t (*attach)(const char*, void*, void*);
};

using tvm::Device;
using tvm::runtime::DeviceAPI;
using tvm::runtime::DeviceAttrKind;

class KilnDeviceAPI final : public DeviceAPI {
 public:
  KilnDeviceAPI(const KilnDeviceTable* table, int32_t device_type)
      : t_(table), type_(device_type) {}

  void SetDevice(Device dev) final { Check(dev); }

  void GetAttr(Device dev, DeviceAttrKind kind, tvm::ffi::Any* rv) final {
    int64_t v = 0;
    const char* s = nullptr;
    int32_t rc = t_->attr(dev.device_type, dev.device_id, static_cast<int32_t>(kind), &v, &s);
    if (rc == 1) {
      *rv = v;
    } else if (rc == 2) {
      *rv = tvm::ffi::String(s);
    } else if (rc < 0) {
      Fail();
    }
  }

  void* AllocDataSpace(Device dev, size_t nbytes, size_t alignment,
                       DLDataType type_hint) final {
    Check(dev);
    void* p = nullptr;
    if (t_->alloc(dev.device_type, dev.device_id, nbytes, alignment, type_hint, &p) != 0) Fail();
    return p;
  }

  // Called from tensor deleters, where an exception would terminate the process: a failed
  // free (memory kiln does not know, a lost device) is reported on stderr and leaks.
  void FreeDataSpace(Device dev, void* ptr) final {
    if (t_->free(dev.device_type, dev.device_id, ptr) != 0) {
      const char* m = t_->last_error();
      std::fprintf(stderr, "kiln: freeing TVM's device memory failed: %s\n",
                   m != nullptr ? m : "unknown error");
    }
  }

  void CopyDataFromTo(DLTensor* from, DLTensor* to, TVMStreamHandle stream) final {
    if (t_->copy(from, to, stream) != 0) Fail();
  }

  void StreamSync(Device dev, TVMStreamHandle stream) final {
    if (t_->sync(dev.device_type, dev.device_id, stream) != 0) Fail();
  }

  // kiln's device memory is a handle (OpenCL's cl_mem): offsets travel as byte_offset.
  bool SupportsDevicePointerArithmeticsOnHost() final { return false; }

 protected:
  void CopyDataFromTo(const void* from, size_t from_offset, void* to, size_t to_offset,
                      size_t num_bytes, Device dev_from, Device dev_to, DLDataType type_hint,
                      TVMStreamHandle stream) final {
    // As bytes: two one-dimensional tensors of `num_bytes` uint8 at the offsets.
    int64_t n = static_cast<int64_t>(num_bytes);
    DLTensor a{const_cast<void*>(from), dev_from, 1, DLDataType{kDLUInt, 8, 1}, &n, nullptr,
               from_offset};
    DLTensor b{to, dev_to, 1, DLDataType{kDLUInt, 8, 1}, &n, nullptr, to_offset};
    if (t_->copy(&a, &b, stream) != 0) Fail();
  }

 private:
  void Check(Device dev) const {
    if (dev.device_type != type_) {
      TVM_FFI_THROW(RuntimeError) << "kiln's DeviceAPI for device type " << type_
                                  << " was called for device type " << dev.device_type;
    }
  }

  [[noreturn]] void Fail() const {
    const char* m = t_->last_error();
    TVM_FFI_THROW(RuntimeError) << (m != nullptr ? m : "kiln device error");
  }

  const KilnDeviceTable* t_;
  int32_t type_;
};

}  // namespace

// Registers kiln's backend of `device_type` as TVM's `device_api.<name>`. Returns 0; 1 when
// the global exists already and is not kiln's (another runtime of that device is in this
// process: TVM's own); -1 for a table of another version. Idempotent for kiln's own.
extern "C" int kiln_tvm_register_device_api(const void* table, int32_t device_type,
                                            const char* name) {
  const auto* t = static_cast<const KilnDeviceTable*>(table);
  if (t == nullptr || t->version != kKilnTableVersion) return -1;
  std::string global = std::string("device_api.") + name;
  std::string marker = std::string("kiln.device_api.") + name;
  if (tvm::ffi::Function::GetGlobal(marker).has_value()) return 0;
  if (tvm::ffi::Function::GetGlobal(global).has_value()) return 1;
  // One object per device type, for the life of the process (TVM caches the pointer).
  auto* api = new KilnDeviceAPI(t, device_type);
  auto get = tvm::ffi::Function::FromPacked(
      [api](tvm::ffi::PackedArgs, tvm::ffi::Any* rv) { *rv = static_cast<void*>(api); });
  tvm::ffi::Function::SetGlobal(global, get, false);
  tvm::ffi::Function::SetGlobal(marker, get, false);
  // What a library kiln exported calls when its loader (TVM's load_module) filled no device
  // slot: kiln attaches the library's device module.
  if (!tvm::ffi::Function::GetGlobal("kiln.runtime.attach_device_module").has_value()) {
    auto attach = tvm::ffi::Function::FromTyped([t](void* meta, void* launch, void* module) {
      if (t->attach(static_cast<const char*>(meta), launch, module) != 0) {
        const char* m = t->last_error();
        TVM_FFI_THROW(RuntimeError) << (m != nullptr ? m : "kiln device module error");
      }
    });
    tvm::ffi::Function::SetGlobal("kiln.runtime.attach_device_module", attach, false);
  }
  return 0;
}
