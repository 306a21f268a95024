//! The launch-overhead baseline of the OpenCL bench (`benches/opencl_kernels`): OpenCL driven with nothing of kiln in
//! between. The ICD loader is opened here with `libloading`; one context, in-order queue,
//! program, kernel and three buffers are made on the first device of the first platform (the
//! device kiln calls `opencl:0` when one platform is installed, as in CI); a launch is exactly
//! one `clSetKernelArg` per argument and one `clEnqueueNDRangeKernel`, which is what any host
//! has to call per launch (TVM's OpenCL runtime calls the same two, after its own lookups).
//! No checks, no locks, no lookups: the floor a runtime's launch path can be measured against.

use std::ffi::{c_char, c_void, CString};
use std::ptr::{null, null_mut};

type ClInt = i32;
type Handle = *mut c_void;

/// One entry point of the table, resolved by name.
macro_rules! table {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {
        #[allow(non_snake_case)]
        struct Fns {
            $($name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }
        impl Fns {
            fn load(lib: &libloading::Library) -> Result<Fns, String> {
                // SAFETY: each symbol is an OpenCL 1.2 entry point with the C signature declared
                // here (the Khronos headers' prototypes).
                unsafe {
                    Ok(Fns {
                        $($name: *lib
                            .get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                            .map_err(|e| e.to_string())?,)*
                    })
                }
            }
        }
    };
}

table! {
    clGetPlatformIDs: fn(u32, *mut Handle, *mut u32) -> ClInt;
    clGetDeviceIDs: fn(Handle, u64, u32, *mut Handle, *mut u32) -> ClInt;
    clCreateContext: fn(*const isize, u32, *const Handle, *const c_void, *mut c_void, *mut ClInt) -> Handle;
    clCreateCommandQueue: fn(Handle, Handle, u64, *mut ClInt) -> Handle;
    clCreateBuffer: fn(Handle, u64, usize, *mut c_void, *mut ClInt) -> Handle;
    clCreateProgramWithSource: fn(Handle, u32, *const *const c_char, *const usize, *mut ClInt) -> Handle;
    clBuildProgram: fn(Handle, u32, *const Handle, *const c_char, *const c_void, *mut c_void) -> ClInt;
    clCreateKernel: fn(Handle, *const c_char, *mut ClInt) -> Handle;
    clSetKernelArg: fn(Handle, u32, usize, *const c_void) -> ClInt;
    clEnqueueNDRangeKernel: fn(Handle, Handle, u32, *const usize, *const usize, *const usize, u32, *const Handle, *mut Handle) -> ClInt;
    clFinish: fn(Handle) -> ClInt;
    clReleaseMemObject: fn(Handle) -> ClInt;
    clReleaseKernel: fn(Handle) -> ClInt;
    clReleaseProgram: fn(Handle) -> ClInt;
    clReleaseCommandQueue: fn(Handle) -> ClInt;
    clReleaseContext: fn(Handle) -> ClInt;
}

const CL_DEVICE_TYPE_ALL: u64 = 0xFFFF_FFFF;
const CL_MEM_READ_WRITE: u64 = 1;

/// `C = A + B` over `n` floats, one work-item per element (the kernel of the launch benchmark).
const VADD: &str = "__kernel void vadd(__global const float* restrict A, \
                    __global const float* restrict B, __global float* restrict C, const int n) \
                    { const int i = get_global_id(0); if (i < n) C[i] = A[i] + B[i]; }";

/// A bare vadd launcher: its own context, queue, kernel and buffers of `n` floats.
pub struct BareVadd {
    fns: Fns,
    ctx: Handle,
    queue: Handle,
    program: Handle,
    kernel: Handle,
    bufs: [Handle; 3],
    n: i32,
    // Dropped last: the entry points live in it.
    _lib: libloading::Library,
}

fn check(what: &str, code: ClInt) -> Result<(), String> {
    if code == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed: OpenCL error {code}"))
    }
}

