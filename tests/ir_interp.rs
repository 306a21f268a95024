//! The reference interpreter: the kernel set against plain Rust loops, and the IR's exact
//! semantics (wrapping, floor division, NaN, f16/bf16 rounding, casts, errors).

use half::{bf16, f16};
use kiln::ir::builder::*;
use kiln::ir::interp::{run, HostBuffer, InterpArg, Scalar};
use kiln::ir::*;

/// Deterministic pseudo-random floats in [-1, 1).
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn buffer(shape: &[i64], values: &[f32]) -> InterpArg {
    InterpArg::Buffer(HostBuffer::from_slice(shape, values))
}

fn zeros(shape: &[i64]) -> InterpArg {
    InterpArg::Buffer(HostBuffer::zeros(DataType::f32(), shape))
}

#[test]
fn vadd_adds_with_a_symbolic_length() {
    let (a, b) = (data(37, 1), data(37, 2));
    let mut args = [buffer(&[37], &a), buffer(&[37], &b), zeros(&[37])];
    assert_eq!(run(&kernels::vadd(), &mut args).unwrap(), None);
    let c = args[2].to_vec::<f32>().unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(c, want);
}

#[test]
fn vadd_rejects_mismatched_symbolic_shapes() {
    let mut args = [
        buffer(&[3], &[1.0; 3]),
        buffer(&[4], &[1.0; 4]),
        zeros(&[3]),
    ];
    let err = run(&kernels::vadd(), &mut args).unwrap_err().to_string();
    assert_eq!(
        err,
        "interpreting `vadd`: argument #1 `B` shape[0]: `n` is 3 from an earlier argument, got 4"
    );
    // The buffers are handed back unchanged after an error.
    assert_eq!(args[0].to_vec::<f32>().unwrap(), vec![1.0; 3]);
}

#[test]
fn matmul_matches_a_plain_loop() {
    let (m, n, k) = (5usize, 7usize, 3usize);
    let (a, b) = (data(m * k, 3), data(k * n, 4));
    let mut args = [
        buffer(&[m as i64, k as i64], &a),
        buffer(&[k as i64, n as i64], &b),
        zeros(&[m as i64, n as i64]),
    ];
    run(
        &kernels::matmul_sized(m as i64, n as i64, k as i64),
        &mut args,
    )
    .unwrap();
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0f32;
            for r in 0..k {
                acc += a[i * k + r] * b[r * n + j];
            }
            want[i * n + j] = acc;
        }
    }
    assert_eq!(args[2].to_vec::<f32>().unwrap(), want);
}

#[test]
fn rowsum_matches_hand_computed_values() {
    let a = [1.0f32, 2.0, 3.0, 4.0, -1.0, 0.5, 0.25, 0.25];
    let mut args = [buffer(&[2, 4], &a), zeros(&[2])];
    run(&kernels::rowsum_sized(2, 4), &mut args).unwrap();
    assert_eq!(args[1].to_vec::<f32>().unwrap(), vec![10.0, 0.0]);
}

#[test]
fn softmax_matches_a_plain_loop_and_sums_to_one() {
    let (rows, cols) = (4usize, 9usize);
    let mut a = data(rows * cols, 5);
    a[3] = 80.0; // large values must not overflow: the max is subtracted
    let mut args = [
        buffer(&[rows as i64, cols as i64], &a),
        zeros(&[rows as i64, cols as i64]),
    ];
    run(&kernels::softmax_sized(rows as i64, cols as i64), &mut args).unwrap();
    let got = args[1].to_vec::<f32>().unwrap();
    for r in 0..rows {
        let row = &a[r * cols..(r + 1) * cols];
        let mx = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        let e: Vec<f32> = row.iter().map(|v| (v - mx).exp()).collect();
        let mut sum = 0f32;
        for v in &e {
            sum += v;
        }
        for c in 0..cols {
            assert_eq!(got[r * cols + c], e[c] / sum, "row {r} col {c}");
        }
        let total: f32 = got[r * cols..(r + 1) * cols].iter().sum();
        assert!((total - 1.0).abs() < 1e-5);
    }
}

