//! Differential tests: random IR programs run by the LLVM backend and by the reference
//! interpreter must agree — bit for bit on integers, and on floats too when multiply-add
//! contraction is off (`CodegenOptions::host()`; the generated operators are then exactly
//! rounded: + - * / min max select casts; NaNs match any NaN), and both must fail on integer
//! division by zero. With contraction on (the default target, as TVM), sums of products of
//! positive values agree within the stated bound `2 * ops * eps` relative (docs/ir.md).

use proptest::prelude::*;

mod random_expr;
use random_expr::{expr, lower, Leaves, E};

use kiln::codegen::llvm::{CodegenOptions, LlvmModule, Tiering};
use kiln::ir::interp::{run, HostBuffer, InterpArg};
use kiln::ir::{Buffer, DataType, Expr, ForKind, IRModule, Param, PrimFunc, Stmt, Var};
use kiln::packed_func::ffi::{DLDataTypeCode, DLDeviceType};
use kiln::packed_func::{AnyView, DLDataType, DLDevice, DLTensor, Module};

const N: i64 = 37;

fn program(e: &E, t: DataType, kind: ForKind) -> PrimFunc {
    let a = Buffer::new("A", t, vec![Expr::from(N)]);
    let b = Buffer::new("B", t, vec![Expr::from(N)]);
    let c = Buffer::new("C", t, vec![Expr::from(N)]);
    let i = Var::new("i", DataType::i64());
    let iv = Expr::Var(i.clone());
    let leaves = Leaves {
        a: a.load(vec![iv.clone()]),
        b: b.load(vec![iv.clone()]),
        index: iv,
        float_scale: 0.75,
    };
    let value = lower(e, t, &leaves);
    let body = Stmt::For {
        var: i.clone(),
        min: Expr::from(0i64),
        extent: Expr::from(N),
        kind,
        body: Box::new(c.store(vec![Expr::Var(i)], value)),
    };
    PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
}

fn bytes_of(t: DataType, vals: &[i64]) -> Vec<u8> {
    vals.iter()
        .flat_map(|&v| match (t.code, t.bits) {
            (kiln::ir::TypeCode::Float, 32) => ((v as f32) * 0.5).to_le_bytes().to_vec(),
            (kiln::ir::TypeCode::Float, _) => ((v as f64) * 0.5).to_le_bytes().to_vec(),
            (_, 32) => (v as i32).to_le_bytes().to_vec(),
            (_, 8) => (v as i8).to_le_bytes().to_vec(),
            _ => v.to_le_bytes().to_vec(),
        })
        .collect()
}

