//! The packed-API argument checks against TVM 0.27: every case of
//! `tests/data/tvm027_packed_abi_errors.jsonl` is called on kiln-built kernels with the
//! same signatures — in process (JIT, through the Rust API), and through Python's
//! `tvm_ffi.load_module` on exported `.so` files (numpy arrays in). Error kinds and messages
//! must match TVM's exactly, except for two documented, deliberate differences:
//!
//! - `shape_object_arg`: TVM reinterprets a Shape object as a DLTensor (reading past it) and
//!   reports a wrong `ndim`; kiln accepts only Tensor (70) and DLTensor* (7) and reports a
//!   mismatched type.
//! - `ok_n0`: an empty tensor whose stride is 0 (numpy's) is rejected by TVM as non-compact;
//!   kiln ignores the strides of empty tensors.
//!
//! The data file is part of the repository (`tests/data/README.md` says where it comes from).
//! The Python half runs when `KILN_PYTHON` (default `python3`) has
//! `tvm_ffi` and `numpy`, and must run when `KILN_REQUIRE_TVM_FFI=1` (CI).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::HostArray;
use kiln::codegen::llvm::{export, CodegenOptions, LlvmModule, Tiering};
use kiln::ir::builder::{for_range, select, size_var};
use kiln::ir::{
    Buffer, DataType, Expr, ForKind, IRModule, Param, PrimFunc, Stmt, StorageScope, Var,
};
use kiln::packed_func::ffi::DLDataTypeCode;
use kiln::packed_func::{Any, AnyView, DLDataType, Module, PackedFuncError};
use serde_json::Value;

const DEVIATIONS: &[(&str, &str)] = &[("add16", "shape_object_arg"), ("add_n", "ok_n0")];

fn buf(name: &str, dtype: DataType, shape: Vec<Expr>) -> Buffer {
    Buffer::new(name, dtype, shape)
}

