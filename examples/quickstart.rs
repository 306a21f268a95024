//! kiln's main job, end to end: read kernels written in kiln's IR (JSON), compile them with LLVM
//! for this machine under the default target (`{"kind": "llvm", "mcpu": "native"}`, what
//! `kiln build` and `kiln run` use without `--target`; no option needed for fast code), run them
//! on CPU tensors, check them against plain Rust loops, and print the target, compile time and
//! throughput.
//!
//! Run: `cargo run --release --example quickstart` (`-- '<target JSON>'` for another target whose
//! code runs on this machine, e.g. `{"kind": "llvm", "mcpu": "haswell"}`)

use std::time::Instant;

use kiln::device_api::{Device, Tensor};
use kiln::ir::IRModule;
use kiln::packed_func::AnyView;
use kiln::target::Target;

fn median_ms(
    runs: usize,
    mut f: impl FnMut() -> Result<(), kiln::Error>,
) -> Result<(f64, f64, f64), kiln::Error> {
    f()?; // warm up
    let mut t: Vec<f64> = Vec::new();
    for _ in 0..runs {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok((t[t.len() / 2], t[0], t[t.len() - 1]))
}

/// Builds `module` and returns it with the time until it was callable and the time until its
/// optimized code was installed (the JIT compiles quick code first and O3 code in the
/// background; a module from the compile cache is optimized at once), in ms.
fn build(
    module: &IRModule,
    target: &Target,
) -> Result<(kiln::codegen::ModuleRef, f64, f64), kiln::Error> {
    let t = Instant::now();
    let rt = kiln::codegen::build(module, target)?;
    let callable = t.elapsed().as_secs_f64() * 1e3;
    kiln::codegen::llvm::wait_all_optimized();
    Ok((rt, callable, t.elapsed().as_secs_f64() * 1e3))
}

fn load(name: &str) -> Result<IRModule, Box<dyn std::error::Error>> {
    let path = format!(
        "{}/examples/kernels/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    Ok(IRModule::from_json_str(&text)?)
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Another CPU's code (it must run here), e.g. an AVX2-only one:
    // `cargo run --release --example quickstart -- '{"kind": "llvm", "mcpu": "haswell"}'`.
    let arg = std::env::args().nth(1);
    let default = arg.is_none();
    let target = Target::parse(
        arg.as_deref()
            .unwrap_or(r#"{"kind": "llvm", "mcpu": "native"}"#),
    )?;
    let cpu = Device::cpu();
    // What this target gives, with no option: `native` resolved, the vector ISA, the float
    // rule (multiply-adds fused, as TVM), streaming stores for big outputs.
    let opts = kiln::codegen::llvm::CodegenOptions::from_target(&target)?;
    if default {
        println!("target: {target} (the default of `kiln build` and `kiln run`)");
    } else {
        println!("target: {target}");
    }
    println!("        {}", opts.describe());

    // --- vector add, n = 16M ---------------------------------------------------------------
    let n = 16 << 20;
    let module = load("vadd")?;
    let (rt, compile, optimized) = build(&module, &target)?;
    let (a, b) = (data(n, 1), data(n, 2));
    let ta = Tensor::from_slice(&a, &[n as i64], cpu)?;
    let tb = Tensor::from_slice(&b, &[n as i64], cpu)?;
    let tc = Tensor::zeros(&[n as i64], ta.dtype(), cpu)?;
    let f = rt.require_function("vadd")?;
    let args = [
        AnyView::from(ta.as_dltensor()),
        AnyView::from(tb.as_dltensor()),
        AnyView::from(tc.as_dltensor()),
    ];
    let (med, lo, hi) = median_ms(10, || Ok(f.call(&args).map(drop)?))?;
    let c: Vec<f32> = tc.to_vec()?;
    let ok = c
        .iter()
        .zip(a.iter().zip(&b))
        .all(|(c, (a, b))| *c == a + b);
    let gbs = 3.0 * 4.0 * n as f64 / (med * 1e-3) / 1e9;
    println!("vadd    n=16M      compile {compile:5.1} ms (O3 {optimized:5.1} ms)   run {med:7.3} ms [{lo:.3}, {hi:.3}]  {gbs:6.1} GB/s   exact match with a Rust loop: {ok}");
    if !ok {
        return Err("vadd result differs from a plain Rust loop".into());
    }

    // --- matmul 1024 ------------------------------------------------------------------------
    let m = 1024usize;
    // The schedule for this CPU's vector registers: 8 x 32 register tiles in zmm registers
    // (matmul.json), or 6 x 16 in the sixteen ymm registers of an AVX2-only CPU
    // (matmul_avx2.json), where 8 x 32 would spill.
    let file = if kiln::target::has_avx512(&target) {
        "matmul"
    } else {
        "matmul_avx2"
    };
    let module = load(file)?;
    let (rt, compile, optimized) = build(&module, &target)?;
    let (a, b) = (data(m * m, 3), data(m * m, 4));
    let ta = Tensor::from_slice(&a, &[m as i64, m as i64], cpu)?;
    let tb = Tensor::from_slice(&b, &[m as i64, m as i64], cpu)?;
    let tc = Tensor::zeros(&[m as i64, m as i64], ta.dtype(), cpu)?;
    let f = rt.require_function("matmul")?;
    let args = [
        AnyView::from(ta.as_dltensor()),
        AnyView::from(tb.as_dltensor()),
        AnyView::from(tc.as_dltensor()),
    ];
    let (med, lo, hi) = median_ms(5, || Ok(f.call(&args).map(drop)?))?;
    let c: Vec<f32> = tc.to_vec()?;
    // Plain Rust reference (i-k-j order, f64 accumulation is overkill here: f32 like the kernel).
    let mut want = vec![0f32; m * m];
    for i in 0..m {
        for k in 0..m {
            let aik = a[i * m + k];
            for j in 0..m {
                want[i * m + j] += aik * b[k * m + j];
            }
        }
    }
    let err = c
        .iter()
        .zip(&want)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let gflops = 2.0 * (m * m * m) as f64 / (med * 1e-3) / 1e9;
    println!("matmul  1024^3     ({file}.json)");
    println!("                   compile {compile:5.1} ms (O3 {optimized:5.1} ms)   run {med:7.3} ms [{lo:.3}, {hi:.3}]  {gflops:6.1} GFLOP/s   max abs error vs a Rust loop: {err:.2e}");
    if err > 1e-3 {
        return Err(format!("matmul differs from a plain Rust loop by {err}").into());
    }

    // --- row softmax 4096 x 4096 -----------------------------------------------------------
    let r = 4096usize;
    // Likewise: the max in 64 lanes of zmm registers, or in 32 of ymm (softmax_avx2.json).
    let file = if kiln::target::has_avx512(&target) {
        "softmax"
    } else {
        "softmax_avx2"
    };
    let module = load(file)?;
    let (rt, compile, optimized) = build(&module, &target)?;
    let a = data(r * r, 5);
    let ta = Tensor::from_slice(&a, &[r as i64, r as i64], cpu)?;
    let tb = Tensor::zeros(&[r as i64, r as i64], ta.dtype(), cpu)?;
    let f = rt.require_function("softmax")?;
    let args = [
        AnyView::from(ta.as_dltensor()),
        AnyView::from(tb.as_dltensor()),
    ];
    let (med, lo, hi) = median_ms(5, || Ok(f.call(&args).map(drop)?))?;
    let got: Vec<f32> = tb.to_vec()?;
    let mut err = 0f64;
    for row in 0..r {
        let x = &a[row * r..(row + 1) * r];
        let mx = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = x.iter().map(|v| (*v as f64 - mx).exp()).sum();
        for (j, v) in x.iter().enumerate() {
            err = err.max(((*v as f64 - mx).exp() / sum - got[row * r + j] as f64).abs());
        }
    }
    println!("softmax 4096x4096  compile {compile:5.1} ms (O3 {optimized:5.1} ms)   run {med:7.3} ms [{lo:.3}, {hi:.3}]                 max abs error vs a Rust loop (f64): {err:.2e}");
    if err > 1e-5 {
        return Err(format!("softmax differs from a plain Rust loop by {err}").into());
    }
    println!("all results verified");
    Ok(())
}
