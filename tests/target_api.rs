//! The target API: legacy form, registration, tags, export order, round trips, error texts.

use std::collections::HashSet;

use kiln::target::{
    list_kinds, list_tags, lookup_kind, register_kind, register_tag, Target, TargetError,
    TargetKind, TargetValue,
};
use serde_json::json;

fn parse(s: &str) -> Target {
    match Target::parse(s) {
        Ok(t) => t,
        Err(e) => panic!("{s:?} should parse: {e}"),
    }
}

fn parse_err(s: &str) -> TargetError {
    match Target::parse(s) {
        Ok(t) => panic!("{s:?} should be rejected, got {t}"),
        Err(e) => e,
    }
}

#[test]
fn legacy_strings_mean_the_same_target_as_their_json() {
    let pairs = [
        (
            "llvm -mcpu=znver3 -mattr=+avx2,+fma -num-cores=4",
            json!({"kind": "llvm", "mcpu": "znver3", "mattr": ["+avx2", "+fma"], "num-cores": 4}),
        ),
        ("cuda -arch=sm_80", json!({"kind": "cuda", "arch": "sm_80"})),
        (
            "cuda --arch sm_80",
            json!({"kind": "cuda", "arch": "sm_80"}),
        ),
        (
            "llvm -mtriple=aarch64-linux-gnu -mattr=+neon",
            json!({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}),
        ),
        (
            "llvm -fast-math",
            json!({"kind": "llvm", "fast-math": true}),
        ),
        (
            "llvm -fast-math=0 -mcpu=x",
            json!({"kind": "llvm", "fast-math": false, "mcpu": "x"}),
        ),
        (
            "llvm -keys=cpu,x86 -device=arm_cpu -libs=cblas",
            json!({"kind": "llvm", "keys": ["cpu", "x86"], "device": "arm_cpu", "libs": ["cblas"]}),
        ),
        (
            "nvidia/nvidia-a100 -l2_cache_size_bytes=12345",
            json!({"tag": "nvidia/nvidia-a100", "l2_cache_size_bytes": 12345}),
        ),
        (
            r#"vulkan -device_name="GPU with spaces" -supports_float16=1"#,
            json!({"kind": "vulkan", "device_name": "GPU with spaces", "supports_float16": true}),
        ),
        (
            "llvm -system-lib -mcpu=x",
            json!({"kind": "llvm", "mcpu": "x"}),
        ),
        ("llvm ", json!({"kind": "llvm"})),
        (" llvm  cuda", json!({"kind": "llvm"})),
    ];
    for (legacy, config) in pairs {
        let a = parse(legacy);
        let b = Target::from_json(&config).unwrap_or_else(|e| panic!("{config}: {e}"));
        assert_eq!(a, b, "{legacy:?} vs {config}");
    }
}

