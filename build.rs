//! Compiles the runtime that `kiln build` links into every exported library
//! (`src/runtime/export_rt.c`: the thread pool and workspace cache for hosts that fill no
//! context slot) into one object, `$OUT_DIR/kiln_export_rt.o`, which the code generator embeds.

fn main() {
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
