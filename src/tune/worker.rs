//! Where candidates are measured: in this process ([`InProcess`]), or in a child process
//! ([`Subprocess`], what `kiln tune` uses) so that a candidate that crashes or hangs costs one
//! trial and a restarted worker, never the search.
//!
//! The child is `kiln tune-worker`. It reads one JSON line ([`WorkerInit`]: the function, the
//! target, the seed of the inputs), builds the default, answers `{"baseline": timing}`, then
//! answers each `{"steps": [...]}` line with `{"outcome": ...}` ([`Outcome`]), and each
//! `{"batch": [[...], ...]}` line with one `{"outcome": ...}` line per candidate, in order.
//!
//! A CPU worker also answers `"checking"` as a candidate's checking call starts and `"timing"`
//! as its timed calls start. A checking call that runs past [`ABANDON_FACTOR`] times the
//! search's cutoff (12 times the best so far; at least [`ABANDON_FLOOR_S`], and at least the
//! default's time, which a restart spends calling the default once) is abandoned: the
//! worker is killed, the candidate's outcome is [`Outcome::Abandoned`], and the next request
//! starts a new worker, told the default's time so that it does not time it again. On a 64 x
//! 4096 x 4096 matmul, candidates of the knob space that take 6-12 s a call (the default: 0.24
//! s) had each cost its whole call.
//!
//! Batches: building a candidate (LLVM at its full level, 20-2000 ms for a tiled matmul) takes
//! longer than checking and timing it, so [`Measurer::measure_batch`] builds a batch of
//! candidates at once, one thread each (as many as the machine has cores, at most four), then
//! checks and times them one after another on a quiet machine.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::measure::build;
use super::measure::{Bench, Outcome, Phase, Timing};
use crate::ir::{IRModule, PrimFunc};
use crate::packed_func::PackedFunc;
use crate::schedule::{Schedule, Step};
use crate::target::Target;

/// What a worker measures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerInit {
    /// The function, as a one-function IR module (kiln-ir/1 JSON).
    pub module: serde_json::Value,
    /// The target, canonical JSON.
    pub target: String,
    /// The seed of the inputs.
    pub seed: u64,
    /// The inputs in transparent huge pages ([`crate::npy::set_huge_pages`]; `kiln tune
    /// --huge-pages`).
    #[serde(default)]
    pub huge_pages: bool,
}

/// What the parent adds to a [`WorkerInit`] when it restarts a worker: the default's time,
/// measured by the first worker, so that a restart does not time it again (a large default
/// takes seconds).
#[derive(Deserialize)]
struct Known {
    #[serde(default)]
    baseline: Option<Timing>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    Baseline(Timing),
    Outcome(Outcome),
    Error(String),
    /// A CPU candidate's checking call starts ([`Phase::Checking`]).
    Checking,
    /// Its timed calls start ([`Phase::Timing`]).
    Timing,
}

#[derive(Serialize, Deserialize)]
struct Request {
    #[serde(default)]
    steps: Option<Vec<Step>>,
    #[serde(default)]
    batch: Option<Vec<Vec<Step>>>,
    #[serde(default)]
    cutoff: Option<f64>,
}

/// Threads that build candidates at once: the machine's cores, at most four.
pub fn build_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4)
}

/// Measures candidates of one function.
pub trait Measurer {
    /// The default build's time.
    fn baseline(&self) -> Timing;
    /// Applies `steps` to the function, builds, checks and times it; a candidate whose first
    /// call takes more than `cutoff` seconds is timed by that call alone.
    fn measure(&mut self, steps: &[Step], cutoff: Option<f64>) -> Outcome;
    /// How many candidates [`Measurer::measure_batch`] builds at once (1: one after another).
    fn batch_width(&self) -> usize {
        1
    }
    /// Measures each of `batch` as [`Measurer::measure`] does, the outcomes in order.
    fn measure_batch(&mut self, batch: &[Vec<Step>], cutoff: Option<f64>) -> Vec<Outcome> {
        batch.iter().map(|s| self.measure(s, cutoff)).collect()
    }
}

fn scheduled(f: &PrimFunc, steps: &[Step]) -> Result<PrimFunc, String> {
    let mut s = Schedule::new(f.clone());
    s.apply(steps).map_err(|e| e.to_string())?;
    s.finish().map_err(|e| e.to_string())
}

