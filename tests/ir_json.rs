//! The `kiln-ir/1` JSON format: round trips, the example kernels, and reader errors with paths.

#[path = "ir/common.rs"]
mod common;

use common::{all_constructs, check_snapshot, data_path};
use kiln::ir::{IRModule, IrError};

fn json_error(text: &str) -> (String, String) {
    match IRModule::from_json_str(text) {
        Err(IrError::Json { path, message }) => (path, message),
        other => panic!("expected a JSON schema error, got {other:?}"),
    }
}

/// The vadd example as compact JSON, for textual edits.
fn vadd_text() -> String {
    let text = std::fs::read_to_string(data_path("examples/kernels/vadd.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&text)
        .unwrap()
        .to_string()
}

#[test]
fn the_example_kernels_are_the_scheduled_kernels() {
    // `KILN_BLESS=1` regenerates examples/kernels/*.json from `kiln::schedule::kernels` (the
    // builder kernels of `kiln::ir::kernels` with their fast schedules; see tests/schedule.rs).
    use kiln::schedule::kernels as scheduled;
    for f in [
        scheduled::vadd().unwrap(),
        scheduled::matmul().unwrap(),
        scheduled::rowsum().unwrap(),
        scheduled::softmax().unwrap(),
    ] {
        let m = IRModule::from_functions(vec![f]);
        m.verify().unwrap();
        let name = &m.functions[0].name;
        check_snapshot(
            &format!("examples/kernels/{name}.json"),
            &(m.to_json_string() + "\n"),
        );
    }
}

#[test]
fn example_kernels_read_verify_and_round_trip() {
    let mut n = 0;
    let dirs = [
        data_path("examples/kernels"),
        data_path("examples/kernels/opencl"),
    ];
    for entry in dirs.iter().flat_map(|d| std::fs::read_dir(d).unwrap()) {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).unwrap();
            let m = IRModule::from_json_str(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            m.verify()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(m.to_json(), value, "{}", path.display());
            n += 1;
        }
    }
    assert!(
        n >= 8,
        "expected the four benchmark kernels and their OpenCL forms, found {n} files"
    );
}

#[test]
fn every_construct_round_trips_through_json() {
    let m = IRModule::from_functions(vec![all_constructs()]);
    m.verify().unwrap();
    let text = m.to_json_string() + "\n";
    check_snapshot("json/constructs.json", &text);
    let back = IRModule::from_json_str(&text).unwrap();
    back.verify().unwrap();
    assert_eq!(back.to_json_string() + "\n", text);
    // Same program: same text form, and the same structure up to variable identities.
    assert_eq!(back.to_string(), m.to_string());
}

#[test]
fn json_then_ir_then_json_is_the_identity_on_hand_written_input() {
    let text = std::fs::read_to_string(data_path("json/handwritten.json")).unwrap();
    let m = IRModule::from_json_str(&text).unwrap();
    m.verify().unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(m.to_json(), value);
}

#[test]
fn the_format_version_is_checked() {
    let (path, msg) = json_error(r#"{"format": "kiln-ir/2", "functions": []}"#);
    assert_eq!(path, "$.format");
    assert!(
        msg.contains("unsupported format `kiln-ir/2`, expected `kiln-ir/1`"),
        "{msg}"
    );
    let (path, msg) = json_error(r#"{"functions": []}"#);
    assert_eq!(
        (path.as_str(), msg.as_str()),
        ("$", "missing field `format`")
    );
}

#[test]
fn unknown_fields_are_rejected_with_their_path() {
    let text = vadd_text().replace(r#""kind":"parallel","#, r#""kind":"parallel","unroll":4,"#);
    let (path, msg) = json_error(&text);
    assert_eq!(path, "$.functions[0].body.unroll");
    assert!(
        msg.starts_with(
            "unknown field `unroll`, expected one of: stmt, var, min, extent, kind, thread, body"
        ),
        "{msg}"
    );
    let (path, _) =
        json_error(&vadd_text().replace(r#""noalias":true"#, r#""noalias":true,"inline":true"#));
    assert_eq!(path, "$.functions[0].attrs.inline");
}

#[test]
fn bad_values_are_reported_with_their_path() {
    let (path, msg) =
        json_error(&vadd_text().replacen(r#""dtype":"float32""#, r#""dtype":"float31""#, 1));
    assert_eq!(path, "$.functions[0].params[0].dtype");
    assert!(msg.contains("unknown data type `float31`"), "{msg}");
    let (path, msg) = json_error(&vadd_text().replace(r#""op":"add""#, r#""op":"plus""#));
    assert_eq!(path, "$.functions[0].body.body.value.op");
    assert!(msg.contains("unknown operator `plus`"), "{msg}");
    let (path, msg) = json_error(&vadd_text().replace(r#""kind":"parallel""#, r#""kind":"simd""#));
    assert_eq!(path, "$.functions[0].body.kind");
    assert!(msg.contains("unknown loop kind `simd`"), "{msg}");
    let (path, msg) = json_error(&vadd_text().replace(r#""buffer":"C""#, r#""buffer":"D""#));
    assert_eq!(path, "$.functions[0].body.body.buffer");
    assert_eq!(msg, "undefined buffer `D` (in scope: A, B, C)");
    let (path, msg) = json_error(&vadd_text().replacen(r#""var":"i""#, r#""var":"j""#, 1));
    assert_eq!(path, "$.functions[0].body.body.indices[0].var");
    assert_eq!(msg, "undefined variable `j` (in scope: i, n)");
}

#[test]
fn shadowing_a_name_in_scope_is_rejected() {
    let text = vadd_text().replace(r#""name":"i""#, r#""name":"n""#);
    let (path, msg) = json_error(&text);
    assert_eq!(path, "$.functions[0].body.var");
    assert_eq!(msg, "variable `n` is already defined in this scope");
}

#[test]
fn constants_are_checked_against_their_type() {
    let module = |c: &str| {
        format!(
            r#"{{"format": "kiln-ir/1", "functions": [{{"name": "f", "params": [], "body": {{"stmt": "evaluate", "value": {c}}}}}]}}"#
        )
    };
    let ok = |c: &str| IRModule::from_json_str(&module(c)).unwrap();
    ok(r#"{"const": 18446744073709551615, "dtype": "uint64"}"#);
    ok(r#"{"const": "-inf", "dtype": "float16"}"#);
    ok(r#"{"const": true, "dtype": "bool"}"#);
    let (path, msg) = json_error(&module(r#"{"const": 1.5, "dtype": "int32"}"#));
    assert_eq!(path, "$.functions[0].body.value.const");
    assert!(
        msg.contains("expected an integer for a int32 constant"),
        "{msg}"
    );
    let (_, msg) = json_error(&module(r#"{"const": 1, "dtype": "bool"}"#));
    assert!(msg.contains("`true` or `false`"), "{msg}");
    let (_, msg) = json_error(&module(r#"{"const": "infinity", "dtype": "float32"}"#));
    assert!(msg.contains(r#""inf", "-inf" or "nan""#), "{msg}");
    // Out-of-range integers parse, and the verifier rejects them.
    let m = ok(r#"{"const": 300, "dtype": "uint8"}"#);
    let err = m.verify().unwrap_err().to_string();
    assert_eq!(
        err,
        "function `f`: $.functions[0].body.value: constant 300 does not fit in uint8"
    );
}

#[test]
fn wrong_arities_are_rejected() {
    let text = vadd_text().replace(
        r#"{"var":"i"}]}]}"#,
        r#"{"var":"i"}]},{"const":1.0,"dtype":"float32"}]}"#,
    );
    assert_ne!(text, vadd_text(), "the replacement must apply");
    let (path, msg) = json_error(&text);
    assert_eq!(path, "$.functions[0].body.body.value.args");
    assert_eq!(msg, "`add` takes 2 argument(s), found 3");
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let mut e = String::from(r#"{"const": 1, "dtype": "int32"}"#);
    for _ in 0..100 {
        e = format!(r#"{{"op": "not", "args": [{e}]}}"#);
    }
    let text = format!(
        r#"{{"format": "kiln-ir/1", "functions": [{{"name": "f", "params": [], "body": {{"stmt": "evaluate", "value": {e}}}}}]}}"#
    );
    match IRModule::from_json_str(&text) {
        Err(IrError::Syntax { message }) => assert!(
            message.contains("nesting is limited to 128 levels"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    // A programmatically built value is bounded by the reader itself.
    let mut v = serde_json::json!({"const": true, "dtype": "bool"});
    for _ in 0..300 {
        v = serde_json::json!({"op": "not", "args": [v]});
    }
    let m = serde_json::json!({"format": "kiln-ir/1", "functions": [{"name": "f", "params": [], "body": {"stmt": "evaluate", "value": v}}]});
    match IRModule::from_json(&m) {
        Err(IrError::Json { message, .. }) => {
            assert!(message.contains("nested deeper than 128"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn syntax_errors_carry_line_and_column() {
    match IRModule::from_json_str("{\"format\": \"kiln-ir/1\",\n \"functions\": [,]}") {
        Err(IrError::Syntax { message }) => assert!(message.contains("line 2 column"), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_json_example_in_the_docs_reads_and_verifies() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/ir.md")).unwrap();
    let mut found = 0;
    for block in doc.split("```json\n").skip(1) {
        let text = block.split("\n```").next().unwrap();
        if !text.trim_start().starts_with("{\n  \"format\"") {
            continue; // fragments (single parameters) are not modules
        }
        let m = IRModule::from_json_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        m.verify().unwrap_or_else(|e| panic!("{e}\n{m}"));
        found += 1;
    }
    assert_eq!(found, 3);
}

#[test]
fn the_documented_example_runs() {
    use kiln::ir::interp::{run, HostBuffer, InterpArg, Scalar};
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/ir.md")).unwrap();
    let block = doc
        .split("```json\n")
        .find(|b| b.contains("clamp_sum"))
        .unwrap();
    let m = IRModule::from_json_str(block.split("\n```").next().unwrap()).unwrap();
    let mut args = [
        InterpArg::Buffer(HostBuffer::from_slice(&[4], &[1.0f32, 5.0, 2.0, 9.0])),
        InterpArg::Scalar(Scalar::f32(4.0)),
    ];
    assert_eq!(
        run(&m.functions[0], &mut args).unwrap(),
        Some(Scalar::f32(3.0))
    );
    let mut empty = [
        InterpArg::Buffer(HostBuffer::zeros(kiln::ir::DataType::f32(), &[0])),
        InterpArg::Scalar(Scalar::f32(1.0)),
    ];
    assert_eq!(
        run(&m.functions[0], &mut empty).unwrap_err().to_string(),
        "interpreting `clamp_sum`: assertion failed: X must not be empty"
    );
}

#[test]
fn a_shape_variable_may_also_be_a_scalar_parameter() {
    use kiln::ir::{builder::size_var, Buffer, DataType, Expr, Param, PrimFunc, Stmt};
    let n = size_var("n");
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(&n)]);
    let f = PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Scalar(n.clone())],
        Stmt::Evaluate(Expr::from(&n)),
    );
    let m = IRModule::from_functions(vec![f]);
    m.verify().unwrap();
    let back = IRModule::from_json(&m.to_json()).unwrap();
    back.verify().unwrap();
    assert_eq!(back.to_json(), m.to_json());
    // With another type it is a second definition of the name.
    let text = m.to_json().to_string().replace(
        r#""kind":"scalar","name":"n","dtype":"int64""#,
        r#""kind":"scalar","name":"n","dtype":"int32""#,
    );
    let (path, msg) = json_error(&text);
    assert_eq!(
        (path.as_str(), msg.as_str()),
        (
            "$.functions[0].params[1]",
            "variable `n` is already defined in this scope"
        )
    );
}

#[test]
fn float_constants_are_read_exactly() {
    // Decimal texts a fast float parser reads one ulp off; Python's `repr` and kiln write them.
    for v in [
        -127.99999999999999f64,
        126.99999999999999,
        9.999999747378752e-6,
        2.2250738585072014e-308,
        f64::from_bits(1), // the smallest subnormal, printed 5e-324
        0.30000000000000004,
        1.7976931348623157e308,
        -9.223372036854776e18,
    ] {
        let text = format!(
            r#"{{"format": "kiln-ir/1", "functions": [{{"name": "f", "params": [], "body": {{"stmt": "evaluate", "value": {{"const": {v:?}, "dtype": "float64"}}}}}}]}}"#
        );
        let m = IRModule::from_json_str(&text).unwrap();
        let back = m.to_json();
        let got = back["functions"][0]["body"]["value"]["const"]
            .as_f64()
            .unwrap();
        assert_eq!(got.to_bits(), v.to_bits(), "{v:?} read as {got:?}");
    }
}

#[test]
fn the_host_attribute_round_trips_and_prints() {
    let text = vadd_text().replace(r#""noalias":true"#, r#""noalias":true,"host":true"#);
    let m = IRModule::from_json_str(&text).unwrap();
    assert!(m.functions[0].attrs.host);
    assert!(m.to_string().contains("host"), "{m}");
    let back = IRModule::from_json_str(&m.to_json_string()).unwrap();
    assert!(back.functions[0].attrs.host);
    assert_eq!(back.to_json_string(), m.to_json_string());
    let (path, msg) =
        json_error(&vadd_text().replace(r#""noalias":true"#, r#""noalias":true,"host":1"#));
    assert_eq!(path, "$.functions[0].attrs.host");
    assert!(msg.contains("expected a boolean"), "{msg}");
    // Absent, it is false, and it is not written.
    let plain = IRModule::from_json_str(&vadd_text()).unwrap();
    assert!(!plain.functions[0].attrs.host && !plain.to_json_string().contains("\"host\""));
}

#[test]
fn an_unsaturated_cast_round_trips_and_its_flag_is_checked() {
    // `all_constructs` holds one saturating and one unsaturated float -> int32 cast.
    let m = IRModule::from_functions(vec![all_constructs()]);
    let v: serde_json::Value = serde_json::from_str(&m.to_json_string()).unwrap();
    let text = v.to_string();
    assert_eq!(text.matches(r#""saturate":false"#).count(), 1, "{text}");
    assert!(
        !text.contains(r#""saturate":true"#),
        "the default is not written"
    );
    let back = IRModule::from_json_str(&text).unwrap();
    assert_eq!(back.to_json_string(), m.to_json_string());
    assert!(m.to_string().contains("int32_unsaturated("), "{m}");
    let (path, msg) = json_error(&text.replace(r#""saturate":false"#, r#""saturate":0"#));
    assert!(path.ends_with(".saturate"), "{path}");
    assert_eq!(msg, "expected a boolean, found a number");
}
