//! Helpers shared by integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles C sources into a shared library in `dir` with the system C compiler (`$CC` or `cc`).
pub fn build_c_shared(dir: &Path, name: &str, sources: &[&str], extra: &[&str]) -> PathBuf {
    let out = dir.join(format!("lib{name}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(cc);
    cmd.args(["-shared", "-fPIC", "-O2", "-o"]).arg(&out);
    for s in sources {
        cmd.arg(root.join(s));
    }
    cmd.args(extra);
    let status = cmd.status().expect("running the C compiler");
    assert!(status.success(), "C compiler failed for {sources:?}");
    out
}

/// A host array that can be viewed as a `DLTensor` (tests only; the library's `Tensor` lives in
/// `device_api`).
pub struct HostArray {
    pub data: Vec<u64>,
    pub shape: Vec<i64>,
    pub strides: Option<Vec<i64>>,
    pub dtype: kiln::packed_func::DLDataType,
    pub nbytes: usize,
}

impl HostArray {
    pub fn f32(shape: &[i64], values: &[f32]) -> Self {
        let mut a = Self::zeros(
            shape,
            kiln::packed_func::DLDataType {
                code: kiln::packed_func::ffi::DLDataTypeCode::FLOAT,
                bits: 32,
                lanes: 1,
            },
            4,
        );
        assert_eq!(values.len() * 4, a.nbytes);
        a.bytes_mut().copy_from_slice(
            &values
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect::<Vec<u8>>(),
        );
        a
    }

    pub fn zeros(shape: &[i64], dtype: kiln::packed_func::DLDataType, elem: usize) -> Self {
        let n: i64 = shape.iter().product();
        let nbytes = n as usize * elem;
        HostArray {
            data: vec![0u64; nbytes.div_ceil(8) + 1],
            shape: shape.to_vec(),
            strides: None,
            dtype,
            nbytes,
        }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.nbytes;
        // SAFETY: the u64 buffer holds at least `nbytes` bytes.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_mut_ptr().cast::<u8>(), n) }
    }

    pub fn to_f32(&self) -> Vec<f32> {
        // SAFETY: the u64 buffer holds at least `nbytes` bytes.
        let b = unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<u8>(), self.nbytes) };
        b.chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    pub fn dl(&mut self) -> kiln::packed_func::DLTensor {
        kiln::packed_func::DLTensor {
            data: self.data.as_mut_ptr().cast(),
            device: kiln::packed_func::DLDevice {
                device_type: kiln::packed_func::DLDeviceType::CPU,
                device_id: 0,
            },
            ndim: self.shape.len() as i32,
            dtype: self.dtype,
            shape: self.shape.as_mut_ptr(),
            strides: self
                .strides
                .as_mut()
                .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: 0,
        }
    }
}

impl HostArray {
    pub fn to_i64(&self) -> Vec<f64> {
        // SAFETY: the u64 buffer holds at least `nbytes` bytes.
        let b = unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<u8>(), self.nbytes) };
        let e = self.dtype.bits as usize / 8;
        b.chunks_exact(e)
            .map(|c| {
                let mut v = [0u8; 8];
                v[..e].copy_from_slice(c);
                let s = 64 - 8 * e as u32;
                ((i64::from_ne_bytes(v) << s) >> s) as f64
            })
            .collect()
    }
}

/// The Python (`KILN_PYTHON`, default `python3`) if it can import tvm_ffi and numpy. Without it
/// the caller skips, except under `KILN_REQUIRE_TVM_FFI=1` (CI), where this panics.
pub fn python_with_tvm_ffi() -> Option<String> {
    python_with(
        "tvm_ffi, numpy",
        "KILN_REQUIRE_TVM_FFI",
        "pip install apache-tvm-ffi numpy",
    )
}

/// The Python (`KILN_PYTHON`) if it can import TVM 0.27, tvm_ffi and numpy; else skips, or
/// panics under `KILN_REQUIRE_TVM=1` (CI).
pub fn python_with_tvm() -> Option<String> {
    python_with(
        "tvm, tvm_ffi, numpy",
        "KILN_REQUIRE_TVM",
        "pip install apache-tvm==0.27.0.post1",
    )
}

