//! The OpenCL backend on a real driver (PoCL on CI): attributes, checked pointers and ranges,
//! allocation limits, streams and events, event timing, and `OpenClProgram` launches. Every test
//! skips visibly without an OpenCL device, and fails instead under `KILN_REQUIRE_OPENCL=1`.

mod common;

use std::sync::Arc;

use kiln::device_api::opencl::{KernelArg, OpenClProgram};
use kiln::device_api::{
    self, AttrKind, Device, DeviceApi, DeviceError, DevicePtr, OpenClDeviceApi, StreamHandle,
};
use kiln::packed_func::ffi::{DLDataType, DLDataTypeCode, DLTensor};

const U8: DLDataType = DLDataType {
    code: DLDataTypeCode::UINT,
    bits: 8,
    lanes: 1,
};
const S: StreamHandle = StreamHandle::DEFAULT;

const ADD1: &str = "__kernel void add1(__global float* a, int n) {
    int i = get_global_id(0);
    if (i < n) a[i] += 1.0f;
}
__kernel void scale(__global float* a, float f, int n) {
    int i = get_global_id(0);
    if (i < n) a[i] *= f;
}";

fn device(test: &str) -> Option<(Arc<OpenClDeviceApi>, Device)> {
    common::opencl_device(test)
}

fn dl(data: *mut u8, dev: Device, shape: &mut [i64]) -> DLTensor {
    DLTensor {
        data: data.cast(),
        device: dev.to_dl(),
        ndim: shape.len() as i32,
        dtype: U8,
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

fn upload_f32(api: &OpenClDeviceApi, dev: Device, v: &[f32], s: StreamHandle) -> DevicePtr {
    let mut bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let p = api.alloc_data_space(dev, bytes.len(), 64, U8).unwrap();
    let mut shape = [bytes.len() as i64];
    let src = dl(bytes.as_mut_ptr(), Device::cpu(), &mut shape);
    let dst = dl(p.as_raw().cast(), dev, &mut shape);
    // SAFETY: `bytes` outlives the copy (synchronized below); `p` holds the same size.
    unsafe { api.copy_data_from_to(&src, &dst, s).unwrap() };
    api.sync_stream(dev, s).unwrap();
    p
}

fn download_f32(api: &OpenClDeviceApi, dev: Device, p: DevicePtr, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 4];
    let mut shape = [bytes.len() as i64];
    let src = dl(p.as_raw().cast(), dev, &mut shape);
    let dst = dl(bytes.as_mut_ptr(), Device::cpu(), &mut shape);
    // SAFETY: in bounds; synchronized below.
    unsafe { api.copy_data_from_to(&src, &dst, S).unwrap() };
    api.sync_stream(dev, S).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn int_arg(v: i32) -> KernelArg {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&v.to_ne_bytes());
    KernelArg::Scalar { bytes, size: 4 }
}

fn f32_arg(v: f32) -> KernelArg {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&v.to_ne_bytes());
    KernelArg::Scalar { bytes, size: 4 }
}

#[test]
fn the_registry_and_the_global_function_serve_opencl() {
    let api = device_api::get_by_name("opencl").unwrap();
    assert_eq!(api.device_type().0, 4);
    assert_eq!(api.name(), "opencl");
    let f = kiln::packed_func::registry::require("device_api.opencl").unwrap();
    assert_eq!(f.call_typed::<_, i64>(()).unwrap(), 4);
}

#[test]
fn attributes_come_from_the_driver() {
    let Some((api, dev)) = device("attributes_come_from_the_driver") else {
        return;
    };
    let attr = |k| api.attr(dev, k).unwrap();
    let name = attr(AttrKind::DEVICE_NAME).unwrap();
    assert!(!name.as_str().unwrap().is_empty());
    for k in [
        AttrKind::MAX_THREADS_PER_BLOCK,
        AttrKind::WARP_SIZE,
        AttrKind::MAX_SHARED_MEMORY_PER_BLOCK,
        AttrKind::MAX_CLOCK_RATE,
        AttrKind::MULTI_PROCESSOR_COUNT,
        AttrKind::TOTAL_GLOBAL_MEMORY,
    ] {
        let v = attr(k).unwrap_or_else(|| panic!("{k} is unanswered"));
        assert!(v.as_int().unwrap() > 0, "{k} = {v}");
    }
    let version = attr(AttrKind::COMPUTE_VERSION).unwrap();
    let version = version.as_str().unwrap();
    assert!(
        version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "{version}"
    );
    let dims = attr(AttrKind::MAX_THREAD_DIMENSIONS).unwrap();
    let dims = dims.as_str().unwrap();
    assert!(dims.starts_with('[') && dims.ends_with(']'), "{dims}");
    assert!(!attr(AttrKind::DRIVER_VERSION)
        .unwrap()
        .as_str()
        .unwrap()
        .is_empty());
    assert!(!api.platform_name(dev).unwrap().is_empty());
    assert_eq!(attr(AttrKind::EXIST).unwrap().as_int(), Some(1));
}

