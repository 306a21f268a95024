//! Stream and event semantics, failure injection and kernels on the sample plugin, whose streams
//! run on worker threads (so ordering is real, not an artefact of synchronous execution).

mod plugin_util;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use kiln::device_api::{Device, DeviceApi, DeviceError, DevicePtr, StreamHandle, Tensor};
use kiln::packed_func::ffi::{DLDataType, DLDataTypeCode, DLTensor};
use kiln::packed_func::registry;

const U8: DLDataType = DLDataType {
    code: DLDataTypeCode::UINT,
    bits: 8,
    lanes: 1,
};

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

/// Copies host bytes to `p` on `stream` (not synchronized).
///
/// The caller keeps `bytes` alive until the stream is synchronized.
fn h2d(api: &dyn DeviceApi, dev: Device, bytes: &mut [u8], p: DevicePtr, s: StreamHandle) {
    let mut shape = [bytes.len() as i64];
    let src = dl(bytes.as_mut_ptr(), Device::cpu(), &mut shape);
    let dst = dl(p.as_raw().cast(), dev, &mut shape);
    // SAFETY: `p` holds `bytes.len()` bytes; the caller keeps `bytes` alive until a sync.
    unsafe { api.copy_data_from_to(&src, &dst, s) }.unwrap();
}

fn read(api: &dyn DeviceApi, dev: Device, p: DevicePtr, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let mut shape = [n as i64];
    let src = dl(p.as_raw().cast(), dev, &mut shape);
    let dst = dl(out.as_mut_ptr(), Device::cpu(), &mut shape);
    // SAFETY: in bounds; synchronized before `out` is read.
    unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap();
    api.sync_stream(dev, StreamHandle::DEFAULT).unwrap();
    out
}

/// Blocks `stream`'s worker in a host callback until the returned sender is used.
fn block_stream(api: &dyn DeviceApi, dev: Device, s: StreamHandle) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    api.add_callback(
        dev,
        s,
        Box::new(move || {
            let _ = rx.recv();
        }),
    )
    .unwrap();
    tx
}

#[test]
fn an_event_orders_an_h2d_copy_on_one_stream_before_a_d2d_copy_on_another() {
    let api = plugin_util::sample("streams_order", &[]);
    let dev = Device::new(api.code(), 0);
    let (s1, s2) = (
        api.create_stream(dev).unwrap(),
        api.create_stream(dev).unwrap(),
    );
    let n = 1 << 20;
    let a = api.alloc_data_space(dev, n, 64, U8).unwrap();
    let b = api.alloc_data_space(dev, n, 64, U8).unwrap();
    let mut bytes: Vec<u8> = (0..n).map(|i| (i * 31 % 253) as u8).collect();
    // Hold S1 so that the d2d on S2 would read stale data if it did not wait for the event.
    let release = block_stream(&*api, dev, s1);
    h2d(&*api, dev, &mut bytes, a, s1);
    let e = api.create_event(dev).unwrap();
    api.record_event(dev, s1, e).unwrap();
    api.stream_wait_event(dev, s2, e).unwrap();
    let mut shape = [n as i64];
    let src = dl(a.as_raw().cast(), dev, &mut shape);
    let dst = dl(b.as_raw().cast(), dev, &mut shape);
    // SAFETY: both in bounds; synchronized below.
    unsafe { api.copy_data_from_to(&src, &dst, s2) }.unwrap();
    assert!(
        !api.query_stream(dev, s2).unwrap(),
        "S2 waits for S1's event"
    );
    release.send(()).unwrap();
    api.sync_stream(dev, s2).unwrap();
    assert_eq!(read(&*api, dev, b, n), bytes);
    api.destroy_event(dev, e).unwrap();
    api.free_stream(dev, s1).unwrap();
    api.free_stream(dev, s2).unwrap();
    api.free_data_space(dev, a).unwrap();
    api.free_data_space(dev, b).unwrap();
}

#[test]
fn callbacks_run_in_stream_order_after_the_copies_queued_before_them() {
    let api = plugin_util::sample("streams_callbacks", &[]);
    let dev = Device::new(api.code(), 1);
    let s = api.create_stream(dev).unwrap();
    let p = api.alloc_data_space(dev, 4096, 64, U8).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let release = block_stream(&*api, dev, s);
    let mut bufs: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8; 4096]).collect();
    for (i, buf) in bufs.iter_mut().enumerate() {
        h2d(&*api, dev, buf, p, s);
        let (l, a2) = (log.clone(), api.clone());
        // Each callback sees the copy queued just before it completed: read it back on the
        // default stream from the worker thread.
        api.add_callback(
            dev,
            s,
            Box::new(move || {
                let first = read(&*a2, dev, p, 1)[0];
                l.lock().unwrap().push((i, first));
            }),
        )
        .unwrap();
    }
    assert!(
        log.lock().unwrap().is_empty(),
        "nothing runs while the stream is held"
    );
    release.send(()).unwrap();
    api.sync_stream(dev, s).unwrap();
    let got = log.lock().unwrap().clone();
    assert_eq!(got, (0..5).map(|i| (i, i as u8)).collect::<Vec<_>>());
    api.free_stream(dev, s).unwrap();
    api.free_data_space(dev, p).unwrap();
}

