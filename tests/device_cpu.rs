//! What only the CPU backend does: attributes from the OS, strided host-to-host copies.

use kiln::device_api::{self, AttrKind, CpuDeviceApi, Device, DeviceApi, StreamHandle, Tensor};
use kiln::packed_func::ffi::{DLDataType, DLDataTypeCode, DLTensor};

const F32: DLDataType = DLDataType {
    code: DLDataTypeCode::FLOAT,
    bits: 32,
    lanes: 1,
};

fn meminfo_kb(key: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        })
}

#[test]
fn cpu_attributes_come_from_the_operating_system() {
    let api = CpuDeviceApi::new();
    let cpu = Device::cpu();
    let get = |k| api.attr(cpu, k).unwrap();
    if let Some(model) = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines().find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
        })
    }) {
        assert_eq!(
            get(AttrKind::DEVICE_NAME).unwrap().as_str(),
            Some(model.as_str())
        );
    }
    let cores = get(AttrKind::MULTI_PROCESSOR_COUNT)
        .unwrap()
        .as_int()
        .unwrap();
    assert!(cores >= std::thread::available_parallelism().unwrap().get() as i64);
    let total = get(AttrKind::TOTAL_GLOBAL_MEMORY)
        .unwrap()
        .as_int()
        .unwrap() as u64;
    assert_eq!(Some(total / 1024), meminfo_kb("MemTotal"));
    let avail = get(AttrKind::AVAILABLE_GLOBAL_MEMORY)
        .unwrap()
        .as_int()
        .unwrap() as u64;
    assert!(avail > 0 && avail <= total);
    if std::path::Path::new("/sys/devices/system/cpu/cpu0/cache/index2/size").exists() {
        assert!(
            get(AttrKind::L2_CACHE_SIZE_BYTES)
                .unwrap()
                .as_int()
                .unwrap()
                >= 64 * 1024
        );
    }
    assert_eq!(get(AttrKind::WARP_SIZE).unwrap().as_int(), Some(1));
    assert_eq!(get(AttrKind::MAX_THREADS_PER_BLOCK), None);
    assert_eq!(get(AttrKind::GCN_ARCH), None);
    assert_eq!(api.device_count().unwrap(), 1);
}

#[test]
fn cpu_memory_is_64_byte_aligned_and_writable_by_the_host() {
    let api = CpuDeviceApi::new();
    let cpu = Device::cpu();
    let p = api.alloc_data_space(cpu, 3, 1, F32).unwrap();
    assert_eq!(p.0 % 64, 0);
    api.memset(cpu, p, 0, 0x5a, 3, StreamHandle::DEFAULT)
        .unwrap();
    let stats = api.memory_stats(cpu).unwrap();
    assert_eq!((stats.in_use, stats.allocations), (3, 1));
    api.free_data_space(cpu, p).unwrap();
    assert_eq!(api.memory_stats(cpu).unwrap().in_use, 0);
    assert_eq!(api.memory_stats(cpu).unwrap().peak, 3);
}

#[test]
fn strided_host_to_host_copies_walk_both_layouts() {
    // Transpose a 3x5 matrix by copying a strided view into a compact tensor, then into a
    // strided destination with a byte offset.
    let src: Vec<f32> = (0..15).map(|i| i as f32).collect();
    let a = Tensor::from_slice(&src, &[3, 5], Device::cpu()).unwrap();
    let mut shape = [5i64, 3];
    let mut strides = [1i64, 5];
    let mut view = *a.as_dltensor();
    view.ndim = 2;
    view.shape = shape.as_mut_ptr();
    view.strides = strides.as_mut_ptr();
    let mut out = vec![0f32; 32];
    let mut oshape = [5i64, 3];
    let mut ostrides = [6i64, 2]; // every other element of a 5x6 row-major buffer
    let dst = DLTensor {
        data: out.as_mut_ptr().cast(),
        device: Device::cpu().to_dl(),
        ndim: 2,
        dtype: F32,
        shape: oshape.as_mut_ptr(),
        strides: ostrides.as_mut_ptr(),
        byte_offset: 8,
    };
    // SAFETY: the view addresses `a`'s 15 elements; `dst` addresses out[2..2 + 4*6 + 2*2 + 1].
    unsafe { device_api::copy_data_from_to(&view, &dst, StreamHandle::DEFAULT).unwrap() };
    for i in 0..5 {
        for j in 0..3 {
            assert_eq!(out[2 + i * 6 + j * 2], src[j * 5 + i], "({i}, {j})");
        }
    }
    assert_eq!(out[0], 0.0);
    assert_eq!(out[3], 0.0);
}

#[test]
fn a_copy_to_an_unregistered_device_type_says_no_backend_is_registered() {
    let a = Tensor::from_slice(&[1u8, 2], &[2], Device::cpu()).unwrap();
    let mut shape = [2i64];
    let mut b = *a.as_dltensor();
    b.device = Device::new(device_api::DeviceType::ROCM, 0).to_dl();
    b.shape = shape.as_mut_ptr();
    // SAFETY: rejected before any memory is touched.
    let e = unsafe { device_api::copy_data_from_to(a.as_dltensor(), &b, StreamHandle::DEFAULT) }
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("no backend is registered for device type `rocm` (10); registered: cpu"),
        "{e}"
    );
}

#[test]
fn byte_copies_round_trip_and_refuse_a_wrong_size_or_layout() {
    let f32 = DLDataType {
        code: DLDataTypeCode::FLOAT,
        bits: 32,
        lanes: 1,
    };
    let cpu = Device::cpu();
    let mut t = Tensor::empty(&[2, 3], f32, cpu).unwrap();
    let bytes: Vec<u8> = (0..24u8).collect();
    t.copy_from_bytes(&bytes).unwrap();
    let mut back = vec![0u8; 24];
    t.copy_to_bytes(&mut back).unwrap();
    assert_eq!(back, bytes);
    let e = t.copy_from_bytes(&bytes[..20]).unwrap_err().to_string();
    assert!(
        e.contains("the tensor holds 24 bytes ([2, 3] of float32), the host buffer 20"),
        "{e}"
    );
    let e = t.copy_to_bytes(&mut back[..4]).unwrap_err().to_string();
    assert!(e.contains("the host buffer 4"), "{e}");
    // A strided tensor is not copied byte for byte.
    let mut s = Tensor::empty_strided(&[2, 3], &[1, 2], f32, cpu).unwrap();
    let e = s.copy_from_bytes(&bytes).unwrap_err().to_string();
    assert!(e.contains("a byte copy needs a compact tensor"), "{e}");
}