/// Measures in this process.
pub struct InProcess {
    f: PrimFunc,
    target: Target,
    bench: Bench,
    baseline: Timing,
    /// The last [`RECENT`] schedules [`Measurer::measure`] and [`Measurer::measure_batch`]
    /// built or measured, newest last: measured again (a duel with the best so far, the final
    /// round, the pairing of a winner with the default), they are not built again.
    recent: Vec<(Vec<Step>, PrimFunc, PackedFunc)>,
}

/// How many of its latest builds [`InProcess`] keeps for measuring again: a final round's
/// entrants and the default ([`super::final_round`], then the pairing), and during the search a
/// batch of candidates (at most 4) and the best so far, which a candidate of the batch may duel
/// ([`super::TuneOptions::duel`]).
const RECENT: usize = super::FINALISTS + 4;

impl InProcess {
    /// Builds and times the default of `f`.
    ///
    /// # Errors
    /// As [`Bench::new`].
    pub fn new(f: &PrimFunc, target: &Target, seed: u64) -> Result<Self, String> {
        let (bench, baseline) = Bench::new(f, target, seed)?;
        Ok(Self {
            f: f.clone(),
            target: target.clone(),
            bench,
            baseline,
            recent: Vec::new(),
        })
    }

    /// Like [`InProcess::new`], with the default's time known (not timed again).
    ///
    /// # Errors
    /// As [`Bench::new`].
    pub fn with_baseline(
        f: &PrimFunc,
        target: &Target,
        seed: u64,
        baseline: Timing,
    ) -> Result<Self, String> {
        Ok(Self {
            f: f.clone(),
            target: target.clone(),
            bench: Bench::untimed(f, target, seed)?,
            baseline,
            recent: Vec::new(),
        })
    }
}

impl Measurer for InProcess {
    fn baseline(&self) -> Timing {
        self.baseline
    }

    fn measure(&mut self, steps: &[Step], cutoff: Option<f64>) -> Outcome {
        if let Some(k) = self.recent.iter().position(|(s, _, _)| s == steps) {
            let hit = self.recent.remove(k);
            let out = self.bench.check_and_time(&hit.1, &hit.2, cutoff);
            self.recent.push(hit);
            return out;
        }
        let g = match scheduled(&self.f, steps) {
            Ok(g) => g,
            Err(e) => return Outcome::Invalid(e),
        };
        let func = match build(&g, &self.target) {
            Ok(func) => func,
            Err(e) => return Outcome::Invalid(e),
        };
        let out = self.bench.check_and_time(&g, &func, cutoff);
        self.keep(steps, g, func);
        out
    }

    fn batch_width(&self) -> usize {
        build_threads()
    }

    /// Builds the candidates at once, one thread each, then checks and times them one after
    /// another.
    fn measure_batch(&mut self, batch: &[Vec<Step>], cutoff: Option<f64>) -> Vec<Outcome> {
        self.build_batch(batch)
            .into_iter()
            .zip(batch)
            .map(|(b, steps)| self.check_built(steps, b, cutoff))
            .collect()
    }
}

/// A candidate built (scheduled and compiled), or why not.
type Built = Result<(PrimFunc, PackedFunc), Outcome>;

impl InProcess {
    /// Builds the candidates of `batch` at once, one thread each.
    fn build_batch(&self, batch: &[Vec<Step>]) -> Vec<Built> {
        let (f, target) = (&self.f, &self.target);
        std::thread::scope(|sc| {
            let handles: Vec<_> = batch
                .iter()
                .map(|steps| {
                    std::thread::Builder::new()
                        .name("kiln-tune-build".into())
                        .stack_size(16 << 20)
                        .spawn_scoped(sc, move || {
                            let g = scheduled(f, steps).map_err(Outcome::Invalid)?;
                            let func = build(&g, target).map_err(Outcome::Invalid)?;
                            Ok((g, func))
                        })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(Outcome::Crashed("building the candidate panicked".into()))
                    }),
                    Err(e) => Err(Outcome::Crashed(format!("starting a build thread: {e}"))),
                })
                .collect()
        })
    }

    /// Checks and times a candidate [`InProcess::build_batch`] built from `steps`, and keeps it
    /// for measuring again.
    fn check_built(&mut self, steps: &[Step], b: Built, cutoff: Option<f64>) -> Outcome {
        match b {
            Ok((g, func)) => {
                let out = self.bench.check_and_time(&g, &func, cutoff);
                self.keep(steps, g, func);
                out
            }
            Err(o) => o,
        }
    }

    /// Keeps the build of `steps` among the [`RECENT`], newest last.
    fn keep(&mut self, steps: &[Step], g: PrimFunc, func: PackedFunc) {
        self.recent.retain(|(s, _, _)| s != steps);
        if self.recent.len() == RECENT {
            self.recent.remove(0);
        }
        self.recent.push((steps.to_vec(), g, func));
    }
}

