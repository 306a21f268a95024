//! Pinned staging of asynchronous copies between a plugin device and ordinary host memory
//! (`docs/plugins.md`, "Pinned staging"): right bytes for every size against the staging chunk
//! and unaligned offsets, the caller's memory is not read after an h2d returns, the fallbacks,
//! and failures of one chunk.

mod plugin_util;

use std::sync::Arc;

use kiln::device_api::plugin::{PluginDeviceApi, StagingStats};
use kiln::device_api::{Device, DeviceApi, DevicePtr, StreamHandle};
use kiln::packed_func::ffi::{DLDataType, DLDataTypeCode, DLTensor};
use kiln::packed_func::registry;

const U8: DLDataType = DLDataType {
    code: DLDataTypeCode::UINT,
    bits: 8,
    lanes: 1,
};

const CHUNK: usize = 4096;

fn dl(data: *mut u8, dev: Device, shape: &mut [i64], byte_offset: u64) -> DLTensor {
    DLTensor {
        data: data.cast(),
        device: dev.to_dl(),
        ndim: shape.len() as i32,
        dtype: U8,
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset,
    }
}

fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 31 + seed * 7) % 251) as u8).collect()
}

/// `host[hoff..hoff+n]` -> `dev_ptr + doff`, on `stream`.
#[allow(clippy::too_many_arguments)]
fn h2d(
    api: &PluginDeviceApi,
    host: &mut [u8],
    hoff: usize,
    dev: Device,
    p: DevicePtr,
    doff: usize,
    n: usize,
    stream: StreamHandle,
) -> kiln::device_api::DeviceResult<()> {
    let mut shape = [n as i64];
    let src = dl(host.as_mut_ptr(), Device::cpu(), &mut shape, hoff as u64);
    let dst = dl(p.as_raw().cast(), dev, &mut shape, doff as u64);
    assert!(hoff + n <= host.len());
    // SAFETY: in bounds of `host` and of the device allocation (checked by kiln); `host`
    // outlives the stream synchronizations the callers make.
    unsafe { api.copy_data_from_to(&src, &dst, stream) }
}

/// `dev_ptr + doff` -> `host[hoff..hoff+n]`, on `stream`.
#[allow(clippy::too_many_arguments)]
fn d2h(
    api: &PluginDeviceApi,
    dev: Device,
    p: DevicePtr,
    doff: usize,
    host: &mut [u8],
    hoff: usize,
    n: usize,
    stream: StreamHandle,
) -> kiln::device_api::DeviceResult<()> {
    let mut shape = [n as i64];
    let src = dl(p.as_raw().cast(), dev, &mut shape, doff as u64);
    let dst = dl(host.as_mut_ptr(), Device::cpu(), &mut shape, hoff as u64);
    assert!(hoff + n <= host.len());
    // SAFETY: as in `h2d`.
    unsafe { api.copy_data_from_to(&src, &dst, stream) }
}

fn staged(name: &str, defines: &[&str]) -> Arc<PluginDeviceApi> {
    let mut d = vec!["SAMPLE_PINNED_STAGING"];
    d.extend_from_slice(defines);
    let api = plugin_util::sample(name, &d);
    api.set_staging_chunk(CHUNK);
    api
}

fn delta(a: StagingStats, b: StagingStats) -> (u64, u64, u64) {
    (
        b.h2d_copies - a.h2d_copies,
        b.d2h_copies - a.d2h_copies,
        b.chunks - a.chunks,
    )
}

/// Round trips of every size against the chunk at unaligned offsets; returns the stats delta.
fn roundtrips(api: &PluginDeviceApi, stream_of: impl Fn(Device) -> StreamHandle) -> StagingStats {
    let dev = Device::new(api.code(), 1);
    let s = stream_of(dev);
    let cap = 4 * CHUNK + 256;
    let p = api.alloc_data_space(dev, cap, 64, U8).unwrap();
    let sizes = [
        1,
        1000,
        CHUNK - 1,
        CHUNK,
        CHUNK + 1,
        2 * CHUNK,
        3 * CHUNK + 17,
    ];
    for (i, &n) in sizes.iter().enumerate() {
        for (hoff, doff) in [(0, 0), (3, 5), (1, 64 + 7)] {
            // Fill the whole device buffer with a background, then write the window.
            let mut bg = pattern(cap, 100 + i);
            h2d(api, &mut bg, 0, dev, p, 0, cap, s).unwrap();
            let mut host = vec![0xeeu8; hoff + n + 9];
            host[hoff..hoff + n].copy_from_slice(&pattern(n, i));
            h2d(api, &mut host, hoff, dev, p, doff, n, s).unwrap();
            api.sync_stream(dev, s).unwrap();
            // The window reads back right, at another unaligned host offset.
            let mut out = vec![0x11u8; n + 13];
            d2h(api, dev, p, doff, &mut out, 6, n, s).unwrap();
            api.sync_stream(dev, s).unwrap();
            assert_eq!(
                &out[6..6 + n],
                &pattern(n, i)[..],
                "n={n} hoff={hoff} doff={doff}"
            );
            assert!(out[..6].iter().chain(&out[6 + n..]).all(|&b| b == 0x11));
            // Nothing around the window changed on the device.
            let mut all = vec![0u8; cap];
            d2h(api, dev, p, 0, &mut all, 0, cap, s).unwrap();
            api.sync_stream(dev, s).unwrap();
            let mut want = pattern(cap, 100 + i);
            want[doff..doff + n].copy_from_slice(&pattern(n, i));
            assert!(all == want, "n={n} hoff={hoff} doff={doff}: device bytes");
        }
    }
    api.free_data_space(dev, p).unwrap();
    api.staging_stats()
}

