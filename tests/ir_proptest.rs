//! The JSON reader never panics: arbitrary strings, arbitrary IR-shaped JSON values, deep
//! nesting, and valid modules with random mutations. Whatever it accepts also verifies, prints
//! and round-trips without panicking. Each read runs under `catch_unwind`, so a panic fails the
//! case with its input.

use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use serde_json::{json, Value};

use kiln::ir::{IRModule, IrResult};

/// Runs one read (and `exercise` on what it accepts), failing the case on a panic.
fn no_panic(what: &str, read: impl FnOnce() -> IrResult<IRModule>) -> Result<(), TestCaseError> {
    catch_unwind(AssertUnwindSafe(|| {
        if let Ok(m) = read() {
            exercise(&m);
        }
    }))
    .map_err(|_| TestCaseError::fail(format!("the IR reader panicked on {what}")))
}

fn valid_modules() -> Vec<Value> {
    let mut out = Vec::new();
    for name in ["vadd", "matmul", "rowsum", "softmax"] {
        let path = format!(
            "{}/examples/kernels/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        out.push(serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap());
    }
    for name in ["constructs", "handwritten"] {
        let path = format!("{}/tests/ir/json/{name}.json", env!("CARGO_MANIFEST_DIR"));
        out.push(serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap());
    }
    out
}

/// Every node of a JSON value, as a path of object keys / array indices.
fn node_paths(v: &Value, prefix: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    out.push(prefix.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(json!(k));
                node_paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(json!(i));
                node_paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn node_mut<'a>(v: &'a mut Value, path: &[Value]) -> Option<&'a mut Value> {
    let mut cur = v;
    for seg in path {
        cur = match seg {
            Value::String(k) => cur.get_mut(k.as_str())?,
            Value::Number(n) => cur.get_mut(n.as_u64()? as usize)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Replacement values that are plausible in the format (names, types, kinds, numbers).
fn replacement(kind: u8, small: i64) -> Value {
    match kind % 16 {
        0 => Value::Null,
        1 => json!(small),
        2 => json!(-small),
        3 => json!(small as f64 / 3.0),
        4 => json!("n"),
        5 => json!("i"),
        6 => json!("float16"),
        7 => json!("int8"),
        8 => json!("parallel"),
        9 => json!({"var": "n"}),
        10 => json!({"const": small, "dtype": "int64"}),
        11 => json!({"op": "load", "buffer": "A", "indices": []}),
        12 => json!([]),
        13 => json!({}),
        14 => json!(u64::MAX),
        _ => json!(true),
    }
}

fn exercise(m: &IRModule) {
    let _ = m.verify_all();
    if m.verify().is_ok() {
        let text = m.to_string();
        assert!(!text.is_empty());
        let back = IRModule::from_json(&m.to_json()).expect("a verified module reads back");
        assert_eq!(back.to_string(), text);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings_never_panic(s in any::<String>()) {
        no_panic(&s, || IRModule::from_json_str(&s))?;
    }

    #[test]
    fn arbitrary_ir_shaped_json_values_never_panic(v in ir_json_value()) {
        let text = v.to_string();
        no_panic(&text, || IRModule::from_json(&v))?;
        no_panic(&text, || IRModule::from_json_str(&text))?;
        let module = json!({"format": "kiln-ir/1", "functions": [v]});
        no_panic(&text, || IRModule::from_json(&module))?;
    }

    #[test]
    fn deep_nesting_is_an_error_or_a_module_never_a_crash(depth in 1usize..600, stmt in any::<bool>()) {
        // `depth` nested adds (or nested sequences) as a function body (the reader's limit is
        // 128 IR nodes), read from a value (no JSON recursion limit applies) and from text
        // (serde_json's applies). Built by moving, not with `json!` (which would recurse).
        let obj = |kv: Vec<(&str, Value)>| {
            Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
        };
        let mut e = json!({"var": "n"});
        for _ in 0..depth {
            e = if stmt {
                let eval = json!({"stmt": "evaluate", "value": {"const": 0, "dtype": "int32"}});
                obj(vec![("stmt", json!("seq")), ("stmts", Value::Array(vec![eval, e]))])
            } else {
                let one = json!({"const": 1, "dtype": "int64"});
                obj(vec![("op", json!("add")), ("args", Value::Array(vec![e, one]))])
            };
        }
        let body = if stmt { e } else { obj(vec![("stmt", json!("evaluate")), ("value", e)]) };
        let mut m = valid_modules().swap_remove(0);
        m["functions"][0]["body"] = body;
        no_panic("a deeply nested module", || IRModule::from_json(&m))?;
        let text = m.to_string();
        no_panic("a deeply nested module (text)", || IRModule::from_json_str(&text))?;
    }

    #[test]
    fn arbitrary_bytes_around_json_never_panic(prefix in any::<String>(), cut in 0usize..2000) {
        let base = valid_modules()[0].to_string();
        let cut = cut.min(base.len());
        let s = format!("{}{}", &base[..cut], prefix);
        no_panic(&s, || IRModule::from_json_str(&s))?;
    }

    #[test]
    fn mutated_valid_modules_never_panic(
        which in 0usize..6,
        edits in proptest::collection::vec((any::<u32>(), 0u8..4, any::<u8>(), -3i64..70), 1..4),
    ) {
        let mut v = valid_modules().swap_remove(which);
        for (sel, op, kind, small) in edits {
            let mut paths = Vec::new();
            node_paths(&v, &mut Vec::new(), &mut paths);
            let path = paths[sel as usize % paths.len()].clone();
            match op {
                // Replace the node.
                0 => {
                    if let Some(n) = node_mut(&mut v, &path) {
                        *n = replacement(kind, small);
                    }
                }
                // Remove it from its parent.
                1 => {
                    if let Some((last, parent)) = path.split_last() {
                        match (node_mut(&mut v, parent), last) {
                            (Some(Value::Object(m)), Value::String(k)) => { m.shift_remove(k); }
                            (Some(Value::Array(a)), Value::Number(i)) => { a.remove(i.as_u64().unwrap_or(0) as usize); }
                            _ => {}
                        }
                    }
                }
                // Add an unknown field, or duplicate an array element.
                2 => match node_mut(&mut v, &path) {
                    Some(Value::Object(m)) => { m.insert(format!("x{kind}"), json!(small)); }
                    Some(Value::Array(a)) if !a.is_empty() => { let e = a[0].clone(); a.push(e); }
                    _ => {}
                },
                // Swap in a subtree from elsewhere (well-typed pieces in the wrong place).
                _ => {
                    let other = paths[(sel as usize / 7 + kind as usize) % paths.len()].clone();
                    let sub = node_mut(&mut v, &other).map(|n| n.clone());
                    if let (Some(sub), Some(n)) = (sub, node_mut(&mut v, &path)) {
                        *n = sub;
                    }
                }
            }
        }
        let text = v.to_string();
        no_panic(&text, || IRModule::from_json_str(&text))?;
        no_panic(&text, || IRModule::from_json(&v))?;
    }
}

/// Arbitrary JSON built from the format's own keys and values, so it gets past the first checks
/// more often than random text.
fn ir_json_value() -> impl Strategy<Value = Value> {
    let key = prop::sample::select(vec![
        "format",
        "functions",
        "name",
        "params",
        "kind",
        "dtype",
        "shape",
        "strides",
        "attrs",
        "body",
        "stmt",
        "op",
        "var",
        "const",
        "args",
        "buffer",
        "indices",
        "value",
        "min",
        "extent",
        "stmts",
        "then",
        "else",
        "cond",
        "global_symbol",
        "noalias",
        "scope",
        "lanes",
        "allocate",
        "size",
        "thread",
        "x",
    ]);
    let word = prop::sample::select(vec![
        "kiln-ir/1",
        "buffer",
        "scalar",
        "float32",
        "int64",
        "int32",
        "bool",
        "float16",
        "handle",
        "for",
        "store",
        "seq",
        "evaluate",
        "if",
        "let",
        "allocate",
        "load",
        "add",
        "sub",
        "mul",
        "div",
        "floordiv",
        "floormod",
        "select",
        "cast",
        "call",
        "parallel",
        "serial",
        "vectorized",
        "unrolled",
        "n",
        "i",
        "A",
        "B",
        "C",
        "global",
        "shared",
        "local",
        "",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![-3i64..70, any::<i64>()].prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![-1e3f64..1e3, Just(f64::MAX), Just(f64::MIN_POSITIVE)].prop_map(Value::from),
        word.prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(6, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

mod interp_props {
    use kiln::ir::builder::*;
    use kiln::ir::interp::{run, InterpArg, Scalar};
    use kiln::ir::{BinOp, DataType, Expr, IRModule, Intrinsic, Param, PrimFunc, Stmt, Var};
    use proptest::prelude::*;

    /// A random well-typed expression over `x` and `y` of type `t` (an integer or float type).
    fn tree(t: DataType, x: Var, y: Var) -> impl Strategy<Value = Expr> {
        let leaf = prop_oneof![
            Just(Expr::from(&x)),
            Just(Expr::from(&y)),
            (-5i64..5).prop_map(move |v| constant(t, v as f64)),
        ];
        leaf.prop_recursive(5, 40, 3, move |inner| {
            let ops: Vec<BinOp> = BinOp::ALL
                .into_iter()
                .filter(|o| {
                    !o.is_comparison() && !o.is_logical() && (t.is_int() || !o.is_bitwise())
                })
                .collect();
            prop_oneof![
                (0..ops.len(), inner.clone(), inner.clone())
                    .prop_map(move |(k, a, b)| Expr::binary(ops[k], a, b)),
                (inner.clone(), inner.clone(), inner.clone(), inner.clone())
                    .prop_map(|(a, b, c, d)| select(a.lt(b), c, d)),
                (inner.clone(), inner.clone(), inner.clone(), 0usize..13).prop_map(
                    move |(a, b, c, k)| {
                        // Distinct subtrees: a duplicated `let` would bind its variable twice.
                        let op = Intrinsic::ALL[k];
                        if t.is_float() {
                            let mut args = vec![a, b, c];
                            args.truncate(op.arity());
                            call(op, args)
                        } else {
                            abs(a)
                        }
                    }
                ),
                inner
                    .clone()
                    .prop_map(move |a| let_expr("v", a, |v| v.clone() + v)),
                inner.prop_map(move |a| a.cast(DataType::i8()).cast(t)),
            ]
        })
    }

    fn check(t: DataType, e: Expr, x: Var, y: Var, xv: Scalar, yv: Scalar) {
        let f = PrimFunc::new(
            "p",
            vec![Param::Scalar(x), Param::Scalar(y)],
            Stmt::Return(e),
        )
        .with_ret_type(t);
        f.verify().unwrap();
        let m = IRModule::from_functions(vec![f]);
        let back = IRModule::from_json(&m.to_json()).unwrap();
        assert_eq!(back.to_string(), m.to_string());
        let a = run(
            &m.functions[0],
            &mut [InterpArg::Scalar(xv), InterpArg::Scalar(yv)],
        );
        let b = run(
            &back.functions[0],
            &mut [InterpArg::Scalar(xv), InterpArg::Scalar(yv)],
        );
        match (a, b) {
            (Ok(Some(p)), Ok(Some(q))) => {
                assert_eq!(p.dtype(), t);
                assert!(p == q || (p.as_f64().is_nan() && q.as_f64().is_nan()));
            }
            (Err(e), Err(f)) => {
                assert_eq!(e.to_string(), f.to_string());
                assert!(e.to_string().contains("division by zero"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn random_int_expressions_run_and_round_trip(e in tree(DataType::i32(), Var::new("x", DataType::i32()), Var::new("y", DataType::i32())), xv in any::<i32>(), yv in any::<i32>()) {
            let (x, y) = free_vars(&e, DataType::i32());
            check(DataType::i32(), e, x, y, Scalar::i32(xv), Scalar::i32(yv));
        }

        #[test]
        fn random_float_expressions_run_and_round_trip(e in tree(DataType::f16(), Var::new("x", DataType::f16()), Var::new("y", DataType::f16())), xv in -100f64..100.0, yv in -100f64..100.0) {
            let (x, y) = free_vars(&e, DataType::f16());
            let t = DataType::f16();
            check(t, e, x, y, Scalar::from_float(t, xv), Scalar::from_float(t, yv));
        }

        #[test]
        fn division_identities_hold(a in any::<i32>(), b in any::<i32>()) {
            prop_assume!(b != 0);
            let t = DataType::i32();
            let (x, y) = (Var::new("x", t), Var::new("y", t));
            let (xe, ye) = (Expr::from(&x), Expr::from(&y));
            let trunc = (xe.clone() / ye.clone()) * ye.clone() + xe.clone() % ye.clone();
            let floor = xe.clone().floordiv(ye.clone()) * ye.clone() + xe.clone().floormod(ye.clone());
            let same = trunc.eq_(xe.clone()).and(floor.eq_(xe.clone()));
            let sign = xe.clone().floormod(ye.clone()).eq_(0).or(xe.floormod(ye.clone()).lt(0).eq_(ye.lt(0)));
            let f = PrimFunc::new("d", vec![Param::Scalar(x), Param::Scalar(y)], Stmt::Return(same.and(sign))).with_ret_type(DataType::bool());
            let r = run(&f, &mut [InterpArg::Scalar(Scalar::i32(a)), InterpArg::Scalar(Scalar::i32(b))]).unwrap();
            prop_assert_eq!(r, Some(Scalar::Bool(true)));
        }
    }

    /// The two parameters the strategy used (found by name in the tree; fresh ones if unused).
    fn free_vars(e: &Expr, t: DataType) -> (Var, Var) {
        fn walk(e: &Expr, out: &mut Vec<Var>) {
            match e {
                Expr::Var(v) if &*v.name != "v" => out.push(v.clone()),
                Expr::Binary { a, b, .. } => {
                    walk(a, out);
                    walk(b, out);
                }
                Expr::Select { cond, t, f } => {
                    walk(cond, out);
                    walk(t, out);
                    walk(f, out);
                }
                Expr::Cast { value, .. } | Expr::Not(value) => walk(value, out),
                Expr::Let { value, body, .. } => {
                    walk(value, out);
                    walk(body, out);
                }
                Expr::Call { args, .. } => args.iter().for_each(|a| walk(a, out)),
                _ => {}
            }
        }
        let mut vars = Vec::new();
        walk(e, &mut vars);
        let x = vars
            .iter()
            .find(|v| &*v.name == "x")
            .cloned()
            .unwrap_or_else(|| Var::new("x", t));
        let y = vars
            .iter()
            .find(|v| &*v.name == "y")
            .cloned()
            .unwrap_or_else(|| Var::new("y", t));
        (x, y)
    }
}
