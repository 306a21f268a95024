//! `kiln tune`: a measured search for the fastest schedule of a function on the machine at hand.
//!
//! # Design
//!
//! MetaSchedule's users wait hours for a tuning run, get records that ignore the target and do
//! not port, and cannot reproduce a run; tinygrad's BEAM shows that a plain search over a few
//! kernel edits, timed on the device, gets most of the way with no learned model. kiln's tuner
//! is that search, over kiln's own schedule primitives:
//!
//! | file | part |
//! |---|---|
//! | [`space`] | the function's loop nests (made perfect first where an initialization sits beside its reduction) and their knobs (tiles, vector width, unrolling, parallel loops); a choice of knobs becomes schedule [`Step`]s |
//! | [`measure`] | inputs from a seed, the default build's results, a candidate's check against them and its timing |
//! | [`templates`] | kiln's hand schedules (today the matmul, in kiln's form or TVM's) recognized in a function, as steps: the first candidates |
//! | [`worker`] | where candidates run: this process, or a child process (`kiln tune-worker`) that a crash or a hang cannot take the search down with |
//! | [`remote`] | candidates measured on another machine through a TVM RPC server (`kiln tune --rpc` / `--tracker`) |
//! | [`db`] | the JSON-lines database: records keyed by workload hash, target and CPU model |
//!
//! The search ([`tune`]) is seeded and reproducible: the same seed proposes the same
//! candidates in the same order. It measures the hand-written starting points first (kiln's
//! hand schedule of the kernel when it has one, recognized by its loops ([`templates`]), as traced
//! steps; then the
//! default and "outer loop parallel, inner loop vectorized"), then random choices, then
//! mutations of the best ones found (one knob changed; an evolutionary search with a population
//! of four, and one random candidate in five, so it does not stall in a corner). Every candidate
//! is checked against the default build's results before it is timed, so a schedule that
//! computes something else can never win. It stops after a number of measured candidates or of
//! seconds, whichever comes first.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub mod db;
pub mod measure;
pub mod remote;
pub mod space;
pub mod templates;
pub mod worker;

pub use db::{Database, Record, Workload};
pub use measure::{Outcome, Timing};
pub use worker::{InProcess, Measurer, Subprocess, WorkerInit};

use crate::ir::PrimFunc;
use crate::schedule::Step;

/// How long and how to search.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// Measured candidates at most.
    pub trials: usize,
    /// Seconds at most.
    pub seconds: Option<f64>,
    /// The seed of the search and of the inputs.
    pub seed: u64,
    /// Print a line per candidate on stderr.
    pub progress: bool,
    /// Set from another thread (or a signal handler) to stop after the current candidate.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Default for TuneOptions {
    fn default() -> Self {
        Self {
            trials: 64,
            seconds: None,
            seed: 0,
            progress: false,
            stop: None,
        }
    }
}

/// What a search found.
#[derive(Clone, Debug)]
pub struct TuneReport {
    /// The workload.
    pub workload: Workload,
    /// The default build's time.
    pub default: Timing,
    /// The fastest candidate that beat the default, with its time.
    pub best: Option<(Vec<Step>, Timing)>,
    /// Candidates measured.
    pub trials: usize,
    /// Candidates the schedule or the build refused.
    pub invalid: usize,
    /// Candidates whose results differed from the default build's.
    pub wrong: usize,
    /// Candidates whose worker crashed or hung.
    pub crashed: usize,
    /// Seconds the search took.
    pub seconds: f64,
}

