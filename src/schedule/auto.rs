//! Loop kinds for functions nobody scheduled: [`auto_parallel`] runs the outermost loop whose
//! iterations are provably independent on the thread pool.
//!
//! TVM's Relax pipeline lowers every operator to plain serial loops, and TVM's default CPU build
//! runs them on one thread. kiln keeps the function as it is but for one loop kind: it takes
//! the outermost loops in turn (through sequences, `let`s, allocations, branches and loops of
//! one iteration) and makes the first one parallel that is
//!
//! - **independent**: every buffer the body writes (other than allocations inside the body,
//!   which are private to an iteration) is indexed by the loop variable itself, alone, in the
//!   same dimension at every store and every load of that buffer in the body; so two
//!   iterations never touch the same element of a buffer one of them writes. The function must
//!   be `noalias` (TVM's `tir.noalias`, which Relax's PrimFuncs carry), so that a buffer only
//!   read is not another name for one written;
//! - **plain**: no `call_extern` (unknown effects), no `assert`, `return` or `evaluate`, no
//!   workspace allocation, no loop that is already parallel or bound to a thread (a function
//!   with one is scheduled already and left alone);
//! - **worth it**: at least `min_work` iterations of the loop nest in all (constant extents
//!   multiplied; a symbolic extent counts as 1024), so that a small operator does not pay for
//!   waking the pool.
//!
//! A loop that is not independent is descended into, so the first independent loop inside it
//! (within each of its iterations) can be parallel instead. The result computes the same
//! values: each element is written by the same iteration as before, only on another thread.

use std::collections::{HashMap, HashSet};

use super::{Schedule, ScheduleResult};
use crate::ir::visit::{walk_expr, walk_stmt, Visitor};
use crate::ir::{Buffer, Expr, ForKind, PrimFunc, Stmt, StorageScope, ThreadTag, Var, VarId};

/// What [`auto_parallel`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoParallel {
    /// The function, with the chosen loops made parallel.
    pub func: PrimFunc,
    /// The names of the loops made parallel, outermost first; empty when none qualified.
    pub loops: Vec<String>,
}

impl AutoParallel {
    /// The schedule steps that make the same loops parallel in the original function (a
    /// candidate of `kiln tune`, whose winner must beat this build too).
    pub fn steps(&self) -> Vec<super::Step> {
        self.loops
            .iter()
            .map(|l| super::Step::Kind {
                loop_: l.clone(),
                kind: "parallel".into(),
            })
            .collect()
    }
}

/// The default `min_work`: about 32 thousand innermost iterations, below which waking the
/// thread pool costs more than the loop.
pub const DEFAULT_MIN_WORK: u64 = 1 << 15;

/// Makes the outermost independent loops of `func` parallel (see the module documentation).
///
/// ```
/// use kiln::ir::{kernels, ForKind, Stmt};
/// use kiln::schedule::auto::auto_parallel;
/// let mut f = kernels::vadd();
/// // vadd as nobody scheduled it: one serial loop over `n`.
/// if let Stmt::For { kind, .. } = &mut f.body { *kind = ForKind::Serial; }
/// let out = auto_parallel(&f, 1);
/// assert_eq!(out.loops, ["i"]);
/// ```
pub fn auto_parallel(func: &PrimFunc, min_work: u64) -> AutoParallel {
    let mut loops = Vec::new();
    if !func.attrs.noalias || scheduled(&func.body) {
        return AutoParallel {
            func: func.clone(),
            loops,
        };
    }
    let body = rewrite(&func.body, min_work, &mut loops);
    let mut out = func.clone();
    out.body = body;
    AutoParallel { func: out, loops }
}

/// Whether a loop is already parallel or bound to a thread.
fn scheduled(s: &Stmt) -> bool {
    has_loop_of(s, |k| {
        matches!(k, ForKind::Parallel | ForKind::ThreadBinding(_))
    })
}

