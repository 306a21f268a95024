//! One test per verifier rule: each builds a function with exactly that defect and checks the
//! message and the node path.

use kiln::ir::builder::*;
use kiln::ir::*;

fn i64c(v: i64) -> Expr {
    Expr::from(v)
}

fn buf(name: &str, dtype: DataType, shape: &[i64]) -> Buffer {
    Buffer::new(name, dtype, shape.iter().map(|d| i64c(*d)).collect())
}

/// A function with one float32 buffer `A[4]`, an int32 scalar `x`, and `body(A, x)`.
fn func_with(body: impl FnOnce(&Buffer, &Expr) -> Stmt) -> PrimFunc {
    let a = buf("A", DataType::f32(), &[4]);
    let x = Var::new("x", DataType::i32());
    let body = body(&a, &Expr::from(&x));
    PrimFunc::new("f", vec![Param::Buffer(a), Param::Scalar(x)], body)
}

/// Verifies a one-function module and expects a single error at `path` containing `message`.
fn expect_error(f: PrimFunc, path: &str, message: &str) {
    let name = f.name.clone();
    let m = IRModule::from_functions(vec![f]);
    let errors = m.verify_all();
    assert_eq!(
        errors.len(),
        1,
        "expected exactly one error, got {errors:#?}\n{m}"
    );
    match &errors[0] {
        IrError::Verify {
            func,
            path: p,
            message: msg,
        } => {
            assert_eq!(func, &name);
            assert_eq!(p, &format!("$.functions[0]{path}"), "message: {msg}");
            assert!(msg.contains(message), "expected `{message}` in `{msg}`");
        }
        other => panic!("{other:?}"),
    }
    // `verify` returns the same (first) error.
    assert_eq!(m.verify().unwrap_err(), errors[0]);
}

fn eval(e: Expr) -> Stmt {
    Stmt::Evaluate(e)
}

macro_rules! case {
    ($name:ident, $func:expr, $path:expr, $msg:expr) => {
        #[test]
        fn $name() {
            expect_error($func, $path, $msg);
        }
    };
}

#[test]
fn well_formed_kernels_have_no_errors() {
    for f in [
        kernels::vadd(),
        kernels::matmul(),
        kernels::rowsum(),
        kernels::softmax(),
        kernels::conv2d(1, 3, 8, 8, 4, 3, 3),
    ] {
        assert_eq!(IRModule::from_functions(vec![f]).verify_all(), vec![]);
    }
}