#[test]
fn conv2d_matches_a_plain_loop() {
    let (n, c, h, w, k, r, s) = (2usize, 3usize, 6usize, 5usize, 4usize, 3usize, 2usize);
    let (oh, ow) = (h - r + 1, w - s + 1);
    let input = data(n * c * h * w, 6);
    let weight = data(k * c * r * s, 7);
    let mut args = [
        buffer(&[n, c, h, w].map(|v| v as i64), &input),
        buffer(&[k, c, r, s].map(|v| v as i64), &weight),
        zeros(&[n, k, oh, ow].map(|v| v as i64)),
    ];
    run(
        &kernels::conv2d(
            n as i64, c as i64, h as i64, w as i64, k as i64, r as i64, s as i64,
        ),
        &mut args,
    )
    .unwrap();
    let got = args[2].to_vec::<f32>().unwrap();
    for b in 0..n {
        for o in 0..k {
            for y in 0..oh {
                for x in 0..ow {
                    let mut acc = 0f32;
                    for ic in 0..c {
                        for dy in 0..r {
                            for dx in 0..s {
                                acc += input[((b * c + ic) * h + y + dy) * w + x + dx]
                                    * weight[((o * c + ic) * r + dy) * s + dx];
                            }
                        }
                    }
                    assert_eq!(got[((b * k + o) * oh + y) * ow + x], acc);
                }
            }
        }
    }
}

/// Evaluates `f(x)` for a scalar parameter `x` of type `t` by returning it from a function.
fn eval1(t: DataType, arg: Scalar, f: impl FnOnce(Expr) -> Expr) -> Result<Scalar, IrError> {
    let x = Var::new("x", t);
    let e = f(Expr::from(&x));
    let ret = e.dtype();
    let func = PrimFunc::new("e", vec![Param::Scalar(x)], Stmt::Return(e)).with_ret_type(ret);
    run(&func, &mut [InterpArg::Scalar(arg)]).map(|r| r.expect("a return value"))
}

fn i32v(v: i32) -> Scalar {
    Scalar::i32(v)
}

#[test]
fn integer_arithmetic_wraps() {
    assert_eq!(
        eval1(DataType::i32(), i32v(i32::MAX), |x| x + 1).unwrap(),
        i32v(i32::MIN)
    );
    assert_eq!(
        eval1(DataType::i32(), i32v(65536), |x| x.clone() * x).unwrap(),
        i32v(0)
    );
    assert_eq!(
        eval1(DataType::i32(), i32v(i32::MIN), |x| x / -1).unwrap(),
        i32v(i32::MIN)
    );
    assert_eq!(
        eval1(DataType::i32(), i32v(i32::MIN), |x| Expr::binary(
            BinOp::Mod,
            x,
            -1i32
        ))
        .unwrap(),
        i32v(0)
    );
    assert_eq!(
        eval1(DataType::i32(), i32v(i32::MIN), abs).unwrap(),
        i32v(i32::MIN)
    );
    let u8t = DataType::u8();
    assert_eq!(
        eval1(u8t, Scalar::UInt(u8t, 3), |x| x - 5).unwrap(),
        Scalar::UInt(u8t, 254)
    );
    let i8t = DataType::i8();
    assert_eq!(
        eval1(i8t, Scalar::Int(i8t, 127), |x| x + 1).unwrap(),
        Scalar::Int(i8t, -128)
    );
    let u64t = DataType::u64();
    assert_eq!(
        eval1(u64t, Scalar::UInt(u64t, u64::MAX), |x| x.clone() / 2
            + x.lt(int(u64t, 1)).cast(u64t))
        .unwrap(),
        Scalar::UInt(u64t, u64::MAX / 2)
    );
}

