//! TIR's scalar language: `if_then_else`, bitwise operations and shifts, `clz`/`popcount`,
//! `reinterpret`, the float functions and predicates, and `call_extern` — in the verifier, JSON,
//! the interpreter, LLVM-compiled code and OpenCL kernels (docs/ir.md section 4).

mod common;

use kiln::codegen::llvm::{CodegenOptions, LlvmModule, Tiering};
use kiln::device_api::{DeviceApi, Tensor};
use kiln::ir::builder::{call, call_extern, if_then_else_expr, thread_for};
use kiln::ir::interp::{run, HostBuffer, InterpArg};
use kiln::ir::{
    BinOp, Buffer, DataType, Expr, IRModule, Intrinsic, Param, PrimFunc, Stmt, ThreadTag, Var,
};
use kiln::packed_func::ffi::{DLDataTypeCode, DLDeviceType};
use kiln::packed_func::{AnyView, DLDataType, DLDevice, DLTensor, Module};
use kiln::target::Target;

const THREADS: i64 = 32;

/// The float functions of TIR's scalar language (with a float result).
const FLOAT_FNS: [Intrinsic; 22] = [
    Intrinsic::Copysign,
    Intrinsic::Trunc,
    Intrinsic::Nearbyint,
    Intrinsic::Sin,
    Intrinsic::Cos,
    Intrinsic::Tan,
    Intrinsic::Asin,
    Intrinsic::Acos,
    Intrinsic::Atan,
    Intrinsic::Atan2,
    Intrinsic::Sinh,
    Intrinsic::Cosh,
    Intrinsic::Asinh,
    Intrinsic::Acosh,
    Intrinsic::Atanh,
    Intrinsic::Log2,
    Intrinsic::Log10,
    Intrinsic::Log1p,
    Intrinsic::Exp2,
    Intrinsic::Exp10,
    Intrinsic::Expm1,
    Intrinsic::Hypot,
];

const PREDICATES: [Intrinsic; 3] = [Intrinsic::IsNan, Intrinsic::IsInf, Intrinsic::IsFinite];

/// Edge cases and ordinary values.
fn grid() -> Vec<f64> {
    vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        0.9,
        -0.9,
        1.5,
        2.0,
        3.7,
        -3.7,
        std::f64::consts::PI,
        10.0,
        100.0,
        -100.0,
        1e-30,
        1e10,
        1e30,
        -1e30,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ]
}

/// `(a, b)` over all pairs of the grid, padded to whole blocks of `THREADS`.
fn pairs() -> (Vec<f64>, Vec<f64>) {
    let g = grid();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for x in &g {
        for y in &g {
            a.push(*x);
            b.push(*y);
        }
    }
    while a.len() % THREADS as usize != 0 {
        a.push(0.25);
        b.push(0.75);
    }
    (a, b)
}

/// `C[i] = op(A[i], B[i])` (or of `A[i]`), cast to `t` for the predicates.
fn value(op: Intrinsic, t: DataType, a: Expr, b: Expr) -> Expr {
    let args = if op.arity() == 2 { vec![a, b] } else { vec![a] };
    let v = call(op, args);
    if op.is_predicate() {
        v.cast(t)
    } else {
        v
    }
}

fn cpu_func(op: Intrinsic, t: DataType, n: i64) -> PrimFunc {
    let buf = |name: &str| Buffer::new(name, t, vec![Expr::from(n)]);
    let (a, b, c) = (buf("A"), buf("B"), buf("C"));
    let i = Var::new("i", DataType::i64());
    let iv = Expr::Var(i.clone());
    let body = Stmt::For {
        var: i,
        min: Expr::from(0i64),
        extent: Expr::from(n),
        kind: kiln::ir::ForKind::Serial,
        body: Box::new(c.store(
            vec![iv.clone()],
            value(op, t, a.load(vec![iv.clone()]), b.load(vec![iv])),
        )),
    };
    PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
}

/// A float32's position in the order of the floats (adjacent floats differ by 1, `-0.0` and
/// `+0.0` are 0): distances in it are ulps.
fn f32_key(v: f32) -> i64 {
    let b = v.to_bits() as i32;
    i64::from(if b < 0 { i32::MIN - b } else { b })
}

/// The float32 at position `k` of [`f32_key`].
fn f32_from_key(k: i64) -> f32 {
    let b = if k < 0 { i32::MIN - k as i32 } else { k as i32 };
    f32::from_bits(b as u32)
}

/// Test inputs: every `step`-th float32 from `lo` to `hi`, the floats within `around` ulp of
/// each of `edges`, then `extra`, padded with `pad` to a multiple of 16 (the vector width of
/// the vectorized test functions).
fn float_samples(
    (lo, hi, step): (f32, f32, i64),
    (edges, around): (&[f32], i64),
    extra: &[f32],
    pad: f32,
) -> Vec<f32> {
    let mut xs: Vec<f32> = (f32_key(lo)..=f32_key(hi))
        .step_by(step as usize)
        .map(f32_from_key)
        .collect();
    for e in edges {
        for d in -around..=around {
            xs.push(f32_from_key(f32_key(*e) + d));
        }
    }
    xs.extend_from_slice(extra);
    while xs.len() % 16 != 0 {
        xs.push(pad);
    }
    xs
}

/// `C[i] = op(A[i])` (`A`, `B`, `C` of `n` elements, `n` a multiple of 16) in a loop of 16
/// vectorized lanes, which kiln's emitter writes as vector code.
fn vectorized_func(op: Intrinsic, t: DataType, n: i64) -> PrimFunc {
    let buf = |name: &str| Buffer::new(name, t, vec![Expr::from(n)]);
    let (a, b, c) = (buf("A"), buf("B"), buf("C"));
    let (o, l) = (
        Var::new("o", DataType::i64()),
        Var::new("l", DataType::i64()),
    );
    let i = Expr::Var(o.clone()) * 16i64 + Expr::Var(l.clone());
    let body = Stmt::For {
        var: o,
        min: Expr::from(0i64),
        extent: Expr::from(n / 16),
        kind: kiln::ir::ForKind::Serial,
        body: Box::new(Stmt::For {
            var: l,
            min: Expr::from(0i64),
            extent: Expr::from(16i64),
            kind: kiln::ir::ForKind::Vectorized,
            body: Box::new(c.store(
                vec![i.clone()],
                value(op, t, a.load(vec![i.clone()]), b.load(vec![i])),
            )),
        }),
    };
    PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
}