// ---- types
case!(
    binary_operands_must_have_one_type,
    func_with(|_, x| eval(x + i64c(1))),
    ".body.value",
    "operands of `add` have different types: int32 and int64"
);
case!(
    arithmetic_needs_numbers,
    func_with(|_, _| eval(Expr::from(true) + Expr::from(false))),
    ".body.value",
    "`add` needs numeric operands, found bool"
);
case!(
    logical_ops_need_bools,
    func_with(|_, x| eval(x.clone().and(x.clone()))),
    ".body.value",
    "`and` needs bool operands, found int32"
);
case!(
    not_needs_a_bool,
    func_with(|_, x| eval(!x.clone())),
    ".body.value",
    "`not` needs a bool, found int32"
);
case!(
    select_condition_must_be_bool,
    func_with(|_, x| eval(select(x.clone(), 1i32, 2i32))),
    ".body.value.args[0]",
    "select condition must be bool, found int32"
);
case!(
    select_arms_must_agree,
    func_with(|_, x| eval(select(x.clone().lt(0), 1i32, 2i64))),
    ".body.value",
    "select arms have different types: int32 and int64"
);
case!(
    intrinsics_need_floats,
    func_with(|_, x| eval(exp(x.clone()))),
    ".body.value",
    "`exp` needs a float, found int32"
);
case!(
    intrinsic_arguments_share_a_type,
    func_with(|_, _| eval(pow(1.0f32, 2.0f64))),
    ".body.value",
    "arguments of `pow` have different types: float32, float64"
);
case!(
    intrinsic_arity_is_checked,
    func_with(|_, _| eval(call(Intrinsic::Fma, vec![Expr::from(1.0f32)]))),
    ".body.value",
    "`fma` takes 3 argument(s), found 1"
);
case!(
    constants_must_fit_their_type,
    func_with(|_, _| eval(Expr::IntImm {
        dtype: DataType::i8(),
        value: 200
    })),
    ".body.value",
    "constant 200 does not fit in int8"
);
case!(
    integer_constants_need_an_integer_type,
    func_with(|_, _| eval(Expr::IntImm {
        dtype: DataType::f32(),
        value: 1
    })),
    ".body.value",
    "integer constant 1 has non-integer type float32"
);
case!(
    float_constants_need_a_float_type,
    func_with(|_, _| eval(Expr::FloatImm {
        dtype: DataType::i32(),
        value: 1.5
    })),
    ".body.value",
    "float constant 1.5 has non-float type int32"
);
case!(
    vector_types_are_rejected,
    func_with(|_, _| eval(Expr::FloatImm {
        dtype: DataType::f32().with_lanes(4),
        value: 1.0
    })),
    ".body.value",
    "vector type float32x4"
);
case!(
    invalid_types_are_rejected,
    func_with(|_, x| eval(x.clone().cast(DataType::new(TypeCode::Float, 8, 1)))),
    ".body.value",
    "cast target has an invalid type (code 2, 8 bits)"
);
case!(
    casts_to_handle_are_rejected,
    func_with(|_, x| eval(x.clone().cast(DataType::handle()))),
    ".body.value",
    "cast target has type handle"
);
case!(
    only_float_to_int_casts_may_skip_saturation,
    func_with(|_, x| eval(Expr::Cast {
        dtype: DataType::i8(),
        value: Box::new(x.clone()),
        saturate: false,
    })),
    ".body.value.saturate",
    "`\"saturate\": false` applies to a float → integer cast; this one converts int32 to int8"
);
case!(
    an_unsaturated_cast_to_a_float_is_rejected,
    func_with(|a, _| eval(Expr::Cast {
        dtype: DataType::f64(),
        value: Box::new(a.load(&[i64c(0)])),
        saturate: false,
    })),
    ".body.value.saturate",
    "converts float32 to float64"
);
case!(
    stores_must_match_the_buffer_type,
    func_with(|a, _| a.store(&[i64c(0)], 1.0f64)),
    ".body.value",
    "storing a float64 value into buffer `A` of float32"
);
case!(
    let_values_must_match_the_variable,
    func_with(|_, x| {
        let v = Var::new("v", DataType::f32());
        Stmt::Let {
            var: v,
            value: x.clone(),
            body: Box::new(eval(Expr::from(0i32))),
        }
    }),
    ".body.var",
    "`let v: float32` is given a int32 value"
);
case!(
    let_expression_values_must_match_the_variable,
    func_with(|_, x| {
        let v = Var::new("v", DataType::i64());
        eval(Expr::Let {
            var: v.clone(),
            value: Box::new(x.clone()),
            body: Box::new(Expr::from(&v)),
        })
    }),
    ".body.value.var",
    "`let v: int64` is given a int32 value"
);
case!(
    if_conditions_must_be_bool,
    func_with(|_, x| if_then_else(x.clone(), eval(Expr::from(0i32)), None)),
    ".body.cond",
    "if condition must be bool, found int32"
);
case!(
    assert_conditions_must_be_bool,
    func_with(|_, x| Stmt::Assert {
        cond: x.clone(),
        message: "m".into()
    }),
    ".body.cond",
    "assert condition must be bool, found int32"
);
case!(
    while_conditions_must_be_bool,
    func_with(|_, x| Stmt::While {
        cond: x.clone(),
        body: Box::new(eval(Expr::from(0i32))),
    }),
    ".body.cond",
    "while condition must be bool, found int32"
);
case!(
    a_while_loop_is_not_vectorized,
    func_with(|_, x| Stmt::For {
        var: Var::new("i", DataType::i64()),
        min: i64c(0),
        extent: i64c(4),
        kind: ForKind::Vectorized,
        body: Box::new(Stmt::While {
            cond: x.clone().lt(0),
            body: Box::new(eval(Expr::from(0i32))),
        }),
    }),
    ".body.body",
    "a `while` loop inside a vectorized loop"
);

