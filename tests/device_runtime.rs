//! The device runtime around the backends: names, the registry, tensors and DLPack, workspace
//! pools and the `TVMBackend*Workspace` entry points.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kiln::device_api::{
    self, workspace, Device, DeviceError, DevicePtr, DeviceType, NullDeviceApi, Tensor,
    WorkspacePool,
};
use kiln::packed_func::ffi::{
    self, DLDataType, DLDataTypeCode, DLManagedTensorVersioned, DLTensor,
};
use kiln::packed_func::{context as library, registry};

#[test]
fn device_names_map_to_codes_both_ways() {
    assert_eq!(DeviceType::from_name("cpu").unwrap(), DeviceType::CPU);
    assert_eq!(DeviceType::from_name("llvm").unwrap(), DeviceType::CPU);
    assert_eq!(DeviceType::from_name("cuda").unwrap().0, 2);
    assert_eq!(DeviceType(10).name(), "rocm");
    assert_eq!(DeviceType(1).to_string(), "cpu");
    assert_eq!("cpu:0".parse::<Device>().unwrap(), Device::cpu());
    assert_eq!(
        "cuda:3".parse::<Device>().unwrap(),
        Device::new(DeviceType::CUDA, 3)
    );
    assert_eq!(Device::new(DeviceType::CUDA, 3).to_string(), "cuda:3");
    assert!("cpu:x".parse::<Device>().is_err());
    let e = DeviceType::from_name("cdua").unwrap_err();
    assert!(matches!(e, DeviceError::UnknownDevice { .. }));
    assert!(e.to_string().contains("known devices: cpu"), "{e}");
}

#[test]
fn the_registry_resolves_backends_and_tells_unknown_from_unregistered() {
    let cpu = device_api::get(DeviceType::CPU).unwrap();
    assert_eq!(cpu.name(), "cpu");
    assert!(Arc::ptr_eq(&cpu, &device_api::get_by_name("cpu").unwrap()));
    let e = device_api::get(DeviceType::ROCM).unwrap_err();
    assert!(matches!(e, DeviceError::NoBackend { .. }), "{e}");
    let e = device_api::get(DeviceType(99)).unwrap_err();
    assert!(matches!(e, DeviceError::UnknownDevice { .. }), "{e}");
    assert!(e.to_string().contains("cpu"), "{e}");
    let e = device_api::get_by_name("nope").unwrap_err();
    assert!(e.to_string().contains("unknown device `nope`"), "{e}");
}

#[test]
fn the_global_function_device_api_cpu_returns_the_device_type_code() {
    device_api::init();
    let f = registry::require("device_api.cpu").unwrap();
    assert_eq!(f.call_typed::<_, i64>(()).unwrap(), 1);
}

/// Held from `next_extension_code` to `register_device_api`: the tests of this file run in
/// parallel, and two of them could otherwise be handed the same free code.
static REGISTERING: Mutex<()> = Mutex::new(());

#[test]
fn a_backend_registered_from_rust_gets_a_name_a_code_and_a_global_function() {
    let guard = REGISTERING.lock().unwrap_or_else(|e| e.into_inner());
    let code = device_api::next_extension_code().unwrap();
    assert!(code.0 >= DeviceType::EXT_BASE);
    let api = Arc::new(NullDeviceApi::new("rt_test_dev", code, 1, 1 << 20));
    device_api::register_device_api("rt_test_dev", code, api.clone()).unwrap();
    drop(guard);
    assert_eq!(DeviceType::from_name("rt_test_dev").unwrap(), code);
    assert_eq!(code.name(), "rt_test_dev");
    assert!(device_api::list()
        .iter()
        .any(|(n, c)| n == "rt_test_dev" && *c == code));
    let f = registry::require("device_api.rt_test_dev").unwrap();
    assert_eq!(f.call_typed::<_, i64>(()).unwrap(), i64::from(code.0));
    // The same name or code again, a DLPack name, a reserved code, or a code the backend does
    // not report are all refused.
    let e = device_api::register_device_api("rt_test_dev", code, api.clone()).unwrap_err();
    assert!(e.to_string().contains("already registered"), "{e}");
    let other = Arc::new(NullDeviceApi::new("x", DeviceType(20), 1, 1));
    let e = device_api::register_device_api("x", DeviceType(20), other).unwrap_err();
    assert!(e.to_string().contains("extension codes are 64..128"), "{e}");
    let e =
        device_api::register_device_api("cuda", DeviceType(DeviceType::EXT_BASE + 60), api.clone())
            .unwrap_err();
    assert!(matches!(e, DeviceError::Registration { .. }), "{e}");
    let e = device_api::register_device_api("Bad Name", code, api).unwrap_err();
    assert!(e.to_string().contains("lowercase"), "{e}");
}

