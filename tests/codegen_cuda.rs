//! The CUDA code generator without a GPU: every example kernel and every math intrinsic is
//! compiled to PTX through LLVM's NVPTX backend and assembled by NVIDIA's ptxas for sm_80 and
//! sm_90 (`common::ptxas_check`; CI installs ptxas and libdevice from the
//! `nvidia-cuda-nvcc-cu12` wheel and sets `KILN_REQUIRE_PTXAS=1`); the arch rule, the build-time
//! limit checks, dynamic shared memory and the errors of what a kernel cannot do. Running the
//! kernels needs a GPU: the conformance suites (`tests/codegen_conformance.rs`, `cuda`) run
//! them where one exists.

mod common;

use std::path::Path;
use std::process::Command;

use kiln::codegen::cuda::{self, PtxArch};
use kiln::ir::builder::{barrier, call, call_extern, thread_for};
use kiln::ir::{
    Buffer, DataType, Expr, ForKind, IRModule, Intrinsic, Param, PrimFunc, Stmt, StorageScope,
    ThreadTag, Var,
};
use kiln::target::Target;

fn target(arch: &str) -> Target {
    Target::parse(&format!(r#"{{"kind": "cuda", "arch": "{arch}"}}"#)).unwrap()
}

fn read(path: &Path) -> IRModule {
    IRModule::from_json_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Whether libdevice can be found; `false` after a `skipping:` line (a panic under
/// `KILN_REQUIRE_PTXAS=1`, which CI sets with `KILN_LIBDEVICE`).
fn have_libdevice(what: &str) -> bool {
    match cuda::libdevice_path() {
        Ok(_) => true,
        Err(why) => {
            assert_ne!(
                std::env::var("KILN_REQUIRE_PTXAS").as_deref(),
                Ok("1"),
                "KILN_REQUIRE_PTXAS=1 but {why}"
            );
            eprintln!("skipping: {what}: {why}");
            false
        }
    }
}

fn uses_math(m: &IRModule) -> bool {
    let text = m.to_json_string();
    ["\"exp\"", "\"log\"", "\"tanh\"", "\"erf\"", "\"sin\""]
        .iter()
        .any(|op| text.contains(op))
}

#[test]
fn example_kernels_compile_to_ptx_that_ptxas_accepts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for dir in ["examples/kernels/cuda", "examples/kernels/opencl"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for path in files {
            let m = read(&path);
            if uses_math(&m) && !have_libdevice(&path.display().to_string()) {
                continue;
            }
            for (arch, want) in [("sm_80", "sm_80"), ("sm_90", "sm_86")] {
                let code = cuda::device_code(&m, &target(arch))
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert!(
                    code.source.contains(&format!(".target {want}")),
                    "{}",
                    code.source
                );
                let entries = code.source.matches(".entry ").count();
                assert_eq!(entries, code.kernels.len(), "{}", code.source);
                // libdevice leaves nothing behind: no call of an external function.
                assert!(
                    !code.source.contains(".extern .func"),
                    "{}: {}",
                    path.display(),
                    code.source
                );
                common::ptxas_check(&code.source)
                    .unwrap_or_else(|e| panic!("{} for {arch}: {e}", path.display()));
                n += 1;
            }
        }
    }
    assert!(n >= 8, "only {n} example builds");
}

#[test]
fn the_ptx_arch_is_capped_at_what_llvm_14_writes() {
    let cases = [
        ("sm_50", 50, "4.0"),
        ("sm_70", 70, "6.0"),
        ("sm_75", 75, "6.3"),
        ("sm_80", 80, "7.0"),
        ("sm_86", 86, "7.1"),
        ("sm_87", 86, "7.1"),
        ("sm_89", 86, "7.1"),
        ("sm_90", 86, "7.1"),
        ("sm_90a", 86, "7.1"),
        ("sm_100", 86, "7.1"),
        ("sm_120f", 86, "7.1"),
    ];
    for (arch, sm, ptx) in cases {
        let a = PtxArch::from_arch(arch).unwrap();
        assert_eq!((a.sm, a.ptx_version), (sm, ptx), "{arch}");
        let d = a.describe();
        assert!(d.contains(&format!("sm_{sm}")), "{d}");
        if sm != a.requested_sm {
            assert!(d.contains("driver compiles"), "{d}");
        }
    }
    // The target's arch (TVM's tag for an H100 says sm_90a), and the PTX header LLVM writes.
    let h100 = Target::parse("nvidia/nvidia-h100").unwrap();
    assert_eq!(PtxArch::of(&h100).unwrap().cpu(), "sm_86");
    let vadd = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kernels/cuda/vadd.json"));
    let ptx = cuda::device_code(&vadd, &h100).unwrap().source;
    assert!(
        ptx.contains(".version 7.1") && ptx.contains(".target sm_86"),
        "{ptx}"
    );
    common::ptxas_check(&ptx).unwrap();
    for (bad, why) in [
        ("sm_35", "older than sm_50"),
        ("sm_", "must be `sm_<compute capability>`"),
        ("sm_9x", "must be `sm_<compute capability>`"),
        ("compute_80", "must be `sm_<compute capability>`"),
    ] {
        let e = PtxArch::from_arch(bad).unwrap_err().to_string();
        assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
    }
}

/// `B[i] = op(A[i], ...)` over 64 threads for a float type.
fn math_kernel(op: Intrinsic, t: DataType) -> PrimFunc {
    let a = Buffer::new("A", t, vec![Expr::from(64i64)]);
    let b = Buffer::new("B", t, vec![Expr::from(64i64)]);
    let body = thread_for("bx", 1i64, ThreadTag::Block(0), |_| {
        thread_for("tx", 64i64, ThreadTag::Thread(0), |tx| {
            let x = a.load([tx.clone()]);
            let args = vec![x; op.arity()];
            b.store([tx], call(op, args))
        })
    });
    PrimFunc::new(
        &format!("f_{}", op.name()),
        vec![Param::Buffer(a), Param::Buffer(b)],
        body,
    )
}

#[test]
fn every_math_intrinsic_compiles_without_aborting_llvm() {
    // LLVM 14's NVPTX backend aborts the process on `llvm.exp`, `llvm.sin`, `llvm.pow`,
    // `llvm.roundeven`, ...: that this test process lives is part of the test.
    if !have_libdevice("math intrinsics") {
        return;
    }
    for t in [DataType::f32(), DataType::f64(), DataType::f16()] {
        let fs: Vec<PrimFunc> = Intrinsic::ALL
            .iter()
            .filter(|op| !op.is_integer() && !op.is_predicate())
            .map(|op| math_kernel(*op, t))
            .collect();
        let m = IRModule::from_functions(fs);
        m.verify().unwrap();
        let code = cuda::device_code(&m, &target("sm_80")).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert!(
            !code.source.contains(".extern .func"),
            "{t}: {}",
            code.source
        );
        common::ptxas_check(&code.source).unwrap_or_else(|e| panic!("{t}: {e}"));
    }
}

/// A kernel of `threads` threads that stages `A` through `shared` floats of shared memory.
fn shared_kernel(threads: i64, shared: i64) -> IRModule {
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(threads)]);
    let sh = Buffer::shared("sh", DataType::f32(), &[shared]);
    let body = thread_for("bx", 1i64, ThreadTag::Block(0), |_| {
        sh.allocate(thread_for("tx", threads, ThreadTag::Thread(0), |tx| {
            Stmt::seq(vec![
                sh.store([tx.clone()], a.load([tx.clone()])),
                barrier(),
                a.store([tx.clone()], sh.load([(tx + 1i64).floormod(threads)])),
            ])
        }))
    });
    let m = IRModule::from_functions(vec![PrimFunc::new("k", vec![Param::Buffer(a)], body)]);
    m.verify().unwrap();
    m
}

#[test]
fn limits_are_checked_at_build_and_large_shared_memory_is_dynamic() {
    // Static shared memory, within 48 KiB.
    let code = cuda::device_code(&shared_kernel(256, 256), &target("sm_80")).unwrap();
    assert!(code.source.contains(".shared .align 16"), "{}", code.source);
    assert!(code.source.contains("bar.sync"), "{}", code.source);
    assert!(
        code.source.contains(".maxntid 256, 1, 1"),
        "{}",
        code.source
    );
    assert_eq!(code.kernels[0].dyn_shared_bytes, 0);
    common::ptxas_check(&code.source).unwrap();
    // Over the target's threads per block.
    let e = cuda::device_code(&shared_kernel(2048, 2048), &target("sm_80"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("2048") && e.contains("1024"), "{e}");
    // 64 KiB of shared memory: over the default 48 KiB ...
    let big = shared_kernel(256, 16384);
    let e = cuda::device_code(&big, &target("sm_80"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("65536") && e.contains("49152"), "{e}");
    // ... allowed by a target that states an A100's opt-in limit: dynamic shared memory,
    // recorded in the kernel table for the runtime.
    let a100 = Target::parse(
        r#"{"kind": "cuda", "arch": "sm_80", "max_shared_memory_per_block": 166912}"#,
    )
    .unwrap();
    let code = cuda::device_code(&big, &a100).unwrap();
    assert_eq!(code.kernels[0].dyn_shared_bytes, 65536);
    assert!(code.source.contains(".extern .shared"), "{}", code.source);
    common::ptxas_check(&code.source).unwrap();
    // Which needs sm_70 or newer.
    let old = Target::parse(
        r#"{"kind": "cuda", "arch": "sm_60", "max_shared_memory_per_block": 166912}"#,
    )
    .unwrap();
    let e = cuda::device_code(&big, &old).unwrap_err().to_string();
    assert!(e.contains("sm_70") && e.contains("sm_60"), "{e}");
}

/// A one-thread kernel around `body` (which may use `A`, float32 x 4).
fn kernel_with(body: impl FnOnce(&Buffer) -> Stmt) -> IRModule {
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(4i64)]);
    let inner = body(&a);
    let k = thread_for("bx", 1i64, ThreadTag::Block(0), |_| {
        thread_for("tx", 1i64, ThreadTag::Thread(0), |_| inner)
    });
    IRModule::from_functions(vec![PrimFunc::new("f", vec![Param::Buffer(a)], k)])
}

#[test]
fn what_a_kernel_cannot_do_is_an_error_naming_it() {
    let cases: Vec<(IRModule, &str)> = vec![
        (
            kernel_with(|a| Stmt::Assert {
                cond: a.load([Expr::from(0i64)]).gt(0.0f32),
                message: "positive".into(),
            }),
            "`assert` (\"positive\") inside a kernel",
        ),
        (
            kernel_with(|a| {
                let i = Var::new("i", DataType::i64());
                Stmt::For {
                    var: i.clone(),
                    min: Expr::from(0i64),
                    extent: Expr::from(4i64),
                    kind: ForKind::Parallel,
                    body: Box::new(a.store([Expr::Var(i)], 1.0f32)),
                }
            }),
            "parallel loop `i` inside the device kernel",
        ),
        (
            kernel_with(|a| {
                a.store(
                    [Expr::from(0i64)],
                    call_extern(
                        DataType::f32(),
                        "my_host_fn",
                        vec![a.load([Expr::from(1i64)])],
                    ),
                )
            }),
            "call_extern `my_host_fn` calls a host function",
        ),
        (
            kernel_with(|a| {
                let w = Buffer::temp(
                    "w",
                    DataType::f32(),
                    vec![Expr::from(4i64)],
                    StorageScope::Workspace,
                );
                w.allocate(a.store([Expr::from(0i64)], 1.0f32))
            }),
            "workspace buffer `w` is allocated inside a device kernel",
        ),
        (
            kernel_with(|a| {
                let l = Buffer::temp(
                    "l",
                    DataType::f32(),
                    vec![Expr::from(1i64 << 20)],
                    StorageScope::Local,
                );
                l.allocate(a.store([Expr::from(0i64)], 1.0f32))
            }),
            "local allocation `l` is 4194304 bytes per thread",
        ),
    ];
    for (m, want) in cases {
        let r = m.verify().map_err(|e| e.to_string()).and_then(|()| {
            cuda::device_code(&m, &target("sm_80"))
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        let e = r.expect_err(want);
        assert!(e.contains(want), "expected `{want}` in: {e}");
    }
}

#[test]
fn integer_division_in_a_kernel_has_no_error_path() {
    // The divisor may be zero: a kernel gives 0 (it cannot raise), the PTX has no call.
    let a = Buffer::new("A", DataType::i32(), vec![Expr::from(32i64)]);
    let b = Buffer::new("B", DataType::i32(), vec![Expr::from(32i64)]);
    let body = thread_for("bx", 1i64, ThreadTag::Block(0), |_| {
        thread_for("tx", 32i64, ThreadTag::Thread(0), |tx| {
            let x = a.load([tx.clone()]);
            let y = b.load([tx.clone()]);
            a.store(
                [tx],
                (x.clone() / y.clone()) + x.clone().floordiv(y.clone()) + x.floormod(y),
            )
        })
    });
    let m = IRModule::from_functions(vec![PrimFunc::new(
        "div",
        vec![Param::Buffer(a), Param::Buffer(b)],
        body,
    )]);
    let code = cuda::device_code(&m, &target("sm_80")).unwrap();
    assert!(!code.source.contains("call."), "{}", code.source);
    common::ptxas_check(&code.source).unwrap();
}

#[test]
fn an_unsaturated_cast_in_a_kernel_is_one_conversion() {
    // TVM's float -> int32 cast (`"saturate": false`): PTX's `cvt.rzi.s32.f32` (which
    // saturates, one value the cast allows), no compare-and-select fix-ups; ptxas accepts it.
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(32i64)]);
    let b = Buffer::new("B", DataType::i32(), vec![Expr::from(32i64)]);
    let body = thread_for("bx", 1i64, ThreadTag::Block(0), |_| {
        thread_for("tx", 32i64, ThreadTag::Thread(0), |tx| {
            b.store([tx.clone()], a.load([tx]).cast_unsaturated(DataType::i32()))
        })
    });
    let m = IRModule::from_functions(vec![PrimFunc::new(
        "cast",
        vec![Param::Buffer(a), Param::Buffer(b)],
        body,
    )]);
    let code = cuda::device_code(&m, &target("sm_80")).unwrap();
    assert_eq!(
        code.source.matches("cvt.rzi.s32.f32").count(),
        1,
        "{}",
        code.source
    );
    assert!(!code.source.contains("selp"), "{}", code.source);
    common::ptxas_check(&code.source).unwrap();
}

/// Float `%` in a kernel is libdevice's exact `fmod`: LLVM 14's NVPTX backend would expand
/// `frem` as `x - trunc(x / y) * y` (`div.rn`, `cvt.rzi`, `mul`, `sub`), which loses digits and
/// the sign of a zero result (found on an H100 by the conformance suite: `fmod(-x, -x)` gave
/// +0 where the interpreter, like C, gives -0).
#[test]
fn float_modulo_in_a_kernel_is_exact_fmod() {
    if !have_libdevice("float modulo") {
        return;
    }
    for t in [DataType::f32(), DataType::f64(), DataType::f16()] {
        let a = Buffer::new("A", t, vec![Expr::from(32i64)]);
        let b = Buffer::new("B", t, vec![Expr::from(32i64)]);
        let body = thread_for("bx", 1i64, ThreadTag::Block(0), |_| {
            thread_for("tx", 32i64, ThreadTag::Thread(0), |tx| {
                let x = a.load([tx.clone()]);
                let y = b.load([tx.clone()]);
                a.store([tx], x % y)
            })
        });
        let m = IRModule::from_functions(vec![PrimFunc::new(
            "fmod",
            vec![Param::Buffer(a), Param::Buffer(b)],
            body,
        )]);
        let code = cuda::device_code(&m, &target("sm_80")).unwrap_or_else(|e| panic!("{t}: {e}"));
        // The expansion divides with `div.rn`; the kernel has no division of its own, and
        // libdevice's exact algorithm divides with `div.approx` only to guess a quotient.
        assert!(
            !code.source.contains("div.rn.f"),
            "{t}: frem's inexact expansion:\n{}",
            code.source
        );
        common::ptxas_check(&code.source).unwrap_or_else(|e| panic!("{t}: {e}"));
    }
}

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

/// `kiln build <module> --target <target> -o <out>` with `env` set: its output.
fn kiln_build(
    module: &Path,
    target: &str,
    out: &Path,
    env: &[(&str, &Path)],
) -> std::process::Output {
    let mut cmd = kiln();
    cmd.arg("build")
        .arg(module)
        .args(["--target", target, "-o"])
        .arg(out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn the_cli_builds_ptx_and_libraries_and_says_when_libdevice_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let vadd = root.join("examples/kernels/cuda/vadd.json");
    let ptx = dir.path().join("vadd.ptx");
    let out = kiln_build(&vadd, r#"{"kind": "cuda", "arch": "sm_90"}"#, &ptx, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&ptx).unwrap();
    assert!(text.contains(".entry vadd_kernel0"), "{text}");
    common::ptxas_check(&text).unwrap();
    // A library with the PTX embedded.
    let so = dir.path().join("vadd.so");
    let out = kiln_build(&vadd, "cuda", &so, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = std::fs::read(&so).unwrap();
    assert!(
        lib.windows(b".entry vadd_kernel0".len())
            .any(|w| w == b".entry vadd_kernel0"),
        "the library embeds the PTX"
    );
    // Math without libdevice: the error says what to do.
    let softmax = root.join("examples/kernels/cuda/softmax.json");
    let s_ptx = dir.path().join("s.ptx");
    let missing = dir.path().join("missing.bc");
    let out = kiln_build(&softmax, "cuda", &s_ptx, &[("KILN_LIBDEVICE", &missing)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("libdevice") && err.contains("missing.bc") && err.contains("not a file"),
        "{err}"
    );
    // A file that is not bitcode.
    let junk = dir.path().join("junk.bc");
    std::fs::write(&junk, b"not bitcode").unwrap();
    let out = kiln_build(&softmax, "cuda", &s_ptx, &[("KILN_LIBDEVICE", &junk)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read libdevice") && err.contains("junk.bc"),
        "{err}"
    );
}

#[test]
fn get_source_answers_ptx_and_the_kernels_llvm_ir() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let m = read(&root.join("examples/kernels/cuda/matmul.json"));
    let built = kiln::codegen::build(&m, &target("sm_80")).unwrap();
    let ptx = built.get_source("ptx").unwrap();
    assert!(ptx.contains(".entry matmul_kernel0"), "{ptx}");
    assert_eq!(built.get_source("").unwrap(), ptx);
    let ll = built.get_source("ll").unwrap();
    assert!(
        ll.contains("nvptx64-nvidia-cuda") && ll.contains("llvm.nvvm.barrier0"),
        "{ll}"
    );
}