/// `kiln tune-worker`: serves one [`WorkerInit`] and then requests, on stdin and stdout.
///
/// # Errors
/// A first line that is not a [`WorkerInit`], or a function that cannot be benched.
pub fn worker_main() -> Result<(), String> {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut out = std::io::stdout().lock();
    let mut say = |r: &Reply| -> Result<(), String> {
        let text = serde_json::to_string(r).map_err(|e| e.to_string())?;
        writeln!(out, "{text}")
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())
    };
    let first = lines
        .next()
        .ok_or("no init line")?
        .map_err(|e| e.to_string())?;
    let init: WorkerInit =
        serde_json::from_str(&first).map_err(|e| format!("the init line: {e}"))?;
    let known: Known = serde_json::from_str(&first).map_err(|e| {
        format!("the init line: \"baseline\" must be a timing {{\"median\", \"min\", \"max\"}} in seconds: {e}")
    })?;
    crate::npy::set_huge_pages(init.huge_pages);
    let setup = (|| {
        let m = IRModule::from_json_str(&init.module.to_string()).map_err(|e| e.to_string())?;
        let f = m.functions.first().cloned().ok_or("an empty module")?;
        let target = Target::parse(&init.target).map_err(|e| e.to_string())?;
        let mut me = match known.baseline {
            Some(t) => InProcess::with_baseline(&f, &target, init.seed, t)?,
            None => InProcess::new(&f, &target, init.seed)?,
        };
        me.bench.watch(announce);
        Ok::<_, String>(me)
    })();
    let mut me = match setup {
        Ok(m) => m,
        Err(e) => {
            say(&Reply::Error(e.clone()))?;
            return Err(e);
        }
    };
    say(&Reply::Baseline(me.baseline))?;
    for line in lines {
        let line = line.map_err(|e| e.to_string())?;
        match serde_json::from_str::<Request>(&line) {
            Ok(Request {
                steps: Some(steps),
                batch: None,
                cutoff,
            }) => say(&Reply::Outcome(me.measure(&steps, cutoff)))?,
            Ok(Request {
                steps: None,
                batch: Some(batch),
                cutoff,
            }) => {
                // Each outcome as it is known: the parent reads a candidate's "checking" line
                // and then its outcome, before the next candidate's.
                for (b, steps) in me.build_batch(&batch).into_iter().zip(&batch) {
                    say(&Reply::Outcome(me.check_built(steps, b, cutoff)))?;
                }
            }
            Ok(_) => say(&Reply::Error(
                "a request needs one of \"steps\" and \"batch\"".into(),
            ))?,
            Err(e) => say(&Reply::Error(format!(
                "a request that is not {{\"steps\": [...]}} or {{\"batch\": [[...], ...]}}: {e}"
            )))?,
        }
    }
    Ok(())
}

/// Tells the parent where a CPU measurement is, on stdout (the worker's main thread holds
/// stdout's lock, which the same thread may take again).
fn announce(p: Phase) {
    let r = match p {
        Phase::Checking => Reply::Checking,
        Phase::Timing => Reply::Timing,
    };
    if let Ok(text) = serde_json::to_string(&r) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}").and_then(|()| out.flush());
    }
}

struct Child2 {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Drop for Child2 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Measures in a child process (`<exe> tune-worker`), restarted after a crash.
pub struct Subprocess {
    command: Vec<OsString>,
    init: String,
    child: Option<Child2>,
    timeout: Duration,
    baseline: Timing,
    abandon: Abandon,
    /// How many times the worker was restarted.
    pub restarts: usize,
}

/// When a CPU candidate's checking call is abandoned: past `factor` times the cutoff the
/// search gives (three times the best so far), and never before `floor`.
#[derive(Clone, Copy, Debug)]
struct Abandon {
    factor: f64,
    floor: Duration,
}

/// A checking call is abandoned past this many times the cutoff (12 times the best so far:
/// past 9 times, its one call is its time anyway, see [`Bench::check_and_time`]).
pub const ABANDON_FACTOR: f64 = 4.0;

/// ... and never before this many seconds: a cold first call of a small kernel (page faults,
/// the thread pool waking) must not count as slow.
pub const ABANDON_FLOOR_S: f64 = 0.25;

impl Subprocess {
    /// Starts the worker `exe tune-worker` for `init`; a candidate may take `timeout`.
    ///
    /// # Errors
    /// The worker cannot start, or cannot build the default.
    pub fn new(exe: PathBuf, init: &WorkerInit, timeout: Duration) -> Result<Self, String> {
        Self::with_command(vec![exe.into_os_string()], init, timeout)
    }