#[test]
fn division_truncates_and_floor_division_rounds_down() {
    let cases = [
        (-7, 2, -3, -1, -4, 1),
        (7, -2, -3, 1, -4, -1),
        (-7, -2, 3, -1, 3, -1),
        (7, 2, 3, 1, 3, 1),
    ];
    for (a, b, div, rem, fdiv, fmod) in cases {
        let r = |op: BinOp| eval1(DataType::i32(), i32v(a), |x| Expr::binary(op, x, b)).unwrap();
        assert_eq!(
            [
                r(BinOp::Div),
                r(BinOp::Mod),
                r(BinOp::FloorDiv),
                r(BinOp::FloorMod)
            ],
            [div, rem, fdiv, fmod].map(i32v),
            "{a} and {b}"
        );
    }
    // Floats: div is IEEE, mod is fmod, floordiv/floormod round toward -inf.
    let f = |op: BinOp, a: f32, b: f32| {
        eval1(DataType::f32(), Scalar::f32(a), |x| Expr::binary(op, x, b)).unwrap()
    };
    assert_eq!(f(BinOp::Mod, -7.5, 2.0), Scalar::f32(-1.5));
    assert_eq!(f(BinOp::FloorDiv, -7.5, 2.0), Scalar::f32(-4.0));
    assert_eq!(f(BinOp::FloorMod, -7.5, 2.0), Scalar::f32(0.5));
    assert_eq!(f(BinOp::Div, 1.0, 0.0), Scalar::f32(f32::INFINITY));
}

#[test]
fn integer_division_by_zero_is_an_error() {
    for op in [BinOp::Div, BinOp::Mod, BinOp::FloorDiv, BinOp::FloorMod] {
        let err = eval1(DataType::i32(), i32v(0), |x| Expr::binary(op, 1i32, x))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "interpreting `e`: integer division by zero (int32 `{}`)",
                op.name()
            )
        );
    }
}

#[test]
fn min_and_max_propagate_nan_and_order_signed_zeros() {
    let f32t = DataType::f32();
    let is_nan = |s: Scalar| s.as_f64().is_nan();
    assert!(is_nan(
        eval1(f32t, Scalar::f32(f32::NAN), |x| x.min(1.0f32)).unwrap()
    ));
    assert!(is_nan(
        eval1(f32t, Scalar::f32(1.0), |x| Expr::from(f32::NAN).max(x)).unwrap()
    ));
    let neg_zero_first = eval1(f32t, Scalar::f32(0.0), |x| x.min(-0.0f32)).unwrap();
    assert!(neg_zero_first.as_f64().is_sign_negative());
    let pos_zero = eval1(f32t, Scalar::f32(-0.0), |x| x.max(0.0f32)).unwrap();
    assert!(pos_zero.as_f64().is_sign_positive());
    // Comparisons with NaN are false, except `!=`.
    assert_eq!(
        eval1(f32t, Scalar::f32(f32::NAN), |x| x.clone().eq_(x)).unwrap(),
        Scalar::Bool(false)
    );
    assert_eq!(
        eval1(f32t, Scalar::f32(f32::NAN), |x| x.clone().ne_(x)).unwrap(),
        Scalar::Bool(true)
    );
    assert!(is_nan(
        eval1(f32t, Scalar::f32(f32::NAN), |x| exp(x) + 1.0f32).unwrap()
    ));
}

#[test]
fn half_precision_rounds_after_every_operation() {
    let f16t = DataType::f16();
    // 2048 + 1 is not representable in float16 (11-bit significand): ties to even gives 2048.
    let r = eval1(f16t, Scalar::from_float(f16t, 2048.0), |x| x + 1.0f32).unwrap();
    assert_eq!(r, Scalar::Float(f16t, 2048.0));
    // (2048 + 1) + 1 rounds twice; 2048 + (1 + 1) does not.
    let r = eval1(f16t, Scalar::from_float(f16t, 2048.0), |x| {
        x + 1.0f32 + 1.0f32
    })
    .unwrap();
    assert_eq!(r.as_f64(), 2048.0);
    let r = eval1(f16t, Scalar::from_float(f16t, 1.0), |x| {
        Expr::from(2048.0f32).cast(f16t) + (x.clone() + x)
    })
    .unwrap();
    assert_eq!(r.as_f64(), 2050.0);
    assert_eq!(
        eval1(f16t, Scalar::from_float(f16t, 60000.0), |x| x * 2.0f32)
            .unwrap()
            .as_f64(),
        f64::INFINITY
    );
    let bf = DataType::bf16();
    let third = eval1(bf, Scalar::from_float(bf, 1.0), |x| x / 3.0f32).unwrap();
    assert_eq!(third.as_f64(), bf16::from_f32(1.0 / 3.0).to_f64());
    // Constants are rounded to their type when evaluated.
    let c = eval1(f16t, Scalar::from_float(f16t, 0.0), |x| {
        x + Expr::FloatImm {
            dtype: f16t,
            value: 0.1,
        }
    })
    .unwrap();
    assert_eq!(c.as_f64(), f16::from_f64(0.1).to_f64());
    // Buffers of f16 store the bits.
    let h = HostBuffer::from_slice(&[2], &[f16::from_f32(1.5), f16::from_f32(-2.0)]);
    assert_eq!(h.get(1), Some(Scalar::Float(f16t, -2.0)));
}

