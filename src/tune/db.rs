//! The tuning database: JSON lines, one [`Record`] per line, appended as a search finds better
//! schedules (so an interrupted search keeps what it found), or once with no steps when no
//! candidate beat the default build (which a build then keeps). Databases merge by concatenation
//! (`cat a.jsonl b.jsonl > c.jsonl`): the best record for a workload wins wherever it sits.
//!
//! A record is applied to a function only when all of these hold:
//! - the function's *workload hash* is the record's: the blake3 of the function's kiln-ir/1 JSON
//!   with its name taken out (the same loops over the same shapes and types under another name
//!   are the same workload);
//! - the target's canonical JSON is the record's;
//! - the host CPU's model name is the record's, unless the caller allows any CPU;
//! - the steps still apply (a record kiln cannot replay is stale: skipped with a warning).
//!
//! A line that is not a record (corrupt, truncated, another format) is skipped with a warning
//! naming its line; nothing is applied blindly.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::measure::{Paired, Timing};
use crate::ir::{IRModule, PrimFunc};
use crate::schedule::{Schedule, Step};
use crate::target::Target;

/// The `format` of a record.
pub const FORMAT: &str = "kiln-tune/1";

/// A workload: what a record is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// The structural hash (hex).
    pub hash: String,
    /// A readable key: `name(A: float32[1024, 1024], ...)`.
    pub key: String,
}

/// One tuning result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// [`FORMAT`].
    pub format: String,
    /// The workload.
    pub workload: Workload,
    /// The target, canonical JSON.
    pub target: String,
    /// The model name of the CPU it was measured on.
    pub cpu: String,
    /// The device it ran on (`cpu`).
    pub device: String,
    /// The schedule.
    pub steps: Vec<Step>,
    /// Its time per call.
    pub time: Timing,
    /// The default build's time per call, measured in the same search.
    pub default_time: Timing,
    /// Candidates measured until this one was found.
    pub trials: usize,
    /// The search's seed.
    pub seed: u64,
    /// kiln's version.
    pub kiln: String,
    /// The record's schedule timed against the default in alternating rounds after the search
    /// (absent from the records a search writes as it goes, and from older kilns').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paired: Option<Paired>,
    /// The record's schedule won a final round after the search ([`crate::tune::final_round`]),
    /// its `time` taken there (absent from the records a search writes as it goes, and from
    /// older kilns').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finals: Option<Finals>,
    /// Measured on inputs in transparent huge pages (`kiln tune --huge-pages`), where a kernel
    /// that streams a large operand can rank its schedules otherwise than in 4 KiB pages;
    /// `kiln build` says so when it applies such a record (absent when false, and from older
    /// kilns').
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub huge_pages: bool,
}

/// How a record's schedule won its search's final round ([`Record::finals`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finals {
    /// The entrants: the search's fastest candidates.
    pub entrants: usize,
    /// Rounds, each entrant measured once per round.
    pub rounds: usize,
}