/// Searches for the fastest schedule of `f`, measuring with `m`. `on_better` is called with
/// every candidate that beats the best so far (and the default): the place to save a record,
/// so that an interrupted search keeps what it found.
///
/// # Errors
/// A function with no loop nest.
pub fn tune(
    f: &PrimFunc,
    target: &crate::target::Target,
    m: &mut dyn Measurer,
    opts: &TuneOptions,
    mut on_better: impl FnMut(&[Step], Timing, usize),
) -> Result<TuneReport, String> {
    let start = Instant::now();
    let (g, prefix) = space::normalize(f);
    let nests = space::nests(&g);
    if nests.is_empty() {
        return Err(format!("`{}` has no loop nest to schedule", f.name));
    }
    let default = m.baseline();
    let mut rng = space::Rng::new(opts.seed);
    let mut seen: HashSet<String> = HashSet::new();
    seen.insert("[]".into());
    // Measured candidates: (median, choice).
    let mut pop: Vec<(f64, space::Choice)> = Vec::new();
    let mut report = TuneReport {
        workload: db::workload(f),
        default,
        best: None,
        trials: 0,
        invalid: 0,
        wrong: 0,
        crashed: 0,
        seconds: 0.0,
    };
    let mut best = default.median;
    // The seeds but the first (no knob set: the default, timed already, and for a large
    // kernel the slowest candidate there is: 48 s a call for a 2048³ matmul).
    let mut queue: std::collections::VecDeque<space::Choice> =
        space::seeds(&nests).into_iter().skip(1).collect();
    for _ in 0..12 {
        queue.push_back(space::random_choice(&nests, &mut rng));
    }
    // kiln's hand schedules of this kernel, if it has any, go first.
    let mut hand: std::collections::VecDeque<Vec<Step>> = templates::templates(f, target).into();
    let mut attempts = 0usize;
    let out_of_time = |start: &Instant| {
        opts.seconds
            .is_some_and(|s| start.elapsed().as_secs_f64() >= s)
    };
    let width = m.batch_width().max(1);
    while report.trials < opts.trials && attempts < opts.trials * 50 + 100 {
        if out_of_time(&start) || opts.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
            break;
        }
        // The next candidates, as many as the measurer builds at once: (steps, the knobs they
        // come from, or none for a hand schedule).
        let mut batch: Vec<(Vec<Step>, Option<space::Choice>)> = Vec::new();
        while batch.len() < width
            && report.trials + batch.len() < opts.trials
            && attempts < opts.trials * 50 + 100
        {
            attempts += 1;
            let (steps, choice) = if let Some(steps) = hand.pop_front() {
                (steps, None)
            } else {
                let choice = match queue.pop_front() {
                    Some(c) => c,
                    None if pop.is_empty() || rng.below(5) == 0 => {
                        space::random_choice(&nests, &mut rng)
                    }
                    None => {
                        pop.sort_by(|a, b| a.0.total_cmp(&b.0));
                        pop.truncate(4);
                        let parent = pop[rng.below(pop.len())].1.clone();
                        space::mutate(&nests, &parent, &mut rng)
                    }
                };
                match space::steps_for(&g, &nests, &choice) {
                    Ok(s) => (prefix.iter().cloned().chain(s).collect(), Some(choice)),
                    Err(_) => continue,
                }
            };
            let key = serde_json::to_string(&steps).unwrap_or_default();
            if seen.insert(key) {
                batch.push((steps, choice));
            }
        }
        if batch.is_empty() {
            break;
        }
        let all: Vec<Vec<Step>> = batch.iter().map(|(s, _)| s.clone()).collect();
        let outcomes = m.measure_batch(&all, Some(best * 3.0));
        for ((steps, choice), outcome) in batch.into_iter().zip(outcomes) {
            report.trials += 1;
            let what = if choice.is_none() {
                ", a hand schedule"
            } else {
                ""
            };
            let line = match &outcome {
                Outcome::Ok(t) => {
                    if let Some(c) = choice {
                        pop.push((t.median, c));
                    }
                    let mark = if t.median < best {
                        best = t.median;
                        report.best = Some((steps.clone(), *t));
                        on_better(&steps, *t, report.trials);
                        " new best"
                    } else {
                        ""
                    };
                    format!(
                        "{:.4} ms ({:.2}x the default){what}{mark}",
                        t.median * 1e3,
                        default.median / t.median.max(f64::MIN_POSITIVE)
                    )
                }
                Outcome::Invalid(e) => {
                    report.invalid += 1;
                    format!("refused{what}: {e}")
                }
                Outcome::Wrong(e) => {
                    report.wrong += 1;
                    format!("wrong results, discarded{what}: {e}")
                }
                Outcome::Crashed(e) => {
                    report.crashed += 1;
                    format!("crashed{what}: {e}")
                }
            };
            if opts.progress {
                eprintln!(
                    "[{}/{}] {:.1} s  {line}  (best {:.4} ms)",
                    report.trials,
                    opts.trials,
                    start.elapsed().as_secs_f64(),
                    best * 1e3
                );
            }
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}
