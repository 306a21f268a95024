//! Call overhead of packed functions, measured in one run against a direct C call.
//!
//! - direct: `nop3_direct(DLTensor*, DLTensor*, DLTensor*)` through an `extern "C"` fn pointer;
//! - packed (foreign): the same work as a tvm-ffi safe-call `__tvm_ffi_nop3`, called through
//!   `PackedFunc::call` with 3 DLTensor arguments;
//! - packed (Rust closure): a closure reading its 3 tensor arguments, through `PackedFunc::call`.
//!
//! Goal (issue 2): packed(foreign) <= 2 x direct + 5 ns. Run: `cargo bench --bench packed_call`.

#[path = "util/mod.rs"]
mod util;

use std::hint::black_box;
use std::process::Command;

use kiln::packed_func::{AnyView, DLTensor, Module, PackedFunc};
use kiln::runtime::LibraryModule;

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("libforeign.so");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/foreign.c"))
        .status()
        .unwrap();
    assert!(status.success());
    // SAFETY: our own test library.
    let lib = unsafe { LibraryModule::load(&so) }.unwrap();
    // SAFETY: the library exports `nop3_direct` with this signature (tests/c/foreign.c).
    let raw = unsafe { libloading::Library::new(&so) }.unwrap();
    type Direct = unsafe extern "C" fn(*mut DLTensor, *mut DLTensor, *mut DLTensor) -> i32;
    // SAFETY: as above.
    let direct: Direct = unsafe { *raw.get::<Direct>(b"nop3_direct\0").unwrap() };

    let mut x = [0f32; 1];
    let mut shape = [1i64];
    let mut t = util::f32_tensor(x.as_mut_ptr(), shape.as_mut_ptr());
    let foreign = lib.require_function("nop3").unwrap();
    let closure = PackedFunc::new("nop3_rust", |args| {
        let mut n = 0;
        for a in args {
            n += a.as_dltensor().map_or(0, |t| t.ndim);
        }
        black_box(n);
        Ok(kiln::packed_func::Any::none())
    });

    let iters = 2_000_000;
    let tp: *mut DLTensor = &mut t;
    let d = util::measure(21, iters, || {
        // SAFETY: three valid tensor pointers.
        black_box(unsafe { direct(black_box(tp), black_box(tp), black_box(tp)) });
    });
    let args = [
        AnyView::dltensor(&t),
        AnyView::dltensor(&t),
        AnyView::dltensor(&t),
    ];
    let p = util::measure(21, iters, || {
        black_box(foreign.call(black_box(&args)).unwrap());
    });
    let c = util::measure(21, iters, || {
        black_box(closure.call(black_box(&args)).unwrap());
    });
    println!("packed-function call overhead (3 DLTensor arguments), ns per call:");
    util::report("direct extern \"C\" call", d, None);
    util::report("PackedFunc -> foreign safe-call", p, Some(d));
    util::report("PackedFunc -> Rust closure", c, Some(d));
    let goal = 2.0 * d.median + 5.0;
    println!(
        "goal: foreign <= 2 x direct + 5 ns = {goal:.2} ns -> {}",
        if p.median <= goal { "met" } else { "NOT met" }
    );
}
