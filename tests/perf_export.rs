//! Exported libraries run parallel loops on their own threads when no loader fills the
//! `__TVMBackendParallelLaunch` slot (a plain `dlopen`, as Python `tvm_ffi` does without TVM).

mod common;

use std::ffi::c_void;

use common::HostArray;
use kiln::codegen::llvm::{export, CodegenOptions};
use kiln::ir::builder::{for_range, if_then_else};
use kiln::ir::{Buffer, DataType, Expr, ForKind, IRModule, Param, PrimFunc, Stmt};
use kiln::packed_func::ffi::{TVMFFIAny, TVMFFISafeCallType};
use kiln::packed_func::AnyView;
use kiln::schedule::kernels as sk;

fn export_so(f: PrimFunc, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join(format!("lib{}.so", f.name));
    let mut o = CodegenOptions::host();
    o.fast_math = "fast".into();
    export(&IRModule::from_functions(vec![f]), &o, &path).unwrap();
    path
}

/// Calls `__tvm_ffi_<name>` of a library opened with plain `dlopen` (no context slot filled).
fn call_raw(lib: &libloading::Library, name: &str, arrays: &mut [HostArray]) -> i32 {
    let sym = format!("__tvm_ffi_{name}");
    // SAFETY: kiln exports `__tvm_ffi_<name>` with the tvm-ffi safe-call signature.
    let f: libloading::Symbol<TVMFFISafeCallType> = unsafe { lib.get(sym.as_bytes()) }.unwrap();
    let dls: Vec<_> = arrays.iter_mut().map(|a| a.dl()).collect();
    let args: Vec<TVMFFIAny> = dls.iter().map(|d| *AnyView::from(d).as_raw()).collect();
    let mut ret = TVMFFIAny::NONE;
    // SAFETY: the arguments are DLTensors that outlive the call; the result slot is writable.
    unsafe {
        f(
            std::ptr::null_mut::<c_void>(),
            args.as_ptr(),
            args.len() as i32,
            &mut ret,
        )
    }
}

fn dynamic_imports(path: &std::path::Path) -> Vec<String> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.dynamic_symbols()
        .filter(|s| s.is_undefined())
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect()
}

fn defined_dynamic(path: &std::path::Path) -> Vec<String> {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.dynamic_symbols()
        .filter(|s| !s.is_undefined())
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect()
}

#[test]
fn exported_parallel_kernels_use_threads_without_a_loader() {
    let dir = tempfile::tempdir().unwrap();
    let so = export_so(sk::matmul_sized(96, 64, 33).unwrap(), dir.path());
    assert!(
        dynamic_imports(&so).iter().any(|s| s == "pthread_create"),
        "the library does not start threads"
    );
    // The runtime's symbols stay inside the library.
    let exported = defined_dynamic(&so);
    assert!(
        !exported.iter().any(|s| s.contains("kiln_rt")),
        "runtime symbols exported: {exported:?}"
    );
    // SAFETY: a kiln-exported library; its constructors do nothing unsafe.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    let (m, n, k) = (96usize, 64usize, 33usize);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
    let mut arrays = vec![
        HostArray::f32(&[m as i64, k as i64], &a),
        HostArray::f32(&[k as i64, n as i64], &b),
        HostArray::f32(&[m as i64, n as i64], &vec![0.0; m * n]),
    ];
    assert_eq!(call_raw(&lib, "matmul", &mut arrays), 0);
    let c = arrays[2].to_f32();
    for i in 0..m {
        for j in 0..n {
            let want: f32 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            assert!((c[i * n + j] - want).abs() < 1e-3, "C[{i},{j}]");
        }
    }
    // vadd (symbolic n) through the same path: inline at small sizes, the pool at large ones.
    let so = export_so(sk::vadd().unwrap(), dir.path());
    // SAFETY: as above.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    for len in [1usize, 3, 100_003] {
        let x: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let mut arrays = vec![
            HostArray::f32(&[len as i64], &x),
            HostArray::f32(&[len as i64], &x),
            HostArray::f32(&[len as i64], &vec![0.0; len]),
        ];
        assert_eq!(call_raw(&lib, "vadd", &mut arrays), 0);
        let want: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
        assert_eq!(arrays[2].to_f32(), want);
    }
}

#[test]
fn a_failing_task_fails_the_call() {
    // for i in parallel(n): if X[i] < 0 { assert false } else { Y[i] = X[i] }, at a size that
    // runs inline (little work) and at one that runs on the pool.
    for len in [64usize, 1 << 16] {
        failing_task_fails_the_call(len);
    }
}

