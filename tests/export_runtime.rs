//! The runtime kiln links into exported libraries (`src/runtime/export_rt.c`), seen from a
//! plain C host that fills no context slot (`tests/c/pool_host.c`): a persistent pool sized by
//! `KILN_NUM_THREADS`, else `TVM_NUM_THREADS`, else the CPUs; no thread created after the first
//! call (counted over 1000 calls); workspaces reused across calls (the host counts the
//! library's `aligned_alloc` calls).

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::codegen::llvm::{export, CodegenOptions};
use kiln::ir::IRModule;
use kiln::schedule::kernels as sk;
use kiln::target::Target;

fn host(dir: &Path) -> PathBuf {
    let exe = dir.join("pool_host");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/pool_host.c");
    let st = Command::new(cc)
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(src)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(st.success(), "compiling pool_host.c");
    exe
}

fn export_default(f: kiln::ir::PrimFunc, dir: &Path) -> PathBuf {
    let path = dir.join(format!("lib{}.so", f.name));
    let t = Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap();
    let o = CodegenOptions::from_target(&t).unwrap();
    export(&IRModule::from_functions(vec![f]), &o, &path).unwrap();
    path
}

/// Runs the host with `env` (and neither thread variable unless given); returns the numbers
/// after `prefix`.
fn run(exe: &Path, mode: &str, lib: &Path, env: &[(&str, &str)], prefix: &str) -> Vec<f64> {
    // `mode` may carry arguments after the library (`workspace 128`).
    let mut words = mode.split_whitespace();
    let mut cmd = Command::new(exe);
    cmd.arg(words.next().unwrap_or_default())
        .arg(lib)
        .args(words);
    cmd.env_remove("KILN_NUM_THREADS")
        .env_remove("TVM_NUM_THREADS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "pool_host {mode}: {text}");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` in {text}"));
    line.split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

fn cpus() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

#[test]
fn the_pool_starts_once_with_the_configured_threads_and_never_grows() {
    let dir = tempfile::tempdir().unwrap();
    let exe = host(dir.path());
    let lib = export_default(sk::vadd().unwrap(), dir.path());
    // Threads in the process after the first big call and after 1000 more calls: the main
    // thread plus the pool's workers (the caller is one of the pool's threads).
    let cases: [(&[(&str, &str)], f64); 4] = [
        (&[("KILN_NUM_THREADS", "3")], 3.0),
        (&[("TVM_NUM_THREADS", "2")], 2.0),
        (&[("KILN_NUM_THREADS", "1"), ("TVM_NUM_THREADS", "4")], 1.0),
        (&[], cpus()),
    ];
    for (env, want) in cases {
        let t = run(&exe, "threads", &lib, env, "threads: ");
        assert_eq!(t[0], want, "threads after the first call with {env:?}");
        assert_eq!(
            t[1], t[0],
            "threads created after the first call with {env:?}"
        );
    }
}

/// The workspace allocations of an exported `m x m x m` matmul in a plain C host: on its first
/// call and on 1000 calls more.
fn matmul_workspace_allocations(m: i64) -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let exe = host(dir.path());
    let lib = export_default(sk::matmul_sized(m, m, m).unwrap(), dir.path());
    run(
        &exe,
        &format!("workspace {m}"),
        &lib,
        &[],
        "aligned_alloc: ",
    )
}

#[test]
fn workspaces_are_reused_across_calls() {
    // 128 x 128 x 128 packs `B` (64 KiB) in a workspace from the allocator.
    let n = matmul_workspace_allocations(128);
    assert!(n[0] >= 1.0, "the first call allocates its workspace: {n:?}");
    assert_eq!(n[1], 0.0, "1000 calls more allocated again: {n:?}");
}

/// A CPU workspace of a constant size of at most 16 KiB (64 x 64 x 64 packs a 16 KiB `B`)
/// lives on the stack of the call: no allocation at all, and the results stay right.
#[test]
fn a_small_constant_workspace_is_never_allocated() {
    let n = matmul_workspace_allocations(64);
    assert_eq!(n, vec![0.0, 0.0], "a 16 KiB workspace was allocated");
}

