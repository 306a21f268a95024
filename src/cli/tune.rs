//! `kiln tune` (and the worker it measures in, `kiln tune-worker`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::ir::{IRModule, PrimFunc};
use crate::schedule::Step;
use crate::target::Target;
use crate::tune::{self, Database, Record, Subprocess, TuneOptions, WorkerInit};

use super::codegen::{read_module, DEFAULT_TARGET};
use super::CmdResult;

/// The database used when neither `--db` nor `KILN_TUNING_DB` names one.
pub const DEFAULT_DB: &str = "kiln-tuning.jsonl";

/// `kiln tune`.
#[derive(clap::Args)]
pub struct TuneArgs {
    /// An IR module (kiln-ir/1 JSON), best as written, before any schedule.
    module: PathBuf,
    /// The function to tune (or `--model`).
    #[arg(required_unless_present = "model")]
    function: Option<String>,
    /// Tune every function of the module, one after another (a model's kernels, as
    /// `kiln.to_kiln` converts them), each with the budget of `--trials` and `--seconds`;
    /// functions with symbolic shapes or scalar parameters are skipped, and said so.
    #[arg(long, conflicts_with = "function")]
    model: bool,
    /// The target to tune for (JSON, legacy string or tag).
    #[arg(long, short, default_value = DEFAULT_TARGET)]
    target: String,
    /// Measured candidates at most.
    #[arg(long, default_value_t = 64)]
    trials: usize,
    /// Seconds at most, for each function: the search stops early enough to leave the final
    /// round (`--finals`) and the pairing (`--pair`) their projected time.
    #[arg(long)]
    seconds: Option<f64>,
    /// The tuning database (JSON lines) records are appended to [default: $KILN_TUNING_DB, else
    /// kiln-tuning.jsonl].
    #[arg(long)]
    db: Option<PathBuf>,
    /// The seed of the search and of the inputs: the same seed proposes the same candidates.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Seconds a candidate may take before its worker is restarted (1 or more: with 0, every
    /// candidate would be stopped at once and the search would measure nothing).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Rounds in which the winner is timed against the default build, alternating, after the
    /// search (0: none); a winner that is not faster in the median round, by more than the
    /// pairing's standard error, is not applied. Only where a call of the default takes 0.25 s
    /// or less.
    #[arg(long, value_name = "ROUNDS", default_value_t = 5)]
    pair: usize,
    /// Rounds of the final round after the search (0: none): the fastest candidates (at most
    /// four) measured again, each once per round, the order reversed every other round; the
    /// one with the lowest median over the rounds is the winner (a search's fastest single
    /// measurement is the likeliest to be a lucky one).
    #[arg(long, value_name = "ROUNDS", default_value_t = 3)]
    finals: usize,
    /// The bound on the paired speedup's relative standard error: past `--pair` rounds, the
    /// pairing goes on (up to four times as many rounds) until the speedup is known to within
    /// it (0: exactly `--pair` rounds).
    #[arg(long, value_name = "SE", default_value_t = 0.02)]
    pair_se: f64,
    /// Rounds of a duel during the search (0: none): a candidate whose median is below the
    /// best so far's is timed against it in alternating rounds (up to twice as many, until the
    /// ratio is known to 2 %) and becomes the new best only if it is faster in the median round.
    #[arg(long, value_name = "ROUNDS", default_value_t = 3)]
    duel: usize,
    /// Measure in this process instead of a worker process (faster to start; a crashing
    /// candidate then ends the search).
    #[arg(long)]
    in_process: bool,
    /// Measure on inputs in transparent huge pages (arrays of 4 MiB or more advised with
    /// `madvise(MADV_HUGEPAGE)`), as numpy allocates its arrays: tune for tensors that live
    /// there. Off: 4 KiB pages unless the system's THP mode is `always`, as for tensors from
    /// TVM's and PyTorch's allocators. A kernel that streams a large operand can rank its
    /// candidates differently in the two.
    #[arg(long, conflicts_with_all = ["rpc", "tracker"])]
    huge_pages: bool,
    /// Measure on the TVM RPC server at HOST:PORT (`kiln rpc-server` or TVM's): on its CPU
    /// (`--target` should name that CPU), or with a device target (`opencl`, `cuda`) on its
    /// device 0 of that kind.
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["tracker", "in_process"])]
    rpc: Option<String>,
    /// Measure on a server the RPC tracker at HOST:PORT hands out for `--key`.
    #[arg(
        long,
        value_name = "HOST:PORT",
        requires = "key",
        conflicts_with = "in_process"
    )]
    tracker: Option<String>,
    /// The tracker's device key.
    #[arg(long)]
    key: Option<String>,
    /// Print only the summary.
    #[arg(long, short)]
    quiet: bool,
}

