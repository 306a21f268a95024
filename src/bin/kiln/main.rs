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

fn main() {
    #[cfg(unix)]
    default_sigpipe();
    std::process::exit(kiln::cli::run(std::env::args_os()));
}