fn check(e: &E, t: DataType, kind: ForKind, a: &[i64], b: &[i64]) -> Result<(), TestCaseError> {
    let f = program(e, t, kind);
    let module = IRModule::from_functions(vec![f.clone()]);
    module
        .verify()
        .map_err(|e| TestCaseError::fail(format!("generated IR does not verify: {e}")))?;
    let hb = |v: &[i64]| HostBuffer {
        dtype: t,
        shape: vec![N],
        strides: None,
        data: bytes_of(t, v),
    };
    let mut iargs = vec![
        InterpArg::Buffer(hb(a)),
        InterpArg::Buffer(hb(b)),
        InterpArg::Buffer(HostBuffer::zeros(t, &[N])),
    ];
    let want = run(&f, &mut iargs);

    // The JIT's quick first tier and its optimized code, each on its own; and, with the
    // buffers `noalias`, the optimized code with streaming stores for any size (float outputs
    // of serial and parallel loops: scalar head, 64-byte vector stores, scalar tail).
    let streamed = IRModule::from_functions(vec![f.clone().with_noalias(true)]);
    let stream_opts = CodegenOptions {
        stream_store_bytes: Some(0),
        ..CodegenOptions::host()
    };
    let mut configs = vec![
        (Tiering::QuickOnly, &module, CodegenOptions::host()),
        (Tiering::Off, &module, CodegenOptions::host()),
    ];
    // (Only float outputs of serial and parallel loops stream: other programs would compile
    // the same code again.)
    if t.is_float() && matches!(kind, ForKind::Serial | ForKind::Parallel) {
        configs.push((Tiering::Off, &streamed, stream_opts));
    }
    for (tiering, module, opts) in configs {
        let m = LlvmModule::jit_with(module, &opts, tiering)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let pf = m.require_function("f").unwrap();
        let nbytes = N as usize * t.bytes();
        let mut bufs: Vec<Vec<u64>> = vec![vec![0; nbytes.div_ceil(8)]; 3];
        for (k, src) in [bytes_of(t, a), bytes_of(t, b)].iter().enumerate() {
            // SAFETY: each buffer holds `nbytes` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr(),
                    bufs[k].as_mut_ptr().cast::<u8>(),
                    nbytes,
                )
            };
        }
        let mut shape = [N];
        let dt = DLDataType {
            code: DLDataTypeCode(t.code as u8),
            bits: t.bits,
            lanes: 1,
        };
        let dls: Vec<DLTensor> = bufs
            .iter_mut()
            .map(|b| DLTensor {
                data: b.as_mut_ptr().cast(),
                device: DLDevice {
                    device_type: DLDeviceType::CPU,
                    device_id: 0,
                },
                ndim: 1,
                dtype: dt,
                shape: shape.as_mut_ptr(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            })
            .collect();
        let got = pf.call(&[
            AnyView::from(&dls[0]),
            AnyView::from(&dls[1]),
            AnyView::from(&dls[2]),
        ]);
        match (&want, got) {
            (Err(_), Err(e)) => {
                prop_assert!(e.to_string().contains("division by zero"), "{e}");
            }
            (Ok(_), Ok(_)) => {
                let InterpArg::Buffer(c) = &iargs[2] else {
                    unreachable!()
                };
                // SAFETY: the output buffer holds `nbytes` bytes.
                let out =
                    unsafe { std::slice::from_raw_parts(bufs[2].as_ptr().cast::<u8>(), nbytes) };
                for k in 0..N as usize {
                    let (g, w) = (
                        &out[k * t.bytes()..(k + 1) * t.bytes()],
                        &c.data[k * t.bytes()..(k + 1) * t.bytes()],
                    );
                    let is_nan = |bytes: &[u8]| {
                        HostBuffer {
                            dtype: t,
                            shape: vec![1],
                            strides: None,
                            data: bytes.to_vec(),
                        }
                        .get(0)
                        .unwrap()
                        .as_f64()
                        .is_nan()
                    };
                    let nan_both = t.is_float() && is_nan(g) && is_nan(w);
                    prop_assert!(
                        g == w || nan_both,
                        "element {k}: compiled ({tiering:?}, streaming stores from {:?} bytes) {g:?}, interpreted {w:?}\n{f}",
                        opts.stream_store_bytes
                    );
                }
            }
            (w, g) => prop_assert!(
                false,
                "interpreter {w:?} vs compiled ({tiering:?}) {g:?}\n{f}"
            ),
        }
    }
    Ok(())
}

fn dtypes() -> impl Strategy<Value = DataType> {
    prop_oneof![
        Just(DataType::i32()),
        Just(DataType::i64()),
        Just(DataType::i8()),
        Just(DataType::f32()),
        Just(DataType::f64())
    ]
}

