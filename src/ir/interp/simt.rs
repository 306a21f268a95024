//! Device kernels: a launch runs the blocks one after the other and the threads of a block in
//! lock-step, with barriers and race detection on shared memory.

use std::collections::HashMap;

use super::value::{write_scalar, Scalar};
use super::{BufState, Interp, MAX_BLOCK_THREADS};
use crate::ir::error::IrResult;
use crate::ir::expr::VarId;
use crate::ir::func::{Buffer, StorageScope};
use crate::ir::stmt::{ForKind, Stmt, ThreadTag};

/// One block of a kernel launch, its threads run in lock-step.
pub(super) struct Block {
    /// `blockIdx` (x, y, z).
    coord: [i64; 3],
    /// Block size (x, y, z).
    dims: [i64; 3],
    threads: Vec<ThreadState>,
    /// The thread running the current statement.
    current: Option<usize>,
    /// Shared-memory accesses since the last barrier, by (buffer, byte offset).
    accesses: HashMap<(VarId, usize), Access>,
}

/// The per-thread state.
struct ThreadState {
    env: HashMap<VarId, Scalar>,
    locals: HashMap<VarId, BufState>,
}

/// The accesses to one shared element since the last barrier.
struct Access {
    writers: BitSet,
    readers: BitSet,
    /// The bytes written last.
    value: Vec<u8>,
}

struct BitSet(Vec<u64>);

impl BitSet {
    fn new(n: usize) -> BitSet {
        BitSet(vec![0; n.div_ceil(64)])
    }
    fn insert(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn contains(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }
    /// Some member other than `i`.
    fn other_than(&self, i: usize) -> Option<usize> {
        self.0.iter().enumerate().find_map(|(w, bits)| {
            let mut b = *bits;
            if w == i / 64 {
                b &= !(1 << (i % 64));
            }
            (b != 0).then(|| w * 64 + b.trailing_zeros() as usize)
        })
    }
}

impl Block {
    fn thread_coord(&self, t: usize) -> [i64; 3] {
        let t = t as i64;
        let [dx, dy, _] = self.dims;
        [t % dx, (t / dx) % dy, t / (dx * dy)]
    }

    fn thread_name(&self, t: usize) -> String {
        let [x, y, z] = self.thread_coord(t);
        format!("thread ({x}, {y}, {z})")
    }
}

/// Device kernels: launch, lock-step execution of a block, race detection.
impl Interp<'_> {
    /// Runs the kernel whose outermost loop is `kernel`: every block, one after the other.
    pub(super) fn launch(&mut self, kernel: &Stmt) -> IrResult<()> {
        let mut grid = [1i64; 3];
        let mut dims = [1i64; 3];
        for (tag, extent) in crate::ir::device::launch_extents(kernel) {
            let n = self.expr(extent)?.as_i64();
            match tag {
                ThreadTag::Block(_) => grid[tag.axis()] = n,
                ThreadTag::Thread(_) => dims[tag.axis()] = n,
            }
        }
        if grid.iter().chain(&dims).any(|n| *n <= 0) {
            return Ok(());
        }
        let threads = dims
            .iter()
            .try_fold(1i64, |acc, d| acc.checked_mul(*d))
            .filter(|n| *n <= MAX_BLOCK_THREADS)
            .ok_or_else(|| {
                self.error(format!(
                    "a block of {dims:?} threads exceeds the interpreter's limit of {MAX_BLOCK_THREADS}"
                ))
            })? as usize;
        let all: Vec<usize> = (0..threads).collect();
        for bz in 0..grid[2] {
            for by in 0..grid[1] {
                for bx in 0..grid[0] {
                    let block = Block {
                        coord: [bx, by, bz],
                        dims,
                        threads: (0..threads)
                            .map(|_| ThreadState {
                                env: self.env.clone(),
                                locals: HashMap::new(),
                            })
                            .collect(),
                        current: None,
                        accesses: HashMap::new(),
                    };
                    self.simt = Some(block);
                    let r = self.simt_stmt(kernel, &all);
                    self.simt = None;
                    r?;
                }
            }
        }
        Ok(())
    }

    fn block(&mut self) -> &mut Block {
        self.simt
            .as_mut()
            .expect("device statements run inside a block")
    }