/// `KILN_PYTHON` (default `python3`) if it imports `modules`; else a visible skip, or a panic
/// when the environment variable `require` is `1`.
fn python_with(modules: &str, require: &str, install: &str) -> Option<String> {
    let py = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert_ne!(
            std::env::var(require).as_deref(),
            Ok("1"),
            "{require}=1 but `{py}` cannot import {modules} ({install})"
        );
        eprintln!("skipped: `{py}` cannot import {modules} ({install})");
        return None;
    }
    Some(py)
}

/// Calls a `vadd` kernel (`C = A + B`, f32) on `n` elements and checks the sum.
pub fn check_vadd(f: &kiln::packed_func::PackedFunc, n: i64) {
    use kiln::packed_func::AnyView;
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

/// `opencl:0` and its backend when an OpenCL device exists. Without one, prints a visible
/// `skipping: no OpenCL device (...) [test]` line and returns `None` (the caller returns),
/// except under `KILN_REQUIRE_OPENCL=1` (CI), where this panics.
pub fn opencl_device(
    test: &str,
) -> Option<(
    std::sync::Arc<kiln::device_api::OpenClDeviceApi>,
    kiln::device_api::Device,
)> {
    use kiln::device_api::{opencl, Device, DeviceApi, DeviceType};
    let why = match opencl::global() {
        Ok(api) if api.device_count().unwrap_or(0) > 0 => {
            return Some((api, Device::new(DeviceType::OPENCL, 0)))
        }
        Ok(_) => "the OpenCL backend has no device".to_owned(),
        Err(e) => e.to_string(),
    };
    assert_ne!(
        std::env::var("KILN_REQUIRE_OPENCL").as_deref(),
        Ok("1"),
        "KILN_REQUIRE_OPENCL=1 but there is no OpenCL device: {why}"
    );
    eprintln!("skipping: no OpenCL device ({why}) [{test}]");
    None
}

/// `cuda:0` and its backend when a CUDA device exists (the real driver, `libcuda.so.1`, unless
/// `KILN_CUDA_DRIVER` names another library). Without one, prints a visible
/// `skipping: no CUDA device (...) [test]` line and returns `None` (the caller returns), except
/// under `KILN_REQUIRE_CUDA=1` (a machine with a GPU), where this panics.
pub fn cuda_device(
    test: &str,
) -> Option<(
    std::sync::Arc<kiln::device_api::CudaDeviceApi>,
    kiln::device_api::Device,
)> {
    use kiln::device_api::{cuda, Device, DeviceApi, DeviceType};
    let why = match cuda::global() {
        Ok(api) if api.device_count().unwrap_or(0) > 0 => {
            return Some((api, Device::new(DeviceType::CUDA, 0)))
        }
        Ok(_) => "the CUDA backend has no device".to_owned(),
        Err(e) => e.to_string(),
    };
    assert_ne!(
        std::env::var("KILN_REQUIRE_CUDA").as_deref(),
        Ok("1"),
        "KILN_REQUIRE_CUDA=1 but there is no CUDA device: {why}"
    );
    eprintln!("skipping: no CUDA device ({why}) [{test}]");
    None
}

impl HostArray {
    /// A copy of an interpreter buffer (compact), in 8-byte-aligned storage.
    pub fn from_host_buffer(b: &kiln::ir::interp::HostBuffer) -> Self {
        let mut a = Self::zeros(
            &b.shape,
            kiln::packed_func::DLDataType {
                code: kiln::packed_func::ffi::DLDataTypeCode(b.dtype.code as u8),
                bits: b.dtype.bits,
                lanes: 1,
            },
            b.dtype.bytes(),
        );
        a.bytes_mut().copy_from_slice(&b.data);
        a
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the u64 buffer holds at least `nbytes` bytes.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<u8>(), self.nbytes) }
    }
}

/// Compiles `f` alone for the host (JIT, its optimized tier), calls it on copies of the buffers
/// `bufs` (one per parameter, in order) and returns each buffer's bytes after the call.
pub fn run_jit(f: &kiln::ir::PrimFunc, bufs: &[kiln::ir::interp::HostBuffer]) -> Vec<Vec<u8>> {
    run_jit_with(f, bufs, &kiln::codegen::llvm::CodegenOptions::host())
}

