//! kiln's scheduled OpenCL kernels (`kiln::schedule::kernels::opencl_*`) against hand-written
//! OpenCL C kernels of the same algorithms, on the first OpenCL device (PoCL in CI), in one run.
//!
//! Both sides run through the same driver in the same process: kiln's kernels through the
//! compiled module's packed functions (host code, argument checks, `kiln_device_launch`), the
//! hand-written ones through `OpenClProgram::launch`, with the same global and local sizes on
//! the same tensors. Each call is timed with device events (markers recorded on the stream
//! before and after the launch, `event_elapsed`) and with the wall clock around launch + sync;
//! kiln's and the hand-written kernel's calls alternate, so load drifts hit both alike. Times
//! are medians with the spread (min - max); `x` = hand-written time / kiln time (> 1: kiln is
//! faster). Before timing, kiln's outputs are checked against the hand-written kernel's (and
//! against a Rust loop for vadd and rowsum).
//!
//! The second part is the host cost of one launch: a 256-element vadd called N times without
//! waiting (the queue bounded by a sync every 64 calls, see apache/tvm#16276), through kiln's
//! packed function, through `OpenClProgram::launch` of the hand-written kernel, and bare:
//! `clSetKernelArg` x 4 + `clEnqueueNDRangeKernel` with nothing of kiln in between
//! (`bare_opencl/`, its own context and queue on the same device); only the time spent in the
//! calls counts, not the syncs.
//!
//! Run: `cargo bench --bench opencl` (`KILN_BENCH_QUICK=1` for fewer repetitions;
//! `-- --source <kernel>` prints kiln's OpenCL C for a kernel), or as the last part of `cargo
//! bench --bench kernels`. Without an OpenCL device it says so and exits successfully.

use crate::bare_opencl;
use crate::util::{self, cpu_model, num_cpus, rnd};

use std::time::{Duration, Instant};

use kiln::codegen::device::HostDeviceModule;
use kiln::device_api::opencl::{KernelArg, OpenClProgram};
use kiln::device_api::{AttrKind, Device, DeviceApi, DeviceType, OpenClDeviceApi, Tensor};
use kiln::ir::{IRModule, PrimFunc};
use kiln::packed_func::{AnyView, DLTensor, Module, PackedFunc};
use kiln::schedule::kernels;
use kiln::target::Target;

/// Median, min and max of `v` (seconds).
type Stat = (f64, f64, f64);

