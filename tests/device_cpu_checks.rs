//! CPU backend: a freed stream is refused by copies and memsets (as on every backend), and safe
//! code never reads uninitialised memory (`Tensor::empty` is zeroed on the CPU).

use kiln::device_api::{self, Device, DeviceError, StreamHandle, Tensor};
use kiln::packed_func::ffi::{DLDataType, DLDataTypeCode, DLTensor};

const U8: DLDataType = DLDataType {
    code: DLDataTypeCode::UINT,
    bits: 8,
    lanes: 1,
};

#[test]
fn the_cpu_refuses_a_freed_stream_in_copies_and_memsets() {
    let cpu = Device::cpu();
    let api = device_api::get(cpu.device_type).unwrap();
    let s = api.create_stream(cpu).unwrap();
    api.free_stream(cpu, s).unwrap();
    let p = api.alloc_data_space(cpu, 64, 64, U8).unwrap();
    let e = api.memset(cpu, p, 0, 1, 64, s).unwrap_err();
    assert!(matches!(e, DeviceError::InvalidStream { .. }), "{e}");
    let mut a = vec![1u8; 64];
    let mut b = vec![0u8; 64];
    let mut shape = [64i64];
    let mk = |d: *mut u8, shape: &mut [i64; 1]| DLTensor {
        data: d.cast(),
        device: cpu.to_dl(),
        ndim: 1,
        dtype: U8,
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let from = mk(a.as_mut_ptr(), &mut shape);
    let to = mk(b.as_mut_ptr(), &mut shape);
    // SAFETY: both are 64-byte host buffers.
    let e = unsafe { api.copy_data_from_to(&from, &to, s) }.unwrap_err();
    assert!(matches!(e, DeviceError::InvalidStream { .. }), "{e}");
    assert!(e.to_string().contains("stream"), "{e}");
    assert_eq!(b, vec![0u8; 64], "nothing was copied");
    // The default stream and live streams still work.
    // SAFETY: as above.
    unsafe { api.copy_data_from_to(&from, &to, StreamHandle::DEFAULT) }.unwrap();
    assert_eq!(b, a);
    let live = api.create_stream(cpu).unwrap();
    api.memset(cpu, p, 0, 1, 64, live).unwrap();
    api.free_stream(cpu, live).unwrap();
    api.free_data_space(cpu, p).unwrap();
}

#[test]
fn an_empty_cpu_tensor_reads_as_zeros() {
    // Dirty the allocator first, so a recycled block would show old bytes if not zeroed.
    for _ in 0..4 {
        let t = Tensor::from_slice(&vec![0xABu8; 1 << 16], &[1 << 16], Device::cpu()).unwrap();
        drop(t);
    }
    let t = Tensor::empty(&[1 << 16], U8, Device::cpu()).unwrap();
    assert!(t.to_vec::<u8>().unwrap().iter().all(|&b| b == 0));
    let big = Tensor::empty(&[1 << 22], U8, Device::cpu()).unwrap();
    assert!(big.to_vec::<u8>().unwrap().iter().all(|&b| b == 0));
}
