//! File-driven codegen tests.
//!
//! 1. Every run of `tests/ir/run/*.json` (the interpreter's hand-checked oracle files) is run
//!    again on JIT-compiled code, which must give the same outputs, return values and errors —
//!    except out-of-bounds accesses, which generated code does not check (as in TVM; the IR
//!    author guarantees bounds), and unsaturated casts of values out of range, where generated
//!    code must return normally with some value.
//! 2. `tests/codegen/*.json` add a target and patterns the generated assembly must (not) contain:
//!
//! ```json
//! {"target": {"kind": "llvm", "mcpu": "native"},
//!  "asm_contains": ["vfmadd"], "asm_not_contains": ["call\texpf"],
//!  "also_run_on": [{"kind": "llvm", "mcpu": "native"}],
//!  "module": {kiln-ir/1 module}, "runs": [run cases as in tests/ir/run]}
//! ```
//!
//! `also_run_on` (optional) runs the same cases on code built for more targets (no patterns).
//!
//! `KILN_BLESS=1` rewrites the expected outputs of `tests/codegen/*.json` runs from the reference
//! interpreter (review the diff before committing).

#[path = "ir/runfile.rs"]
mod runfile;

use std::path::Path;

use kiln::codegen::llvm::{CodegenOptions, LlvmModule};
use kiln::ir::interp::{HostBuffer, InterpArg, Scalar};
use kiln::ir::IRModule;
use kiln::packed_func::ffi::{DLDataTypeCode, DLDeviceType};
use kiln::packed_func::{Any, AnyView, DLDataType, DLDevice, DLTensor, Module};
use runfile::*;
use serde_json::Value;

/// Runs one case on compiled code; `Ok(None)` when the case cannot apply to compiled code.
fn run_compiled(m: &LlvmModule, case: &RunCase) -> Result<Option<()>, String> {
    if let Some(e) = &case.error {
        if e.contains("out of bounds") {
            return Ok(None);
        }
    }
    let f = m
        .require_function(&case.function)
        .map_err(|e| e.to_string())?;
    let mut args = make_args(case);
    // Aligned copies of the buffers, viewed as DLTensors.
    let mut storage: Vec<Option<(Vec<u64>, Vec<i64>)>> = args
        .iter()
        .map(|a| match a {
            InterpArg::Buffer(h) => {
                let mut words = vec![0u64; h.data.len().div_ceil(8) + 1];
                // SAFETY: `words` holds at least `h.data.len()` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        h.data.as_ptr(),
                        words.as_mut_ptr().cast::<u8>(),
                        h.data.len(),
                    )
                };
                Some((words, h.shape.clone()))
            }
            InterpArg::Scalar(_) => None,
        })
        .collect();
    let dls: Vec<Option<DLTensor>> = storage
        .iter_mut()
        .zip(&args)
        .map(|(s, a)| {
            let (words, shape) = s.as_mut()?;
            let InterpArg::Buffer(h) = a else { return None };
            Some(DLTensor {
                data: words.as_mut_ptr().cast(),
                device: DLDevice {
                    device_type: DLDeviceType::CPU,
                    device_id: 0,
                },
                ndim: shape.len() as i32,
                dtype: DLDataType {
                    code: DLDataTypeCode(h.dtype.code as u8),
                    bits: h.dtype.bits,
                    lanes: 1,
                },
                shape: shape.as_mut_ptr(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            })
        })
        .collect();
    let scalars: Vec<Any> = args
        .iter()
        .map(|a| match a {
            InterpArg::Scalar(Scalar::Bool(b)) => Any::from(*b),
            InterpArg::Scalar(s @ Scalar::Float(..)) => Any::from(s.as_f64()),
            InterpArg::Scalar(s) => Any::from(s.as_i64()),
            InterpArg::Buffer(_) => Any::none(),
        })
        .collect();
    let views: Vec<AnyView> = dls
        .iter()
        .zip(&scalars)
        .map(|(d, s)| d.as_ref().map_or_else(|| s.view(), AnyView::from))
        .collect();
    let result = f.call(&views);
    drop(views);
    // Copy the compiled results back and compare like the interpreter's.
    for (a, s) in args.iter_mut().zip(&storage) {
        if let (InterpArg::Buffer(h), Some((words, _))) = (a, s) {
            let n = h.data.len();
            // SAFETY: `words` holds at least `n` bytes.
            let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), n) };
            h.data.copy_from_slice(bytes);
        }
    }
    check_compiled_call(case, result, &args).map(Some)
}

