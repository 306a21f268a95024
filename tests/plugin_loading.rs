//! Loading device plugins: every bad input gives an error that says what happened (with the
//! plugin's own message), and kiln keeps working afterwards.

mod plugin_util;

use kiln::device_api::plugin::{self, PluginError};
use kiln::device_api::{self, AttrKind, Device, DeviceApi, Tensor};
use kiln::packed_func::registry;

/// kiln still works: the CPU backend copies, and a good plugin loads and round-trips data.
fn kiln_keeps_working() {
    let cpu = Tensor::from_slice(&[1.0f32, 2.0], &[2], Device::cpu()).unwrap();
    assert_eq!(cpu.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    let api = plugin_util::sample("load_good", &[]);
    let t = Tensor::from_slice(&[3i32, 4, 5], &[3], Device::new(api.code(), 0)).unwrap();
    assert_eq!(t.to_vec::<i32>().unwrap(), vec![3, 4, 5]);
}

#[test]
fn a_library_without_the_entry_symbol_is_refused_by_name() {
    let lib = plugin_util::build_c("no_entry", "int some_other_function(void) { return 1; }\n");
    let e = plugin::load_plugin(&lib).unwrap_err();
    assert!(matches!(e, PluginError::NoEntry { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("does not export `kiln_device_plugin_init`"),
        "{msg}"
    );
    assert!(msg.contains("libno_entry.so"), "{msg}");
    kiln_keeps_working();
}

#[test]
fn a_file_that_is_not_a_shared_library_is_refused_without_opening_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("libjunk.so");
    std::fs::write(&f, "this is not an ELF file\n").unwrap();
    let e = plugin::load_plugin(&f).unwrap_err();
    assert!(matches!(e, PluginError::NotALibrary { .. }), "{e}");
    assert!(e.to_string().contains("is not a device plugin"), "{e}");
    let missing = plugin::load_plugin(dir.path().join("libmissing.so")).unwrap_err();
    assert!(
        matches!(missing, PluginError::NotALibrary { .. }),
        "{missing}"
    );
    // A device is refused before it is read (`/dev/zero` never ends).
    if std::path::Path::new("/dev/zero").exists() {
        let e = plugin::load_plugin("/dev/zero").unwrap_err();
        assert!(
            matches!(e, PluginError::NotALibrary { .. })
                && e.to_string().contains("not a regular file"),
            "{e}"
        );
    }
    kiln_keeps_working();
}

#[test]
fn a_plugin_built_for_a_newer_major_version_is_refused() {
    let lib = plugin_util::build_sample("load_major2", &["SAMPLE_ABI_MAJOR=2"]);
    let e = plugin::load_plugin(&lib).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, PluginError::Version { plugin: (2, 2), .. }),
        "{msg}"
    );
    assert!(msg.contains("built for device plugin ABI 2.2"), "{msg}");
    assert!(msg.contains("newer than this kiln"), "{msg}");
    assert!(device_api::get_by_name("load_major2").is_err());
    kiln_keeps_working();
}