/// What the database holds for a function ([`Database::lookup`]).
#[derive(Debug)]
pub enum Lookup<'a> {
    /// The record to apply.
    Apply(&'a Record),
    /// The records were paired against the default and none beat it: the default build stays
    /// (the best of them, and its pairing).
    KeepDefault(&'a Record, Paired),
    /// No record for this function, target, CPU and device.
    None,
}

fn func_json(f: &PrimFunc) -> serde_json::Value {
    let mut v = IRModule::from_functions(vec![f.clone()]).to_json();
    if let Some(func) = v.get_mut("functions").and_then(|x| x.get_mut(0)) {
        if let Some(o) = func.as_object_mut() {
            o.insert("name".into(), serde_json::Value::String(String::new()));
            if let Some(a) = o.get_mut("attrs").and_then(|a| a.as_object_mut()) {
                a.remove("global_symbol");
            }
        }
    }
    v
}

/// The workload of `f`.
pub fn workload(f: &PrimFunc) -> Workload {
    let hash = blake3::hash(func_json(f).to_string().as_bytes())
        .to_hex()
        .to_string();
    let params: Vec<String> = f
        .params
        .iter()
        .map(|p| match p {
            crate::ir::Param::Buffer(b) => format!(
                "{}: {}[{}]",
                b.name,
                b.dtype,
                b.shape
                    .iter()
                    .map(|e| e.as_int().map_or_else(|| e.to_string(), |v| v.to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            crate::ir::Param::Scalar(v) => format!("{}: {}", v.name, v.dtype),
        })
        .collect();
    Workload {
        hash: hash[..32].to_owned(),
        key: format!("{}({})", f.name, params.join(", ")),
    }
}

/// The host CPU's model name (`/proc/cpuinfo`), or `unknown`.
pub fn host_cpu() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The device a target's candidates are measured on, as records name it: `cpu` for a CPU
/// target, else the kind and the device's own name (`opencl: cpu-haswell-Intel(R) Xeon(R)
/// Processor`), or the kind alone when the device does not say or is not there.
pub fn device_name(target: &Target) -> String {
    let kind = target.kind_name();
    if kind == "llvm" {
        return "cpu".to_owned();
    }
    let named = super::measure::device_of(target)
        .ok()
        .flatten()
        .and_then(|dev| {
            let api = crate::device_api::get(dev.device_type).ok()?;
            api.attr(dev, crate::device_api::AttrKind::DEVICE_NAME)
                .ok()?
        })
        .map(|v| format!("{kind}: {v}"));
    named.unwrap_or_else(|| kind.to_owned())
}

/// Whether `f`'s last byte is something other than a newline.
fn ends_mid_line(f: &mut std::fs::File) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    if f.metadata()?.len() == 0 {
        return Ok(false);
    }
    f.seek(SeekFrom::End(-1))?;
    let mut last = [0u8];
    f.read_exact(&mut last)?;
    Ok(last[0] != b'\n')
}

/// The record with the smallest median time.
fn fastest<'a>(records: impl Iterator<Item = &'a Record>) -> Option<&'a Record> {
    records.min_by(|a, b| a.time.median.total_cmp(&b.time.median))
}

/// A database file and its records.
#[derive(Debug, Default)]
pub struct Database {
    path: Option<PathBuf>,
    /// The records read or added.
    pub records: Vec<Record>,
    /// Lines that were skipped, and why.
    pub warnings: Vec<String>,
}

impl Database {
    /// Reads `path`, which must exist: the database a build applies (a path that names no
    /// file is a mistake there, where [`Database::open`] starts an empty one to append to).
    ///
    /// # Errors
    /// A missing file, or one that cannot be read.
    pub fn open_existing(path: &Path) -> Result<Database, String> {
        if !path.exists() {
            return Err(format!(
                "the tuning database `{}` does not exist",
                path.display()
            ));
        }
        Database::open(path)
    }

    /// Reads `path` (a missing file is an empty database).
    ///
    /// # Errors
    /// A file that exists but cannot be read.
    pub fn open(path: &Path) -> Result<Database, String> {
        let mut db = Database {
            path: Some(path.to_path_buf()),
            ..Database::default()
        };
        let bytes = match crate::util::read_bounded(path, crate::util::MAX_TEXT_FILE_BYTES) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(db),
            Err(e) => {
                return Err(format!(
                    "reading the tuning database `{}`: {e}",
                    path.display()
                ))
            }
        };
        // Line by line, so that a line of bytes that are not UTF-8 (a corrupt disk block, a
        // binary file concatenated in) costs that line, not the file.
        for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
            let Ok(line) = std::str::from_utf8(raw) else {
                db.warnings.push(format!(
                    "{}:{}: not UTF-8 text: skipped",
                    path.display(),
                    i + 1
                ));
                continue;
            };
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Record>(line) {
                Ok(r) if r.format == FORMAT => db.records.push(r),
                Ok(r) => db.warnings.push(format!(
                    "{}:{}: format `{}`, expected `{FORMAT}`: skipped",
                    path.display(),
                    i + 1,
                    r.format
                )),
                Err(e) => db.warnings.push(format!(
                    "{}:{}: not a tuning record ({e}): skipped",
                    path.display(),
                    i + 1
                )),
            }
        }
        Ok(db)
    }

    /// `Ok` where records can be appended to the database's file, which is opened for
    /// appending (and created, empty, where it is missing). A search calls it before it
    /// measures anything: its records are written as they are found, and a file that cannot
    /// be written would lose them all.
    ///
    /// # Errors
    /// The file, and why it cannot be opened for writing.
    pub fn check_writable(&self) -> Result<(), String> {
        let Some(p) = &self.path else {
            return Ok(());
        };
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map(drop)
            .map_err(|e| {
                format!(
                    "cannot write the tuning database `{}`: {e} (checked before the search, so \
                     that no measurement is lost)",
                    p.display()
                )
            })
    }

    /// Appends `r` to the file (and to the records).
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn append(&mut self, r: Record) -> Result<(), String> {
        if let Some(p) = &self.path {
            let mut line = serde_json::to_string(&r).map_err(|e| e.to_string())?;
            line.push('\n');
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(p)
                .map_err(|e| format!("writing the tuning database `{}`: {e}", p.display()))?;
            // A last line cut short (a search killed mid-write, a file edited by hand) is ended
            // first: the record would otherwise be glued to it and lost with it.
            if ends_mid_line(&mut f).unwrap_or(false) {
                line.insert(0, '\n');
            }
            // One write of the whole line: appends from two searches do not interleave.
            f.write_all(line.as_bytes())
                .and_then(|()| f.flush())
                .map_err(|e| format!("writing the tuning database `{}`: {e}", p.display()))?;
        }
        self.records.push(r);
        Ok(())
    }

    /// The record to apply to `f` on `target` (and this CPU and device, unless `any_cpu`):
    /// [`Database::lookup`]'s [`Lookup::Apply`].
    pub fn best(&self, f: &PrimFunc, target: &Target, any_cpu: bool) -> Option<&Record> {
        match self.lookup(f, target, any_cpu) {
            Lookup::Apply(r) => Some(r),
            _ => None,
        }
    }

    /// What the records say for `f` on `target` (and this CPU and device, unless `any_cpu`).
    /// Records paired against the default (`kiln tune`'s last step) outrank the others (what
    /// a search writes as it goes, or an older kiln wrote): among them, the fastest whose
    /// pairing beat the default beyond its noise ([`Paired::beats_default`]), and none when
    /// no paired record did. Without
    /// paired records, the fastest winner of a final round ([`Record::finals`]: its time was
    /// measured beside its rivals', not in one lucky batch); without those, the fastest record.
    pub fn lookup(&self, f: &PrimFunc, target: &Target, any_cpu: bool) -> Lookup<'_> {
        let w = workload(f);
        let t = target.to_string();
        let mut here: Option<(String, String)> = None;
        let matching: Vec<&Record> = self
            .records
            .iter()
            .filter(|r| r.workload.hash == w.hash && r.target == t)
            .filter(|r| {
                any_cpu || {
                    let (cpu, dev) = here.get_or_insert_with(|| (host_cpu(), device_name(target)));
                    r.cpu == *cpu && r.device == *dev
                }
            })
            .collect();
        if matching.iter().any(|r| r.paired.is_some()) {
            let winners = matching
                .iter()
                .copied()
                .filter(|r| r.paired.is_some_and(|p| p.beats_default()));
            if let Some(r) = fastest(winners) {
                return Lookup::Apply(r);
            }
            let paired = matching.iter().copied().filter(|r| r.paired.is_some());
            return fastest(paired)
                .and_then(|r| Some(Lookup::KeepDefault(r, r.paired?)))
                .unwrap_or(Lookup::None);
        }
        if matching.iter().any(|r| r.finals.is_some()) {
            let finals = matching.iter().copied().filter(|r| r.finals.is_some());
            return fastest(finals).map_or(Lookup::None, Lookup::Apply);
        }
        fastest(matching.into_iter()).map_or(Lookup::None, Lookup::Apply)
    }

    /// `module` with every function that has a record scheduled by it; notes say what was
    /// applied and what was skipped.
    pub fn apply(
        &self,
        module: &IRModule,
        target: &Target,
        any_cpu: bool,
    ) -> (IRModule, Vec<String>) {
        let mut notes = Vec::new();
        let mut out = Vec::new();
        for f in &module.functions {
            let r = match self.lookup(f, target, any_cpu) {
                Lookup::Apply(r) => r,
                Lookup::KeepDefault(_, p) => {
                    notes.push(format!(
                        "`{}`: no tuned schedule beat the default build when paired with it ({:.2}x [{:.2}, {:.2}] over {} rounds{}): the default build is kept",
                        f.name,
                        p.speedup,
                        p.low,
                        p.high,
                        p.rounds,
                        match p.se {
                            Some(se) if p.speedup > 1.0 => format!(
                                ", within its standard error of {:.1} %",
                                se * 100.0
                            ),
                            _ => String::new(),
                        }
                    ));
                    out.push(f.clone());
                    continue;
                }
                Lookup::None => {
                    out.push(f.clone());
                    continue;
                }
            };
            if r.steps.is_empty() {
                notes.push(format!(
                    "`{}`: no candidate of {} beat the default build when tuned ({} on {}): the default build is kept",
                    f.name, r.trials, r.kiln, r.cpu
                ));
                out.push(f.clone());
                continue;
            }
            let mut s = Schedule::new(f.clone());
            match s.apply(&r.steps).and_then(|()| s.finish()) {
                Ok(g) => {
                    let speedup = match r.paired {
                        Some(p) => format!("{:.2}x the default, paired", p.speedup),
                        None => format!(
                            "{:.2}x the default",
                            r.default_time.median / r.time.median.max(f64::MIN_POSITIVE)
                        ),
                    };
                    notes.push(format!(
                        "`{}`: tuning record applied ({} ms, {speedup}, {} on {}{})",
                        f.name,
                        crate::util::ms(r.time.median),
                        r.kiln,
                        r.cpu,
                        if r.huge_pages {
                            ", measured in huge pages: tensors in 4 KiB pages may rank its schedule otherwise"
                        } else {
                            ""
                        }
                    ));
                    out.push(g);
                }
                Err(e) => {
                    notes.push(format!(
                        "warning: `{}`: a stale tuning record was skipped ({e})",
                        f.name
                    ));
                    out.push(f.clone());
                }
            }
        }
        (IRModule::from_functions(out), notes)
    }
}
