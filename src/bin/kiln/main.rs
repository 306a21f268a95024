//! The `kiln` command line. Each subcommand lives in its own file (`cmd_*.rs`) with a clap
//! `Args` struct and a `run` function; this file only dispatches.

use clap::{Parser, Subcommand};

mod cmd_codegen;
mod cmd_devices;
mod cmd_ir;
mod cmd_target;

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "kiln: devices, targets, tensor IR and LLVM codegen on the tvm-ffi ABI"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse a target and print its canonical export as one line of JSON.
    Target(cmd_target::TargetArgs),
    /// List target kinds and their options.
    Kinds(cmd_target::KindsArgs),
    /// List target tags.
    Tags(cmd_target::TagsArgs),
    /// Verify an IR module (kiln-ir/1 JSON) and print it in text form.
    Ir(cmd_ir::IrArgs),
    /// Compile an IR module to a .so, .o, .ll or .s file.
    Build(cmd_codegen::BuildArgs),
    /// Run a function of an IR module or library on .npy (or generated) inputs.
    Run(cmd_codegen::RunArgs),
    /// List the global packed functions registered in this process.
    Functions,
    /// List the registered device backends and each device's attributes.
    Devices(cmd_devices::DevicesArgs),
}

/// Writes `text` to stdout; a closed pipe (`kiln tags | head`) is not an error.
pub(crate) fn emit(text: &str) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

type CmdResult = Result<(), Box<dyn std::error::Error>>;

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
    let cli = Cli::parse();
    let result: CmdResult = match cli.command {
        Command::Target(args) => cmd_target::run_target(&args),
        Command::Kinds(args) => cmd_target::run_kinds(&args),
        Command::Tags(args) => cmd_target::run_tags(&args),
        Command::Ir(args) => cmd_ir::run(args),
        Command::Build(args) => cmd_codegen::run_build(&args),
        Command::Run(args) => cmd_codegen::run_run(&args),
        Command::Functions => {
            for name in kiln::packed_func::registry::list() {
                println!("{name}");
            }
            Ok(())
        }
        Command::Devices(args) => cmd_devices::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
