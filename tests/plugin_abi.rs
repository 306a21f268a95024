//! The header is the source of truth: a C file compiled against `include/kiln/device_plugin.h`
//! prints the size and field offsets of every struct and the constants, and they must equal the
//! Rust mirror in `kiln::device_api::plugin::sys`.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

use kiln::device_api::plugin::sys::*;

macro_rules! layout {
    ($out:ident, $c:ident, $ty:ident { $($field:ident $(as $cfield:ident)?),* $(,)? }) => {{
        $c.push_str(&format!("  printf(\"sizeof({0}) %zu\\n\", sizeof({0}));\n", stringify!($ty)));
        $out.push((format!("sizeof({})", stringify!($ty)), size_of::<$ty>()));
        $(
            let cname = layout!(@name $field $($cfield)?);
            $c.push_str(&format!(
                "  printf(\"offsetof({0}, {1}) %zu\\n\", offsetof({0}, {1}));\n",
                stringify!($ty), cname
            ));
            $out.push((format!("offsetof({}, {})", stringify!($ty), cname), offset_of!($ty, $field)));
        )*
    }};
    (@name $field:ident) => { stringify!($field) };
    (@name $field:ident $cfield:ident) => { stringify!($cfield) };
}

#[test]
fn struct_layouts_and_constants_match_the_c_header() {
    let mut rust: Vec<(String, usize)> = Vec::new();
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"kiln/device_plugin.h\"\nint main(void) {\n",
    );
    layout!(
        rust,
        c,
        KilnDeviceInterface {
            struct_size,
            abi_major,
            abi_minor,
            initialize,
            finalize,
            init_device,
            deinit_device,
            set_device,
            get_device,
            synchronize_device,
            get_device_count,
            get_device_list,
            get_compute_capability,
            get_runtime_version,
            get_driver_version,
            device_memory_allocate,
            device_memory_deallocate,
            host_memory_allocate,
            host_memory_deallocate,
            unified_memory_allocate,
            unified_memory_deallocate,
            memory_copy_h2d,
            memory_copy_d2h,
            memory_copy_d2d,
            memory_copy_p2p,
            async_memory_copy_h2d,
            async_memory_copy_d2h,
            async_memory_copy_d2d,
            async_memory_copy_p2p,
            device_memory_set,
            device_memory_stats,
            device_min_chunk_size,
            device_max_chunk_size,
            device_max_alloc_size,
            device_extra_padding_size,
            device_init_alloc_size,
            device_realloc_size,
            create_stream,
            destroy_stream,
            query_stream,
            synchronize_stream,
            stream_add_callback,
            stream_wait_event,
            create_event,
            destroy_event,
            record_event,
            query_event,
            synchronize_event,
            get_last_error,
            get_attribute,
            get_kernels,
            async_memory_set,
        }
    );
    layout!(
        rust,
        c,
        KilnPluginParams {
            struct_size,
            abi_major,
            abi_minor,
            device_type,
            sub_device_type,
            plugin_version_major,
            plugin_version_minor,
            plugin_version_patch,
            reserved,
            interface,
        }
    );
    layout!(rust, c, KilnPluginKernel { struct_size, abi_major, abi_minor, name, call, self_ as self });
    layout!(rust, c, KilnAttrValue {
        struct_size, abi_major, abi_minor, type_ as type, reserved, int_value, string_value,
    });
    let consts: &[(&str, usize)] = &[
        ("KILN_PLUGIN_ABI_MAJOR", KILN_PLUGIN_ABI_MAJOR as usize),
        ("KILN_PLUGIN_ABI_MINOR", KILN_PLUGIN_ABI_MINOR as usize),
        ("KILN_PLUGIN_MIN_ALIGNMENT", KILN_PLUGIN_MIN_ALIGNMENT),
        ("KILN_ATTR_STRING_CAPACITY", KILN_ATTR_STRING_CAPACITY),
        ("KILN_DEVICE_INTERFACE_SIZE", KILN_DEVICE_INTERFACE_SIZE),
        (
            "KILN_DEVICE_INTERFACE_SIZE_1_0",
            KILN_DEVICE_INTERFACE_SIZE_1_0,
        ),
        (
            "KILN_DEVICE_INTERFACE_SIZE_1_1",
            KILN_DEVICE_INTERFACE_SIZE_1_1,
        ),
        ("KILN_PLUGIN_PARAMS_SIZE", KILN_PLUGIN_PARAMS_SIZE),
        ("KILN_STATUS_SUCCESS", KILN_STATUS_SUCCESS as usize),
        ("KILN_STATUS_ERROR", KILN_STATUS_ERROR as usize),
        (
            "KILN_STATUS_OUT_OF_MEMORY",
            KILN_STATUS_OUT_OF_MEMORY as usize,
        ),
        (
            "KILN_STATUS_INVALID_ARGUMENT",
            KILN_STATUS_INVALID_ARGUMENT as usize,
        ),
        ("KILN_STATUS_NOT_READY", KILN_STATUS_NOT_READY as usize),
        ("KILN_STATUS_UNSUPPORTED", KILN_STATUS_UNSUPPORTED as usize),
        (
            "KILN_STATUS_VERSION_MISMATCH",
            KILN_STATUS_VERSION_MISMATCH as usize,
        ),
        ("KILN_ATTR_NONE", KILN_ATTR_NONE as usize),
        ("KILN_ATTR_INT", KILN_ATTR_INT as usize),
        ("KILN_ATTR_STRING", KILN_ATTR_STRING as usize),
    ];
    for (name, v) in consts {
        c.push_str(&format!("  printf(\"{name} %zu\\n\", (size_t)({name}));\n"));
        rust.push((name.to_string(), *v));
    }
    c.push_str(&format!(
        "  printf(\"entry %d\\n\", __builtin_strcmp(KILN_PLUGIN_ENTRY_SYMBOL, \"{KILN_PLUGIN_ENTRY_SYMBOL}\") == 0);\n"
    ));
    rust.push(("entry".into(), 1));
    c.push_str("  return 0;\n}\n");

    let dir = tempfile::tempdir().unwrap();
    let (src, exe) = (dir.path().join("layout.c"), dir.path().join("layout"));
    std::fs::write(&src, &c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the header does not compile as C11 with -Wall -Werror"
    );
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let from_c: HashMap<&str, usize> = text
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect();
    assert_eq!(from_c.len(), rust.len(), "C printed:\n{text}");
    for (k, v) in &rust {
        assert_eq!(
            from_c.get(k.as_str()),
            Some(v),
            "{k}: C says {:?}, Rust {v}",
            from_c.get(k.as_str())
        );
    }
}

#[test]
fn the_header_compiles_as_cplusplus_too() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("h.cc");
    std::fs::write(&src, "#include \"kiln/device_plugin.h\"\nint main() { return sizeof(KilnDeviceInterface) == KILN_DEVICE_INTERFACE_SIZE ? 0 : 1; }\n").unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let Ok(status) = Command::new(&cxx)
        .args(["-Wall", "-Werror", "-fsyntax-only", "-I"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/include"))
        .arg(&src)
        .status()
    else {
        eprintln!("skipped: no C++ compiler `{cxx}`");
        return;
    };
    assert!(status.success());
}
