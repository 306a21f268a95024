//! Measuring a candidate: build it, check it against the function's default build, time it.
//!
//! A [`Bench`] holds the function's inputs (random, from a seed: every candidate sees the same
//! ones) and what the default build leaves in every buffer. A candidate is built for the target,
//! called once on fresh copies of the inputs, and compared buffer by buffer with that reference
//! (integers exactly, floats to 1e-3 relative, as reassociated sums may differ in the last
//! bits); only a candidate that agrees is timed. The default build itself is the code kiln's
//! differential tests hold to the reference interpreter.
//!
//! A candidate whose checking call takes more than nine times the best so far is timed by that
//! call alone; one whose first timed call takes more than three times the best, by that call.
//! A [`Bench`] can be watched ([`Bench::watch`]): it says when a checking call starts and when
//! the timed calls start ([`Phase`]), which is how the worker's parent abandons a checking call
//! that runs far past the best ([`super::worker`]).
//!
//! On a device target, the reference is the function built for the host CPU, and the default
//! (the function as written, made kernels by the default device schedule) is checked against
//! it like every candidate. A candidate runs on device copies of the inputs, its results are
//! copied back to be compared, and its calls are timed between two events of the device's
//! current stream (the driver's own timer); its first call, which includes the driver
//! compiling the kernels, is never the answer.
//!
//! Timing: on the arrays of the checking call (warm: paged in, in the caches as in the calls
//! that follow, so a cold first call does not count against a candidate), calls are batched
//! until a batch lasts 2 ms, then 7 batches are timed; the result is the median time per call
//! with the fastest and slowest batch. When the spread is above 10 % of the median, up to 8
//! more batches are taken.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::device_api::{self, Device, DeviceType, Tensor};
use crate::ir::{IRModule, Param, PrimFunc};
use crate::npy::{parse_dtype, NpyArray};
use crate::packed_func::{AnyView, DLTensor, PackedFunc};
use crate::target::Target;

/// A candidate's time per call, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The median.
    pub median: f64,
    /// The fastest batch.
    pub min: f64,
    /// The slowest batch.
    pub max: f64,
}

impl Timing {
    /// The median (the upper of the middle two for an even count), fastest and slowest of
    /// `samples`, which must not be empty.
    pub(crate) fn of(mut samples: Vec<f64>) -> Timing {
        samples.sort_by(f64::total_cmp);
        Timing {
            median: samples[samples.len() / 2],
            min: samples[0],
            max: samples[samples.len() - 1],
        }
    }

    /// `(max - min) / median`.
    pub fn spread(&self) -> f64 {
        (self.max - self.min) / self.median.max(f64::MIN_POSITIVE)
    }
}

/// A candidate timed against the default build in alternating rounds (`candidate, default`,
/// then `default, candidate`, ...), each round a full measurement of both: the per-round
/// ratios cancel the machine's slow phases, which a ratio of two separate medians does not.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Paired {
    /// Rounds measured.
    pub rounds: usize,
    /// The median over the rounds of the default's time / the candidate's (above 1: faster).
    pub speedup: f64,
    /// The smallest of the per-round ratios.
    pub low: f64,
    /// The largest of the per-round ratios.
    pub high: f64,
    /// The standard error of the speedup, relative: the standard deviation of the per-round
    /// ratios' logarithms over the square root of the rounds (0.02: the speedup is known to
    /// about 2 %). Absent from records of kiln before it, and with one round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub se: Option<f64>,
}

impl Paired {
    /// The pairing of the per-round ratios `ratios` (default time / candidate time): their
    /// median, range (as a [`Timing`] of them) and relative standard error ([`Paired::se`]). `None`
    /// for no ratio.
    pub fn of(ratios: &[f64]) -> Option<Paired> {
        let n = ratios.len();
        if n == 0 {
            return None;
        }
        let se = (n >= 2).then(|| {
            let logs: Vec<f64> = ratios
                .iter()
                .map(|r| r.max(f64::MIN_POSITIVE).ln())
                .collect();
            let mean = logs.iter().sum::<f64>() / n as f64;
            let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            (var / n as f64).sqrt()
        });
        let t = Timing::of(ratios.to_vec());
        Some(Paired {
            rounds: n,
            speedup: t.median,
            low: t.min,
            high: t.max,
            se,
        })
    }