// ---- scoping
case!(
    variables_must_be_defined,
    func_with(|_, _| eval(Expr::from(&Var::new("y", DataType::i32())))),
    ".body.value",
    "undefined variable `y`"
);
case!(
    variables_are_not_visible_outside_their_scope,
    func_with(|a, _| {
        let i = Var::new("i", DataType::i64());
        let lp = Stmt::For {
            var: i.clone(),
            min: i64c(0),
            extent: i64c(4),
            kind: ForKind::Serial,
            body: Box::new(a.store(&[Expr::from(&i)], 0.0f32)),
        };
        Stmt::Seq(vec![lp, a.store(&[Expr::from(&i)], 1.0f32)])
    }),
    ".body.stmts[1].indices[0]",
    "variable `i` is used outside its scope"
);
case!(
    variables_are_bound_once,
    func_with(|a, _| {
        let i = Var::new("i", DataType::i64());
        let lp = |body| Stmt::For {
            var: i.clone(),
            min: i64c(0),
            extent: i64c(4),
            kind: ForKind::Serial,
            body: Box::new(body),
        };
        Stmt::Seq(vec![
            lp(a.store(&[Expr::from(&i)], 0.0f32)),
            lp(a.store(&[Expr::from(&i)], 1.0f32)),
        ])
    }),
    ".body.stmts[1]",
    "variable `i` (id"
);
case!(
    a_variable_keeps_its_type,
    func_with(|_, x| {
        let Expr::Var(v) = x else { unreachable!() };
        eval(Expr::Var(Var {
            dtype: DataType::i64(),
            ..v.clone()
        }))
    }),
    ".body.value",
    "variable `x` was bound as int32 but used as int64"
);
case!(
    data_pointers_are_not_values,
    func_with(|a, _| eval(Expr::from(&a.data))),
    ".body.value",
    "`A` is a buffer data pointer; read buffers with load"
);
case!(
    buffers_must_be_in_scope,
    func_with(|_, _| buf("Z", DataType::f32(), &[4]).store(&[i64c(0)], 0.0f32)),
    ".body",
    "buffer `Z` is not in scope here"
);
case!(
    allocations_are_scoped,
    func_with(|_, _| {
        let t = Buffer::temp("T", DataType::f32(), vec![i64c(4)], StorageScope::Local);
        Stmt::Seq(vec![
            t.allocate(t.store(&[i64c(0)], 0.0f32)),
            eval(t.load(&[i64c(0)])),
        ])
    }),
    ".body.stmts[1].value",
    "buffer `T` is not in scope here"
);
case!(
    buffer_uses_match_the_declaration,
    func_with(|a, _| {
        let other = Buffer {
            shape: vec![i64c(8)],
            ..a.clone()
        };
        other.store(&[i64c(0)], 0.0f32)
    }),
    ".body",
    "buffer `A` differs from its declaration"
);
case!(
    buffer_names_are_unique,
    func_with(|_, _| {
        let t = Buffer::temp("A", DataType::f32(), vec![i64c(4)], StorageScope::Local);
        t.allocate(t.store(&[i64c(0)], 0.0f32))
    }),
    ".body.buffer",
    "buffer name `A` is used twice in this function"
);
case!(
    buffers_are_declared_once,
    func_with(|_, _| {
        let t = Buffer::temp("T", DataType::f32(), vec![i64c(4)], StorageScope::Local);
        let t2 = Buffer {
            name: "T2".into(),
            ..t.clone()
        };
        t.allocate(t2.allocate(eval(Expr::from(0i32))))
    }),
    ".body.body.buffer",
    "buffer `T2` is declared twice (same data variable)"
);
case!(
    allocation_shapes_use_variables_in_scope,
    func_with(|_, _| {
        let t = Buffer::temp(
            "T",
            DataType::f32(),
            vec![Expr::from(&Var::new("m", DataType::i64()))],
            StorageScope::Local,
        );
        t.allocate(eval(Expr::from(0i32)))
    }),
    ".body.buffer.shape[0]",
    "undefined variable `m` in buffer shape"
);