    /// Runs `f` as thread `t` of the current block: its variables and `local` buffers in scope.
    fn on_thread<R>(&mut self, t: usize, f: impl FnOnce(&mut Self) -> IrResult<R>) -> IrResult<R> {
        let block = self
            .simt
            .as_mut()
            .expect("device statements run inside a block");
        std::mem::swap(&mut self.env, &mut block.threads[t].env);
        let locals = std::mem::take(&mut block.threads[t].locals);
        let keys: Vec<VarId> = locals.keys().copied().collect();
        self.bufs.extend(locals);
        block.current = Some(t);
        let r = f(self);
        let block = self
            .simt
            .as_mut()
            .expect("device statements run inside a block");
        block.current = None;
        std::mem::swap(&mut self.env, &mut block.threads[t].env);
        for k in keys {
            if let Some(b) = self.bufs.remove(&k) {
                block.threads[t].locals.insert(k, b);
            }
        }
        r
    }

    /// Sets (or with `None` removes) a variable in each of the `active` threads.
    fn set_var(&mut self, active: &[usize], var: VarId, values: Option<&[Scalar]>) {
        let block = self.block();
        for (i, t) in active.iter().enumerate() {
            let env = &mut block.threads[*t].env;
            match values {
                Some(v) => {
                    env.insert(var, v[i]);
                }
                None => {
                    env.remove(&var);
                }
            }
        }
    }

    /// Runs `s` in lock-step for the `active` threads of the current block.
    fn simt_stmt(&mut self, s: &Stmt, active: &[usize]) -> IrResult<()> {
        if active.is_empty() {
            return Ok(());
        }
        match s {
            Stmt::For {
                var,
                min,
                extent,
                kind,
                body,
            } => {
                if let ForKind::ThreadBinding(tag) = kind {
                    let block = self.block();
                    let values: Vec<Scalar> = active
                        .iter()
                        .map(|t| {
                            let c = match tag {
                                ThreadTag::Block(_) => block.coord[tag.axis()],
                                ThreadTag::Thread(_) => block.thread_coord(*t)[tag.axis()],
                            };
                            Scalar::from_int(var.dtype, c as i128)
                        })
                        .collect();
                    self.set_var(active, var.id, Some(&values));
                    let r = self.simt_stmt(body, active);
                    self.set_var(active, var.id, None);
                    return r;
                }
                let mut bounds = Vec::with_capacity(active.len());
                for &t in active {
                    let (lo, n) = self.on_thread(t, |me| {
                        Ok((me.expr(min)?.as_i128(), me.expr(extent)?.as_i128()))
                    })?;
                    bounds.push((t, lo, n));
                }
                let mut k = 0i128;
                let r = loop {
                    let now: Vec<usize> = bounds.iter().filter(|b| k < b.2).map(|b| b.0).collect();
                    if now.is_empty() {
                        break Ok(());
                    }
                    let values: Vec<Scalar> = bounds
                        .iter()
                        .filter(|b| k < b.2)
                        .map(|b| Scalar::from_int(var.dtype, b.1 + k))
                        .collect();
                    self.set_var(&now, var.id, Some(&values));
                    if let Err(e) = self.simt_stmt(body, &now) {
                        break Err(e);
                    }
                    k += 1;
                };
                self.set_var(active, var.id, None);
                r
            }
            Stmt::Store { .. } | Stmt::Evaluate(_) | Stmt::Assert { .. } => {
                for &t in active {
                    self.on_thread(t, |me| me.stmt(s).map(|_| ()))?;
                }
                Ok(())
            }
            Stmt::Allocate { buffer, body } => {
                if buffer.scope == StorageScope::Shared {
                    let state = self.on_thread(active[0], |me| me.new_buffer(buffer))?;
                    self.bufs.insert(buffer.data.id, state);
                    let r = self.simt_stmt(body, active);
                    self.bufs.remove(&buffer.data.id);
                    self.block()
                        .accesses
                        .retain(|(b, _), _| *b != buffer.data.id);
                    return r;
                }
                for &t in active {
                    let state = self.on_thread(t, |me| me.new_buffer(buffer))?;
                    self.block().threads[t].locals.insert(buffer.data.id, state);
                }
                let r = self.simt_stmt(body, active);
                for &t in active {
                    self.block().threads[t].locals.remove(&buffer.data.id);
                }
                r
            }
            Stmt::Let { var, value, body } => {
                let mut values = Vec::with_capacity(active.len());
                for &t in active {
                    values.push(self.on_thread(t, |me| me.expr(value))?);
                }
                self.set_var(active, var.id, Some(&values));
                let r = self.simt_stmt(body, active);
                self.set_var(active, var.id, None);
                r
            }
            Stmt::IfThenElse {
                cond,
                then_case,
                else_case,
            } => {
                let (mut yes, mut no) = (Vec::new(), Vec::new());
                for &t in active {
                    if self.on_thread(t, |me| Ok(me.expr(cond)?.as_bool()))? {
                        yes.push(t);
                    } else {
                        no.push(t);
                    }
                }
                self.simt_stmt(then_case, &yes)?;
                match else_case {
                    Some(e) => self.simt_stmt(e, &no),
                    None => Ok(()),
                }
            }
            Stmt::While { cond, body } => {
                // Each round, the threads whose condition still holds run the body together.
                let mut now = active.to_vec();
                loop {
                    let mut next = Vec::with_capacity(now.len());
                    for &t in &now {
                        if self.on_thread(t, |me| Ok(me.expr(cond)?.as_bool()))? {
                            next.push(t);
                        }
                    }
                    if next.is_empty() {
                        return Ok(());
                    }
                    self.simt_stmt(body, &next)?;
                    now = next;
                }
            }
            Stmt::Seq(v) => {
                for st in v {
                    self.simt_stmt(st, active)?;
                }
                Ok(())
            }
            Stmt::Return(_) => Err(self.error("`return` inside a device kernel".into())),
            Stmt::Prefetch { .. } => Ok(()),
            Stmt::Barrier => {
                let block = self.block();
                let n = block.threads.len();
                if active.len() != n {
                    let [x, y, z] = block.coord;
                    return Err(self.error(format!(
                        "barrier reached by {} of the {n} threads of block ({x}, {y}, {z}): the others would wait forever",
                        active.len()
                    )));
                }
                block.accesses.clear();
                Ok(())
            }
        }
    }