fn device_func(op: Intrinsic, t: DataType, n: i64) -> PrimFunc {
    let buf = |name: &str| Buffer::new(name, t, vec![Expr::from(n)]);
    let (a, b, c) = (buf("A"), buf("B"), buf("C"));
    let body = thread_for("bx", Expr::from(n / THREADS), ThreadTag::Block(0), |bx| {
        thread_for("tx", Expr::from(THREADS), ThreadTag::Thread(0), |tx| {
            let i = bx * THREADS + tx;
            c.store([i.clone()], value(op, t, a.load([i.clone()]), b.load([i])))
        })
    });
    PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
}

fn host(t: DataType, v: &[f64]) -> HostBuffer {
    let n = v.len() as i64;
    if t == DataType::f32() {
        HostBuffer::from_slice(&[n], &v.iter().map(|x| *x as f32).collect::<Vec<_>>())
    } else {
        HostBuffer::from_slice(&[n], v)
    }
}

fn values(b: &HostBuffer) -> Vec<f64> {
    (0..b.shape[0] as usize)
        .map(|i| b.get(i).unwrap().as_f64())
        .collect()
}

/// Runs `f(A, B, C)` in the interpreter; returns `C`.
fn interpret(f: &PrimFunc, t: DataType, a: &[f64], b: &[f64]) -> Vec<f64> {
    let mut args = vec![
        InterpArg::Buffer(host(t, a)),
        InterpArg::Buffer(host(t, b)),
        InterpArg::Buffer(HostBuffer::zeros(t, &[a.len() as i64])),
    ];
    run(f, &mut args).unwrap();
    let InterpArg::Buffer(c) = &args[2] else {
        unreachable!()
    };
    values(c)
}

/// Runs `module`'s `f` on host buffers of `t` (one `DLTensor` each).
fn jit_call(module: &IRModule, t: DataType, bufs: &mut [HostBuffer]) -> Result<(), String> {
    jit_call_with(module, t, bufs, &CodegenOptions::host())
}

/// [`jit_call`] compiled with `opts`.
fn jit_call_with(
    module: &IRModule,
    t: DataType,
    bufs: &mut [HostBuffer],
    opts: &CodegenOptions,
) -> Result<(), String> {
    let m = LlvmModule::jit_with(module, opts, Tiering::Off).map_err(|e| e.to_string())?;
    let pf = m.require_function("f").unwrap();
    let mut shapes: Vec<[i64; 1]> = bufs.iter().map(|b| [b.shape[0]]).collect();
    let dls: Vec<DLTensor> = bufs
        .iter_mut()
        .zip(shapes.iter_mut())
        .map(|(b, s)| DLTensor {
            data: b.data.as_mut_ptr().cast(),
            device: DLDevice {
                device_type: DLDeviceType::CPU,
                device_id: 0,
            },
            ndim: 1,
            dtype: DLDataType {
                code: DLDataTypeCode(b.dtype.code as u8),
                bits: b.dtype.bits,
                lanes: 1,
            },
            shape: s.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        })
        .collect();
    let _ = t;
    let views: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
    pf.call(&views).map(|_| ()).map_err(|e| e.to_string())
}

fn compiled(f: &PrimFunc, t: DataType, a: &[f64], b: &[f64]) -> Vec<f64> {
    compiled_with(f, t, a, b, &CodegenOptions::host())
}

/// [`compiled`] with `opts`.
fn compiled_with(
    f: &PrimFunc,
    t: DataType,
    a: &[f64],
    b: &[f64],
    opts: &CodegenOptions,
) -> Vec<f64> {
    let module = IRModule::from_functions(vec![f.clone()]);
    module.verify().unwrap();
    let mut bufs = vec![
        host(t, a),
        host(t, b),
        HostBuffer::zeros(t, &[a.len() as i64]),
    ];
    jit_call_with(&module, t, &mut bufs, opts).unwrap();
    values(&bufs[2])
}

