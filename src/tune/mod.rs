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
//! | [`device`] | the space of a device target (`opencl`, `cuda`): per nest a mode (the default device schedule; flat blocks of threads; a 2-D block with shared-memory staging; a block per row) and its thread shapes, offered only where no two threads can race |
//! | [`measure`] | inputs from a seed, the default build's results, a candidate's check against them and its timing (the CPU clock; the device's events for a device target, checked against the host's build) |
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
//! mutations of the best ones found (one knob changed, or one parameter of a hand schedule:
//! [`templates::TemplateSpace`]; an evolutionary search with a population
//! of four, and one random candidate in five, so it does not stall in a corner). Every candidate
//! is checked against the default build's results before it is timed, so a schedule that
//! computes something else can never win, and a candidate that seems to beat the best so far
//! meets it in a duel (the two timed in alternating rounds, [`pair_steps`]), so that a lucky
//! measurement cannot win either. It stops after a number of measured candidates or of
//! seconds, whichever comes first; a budget of seconds holds for what follows the search as
//! well (the [`final_round`] and the pairing with the default, [`pair_until`]): the search stops
//! early enough to leave them their projected time ([`follow_up_seconds`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub mod db;
pub mod device;
pub mod measure;
pub mod remote;
pub mod space;
pub mod templates;
pub mod worker;

pub use db::{Database, Finals, Lookup, Record, Workload};
pub use measure::{Outcome, Paired, Timing};
pub use worker::{InProcess, Measurer, Subprocess, WorkerInit};

use crate::ir::PrimFunc;
use crate::schedule::Step;

/// How long and how to search.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// Measured candidates at most.
    pub trials: usize,
    /// Seconds at most, the rounds after the search (`finals`, `pair`) included: the search
    /// stops when what it took and their projected time ([`follow_up_seconds`]) reach it.
    pub seconds: Option<f64>,
    /// Rounds of the [`final_round`] the caller runs after the search (0: none); only counted
    /// against `seconds`.
    pub finals: usize,
    /// Rounds of the pairing with the default the caller runs after the search ([`pair_until`];
    /// 0: none); only counted against `seconds`, and only where the default's call takes at
    /// most [`PAIR_MAX_CALL_S`], as for `kiln tune --pair`.
    pub pair: usize,
    /// The seed of the search and of the inputs.
    pub seed: u64,
    /// Print a line per candidate on stderr.
    pub progress: bool,
    /// Set from another thread (or a signal handler) to stop after the current candidate.
    pub stop: Option<Arc<AtomicBool>>,
    /// Rounds of a duel (0: none, a median below the best's fastest batch wins outright): a
    /// candidate whose median is below the best so far's (but not [`DUEL_CLEAR`] times below)
    /// is timed against it in alternating rounds ([`pair_steps`]; more, up to twice as many,
    /// until the ratio's standard error is at most [`DUEL_SE`]) and becomes the new best only
    /// if it is faster in the median round. Both sides' times from the duel replace their
    /// single measurements.
    pub duel: usize,
}

/// A candidate whose median is this many times below the best so far's wins without a duel:
/// beyond the machine's slow and fast phases (15-25 % on the 2-core VMs kiln is measured on).
pub const DUEL_CLEAR: f64 = 1.3;

/// The bound on a duel's standard error past its first rounds ([`TuneOptions::duel`]).
pub const DUEL_SE: f64 = 0.02;

impl Default for TuneOptions {
    fn default() -> Self {
        Self {
            trials: 64,
            seconds: None,
            finals: 0,
            pair: 0,
            seed: 0,
            progress: false,
            stop: None,
            duel: 0,
        }
    }
}

