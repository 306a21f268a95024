//! Printer snapshots: `tests/ir/print/*.txt` (rewrite with `KILN_BLESS=1`).

#[path = "ir/common.rs"]
mod common;

use common::{all_constructs, check_snapshot};
use kiln::ir::{kernels, IRModule};

#[test]
fn every_construct_prints_as_in_the_snapshot() {
    let f = all_constructs();
    f.verify().unwrap();
    check_snapshot("print/constructs.txt", &f.to_string());
}

#[test]
fn benchmark_kernels_print_as_in_the_snapshots() {
    for f in [
        kernels::vadd(),
        kernels::matmul_sized(4, 5, 6),
        kernels::rowsum_sized(3, 4),
        kernels::softmax_sized(2, 3),
        kernels::conv2d(1, 2, 5, 5, 3, 3, 3),
    ] {
        f.verify().unwrap();
        check_snapshot(&format!("print/{}.txt", f.name), &f.to_string());
    }
}

#[test]
fn a_module_prints_a_header_and_each_function() {
    let m = IRModule::from_functions(vec![kernels::vadd(), kernels::rowsum_sized(2, 2)]);
    let text = m.to_string();
    assert!(
        text.starts_with("// kiln-ir/1 module, 2 function(s)\n\nfunc @vadd("),
        "{text}"
    );
    assert!(
        text.contains("\nfunc @rowsum(A: float32[2, 2], B: float32[2]) attrs(noalias) {"),
        "{text}"
    );
}

#[test]
fn shadowing_variables_are_renamed() {
    use kiln::ir::{builder::for_range, Buffer, DataType, Expr, ForKind, Param, PrimFunc, Var};
    let b = Buffer::new(
        "B",
        DataType::i64(),
        vec![Expr::from(2i64), Expr::from(2i64)],
    );
    let i = Var::new("i", DataType::i64());
    let inner = for_range("i", Expr::from(2i64), ForKind::Serial, |j| {
        b.store(&[Expr::from(&i), j], Expr::from(&i))
    });
    let body = kiln::ir::Stmt::For {
        var: i.clone(),
        min: Expr::from(0i64),
        extent: Expr::from(2i64),
        kind: ForKind::Serial,
        body: Box::new(inner),
    };
    let f = PrimFunc::new("shadow", vec![Param::Buffer(b)], body);
    f.verify().unwrap();
    let text = f.to_string();
    assert!(
        text.contains("for i_1: int64 in serial(0i64, 2i64) {\n      B[i, i_1] = i\n"),
        "{text}"
    );
    // The JSON writer applies the same renaming, so the module reads back to the same program.
    let m = IRModule::from_functions(vec![f]);
    let back = IRModule::from_json_str(&m.to_json().to_string()).unwrap();
    assert_eq!(back.to_string(), m.to_string());
}

#[test]
fn snapshot_diffs_show_removed_then_added_lines_with_context() {
    let d = common::diff("a\nb\nc\nd\ne\nf\ng\n", "a\nb\nc\nd\nX\nf\ng\n");
    assert_eq!(d, "@@ ... @@\n c\n d\n-e\n+X\n f\n g\n");
}

#[test]
fn signatures_match_the_tvm_packed_api_messages() {
    use kiln::ir::{builder::size_var, Buffer, DataType, Expr, Param, PrimFunc, Stmt, Var};
    // The signatures quoted in tests/data/tvm027_packed_abi_errors.jsonl.
    let nop = || Stmt::Evaluate(Expr::from(0i32));
    let c = |v: i64| Expr::from(v);
    let t = |name: &str, dtype, shape: Vec<Expr>| Param::Buffer(Buffer::new(name, dtype, shape));
    let f32t = DataType::f32();
    let add16 = PrimFunc::new(
        "add16",
        vec![
            t("a", f32t, vec![c(16)]),
            t("b", f32t, vec![c(16)]),
            t("c", f32t, vec![c(16)]),
        ],
        nop(),
    );
    assert_eq!(
        add16.signature(),
        "add16(a: Tensor([16], float32), b: Tensor([16], float32), c: Tensor([16], float32))"
    );
    let (m, n) = (size_var("m"), size_var("n"));
    let mat2d = PrimFunc::new(
        "mat2d",
        vec![
            t("A", f32t, vec![Expr::from(&m), Expr::from(&n)]),
            t("C", f32t, vec![Expr::from(&m), Expr::from(&n)]),
        ],
        nop(),
    );
    assert_eq!(
        mat2d.signature(),
        "mat2d(A: Tensor([m, n], float32), C: Tensor([m, n], float32))"
    );
    let scal = PrimFunc::new(
        "scal",
        vec![
            Param::Scalar(Var::new("x", DataType::i32())),
            Param::Scalar(Var::new("y", f32t)),
            Param::Scalar(Var::new("flag", DataType::bool())),
            t("out", f32t, vec![c(1)]),
        ],
        nop(),
    );
    assert_eq!(
        scal.signature(),
        "scal(x: int32, y: float32, flag: bool, out: Tensor([1], float32))"
    );
    let int_buf = PrimFunc::new(
        "int_buf",
        vec![
            t("a", DataType::i32(), vec![c(4)]),
            t("c", DataType::i64(), vec![c(4)]),
        ],
        nop(),
    );
    assert_eq!(
        int_buf.signature(),
        "int_buf(a: Tensor([4], int32), c: Tensor([4], int64))"
    );
}