fn failing_task_fails_the_call(len: usize) {
    let n = Expr::from(len as i64);
    let x = Buffer::new("X", DataType::f32(), vec![n.clone()]);
    let y = Buffer::new("Y", DataType::f32(), vec![n.clone()]);
    let body = for_range("i", n, ForKind::Parallel, |i| {
        if_then_else(
            x.load([i.clone()]).lt(Expr::from(0.0f32)),
            Stmt::Assert {
                cond: Expr::from(false),
                message: "negative input".into(),
            },
            Some(y.store([i.clone()], x.load([i.clone()]))),
        )
    });
    let f =
        PrimFunc::new("check", vec![Param::Buffer(x), Param::Buffer(y)], body).with_noalias(true);
    let dir = tempfile::tempdir().unwrap();
    let so = export_so(f, dir.path());
    // SAFETY: a kiln-exported library.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    let l = len as i64;
    // Repeated: the failure may land on the caller or on a worker, and a failure reported
    // after the task counted as finished would be missed only now and then.
    for bad in [0usize, len - 1].repeat(10) {
        let mut v = vec![1.0f32; len];
        v[bad] = -1.0;
        let mut arrays = vec![
            HostArray::f32(&[l], &v),
            HostArray::f32(&[l], &vec![0.0; len]),
        ];
        assert_ne!(
            call_raw(&lib, "check", &mut arrays),
            0,
            "bad element {bad} of {len}"
        );
    }
    let mut arrays = vec![
        HostArray::f32(&[l], &vec![2.0; len]),
        HostArray::f32(&[l], &vec![0.0; len]),
    ];
    assert_eq!(call_raw(&lib, "check", &mut arrays), 0);
    assert_eq!(arrays[1].to_f32(), vec![2.0; len]);
}

/// The rows a test launcher's tasks wrote: `TASK_ROWS` (rows written after each task), over `Y`
/// (`ROWS` x `COLS` floats, zero before the call, each row set whole by one iteration).
static Y_PTR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static Y_ROWS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static TASK_ROWS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
const COLS: usize = 4096;
const TASKS: i32 = 8;

type Lambda = unsafe extern "C" fn(
    i32,
    *mut kiln::runtime::parallel::TVMParallelGroupEnv,
    *mut c_void,
) -> i32;

/// A `TVMBackendParallelLaunch` that runs `TASKS` tasks one after the other on this thread and
/// records how many rows of `Y` each one wrote.
unsafe extern "C" fn recording_launch(lambda: Lambda, cdata: *mut c_void, _n: i32) -> i32 {
    let mut env = kiln::runtime::parallel::TVMParallelGroupEnv {
        sync_handle: std::ptr::null_mut(),
        num_task: TASKS,
    };
    let y = Y_PTR.load(std::sync::atomic::Ordering::SeqCst) as *const f32;
    let count = Y_ROWS.load(std::sync::atomic::Ordering::SeqCst);
    // The rows written so far (each iteration writes its whole row, in order within a task).
    let rows = || {
        let mut k = 0;
        // SAFETY: `y` points at the test's live `Y` of `count` rows of `COLS` floats.
        while k < count && unsafe { *y.add(k * COLS) } != 0.0 {
            k += 1;
        }
        k
    };
    let mut before = 0;
    for t in 0..TASKS {
        // SAFETY: the lambda and its data come from the generated code for this launch.
        let r = unsafe { lambda(t, &mut env, cdata) };
        if r != 0 {
            return r;
        }
        let now = rows();
        TASK_ROWS.lock().unwrap().push(now - before);
        before = now;
    }
    0
}

/// A parallel loop's iterations are shared out evenly: with `n` iterations and `T` tasks, each
/// task runs `n / T` or one more, in order (TVM's `ceil(n / T)` chunks give 34 rows in 8 tasks
/// as 5, 5, 5, 5, 5, 5, 4, 0, which two threads run as 20 against 14).
#[test]
fn parallel_iterations_are_shared_evenly_among_tasks() {
    for rows in [34usize, 8, 3, 17] {
        let n = Expr::from(rows as i64);
        let c = Expr::from(COLS as i64);
        let y = Buffer::new("Y", DataType::f32(), vec![n.clone(), c.clone()]);
        let body = for_range("i", n, ForKind::Parallel, |i| {
            for_range("j", c.clone(), ForKind::Serial, |j| {
                y.store([i.clone(), j], Expr::from(1.0f32))
            })
        });
        let f = PrimFunc::new("fill", vec![Param::Buffer(y)], body).with_noalias(true);
        let dir = tempfile::tempdir().unwrap();
        let so = export_so(f, dir.path());
        // SAFETY: a kiln-exported library.
        let lib = unsafe { libloading::Library::new(&so) }.unwrap();
        // SAFETY: the library's context slot is a pointer-sized global the loader may fill.
        unsafe {
            let slot: libloading::Symbol<*mut *const c_void> =
                lib.get(b"__TVMBackendParallelLaunch").unwrap();
            **slot = recording_launch as *const c_void;
        }
        let mut arrays = vec![HostArray::f32(
            &[rows as i64, COLS as i64],
            &vec![0.0; rows * COLS],
        )];
        Y_PTR.store(
            arrays[0].dl().data as usize,
            std::sync::atomic::Ordering::SeqCst,
        );
        Y_ROWS.store(rows, std::sync::atomic::Ordering::SeqCst);
        TASK_ROWS.lock().unwrap().clear();
        assert_eq!(call_raw(&lib, "fill", &mut arrays), 0);
        assert!(arrays[0].to_f32().iter().all(|&v| v == 1.0));
        let got = TASK_ROWS.lock().unwrap().clone();
        let (q, r) = (rows / TASKS as usize, rows % TASKS as usize);
        let want: Vec<usize> = (0..TASKS as usize)
            .map(|t| q + usize::from(t < r))
            .collect();
        assert_eq!(got, want, "{rows} rows in {TASKS} tasks");
    }
}