#[test]
fn foreign_and_freed_pointers_are_errors_not_crashes() {
    let Some((api, dev)) = device("foreign_and_freed_pointers_are_errors_not_crashes") else {
        return;
    };
    let foreign = DevicePtr(0xdead_0000);
    let e = api.free_data_space(dev, foreign).unwrap_err();
    assert!(matches!(e, DeviceError::UnknownPointer { .. }), "{e}");
    let e = api.memset(dev, foreign, 0, 0, 8, S).unwrap_err();
    assert!(matches!(e, DeviceError::OutOfBounds { .. }), "{e}");
    let p = api.alloc_data_space(dev, 64, 64, U8).unwrap();
    api.free_data_space(dev, p).unwrap();
    let e = api.free_data_space(dev, p).unwrap_err();
    assert!(matches!(e, DeviceError::DoubleFree { .. }), "{e}");
    let mut host = vec![0u8; 8];
    let mut shape = [8i64];
    let src = dl(p.as_raw().cast(), dev, &mut shape);
    let dst = dl(host.as_mut_ptr(), Device::cpu(), &mut shape);
    // SAFETY: refused before the driver sees the freed handle.
    let e = unsafe { api.copy_data_from_to(&src, &dst, S) }.unwrap_err();
    assert!(
        e.to_string().contains("not inside a live allocation"),
        "{e}"
    );
}

#[test]
fn a_copy_out_of_bounds_names_both_sizes() {
    let Some((api, dev)) = device("a_copy_out_of_bounds_names_both_sizes") else {
        return;
    };
    let p = api.alloc_data_space(dev, 128, 64, U8).unwrap();
    let mut host = vec![0u8; 200];
    let mut shape = [200i64];
    let src = dl(host.as_mut_ptr(), Device::cpu(), &mut shape);
    let dst = dl(p.as_raw().cast(), dev, &mut shape);
    // SAFETY: refused before any memory is touched.
    let e = unsafe { api.copy_data_from_to(&src, &dst, S) }.unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::OutOfBounds {
                allocation: Some(128),
                nbytes: 200,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("+200") && msg.contains("128 bytes"), "{msg}");
    // An offset that pushes a small copy past the end.
    let mut shape = [16i64];
    let mut src = dl(p.as_raw().cast(), dev, &mut shape);
    src.byte_offset = 120;
    let dst = dl(host.as_mut_ptr(), Device::cpu(), &mut shape);
    // SAFETY: as above.
    let e = unsafe { api.copy_data_from_to(&src, &dst, S) }.unwrap_err();
    assert!(e.to_string().contains("+ 120, +16)"), "{e}");
    assert_eq!(api.last_error(), Some(e.to_string()));
    api.free_data_space(dev, p).unwrap();
}

#[test]
fn an_allocation_over_the_max_alloc_size_is_out_of_memory_and_the_next_one_works() {
    let Some((api, dev)) = device("an_allocation_over_the_max_alloc_size") else {
        return;
    };
    let max = api.max_alloc_size(dev).unwrap();
    assert!(max > 0);
    let n = usize::try_from(max + 1).unwrap();
    let e = api.alloc_data_space(dev, n, 64, U8).unwrap_err();
    assert!(matches!(e, DeviceError::OutOfMemory { .. }), "{e}");
    assert!(
        e.to_string().contains("CL_DEVICE_MAX_MEM_ALLOC_SIZE"),
        "{e}"
    );
    let p = api.alloc_data_space(dev, 1024, 64, U8).unwrap();
    api.memset(dev, p, 0, 3, 1024, S).unwrap();
    api.sync_stream(dev, S).unwrap();
    api.free_data_space(dev, p).unwrap();
}

