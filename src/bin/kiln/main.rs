//! The `kiln` command line. Each subcommand lives in its own file (`cmd_*.rs`) with a clap
//! `Args` struct and a `run` function; this file only dispatches.

use clap::{Parser, Subcommand};

mod cmd_devices;

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
    /// List the global packed functions registered in this process.
    Functions,
    /// List the registered device backends and each device's attributes.
    Devices(cmd_devices::DevicesArgs),
}

type CmdResult = Result<(), Box<dyn std::error::Error>>;

fn main() {
    let cli = Cli::parse();
    let result: CmdResult = match cli.command {
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