/// The host, and x86-64 without FMA (TVM's default `llvm` target: the inline `exp` and `erf`
/// multiply and add there).
fn host_and_no_fma() -> Vec<(&'static str, CodegenOptions)> {
    let generic = Target::parse(r#"{"kind": "llvm", "mcpu": "x86-64"}"#).unwrap();
    vec![
        ("host", CodegenOptions::host()),
        ("x86-64", CodegenOptions::from_target(&generic).unwrap()),
    ]
}

/// Distance in units in the last place of `t` (0 for equal values or two NaNs).
fn ulps(t: DataType, x: f64, y: f64) -> u64 {
    if (x.is_nan() && y.is_nan()) || x == y && x.is_sign_negative() == y.is_sign_negative() {
        return 0;
    }
    if x.is_nan() || y.is_nan() {
        return u64::MAX;
    }
    let key = |v: f64| -> i64 {
        if t == DataType::f32() {
            f32_key(v as f32)
        } else {
            let b = v.to_bits() as i64;
            if b < 0 {
                i64::MIN - b
            } else {
                b
            }
        }
    };
    key(x).abs_diff(key(y))
}

fn compare(
    what: &str,
    op: Intrinsic,
    t: DataType,
    (a, b): (&[f64], &[f64]),
    got: &[f64],
    want: &[f64],
    tol: u64,
) {
    for k in 0..got.len() {
        let d = ulps(t, got[k], want[k]);
        // Exact zeros of the function may come out as tiny values of either sign.
        let tiny = got[k].abs() < 1e-6
            && want[k].abs() < 1e-6
            && !matches!(
                op,
                Intrinsic::Copysign | Intrinsic::Trunc | Intrinsic::Nearbyint
            );
        assert!(
            d <= tol || tiny,
            "{what} {t} {}({}, {}) = {} but the interpreter says {} ({d} ulp)",
            op.name(),
            a[k],
            b[k],
            got[k],
            want[k]
        );
    }
}

#[test]
fn float_functions_compiled_by_llvm_agree_with_the_interpreter() {
    let (a, b) = pairs();
    for t in [DataType::f32(), DataType::f64()] {
        for op in FLOAT_FNS.into_iter().chain(PREDICATES) {
            let f = cpu_func(op, t, a.len() as i64);
            let want = interpret(&f, t, &a, &b);
            let got = compiled(&f, t, &a, &b);
            compare("LLVM", op, t, (&a, &b), &got, &want, 4);
        }
    }
}

/// Builds `f(A, B, C)` for OpenCL, runs it on `dev` with `a`, `b` in type `t` and returns `C`.
fn on_device(
    f: PrimFunc,
    t: DataType,
    a: &[f64],
    b: &[f64],
    api: &kiln::device_api::OpenClDeviceApi,
    dev: kiln::device_api::Device,
) -> Vec<f64> {
    let n = a.len() as i64;
    let m = kiln::codegen::opencl::build(
        &IRModule::from_functions(vec![f]),
        &Target::parse(r#"{"kind": "opencl"}"#).unwrap(),
    )
    .unwrap();
    let pf = m.get_function("f").unwrap();
    let tensor = |v: &[f64]| {
        if t == DataType::f32() {
            let v: Vec<f32> = v.iter().map(|x| *x as f32).collect();
            Tensor::from_slice(&v, &[n], dev).unwrap()
        } else {
            Tensor::from_slice(v, &[n], dev).unwrap()
        }
    };
    let (at, bt, ct) = (tensor(a), tensor(b), tensor(&vec![0.0; a.len()]));
    pf.call(&[
        AnyView::from(at.as_dltensor()),
        AnyView::from(bt.as_dltensor()),
        AnyView::from(ct.as_dltensor()),
    ])
    .unwrap();
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    if t == DataType::f32() {
        ct.to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect()
    } else {
        ct.to_vec::<f64>().unwrap()
    }
}

#[test]
fn float_functions_in_opencl_agree_with_the_interpreter() {
    let Some((api, dev)) = common::opencl_device("float_functions_in_opencl") else {
        return;
    };
    let (a, b) = pairs();
    let n = a.len() as i64;
    for t in [DataType::f32(), DataType::f64()] {
        for op in FLOAT_FNS.into_iter().chain(PREDICATES) {
            let f = device_func(op, t, n);
            let want = interpret(&f, t, &a, &b);
            let got = on_device(f, t, &a, &b, &api, dev);
            // OpenCL C's accuracy requirements go up to 16 ulp (pow-like functions).
            compare("OpenCL", op, t, (&a, &b), &got, &want, 16);
        }
    }
}

/// `B[i] = if_then_else(i >= 1, A[i - 1], 0)` over `[0, 8)`: never reads `A[-1]`.
fn shifted(kernel: bool) -> PrimFunc {
    let n = if kernel { THREADS } else { 8 };
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(n)]);
    let b = Buffer::new("B", DataType::f32(), vec![Expr::from(n)]);
    let store = |i: Expr| {
        b.store(
            [i.clone()],
            if_then_else_expr(i.clone().ge(1i64), a.load([i - 1i64]), Expr::from(0.0f32)),
        )
    };
    let body = if kernel {
        thread_for("bx", Expr::from(1i64), ThreadTag::Block(0), |_| {
            thread_for("tx", Expr::from(n), ThreadTag::Thread(0), store)
        })
    } else {
        let i = Var::new("i", DataType::i64());
        Stmt::For {
            var: i.clone(),
            min: Expr::from(0i64),
            extent: Expr::from(n),
            kind: kiln::ir::ForKind::Serial,
            body: Box::new(store(Expr::Var(i))),
        }
    };
    PrimFunc::new("f", vec![Param::Buffer(a), Param::Buffer(b)], body)
}

#[test]
fn if_then_else_guards_an_out_of_bounds_load() {
    let f = shifted(false);
    let a: Vec<f32> = (1..=8).map(|x| x as f32).collect();
    let want = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];
    let mut args = vec![
        InterpArg::Buffer(HostBuffer::from_slice(&[8], &a)),
        InterpArg::Buffer(HostBuffer::zeros(DataType::f32(), &[8])),
    ];
    run(&f, &mut args).expect("the unchosen arm is not evaluated");
    assert_eq!(args[1].to_vec::<f32>().unwrap(), want);

    let module = IRModule::from_functions(vec![f]);
    let ir = kiln::codegen::llvm::generate_ir(
        &module,
        &CodegenOptions::host(),
        &kiln::codegen::llvm::Linkage::Export,
    )
    .unwrap();
    assert!(
        ir.contains("phi float"),
        "if_then_else is a branch and a phi:\n{ir}"
    );
    let mut bufs = vec![
        HostBuffer::from_slice(&[8], &a),
        HostBuffer::zeros(DataType::f32(), &[8]),
    ];
    jit_call(&module, DataType::f32(), &mut bufs).unwrap();
    assert_eq!(bufs[1].to_vec::<f32>().unwrap(), want);

    let Some((api, dev)) = common::opencl_device("if_then_else_guards") else {
        return;
    };
    let k = shifted(true);
    let n = THREADS as usize;
    let a: Vec<f32> = (1..=n).map(|x| x as f32).collect();
    let mut iargs = vec![
        InterpArg::Buffer(HostBuffer::from_slice(&[THREADS], &a)),
        InterpArg::Buffer(HostBuffer::zeros(DataType::f32(), &[THREADS])),
    ];
    run(&k, &mut iargs).unwrap();
    let m = kiln::codegen::opencl::build(
        &IRModule::from_functions(vec![k]),
        &Target::parse(r#"{"kind": "opencl"}"#).unwrap(),
    )
    .unwrap();
    let at = Tensor::from_slice(&a, &[THREADS], dev).unwrap();
    let bt = Tensor::from_slice(&vec![9.0f32; n], &[THREADS], dev).unwrap();
    m.get_function("f")
        .unwrap()
        .call(&[
            AnyView::from(at.as_dltensor()),
            AnyView::from(bt.as_dltensor()),
        ])
        .unwrap();
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    assert_eq!(
        bt.to_vec::<f32>().unwrap(),
        iargs[1].to_vec::<f32>().unwrap()
    );
}

