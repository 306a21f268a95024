//! File-driven interpreter tests: `tests/ir/run/*.json` (format in `tests/ir/runfile.rs`), each a
//! module plus runs with inputs and hand-computed expected outputs, return values or errors.

#[path = "ir/runfile.rs"]
mod runfile;

use runfile::*;

#[test]
fn run_files_produce_the_expected_results() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ir/run");
    let mut failures = Vec::new();
    let mut cases = 0;
    for (path, file, module) in load_run_files(dir) {
        for (i, case) in file.runs.iter().enumerate() {
            cases += 1;
            if let Err(e) = check_case(&module, case) {
                failures.push(format!(
                    "{} runs[{i}] ({}): {e}",
                    path.display(),
                    case.function
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(cases >= 18, "only {cases} runs found");
}