#[test]
fn an_event_recorded_on_one_stream_orders_work_on_another() {
    let Some((api, dev)) = device("an_event_recorded_on_one_stream_orders_work_on_another") else {
        return;
    };
    let n = 16 << 20;
    let (s1, s2) = (
        api.create_stream(dev).unwrap(),
        api.create_stream(dev).unwrap(),
    );
    let a = api.alloc_data_space(dev, n, 64, U8).unwrap();
    let b = api.alloc_data_space(dev, n, 64, U8).unwrap();
    api.memset(dev, b, 0, 0, n, S).unwrap();
    api.sync_stream(dev, S).unwrap();
    let e = api.create_event(dev).unwrap();
    api.memset(dev, a, 0, 7, n, s1).unwrap();
    api.record_event(dev, s1, e).unwrap();
    api.stream_wait_event(dev, s2, e).unwrap();
    let mut shape = [n as i64];
    let src = dl(a.as_raw().cast(), dev, &mut shape);
    let dst = dl(b.as_raw().cast(), dev, &mut shape);
    // SAFETY: both live, same size; synchronized below.
    unsafe { api.copy_data_from_to(&src, &dst, s2).unwrap() };
    api.sync_stream(dev, s2).unwrap();
    assert!(api.query_event(dev, e).unwrap());
    assert!(api.query_stream(dev, s1).unwrap());
    let mut host = vec![0u8; n];
    let hdst = dl(host.as_mut_ptr(), Device::cpu(), &mut shape);
    // SAFETY: in bounds; synchronized below.
    unsafe { api.copy_data_from_to(&dst, &hdst, S).unwrap() };
    api.sync_stream(dev, S).unwrap();
    assert!(host.iter().all(|&x| x == 7));
    api.destroy_event(dev, e).unwrap();
    for s in [s1, s2] {
        api.free_stream(dev, s).unwrap();
    }
    api.free_data_space(dev, a).unwrap();
    api.free_data_space(dev, b).unwrap();
}

#[test]
fn event_elapsed_measures_the_work_between_two_events() {
    let Some((api, dev)) = device("event_elapsed_measures_the_work_between_two_events") else {
        return;
    };
    let n = 32 << 20;
    let s = api.create_stream(dev).unwrap();
    let p = api.alloc_data_space(dev, n, 64, U8).unwrap();
    let (e0, e1) = (
        api.create_event(dev).unwrap(),
        api.create_event(dev).unwrap(),
    );
    let e = api.event_elapsed(dev, e0, e1).unwrap_err();
    assert!(e.to_string().contains("never recorded"), "{e}");
    api.record_event(dev, s, e0).unwrap();
    for v in 0..4 {
        api.memset(dev, p, 0, v, n, s).unwrap();
    }
    api.record_event(dev, s, e1).unwrap();
    let t = api.event_elapsed(dev, e0, e1).unwrap();
    assert!(t > std::time::Duration::ZERO, "{t:?}");
    api.destroy_event(dev, e0).unwrap();
    let e = api.event_elapsed(dev, e0, e1).unwrap_err();
    assert!(matches!(e, DeviceError::InvalidEvent { .. }), "{e}");
    api.destroy_event(dev, e1).unwrap();
    api.free_stream(dev, s).unwrap();
    api.free_data_space(dev, p).unwrap();
}

#[test]
fn a_kernel_launched_on_the_current_stream_computes_after_sync() {
    let Some((api, dev)) = device("a_kernel_launched_on_the_current_stream_computes_after_sync")
    else {
        return;
    };
    let n = 1000usize;
    let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let s = api.create_stream(dev).unwrap();
    let p = upload_f32(&api, dev, &v, S);
    let prog = OpenClProgram::new(ADD1.to_owned());
    assert_eq!(prog.source(), ADD1);
    prog.build(0).unwrap();
    let prev = api.set_current_stream(dev, s).unwrap();
    let buf = KernelArg::Buffer {
        ptr: p,
        min_bytes: (n * 4) as u64,
    };
    // 1000 work-items rounded up to groups of 64; the kernel guards i < n.
    let global = [n.div_ceil(64) * 64, 1, 1];
    prog.launch(0, "add1", &[buf, int_arg(n as i32)], global, [64, 1, 1])
        .unwrap();
    prog.launch(
        0,
        "scale",
        &[buf, f32_arg(2.0), int_arg(n as i32)],
        global,
        [64, 1, 1],
    )
    .unwrap();
    api.sync_stream(dev, s).unwrap();
    api.set_current_stream(dev, prev).unwrap();
    let got = download_f32(&api, dev, p, n);
    let want: Vec<f32> = v.iter().map(|x| (x + 1.0) * 2.0).collect();
    assert_eq!(got, want);
    // A zero extent launches nothing.
    prog.launch(0, "add1", &[buf, int_arg(n as i32)], [0, 1, 1], [64, 1, 1])
        .unwrap();
    api.free_stream(dev, s).unwrap();
    api.free_data_space(dev, p).unwrap();
}