// ---- buffers
case!(
    index_count_equals_rank,
    func_with(|a, _| eval(a.load(&[i64c(0), i64c(0)]))),
    ".body.value",
    "buffer `A` has rank 1 but is indexed with 2 indices"
);
case!(
    indices_are_integers,
    func_with(|a, _| eval(a.load(&[Expr::from(0.0f32)]))),
    ".body.value.indices[0]",
    "indices are int32 or int64, found float32"
);
case!(
    shape_constants_are_index_typed,
    {
        let a = Buffer::new(
            "A",
            DataType::f32(),
            vec![Expr::IntImm {
                dtype: DataType::i8(),
                value: 4,
            }],
        );
        PrimFunc::new("f", vec![Param::Buffer(a)], eval(Expr::from(0i32)))
    },
    ".params[0].shape[0]",
    "shape entries are int32 or int64, found int8"
);
case!(
    shapes_are_not_negative,
    PrimFunc::new(
        "f",
        vec![Param::Buffer(buf("A", DataType::f32(), &[-1]))],
        eval(Expr::from(0i32))
    ),
    ".params[0].shape[0]",
    "shape entries may not be negative, found -1"
);
case!(
    shape_variables_are_index_typed,
    {
        let a = Buffer::new(
            "A",
            DataType::f32(),
            vec![Expr::from(&Var::new("n", DataType::u8()))],
        );
        PrimFunc::new("f", vec![Param::Buffer(a)], eval(Expr::from(0i32)))
    },
    ".params[0].shape[0]",
    "shape variable `n` must be int32 or int64, found uint8"
);
case!(
    shapes_are_constants_or_variables,
    {
        let n = size_var("n");
        let a = Buffer::new("A", DataType::f32(), vec![Expr::from(&n)]);
        let b = Buffer::new("B", DataType::f32(), vec![&n + 1i64]);
        PrimFunc::new(
            "f",
            vec![Param::Buffer(a), Param::Buffer(b)],
            eval(Expr::from(0i32)),
        )
    },
    ".params[1].shape[0]",
    "shape entries are constants or variables, found `n + 1i64`"
);
case!(
    shape_variables_keep_their_type,
    {
        let n = size_var("n");
        let a = Buffer::new("A", DataType::f32(), vec![Expr::from(&n)]);
        let b = Buffer::new(
            "B",
            DataType::f32(),
            vec![Expr::Var(Var {
                dtype: DataType::i32(),
                ..n.clone()
            })],
        );
        PrimFunc::new(
            "f",
            vec![Param::Buffer(a), Param::Buffer(b)],
            eval(Expr::from(0i32)),
        )
    },
    ".params[1].shape[0]",
    "variable `n` was bound as int64 but used as int32"
);
case!(
    strides_match_the_rank,
    {
        let a = buf("A", DataType::f32(), &[4, 4]).with_strides(vec![i64c(1)]);
        PrimFunc::new("f", vec![Param::Buffer(a)], eval(Expr::from(0i32)))
    },
    ".params[0]",
    "buffer `A` has 1 strides for 2 dimensions"
);
case!(
    allocations_are_compact,
    func_with(|_, _| {
        let t = Buffer::temp("T", DataType::f32(), vec![i64c(4)], StorageScope::Local)
            .with_strides(vec![i64c(2)]);
        t.allocate(eval(Expr::from(0i32)))
    }),
    ".body.buffer",
    "allocated buffer `T` must be compact (no strides)"
);
case!(
    parameters_are_global,
    PrimFunc::new(
        "f",
        vec![Param::Buffer(
            buf("A", DataType::f32(), &[4]).with_scope(StorageScope::Local)
        )],
        eval(Expr::from(0i32))
    ),
    ".params[0]",
    "parameter buffer `A` has scope local, expected global"
);
case!(
    allocations_are_not_global,
    func_with(|_, _| {
        let t = buf("T", DataType::f32(), &[4]);
        t.allocate(eval(Expr::from(0i32)))
    }),
    ".body.buffer",
    "allocated buffer `T` has scope global, expected local, workspace or shared"
);
case!(
    buffer_data_is_a_handle,
    {
        let mut a = buf("A", DataType::f32(), &[4]);
        a.data = Var::new("A", DataType::i64());
        PrimFunc::new("f", vec![Param::Buffer(a)], eval(Expr::from(0i32)))
    },
    ".params[0]",
    "data variable of buffer `A` has type int64, expected handle"
);
case!(
    buffers_hold_values,
    PrimFunc::new(
        "f",
        vec![Param::Buffer(buf("A", DataType::handle(), &[4]))],
        eval(Expr::from(0i32))
    ),
    ".params[0]",
    "buffer `A` has type handle"
);
case!(
    buffer_names_are_not_empty,
    PrimFunc::new(
        "f",
        vec![Param::Buffer(buf("", DataType::f32(), &[4]))],
        eval(Expr::from(0i32))
    ),
    ".params[0]",
    "buffer names may not be empty"
);