fn elementwise(name: &str, shape: Vec<Expr>, noalias: bool) -> PrimFunc {
    let (a, b, c) = (
        buf(names(name)[0], DataType::f32(), shape.clone()),
        buf(names(name)[1], DataType::f32(), shape.clone()),
        buf(names(name)[2], DataType::f32(), shape.clone()),
    );
    let body = kiln::ir::builder::compute(&c, |i| a.load(i) + b.load(i));
    PrimFunc::new(
        name,
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
    .with_noalias(noalias)
}

fn names(kernel: &str) -> [&'static str; 3] {
    if kernel == "add16" {
        ["a", "b", "c"]
    } else {
        ["A", "B", "C"]
    }
}

/// The kernels the conformance file calls, by kernel name (module) -> function.
fn kernels() -> BTreeMap<&'static str, (PrimFunc, bool)> {
    let mut m = BTreeMap::new();
    let n = size_var("n");
    m.insert(
        "add16",
        (elementwise("add16", vec![Expr::from(16i64)], false), false),
    );
    m.insert(
        "add_n",
        (elementwise("add_n", vec![Expr::from(&n)], false), false),
    );
    m.insert(
        "add_n_noalias",
        (
            elementwise("add_n_noalias", vec![Expr::from(&n)], true),
            false,
        ),
    );
    m.insert(
        "add_n_fastmath",
        (elementwise("add_n", vec![Expr::from(&n)], false), true),
    );
    m.insert(
        "add_n_mcjit",
        (elementwise("add_n", vec![Expr::from(&n)], false), false),
    );
    // mat2d(A[m, n], C[m, n]): C = A + 2
    let (mm, nn) = (size_var("m"), size_var("n"));
    let a = buf("A", DataType::f32(), vec![Expr::from(&mm), Expr::from(&nn)]);
    let c = buf("C", DataType::f32(), vec![Expr::from(&mm), Expr::from(&nn)]);
    let body = kiln::ir::builder::compute(&c, |i| a.load(i) + Expr::from(2.0f32));
    m.insert(
        "mat2d",
        (
            PrimFunc::new("mat2d", vec![Param::Buffer(a), Param::Buffer(c)], body),
            false,
        ),
    );
    // scal(x: int32, y: float32, flag: bool, out[1]): out[0] = flag ? x + y : x - y
    let x = Var::new("x", DataType::i32());
    let y = Var::new("y", DataType::f32());
    let flag = Var::new("flag", DataType::bool());
    let out = buf("out", DataType::f32(), vec![Expr::from(1i64)]);
    let xf = Expr::from(&x).cast(DataType::f32());
    let body = out.store(
        vec![Expr::from(0i64)],
        select(
            Expr::from(&flag),
            xf.clone() + Expr::from(&y),
            xf - Expr::from(&y),
        ),
    );
    m.insert(
        "scal",
        (
            PrimFunc::new(
                "scal",
                vec![
                    Param::Scalar(x),
                    Param::Scalar(y),
                    Param::Scalar(flag),
                    Param::Buffer(out),
                ],
                body,
            ),
            false,
        ),
    );
    // par(A[1000], B[1000]): parallel B = A * 2
    let a = buf("A", DataType::f32(), vec![Expr::from(1000i64)]);
    let b = buf("B", DataType::f32(), vec![Expr::from(1000i64)]);
    let body = for_range("i", 1000i64, ForKind::Parallel, |i| {
        b.store(vec![i.clone()], a.load(vec![i]) * Expr::from(2.0f32))
    });
    m.insert(
        "par",
        (
            PrimFunc::new("par", vec![Param::Buffer(a), Param::Buffer(b)], body),
            false,
        ),
    );
    // ws(A[1024], B[1024]): T = A + 1 in a workspace; B = T * 2
    let a = buf("A", DataType::f32(), vec![Expr::from(1024i64)]);
    let b = buf("B", DataType::f32(), vec![Expr::from(1024i64)]);
    let t = Buffer::temp(
        "T",
        DataType::f32(),
        vec![Expr::from(1024i64)],
        StorageScope::Workspace,
    );
    let fill = for_range("i", 1024i64, ForKind::Serial, |i| {
        t.store(vec![i.clone()], a.load(vec![i]) + Expr::from(1.0f32))
    });
    let use_ = for_range("j", 1024i64, ForKind::Serial, |j| {
        b.store(vec![j.clone()], t.load(vec![j]) * Expr::from(2.0f32))
    });
    let body = t.allocate(Stmt::Seq(vec![fill, use_]));
    m.insert(
        "ws",
        (
            PrimFunc::new("ws", vec![Param::Buffer(a), Param::Buffer(b)], body),
            false,
        ),
    );
    // retv(x: int64) -> x + 1; retf(x: float64) -> x * 2
    let x = Var::new("x", DataType::i64());
    let body = Stmt::Return(Expr::from(&x) + Expr::from(1i64));
    m.insert(
        "retv",
        (
            PrimFunc::new("retv", vec![Param::Scalar(x)], body).with_ret_type(DataType::i64()),
            false,
        ),
    );
    let x = Var::new("x", DataType::f64());
    let body = Stmt::Return(Expr::from(&x) * Expr::from(2.0f64));
    m.insert(
        "retf",
        (
            PrimFunc::new("retf", vec![Param::Scalar(x)], body).with_ret_type(DataType::f64()),
            false,
        ),
    );
    // int_buf(a: int32[4], c: int64[4]): c = a * 2
    let a = buf("a", DataType::i32(), vec![Expr::from(4i64)]);
    let c = buf("c", DataType::i64(), vec![Expr::from(4i64)]);
    let body =
        kiln::ir::builder::compute(&c, |i| a.load(i).cast(DataType::i64()) * Expr::from(2i64));
    m.insert(
        "int_buf",
        (
            PrimFunc::new("int_buf", vec![Param::Buffer(a), Param::Buffer(c)], body),
            false,
        ),
    );
    m
}

fn options(fast_math: bool) -> CodegenOptions {
    let mut o = CodegenOptions::host();
    if fast_math {
        o.fast_math = "fast".into();
    }
    o
}

