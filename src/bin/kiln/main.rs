//! The `kiln` binary: the command line of [`kiln::cli`], with Unix's usual `SIGPIPE`
//! behaviour.

/// Output to a closed pipe (`kiln devices | head`) ends the process quietly, as for any Unix
/// tool, instead of `println!` panicking on `EPIPE`: Rust starts programs with SIGPIPE ignored.
#[cfg(unix)]
fn default_sigpipe() {
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    const SIGPIPE: i32 = 13;
    const SIG_DFL: usize = 0;
    // SAFETY: `signal` is async-signal-safe libc; restoring the default disposition of SIGPIPE
    // before any thread starts touches no Rust state.
    unsafe {
        signal(SIGPIPE, SIG_DFL);
    }
}

/// TVM's libraries raise errors by calling `TVMFFIErrorSetRaisedFromCStrParts` by name (in a
/// Python process `libtvm_ffi` defines it). In the `kiln` binary kiln's implementation answers,
/// exported to the dynamic symbol table (`build.rs`), so that a library TVM built reports a
/// failed check under `kiln run` and `kiln rpc-server` instead of failing to load.
///
/// # Safety
/// As [`kiln::packed_func::ffi::kiln_error_set_raised_from_cstr_parts`].
#[no_mangle]
pub unsafe extern "C" fn TVMFFIErrorSetRaisedFromCStrParts(
    kind: *const std::ffi::c_char,
    parts: *const *const std::ffi::c_char,
    n: i32,
) {
    // SAFETY: forwarded from this function's contract.
    unsafe { kiln::packed_func::ffi::kiln_error_set_raised_from_cstr_parts(kind, parts, n) }
}

/// `TVMFFIErrorSetRaisedFromCStr`, for the same reason.
///
/// # Safety
/// As [`kiln::packed_func::ffi::kiln_error_set_raised_from_cstr`].
#[no_mangle]
pub unsafe extern "C" fn TVMFFIErrorSetRaisedFromCStr(
    kind: *const std::ffi::c_char,
    message: *const std::ffi::c_char,
) {
    // SAFETY: forwarded from this function's contract.
    unsafe { kiln::packed_func::ffi::kiln_error_set_raised_from_cstr(kind, message) }
}

fn main() {
    #[cfg(unix)]
    default_sigpipe();
    std::process::exit(kiln::cli::run(std::env::args_os()));
}