#[test]
fn events_are_pending_before_completion_and_complete_after() {
    let api = plugin_util::sample("streams_events", &[]);
    let dev = Device::new(api.code(), 0);
    let s = api.create_stream(dev).unwrap();
    let e = api.create_event(dev).unwrap();
    assert!(api.query_event(dev, e).unwrap(), "never recorded: complete");
    let release = block_stream(&*api, dev, s);
    api.record_event(dev, s, e).unwrap();
    assert!(
        !api.query_event(dev, e).unwrap(),
        "recorded behind blocked work: pending"
    );
    assert!(!api.query_stream(dev, s).unwrap());
    release.send(()).unwrap();
    api.sync_event(dev, e).unwrap();
    assert!(api.query_event(dev, e).unwrap());
    api.sync_stream(dev, s).unwrap();
    assert!(api.query_stream(dev, s).unwrap());
    api.destroy_event(dev, e).unwrap();
    api.free_stream(dev, s).unwrap();
}

#[test]
fn a_callback_on_a_destroyed_stream_is_refused_and_never_runs() {
    let api = plugin_util::sample("streams_destroyed", &[]);
    let dev = Device::new(api.code(), 0);
    let s = api.create_stream(dev).unwrap();
    let ran = Arc::new(Mutex::new(0));
    let r = ran.clone();
    // A callback queued before destruction still runs: destroy drains the stream.
    api.add_callback(dev, s, Box::new(move || *r.lock().unwrap() += 1))
        .unwrap();
    api.free_stream(dev, s).unwrap();
    assert_eq!(*ran.lock().unwrap(), 1);
    let r = ran.clone();
    let e = api
        .add_callback(dev, s, Box::new(move || *r.lock().unwrap() += 10))
        .unwrap_err();
    assert!(matches!(e, DeviceError::InvalidStream { .. }), "{e}");
    assert!(e.to_string().contains("is not a live stream"), "{e}");
    assert_eq!(api.last_error(), Some(e.to_string()));
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(*ran.lock().unwrap(), 1);
    // The backend keeps working.
    let s2 = api.create_stream(dev).unwrap();
    api.sync_stream(dev, s2).unwrap();
    api.free_stream(dev, s2).unwrap();
}

