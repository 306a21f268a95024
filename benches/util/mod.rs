//! A small measuring helper shared by kiln's benchmarks: every figure is the median of several
//! timed batches, printed with its spread, so that ratios taken in one run are meaningful on a
//! noisy machine.
#![allow(dead_code)]

use std::path::Path;
use std::time::Instant;

use kiln::packed_func::ffi::DLDataTypeCode;
use kiln::packed_func::{DLDataType, DLDevice, DLDeviceType, DLTensor};

/// Per-iteration times of one measured thing, in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    /// Median over batches.
    pub median: f64,
    /// Fastest batch.
    pub min: f64,
    /// Slowest batch.
    pub max: f64,
}

/// Times `f` in `batches` batches of `iters` calls and returns ns per call.
pub fn measure(batches: usize, iters: u64, mut f: impl FnMut()) -> Stats {
    for _ in 0..iters.min(1000) {
        f();
    }
    let mut per: Vec<f64> = (0..batches)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    per.sort_by(f64::total_cmp);
    Stats {
        median: per[per.len() / 2],
        min: per[0],
        max: per[per.len() - 1],
    }
}

/// Prints one row: name, median, spread, and the ratio to a baseline median (if any).
pub fn report(name: &str, s: Stats, baseline: Option<Stats>) {
    let ratio = baseline
        .map(|b| format!("{:6.2}x baseline", s.median / b.median))
        .unwrap_or_default();
    println!(
        "{name:<48} median {:>10.2} ns   [min {:>9.2}, max {:>9.2}]  {ratio}",
        s.median, s.min, s.max
    );
}

/// A 1-D float32 CPU `DLTensor` over `data` with extent `*shape` (both must outlive its use).
pub fn f32_tensor(data: *mut f32, shape: *mut i64) -> kiln::packed_func::DLTensor {
    use kiln::packed_func::{ffi::DLDataTypeCode, DLDataType, DLDevice, DLDeviceType};
    kiln::packed_func::DLTensor {
        data: data.cast(),
        device: DLDevice {
            device_type: DLDeviceType::CPU,
            device_id: 0,
        },
        ndim: 1,
        dtype: DLDataType {
            code: DLDataTypeCode::FLOAT,
            bits: 32,
            lanes: 1,
        },
        shape,
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

/// The CPU's model name (`/proc/cpuinfo`), printed beside every figure.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The logical CPUs this process may use.
pub fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The load averages (`/proc/loadavg`), printed beside figures taken on a shared machine.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

impl Stats {
    /// The median, min and max of the values `v` (not empty).
    pub fn of(v: &[f64]) -> Stats {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        Stats {
            median: s[s.len() / 2],
            min: s[0],
            max: s[s.len() - 1],
        }
    }
}

/// The median of `v` (not empty).
pub fn median(v: &[f64]) -> f64 {
    Stats::of(v).median
}

/// A 64-byte-aligned f32 array with its shape, viewable as a DLTensor.
pub struct Array {
    buf: Vec<f32>,
    off: usize,
    len: usize,
    shape: Vec<i64>,
}

impl Array {
    pub fn new(shape: &[i64], f: impl Fn(usize) -> f32) -> Array {
        let len: i64 = shape.iter().product();
        let len = len as usize;
        let mut buf = vec![0f32; len + 16];
        let off = (64 - (buf.as_ptr() as usize % 64)) % 64 / 4;
        for (i, x) in buf[off..off + len].iter_mut().enumerate() {
            *x = f(i);
        }
        Array {
            buf,
            off,
            len,
            shape: shape.to_vec(),
        }
    }
    pub fn data(&self) -> &[f32] {
        &self.buf[self.off..self.off + self.len]
    }
    pub fn dl(&mut self) -> DLTensor {
        DLTensor {
            data: self.buf[self.off..].as_mut_ptr().cast(),
            device: DLDevice {
                device_type: DLDeviceType::CPU,
                device_id: 0,
            },
            ndim: self.shape.len() as i32,
            dtype: DLDataType {
                code: DLDataTypeCode::FLOAT,
                bits: 32,
                lanes: 1,
            },
            shape: self.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }
    pub fn save(&self, path: &Path) {
        let bytes: Vec<u8> = self.data().iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).unwrap();
    }
}

/// Deterministic pseudo-random values in [-1, 1) for index `i` (a multiplicative hash of `i` and
/// `seed`): the benches' inputs.
pub fn rnd(seed: u32) -> impl Fn(usize) -> f32 {
    move |i: usize| {
        let x = (i as u32)
            .wrapping_mul(2_654_435_761)
            .wrapping_add(seed * 97);
        ((x >> 8) % 2000) as f32 / 1000.0 - 1.0
    }
}