fn cases() -> Vec<Value> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tvm027_packed_abi_errors.jsonl");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn dtype(name: &str) -> (DLDataType, usize) {
    let (code, bits) = match name {
        "float32" => (DLDataTypeCode::FLOAT, 32),
        "float64" => (DLDataTypeCode::FLOAT, 64),
        "int32" => (DLDataTypeCode::INT, 32),
        "int64" => (DLDataTypeCode::INT, 64),
        "uint32" => (DLDataTypeCode::UINT, 32),
        other => panic!("dtype {other} not used by the conformance file"),
    };
    (
        DLDataType {
            code,
            bits,
            lanes: 1,
        },
        bits as usize / 8,
    )
}

/// A tensor argument: filled with `index + 1` (floats) or `0, 1, 2, ...` (ints).
fn tensor(spec: &Value, index: usize) -> HostArray {
    let shape: Vec<i64> = spec["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let (dt, elem) = dtype(spec["dtype"].as_str().unwrap());
    let strides: Option<Vec<i64>> = spec["strides"]
        .as_array()
        .map(|s| s.iter().map(|v| v.as_i64().unwrap()).collect());
    let span: i64 = match &strides {
        Some(st) if shape.iter().all(|&d| d > 0) => {
            shape.iter().zip(st).map(|(d, s)| (d - 1) * s).sum::<i64>() + 1
        }
        _ => shape.iter().product(),
    };
    let mut a = HostArray::zeros(&[span.max(1)], dt, elem);
    let is_float = dt.code == DLDataTypeCode::FLOAT;
    let bytes = a.bytes_mut();
    for (k, chunk) in bytes.chunks_exact_mut(elem).enumerate() {
        let v: Vec<u8> = match (is_float, elem) {
            (true, 4) => ((index + 1) as f32).to_ne_bytes().to_vec(),
            (true, _) => ((index + 1) as f64).to_ne_bytes().to_vec(),
            (false, 4) => (k as i32).to_ne_bytes().to_vec(),
            (false, _) => (k as i64).to_ne_bytes().to_vec(),
        };
        chunk.copy_from_slice(&v);
    }
    a.shape = shape;
    a.strides = strides;
    a
}

fn run_rust_cases(all: &[Value], tiering: Tiering) -> (usize, Vec<String>) {
    let ks = kernels();
    let mut modules: BTreeMap<&str, LlvmModule> = BTreeMap::new();
    for (name, (f, fast)) in &ks {
        let m = IRModule::from_functions(vec![f.clone()]);
        m.verify().unwrap_or_else(|e| panic!("{name}: {e}"));
        modules.insert(
            name,
            LlvmModule::jit_with(&m, &options(*fast), tiering).unwrap(),
        );
    }
    let mut failures = Vec::new();
    let mut passed = 0;
    for case in all {
        let kernel = case["kernel"].as_str().unwrap();
        let cname = case["case"].as_str().unwrap();
        let deviation = DEVIATIONS.contains(&(kernel, cname));
        let f = modules[kernel]
            .require_function(case["symbol"].as_str().unwrap())
            .unwrap();
        let specs = case["args"].as_array().unwrap();
        let mut arrays: Vec<Option<HostArray>> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| s.get("tensor").map(|t| tensor(t, i)))
            .collect();
        let dls: Vec<Option<kiln::packed_func::DLTensor>> = arrays
            .iter_mut()
            .map(|a| a.as_mut().map(HostArray::dl))
            .collect();
        let scalars: Vec<Any> = specs
            .iter()
            .map(|s| match s {
                Value::Null => Any::none(),
                Value::Bool(b) => Any::from(*b),
                Value::Number(n) if n.is_i64() => Any::from(n.as_i64().unwrap()),
                Value::Number(n) => Any::from(n.as_f64().unwrap()),
                Value::String(s) => Any::from(s.as_str()),
                _ => Any::none(),
            })
            .collect();
        let views: Vec<AnyView> = dls
            .iter()
            .zip(&scalars)
            .map(|(d, s)| d.as_ref().map_or_else(|| s.view(), AnyView::from))
            .collect();
        let got = f.call(&views);
        if deviation {
            // kiln's own, documented behaviour for these cases.
            let fine = match cname {
                "shape_object_arg" => matches!(&got, Err(PackedFuncError::Raised { kind, message })
                    if kind == "TypeError" && message.starts_with("Mismatched type on argument #0") && message.ends_with("expected Tensor")),
                _ => got.is_ok(),
            };
            if fine {
                passed += 1;
            } else {
                failures.push(format!(
                    "{kernel}/{cname} ({tiering:?}, kiln deviation): got {got:?}"
                ));
            }
            continue;
        }
        let want_err = case["error"].as_object();
        let ok = match (&got, want_err) {
            (Err(PackedFuncError::Raised { kind, message }), Some(w)) => {
                kind == w["type"].as_str().unwrap() && message == w["message"].as_str().unwrap()
            }
            (Ok(v), None) => {
                let want = &case["result"];
                let rv = match v.value() {
                    kiln::packed_func::Value::Int(i) => Value::from(i),
                    kiln::packed_func::Value::Float(x) => Value::from(x),
                    _ => Value::Null,
                };
                let result_ok = want.is_null() && v.is_none()
                    || (want.as_f64() == rv.as_f64() && !want.is_null());
                let after_ok = match case.get("last_arg_after") {
                    Some(Value::Array(_)) => {
                        let last = arrays.last().unwrap().as_ref().unwrap();
                        let flat: Vec<f64> = flatten(&case["last_arg_after"]);
                        let got: Vec<f64> = if last.dtype.code == DLDataTypeCode::FLOAT {
                            last.to_f32().iter().map(|v| *v as f64).collect()
                        } else {
                            last.to_i64()
                        };
                        // Expected values follow TVM's harness, which filled inputs with 1 and 2;
                        // kiln's fill (index + 1) gives the same for every recorded kernel.
                        got[..flat.len()] == flat[..]
                    }
                    _ => true,
                };
                result_ok && after_ok
            }
            _ => false,
        };
        if ok {
            passed += 1;
        } else {
            failures.push(format!(
                "{kernel}/{cname} ({tiering:?}): got {got:?}, want {}",
                case["error"]
            ));
        }
    }
    (passed, failures)
}

