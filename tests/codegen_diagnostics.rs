//! LLVM's diagnostics reach the `log` crate, not stderr: a loop marked vectorized that LLVM
//! cannot vectorize (an integer division, which raises on a zero divisor) is a warning record.

use std::sync::Mutex;

use kiln::codegen::llvm::{CodegenOptions, LlvmModule, Tiering};
use kiln::ir::{BinOp, Buffer, DataType, Expr, ForKind, IRModule, Param, PrimFunc, Stmt, Var};

static RECORDS: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        RECORDS
            .lock()
            .unwrap()
            .push((record.level(), record.args().to_string()));
    }
    fn flush(&self) {}
}

#[test]
fn a_vectorized_loop_llvm_cannot_vectorize_is_a_logged_warning() {
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    let t = DataType::i32();
    let n = Expr::from(64i64);
    let (a, b, c) = (
        Buffer::new("A", t, vec![n.clone()]),
        Buffer::new("B", t, vec![n.clone()]),
        Buffer::new("C", t, vec![n.clone()]),
    );
    let i = Var::new("i", DataType::i64());
    let at = |x: &Buffer| x.load(vec![Expr::Var(i.clone())]);
    let body = Stmt::For {
        var: i.clone(),
        min: Expr::from(0i64),
        extent: n,
        kind: ForKind::Vectorized,
        body: Box::new(c.store(
            vec![Expr::Var(i.clone())],
            Expr::binary(BinOp::Div, at(&a), at(&b)),
        )),
    };
    let f = PrimFunc::new(
        "div",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    );
    let m = IRModule::from_functions(vec![f]);
    m.verify().unwrap();
    LlvmModule::jit_with(&m, &CodegenOptions::host(), Tiering::Off).unwrap();
    let records = RECORDS.lock().unwrap();
    assert!(
        records
            .iter()
            .any(|(l, m)| *l == log::Level::Warn && m.starts_with("LLVM: loop not vectorized")),
        "{records:?}"
    );
}
