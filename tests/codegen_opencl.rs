//! The OpenCL backend end to end: the host/device split, OpenCL C generation, launches on the
//! current stream of a real OpenCL device (PoCL in CI), exported libraries with device code,
//! and the bad inputs of each. Tests that need a device skip visibly without one, and fail
//! under `KILN_REQUIRE_OPENCL=1` (CI).

mod common;

use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

use kiln::codegen::device::HostDeviceModule;
use kiln::device_api::{Device, DeviceApi, Tensor};
use kiln::ir::builder::{barrier, for_range, if_then_else, thread_for};
use kiln::ir::interp::{run, HostBuffer, InterpArg};
use kiln::ir::{
    BinOp, Buffer, DataType, Expr, ForKind, IRModule, Param, PrimFunc, Stmt, StorageScope,
    ThreadTag,
};
use kiln::packed_func::ffi::{TVMFFIAny, TVMFFISafeCallType};
use kiln::packed_func::{AnyView, Module, PackedFunc};
use kiln::target::Target;

const BX: ThreadTag = ThreadTag::Block(0);
const TX: ThreadTag = ThreadTag::Thread(0);

fn opencl() -> Target {
    Target::parse(r#"{"kind": "opencl"}"#).unwrap()
}

/// `C[i] = A[i] + B[i]` for `i < n`, 64 threads per block, `ceil(n / 64)` blocks.
fn vadd() -> PrimFunc {
    common::device_vadd()
}

/// `S[r] = sum_j X[r, j]`: one block per row, 64 threads, a tree reduction in shared memory.
fn rowsum(rows: i64, cols: i64) -> PrimFunc {
    let x = Buffer::new(
        "X",
        DataType::f32(),
        vec![Expr::from(rows), Expr::from(cols)],
    );
    let s = Buffer::new("S", DataType::f32(), vec![Expr::from(rows)]);
    let sh = Buffer::shared("sh", DataType::f32(), &[64]);
    let body = thread_for("r", Expr::from(rows), BX, |r| {
        sh.allocate(thread_for("t", Expr::from(64i64), TX, |t| {
            let mut steps = vec![
                sh.store([t.clone()], Expr::from(0.0f32)),
                for_range("j", Expr::from((cols + 63) / 64), ForKind::Serial, |j| {
                    let col = j * 64i64 + t.clone();
                    if_then_else(
                        col.clone().lt(Expr::from(cols)),
                        sh.store([t.clone()], sh.load([t.clone()]) + x.load([r.clone(), col])),
                        None,
                    )
                }),
                barrier(),
            ];
            let mut w = 32i64;
            while w >= 1 {
                steps.push(if_then_else(
                    t.clone().lt(Expr::from(w)),
                    sh.store([t.clone()], sh.load([t.clone()]) + sh.load([t.clone() + w])),
                    None,
                ));
                steps.push(barrier());
                w /= 2;
            }
            steps.push(if_then_else(
                t.clone().eq_(Expr::from(0i64)),
                s.store([r.clone()], sh.load([Expr::from(0i64)])),
                None,
            ));
            Stmt::seq(steps)
        }))
    });
    PrimFunc::new("rowsum", vec![Param::Buffer(x), Param::Buffer(s)], body)
}

fn build(f: PrimFunc) -> HostDeviceModule {
    let m = IRModule::from_functions(vec![f]);
    m.verify().unwrap();
    kiln::codegen::opencl::build(&m, &opencl()).unwrap()
}

fn views(ts: &[&Tensor]) -> Vec<AnyView<'static>> {
    ts.iter()
        .map(|t| {
            // SAFETY: (test) the tensors outlive every call made with these views.
            let d: &'static kiln::packed_func::DLTensor =
                unsafe { &*(t.as_dltensor() as *const _) };
            AnyView::from(d)
        })
        .collect()
}

fn call(f: &PackedFunc, ts: &[&Tensor]) -> Result<(), String> {
    f.call(&views(ts)).map(|_| ()).map_err(|e| e.to_string())
}

fn floats(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 100.0)
        .collect()
}

// ----- without a device ----------------------------------------------------------------------

#[test]
fn each_thread_bound_nest_becomes_one_opencl_kernel() {
    let m = IRModule::from_functions(vec![vadd()]);
    let code = kiln::codegen::opencl::device_code(&m, &opencl()).unwrap();
    let (plans, src, infos) = (code.plans, code.source, code.kernels);
    assert_eq!(plans.len(), 1);
    assert_eq!(infos[0].name, "vadd_kernel0");
    assert!(src.contains("__kernel void vadd_kernel0("), "{src}");
    assert!(
        src.contains("get_group_id(0)") && src.contains("get_local_id(0)"),
        "{src}"
    );
    assert!(src.contains("reqd_work_group_size(64, 1, 1)"), "{src}");
    // A, B, C and n: three buffers and the shape variable.
    assert_eq!(infos[0].params.len(), 4, "{:?}", infos[0].params);
}