    /// Starts the worker `<command...> tune-worker` (e.g. `python -m kiln tune-worker`).
    ///
    /// # Errors
    /// An empty command; as [`Subprocess::new`].
    pub fn with_command(
        command: Vec<OsString>,
        init: &WorkerInit,
        timeout: Duration,
    ) -> Result<Self, String> {
        if command.is_empty() {
            return Err("an empty worker command".into());
        }
        let init = serde_json::to_string(init).map_err(|e| e.to_string())?;
        let mut s = Self {
            command,
            init,
            child: None,
            timeout,
            baseline: Timing {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            },
            abandon: Abandon {
                factor: ABANDON_FACTOR,
                floor: Duration::from_secs_f64(ABANDON_FLOOR_S),
            },
            restarts: 0,
        };
        s.baseline = s.start()?;
        Ok(s)
    }

    /// Abandons a CPU candidate whose checking call runs past `factor` times the cutoff
    /// given to [`Measurer::measure`] (and past `floor`, and past the default's time): the
    /// worker is killed and restarted,
    /// and the candidate's outcome is [`Outcome::Abandoned`]. The defaults are
    /// [`ABANDON_FACTOR`] and [`ABANDON_FLOOR_S`]; a factor of infinity never abandons.
    pub fn abandon_after(&mut self, factor: f64, floor: Duration) {
        self.abandon = Abandon { factor, floor };
    }

    /// How long a checking call may take for `cutoff`, if it may be abandoned at all: the
    /// factor times the cutoff, and at least the floor and the default's own time. A restart
    /// calls the default once (for the reference results), so abandoning sooner could cost more
    /// than it saves; waiting that long first, an abandoned candidate costs at most twice what
    /// it would have cost (a 2048³ matmul's default takes 40 s a call: its candidates that take
    /// seconds run to the end).
    fn checking_limit(&self, cutoff: Option<f64>) -> Option<Duration> {
        let limit = cutoff? * self.abandon.factor;
        if !limit.is_finite() || limit < 0.0 {
            return None;
        }
        let restart = Duration::try_from_secs_f64(self.baseline.max).unwrap_or(Duration::ZERO);
        Some(
            Duration::from_secs_f64(limit)
                .max(self.abandon.floor)
                .max(restart),
        )
    }

    fn start(&mut self) -> Result<Timing, String> {
        let mut child = Command::new(&self.command[0])
            .args(&self.command[1..])
            .arg("tune-worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                let cmd: Vec<_> = self.command.iter().map(|c| c.to_string_lossy()).collect();
                format!("starting `{} tune-worker`: {e}", cmd.join(" "))
            })?;
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let init = if self.restarts > 0 {
            // A restart: the first worker timed the default.
            let mut v: serde_json::Value =
                serde_json::from_str(&self.init).map_err(|e| e.to_string())?;
            if let Some(o) = v.as_object_mut() {
                o.insert(
                    "baseline".into(),
                    serde_json::to_value(self.baseline).map_err(|e| e.to_string())?,
                );
            }
            v.to_string()
        } else {
            self.init.clone()
        };
        writeln!(stdin, "{init}").map_err(|e| e.to_string())?;
        stdin.flush().map_err(|e| e.to_string())?;
        let c = Child2 {
            child,
            stdin,
            lines: rx,
        };
        let line = c
            .lines
            .recv_timeout(self.timeout.max(Duration::from_secs(120)))
            .map_err(|_| "the worker did not answer its init line".to_owned())?;
        let t = match serde_json::from_str::<Reply>(&line) {
            Ok(Reply::Baseline(t)) => t,
            Ok(Reply::Error(e)) => return Err(e),
            _ => return Err(format!("the worker answered `{line}`")),
        };
        self.child = Some(c);
        Ok(t)
    }
}

impl Measurer for Subprocess {
    fn baseline(&self) -> Timing {
        self.baseline
    }

    fn measure(&mut self, steps: &[Step], cutoff: Option<f64>) -> Outcome {
        let req = Request {
            steps: Some(steps.to_vec()),
            batch: None,
            cutoff,
        };
        match self.send(&req, 1) {
            Ok(mut v) => v
                .pop()
                .unwrap_or_else(|| Outcome::Crashed("no answer".into())),
            Err((_, crashed)) => crashed,
        }
    }

    fn batch_width(&self) -> usize {
        build_threads()
    }