fn stat(mut v: Vec<f64>) -> Stat {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// The hand-written kernels. Sizes are compile-time constants (`-D`-style `#define`s), as in
/// kiln's kernels, whose shapes are constants of the IR; vadd takes `n` as an argument.
fn hand_source(n: usize) -> String {
    format!(
        r#"#define N {n}

// C = A + B, one work-item per element, 256 per work-group; the last group's tail idles.
__attribute__((reqd_work_group_size(256, 1, 1)))
__kernel void vadd(__global const float* restrict A, __global const float* restrict B,
                   __global float* restrict C, const int n) {{
    const int i = get_global_id(0);
    if (i < n) C[i] = A[i] + B[i];
}}

// C = A B (N x N): a 64 x 64 block of C per work-group of 16 x 16 work-items, each a 4 x 4
// register tile; per k step of 16, a 64 x 16 tile of A and a 16 x 64 tile of B in local memory.
__attribute__((reqd_work_group_size(16, 16, 1)))
__kernel void matmul(__global const float* restrict A, __global const float* restrict B,
                     __global float* restrict C) {{
    __local float As[64][16];
    __local float Bs[16][64];
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int row0 = get_group_id(1) * 64, col0 = get_group_id(0) * 64;
    const int tid = ty * 16 + tx;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < N; k0 += 16) {{
        for (int l = 0; l < 4; ++l) {{
            As[l * 16 + ty][tx] = A[(row0 + l * 16 + ty) * N + k0 + tx];
            const int e = l * 256 + tid;
            Bs[e / 64][e % 64] = B[(k0 + e / 64) * N + col0 + e % 64];
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < 16; ++k) {{
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = As[ty * 4 + i][k];
            for (int j = 0; j < 4; ++j) b[j] = Bs[k][tx * 4 + j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }}
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) C[(row0 + ty * 4 + i) * N + col0 + tx * 4 + j] = acc[i][j];
}}

// B[r] = sum of row r of A (N x N): a work-group of 256 per row; work-item t sums columns
// t, t + 256, ... (coalesced), then a tree reduction in local memory. (The loops count steps,
// N / 256 for every work-item, as kiln's schedule does: on PoCL the `for (c = t; c < N; c +=
// 256)` form, whose trip count depends on t, took 1.5x (rowsum) and 1.85x (softmax) kiln's
// time.)
__attribute__((reqd_work_group_size(256, 1, 1)))
__kernel void rowsum(__global const float* restrict A, __global float* restrict B) {{
    __local float red[256];
    const int r = get_group_id(0), t = get_local_id(0);
    __global const float* row = A + r * N;
    float s = 0.0f;
    for (int j = 0; j < N / 256; ++j) s += row[j * 256 + t];
    red[t] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = 128; h > 0; h >>= 1) {{
        if (t < h) red[t] += red[t + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    if (t == 0) B[r] = red[0];
}}

// Row softmax of A (N x N): a work-group of 256 per row, three phases with one column in 256
// per work-item: the row max (tree reduction), exp(x - max) stored and summed (tree
// reduction), the scaling by 1 / sum.
__attribute__((reqd_work_group_size(256, 1, 1)))
__kernel void softmax(__global const float* restrict A, __global float* restrict B) {{
    __local float red[256];
    const int r = get_group_id(0), t = get_local_id(0);
    __global const float* a = A + r * N;
    __global float* b = B + r * N;
    float m = -INFINITY;
    for (int j = 0; j < N / 256; ++j) m = fmax(m, a[j * 256 + t]);
    red[t] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = 128; h > 0; h >>= 1) {{
        if (t < h) red[t] = fmax(red[t], red[t + h]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    m = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float s = 0.0f;
    for (int j = 0; j < N / 256; ++j) {{
        const float e = exp(a[j * 256 + t] - m);
        b[j * 256 + t] = e;
        s += e;
    }}
    red[t] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = 128; h > 0; h >>= 1) {{
        if (t < h) red[t] += red[t + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }}
    const float inv = 1.0f / red[0];
    for (int j = 0; j < N / 256; ++j) b[j * 256 + t] *= inv;
}}
"#
    )
}

fn build(f: PrimFunc) -> HostDeviceModule {
    let m = IRModule::from_functions(vec![f]);
    m.verify().unwrap();
    let built =
        kiln::codegen::opencl::build(&m, &Target::parse(r#"{"kind": "opencl"}"#).unwrap()).unwrap();
    // Time the host code's optimized tier, not the JIT's quick first tier.
    kiln::codegen::llvm::wait_all_optimized();
    built
}

/// The packed-function arguments for `ts` (the tensors outlive every call made with them).
fn views(ts: &[&Tensor]) -> Vec<AnyView<'static>> {
    ts.iter()
        .map(|t| {
            // SAFETY: (bench) the tensors outlive every call made with these views.
            let d: &'static DLTensor = unsafe { &*(t.as_dltensor() as *const _) };
            AnyView::from(d)
        })
        .collect()
}

fn buf(t: &Tensor) -> KernelArg {
    KernelArg::Buffer {
        ptr: t.data_ptr(),
        min_bytes: t.nbytes(),
    }
}

fn int_arg(v: i32) -> KernelArg {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&v.to_le_bytes());
    KernelArg::Scalar { bytes, size: 4 }
}

/// How far kiln's output `kv` is from the hand-written kernel's `hv` and from a Rust reference.
fn agreement(kv: &[f32], hv: &[f32], reference: &[f32]) -> String {
    format!(
        "|kiln-hand| {:.1e}, |kiln-Rust| {:.1e}",
        max_diff(kv, hv),
        max_diff(kv, reference)
    )
}

fn max_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from((x - y).abs()))
        .fold(0.0, f64::max)
}

struct Bench {
    api: std::sync::Arc<OpenClDeviceApi>,
    dev: Device,
    hand: OpenClProgram,
}

/// One measured side: device-event times and wall-clock times (seconds).
#[derive(Default)]
struct Times {
    device: Vec<f64>,
    wall: Vec<f64>,
}

impl Bench {
    fn sync(&self) {
        self.api
            .sync_stream(self.dev, self.api.current_stream(self.dev))
            .unwrap();
    }

    /// Times `kiln` and `hand` alternately (`warm` untimed rounds, then `reps`), each call
    /// between two recorded events, the wall clock around launch + sync.
    fn time_pair(
        &self,
        warm: usize,
        reps: usize,
        mut kiln: impl FnMut(),
        mut hand: impl FnMut(),
    ) -> (Times, Times) {
        let (api, dev) = (&self.api, self.dev);
        let (e0, e1) = (
            api.create_event(dev).unwrap(),
            api.create_event(dev).unwrap(),
        );
        let (mut tk, mut th) = (Times::default(), Times::default());
        for round in 0..warm + reps {
            for side in 0..2 {
                // Alternate which side goes first.
                let is_kiln = (side + round) % 2 == 0;
                let s = api.current_stream(dev);
                api.record_event(dev, s, e0).unwrap();
                let t = Instant::now();
                if is_kiln {
                    kiln();
                } else {
                    hand();
                }
                api.record_event(dev, s, e1).unwrap();
                api.sync_stream(dev, s).unwrap();
                let wall = t.elapsed().as_secs_f64();
                let device = api.event_elapsed(dev, e0, e1).unwrap().as_secs_f64();
                if round >= warm {
                    let out = if is_kiln { &mut tk } else { &mut th };
                    out.device.push(device);
                    out.wall.push(wall);
                }
            }
        }
        api.destroy_event(dev, e0).unwrap();
        api.destroy_event(dev, e1).unwrap();
        (tk, th)
    }

    fn hand_launch(&self, name: &str, args: &[KernelArg], global: [usize; 3], local: [usize; 3]) {
        self.hand.launch(0, name, args, global, local).unwrap();
    }

    /// Two output tensors of `shape` filled with NaN (so an element a kernel misses shows): kiln's
    /// and the hand-written kernel's.
    fn outputs(&self, shape: &[i64]) -> (Tensor, Tensor) {
        let n = shape.iter().product::<i64>() as usize;
        let nan = || Tensor::from_slice(&vec![f32::NAN; n], shape, self.dev).unwrap();
        (nan(), nan())
    }

    /// Runs `kiln` and `hand` once each and returns what they wrote into `ck` and `ch`.
    fn first_results(
        &self,
        kiln: impl Fn(),
        hand: impl Fn(),
        ck: &Tensor,
        ch: &Tensor,
    ) -> (Vec<f32>, Vec<f32>) {
        kiln();
        hand();
        self.sync();
        (ck.to_vec::<f32>().unwrap(), ch.to_vec::<f32>().unwrap())
    }
}

struct Row {
    name: &'static str,
    unit: &'static str,
    /// Work per call in the unit (bytes for GB/s, flops for GFLOP/s).
    work: f64,
    kiln: Times,
    hand: Times,
    check: String,
}

fn call(f: &PackedFunc, v: &[AnyView<'static>]) {
    f.call(v).unwrap();
}

/// The whole OpenCL bench (or, with `--source <kernel>` among the arguments, kiln's OpenCL C
/// for that kernel).
pub fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if let Some(k) = argv.iter().position(|a| a == "--source") {
        let f = match argv.get(k + 1).map_or("matmul", String::as_str) {
            "vadd" => kernels::opencl_vadd(),
            "rowsum" => kernels::opencl_rowsum(),
            "softmax" => kernels::opencl_softmax(),
            _ => kernels::opencl_matmul(),
        };
        print!("{}", build(f.unwrap()).source());
        return;
    }
    let quick = std::env::var("KILN_BENCH_QUICK").is_ok_and(|v| v == "1");
    let reps = |n: usize| if quick { n.div_ceil(4).max(3) } else { n };

    println!("CPU: {} ({} logical CPUs)", cpu_model(), num_cpus());
    let api = match kiln::device_api::opencl::global() {
        Ok(api) if api.device_count().unwrap_or(0) > 0 => api,
        Ok(_) => {
            println!("skipping the OpenCL benchmark: the OpenCL backend has no device");
            return;
        }
        Err(e) => {
            println!("skipping the OpenCL benchmark: no OpenCL device ({e})");
            return;
        }
    };
    let dev = Device::new(DeviceType::OPENCL, 0);
    let attr = |k| {
        api.attr(dev, k)
            .ok()
            .flatten()
            .map_or_else(|| "?".to_owned(), |v| v.to_string())
    };
    println!(
        "OpenCL device: {} ({}; {}; {} compute units)",
        attr(AttrKind::DEVICE_NAME),
        api.platform_name(dev).unwrap_or_default(),
        attr(AttrKind::DRIVER_VERSION),
        attr(AttrKind::MULTI_PROCESSOR_COUNT),
    );
    println!("load average {}", util::load_average());

    const N: usize = 4096;
    const MM: usize = 1024;
    let b = Bench {
        api: api.clone(),
        dev,
        hand: OpenClProgram::new(hand_source(N)),
    };
    // matmul's N differs from rowsum's and softmax's: a second program.
    let hand_mm = OpenClProgram::new(hand_source(MM));
    let t_build = Instant::now();
    b.hand.build(0).unwrap();
    hand_mm.build(0).unwrap();
    let data = |n: usize, seed: u32| -> Vec<f32> { (0..n).map(rnd(seed)).collect() };
    let mut rows = Vec::new();

    // vadd, n = 16M.
    {
        let n = 1usize << 24;
        let m = build(kernels::opencl_vadd().unwrap());
        let f = m.get_function("vadd").unwrap();
        let (x, y) = (data(n, 1), data(n, 2));
        let sh = [n as i64];
        let a = Tensor::from_slice(&x, &sh, dev).unwrap();
        let bb = Tensor::from_slice(&y, &sh, dev).unwrap();
        let (ck, ch) = b.outputs(&sh);
        let v = views(&[&a, &bb, &ck]);
        let hargs = [buf(&a), buf(&bb), buf(&ch), int_arg(n as i32)];
        let (g, l) = ([n.div_ceil(256) * 256, 1, 1], [256, 1, 1]);
        let (kv, hv) = b.first_results(
            || call(&f, &v),
            || b.hand_launch("vadd", &hargs, g, l),
            &ck,
            &ch,
        );
        let r: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
        let check = agreement(&kv, &hv, &r);
        let (kt, ht) = b.time_pair(
            3,
            reps(40),
            || call(&f, &v),
            || b.hand_launch("vadd", &hargs, g, l),
        );
        rows.push(Row {
            name: "vadd 16M",
            unit: "GB/s",
            work: 12.0 * n as f64,
            kiln: kt,
            hand: ht,
            check,
        });
    }
    // matmul 1024^3.
    {
        let n = MM;
        let m = build(kernels::opencl_matmul().unwrap());
        let f = m.get_function("matmul").unwrap();
        let sh = [n as i64, n as i64];
        let (x, y) = (data(n * n, 3), data(n * n, 4));
        let a = Tensor::from_slice(&x, &sh, dev).unwrap();
        let bb = Tensor::from_slice(&y, &sh, dev).unwrap();
        let (ck, ch) = b.outputs(&sh);
        let v = views(&[&a, &bb, &ck]);
        let hargs = [buf(&a), buf(&bb), buf(&ch)];
        let (g, l) = ([n / 4, n / 4, 1], [16, 16, 1]);
        let hl = || hand_mm.launch(0, "matmul", &hargs, g, l).unwrap();
        let (kv, hv) = b.first_results(|| call(&f, &v), hl, &ck, &ch);
        // A Rust reference for every 61st row (the whole product would take seconds).
        let mut ref_err = 0f64;
        for i in (0..n).step_by(61) {
            let mut r = vec![0f32; n];
            for k in 0..n {
                let p = x[i * n + k];
                for (z, q) in r.iter_mut().zip(&y[k * n..(k + 1) * n]) {
                    *z += p * q;
                }
            }
            ref_err = ref_err.max(max_diff(&kv[i * n..(i + 1) * n], &r));
        }
        let check = format!(
            "|kiln-hand| {:.1e}, |kiln-Rust| {:.1e} (rows i%61=0)",
            max_diff(&kv, &hv),
            ref_err
        );
        let (kt, ht) = b.time_pair(2, reps(20), || call(&f, &v), hl);
        rows.push(Row {
            name: "matmul 1024^3",
            unit: "GFLOP/s",
            work: 2.0 * (n * n * n) as f64,
            kiln: kt,
            hand: ht,
            check,
        });
    }
    // rowsum 4096 x 4096.
    {
        let n = N;
        let m = build(kernels::opencl_rowsum().unwrap());
        let f = m.get_function("rowsum").unwrap();
        let x = data(n * n, 5);
        let a = Tensor::from_slice(&x, &[n as i64, n as i64], dev).unwrap();
        let (ck, ch) = b.outputs(&[n as i64]);
        let v = views(&[&a, &ck]);
        let hargs = [buf(&a), buf(&ch)];
        let (g, l) = ([n * 256, 1, 1], [256, 1, 1]);
        let (kv, hv) = b.first_results(
            || call(&f, &v),
            || b.hand_launch("rowsum", &hargs, g, l),
            &ck,
            &ch,
        );
        let r: Vec<f32> = x.chunks(n).map(|row| row.iter().sum()).collect();
        let check = agreement(&kv, &hv, &r);
        let (kt, ht) = b.time_pair(
            3,
            reps(40),
            || call(&f, &v),
            || b.hand_launch("rowsum", &hargs, g, l),
        );
        rows.push(Row {
            name: "rowsum 4096^2",
            unit: "GB/s",
            work: 4.0 * (n * n) as f64,
            kiln: kt,
            hand: ht,
            check,
        });
    }
    // softmax 4096 x 4096.
    {
        let n = N;
        let m = build(kernels::opencl_softmax().unwrap());
        let f = m.get_function("softmax").unwrap();
        let sh = [n as i64, n as i64];
        let x: Vec<f32> = (0..n * n).map(|i| rnd(6)(i) * 4.0).collect();
        let a = Tensor::from_slice(&x, &sh, dev).unwrap();
        let (ck, ch) = b.outputs(&sh);
        let v = views(&[&a, &ck]);
        let hargs = [buf(&a), buf(&ch)];
        let (g, l) = ([n * 256, 1, 1], [256, 1, 1]);
        let (kv, hv) = b.first_results(
            || call(&f, &v),
            || b.hand_launch("softmax", &hargs, g, l),
            &ck,
            &ch,
        );
        let check = format!("|kiln-hand| {:.1e}", max_diff(&kv, &hv));
        let (kt, ht) = b.time_pair(
            3,
            reps(30),
            || call(&f, &v),
            || b.hand_launch("softmax", &hargs, g, l),
        );
        rows.push(Row {
            name: "softmax 4096^2",
            unit: "GB/s",
            // One read of A and one write of B: the least traffic any softmax needs.
            work: 8.0 * (n * n) as f64,
            kiln: kt,
            hand: ht,
            check,
        });
    }
    let setup = t_build.elapsed();

    // Launch overhead: a 256-element vadd, 64 launches between syncs.
    let launch = {
        let n = 256usize;
        let m = build(kernels::opencl_vadd().unwrap());
        let f = m.get_function("vadd").unwrap();
        let (x, y) = (data(n, 7), data(n, 8));
        let a = Tensor::from_slice(&x, &[n as i64], dev).unwrap();
        let bb = Tensor::from_slice(&y, &[n as i64], dev).unwrap();
        let c = Tensor::zeros(&[n as i64], a.dtype(), dev).unwrap();
        let v = views(&[&a, &bb, &c]);
        let hargs = [buf(&a), buf(&bb), buf(&c), int_arg(n as i32)];
        let bare = bare_opencl::BareVadd::new(n).unwrap();
        const BATCH: usize = 64;
        // 64 batches per sample in quick mode too: shorter samples (16 batches) read 1.7x bare
        // where these read 1.3-1.5x (a transient they do not amortize), and cost only ~0.1 s less.
        let batches = 64;
        // Per sample: `batches` x (64 launches, then a sync); the launch time excludes the syncs.
        let sample = |launch: &dyn Fn(), sync: &dyn Fn()| -> (f64, f64) {
            let mut in_calls = Duration::ZERO;
            let t = Instant::now();
            for _ in 0..batches {
                let s = Instant::now();
                for _ in 0..BATCH {
                    launch();
                }
                in_calls += s.elapsed();
                sync();
            }
            let total = t.elapsed().as_secs_f64();
            let calls = (batches * BATCH) as f64;
            (in_calls.as_secs_f64() / calls, total / calls)
        };
        let kl = || call(&f, &v);
        let hl = || b.hand_launch("vadd", &hargs, [n, 1, 1], [256, 1, 1]);
        let bl = || bare.launch();
        let ks = || b.sync();
        let bs = || bare.finish();
        // kiln's packed function, `OpenClProgram::launch`, bare OpenCL: calls and calls + syncs.
        let mut per: [(Vec<f64>, Vec<f64>); 3] = Default::default();
        let samples = reps(21);
        // (launch, sync) per side.
        type Side<'a> = (&'a dyn Fn(), &'a dyn Fn());
        let sides: [Side; 3] = [(&kl, &ks), (&hl, &ks), (&bl, &bs)];
        for round in 0..samples + 2 {
            // Rotate which side goes first.
            for k in 0..3 {
                let side = (k + round) % 3;
                let (l, sy) = sides[side];
                let (t, e2e) = sample(l, sy);
                if round >= 2 {
                    per[side].0.push(t);
                    per[side].1.push(e2e);
                }
            }
        }
        assert_eq!(
            c.to_vec::<f32>().unwrap(),
            x.iter().zip(&y).map(|(p, q)| p + q).collect::<Vec<_>>()
        );
        // kiln / bare per round (the two samples of a round are adjacent in time, so a drift
        // of the load hits both).
        let ratios: Vec<f64> = per[0].0.iter().zip(&per[2].0).map(|(k, b)| k / b).collect();
        (per.map(|(t, e)| (stat(t), stat(e))), stat(ratios))
    };

    println!(
        "\nkiln's OpenCL kernels vs hand-written OpenCL C of the same algorithm, same driver, same \
         global/local sizes"
    );
    println!(
        "median [min-max] over alternating calls; device = event to event on the stream, wall = \
         launch + sync;"
    );
    println!("x = hand-written time / kiln time (> 1: kiln faster); setup (builds, checks) {setup:.1?}\n");
    let tp = |r: &Row, t: Stat| {
        format!(
            "{:.1} [{:.1}-{:.1}]",
            r.work / t.0 / 1e9,
            r.work / t.2 / 1e9,
            r.work / t.1 / 1e9
        )
    };
    let ms = |t: Stat| format!("{:.2} [{:.2}-{:.2}]", t.0 * 1e3, t.1 * 1e3, t.2 * 1e3);
    println!(
        "{:<15} {:>7} | {:>20} {:>20} | {:>22} {:>22} {:>5} | {:>22} {:>22} {:>5} | check",
        "kernel",
        "unit",
        "kiln (device)",
        "hand (device)",
        "kiln device ms",
        "hand device ms",
        "x",
        "kiln wall ms",
        "hand wall ms",
        "x"
    );
    for r in &rows {
        let (kd, hd) = (stat(r.kiln.device.clone()), stat(r.hand.device.clone()));
        let (kw, hw) = (stat(r.kiln.wall.clone()), stat(r.hand.wall.clone()));
        println!(
            "{:<15} {:>7} | {:>20} {:>20} | {:>22} {:>22} {:>5.2} | {:>22} {:>22} {:>5.2} | {}",
            r.name,
            r.unit,
            tp(r, kd),
            tp(r, hd),
            ms(kd),
            ms(hd),
            hd.0 / kd.0,
            ms(kw),
            ms(hw),
            hw.0 / kw.0,
            r.check
        );
    }
    let ns = |t: Stat| format!("{:.0} [{:.0}-{:.0}]", t.0 * 1e9, t.1 * 1e9, t.2 * 1e9);
    println!(
        "\nlaunch overhead, vadd n=256, {} launches per sample in batches of 64 (sync between \
         batches, not timed); bare = clSetKernelArg x 4 + clEnqueueNDRangeKernel on its own \
         context and queue:",
        if quick { 16 * 64 } else { 64 * 64 }
    );
    let ([(kiln_t, kiln_e), (prog_t, prog_e), (bare_t, bare_e)], ratio) = launch;
    println!(
        "  host ns per launch: kiln packed function {}  OpenClProgram::launch {}  bare OpenCL {}",
        ns(kiln_t),
        ns(prog_t),
        ns(bare_t)
    );
    println!(
        "    kiln / bare = {:.2} (goal <= 1.5); per round: median {:.2} [{:.2}-{:.2}]; \
         OpenClProgram::launch / bare = {:.2}",
        kiln_t.0 / bare_t.0,
        ratio.0,
        ratio.1,
        ratio.2,
        prog_t.0 / bare_t.0
    );
    println!(
        "  with the syncs, ns per launch: kiln {}  OpenClProgram::launch {}  bare {}  kiln / bare = {:.2}",
        ns(kiln_e),
        ns(prog_e),
        ns(bare_e),
        kiln_e.0 / bare_e.0
    );
}