#[test]
fn shared_memory_and_barriers_are_local_arrays_and_work_group_barriers() {
    let m = IRModule::from_functions(vec![rowsum(4, 100)]);
    let src = kiln::codegen::opencl::device_code(&m, &opencl())
        .unwrap()
        .source;
    assert!(src.contains("__local float sh_"), "{src}");
    assert!(src.contains("barrier(CLK_LOCAL_MEM_FENCE);"), "{src}");
}

#[test]
fn a_cpu_target_refuses_thread_bound_loops() {
    let m = IRModule::from_functions(vec![vadd()]);
    let t = Target::parse(r#"{"kind": "llvm"}"#).unwrap();
    let e = kiln::codegen::build(&m, &t).err().unwrap().to_string();
    assert!(
        e.contains("thread-bound loops") && e.contains("opencl"),
        "{e}"
    );
}

#[test]
fn a_kernel_over_the_targets_thread_limit_is_refused() {
    let m = IRModule::from_functions(vec![vadd()]);
    let t = Target::parse(r#"{"kind": "opencl", "max_num_threads": 32}"#).unwrap();
    let e = kiln::codegen::opencl::build(&m, &t)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("64 threads per block") && e.contains("max_num_threads 32"),
        "{e}"
    );
}

#[test]
fn a_kernel_over_the_targets_shared_memory_is_refused() {
    let m = IRModule::from_functions(vec![rowsum(4, 100)]);
    let t = Target::parse(r#"{"kind": "opencl", "max_shared_memory_per_block": 128}"#).unwrap();
    let e = kiln::codegen::opencl::build(&m, &t)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("256 bytes of shared memory") && e.contains("max_shared_memory_per_block 128"),
        "{e}"
    );
}

#[test]
fn host_code_never_touches_device_memory() {
    let n = Expr::from(8i64);
    let a = Buffer::new("A", DataType::f32(), vec![n.clone()]);
    let f = PrimFunc::new(
        "poke",
        vec![Param::Buffer(a.clone())],
        a.store([Expr::from(0i64)], Expr::from(1.0f32)),
    );
    let m = IRModule::from_functions(vec![f]);
    let e = kiln::codegen::opencl::build(&m, &opencl())
        .unwrap_err()
        .to_string();
    assert!(e.contains("host code accesses `A`"), "{e}");
}

#[test]
fn asserts_inside_kernels_are_refused_with_the_reason() {
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(64i64)]);
    let body = thread_for("bx", Expr::from(1i64), BX, |_| {
        thread_for("tx", Expr::from(64i64), TX, |tx| Stmt::Assert {
            cond: tx.lt(Expr::from(64i64)),
            message: "in range".into(),
        })
    });
    let m = IRModule::from_functions(vec![PrimFunc::new("f", vec![Param::Buffer(a)], body)]);
    let e = kiln::codegen::opencl::build(&m, &opencl())
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot raise an error"), "{e}");
}

#[test]
fn the_exported_source_is_the_module_source() {
    let dir = tempfile::tempdir().unwrap();
    let m = build(vadd());
    let p = dir.path().join("k.cl");
    m.export(&p).unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), m.source());
    assert_eq!(m.get_source("cl").as_deref(), Some(m.source()));
}

// ----- on a device ---------------------------------------------------------------------------

#[test]
fn vadd_runs_on_the_device_with_a_tail_block() {
    let Some((api, dev)) = common::opencl_device("vadd_runs_on_the_device_with_a_tail_block")
    else {
        return;
    };
    let m = build(vadd());
    let f = m.get_function("vadd").unwrap();
    for n in [1usize, 64, 1000] {
        let (x, y) = (floats(n, 1), floats(n, 2));
        let a = Tensor::from_slice(&x, &[n as i64], dev).unwrap();
        let b = Tensor::from_slice(&y, &[n as i64], dev).unwrap();
        let c = Tensor::zeros(&[n as i64], a.dtype(), dev).unwrap();
        call(&f, &[&a, &b, &c]).unwrap();
        api.sync_stream(dev, api.current_stream(dev)).unwrap();
        let got = c.to_vec::<f32>().unwrap();
        let want: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
        assert_eq!(got, want, "n = {n}");
    }
}

