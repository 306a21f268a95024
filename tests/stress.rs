//! A bounded concurrency stress test: for a few seconds (`KILN_STRESS_SECS`, default 3), 8
//! threads call one JIT-compiled function and one exported (`.so`) function, while other threads
//! build and drop modules (JIT and loaded libraries), register, look up, call and remove global
//! functions, and allocate, copy and free tensors on the CPU and on the sample plugin device
//! (whose streams run on worker threads), calling the plugin's kernel too. Every result is
//! checked. A watchdog fails the test with each worker's progress instead of hanging when a
//! worker does not finish in time (a deadlock, or a call that never returns).

mod plugin_util;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use kiln::codegen::llvm::{export, CodegenOptions, LlvmModule};
use kiln::device_api::{Device, Tensor};
use kiln::ir::{kernels, IRModule};
use kiln::packed_func::{registry, AnyView, DLDataType, DLTensor, Module, PackedFunc};
use kiln::runtime::LibraryModule;

/// How long the workers run.
fn run_time() -> Duration {
    let secs = std::env::var("KILN_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

/// How long after the run time a worker may take to finish its last iteration before the
/// watchdog declares it stuck (one JIT compile or export of a small kernel takes well under a
/// second; this leaves room for a loaded machine).
const GRACE: Duration = Duration::from_secs(60);

const F32: DLDataType = DLDataType {
    code: kiln::packed_func::ffi::DLDataTypeCode::FLOAT,
    bits: 32,
    lanes: 1,
};

fn dl(v: &mut [f32], shape: &mut [i64; 1]) -> DLTensor {
    DLTensor {
        data: v.as_mut_ptr().cast(),
        device: Device::cpu().to_dl(),
        ndim: 1,
        dtype: F32,
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

/// Calls `f` (a `vadd`: `C = A + B`) on `n` elements derived from `seed` and checks `C`.
fn call_vadd(f: &PackedFunc, n: usize, seed: u64) -> Result<(), String> {
    let mut a: Vec<f32> = (0..n).map(|i| (i as u64 ^ seed) as f32 % 97.0).collect();
    let mut b: Vec<f32> = (0..n)
        .map(|i| (i as u64 * 3 + seed) as f32 % 89.0)
        .collect();
    let mut c = vec![-1.0f32; n];
    let (mut sa, mut sb, mut sc) = ([n as i64], [n as i64], [n as i64]);
    let (da, db, dc) = (
        dl(&mut a, &mut sa),
        dl(&mut b, &mut sb),
        dl(&mut c, &mut sc),
    );
    f.call(&[AnyView::from(&da), AnyView::from(&db), AnyView::from(&dc)])
        .map_err(|e| format!("calling {}: {e}", f.name()))?;
    for i in 0..n {
        if c[i] != a[i] + b[i] {
            return Err(format!(
                "{}: n={n} seed={seed}: c[{i}] = {} but a + b = {}",
                f.name(),
                c[i],
                a[i] + b[i]
            ));
        }
    }
    Ok(())
}

fn jit_vadd() -> LlvmModule {
    let m = IRModule::from_functions(vec![kernels::vadd()]);
    LlvmModule::jit(&m, &CodegenOptions::host()).expect("JIT-compiling vadd")
}

/// One worker: a name, its progress counter, and its loop body (called until the run ends;
/// an `Err` fails the test).
type Body = Box<dyn FnMut(u64) -> Result<(), String> + Send>;

/// A hard bound on the whole test, setup included (building the plugin, exporting, JIT): the
/// body runs on its own thread and the test fails, instead of hanging, if it does not return.
const HARD_BOUND: Duration = Duration::from_secs(240);

#[test]
fn many_threads_call_build_register_and_allocate_at_once_without_deadlock_or_wrong_results() {
    let (tx, rx) = mpsc::channel();
    let body = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(stress);
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(HARD_BOUND) {
        // Finished (or panicked): re-raise the body's panic with its own message.
        Ok(()) => {
            if let Err(p) = body.join().unwrap() {
                std::panic::resume_unwind(p);
            }
        }
        Err(_) => panic!(
            "watchdog: the stress test did not finish within {HARD_BOUND:?} (deadlock in setup \
             or in the workers)"
        ),
    }
}

fn stress() {
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("vadd_stress.so");
    export(
        &IRModule::from_functions(vec![kernels::vadd()]),
        &CodegenOptions::host(),
        &so,
    )
    .expect("exporting vadd");
    // SAFETY: a library kiln just generated.
    let lib = unsafe { LibraryModule::load(&so) }.expect("loading the exported vadd");
    let exported = lib.require_function("vadd").unwrap();
    let jit = jit_vadd();
    let jitted = jit.require_function("vadd").unwrap();
    let plugin = plugin_util::sample("stress", &[]);
    let (pd0, pd1) = (Device::new(plugin.code(), 0), Device::new(plugin.code(), 1));
    let plugin_add = registry::require("stress.add").unwrap();

    let mut workers: Vec<(String, Body)> = Vec::new();
    // 8 callers of one JIT function and one exported function.
    for t in 0..8u64 {
        let (j, e) = (jitted.clone(), exported.clone());
        workers.push((
            format!("caller {t}"),
            Box::new(move |i| {
                let n = 1 + ((i * 131 + t * 17) % 700) as usize;
                call_vadd(&j, n, i ^ t)?;
                call_vadd(&e, n + 1, i + t)
            }),
        ));
    }
    // Build, call and drop JIT modules; load, call and drop the exported library; now and then
    // export a fresh one and load it.
    let so2 = so.clone();
    let dir2 = dir.path().to_path_buf();
    workers.push((
        "module builder".into(),
        Box::new(move |i| {
            let m = jit_vadd();
            call_vadd(
                &m.require_function("vadd").map_err(|e| e.to_string())?,
                33,
                i,
            )?;
            drop(m);
            // SAFETY: a library kiln generated.
            let l = unsafe { LibraryModule::load(&so2) }.map_err(|e| e.to_string())?;
            let f = l.require_function("vadd").map_err(|e| e.to_string())?;
            drop(l);
            call_vadd(&f, 65, i)?;
            if i % 4 == 0 {
                let p = dir2.join(format!("vadd_{i}.so"));
                export(
                    &IRModule::from_functions(vec![kernels::vadd()]),
                    &CodegenOptions::host(),
                    &p,
                )
                .map_err(|e| e.to_string())?;
                // SAFETY: a library kiln just generated.
                let l = unsafe { LibraryModule::load(&p) }.map_err(|e| e.to_string())?;
                call_vadd(
                    &l.require_function("vadd").map_err(|e| e.to_string())?,
                    9,
                    i,
                )?;
            }
            Ok(())
        }),
    ));
    // Global functions: register, look up, call, list, override, remove.
    for t in 0..2u64 {
        workers.push((
            format!("registry {t}"),
            Box::new(move |i| {
                let name = format!("stress.reg.{t}.{}", i % 16);
                let v = (i * 10 + t) as i64;
                registry::register(&name, PackedFunc::from_typed(name.clone(), move || v), true)
                    .map_err(|e| e.to_string())?;
                let got: i64 = registry::require(&name)
                    .map_err(|e| e.to_string())?
                    .call_typed(())
                    .map_err(|e| e.to_string())?;
                if got != v {
                    return Err(format!("{name} returned {got}, registered {v}"));
                }
                let shared = "stress.reg.shared";
                registry::register(shared, PackedFunc::from_typed(shared, move || v), true)
                    .map_err(|e| e.to_string())?;
                if let Some(f) = registry::get(shared) {
                    f.call_typed::<_, i64>(()).map_err(|e| e.to_string())?;
                }
                if !registry::list_prefix("stress.reg.").contains(&name) {
                    return Err(format!("{name} is not listed"));
                }
                if registry::remove(&name).is_none() {
                    return Err(format!("{name} vanished before its remove"));
                }
                if registry::get("device_api.cpu").is_none() {
                    return Err("device_api.cpu is gone".into());
                }
                Ok(())
            }),
        ));
    }
    // Memory on the CPU: allocate, copy, read back, free.
    workers.push((
        "cpu memory".into(),
        Box::new(move |i| {
            let n = 1 + (i % 300) as usize;
            let v: Vec<f32> = (0..n).map(|k| (k as u64 + i) as f32).collect();
            let a =
                Tensor::from_slice(&v, &[n as i64], Device::cpu()).map_err(|e| e.to_string())?;
            let b = a.copy_to(Device::cpu()).map_err(|e| e.to_string())?;
            drop(a);
            let mut c =
                Tensor::empty(&[n as i64], F32, Device::cpu()).map_err(|e| e.to_string())?;
            c.copy_from(&b).map_err(|e| e.to_string())?;
            let got = c.to_vec::<f32>().map_err(|e| e.to_string())?;
            if got != v {
                return Err(format!("cpu round trip of {n} floats differs"));
            }
            Ok(())
        }),
    ));
    // Memory on the plugin: two threads allocating, copying between its two devices and the
    // host, and calling its kernel.
    for t in 0..2u64 {
        let add = plugin_add.clone();
        workers.push((
            format!("plugin memory {t}"),
            Box::new(move |i| {
                let n = 1 + ((i * 7 + t) % 500) as usize;
                let x: Vec<f32> = (0..n).map(|k| (k as u64 * 2 + i) as f32).collect();
                let y: Vec<f32> = (0..n).map(|k| (k as u64 + t) as f32).collect();
                let (d, other) = if (i + t) % 2 == 0 {
                    (pd0, pd1)
                } else {
                    (pd1, pd0)
                };
                let e = |e: kiln::device_api::DeviceError| e.to_string();
                let a = Tensor::from_slice(&x, &[n as i64], d).map_err(e)?;
                let b = Tensor::from_slice(&y, &[n as i64], d).map_err(e)?;
                let c = Tensor::zeros(&[n as i64], F32, d).map_err(e)?;
                add.call_typed::<_, ()>((a.as_dltensor(), b.as_dltensor(), c.as_dltensor()))
                    .map_err(|e| e.to_string())?;
                let moved = c.copy_to(other).map_err(e)?;
                drop(c);
                let got = moved.to_vec::<f32>().map_err(e)?;
                let want: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
                if got != want {
                    return Err(format!("plugin add of {n} floats on {d:?} differs"));
                }
                let back = a.copy_to(Device::cpu()).map_err(e)?;
                if back.to_vec::<f32>().map_err(e)? != x {
                    return Err("plugin d2h copy differs".into());
                }
                Ok(())
            }),
        ));
    }

    let run = run_time();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(workers.len() + 1));
    let (done_tx, done_rx) = mpsc::channel::<(usize, Result<u64, String>)>();
    let mut progress = Vec::new();
    let mut names = Vec::new();
    for (k, (name, mut body)) in workers.into_iter().enumerate() {
        let count = Arc::new(AtomicU64::new(0));
        progress.push(count.clone());
        names.push(name.clone());
        let (stop, start, tx) = (stop.clone(), start.clone(), done_tx.clone());
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                start.wait();
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        body(i)?;
                        i += 1;
                        count.store(i, Ordering::Relaxed);
                    }
                    Ok(i)
                }))
                .unwrap_or_else(|p| {
                    Err(format!(
                        "panicked: {}",
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default()
                    ))
                });
                // A failure stops everyone early.
                if r.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                let _ = tx.send((k, r));
            })
            .unwrap();
    }
    drop(done_tx);
    start.wait();
    let t0 = Instant::now();
    std::thread::sleep(run);
    stop.store(true, Ordering::Relaxed);

    // The watchdog: every worker reports within GRACE, or the test fails naming the stuck ones
    // (their threads are left behind; the process ends with the test binary).
    let deadline = Instant::now() + GRACE;
    let mut finished: Vec<Option<Result<u64, String>>> = vec![None; names.len()];
    while finished.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok((k, r)) => finished[k] = Some(r),
            Err(_) => {
                let stuck: Vec<String> = names
                    .iter()
                    .zip(&finished)
                    .zip(&progress)
                    .filter(|((_, f), _)| f.is_none())
                    .map(|((n, _), c)| {
                        format!("{n} (after {} iterations)", c.load(Ordering::Relaxed))
                    })
                    .collect();
                panic!(
                    "watchdog: {} worker(s) did not finish within {GRACE:?} after the {run:?} run \
                     (deadlock or a call that never returns): {}",
                    stuck.len(),
                    stuck.join(", ")
                );
            }
        }
    }
    let elapsed = t0.elapsed();
    let mut errors = Vec::new();
    let mut summary = Vec::new();
    for (name, r) in names.iter().zip(finished) {
        match r.unwrap() {
            Ok(n) => summary.push(format!("{name}: {n}")),
            Err(e) => errors.push(format!("{name}: {e}")),
        }
    }
    eprintln!("stress: {elapsed:.1?}; iterations: {}", summary.join(", "));
    assert!(errors.is_empty(), "workers failed:\n{}", errors.join("\n"));
    // Everyone made progress (a starved worker is a liveness bug too).
    for (name, c) in names.iter().zip(&progress) {
        assert!(
            c.load(Ordering::Relaxed) > 0,
            "{name} never completed an iteration"
        );
    }
    // The shared state is still coherent afterwards.
    call_vadd(&jitted, 1000, 5).unwrap();
    call_vadd(&exported, 1000, 6).unwrap();
    assert!(registry::list_prefix("stress.reg.")
        .iter()
        .all(|n| n == "stress.reg.shared"));
}