#[test]
fn legacy_errors_name_the_option_and_value() {
    let e = parse_err("llvm -num-cores=four");
    assert_eq!(e.category(), "type_mismatch");
    assert_eq!(
        e.to_string(),
        "target `llvm`: attribute `num-cores` expects Integer, found \"four\""
    );
    let e = parse_err("llvm -mcpux=skylake");
    assert_eq!(e.category(), "unknown_option");
    assert!(e.to_string().contains("did you mean `mcpu`?"), "{e}");
    let e = parse_err("llvm -mcpu");
    assert!(e.to_string().contains("`-mcpu` needs a value"), "{e}");
    let e = parse_err("nvidia/nvidia-a100 ");
    assert!(e.to_string().contains("remove the whitespace"), "{e}");
    let e = parse_err(" {\"kind\":\"llvm\"}");
    assert!(e.to_string().contains("first character"), "{e}");
    // Inside JSON the legacy form is not accepted (TVM 0.27's rule).
    let e = parse_err(r#"{"kind":"cuda","host":"llvm -mcpu=skylake"}"#);
    assert_eq!(e.category(), "cli_string");
    assert!(e.to_string().starts_with("in `host`:"), "{e}");
}

#[test]
fn errors_carry_tvm_facts() {
    let e = parse_err(r#"{"kind":"llvm","mcpu":1}"#);
    assert_eq!(
        e.to_string(),
        "target `llvm`: attribute `mcpu` expects String, found Integer"
    );
    let e = parse_err(r#"{"kind":"llvm","bogus":1}"#);
    match &e {
        TargetError::UnknownOption { option, known, .. } => {
            assert_eq!(option, "bogus");
            assert_eq!(&known[..3], ["kind", "keys", "tag"]);
            assert!(known.iter().any(|k| k == "vector-width"));
        }
        other => panic!("{other:?}"),
    }
    let e = parse_err("cdua");
    assert!(e.to_string().contains("did you mean `cuda`?"), "{e}");
    assert!(e.to_string().contains("known kinds: llvm, c,"), "{e}");
    assert_eq!(parse_err("{}").category(), "missing_kind");
    assert_eq!(
        parse_err("{\"kind\":\"llvm\"").to_string(),
        "malformed target JSON: Expecting ',' delimiter: line 1 column 15 (char 14)"
    );
    let e = parse_err(r#"{"kind":"cuda","host":{"kind":"llvm","host":{"kind":"llvm","mcpu":5}}}"#);
    assert!(
        e.to_string().starts_with("in `host.host`: target `llvm`"),
        "{e}"
    );
    let e = parse_err(r#"{"kind":"cuda","arch":"80"}"#);
    assert_eq!(e.category(), "cuda_arch");
    assert!(e.to_string().contains("\"80\""), "{e}");
    let e = parse_err(r#"{"kind":"webgpu","thread_warp_size":4}"#);
    assert!(e.to_string().contains("supports_subgroups"), "{e}");
}

#[test]
fn coercions_are_int_bool_only() {
    let t = parse(r#"{"kind":"llvm","fast-math":2,"num-cores":true,"mtriple":"x"}"#);
    assert_eq!(t.get_bool("fast-math"), Some(true));
    assert_eq!(t.get_int("num-cores"), Some(1));
    for bad in [
        r#"{"kind":"llvm","num-cores":4.0}"#,
        r#"{"kind":"llvm","num-cores":"4"}"#,
        r#"{"kind":"llvm","fast-math":"true"}"#,
        r#"{"kind":"llvm","mattr":"+avx2"}"#,
        r#"{"kind":"llvm","mattr":[["+avx2"]]}"#,
        r#"{"kind":"llvm","libs":{"a":"b"}}"#,
        r#"{"kind":"llvm","mcpu":null}"#,
    ] {
        assert_eq!(parse_err(bad).category(), "type_mismatch", "{bad}");
    }
}

#[test]
fn export_order_is_kind_tag_keys_host_then_declaration_order() {
    let t = parse(
        r#"{"vector-width":256,"mcpu":"skylake","feature.z":1,"kind":"llvm","host":"c","feature.a":true,"mattr":["+avx2"],"device":"d"}"#,
    );
    let keys: Vec<String> = t
        .export()
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    assert_eq!(
        keys,
        [
            "kind",
            "tag",
            "keys",
            "host",
            "device",
            "mattr",
            "mcpu",
            "vector-width",
            "feature.a",
            "feature.z"
        ]
    );
    assert_eq!(t.keys(), ["d", "cpu"]);
    assert_eq!(t.host().map(Target::kind_name), Some("c"));
    assert_eq!(t.get_str_array("mattr"), Some(&["+avx2".to_string()][..]));
    assert_eq!(t.attr("feature.z"), Some(&TargetValue::Int(1)));
    assert_eq!(t.feature("a"), Some(&TargetValue::Bool(true)));
    assert_eq!(
        t.to_string(),
        r#"{"kind":"llvm","tag":"","keys":["d","cpu"],"host":{"kind":"c","tag":"","keys":["cpu"]},"device":"d","mattr":["+avx2"],"mcpu":"skylake","vector-width":256,"feature.a":true,"feature.z":1}"#
    );
}

#[test]
fn round_trips_equality_and_hashing() {
    let inputs = [
        "llvm",
        "nvidia/jetson-agx-xavier",
        "raspberry-pi/4b-aarch64",
        r#"{"kind":"composite","host":"llvm","devices":["cuda",{"kind":"opencl"}]}"#,
        r#"{"kind":"llvm","feature.nan":NaN,"feature.f":1.5,"feature.big":1e300,"mcpu":"a\"b\\c\u0001"}"#,
        r#"{"kind":"vulkan","device_name":"GPU with spaces"}"#,
    ];
    let mut set = HashSet::new();
    for s in inputs {
        let t = parse(s);
        let back = parse(&t.to_string());
        assert_eq!(back, t, "{s}");
        if !s.contains("NaN") {
            assert_eq!(Target::from_json(&t.export()).ok(), Some(t.clone()), "{s}");
        }
        assert!(set.insert(t.clone()));
        assert!(!set.insert(back));
    }
    let a = parse(r#"{"kind":"cuda","arch":"sm_80"}"#);
    let b = parse("cuda -arch=sm_80").with_host(parse("llvm"));
    assert_ne!(a, b);
    assert_eq!(a, b.clone().without_host());
    // with_host replaces the host.
    let c = b.with_host(parse("c"));
    assert_eq!(c.host().map(Target::kind_name), Some("c"));
}

#[test]
fn kinds_can_be_registered_from_outside() {
    let kind = TargetKind::builder("api_test_npu", 12)
        .option::<i64>("num-cores", Some(2))
        .option::<Vec<String>>("ops", None)
        .option::<bool>("fp16", None)
        .default_keys(["npu"])
        .canonicalizer(|cfg| {
            if cfg.get_int("num-cores").unwrap_or(0) > 64 {
                return Err(TargetError::Canonicalizer {
                    kind: "api_test_npu".into(),
                    message: "at most 64 cores".into(),
                });
            }
            cfg.set("feature.big", cfg.get_int("num-cores").unwrap_or(0) > 8);
            Ok(())
        });
    register_kind(kind).expect("first registration succeeds");
    assert!(lookup_kind("api_test_npu").is_some());
    assert!(list_kinds().iter().any(|k| k.name() == "api_test_npu"));
    let t = parse(r#"{"kind":"api_test_npu","num-cores":16,"fp16":1}"#);
    assert_eq!(t.get_bool("feature.big"), Some(true));
    assert_eq!(t.get_bool("fp16"), Some(true));
    assert_eq!(t.keys(), ["npu"]);
    assert_eq!(t.device_type(), 12);
    assert_eq!(
        parse_err(r#"{"kind":"api_test_npu","num-cores":100}"#).category(),
        "canonicalizer"
    );

    let dup = TargetKind::builder("api_test_npu", 1).register();
    assert!(matches!(dup, Err(TargetError::DuplicateKind(n)) if n == "api_test_npu"));
    let dup_opt = TargetKind::builder("api_test_other", 1)
        .option::<i64>("x", None)
        .option::<bool>("x", None)
        .register();
    assert!(matches!(dup_opt, Err(TargetError::DuplicateOption { .. })));
    let dup_base = TargetKind::builder("api_test_other", 1)
        .option::<String>("device", None)
        .build();
    assert!(matches!(dup_base, Err(TargetError::DuplicateOption { .. })));
    assert!(lookup_kind("api_test_other").is_none());
}

#[test]
fn canonicalizer_output_is_checked() {
    TargetKind::builder("api_test_bad_canon", 1)
        .option::<i64>("n", None)
        .canonicalizer(|cfg| {
            cfg.set("n", "not a number");
            Ok(())
        })
        .register()
        .expect("registers");
    let e = parse_err("api_test_bad_canon");
    assert_eq!(e.category(), "canonicalizer");
    assert!(e.to_string().contains("set `n` to String"), "{e}");
}

#[test]
fn tags_are_listed_and_extensible() {
    let tags = list_tags();
    assert!(tags.len() >= 287);
    assert!(tags.iter().any(|t| t.name == "nvidia/geforce-rtx-2080-ti"));
    let t = parse("nvidia/geforce-rtx-2080-ti");
    assert_eq!(t.get_str("arch"), Some("sm_75"));
    assert_eq!(t.get_int("max_shared_memory_per_block"), Some(49152));
    assert_eq!(t.tag(), "");
    let t = Target::from_json(&json!({"tag": "nvidia/jetson-nano"})).expect("tag dict");
    assert_eq!(t.get_int("registers_per_block"), Some(32768));
    assert_eq!(t.tag(), "nvidia/jetson-nano");

    register_tag(
        "api-test/my-board",
        &json!({"kind": "llvm", "mcpu": "cortex-a53", "mtriple": "aarch64-linux-gnu"}),
    )
    .expect("registers");
    let t = parse("api-test/my-board");
    assert_eq!(t.feature("is_aarch64"), Some(&TargetValue::Bool(true)));
    assert_eq!(t.keys(), ["arm_cpu", "cpu"]);
    assert!(matches!(
        register_tag("api-test/my-board", &json!({"kind": "llvm"})),
        Err(TargetError::DuplicateTag(_))
    ));
    assert!(register_tag("api-test/bad", &json!({"kind": "llvm", "mcpu": 1})).is_err());
    assert!(register_tag("api-test/bad", &json!([1])).is_err());
    assert!(list_tags().iter().all(|t| t.name != "api-test/bad"));
}

#[test]
fn llvm_canonicalizer_rules() {
    let t = parse("llvm");
    assert_eq!(t.get_str("mtriple"), Some(kiln::target::default_triple()));
    assert_eq!(
        parse(r#"{"kind":"llvm","mcpu":"x"}"#).get_str("mtriple"),
        None
    );
    let t = parse(r#"{"kind":"llvm","mcpu":"cortex-m55","mattr":["+nomve"]}"#);
    assert_eq!(t.feature("has_dsp"), Some(&TargetValue::Bool(true)));
    assert_eq!(t.feature("has_mve"), Some(&TargetValue::Bool(false)));
    let t =
        parse(r#"{"kind":"llvm","mtriple":"aarch64-linux-gnu","mcpu":"neoverse-v1","keys":["x"]}"#);
    assert_eq!(t.keys(), ["x", "arm_cpu", "cpu"]);
    assert_eq!(t.feature("has_sve"), Some(&TargetValue::Bool(true)));
    // c kind: M-profile fires, A-profile cannot (no mtriple option).
    let t = parse(r#"{"kind":"c","mcpu":"cortex-m4"}"#);
    assert_eq!(t.feature("has_dsp"), Some(&TargetValue::Bool(true)));
    // Features given by the user survive unless the canonicalizer sets them.
    let t = parse(r#"{"kind":"test","feature.is_test":false,"feature.x":1}"#);
    assert_eq!(t.feature("is_test"), Some(&TargetValue::Bool(true)));
    assert_eq!(t.feature("x"), Some(&TargetValue::Int(1)));
    assert_eq!(
        parse_err(r#"{"kind":"llvm","feature.":1}"#).category(),
        "unknown_option"
    );
}

#[test]
fn mcpu_native_is_kept_in_the_export_as_tvm_keeps_it() {
    // TVM 0.27: {"kind": "llvm", "tag": "", "keys": ["cpu"], "mcpu": "native"}.
    let t = parse(r#"{"kind":"llvm","mcpu":"native"}"#);
    assert_eq!(
        t.export(),
        json!({"kind": "llvm", "tag": "", "keys": ["cpu"], "mcpu": "native"})
    );
    assert_eq!(
        t.to_string(),
        r#"{"kind":"llvm","tag":"","keys":["cpu"],"mcpu":"native"}"#
    );
    assert_eq!(parse(&t.to_string()), t);
    // The legacy form, a given mattr, and `native` as a host mean the same everywhere.
    assert_eq!(parse("llvm -mcpu=native"), t);
    let t = parse(r#"{"kind":"llvm","mcpu":"native","mattr":["+user"]}"#);
    assert_eq!(t.get_str("mcpu"), Some("native"));
    assert_eq!(t.get_str_array("mattr"), Some(&["+user".to_string()][..]));
    let t = parse(r#"{"kind":"cuda","arch":"sm_80","host":{"kind":"llvm","mcpu":"native"}}"#);
    assert_eq!(t.host().and_then(|h| h.get_str("mcpu")), Some("native"));
}

#[cfg(feature = "llvm")]
#[test]
fn resolve_native_gives_the_host_cpu_and_features() {
    let (name, features) = kiln::target::host_cpu().expect("LLVM knows the host");
    let t = parse(r#"{"kind":"llvm","mcpu":"native","mattr":["+user"]}"#);
    let r = t.resolve_native().unwrap();
    assert_eq!(r.get_str("mcpu"), Some(name.as_str()));
    let mattr = r.get_str_array("mattr").expect("mattr set");
    assert_eq!(&mattr[..features.len()], &features[..]);
    assert_eq!(mattr.last().map(String::as_str), Some("+user"));
    assert_eq!(r.keys(), t.keys());
    // The resolved target is a plain one: it parses back to itself and stays resolved.
    assert_eq!(parse(&r.to_string()), r);
    assert_eq!(r.resolve_native().unwrap(), r);
    // Hosts are resolved too; other targets and named CPUs are unchanged.
    let t = parse(r#"{"kind":"cuda","arch":"sm_80","host":{"kind":"llvm","mcpu":"native"}}"#);
    let r = t.resolve_native().unwrap();
    assert_eq!(
        r.host().and_then(|h| h.get_str("mcpu")),
        Some(name.as_str())
    );
    assert_eq!(r.clone().without_host(), t.clone().without_host());
    for s in [
        "llvm -mcpu=skylake",
        "llvm",
        "cuda -arch=sm_80",
        "c -mcpu=native",
    ] {
        let t = parse(s);
        assert_eq!(t.resolve_native().unwrap(), t, "{s}");
    }
    // Code generation sees the same CPU and features for `native` and its resolved form.
    let native = kiln::codegen::llvm::CodegenOptions::from_target(&parse(
        r#"{"kind":"llvm","mcpu":"native","mattr":["+user"]}"#,
    ))
    .unwrap()
    .resolved();
    let pinned = kiln::codegen::llvm::CodegenOptions::from_target(
        &parse(r#"{"kind":"llvm","mcpu":"native","mattr":["+user"]}"#)
            .resolve_native()
            .unwrap(),
    )
    .unwrap()
    .resolved();
    assert_eq!(native.cpu, pinned.cpu);
    assert_eq!(native.features, pinned.features);
}

#[test]
fn legacy_form_is_read_only_where_the_user_writes_a_target_directly() {
    // Top-level strings, including both halves of a (target, host) pair built from strings.
    let t = Target::from_json(&json!("cuda -arch=sm_80"))
        .and_then(|t| Ok(t.with_host(Target::from_json(&json!("llvm -mcpu=skylake"))?)));
    assert!(t.is_ok(), "{t:?}");
    // Strings inside a config: TVM 0.27's strict rules.
    for config in [
        json!({"kind": "cuda", "host": "llvm -mcpu=skylake"}),
        json!({"kind": "composite", "devices": ["cuda -arch=sm_80"]}),
        json!({"tag": "nvidia/nvidia-a100", "host": "llvm "}),
    ] {
        let e = Target::from_json(&config).err();
        assert_eq!(
            e.as_ref().map(TargetError::category),
            Some("cli_string"),
            "{config}"
        );
    }
    // A tag alone with stray whitespace is not the legacy form (TVM never read it either).
    assert_eq!(parse_err("nvidia/nvidia-a100 ").category(), "unknown_kind");
}

/// The vector register width kiln sizes its own vector steps by: by the CPU's name, unless the
/// feature list says otherwise (its last word on a feature wins, as in LLVM's).
#[test]
fn cpu_vector_bits_follows_the_cpu_and_its_features() {
    use kiln::target::cpu_vector_bits;
    for (cpu, features, bits) in [
        ("x86-64", "", 128),
        ("generic", "", 128),
        ("nehalem", "", 128),
        ("haswell", "", 256),
        ("znver3", "", 256),
        ("skylake-avx512", "", 512),
        ("znver4", "", 512),
        ("a-cpu-llvm-14-does-not-know", "", 256),
        ("x86-64", "+avx,+avx2", 256),
        ("x86-64", "+avx2,+avx512f", 512),
        ("skylake-avx512", "-avx512f", 256),
        ("skylake-avx512", "+avx512f,-avx512f", 256),
        ("haswell", "-avx", 128),
        ("znver3", "+avx,-avx512f,+avx2", 256),
    ] {
        assert_eq!(cpu_vector_bits(cpu, features), bits, "{cpu} {features:?}");
    }
}