#[test]
fn a_block_reduction_in_shared_memory_matches_the_interpreter() {
    let Some((api, dev)) = common::opencl_device("a_block_reduction_in_shared_memory") else {
        return;
    };
    let (rows, cols) = (5i64, 300i64);
    let f = rowsum(rows, cols);
    let x = floats((rows * cols) as usize, 3);
    let mut iargs = vec![
        InterpArg::Buffer(HostBuffer::from_slice(&[rows, cols], &x)),
        InterpArg::Buffer(HostBuffer::zeros(DataType::f32(), &[rows])),
    ];
    run(&f, &mut iargs).unwrap();
    let InterpArg::Buffer(want) = &iargs[1] else {
        unreachable!()
    };
    let want = want.to_vec::<f32>().unwrap();
    let m = build(f);
    let fx = m.get_function("rowsum").unwrap();
    let xt = Tensor::from_slice(&x, &[rows, cols], dev).unwrap();
    let st = Tensor::zeros(&[rows], xt.dtype(), dev).unwrap();
    call(&fx, &[&xt, &st]).unwrap();
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    assert_eq!(st.to_vec::<f32>().unwrap(), want);
}

#[test]
fn kernels_are_enqueued_on_the_current_stream() {
    let Some((api, dev)) = common::opencl_device("kernels_are_enqueued_on_the_current_stream")
    else {
        return;
    };
    let m = build(vadd());
    let f = m.get_function("vadd").unwrap();
    let n = 1 << 16;
    let (x, y) = (floats(n, 4), floats(n, 5));
    let a = Tensor::from_slice(&x, &[n as i64], dev).unwrap();
    let b = Tensor::from_slice(&y, &[n as i64], dev).unwrap();
    let c = Tensor::zeros(&[n as i64], a.dtype(), dev).unwrap();
    let s = api.create_stream(dev).unwrap();
    let old = api.set_current_stream(dev, s).unwrap();
    // An event recorded on `s` after the call completes only once the kernel has run.
    call(&f, &[&a, &b, &c]).unwrap();
    let ev = api.create_event(dev).unwrap();
    api.record_event(dev, s, ev).unwrap();
    api.sync_event(dev, ev).unwrap();
    let want: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
    assert_eq!(c.to_vec::<f32>().unwrap(), want);
    api.destroy_event(dev, ev).unwrap();
    api.set_current_stream(dev, old).unwrap();
    api.free_stream(dev, s).unwrap();
}

#[test]
fn a_cpu_tensor_gets_tvms_device_mismatch_message() {
    let Some((_, dev)) = common::opencl_device("a_cpu_tensor_gets_tvms_device_mismatch_message")
    else {
        return;
    };
    let m = build(vadd());
    let f = m.get_function("vadd").unwrap();
    let a = Tensor::from_slice(&[1.0f32; 4], &[4], Device::cpu()).unwrap();
    let b = Tensor::from_slice(&[1.0f32; 4], &[4], dev).unwrap();
    let c = Tensor::from_slice(&[1.0f32; 4], &[4], dev).unwrap();
    let e = call(&f, &[&a, &b, &c]).unwrap_err();
    assert!(
        e.contains("Mismatched A.device_type") && e.contains("opencl"),
        "{e}"
    );
}

#[test]
fn a_tensor_claiming_more_than_its_allocation_is_refused_before_the_launch() {
    let Some((_, dev)) = common::opencl_device("a_tensor_claiming_more_than_its_allocation") else {
        return;
    };
    let m = build(vadd());
    let f = m.get_function("vadd").unwrap();
    let small = Tensor::from_slice(&[1.0f32; 4], &[4], dev).unwrap();
    let big = Tensor::zeros(&[1024], small.dtype(), dev).unwrap();
    // A DLTensor that says 1024 elements over a 4-element allocation.
    let mut shape = [1024i64];
    let mut lie = *small.as_dltensor();
    lie.shape = shape.as_mut_ptr();
    let args = [
        AnyView::from(&lie),
        AnyView::from(big.as_dltensor()),
        AnyView::from(big.as_dltensor()),
    ];
    let e = f.call(&args).unwrap_err().to_string();
    assert!(e.contains("4096") && e.contains("16"), "{e}");
}

