//! JIT-compiled kernels against the reference interpreter, and the packed-API argument checks.

mod common;

use common::HostArray;
use kiln::codegen::llvm::{CodegenOptions, LlvmModule};
use kiln::ir::interp::{self, HostBuffer, InterpArg};
use kiln::ir::{kernels, IRModule};
use kiln::packed_func::{AnyView, Module};

fn jit(f: kiln::ir::PrimFunc) -> LlvmModule {
    let m = IRModule::from_functions(vec![f]);
    m.verify().unwrap();
    LlvmModule::jit(&m, &CodegenOptions::host()).unwrap()
}

#[test]
fn vadd_matches_a_plain_loop() {
    let m = jit(kernels::vadd());
    let f = m.require_function("vadd").unwrap();
    let n = 1003;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let (mut ta, mut tb, mut tc) = (
        HostArray::f32(&[n], &a),
        HostArray::f32(&[n], &b),
        HostArray::f32(&[n], &vec![0.0; n as usize]),
    );
    let (da, db, dc) = (ta.dl(), tb.dl(), tc.dl());
    f.call(&[AnyView::from(&da), AnyView::from(&db), AnyView::from(&dc)])
        .unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(tc.to_f32(), want);
}

#[test]
fn matmul_and_softmax_match_the_interpreter() {
    for (f, shapes) in [
        (
            kernels::matmul_sized(17, 13, 9),
            vec![vec![17i64, 9], vec![9, 13], vec![17, 13]],
        ),
        (
            kernels::softmax_sized(5, 33),
            vec![vec![5, 33], vec![5, 33]],
        ),
        (kernels::rowsum_sized(7, 19), vec![vec![7, 19], vec![7]]),
    ] {
        let m = jit(f.clone());
        let pf = m.require_function(&f.name).unwrap();
        let mut arrays: Vec<HostArray> = shapes
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let n: i64 = s.iter().product();
                let v: Vec<f32> = (0..n)
                    .map(|i| ((i * 7 + k as i64 * 3) % 11) as f32 * 0.25 - 1.0)
                    .collect();
                HostArray::f32(s, &v)
            })
            .collect();
        let mut iargs: Vec<InterpArg> = arrays
            .iter()
            .map(|a| InterpArg::Buffer(HostBuffer::from_slice(&a.shape, &a.to_f32())))
            .collect();
        interp::run(&f, &mut iargs).unwrap();
        let dls: Vec<_> = arrays.iter_mut().map(|a| a.dl()).collect();
        let views: Vec<AnyView> = dls.iter().map(AnyView::from).collect();
        pf.call(&views).unwrap();
        let last = arrays.last().unwrap().to_f32();
        let want = iargs.last().unwrap().to_vec::<f32>().unwrap();
        for (i, (g, w)) in last.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{}: [{i}] {g} vs {w}",
                f.name
            );
        }
    }
}