/// `C[i] = op(A[i], B[i])` on integers of type `t`, in the interpreter and the JIT.
#[test]
fn shifts_and_bit_functions_are_defined_for_every_amount() {
    use kiln::ir::interp::{binary, intrinsic, Scalar};
    let i32s = |v: i64| Scalar::Int(DataType::i32(), v);
    let sh = |op, a, b| binary(op, i32s(a), i32s(b)).unwrap().as_i64();
    assert_eq!(sh(BinOp::Shl, 1, 33), 2);
    assert_eq!(sh(BinOp::Shl, 1, -1), i64::from(i32::MIN));
    assert_eq!(sh(BinOp::Shr, -8, 1), -4);
    assert_eq!(sh(BinOp::Shr, -8, 32), -8);
    let u8s = |v: i64| Scalar::UInt(DataType::new(kiln::ir::TypeCode::UInt, 8, 1), v as u64);
    assert_eq!(binary(BinOp::Shr, u8s(0x80), u8s(7)).unwrap().as_i64(), 1);
    assert_eq!(intrinsic(Intrinsic::Clz, &[i32s(0)]).as_i64(), 32);
    assert_eq!(intrinsic(Intrinsic::Clz, &[i32s(1)]).as_i64(), 31);
    assert_eq!(intrinsic(Intrinsic::Clz, &[i32s(-1)]).as_i64(), 0);
    assert_eq!(intrinsic(Intrinsic::Popcount, &[i32s(-1)]).as_i64(), 32);
    assert_eq!(intrinsic(Intrinsic::BitwiseNot, &[i32s(5)]).as_i64(), -6);

    // Every pair of a few amounts and values, compiled, against the interpreter (bit-exact).
    for t in [
        DataType::i32(),
        DataType::i64(),
        DataType::i8(),
        DataType::new(kiln::ir::TypeCode::UInt, 32, 1),
        DataType::new(kiln::ir::TypeCode::UInt, 8, 1),
    ] {
        let vals: [i64; 10] = [0, 1, -1, 7, 8, 31, 32, 63, 64, -100];
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for x in vals {
            for y in vals {
                a.push(x);
                b.push(y);
            }
        }
        let n = a.len() as i64;
        let ops: Vec<Box<dyn Fn(Expr, Expr) -> Expr>> = vec![
            Box::new(|x, y| Expr::binary(BinOp::Shl, x, y)),
            Box::new(|x, y| Expr::binary(BinOp::Shr, x, y)),
            Box::new(|x, y| Expr::binary(BinOp::BitAnd, x, y)),
            Box::new(|x, y| Expr::binary(BinOp::BitOr, x, y)),
            Box::new(|x, y| Expr::binary(BinOp::BitXor, x, y)),
            Box::new(|x, _| call(Intrinsic::Clz, vec![x])),
            Box::new(|x, _| call(Intrinsic::Popcount, vec![x])),
            Box::new(|x, _| call(Intrinsic::BitwiseNot, vec![x])),
        ];
        for op in &ops {
            let buf = |name: &str| Buffer::new(name, t, vec![Expr::from(n)]);
            let (ab, bb, cb) = (buf("A"), buf("B"), buf("C"));
            let i = Var::new("i", DataType::i64());
            let iv = Expr::Var(i.clone());
            let f = PrimFunc::new(
                "f",
                vec![
                    Param::Buffer(ab.clone()),
                    Param::Buffer(bb.clone()),
                    Param::Buffer(cb.clone()),
                ],
                Stmt::For {
                    var: i,
                    min: Expr::from(0i64),
                    extent: Expr::from(n),
                    kind: kiln::ir::ForKind::Serial,
                    body: Box::new(cb.store(
                        vec![iv.clone()],
                        op(ab.load(vec![iv.clone()]), bb.load(vec![iv])),
                    )),
                },
            );
            let hb = |v: &[i64]| {
                let mut h = HostBuffer::zeros(t, &[n]);
                for (k, x) in v.iter().enumerate() {
                    let bytes = x.to_le_bytes();
                    h.data[k * t.bytes()..(k + 1) * t.bytes()].copy_from_slice(&bytes[..t.bytes()]);
                }
                h
            };
            let mut iargs = vec![
                InterpArg::Buffer(hb(&a)),
                InterpArg::Buffer(hb(&b)),
                InterpArg::Buffer(HostBuffer::zeros(t, &[n])),
            ];
            run(&f, &mut iargs).unwrap();
            let module = IRModule::from_functions(vec![f.clone()]);
            module.verify().unwrap();
            let mut bufs = vec![hb(&a), hb(&b), HostBuffer::zeros(t, &[n])];
            jit_call(&module, t, &mut bufs).unwrap();
            let InterpArg::Buffer(want) = &iargs[2] else {
                unreachable!()
            };
            assert_eq!(bufs[2].data, want.data, "{t}\n{f}");
        }
    }
}

