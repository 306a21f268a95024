//! The `kiln` command line. Each subcommand lives in its own file (`cmd_*.rs`) with a clap
//! `Args` struct and a `run` function; this file only dispatches.

use clap::{Parser, Subcommand};

mod cmd_ir;

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
    /// Verify an IR module (kiln-ir/1 JSON) and print it in text form.
    Ir(cmd_ir::IrArgs),
}

fn main() {
    let cli = Cli::parse();
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Ir(args) => cmd_ir::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