#[test]
fn a_build_failure_carries_the_build_log_and_is_cached() {
    let Some((api, _dev)) = device("a_build_failure_carries_the_build_log_and_is_cached") else {
        return;
    };
    let prog = OpenClProgram::new(
        "__kernel void broken(__global float* a) { a[0] = undeclared_thing; }".to_owned(),
    );
    let e = prog.build(0).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("build log"), "{msg}");
    assert!(msg.contains("undeclared_thing"), "{msg}");
    assert!(msg.contains("CL_BUILD_PROGRAM_FAILURE"), "{msg}");
    assert_eq!(api.last_error(), Some(msg.clone()));
    let t = std::time::Instant::now();
    let e2 = prog
        .launch(0, "broken", &[], [1, 1, 1], [1, 1, 1])
        .unwrap_err();
    assert_eq!(e2.to_string(), msg, "the failure is cached");
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    // An unknown device is an error, not a panic.
    assert!(matches!(
        prog.build(1000).unwrap_err(),
        DeviceError::InvalidDevice { .. }
    ));
}

#[test]
fn bad_launches_are_clear_errors() {
    let Some((api, dev)) = device("bad_launches_are_clear_errors") else {
        return;
    };
    let prog = OpenClProgram::new(ADD1.to_owned());
    let p = api.alloc_data_space(dev, 256, 64, U8).unwrap();
    let buf = |min_bytes| KernelArg::Buffer { ptr: p, min_bytes };
    let launch = |name: &str, args: &[KernelArg], global, local| {
        let e = prog.launch(0, name, args, global, local).unwrap_err();
        assert!(matches!(e, DeviceError::InvalidLaunch { .. }), "{e}");
        e.to_string()
    };
    let one = [64, 1, 1];
    let m = launch("nope", &[], one, one);
    assert!(m.contains("add1") && m.contains("scale"), "{m}");
    let m = launch("add1", &[buf(256)], one, one);
    assert!(
        m.contains("takes 2 argument(s)") && m.contains("passes 1"),
        "{m}"
    );
    let m = launch("add1", &[buf(4096), int_arg(1)], one, one);
    assert!(
        m.contains("argument 0") && m.contains("4096") && m.contains("256"),
        "{m}"
    );
    let m = launch(
        "add1",
        &[
            KernelArg::Buffer {
                ptr: DevicePtr(0xbad_0000),
                min_bytes: 4,
            },
            int_arg(1),
        ],
        one,
        one,
    );
    assert!(
        m.contains("argument 0") && m.contains("not a live allocation"),
        "{m}"
    );
    // A scalar for a pointer parameter (which the driver would read as a cl_mem), and back.
    let m = launch("add1", &[int_arg(1), int_arg(1)], one, one);
    assert!(
        m.contains("argument 0") && m.contains("takes a buffer"),
        "{m}"
    );
    let m = launch("add1", &[buf(256), buf(256)], one, one);
    assert!(
        m.contains("argument 1") && m.contains("takes a scalar"),
        "{m}"
    );
    let m = launch("add1", &[buf(256), int_arg(1)], [100, 1, 1], [64, 1, 1]);
    assert!(m.contains("not a multiple"), "{m}");
    let huge = 1usize << 20;
    let m = launch("add1", &[buf(256), int_arg(1)], [huge, 1, 1], [huge, 1, 1]);
    assert!(m.contains("exceeds the limit of"), "{m}");
    let m = launch(
        "add1",
        &[
            buf(256),
            KernelArg::Scalar {
                bytes: [0; 8],
                size: 9,
            },
        ],
        one,
        one,
    );
    assert!(m.contains("argument 1"), "{m}");
    api.free_data_space(dev, p).unwrap();
    let m = launch("add1", &[buf(4), int_arg(1)], one, one);
    assert!(m.contains("not a live allocation"), "{m}");
}

