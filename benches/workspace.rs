//! Workspace alloc + free of 64 KiB in a steady loop (goal: at most 20 ns per pair) against
//! `std::alloc::alloc`/`dealloc`, through the per-thread pool (`workspace::alloc`), a
//! `WorkspacePool` held directly, and the C entry points generated code calls.

use std::alloc::Layout;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use kiln::device_api::{self, workspace, Device, WorkspacePool};

const N: usize = 64 << 10;

fn bench(c: &mut Criterion) {
    let cpu = Device::cpu();
    let mut g = c.benchmark_group("workspace_64KiB_alloc_free");
    g.bench_function("thread_pool", |b| {
        b.iter(|| {
            let p = workspace::alloc(cpu, black_box(N)).expect("alloc");
            workspace::free(cpu, black_box(p)).expect("free");
        })
    });
    let api = device_api::get(cpu.device_type).expect("cpu backend");
    let mut pool = WorkspacePool::new(api, cpu);
    g.bench_function("pool_direct", |b| {
        b.iter(|| {
            let p = pool.alloc(black_box(N)).expect("alloc");
            pool.free(black_box(p)).expect("free");
        })
    });
    g.bench_function("TVMBackendAllocWorkspace", |b| {
        b.iter(|| {
            let p = device_api::backend_alloc_workspace(1, 0, black_box(N as u64), 2, 32);
            assert_eq!(device_api::backend_free_workspace(1, 0, black_box(p)), 0);
        })
    });
    let layout = Layout::from_size_align(N, 64).expect("layout");
    g.bench_function("std_alloc", |b| {
        b.iter(|| {
            // SAFETY: non-zero size; freed with the same layout.
            unsafe {
                let p = std::alloc::alloc(black_box(layout));
                assert!(!p.is_null());
                std::alloc::dealloc(black_box(p), layout);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
