/* Prints sizes and offsets of the tvm-ffi / DLPack structs from the real headers. */
#include <stddef.h>
#include <stdio.h>
#include <tvm/ffi/c_api.h>

#define P(expr) printf("%s %zu\n", #expr, (size_t)(expr))
int main(void) {
  P(sizeof(DLDevice)); P(sizeof(DLDataType)); P(sizeof(DLTensor));
  P(offsetof(DLTensor, device)); P(offsetof(DLTensor, ndim)); P(offsetof(DLTensor, dtype));
  P(offsetof(DLTensor, shape)); P(offsetof(DLTensor, strides)); P(offsetof(DLTensor, byte_offset));
  P(sizeof(DLPackVersion)); P(sizeof(DLManagedTensorVersioned));
  P(offsetof(DLManagedTensorVersioned, manager_ctx)); P(offsetof(DLManagedTensorVersioned, deleter));
  P(offsetof(DLManagedTensorVersioned, flags)); P(offsetof(DLManagedTensorVersioned, dl_tensor));
  P(sizeof(TVMFFIObject)); P(offsetof(TVMFFIObject, type_index)); P(offsetof(TVMFFIObject, deleter));
  P(sizeof(TVMFFIAny)); P(offsetof(TVMFFIAny, small_str_len)); P(offsetof(TVMFFIAny, v_int64));
  P(sizeof(TVMFFIByteArray));
  P(kTVMFFINone); P(kTVMFFIInt); P(kTVMFFIBool); P(kTVMFFIFloat); P(kTVMFFIOpaquePtr);
  P(kTVMFFIDataType); P(kTVMFFIDevice); P(kTVMFFIDLTensorPtr); P(kTVMFFIRawStr);
  P(kTVMFFIByteArrayPtr); P(kTVMFFISmallStr); P(kTVMFFISmallBytes); P(kTVMFFIStr); P(kTVMFFIBytes);
  P(kTVMFFIError); P(kTVMFFIFunction); P(kTVMFFIShape); P(kTVMFFITensor); P(kTVMFFIArray);
  P(kTVMFFIMap); P(kTVMFFIModule); P(kTVMFFIBigInt);
  P(kDLCPU); P(kDLCUDA); P(kDLOpenCL); P(kDLVulkan); P(kDLMetal); P(kDLROCM); P(kDLExtDev);
  P(kDLWebGPU); P(kDLHexagon); P(kDLInt); P(kDLUInt); P(kDLFloat); P(kDLBfloat); P(kDLBool);
  P(DLPACK_MAJOR_VERSION); P(DLPACK_MINOR_VERSION);
  P(kTVMFFIObjectDeleterFlagBitMaskBoth);
  return 0;
}
