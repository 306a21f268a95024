//! `examples/custom_backend.rs` as a test: a backend `foo` added from outside the crate (device,
//! target kind, code generator) builds and runs kernels, and every check in the example holds.

#[allow(dead_code)]
#[path = "../examples/custom_backend.rs"]
mod example;

#[test]
fn a_backend_added_with_the_public_api_builds_and_runs_kernels() {
    let mut out = Vec::new();
    let result = example::run(&mut out);
    let text = String::from_utf8(out).unwrap();
    if let Err(e) = result {
        panic!("{text}\nexample failed: {e}");
    }
    for line in [
        "registered device_api.foo: device type ",
        r#""feature.has_fma":true"#,
        "canonicalizer: `version` expects v1 or v2",
        "vadd on foo:0, n = 100000: C = A + B exactly",
        "its workspace came from foo's arena",
        "Mismatched A.device_type on argument #0",
        "never handed out this pointer",
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    assert!(text.ends_with("ok\n"), "{text}");
}
