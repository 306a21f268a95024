//! The compile cache: a second build of the same module is served from the cache directory.

use std::time::{Duration, Instant};

use kiln::codegen::cache::CompileCache;
use kiln::codegen::llvm::CodegenOptions;
use kiln::ir::{kernels, IRModule};
use kiln::target::Target;

#[test]
fn a_second_build_of_the_same_module_is_a_cache_hit_and_keys_follow_the_options() {
    let dir = tempfile::tempdir().unwrap();
    // This test binary has one test, so setting the environment is race-free.
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