#[test]
fn casts_follow_the_documented_rules() {
    let f32t = DataType::f32();
    let to_i32 = |v: f32| eval1(f32t, Scalar::f32(v), |x| x.cast(DataType::i32())).unwrap();
    assert_eq!(to_i32(-2.7), i32v(-2));
    assert_eq!(to_i32(1e20), i32v(i32::MAX));
    assert_eq!(to_i32(-1e20), i32v(i32::MIN));
    assert_eq!(to_i32(f32::NAN), i32v(0));
    let u8t = DataType::u8();
    assert_eq!(
        eval1(f32t, Scalar::f32(-5.0), |x| x.cast(u8t)).unwrap(),
        Scalar::UInt(u8t, 0)
    );
    assert_eq!(
        eval1(DataType::i32(), i32v(300), |x| x.cast(u8t)).unwrap(),
        Scalar::UInt(u8t, 44)
    );
    assert_eq!(
        eval1(DataType::i32(), i32v(-1), |x| x.cast(DataType::i64())).unwrap(),
        Scalar::i64(-1)
    );
    assert_eq!(
        eval1(DataType::i32(), i32v(2), |x| x.cast(DataType::bool())).unwrap(),
        Scalar::Bool(true)
    );
    assert_eq!(
        eval1(f32t, Scalar::f32(f32::NAN), |x| x.cast(DataType::bool())).unwrap(),
        Scalar::Bool(true)
    );
    assert_eq!(
        eval1(DataType::i64(), Scalar::i64((1 << 24) + 1), |x| x
            .cast(f32t))
        .unwrap(),
        Scalar::f32(16777216.0)
    );
    assert_eq!(
        eval1(DataType::bool(), Scalar::Bool(true), |x| x.cast(f32t)).unwrap(),
        Scalar::f32(1.0)
    );
}

#[test]
fn intrinsics_compute_in_the_argument_type() {
    let f32t = DataType::f32();
    let f = |v: f32, g: fn(Expr) -> Expr| eval1(f32t, Scalar::f32(v), g).unwrap().as_f64() as f32;
    assert_eq!(f(1.0, exp), 1.0f32.exp());
    assert_eq!(f(2.0, log), 2.0f32.ln());
    assert_eq!(f(2.0, sqrt), 2.0f32.sqrt());
    assert_eq!(f(4.0, rsqrt), 0.5);
    assert_eq!(f(0.5, tanh), 0.5f32.tanh());
    assert_eq!(f(0.0, sigmoid), 0.5);
    assert_eq!(f(-1.5, abs), 1.5);
    assert_eq!(f(-1.5, floor), -2.0);
    assert_eq!(f(-1.5, ceil), -1.0);
    assert_eq!(f(2.5, round), 2.0);
    assert_eq!(f(3.5, round), 4.0);
    assert_eq!(f(1.0, erf), 0.842_700_8);
    assert_eq!(
        eval1(f32t, Scalar::f32(2.0), |x| pow(x, 10.0f32)).unwrap(),
        Scalar::f32(1024.0)
    );
    let tiny = f32::EPSILON;
    let fused = eval1(f32t, Scalar::f32(1.0 + tiny), |x| {
        fma(x.clone(), x, Expr::from(-1.0f32 - 2.0 * tiny))
    })
    .unwrap();
    assert_eq!(fused.as_f64() as f32, tiny * tiny);
    let f64t = DataType::f64();
    assert_eq!(
        eval1(f64t, Scalar::f64(1.0), exp).unwrap(),
        Scalar::f64(1f64.exp())
    );
}

