//! The device conformance suite, shared by the test binaries that instantiate it: every test
//! body is written once over `&dyn DeviceApi` and one of its devices, and
//! `conformance_suite!(name, || (api, device))` instantiates all of them for a backend (as a
//! module `name` of `#[test]`s). `tests/device_conformance.rs` runs it on every backend of a
//! plain process; a backend that needs a process of its own (the CUDA backend over its mock
//! driver, `tests/device_cuda.rs`) instantiates it in its own test binary, with
//! `#[macro_use] mod conformance;`.
//!
//! The bodies synchronize before reading results, so they hold for asynchronous backends too.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use kiln::device_api::{AttrKind, Device, DeviceApi, DeviceError, DevicePtr, StreamHandle, Tensor};
use kiln::packed_func::ffi::{DLDataType, DLDataTypeCode, DLTensor};

const U8: DLDataType = DLDataType {
    code: DLDataTypeCode::UINT,
    bits: 8,
    lanes: 1,
};
const F32: DLDataType = DLDataType {
    code: DLDataTypeCode::FLOAT,
    bits: 32,
    lanes: 1,
};
const S: StreamHandle = StreamHandle::DEFAULT;

pub fn dl(data: *mut u8, dev: Device, shape: &mut [i64], dtype: DLDataType) -> DLTensor {
    DLTensor {
        data: data.cast(),
        device: dev.to_dl(),
        ndim: shape.len() as i32,
        dtype,
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

/// Copies `bytes` to a fresh allocation on `dev` and returns it.
pub fn upload(api: &dyn DeviceApi, dev: Device, bytes: &mut [u8]) -> DevicePtr {
    let p = api.alloc_data_space(dev, bytes.len(), 64, U8).unwrap();
    let mut shape = [bytes.len() as i64];
    let src = dl(bytes.as_mut_ptr(), Device::cpu(), &mut shape, U8);
    let dst = dl(p.as_raw().cast(), dev, &mut shape, U8);
    // SAFETY: `src` is `bytes`, `dst` a fresh allocation of the same size; synchronized below.
    unsafe { api.copy_data_from_to(&src, &dst, S).unwrap() };
    api.sync_stream(dev, S).unwrap();
    p
}

/// Reads `n` bytes at `p + offset` on `dev`.
pub fn download(api: &dyn DeviceApi, dev: Device, p: DevicePtr, offset: u64, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let mut shape = [n as i64];
    let mut src = dl(p.as_raw().cast(), dev, &mut shape, U8);
    src.byte_offset = offset;
    let dst = dl(out.as_mut_ptr(), Device::cpu(), &mut shape, U8);
    // SAFETY: `dst` is `out`; `src` lies inside a live allocation; synchronized below.
    unsafe { api.copy_data_from_to(&src, &dst, S).unwrap() };
    api.sync_stream(dev, S).unwrap();
    out
}

pub mod suite {
    use super::*;

    pub fn device_exists_and_out_of_range_ids_do_not(api: &dyn DeviceApi, dev: Device) {
        assert!(api.device_count().unwrap() > dev.device_id as usize);
        let exist = api.attr(dev, AttrKind::EXIST).unwrap().unwrap();
        assert_eq!(exist.as_int(), Some(1));
        let missing = Device::new(dev.device_type, 1000);
        let exist = api.attr(missing, AttrKind::EXIST).unwrap().unwrap();
        assert_eq!(exist.as_int(), Some(0));
    }

    pub fn every_attribute_kind_answers_without_error(api: &dyn DeviceApi, dev: Device) {
        assert_eq!(AttrKind::all().count(), 17);
        for kind in AttrKind::all() {
            api.attr(dev, kind)
                .unwrap_or_else(|e| panic!("attribute {kind}: {e}"));
        }
        assert_eq!(api.attr(dev, AttrKind(99)).unwrap(), None);
    }

    pub fn allocated_memory_round_trips_bytes(api: &dyn DeviceApi, dev: Device) {
        let mut bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let p = upload(api, dev, &mut bytes);
        assert_eq!(download(api, dev, p, 0, 1000), bytes);
        api.free_data_space(dev, p).unwrap();
    }

    pub fn allocations_honour_the_requested_alignment(api: &dyn DeviceApi, dev: Device) {
        for align in [1usize, 64, 128, 256, 4096] {
            let p = api.alloc_data_space(dev, 100, align, U8).unwrap();
            // Handles (OpenCL's cl_mem) are not addresses: the driver aligns the memory.
            if !api.pointers_are_handles() {
                assert_eq!(p.0 % align.max(64), 0, "align {align}: {p}");
            }
            api.free_data_space(dev, p).unwrap();
        }
    }

    pub fn zero_size_allocation_is_an_error(api: &dyn DeviceApi, dev: Device) {
        let e = api.alloc_data_space(dev, 0, 64, U8).unwrap_err();
        assert!(matches!(e, DeviceError::ZeroSize { .. }), "{e}");
    }

    pub fn alignment_that_is_not_a_power_of_two_is_an_error(api: &dyn DeviceApi, dev: Device) {
        for align in [0usize, 3, 48, 100] {
            let e = api.alloc_data_space(dev, 64, align, U8).unwrap_err();
            assert!(matches!(e, DeviceError::BadAlignment { .. }), "{e}");
            assert!(e.to_string().contains(&format!("alignment {align}")), "{e}");
        }
    }

    pub fn impossible_allocation_is_out_of_memory_not_an_abort(api: &dyn DeviceApi, dev: Device) {
        for n in [usize::MAX, 1usize << 62, 1usize << 50] {
            let e = api.alloc_data_space(dev, n, 64, U8).unwrap_err();
            assert!(matches!(e, DeviceError::OutOfMemory { .. }), "{e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("allocating {n} bytes (align 64) on {dev} failed")),
                "{e}"
            );
        }
    }

    pub fn double_free_is_an_error(api: &dyn DeviceApi, dev: Device) {
        let p = api.alloc_data_space(dev, 256, 64, U8).unwrap();
        api.free_data_space(dev, p).unwrap();
        let e = api.free_data_space(dev, p).unwrap_err();
        assert!(matches!(e, DeviceError::DoubleFree { .. }), "{e}");
    }

    pub fn freeing_a_pointer_the_backend_never_gave_out_is_an_error(
        api: &dyn DeviceApi,
        dev: Device,
    ) {
        let e = api
            .free_data_space(dev, DevicePtr(0x1234_5640))
            .unwrap_err();
        assert!(matches!(e, DeviceError::UnknownPointer { .. }), "{e}");
        let e = api.free_data_space(dev, DevicePtr::NULL).unwrap_err();
        assert!(matches!(e, DeviceError::UnknownPointer { .. }), "{e}");
    }

    pub fn a_device_id_out_of_range_is_an_error(api: &dyn DeviceApi, dev: Device) {
        let bad = Device::new(dev.device_type, 1000);
        let e = api.alloc_data_space(bad, 64, 64, U8).unwrap_err();
        assert!(matches!(e, DeviceError::InvalidDevice { .. }), "{e}");
        assert!(api.create_stream(bad).is_err());
        assert!(api.set_device(bad).is_err());
    }

    pub fn copies_honour_byte_offsets_on_both_sides(api: &dyn DeviceApi, dev: Device) {
        let mut bytes: Vec<u8> = (0..64u8).collect();
        let p = upload(api, dev, &mut bytes);
        // Device [8..24) -> device [40..56) of a second buffer.
        let q = api.alloc_data_space(dev, 64, 64, U8).unwrap();
        api.memset(dev, q, 0, 0xee, 64, S).unwrap();
        let mut shape = [16i64];
        let mut src = dl(p.as_raw().cast(), dev, &mut shape, U8);
        src.byte_offset = 8;
        let mut dst = dl(q.as_raw().cast(), dev, &mut shape, U8);
        dst.byte_offset = 40;
        // SAFETY: both ranges lie inside live allocations; synchronized below.
        unsafe { api.copy_data_from_to(&src, &dst, S).unwrap() };
        api.sync_stream(dev, S).unwrap();
        let got = download(api, dev, q, 0, 64);
        assert_eq!(&got[40..56], &bytes[8..24]);
        assert!(got[..40].iter().all(|&b| b == 0xee));
        assert!(got[56..].iter().all(|&b| b == 0xee));
        // And a host-side offset.
        let mut host = vec![0u8; 32];
        let mut shape4 = [4i64];
        let mut src = dl(p.as_raw().cast(), dev, &mut shape4, U8);
        src.byte_offset = 60;
        let mut hdst = dl(host.as_mut_ptr(), Device::cpu(), &mut shape4, U8);
        hdst.byte_offset = 10;
        // SAFETY: in bounds on both sides; synchronized below.
        unsafe { api.copy_data_from_to(&src, &hdst, S).unwrap() };
        api.sync_stream(dev, S).unwrap();
        assert_eq!(&host[10..14], &[60, 61, 62, 63]);
        api.free_data_space(dev, p).unwrap();
        api.free_data_space(dev, q).unwrap();
    }

    pub fn copies_between_mismatched_shapes_dtypes_or_sizes_are_errors(
        api: &dyn DeviceApi,
        dev: Device,
    ) {
        let p = api.alloc_data_space(dev, 64, 64, U8).unwrap();
        let mut host = vec![0u8; 64];
        let (mut s1, mut s2, mut s3) = ([4i64, 4], [16i64], [8i64, 8]);
        let a = dl(p.as_raw().cast(), dev, &mut s1, F32);
        let b = dl(host.as_mut_ptr(), Device::cpu(), &mut s2, F32);
        // SAFETY: rejected before any memory is touched.
        let e = unsafe { api.copy_data_from_to(&a, &b, S) }.unwrap_err();
        assert!(matches!(e, DeviceError::CopyMismatch { .. }), "{e}");
        assert!(e.to_string().contains("shapes differ"), "{e}");
        let c = dl(host.as_mut_ptr(), Device::cpu(), &mut s3, U8);
        // SAFETY: rejected before any memory is touched.
        let e = unsafe { api.copy_data_from_to(&a, &c, S) }.unwrap_err();
        assert!(e.to_string().contains("dtypes differ"), "{e}");
        api.free_data_space(dev, p).unwrap();
    }

    pub fn strided_host_tensors_copy_to_and_from_the_device(api: &dyn DeviceApi, dev: Device) {
        // A 3x4 f32 matrix on the host, read through a transposed (4x3, strides [1, 4]) view.
        let mut m: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let p = api.alloc_data_space(dev, 48, 64, F32).unwrap();
        let mut shape = [4i64, 3];
        let mut strides = [1i64, 4];
        let mut src = dl(m.as_mut_ptr().cast(), Device::cpu(), &mut shape, F32);
        src.strides = strides.as_mut_ptr();
        let dst = dl(p.as_raw().cast(), dev, &mut shape, F32);
        // SAFETY: the view addresses elements 0..12 of `m`; `p` holds 48 bytes; synced below.
        unsafe { api.copy_data_from_to(&src, &dst, S).unwrap() };
        api.sync_stream(dev, S).unwrap();
        let got = download(api, dev, p, 0, 48);
        let got: Vec<f32> = got
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]);
        // Back into a strided host view: the transpose of the transpose.
        let mut back = vec![0f32; 12];
        let mut bshape = [4i64, 3];
        let mut bstrides = [1i64, 4];
        let mut bdst = dl(back.as_mut_ptr().cast(), Device::cpu(), &mut bshape, F32);
        bdst.strides = bstrides.as_mut_ptr();
        // SAFETY: as above.
        unsafe { api.copy_data_from_to(&dst, &bdst, S).unwrap() };
        api.sync_stream(dev, S).unwrap();
        assert_eq!(back, m);
        api.free_data_space(dev, p).unwrap();
    }

    pub fn memset_fills_bytes_and_rejects_ranges_outside_allocations(
        api: &dyn DeviceApi,
        dev: Device,
    ) {
        let p = api.alloc_data_space(dev, 128, 64, U8).unwrap();
        api.memset(dev, p, 0, 1, 128, S).unwrap();
        api.memset(dev, p, 32, 7, 16, S).unwrap();
        api.sync_stream(dev, S).unwrap();
        let got = download(api, dev, p, 0, 128);
        assert!(got[..32].iter().all(|&b| b == 1));
        assert!(got[32..48].iter().all(|&b| b == 7));
        assert!(got[48..].iter().all(|&b| b == 1));
        let e = api.memset(dev, p, 100, 0, 64, S).unwrap_err();
        assert!(matches!(e, DeviceError::OutOfBounds { .. }), "{e}");
        api.free_data_space(dev, p).unwrap();
        let e = api.memset(dev, p, 0, 0, 8, S).unwrap_err();
        assert!(matches!(e, DeviceError::OutOfBounds { .. }), "{e}");
    }

    pub fn memory_statistics_track_bytes_in_use_and_the_peak(api: &dyn DeviceApi, dev: Device) {
        let before = api.memory_stats(dev).unwrap();
        let p = api.alloc_data_space(dev, 1 << 20, 64, U8).unwrap();
        let during = api.memory_stats(dev).unwrap();
        assert!(during.in_use >= before.in_use + (1 << 20) || during.in_use >= 1 << 20);
        assert!(during.peak >= during.in_use);
        assert!(during.allocations >= 1);
        api.free_data_space(dev, p).unwrap();
        let after = api.memory_stats(dev).unwrap();
        assert!(after.peak >= 1 << 20);
        if let (Some(t), Some(f)) = (after.total, after.free) {
            assert!(t >= f && t > 0);
        }
    }

    pub fn streams_sync_query_and_free_and_a_freed_stream_is_an_error(
        api: &dyn DeviceApi,
        dev: Device,
    ) {
        let s = api.create_stream(dev).unwrap();
        assert!(!s.is_default());
        api.sync_stream(dev, s).unwrap();
        assert!(api.query_stream(dev, s).unwrap());
        api.free_stream(dev, s).unwrap();
        for e in [
            api.sync_stream(dev, s).unwrap_err(),
            api.query_stream(dev, s).map(|_| ()).unwrap_err(),
            api.free_stream(dev, s).unwrap_err(),
            api.set_current_stream(dev, s).map(|_| ()).unwrap_err(),
            api.add_callback(dev, s, Box::new(|| panic!("ran on a freed stream")))
                .unwrap_err(),
        ] {
            assert!(matches!(e, DeviceError::InvalidStream { .. }), "{e}");
        }
        // A new stream in the same slot does not revive the old handle.
        let s2 = api.create_stream(dev).unwrap();
        assert_ne!(s, s2);
        assert!(api.sync_stream(dev, s).is_err());
        api.free_stream(dev, s2).unwrap();
        // The default stream is always there and cannot be freed.
        api.sync_stream(dev, S).unwrap();
        assert!(api.free_stream(dev, S).is_err());
    }

    pub fn the_current_stream_is_per_thread_and_per_device(api: &dyn DeviceApi, dev: Device) {
        let s = api.create_stream(dev).unwrap();
        assert_eq!(api.current_stream(dev), S);
        assert_eq!(api.set_current_stream(dev, s).unwrap(), S);
        assert_eq!(api.current_stream(dev), s);
        std::thread::scope(|sc| {
            sc.spawn(|| assert_eq!(api.current_stream(dev), S));
        });
        // Freeing the current stream resets it to the default.
        api.free_stream(dev, s).unwrap();
        assert_eq!(api.current_stream(dev), S);
    }

    pub fn the_current_device_is_per_thread(api: &dyn DeviceApi, dev: Device) {
        api.set_device(dev).unwrap();
        assert_eq!(api.current_device(), dev);
        std::thread::scope(|sc| {
            sc.spawn(|| assert_eq!(api.current_device().device_id, 0));
        });
    }

    pub fn host_callbacks_run_once_in_stream_order(api: &dyn DeviceApi, dev: Device) {
        let s = api.create_stream(dev).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut bytes = vec![9u8; 16];
        let p = api.alloc_data_space(dev, 16, 64, U8).unwrap();
        let mut shape = [16i64];
        let src = dl(bytes.as_mut_ptr(), Device::cpu(), &mut shape, U8);
        let dst = dl(p.as_raw().cast(), dev, &mut shape, U8);
        for i in 0..3 {
            let l = log.clone();
            api.add_callback(dev, s, Box::new(move || l.lock().unwrap().push(i)))
                .unwrap();
        }
        // SAFETY: in bounds; synchronized below before `bytes` drops.
        unsafe { api.copy_data_from_to(&src, &dst, s).unwrap() };
        let l = log.clone();
        api.add_callback(dev, s, Box::new(move || l.lock().unwrap().push(3)))
            .unwrap();
        // A panicking callback is contained.
        api.add_callback(dev, s, Box::new(|| panic!("callback panic (expected)")))
            .unwrap();
        api.sync_stream(dev, s).unwrap();
        assert_eq!(*log.lock().unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(download(api, dev, p, 0, 16), bytes);
        api.free_stream(dev, s).unwrap();
        api.free_data_space(dev, p).unwrap();
    }

    pub fn events_record_query_synchronize_and_order_streams(api: &dyn DeviceApi, dev: Device) {
        let (s1, s2) = (
            api.create_stream(dev).unwrap(),
            api.create_stream(dev).unwrap(),
        );
        let e = api.create_event(dev).unwrap();
        assert!(
            api.query_event(dev, e).unwrap(),
            "a never-recorded event is complete"
        );
        api.record_event(dev, s1, e).unwrap();
        api.stream_wait_event(dev, s2, e).unwrap();
        api.sync_event(dev, e).unwrap();
        assert!(api.query_event(dev, e).unwrap());
        api.sync_stream_from_to(dev, s1, s2).unwrap();
        api.sync_stream(dev, s2).unwrap();
        api.destroy_event(dev, e).unwrap();
        for err in [
            api.record_event(dev, s1, e).unwrap_err(),
            api.query_event(dev, e).map(|_| ()).unwrap_err(),
            api.sync_event(dev, e).unwrap_err(),
            api.stream_wait_event(dev, s2, e).unwrap_err(),
            api.destroy_event(dev, e).unwrap_err(),
        ] {
            assert!(matches!(err, DeviceError::InvalidEvent { .. }), "{err}");
        }
        api.free_stream(dev, s1).unwrap();
        let err = api.sync_stream_from_to(dev, s1, s2).unwrap_err();
        assert!(matches!(err, DeviceError::InvalidStream { .. }), "{err}");
        api.free_stream(dev, s2).unwrap();
    }

    pub fn the_last_error_is_the_message_of_the_last_failed_call(api: &dyn DeviceApi, dev: Device) {
        api.clear_last_error();
        assert_eq!(api.last_error(), None);
        let e = api.alloc_data_space(dev, 0, 64, U8).unwrap_err();
        assert_eq!(api.last_error(), Some(e.to_string()));
        std::thread::scope(|sc| {
            sc.spawn(|| assert_eq!(api.last_error(), None, "per thread"));
        });
        api.clear_last_error();
        assert_eq!(api.last_error(), None);
    }

    pub fn workspaces_are_reused_and_bad_frees_are_errors(api: &dyn DeviceApi, dev: Device) {
        let a = api.alloc_workspace(dev, 64 << 10, U8).unwrap();
        if !api.pointers_are_handles() {
            assert_eq!(a.0 % 64, 0);
        }
        api.free_workspace(dev, a).unwrap();
        let b = api.alloc_workspace(dev, 60 << 10, U8).unwrap();
        assert_eq!(a, b, "a freed workspace of the same size class is reused");
        let c = api.alloc_workspace(dev, 100, U8).unwrap();
        // Any free order.
        api.free_workspace(dev, b).unwrap();
        api.free_workspace(dev, c).unwrap();
        let e = api.free_workspace(dev, c).unwrap_err();
        assert!(
            matches!(
                e,
                DeviceError::UnknownPointer { .. } | DeviceError::DoubleFree { .. }
            ),
            "{e}"
        );
        // A workspace belongs to the thread that allocated it.
        let d = api.alloc_workspace(dev, 128, U8).unwrap();
        std::thread::scope(|sc| {
            sc.spawn(|| assert!(api.free_workspace(dev, d).is_err()));
        });
        api.free_workspace(dev, d).unwrap();
    }

    pub fn tensors_round_trip_through_the_device(api: &dyn DeviceApi, dev: Device) {
        let _ = api;
        let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.5).collect();
        let t = Tensor::from_slice(&data, &[2, 3, 4], dev).unwrap();
        assert_eq!(t.device(), dev);
        assert_eq!(t.to_vec::<f32>().unwrap(), data);
        let on_cpu = t.copy_to(Device::cpu()).unwrap();
        let mut back = Tensor::zeros(&[2, 3, 4], t.dtype(), dev).unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), vec![0.0; 24]);
        back.copy_from(&on_cpu).unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), data);
        assert!(matches!(
            t.to_vec::<i32>().unwrap_err(),
            DeviceError::DtypeMismatch { .. }
        ));
    }
}