impl BareVadd {
    /// Sets up on the first device of the first platform.
    pub fn new(n: usize) -> Result<BareVadd, String> {
        // SAFETY: loading the ICD loader runs its initializers, as kiln's own loading does.
        let lib =
            unsafe { libloading::Library::new("libOpenCL.so.1") }.map_err(|e| e.to_string())?;
        let fns = Fns::load(&lib)?;
        let mut b = BareVadd {
            fns,
            ctx: null_mut(),
            queue: null_mut(),
            program: null_mut(),
            kernel: null_mut(),
            bufs: [null_mut(); 3],
            n: i32::try_from(n).map_err(|e| e.to_string())?,
            _lib: lib,
        };
        // SAFETY: every call gets the handles made by the calls before it (checked for errors
        // on the way) and pointers to live locals; what is made is released in `drop`.
        unsafe {
            let f = &b.fns;
            let (mut platform, mut device, mut count) = (null_mut(), null_mut(), 0u32);
            check(
                "clGetPlatformIDs",
                (f.clGetPlatformIDs)(1, &mut platform, &mut count),
            )?;
            check(
                "clGetDeviceIDs",
                (f.clGetDeviceIDs)(platform, CL_DEVICE_TYPE_ALL, 1, &mut device, &mut count),
            )?;
            let mut err = 0;
            b.ctx = (f.clCreateContext)(null(), 1, &device, null(), null_mut(), &mut err);
            check("clCreateContext", err)?;
            b.queue = (f.clCreateCommandQueue)(b.ctx, device, 0, &mut err);
            check("clCreateCommandQueue", err)?;
            for buf in &mut b.bufs {
                *buf = (f.clCreateBuffer)(b.ctx, CL_MEM_READ_WRITE, n * 4, null_mut(), &mut err);
                check("clCreateBuffer", err)?;
            }
            let (src, len) = (VADD.as_ptr().cast::<c_char>(), VADD.len());
            b.program = (f.clCreateProgramWithSource)(b.ctx, 1, &src, &len, &mut err);
            check("clCreateProgramWithSource", err)?;
            check(
                "clBuildProgram",
                (f.clBuildProgram)(b.program, 1, &device, null(), null(), null_mut()),
            )?;
            let name = CString::new("vadd").expect("no NUL");
            b.kernel = (f.clCreateKernel)(b.program, name.as_ptr(), &mut err);
            check("clCreateKernel", err)?;
        }
        Ok(b)
    }

    /// One launch: the four arguments set, the kernel enqueued (256 work-items per group).
    pub fn launch(&self) {
        let f = &self.fns;
        let global = (self.n as usize).div_ceil(256) * 256;
        let local = 256usize;
        // SAFETY: the kernel and buffers are live (released only in `drop`); each argument
        // pointer points at a value of the size passed.
        unsafe {
            for (i, m) in self.bufs.iter().enumerate() {
                let code = (f.clSetKernelArg)(
                    self.kernel,
                    i as u32,
                    size_of::<Handle>(),
                    (m as *const Handle).cast(),
                );
                assert_eq!(code, 0, "clSetKernelArg");
            }
            let n = self.n;
            let code = (f.clSetKernelArg)(self.kernel, 3, 4, (&n as *const i32).cast());
            assert_eq!(code, 0, "clSetKernelArg");
            let code = (f.clEnqueueNDRangeKernel)(
                self.queue,
                self.kernel,
                1,
                null(),
                &global,
                &local,
                0,
                null(),
                null_mut(),
            );
            assert_eq!(code, 0, "clEnqueueNDRangeKernel");
        }
    }

    /// Waits for every launch so far.
    pub fn finish(&self) {
        // SAFETY: the queue is live.
        let code = unsafe { (self.fns.clFinish)(self.queue) };
        assert_eq!(code, 0, "clFinish");
    }
}

impl Drop for BareVadd {
    fn drop(&mut self) {
        let f = &self.fns;
        // SAFETY: each handle was made in `new` (or is null, skipped) and is released once;
        // the queue is drained first so no command still uses the buffers.
        unsafe {
            if !self.queue.is_null() {
                (f.clFinish)(self.queue);
            }
            if !self.kernel.is_null() {
                (f.clReleaseKernel)(self.kernel);
            }
            if !self.program.is_null() {
                (f.clReleaseProgram)(self.program);
            }
            for m in self.bufs {
                if !m.is_null() {
                    (f.clReleaseMemObject)(m);
                }
            }
            if !self.queue.is_null() {
                (f.clReleaseCommandQueue)(self.queue);
            }
            if !self.ctx.is_null() {
                (f.clReleaseContext)(self.ctx);
            }
        }
    }
}
