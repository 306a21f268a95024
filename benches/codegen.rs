//! Code generation costs, measured in one run:
//! - build latency: IR module with one function -> callable JIT function (`kiln::codegen::build`,
//!   no compile cache), -> its O3 code installed by the JIT's background tier, in one tier
//!   (`KILN_JIT_TIERS=1`, the baseline), and with a compile-cache hit;
//! - the JIT's two tiers on the benchmark kernels: build and run time of the quick code alone
//!   against the O3 code;
//! - call overhead: an exported 3-tensor function with 1-element tensors, called directly through
//!   its C symbol (the cost a C host pays), next to a direct call of a plain C function doing the
//!   same add (the floor).
//!
//! - CUDA: the scheduled vadd (`examples/kernels/cuda/vadd.json`) to PTX through LLVM's NVPTX
//!   backend (split, plan, kernel emission, O3, PTX), and to a whole module (with the host JIT);
//!
//! Goals (issue 6): build < 5 ms median; exported call <= TVM's 9-15 ns, aiming at 5 ns.
//! (issue 24): vadd to PTX in 10 ms or less.
//! Run: `cargo bench --bench codegen`.

#[path = "util/mod.rs"]
mod util;

use std::hint::black_box;
use std::time::Instant;

use kiln::codegen::llvm::{export, generate_ir, CodegenOptions, Linkage};
use kiln::ir::{kernels, IRModule};
use kiln::packed_func::ffi::{TVMFFIAny, TVMFFISafeCallType, TypeIndex};
use kiln::packed_func::DLTensor;
use kiln::target::Target;

