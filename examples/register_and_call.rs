//! Registers a Rust function in kiln's global registry, looks it up by name and calls it, then
//! calls it again through the C safe-call ABI that tvm-ffi hosts and generated code use.
//!
//! Run: `cargo run --example register_and_call`

use kiln::packed_func::{ffi, registry, Any, PackedFunc};

fn main() -> Result<(), kiln::Error> {
    let axpy = PackedFunc::from_typed("demo.axpy", |a: f64, x: f64, y: f64| a * x + y);
    registry::register("demo.axpy", axpy, false)?;

    let f = registry::require("demo.axpy")?;
    let r: f64 = f.call_typed((2.0f64, 3.0f64, 1.0f64))?;
    println!("demo.axpy(2, 3, 1) = {r}");

    // The same function as a C caller sees it.
    let (call, handle) = f.safe_call();
    let args = [Any::from(2.0f64), Any::from(3.0f64), Any::from(1.0f64)];
    let mut ret = ffi::TVMFFIAny::NONE;
    // SAFETY: three valid arguments, a writable result, and `f` outlives the call.
    let code = unsafe { call(handle, args.as_ptr().cast(), 3, &mut ret) };
    // SAFETY: on success the callee wrote an owned value.
    let value = unsafe { Any::from_raw(ret) };
    println!("through the C ABI: return code {code}, value {value:?}");

    // A bad call is an error that says what was expected.
    let err = f.call_typed::<_, f64>(("two", 3.0f64, 1.0f64)).unwrap_err();
    println!("bad call: {err}");
    println!("registered functions: {:?}", registry::list_prefix("demo."));
    Ok(())
}
