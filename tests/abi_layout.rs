//! Checks kiln's hand-written ABI structs against the real tvm-ffi and DLPack headers.
//!
//! The headers ship in the `apache-tvm-ffi` wheel. The test finds them through `KILN_PYTHON`
//! (default `python3`) importing `tvm_ffi`; when that fails it skips with a note, unless
//! `KILN_REQUIRE_TVM_FFI=1` (set by `.ci/run`, which installs the wheel), where it fails.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use kiln::packed_func::ffi::*;

fn tvm_ffi_include() -> Option<PathBuf> {
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python)
        .args([
            "-c",
            "import tvm_ffi, os; print(os.path.join(os.path.dirname(tvm_ffi.__file__), 'include'))",
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

#[test]
fn struct_layouts_and_codes_match_the_real_c_headers() {
    let Some(include) = tvm_ffi_include() else {
        assert!(
            std::env::var("KILN_REQUIRE_TVM_FFI").as_deref() != Ok("1"),
            "KILN_REQUIRE_TVM_FFI=1 but tvm_ffi is not importable (set KILN_PYTHON)"
        );
        eprintln!(
            "skipped: tvm_ffi headers not found (pip install apache-tvm-ffi, or set KILN_PYTHON)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("layout");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(cc)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/layout.c"))
        .arg("-I")
        .arg(&include)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap();
    assert!(status.success());
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let c: HashMap<&str, usize> = text
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect();
    let ours: &[(&str, usize)] = &[
        ("sizeof(DLDevice)", size_of::<DLDevice>()),
        ("sizeof(DLDataType)", size_of::<DLDataType>()),
        ("sizeof(DLTensor)", size_of::<DLTensor>()),
        ("offsetof(DLTensor, device)", offset_of!(DLTensor, device)),
        ("offsetof(DLTensor, ndim)", offset_of!(DLTensor, ndim)),
        ("offsetof(DLTensor, dtype)", offset_of!(DLTensor, dtype)),
        ("offsetof(DLTensor, shape)", offset_of!(DLTensor, shape)),
        ("offsetof(DLTensor, strides)", offset_of!(DLTensor, strides)),
        (
            "offsetof(DLTensor, byte_offset)",
            offset_of!(DLTensor, byte_offset),
        ),
        ("sizeof(DLPackVersion)", size_of::<DLPackVersion>()),
        (
            "sizeof(DLManagedTensorVersioned)",
            size_of::<DLManagedTensorVersioned>(),
        ),
        (
            "offsetof(DLManagedTensorVersioned, manager_ctx)",
            offset_of!(DLManagedTensorVersioned, manager_ctx),
        ),
        (
            "offsetof(DLManagedTensorVersioned, deleter)",
            offset_of!(DLManagedTensorVersioned, deleter),
        ),
        (
            "offsetof(DLManagedTensorVersioned, flags)",
            offset_of!(DLManagedTensorVersioned, flags),
        ),
        (
            "offsetof(DLManagedTensorVersioned, dl_tensor)",
            offset_of!(DLManagedTensorVersioned, dl_tensor),
        ),
        ("sizeof(TVMFFIObject)", size_of::<TVMFFIObject>()),
        (
            "offsetof(TVMFFIObject, type_index)",
            offset_of!(TVMFFIObject, type_index),
        ),
        (
            "offsetof(TVMFFIObject, deleter)",
            offset_of!(TVMFFIObject, deleter),
        ),
        ("sizeof(TVMFFIAny)", size_of::<TVMFFIAny>()),
        (
            "offsetof(TVMFFIAny, small_str_len)",
            offset_of!(TVMFFIAny, small_len),
        ),
        ("offsetof(TVMFFIAny, v_int64)", offset_of!(TVMFFIAny, value)),
        ("sizeof(TVMFFIByteArray)", size_of::<TVMFFIByteArray>()),
        ("kTVMFFINone", TypeIndex::NONE.0 as usize),
        ("kTVMFFIInt", TypeIndex::INT.0 as usize),
        ("kTVMFFIBool", TypeIndex::BOOL.0 as usize),
        ("kTVMFFIFloat", TypeIndex::FLOAT.0 as usize),
        ("kTVMFFIOpaquePtr", TypeIndex::OPAQUE_PTR.0 as usize),
        ("kTVMFFIDataType", TypeIndex::DATA_TYPE.0 as usize),
        ("kTVMFFIDevice", TypeIndex::DEVICE.0 as usize),
        ("kTVMFFIDLTensorPtr", TypeIndex::DL_TENSOR_PTR.0 as usize),
        ("kTVMFFIRawStr", TypeIndex::RAW_STR.0 as usize),
        ("kTVMFFIByteArrayPtr", TypeIndex::BYTE_ARRAY_PTR.0 as usize),
        ("kTVMFFISmallStr", TypeIndex::SMALL_STR.0 as usize),
        ("kTVMFFISmallBytes", TypeIndex::SMALL_BYTES.0 as usize),
        ("kTVMFFIStr", TypeIndex::STR.0 as usize),
        ("kTVMFFIBytes", TypeIndex::BYTES.0 as usize),
        ("kTVMFFIError", TypeIndex::ERROR.0 as usize),
        ("kTVMFFIFunction", TypeIndex::FUNCTION.0 as usize),
        ("kTVMFFIShape", TypeIndex::SHAPE.0 as usize),
        ("kTVMFFITensor", TypeIndex::TENSOR.0 as usize),
        ("kTVMFFIArray", TypeIndex::ARRAY.0 as usize),
        ("kTVMFFIMap", TypeIndex::MAP.0 as usize),
        ("kTVMFFIModule", TypeIndex::MODULE.0 as usize),
        ("kTVMFFIBigInt", TypeIndex::BIG_INT.0 as usize),
        ("kDLCPU", DLDeviceType::CPU.0 as usize),
        ("kDLCUDA", DLDeviceType::CUDA.0 as usize),
        ("kDLOpenCL", DLDeviceType::OPENCL.0 as usize),
        ("kDLVulkan", DLDeviceType::VULKAN.0 as usize),
        ("kDLMetal", DLDeviceType::METAL.0 as usize),
        ("kDLROCM", DLDeviceType::ROCM.0 as usize),
        ("kDLExtDev", DLDeviceType::EXT_DEV.0 as usize),
        ("kDLWebGPU", DLDeviceType::WEBGPU.0 as usize),
        ("kDLHexagon", DLDeviceType::HEXAGON.0 as usize),
        ("kDLInt", DLDataTypeCode::INT.0 as usize),
        ("kDLUInt", DLDataTypeCode::UINT.0 as usize),
        ("kDLFloat", DLDataTypeCode::FLOAT.0 as usize),
        ("kDLBfloat", DLDataTypeCode::BFLOAT.0 as usize),
        ("kDLBool", DLDataTypeCode::BOOL.0 as usize),
        ("DLPACK_MAJOR_VERSION", DLPACK_VERSION.major as usize),
        ("DLPACK_MINOR_VERSION", DLPACK_VERSION.minor as usize),
        (
            "kTVMFFIObjectDeleterFlagBitMaskBoth",
            DELETER_FLAG_BOTH as usize,
        ),
    ];
    let mut bad = Vec::new();
    for (name, ours) in ours {
        match c.get(name) {
            Some(theirs) if theirs == ours => {}
            other => bad.push(format!("{name}: kiln {ours}, header {other:?}")),
        }
    }
    assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
}
