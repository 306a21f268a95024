//! Copies between two devices of the sample plugin, which has no p2p entries, so kiln stages
//! them through the host: the plugin's page-locked memory (`host_memory_allocate`, cached per
//! device) against ordinary host memory (the same plugin built with `SAMPLE_NO_PINNED`).
//! 16 MiB per copy; the streams are synchronized inside the timed closure.
//!
//! Then copies between a plugin device and ordinary (pageable) host memory, h2d and d2h: staged
//! through the plugin's page-locked memory (`set_pinned_staging(true)`, 4 MiB chunks) against
//! the direct copy (staging off). Besides criterion's figures, each case prints the median and
//! the spread (min, p10, p90, max) of 40 timed copies, and the CPU model (`/proc/cpuinfo`).

mod util;
use util::{cpu_model, num_cpus};

use std::path::Path;
use std::process::Command;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::{Duration, Instant};

use kiln::device_api::{plugin, Device, DeviceApi, StreamHandle};
use kiln::packed_func::ffi::{DLDataType, DLDataTypeCode, DLTensor};

const N: usize = 16 << 20;

fn build(dir: &Path, name: &str, defines: &[&str]) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join(format!("libkiln_{name}.so"));
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_owned()));
    cmd.args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&out)
        .arg("-I")
        .arg(root.join("include"))
        .arg(format!("-DSAMPLE_DEVICE_TYPE=\"{name}\""));
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    cmd.arg(root.join("plugins/sample/sample.c"))
        .arg("-lpthread");
    assert!(
        cmd.status().expect("running cc").success(),
        "building {name}"
    );
    out
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let u8t = DLDataType {
        code: DLDataTypeCode::UINT,
        bits: 8,
        lanes: 1,
    };
    let mut g = c.benchmark_group("plugin_p2p_16MiB_staged");
    g.throughput(Throughput::Bytes(N as u64));
    g.sample_size(30);
    for (label, name, defines) in [
        ("pinned_staging", "bench_pinned", &[][..]),
        ("unpinned_staging", "bench_plain", &["SAMPLE_NO_PINNED"][..]),
    ] {
        let api = plugin::load_plugin(build(dir.path(), name, defines)).expect("load");
        let (d0, d1) = (Device::new(api.code(), 0), Device::new(api.code(), 1));
        let a = api.alloc_data_space(d0, N, 64, u8t).expect("alloc");
        let b = api.alloc_data_space(d1, N, 64, u8t).expect("alloc");
        api.memset(d0, a, 0, 7, N, StreamHandle::DEFAULT)
            .expect("memset");
        let mut shape = [N as i64];
        let mk = |p: kiln::device_api::DevicePtr, dev: Device, shape: &mut [i64; 1]| DLTensor {
            data: p.as_raw(),
            device: dev.to_dl(),
            ndim: 1,
            dtype: u8t,
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let from = mk(a, d0, &mut shape);
        let to = mk(b, d1, &mut shape);
        g.bench_function(label, |bch| {
            bch.iter(|| {
                // SAFETY: both are live 16 MiB allocations of the plugin.
                unsafe { api.copy_data_from_to(&from, &to, StreamHandle::DEFAULT) }.expect("copy");
                api.sync_stream(d0, StreamHandle::DEFAULT).expect("sync");
            })
        });
        api.free_data_space(d0, a).expect("free");
        api.free_data_space(d1, b).expect("free");
    }
    g.finish();
    host_copies(c, dir.path());
}

fn host_copies(c: &mut Criterion, dir: &Path) {
    let u8t = DLDataType {
        code: DLDataTypeCode::UINT,
        bits: 8,
        lanes: 1,
    };
    let api = plugin::load_plugin(build(dir, "bench_host", &[])).expect("load");
    let dev = Device::new(api.code(), 0);
    let p = api.alloc_data_space(dev, N, 64, u8t).expect("alloc");
    let mut host: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
    let mut shape = [N as i64];
    let dev_t = DLTensor {
        data: p.as_raw(),
        device: dev.to_dl(),
        ndim: 1,
        dtype: u8t,
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let host_t = DLTensor {
        data: host.as_mut_ptr().cast(),
        device: Device::cpu().to_dl(),
        ..dev_t
    };
    println!("CPU: {} ({} logical CPUs)", cpu_model(), num_cpus());
    let mut g = c.benchmark_group("plugin_host_16MiB");
    g.throughput(Throughput::Bytes(N as u64));
    g.sample_size(20);
    for (dir_label, from, to) in [("h2d", &host_t, &dev_t), ("d2h", &dev_t, &host_t)] {
        for (label, pinned) in [("pinned_staging", true), ("unpinned", false)] {
            api.set_pinned_staging(pinned);
            let one = || {
                // SAFETY: `host` and `p` are live 16 MiB buffers; the stream is synchronized
                // before `host` is touched again.
                unsafe { api.copy_data_from_to(from, to, StreamHandle::DEFAULT) }.expect("copy");
                api.sync_stream(dev, StreamHandle::DEFAULT).expect("sync");
            };
            one();
            let mut t: Vec<Duration> = (0..40)
                .map(|_| {
                    let s = Instant::now();
                    one();
                    s.elapsed()
                })
                .collect();
            t.sort();
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let gib = |d: Duration| N as f64 / d.as_secs_f64() / (1u64 << 30) as f64;
            println!(
                "{dir_label} {label:>14}: median {:.2} ms ({:.2} GiB/s); min {:.2}, p10 {:.2}, \
                 p90 {:.2}, max {:.2} ms",
                ms(t[20]),
                gib(t[20]),
                ms(t[0]),
                ms(t[4]),
                ms(t[35]),
                ms(t[39])
            );
            g.bench_function(format!("{dir_label}_{label}"), |b| b.iter(one));
        }
    }
    g.finish();
    api.set_pinned_staging(false);
    api.free_data_space(dev, p).expect("free");
}

criterion_group!(benches, bench);
criterion_main!(benches);
