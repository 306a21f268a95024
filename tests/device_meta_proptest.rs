//! The `kiln-device/1` metadata an exported library embeds (`__kiln_device_meta`: the device
//! source and each kernel's parameters) is read back when the library loads, from a file the
//! user hands in: reading it never panics. Arbitrary text and mutations of real metadata
//! (bytes flipped, cut short, fields given other JSON) give the kernels or an error that
//! names what was expected; what is read back is what was written.

use std::panic::{catch_unwind, AssertUnwindSafe};

use kiln::device_api::kernel::{KernelInfo, KernelParamKind};
use kiln::packed_func::DLDataType;
use kiln::runtime::DeviceModule;
use proptest::prelude::*;

fn kernels() -> Vec<KernelInfo> {
    let t = |s: &str| DLDataType::parse(s).unwrap();
    vec![
        KernelInfo {
            name: "f_kernel0".into(),
            params: vec![
                KernelParamKind::Buffer(t("float32")),
                KernelParamKind::Scalar(t("int32")),
            ],
            dyn_shared_bytes: 0,
        },
        KernelInfo {
            name: "f_kernel1".into(),
            params: vec![KernelParamKind::Buffer(t("int8"))],
            dyn_shared_bytes: 4096,
        },
    ]
}

fn valid() -> String {
    DeviceModule::meta_json("opencl", "__kernel void f_kernel0() {}", &kernels())
}

/// Parses `text` under `catch_unwind`; an error must say what it is about.
fn parse(text: &str) -> Result<bool, TestCaseError> {
    let r = catch_unwind(AssertUnwindSafe(|| DeviceModule::parse_meta(text))).map_err(|_| {
        TestCaseError::fail(format!(
            "parse_meta panicked on {:?}",
            &text[..text.len().min(300)]
        ))
    })?;
    if let Err(e) = &r {
        prop_assert!(e.starts_with("device metadata"), "{e}");
    }
    Ok(r.is_ok())
}

#[test]
fn metadata_reads_back_what_was_written() {
    let (kind, source, back) = DeviceModule::parse_meta(&valid()).unwrap();
    assert_eq!(kind, "opencl");
    assert_eq!(source, "__kernel void f_kernel0() {}");
    assert_eq!(back, kernels());
}

/// JSON values a mutation puts in place of a field.
fn any_json() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(Into::into),
        any::<i64>().prop_map(Into::into),
        any::<f64>().prop_map(
            |f| serde_json::Number::from_f64(f).map_or(serde_json::Value::Null, Into::into)
        ),
        "[a-z0-9x ]{0,12}".prop_map(Into::into),
        Just(serde_json::json!([])),
        Just(serde_json::json!({})),
        Just(serde_json::json!([{"buffer": "float32"}, {"scalar": "float16x4"}])),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,200}") {
        parse(&s)?;
        parse(&format!("{{\"format\":\"kiln-device/1\",{s}"))?;
    }

    #[test]
    fn flipped_and_cut_metadata_never_panics(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        cut in any::<usize>(),
    ) {
        let mut b = valid().into_bytes();
        for (at, x) in flips {
            let i = at % b.len();
            b[i] ^= x;
        }
        b.truncate(b.len() - cut % b.len());
        parse(&String::from_utf8_lossy(&b))?;
    }

    #[test]
    fn fields_given_other_values_never_panic(
        path in prop_oneof![
            Just(vec!["format"]), Just(vec!["kind"]), Just(vec!["source"]), Just(vec!["kernels"]),
            Just(vec!["kernels", "0"]), Just(vec!["kernels", "0", "name"]),
            Just(vec!["kernels", "0", "params"]), Just(vec!["kernels", "0", "params", "0"]),
            Just(vec!["kernels", "0", "params", "1", "scalar"]),
            Just(vec!["kernels", "1", "dyn_shared_bytes"]),
        ],
        value in any_json(),
    ) {
        let mut v: serde_json::Value = serde_json::from_str(&valid()).unwrap();
        let mut at = &mut v;
        for p in &path {
            at = match p.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*p],
            };
        }
        let same = *at == value;
        *at = value;
        let ok = parse(&v.to_string())?;
        // The format and the parameter list's shape are checked: a change there is refused.
        if !same && (path == ["format"] || path == ["kernels"] && !v["kernels"].is_array()) {
            prop_assert!(!ok, "{v}");
        }
    }
}