#[test]
fn dropping_a_program_with_queued_launches_is_safe() {
    let Some((api, dev)) = device("dropping_a_program_with_queued_launches_is_safe") else {
        return;
    };
    let n = 1 << 16;
    let p = upload_f32(&api, dev, &vec![0.0; n], S);
    let s = api.create_stream(dev).unwrap();
    let prev = api.set_current_stream(dev, s).unwrap();
    {
        let prog = OpenClProgram::new(ADD1.to_owned());
        let args = [
            KernelArg::Buffer {
                ptr: p,
                min_bytes: (n * 4) as u64,
            },
            int_arg(n as i32),
        ];
        for _ in 0..50 {
            prog.launch(0, "add1", &args, [n, 1, 1], [64, 1, 1])
                .unwrap();
        }
    }
    api.sync_stream(dev, s).unwrap();
    api.set_current_stream(dev, prev).unwrap();
    assert!(download_f32(&api, dev, p, n).iter().all(|&x| x == 50.0));
    api.free_stream(dev, s).unwrap();
    api.free_data_space(dev, p).unwrap();
}

#[test]
fn launches_from_many_threads_share_kernel_objects_safely() {
    let Some((api, dev)) = device("launches_from_many_threads_share_kernel_objects_safely") else {
        return;
    };
    let n = 4096;
    let prog = OpenClProgram::new(ADD1.to_owned());
    let bufs: Vec<DevicePtr> = (0..4)
        .map(|_| upload_f32(&api, dev, &vec![0.0; n], S))
        .collect();
    std::thread::scope(|sc| {
        for (t, &p) in bufs.iter().enumerate() {
            let (prog, api) = (&prog, &api);
            sc.spawn(move || {
                let args = [
                    KernelArg::Buffer {
                        ptr: p,
                        min_bytes: (n * 4) as u64,
                    },
                    int_arg(n as i32),
                ];
                for _ in 0..=t {
                    prog.launch(0, "add1", &args, [n, 1, 1], [64, 1, 1])
                        .unwrap();
                }
                api.sync_stream(dev, S).unwrap();
            });
        }
    });
    for (t, &p) in bufs.iter().enumerate() {
        let want = (t + 1) as f32;
        assert!(
            download_f32(&api, dev, p, n).iter().all(|&x| x == want),
            "thread {t}"
        );
        api.free_data_space(dev, p).unwrap();
    }
}