fn kinds() -> impl Strategy<Value = ForKind> {
    prop_oneof![
        Just(ForKind::Serial),
        Just(ForKind::Vectorized),
        Just(ForKind::Parallel),
        Just(ForKind::Unrolled)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn compiled_code_agrees_with_the_interpreter(
        e in expr(),
        t in dtypes(),
        kind in kinds(),
        a in proptest::collection::vec(-20i64..20, N as usize),
        b in proptest::collection::vec(-20i64..20, N as usize),
    ) {
        check(&e, t, kind, &a, &b)?;
    }
}

/// Calls the module's `f` on 1-D host buffers of `N` elements (one `DLTensor` each).
fn call_f(m: &LlvmModule, bufs: &mut [HostBuffer]) -> Result<(), String> {
    // Each buffer's own length (one dimension).
    let mut shapes: Vec<[i64; 1]> = bufs.iter().map(|h| [h.shape[0]]).collect();
    let dls: Vec<DLTensor> = bufs
        .iter_mut()
        .zip(shapes.iter_mut())
        .map(|(h, shape)| DLTensor {
            data: h.data.as_mut_ptr().cast(),
            device: DLDevice {
                device_type: DLDeviceType::CPU,
                device_id: 0,
            },
            ndim: 1,
            dtype: DLDataType {
                code: DLDataTypeCode(h.dtype.code as u8),
                bits: h.dtype.bits,
                lanes: 1,
            },
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        })
        .collect();
    let views: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
    m.require_function("f")
        .unwrap()
        .call(&views)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A sum-of-products expression over `A[i]`, `B[i]` and constants (all in [0.5, 2], so no
/// cancellation: every operation's rounding error is relative to a positive result).
#[derive(Debug, Clone)]
enum Poly {
    A,
    B,
    Const(f32),
    Add(Box<Poly>, Box<Poly>),
    Mul(Box<Poly>, Box<Poly>),
}

impl Poly {
    fn ops(&self) -> u32 {
        match self {
            Poly::Add(x, y) | Poly::Mul(x, y) => 1 + x.ops() + y.ops(),
            _ => 0,
        }
    }
    fn lower(&self, a: &Expr, b: &Expr, t: DataType) -> Expr {
        match self {
            Poly::A => a.clone(),
            Poly::B => b.clone(),
            Poly::Const(c) => kiln::ir::builder::constant(t, f64::from(*c)),
            Poly::Add(x, y) => x.lower(a, b, t) + y.lower(a, b, t),
            Poly::Mul(x, y) => x.lower(a, b, t) * y.lower(a, b, t),
        }
    }
}

fn poly() -> impl Strategy<Value = Poly> {
    let leaf = prop_oneof![
        Just(Poly::A),
        Just(Poly::B),
        (0.5f32..2.0).prop_map(Poly::Const)
    ];
    leaf.prop_recursive(5, 24, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(x, y)| Poly::Add(Box::new(x), Box::new(y))),
            (inner.clone(), inner).prop_map(|(x, y)| Poly::Mul(Box::new(x), Box::new(y))),
        ]
    })
}

