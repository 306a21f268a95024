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
    use kiln::packed_func::Module;
    let m = kiln::codegen::llvm::LlvmModule::jit(
        &kiln::ir::IRModule::from_functions(vec![f.clone()]),
        &kiln::codegen::llvm::CodegenOptions::host(),
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

/// Runs `f` JIT-compiled with `opts` on [`schedule_inputs`]; returns the last buffer.
pub fn jit_last(
    f: &kiln::ir::PrimFunc,
    shapes: &[Vec<i64>],
    opts: &kiln::codegen::llvm::CodegenOptions,
) -> Vec<f32> {
    use kiln::packed_func::Module;
    let m = kiln::codegen::llvm::LlvmModule::jit(
        &kiln::ir::IRModule::from_functions(vec![f.clone()]),
        opts,
    )
    .unwrap();
    let pf = m.require_function(&f.name).unwrap();
    let mut arrays: Vec<HostArray> = schedule_inputs(shapes)
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