/// [`run_jit`] with code built with `opts` (a CPU the host can run).
pub fn run_jit_with(
    f: &kiln::ir::PrimFunc,
    bufs: &[kiln::ir::interp::HostBuffer],
    opts: &kiln::codegen::llvm::CodegenOptions,
) -> Vec<Vec<u8>> {
    use kiln::packed_func::Module;
    let m = kiln::codegen::llvm::LlvmModule::jit(
        &kiln::ir::IRModule::from_functions(vec![f.clone()]),
        opts,
    )
    .unwrap();
    m.wait_optimized().unwrap();
    let pf = m.require_function(&f.name).unwrap();
    let mut arrays: Vec<HostArray> = bufs.iter().map(HostArray::from_host_buffer).collect();
    let dls: Vec<kiln::packed_func::DLTensor> = arrays.iter_mut().map(HostArray::dl).collect();
    let views: Vec<kiln::packed_func::AnyView> =
        dls.iter().map(kiln::packed_func::AnyView::from).collect();
    pf.call(&views).unwrap();
    arrays.iter().map(|a| a.bytes().to_vec()).collect()
}

/// The inputs of the schedule tests: buffer `k` of shape `s` holds `((i * 7 + 3 k) % 11) / 4 - 1`
/// at element `i` (small values, exact in float32, different per buffer).
pub fn schedule_inputs(shapes: &[Vec<i64>]) -> Vec<Vec<f32>> {
    shapes
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let n: i64 = s.iter().product();
            (0..n)
                .map(|i| ((i * 7 + k as i64 * 3) % 11) as f32 * 0.25 - 1.0)
                .collect()
        })
        .collect()
}

/// [`schedule_inputs`] as interpreter arguments.
pub fn interp_args(shapes: &[Vec<i64>]) -> Vec<kiln::ir::interp::InterpArg> {
    schedule_inputs(shapes)
        .iter()
        .zip(shapes)
        .map(|(v, s)| {
            kiln::ir::interp::InterpArg::Buffer(kiln::ir::interp::HostBuffer::from_slice(s, v))
        })
        .collect()
}

/// Runs `f` in the interpreter on [`schedule_inputs`]; returns the last buffer.
pub fn interp_last(f: &kiln::ir::PrimFunc, shapes: &[Vec<i64>]) -> Vec<f32> {
    let mut args = interp_args(shapes);
    kiln::ir::interp::run(f, &mut args).unwrap_or_else(|e| panic!("{}: {e}", f.name));
    args.last().unwrap().to_vec::<f32>().unwrap()
}

/// The code generator's options for the target JSON or string `t`, `native` resolved.
pub fn target_opts(t: &str) -> kiln::codegen::llvm::CodegenOptions {
    kiln::codegen::llvm::CodegenOptions::from_target(&kiln::target::Target::parse(t).unwrap())
        .unwrap()
        .resolved()
}

/// Runs `f` JIT-compiled with `opts` on [`schedule_inputs`]; returns the last buffer.
pub fn jit_last(
    f: &kiln::ir::PrimFunc,
    shapes: &[Vec<i64>],
    opts: &kiln::codegen::llvm::CodegenOptions,
) -> Vec<f32> {
    jit_last_on(f, shapes, opts, &schedule_inputs(shapes))
}

/// Runs `f` JIT-compiled with `opts` on `inputs` (one `float32` array per shape); returns the
/// last buffer.
pub fn jit_last_on(
    f: &kiln::ir::PrimFunc,
    shapes: &[Vec<i64>],
    opts: &kiln::codegen::llvm::CodegenOptions,
    inputs: &[Vec<f32>],
) -> Vec<f32> {
    use kiln::packed_func::Module;
    let m = kiln::codegen::llvm::LlvmModule::jit(
        &kiln::ir::IRModule::from_functions(vec![f.clone()]),
        opts,
    )
    .unwrap();
    let pf = m.require_function(&f.name).unwrap();
    let mut arrays: Vec<HostArray> = inputs
        .iter()
        .zip(shapes)
        .map(|(v, s)| HostArray::f32(s, v))
        .collect();
    let dls: Vec<kiln::packed_func::DLTensor> = arrays.iter_mut().map(HostArray::dl).collect();
    let views: Vec<kiln::packed_func::AnyView> =
        dls.iter().map(kiln::packed_func::AnyView::from).collect();
    pf.call(&views).unwrap();
    arrays.last().unwrap().to_f32()
}

