//! `copy_data_from_to` host -> host of 64 MiB against `copy_from_slice` in the same run (goal:
//! at least 0.95x its throughput). The stream is synchronized inside the timed closure.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kiln::device_api::{self, Device, StreamHandle};
use kiln::packed_func::ffi::{DLDataType, DLDataTypeCode, DLTensor};

const N: usize = 64 << 20;

fn bench(c: &mut Criterion) {
    let cpu = Device::cpu();
    let api = device_api::get(cpu.device_type).expect("cpu backend");
    let u8t = DLDataType {
        code: DLDataTypeCode::UINT,
        bits: 8,
        lanes: 1,
    };
    let src = api.alloc_data_space(cpu, N, 64, u8t).expect("alloc");
    let dst = api.alloc_data_space(cpu, N, 64, u8t).expect("alloc");
    api.memset(cpu, src, 0, 7, N, StreamHandle::DEFAULT)
        .expect("memset");
    api.memset(cpu, dst, 0, 0, N, StreamHandle::DEFAULT)
        .expect("memset");
    let mut shape = [N as i64];
    let mk = |p: device_api::DevicePtr, shape: &mut [i64; 1]| DLTensor {
        data: p.as_raw(),
        device: cpu.to_dl(),
        ndim: 1,
        dtype: u8t,
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let from = mk(src, &mut shape);
    let to = mk(dst, &mut shape);

    let mut g = c.benchmark_group("copy_64MiB_host_to_host");
    g.throughput(Throughput::Bytes(N as u64));
    g.sample_size(30);
    g.bench_function("copy_data_from_to", |b| {
        b.iter(|| {
            // SAFETY: both are live 64 MiB CPU allocations.
            unsafe { api.copy_data_from_to(&from, &to, StreamHandle::DEFAULT) }.expect("copy");
            api.sync_stream(cpu, StreamHandle::DEFAULT).expect("sync");
        })
    });
    let a = vec![7u8; N];
    let mut bvec = vec![0u8; N];
    g.bench_function("copy_from_slice", |b| {
        b.iter(|| {
            bvec.copy_from_slice(std::hint::black_box(&a));
            std::hint::black_box(&mut bvec);
        })
    });
    g.finish();
    api.free_data_space(cpu, src).expect("free");
    api.free_data_space(cpu, dst).expect("free");
}

criterion_group!(benches, bench);
criterion_main!(benches);
