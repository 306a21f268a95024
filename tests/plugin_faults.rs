//! Faulty plugins and bad inputs: every value a plugin returns is bounded or checked, every
//! out-of-range request is refused before the plugin sees it, and each failure is reported by
//! the call it belongs to, with a message that says what was expected and what was seen.

mod plugin_util;

use std::process::Command;

use kiln::device_api::plugin::{self, PluginError};
use kiln::device_api::{AttrKind, Device, DeviceApi, DeviceError, DevicePtr, StreamHandle};
use kiln::packed_func::ffi::{DLDataType, DLDataTypeCode, DLTensor};
use kiln::packed_func::registry;

const U8: DLDataType = DLDataType {
    code: DLDataTypeCode::UINT,
    bits: 8,
    lanes: 1,
};

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

fn load_err(name: &str, defines: &[&str]) -> PluginError {
    let lib = plugin_util::build_sample(name, defines);
    plugin::load_plugin(&lib).expect_err("the faulty plugin must be refused")
}

// ------------------------------------------------------------------ 1. values from the plugin

#[test]
fn a_huge_device_count_is_refused_with_a_message() {
    let e = load_err(
        "fault_count",
        &["SAMPLE_FAULT_DEVICE_COUNT=((size_t)1<<40)"],
    );
    assert!(matches!(e, PluginError::Invalid { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("get_device_count reported 1099511627776 devices"),
        "{msg}"
    );
    assert!(msg.contains("at most 1024"), "{msg}");
}

#[test]
fn kiln_devices_survives_a_plugin_with_a_huge_device_count() {
    let dir = tempfile::tempdir().unwrap();
    plugin_util::build_sample_in(
        dir.path(),
        "cli_fault_count",
        &["SAMPLE_FAULT_DEVICE_COUNT=((size_t)1<<40)"],
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("devices")
        .env("KILN_PLUGIN_PATH", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(stderr.contains("warning: skipping plugin"), "{stderr}");
    assert!(
        stderr.contains("get_device_count reported 1099511627776 devices"),
        "{stderr}"
    );
}

#[test]
fn a_device_id_beyond_i32_is_refused() {
    let e = load_err("fault_list", &["SAMPLE_FAULT_DEVICE_LIST"]);
    let msg = e.to_string();
    assert!(
        msg.contains("get_device_list gave device id 1099511627776 at position 1"),
        "{msg}"
    );
    assert!(msg.contains("expected ids below 2147483648"), "{msg}");
}

#[test]
fn a_huge_kernel_count_is_refused() {
    let e = load_err("fault_kernels", &["SAMPLE_FAULT_KERNEL_COUNT"]);
    let msg = e.to_string();
    assert!(
        msg.contains("get_kernels reported 1099511627776 kernels; kiln accepts at most 65536"),
        "{msg}"
    );
}

#[test]
fn a_name_without_a_terminating_nul_is_refused_after_a_bounded_read() {
    let e = load_err("fault_name", &["SAMPLE_FAULT_NAME_NO_NUL"]);
    assert!(matches!(e, PluginError::Invalid { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("`sub_device_type` has no terminating NUL within 255 bytes"),
        "{msg}"
    );
    assert!(msg.contains("it starts `nnnn"), "{msg}");
}

#[test]
fn a_string_attribute_without_a_nul_is_an_error_not_a_truncated_name() {
    let api = plugin_util::sample("fault_attr", &["SAMPLE_FAULT_ATTR_NO_NUL"]);
    let dev = Device::new(api.code(), 0);
    let e = api.attr(dev, AttrKind::DEVICE_NAME).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("string attribute without a terminating NUL in its 256 bytes"),
        "{msg}"
    );
    assert!(
        msg.contains("expected at most 255 bytes and a NUL"),
        "{msg}"
    );
    // Other attributes still work.
    assert_eq!(
        api.attr(dev, AttrKind::WARP_SIZE)
            .unwrap()
            .unwrap()
            .as_int(),
        Some(32)
    );
}

#[test]
fn a_null_stream_handle_is_refused() {
    let api = plugin_util::sample("fault_null_stream", &["SAMPLE_FAULT_NULL_STREAM"]);
    let dev = Device::new(api.code(), 0);
    // The default stream (the plugin's first) is fine.
    api.sync_stream(dev, StreamHandle::DEFAULT).unwrap();
    let e = api.create_stream(dev).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(
            "create_stream succeeded but returned NULL; expected a new, non-NULL stream handle"
        ),
        "{msg}"
    );
}

#[test]
fn a_chunk_that_wraps_around_the_address_space_is_refused() {
    let api = plugin_util::sample("fault_wrap", &["SAMPLE_FAULT_WRAP_ALLOC"]);
    let dev = Device::new(api.code(), 0);
    let e = api.alloc_data_space(dev, 2 << 20, 64, U8).unwrap_err();
    assert!(matches!(e, DeviceError::OutOfMemory { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("a range that wraps around the address space"),
        "{msg}"
    );
    // Small allocations from the initial chunk still work.
    let p = api.alloc_data_space(dev, 1024, 64, U8).unwrap();
    api.free_data_space(dev, p).unwrap();
}

#[test]
fn memory_figures_that_do_not_fit_are_reported_as_unknown() {
    let api = plugin_util::sample("fault_stats", &["SAMPLE_FAULT_MEMORY_STATS"]);
    let dev = Device::new(api.code(), 0);
    let stats = api.memory_stats(dev).unwrap();
    assert_eq!((stats.total, stats.free), (None, None));
    // The plugin's own get_attribute still answers.
    assert!(api
        .attr(dev, AttrKind::TOTAL_GLOBAL_MEMORY)
        .unwrap()
        .is_some());
}

// ------------------------------------------------------------------ 2. base-pointer bounds

fn two_buffers(
    name: &str,
) -> (
    std::sync::Arc<plugin::PluginDeviceApi>,
    Device,
    DevicePtr,
    DevicePtr,
) {
    let api = plugin_util::sample(name, &["SAMPLE_MINIMAL"]);
    let dev = Device::new(api.code(), 0);
    let a = api.alloc_data_space(dev, 1024, 64, U8).unwrap();
    let b = api.alloc_data_space(dev, 1024, 64, U8).unwrap();
    (api, dev, a, b)
}

fn assert_oob(e: &DeviceError, op: &str) {
    match e {
        DeviceError::OutOfBounds {
            allocation,
            nbytes,
            offset,
            ..
        } => {
            assert_eq!(*allocation, Some(1024), "{e}");
            assert_eq!((*offset, *nbytes), (1024, 1024), "{e}");
        }
        other => panic!("expected OutOfBounds, got {other}"),
    }
    let msg = e.to_string();
    assert!(msg.starts_with(op), "{msg}");
    assert!(msg.contains("+ 1024, +1024)"), "{msg}");
    assert!(
        msg.contains("run past the end of its allocation of 1024 bytes"),
        "{msg}"
    );
}

#[test]
fn a_copy_past_the_end_of_a_buffer_does_not_reach_the_next_one() {
    let (api, dev, a, b) = two_buffers("oob_copy");
    let mut host = vec![9u8; 1024];
    let mut shape = [1024i64];
    let zeros = vec![0u8; 1024];
    // b holds zeros; a copy into a at offset 1024 must not change it.
    let src = dl(zeros.as_ptr().cast_mut(), Device::cpu(), &mut shape, 0);
    let dst = dl(b.as_raw().cast(), dev, &mut shape, 0);
    // SAFETY: in bounds; synchronized below.
    unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap();

    // h2d into a at 1024
    let src = dl(host.as_mut_ptr(), Device::cpu(), &mut shape, 0);
    let dst = dl(a.as_raw().cast(), dev, &mut shape, 1024);
    // SAFETY: kiln must refuse the range before touching memory.
    let e = unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap_err();
    assert_oob(&e, "copy");
    // d2h from a at 1024
    let src = dl(a.as_raw().cast(), dev, &mut shape, 1024);
    let dst = dl(host.as_mut_ptr(), Device::cpu(), &mut shape, 0);
    // SAFETY: as above.
    let e = unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap_err();
    assert_oob(&e, "copy");
    // d2d: destination a at 1024, then source a at 1024
    let src = dl(b.as_raw().cast(), dev, &mut shape, 0);
    let dst = dl(a.as_raw().cast(), dev, &mut shape, 1024);
    // SAFETY: as above.
    let e = unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap_err();
    assert_oob(&e, "copy");
    let src = dl(a.as_raw().cast(), dev, &mut shape, 1024);
    let dst = dl(b.as_raw().cast(), dev, &mut shape, 0);
    // SAFETY: as above.
    let e = unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap_err();
    assert_oob(&e, "copy");
    // memset of a at 1024
    let e = api
        .memset(dev, a, 1024, 7, 1024, StreamHandle::DEFAULT)
        .unwrap_err();
    assert_oob(&e, "memset");

    // b is untouched.
    let mut out = vec![1u8; 1024];
    let src = dl(b.as_raw().cast(), dev, &mut shape, 0);
    let dst = dl(out.as_mut_ptr(), Device::cpu(), &mut shape, 0);
    // SAFETY: in bounds; synchronized below.
    unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap();
    api.sync_stream(dev, StreamHandle::DEFAULT).unwrap();
    assert_eq!(out, zeros);
    // In-bounds offsets inside a still work.
    api.memset(dev, a, 512, 3, 512, StreamHandle::DEFAULT)
        .unwrap();
    api.free_data_space(dev, a).unwrap();
    api.free_data_space(dev, b).unwrap();
}

// ------------------------------------------------------------------ 3. errors belong to the sync

#[test]
fn a_failed_queued_copy_is_reported_by_the_sync_not_by_a_handle_check() {
    let api = plugin_util::sample("fault_no_query", &["SAMPLE_NO_QUERY_STREAM"]);
    assert!(api.info().absent_entries.contains(&"query_stream"));
    let dev = Device::new(api.code(), 0);
    let s1 = api.create_stream(dev).unwrap();
    let s2 = api.create_stream(dev).unwrap();
    let p = api.alloc_data_space(dev, 256, 64, U8).unwrap();
    registry::require("fault_no_query.inject_copy_failure")
        .unwrap()
        .call_typed::<_, ()>((1i64,))
        .unwrap();
    let mut bytes = vec![5u8; 256];
    let mut shape = [256i64];
    let src = dl(bytes.as_mut_ptr(), Device::cpu(), &mut shape, 0);
    let dst = dl(p.as_raw().cast(), dev, &mut shape, 0);
    // SAFETY: in bounds; `bytes` outlives the sync below.
    unsafe { api.copy_data_from_to(&src, &dst, s1) }.unwrap();
    // Handle checks: no error, no synchronization.
    let prev = api.set_current_stream(dev, s1).unwrap();
    api.set_current_stream(dev, prev).unwrap();
    api.sync_stream_from_to(dev, s1, s2).unwrap();
    // The failure belongs to the sync of s1, once.
    let e = api.sync_stream(dev, s1).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("synchronize_stream failed"), "{msg}");
    assert!(msg.contains("injected failure"), "{msg}");
    api.sync_stream(dev, s1).unwrap();
    // A dead handle is still refused by the check.
    api.free_stream(dev, s2).unwrap();
    let e = api.set_current_stream(dev, s2).unwrap_err();
    assert!(matches!(e, DeviceError::InvalidStream { .. }), "{e}");
    api.free_stream(dev, s1).unwrap();
    api.free_data_space(dev, p).unwrap();
}

// ------------------------------------------------------------------ 4. the loader's reason

#[test]
fn a_plugin_linked_against_a_missing_library_shows_the_loaders_message() {
    let dir = tempfile::tempdir().unwrap();
    let dep_src = dir.path().join("dep.c");
    std::fs::write(&dep_src, "int kiln_test_dep(void) { return 3; }\n").unwrap();
    let dep = dir.path().join("libkiln_test_dep.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    assert!(Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&dep)
        .arg(&dep_src)
        .status()
        .unwrap()
        .success());
    let src = dir.path().join("plug.c");
    std::fs::write(
        &src,
        "int kiln_test_dep(void);\nint kiln_device_plugin_init(void* p) { (void)p; return kiln_test_dep(); }\n",
    )
    .unwrap();
    let lib = dir.path().join("libkiln_needs_dep.so");
    assert!(Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-L")
        .arg(dir.path())
        .arg("-lkiln_test_dep")
        .status()
        .unwrap()
        .success());
    std::fs::remove_file(&dep).unwrap();
    let e = plugin::load_plugin(&lib).unwrap_err();
    assert!(matches!(e, PluginError::Open { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("libkiln_test_dep.so: cannot open shared object file"),
        "{msg}"
    );
}

#[test]
fn a_plugin_for_another_architecture_is_refused_naming_both() {
    let lib = plugin_util::build_sample("fault_arch", &[]);
    let mut bytes = std::fs::read(&lib).unwrap();
    // e_machine (offset 18, little-endian): claim another architecture.
    let other: u16 = if cfg!(target_arch = "aarch64") {
        62
    } else {
        183
    };
    bytes[18..20].copy_from_slice(&other.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("libkiln_other_arch.so");
    std::fs::write(&f, bytes).unwrap();
    let e = plugin::load_plugin(&f).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("it is built for the"), "{msg}");
    assert!(msg.contains("but this process runs on"), "{msg}");
}

// ------------------------------------------------------------------ 8. entry-point gaps

#[test]
fn a_failing_entry_point_is_reported_with_its_message() {
    let e = load_err("abi_entry_fails", &["SAMPLE_ENTRY_FAILS"]);
    assert!(matches!(e, PluginError::EntryFailed { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("kiln_device_plugin_init failed with status 1 (ERROR)"),
        "{msg}"
    );
    assert!(
        msg.contains("needs driver 9.9 (injected entry failure)"),
        "{msg}"
    );
}

#[test]
fn a_null_device_name_is_refused() {
    let e = load_err("abi_null_name", &["SAMPLE_NULL_DEVICE_TYPE"]);
    assert!(matches!(e, PluginError::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("left `device_type` NULL"), "{e}");
}

#[test]
fn a_null_function_table_is_refused() {
    let e = load_err("abi_null_table", &["SAMPLE_NULL_TABLE"]);
    assert!(matches!(e, PluginError::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("left `interface` NULL"), "{e}");
}

#[test]
fn a_short_function_table_is_refused_with_both_sizes() {
    let e = load_err("abi_short_table", &["SAMPLE_SHORT_TABLE"]);
    assert!(matches!(e, PluginError::Version { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "its function table is 64 bytes, smaller than the {} bytes of ABI 1.0",
            plugin::sys::KILN_DEVICE_INTERFACE_SIZE_1_0
        )),
        "{msg}"
    );
}

#[test]
fn a_plugin_refusing_kiln_through_check_params_gets_an_explanation() {
    let e = load_err("abi_refuses", &["SAMPLE_REFUSE_KILN"]);
    assert!(matches!(e, PluginError::EntryFailed { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("status 6 (VERSION_MISMATCH)"), "{msg}");
    assert!(!msg.contains("no message"), "{msg}");
    assert!(msg.contains("the plugin refused this kiln"), "{msg}");
    assert!(msg.contains("ABI 1.2"), "{msg}");
}

// ------------------------------------------------------------------ 8. async memset (ABI 1.2)

fn memset_case(name: &str, defines: &[&str]) -> std::sync::Arc<plugin::PluginDeviceApi> {
    let api = plugin_util::sample(name, defines);
    let dev = Device::new(api.code(), 0);
    let s = api.create_stream(dev).unwrap();
    let p = api.alloc_data_space(dev, 4096, 64, U8).unwrap();
    api.memset(dev, p, 0, 1, 4096, s).unwrap();
    api.memset(dev, p, 1024, 7, 1024, s).unwrap();
    api.sync_stream(dev, s).unwrap();
    let mut out = vec![0u8; 4096];
    let mut shape = [4096i64];
    let src = dl(p.as_raw().cast(), dev, &mut shape, 0);
    let dst = dl(out.as_mut_ptr(), Device::cpu(), &mut shape, 0);
    // SAFETY: in bounds; synchronized below.
    unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap();
    api.sync_stream(dev, StreamHandle::DEFAULT).unwrap();
    let mut want = vec![1u8; 4096];
    want[1024..2048].fill(7);
    assert_eq!(out, want, "{name}");
    api.free_stream(dev, s).unwrap();
    api.free_data_space(dev, p).unwrap();
    api
}

#[test]
fn async_memset_is_used_when_present_and_falls_back_when_absent_or_past_the_table() {
    let full = memset_case("memset_async", &[]);
    assert_eq!(full.info().abi, (1, 2));
    assert!(!full.info().absent_entries.contains(&"async_memory_set"));
    let none = memset_case("memset_none", &["SAMPLE_NO_ASYNC_MEMSET"]);
    assert!(none.info().absent_entries.contains(&"async_memory_set"));
    let old = memset_case("memset_old", &["SAMPLE_TABLE_1_1"]);
    assert_eq!(old.info().abi, (1, 1));
    assert_eq!(
        old.info().table_size,
        plugin::sys::KILN_DEVICE_INTERFACE_SIZE_1_1
    );
    assert!(old.info().absent_entries.contains(&"async_memory_set"));
    memset_case("memset_minimal", &["SAMPLE_MINIMAL"]);
}

#[test]
fn an_async_memset_out_of_bounds_is_refused_before_it_is_queued() {
    let api = plugin_util::sample("memset_fail", &[]);
    let dev = Device::new(api.code(), 0);
    let s = api.create_stream(dev).unwrap();
    let p = api.alloc_data_space(dev, 4096, 64, U8).unwrap();
    // kiln checks the range before queueing; the stream stays clean for the next fill.
    let e = api.memset(dev, p, 4000, 0, 200, s).unwrap_err();
    assert!(matches!(e, DeviceError::OutOfBounds { .. }), "{e}");
    api.memset(dev, p, 0, 0, 4096, s).unwrap();
    api.sync_stream(dev, s).unwrap();
    api.free_stream(dev, s).unwrap();
    api.free_data_space(dev, p).unwrap();
}

// ------------------------------------------------------------------ 8. pinned staging

fn p2p_roundtrip(name: &str, defines: &[&str]) {
    let api = plugin_util::sample(name, defines);
    let (d0, d1) = (Device::new(api.code(), 0), Device::new(api.code(), 1));
    let n = 3 << 20;
    let a = api.alloc_data_space(d0, n, 64, U8).unwrap();
    let b = api.alloc_data_space(d1, n, 64, U8).unwrap();
    let mut bytes: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    let mut shape = [n as i64];
    for _ in 0..2 {
        let src = dl(bytes.as_mut_ptr(), Device::cpu(), &mut shape, 0);
        let dst = dl(a.as_raw().cast(), d0, &mut shape, 0);
        // SAFETY: in bounds; synchronized below.
        unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap();
        let src = dl(a.as_raw().cast(), d0, &mut shape, 0);
        let dst = dl(b.as_raw().cast(), d1, &mut shape, 0);
        // SAFETY: in bounds; synchronized below.
        unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap();
        api.sync_stream(d0, StreamHandle::DEFAULT).unwrap();
        let mut out = vec![0u8; n];
        let src = dl(b.as_raw().cast(), d1, &mut shape, 0);
        let dst = dl(out.as_mut_ptr(), Device::cpu(), &mut shape, 0);
        // SAFETY: in bounds; synchronized below.
        unsafe { api.copy_data_from_to(&src, &dst, StreamHandle::DEFAULT) }.unwrap();
        api.sync_stream(d1, StreamHandle::DEFAULT).unwrap();
        assert_eq!(out, bytes, "{name}");
        bytes.reverse();
    }
    api.free_data_space(d0, a).unwrap();
    api.free_data_space(d1, b).unwrap();
}

#[test]
fn copies_between_plugin_devices_stage_through_pinned_memory_or_ordinary_memory() {
    p2p_roundtrip("stage_pinned", &[]);
    p2p_roundtrip("stage_plain", &["SAMPLE_NO_PINNED"]);
}