fn host() -> CodegenOptions {
    CodegenOptions::host()
}

#[test]
fn interpreter_run_files_give_the_same_results_when_compiled() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ir/run");
    let (mut ran, mut failures) = (0, Vec::new());
    for (path, file, module) in load_run_files(dir) {
        let m =
            LlvmModule::jit(&module, &host()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for (i, case) in file.runs.iter().enumerate() {
            match run_compiled(&m, case) {
                Ok(Some(())) => ran += 1,
                Ok(None) => {}
                Err(e) => failures.push(format!(
                    "{} runs[{i}] ({}): {e}",
                    path.display(),
                    case.function
                )),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(ran >= 15, "only {ran} runs applied to compiled code");
}

fn bless_outputs(module: &IRModule, case: &mut Value) {
    let rc: RunCase = serde_json::from_value(case.clone()).unwrap();
    let f = module.get(&rc.function).unwrap();
    let mut args = make_args(&rc);
    if kiln::ir::interp::run(f, &mut args).is_err() {
        return;
    }
    let mut outs = serde_json::Map::new();
    for (i, a) in args.iter().enumerate() {
        if let InterpArg::Buffer(h) = a {
            outs.insert(i.to_string(), Value::Array(values(h)));
        }
    }
    case["outputs"] = Value::Object(outs);
}

fn values(h: &HostBuffer) -> Vec<Value> {
    let n = h.data.len() / h.dtype.bytes().max(1);
    (0..n)
        .filter_map(|i| h.get(i))
        .map(|s| match s {
            Scalar::Bool(b) => Value::from(b),
            Scalar::Float(_, f) if f.is_nan() => Value::from("nan"),
            Scalar::Float(_, f) if f.is_infinite() => {
                Value::from(if f > 0.0 { "inf" } else { "-inf" })
            }
            Scalar::Float(_, f) => Value::from(f),
            other => Value::from(other.as_i64()),
        })
        .collect()
}

#[test]
fn codegen_files_compile_to_the_expected_assembly_and_results() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/codegen");
    let bless = std::env::var("KILN_BLESS").is_ok_and(|v| v == "1");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let mut failures = Vec::new();
    let mut files = 0;
    for path in paths
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
    {
        files += 1;
        let text = std::fs::read_to_string(path).unwrap();
        let mut v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let obj = v.as_object_mut().unwrap();
        let target = obj
            .remove("target")
            .unwrap_or_else(|| serde_json::json!({"kind": "llvm", "mcpu": "native"}));
        let contains = obj.remove("asm_contains").unwrap_or(Value::Array(vec![]));
        let not_contains = obj
            .remove("asm_not_contains")
            .unwrap_or(Value::Array(vec![]));
        let also = obj.remove("also_run_on").unwrap_or(Value::Array(vec![]));
        let module = IRModule::from_json(&obj["module"])
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        module
            .verify()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if bless {
            let mut full: Value = serde_json::from_str(&text).unwrap();
            for case in full["runs"].as_array_mut().unwrap() {
                bless_outputs(&module, case);
            }
            std::fs::write(path, serde_json::to_string_pretty(&full).unwrap() + "\n").unwrap();
            continue;
        }
        let file: RunFile =
            serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let t = kiln::target::Target::from_json(&target).unwrap();
        let opts = CodegenOptions::from_target(&t).unwrap();
        let m =
            LlvmModule::jit(&module, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let asm = m.get_source("asm").unwrap();
        for pat in contains
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
        {
            if !asm.contains(pat) {
                failures.push(format!("{}: assembly lacks `{pat}`", path.display()));
            }
        }
        for pat in not_contains
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
        {
            if asm.contains(pat) {
                failures.push(format!("{}: assembly contains `{pat}`", path.display()));
            }
        }
        for (i, case) in file.runs.iter().enumerate() {
            if let Err(e) = run_compiled(&m, case) {
                failures.push(format!("{} runs[{i}]: {e} (KILN_BLESS=1 rewrites expected outputs from the interpreter)", path.display()));
            }
        }
        for t in also.as_array().unwrap() {
            let t = kiln::target::Target::from_json(t).unwrap();
            let opts = CodegenOptions::from_target(&t).unwrap();
            let m = LlvmModule::jit(&module, &opts)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for (i, case) in file.runs.iter().enumerate() {
                if let Err(e) = run_compiled(&m, case) {
                    failures.push(format!("{} runs[{i}] on {t}: {e}", path.display()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(files >= 3, "only {files} codegen files");
}