/// NVIDIA's PTX assembler: `KILN_PTXAS`, else `ptxas` on `PATH`. `None` when there is none
/// (a `skipping:` line is printed once), and a panic instead under `KILN_REQUIRE_PTXAS=1`
/// (CI installs it from the `nvidia-cuda-nvcc-cu12` wheel).
pub fn ptxas() -> Option<PathBuf> {
    static PTXAS: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    PTXAS
        .get_or_init(|| {
            let found = std::env::var_os("KILN_PTXAS")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("PATH").and_then(|p| {
                        std::env::split_paths(&p)
                            .map(|d| d.join("ptxas"))
                            .find(|c| c.is_file())
                    })
                })
                .filter(|p| {
                    Command::new(p)
                        .arg("--version")
                        .output()
                        .is_ok_and(|o| o.status.success())
                });
            if found.is_none() {
                assert_ne!(
                    std::env::var("KILN_REQUIRE_PTXAS").as_deref(),
                    Ok("1"),
                    "KILN_REQUIRE_PTXAS=1 but no working ptxas (set KILN_PTXAS or put ptxas on PATH)"
                );
                eprintln!("skipping: no ptxas (set KILN_PTXAS; `pip install nvidia-cuda-nvcc-cu12` has one): PTX is not checked");
            }
            found
        })
        .clone()
}