/// Launches back to back, each task incrementing its elements once: a task run twice (a worker
/// late from one launch taking a task of the next) or skipped would leave a wrong count.
#[test]
fn back_to_back_launches_run_every_task_exactly_once() {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, PrimFunc};
    let dir = tempfile::tempdir().unwrap();
    let exe = host(dir.path());
    let n = Expr::from(1i64 << 16);
    let c = Buffer::new("C", DataType::f32(), vec![n.clone()]);
    let body = for_range("i", n, ForKind::Parallel, |i| {
        c.store([i.clone()], c.load([i]) + Expr::from(1.0f32))
    });
    let f = PrimFunc::new("inc", vec![Param::Buffer(c)], body).with_noalias(true);
    let lib = export_default(f, dir.path());
    for threads in ["2", "4"] {
        let out = Command::new(&exe)
            .arg("inc")
            .arg(&lib)
            .env("KILN_NUM_THREADS", threads)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("inc: ok"),
            "{threads} threads: {text}"
        );
    }
}

#[test]
fn the_runtime_is_linked_only_into_libraries_that_call_it() {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Param, PrimFunc};
    let dir = tempfile::tempdir().unwrap();
    let n = Expr::from(1i64 << 16);
    let lib = |sub: &str, kind: ForKind| {
        let c = Buffer::new("C", DataType::f32(), vec![n.clone()]);
        let body = for_range("i", n.clone(), kind, |i| {
            c.store([i.clone()], c.load([i]) + Expr::from(1.0f32))
        });
        let f = PrimFunc::new("inc", vec![Param::Buffer(c)], body).with_noalias(true);
        let d = dir.path().join(sub);
        std::fs::create_dir(&d).unwrap();
        export_default(f, &d)
    };
    let has = |lib: &Path, s: &str| {
        let bytes = std::fs::read(lib).unwrap();
        bytes.windows(s.len()).any(|w| w == s.as_bytes())
    };
    let serial = lib("serial", ForKind::Serial);
    assert!(!has(&serial, "__kiln_rt_") && !has(&serial, "pthread_create"));
    let parallel = lib("parallel", ForKind::Parallel);
    assert!(has(&parallel, "__kiln_rt_parallel_launch") && has(&parallel, "pthread_create"));
    // Both run from a plain C host.
    let exe = host(dir.path());
    for lib in [serial, parallel] {
        let out = Command::new(&exe).arg("inc").arg(&lib).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("inc: ok"),
            "{}: {text}",
            lib.display()
        );
    }
}

#[test]
fn libm_is_linked_so_its_current_function_versions_are_bound() {
    use kiln::ir::builder::for_range;
    use kiln::ir::{Buffer, DataType, Expr, ForKind, Intrinsic, Param, PrimFunc};
    let dir = tempfile::tempdir().unwrap();
    let n = Expr::from(1024i64);
    let a = Buffer::new("A", DataType::f32(), vec![n.clone()]);
    let b = Buffer::new("B", DataType::f32(), vec![n.clone()]);
    let body = for_range("i", n, ForKind::Serial, |i| {
        b.store(
            [i.clone()],
            Expr::Call {
                op: Intrinsic::Log,
                args: vec![a.load([i])],
            },
        )
    });
    let f =
        PrimFunc::new("vlog", vec![Param::Buffer(a), Param::Buffer(b)], body).with_noalias(true);
    let lib = export_default(f, dir.path());
    let bytes = std::fs::read(&lib).unwrap();
    let has = |s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
    // `logf` is a call to libm (no vector library; float32 `exp` is inline code); without libm
    // among the library's needed objects, and its version, the loader binds the oldest, slow
    // `logf`.
    assert!(
        has("logf"),
        "the kernel no longer calls expf: pick another libm function"
    );
    assert!(
        has("libm.so.6"),
        "libm is not a needed library of {}",
        lib.display()
    );
}