#[test]
fn integer_division_by_zero_in_a_kernel_gives_zero() {
    let Some((api, dev)) = common::opencl_device("integer_division_by_zero_in_a_kernel") else {
        return;
    };
    let a = Buffer::new("A", DataType::i32(), vec![Expr::from(64i64)]);
    let b = Buffer::new("B", DataType::i32(), vec![Expr::from(64i64)]);
    let body = thread_for("bx", Expr::from(1i64), BX, |_| {
        thread_for("tx", Expr::from(64i64), TX, |tx| {
            b.store(
                [tx.clone()],
                Expr::binary(BinOp::Div, a.load([tx.clone()]), Expr::from(0i32))
                    + Expr::binary(BinOp::FloorMod, a.load([tx]), Expr::from(0i32)),
            )
        })
    });
    let m = build(PrimFunc::new(
        "divz",
        vec![Param::Buffer(a), Param::Buffer(b)],
        body,
    ));
    let f = m.get_function("divz").unwrap();
    let at = Tensor::from_slice(&[7i32; 64], &[64], dev).unwrap();
    let bt = Tensor::from_slice(&[9i32; 64], &[64], dev).unwrap();
    call(&f, &[&at, &bt]).unwrap();
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    assert_eq!(bt.to_vec::<i32>().unwrap(), vec![0; 64]);
}

#[test]
fn a_module_dropped_with_kernels_queued_is_safe() {
    let Some((api, dev)) = common::opencl_device("a_module_dropped_with_kernels_queued") else {
        return;
    };
    let n = 1 << 20;
    let (x, y) = (floats(n, 6), floats(n, 7));
    let a = Tensor::from_slice(&x, &[n as i64], dev).unwrap();
    let b = Tensor::from_slice(&y, &[n as i64], dev).unwrap();
    let c = Tensor::zeros(&[n as i64], a.dtype(), dev).unwrap();
    {
        let m = build(vadd());
        let f = m.get_function("vadd").unwrap();
        for _ in 0..4 {
            call(&f, &[&a, &b, &c]).unwrap();
        }
        drop(m);
        drop(f);
    }
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    let want: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
    assert_eq!(c.to_vec::<f32>().unwrap(), want);
}

#[test]
fn a_cpu_jit_and_opencl_kernels_share_one_process() {
    // kiln's LLVM 14 is linked statically with private symbols: PoCL's LLVM 15 builds programs
    // in the same process after kiln JIT-compiled CPU code.
    let cpu = kiln::codegen::build(
        &IRModule::from_functions(vec![kiln::ir::kernels::vadd()]),
        &Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap(),
    )
    .unwrap();
    common::check_vadd(&cpu.get_function("vadd").unwrap(), 100);
    let Some((api, dev)) = common::opencl_device("a_cpu_jit_and_opencl_kernels_share") else {
        return;
    };
    let m = build(vadd());
    let f = m.get_function("vadd").unwrap();
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], dev).unwrap();
    let c = Tensor::zeros(&[3], a.dtype(), dev).unwrap();
    call(&f, &[&a, &a, &c]).unwrap();
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn an_exported_library_runs_in_kilns_loader() {
    let Some((api, dev)) = common::opencl_device("an_exported_library_runs_in_kilns_loader") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("libvadd_cl.so");
    let m = build(vadd());
    m.export(&p).unwrap();
    // SAFETY: a library kiln just wrote.
    let lib = unsafe { kiln::runtime::LibraryModule::load(&p) }.unwrap();
    assert_eq!(lib.get_source("cl").as_deref(), Some(m.source()));
    drop(m);
    let f = lib.get_function("vadd").unwrap();
    let a = Tensor::from_slice(&[1.0f32, 2.0], &[2], dev).unwrap();
    let c = Tensor::zeros(&[2], a.dtype(), dev).unwrap();
    call(&f, &[&a, &a, &c]).unwrap();
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
}

static RAISED: Mutex<Option<(String, String)>> = Mutex::new(None);

extern "C" fn capture(kind: *const c_char, msg: *const c_char) {
    // SAFETY: the library passes two NUL-terminated strings.
    let (k, m) = unsafe { (CStr::from_ptr(kind), CStr::from_ptr(msg)) };
    *RAISED.lock().unwrap() = Some((
        k.to_string_lossy().into_owned(),
        m.to_string_lossy().into_owned(),
    ));
}

