//! kiln's OpenCL kernels against hand-written OpenCL C, and the launch overhead against a bare
//! launch: `opencl_kernels` (also the last part of `cargo bench --bench kernels`).
//!
//! Run: `cargo bench --bench opencl` (`KILN_BENCH_QUICK=1` for fewer repetitions;
//! `-- --source <kernel>` prints kiln's OpenCL C for a kernel).

mod bare_opencl;
mod opencl_kernels;
mod util;

fn main() {
    opencl_kernels::main();
}
