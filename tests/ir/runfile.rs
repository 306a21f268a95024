//! The run-file format shared by `ir_run.rs` (interpreter) and `codegen_files.rs` (compiled code): `tests/ir/run/*.json`, each a module plus runs with inputs and
//! hand-computed expected outputs, return values or errors. The files are meant to be reused as
//! the oracle for compiled code (same inputs, same expected results).
//!
//! ```json
//! {"module": {kiln-ir/1 module},
//!  "runs": [{"function": "f",
//!            "args": [{"dtype": "float32", "shape": [2], "data": [1, "nan"]}, {"dtype": "int32", "value": 3}],
//!            "outputs": {"0": [..expected data of argument 0..]},
//!            "returns": {"dtype": "int32", "value": 9},
//!            "error": "substring of the expected error"}]}
//! ```
//!
//! Floats compare bit for bit (so `-0.0 != 0.0`), except that any NaN matches `"nan"`.
#![allow(dead_code)]

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use kiln::ir::interp::{cast, run, HostBuffer, InterpArg, Scalar};
use kiln::ir::{DataType, IRModule};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    pub module: Value,
    pub runs: Vec<RunCase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunCase {
    pub function: String,
    pub args: Vec<Arg>,
    #[serde(default)]
    pub outputs: BTreeMap<usize, Vec<Value>>,
    pub returns: Option<ScalarValue>,
    pub error: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, untagged)]
pub enum Arg {
    Buffer {
        dtype: String,
        shape: Vec<i64>,
        data: Vec<Value>,
    },
    Scalar(ScalarValue),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalarValue {
    pub dtype: String,
    pub value: Value,
}

pub fn dtype(s: &str) -> DataType {
    DataType::parse(s).unwrap_or_else(|| panic!("unknown dtype {s}"))
}

pub fn scalar(t: DataType, v: &Value) -> Scalar {
    match v {
        Value::Bool(b) => cast(t, Scalar::Bool(*b)),
        Value::String(s) => {
            let f = match s.as_str() {
                "nan" => f64::NAN,
                "inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                other => panic!("bad value {other}"),
            };
            cast(t, Scalar::f64(f))
        }
        Value::Number(n) if n.is_f64() || t.is_float() => cast(t, Scalar::f64(n.as_f64().unwrap())),
        Value::Number(n) => match n.as_i64() {
            Some(i) => cast(t, Scalar::i64(i)),
            None => Scalar::UInt(t, n.as_u64().unwrap()),
        },
        other => panic!("bad value {other}"),
    }
}

/// An expected value: like [`scalar`], but floats are not rounded to the type, so that a value the
/// type cannot represent never matches.
pub fn expected(t: DataType, v: &Value) -> Scalar {
    match (scalar(t, v), v) {
        (Scalar::Float(t, _), Value::Number(n)) => Scalar::Float(t, n.as_f64().unwrap()),
        (s, _) => s,
    }
}

pub fn show(values: &[Scalar]) -> String {
    let items: Vec<String> = values
        .iter()
        .map(|s| match s {
            Scalar::Bool(b) => b.to_string(),
            Scalar::Float(_, f) => format!("{f:?}"),
            other => other.as_i128().to_string(),
        })
        .collect();
    format!("[{}]", items.join(", "))
}

pub fn same(a: &Scalar, b: &Scalar) -> bool {
    match (a, b) {
        (Scalar::Float(ta, x), Scalar::Float(tb, y)) => {
            ta == tb && (x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
        }
        _ => a == b,
    }
}

pub fn check_case(module: &IRModule, case: &RunCase) -> Result<(), String> {
    let func = module
        .get(&case.function)
        .ok_or_else(|| format!("no function `{}`", case.function))?;
    let mut args = make_args(case);
    let result = run(func, &mut args);
    match (&case.error, result) {
        (Some(want), Err(e)) if e.to_string().contains(want.as_str()) => return Ok(()),
        (Some(want), other) => {
            return Err(format!(
                "expected an error containing `{want}`, got {other:?}"
            ))
        }
        (None, Err(e)) => return Err(format!("unexpected error: {e}")),
        (None, Ok(ret)) => {
            let want = case
                .returns
                .as_ref()
                .map(|r| expected(dtype(&r.dtype), &r.value));
            let ok = match (&ret, &want) {
                (Some(a), Some(b)) => same(a, b),
                (None, None) => true,
                _ => false,
            };
            if !ok {
                return Err(format!("returned {ret:?}, expected {want:?}"));
            }
        }
    }
    check_outputs(case, &args)
}

/// The little-endian bytes of `s` as stored in a buffer of type `t`.
pub fn encode(t: DataType, s: Scalar) -> Vec<u8> {
    let bytes = t.bytes();
    let raw: u64 = match s {
        Scalar::Float(_, v) => match (t.code, t.bits) {
            (kiln::ir::TypeCode::Float, 16) => half::f16::from_f64(v).to_bits() as u64,
            (kiln::ir::TypeCode::BFloat, _) => half::bf16::from_f64(v).to_bits() as u64,
            (_, 32) => (v as f32).to_bits() as u64,
            _ => v.to_bits(),
        },
        other => other.as_i128() as u64,
    };
    raw.to_le_bytes()[..bytes].to_vec()
}

/// Every `*.json` run file in `dir`, sorted, parsed and verified.
pub fn load_run_files(dir: &str) -> Vec<(std::path::PathBuf, RunFile, IRModule)> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let file: RunFile =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let module = IRModule::from_json(&file.module)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            module
                .verify()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path, file, module)
        })
        .collect()
}