#[test]
fn a_host_without_kilns_device_runtime_gets_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("libvadd_foreign.so");
    build(vadd()).export(&p).unwrap();
    // A plain dlopen, as a C host or tvm_ffi would: only the error slot is filled.
    // SAFETY: a library kiln just wrote.
    let lib = unsafe { libloading::Library::new(&p) }.unwrap();
    // SAFETY: `__TVMFFIErrorSetRaisedFromCStr` is an exported `void*` context slot.
    unsafe {
        let slot: libloading::Symbol<*mut *mut c_void> =
            lib.get(b"__TVMFFIErrorSetRaisedFromCStr\0").unwrap();
        let f: extern "C" fn(*const c_char, *const c_char) = capture;
        (*slot).write(f as *mut c_void);
    }
    let mut shape = [4i64];
    let mut data = [0f32; 4];
    let t = kiln::packed_func::DLTensor {
        data: data.as_mut_ptr().cast(),
        device: kiln::packed_func::DLDevice {
            device_type: kiln::packed_func::DLDeviceType(4),
            device_id: 0,
        },
        ndim: 1,
        dtype: kiln::packed_func::DLDataType {
            code: kiln::packed_func::ffi::DLDataTypeCode::FLOAT,
            bits: 32,
            lanes: 1,
        },
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let args: Vec<TVMFFIAny> = (0..3).map(|_| *AnyView::from(&t).as_raw()).collect();
    let mut ret = TVMFFIAny::NONE;
    // SAFETY: kiln exports `__tvm_ffi_vadd` with the safe-call signature; the arguments outlive
    // the call.
    let rc = unsafe {
        let f: libloading::Symbol<TVMFFISafeCallType> = lib.get(b"__tvm_ffi_vadd\0").unwrap();
        f(std::ptr::null_mut(), args.as_ptr(), 3, &mut ret)
    };
    assert_eq!(rc, -1);
    let (kind, msg) = RAISED.lock().unwrap().clone().unwrap();
    assert_eq!(kind, "RuntimeError");
    assert!(
        msg.contains("__KilnDeviceLaunch") && msg.contains("kiln"),
        "{msg}"
    );
}

#[test]
fn workspace_buffers_carry_data_between_kernels() {
    let Some((api, dev)) = common::opencl_device("workspace_buffers_carry_data_between_kernels")
    else {
        return;
    };
    // T = A * 2 (kernel 0), B = T + 1 (kernel 1), through a device workspace.
    let n = Expr::from(256i64);
    let a = Buffer::new("A", DataType::f32(), vec![n.clone()]);
    let b = Buffer::new("B", DataType::f32(), vec![n.clone()]);
    let t = Buffer::temp("T", DataType::f32(), vec![n], StorageScope::Workspace);
    let k = |f: &dyn Fn(Expr) -> Stmt| {
        thread_for("bx", Expr::from(4i64), BX, |bx| {
            thread_for("tx", Expr::from(64i64), TX, |tx| f(bx * 64i64 + tx))
        })
    };
    let body = t.allocate(Stmt::seq(vec![
        k(&|i| t.store([i.clone()], a.load([i]) * 2.0f32)),
        k(&|i| b.store([i.clone()], t.load([i]) + 1.0f32)),
    ]));
    let m = build(PrimFunc::new(
        "twice",
        vec![Param::Buffer(a), Param::Buffer(b)],
        body,
    ));
    assert_eq!(m.source().matches("__kernel").count(), 2);
    let f = m.get_function("twice").unwrap();
    let x = floats(256, 8);
    let at = Tensor::from_slice(&x, &[256], dev).unwrap();
    let bt = Tensor::zeros(&[256], at.dtype(), dev).unwrap();
    call(&f, &[&at, &bt]).unwrap();
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    let want: Vec<f32> = x.iter().map(|v| v * 2.0 + 1.0).collect();
    assert_eq!(bt.to_vec::<f32>().unwrap(), want);
}

/// Runs `f` on the device and in the interpreter on the same random inputs; returns the largest
/// difference over every buffer parameter.
fn device_vs_interpreter(f: &PrimFunc, shapes: &[Vec<i64>], dev: Device) -> f64 {
    let api = kiln::device_api::get(dev.device_type).unwrap();
    let inputs: Vec<Vec<f32>> = shapes
        .iter()
        .enumerate()
        .map(|(k, s)| floats(s.iter().product::<i64>() as usize, k as u32 + 11))
        .collect();
    let mut iargs: Vec<InterpArg> = inputs
        .iter()
        .zip(shapes)
        .map(|(x, s)| InterpArg::Buffer(HostBuffer::from_slice(s, x)))
        .collect();
    run(f, &mut iargs).unwrap();
    let m = build(f.clone());
    let pf = m.get_function(&f.name).unwrap();
    let ts: Vec<Tensor> = inputs
        .iter()
        .zip(shapes)
        .map(|(x, s)| Tensor::from_slice(x, s, dev).unwrap())
        .collect();
    let refs: Vec<&Tensor> = ts.iter().collect();
    call(&pf, &refs).unwrap();
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    let mut worst = 0f64;
    for (t, ia) in ts.iter().zip(&iargs) {
        let got = t.to_vec::<f32>().unwrap();
        let want = ia.to_vec::<f32>().unwrap();
        for (g, w) in got.iter().zip(&want) {
            let d = ((g - w).abs() / w.abs().max(1.0)) as f64;
            worst = if d.is_nan() {
                f64::INFINITY
            } else {
                worst.max(d)
            };
        }
    }
    worst
}