/// Whether `s` holds a loop whose kind `pred` accepts.
fn has_loop_of(s: &Stmt, pred: impl Fn(ForKind) -> bool) -> bool {
    struct Find<P>(P, bool);
    impl<P: Fn(ForKind) -> bool> Visitor for Find<P> {
        fn stmt(&mut self, s: &Stmt) {
            if let Stmt::For { kind, .. } = s {
                if (self.0)(*kind) {
                    self.1 = true;
                    return;
                }
            }
            walk_stmt(self, s);
        }
    }
    let mut f = Find(pred, false);
    f.stmt(s);
    f.1
}

fn rewrite(s: &Stmt, min_work: u64, loops: &mut Vec<String>) -> Stmt {
    match s {
        Stmt::For {
            var,
            extent,
            kind: ForKind::Serial,
            body,
            ..
        } if extent.as_int() != Some(1) && work(s) >= min_work && independent(var, body) => {
            loops.push(var.name.to_string());
            let mut out = s.clone();
            if let Stmt::For { kind, .. } = &mut out {
                *kind = ForKind::Parallel;
            }
            out
        }
        // Serial loops (the one above when it does not qualify), sequences, `let`s,
        // allocations and branches are looked into; other loops and statements are kept.
        Stmt::For { kind, .. } if *kind != ForKind::Serial => s.clone(),
        _ => s.map_children(|c| rewrite(c, min_work, loops)),
    }
}

/// The iterations of the loop nest `s`: constant extents multiplied along the deepest path
/// (a symbolic extent counts as 1024), saturating.
fn work(s: &Stmt) -> u64 {
    match s {
        Stmt::For { extent, body, .. } => {
            let n = extent.as_int().map_or(1024, |e| e.max(0) as u64);
            n.saturating_mul(work(body).max(1))
        }
        Stmt::Seq(v) => v.iter().map(work).fold(0u64, u64::saturating_add),
        Stmt::Let { body, .. } | Stmt::Allocate { body, .. } => work(body),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => work(then_case).max(else_case.as_ref().map_or(0, |e| work(e))),
        _ => 1,
    }
}

/// One access of a buffer the body writes: which dimensions hold exactly the loop variable.
struct Access {
    var_dims: Vec<usize>,
}

struct Accesses {
    /// Buffers allocated inside the body (private to an iteration).
    private: HashSet<VarId>,
    stores: HashMap<VarId, Vec<Access>>,
    loads: HashMap<VarId, Vec<Access>>,
    /// Something that rules the loop out.
    blocked: bool,
    /// The loop variable.
    var: VarId,
}

impl Accesses {
    fn access(&self, indices: &[Expr]) -> Access {
        let var = self.var;
        Access {
            var_dims: indices
                .iter()
                .enumerate()
                .filter(|(_, e)| matches!(e, Expr::Var(v) if v.id == var))
                .map(|(d, _)| d)
                .collect(),
        }
    }
}

impl Visitor for Accesses {
    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Store {
                buffer, indices, ..
            } => {
                let a = self.access(indices);
                self.stores.entry(key(buffer)).or_default().push(a);
            }
            Stmt::Allocate { buffer, .. } => {
                if buffer.scope != StorageScope::Local {
                    self.blocked = true;
                }
                self.private.insert(key(buffer));
            }
            // (A parallel or thread-bound loop cannot be inside: `auto_parallel` leaves a
            // function with one alone.)
            Stmt::Assert { .. } | Stmt::Return(_) | Stmt::Evaluate(_) | Stmt::Barrier => {
                self.blocked = true;
            }
            _ => {}
        }
        walk_stmt(self, s);
    }

    fn expr(&mut self, e: &Expr) {
        match e {
            Expr::Load { buffer, indices } => {
                let a = self.access(indices);
                self.loads.entry(key(buffer)).or_default().push(a);
            }
            Expr::CallExtern { .. } => self.blocked = true,
            _ => {}
        }
        walk_expr(self, e);
    }
}

fn key(b: &Buffer) -> VarId {
    b.data.id
}