    /// Records an access to a shared buffer element at byte offset `off` by the current thread
    /// (a store of `value`, or a load) and reports a data race with another thread's access
    /// since the last barrier.
    pub(super) fn shared_access(
        &mut self,
        b: &Buffer,
        off: usize,
        value: Option<Scalar>,
    ) -> IrResult<()> {
        let Some(block) = self.simt.as_mut() else {
            return Ok(());
        };
        let Some(t) = block.current else {
            return Ok(());
        };
        let n = block.threads.len();
        let bytes = value.map(|v| {
            let mut out = vec![0u8; b.dtype.bytes()];
            write_scalar(v, &mut out);
            out
        });
        let a = block
            .accesses
            .entry((b.data.id, off))
            .or_insert_with(|| Access {
                writers: BitSet::new(n),
                readers: BitSet::new(n),
                value: Vec::new(),
            });
        let conflict = match &bytes {
            None => {
                let other = if a.writers.is_empty() || a.writers.contains(t) {
                    None
                } else {
                    a.writers.other_than(t)
                };
                a.readers.insert(t);
                other.map(|u| (u, "reads", "wrote"))
            }
            Some(v) => {
                let c = if let Some(u) = a.readers.other_than(t) {
                    Some((u, "writes", "read"))
                } else if a.value != *v {
                    a.writers.other_than(t).map(|u| (u, "writes", "wrote"))
                } else {
                    None
                };
                a.writers.insert(t);
                a.value.clone_from(v);
                c
            }
        };
        let Some((u, does, did)) = conflict else {
            return Ok(());
        };
        let (me, other) = (block.thread_name(t), block.thread_name(u));
        let [x, y, z] = block.coord;
        let element = match self.bufs.get(&b.data.id) {
            Some(st) => {
                let e = (off / st.dtype.bytes().max(1)) as i64;
                let idx: Vec<String> = st
                    .shape
                    .iter()
                    .zip(&st.strides)
                    .map(|(n, s)| ((e / (*s).max(1)) % (*n).max(1)).to_string())
                    .collect();
                format!("{}[{}]", b.name, idx.join(", "))
            }
            None => b.name.clone(),
        };
        Err(self.error(format!(
            "data race on shared buffer `{}` at {element} in block ({x}, {y}, {z}): {me} {does} it after {other} {did} it, with no barrier in between",
            b.name
        )))
    }
}