#[test]
fn host_copies_stage_through_pinned_memory_for_every_size_and_unaligned_offsets() {
    let api = staged("hstage_sizes", &[]);
    assert!(api.pinned_staging(), "the plugin asked for pinned staging");
    let before = api.staging_stats();
    let after = roundtrips(&api, |_| StreamHandle::DEFAULT);
    let (h, d, chunks) = delta(before, after);
    // 7 sizes x 3 offsets x (background h2d + window h2d, window d2h + full d2h).
    assert_eq!((h, d), (42, 42));
    let per = |n: usize| n.div_ceil(CHUNK) as u64;
    let sizes = [
        1,
        1000,
        CHUNK - 1,
        CHUNK,
        CHUNK + 1,
        2 * CHUNK,
        3 * CHUNK + 17,
    ];
    let want: u64 = sizes
        .iter()
        .map(|&n| 3 * 2 * (per(n) + per(4 * CHUNK + 256)))
        .sum();
    assert_eq!(chunks, want);
    // On a stream of its own too.
    let api2 = api.clone();
    let streams = std::sync::Mutex::new(Vec::new());
    let after2 = roundtrips(&api, |dev| {
        let s = api2.create_stream(dev).unwrap();
        streams.lock().unwrap().push((dev, s));
        s
    });
    assert_eq!(delta(after, after2).0, 42);
    for (dev, s) in streams.into_inner().unwrap() {
        api.free_stream(dev, s).unwrap();
    }
}

#[test]
fn a_staged_h2d_does_not_read_the_callers_memory_after_it_returns() {
    let api = staged("hstage_snapshot", &[]);
    let dev = Device::new(api.code(), 0);
    let n = 5 * CHUNK + 3;
    let p = api.alloc_data_space(dev, n, 64, U8).unwrap();
    let s = api.create_stream(dev).unwrap();
    // Hold the stream back, so that a copy reading the caller's memory asynchronously would
    // still be queued when the call returns.
    api.add_callback(
        dev,
        s,
        Box::new(|| std::thread::sleep(std::time::Duration::from_millis(100))),
    )
    .unwrap();
    let mut host = pattern(n, 1);
    h2d(&api, &mut host, 0, dev, p, 0, n, s).unwrap();
    // Overwrite the caller's buffer right away: the device must get the old bytes.
    host.iter_mut().for_each(|b| *b = 0);
    api.sync_stream(dev, s).unwrap();
    drop(host);
    let mut out = vec![0u8; n];
    d2h(&api, dev, p, 0, &mut out, 0, n, s).unwrap();
    assert!(
        out == pattern(n, 1),
        "the device got the bytes of the call, not later ones"
    );
    api.free_stream(dev, s).unwrap();
    api.free_data_space(dev, p).unwrap();
}

#[test]
fn without_pinned_memory_or_async_entries_or_the_opt_in_copies_go_direct() {
    // Opted in, but no host_memory_allocate: the direct path.
    let api = staged("hstage_no_pinned", &["SAMPLE_NO_PINNED"]);
    assert!(api.pinned_staging());
    assert_eq!(
        roundtrips(&api, |_| StreamHandle::DEFAULT),
        StagingStats::default()
    );
    // Turned on by hand on a plugin without async copies (synchronous already): direct.
    let api = plugin_util::sample("hstage_minimal", &["SAMPLE_MINIMAL"]);
    api.set_pinned_staging(true);
    api.set_staging_chunk(CHUNK);
    assert_eq!(
        roundtrips(&api, |_| StreamHandle::DEFAULT),
        StagingStats::default()
    );
    // Pinned memory and async copies, but the plugin did not ask: direct, until turned on.
    let api = plugin_util::sample("hstage_not_asked", &[]);
    assert!(!api.pinned_staging());
    api.set_staging_chunk(CHUNK);
    assert_eq!(
        roundtrips(&api, |_| StreamHandle::DEFAULT),
        StagingStats::default()
    );
    api.set_pinned_staging(true);
    assert_ne!(roundtrips(&api, |_| StreamHandle::DEFAULT).chunks, 0);
    api.set_pinned_staging(false);
}