/// Whether the iterations of `for var { body }` touch disjoint elements of every buffer the
/// body writes (see the module documentation).
fn independent(var: &Var, body: &Stmt) -> bool {
    let mut a = Accesses {
        private: HashSet::new(),
        stores: HashMap::new(),
        loads: HashMap::new(),
        blocked: false,
        var: var.id,
    };
    a.stmt(body);
    if a.blocked {
        return false;
    }
    a.stores.iter().all(|(buf, stores)| {
        if a.private.contains(buf) {
            return true;
        }
        let loads = a.loads.get(buf).map_or(&[][..], Vec::as_slice);
        // A dimension indexed by the loop variable alone at every access of the buffer.
        let first = &stores[0].var_dims;
        first.iter().any(|d| {
            stores
                .iter()
                .chain(loads.iter())
                .all(|acc| acc.var_dims.contains(d))
        })
    })
}

/// What [`bind_default`] does with one loop nest that runs on the host: the loops it fuses
/// into a kernel's threads, or the one loop it runs on a single thread.
#[derive(Debug, Clone, PartialEq)]
enum HostNest {
    /// A perfect chain of independent loops, outermost first: fused, split into blocks of
    /// threads.
    Threads(Vec<String>),
    /// A loop with no independent loop inside and a constant extent: the whole nest in one
    /// thread of one block.
    Single(String, i64),
}

/// Whether `s` holds a thread-bound loop.
fn has_binding(s: &Stmt) -> bool {
    has_loop_of(s, |k| matches!(k, ForKind::ThreadBinding(_)))
}

/// Whether `s` loads or stores a buffer allocated outside it: a parameter or a workspace (in
/// device memory), or a `local` allocation of the host (which the device build moves to device
/// memory when a kernel uses it). These are the nests a device target cannot leave on the host;
/// one that touches only its own allocations can stay there.
fn touches_device_memory(s: &Stmt) -> bool {
    let uses = s.free_uses();
    uses.buffers.iter().any(|b| {
        matches!(
            b.scope,
            StorageScope::Global | StorageScope::Workspace | StorageScope::Local
        )
    })
}

/// The first loop nest in `s` (in walk order) that runs on the host and touches device memory.
fn host_nest(s: &Stmt) -> Option<HostNest> {
    match s {
        Stmt::For {
            var,
            extent,
            kind,
            body,
            ..
        } => {
            if matches!(kind, ForKind::ThreadBinding(_)) || !touches_device_memory(s) {
                return None;
            }
            if has_binding(body) {
                // A host loop around kernels: its body is looked into.
                return host_nest(body);
            }
            let chain = independent_chain(s);
            if !chain.is_empty() {
                return Some(HostNest::Threads(chain));
            }
            host_nest(body).or_else(|| {
                extent
                    .as_int()
                    .filter(|&n| n >= 1)
                    .map(|n| HostNest::Single(var.name.to_string(), n))
            })
        }
        Stmt::Allocate { body, .. } | Stmt::Let { body, .. } => host_nest(body),
        Stmt::IfThenElse {
            then_case,
            else_case,
            ..
        } => host_nest(then_case).or_else(|| else_case.as_deref().and_then(host_nest)),
        Stmt::Seq(v) => v.iter().find_map(host_nest),
        _ => None,
    }
}

/// The loops of the perfect chain that starts at `s` (each loop the whole body of the one
/// before) whose iterations are independent (see the module documentation), outermost first,
/// up to the first that is not, or whose bounds use an outer loop's variable; empty when `s`
/// is not such a loop. Fused, they can run as the threads of a device kernel.
pub fn independent_chain(s: &Stmt) -> Vec<String> {
    let mut chain = Vec::new();
    let mut outer: Vec<&Var> = Vec::new();
    let mut cur = s;
    while let Stmt::For {
        var,
        min,
        extent,
        body,
        ..
    } = cur
    {
        let depends = outer.iter().any(|o| min.mentions(o) || extent.mentions(o));
        if depends || !independent(var, body) {
            break;
        }
        chain.push(var.name.to_string());
        outer.push(var);
        cur = body;
    }
    chain
}