#[test]
fn the_scheduled_example_kernels_agree_with_the_interpreter_on_the_device() {
    let Some((_, dev)) = common::opencl_device("the_scheduled_example_kernels_agree") else {
        return;
    };
    use kiln::schedule::kernels as sk;
    let cases: Vec<(PrimFunc, Vec<Vec<i64>>)> = vec![
        (
            sk::opencl_matmul_sized(128, 64, 64).unwrap(),
            vec![vec![128, 64], vec![64, 64], vec![128, 64]],
        ),
        (
            sk::opencl_rowsum_sized(16, 1024).unwrap(),
            vec![vec![16, 1024], vec![16]],
        ),
        (
            sk::opencl_softmax_sized(8, 512).unwrap(),
            vec![vec![8, 512], vec![8, 512]],
        ),
    ];
    for (f, shapes) in cases {
        let params: Vec<Vec<i64>> = f
            .params
            .iter()
            .filter_map(|p| match p {
                Param::Buffer(b) => Some(b.shape.iter().map(|e| e.as_int().unwrap()).collect()),
                Param::Scalar(_) => None,
            })
            .collect();
        assert_eq!(params, shapes, "{}", f.name);
        let d = device_vs_interpreter(&f, &shapes, dev);
        assert!(
            d < 1e-5,
            "{}: device and interpreter differ by {d:e}",
            f.name
        );
    }
}

// ----- the command line ----------------------------------------------------------------------

fn kiln_cli() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
}

const CL_VADD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/kernels/opencl/vadd.json"
);