fn main() {
    if std::env::var_os("KILN_BENCH_STREAM_ONLY").is_some() {
        let module = IRModule::from_functions(vec![kernels::vadd()]);
        let target = Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap();
        std::env::set_var("KILN_CACHE", "off");
        streaming_store_cost(&module, &target);
        return;
    }
    let module = IRModule::from_functions(vec![kernels::vadd()]);
    let target = Target::parse(
        &std::env::var("KILN_BENCH_TARGET")
            .unwrap_or_else(|_| r#"{"kind": "llvm", "mcpu": "native"}"#.into()),
    )
    .unwrap();
    // Build latency: without the compile cache (a real compilation every time), then with it.
    // `until_optimized`: the time until the JIT's optimized code is installed (tiered JIT)
    // rather than until the function is callable. Between builds, the background compilation
    // of the last one finishes, unmeasured, so that it does not slow the next (unless
    // `back_to_back`). `idle_ms`: an idle pause before each build (on this kind of VM, a build
    // after 20 ms idle is markedly slower).
    let build_times = |n: usize, until_optimized: bool, idle_ms: u64, back_to_back: bool| {
        let wait = || {
            if !back_to_back {
                kiln::codegen::llvm::wait_all_optimized();
            }
        };
        let mut times = Vec::new();
        for _ in 0..n {
            wait();
            std::thread::sleep(std::time::Duration::from_millis(idle_ms));
            let t = Instant::now();
            let m = kiln::codegen::build(&module, &target).unwrap();
            let f = m.require_function("vadd").unwrap();
            if until_optimized {
                kiln::codegen::llvm::wait_all_optimized();
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
            black_box(f);
        }
        times.sort_by(f64::total_cmp);
        (times[n / 2], times[0], times[n - 1])
    };
    std::env::set_var("KILN_CACHE", "off");
    let (med, lo, hi) = build_times(41, false, 0, false);
    println!("build vadd -> callable JIT function, no cache: median {med:.2} ms [min {lo:.2}, max {hi:.2}] (goal < 5 ms; TVM 0.27 tvm.compile: 22-44 ms)");
    streaming_store_cost(&module, &target);
    let (med, lo, hi) = build_times(21, false, 20, false);
    println!("  the same after 20 ms idle:                      median {med:.2} ms [min {lo:.2}, max {hi:.2}]");
    let (med, lo, hi) = build_times(41, false, 0, true);
    println!("  back to back (background work overlapping):     median {med:.2} ms [min {lo:.2}, max {hi:.2}]");
    let (med, lo, hi) = build_times(41, true, 0, false);
    println!("  -> its O3 code installed (background tier):     median {med:.2} ms [min {lo:.2}, max {hi:.2}]");
    std::env::set_var("KILN_JIT_TIERS", "1");
    let (med, lo, hi) = build_times(41, false, 0, false);
    std::env::remove_var("KILN_JIT_TIERS");
    println!("  one tier (KILN_JIT_TIERS=1), O3 before return:  median {med:.2} ms [min {lo:.2}, max {hi:.2}]");
    let cache_dir = tempfile::tempdir().unwrap();
    std::env::remove_var("KILN_CACHE");
    std::env::set_var("KILN_CACHE_DIR", cache_dir.path());
    let _ = kiln::codegen::build(&module, &target).unwrap();
    let opts0 = CodegenOptions::from_target(&target).unwrap().resolved();
    let key = kiln::codegen::cache::CompileCache::key(&module, &opts0);
    while !cache_dir.path().join(format!("{key}.so")).exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (med, lo, hi) = build_times(30, false, 0, false);
    println!(
        "build vadd -> function, compile-cache hit: median {med:.2} ms [min {lo:.2}, max {hi:.2}]"
    );
    let opts = CodegenOptions::from_target(&target).unwrap().resolved();
    let t = Instant::now();
    let text = generate_ir(&module, &opts, &Linkage::Export).unwrap();
    println!(
        "  of which IR text generation: {:.3} ms ({} bytes)",
        t.elapsed().as_secs_f64() * 1e3,
        text.len()
    );

    tiers(&target);
    ptx_build();

    // Direct call of an exported function.
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("vadd.so");
    export(&module, &opts, &so).unwrap();
    // SAFETY: a library kiln just generated.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    // SAFETY: kiln exports `__tvm_ffi_vadd` with the safe-call signature.
    let f: TVMFFISafeCallType =
        unsafe { *lib.get::<TVMFFISafeCallType>(b"__tvm_ffi_vadd\0").unwrap() };
    let mut xs = [[1.0f32; 16]; 3];
    let mut shape = [1i64];
    let mk = util::f32_tensor;
    let sp = shape.as_mut_ptr();
    let mut ts = [
        mk(xs[0].as_mut_ptr(), sp),
        mk(xs[1].as_mut_ptr(), sp),
        mk(xs[2].as_mut_ptr(), sp),
    ];
    let args: Vec<TVMFFIAny> = ts
        .iter_mut()
        .map(|t| TVMFFIAny {
            type_index: TypeIndex::DL_TENSOR_PTR,
            small_len: 0,
            value: kiln::packed_func::ffi::TVMFFIAnyValue {
                v_ptr: (t as *mut DLTensor).cast(),
            },
        })
        .collect();
    let mut ret = TVMFFIAny::NONE;
    let call = util::measure(21, 2_000_000, || {
        // SAFETY: three valid DLTensor arguments, a writable result.
        black_box(unsafe { f(std::ptr::null_mut(), black_box(args.as_ptr()), 3, &mut ret) });
    });
    let (a, b) = (xs[0].as_ptr(), xs[1].as_ptr());
    let c = xs[2].as_mut_ptr();
    let floor = util::measure(21, 2_000_000, || {
        // SAFETY: one element each.
        unsafe { *black_box(c) = *black_box(a) + *black_box(b) };
    });
    // The same call of a JIT function (fast checks, the compute function through the table).
    let jm = kiln::codegen::llvm::LlvmModule::jit(&module, &opts).unwrap();
    jm.wait_optimized().unwrap();
    let jpf = kiln::packed_func::Module::require_function(&jm, "vadd").unwrap();
    let (jf, jself) = jpf.safe_call();
    let jit_call = util::measure(21, 2_000_000, || {
        // SAFETY: as above; `jpf` keeps the JIT code alive.
        black_box(unsafe { jf(jself, black_box(args.as_ptr()), 3, &mut ret) });
    });
    println!("exported 3-tensor call, 1 element (direct C call), ns per call:");
    util::report("__tvm_ffi_vadd (checks + add)", call, None);
    util::report("inline add (floor)", floor, None);
    util::report("JIT __tvm_ffi_vadd, O3 tier", jit_call, None);
    println!(
        "goal: <= TVM's 9-15 ns, aiming at 5 ns -> {}",
        if call.median <= 9.0 { "met" } else { "NOT met" }
    );
}

/// vadd for CUDA: to PTX, and to a module (host JIT + PTX).
fn ptx_build() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/kernels/cuda/vadd.json"
    );
    let m = IRModule::from_json_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let t = Target::parse(r#"{"kind": "cuda", "arch": "sm_90"}"#).unwrap();
    let time = |n: usize, f: &dyn Fn()| {
        let mut v: Vec<f64> = (0..n)
            .map(|_| {
                let s = Instant::now();
                f();
                s.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        v.sort_by(f64::total_cmp);
        (v[n / 2], v[0], v[n - 1])
    };
    let (med, lo, hi) = time(41, &|| {
        black_box(kiln::codegen::cuda::device_code(&m, &t).unwrap());
    });
    println!("build cuda vadd -> PTX (sm_90 target, sm_86 PTX): median {med:.2} ms [min {lo:.2}, max {hi:.2}] (goal <= 10 ms)");
    let (med, lo, hi) = time(21, &|| {
        let built = kiln::codegen::build(&m, &t).unwrap();
        black_box(built.require_function("vadd").unwrap());
        kiln::codegen::llvm::wait_all_optimized();
    });
    println!("  -> whole module (host JIT until optimized + PTX):  median {med:.2} ms [min {lo:.2}, max {hi:.2}]");
    // softmax calls `exp`: libdevice is parsed and linked into every build.
    if kiln::codegen::cuda::libdevice_path().is_ok() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/kernels/cuda/softmax.json"
        );
        let sm = IRModule::from_json_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let (med, lo, hi) = time(21, &|| {
            black_box(kiln::codegen::cuda::device_code(&sm, &t).unwrap());
        });
        println!("build cuda softmax -> PTX (libdevice linked):   median {med:.2} ms [min {lo:.2}, max {hi:.2}]");
    } else {
        println!("build cuda softmax -> PTX: skipped (no libdevice; set KILN_LIBDEVICE)");
    }
}

/// The JIT's two tiers on the benchmark kernels (`examples/kernels/*.json`): build time and
/// time per call of the quick code alone (`Tiering::QuickOnly`) and of the O3 code
/// (`Tiering::Off`).
fn tiers(target: &Target) {
    use kiln::codegen::llvm::{LlvmModule, Tiering};
    use kiln::device_api::{Device, Tensor};
    use kiln::packed_func::{AnyView, Module};
    let opts = CodegenOptions::from_target(target).unwrap().resolved();
    println!("JIT tiers on the benchmark kernels: build ms, run ms (median of 9 [min, max]):");
    for (name, shapes) in [
        ("vadd", vec![vec![1i64 << 24]; 3]),
        ("matmul", vec![vec![1024i64, 1024]; 3]),
        ("softmax", vec![vec![4096i64, 4096]; 2]),
    ] {
        let path = format!(
            "{}/examples/kernels/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let ir = IRModule::from_json_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let tensors: Vec<Tensor> = shapes
            .iter()
            .map(|s| {
                Tensor::zeros(s, <f32 as kiln::device_api::Element>::DTYPE, Device::cpu()).unwrap()
            })
            .collect();
        let args: Vec<AnyView<'_>> = tensors
            .iter()
            .map(|t| AnyView::from(t.as_dltensor()))
            .collect();
        let mut runs = Vec::new();
        for tiering in [Tiering::QuickOnly, Tiering::Off] {
            let t = Instant::now();
            let m = LlvmModule::jit_with(&ir, &opts, tiering).unwrap();
            let build = t.elapsed().as_secs_f64() * 1e3;
            let f = m.require_function(name).unwrap();
            f.call(&args).unwrap();
            let mut times: Vec<f64> = (0..9)
                .map(|_| {
                    let t = Instant::now();
                    f.call(&args).unwrap();
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            times.sort_by(f64::total_cmp);
            runs.push((build, times[4], times[0], times[8]));
        }
        let [(qb, qr, ql, qh), (ob, or, ol, oh)] = runs[..] else {
            unreachable!()
        };
        println!(
            "  {name:8} quick: build {qb:6.2}, run {qr:8.3} [{ql:.3}, {qh:.3}]   O3: build {ob:6.2}, run {or:8.3} [{ol:.3}, {oh:.3}]   quick run / O3 run = {:.2}",
            qr / or
        );
    }
}

/// The build cost of streaming stores: vadd (symbolic size, so both forms of its loop are
/// compiled, behind a run-time size check) with and without them, alternated, to a callable
/// function and to its O3 code.
fn streaming_store_cost(module: &IRModule, target: &Target) {
    let with = CodegenOptions::from_target(target).unwrap().resolved();
    if with.stream_store_bytes.is_none() {
        return;
    }
    let without = CodegenOptions {
        stream_store_bytes: None,
        ..with.clone()
    };
    let mut t: [[Vec<f64>; 2]; 2] = Default::default();
    for _ in 0..41 {
        for (k, o) in [&with, &without].into_iter().enumerate() {
            kiln::codegen::llvm::wait_all_optimized();
            let s = Instant::now();
            let m = kiln::codegen::llvm::LlvmModule::jit(module, o).unwrap();
            black_box(kiln::packed_func::Module::require_function(&m, "vadd").unwrap());
            t[k][0].push(s.elapsed().as_secs_f64() * 1e3);
            m.wait_optimized().unwrap();
            t[k][1].push(s.elapsed().as_secs_f64() * 1e3);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    for (i, what) in ["callable", "O3 code"].iter().enumerate() {
        let (a, alo, ahi) = med(&mut t[0][i]);
        let (b, blo, bhi) = med(&mut t[1][i]);
        println!(
            "  vadd -> {what:<8} with streaming stores: median {a:.2} ms [{alo:.2}, {ahi:.2}], without: {b:.2} ms [{blo:.2}, {bhi:.2}]: {:.2}x",
            a / b
        );
    }
}