#[test]
fn control_flow_let_select_and_assert() {
    let i32t = DataType::i32();
    // sum of i for i in [0, x) with odd i doubled, via let, if and a local accumulator.
    let x = Var::new("x", i32t);
    let acc = Buffer::temp("acc", i32t, vec![Expr::from(1i64)], StorageScope::Local);
    let z = [Expr::from(0i64)];
    let body = acc.allocate(Stmt::Seq(vec![
        Stmt::Assert {
            cond: Expr::from(&x).ge(0),
            message: "x must be non-negative".into(),
        },
        for_range("i", Expr::from(&x), ForKind::Serial, |i| {
            let_stmt("odd", i.clone().floormod(2).eq_(1), |odd| {
                acc.store(&z, acc.load(&z) + select(odd, i.clone() * 2, i))
            })
        }),
        if_then_else(acc.load(&z).gt(100), Stmt::Return(Expr::from(-1i32)), None),
        Stmt::Return(acc.load(&z)),
    ]));
    let f = PrimFunc::new("g", vec![Param::Scalar(x)], body).with_ret_type(i32t);
    let call = |v: i32| run(&f, &mut [InterpArg::Scalar(i32v(v))]);
    assert_eq!(call(5).unwrap(), Some(i32v(2 + 2 + 6 + 4)));
    assert_eq!(call(0).unwrap(), Some(i32v(0)));
    assert_eq!(call(20).unwrap(), Some(i32v(-1)));
    assert_eq!(
        call(-1).unwrap_err().to_string(),
        "interpreting `g`: assertion failed: x must be non-negative"
    );
}

#[test]
fn out_of_bounds_accesses_are_errors() {
    let a = Buffer::new(
        "A",
        DataType::f32(),
        vec![Expr::from(2i64), Expr::from(3i64)],
    );
    let body = compute(&a, |ix| a.load(&[ix[0].clone(), ix[1].clone() + 1]));
    let f = PrimFunc::new("shift", vec![Param::Buffer(a)], body);
    let err = run(&f, &mut [zeros(&[2, 3])]).unwrap_err().to_string();
    assert_eq!(
        err,
        "interpreting `shift`: index 3 out of bounds for dimension 1 of `A` (extent 3) in A[0, 3]"
    );
}

#[test]
fn arguments_are_checked() {
    let f = kernels::rowsum_sized(2, 2);
    let check = |mut args: Vec<InterpArg>, want: &str| {
        let err = run(&f, &mut args).unwrap_err().to_string();
        assert_eq!(err, format!("interpreting `rowsum`: {want}"));
    };
    check(vec![zeros(&[2, 2])], "expected 2 arguments, got 1");
    check(
        vec![zeros(&[2, 3]), zeros(&[2])],
        "argument #0 `A` shape[1]: expected 2, got 3",
    );
    check(
        vec![zeros(&[2, 2]), InterpArg::Scalar(i32v(1))],
        "argument #1 `B`: expected a buffer, got a scalar",
    );
    check(
        vec![
            zeros(&[2, 2]),
            InterpArg::Buffer(HostBuffer::zeros(DataType::f64(), &[2])),
        ],
        "argument #1 `B`: expected dtype float32, got float64",
    );
    check(
        vec![zeros(&[4]), zeros(&[2])],
        "argument #0 `A`: expected 2 dimensions, got 1",
    );
    let short = HostBuffer {
        data: vec![0; 12],
        ..HostBuffer::zeros(DataType::f32(), &[2, 2])
    };
    check(
        vec![InterpArg::Buffer(short), zeros(&[2])],
        "argument #0 `A`: needs 16 bytes for shape [2, 2], holds 12",
    );
    let strided = HostBuffer {
        strides: Some(vec![1, 2]),
        ..HostBuffer::zeros(DataType::f32(), &[2, 2])
    };
    check(
        vec![InterpArg::Buffer(strided), zeros(&[2])],
        "argument #0 `A`: expected a compact array, got strides [1, 2] for shape [2, 2]",
    );
}

