//! The `kiln` command line, as a library: [`run`] parses the arguments and runs one command,
//! so the `kiln` binary and Python's `python -m kiln` (through the `kiln-python` library) are
//! the same program. Each command group lives in its own file with a clap `Args` struct and a
//! `run` function; this file only dispatches.

use std::ffi::OsString;

use clap::{Parser, Subcommand};

pub mod codegen;
pub mod devices;
pub mod ir;
pub mod rpc;
pub mod target;
pub mod tune;

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
    Target(target::TargetArgs),
    /// List target kinds and their options.
    Kinds(target::KindsArgs),
    /// List target tags.
    Tags(target::TagsArgs),
    /// Verify an IR module (kiln-ir/1 JSON) and print it in text form.
    Ir(ir::IrArgs),
    /// Compile an IR module to a .so, .o, .ll or .s file.
    Build(codegen::BuildArgs),
    /// Run a function of an IR module or library on .npy (or generated) inputs.
    Run(codegen::RunArgs),
    /// List the global packed functions registered in this process.
    Functions,
    /// List the registered device backends and each device's attributes.
    Devices(devices::DevicesArgs),
    /// Serve this machine's devices over TVM's RPC protocol (TVM's tracker and clients drive
    /// it unchanged).
    RpcServer(rpc::RpcServerArgs),
    /// Search for the fastest schedule of a function on this machine; record it in a tuning
    /// database that `kiln build --db` applies.
    ///
    /// Ctrl-C stops the search after the candidate being measured: its best is measured again,
    /// paired with the default and recorded, and the exit status is 130. A second Ctrl-C ends
    /// it at once, keeping the records written so far.
    Tune(tune::TuneArgs),
    /// The process `kiln tune` measures candidates in (JSON lines on stdin and stdout).
    #[command(hide = true)]
    TuneWorker,
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

/// What a command returns: an error is printed as `error: ...` and the exit code is 1.
pub(crate) type CmdResult = Result<(), Box<dyn std::error::Error>>;

/// Runs the command line `args` (the first item is the program name, as in
/// `std::env::args_os`) and returns the process exit code: 0 on success, 1 after printing
/// `error: ...` on stderr, 2 for a usage error (clap's message on stderr), 0 for `--help` and
/// `--version` (printed on stdout).
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    let result: CmdResult = match cli.command {
        Command::Target(args) => target::run_target(&args),
        Command::Kinds(args) => target::run_kinds(&args),
        Command::Tags(args) => target::run_tags(&args),
        Command::Ir(args) => ir::run(args),
        Command::Build(args) => codegen::run_build(&args),
        Command::Run(args) => codegen::run_run(&args),
        Command::Functions => {
            for name in crate::packed_func::registry::list() {
                println!("{name}");
            }
            Ok(())
        }
        Command::Devices(args) => devices::run(args),
        Command::RpcServer(args) => rpc::run_server(&args),
        Command::Tune(args) => tune::run(&args),
        Command::TuneWorker => tune::run_worker(),
    };
    match result {
        Ok(()) => 0,
        // Ctrl-C during `kiln tune`, after what the search found was written: the status a
        // shell gives an interrupted command.
        Err(e) if e.is::<tune::Interrupted>() => {
            eprintln!("{e}");
            130
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