fn flatten(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(a) => a.iter().flat_map(flatten).collect(),
        Value::Number(n) => vec![n.as_f64().unwrap()],
        _ => vec![],
    }
}

#[test]
fn every_recorded_tvm_call_gets_the_same_error_or_result_in_process() {
    let all = cases();
    // The JIT's quick code (lazily compiled checkers) and its optimized code (checks inline).
    for tiering in [Tiering::QuickOnly, Tiering::Off] {
        let (passed, failures) = run_rust_cases(&all, tiering);
        assert!(
            failures.is_empty(),
            "{} of {} cases differ:\n{}",
            failures.len(),
            all.len(),
            failures.join("\n")
        );
        assert_eq!(passed, all.len());
    }
}

fn export_kernels(dir: &Path) -> PathBuf {
    for (name, (f, fast)) in kernels() {
        let m = IRModule::from_functions(vec![f]);
        export(&m, &options(fast), &dir.join(format!("{name}.so")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    dir.to_path_buf()
}

#[test]
fn every_recorded_tvm_call_gets_the_same_error_or_result_through_python_tvm_ffi() {
    let Some(py) = common::python_with_tvm_ffi() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    export_kernels(dir.path());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/abi_conformance.py");
    let data =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tvm027_packed_abi_errors.jsonl");
    let out = Command::new(py)
        .arg(&script)
        .arg(dir.path())
        .arg(&data)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python conformance failed:\n{stdout}\n{stderr}"
    );
    eprintln!("{stdout}");
    assert!(stdout.contains(" 0 failed"), "{stdout}");
}

#[test]
fn exported_libraries_load_in_kiln_and_in_a_plain_c_host() {
    let dir = tempfile::tempdir().unwrap();
    export_kernels(dir.path());
    // kiln's own loader
    // SAFETY: a library kiln just generated.
    let lib = unsafe { kiln::runtime::LibraryModule::load(dir.path().join("add16.so")) }.unwrap();
    assert_eq!(lib.function_names(), ["add16"]);
    let f = lib.require_function("add16").unwrap();
    let mut arrs: Vec<HostArray> = (0..3)
        .map(|i| {
            tensor(
                &serde_json::json!({"shape": [16], "dtype": "float32", "strides": null}),
                i,
            )
        })
        .collect();
    let dls: Vec<_> = arrs.iter_mut().map(HostArray::dl).collect();
    f.call(&[
        AnyView::from(&dls[0]),
        AnyView::from(&dls[1]),
        AnyView::from(&dls[2]),
    ])
    .unwrap();
    assert_eq!(arrs[2].to_f32(), vec![3.0; 16]);
    let e = f.call(&[AnyView::from(&dls[0])]).unwrap_err();
    assert_eq!(
        e.kind(),
        "TypeError",
        "the error reached kiln through the context slot: {e}"
    );
    // a plain C host: dlopen, fill the error slot, call with DLTensor pointers, and a bad call
    let host = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/host.c");
    let exe = dir.path().join("host");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(cc)
        .arg(&host)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(st.success());
    let out = Command::new(&exe)
        .arg(dir.path().join("add16.so"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("ok: c[0..16] = 3"), "{text}");
    assert!(
        text.contains("bad call returned -1: TypeError: Expected 3 arguments"),
        "{text}"
    );
}

/// How [`exported_fast_checks_agree_with_the_checker`] alters tensor `k` of a valid call.
const VARIATIONS: &[&str] = &[
    "valid",
    "ndim",
    "code",
    "bits",
    "lanes",
    "device_type",
    "device_id",
    "null_data",
    "shape",
    "byte_offset",
    "compact_strides",
    "unit_dim_strides",
    "doubled_strides",
    "zero_strides",
    "object",
];

/// One call of `f` with tensors of `shape` (the last one the output), tensor `k` altered by
/// `variation`: the output's values, or the error.
fn fast_check_call(
    f: &kiln::packed_func::PackedFunc,
    ntensors: usize,
    shape: &[i64],
    k: usize,
    variation: &str,
) -> Result<Vec<f32>, (String, String)> {
    let numel = shape.iter().product::<i64>() as usize;
    let mut arrays: Vec<HostArray> = (0..ntensors)
        .map(|i| {
            let v: Vec<f32> = (0..numel.max(1))
                .map(|j| {
                    if i + 1 == ntensors {
                        0.0
                    } else {
                        (i * 100 + j) as f32
                    }
                })
                .collect();
            let mut a = HostArray::f32(&[numel.max(1) as i64], &v);
            a.shape = shape.to_vec();
            a
        })
        .collect();
    let compact: Vec<i64> = (0..shape.len())
        .map(|d| shape[d + 1..].iter().product())
        .collect();
    let mut strides: Vec<i64> = match variation {
        "compact_strides" => compact.clone(),
        // Extent-1 dimensions' strides are ignored.
        "unit_dim_strides" => (0..shape.len())
            .map(|d| if shape[d] == 1 { 7 } else { compact[d] })
            .collect(),
        "doubled_strides" => compact.iter().map(|s| s * 2).collect(),
        "zero_strides" => vec![0; shape.len()],
        _ => Vec::new(),
    };
    let mut other_shape: Vec<i64> = shape.to_vec();
    other_shape[0] += 1;
    let mut dls: Vec<kiln::packed_func::DLTensor> = arrays.iter_mut().map(HostArray::dl).collect();
    let t = &mut dls[k];
    match variation {
        "ndim" => t.ndim -= 1,
        "code" => t.dtype.code = DLDataTypeCode::INT,
        "bits" => t.dtype.bits = 64,
        "lanes" => t.dtype.lanes = 4,
        "device_type" => t.device.device_type = kiln::packed_func::DLDeviceType::CUDA,
        "device_id" => t.device.device_id = 1,
        "null_data" => t.data = std::ptr::null_mut(),
        "shape" => t.shape = other_shape.as_mut_ptr(),
        // Every array has 8 bytes to spare.
        "byte_offset" => t.byte_offset = 4,
        "compact_strides" | "unit_dim_strides" | "doubled_strides" | "zero_strides" => {
            t.strides = strides.as_mut_ptr()
        }
        _ => {}
    }
    // SAFETY: the tensor's shape and strides hold `ndim` values and its data outlives the call.
    let object = (variation == "object").then(|| unsafe { Any::tensor_object(&dls[k], ()) });
    let views: Vec<AnyView> = dls
        .iter()
        .enumerate()
        .map(|(i, d)| match &object {
            Some(o) if i == k => o.view(),
            _ => AnyView::from(d),
        })
        .collect();
    match f.call(&views) {
        Ok(_) => Ok(arrays.last().unwrap().to_f32()),
        Err(PackedFuncError::Raised { kind, message }) => Err((kind, message)),
        Err(e) => Err(("other".into(), e.to_string())),
    }
}

/// An exported library's wrapper checks its arguments on a fast path of its own (wide compares,
/// a few stricter checks) and hands any doubt to the checker, which the JIT's wrapper shares:
/// for every variation of every tensor of valid calls (empty tensors and extent-1 dimensions
/// among them), the library and the JIT give the same result or the same error.
#[test]
fn exported_fast_checks_agree_with_the_checker() {
    let n = size_var("n");
    let (mm, nn) = (size_var("m"), size_var("n"));
    let a = buf("A", DataType::f32(), vec![Expr::from(&mm), Expr::from(&nn)]);
    let c = buf("C", DataType::f32(), vec![Expr::from(&mm), Expr::from(&nn)]);
    let body = kiln::ir::builder::compute(&c, |i| a.load(i) + Expr::from(2.0f32));
    let kernels: Vec<(PrimFunc, usize, Vec<Vec<i64>>)> = vec![
        (
            elementwise("add_n", vec![Expr::from(&n)], true),
            3,
            vec![vec![5], vec![1], vec![0], vec![3000]],
        ),
        (
            kiln::schedule::kernels::vadd().unwrap(),
            3,
            vec![vec![1], vec![0], vec![40000]],
        ),
        (
            PrimFunc::new("mat2d", vec![Param::Buffer(a), Param::Buffer(c)], body),
            2,
            vec![vec![3, 4], vec![1, 4], vec![3, 1], vec![0, 4], vec![1, 1]],
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut compared = 0;
    for (f, ntensors, shapes) in kernels {
        let name = f.attrs.global_symbol.clone().unwrap();
        let m = IRModule::from_functions(vec![f]);
        let jit = LlvmModule::jit_with(&m, &options(false), Tiering::Off).unwrap();
        let path = dir.path().join(format!("{name}.so"));
        export(&m, &options(false), &path).unwrap();
        // SAFETY: a library kiln just generated.
        let lib = unsafe { kiln::runtime::LibraryModule::load(&path) }.unwrap();
        let (fj, fe) = (
            jit.require_function(&name).unwrap(),
            lib.require_function(&name).unwrap(),
        );
        for shape in &shapes {
            for k in 0..ntensors {
                for v in VARIATIONS {
                    let want = fast_check_call(&fj, ntensors, shape, k, v);
                    let got = fast_check_call(&fe, ntensors, shape, k, v);
                    assert_eq!(got, want, "{name}, shape {shape:?}, tensor #{k}: {v}");
                    if *v == "valid" || *v == "object" || *v == "compact_strides" {
                        assert!(got.is_ok(), "{name}, shape {shape:?}, #{k}, {v}: {got:?}");
                    }
                    compared += 1;
                }
            }
        }
    }
    assert!(compared > 300, "{compared}");
}
