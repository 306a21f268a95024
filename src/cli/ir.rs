//! `kiln ir <module.json>`: verifies an IR module and prints it in text form.

use std::path::PathBuf;

use crate::ir::IRModule;

/// Arguments of `kiln ir`.
#[derive(clap::Args)]
pub struct IrArgs {
    /// The module, in the `kiln-ir/1` JSON format (`-` reads stdin).
    pub module: PathBuf,
    /// Print the module as canonical JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Reads, verifies (reporting every error) and prints the module.
pub fn run(args: IrArgs) -> Result<(), Box<dyn std::error::Error>> {
    let text = if args.module.as_os_str() == "-" {
        crate::util::read_text_bounded_from(std::io::stdin(), crate::util::MAX_TEXT_FILE_BYTES)
            .map_err(|e| format!("cannot read standard input: {e}"))?
    } else {
        crate::util::read_text_bounded(&args.module, crate::util::MAX_TEXT_FILE_BYTES)
            .map_err(|e| format!("cannot read {}: {e}", args.module.display()))?
    };
    let module = IRModule::from_json_str(&text)?;
    let mut errors = module.verify_all();
    // All errors in node order: every one but the last here, the last through `main`.
    if let Some(last) = errors.pop() {
        for e in &errors {
            eprintln!("error: {e}");
        }
        return Err(Box::new(last));
    }
    if args.json {
        super::emit(&format!("{}\n", module.to_json_string()))
    } else {
        super::emit(&module.to_string())
    }
}