/// Makes every loop nest of the function that touches device memory and is not in a kernel
/// yet a kernel of its own (TVM's `DefaultGPUSchedule`), for a device target with at most
/// `max_threads` threads per block, and returns the names of the loops made kernels.
///
/// In each nest, the outermost chain of perfectly nested loops whose iterations are
/// independent (as [`auto_parallel`] decides it: each written element belongs to one
/// iteration) is fused into one loop, split by `min(max_threads, 256)` (or its extent, when
/// smaller), and bound to `blockIdx.x` and `threadIdx.x`; the loops inside run in each thread.
/// A loop that is not independent (a host loop around a kernel) is looked into, and one with no
/// independent loop inside at all runs whole on one thread of one block (constant extents
/// only; else it is left alone and the build says the host cannot touch device memory). The
/// primitives are recorded in the schedule's trace, so the result replays as [`Step`]s.
///
/// Like TVM's device kernels, the kernels assume their buffer parameters do not overlap.
///
/// [`Step`]: crate::schedule::Step
///
/// # Errors
/// A primitive that refuses (a chain whose loops cannot fuse); `max_threads` below 1.
pub fn bind_default(s: &mut Schedule, max_threads: i64) -> ScheduleResult<Vec<String>> {
    if max_threads < 1 {
        return Err(s.form(
            "bind_default",
            format!("needs at least one thread per block, found {max_threads}"),
        ));
    }
    let threads = max_threads.min(256);
    let mut out = Vec::new();
    // Each round binds one nest; a function has finitely many, and a bound nest is no longer
    // a host nest.
    for _ in 0..4096 {
        let Some(nest) = host_nest(&s.func().body) else {
            return Ok(out);
        };
        match nest {
            HostNest::Threads(chain) => {
                make_serial(s, &chain)?;
                let mut fused = chain[0].clone();
                for inner in &chain[1..] {
                    fused = s.fuse(&fused, inner)?;
                }
                let extent = find_loop(&s.func().body, &fused).and_then(|l| l.2.as_int());
                let t = extent.map_or(threads, |e| e.clamp(1, threads));
                let (bo, ti) = s.split(&fused, t)?;
                s.bind(&bo, ThreadTag::Block(0))?;
                s.bind(&ti, ThreadTag::Thread(0))?;
                out.push(fused);
            }
            HostNest::Single(name, n) => {
                make_serial(s, std::slice::from_ref(&name))?;
                let (bo, _) = s.split(&name, n)?;
                s.bind(&bo, ThreadTag::Block(0))?;
                out.push(name);
            }
        }
    }
    Err(s.form("bind_default", "more than 4096 loop nests"))
}

/// Makes the named loops serial where a CPU schedule made them `parallel`, `vectorized` or
/// `unrolled` (TVM's `cumsum` comes with its outer loop parallel): their iterations are
/// becoming a device's threads, which only serial loops can be bound to. Recorded in the trace.
///
/// # Errors
/// No such loop.
pub fn make_serial(s: &mut Schedule, names: &[String]) -> ScheduleResult<()> {
    for name in names {
        if find_loop(&s.func().body, name).is_some_and(|l| l.3 != ForKind::Serial) {
            s.traced(
                || crate::schedule::Step::Kind {
                    loop_: name.clone(),
                    kind: ForKind::Serial.name().into(),
                },
                |x| x.set_kind(name, ForKind::Serial),
            )?;
        }
    }
    Ok(())
}

/// Loop `name` of `s`: variable, min, extent, kind.
fn find_loop(s: &Stmt, name: &str) -> Option<super::device::Loop> {
    super::device::loop_path(s, name, &mut Vec::new())
}

/// `func` with every loop nest that touches device memory outside a kernel made a kernel
/// ([`bind_default`]), for a device target of `max_threads` threads per block; the function
/// as it is when it has none.
///
/// ```
/// use kiln::ir::{kernels, ForKind, Stmt};
/// use kiln::schedule::auto::device_default;
/// let mut f = kernels::vadd();
/// if let Stmt::For { kind, .. } = &mut f.body { *kind = ForKind::Serial; }
/// let g = device_default(&f, 256)?;
/// assert!(g.to_string().contains("blockIdx.x"));
/// # Ok::<(), kiln::schedule::ScheduleError>(())
/// ```
///
/// # Errors
/// As [`bind_default`], and a result that does not verify.
pub fn device_default(func: &PrimFunc, max_threads: i64) -> ScheduleResult<PrimFunc> {
    let mut s = Schedule::new(func.clone());
    bind_default(&mut s, max_threads)?;
    s.finish()
}