#[test]
fn reinterpret_reads_the_bits() {
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(4i64)]);
    let b = Buffer::new("B", DataType::i32(), vec![Expr::from(4i64)]);
    let c = Buffer::new("C", DataType::f32(), vec![Expr::from(4i64)]);
    let i = Var::new("i", DataType::i64());
    let iv = Expr::Var(i.clone());
    let bits = a.load(vec![iv.clone()]).reinterpret(DataType::i32());
    let body = Stmt::For {
        var: i,
        min: Expr::from(0i64),
        extent: Expr::from(4i64),
        kind: kiln::ir::ForKind::Serial,
        body: Box::new(Stmt::seq(vec![
            b.store(vec![iv.clone()], bits.clone()),
            // Flip the sign bit through the integer view.
            c.store(
                vec![iv],
                Expr::binary(BinOp::BitXor, bits, Expr::from(i32::MIN))
                    .reinterpret(DataType::f32()),
            ),
        ])),
    };
    let f = PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    );
    let xs = [1.0f32, -2.5, 0.0, f32::INFINITY];
    let mut iargs = vec![
        InterpArg::Buffer(HostBuffer::from_slice(&[4], &xs)),
        InterpArg::Buffer(HostBuffer::zeros(DataType::i32(), &[4])),
        InterpArg::Buffer(HostBuffer::zeros(DataType::f32(), &[4])),
    ];
    run(&f, &mut iargs).unwrap();
    let want_bits: Vec<i32> = xs.iter().map(|x| x.to_bits() as i32).collect();
    let want_neg: Vec<f32> = xs.iter().map(|x| -x).collect();
    assert_eq!(iargs[1].to_vec::<i32>().unwrap(), want_bits);
    assert_eq!(iargs[2].to_vec::<f32>().unwrap(), want_neg);
    let module = IRModule::from_functions(vec![f]);
    let mut bufs = vec![
        HostBuffer::from_slice(&[4], &xs),
        HostBuffer::zeros(DataType::i32(), &[4]),
        HostBuffer::zeros(DataType::f32(), &[4]),
    ];
    jit_call(&module, DataType::f32(), &mut bufs).unwrap();
    assert_eq!(bufs[1].to_vec::<i32>().unwrap(), want_bits);
    assert_eq!(bufs[2].to_vec::<f32>().unwrap(), want_neg);
}

/// `C[i] = call_extern("cbrtf", A[i])` and `fmaf(A[i], A[i], 1)`.
#[test]
fn call_extern_calls_libm_in_the_jit() {
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(4i64)]);
    let b = Buffer::new("B", DataType::f32(), vec![Expr::from(4i64)]);
    let c = Buffer::new("C", DataType::f32(), vec![Expr::from(4i64)]);
    let i = Var::new("i", DataType::i64());
    let iv = Expr::Var(i.clone());
    let x = a.load(vec![iv.clone()]);
    let body = Stmt::For {
        var: i,
        min: Expr::from(0i64),
        extent: Expr::from(4i64),
        kind: kiln::ir::ForKind::Serial,
        body: Box::new(Stmt::seq(vec![
            b.store(
                vec![iv.clone()],
                call_extern(DataType::f32(), "cbrtf", vec![x.clone()]),
            ),
            c.store(
                vec![iv],
                call_extern(
                    DataType::f32(),
                    "fmaf",
                    vec![x.clone(), x, Expr::from(1.0f32)],
                ),
            ),
        ])),
    };
    let f = PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    );
    let module = IRModule::from_functions(vec![f.clone()]);
    module.verify().unwrap();
    let xs = [8.0f32, -27.0, 2.0, 0.0];
    let mut bufs = vec![
        HostBuffer::from_slice(&[4], &xs),
        HostBuffer::zeros(DataType::f32(), &[4]),
        HostBuffer::zeros(DataType::f32(), &[4]),
    ];
    jit_call(&module, DataType::f32(), &mut bufs).unwrap();
    let want: Vec<f32> = xs.iter().map(|x| x.cbrt()).collect();
    assert_eq!(bufs[1].to_vec::<f32>().unwrap(), want);
    let want: Vec<f32> = xs.iter().map(|x| x.mul_add(*x, 1.0)).collect();
    assert_eq!(bufs[2].to_vec::<f32>().unwrap(), want);

    // The interpreter names the symbol it cannot run.
    let mut iargs = vec![
        InterpArg::Buffer(HostBuffer::from_slice(&[4], &xs)),
        InterpArg::Buffer(HostBuffer::zeros(DataType::f32(), &[4])),
        InterpArg::Buffer(HostBuffer::zeros(DataType::f32(), &[4])),
    ];
    let err = run(&f, &mut iargs).unwrap_err().to_string();
    assert!(err.contains("call_extern `cbrtf`"), "{err}");
}

