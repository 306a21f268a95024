//! Robustness: arbitrary strings, arbitrary JSON values and mutated valid targets never panic;
//! each gives a target (which then round-trips through its export) or an error. Each parse runs
//! under `catch_unwind`, so a panic fails the case with its input.

use std::panic::{catch_unwind, AssertUnwindSafe};

use kiln::target::Target;
use proptest::prelude::*;

/// Runs `f`, failing the case (with `input`) if it panics.
fn no_panic<T>(input: &str, f: impl FnOnce() -> T) -> Result<T, TestCaseError> {
    catch_unwind(AssertUnwindSafe(f))
        .map_err(|_| TestCaseError::fail(format!("target parsing panicked on {input:?}")))
}

const SEEDS: &[&str] = &[
    r#"{"kind":"llvm","mcpu":"skylake","mattr":["+avx2","+fma"],"num-cores":4}"#,
    r#"{"kind":"cuda","arch":"sm_80","host":{"kind":"llvm","host":"c"}}"#,
    r#"{"tag":"nvidia/nvidia-a100","l2_cache_size_bytes":12345,"keys":["x"]}"#,
    r#"{"kind":"composite","devices":["cuda",{"kind":"llvm","mtriple":"aarch64-linux-gnu"}]}"#,
    r#"{"kind":"webgpu","supports_subgroups":true,"feature.x":NaN}"#,
    "llvm -mcpu=znver3 -mattr=+avx2,+fma -num-cores=4",
    "nvidia/nvidia-a100 -arch=sm_86",
    r#"vulkan -device_name="GPU x" -supports_float16=1"#,
    "raspberry-pi/4b-aarch64",
];

/// Parsing either fails cleanly or gives a target whose export parses back to it.
fn check(s: &str) -> Result<(), TestCaseError> {
    if let Ok(t) = no_panic(s, || Target::parse(s))? {
        let text = no_panic(s, || t.to_string())?;
        let back = no_panic(&text, || Target::parse(&text))?;
        prop_assert_eq!(back.as_ref().ok(), Some(&t), "{} -> {}", s, text);
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Edit {
    Delete(usize),
    Insert(usize, char),
    Replace(usize, char),
    Duplicate(usize, usize),
}

fn mutate(seed: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = seed.chars().collect();
    for e in edits {
        let n = chars.len().max(1);
        match *e {
            Edit::Delete(i) if !chars.is_empty() => {
                chars.remove(i % n);
            }
            Edit::Insert(i, c) => chars.insert(i % (chars.len() + 1), c),
            Edit::Replace(i, c) if !chars.is_empty() => chars[i % n] = c,
            Edit::Duplicate(i, len) if !chars.is_empty() => {
                let start = i % n;
                let end = (start + len).min(chars.len());
                let piece: Vec<char> = chars[start..end].to_vec();
                chars.splice(start..start, piece);
            }
            _ => {}
        }
    }
    chars.into_iter().collect()
}

fn edit() -> impl Strategy<Value = Edit> {
    let c = prop_oneof![
        prop::sample::select(vec![
            '{', '}', '[', ']', '"', ',', ':', ' ', '-', '=', '\\', '0', '1', 'e', '.', 'x', 'N'
        ]),
        any::<char>(),
    ];
    prop_oneof![
        any::<usize>().prop_map(Edit::Delete),
        (any::<usize>(), c.clone()).prop_map(|(i, c)| Edit::Insert(i, c)),
        (any::<usize>(), c).prop_map(|(i, c)| Edit::Replace(i, c)),
        (any::<usize>(), 0usize..40).prop_map(|(i, n)| Edit::Duplicate(i, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings_never_panic(s in any::<String>()) {
        check(&s)?;
    }

    #[test]
    fn json_like_strings_never_panic(s in r#"\{[ "a-z:,\[\]{}0-9.\-eEN]{0,60}"#) {
        check(&s)?;
    }

    #[test]
    fn mutated_valid_targets_never_panic(
        seed in prop::sample::select(SEEDS),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        check(&mutate(seed, &edits))?;
    }

    #[test]
    fn arbitrary_json_values_never_panic(v in json_value()) {
        let text = v.to_string();
        if let Ok(t) = no_panic(&text, || Target::from_json(&v))? {
            prop_assert_eq!(Target::parse(&t.to_string()).ok(), Some(t));
        }
        // The same value as text, through `Target::parse`.
        check(&text)?;
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let key = prop::sample::select(vec![
        "kind",
        "host",
        "tag",
        "keys",
        "device",
        "mcpu",
        "mattr",
        "num-cores",
        "arch",
        "devices",
        "feature.x",
        "fast-math",
        "libs",
        "thread_warp_size",
        "supports_subgroups",
    ]);
    let kind = prop::sample::select(vec![
        "llvm",
        "cuda",
        "c",
        "rocm",
        "nvptx",
        "webgpu",
        "composite",
        "test",
        "vulkan",
        "nvidia/nvidia-a100",
        "bogus",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        kind.prop_map(|s| Value::String(s.to_string())),
        "[a-z_0-9+]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

#[test]
fn deeply_nested_input_is_an_error_or_a_target_not_a_crash() {
    // Hosts nested as deep as the JSON reader allows.
    let depth = 250;
    let s = format!(
        r#"{}{{"kind":"c"}}{}"#,
        r#"{"kind":"llvm","mcpu":"x","host":"#.repeat(depth),
        "}".repeat(depth)
    );
    let t = Target::parse(&s).expect("250 nested hosts are fine");
    let mut n = 0;
    let mut cur = &t;
    while let Some(h) = cur.host() {
        n += 1;
        cur = h;
    }
    assert_eq!(n, depth);
    assert_eq!(Target::parse(&t.to_string()).ok(), Some(t));
    // Deeper than that: a clean error.
    let s = format!(
        "{{\"kind\":\"llvm\",\"x\":{}{}}}",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    assert!(Target::parse(&s).is_err());
}
