//! Packed functions: values, typed and untyped calls, the C trampoline, foreign functions loaded
//! from a C library, the registry, and every bad input the issue lists.

mod common;

use std::ffi::c_void;

use kiln::packed_func::ffi::{self, TVMFFIAny};
use kiln::packed_func::{
    registry, Any, AnyView, DLDataType, DLDevice, DLDeviceType, DLTensor, Module, PackedFunc,
    PackedFuncError, TypeIndex, Value,
};
use kiln::runtime::LibraryModule;

fn foreign_lib() -> (tempfile::TempDir, LibraryModule) {
    let dir = tempfile::tempdir().unwrap();
    let so = common::build_c_shared(dir.path(), "foreign", &["tests/c/foreign.c"], &[]);
    // SAFETY: the library is our own test C file, a well-behaved tvm-ffi module.
    let lib = unsafe { LibraryModule::load(&so) }.unwrap();
    (dir, lib)
}

fn tensor1(x: &mut f32, shape: &mut [i64; 1]) -> DLTensor {
    DLTensor {
        data: (x as *mut f32).cast::<c_void>(),
        device: DLDevice {
            device_type: DLDeviceType::CPU,
            device_id: 0,
        },
        ndim: 1,
        dtype: DLDataType {
            code: ffi::DLDataTypeCode::FLOAT,
            bits: 32,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

#[test]
fn values_round_trip_through_any() {
    assert_eq!(Any::from(7i64).get::<i64>().unwrap(), 7);
    assert!(Any::from(true).get::<bool>().unwrap());
    assert_eq!(
        Any::from(true).get::<i64>().unwrap(),
        1,
        "int accepts bool, as in tvm-ffi"
    );
    assert_eq!(Any::from(2.5f64).get::<f64>().unwrap(), 2.5);
    assert_eq!(
        Any::from(3i64).get::<f64>().unwrap(),
        3.0,
        "float accepts int"
    );
    assert_eq!(Any::from("short").get::<String>().unwrap(), "short");
    assert_eq!(Any::from("short").type_index(), TypeIndex::SMALL_STR);
    let long = "a string longer than seven bytes";
    let a = Any::from(long);
    assert_eq!(a.type_index(), TypeIndex::STR);
    let b = a.clone();
    drop(a);
    assert_eq!(
        b.get::<String>().unwrap(),
        long,
        "clone keeps the object alive"
    );
    assert!(matches!(
        Any::bytes(&[1, 2, 3]).value(),
        Value::Bytes(&[1, 2, 3])
    ));
    assert!(matches!(Any::bytes(&[9; 20]).value(), Value::Bytes(b) if b.len() == 20));
    let dev = DLDevice {
        device_type: DLDeviceType::CPU,
        device_id: 3,
    };
    assert_eq!(Any::from(dev).get::<DLDevice>().unwrap(), dev);
    let dt = DLDataType {
        code: ffi::DLDataTypeCode::FLOAT,
        bits: 16,
        lanes: 1,
    };
    assert_eq!(Any::from(dt).get::<DLDataType>().unwrap(), dt);
    assert!(Any::none().is_none());
    assert_eq!(Any::from(5i64), Any::from(5i64));
}

#[test]
fn conversion_errors_name_the_expected_and_found_type() {
    let e = Any::from(1.5f64).get::<i64>().unwrap_err();
    assert_eq!(e.to_string(), "expected int, found float");
    let e = Any::from("x").get::<DLDevice>().unwrap_err();
    assert_eq!(e.to_string(), "expected Device, found str");
    let e = i64::try_from(Any::from("text that is long")).unwrap_err();
    assert_eq!(e.to_string(), "TypeError: expected int, found str");
}

#[test]
fn tensor_objects_expose_their_dltensor_and_free_their_owner_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    struct Owner(Arc<AtomicUsize>);
    impl Drop for Owner {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let mut x = 4.0f32;
    let mut shape = [1i64];
    let t = tensor1(&mut x, &mut shape);
    // SAFETY: shape has ndim entries; `x` outlives the object (it is dropped in this scope).
    let obj = unsafe { Any::tensor_object(&t, Owner(drops.clone())) };
    assert_eq!(obj.type_index(), TypeIndex::TENSOR);
    let view = obj.view();
    let dl = view.as_dltensor().unwrap();
    assert_eq!(dl.ndim, 1);
    // SAFETY: the object copied the shape array; it has one element.
    assert_eq!(unsafe { *dl.shape }, 1);
    let copy = obj.clone();
    drop(obj);
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    drop(copy);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn typed_closures_check_argument_count_and_types() {
    let f = PackedFunc::from_typed("scale", |x: f64, k: i64| x * k as f64);
    assert_eq!(f.call_typed::<_, f64>((2.0f64, 3i64)).unwrap(), 6.0);
    let e = f.call_typed::<_, f64>((2.0f64,)).unwrap_err();
    assert_eq!(
        e,
        PackedFuncError::ArgCount {
            name: "scale".into(),
            expected: 2,
            found: 1
        }
    );
    assert_eq!(
        e.to_string(),
        "TypeError: packed function `scale` expects 2 arguments, found 1"
    );
    let e = f.call_typed::<_, f64>((2.0f64, 1.5f64)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "TypeError: packed function `scale`: argument #1 expects int, found float"
    );
    assert_eq!(e.kind(), "TypeError");
    // Wrong return type.
    let e = f.call_typed::<_, String>((2.0f64, 3i64)).unwrap_err();
    assert_eq!(e.to_string(), "TypeError: expected str, found float");
}

#[test]
fn typed_closures_can_return_errors_with_a_kind() {
    let f = PackedFunc::from_typed("checked_sqrt", |x: f64| -> Result<f64, PackedFuncError> {
        if x < 0.0 {
            return Err(PackedFuncError::Raised {
                kind: "ValueError".into(),
                message: format!("negative input {x}"),
            });
        }
        Ok(x.sqrt())
    });
    assert_eq!(f.call_typed::<_, f64>((4.0f64,)).unwrap(), 2.0);
    let e = f.call_typed::<_, f64>((-1.0f64,)).unwrap_err();
    assert_eq!(e.kind(), "ValueError");
    assert_eq!(e.message(), "negative input -1");
}

#[test]
fn a_panicking_closure_becomes_a_runtime_error() {
    let f = PackedFunc::new("boom", |_| panic!("kaboom"));
    let e = f.call(&[]).unwrap_err();
    assert_eq!(
        e,
        PackedFuncError::Panicked {
            name: "boom".into(),
            message: "kaboom".into()
        }
    );
    assert_eq!(e.kind(), "RuntimeError");
}

#[test]
fn the_trampoline_catches_panics_and_raises_instead_of_unwinding_into_c() {
    let f = PackedFunc::new("boom", |_| panic!("kaboom"));
    let (call, handle) = f.safe_call();
    let mut ret = TVMFFIAny::NONE;
    // SAFETY: the pair comes from a live PackedFunc; 0 args with NULL is allowed.
    let code = unsafe { call(handle, std::ptr::null(), 0, &mut ret) };
    assert_eq!(code, -1);
    let (kind, msg) = ffi::take_raised().expect("an error was raised");
    assert_eq!(kind, "RuntimeError");
    assert!(msg.contains("kaboom"), "{msg}");
}

#[test]
fn the_trampoline_rejects_null_args_with_a_positive_count() {
    let f = PackedFunc::from_typed("id", |x: i64| x);
    let (call, handle) = f.safe_call();
    let mut ret = TVMFFIAny::NONE;
    // SAFETY: deliberately bad arguments: the trampoline must reject them without reading.
    let code = unsafe { call(handle, std::ptr::null(), 3, &mut ret) };
    assert_eq!(code, -1);
    let (kind, msg) = ffi::take_raised().unwrap();
    assert_eq!(kind, "ValueError");
    assert_eq!(
        msg,
        "packed function `id` called with args = NULL and num_args = 3"
    );
    // SAFETY: as above, a negative count.
    let code = unsafe { call(handle, std::ptr::null(), -1, &mut ret) };
    assert_eq!(code, -1);
    assert!(ffi::take_raised().is_some());
}

#[test]
fn the_trampoline_returns_values_through_ret() {
    let f = PackedFunc::from_typed("greet", |n: i64| format!("hello number {n}"));
    let (call, handle) = f.safe_call();
    let args = [Any::from(5i64)];
    let mut ret = TVMFFIAny::NONE;
    // SAFETY: one valid argument; `ret` is writable.
    let code = unsafe { call(handle, args.as_ptr().cast(), 1, &mut ret) };
    assert_eq!(code, 0);
    // SAFETY: the trampoline wrote an owned value.
    let v = unsafe { Any::from_raw(ret) };
    assert_eq!(v.get::<String>().unwrap(), "hello number 5");
}

#[test]
fn a_rust_closure_called_through_its_own_safe_call_as_a_foreign_function() {
    let f = PackedFunc::from_typed("add", |a: i64, b: i64| a + b);
    let (call, handle) = f.safe_call();
    // SAFETY: the pair stays valid while `f` lives, and `f` outlives `g`'s use below.
    let g = unsafe { PackedFunc::from_safe_call("add_via_c", call, handle, None) };
    assert_eq!(g.call_typed::<_, i64>((2i64, 40i64)).unwrap(), 42);
    let e = g.call_typed::<_, i64>((2i64,)).unwrap_err();
    assert_eq!(
        e.kind(),
        "TypeError",
        "the kind survives the round trip through C: {e}"
    );
    assert!(e.to_string().contains("expects 2 arguments, found 1"));
}

#[test]
fn foreign_functions_from_a_c_library_are_called_and_their_errors_keep_their_kind() {
    let (_dir, lib) = foreign_lib();
    assert_eq!(
        lib.function_names(),
        ["add", "fail_silent", "fail_value", "nop3", "sum3"]
    );
    let add = lib.require_function("add").unwrap();
    assert_eq!(add.call_typed::<_, i64>((20i64, 22i64)).unwrap(), 42);
    let e = add.call_typed::<_, i64>((1.5f64, 2i64)).unwrap_err();
    assert_eq!(
        e,
        PackedFuncError::Raised {
            kind: "TypeError".into(),
            message: "add expects ints".into()
        }
    );
    let e = lib
        .require_function("fail_value")
        .unwrap()
        .call(&[])
        .unwrap_err();
    assert_eq!(e.kind(), "ValueError");
    assert_eq!(e.to_string(), "ValueError: value out of range: 42");
    let e = lib
        .require_function("fail_silent")
        .unwrap()
        .call(&[])
        .unwrap_err();
    assert_eq!(
        e,
        PackedFuncError::ReturnedWithoutError {
            name: "fail_silent".into(),
            code: 7
        }
    );
    assert_eq!(e.kind(), "RuntimeError");
}

#[test]
fn foreign_functions_take_dltensor_pointers_and_tensor_objects() {
    let (_dir, lib) = foreign_lib();
    let sum3 = lib.require_function("sum3").unwrap();
    let (mut a, mut b, mut c) = (1.0f32, 2.0f32, 4.0f32);
    let (mut sa, mut sb, mut sc) = ([1i64], [1i64], [1i64]);
    let (ta, tb, tc) = (
        tensor1(&mut a, &mut sa),
        tensor1(&mut b, &mut sb),
        tensor1(&mut c, &mut sc),
    );
    let r: f64 = sum3.call_typed((&ta, &tb, &tc)).unwrap();
    assert_eq!(r, 7.0);
    // SAFETY: shape has one element; `c` outlives the object.
    let obj = unsafe { Any::tensor_object(&tc, ()) };
    let r = sum3
        .call(&[AnyView::from(&ta), AnyView::from(&tb), obj.view()])
        .unwrap();
    assert_eq!(r.get::<f64>().unwrap(), 7.0);
}

#[test]
fn a_function_keeps_its_library_loaded_after_the_module_is_dropped() {
    let (_dir, lib) = foreign_lib();
    let add = lib.require_function("add").unwrap();
    drop(lib);
    assert_eq!(add.call_typed::<_, i64>((1i64, 2i64)).unwrap(), 3);
}

#[test]
fn asking_a_module_for_a_missing_function_lists_what_it_has() {
    let (_dir, lib) = foreign_lib();
    let e = lib.require_function("ad").unwrap_err();
    assert_eq!(
        e.to_string(),
        "module `library` has no function `ad`; it has: add, fail_silent, fail_value, nop3, sum3"
    );
}

#[test]
fn loading_a_file_that_is_not_a_shared_library_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("not_a_lib.so");
    std::fs::write(&p, b"hello").unwrap();
    // SAFETY: the file is rejected before dlopen.
    let e = unsafe { LibraryModule::load(&p) }.unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "cannot read `{}` as a shared library",
            p.display()
        )),
        "{e}"
    );
    // SAFETY: a missing file is rejected before dlopen.
    let e = unsafe { LibraryModule::load(dir.path().join("missing.so")) }.unwrap_err();
    assert!(e.to_string().contains("No such file"), "{e}");
    // A device (or a pipe) is refused before it is read: `/dev/zero` never ends.
    if std::path::Path::new("/dev/zero").exists() {
        // SAFETY: the path is rejected before dlopen.
        let e = unsafe { LibraryModule::load("/dev/zero") }.unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
    // SAFETY: a directory is rejected before dlopen.
    let e = unsafe { LibraryModule::load(dir.path()) }.unwrap_err();
    assert!(
        e.to_string().contains("not a regular file (a directory)"),
        "{e}"
    );
}

#[test]
fn registry_registers_gets_lists_and_removes() {
    let f = PackedFunc::from_typed("t.reg.one", || 1i64);
    registry::register("t.reg.one", f.clone(), false).unwrap();
    let e = registry::register("t.reg.one", f.clone(), false).unwrap_err();
    assert_eq!(
        e.to_string(),
        "global function `t.reg.one` is already registered (pass override = true to replace it)"
    );
    let g = PackedFunc::from_typed("t.reg.one", || 2i64);
    registry::register("t.reg.one", g, true).unwrap();
    assert_eq!(
        registry::require("t.reg.one")
            .unwrap()
            .call_typed::<_, i64>(())
            .unwrap(),
        2
    );
    assert!(registry::list().contains(&"t.reg.one".to_owned()));
    assert_eq!(registry::list_prefix("t.reg."), ["t.reg.one"]);
    let e = registry::require("t.reg.onee").unwrap_err();
    assert_eq!(
        e.to_string(),
        "no global function `t.reg.onee`; did you mean `t.reg.one`?"
    );
    assert!(registry::remove("t.reg.one").is_some());
    assert!(registry::get("t.reg.one").is_none());
    assert!(registry::remove("t.reg.one").is_none());
}

#[test]
fn the_registry_is_safe_to_use_from_many_threads() {
    let handles: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let name = format!("t.threads.{i}");
                registry::register(
                    &name,
                    PackedFunc::from_typed(name.clone(), move || i as i64),
                    false,
                )
                .unwrap();
                registry::require(&name)
                    .unwrap()
                    .call_typed::<_, i64>(())
                    .unwrap()
            })
        })
        .collect();
    let mut got: Vec<i64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    got.sort();
    assert_eq!(got, (0..8).collect::<Vec<_>>());
}

#[test]
fn kiln_errors_convert_into_raised_errors_with_their_kind() {
    let e: kiln::Error = PackedFuncError::ArgCount {
        name: "f".into(),
        expected: 1,
        found: 0,
    }
    .into();
    assert_eq!(e.kind(), "TypeError");
    let back: PackedFuncError = e.into();
    assert_eq!(back.kind(), "TypeError");
}
