//! The compile cache: a second build of the same module is served from the cache directory;
//! keys hold the resolved CPU and features.

use std::time::{Duration, Instant};

use kiln::codegen::cache::CompileCache;
use kiln::codegen::llvm::CodegenOptions;
use kiln::ir::{kernels, IRModule};
use kiln::target::Target;

#[test]
fn a_second_build_of_the_same_module_is_a_cache_hit_and_keys_follow_the_options() {
    let dir = tempfile::tempdir().unwrap();
    // The other test of this binary reads no environment, so setting it is race-free.
    std::env::set_var("KILN_CACHE_DIR", dir.path());
    std::env::remove_var("KILN_CACHE");
    let module = IRModule::from_functions(vec![kernels::vadd()]);
    let target = Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap();

    let opts = CodegenOptions::from_target(&target).unwrap().resolved();
    let key = CompileCache::key(&module, &opts);
    assert_eq!(
        key,
        CompileCache::key(&module, &opts),
        "keys are deterministic"
    );
    let mut o2 = opts.clone();
    o2.opt_level = 2;
    assert_ne!(
        key,
        CompileCache::key(&module, &o2),
        "options are part of the key"
    );
    // Every option that changes the code is in the key: a threshold set by the caller (or
    // read from another host's caches) must not be served code built with another.
    for change in [
        |o: &mut CodegenOptions| o.stream_store_bytes = Some(0),
        |o: &mut CodegenOptions| o.stream_store_bytes = None,
        |o: &mut CodegenOptions| o.device_host = !o.device_host,
        |o: &mut CodegenOptions| o.device_meta = Some("{}".into()),
        |o: &mut CodegenOptions| o.fast_math = "fast".into(),
    ] {
        let mut o = opts.clone();
        change(&mut o);
        assert_ne!(key, CompileCache::key(&module, &o), "{o:?}");
    }
    let other = IRModule::from_functions(vec![kernels::rowsum_sized(4, 4)]);
    assert_ne!(
        key,
        CompileCache::key(&other, &opts),
        "the IR is part of the key"
    );

    let first = kiln::codegen::build(&module, &target).unwrap();
    assert_eq!(first.type_key(), "llvm");
    let entry = dir.path().join(format!("{key}.so"));
    let t = Instant::now();
    while !entry.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the background store did not finish"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    let second = kiln::codegen::build(&module, &target).unwrap();
    let hit_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(second.function_names(), ["vadd"]);
    assert!(second.get_function("vadd").is_some());
    eprintln!("cache hit build: {hit_ms:.2} ms");

    // A corrupt entry is ignored (and the build still works). It is renamed into place, as the
    // cache itself does: writing into a library that is mapped would crash this process.
    let tmp = dir.path().join("corrupt.tmp");
    std::fs::write(&tmp, b"not a library").unwrap();
    std::fs::rename(&tmp, &entry).unwrap();
    let third = kiln::codegen::build(&module, &target).unwrap();
    assert_eq!(third.function_names(), ["vadd"]);

    // Disabled: no lookups.
    std::env::set_var("KILN_CACHE", "off");
    assert!(CompileCache::from_env().is_none());
}

#[test]
fn the_key_holds_the_resolved_cpu_and_features_not_native() {
    let module = IRModule::from_functions(vec![kernels::vadd()]);
    let native = Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap();
    let raw = CodegenOptions::from_target(&native).unwrap();
    assert_eq!(raw.cpu, "native", "the target keeps `native`");
    let resolved = raw.clone().resolved();
    assert_ne!(resolved.cpu, "native");
    // Unresolved and resolved options give the same key: `native` is expanded first.
    let key = CompileCache::key(&module, &raw);
    assert_eq!(key, CompileCache::key(&module, &resolved));
    // ... which is the key of this machine's CPU named explicitly.
    let pinned = CodegenOptions::from_target(&native.resolve_native().unwrap()).unwrap();
    assert_eq!(key, CompileCache::key(&module, &pinned));
    // Another machine's `native` (another CPU, or the same CPU name with other features)
    // resolves to other options, hence another key: a shared cache never mixes them up.
    let other_cpu = CodegenOptions {
        cpu: if resolved.cpu == "skylake" {
            "znver3"
        } else {
            "skylake"
        }
        .into(),
        ..resolved.clone()
    };
    assert_ne!(key, CompileCache::key(&module, &other_cpu));
    let other_features = CodegenOptions {
        features: format!("{},-avx2", resolved.features),
        ..resolved.clone()
    };
    assert_ne!(key, CompileCache::key(&module, &other_features));
    let generic = CodegenOptions::from_target(&Target::parse("llvm").unwrap()).unwrap();
    assert_ne!(key, CompileCache::key(&module, &generic));
}