#[test]
fn declared_strides_address_the_buffer() {
    // A[2, 2] with strides [1, s]: column-major when s == 2.
    let s = size_var("s");
    let a = Buffer::new(
        "A",
        DataType::f32(),
        vec![Expr::from(2i64), Expr::from(2i64)],
    )
    .with_strides(vec![Expr::from(1i64), Expr::from(&s)]);
    let b = Buffer::new(
        "B",
        DataType::f32(),
        vec![Expr::from(2i64), Expr::from(2i64)],
    );
    let f = PrimFunc::new(
        "copy",
        vec![Param::Buffer(a.clone()), Param::Buffer(b.clone())],
        compute(&b, |ix| a.load(ix)),
    );
    let col_major = HostBuffer {
        strides: Some(vec![1, 2]),
        ..HostBuffer::from_slice(&[2, 2], &[1.0f32, 3.0, 2.0, 4.0])
    };
    let mut args = [InterpArg::Buffer(col_major), zeros(&[2, 2])];
    run(&f, &mut args).unwrap();
    assert_eq!(args[1].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn a_missing_return_is_an_error() {
    let f =
        PrimFunc::new("r", vec![], Stmt::Evaluate(Expr::from(0i32))).with_ret_type(DataType::i32());
    assert_eq!(
        run(&f, &mut []).unwrap_err().to_string(),
        "interpreting `r`: the function returns int32 but ended without `return`"
    );
}

#[test]
fn ill_formed_functions_are_not_run() {
    let f = PrimFunc::new(
        "bad",
        vec![],
        Stmt::Evaluate(Expr::from(1i32) + Expr::from(1i64)),
    );
    assert!(matches!(run(&f, &mut []), Err(IrError::Verify { .. })));
}

#[test]
fn huge_allocations_are_refused() {
    let t = Buffer::temp(
        "T",
        DataType::f64(),
        vec![Expr::from(1i64 << 40)],
        StorageScope::Workspace,
    );
    let f = PrimFunc::new("big", vec![], t.allocate(Stmt::Evaluate(Expr::from(0i32))));
    let err = run(&f, &mut []).unwrap_err().to_string();
    assert!(err.contains("exceeds the interpreter's limit"), "{err}");
}

#[test]
fn absurd_shapes_and_strides_are_errors_not_overflows() {
    let f = kernels::conv2d(1, 1, 3, 3, 1, 1, 1);
    let huge = HostBuffer {
        shape: vec![1, 1, 3, 3],
        strides: Some(vec![i64::MAX, i64::MAX, i64::MAX, 1]),
        ..HostBuffer::zeros(DataType::f32(), &[1, 1, 3, 3])
    };
    let mut args = [
        InterpArg::Buffer(huge),
        zeros(&[1, 1, 1, 1]),
        zeros(&[1, 1, 3, 3]),
    ];
    let err = run(&f, &mut args).unwrap_err().to_string();
    assert!(
        err.contains("argument #0 `I`: expected a compact array"),
        "{err}"
    );
    let v = kernels::vadd();
    let big = HostBuffer {
        shape: vec![i64::MAX],
        ..HostBuffer::zeros(DataType::f32(), &[0])
    };
    let mut args = [
        InterpArg::Buffer(big.clone()),
        InterpArg::Buffer(big.clone()),
        InterpArg::Buffer(big),
    ];
    let err = run(&v, &mut args).unwrap_err().to_string();
    assert!(
        err.contains("needs 36893488147419103228 bytes for shape [9223372036854775807], holds 0"),
        "{err}"
    );
}

#[test]
fn free_uses_list_what_a_parallel_body_captures() {
    // softmax: the row loop body uses A, B and nothing else (maxv/sum are allocated inside).
    let f = kernels::softmax_sized(4, 8);
    let Stmt::For { var, body, .. } = &f.body else {
        panic!("{}", f.body)
    };
    let uses = body.free_uses();
    let names: Vec<&str> = uses.buffers.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["A", "B"]);
    assert_eq!(uses.vars, vec![var.clone()]);
    // A symbolic shape comes with its buffer; let-bound and loop variables inside do not.
    let n = size_var("n");
    let x = Var::new("x", DataType::f32());
    let a = Buffer::new("A", DataType::f32(), vec![Expr::from(&n)]);
    let s = for_range("i", Expr::from(&n), ForKind::Parallel, |i| {
        let_stmt("t", a.load([i.clone()]) * Expr::from(&x), |t| {
            a.store([i], t)
        })
    });
    let uses = s.free_uses();
    assert_eq!(uses.vars, vec![n.clone(), x]);
    assert_eq!(uses.buffers, vec![a]);
}