/// The arguments of a run as interpreter arguments.
pub fn make_args(case: &RunCase) -> Vec<InterpArg> {
    case.args
        .iter()
        .map(|a| match a {
            Arg::Buffer {
                dtype: d,
                shape,
                data,
            } => {
                let t = dtype(d);
                let mut h = HostBuffer::zeros(t, shape);
                h.data = data.iter().flat_map(|v| encode(t, scalar(t, v))).collect();
                InterpArg::Buffer(h)
            }
            Arg::Scalar(s) => InterpArg::Scalar(scalar(dtype(&s.dtype), &s.value)),
        })
        .collect()
}

/// Compares the buffers after a run with the run's expected outputs.
pub fn check_outputs(case: &RunCase, args: &[InterpArg]) -> Result<(), String> {
    for (index, values) in &case.outputs {
        let h = args
            .get(*index)
            .and_then(InterpArg::buffer)
            .ok_or_else(|| format!("argument #{index} is not a buffer"))?;
        let got: Vec<Scalar> = (0..values.len()).filter_map(|i| h.get(i)).collect();
        let want: Vec<Scalar> = values.iter().map(|v| expected(h.dtype, v)).collect();
        if got.len() != want.len() || !got.iter().zip(&want).all(|(a, b)| same(a, b)) {
            return Err(format!(
                "argument #{index}: got {}, expected {}",
                show(&got),
                show(&want)
            ));
        }
    }
    Ok(())
}

/// Checks what a compiled call of `case` gave: the expected error (its message, or a
/// `ValueError` for an argument check), else the returned value and the outputs in `args`
/// (already copied back from the compiled code's buffers). A case whose error is an unsaturated
/// cast's unspecified result only needs the call to succeed.
#[allow(dead_code)] // used by the codegen tests, not by ir_run
pub fn check_compiled_call(
    case: &RunCase,
    result: Result<kiln::packed_func::Any, kiln::packed_func::PackedFuncError>,
    args: &[InterpArg],
) -> Result<(), String> {
    use kiln::packed_func::{PackedFuncError, Value as V};
    // An unsaturated cast of a value out of range has no specified result: the interpreter
    // reports it, and compiled code must return normally, with some value.
    if let Some(want) = &case.error {
        if want.contains("has no specified result") {
            return result
                .map(|_| ())
                .map_err(|e| format!("an unspecified cast result failed the call: {e}"));
        }
    }
    let ret = match (&case.error, result) {
        (Some(want), Err(PackedFuncError::Raised { kind, message })) => {
            let want_msg = want.strip_prefix("assertion failed: ").unwrap_or(want);
            return if message.contains(want_msg)
                || (want.starts_with("argument #") && kind == "ValueError")
            {
                Ok(())
            } else {
                Err(format!(
                    "expected an error like `{want}`, got {kind}: {message}"
                ))
            };
        }
        (Some(want), other) => {
            return Err(format!("expected an error like `{want}`, got {other:?}"))
        }
        (None, Err(e)) => return Err(format!("unexpected error: {e}")),
        (None, Ok(ret)) => ret,
    };
    if let Some(r) = &case.returns {
        let want = expected(dtype(&r.dtype), &r.value);
        let got = match ret.value() {
            V::Int(i) => Scalar::from_int(want.dtype(), i128::from(i)),
            V::Bool(b) => Scalar::Bool(b),
            V::Float(x) => Scalar::from_float(want.dtype(), x),
            other => return Err(format!("returned {other:?}")),
        };
        if !same(&got, &want) {
            return Err(format!("returned {got:?}, expected {want:?}"));
        }
    }
    check_outputs(case, args)
}
