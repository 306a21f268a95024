//! Rows that gather from constant columns (`Y[r, x] = X[r, f(x)]`, `f` computed from `x` and
//! constants alone: a nearest-neighbour resize, a reversal, a repeat, a tile) are emitted as
//! one vector load of the source row's window and one constant shuffle per vector piece. The
//! generated code computes the interpreter's bytes for every row length, source width, loop
//! start, index function, element type and target, and the AVX2 code of TOPI's resize row is
//! permutes, not element inserts.

use proptest::prelude::*;

use common::target_opts;
use kiln::codegen::llvm::{CodegenOptions, LlvmModule};
use kiln::ir::builder::call;
use kiln::ir::interp::{self, HostBuffer, InterpArg};
use kiln::ir::{Buffer, DataType, Expr, ForKind, IRModule, Intrinsic, Param, PrimFunc, Stmt, Var};
use kiln::packed_func::{AnyView, Module};

mod common;

const ROWS: i64 = 3;

/// The column a lane reads.
#[derive(Clone, Debug)]
enum Column {
    /// `clamp(int32(floor(scale * float32(x) + 1e-5)), 0, width - 1)`, unsaturated, as TVM's
    /// `resize2d` writes it.
    Resize(f32),
    /// `width - 1 - x`.
    Reverse,
    /// `x floordiv k`.
    Repeat(i64),
    /// `x floormod width`.
    Tile,
}

fn column(c: &Column, x: Expr, width: i64) -> Expr {
    let t = DataType::i32();
    match c {
        Column::Resize(scale) => call(
            Intrinsic::Floor,
            vec![Expr::from(*scale) * x.cast(DataType::f32()) + Expr::from(1e-5f32)],
        )
        .cast_unsaturated(t)
        .min(Expr::from(width as i32 - 1))
        .max(Expr::from(0i32)),
        Column::Reverse => Expr::from(width as i32 - 1) - x,
        Column::Repeat(k) => x.floordiv(Expr::from(*k as i32)),
        Column::Tile => x.floormod(Expr::from(width as i32)),
    }
}

/// `for r in ROWS { for x in [start, start + n) { Y[r, x - start] = X[r, col(x)] } }`.
fn gather(
    dtype: DataType,
    n: i64,
    width: i64,
    start: i64,
    col: &Column,
    rows: ForKind,
) -> PrimFunc {
    let x_buf = Buffer::new("X", dtype, vec![Expr::from(ROWS), Expr::from(width)]);
    let y_buf = Buffer::new("Y", dtype, vec![Expr::from(ROWS), Expr::from(n)]);
    let r = Var::new("r", DataType::i32());
    let x = Var::new("x", DataType::i32());
    let row = Stmt::For {
        var: x.clone(),
        min: Expr::from(start as i32),
        extent: Expr::from(n as i32),
        kind: ForKind::Serial,
        body: Box::new(y_buf.store(
            vec![
                Expr::Var(r.clone()),
                Expr::Var(x.clone()) - Expr::from(start as i32),
            ],
            x_buf.load(vec![Expr::Var(r.clone()), column(col, Expr::Var(x), width)]),
        )),
    };
    let body = Stmt::For {
        var: r,
        min: Expr::from(0i32),
        extent: Expr::from(ROWS as i32),
        kind: rows,
        body: Box::new(row),
    };
    PrimFunc::new(
        "gather",
        vec![Param::Buffer(x_buf), Param::Buffer(y_buf)],
        body,
    )
    .with_noalias(true)
}

fn compiled(f: &PrimFunc, o: &CodegenOptions) -> LlvmModule {
    let m = LlvmModule::jit(&IRModule::from_functions(vec![f.clone()]), o).unwrap();
    m.wait_optimized().unwrap();
    m
}

/// The interpreter's output and the compiled function's, on distinct source values.
fn run_both(f: &PrimFunc, o: &CodegenOptions) -> Result<(Vec<u8>, Vec<u8>), String> {
    let shapes: Vec<(DataType, Vec<i64>)> = f
        .params
        .iter()
        .map(|p| match p {
            Param::Buffer(b) => (
                b.dtype,
                b.shape.iter().map(|d| d.as_int().unwrap()).collect(),
            ),
            Param::Scalar(_) => unreachable!(),
        })
        .collect();
    let bufs: Vec<HostBuffer> = shapes
        .iter()
        .enumerate()
        .map(|(k, (t, s))| {
            let n: i64 = s.iter().product();
            let v: Vec<f64> = (0..n)
                .map(|i| (i * 3 + k as i64 * 1000) as f64 + 0.5)
                .collect();
            if *t == DataType::f32() {
                HostBuffer::from_slice(s, &v.iter().map(|&x| x as f32).collect::<Vec<_>>())
            } else {
                HostBuffer::from_slice(s, &v)
            }
        })
        .collect();
    let mut iargs: Vec<InterpArg> = bufs.iter().cloned().map(InterpArg::Buffer).collect();
    interp::run(f, &mut iargs).map_err(|e| e.to_string())?;
    let InterpArg::Buffer(want) = iargs.pop().unwrap() else {
        unreachable!()
    };
    let m = compiled(f, o);
    let mut arrays: Vec<common::HostArray> = bufs
        .iter()
        .map(common::HostArray::from_host_buffer)
        .collect();
    let dls: Vec<_> = arrays.iter_mut().map(common::HostArray::dl).collect();
    let views: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
    m.require_function("gather").unwrap().call(&views).unwrap();
    Ok((arrays.last().unwrap().bytes().to_vec(), want.data))
}