#[test]
fn an_old_plugin_with_a_smaller_table_is_accepted_and_newer_entries_are_absent() {
    let api = plugin_util::sample("load_old", &["SAMPLE_TABLE_1_0"]);
    let info = api.info();
    assert_eq!(info.abi, (1, 0));
    assert_eq!(info.table_size, plugin::sys::KILN_DEVICE_INTERFACE_SIZE_1_0);
    // The 1.1 entries are set in the plugin's memory past its table's end: kiln must not use them.
    assert!(info.absent_entries.contains(&"get_attribute"), "{info:?}");
    assert!(info.absent_entries.contains(&"get_kernels"), "{info:?}");
    assert!(info.kernels.is_empty());
    assert!(registry::get("load_old.add").is_none());
    let dev = Device::new(api.code(), 0);
    // Attributes come from the fallbacks: the name from the device type, the compute version
    // from get_compute_capability, memory from device_memory_stats; the warp size only the
    // plugin's get_attribute would know.
    let name = api.attr(dev, AttrKind::DEVICE_NAME).unwrap().unwrap();
    assert_eq!(name.as_str(), Some("load_old simulated #0"));
    let cv = api.attr(dev, AttrKind::COMPUTE_VERSION).unwrap().unwrap();
    assert_eq!(cv.as_str(), Some("1.2"));
    let total = api
        .attr(dev, AttrKind::TOTAL_GLOBAL_MEMORY)
        .unwrap()
        .unwrap();
    assert_eq!(total.as_int(), Some(256 << 20));
    assert_eq!(api.attr(dev, AttrKind::WARP_SIZE).unwrap(), None);
    // And it works.
    let t = Tensor::from_slice(&[1u8, 2, 3], &[3], dev).unwrap();
    assert_eq!(t.to_vec::<u8>().unwrap(), vec![1, 2, 3]);
}

#[test]
fn a_plugin_missing_required_entries_is_refused_and_each_is_named() {
    let lib = plugin_util::build_sample("load_missing", &["SAMPLE_DROP_REQUIRED"]);
    let e = plugin::load_plugin(&lib).unwrap_err();
    match &e {
        PluginError::MissingEntries {
            missing,
            device_type,
            ..
        } => {
            assert_eq!(device_type, "load_missing");
            assert_eq!(missing, &["memory_copy_d2h", "create_event"]);
        }
        other => panic!("expected MissingEntries, got {other}"),
    }
    assert!(
        e.to_string()
            .contains("lacks required entries: memory_copy_d2h, create_event"),
        "{e}"
    );
    kiln_keeps_working();
}