#[test]
fn opencl_refuses_call_extern() {
    let c = Buffer::new("C", DataType::f32(), vec![Expr::from(THREADS)]);
    let body = thread_for("bx", Expr::from(1i64), ThreadTag::Block(0), |_| {
        thread_for("tx", Expr::from(THREADS), ThreadTag::Thread(0), |tx| {
            c.store(
                [tx],
                call_extern(DataType::f32(), "cbrtf", vec![Expr::from(1.0f32)]),
            )
        })
    });
    let f = PrimFunc::new("f", vec![Param::Buffer(c)], body);
    let err = kiln::codegen::opencl::build(
        &IRModule::from_functions(vec![f]),
        &Target::parse(r#"{"kind": "opencl"}"#).unwrap(),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("call_extern `cbrtf`"), "{err}");
}

fn verify_errors(json: &str) -> String {
    let text = format!(
        r#"{{"format": "kiln-ir/1", "functions": [{{"name": "f",
        "params": [{{"kind": "buffer", "name": "A", "dtype": "float32", "shape": [4]}},
                   {{"kind": "scalar", "name": "k", "dtype": "int32"}}],
        "ret_type": "float32",
        "body": {{"stmt": "return", "value": {json}}}}}]}}"#
    );
    let m = IRModule::from_json_str(&text).unwrap();
    m.verify_all()
        .into_iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn verifier_reports_arity_and_type_errors_with_paths() {
    let a0 = r#"{"op": "load", "buffer": "A", "indices": [{"const": 0, "dtype": "int64"}]}"#;
    let k = r#"{"var": "k"}"#;
    let e = verify_errors(&format!(r#"{{"op": "bitwise_and", "args": [{a0}, {a0}]}}"#));
    assert!(
        e.contains("body.value: `bitwise_and` needs integer operands, found float32"),
        "{e}"
    );
    let e = verify_errors(&format!(
        r#"{{"op": "cast", "dtype": "float32", "args": [{{"op": "clz", "args": [{a0}]}}]}}"#
    ));
    assert!(
        e.contains("body.value.args[0]: `clz` needs an integer, found float32"),
        "{e}"
    );
    let e = verify_errors(&format!(
        r#"{{"op": "cast", "dtype": "float32", "args": [{{"op": "sin", "args": [{k}]}}]}}"#
    ));
    assert!(e.contains("`sin` needs a float, found int32"), "{e}");
    let e = verify_errors(&format!(
        r#"{{"op": "if_then_else", "args": [{k}, {a0}, {a0}]}}"#
    ));
    assert!(
        e.contains("body.value.args[0]: if_then_else condition must be bool, found int32"),
        "{e}"
    );
    let e = verify_errors(&format!(
        r#"{{"op": "reinterpret", "dtype": "float32", "args": [{{"op": "cast", "dtype": "int64", "args": [{k}]}}]}}"#
    ));
    assert!(e.contains("reinterpret needs types of one size"), "{e}");
    let e = verify_errors(&format!(
        r#"{{"op": "call_extern", "symbol": "not-an-ident", "dtype": "float32", "args": [{a0}]}}"#
    ));
    assert!(
        e.contains("body.value.symbol: call_extern symbol `not-an-ident` is not a C identifier"),
        "{e}"
    );
    let e = verify_errors(&format!(
        r#"{{"op": "call_extern", "symbol": "f16fn", "dtype": "float32", "args": [{{"op": "cast", "dtype": "float16", "args": [{a0}]}}]}}"#
    ));
    assert!(
        e.contains("body.value.args[0]: call_extern `f16fn` argument has type float16"),
        "{e}"
    );
    // Arity: the JSON reader refuses a wrong number of arguments with the path.
    let text = format!(
        r#"{{"format": "kiln-ir/1", "functions": [{{"name": "f",
        "params": [{{"kind": "buffer", "name": "A", "dtype": "float32", "shape": [4]}}],
        "ret_type": "float32",
        "body": {{"stmt": "return", "value": {{"op": "atan2", "args": [{a0}]}}}}}}]}}"#
    );
    let err = IRModule::from_json_str(&text).unwrap_err().to_string();
    assert!(
        err.contains("`atan2` takes 2 argument(s), found 1"),
        "{err}"
    );
    // The verifier sees the arity of trees built in Rust.
    let bad = call(Intrinsic::Hypot, vec![Expr::from(1.0f32)]);
    let f = PrimFunc::new("g", vec![], Stmt::Evaluate(bad));
    let err = IRModule::from_functions(vec![f])
        .verify()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`hypot` takes 2 argument(s), found 1"),
        "{err}"
    );
}

#[test]
fn new_operations_round_trip_through_json_and_print() {
    let x = r#"{"op": "load", "buffer": "A", "indices": [{"const": 0, "dtype": "int64"}]}"#;
    let k = r#"{"var": "k"}"#;
    let value = format!(
        r#"{{"op": "add", "args": [
          {{"op": "if_then_else", "args": [{{"op": "isnan", "args": [{x}]}}, {{"op": "hypot", "args": [{x}, {x}]}}, {{"op": "exp10", "args": [{x}]}}]}},
          {{"op": "add", "args": [
            {{"op": "reinterpret", "dtype": "float32", "args": [{{"op": "shift_left", "args": [{{"op": "popcount", "args": [{k}]}}, {{"op": "bitwise_xor", "args": [{k}, {{"const": 3, "dtype": "int32"}}]}}]}}]}},
            {{"op": "call_extern", "symbol": "cbrtf", "dtype": "float32", "args": [{x}]}}]}}]}}"#
    );
    let text = format!(
        r#"{{"format": "kiln-ir/1", "functions": [{{"name": "f",
        "params": [{{"kind": "buffer", "name": "A", "dtype": "float32", "shape": [4]}},
                   {{"kind": "scalar", "name": "k", "dtype": "int32"}}],
        "ret_type": "float32",
        "body": {{"stmt": "return", "value": {value}}}}}]}}"#
    );
    let m = IRModule::from_json_str(&text).unwrap();
    m.verify().unwrap();
    let back = IRModule::from_json_str(&m.to_json_string()).unwrap();
    assert_eq!(m.to_json(), back.to_json());
    assert_eq!(m.to_string(), back.to_string());
    let printed = m.to_string();
    for s in [
        "if_then_else(isnan(",
        "hypot(",
        "exp10(",
        "reinterpret<float32>(shift_left(popcount(k",
        "bitwise_xor(k, 3",
        "call_extern<float32>(\"cbrtf\", A[",
    ] {
        assert!(printed.contains(s), "`{s}` not in\n{printed}");
    }
}

/// float32 inputs for `fast_exp`: a sweep of [-100, 100] with the clamps, zeros, tiny values,
/// infinities and NaN, padded to whole blocks of `THREADS`.
fn fast_exp_inputs() -> Vec<f64> {
    let mut v: Vec<f64> = (0..4000).map(|i| -100.0 + 0.05 * f64::from(i)).collect();
    v.extend([
        -87.0,
        -87.000_01,
        -86.999_99,
        88.0,
        88.000_01,
        87.999_99,
        88.72,
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ]);
    while v.len() % (THREADS as usize) != 0 {
        v.push(0.25);
    }
    v
}