/// Run in a child process with no OpenCL driver visible (`OCL_ICD_VENDORS` points to an empty
/// directory): the backend has no device and says how to install one.
#[test]
fn without_a_platform_the_count_is_zero_and_the_error_says_how_to_install_one() {
    if std::env::var("KILN_OPENCL_NO_PLATFORM_CHILD").is_ok() {
        let api = device_api::get_by_name("opencl").unwrap();
        assert_eq!(api.device_count().unwrap(), 0);
        let dev = Device::new(api.device_type(), 0);
        let e = api.alloc_data_space(dev, 64, 64, U8).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("no OpenCL platform was found"), "{m}");
        assert!(
            m.contains("apt-get install pocl-opencl-icd ocl-icd-libopencl1"),
            "{m}"
        );
        let e = OpenClProgram::new(ADD1.to_owned()).build(0).unwrap_err();
        assert!(
            e.to_string().contains("no OpenCL platform was found"),
            "{e}"
        );
        return;
    }
    let empty = std::env::temp_dir().join(format!("kiln-no-icd-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "without_a_platform_the_count_is_zero_and_the_error_says_how_to_install_one",
            "--nocapture",
        ])
        .env("KILN_OPENCL_NO_PLATFORM_CHILD", "1")
        .env("OCL_ICD_VENDORS", &empty)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&empty);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn strided_device_tensors_copy_as_rectangles() {
    let Some((api, dev)) = device("strided_device_tensors_copy_as_rectangles") else {
        return;
    };
    const F32: DLDataType = DLDataType {
        code: DLDataTypeCode::FLOAT,
        bits: 32,
        lanes: 1,
    };
    let m: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let p = upload_f32(&api, dev, &m, S);
    // Rows 1..3, columns 2..5 of the 4x8 matrix.
    let (mut shape, mut strides) = ([2i64, 3], [8i64, 1]);
    let mut view = dl(p.as_raw().cast(), dev, &mut shape);
    view.dtype = F32;
    view.strides = strides.as_mut_ptr();
    view.byte_offset = 40;
    let mut host = vec![0f32; 6];
    let mut hshape = [2i64, 3];
    let mut hdst = dl(host.as_mut_ptr().cast(), Device::cpu(), &mut hshape);
    hdst.dtype = F32;
    // SAFETY: the view lies inside `p`; `host` holds 6 floats; synchronized below.
    unsafe { api.copy_data_from_to(&view, &hdst, S).unwrap() };
    api.sync_stream(dev, S).unwrap();
    assert_eq!(host, [10., 11., 12., 18., 19., 20.]);
    // Device view -> compact device buffer.
    let q = api.alloc_data_space(dev, 24, 64, U8).unwrap();
    let mut qshape = [2i64, 3];
    let mut qt = dl(q.as_raw().cast(), dev, &mut qshape);
    qt.dtype = F32;
    // SAFETY: both inside live buffers; synchronized below.
    unsafe { api.copy_data_from_to(&view, &qt, S).unwrap() };
    assert_eq!(
        download_f32(&api, dev, q, 6),
        [10., 11., 12., 18., 19., 20.]
    );
    // Compact host -> device view (rows 2..4, columns 0..3).
    let mut src: Vec<f32> = (100..106).map(|i| i as f32).collect();
    let mut sshape = [2i64, 3];
    let mut hsrc = dl(src.as_mut_ptr().cast(), Device::cpu(), &mut sshape);
    hsrc.dtype = F32;
    view.byte_offset = 64;
    // SAFETY: as above.
    unsafe { api.copy_data_from_to(&hsrc, &view, S).unwrap() };
    api.sync_stream(dev, S).unwrap();
    let got = download_f32(&api, dev, p, 32);
    let mut want = m.clone();
    want[16..19].copy_from_slice(&[100., 101., 102.]);
    want[24..27].copy_from_slice(&[103., 104., 105.]);
    assert_eq!(got, want);
    // A view running past the end of the buffer is refused before the driver sees it.
    view.byte_offset = 4 * 30;
    // SAFETY: refused before any memory is touched.
    let e = unsafe { api.copy_data_from_to(&view, &hdst, S) }.unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::OutOfBounds {
                allocation: Some(128),
                ..
            }
        ),
        "{e}"
    );
    api.free_data_space(dev, p).unwrap();
    api.free_data_space(dev, q).unwrap();
}

#[test]
fn tensors_cross_between_opencl_and_other_backends_through_the_host() {
    let Some((_api, dev)) = device("tensors_cross_between_opencl_and_other_backends") else {
        return;
    };
    let code = device_api::next_extension_code().unwrap();
    let null: Arc<dyn DeviceApi> = Arc::new(kiln::device_api::NullDeviceApi::new(
        "ocl_test_null",
        code,
        1,
        1 << 20,
    ));
    device_api::register_device_api("ocl_test_null", code, null).unwrap();
    let other = Device::new(code, 0);
    let data: Vec<i32> = (0..100).collect();
    let t = kiln::device_api::Tensor::from_slice(&data, &[10, 10], dev).unwrap();
    let u = t.copy_to(other).unwrap();
    assert_eq!(u.to_vec::<i32>().unwrap(), data);
    let back = u.copy_to(dev).unwrap();
    assert_eq!(back.to_vec::<i32>().unwrap(), data);
}

#[test]
fn kiln_devices_lists_the_opencl_devices_and_their_attributes() {
    let Some((api, _dev)) = device("kiln_devices_lists_the_opencl_devices") else {
        return;
    };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["devices", "opencl", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let b = &v["backends"][0];
    assert_eq!(b["name"], "opencl");
    assert_eq!(b["code"], 4);
    assert_eq!(
        b["device_count"].as_u64().unwrap() as usize,
        api.device_count().unwrap()
    );
    let attrs = b["devices"][0]["attributes"].as_object().unwrap();
    assert_eq!(attrs.len(), 17);
    assert!(!attrs["device_name"].as_str().unwrap().is_empty());
    assert!(attrs["max_threads_per_block"].as_i64().unwrap() > 0);
}