#[test]
fn copies_between_two_non_cpu_backends_bounce_through_the_host() {
    let mk = |name: &str| {
        let _guard = REGISTERING.lock().unwrap_or_else(|e| e.into_inner());
        let code = device_api::next_extension_code().unwrap();
        let api = Arc::new(NullDeviceApi::new(name, code, 2, 1 << 20));
        device_api::register_device_api(name, code, api).unwrap();
        code
    };
    let (a, b) = (mk("bounce_a"), mk("bounce_b"));
    let data: Vec<i32> = (0..100).collect();
    let x = Tensor::from_slice(&data, &[10, 10], Device::new(a, 1)).unwrap();
    let y = x.copy_to(Device::new(b, 0)).unwrap();
    let z = y.copy_to(Device::new(b, 1)).unwrap();
    assert_eq!(z.to_vec::<i32>().unwrap(), data);
    assert_ne!(x.data_ptr(), DevicePtr::NULL);
}

#[test]
fn tensors_hold_every_element_type() {
    fn check<T: device_api::Element + PartialEq + std::fmt::Debug>(v: Vec<T>) {
        let t = Tensor::from_slice(&v, &[v.len() as i64], Device::cpu()).unwrap();
        assert_eq!(t.dtype(), T::DTYPE);
        assert_eq!(t.to_vec::<T>().unwrap(), v);
    }
    check(vec![1.5f32, -2.0]);
    check(vec![1.5f64, -2.0]);
    check(vec![half::f16::from_f32(1.5), half::f16::from_f32(-2.0)]);
    check(vec![half::bf16::from_f32(1.5)]);
    check(vec![i8::MIN, 0, i8::MAX]);
    check(vec![i16::MIN, i16::MAX]);
    check(vec![i32::MIN, i32::MAX]);
    check(vec![i64::MIN, i64::MAX]);
    check(vec![0u8, 255]);
    check(vec![0u16, u16::MAX]);
    check(vec![0u32, u32::MAX]);
    check(vec![0u64, u64::MAX]);
    check(vec![true, false, true]);
}

#[test]
fn tensor_construction_rejects_bad_shapes_and_zero_element_tensors_allocate_nothing() {
    let f32t = <f32 as device_api::Element>::DTYPE;
    let e = Tensor::empty(&[2, -1], f32t, Device::cpu()).unwrap_err();
    assert!(matches!(e, DeviceError::InvalidTensor(_)), "{e}");
    let e = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[2, 2], Device::cpu()).unwrap_err();
    assert!(
        e.to_string().contains("holds 4 elements, the slice has 3"),
        "{e}"
    );
    let t = Tensor::empty(&[0, 5], f32t, Device::cpu()).unwrap();
    assert_eq!(t.data_ptr(), DevicePtr::NULL);
    assert_eq!(t.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    let s = Tensor::zeros(&[], f32t, Device::cpu()).unwrap();
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![0.0]);
    let e = Tensor::empty(&[4], f32t, Device::new(DeviceType::CPU, 1)).unwrap_err();
    assert!(matches!(e, DeviceError::InvalidDevice { .. }), "{e}");
}

#[test]
fn a_strided_tensor_copies_into_a_compact_one() {
    let f32t = <f32 as device_api::Element>::DTYPE;
    let src = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[6], Device::cpu()).unwrap();
    let mut st = Tensor::empty_strided(&[2, 3], &[1, 2], f32t, Device::cpu()).unwrap();
    assert!(!st.is_compact());
    let compact = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[2, 3], Device::cpu()).unwrap();
    st.copy_from(&compact).unwrap();
    // Element (i, j) sits at i + 2j.
    let flat = Tensor::empty(&[6], f32t, Device::cpu()).unwrap();
    let mut view = *st.as_dltensor();
    let mut shape = [6i64];
    view.ndim = 1;
    view.shape = shape.as_mut_ptr();
    view.strides = std::ptr::null_mut();
    // SAFETY: `st` owns exactly 6 elements (span 1 + 1*1 + 2*2).
    unsafe {
        device_api::copy_data_from_to(&view, flat.as_dltensor(), device_api::StreamHandle::DEFAULT)
            .unwrap()
    };
    assert_eq!(flat.to_vec::<f32>().unwrap(), vec![1., 4., 2., 5., 3., 6.]);
    drop(src);
}

static PRODUCER_DELETES: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn producer_deleter(m: *mut DLManagedTensorVersioned) {
    PRODUCER_DELETES.fetch_add(1, Ordering::SeqCst);
    // SAFETY: `m` and its context were boxed by `produce` below.
    unsafe {
        drop(Box::from_raw(
            (*m).manager_ctx.cast::<(Vec<f64>, Vec<i64>)>(),
        ));
        drop(Box::from_raw(m));
    }
}

