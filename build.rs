//! Compiles the runtime that `kiln build` links into every exported library
//! (`src/runtime/export_rt.c`: the thread pool and workspace cache for hosts that fill no
//! context slot) into one object, `$OUT_DIR/kiln_export_rt.o`, which the code generator embeds.

fn main() {
    // The `kiln` binary defines tvm-ffi's error functions that TVM-built libraries call by name
    // (`src/bin/kiln/main.rs`): export them to the dynamic symbol table so `dlopen`ed
    // libraries find them.
    for sym in [
        "TVMFFIErrorSetRaisedFromCStr",
        "TVMFFIErrorSetRaisedFromCStrParts",
    ] {
        println!("cargo:rustc-link-arg-bin=kiln=-Wl,--export-dynamic-symbol={sym}");
    }
    let src = "src/runtime/export_rt.c";
    println!("cargo:rerun-if-changed={src}");
    let objs = cc::Build::new()
        .file(src)
        .pic(true)
        .opt_level(2)
        .flag("-fvisibility=hidden")
        .flag("-std=gnu11")
        .warnings(true)
        .extra_warnings(true)
        .cargo_metadata(false)
        .compile_intermediates();
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let obj = objs.first().expect("one object for one source file");
    std::fs::copy(obj, out.join("kiln_export_rt.o")).expect("copying the runtime object");
}