fn inject(name: &str, nth: i64) {
    registry::require(&format!("{name}.inject_copy_failure"))
        .unwrap()
        .call_typed::<_, ()>((nth,))
        .unwrap();
}

#[test]
fn a_failed_h2d_chunk_is_reported_by_the_sync_and_corrupts_nothing() {
    let name = "hstage_h2d_fail";
    let api = staged(name, &[]);
    let dev = Device::new(api.code(), 0);
    let n = 3 * CHUNK + 100;
    let p = api.alloc_data_space(dev, n, 64, U8).unwrap();
    let q = api.alloc_data_space(dev, n, 64, U8).unwrap();
    let mut old = pattern(n, 2);
    h2d(&api, &mut old, 0, dev, p, 0, n, StreamHandle::DEFAULT).unwrap();
    h2d(&api, &mut old, 0, dev, q, 0, n, StreamHandle::DEFAULT).unwrap();
    api.sync_stream(dev, StreamHandle::DEFAULT).unwrap();
    // The second chunk of the next copy fails on the device.
    inject(name, 2);
    let mut new = pattern(n, 3);
    let keep = new.clone();
    h2d(&api, &mut new, 0, dev, p, 0, n, StreamHandle::DEFAULT).unwrap();
    let e = api.sync_stream(dev, StreamHandle::DEFAULT).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("injected failure"), "{msg}");
    assert!(msg.contains("h2d copy"), "{msg}");
    api.sync_stream(dev, StreamHandle::DEFAULT).unwrap();
    assert_eq!(new, keep, "the caller's buffer is only read");
    // The other chunks landed, the failed one left the old bytes, the neighbour is intact.
    let mut out = vec![0u8; n];
    d2h(&api, dev, p, 0, &mut out, 0, n, StreamHandle::DEFAULT).unwrap();
    let mut want = keep.clone();
    want[CHUNK..2 * CHUNK].copy_from_slice(&old[CHUNK..2 * CHUNK]);
    assert!(out == want, "chunks other than the failed one were written");
    d2h(&api, dev, q, 0, &mut out, 0, n, StreamHandle::DEFAULT).unwrap();
    assert!(out == old, "the neighbouring allocation is untouched");
    // The staging buffer is still good: a retry succeeds.
    h2d(&api, &mut new, 0, dev, p, 0, n, StreamHandle::DEFAULT).unwrap();
    api.sync_stream(dev, StreamHandle::DEFAULT).unwrap();
    d2h(&api, dev, p, 0, &mut out, 0, n, StreamHandle::DEFAULT).unwrap();
    assert!(out == keep);
    api.free_data_space(dev, p).unwrap();
    api.free_data_space(dev, q).unwrap();
}

#[test]
fn a_failed_d2h_chunk_is_returned_and_never_written_to_the_caller() {
    let name = "hstage_d2h_fail";
    let api = staged(name, &[]);
    let dev = Device::new(api.code(), 1);
    let n = 3 * CHUNK + 100;
    let p = api.alloc_data_space(dev, n, 64, U8).unwrap();
    let mut data = pattern(n, 4);
    h2d(&api, &mut data, 0, dev, p, 0, n, StreamHandle::DEFAULT).unwrap();
    api.sync_stream(dev, StreamHandle::DEFAULT).unwrap();
    inject(name, 2);
    let mut out = vec![0x5au8; n + 8];
    let e = d2h(&api, dev, p, 0, &mut out, 4, n, StreamHandle::DEFAULT).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("injected failure"), "{msg}");
    assert!(msg.contains("d2h copy"), "{msg}");
    // The first chunk was copied out; the failed one and the rest were not touched.
    assert_eq!(&out[4..4 + CHUNK], &data[..CHUNK]);
    assert!(out[..4].iter().chain(&out[4 + CHUNK..]).all(|&b| b == 0x5a));
    // The stream and the staging buffer still work.
    d2h(&api, dev, p, 0, &mut out, 4, n, StreamHandle::DEFAULT).unwrap();
    assert_eq!(&out[4..4 + n], &data[..]);
    api.free_data_space(dev, p).unwrap();
}