/// `C[i] = fast_exp(A[i])`, the loop over `i` of `kind` (`vectorized` in 16-lane chunks).
fn fast_exp_cpu(n: i64, vectorized: bool) -> PrimFunc {
    let t = DataType::f32();
    let buf = |name: &str| Buffer::new(name, t, vec![Expr::from(n)]);
    let (a, b, c) = (buf("A"), buf("B"), buf("C"));
    let (o, i) = (
        Var::new("o", DataType::i64()),
        Var::new("i", DataType::i64()),
    );
    let at = Expr::Var(o.clone()) * 16i64 + Expr::Var(i.clone());
    let inner = Stmt::For {
        var: i,
        min: Expr::from(0i64),
        extent: Expr::from(16i64),
        kind: if vectorized {
            kiln::ir::ForKind::Vectorized
        } else {
            kiln::ir::ForKind::Serial
        },
        body: Box::new(c.store(
            vec![at.clone()],
            call(Intrinsic::FastExp, vec![a.load(vec![at])]),
        )),
    };
    let body = Stmt::For {
        var: o,
        min: Expr::from(0i64),
        extent: Expr::from(n / 16),
        kind: kiln::ir::ForKind::Serial,
        body: Box::new(inner),
    };
    PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
}

/// `fast_exp` is one definition (`kiln::ir::approx`): the interpreter, LLVM's scalar and
/// vector code and OpenCL agree bit for bit, clamps, infinities and NaN included.
#[test]
fn fast_exp_is_the_same_bits_on_every_backend() {
    let t = DataType::f32();
    let a = fast_exp_inputs();
    let b = vec![0.0; a.len()];
    let n = a.len() as i64;
    let want = interpret(&fast_exp_cpu(n, false), t, &a, &b);
    for (k, x) in a.iter().enumerate() {
        let r = kiln::ir::approx::fast_exp_f32(*x as f32);
        assert!(
            (r.is_nan() && want[k].is_nan()) || f64::from(r) == want[k],
            "interpreter fast_exp({x}) = {} but the definition gives {r}",
            want[k]
        );
    }
    for vectorized in [false, true] {
        let got = compiled(&fast_exp_cpu(n, vectorized), t, &a, &b);
        let what = if vectorized {
            "LLVM vector"
        } else {
            "LLVM scalar"
        };
        compare(what, Intrinsic::FastExp, t, (&a, &b), &got, &want, 0);
        // `compare` lets tiny values pass; fast_exp's must be exact too.
        for k in 0..a.len() {
            assert!(
                (got[k].is_nan() && want[k].is_nan()) || got[k].to_bits() == want[k].to_bits(),
                "{what} fast_exp({}) = {:e}, interpreter {:e}",
                a[k],
                got[k],
                want[k]
            );
        }
    }
    let Some((api, dev)) = common::opencl_device("fast_exp_is_the_same_bits_on_every_backend")
    else {
        return;
    };
    let got = on_device(device_func(Intrinsic::FastExp, t, n), t, &a, &b, &api, dev);
    for (k, &g) in got.iter().enumerate() {
        assert!(
            (g.is_nan() && want[k].is_nan()) || g.to_bits() == want[k].to_bits(),
            "OpenCL fast_exp({}) = {g:e}, interpreter {:e}",
            a[k],
            want[k]
        );
    }
}

/// `fast_exp`'s accuracy, the bound `docs/ir.md` states: within 2 ulp of `e^x` (computed in
/// f64) over every 97th float32 of the clamp range [-87, 88]; saturating outside it.
#[test]
fn fast_exp_is_within_two_ulp_of_exp() {
    use kiln::ir::approx::fast_exp_f32;
    let (lo, hi) = (f32_key(-87.0), f32_key(88.0));
    let mut worst = (0u64, 0f32);
    let mut k = lo;
    while k <= hi {
        let x = f32_from_key(k);
        let want = (f64::from(x)).exp() as f32;
        let d = f32_key(fast_exp_f32(x)).abs_diff(f32_key(want));
        if d > worst.0 {
            worst = (d, x);
        }
        k += 97;
    }
    assert!(
        worst.0 <= 2,
        "fast_exp({}) is {} ulp from exp",
        worst.1,
        worst.0
    );
    assert_eq!(fast_exp_f32(1000.0), fast_exp_f32(88.0));
    assert_eq!(fast_exp_f32(-1000.0), fast_exp_f32(-87.0));
}