/// The database path: `--db`, else `KILN_TUNING_DB`, else `default`.
pub fn db_path(given: Option<&Path>, default: Option<&str>) -> Option<PathBuf> {
    given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("KILN_TUNING_DB").map(PathBuf::from))
        .or_else(|| default.map(PathBuf::from))
}

/// `module` with the best records of the database at `path` applied (for `kiln build` and
/// `kiln run`); prints what was applied and what was skipped.
///
/// # Errors
/// A database that does not exist or cannot be read.
pub fn apply_db(
    path: &Path,
    module: &IRModule,
    target: &Target,
    any_cpu: bool,
) -> Result<IRModule, Box<dyn std::error::Error>> {
    let db = Database::open_existing(path)?;
    for w in &db.warnings {
        eprintln!("warning: {w}");
    }
    let (m, notes) = db.apply(module, target, any_cpu);
    for n in notes {
        eprintln!("{n}");
    }
    Ok(m)
}

/// `kiln tune`.
pub fn run(a: &TuneArgs) -> CmdResult {
    // The bound is checked before the search, not when the pairing after it needs it.
    tune::PairPlan::new(a.pair, a.pair_se)
        .check()
        .map_err(|e| format!("--pair-se: {e}"))?;
    tune::check_seconds(a.seconds).map_err(|e| format!("--seconds: {e}"))?;
    let module = read_module(&a.module)?;
    module
        .verify()
        .map_err(|e| format!("`{}`: {e}", a.module.display()))?;
    let funcs: Vec<PrimFunc> = match &a.function {
        Some(name) => vec![module.get(name).cloned().ok_or_else(|| {
            format!(
                "`{}` has no function `{name}` (it has {:?})",
                a.module.display(),
                module
                    .functions
                    .iter()
                    .map(|f| f.name.clone())
                    .collect::<Vec<_>>()
            )
        })?],
        None => module.functions.clone(),
    };
    let target = Target::parse(&a.target)?;
    if a.rpc.is_none() && a.tracker.is_none() {
        if let Some(w) = generic_cpu_warning(&target) {
            eprintln!("warning: {w}");
        }
    }
    let path = db_path(a.db.as_deref(), Some(DEFAULT_DB)).unwrap_or_else(|| DEFAULT_DB.into());
    let mut db = Database::open(&path)?;
    for w in &db.warnings {
        eprintln!("warning: {w}");
    }
    // Before anything is measured: a database that cannot be written would lose every record
    // of the search (they are written as they are found).
    db.check_writable()?;
    // `stop` is raised by Ctrl-C (the search stops after the candidate being measured, and its
    // best is measured again and paired as usual; a second Ctrl-C ends the process at once)
    // and by a record that cannot be written; `ctrl_c` by Ctrl-C alone.
    let (stop, ctrl_c) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let _interrupt = Interrupt::on_ctrl_c(&[&ctrl_c, &stop])?;
    if !a.model {
        tune_one(a, &funcs[0], &target, &mut db, &path, &stop)?;
        return interrupted(&ctrl_c, "");
    }
    // The whole model: one function after another, and a table at the end.
    let mut rows = Vec::new();
    for (n, f) in funcs.iter().enumerate() {
        if stop.load(Ordering::SeqCst) {
            let why = if ctrl_c.load(Ordering::SeqCst) {
                "interrupted"
            } else {
                "a record could not be written"
            };
            let left: Vec<String> = funcs[n..].iter().map(|f| format!("`{}`", f.name)).collect();
            eprintln!("not tuned ({why}): {}", left.join(", "));
            for f in &funcs[n..] {
                rows.push(format!("| {} | not tuned: {why} | | |", f.name));
            }
            break;
        }
        if let Err(why) = tune::measure::benchable(f) {
            eprintln!("skipping `{}`: {why}", f.name);
            rows.push(format!("| {} | skipped: {why} | | |", f.name));
            continue;
        }
        match tune_one(a, f, &target, &mut db, &path, &stop) {
            Ok((default, best)) => rows.push(match best {
                Some(b) => format!(
                    "| {} | {} | {} | {:.2}x |",
                    f.name,
                    crate::util::ms(default),
                    crate::util::ms(b),
                    default / b.max(f64::MIN_POSITIVE)
                ),
                None => format!(
                    "| {} | {} | (the default) | 1.00x |",
                    f.name,
                    crate::util::ms(default)
                ),
            }),
            Err(e) => {
                eprintln!("`{}`: {e}", f.name);
                rows.push(format!("| {} | failed: {e} | | |", f.name));
            }
        }
    }
    println!("\n| function | default, ms | tuned, ms | speedup |\n|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!("records written to {}", path.display());
    interrupted(&ctrl_c, " of the model")
}

/// Ctrl-C (SIGINT) for the length of a search: the first raises the flags, the first of
/// which is the search's `stop`, so the search ends after the candidate being measured and
/// the rounds after it run (the best measured again, paired with the default, its record
/// written: what an interrupted search found is applied as a finished one's is); a second,
/// with the first flag already raised, ends the process at once with the status 130 a shell
/// gives an interrupted command (the records written so far are kept: each is appended whole
/// as it is found). The handlers go when this is dropped.
struct Interrupt(Vec<signal_hook::SigId>);

impl Interrupt {
    fn on_ctrl_c(flags: &[&Arc<AtomicBool>]) -> std::io::Result<Interrupt> {
        use signal_hook::consts::SIGINT;
        let mut ids = Vec::new();
        if let Some(first) = flags.first() {
            // The order matters: the exit checks the flag before the actions after it raise it.
            ids.push(signal_hook::flag::register_conditional_shutdown(
                SIGINT,
                130,
                Arc::clone(first),
            )?);
        }
        for flag in flags {
            ids.push(signal_hook::flag::register(SIGINT, Arc::clone(flag))?);
        }
        Ok(Interrupt(ids))
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        for id in self.0.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// A search ended by Ctrl-C: an error whose status is 130 ([`super::run`]), after the rounds
/// and the records of what was found.
#[derive(Debug)]
pub struct Interrupted(String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Interrupted {}

/// `Err(Interrupted)` when `ctrl_c` was raised.
fn interrupted(ctrl_c: &AtomicBool, what: &str) -> CmdResult {
    if ctrl_c.load(Ordering::SeqCst) {
        return Err(Box::new(Interrupted(format!(
            "interrupted (Ctrl-C): what the search{what} found is in the database"
        ))));
    }
    Ok(())
}

/// Tunes `f`, appending its records to `db`; the default's time and the best time found.
fn tune_one(
    a: &TuneArgs,
    f: &PrimFunc,
    target: &Target,
    db: &mut Database,
    path: &Path,
    stop: &Arc<AtomicBool>,
) -> Result<(f64, Option<f64>), Box<dyn std::error::Error>> {
    let init = WorkerInit {
        module: IRModule::from_functions(vec![f.clone()]).to_json(),
        target: target.to_string(),
        seed: a.seed,
        huge_pages: a.huge_pages,
    };
    // The inputs of an in-process measurer, too.
    crate::npy::set_huge_pages(a.huge_pages);
    let remote = match (&a.rpc, &a.tracker) {
        (Some(addr), _) => Some(tune::remote::Endpoint::Direct(addr.clone())),
        (None, Some(t)) => Some(tune::remote::Endpoint::Tracker(
            t.clone(),
            a.key.clone().unwrap_or_default(),
        )),
        _ => None,
    };
    let mut measurer: Box<dyn tune::Measurer> = if let Some(at) = remote {
        Box::new(tune::remote::Remote::new(at, f, target, a.seed)?)
    } else if a.in_process {
        Box::new(tune::InProcess::new(f, target, a.seed)?)
    } else {
        Box::new(Subprocess::with_command(
            worker_command()?,
            &init,
            Duration::from_secs(a.timeout),
        )?)
    };
    // A remote CPU's model (or device's name) is not known here: the record says where it
    // was measured.
    let remote_at = match (&a.rpc, &a.tracker, &a.key) {
        (Some(addr), _, _) => Some(format!("remote {addr}")),
        (None, Some(_), Some(k)) => Some(format!("remote key {k}")),
        (None, Some(t), None) => Some(format!("remote tracker {t}")),
        _ => None,
    };
    let cpu = remote_at.clone().unwrap_or_else(tune::db::host_cpu);
    let device = match &remote_at {
        Some(at) if target.kind_name() != "llvm" => format!("{} of {at}", target.kind_name()),
        _ => tune::db::device_name(target),
    };
    let default = measurer.baseline();
    let w = tune::db::workload(f);
    eprintln!(
        "tuning {} for {} on {}: the default build takes {} ms [{}, {}]",
        w.key,
        target,
        if device == "cpu" { &cpu } else { &device },
        crate::util::ms(default.median),
        crate::util::ms(default.min),
        crate::util::ms(default.max)
    );
    // The budget of seconds counts from here: the search, its final round and the pairing.
    let budget_from = std::time::Instant::now();
    // Raised by Ctrl-C, and here when a record cannot be written: the search stops after that
    // candidate instead of measuring on for records it cannot keep (a disk that filled up
    // mid-search).
    let opts = TuneOptions {
        trials: a.trials,
        seconds: a.seconds,
        finals: a.finals,
        pair: a.pair,
        seed: a.seed,
        progress: !a.quiet,
        stop: Some(stop.clone()),
        duel: a.duel,
    };
    // A record of this search: `steps` timed at `time` after `trials` candidates.
    let record = |steps: Vec<Step>, time, trials| Record {
        format: tune::db::FORMAT.to_owned(),
        workload: w.clone(),
        target: target.to_string(),
        cpu: cpu.clone(),
        device: device.clone(),
        steps,
        time,
        default_time: default,
        trials,
        seed: a.seed,
        kiln: env!("CARGO_PKG_VERSION").to_owned(),
        paired: None,
        finals: None,
        huge_pages: a.huge_pages,
    };
    let mut save_err = None;
    let mut last: Option<Record> = None;
    let mut report = tune::tune(f, target, measurer.as_mut(), &opts, |steps, t, trials| {
        let r = record(steps.to_vec(), t, trials);
        if let Err(e) = db.append(r.clone()) {
            save_err.get_or_insert(e);
            stop.store(true, Ordering::SeqCst);
        }
        last = Some(r);
    })?;
    if let Some(e) = save_err {
        return Err(format!("{e}; the search stopped there").into());
    }
    // Past a failed write, only Ctrl-C raises `stop`: the search was interrupted.
    let interrupted = stop.load(Ordering::SeqCst);
    if interrupted && report.trials > 0 {
        eprintln!(
            "interrupted: the search stopped after {} candidates; its best is measured again and paired with the default (Ctrl-C again to quit at once, keeping the records written so far)",
            report.trials
        );
    } else if interrupted {
        eprintln!("interrupted before the first candidate was measured");
    }
    // The fastest few measured again side by side: the winner's record, with its time from
    // the final round, outranks the records written on the way.
    let mut final_line = None;
    if tune::has_final_round(a.finals, report.leaders.len()) {
        let entrants = report.leaders.clone();
        let started = std::time::Instant::now();
        let fr = tune::final_round(measurer.as_mut(), &entrants, a.finals)?;
        let took = started.elapsed().as_secs_f64();
        let t = fr.times[fr.winner].clone()?;
        let steps = entrants[fr.winner].0.clone();
        let mut r = record(steps.clone(), t, report.trials);
        r.finals = Some(tune::Finals {
            entrants: entrants.len(),
            rounds: fr.rounds,
        });
        db.append(r.clone())?;
        let was_best = report.best.as_ref().is_some_and(|(s, _)| *s == steps);
        let others: Vec<String> = fr
            .times
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != fr.winner)
            .map(|(_, t)| match t {
                Ok(t) => crate::util::ms(t.median),
                Err(_) => "failed".to_owned(),
            })
            .collect();
        final_line = Some(format!(
            "finals:  the fastest {} measured again in {} alternating rounds ({:.1} s): {} ms against {} ms; {}",
            entrants.len(),
            fr.rounds,
            took,
            crate::util::ms(t.median),
            others.join(", "),
            if was_best {
                "the search's best won"
            } else {
                "the winner replaces the search's best"
            }
        ));
        report.best = Some((steps, t));
        last = Some(r);
    }
    // The winner against the default, in alternating rounds: its record again, with the
    // pairing, which outranks the records written on the way.
    let mut confirmed = None;
    if let (Some(mut r), true) = (last, tune::pairs_with_default(a.pair, default.median)) {
        let mut plan = tune::PairPlan::new(a.pair, a.pair_se);
        plan.deadline = a
            .seconds
            .and_then(|s| budget_from.checked_add(std::time::Duration::try_from_secs_f64(s).ok()?));
        let (p, t) = tune::pair_until(measurer.as_mut(), &r.steps, plan)?;
        r.paired = Some(p);
        r.time = t;
        db.append(r)?;
        confirmed = Some(p);
    }
    println!(
        "{}: {} candidates in {:.1} s ({:.2} s each; {} refused, {} wrong, {} crashed, {} abandoned; {} duels with the best so far, {} won)",
        w.key,
        report.trials,
        report.seconds,
        report.seconds / report.trials.max(1) as f64,
        report.invalid,
        report.wrong,
        report.crashed,
        report.abandoned,
        report.duels,
        report.duels_won
    );
    if report.serial_only > 0 {
        println!(
            "serial:  {} candidates with parallel loops left out: the default takes under {} ms, where waking the thread pool costs more than a second thread gains",
            report.serial_only,
            crate::util::ms(tune::PARALLEL_MIN_DEFAULT_S)
        );
    }
    println!(
        "default: {} ms [{}, {}]",
        crate::util::ms(default.median),
        crate::util::ms(default.min),
        crate::util::ms(default.max)
    );
    match &report.best {
        Some((steps, t)) => {
            println!(
                "best:    {} ms [{}, {}], {:.2}x the default",
                crate::util::ms(t.median),
                crate::util::ms(t.min),
                crate::util::ms(t.max),
                default.median / t.median.max(f64::MIN_POSITIVE)
            );
            println!("steps:   {}", serde_json::to_string(steps)?);
            if let Some(l) = &final_line {
                println!("{l}");
            }
            // The noise of the pairing: the standard error reached, against the bound.
            let noise = |p: &tune::Paired| match p.se {
                Some(se) if a.pair_se > 0.0 && se > a.pair_se => format!(
                    " (standard error {:.1} %: over the bound of {:.1} % {})",
                    se * 100.0,
                    a.pair_se * 100.0,
                    if p.rounds < a.pair.saturating_mul(4) {
                        "when the budget of seconds ran out"
                    } else {
                        "after the most rounds"
                    }
                ),
                Some(se) if a.pair_se > 0.0 => format!(
                    " (standard error {:.1} %, bound {:.1} %)",
                    se * 100.0,
                    a.pair_se * 100.0
                ),
                Some(se) => format!(" (standard error {:.1} %)", se * 100.0),
                None => String::new(),
            };
            match confirmed {
                Some(p) if p.beats_default() => println!(
                    "paired:  {:.2}x the default [{:.2}, {:.2}] over {} alternating rounds{}",
                    p.speedup,
                    p.low,
                    p.high,
                    p.rounds,
                    noise(&p)
                ),
                Some(p) => println!(
                    "paired:  {:.2}x the default [{:.2}, {:.2}] over {} alternating rounds{}: {}, so the record keeps the default build",
                    p.speedup,
                    p.low,
                    p.high,
                    p.rounds,
                    noise(&p),
                    if p.speedup > 1.0 {
                        "not faster beyond the noise (the speedup is within its standard error of 1)"
                    } else {
                        "not faster"
                    }
                ),
                None if a.pair > 0 => println!(
                    "paired:  not done (a call of the default takes more than {} s)",
                    tune::PAIR_MAX_CALL_S
                ),
                None => {}
            }
            println!("record written to {}", path.display());
        }
        // Interrupted before a candidate was measured: the search has no answer to record.
        None if report.trials == 0 && interrupted => {
            println!("no candidate measured before the interrupt: no record written");
        }
        None => {
            // The search's answer is still an answer: a record of the default build (no
            // steps), so a later build with this database knows the default was measured and
            // kept, and a database is always there after a search that ran.
            db.append(record(Vec::new(), default, report.trials))?;
            println!(
                "no candidate beat the default: a record that keeps the default build written to {}",
                path.display()
            );
        }
    }
    let best = match (confirmed, &report.best) {
        (Some(p), Some(_)) if !p.beats_default() => None,
        (_, b) => b.as_ref().map(|(_, t)| t.median),
    };
    Ok((default.median, best))
}

/// The command `kiln tune` starts its worker with (before `tune-worker`): the JSON list of
/// `KILN_TUNE_WORKER` when set (`python -m kiln` sets `["<python>", "-m", "kiln"]`, this
/// process being Python), else this executable.
fn worker_command() -> Result<Vec<std::ffi::OsString>, Box<dyn std::error::Error>> {
    match std::env::var("KILN_TUNE_WORKER") {
        Ok(text) if !text.trim().is_empty() => {
            let v: Vec<String> = serde_json::from_str(&text).map_err(|e| {
                format!("KILN_TUNE_WORKER: expected a JSON list of strings, found `{text}`: {e}")
            })?;
            if v.is_empty() {
                return Err("KILN_TUNE_WORKER: an empty command".into());
            }
            Ok(v.into_iter().map(Into::into).collect())
        }
        _ => Ok(vec![std::env::current_exe()?.into_os_string()]),
    }
}

/// `kiln tune-worker`: the process `kiln tune` measures candidates in.
pub fn run_worker() -> CmdResult {
    // Ctrl-C in a terminal reaches the whole process group. The worker leaves the first to
    // `kiln tune`, which stops after the candidate being measured and then measures its best
    // again here, and ends with the second, as `kiln tune` does.
    let seen = Arc::new(AtomicBool::new(false));
    let _interrupt = Interrupt::on_ctrl_c(&[&seen])?;
    tune::worker::worker_main().map_err(|e| e.into())
}

/// A warning for a CPU target that names no `mcpu` or `mattr`, measured on this machine: like TVM's `llvm`, it means generic x86-64 code (SSE2, no AVX or FMA), so the search
/// would rank schedules for vector units this machine's kernels would not use. Tuning for the
/// host is the default target, `mcpu: native`.
fn generic_cpu_warning(target: &Target) -> Option<String> {
    let unset = |k: &str| {
        target.get_str(k).is_none_or(str::is_empty)
            && target.get_str_array(k).is_none_or(<[String]>::is_empty)
    };
    if target.kind_name() != "llvm" || !["mcpu", "mattr"].into_iter().all(unset) {
        return None;
    }
    Some(format!(
        "the target {target} names no `mcpu`: the search measures code for generic x86-64 \
         (SSE2, no AVX or FMA), as TVM's `llvm` compiles; to tune for this machine's vector \
         units, give `--target '{{\"kind\": \"llvm\", \"mcpu\": \"native\"}}'` (the default) \
         or the CPU the kernel will run on"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_without_a_cpu_is_warned_of() {
        let warned = |t: &str| generic_cpu_warning(&Target::parse(t).unwrap()).is_some();
        assert!(warned("llvm"));
        assert!(warned(r#"{"kind": "llvm"}"#));
        assert!(!warned(DEFAULT_TARGET));
        assert!(!warned(r#"{"kind": "llvm", "mcpu": "haswell"}"#));
        assert!(!warned("llvm -mattr=+avx2"));
        assert!(!warned("opencl"));
        // What it says: the target seen, what that target compiles, and what to give instead.
        let w = generic_cpu_warning(&Target::parse("llvm").unwrap()).unwrap();
        for part in [
            r#"the target {"kind":"llvm""#,
            "names no `mcpu`",
            "generic x86-64 (SSE2, no AVX or FMA)",
            r#"--target '{"kind": "llvm", "mcpu": "native"}'"#,
        ] {
            assert!(w.contains(part), "{part:?} not in {w:?}");
        }
    }
}