fn produce(major: u32) -> *mut DLManagedTensorVersioned {
    let mut ctx = Box::new((vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], vec![3i64, 2]));
    let dl = DLTensor {
        data: ctx.0.as_mut_ptr().cast(),
        device: Device::cpu().to_dl(),
        ndim: 2,
        dtype: DLDataType {
            code: DLDataTypeCode::FLOAT,
            bits: 64,
            lanes: 1,
        },
        shape: ctx.1.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    Box::into_raw(Box::new(DLManagedTensorVersioned {
        version: ffi::DLPackVersion { major, minor: 0 },
        manager_ctx: Box::into_raw(ctx).cast(),
        deleter: Some(producer_deleter),
        flags: ffi::DLPACK_FLAG_READ_ONLY,
        dl_tensor: dl,
    }))
}

#[test]
fn dlpack_import_is_zero_copy_and_runs_the_producer_deleter_exactly_once() {
    let before = PRODUCER_DELETES.load(Ordering::SeqCst);
    let m = produce(1);
    // SAFETY: `m` is a valid managed tensor whose ownership passes to kiln.
    let t = unsafe { Tensor::from_dlpack(m) }.unwrap();
    // SAFETY: `m` is alive until `t` drops.
    let data = unsafe { (*m).dl_tensor.data };
    assert_eq!(t.data_ptr(), DevicePtr::from_raw(data));
    assert_eq!(t.shape(), &[3, 2]);
    assert!(t.is_read_only());
    assert_eq!(
        t.to_vec::<f64>().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    let mut t = t;
    let other = Tensor::zeros(&[3, 2], t.dtype(), Device::cpu()).unwrap();
    assert!(t
        .copy_from(&other)
        .unwrap_err()
        .to_string()
        .contains("read-only"));
    assert_eq!(PRODUCER_DELETES.load(Ordering::SeqCst), before);
    drop(t);
    assert_eq!(PRODUCER_DELETES.load(Ordering::SeqCst), before + 1);
    // A version kiln cannot read is refused, and the deleter still runs once.
    // SAFETY: as above.
    let e = unsafe { Tensor::from_dlpack(produce(2)) }.unwrap_err();
    assert!(
        e.to_string().contains("version 2.0 is not supported"),
        "{e}"
    );
    assert_eq!(PRODUCER_DELETES.load(Ordering::SeqCst), before + 2);
    // SAFETY: NULL is accepted and refused.
    assert!(unsafe { Tensor::from_dlpack(std::ptr::null_mut()) }.is_err());
}

#[test]
fn dlpack_export_round_trips_and_frees_the_memory_once() {
    let api = device_api::get(DeviceType::CPU).unwrap();
    let before = api.memory_stats(Device::cpu()).unwrap().allocations;
    let t = Tensor::from_slice(&[7i32, 8, 9], &[3], Device::cpu()).unwrap();
    let data = t.data_ptr();
    let m = t.to_dlpack();
    // SAFETY: `m` is a valid export.
    unsafe {
        assert_eq!((*m).version, ffi::DLPACK_VERSION);
        assert_eq!((*m).dl_tensor.ndim, 1);
        assert_eq!(*(*m).dl_tensor.shape, 3);
    }
    // Import it back: same memory, and dropping the import calls kiln's deleter, which frees.
    // SAFETY: ownership of `m` passes to the import.
    let back = unsafe { Tensor::from_dlpack(m) }.unwrap();
    assert_eq!(back.data_ptr(), data);
    assert_eq!(back.to_vec::<i32>().unwrap(), vec![7, 8, 9]);
    drop(back);
    // Other tests allocate concurrently, so look for our pointer instead of counting.
    let e = api.free_data_space(Device::cpu(), data).unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::DoubleFree { .. } | DeviceError::UnknownPointer { .. }
        ),
        "{e}"
    );
    let _ = before;
}

#[test]
fn workspace_size_classes_waste_at_most_a_quarter() {
    assert_eq!(workspace::size_class(1), (0, 4096));
    assert_eq!(workspace::size_class(4096), (0, 4096));
    assert_eq!(workspace::size_class(4097).1, 5120);
    assert_eq!(workspace::size_class(64 << 10).1, 64 << 10);
    for n in [5000usize, 70_000, 1 << 20, (1 << 20) + 1, 123_456_789] {
        let (_, c) = workspace::size_class(n);
        assert!(c >= n && (c - n) * 4 <= n, "{n} -> {c}");
    }
    let (c1, _) = workspace::size_class(1 << 20);
    let (c2, _) = workspace::size_class((1 << 20) + 1);
    assert_eq!(c2, c1 + 1);
}