// ---- loops
case!(
    loop_variables_are_index_typed,
    func_with(|_, x| {
        let i = Var::new("i", DataType::f32());
        Stmt::For {
            var: i,
            min: Expr::from(0.0f32),
            extent: Expr::from(4.0f32),
            kind: ForKind::Serial,
            body: Box::new(eval(x.clone())),
        }
    }),
    ".body.var",
    "loop variable `i` must be int32 or int64, found float32"
);
case!(
    loop_bounds_have_the_variable_type,
    func_with(|_, x| {
        let i = Var::new("i", DataType::i64());
        Stmt::For {
            var: i,
            min: i64c(0),
            extent: x.clone(),
            kind: ForKind::Serial,
            body: Box::new(eval(x.clone())),
        }
    }),
    ".body.var",
    "loop `i`: min (int64) and extent (int32) must have the loop variable's type int64"
);
case!(
    parallel_loops_do_not_nest,
    func_with(|a, _| {
        for_range("i", i64c(2), ForKind::Parallel, |i| {
            for_range("j", i64c(2), ForKind::Parallel, |j| {
                a.store(&[i + j], 0.0f32)
            })
        })
    }),
    ".body.body.kind",
    "parallel loop `j` is nested inside a parallel loop"
);
case!(
    parallel_loops_do_not_nest_in_vectorized_loops,
    func_with(|a, _| {
        for_range("i", i64c(2), ForKind::Vectorized, |i| {
            for_range("j", i64c(2), ForKind::Parallel, |j| {
                a.store(&[i + j], 0.0f32)
            })
        })
    }),
    ".body.body.kind",
    "parallel loop `j` is nested inside a vectorized loop"
);
case!(
    vectorized_loops_have_constant_extents,
    func_with(|a, x| {
        for_range(
            "i",
            x.clone().cast(DataType::i64()),
            ForKind::Vectorized,
            |i| a.store(&[i], 0.0f32),
        )
    }),
    ".body.extent",
    "vectorized loop `i` needs a constant extent, found `int64(x)`"
);
case!(
    unrolled_loops_have_constant_extents,
    func_with(|a, x| {
        for_range(
            "i",
            x.clone().cast(DataType::i64()),
            ForKind::Unrolled,
            |i| a.store(&[i], 0.0f32),
        )
    }),
    ".body.extent",
    "unrolled loop `i` needs a constant extent"
);
case!(
    return_is_not_allowed_in_parallel_loops,
    func_with(|_, x| { for_range("i", i64c(2), ForKind::Parallel, |_| Stmt::Return(x.clone())) })
        .with_ret_type(DataType::i32()),
    ".body.body",
    "`return` inside a parallel loop"
);

