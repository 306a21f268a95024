//! The JSON reader never panics: arbitrary strings, and valid modules with random mutations.
//! Whatever it accepts also verifies, prints and round-trips without panicking.

use proptest::prelude::*;
use serde_json::{json, Value};

use kiln::ir::IRModule;

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
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings_never_panic(s in any::<String>()) {
        if let Ok(m) = IRModule::from_json_str(&s) {
            exercise(&m);
        }
    }

    #[test]
    fn arbitrary_bytes_around_json_never_panic(prefix in any::<String>(), cut in 0usize..2000) {
        let base = valid_modules()[0].to_string();
        let cut = cut.min(base.len());
        let s = format!("{}{}", &base[..cut], prefix);
        if let Ok(m) = IRModule::from_json_str(&s) {
            exercise(&m);
        }
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
        if let Ok(m) = IRModule::from_json_str(&text) {
            exercise(&m);
        }
        if let Ok(m) = IRModule::from_json(&v) {
            exercise(&m);
        }
    }
}