#[test]
fn a_workspace_pool_reuses_blocks_in_any_order_trims_on_demand_and_counts() {
    let api = device_api::get(DeviceType::CPU).unwrap();
    let mut pool = WorkspacePool::new(api.clone(), Device::cpu());
    let ptrs: Vec<DevicePtr> = (0..8)
        .map(|i| pool.alloc(1000 * (i + 1)).unwrap())
        .collect();
    // Free in an order that is neither FIFO nor LIFO.
    for i in [3, 0, 7, 1, 6, 2, 5, 4] {
        pool.free(ptrs[i]).unwrap();
    }
    let s = pool.stats();
    assert_eq!((s.misses, s.hits, s.in_use, s.live_blocks), (8, 0, 0, 0));
    let again: Vec<DevicePtr> = (0..8)
        .map(|i| pool.alloc(1000 * (i + 1)).unwrap())
        .collect();
    assert_eq!(pool.stats().hits, 8);
    let mut a = again.clone();
    let mut b = ptrs.clone();
    a.sort();
    b.sort();
    assert_eq!(a, b, "every block was reused");
    for p in again {
        pool.free(p).unwrap();
    }
    assert!(pool.stats().cached > 0);
    let released = pool.trim();
    assert!(released > 0);
    assert_eq!(pool.stats().cached, 0);
    assert!(matches!(
        pool.free(ptrs[0]).unwrap_err(),
        DeviceError::UnknownPointer { .. }
    ));
    assert!(matches!(
        pool.alloc(0).unwrap_err(),
        DeviceError::ZeroSize { .. }
    ));
    // A cap on the cache returns blocks beyond it to the device at once.
    pool.set_max_cached(Some(8192));
    let big = pool.alloc(1 << 20).unwrap();
    pool.free(big).unwrap();
    assert_eq!(pool.stats().cached, 0);
    assert!(matches!(
        pool.alloc(usize::MAX).unwrap_err(),
        DeviceError::OutOfMemory { .. }
    ));
}

#[test]
fn thread_workspace_pools_can_be_trimmed_and_report_statistics() {
    let cpu = Device::cpu();
    let p = workspace::alloc(cpu, 10_000).unwrap();
    workspace::free(cpu, p).unwrap();
    let s = workspace::thread_stats(cpu).unwrap();
    assert!(s.cached >= 10_000);
    assert!(workspace::trim_thread_pools() >= 10_000);
    assert_eq!(workspace::thread_stats(cpu).unwrap().cached, 0);
    assert!(workspace::alloc(Device::new(DeviceType::CUDA, 0), 16).is_err());
}

#[test]
fn the_tvm_backend_workspace_entry_points_allocate_free_and_raise_errors() {
    device_api::init();
    let slots = library::context_symbols();
    let slot = |n: &str| slots.iter().find(|(k, _)| k == n).map(|(_, v)| *v);
    assert_eq!(
        slot("__TVMBackendAllocWorkspace"),
        Some(device_api::backend_alloc_workspace_ptr())
    );
    assert_eq!(
        slot("__TVMBackendFreeWorkspace"),
        Some(device_api::backend_free_workspace_ptr())
    );

    let p = device_api::backend_alloc_workspace(1, 0, 4096, 2, 32);
    assert!(!p.is_null());
    assert_eq!(p as usize % 64, 0);
    // SAFETY: a fresh 4096-byte workspace.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, 4096) };
    assert_eq!(device_api::backend_free_workspace(1, 0, p), 0);
    // Freeing it again raises an error and returns -1.
    let _ = ffi::take_raised();
    assert_eq!(device_api::backend_free_workspace(1, 0, p), -1);
    let (kind, msg) = ffi::take_raised().unwrap();
    assert_eq!(kind, "RuntimeError");
    assert!(msg.contains("workspace pool"), "{msg}");
    // Zero bytes get a page, as in TVM.
    let z = device_api::backend_alloc_workspace(1, 0, 0, 0, 8);
    assert!(!z.is_null());
    assert_eq!(device_api::backend_free_workspace(1, 0, z), 0);
    // An unknown device or an impossible size: NULL and a raised error.
    assert!(device_api::backend_alloc_workspace(10, 0, 64, 2, 32).is_null());
    assert!(ffi::take_raised().unwrap().1.contains("no backend"));
    assert!(device_api::backend_alloc_workspace(1, 0, u64::MAX, 2, 32).is_null());
    assert_eq!(ffi::take_raised().unwrap().0, "MemoryError");
}