#[test]
fn kiln_build_writes_the_opencl_source_and_a_library() {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["cl", "so", "ll"] {
        let out = dir.path().join(format!("vadd.{ext}"));
        let st = kiln_cli()
            .args(["build", CL_VADD, "--target", "opencl", "-o"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            st.status.success(),
            "{ext}: {}",
            String::from_utf8_lossy(&st.stderr)
        );
    }
    let cl = std::fs::read_to_string(dir.path().join("vadd.cl")).unwrap();
    assert!(cl.contains("__kernel void vadd_kernel0("), "{cl}");
    let ll = std::fs::read_to_string(dir.path().join("vadd.ll")).unwrap();
    assert!(ll.contains("__kiln_device_meta") && ll.contains("__KilnDeviceLaunch"));
}

#[test]
fn kiln_run_runs_on_the_device_and_checks_against_the_interpreter() {
    if common::opencl_device("kiln_run_runs_on_the_device").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let st = kiln_cli()
        .args([
            "run",
            CL_VADD,
            "vadd",
            "rand:1000",
            "rand:1000",
            "zeros:1000",
        ])
        .args(["--target", "opencl", "--check", "--repeat", "3", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&st.stdout);
    assert!(
        st.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert!(out.contains("max abs difference 0e0"), "{out}");
    assert!(
        out.contains("runs on opencl:0, device time median"),
        "{out}"
    );
    assert!(dir.path().join("C.npy").exists());
    // The exported library runs the same way, its device found from the library.
    let so = dir.path().join("vadd.so");
    let st = kiln_cli()
        .args(["build", CL_VADD, "--target", "opencl", "-o"])
        .arg(&so)
        .output()
        .unwrap();
    assert!(st.status.success());
    let st = kiln_cli()
        .arg("run")
        .arg(&so)
        .args(["vadd", "rand:300", "rand:300", "zeros:300", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
}

/// `min`/`max` on the device follow the IR's rules bit for bit: NaN propagates, `min(-0, +0)
/// = -0`, `max(-0, +0) = +0`, infinities order as numbers; in float32 and float64.
#[test]
fn min_and_max_on_the_device_propagate_nan_and_order_signed_zeros() {
    let Some((api, dev)) = common::opencl_device("min_and_max_on_the_device") else {
        return;
    };
    let specials = [
        0.0,
        -0.0,
        1.5,
        -2.25,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e-40,
    ];
    let (a, b): (Vec<f64>, Vec<f64>) = specials
        .iter()
        .flat_map(|&x| specials.iter().map(move |&y| (x, y)))
        .unzip();
    let n = a.len();
    // The rules, written out: NaN if either is NaN; between equal operands (only +-0 differ)
    // the negative one for min and the positive one for max; else the smaller / larger.
    let want = |x: f64, y: f64, is_min: bool| -> f64 {
        if x.is_nan() || y.is_nan() {
            f64::NAN
        } else if x == y {
            if x.is_sign_negative() == is_min {
                x
            } else {
                y
            }
        } else if (x < y) == is_min {
            x
        } else {
            y
        }
    };
    for dt in [DataType::f32(), DataType::f64()] {
        let buf = |name: &str| Buffer::new(name, dt, vec![Expr::from(n as i64)]);
        let (x, y, lo, hi) = (buf("X"), buf("Y"), buf("LO"), buf("HI"));
        let body = thread_for("bx", Expr::from(1i64), BX, |_| {
            thread_for("tx", Expr::from(n as i64), TX, |t| {
                Stmt::Seq(vec![
                    lo.store([t.clone()], x.load([t.clone()]).min(y.load([t.clone()]))),
                    hi.store([t.clone()], x.load([t.clone()]).max(y.load([t]))),
                ])
            })
        });
        let m = build(PrimFunc::new(
            "minmax",
            [x, y, lo, hi].into_iter().map(Param::Buffer).collect(),
            body,
        ));
        let f = m.get_function("minmax").unwrap();
        // The inputs as the device holds them (1e-40 is a float32 subnormal).
        let round = |v: &[f64]| -> Vec<f64> {
            if dt == DataType::f32() {
                v.iter().map(|&x| f64::from(x as f32)).collect()
            } else {
                v.to_vec()
            }
        };
        let (a, b) = (round(&a), round(&b));
        let check = |got: Vec<f64>, is_min: bool| {
            for i in 0..n {
                let w = want(a[i], b[i], is_min);
                let same = (got[i].is_nan() && w.is_nan()) || got[i].to_bits() == w.to_bits();
                assert!(
                    same,
                    "{dt} {}({:?}, {:?}) = {:?} on the device, expected {w:?}",
                    if is_min { "min" } else { "max" },
                    a[i],
                    b[i],
                    got[i]
                );
            }
        };
        if dt == DataType::f32() {
            let t = |v: &[f64]| {
                let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
                Tensor::from_slice(&v, &[n as i64], dev).unwrap()
            };
            let (xt, yt, lt, ht) = (t(&a), t(&b), t(&a), t(&a));
            call(&f, &[&xt, &yt, &lt, &ht]).unwrap();
            api.sync_stream(dev, api.current_stream(dev)).unwrap();
            let back = |t: &Tensor| -> Vec<f64> {
                t.to_vec::<f32>()
                    .unwrap()
                    .into_iter()
                    .map(f64::from)
                    .collect()
            };
            check(back(&lt), true);
            check(back(&ht), false);
        } else {
            let t = |v: &[f64]| Tensor::from_slice(v, &[n as i64], dev).unwrap();
            let (xt, yt, lt, ht) = (t(&a), t(&b), t(&a), t(&a));
            call(&f, &[&xt, &yt, &lt, &ht]).unwrap();
            api.sync_stream(dev, api.current_stream(dev)).unwrap();
            check(lt.to_vec::<f64>().unwrap(), true);
            check(ht.to_vec::<f64>().unwrap(), false);
        }
    }
}

/// `B[i] = A[i] * 2` in a serial loop, marked `host` (TVM's `tir.is_host_func`).
fn host_double() -> PrimFunc {
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(8i64)]);
    let b = Buffer::new("B", DataType::f32(), vec![Expr::from(8i64)]);
    let body = for_range("i", Expr::from(8i64), ForKind::Serial, |i| {
        b.store([i.clone()], a.load([i]) * 2.0f32)
    });
    let mut f = PrimFunc::new(
        "host_double",
        vec![Param::Buffer(a), Param::Buffer(b)],
        body,
    );
    f.attrs.host = true;
    f
}

#[test]
fn a_host_function_of_a_device_module_runs_on_host_tensors_beside_the_kernels() {
    let Some((api, dev)) = common::opencl_device("a_host_function_of_a_device_module") else {
        return;
    };
    // Host function first, so a kernel index that counted it would launch the wrong kernel.
    let m = IRModule::from_functions(vec![host_double(), vadd()]);
    m.verify().unwrap();
    let m = kiln::codegen::opencl::build(&m, &opencl()).unwrap();
    assert_eq!(m.source().matches("__kernel").count(), 1, "{}", m.source());
    let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let ah = Tensor::from_slice(&x, &[8], Device::cpu()).unwrap();
    let bh = Tensor::zeros(&[8], ah.dtype(), Device::cpu()).unwrap();
    let hf = m.get_function("host_double").unwrap();
    call(&hf, &[&ah, &bh]).unwrap();
    assert_eq!(
        bh.to_vec::<f32>().unwrap(),
        [0., 2., 4., 6., 8., 10., 12., 14.]
    );
    // Device tensors are refused by the host function, as host tensors by the kernels'.
    let ad = Tensor::from_slice(&x, &[8], dev).unwrap();
    let err = call(&hf, &[&ad, &bh]).unwrap_err();
    assert!(err.contains("device_type") && err.contains("cpu"), "{err}");
    let n = 1000usize;
    let (xa, xb) = (floats(n, 1), floats(n, 2));
    let ta = Tensor::from_slice(&xa, &[n as i64], dev).unwrap();
    let tb = Tensor::from_slice(&xb, &[n as i64], dev).unwrap();
    let tc = Tensor::zeros(&[n as i64], ta.dtype(), dev).unwrap();
    let vf = m.get_function("vadd").unwrap();
    call(&vf, &[&ta, &tb, &tc]).unwrap();
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    let got = tc.to_vec::<f32>().unwrap();
    assert!(got
        .iter()
        .zip(xa.iter().zip(&xb))
        .all(|(c, (a, b))| *c == a + b));
}

#[test]
fn a_host_function_with_thread_bound_loops_is_refused() {
    let mut f = vadd();
    f.attrs.host = true;
    let m = IRModule::from_functions(vec![f]);
    let e = kiln::codegen::opencl::build(&m, &opencl())
        .unwrap_err()
        .to_string();
    assert!(e.contains("host function") && e.contains("vadd"), "{e}");
}

/// `out[i] = A[idx[i]]` and `S[idx[i]] = A[i]` for `i < 6`, one block of 64 threads: a gather and
/// a scatter whose indices come from memory.
fn gather_scatter() -> PrimFunc {
    let f32b = |name: &str, n: i64| Buffer::new(name, DataType::f32(), vec![Expr::from(n)]);
    let (a, out, s) = (f32b("A", 10), f32b("out", 6), f32b("S", 10));
    let idx = Buffer::new("idx", DataType::i32(), vec![Expr::from(6i64)]);
    let body = thread_for("bx", Expr::from(1i64), BX, |_| {
        thread_for("tx", Expr::from(64i64), TX, |tx| {
            let i = tx;
            if_then_else(
                i.clone().lt(Expr::from(6i64)),
                Stmt::Seq(vec![
                    out.store([i.clone()], a.load([idx.load([i.clone()])])),
                    s.store([idx.load([i.clone()])], a.load([i])),
                ]),
                None,
            )
        })
    });
    PrimFunc::new(
        "gs",
        vec![
            Param::Buffer(a),
            Param::Buffer(idx),
            Param::Buffer(out),
            Param::Buffer(s),
        ],
        body,
    )
}

#[test]
fn a_kernel_index_from_memory_out_of_bounds_reads_zero_and_writes_nothing() {
    let m = build(gather_scatter());
    let src = m.get_source("").unwrap_or_default();
    assert!(
        src.contains("(ulong)(long)("),
        "the guard is in the source:\n{src}"
    );
    let Some((api, dev)) = common::opencl_device(
        "a_kernel_index_from_memory_out_of_bounds_reads_zero_and_writes_nothing",
    ) else {
        return;
    };
    let f = m.get_function("gs").unwrap();
    let x: Vec<f32> = (1..=10).map(|v| v as f32).collect();
    // 10, -1 and 2^28 are outside `A` and `S`: read as 0, not written.
    for (ids, want_out, want_s) in [
        (
            [9, 0, 3, 2, 8, 1],
            vec![10.0, 1.0, 4.0, 3.0, 9.0, 2.0],
            vec![2.0, 6.0, 4.0, 3.0, 0.0, 0.0, 0.0, 0.0, 5.0, 1.0],
        ),
        (
            [9, 10, -1, 2, 1 << 28, 1],
            vec![10.0, 0.0, 0.0, 3.0, 0.0, 2.0],
            vec![0.0, 6.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
        ),
    ] {
        let a = Tensor::from_slice(&x, &[10], dev).unwrap();
        let idx = Tensor::from_slice(&ids, &[6], dev).unwrap();
        let out = Tensor::zeros(&[6], a.dtype(), dev).unwrap();
        let s = Tensor::zeros(&[10], a.dtype(), dev).unwrap();
        call(&f, &[&a, &idx, &out, &s]).unwrap();
        api.sync_stream(dev, api.current_stream(dev)).unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), want_out, "indices {ids:?}");
        assert_eq!(s.to_vec::<f32>().unwrap(), want_s, "indices {ids:?}");
    }
}