    /// Whether the pairing shows the candidate faster than the default beyond the noise: its
    /// speedup above 1 by more than its standard error (`ln(speedup) > se`, the error being
    /// relative). A pairing without an error (one round, or an older kiln's record) counts
    /// when its speedup is above 1. The rule by which a tuned schedule replaces the default
    /// build: a speedup of 1.01x known only to 3 % is the default's time as far as the
    /// measurement can tell, and the default is the build that was not searched for.
    pub fn beats_default(&self) -> bool {
        self.speedup > 1.0 && self.se.is_none_or(|se| self.speedup.ln() > se)
    }
}

/// What measuring a candidate gave.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It agrees with the default build; its time.
    Ok(Timing),
    /// The schedule or the build refused it.
    Invalid(String),
    /// It computes something else than the default build.
    Wrong(String),
    /// The process measuring it died (or ran past its time).
    Crashed(String),
    /// Its checking call ran so far past the best so far that it was stopped (its worker
    /// killed) before it ended: a candidate that cannot win.
    Abandoned(String),
}

/// What a measurement on the CPU is doing, told to a [`Bench`]'s watcher: the worker process
/// tells its parent, which abandons a checking call that runs far past the best so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The candidate's first call, on fresh copies of the inputs, starts.
    Checking,
    /// It agreed with the reference; the timed calls start.
    Timing,
}

/// The inputs of a function and what its default build computes from them.
pub struct Bench {
    inputs: Vec<NpyArray>,
    reference: Vec<NpyArray>,
    /// The device candidates run on (device 0 of a device target's kind); `None` for a CPU
    /// target, whose candidates run on the host arrays themselves.
    device: Option<Device>,
    /// Told where a CPU measurement is ([`Bench::watch`]).
    watcher: Option<fn(Phase)>,
}

/// The device a target's kernels run on: device 0 of its kind, or `None` for a CPU target
/// (kind `llvm`).
///
/// # Errors
/// A kind kiln has no code generator for, or whose device this machine does not have.
pub fn device_of(target: &Target) -> Result<Option<Device>, String> {
    if target.kind_name() == "llvm" {
        return Ok(None);
    }
    let cg = crate::codegen::device::codegen_for(target.kind_name()).ok_or_else(|| {
        format!(
            "`kiln tune` measures on the CPU (`llvm`) and on devices kiln generates code for \
             (`opencl`, `cuda`); `{}` is neither",
            target.kind_name()
        )
    })?;
    let dev = Device::new(DeviceType::from(cg.device_type()), 0);
    let api = device_api::get(dev.device_type).map_err(|e| e.to_string())?;
    api.check_device(dev)
        .map_err(|e| format!("no {} device to measure on: {e}", target.kind_name()))?;
    Ok(Some(dev))
}

/// The CPU target a device target's results are checked against: its `host`, or the machine
/// kiln runs on.
fn host_target(target: &Target) -> Result<Target, String> {
    match target.host() {
        Some(h) if h.kind_name() == "llvm" => Ok(h.clone()),
        _ => Target::parse("llvm").map_err(|e| e.to_string()),
    }
}

/// How many placements of a small kernel's arrays its timing goes through (at most
/// [`PLACED_MAX_BYTES`] in all; each array shifted by a multiple of 64 bytes, differently in
/// each, so that their distances modulo 4 KiB differ: 4 KiB aliasing).
pub const PLACEMENTS: usize = 4;

/// The most bytes (all arrays together) that are timed at [`PLACEMENTS`] placements.
pub const PLACED_MAX_BYTES: usize = 1 << 20;

/// Copies of a small kernel's arrays at [`PLACEMENTS`] placements relative to each other: each
/// batch of its timed calls is spread evenly over them, so that its time is their mean.
///
/// Where arrays of a few KiB lie relative to each other, modulo 4 KiB, moves a call's time by
/// up to 10 % and more: a load whose address matches an earlier store's in its low 12 bits
/// waits for it (4 KiB aliasing), and which loads meet which stores depends on the schedule.
/// Timed at one placement, a tuner ranks candidates for that placement only, and a 12 KiB
/// `clip` whose two-vector schedule was fastest there was 20 % slower than its default where
/// the output lay 192-320 bytes past the input. Each placement here shifts array `a` by
/// `64 * (a * (16 l + 5) mod 64)` bytes in placement `l`: the second array moves a quarter
/// turn of 4 KiB against the first from one placement to the next, 64-byte aligned.
struct Placed {
    /// Per placement, per array: the allocation and the offset of the data in it.
    bufs: Vec<Vec<(crate::npy::AlignedBytes, usize)>>,
    /// Per array: its element type and shape.
    meta: Vec<(crate::packed_func::DLDataType, Vec<i64>)>,
}

