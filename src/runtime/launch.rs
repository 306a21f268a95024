//! The kernel-launch service: the C entry point generated host code calls, through the context
//! slot `__KilnDeviceLaunch`, to launch kernel `k` of its device module ([`super::device_module`]).
//!
//! It converts the raw launch (a kernel index, raw arguments, grid and block extents) into a
//! checked one, catches any panic, and reports failures through tvm-ffi's error path (the
//! thread's raised error, then `-1`), so a failing launch surfaces as a Python or C error of
//! the calling function, never as a crash.

use std::ffi::c_void;
use std::sync::OnceLock;

use super::device_module::{DeviceModule, RawKernelArg};

/// The launch service generated host code reaches through the context slot
/// `__KilnDeviceLaunch`. Returns 0, or raises the error (tvm-ffi's error path) and returns -1.
///
/// # Safety
/// - `module` is NULL or a `DeviceModule` that outlives the call (the host code passes the
///   pointer kiln stored in its `__kiln_device_module` slot).
/// - `args` points to `nargs` readable `RawKernelArg`s.
pub unsafe extern "C" fn kiln_device_launch(
    module: *const c_void,
    kernel: i32,
    device_id: i32,
    args: *const RawKernelArg,
    nargs: i32,
    grid: *const i64,
    block: *const i64,
) -> i32 {
    let r = std::panic::catch_unwind(|| {
        if module.is_null() {
            return Err("this library launches device kernels but its device module is missing (the context slot `__kiln_device_module` is empty)".to_owned());
        }
        // SAFETY: the caller passes a live DeviceModule (see `# Safety`).
        let m = unsafe { &*(module as *const DeviceModule) };
        let n = usize::try_from(nargs).unwrap_or(0);
        let args = if n == 0 || args.is_null() {
            &[][..]
        } else {
            // SAFETY: `args` points to `nargs` RawKernelArgs (see `# Safety`).
            unsafe { std::slice::from_raw_parts(args, n) }
        };
        // SAFETY: generated code passes two arrays of 3 i64 extents.
        let (g, b) = unsafe {
            (
                [*grid, *grid.add(1), *grid.add(2)],
                [*block, *block.add(1), *block.add(2)],
            )
        };
        m.launch_raw(
            usize::try_from(kernel).unwrap_or(usize::MAX),
            device_id,
            args,
            g,
            b,
        )
    });
    let msg = match r {
        Ok(Ok(())) => return 0,
        Ok(Err(m)) => m,
        Err(_) => "kiln bug: a panic while launching a device kernel".to_owned(),
    };
    crate::packed_func::ffi::set_raised("RuntimeError", &msg);
    -1
}

/// Registers the launch service as a context slot (idempotent).
pub fn register_runtime_symbols() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let f: unsafe extern "C" fn(
            *const c_void,
            i32,
            i32,
            *const RawKernelArg,
            i32,
            *const i64,
            *const i64,
        ) -> i32 = kiln_device_launch;
        crate::packed_func::context::register_context_symbol("__KilnDeviceLaunch", f as usize);
    });
}