    /// The batch goes to the worker in one request; if the worker crashes or hangs partway,
    /// the outcomes it gave are kept and the rest are measured one at a time by a restarted
    /// worker, so that only the candidate at fault counts as crashed.
    fn measure_batch(&mut self, batch: &[Vec<Step>], cutoff: Option<f64>) -> Vec<Outcome> {
        if batch.len() <= 1 {
            return batch.iter().map(|s| self.measure(s, cutoff)).collect();
        }
        let req = Request {
            steps: None,
            batch: Some(batch.to_vec()),
            cutoff,
        };
        match self.send(&req, batch.len()) {
            Ok(v) => v,
            Err((mut done, o)) => {
                // An abandoned candidate is settled; a crashed one is measured again alone,
                // so that only the candidate at fault counts as crashed.
                if matches!(o, Outcome::Abandoned(_)) {
                    done.push(o);
                }
                for steps in &batch[done.len()..] {
                    done.push(self.measure(steps, cutoff));
                }
                done
            }
        }
    }
}

impl Subprocess {
    /// Sends `req` and reads `n` outcomes. On a crash, a hang or an abandoned checking call
    /// (the worker killed): the outcomes read before it, and the crash ([`Outcome::Crashed`])
    /// or the abandoned candidate's outcome ([`Outcome::Abandoned`]).
    fn send(&mut self, req: &Request, n: usize) -> Result<Vec<Outcome>, (Vec<Outcome>, Outcome)> {
        if self.child.is_none() {
            self.restarts += 1;
            if let Err(e) = self.start() {
                return Err((
                    Vec::new(),
                    Outcome::Crashed(format!("restarting the worker: {e}")),
                ));
            }
        }
        let req_cutoff = req.cutoff;
        let checking_limit = self.checking_limit(req_cutoff);
        let Some(c) = self.child.as_mut() else {
            return Err((Vec::new(), Outcome::Crashed("no worker".into())));
        };
        let req = match serde_json::to_string(req) {
            Ok(r) => r,
            Err(e) => return Ok(vec![Outcome::Invalid(e.to_string()); n]),
        };
        if writeln!(c.stdin, "{req}")
            .and_then(|()| c.stdin.flush())
            .is_err()
        {
            self.child = None;
            return Err((Vec::new(), Outcome::Crashed("the worker is gone".into())));
        }
        let mut out = Vec::new();
        // Set while a candidate's checking call runs: when it started, and how long it may take.
        let mut checking: Option<(std::time::Instant, Duration)> = None;
        while out.len() < n {
            let wait = match checking {
                Some((since, limit)) => limit.min(self.timeout).saturating_sub(since.elapsed()),
                // The first answer waits for every build of the batch.
                None if out.is_empty() => self.timeout.saturating_mul(n as u32),
                None => self.timeout,
            };
            match c.lines.recv_timeout(wait) {
                Ok(line) => match serde_json::from_str::<Reply>(&line) {
                    Ok(Reply::Checking) => {
                        checking = checking_limit.map(|l| (std::time::Instant::now(), l));
                    }
                    Ok(Reply::Timing) => checking = None,
                    Ok(Reply::Outcome(o)) => {
                        checking = None;
                        out.push(o);
                    }
                    Ok(Reply::Error(e)) => {
                        checking = None;
                        out.push(Outcome::Invalid(e));
                    }
                    _ => {
                        checking = None;
                        out.push(Outcome::Invalid(format!("the worker answered `{line}`")));
                    }
                },
                Err(_) => {
                    let status = c.child.try_wait().ok().flatten();
                    self.child = None;
                    let o = match (status, checking) {
                        (None, Some((since, limit))) if limit < self.timeout => {
                            Outcome::Abandoned(format!(
                                "its checking call ran past {:.3} s, the limit of {:.3} s \
                                 ({:.0}x the cutoff of {:.3} ms, at least {:.3} s and the \
                                 default's {:.3} s), and was stopped",
                                since.elapsed().as_secs_f64(),
                                limit.as_secs_f64(),
                                self.abandon.factor,
                                req_cutoff.unwrap_or(0.0) * 1e3,
                                self.abandon.floor.as_secs_f64(),
                                self.baseline.max
                            ))
                        }
                        (Some(s), _) => Outcome::Crashed(format!("the worker died ({s})")),
                        (None, _) => {
                            Outcome::Crashed(format!("the candidate ran past {:?}", self.timeout))
                        }
                    };
                    return Err((out, o));
                }
            }
        }
        Ok(out)
    }
}
