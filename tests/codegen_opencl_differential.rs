//! Differential tests of the OpenCL backend: random device programs (a grid of blocks and
//! threads computing a random expression per element, optionally staged through shared memory
//! with a barrier and read back by a neighbouring thread) run on the OpenCL device and in the
//! reference interpreter must agree bit for bit (NaNs match any NaN). Programs the interpreter
//! rejects (an integer division by zero) are skipped: a kernel gives 0 there (docs/ir.md).
//! Skips visibly without an OpenCL device; fails under `KILN_REQUIRE_OPENCL=1`.

mod common;
mod random_expr;

use proptest::prelude::*;
use random_expr::{expr, lower, Leaves, E};

use kiln::codegen::opencl::OpenClModule;
use kiln::device_api::{DeviceApi, Tensor};
use kiln::ir::builder::{barrier, thread_for};
use kiln::ir::interp::{run, HostBuffer, InterpArg};
use kiln::ir::{Buffer, DataType, Expr, IRModule, Param, PrimFunc, ThreadTag};
use kiln::packed_func::{AnyView, Module};
use kiln::target::Target;

const BLOCKS: i64 = 3;
const THREADS: i64 = 32;
const N: i64 = BLOCKS * THREADS;

/// `C[i] = e(A[i], B[i], i)`, or with `shared`: each thread stores `e` into shared memory, a
/// barrier, then `C[i]` = the value of the next thread of the block (wrapping).
fn program(e: &E, t: DataType, shared: bool) -> PrimFunc {
    let buf = |n: &str| Buffer::new(n, t, vec![Expr::from(N)]);
    let (a, b, c) = (buf("A"), buf("B"), buf("C"));
    let sh = Buffer::shared("sh", t, &[THREADS]);
    let body = thread_for("bx", Expr::from(BLOCKS), ThreadTag::Block(0), |bx| {
        let inner = thread_for("tx", Expr::from(THREADS), ThreadTag::Thread(0), |tx| {
            let i = bx.clone() * THREADS + tx.clone();
            let leaves = Leaves {
                a: a.load([i.clone()]),
                b: b.load([i.clone()]),
                index: i.clone(),
                float_scale: 1.0,
            };
            let v = lower(e, t, &leaves);
            if shared {
                let next = (tx.clone() + 1i64).floormod(THREADS);
                kiln::ir::Stmt::seq(vec![
                    sh.store([tx.clone()], v),
                    barrier(),
                    c.store([i], sh.load([next])),
                ])
            } else {
                c.store([i], v)
            }
        });
        if shared {
            sh.allocate(inner)
        } else {
            inner
        }
    });
    PrimFunc::new(
        "f",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
}

fn inputs(t: DataType, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut s = seed | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        // Non-zero, so that fewer programs divide by zero.
        let v = (s % 20) as i64 + 1;
        let v = if s & (1 << 40) != 0 { -v } else { v };
        v as f64 / if t.is_float() { 4.0 } else { 1.0 }
    };
    let a = (0..N).map(|_| next()).collect();
    let b = (0..N).map(|_| next()).collect();
    (a, b)
}

fn check(e: &E, t: DataType, shared: bool, seed: u64) -> Result<(), TestCaseError> {
    let Some((api, dev)) = common::opencl_device("random_device_programs") else {
        return Ok(());
    };
    let f = program(e, t, shared);
    let (a, b) = inputs(t, seed);
    let host = |v: &[f64]| -> HostBuffer {
        if t.is_float() {
            HostBuffer::from_slice(&[N], &v.iter().map(|x| *x as f32).collect::<Vec<_>>())
        } else {
            HostBuffer::from_slice(&[N], &v.iter().map(|x| *x as i32).collect::<Vec<_>>())
        }
    };
    let mut iargs = vec![
        InterpArg::Buffer(host(&a)),
        InterpArg::Buffer(host(&b)),
        InterpArg::Buffer(HostBuffer::zeros(t, &[N])),
    ];
    // Integer division by zero: an error in the interpreter, 0 in a kernel.
    prop_assume!(run(&f, &mut iargs).is_ok());
    let m = OpenClModule::build(
        &IRModule::from_functions(vec![f]),
        &Target::parse(r#"{"kind": "opencl"}"#).unwrap(),
    )
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let pf = m.get_function("f").unwrap();
    let dt = |v: &[f64]| -> Tensor {
        if t.is_float() {
            Tensor::from_slice(&v.iter().map(|x| *x as f32).collect::<Vec<_>>(), &[N], dev).unwrap()
        } else {
            Tensor::from_slice(&v.iter().map(|x| *x as i32).collect::<Vec<_>>(), &[N], dev).unwrap()
        }
    };
    let (at, bt, ct) = (dt(&a), dt(&b), dt(&vec![0.0; N as usize]));
    pf.call(&[
        AnyView::from(at.as_dltensor()),
        AnyView::from(bt.as_dltensor()),
        AnyView::from(ct.as_dltensor()),
    ])
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    api.sync_stream(dev, api.current_stream(dev)).unwrap();
    let InterpArg::Buffer(want) = &iargs[2] else {
        unreachable!()
    };
    if t.is_float() {
        let got = ct.to_vec::<f32>().unwrap();
        let want = want.to_vec::<f32>().unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            prop_assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "element {i}: device {g} vs interpreter {w}\n{}",
                m.source()
            );
        }
    } else {
        prop_assert_eq!(ct.to_vec::<i32>().unwrap(), want.to_vec::<i32>().unwrap());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_int32_device_programs_agree_with_the_interpreter(e in expr(), shared: bool, seed: u64) {
        check(&e, DataType::i32(), shared, seed)?;
    }

    #[test]
    fn random_float32_device_programs_agree_with_the_interpreter(e in expr(), shared: bool, seed: u64) {
        check(&e, DataType::f32(), shared, seed)?;
    }
}