#[test]
fn a_failing_initialize_is_reported_with_the_plugins_message() {
    let lib = plugin_util::build_sample("load_fail_init", &["SAMPLE_FAIL_INIT"]);
    let e = plugin::load_plugin(&lib).unwrap_err();
    assert!(matches!(e, PluginError::InitFailed { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("initialize (status 1) failed"), "{msg}");
    assert!(
        msg.contains("firmware image not found (injected init failure)"),
        "{msg}"
    );
    assert!(device_api::get_by_name("load_fail_init").is_err());
    // A second attempt fails the same way (nothing half-registered stands in the way).
    let again = plugin::load_plugin(&lib).unwrap_err();
    assert_eq!(again.to_string(), msg);
    kiln_keeps_working();
}

#[test]
fn loading_the_same_file_twice_returns_the_plugin_loaded_first() {
    let a = plugin_util::sample("load_twice", &[]);
    let b = plugin::load_plugin(&a.info().path).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    assert!(plugin::loaded_plugins()
        .iter()
        .any(|p| std::sync::Arc::ptr_eq(p, &a)));
}

#[test]
fn a_plugin_is_registered_as_a_backend_with_an_extension_code_and_its_kernels() {
    let api = plugin_util::sample("load_registered", &[]);
    let info = api.info();
    assert!(info.code.0 >= 64 && info.code.0 < 128, "{info:?}");
    let by_name = device_api::get_by_name("load_registered").unwrap();
    assert_eq!(by_name.device_type(), api.code());
    let f = registry::require("device_api.load_registered").unwrap();
    assert_eq!(f.call_typed::<_, i64>(()).unwrap(), i64::from(api.code().0));
    assert_eq!(info.device_count, 2);
    assert_eq!(info.device_list, vec![0, 1]);
    assert_eq!(info.plugin_version, (0, 3, 1));
    assert_eq!(info.sub_device_type.as_deref(), Some("simulated"));
    assert_eq!(
        info.kernels,
        vec![
            "load_registered.add",
            "load_registered.inject_alloc_failure",
            "load_registered.inject_copy_failure"
        ]
    );
    assert_eq!(
        info.absent_entries,
        vec!["memory_copy_p2p", "async_memory_copy_p2p"]
    );
    let c = info.chunk_config.unwrap();
    assert_eq!(
        (c.min_chunk_size, c.extra_padding_size, c.realloc_size),
        (256, 64, 4 << 20)
    );
    assert_eq!((c.init_alloc_size, c.max_chunk_size), (1 << 20, 32 << 20));
    // The initial chunk was allocated at load.
    assert_eq!(api.allocator_stats(0).unwrap().reserved, 1 << 20);
}

#[test]
fn every_library_in_the_plugin_directories_loads_and_bad_files_are_reported_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    plugin_util::build_sample_in(dir.path(), "scan_good", &[]);
    std::fs::write(dir.path().join("libbroken.so"), b"\x7fELF but truncated").unwrap();
    std::fs::write(dir.path().join("README.txt"), "not a library, ignored").unwrap();
    let missing = dir.path().join("does-not-exist");
    let scan = plugin::load_plugins_from_dirs([dir.path().to_path_buf(), missing.clone()]);
    let names: Vec<String> = scan.loaded.iter().map(|p| p.info().name).collect();
    assert_eq!(names, vec!["scan_good"]);
    assert_eq!(scan.failed.len(), 2, "{:?}", scan.failed);
    assert!(scan.failed[0].0.ends_with("libbroken.so"));
    assert!(matches!(scan.failed[0].1, PluginError::NotALibrary { .. }));
    assert_eq!(scan.failed[1].0, missing);
    assert!(scan.failed[1]
        .1
        .to_string()
        .contains("cannot read the plugin directory"));
    assert!(device_api::get_by_name("scan_good").is_ok());
    kiln_keeps_working();
}

#[test]
fn a_plugin_file_in_the_plugin_path_is_loaded_and_a_missing_entry_is_named_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let lib = plugin_util::build_sample_in(dir.path(), "path_file", &[]);
    let missing = dir.path().join("nowhere");
    let scan = plugin::load_plugins_from_dirs([lib.clone(), missing.clone()]);
    let names: Vec<String> = scan.loaded.iter().map(|p| p.info().name).collect();
    assert_eq!(names, vec!["path_file"]);
    assert_eq!(scan.failed.len(), 1, "{:?}", scan.failed);
    assert_eq!(scan.failed[0].0, missing);
    let msg = scan.failed[0].1.to_string();
    assert!(
        msg.contains("expected a directory of plugins or a plugin file"),
        "{msg}"
    );
    // A file that is not a plugin is reported as such, not as an unreadable directory.
    let junk = dir.path().join("notes.txt");
    std::fs::write(&junk, "hello").unwrap();
    let scan = plugin::load_plugins_from_dirs([junk.clone()]);
    assert_eq!(scan.failed.len(), 1);
    let msg = scan.failed[0].1.to_string();
    assert!(!msg.contains("cannot read the plugin directory"), "{msg}");
    assert!(msg.contains("is not a device plugin"), "{msg}");
}

#[test]
fn a_broken_symlink_in_the_plugin_directory_is_skipped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    plugin_util::build_sample_in(dir.path(), "scan_links", &[]);
    std::os::unix::fs::symlink(
        dir.path().join("gone.so"),
        dir.path().join("libdangling.so"),
    )
    .unwrap();
    let scan = plugin::load_plugins_from_dirs([dir.path()]);
    let names: Vec<String> = scan.loaded.iter().map(|p| p.info().name).collect();
    assert_eq!(names, vec!["scan_links"]);
    assert!(scan.failed.is_empty(), "{:?}", scan.failed);
    assert_eq!(scan.skipped.len(), 1, "{:?}", scan.skipped);
    assert!(scan.skipped[0].0.ends_with("libdangling.so"));
    assert!(
        scan.skipped[0].1.contains("a broken symbolic link to"),
        "{:?}",
        scan.skipped
    );
}