fn targets() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just(r#"{"kind": "llvm", "mcpu": "haswell"}"#),
        Just(r#"{"kind": "llvm", "mcpu": "native"}"#),
        Just(r#"{"kind": "llvm"}"#),
    ]
}

fn columns() -> impl Strategy<Value = Column> {
    prop_oneof![
        3 => (0.05f32..3.0).prop_map(Column::Resize),
        1 => Just(Column::Reverse),
        1 => (1i64..5).prop_map(Column::Repeat),
        1 => Just(Column::Tile),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn gathered_rows_compute_the_interpreters_bytes(
        n in 2i64..=70,
        width in 1i64..=40,
        start in 0i64..4,
        col in columns(),
        wide in any::<bool>(),
        parallel in any::<bool>(),
        target in targets(),
    ) {
        let dtype = if wide { DataType::f64() } else { DataType::f32() };
        let rows = if parallel { ForKind::Parallel } else { ForKind::Serial };
        let f = gather(dtype, n, width, start, &col, rows);
        // A column outside the row (a reversal or a repeat wider than it) is an error of the
        // program, which the interpreter reports; only programs it runs are compared.
        if let Ok((got, want)) = run_both(&f, &target_opts(target)) {
            prop_assert!(got == want, "{:?}, n {}, width {}, start {}, {}: {:?} against {:?}",
                col, n, width, start, target, got, want);
        }
    }
}

/// TOPI's `resize2d` row of 20 from 16 (`nearest_neighbor`, `asymmetric`), for AVX2: the
/// window of 16 and two permutes, where element by element it was scalar loads, inserts and
/// six stores a row.
#[test]
fn a_resize_row_is_permutes_of_one_window_for_avx2() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let f = gather(
        DataType::f32(),
        20,
        16,
        0,
        &Column::Resize(0.8),
        ForKind::Serial,
    );
    let o = target_opts(r#"{"kind": "llvm", "mcpu": "haswell"}"#);
    let asm = compiled(&f, &o).get_source("asm").unwrap();
    assert!(asm.contains("vpermps"), "no permute:\n{asm}");
    assert!(
        !asm.contains("vinsertps") && !asm.contains("vbroadcastss"),
        "{asm}"
    );
    let (got, want) = run_both(&f, &o).unwrap();
    assert_eq!(got, want);
}

/// A row whose column depends on something besides the row's variable (here, the outer row)
/// is left to LLVM, and still computes the interpreter's bytes.
#[test]
fn a_column_that_depends_on_the_outer_loop_is_not_a_window() {
    let x_buf = Buffer::new(
        "X",
        DataType::f32(),
        vec![Expr::from(ROWS), Expr::from(16i64)],
    );
    let y_buf = Buffer::new(
        "Y",
        DataType::f32(),
        vec![Expr::from(ROWS), Expr::from(8i64)],
    );
    let r = Var::new("r", DataType::i32());
    let x = Var::new("x", DataType::i32());
    let body = Stmt::For {
        var: r.clone(),
        min: Expr::from(0i32),
        extent: Expr::from(ROWS as i32),
        kind: ForKind::Serial,
        body: Box::new(Stmt::For {
            var: x.clone(),
            min: Expr::from(0i32),
            extent: Expr::from(8i32),
            kind: ForKind::Serial,
            body: Box::new(y_buf.store(
                vec![Expr::Var(r.clone()), Expr::Var(x.clone())],
                x_buf.load(vec![
                    Expr::Var(r.clone()),
                    (Expr::Var(x) * Expr::from(2i32) + Expr::Var(r)).min(Expr::from(15i32)),
                ]),
            )),
        }),
    };
    let f = PrimFunc::new(
        "gather",
        vec![Param::Buffer(x_buf), Param::Buffer(y_buf)],
        body,
    )
    .with_noalias(true);
    for t in [
        r#"{"kind": "llvm", "mcpu": "haswell"}"#,
        r#"{"kind": "llvm", "mcpu": "native"}"#,
    ] {
        let (got, want) = run_both(&f, &target_opts(t)).unwrap();
        assert_eq!(got, want, "{t}");
    }
}