/// Compiled float32 `exp` (and `sigmoid`, which uses it) over the whole float range: within
/// 2 ulp of `e^x` computed in f64, in scalar code (vectorized by LLVM's loop vectorizer) and
/// in a loop kiln vectorizes itself; overflow gives ∞, underflow 0 or the subnormal `e^x`
/// rounds to, NaN stays NaN.
#[test]
fn compiled_exp_f32_is_within_two_ulp_over_the_whole_range() {
    // The edges: the last finite result, the first infinite one, the subnormal range and the
    // last nonzero result; and ±0, ±∞, NaN.
    let xs = float_samples(
        (-110.0, 95.0, 1009),
        (
            &[
                88.72283, 88.722_84, 88.7229, -87.33654, -87.3366, -100.0, -103.27893, -103.972,
            ],
            3,
        ),
        &[
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1.0,
            -1.0,
            1e-30,
        ],
        0.5,
    );
    let n = xs.len() as i64;
    let t = DataType::f32();
    let a: Vec<f64> = xs.iter().map(|x| f64::from(*x)).collect();
    let vectorized = vectorized_func(Intrinsic::Exp, t, n);
    for ((what, f), (cpu, opts)) in [
        ("scalar", cpu_func(Intrinsic::Exp, t, n)),
        ("vectorized", vectorized),
    ]
    .into_iter()
    .flat_map(|wf| host_and_no_fma().into_iter().map(move |o| (wf.clone(), o)))
    {
        let what = format!("{what} on {cpu}");
        let got = compiled_with(&f, t, &a, &a, &opts);
        let mut worst = (0u64, 0f32);
        for (x, g) in xs.iter().zip(&got) {
            let want = f64::from(*x).exp() as f32;
            let g = *g as f32;
            if x.is_nan() {
                assert!(g.is_nan(), "{what}: exp(NaN) = {g}");
                continue;
            }
            let d = f32_key(g).abs_diff(f32_key(want));
            if d > worst.0 {
                worst = (d, *x);
            }
        }
        assert!(
            worst.0 <= 2,
            "{what}: exp({:e}) is {} ulp from e^x",
            worst.1,
            worst.0
        );
        let at = |x: f32| got[xs.iter().position(|v| v.to_bits() == x.to_bits()).unwrap()];
        assert_eq!(at(f32::INFINITY), f64::INFINITY, "{what}");
        assert_eq!(at(f32::NEG_INFINITY), 0.0, "{what}");
        assert_eq!(at(0.0), 1.0, "{what}");
        assert_eq!(at(88.7229), f64::INFINITY, "{what}");
        assert!(
            at(-100.0) > 0.0 && (at(-100.0) as f32) < f32::MIN_POSITIVE,
            "{what}"
        );
    }
    // sigmoid = 1 / (1 + exp(-x)) (in float32) through the same exp.
    let sig = cpu_func(Intrinsic::Sigmoid, t, n);
    let got = compiled(&sig, t, &a, &a);
    for (x, g) in xs.iter().zip(&got) {
        // The definition, in float32: 0 where `exp(-x)` overflows.
        let want = 1.0 / (1.0 + (-*x).exp());
        if x.is_nan() {
            assert!(g.is_nan());
            continue;
        }
        let d = f32_key(*g as f32).abs_diff(f32_key(want));
        assert!(d <= 3, "sigmoid({x:e}) = {g} is {d} ulp from {want}");
    }
}

/// On the CPU, float32 `exp` is inline code LLVM can vectorize, not a call of libm's `expf`;
/// float64 `exp` is still libm's.
#[test]
fn cpu_exp_f32_is_inline_and_vectorized() {
    let t = DataType::f32();
    let m = IRModule::from_functions(vec![cpu_func(Intrinsic::Exp, t, 1024)]);
    let ll = LlvmModule::jit_with(&m, &CodegenOptions::host(), Tiering::Off)
        .unwrap()
        .get_source("ll")
        .unwrap();
    assert!(!ll.contains("@expf") && !ll.contains("@llvm.exp."), "{ll}");
    assert!(ll.contains("x float>"), "the loop is not vectorized:\n{ll}");
    // Without FMA (x86-64, TVM's default `llvm`): multiplies and adds, no call of `fmaf`.
    let (_, generic) = host_and_no_fma().pop().unwrap();
    let ll = LlvmModule::jit_with(&m, &generic, Tiering::Off)
        .unwrap()
        .get_source("ll")
        .unwrap();
    assert!(!ll.contains("fmaf") && !ll.contains("@llvm.fma."), "{ll}");
    assert!(ll.contains("x float>"), "the loop is not vectorized:\n{ll}");
    let m = IRModule::from_functions(vec![cpu_func(Intrinsic::Exp, DataType::f64(), 16)]);
    let ll = LlvmModule::jit_with(&m, &CodegenOptions::host(), Tiering::Off)
        .unwrap()
        .get_source("ll")
        .unwrap();
    assert!(ll.contains("exp"), "{ll}");
}

/// Compiled float32 `erf` (inline code on CPUs): within 4 ulp of the interpreter's `erf`
/// (computed in f64, rounded) on every 257th float in [-6, 6], at the edges of its two
/// pieces, and ±0, ±∞ (±1) and NaN, in scalar code and in a loop kiln vectorizes.
#[test]
fn compiled_erf_f32_is_within_four_ulp() {
    let xs = float_samples(
        (-6.0, 6.0, 257),
        (
            &[
                0.921_875f32,
                -0.921_875,
                3.92,
                -3.92,
                1e-20,
                -1e-38,
                2.0,
                0.5,
            ],
            2,
        ),
        &[0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN],
        0.25,
    );
    let n = xs.len() as i64;
    let t = DataType::f32();
    let a: Vec<f64> = xs.iter().map(|x| f64::from(*x)).collect();
    let scalar = cpu_func(Intrinsic::Erf, t, n);
    let want = interpret(&scalar, t, &a, &a);
    let vectorized = vectorized_func(Intrinsic::Erf, t, n);
    for ((what, f), (cpu, opts)) in [("scalar", scalar.clone()), ("vectorized", vectorized)]
        .into_iter()
        .flat_map(|wf| host_and_no_fma().into_iter().map(move |o| (wf.clone(), o)))
    {
        let what = format!("{what} on {cpu}");
        let got = compiled_with(&f, t, &a, &a, &opts);
        compare(&what, Intrinsic::Erf, t, (&a, &a), &got, &want, 4);
        let at = |x: f32| got[xs.iter().position(|v| v.to_bits() == x.to_bits()).unwrap()];
        assert_eq!(at(f32::INFINITY), 1.0, "{what}");
        assert_eq!(at(f32::NEG_INFINITY), -1.0, "{what}");
        assert!(at(f32::NAN).is_nan(), "{what}");
        assert_eq!(at(-0.0).to_bits(), (-0.0f64).to_bits(), "{what}");
    }
    let m = IRModule::from_functions(vec![scalar]);
    let ll = LlvmModule::jit_with(&m, &CodegenOptions::host(), Tiering::Off)
        .unwrap()
        .get_source("ll")
        .unwrap();
    assert!(!ll.contains("@erff"), "erf is still a call:\n{ll}");
}