/// `Ok` where a budget of seconds is one: none, or a finite number above 0. A NaN budget would
/// never run out (every comparison with it is false) and one of 0 or less would end the
/// search before its first candidate: both are mistakes, said so before anything is measured.
///
/// # Errors
/// What was expected and the budget seen.
pub fn check_seconds(seconds: Option<f64>) -> Result<(), String> {
    match seconds {
        Some(s) if !(s.is_finite() && s > 0.0) => Err(format!(
            "expected a budget of seconds above 0 (a finite number), got {s}"
        )),
        _ => Ok(()),
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
    /// Candidates stopped in their checking call, far slower than the best so far
    /// ([`Outcome::Abandoned`]).
    pub abandoned: usize,
    /// Seconds the search took.
    pub seconds: f64,
    /// Candidates timed against the best so far in a duel ([`TuneOptions::duel`]).
    pub duels: usize,
    /// Duels the candidate won (it became the new best).
    pub duels_won: usize,
    /// The fastest candidates by median that beat the default (at most [`FINALISTS`]), fastest
    /// first, and the search's `best` among them (in the last place where it is not one of the
    /// fastest): the entrants of a [`final_round`]. The `best` is the last candidate that beat
    /// the best so far (in a duel, or beyond its spread), which need not be the first of them.
    pub leaders: Vec<(Vec<Step>, Timing)>,
    /// Candidates with parallel loops left out, the default being under
    /// [`PARALLEL_MIN_DEFAULT_S`].
    pub serial_only: usize,
}

/// Below this default time (seconds) a CPU search tries no candidate with a parallel loop.
///
/// A kernel of a few microseconds gains from a second thread only while the pool's workers are
/// spinning, as they are in a tuner's loop of back-to-back calls: there, a 1 us batched matmul
/// split over two threads measured 0.82 us against 0.99 serial. In a process that calls it
/// between other work (Python, another runtime's kernels) the same build took 0.8 or 1.8 us
/// from one run to the next, and a 3 us grouped convolution 3.5-9 us against 3.1 serial:
/// waking a parked worker costs more than the kernel. kiln's own parallel default
/// (`schedule::auto`) holds back below a similar size for the same reason.
pub const PARALLEL_MIN_DEFAULT_S: f64 = 10e-6;

/// Whether `s` makes a loop parallel.
fn is_parallel(s: &Step) -> bool {
    matches!(s, Step::Kind { kind, .. } if kind == "parallel")
}

/// How many of a search's fastest candidates a [`final_round`] measures again.
pub const FINALISTS: usize = 4;

/// A [`final_round`]'s outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct FinalRound {
    /// Rounds measured.
    pub rounds: usize,
    /// Per entrant, in the order given, its time over the rounds (the median, fastest and
    /// slowest of its per-round medians), or why it did not measure.
    pub times: Vec<Result<Timing, String>>,
    /// The entrant with the lowest median over the rounds.
    pub winner: usize,
}

/// The projected seconds of what follows a search: `finals` rounds of a [`final_round`] of
/// `leaders` (the medians of the search's fastest candidates, fastest first; none where fewer
/// than two, as `kiln tune` then has no final round), and `pair` rounds of the pairing of the
/// best (the first leader) with the default build (`default`: its median), where the default's
/// call takes at most [`PAIR_MAX_CALL_S`]. Each measurement is projected by
/// [`measure::measure_seconds`].
pub fn follow_up_seconds(finals: usize, pair: usize, leaders: &[f64], default: f64) -> f64 {
    let finals = if has_final_round(finals, leaders.len()) {
        let round: f64 = leaders
            .iter()
            .take(FINALISTS)
            .map(|&t| measure::measure_seconds(t))
            .sum();
        finals as f64 * round
    } else {
        0.0
    };
    let pairing = match leaders.first() {
        Some(&best) if pairs_with_default(pair, default) => {
            pair as f64 * (measure::measure_seconds(best) + measure::measure_seconds(default))
        }
        _ => 0.0,
    };
    finals + pairing
}