fn check_contracted(
    p: &Poly,
    t: DataType,
    kind: ForKind,
    a: &[f32],
    b: &[f32],
) -> Result<(), TestCaseError> {
    let buf = |name: &str| Buffer::new(name, t, vec![Expr::from(N)]);
    let (ab, bb, cb) = (buf("A"), buf("B"), buf("C"));
    let i = Var::new("i", DataType::i64());
    let iv = Expr::Var(i.clone());
    let value = p.lower(&ab.load(vec![iv.clone()]), &bb.load(vec![iv.clone()]), t);
    let f = PrimFunc::new(
        "f",
        vec![
            Param::Buffer(ab),
            Param::Buffer(bb),
            Param::Buffer(cb.clone()),
        ],
        Stmt::For {
            var: i,
            min: Expr::from(0i64),
            extent: Expr::from(N),
            kind,
            body: Box::new(cb.store(vec![iv], value)),
        },
    );
    let host = |v: &[f32]| -> HostBuffer {
        if t == DataType::f32() {
            HostBuffer::from_slice(&[N], v)
        } else {
            HostBuffer::from_slice(&[N], &v.iter().map(|x| f64::from(*x)).collect::<Vec<_>>())
        }
    };
    let mut iargs = vec![
        InterpArg::Buffer(host(a)),
        InterpArg::Buffer(host(b)),
        InterpArg::Buffer(HostBuffer::zeros(t, &[N])),
    ];
    run(&f, &mut iargs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let target = kiln::target::Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap();
    let opts = CodegenOptions::from_target(&target).unwrap().resolved();
    prop_assert!(opts.fast_math.contains("contract"), "{}", opts.fast_math);
    let module = IRModule::from_functions(vec![f.clone()]);
    let m = LlvmModule::jit_with(&module, &opts, Tiering::Off)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut bufs = vec![host(a), host(b), HostBuffer::zeros(t, &[N])];
    call_f(&m, &mut bufs).map_err(TestCaseError::fail)?;
    let InterpArg::Buffer(want) = &iargs[2] else {
        unreachable!()
    };
    let eps = if t == DataType::f32() {
        f64::from(f32::EPSILON) / 2.0
    } else {
        f64::EPSILON / 2.0
    };
    let bound = 2.0 * f64::from(p.ops().max(1)) * eps;
    for k in 0..N as usize {
        let (g, w) = (
            bufs[2].get(k).unwrap().as_f64(),
            want.get(k).unwrap().as_f64(),
        );
        prop_assert!(
            (g - w).abs() <= bound * w.abs(),
            "element {k}: compiled {g:e}, interpreted {w:e}, relative {:e} > {bound:e}\n{f}",
            (g - w).abs() / w.abs()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn contracted_code_agrees_with_the_interpreter_within_the_stated_bound(
        p in poly(),
        f64_type in any::<bool>(),
        kind in kinds(),
        a in proptest::collection::vec(0.5f32..2.0, N as usize),
        b in proptest::collection::vec(0.5f32..2.0, N as usize),
    ) {
        let t = if f64_type { DataType::f64() } else { DataType::f32() };
        check_contracted(&p, t, kind, &a, &b)?;
    }
}

/// `min`/`max` with a constant operand (relu, clip) compile to one compare and select; they
/// must still follow the IR's rules bit for bit: NaN propagates, `max(-0, +0) = +0`,
/// `min(-0, +0) = -0`, for either operand order, in scalar and vectorized loops, f32 and f64.
#[test]
fn min_and_max_with_a_constant_keep_nan_and_signed_zero_rules() {
    let specials = [
        0.0,
        -0.0,
        1.5,
        -2.0,
        1e-40,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let mut xs: Vec<f64> = specials.to_vec();
    while xs.len() < N as usize {
        xs.push(xs.len() as f64 * 0.37 - 5.0);
    }
    for t in [DataType::f32(), DataType::f64()] {
        for op in [kiln::ir::BinOp::Min, kiln::ir::BinOp::Max] {
            for &c in &specials[..7] {
                for const_first in [false, true] {
                    for kind in [ForKind::Serial, ForKind::Vectorized] {
                        let a = Buffer::new("A", t, vec![Expr::from(N)]);
                        let cbuf = Buffer::new("C", t, vec![Expr::from(N)]);
                        let i = Var::new("i", DataType::i64());
                        let x = a.load(vec![Expr::Var(i.clone())]);
                        let k = kiln::ir::builder::constant(t, c);
                        let (l, r) = if const_first { (k, x) } else { (x, k) };
                        let f = PrimFunc::new(
                            "f",
                            vec![Param::Buffer(a), Param::Buffer(cbuf.clone())],
                            Stmt::For {
                                var: i.clone(),
                                min: Expr::from(0i64),
                                extent: Expr::from(N),
                                kind,
                                body: Box::new(
                                    cbuf.store(vec![Expr::Var(i)], Expr::binary(op, l, r)),
                                ),
                            },
                        );
                        let host = |v: &[f64]| -> HostBuffer {
                            if t == DataType::f32() {
                                let v: Vec<f32> = v.iter().map(|x| *x as f32).collect();
                                HostBuffer::from_slice(&[N], &v)
                            } else {
                                HostBuffer::from_slice(&[N], v)
                            }
                        };
                        let mut iargs = vec![
                            InterpArg::Buffer(host(&xs)),
                            InterpArg::Buffer(HostBuffer::zeros(t, &[N])),
                        ];
                        run(&f, &mut iargs).unwrap();
                        let InterpArg::Buffer(want) = &iargs[1] else {
                            unreachable!()
                        };
                        let module = IRModule::from_functions(vec![f.clone()]);
                        let m =
                            LlvmModule::jit_with(&module, &CodegenOptions::host(), Tiering::Off)
                                .unwrap();
                        let mut bufs = [host(&xs), HostBuffer::zeros(t, &[N])];
                        call_f(&m, &mut bufs).unwrap();
                        for (j, x) in xs.iter().enumerate() {
                            let (g, w) = (
                                bufs[1].get(j).unwrap().as_f64(),
                                want.get(j).unwrap().as_f64(),
                            );
                            assert!(
                                (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits(),
                                "{t} {op:?}({}) with x = {x:?}, c = {c:?} ({kind:?}): compiled {g:?}, \
                                 interpreter {w:?}",
                                if const_first { "c, x" } else { "x, c" }
                            );
                        }
                    }
                }
            }
        }
    }
}

/// `min`/`max` of two loaded values, every pair of special values (NaN of either sign, ±0,
/// ±inf, a subnormal, normal values, equal operands), in scalar loops and in loops vectorized
/// by the emitter (8, 16 and 32 lanes: one, two and four ymm registers), f32 and f64: the
/// compiled result matches the interpreter bit for bit (any NaN for NaN). The emitter writes
/// them as two compare-selects, the AND (max) or OR (min) of their bits, and a NaN select.
#[test]
fn min_and_max_of_two_values_keep_nan_and_signed_zero_rules() {
    let specials = [
        0.0,
        -0.0,
        1.5,
        -2.0,
        1.5,
        1e-40,
        -1e-40,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
    ];
    let pairs: Vec<(f64, f64)> = specials
        .iter()
        .flat_map(|&x| specials.iter().map(move |&y| (x, y)))
        .collect();
    let n = (pairs.len() as i64 + 31) / 32 * 32;
    let mut xs: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let mut ys: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    xs.resize(n as usize, 0.25);
    ys.resize(n as usize, -0.25);
    for t in [DataType::f32(), DataType::f64()] {
        let host = |v: &[f64]| -> HostBuffer {
            if t == DataType::f32() {
                let v: Vec<f32> = v.iter().map(|x| *x as f32).collect();
                HostBuffer::from_slice(&[n], &v)
            } else {
                HostBuffer::from_slice(&[n], v)
            }
        };
        for op in [kiln::ir::BinOp::Min, kiln::ir::BinOp::Max] {
            for lanes in [0, 8, 16, 32] {
                let a = Buffer::new("A", t, vec![Expr::from(n)]);
                let b = Buffer::new("B", t, vec![Expr::from(n)]);
                let c = Buffer::new("C", t, vec![Expr::from(n)]);
                let f = PrimFunc::new(
                    "f",
                    vec![
                        Param::Buffer(a.clone()),
                        Param::Buffer(b.clone()),
                        Param::Buffer(c.clone()),
                    ],
                    kiln::ir::builder::for_range("i", Expr::from(n), ForKind::Serial, |i| {
                        let x = a.load(vec![i.clone()]);
                        let y = b.load(vec![i.clone()]);
                        c.store(vec![i], Expr::binary(op, x, y))
                    }),
                )
                .with_noalias(true);
                let f = if lanes == 0 {
                    f
                } else {
                    let mut s = kiln::schedule::Schedule::new(f);
                    let (_, inner) = s.split("i", lanes).unwrap();
                    s.vectorize(&inner).unwrap();
                    s.finish().unwrap()
                };
                let mut iargs = vec![
                    InterpArg::Buffer(host(&xs)),
                    InterpArg::Buffer(host(&ys)),
                    InterpArg::Buffer(HostBuffer::zeros(t, &[n])),
                ];
                run(&f, &mut iargs).unwrap();
                let InterpArg::Buffer(want) = &iargs[2] else {
                    unreachable!()
                };
                let module = IRModule::from_functions(vec![f.clone()]);
                let m =
                    LlvmModule::jit_with(&module, &CodegenOptions::host(), Tiering::Off).unwrap();
                let mut bufs = [host(&xs), host(&ys), HostBuffer::zeros(t, &[n])];
                call_f(&m, &mut bufs).unwrap();
                for (j, (x, y)) in pairs.iter().enumerate() {
                    let (g, w) = (
                        bufs[2].get(j).unwrap().as_f64(),
                        want.get(j).unwrap().as_f64(),
                    );
                    assert!(
                        (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits(),
                        "{t} {op:?}({x:?}, {y:?}), {lanes} lanes: compiled {g:?}, interpreter {w:?}"
                    );
                }
            }
        }
    }
}