impl Placed {
    /// The copies of `args`, or `None` when they hold more than [`PLACED_MAX_BYTES`].
    fn new(args: &[NpyArray]) -> Result<Option<Placed>, String> {
        let total: usize = args.iter().map(|a| a.data.as_slice().len()).sum();
        if args.is_empty() || total > PLACED_MAX_BYTES {
            return Ok(None);
        }
        let mut bufs = Vec::with_capacity(PLACEMENTS);
        for l in 0..PLACEMENTS {
            let mut set = Vec::with_capacity(args.len());
            for (a, arr) in args.iter().enumerate() {
                let off = 64 * ((a * (16 * l + 5)) % 64);
                let src = arr.data.as_slice();
                let mut b =
                    crate::npy::AlignedBytes::zeroed(src.len() + off).map_err(|e| e.to_string())?;
                b.as_mut_slice()[off..].copy_from_slice(src);
                set.push((b, off));
            }
            bufs.push(set);
        }
        let meta = args.iter().map(|a| (a.dtype, a.shape.clone())).collect();
        Ok(Some(Placed { bufs, meta }))
    }

    /// The tensors of placement `l` (they point into `self`, which must outlive their use).
    fn tensors(&mut self, l: usize) -> Vec<DLTensor> {
        self.bufs[l]
            .iter_mut()
            .zip(self.meta.iter_mut())
            .map(|((b, off), (dtype, shape))| {
                crate::npy::cpu_dltensor(b.as_mut_slice()[*off..].as_mut_ptr(), *dtype, shape)
            })
            .collect()
    }
}

/// Device copies of host arrays, and the timing of calls on them with the device's events.
struct OnDevice {
    api: std::sync::Arc<dyn device_api::DeviceApi>,
    dev: Device,
    tensors: Vec<Tensor>,
}