/// Measures `entrants` (a search's [`TuneReport::leaders`]) again, each once per round in
/// `rounds` rounds, the order reversed every other round, and names the one with the lowest
/// median over the rounds.
///
/// The search measures each candidate once, so its fastest time is the likeliest to be a lucky
/// one (the winner's curse), and a candidate must beat the fastest batch of the best so far to
/// become the new best, which favours the early ones: on a 2048³ matmul, a seed measured 102.3
/// ms lost to one measured 107.1 ms before it. Measured in the same rounds, the entrants meet
/// the machine's slow phases alike.
///
/// # Errors
/// No entrant, `rounds` 0, or no entrant measured in every round.
pub fn final_round(
    m: &mut dyn Measurer,
    entrants: &[(Vec<Step>, Timing)],
    rounds: usize,
) -> Result<FinalRound, String> {
    if entrants.is_empty() || rounds == 0 {
        return Err(format!(
            "a final round needs entrants and rounds, got {} and {rounds}",
            entrants.len()
        ));
    }
    let mut medians: Vec<Result<Vec<f64>, String>> = vec![Ok(Vec::new()); entrants.len()];
    for r in 0..rounds {
        let order: Vec<usize> = if r % 2 == 0 {
            (0..entrants.len()).collect()
        } else {
            (0..entrants.len()).rev().collect()
        };
        for i in order {
            // An entrant that failed a round is out.
            let Ok(v) = &mut medians[i] else { continue };
            match m.measure(&entrants[i].0, None) {
                Outcome::Ok(t) => v.push(t.median),
                other => medians[i] = Err(format!("did not measure: {other:?}")),
            }
        }
    }
    let times: Vec<Result<Timing, String>> =
        medians.into_iter().map(|v| v.map(Timing::of)).collect();
    let winner = times
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.as_ref().ok().map(|t| (i, t.median)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
        .ok_or("no entrant of the final round measured in every round")?;
    Ok(FinalRound {
        rounds,
        times,
        winner,
    })
}

/// Searches for the fastest schedule of `f`, measuring with `m`. `on_better` is called with
/// every candidate that becomes the new best, with the time it won with: against the default,
/// a median below its fastest batch; against a best so far, a duel won
/// ([`TuneOptions::duel`]), or with no duels a median below the best's fastest batch. It is
/// the place to save a record, so that an interrupted search keeps what it found.
///
/// # Errors
/// A budget of seconds that is not a positive number ([`check_seconds`]); a function with no
/// loop nest.
pub fn tune(
    f: &PrimFunc,
    target: &crate::target::Target,
    m: &mut dyn Measurer,
    opts: &TuneOptions,
    mut on_better: impl FnMut(&[Step], Timing, usize),
) -> Result<TuneReport, String> {
    check_seconds(opts.seconds)?;
    let start = Instant::now();
    let (g, prefix) = space::normalize(f);
    let nests = space::nests(&g);
    if nests.is_empty() {
        return Err(format!("`{}` has no loop nest to schedule", f.name));
    }
    let sp = if target.kind_name() == "llvm" {
        // kiln's hand schedules of this kernel, if it has any, are points of a template space
        // that the search mutates like the knobs.
        Space::Cpu(
            &g,
            &nests,
            templates::TemplateSpace::new(f, target).map(Box::new),
            if crate::target::has_avx512(target) {
                16
            } else {
                8
            },
        )
    } else {
        let limits = crate::codegen::device::codegen_for(target.kind_name())
            .map(|cg| crate::codegen::device::DeviceLimits::of(target, cg.default_limits()))
            .ok_or_else(|| {
                format!(
                    "no device code generator for target kind `{}`",
                    target.kind_name()
                )
            })?;
        Space::Device(Box::new(device::DeviceSpace::new(&g, limits.max_threads)))
    };
    let default = m.baseline();
    // A CPU kernel of a few microseconds stays on the calling thread (see
    // `PARALLEL_MIN_DEFAULT_S`).
    let serial_only = matches!(sp, Space::Cpu(..)) && default.median < PARALLEL_MIN_DEFAULT_S;
    if serial_only && opts.progress {
        eprintln!(
            "the default takes {} ms, under {} ms: candidates with parallel loops are not tried",
            crate::util::ms(default.median),
            crate::util::ms(PARALLEL_MIN_DEFAULT_S)
        );
    }
    let mut rng = space::Rng::new(opts.seed);
    let mut seen: HashSet<String> = HashSet::new();
    seen.insert("[]".into());
    // Measured candidates: (median, choice).
    let mut pop: Vec<(f64, Choice)> = Vec::new();
    let mut report = TuneReport {
        workload: db::workload(f),
        default,
        best: None,
        trials: 0,
        invalid: 0,
        wrong: 0,
        crashed: 0,
        abandoned: 0,
        seconds: 0.0,
        duels: 0,
        duels_won: 0,
        leaders: Vec::new(),
        serial_only: 0,
    };
    // Every candidate that measured: (time, steps), for the leaders.
    let mut measured: Vec<(Timing, Vec<Step>)> = Vec::new();
    let mut best = default.median;
    // What a candidate must beat to be the new best without a duel: the fastest batch of the
    // best so far (the default's at first). A median within the best's own spread is a tie,
    // not a win: on a noisy machine such "wins" came out slower when measured again.
    let mut bar = default.min.min(default.median);
    // The seeds but the first (no knob set: the default, timed already, and for a large
    // kernel the slowest candidate there is: 48 s a call for a 2048³ matmul).
    let mut queue: std::collections::VecDeque<Choice> = sp.seeds().into_iter().collect();
    for _ in 0..12 {
        queue.push_back(sp.random(&mut rng));
    }
    // kiln's hand schedules of this kernel, if it has any, go first.
    let hand = sp.hand(f, target);
    let seeds: Vec<templates::MatmulTemplate> = hand
        .iter()
        .filter_map(|(_, c)| match c {
            Some(Choice::Template(t)) => Some(*t),
            _ => None,
        })
        .collect();
    let mut hand: std::collections::VecDeque<(Vec<Step>, Option<Choice>)> = hand.into();
    let mut attempts = 0usize;
    // Out of time: the search's seconds and the projected seconds of the rounds after it
    // (over the fastest candidates so far) reach the budget.
    let out_of_time = |start: &Instant, measured: &[(Timing, Vec<Step>)]| {
        opts.seconds.is_some_and(|s| {
            let mut fastest: Vec<f64> = measured.iter().map(|(t, _)| t.median).collect();
            fastest.sort_by(f64::total_cmp);
            let after = follow_up_seconds(opts.finals, opts.pair, &fastest, default.median);
            start.elapsed().as_secs_f64() + after >= s
        })
    };
    let width = m.batch_width().max(1);
    // A duel adds rounds past its first ones only before the budget of seconds runs out.
    let deadline = opts
        .seconds
        .and_then(|s| start.checked_add(std::time::Duration::try_from_secs_f64(s).ok()?));
    // Proposals at most (most are measured; a few repeat one or are refused).
    let max_attempts = opts.trials.saturating_mul(50).saturating_add(100);
    while report.trials < opts.trials && attempts < max_attempts {
        if out_of_time(&start, &measured)
            || opts.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst))
        {
            break;
        }
        // The next candidates, as many as the measurer builds at once: (steps, the knobs they
        // come from, or none for a hand schedule).
        let mut batch: Vec<(Vec<Step>, Option<Choice>)> = Vec::new();
        while batch.len() < width
            && report.trials + batch.len() < opts.trials
            && attempts < max_attempts
        {
            attempts += 1;
            let (steps, choice) = if let Some(h) = hand.pop_front() {
                h
            } else {
                let choice = match queue.pop_front() {
                    Some(c) => c,
                    None if pop.is_empty() || rng.below(5) == 0 => sp.random(&mut rng),
                    None => {
                        pop.sort_by(|a, b| a.0.total_cmp(&b.0));
                        pop.truncate(4);
                        let parent = pop[rng.below(pop.len())].1.clone();
                        sp.mutate(&parent, &mut rng)
                    }
                };
                match sp.steps(&choice, &prefix) {
                    Ok(s) => (s, Some(choice)),
                    Err(_) => continue,
                }
            };
            let key = serde_json::to_string(&steps).unwrap_or_default();
            if !seen.insert(key) {
                continue;
            }
            if serial_only && steps.iter().any(is_parallel) {
                report.serial_only += 1;
                continue;
            }
            batch.push((steps, choice));
        }
        if batch.is_empty() {
            break;
        }
        let all: Vec<Vec<Step>> = batch.iter().map(|(s, _)| s.clone()).collect();
        let outcomes = m.measure_batch(&all, Some(best * measure::CUTOFF_TIMES_BEST));
        for ((steps, choice), outcome) in batch.into_iter().zip(outcomes) {
            report.trials += 1;
            let what = match &choice {
                None => ", a hand schedule",
                Some(Choice::Template(t)) if seeds.contains(t) => ", a hand schedule",
                Some(Choice::Template(_)) => ", a hand schedule's neighbour",
                Some(Choice::AutoParallel) => ", kiln's auto-parallel build",
                Some(_) => "",
            };
            let line = match &outcome {
                Outcome::Ok(t) => {
                    if let Some(c) = choice {
                        pop.push((t.median, c));
                    }
                    if t.median < default.median {
                        measured.push((*t, steps.clone()));
                    }
                    // The time it wins with: its single measurement, or its duel's.
                    let mut won = None;
                    let mut note = String::new();
                    let contends =
                        opts.duel > 0 && t.median < best && t.median * DUEL_CLEAR >= best;
                    match report
                        .best
                        .as_ref()
                        .filter(|_| contends)
                        .map(|(s, _)| s.clone())
                    {
                        // A contender for the best so far meets it round by round.
                        Some(incumbent) => {
                            report.duels += 1;
                            let plan = PairPlan {
                                rounds: opts.duel,
                                se: DUEL_SE,
                                max_rounds: opts.duel.saturating_mul(2),
                                deadline,
                            };
                            match pair_steps(m, &steps, &incumbent, "the best so far", plan) {
                                Ok((p, ct, it)) => {
                                    note = format!(
                                        " (paired with the best so far: {:.3}x [{:.3}, {:.3}] over {} rounds{})",
                                        p.speedup,
                                        p.low,
                                        p.high,
                                        p.rounds,
                                        if p.speedup > 1.0 { "" } else { ": not faster" }
                                    );
                                    if p.speedup > 1.0 {
                                        report.duels_won += 1;
                                        won = Some(ct);
                                    } else {
                                        // The best so far keeps its place, at its time of now.
                                        crown(
                                            &mut best,
                                            &mut bar,
                                            &mut report.best,
                                            &incumbent,
                                            it,
                                        );
                                    }
                                    for (mt, ms) in &mut measured {
                                        if *ms == steps {
                                            *mt = ct;
                                        } else if *ms == incumbent {
                                            *mt = it;
                                        }
                                    }
                                }
                                Err(e) => note = format!(" (lost its duel: {e})"),
                            }
                        }
                        None if t.median < bar => won = Some(*t),
                        None => {}
                    }
                    let mark = if let Some(wt) = won {
                        crown(&mut best, &mut bar, &mut report.best, &steps, wt);
                        on_better(&steps, wt, report.trials);
                        " new best"
                    } else {
                        ""
                    };
                    format!(
                        "{} ms ({:.2}x the default){what}{mark}{note}",
                        crate::util::ms(t.median),
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
                Outcome::Abandoned(e) => {
                    report.abandoned += 1;
                    format!("abandoned{what}: {e}")
                }
            };
            if opts.progress {
                eprintln!(
                    "[{}/{}] {:.1} s  {line}  (best {} ms)",
                    report.trials,
                    opts.trials,
                    start.elapsed().as_secs_f64(),
                    crate::util::ms(best)
                );
            }
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    measured.sort_by(|a, b| a.0.median.total_cmp(&b.0.median));
    report.leaders = measured
        .into_iter()
        .take(FINALISTS)
        .map(|(t, s)| (s, t))
        .collect();
    // The best so far is an entrant of the final round, in the last place if it has to be.
    if let Some((steps, t)) = &report.best {
        if !report.leaders.iter().any(|(s, _)| s == steps) {
            if report.leaders.len() == FINALISTS {
                report.leaders.pop();
            }
            report.leaders.push((steps.clone(), *t));
        }
    }
    Ok(report)
}

/// Makes `steps`, timed at `t`, the search's best: its median the one to beat in a duel, its
/// fastest batch the one to beat without.
fn crown(
    best: &mut f64,
    bar: &mut f64,
    slot: &mut Option<(Vec<Step>, Timing)>,
    steps: &[Step],
    t: Timing,
) {
    *best = t.median;
    *bar = t.min.min(t.median);
    *slot = Some((steps.to_vec(), t));
}

/// Calls of the default build up to this long are paired with the winner after a search
/// (`kiln tune --pair`): a few seconds at most. A slower default (a 2048³ matmul unscheduled:
/// 40 s a call) would cost minutes, and its winners are many times faster, far beyond the
/// noise.
pub const PAIR_MAX_CALL_S: f64 = 0.25;

/// Whether a search with `leaders` candidates faster than the default gets a final round of
/// `finals` rounds (`kiln tune --finals`): it takes two to meet.
pub fn has_final_round(finals: usize, leaders: usize) -> bool {
    finals > 0 && leaders >= 2
}

/// Whether the winner is paired with the default in `pair` rounds (`kiln tune --pair`), where
/// a call of the default takes `default` seconds: only up to [`PAIR_MAX_CALL_S`].
pub fn pairs_with_default(pair: usize, default: f64) -> bool {
    pair > 0 && default <= PAIR_MAX_CALL_S
}

/// Times `steps` against the default build (no steps) in `rounds` alternating rounds
/// ([`Paired`]): the check a search's winner passes before it is preferred to the default. A
/// winner found by separate measurements can be a tie within the noise (a vector add on
/// OpenCL: 0.95x the default when measured again); the per-round ratios say.
/// [`pair_until`] goes on until the noise is under a bound.
///
/// # Errors
/// `rounds` is 0, or a measurement that does not succeed (the candidate or the default
/// refused, wrong or crashed).
pub fn pair_with_default(
    m: &mut dyn Measurer,
    steps: &[Step],
    rounds: usize,
) -> Result<(Paired, Timing), String> {
    pair_until(
        m,
        steps,
        PairPlan {
            rounds,
            se: 0.0,
            max_rounds: rounds,
            deadline: None,
        },
    )
}

/// How long [`pair_until`] pairs a candidate with the default.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PairPlan {
    /// Rounds at least.
    pub rounds: usize,
    /// The bound on the speedup's relative standard error ([`Paired::se`]): past `rounds`,
    /// rounds are added until it is reached (0: exactly `rounds`).
    pub se: f64,
    /// Rounds at most, where the bound is not reached sooner.
    pub max_rounds: usize,
    /// Rounds past `rounds` are added only before this moment (`kiln tune --seconds`: the
    /// pairing's first `rounds` are counted in the search's budget, the rounds it adds are
    /// not).
    pub deadline: Option<Instant>,
}

impl PairPlan {
    /// `rounds` at least, then until the standard error is at most `se`, with at most four
    /// times `rounds` (`kiln tune --pair ROUNDS --pair-se SE`).
    pub fn new(rounds: usize, se: f64) -> PairPlan {
        PairPlan {
            rounds,
            se,
            max_rounds: rounds.saturating_mul(4),
            deadline: None,
        }
    }

    /// `Ok` where the bound is one: finite and 0 or more.
    ///
    /// # Errors
    /// What was expected and the bound seen.
    pub fn check(&self) -> Result<(), String> {
        if self.se.is_finite() && self.se >= 0.0 {
            Ok(())
        } else {
            Err(format!(
                "expected a bound on the standard error (relative) of 0 or more (0.02: 2 %), got {}",
                self.se
            ))
        }
    }
}

/// [`pair_with_default`], with rounds added past `plan.rounds` until the speedup's relative
/// standard error is at most `plan.se` (and at least three rounds measured), or
/// `plan.max_rounds` are done, or `plan.deadline` has passed: "measured until the noise is
/// under a stated bound". The
/// [`Paired`] it returns says how many rounds it took and the standard error reached, which
/// may be over the bound where `max_rounds` ended it.
///
/// # Errors
/// As [`pair_with_default`]; a bound that is negative, infinite or not a number.
pub fn pair_until(
    m: &mut dyn Measurer,
    steps: &[Step],
    plan: PairPlan,
) -> Result<(Paired, Timing), String> {
    pair_steps(m, steps, &[], "the default", plan).map(|(p, t, _)| (p, t))
}

/// [`pair_until`] against `reference` (named `who` in errors: the default build, or a search's
/// best so far in a [duel](TuneOptions::duel)) instead of the default build: the per-round
/// ratios are `reference`'s time over `steps`' (above 1: `steps` faster), with both sides'
/// times over the rounds (`steps`' first).
///
/// # Errors
/// As [`pair_until`].
pub fn pair_steps(
    m: &mut dyn Measurer,
    steps: &[Step],
    reference: &[Step],
    who: &str,
    plan: PairPlan,
) -> Result<(Paired, Timing, Timing), String> {
    if plan.rounds == 0 {
        return Err("pairing needs at least one round".into());
    }
    plan.check().map_err(|e| format!("pairing: {e}"))?;
    let mut time = |s: &[Step], who: &str| match m.measure(s, None) {
        Outcome::Ok(t) => Ok(t.median),
        other => Err(format!("pairing: {who} did not measure: {other:?}")),
    };
    let most = plan.max_rounds.max(plan.rounds);
    // Grown round by round, not reserved for `plan.rounds`: a count of rounds far past what a
    // deadline lets run must not be an allocation up front.
    let mut ratios = Vec::new();
    let mut times = Vec::new();
    let mut refs = Vec::new();
    for r in 0..most {
        if r >= plan.rounds {
            let p = Paired::of(&ratios).expect("rounds were measured");
            if plan.se == 0.0
                || (r >= 3 && p.se.is_some_and(|se| se <= plan.se))
                || plan.deadline.is_some_and(|d| Instant::now() >= d)
            {
                break;
            }
        }
        let (cand, other) = if r % 2 == 0 {
            let c = time(steps, "the candidate")?;
            (c, time(reference, who)?)
        } else {
            let d = time(reference, who)?;
            (time(steps, "the candidate")?, d)
        };
        ratios.push(other / cand.max(f64::MIN_POSITIVE));
        times.push(cand);
        refs.push(other);
    }
    let paired = Paired::of(&ratios).expect("rounds were measured");
    Ok((paired, Timing::of(times), Timing::of(refs)))
}

/// The space a search draws from: the CPU's knobs (the function in normal form, its nests)
/// and its hand schedules' parameters, or a device's knobs.
enum Space<'a> {
    Cpu(
        &'a PrimFunc,
        &'a [space::Nest],
        Option<Box<templates::TemplateSpace>>,
        // The `float32` lanes of the target's vectors (8, or 16 with AVX-512).
        i64,
    ),
    Device(Box<device::DeviceSpace>),
}

/// One candidate's knobs, in the space's terms, or a hand schedule's parameters.
#[derive(Clone, Debug, PartialEq)]
enum Choice {
    Cpu(space::Choice),
    Device(device::DeviceChoice),
    Template(templates::MatmulTemplate),
    /// kiln's untuned parallel build (`schedule::auto::auto_parallel`), as steps.
    AutoParallel,
}

impl Space<'_> {
    /// kiln's hand schedules of `f` as complete steps, with their choice where the space can
    /// mutate them (a CPU template).
    fn hand(
        &self,
        f: &PrimFunc,
        target: &crate::target::Target,
    ) -> Vec<(Vec<Step>, Option<Choice>)> {
        match self {
            Space::Cpu(_, _, ts, _) => {
                // What `kiln.build(..., auto_parallel=True)` (and `kiln.tvm.compile`) builds
                // when no record applies: a search's winner beats it, not only the serial
                // default (a record's function is built as recorded, without it).
                let ap = crate::schedule::auto::auto_parallel(
                    f,
                    crate::schedule::auto::DEFAULT_MIN_WORK,
                );
                let auto = (!ap.loops.is_empty()).then(|| (ap.steps(), Some(Choice::AutoParallel)));
                let templates = ts.iter().flat_map(|ts| {
                    ts.seeds()
                        .into_iter()
                        .filter_map(|t| Some((ts.steps(&t).ok()?, Some(Choice::Template(t)))))
                });
                templates.chain(auto).collect()
            }
            Space::Device(_) => device::device_templates(f, target)
                .into_iter()
                .map(|s| (s, None))
                .collect(),
        }
    }

    /// The hand-written starting points, but the one with no knob set (the default, timed
    /// already; for a large kernel the slowest candidate there is: 48 s a call for a 2048³
    /// matmul).
    fn seeds(&self) -> Vec<Choice> {
        match self {
            Space::Cpu(_, n, _, lanes) => space::seeds_for_lanes(n, *lanes)
                .into_iter()
                .skip(1)
                .map(Choice::Cpu)
                .collect(),
            Space::Device(d) => {
                let none: device::DeviceChoice = vec![Default::default(); d.nests.len()];
                d.seeds()
                    .into_iter()
                    .filter(|c| *c != none)
                    .map(Choice::Device)
                    .collect()
            }
        }
    }

    fn random(&self, rng: &mut space::Rng) -> Choice {
        match self {
            Space::Cpu(_, n, _, _) => Choice::Cpu(space::random_choice(n, rng)),
            Space::Device(d) => Choice::Device(d.random(rng)),
        }
    }

    fn mutate(&self, c: &Choice, rng: &mut space::Rng) -> Choice {
        match (self, c) {
            (Space::Cpu(_, n, _, _), Choice::Cpu(c)) => Choice::Cpu(space::mutate(n, c, rng)),
            // A hand schedule with one of its parameters changed.
            (Space::Cpu(_, _, Some(ts), _), Choice::Template(t)) => {
                let nb = ts.neighbours(t);
                if nb.is_empty() {
                    return self.random(rng);
                }
                Choice::Template(nb[rng.below(nb.len())])
            }
            (Space::Device(d), Choice::Device(c)) => Choice::Device(d.mutate(c, rng)),
            _ => self.random(rng),
        }
    }

    /// The complete steps of `c`: a template's are complete; the knobs' follow `prefix`, the
    /// steps that bring the function to the normal form the knobs are for.
    fn steps(&self, c: &Choice, prefix: &[Step]) -> Result<Vec<Step>, String> {
        let knobs = match (self, c) {
            (Space::Cpu(_, _, Some(ts), _), Choice::Template(t)) => return ts.steps(t),
            (Space::Cpu(g, n, _, _), Choice::Cpu(c)) => space::steps_for(g, n, c)?,
            (Space::Device(d), Choice::Device(c)) => d.steps_for(c)?,
            _ => return Err("a choice of another space".into()),
        };
        Ok(prefix.iter().cloned().chain(knobs).collect())
    }
}