/// What a `conformance_suite!` constructor returns: a backend and a device, or `None` when the
/// backend has no device here (the tests then return after the constructor said why).
pub trait Backend {
    /// The backend and device, or `None` to skip.
    fn get(self) -> Option<(Arc<dyn DeviceApi>, Device)>;
}

impl Backend for (Arc<dyn DeviceApi>, Device) {
    fn get(self) -> Option<(Arc<dyn DeviceApi>, Device)> {
        Some(self)
    }
}

impl Backend for Option<(Arc<dyn DeviceApi>, Device)> {
    fn get(self) -> Option<(Arc<dyn DeviceApi>, Device)> {
        self
    }
}

macro_rules! conformance_suite {
    ($backend:ident, $make:expr) => {
        conformance_suite!(@tests $backend, $make;
            device_exists_and_out_of_range_ids_do_not,
            every_attribute_kind_answers_without_error,
            allocated_memory_round_trips_bytes,
            allocations_honour_the_requested_alignment,
            zero_size_allocation_is_an_error,
            alignment_that_is_not_a_power_of_two_is_an_error,
            impossible_allocation_is_out_of_memory_not_an_abort,
            double_free_is_an_error,
            freeing_a_pointer_the_backend_never_gave_out_is_an_error,
            a_device_id_out_of_range_is_an_error,
            copies_honour_byte_offsets_on_both_sides,
            copies_between_mismatched_shapes_dtypes_or_sizes_are_errors,
            strided_host_tensors_copy_to_and_from_the_device,
            memset_fills_bytes_and_rejects_ranges_outside_allocations,
            memory_statistics_track_bytes_in_use_and_the_peak,
            streams_sync_query_and_free_and_a_freed_stream_is_an_error,
            the_current_stream_is_per_thread_and_per_device,
            the_current_device_is_per_thread,
            host_callbacks_run_once_in_stream_order,
            events_record_query_synchronize_and_order_streams,
            the_last_error_is_the_message_of_the_last_failed_call,
            workspaces_are_reused_and_bad_frees_are_errors,
            tensors_round_trip_through_the_device
        );
    };
    (@tests $backend:ident, $make:expr; $($test:ident),* $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $test() {
                    let Some((api, dev)) = crate::conformance::Backend::get(($make)()) else {
                        return;
                    };
                    crate::conformance::suite::$test(&*api, dev);
                }
            )*
        }
    };
}
