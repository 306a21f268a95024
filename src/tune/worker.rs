//! Where candidates are measured: in this process ([`InProcess`]), or in a child process
//! ([`Subprocess`], what `kiln tune` uses) so that a candidate that crashes or hangs costs one
//! trial and a restarted worker, never the search.
//!
//! The child is `kiln tune-worker`. It reads one JSON line ([`WorkerInit`]: the function, the
//! target, the seed of the inputs), builds the default, answers `{"baseline": timing}`, then
//! answers each `{"steps": [...]}` line with `{"outcome": ...}` ([`Outcome`]), and each
//! `{"batch": [[...], ...]}` line with one `{"outcome": ...}` line per candidate, in order.
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
use super::measure::{Bench, Outcome, Timing};
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
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    Baseline(Timing),
    Outcome(Outcome),
    Error(String),
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
}

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
        })
    }
}

impl Measurer for InProcess {
    fn baseline(&self) -> Timing {
        self.baseline
    }

    fn measure(&mut self, steps: &[Step], cutoff: Option<f64>) -> Outcome {
        match scheduled(&self.f, steps) {
            Ok(g) => self.bench.measure(&g, &self.target, cutoff),
            Err(e) => Outcome::Invalid(e),
        }
    }

    fn batch_width(&self) -> usize {
        build_threads()
    }

    /// Builds the candidates at once, one thread each, then checks and times them one after
    /// another.
    fn measure_batch(&mut self, batch: &[Vec<Step>], cutoff: Option<f64>) -> Vec<Outcome> {
        let (f, target) = (&self.f, &self.target);
        let built: Vec<Result<(PrimFunc, PackedFunc), Outcome>> = std::thread::scope(|sc| {
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
        });
        built
            .into_iter()
            .map(|r| match r {
                Ok((g, func)) => self.bench.check_and_time(&g, &func, cutoff),
                Err(o) => o,
            })
            .collect()
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
    let setup = (|| {
        let m = IRModule::from_json_str(&init.module.to_string()).map_err(|e| e.to_string())?;
        let f = m.functions.first().cloned().ok_or("an empty module")?;
        let target = Target::parse(&init.target).map_err(|e| e.to_string())?;
        let me = InProcess::new(&f, &target, init.seed)?;
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
                for o in me.measure_batch(&batch, cutoff) {
                    say(&Reply::Outcome(o))?;
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
    /// How many times the worker was restarted.
    pub restarts: usize,
}

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
            restarts: 0,
        };
        s.baseline = s.start()?;
        Ok(s)
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
        writeln!(stdin, "{}", self.init).map_err(|e| e.to_string())?;
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
            Err((mut done, _)) => {
                for steps in &batch[done.len()..] {
                    done.push(self.measure(steps, cutoff));
                }
                done
            }
        }
    }
}

impl Subprocess {
    /// Sends `req` and reads `n` outcomes. On a crash or a hang: the outcomes read before it,
    /// and the crash as an outcome.
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
        while out.len() < n {
            // The first answer waits for every build of the batch.
            let wait = if out.is_empty() {
                self.timeout.saturating_mul(n as u32)
            } else {
                self.timeout
            };
            match c.lines.recv_timeout(wait) {
                Ok(line) => out.push(match serde_json::from_str::<Reply>(&line) {
                    Ok(Reply::Outcome(o)) => o,
                    Ok(Reply::Error(e)) => Outcome::Invalid(e),
                    _ => Outcome::Invalid(format!("the worker answered `{line}`")),
                }),
                Err(_) => {
                    let status = c.child.try_wait().ok().flatten();
                    self.child = None;
                    let o = Outcome::Crashed(match status {
                        Some(s) => format!("the worker died ({s})"),
                        None => format!("the candidate ran past {:?}", self.timeout),
                    });
                    return Err((out, o));
                }
            }
        }
        Ok(out)
    }
}
