//! Copies between two devices of the sample plugin, which has no p2p entries, so kiln stages
//! them through the host: the plugin's page-locked memory (`host_memory_allocate`, cached per
//! device) against ordinary host memory (the same plugin built with `SAMPLE_NO_PINNED`).
//! 16 MiB per copy; the streams are synchronized inside the timed closure.

use std::path::Path;
use std::process::Command;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