impl OnDevice {
    fn new(dev: Device, arrays: &[NpyArray]) -> Result<Self, String> {
        let api = device_api::get(dev.device_type).map_err(|e| e.to_string())?;
        let tensors = arrays
            .iter()
            .map(|a| {
                let mut t = Tensor::empty(&a.shape, a.dtype, dev).map_err(|e| e.to_string())?;
                t.copy_from_bytes(a.data.as_slice())
                    .map_err(|e| e.to_string())?;
                Ok(t)
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(OnDevice { api, dev, tensors })
    }

    fn views(&self) -> Vec<AnyView<'_>> {
        self.tensors
            .iter()
            .map(|t| AnyView::from(t.as_dltensor()))
            .collect()
    }

    /// One call, waited for.
    fn call(&self, func: &PackedFunc) -> Result<(), String> {
        func.call(&self.views()).map_err(|e| e.to_string())?;
        let stream = self.api.current_stream(self.dev);
        self.api
            .sync_stream(self.dev, stream)
            .map_err(|e| e.to_string())
    }

    /// The arrays' contents, copied back into `out`.
    fn read(&self, out: &mut [NpyArray]) -> Result<(), String> {
        for (t, a) in self.tensors.iter().zip(out) {
            t.copy_to_bytes(a.data.as_mut_slice())
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// `n` calls between two events of the device's current stream: their device time.
    fn run(&self, func: &PackedFunc, n: u64) -> Result<f64, String> {
        let (api, dev) = (&self.api, self.dev);
        let err = |e: crate::device_api::DeviceError| e.to_string();
        let views = self.views();
        let stream = api.current_stream(dev);
        let start = api.create_event(dev).map_err(err)?;
        let end = match api.create_event(dev) {
            Ok(e) => e,
            Err(e) => {
                let _ = api.destroy_event(dev, start);
                return Err(e.to_string());
            }
        };
        let timed = (|| {
            api.record_event(dev, stream, start).map_err(err)?;
            for _ in 0..n {
                func.call(&views).map_err(|e| e.to_string())?;
            }
            api.record_event(dev, stream, end).map_err(err)?;
            api.sync_event(dev, end).map_err(err)?;
            api.event_elapsed(dev, start, end)
                .map(|d| d.as_secs_f64())
                .map_err(err)
        })();
        let _ = api.destroy_event(dev, start);
        let _ = api.destroy_event(dev, end);
        timed
    }
}

fn fill(a: &mut NpyArray, seed: u64) {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let dt = a.dtype;
    let n = a.numel();
    let elem = a.elem_bytes();
    let bytes = a.data.as_mut_slice();
    for i in 0..n {
        let r = next();
        let chunk = &mut bytes[i * elem..(i + 1) * elem];
        match (dt.code.0, dt.bits) {
            (2, 32) => {
                let v = ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                chunk.copy_from_slice(&v.to_le_bytes());
            }
            (2, 64) => {
                let v = ((r >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0;
                chunk.copy_from_slice(&v.to_le_bytes());
            }
            (2, 16) => {
                let v = half::f16::from_f64(((r >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0);
                chunk.copy_from_slice(&v.to_le_bytes());
            }
            _ => {
                // Integers and anything else: small values (indices stay in range, sums do not
                // overflow).
                let v = r % 7;
                let b = v.to_le_bytes();
                let k = chunk.len().min(8);
                chunk[..k].copy_from_slice(&b[..k]);
            }
        }
    }
}

/// The host array a parameter of a measured function takes: its constant shape and dtype, or
/// why there is none.
fn array_spec(p: &Param) -> Result<(Vec<i64>, crate::packed_func::DLDataType), String> {
    match p {
        Param::Buffer(b) => {
            let shape: Vec<i64> = b
                .shape
                .iter()
                .map(|e| e.as_int())
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    format!(
                        "parameter `{}` has a symbolic shape: tuning needs constant shapes (one \
                         workload per shape)",
                        b.name
                    )
                })?;
            let dt = parse_dtype(&b.dtype.to_string())
                .ok_or_else(|| format!("parameter `{}`: no host array of {}", b.name, b.dtype))?;
            Ok((shape, dt))
        }
        Param::Scalar(v) => Err(format!(
            "parameter `{}` is a scalar: tuning takes functions of buffers only",
            v.name
        )),
    }
}

/// Whether `f` can be measured: buffers only, with constant shapes and host dtypes (or why
/// not).
///
/// # Errors
/// What stands in the way, naming the parameter.
pub fn benchable(f: &PrimFunc) -> Result<(), String> {
    f.params.iter().try_for_each(|p| array_spec(p).map(drop))
}

pub(crate) fn arrays(f: &PrimFunc, seed: u64) -> Result<Vec<NpyArray>, String> {
    f.params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (shape, dt) = array_spec(p)?;
            let mut a = NpyArray::zeros(dt, &shape).map_err(|e| e.to_string())?;
            fill(&mut a, seed.wrapping_add(i as u64 + 1));
            Ok(a)
        })
        .collect()
}

/// Builds `f` for `target` and returns its function, its optimized code ready. A CPU target is
/// compiled here, at its full level, in this thread (no quick tier first, no copy written to
/// the compile cache in the background: either would take a core from the candidate being
/// timed, and several candidates are built at once, one per thread); other kinds go through
/// their `target.build.<kind>`.
pub(crate) fn build(f: &PrimFunc, target: &Target) -> Result<PackedFunc, String> {
    use crate::codegen::llvm::{CodegenOptions, LlvmModule, Tiering};
    use crate::packed_func::Module;
    let module = IRModule::from_functions(vec![f.clone()]);
    let name = f.name.clone();
    if target.kind_name() == "llvm" {
        module.verify().map_err(|e| e.to_string())?;
        let opts = CodegenOptions::from_target(target)
            .map_err(|e| e.to_string())?
            .resolved();
        let m = LlvmModule::jit_with(&module, &opts, Tiering::Off).map_err(|e| e.to_string())?;
        // The module stays alive through the function's own reference.
        return m.require_function(&name).map_err(|e| e.to_string());
    }
    let m = crate::codegen::build(&module, target).map_err(|e| e.to_string())?;
    crate::codegen::llvm::wait_all_optimized();
    let func = m.require_function(&name).map_err(|e| e.to_string())?;
    drop(m);
    Ok(func)
}

fn call(func: &PackedFunc, args: &mut [NpyArray]) -> Result<(), String> {
    let dls: Vec<DLTensor> = args.iter_mut().map(|a| a.as_dltensor()).collect();
    let views: Vec<AnyView<'_>> = dls.iter().map(AnyView::from).collect();
    func.call(&views).map(drop).map_err(|e| e.to_string())
}

pub(crate) fn compare(got: &[NpyArray], want: &[NpyArray], f: &PrimFunc) -> Result<(), String> {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let name = f
            .params
            .get(i)
            .map(|p| p.name().to_owned())
            .unwrap_or_default();
        let (gb, wb) = (g.data.as_slice(), w.data.as_slice());
        match (g.dtype.code.0, g.dtype.bits) {
            (2, 32) | (2, 64) => {
                let elem = g.elem_bytes();
                for j in 0..g.numel() {
                    let rd = |b: &[u8]| -> f64 {
                        let c = &b[j * elem..(j + 1) * elem];
                        if elem == 4 {
                            f32::from_le_bytes(c.try_into().unwrap_or_default()) as f64
                        } else {
                            f64::from_le_bytes(c.try_into().unwrap_or_default())
                        }
                    };
                    let (x, y) = (rd(gb), rd(wb));
                    let ok = x == y
                        || (x.is_nan() && y.is_nan())
                        || (x - y).abs() <= 1e-3 * y.abs().max(1.0);
                    if !ok {
                        return Err(format!("`{name}`[{j}] is {x}, the default build gives {y}"));
                    }
                }
            }
            _ => {
                if gb != wb {
                    let j = gb.iter().zip(wb).position(|(a, b)| a != b).unwrap_or(0);
                    return Err(format!(
                        "`{name}` differs from the default build at byte {j}"
                    ));
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn clone_arrays(v: &[NpyArray]) -> Result<Vec<NpyArray>, String> {
    v.iter()
        .map(|a| {
            let mut b = NpyArray::zeros(a.dtype, &a.shape).map_err(|e| e.to_string())?;
            b.data.as_mut_slice().copy_from_slice(a.data.as_slice());
            Ok(b)
        })
        .collect()
}

impl Bench {
    /// Inputs for `f` from `seed`, and the default build's results on them (`f` as given, for
    /// `target`), with the default build's time (timed by its one checking call when that
    /// takes 0.5 s or more).
    ///
    /// # Errors
    /// Symbolic shapes, scalar parameters, a default build that fails.
    pub fn new(f: &PrimFunc, target: &Target, seed: u64) -> Result<(Bench, Timing), String> {
        let (bench, time) = Self::prepare(f, target, seed, true)?;
        let time = time.ok_or("the default build was not timed")?;
        Ok((bench, time))
    }

    /// [`Bench::new`] without timing the default build (its time is known: a restarted
    /// worker's). The default is still built and called once, for the reference results.
    ///
    /// # Errors
    /// As [`Bench::new`].
    pub fn untimed(f: &PrimFunc, target: &Target, seed: u64) -> Result<Bench, String> {
        Ok(Self::prepare(f, target, seed, false)?.0)
    }

    fn prepare(
        f: &PrimFunc,
        target: &Target,
        seed: u64,
        timed: bool,
    ) -> Result<(Bench, Option<Timing>), String> {
        let inputs = arrays(f, seed)?;
        if let Some(dev) = device_of(target)? {
            return Self::on_device(f, target, dev, inputs, timed);
        }
        let func = build(f, target)?;
        let mut out = clone_arrays(&inputs)?;
        let t = Instant::now();
        call(&func, &mut out)?;
        let first = t.elapsed().as_secs_f64();
        let bench = Bench {
            inputs,
            reference: clone_arrays(&out)?,
            device: None,
            watcher: None,
        };
        if !timed {
            return Ok((bench, None));
        }
        let time = bench.time_default(&func, &mut out, first)?;
        Ok((bench, Some(time)))
    }

    /// Calls `watcher` as each CPU measurement starts its checking call and its timed calls
    /// ([`Phase`]).
    pub fn watch(&mut self, watcher: fn(Phase)) {
        self.watcher = Some(watcher);
    }

    fn tell(&self, p: Phase) {
        if let Some(w) = self.watcher {
            w(p);
        }
    }

    /// For a device target: the reference results are the host's build of `f` (the CPU code
    /// kiln's differential tests hold to the interpreter), and the default is `f` built for the
    /// device as it is (its loops made kernels by the default device schedule where nobody
    /// bound them), checked against them and timed like a candidate.
    fn on_device(
        f: &PrimFunc,
        target: &Target,
        dev: Device,
        inputs: Vec<NpyArray>,
        timed: bool,
    ) -> Result<(Bench, Option<Timing>), String> {
        let host = build(f, &host_target(target)?)?;
        let mut out = clone_arrays(&inputs)?;
        call(&host, &mut out)?;
        let bench = Bench {
            inputs,
            reference: out,
            device: Some(dev),
            watcher: None,
        };
        if !timed {
            return Ok((bench, None));
        }
        let func = build(f, target).map_err(|e| format!("the default device build: {e}"))?;
        // A default whose first timed call takes 0.5 s or more is timed by that call, as on
        // the CPU (a 1024³ matmul's default takes 1.6 s a call on PoCL).
        match bench.check_and_time(f, &func, Some(0.5)) {
            Outcome::Ok(t) => Ok((bench, Some(t))),
            Outcome::Wrong(e) => Err(format!(
                "the default device build computes something else than the host's: {e}"
            )),
            Outcome::Invalid(e) | Outcome::Crashed(e) | Outcome::Abandoned(e) => {
                Err(format!("the default device build: {e}"))
            }
        }
    }

    /// The default build's time. It is there to report the speedup, so a slow default is not
    /// timed to the last digit: a default whose first call took `first` >= 0.5 s is timed by
    /// that call (a 2048³ matmul's default takes half a minute a call).
    fn time_default(
        &self,
        func: &PackedFunc,
        args: &mut [NpyArray],
        first: f64,
    ) -> Result<Timing, String> {
        if first >= 0.5 {
            return Ok(Timing {
                median: first,
                min: first,
                max: first,
            });
        }
        self.time_within(func, args, None)
    }

    /// Times `func` (already checked) on `args` (the arrays its checking call ran on, so warm:
    /// paged in and cached as in the calls that follow). When its first timed call takes more
    /// than `cutoff` seconds, that call is the answer (a candidate three times slower than the
    /// best so far need not be timed to the last digit: tinygrad's BEAM stops early the same
    /// way). Calls of 50 ms or more are timed in 3 batches instead of 7.
    pub fn time_within(
        &self,
        func: &PackedFunc,
        args: &mut [NpyArray],
        cutoff: Option<f64>,
    ) -> Result<Timing, String> {
        // Small arrays are timed at several placements, one after another (see `Placed`);
        // large ones where they are.
        let mut placed = Placed::new(args)?;
        let sets: Vec<Vec<DLTensor>> = match placed.as_mut() {
            Some(p) => (0..PLACEMENTS).map(|l| p.tensors(l)).collect(),
            None => vec![args.iter_mut().map(|a| a.as_dltensor()).collect()],
        };
        let views: Vec<Vec<AnyView<'_>>> = sets
            .iter()
            .map(|set| set.iter().map(AnyView::from).collect())
            .collect();
        // `n` calls, spread evenly over the placements in turn: each batch's time is their mean.
        let places = views.len() as u64;
        time_runs(
            |n: u64| -> Result<f64, String> {
                let t = Instant::now();
                for (l, views) in views.iter().enumerate() {
                    let calls = n / places + u64::from((l as u64) < n % places);
                    for _ in 0..calls {
                        func.call(views).map_err(|e| e.to_string())?;
                    }
                }
                Ok(t.elapsed().as_secs_f64())
            },
            cutoff,
        )
    }

    /// Checks and times `func`, the build of `f` (a scheduled version of the function); see
    /// [`Bench::time_within`] for `cutoff`.
    pub fn check_and_time(&self, f: &PrimFunc, func: &PackedFunc, cutoff: Option<f64>) -> Outcome {
        if let Some(dev) = self.device {
            return self.check_and_time_on(dev, f, func, cutoff);
        }
        let mut out = match clone_arrays(&self.inputs) {
            Ok(x) => x,
            Err(e) => return Outcome::Invalid(e),
        };
        self.tell(Phase::Checking);
        let t = Instant::now();
        if let Err(e) = call(func, &mut out) {
            return Outcome::Invalid(e);
        }
        let check = t.elapsed().as_secs_f64();
        if let Err(e) = compare(&out, &self.reference, f) {
            return Outcome::Wrong(e);
        }
        // A checking call three times past the cutoff (nine times the best so far) is answer
        // enough, cold as it is: a hopeless candidate of a large kernel (seconds a call, where
        // the best takes milliseconds) costs one call, not two.
        if cut_off_by(check, cutoff.map(|c| 3.0 * c)) {
            return Outcome::Ok(Timing {
                median: check,
                min: check,
                max: check,
            });
        }
        self.tell(Phase::Timing);
        match self.time_within(func, &mut out, cutoff) {
            Ok(t) => Outcome::Ok(t),
            Err(e) => Outcome::Invalid(e),
        }
    }

    /// [`Bench::check_and_time`] on a device: fresh device copies of the inputs, one call
    /// (waited for), the results copied back and compared, then calls timed with the device's
    /// events on the same tensors.
    fn check_and_time_on(
        &self,
        dev: Device,
        f: &PrimFunc,
        func: &PackedFunc,
        cutoff: Option<f64>,
    ) -> Outcome {
        let on = match OnDevice::new(dev, &self.inputs) {
            Ok(x) => x,
            Err(e) => return Outcome::Invalid(e),
        };
        // (The first call's time is no answer here, as it is on the CPU: it includes the
        // driver compiling the kernels.)
        if let Err(e) = on.call(func) {
            return Outcome::Invalid(e);
        }
        let mut out = match clone_arrays(&self.inputs) {
            Ok(x) => x,
            Err(e) => return Outcome::Invalid(e),
        };
        if let Err(e) = on.read(&mut out) {
            return Outcome::Invalid(e);
        }
        if let Err(e) = compare(&out, &self.reference, f) {
            return Outcome::Wrong(e);
        }
        match time_runs(|n| on.run(func, n), cutoff) {
            Ok(t) => Outcome::Ok(t),
            Err(e) => Outcome::Invalid(e),
        }
    }
}

/// The projected seconds of one measurement of a candidate already built whose calls take `t`
/// seconds (a `Measurer::measure` in a final round or a pairing): the checking call, then
/// the timing's first call, its batches of at least 2 ms found by doubling, and its batches
/// (3 for calls of 50 ms or more, else at most 15: 7, and more while the spread is over 10 %,
/// as it often is on a shared machine), plus [`MEASURE_OVERHEAD_S`].
pub fn measure_seconds(t: f64) -> f64 {
    let t = if t.is_finite() { t.max(0.0) } else { 0.0 };
    let batch = t.max(2.2e-3);
    let calls = if t >= 0.05 {
        2.0 * t + 3.0 * t
    } else {
        2.0 * t + 2.0 * batch + 15.0 * batch
    };
    calls + MEASURE_OVERHEAD_S
}

/// What a measurement costs beside the calls: the inputs copied, the results compared, the
/// worker's messages (about a millisecond for small arrays; tens for a 2048³ matmul's).
pub const MEASURE_OVERHEAD_S: f64 = 0.01;

/// The cutoff a search passes with each candidate ([`Bench::time_within`]): this many times its
/// best time so far, which the timing reads back from it (racing).
pub const CUTOFF_TIMES_BEST: f64 = 3.0;

/// The shortest single call that can be answer enough for a candidate past the cutoff. A
/// call under a millisecond is not: the first call of a kernel of a fraction of a microsecond
/// (an elementwise operator on 12 KiB) takes ten times its warm time (its code and the clock
/// cold), so every candidate of such a kernel lost to its own first call and the search never
/// timed one. Timing such a call in batches costs a few milliseconds.
pub const CUTOFF_FLOOR_S: f64 = 1e-3;

/// Whether a candidate whose first call took `first` seconds is timed by that call alone: past
/// `cutoff`, and at least [`CUTOFF_FLOOR_S`].
pub fn cut_off_by(first: f64, cutoff: Option<f64>) -> bool {
    cutoff.is_some_and(|c| first > c && first >= CUTOFF_FLOOR_S)
}

/// Times calls with `run(n)` (the seconds `n` calls take): when the first call takes more than
/// `cutoff` seconds (and [`CUTOFF_FLOOR_S`]), that call is the answer; else calls are batched until a batch lasts 2 ms
/// and the median of 7 batches (3 for calls of 50 ms or more; up to 15 while the spread is
/// over 10 %) is taken, with the fastest and slowest batch; 3 batches when all three are 1.25
/// times the best so far (`cutoff` / [`CUTOFF_TIMES_BEST`]) or slower.
fn time_runs(
    mut run: impl FnMut(u64) -> Result<f64, String>,
    cutoff: Option<f64>,
) -> Result<Timing, String> {
    let first = run(1)?;
    if cut_off_by(first, cutoff) {
        return Ok(Timing {
            median: first,
            min: first,
            max: first,
        });
    }
    let batches = if first >= 0.05 { 3 } else { 7 };
    let mut number = 1u64;
    loop {
        let t = run(number)?;
        if t >= 2e-3 || number >= 1 << 20 {
            break;
        }
        number = (number * 2).max((number as f64 * 2.2e-3 / t.max(1e-9)) as u64);
    }
    let mut per: Vec<f64> = Vec::new();
    for i in 0..15 {
        per.push(run(number)? / number as f64);
        // Racing: the cutoff is `CUTOFF_TIMES_BEST` times the best so far, and a candidate is
        // a new best only with a median under the best's. After three batches all a quarter or more
        // slower than the best, that median would need each of the four batches left under
        // the best: the candidate has lost, and its three batches rank it among the others.
        if i == 2 && cutoff.is_some_and(|c| per.iter().all(|&t| t > 1.25 * c / CUTOFF_TIMES_BEST)) {
            return Ok(Timing::of(per));
        }
        if i + 1 >= batches {
            let t = Timing::of(per.clone());
            if t.spread() <= 0.1 || i == 14 || batches == 3 {
                return Ok(t);
            }
        }
    }
    unreachable!("the loop returns at its last iteration")
}

#[cfg(test)]
mod tests {
    use super::{time_runs, CUTOFF_TIMES_BEST};

    /// `time_runs` with calls that take `per_call(i)` seconds, the `i`-th run counting from 0;
    /// the timing and how many runs it took.
    fn timed(per_call: impl Fn(usize) -> f64, cutoff: Option<f64>) -> (super::Timing, usize) {
        let mut runs = 0;
        let t = time_runs(
            |n| {
                let t = per_call(runs) * n as f64;
                runs += 1;
                Ok(t)
            },
            cutoff,
        )
        .unwrap();
        (t, runs)
    }

    /// A candidate whose first three batches are each a quarter or more slower than the best
    /// (a third of the cutoff) stops there; one within that keeps its seven batches; one past
    /// the cutoff is timed by its first call; without a cutoff (the default, pairing) always
    /// seven.
    #[test]
    fn losing_candidates_stop_after_three_batches() {
        let best = 1e-3;
        let cutoff = Some(CUTOFF_TIMES_BEST * best);
        // The first call, two calibrating runs (1 call, then 2: 2.6 ms), 3 batches.
        let (t, runs) = timed(|_| 1.3e-3, cutoff);
        assert_eq!(runs, 6);
        assert!((t.median - 1.3e-3).abs() < 1e-12, "{t:?}");
        let (_, runs) = timed(|_| 1.2e-3, cutoff);
        assert_eq!(runs, 10);
        let (_, runs) = timed(|_| 1.3e-3, None);
        assert_eq!(runs, 10);
        // One fast batch among the first three: timed in full.
        let (_, runs) = timed(|i| if i == 4 { 1.2e-3 } else { 1.3e-3 }, cutoff);
        assert_eq!(runs, 10);
        let (t, runs) = timed(|_| 4e-3, cutoff);
        assert_eq!((runs, t.median), (1, 4e-3));
    }

    /// A sub-microsecond kernel whose first call is cold (twenty times its warm time, past the
    /// cutoff) is timed in batches all the same: a first call under [`CUTOFF_FLOOR_S`] is never
    /// the answer. Before, every candidate of a 0.1 us `clip` was "timed" by its cold call and
    /// lost to the default.
    #[test]
    fn a_cold_first_call_under_the_floor_is_not_the_answer() {
        let best = 1e-7;
        let cutoff = Some(CUTOFF_TIMES_BEST * best);
        let (t, runs) = timed(|i| if i == 0 { 2e-6 } else { 0.9e-7 }, cutoff);
        assert!(runs > 3, "{runs}");
        assert!((t.median - 0.9e-7).abs() < 1e-15, "{t:?}");
        // A first call past the cutoff and past the floor is still the answer.
        let (t, runs) = timed(|i| if i == 0 { 2e-3 } else { 0.9e-7 }, Some(1e-3));
        assert_eq!((runs, t.median), (1, 2e-3));
    }
}