/// The architectures every PTX of the tests is assembled for.
pub const PTXAS_ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// Assembles `ptx` with ptxas for each of [`PTXAS_ARCHS`] not older than its `.target`; `Ok`
/// when ptxas accepts it everywhere (or there is no ptxas, see [`ptxas`]), else ptxas's
/// messages.
pub fn ptxas_check(ptx: &str) -> Result<(), String> {
    let Some(ptxas) = ptxas() else { return Ok(()) };
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let src = dir.path().join("k.ptx");
    std::fs::write(&src, ptx).map_err(|e| e.to_string())?;
    // PTX for `.target sm_86` assembles for sm_86 and newer only.
    let target: u32 = ptx
        .lines()
        .find_map(|l| l.trim().strip_prefix(".target sm_"))
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| "the PTX has no `.target sm_NN` line".to_owned())?;
    let mut checked = 0;
    for arch in PTXAS_ARCHS {
        if arch[3..].parse::<u32>().unwrap_or(0) < target {
            continue;
        }
        checked += 1;
        let out = Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg(&src)
            .arg("-o")
            .arg(dir.path().join(format!("k_{arch}.cubin")))
            .output()
            .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
        if !out.status.success() {
            return Err(format!(
                "ptxas -arch={arch} rejects the PTX: {}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ));
        }
    }
    if checked == 0 {
        return Err(format!(
            "PTX for sm_{target} is newer than every arch checked"
        ));
    }
    Ok(())
}

/// `C[i] = A[i] + B[i]` for `i < n` as a device kernel: 64 threads per block, `ceil(n / 64)`
/// blocks.
pub fn device_vadd() -> kiln::ir::PrimFunc {
    use kiln::ir::builder::{if_then_else, size_var, thread_for};
    use kiln::ir::{Buffer, DataType, Expr, Param, PrimFunc, ThreadTag};
    let n = size_var("n");
    let ne = Expr::Var(n.clone());
    let buf = |name: &str| Buffer::new(name, DataType::f32(), vec![ne.clone()]);
    let (a, b, c) = (buf("A"), buf("B"), buf("C"));
    let blocks = (ne.clone() + 63i64).floordiv(64i64);
    let body = thread_for("bx", blocks, ThreadTag::Block(0), |bx| {
        thread_for("tx", Expr::from(64i64), ThreadTag::Thread(0), |tx| {
            let i = bx * 64i64 + tx;
            if_then_else(
                i.clone().lt(ne.clone()),
                c.store([i.clone()], a.load([i.clone()]) + b.load([i])),
                None,
            )
        })
    });
    PrimFunc::new(
        "vadd",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
}

/// `for i { B[i] = A[i] + 1; A[i + 1] = B[i] * 0.5 }`: distributing the loop over its two
/// statements (`fission`) changes the results.
pub fn chained(n: i64) -> kiln::ir::PrimFunc {
    let a = kiln::ir::Buffer::new(
        "A",
        kiln::ir::DataType::f32(),
        vec![kiln::ir::Expr::from(n)],
    );
    let b = kiln::ir::Buffer::new(
        "B",
        kiln::ir::DataType::f32(),
        vec![kiln::ir::Expr::from(n)],
    );
    let body = kiln::ir::builder::for_range(
        "i",
        kiln::ir::Expr::from(n - 1),
        kiln::ir::ForKind::Serial,
        |i| {
            kiln::ir::Stmt::Seq(vec![
                b.store(
                    [i.clone()],
                    a.load([i.clone()]) + kiln::ir::Expr::from(1.0f32),
                ),
                a.store(
                    [i.clone() + 1i64],
                    b.load([i]) * kiln::ir::Expr::from(0.5f32),
                ),
            ])
        },
    );
    kiln::ir::PrimFunc::new(
        "chained",
        vec![kiln::ir::Param::Buffer(a), kiln::ir::Param::Buffer(b)],
        body,
    )
    .with_noalias(true)
}

/// A tuning record of `f` on `target` measured on `cpu` and `device`: `steps` taking `ms`
/// milliseconds a call against a default of 10 ms.
pub fn tune_record(
    f: &kiln::ir::PrimFunc,
    target: &kiln::target::Target,
    cpu: &str,
    device: &str,
    steps: Vec<kiln::schedule::Step>,
    ms: f64,
) -> kiln::tune::Record {
    let t = |x: f64| kiln::tune::Timing {
        median: x / 1e3,
        min: x / 1e3,
        max: x / 1e3,
    };
    kiln::tune::Record {
        format: kiln::tune::db::FORMAT.into(),
        workload: kiln::tune::db::workload(f),
        target: target.to_string(),
        cpu: cpu.into(),
        device: device.into(),
        steps,
        time: t(ms),
        default_time: t(10.0),
        trials: 1,
        seed: 0,
        kiln: "test".into(),
        paired: None,
        finals: None,
        huge_pages: false,
    }
}

/// kiln's RPC server on a free loopback port, serving from a thread of this process: its
/// address, and a guard that stops it and joins the thread when dropped.
pub fn rpc_server() -> (String, RpcServerGuard) {
    use kiln::rpc::{Server, ServerConfig};
    let server = Server::bind(ServerConfig {
        port: 0,
        ..ServerConfig::default()
    })
    .unwrap();
    let addr = format!("127.0.0.1:{}", server.port());
    let stop = server.stop_handle();
    let thread = std::thread::spawn(move || server.serve().unwrap());
    (
        addr,
        RpcServerGuard {
            stop,
            thread: Some(thread),
        },
    )
}

/// Stops the server of [`rpc_server`] when dropped.
pub struct RpcServerGuard {
    stop: kiln::rpc::StopHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RpcServerGuard {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// kiln's `matmul_sized(m, n, k)` scheduled by `matmul_tiled_packing` (its loops as the
/// builder names them) with `mr x nr` register tiles, row blocks of `mb` and `k` in passes of
/// `kc` (0: one pass), `B` and `A` packed as given.
pub fn packed_matmul(
    [m, n, k]: [i64; 3],
    [mr, nr, mb, kc]: [i64; 4],
    pack: kiln::schedule::kernels::PackB,
    pack_a: kiln::schedule::kernels::PackA,
) -> kiln::schedule::Schedule {
    use kiln::schedule::kernels as sk;
    sk::matmul_tiled_packing(
        kiln::schedule::Schedule::new(kiln::ir::kernels::matmul_sized(m, n, k)),
        &sk::MatmulParts::default(),
        [m, n, k],
        sk::MatmulTiles { mr, nr, mb, kc },
        pack,
        pack_a,
    )
    .unwrap_or_else(|e| panic!("{m}x{n}x{k}, tiles {mr}x{nr}, {mb} rows, kc {kc}: {e}"))
}
