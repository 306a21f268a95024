//! Parse + canonicalize + export of a typical llvm target (goal: under 5 us).
//!
//! Run: `cargo bench --bench target_parse`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use kiln::target::Target;

const JSON: &str = r#"{"kind":"llvm","mtriple":"x86_64-linux-gnu","mcpu":"znver3","mattr":["+avx2","+fma"],"num-cores":8,"opt-level":3}"#;

fn bench(c: &mut Criterion) {
    // Warm the registries (tag table, kinds, default triple) outside the timed loop.
    let _ = Target::parse("llvm");
    c.bench_function("parse+export llvm json", |b| {
        b.iter(|| {
            let t = Target::parse(black_box(JSON)).expect("valid");
            black_box(t.export())
        })
    });
    c.bench_function("parse+display llvm legacy", |b| {
        b.iter(|| {
            let t = Target::parse(black_box(
                "llvm -mcpu=znver3 -mattr=+avx2,+fma -num-cores=8",
            ))
            .expect("valid");
            black_box(t.to_string())
        })
    });
    c.bench_function("parse+export tag with host", |b| {
        b.iter(|| {
            let t = Target::parse(black_box("nvidia/jetson-agx-xavier")).expect("valid");
            black_box(t.export())
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