#[test]
fn a_failed_allocation_reports_the_plugins_message_and_the_next_one_succeeds() {
    let api = plugin_util::sample("fail_alloc", &[]);
    let dev = Device::new(api.code(), 0);
    let inject = registry::require("fail_alloc.inject_alloc_failure").unwrap();
    // Keep the initial chunk busy, so that there is nothing to give back and retry with.
    let keep = api.alloc_data_space(dev, 100, 64, U8).unwrap();
    inject.call_typed::<_, ()>((1i64,)).unwrap();
    // Larger than the cached initial chunk, so the plugin is asked.
    let n = 8 << 20;
    let e = api.alloc_data_space(dev, n, 64, U8).unwrap_err();
    assert!(matches!(e, DeviceError::OutOfMemory { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("allocating {n} bytes (align 64) on {dev} failed")),
        "{msg}"
    );
    assert!(
        msg.contains("device_memory_allocate failed with status 2 (OUT_OF_MEMORY)"),
        "{msg}"
    );
    assert!(msg.contains("(injected failure)"), "{msg}");
    let p = api.alloc_data_space(dev, n, 64, U8).unwrap();
    api.free_data_space(dev, p).unwrap();
    api.free_data_space(dev, keep).unwrap();
    // Above the plugin's maximum allocation size: refused without asking the plugin.
    let calls = api.allocator_stats(0).unwrap().plugin_allocs;
    let e = api.alloc_data_space(dev, 300 << 20, 64, U8).unwrap_err();
    assert!(
        e.to_string().contains("allows at most 268435456 bytes"),
        "{e}"
    );
    assert_eq!(api.allocator_stats(0).unwrap().plugin_allocs, calls);
}

#[test]
fn a_copy_that_fails_mid_stream_is_reported_at_synchronize_and_the_stream_recovers() {
    let api = plugin_util::sample("fail_copy", &[]);
    let dev = Device::new(api.code(), 0);
    let s = api.create_stream(dev).unwrap();
    let ps: Vec<DevicePtr> = (0..3)
        .map(|_| api.alloc_data_space(dev, 256, 64, U8).unwrap())
        .collect();
    for &p in &ps {
        api.memset(dev, p, 0, 0, 256, s).unwrap();
    }
    registry::require("fail_copy.inject_copy_failure")
        .unwrap()
        .call_typed::<_, ()>((2i64,))
        .unwrap();
    let mut bufs: Vec<Vec<u8>> = (1..=3).map(|i| vec![i as u8; 256]).collect();
    for (buf, &p) in bufs.iter_mut().zip(&ps) {
        h2d(&*api, dev, buf, p, s);
    }
    let e = api.sync_stream(dev, s).unwrap_err();
    assert!(matches!(e, DeviceError::Backend { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("synchronize_stream failed"), "{msg}");
    assert!(
        msg.contains("h2d copy #2 of 256 bytes failed (injected failure)"),
        "{msg}"
    );
    // The copies before and after the failed one ran; the failed one did not.
    assert_eq!(read(&*api, dev, ps[0], 256), vec![1; 256]);
    assert_eq!(read(&*api, dev, ps[1], 256), vec![0; 256]);
    assert_eq!(read(&*api, dev, ps[2], 256), vec![3; 256]);
    // Reported once; the stream works again.
    api.sync_stream(dev, s).unwrap();
    h2d(&*api, dev, &mut bufs[1], ps[1], s);
    api.sync_stream(dev, s).unwrap();
    assert_eq!(read(&*api, dev, ps[1], 256), vec![2; 256]);
    api.free_stream(dev, s).unwrap();
    for p in ps {
        api.free_data_space(dev, p).unwrap();
    }
}

#[test]
fn steady_allocation_and_freeing_does_not_call_the_plugin_each_time() {
    let api = plugin_util::sample("alloc_steady", &[]);
    let dev = Device::new(api.code(), 1);
    let p = api.alloc_data_space(dev, 1000, 64, U8).unwrap();
    api.free_data_space(dev, p).unwrap();
    let before = api.allocator_stats(1).unwrap();
    for _ in 0..200 {
        let a = api.alloc_data_space(dev, 1000, 64, U8).unwrap();
        let b = api.alloc_data_space(dev, 50_000, 256, U8).unwrap();
        api.free_data_space(dev, a).unwrap();
        api.free_data_space(dev, b).unwrap();
    }
    let after = api.allocator_stats(1).unwrap();
    assert_eq!(after.plugin_allocs, before.plugin_allocs);
    assert!(after.cache_hits >= before.cache_hits + 400);
    assert_eq!(after.in_use, 0);
    assert!(after.peak >= 51_000);
    // Trimming gives the wholly free chunks back.
    assert!(api.trim(1).unwrap() >= 1 << 20);
    assert_eq!(api.allocator_stats(1).unwrap().reserved, 0);
    let stats = api.memory_stats(dev).unwrap();
    assert_eq!(
        stats.free, stats.total,
        "the device is empty again: {stats:?}"
    );
}

#[test]
fn a_plugin_kernel_adds_two_tensors_on_the_device() {
    let api = plugin_util::sample("kernel", &[]);
    let dev = Device::new(api.code(), 1);
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], dev).unwrap();
    let y = Tensor::from_slice(&[10.0f32, 20.0, 30.0, 40.0], &[2, 2], dev).unwrap();
    let z = Tensor::zeros(&[2, 2], x.dtype(), dev).unwrap();
    let add = registry::require("kernel.add").unwrap();
    add.call_typed::<_, ()>((x.as_dltensor(), y.as_dltensor(), z.as_dltensor()))
        .unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![11.0, 22.0, 33.0, 44.0]);
    // The kernel's errors arrive as raised errors with its message.
    let e = add
        .call_typed::<_, ()>((x.as_dltensor(), y.as_dltensor()))
        .unwrap_err();
    assert!(
        e.to_string().contains("kernel.add expects 3 tensors"),
        "{e}"
    );
}

#[test]
fn copies_between_two_devices_bounce_through_the_host_without_p2p_entries() {
    let api = plugin_util::sample("p2p", &[]);
    let (d0, d1) = (Device::new(api.code(), 0), Device::new(api.code(), 1));
    let a = Tensor::from_slice(&[5i64, 6, 7], &[3], d0).unwrap();
    let b = a.copy_to(d1).unwrap();
    assert_eq!(b.device(), d1);
    assert_eq!(b.to_vec::<i64>().unwrap(), vec![5, 6, 7]);
}

#[test]
fn unified_memory_is_a_memory_scope_of_the_plugin() {
    let api = plugin_util::sample("unified", &[]);
    let dev = Device::new(api.code(), 0);
    let p = api
        .alloc_data_space_for(dev, &[16], U8, Some("global.unified"))
        .unwrap();
    let mut bytes = vec![7u8; 16];
    h2d(&*api, dev, &mut bytes, p, StreamHandle::DEFAULT);
    api.sync_stream(dev, StreamHandle::DEFAULT).unwrap();
    assert_eq!(read(&*api, dev, p, 16), bytes);
    assert_eq!(api.memory_stats(dev).unwrap().in_use, 16);
    api.free_data_space(dev, p).unwrap();
    let e = api
        .alloc_data_space_for(dev, &[16], U8, Some("texture"))
        .unwrap_err();
    assert!(
        e.to_string().contains("supported: global, global.unified"),
        "{e}"
    );
}