// ---- functions
case!(
    return_needs_a_return_type,
    func_with(|_, x| Stmt::Return(x.clone())),
    ".body",
    "`return` in a function without a return type"
);
case!(
    return_values_match_the_return_type,
    func_with(|_, _| Stmt::Return(Expr::from(1.0f32))).with_ret_type(DataType::i32()),
    ".body.value",
    "returning float32 from a function returning int32"
);
case!(
    return_types_are_values,
    func_with(|_, _| eval(Expr::from(0i32))).with_ret_type(DataType::handle()),
    ".ret_type",
    "the return type has type handle"
);
case!(
    parameter_names_are_unique,
    {
        let x = Var::new("A", DataType::i32());
        PrimFunc::new(
            "f",
            vec![
                Param::Buffer(buf("A", DataType::f32(), &[4])),
                Param::Scalar(x),
            ],
            eval(Expr::from(0i32)),
        )
    },
    ".params[1]",
    "duplicate parameter name `A`"
);
case!(
    scalar_parameters_hold_values,
    PrimFunc::new(
        "f",
        vec![Param::Scalar(Var::new("p", DataType::handle()))],
        eval(Expr::from(0i32))
    ),
    ".params[0]",
    "scalar parameter `p` has type handle"
);
case!(
    global_symbols_are_c_identifiers,
    {
        let mut f = func_with(|_, _| eval(Expr::from(0i32)));
        f.attrs.global_symbol = Some("my-func".into());
        f
    },
    ".attrs.global_symbol",
    "global symbol `my-func` is not a C identifier"
);
case!(
    function_names_are_not_empty,
    {
        let mut f = func_with(|_, _| eval(Expr::from(0i32)));
        f.name = String::new();
        f.attrs.global_symbol = None;
        f
    },
    ".name",
    "function names may not be empty"
);

#[test]
fn nesting_is_bounded() {
    let mut e = Expr::from(true);
    for _ in 0..300 {
        e = !e;
    }
    let f = func_with(|_, _| eval(e));
    let errors = IRModule::from_functions(vec![f]).verify_all();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0]
            .to_string()
            .contains("IR nested deeper than 256 nodes"),
        "{}",
        errors[0]
    );
}

#[test]
fn modules_have_unique_names_symbols_and_one_entry() {
    let ok = || func_with(|_, _| eval(Expr::from(0i32)));
    let mut g = ok();
    g.attrs.global_symbol = Some("g".into());
    let mut f2 = ok();
    f2.attrs.global_symbol = Some("h".into());
    let errors = IRModule::from_functions(vec![ok(), g.clone(), f2]).verify_all();
    assert_eq!(errors.len(), 2);
    assert_eq!(
        errors[0].to_string(),
        "function `f`: $.functions[1].name: duplicate function name `f`"
    );

    let mut h = ok();
    h.name = "h".into();
    let errors = IRModule::from_functions(vec![ok(), h]).verify_all();
    assert_eq!(
        errors[0].to_string(),
        "function `h`: $.functions[1].attrs.global_symbol: duplicate global symbol `f`"
    );

    let entry = |name: &str| {
        let mut e = ok();
        e.name = name.into();
        e.attrs.global_symbol = Some(name.into());
        e.attrs.entry = true;
        e
    };
    let errors = IRModule::from_functions(vec![entry("a"), entry("b")]).verify_all();
    assert_eq!(errors.len(), 1);
    assert_eq!(
        errors[0].to_string(),
        "function `b`: $.functions[1].attrs.entry: more than one function is marked as the entry"
    );
}

#[test]
fn verify_all_reports_every_error_in_node_order() {
    let f = func_with(|a, x| {
        Stmt::Seq(vec![
            eval(x + Expr::from(1.0f32)),
            a.store(&[i64c(0)], 1i32),
            Stmt::Return(x.clone()),
        ])
    });
    let errors = IRModule::from_functions(vec![f]).verify_all();
    let paths: Vec<String> = errors
        .iter()
        .map(|e| match e {
            IrError::Verify { path, .. } => path.clone(),
            _ => String::new(),
        })
        .collect();
    assert_eq!(
        paths,
        [
            "$.functions[0].body.stmts[0].value",
            "$.functions[0].body.stmts[1].value",
            "$.functions[0].body.stmts[2]"
        ]
    );
}
