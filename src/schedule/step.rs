//! Schedules as data: [`Step`], one primitive with its arguments (serde, for JSON), and
//! [`Schedule::apply`], which replays a list of them.

use serde::{Deserialize, Serialize};

use super::{AxisMap, Schedule, ScheduleResult};
use crate::ir::{ForKind, ThreadTag};

/// One schedule step, for schedules kept as JSON (`[{"split": {"loop": "i", "factor": 8}}, ...]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// [`Schedule::split`].
    Split {
        /// Loop name.
        #[serde(rename = "loop")]
        loop_: String,
        /// Inner extent.
        factor: i64,
    },
    /// [`Schedule::reorder`].
    Reorder {
        /// Loop names, outermost first.
        loops: Vec<String>,
    },
    /// [`Schedule::fuse`].
    Fuse {
        /// Outer loop.
        outer: String,
        /// Inner loop.
        inner: String,
    },
    /// [`Schedule::partition`].
    Partition {
        /// Loop name.
        #[serde(rename = "loop")]
        loop_: String,
        /// Iterations in the first part.
        at: i64,
    },
    /// [`Schedule::fission`].
    Fission {
        /// Loop name.
        #[serde(rename = "loop")]
        loop_: String,
    },
    /// [`Schedule::decompose_reduction`].
    DecomposeReduction {
        /// The outermost reduction loop.
        #[serde(rename = "loop")]
        loop_: String,
    },
    /// Sets a loop's kind (`parallel`, `vectorized`, `unrolled`, `serial`).
    Kind {
        /// Loop name.
        #[serde(rename = "loop")]
        loop_: String,
        /// The kind's JSON name.
        kind: String,
    },
    /// [`Schedule::transform_layout`].
    TransformLayout {
        /// The buffer packed.
        buffer: String,
        /// The new buffer's name.
        into: String,
        /// Its dimensions.
        dims: Vec<AxisMap>,
    },
    /// [`Schedule::cache_write`].
    CacheWrite {
        /// The buffer cached.
        buffer: String,
        /// The loop whose body the cache covers.
        at: String,
    },
    /// [`Schedule::cache_read`] (no `panel`), [`Schedule::cache_read_panels`] (a `panel`
    /// alone), [`Schedule::cache_read_panels_of`] (a `panel` and the dimension cut into them,
    /// as `innermost`) or [`Schedule::cache_read_transposed`] (`innermost` alone).
    CacheRead {
        /// The buffer staged.
        buffer: String,
        /// The loop whose body the cache covers.
        at: String,
        /// The panel width of [`Schedule::cache_read_panels`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        panel: Option<i64>,
        /// The dimension [`Schedule::cache_read_transposed`] makes the copy's innermost; with a
        /// `panel`, the dimension [`Schedule::cache_read_panels_of`] cuts into panels (the
        /// position within a panel is then the copy's innermost).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        innermost: Option<usize>,
    },
    /// [`Schedule::rfactor`].
    Rfactor {
        /// The outer reduction loop.
        outer: String,
        /// The inner reduction loop (becomes the factor axis).
        inner: String,
    },
    /// [`Schedule::bind`].
    Bind {
        /// Loop name.
        #[serde(rename = "loop")]
        loop_: String,
        /// `blockIdx.x` .. `threadIdx.z`.
        thread: String,
    },
    /// [`Schedule::cache_read_shared`].
    CacheReadShared {
        /// The buffer staged.
        buffer: String,
        /// The loop whose iterations read one tile.
        at: String,
    },
    /// [`Schedule::block_reduce`].
    BlockReduce {
        /// The outer (per-thread, serial) reduction loop.
        outer: String,
        /// The inner reduction loop (becomes `threadIdx.x`).
        inner: String,
    },
    /// [`Schedule::compute_inline`].
    ComputeInline {
        /// The buffer inlined.
        buffer: String,
    },
    /// [`Schedule::prefetch`].
    Prefetch {
        /// The loop whose loads get prefetches.
        at: String,
        /// The buffer prefetched.
        buffer: String,
        /// The loop advanced: `at` or a loop around it.
        #[serde(rename = "loop")]
        loop_: String,
        /// By how many iterations of `loop`.
        offset: i64,
    },
    /// [`Schedule::prefetch_next`].
    PrefetchNext {
        /// The cache whose copy's reads are prefetched.
        cache: String,
        /// The loop whose next iteration's copy is prefetched.
        #[serde(rename = "loop")]
        loop_: String,
        /// The loop the prefetches are spread over.
        at: String,
    },
}

impl Schedule {
    /// Replays `steps` (as read from JSON).
    ///
    /// # Errors
    /// The first failing step's error.
    pub fn apply(&mut self, steps: &[Step]) -> ScheduleResult<()> {
        for s in steps {
            match s {
                Step::Split { loop_, factor } => {
                    self.split(loop_, *factor)?;
                }
                Step::Reorder { loops } => {
                    let v: Vec<&str> = loops.iter().map(String::as_str).collect();
                    self.reorder(&v)?;
                }
                Step::Fuse { outer, inner } => {
                    self.fuse(outer, inner)?;
                }
                Step::Fission { loop_ } => {
                    self.fission(loop_)?;
                }
                Step::DecomposeReduction { loop_ } => {
                    self.decompose_reduction(loop_)?;
                }
                Step::Partition { loop_, at } => {
                    self.partition(loop_, *at)?;
                }
                Step::Kind { loop_, kind } => {
                    let k = ForKind::from_name(kind).ok_or_else(|| {
                        self.form(
                            "kind",
                            format!(
                                "expects serial, parallel, vectorized or unrolled, found `{kind}`"
                            ),
                        )
                    })?;
                    self.traced(|| s.clone(), |x| x.set_kind(loop_, k))?;
                }
                Step::TransformLayout { buffer, into, dims } => {
                    self.transform_layout(buffer, into, dims)?;
                }
                Step::CacheWrite { buffer, at } => {
                    self.cache_write(buffer, at)?;
                }
                Step::CacheRead {
                    buffer,
                    at,
                    panel,
                    innermost,
                } => match (panel, innermost) {
                    (Some(w), Some(d)) => {
                        self.cache_read_panels_of(buffer, at, *w, *d)?;
                    }
                    (Some(w), None) => {
                        self.cache_read_panels(buffer, at, *w)?;
                    }
                    (None, Some(d)) => {
                        self.cache_read_transposed(buffer, at, *d)?;
                    }
                    (None, None) => {
                        self.cache_read(buffer, at)?;
                    }
                },
                Step::Rfactor { outer, inner } => {
                    self.rfactor(outer, inner)?;
                }
                Step::Bind { loop_, thread } => {
                    let tag = ThreadTag::from_name(thread).ok_or_else(|| {
                        self.form(
                            "bind",
                            format!("expects blockIdx.x|y|z or threadIdx.x|y|z, found `{thread}`"),
                        )
                    })?;
                    self.bind(loop_, tag)?;
                }
                Step::CacheReadShared { buffer, at } => {
                    self.cache_read_shared(buffer, at)?;
                }
                Step::BlockReduce { outer, inner } => {
                    self.block_reduce(outer, inner)?;
                }
                Step::ComputeInline { buffer } => {
                    self.compute_inline(buffer)?;
                }
                Step::Prefetch {
                    at,
                    buffer,
                    loop_,
                    offset,
                } => {
                    self.prefetch(at, buffer, loop_, *offset)?;
                }
                Step::PrefetchNext { cache, loop_, at } => {
                    self.prefetch_next(cache, loop_, at)?;
                }
            }
        }
        Ok(())
    }
}

/// The primitives, recorded in the schedule's trace (their bodies are in the files of their
/// kind: `loops.rs`, `kinds.rs`, `layout.rs`, `cache.rs`, `reduce.rs`, `device.rs`, `inline.rs`,
/// `prefetch.rs`).
impl Schedule {
    /// Splits loop `name` into `name_o` (outer) and `name_i` (inner, extent `factor`), returning
    /// their names. When `factor` does not divide a constant extent (or the extent is symbolic),
    /// the body is guarded by `if name_o * factor + name_i < extent`. A factor above a constant
    /// extent is taken as the extent (`name_o` then has one iteration).
    ///
    /// # Errors
    /// No such loop, or `factor < 1`.
    pub fn split(&mut self, name: &str, factor: i64) -> ScheduleResult<(String, String)> {
        self.traced(
            || Step::Split {
                loop_: name.into(),
                factor,
            },
            |s| s.split_untraced(name, factor),
        )
    }

    /// Reorders the named loops, which must lie in one perfect nest (each loop's body directly
    /// the next loop) whose bounds do not depend on each other's variables. Loops of the nest
    /// that are not named keep their places.
    ///
    /// # Errors
    /// Unknown loops, or loops that are not one perfect nest.
    pub fn reorder(&mut self, order: &[&str]) -> ScheduleResult<()> {
        self.traced(
            || Step::Reorder {
                loops: order.iter().map(|x| x.to_string()).collect(),
            },
            |s| {
                // Reordering moves loop kinds with their loops: a parallel loop must not end up
                // inside a vectorized one (the nesting rule `parallel` and `vectorize` keep).
                let before = s.func.clone();
                let was_valid = before.verify().is_ok();
                s.reorder_untraced(order)?;
                if was_valid {
                    if let Err(e) = s.func.verify() {
                        s.func = before;
                        return Err(s.form(
                            "reorder",
                            format!("would give a function that does not verify: {e}"),
                        ));
                    }
                }
                Ok(())
            },
        )
    }

    /// Fuses `outer` and `inner` (the whole body of `outer`, constant-or-independent extents) into
    /// one loop `outer_inner` and returns its name.
    ///
    /// # Errors
    /// The loops are not directly nested, or `inner`'s bounds depend on `outer`.
    pub fn fuse(&mut self, outer: &str, inner: &str) -> ScheduleResult<String> {
        self.traced(
            || Step::Fuse {
                outer: outer.into(),
                inner: inner.into(),
            },
            |s| s.fuse_untraced(outer, inner),
        )
    }

    /// Replaces every read of `buffer`, a buffer the function allocates and computes in one
    /// perfect loop nest (each index its own loop over the whole dimension), by the expression
    /// that computed it, with the nest's loop variables bound to the read's indices; the nest
    /// and the allocation go away (TVM's `compute_inline`). A convolution reads its input
    /// instead of a padded copy of it.
    ///
    /// # Errors
    /// A parameter or unknown buffer; more than one store to it, or a store outside a perfect
    /// nest at the top of the body; a nest that does not write each element once; a value that
    /// reads a buffer the function writes, or binds a `let`; a read of it before its nest.
    pub fn compute_inline(&mut self, buffer: &str) -> ScheduleResult<()> {
        self.traced(
            || Step::ComputeInline {
                buffer: buffer.into(),
            },
            |s| s.compute_inline_untraced(buffer),
        )
    }

    /// Splits the range of loop `name` at `at` iterations: `for i in [min, min + extent) { b }`
    /// becomes `for i in [min, min + at) { b }; for i_p in [0, extent - at) { b' }`, where `b'`
    /// is `b` with `i` replaced by `i_p + min + at` and every loop inside renamed (`j` ->
    /// `j_p`, or the first free `j_p_1`, ...), so that each part can be scheduled on its own (the
    /// full tiles of a split in one part, the rest in the other, with no bounds guard in the
    /// first: TVM's loop partitioning, by hand). Returns the second part's loop names: the
    /// partitioned loop and each loop inside it, from its name in the first part to its name
    /// in the second.
    ///
    /// # Errors
    /// A loop without constant bounds, `at` not strictly inside the range, or a body that
    /// allocates or binds variables (partition before `cache_write` and the like).
    pub fn partition(
        &mut self,
        name: &str,
        at: i64,
    ) -> ScheduleResult<std::collections::HashMap<String, String>> {
        self.traced(
            || Step::Partition {
                loop_: name.into(),
                at,
            },
            |s| s.partition_untraced(name, at),
        )
    }

    /// Distributes loop `name` over the statements of its body (a sequence): `for i { a; b }`
    /// becomes `for i { a }; for i_1 { b }`. Returns the new loops' names in order.
    ///
    /// # Errors
    /// The body is not a sequence.
    pub fn fission(&mut self, name: &str) -> ScheduleResult<Vec<String>> {
        self.traced(
            || Step::Fission { loop_: name.into() },
            |s| s.fission_untraced(name),
        )
    }

    /// Moves a reduction's initialization out of its loops: `for k { if k == 0 { C = 0 }; C +=
    /// .. }` (the form TVM's lowering gives every reduction) becomes `C = 0; for k { C += .. }`,
    /// and likewise for a chain of reduction loops whose init is guarded by all of them (`if
    /// k1 == 0 && k2 == 0`). TVM's `decompose_reduction` at the outermost reduction loop.
    ///
    /// # Errors
    /// No such loop; a body of another form; a guard that does not test exactly the loops from
    /// `name` inward against their minimums; a loop that may run zero times; an init that uses a
    /// reduction loop.
    pub fn decompose_reduction(&mut self, name: &str) -> ScheduleResult<()> {
        self.traced(
            || Step::DecomposeReduction { loop_: name.into() },
            |s| s.decompose_reduction_untraced(name),
        )
    }

    /// Runs loop `name`'s iterations on the thread pool.
    ///
    /// # Errors
    /// No such loop.
    pub fn parallel(&mut self, name: &str) -> ScheduleResult<()> {
        self.traced(
            || Step::Kind {
                loop_: name.into(),
                kind: "parallel".into(),
            },
            |s| s.parallel_untraced(name),
        )
    }

    /// Runs loop `name`'s iterations as SIMD lanes (constant extent).
    ///
    /// # Errors
    /// No such loop, or a symbolic extent.
    pub fn vectorize(&mut self, name: &str) -> ScheduleResult<()> {
        self.traced(
            || Step::Kind {
                loop_: name.into(),
                kind: "vectorized".into(),
            },
            |s| s.vectorize_untraced(name),
        )
    }

    /// Unrolls loop `name` (constant extent).
    ///
    /// # Errors
    /// No such loop, or a symbolic extent.
    pub fn unroll(&mut self, name: &str) -> ScheduleResult<()> {
        self.traced(
            || Step::Kind {
                loop_: name.into(),
                kind: "unrolled".into(),
            },
            |s| s.unroll_untraced(name),
        )
    }

    /// Packs the read-only parameter buffer `buffer` into a new `workspace` buffer `into` whose
    /// dimension `d` is indexed by `dims[d]` applied to the old indices, filled at the start of
    /// the function by a loop nest named `into_l0, into_l1, ...` (one loop per old dimension,
    /// returned, to be scheduled like any other); every load of `buffer` then reads `into`.
    ///
    /// # Errors
    /// Unknown or written buffer, symbolic shape, or a map that is not one-to-one.
    pub fn transform_layout(
        &mut self,
        buffer: &str,
        into: &str,
        dims: &[AxisMap],
    ) -> ScheduleResult<Vec<String>> {
        self.traced(
            || Step::TransformLayout {
                buffer: buffer.into(),
                into: into.into(),
                dims: dims.to_vec(),
            },
            |s| s.transform_layout_untraced(buffer, into, dims),
        )
    }

    /// Caches `buffer` over one iteration of loop `at`: the region the body of `at` reads and
    /// writes (indices affine in the loops inside `at`, with constant bounds) gets a `local`
    /// buffer `<buffer>_local`, loaded before the body and written back after it, guarded where
    /// the region may pass the buffer's end. The load is left out where the first statement of
    /// the body that touches the region (past any that leave it alone: a softmax row's max)
    /// overwrites all of it before reading it; the output is then written once, by the
    /// write-back, which may take streaming stores. Returns the cache's name.
    ///
    /// # Errors
    /// Non-affine indices, accesses with different offsets outside `at`, or symbolic inner
    /// bounds.
    pub fn cache_write(&mut self, buffer: &str, at: &str) -> ScheduleResult<String> {
        self.traced(
            || Step::CacheWrite {
                buffer: buffer.into(),
                at: at.into(),
            },
            |s| s.cache_write_untraced(buffer, at),
        )
    }

    /// Stages `buffer` over one iteration of loop `at` (TVM's `cache_read` with `compute_at`):
    /// the region the body of `at` reads (indices affine in the loops inside `at`, with
    /// constant bounds) is copied into a `local` buffer `<buffer>_local` at the start of each
    /// iteration, and the body reads the copy. The copy is guarded where the region may pass the
    /// buffer's end. A region of at most 16 KiB lives on the stack, a larger one in the
    /// workspace. Returns the cache's name.
    ///
    /// This is packing where the data is used: `B[k, j]` read by a parallel task over a
    /// `kc x nr` slice becomes a contiguous `kc x nr` panel, filled by the task that reads it.
    ///
    /// # Errors
    /// A store to `buffer` inside `at`, non-affine indices, accesses with different offsets
    /// outside `at`, or symbolic inner bounds.
    pub fn cache_read(&mut self, buffer: &str, at: &str) -> ScheduleResult<String> {
        self.traced(
            || Step::CacheRead {
                buffer: buffer.into(),
                at: at.into(),
                panel: None,
                innermost: None,
            },
            |s| s.cache_read_untraced(buffer, at, None),
        )
    }

    /// [`Schedule::cache_read`] with the region's dimension `innermost` made the copy's last:
    /// the region `[.., E_d, .., E_last]` is cached as `[.., E_last, E_d]` (a transposed
    /// copy). A register tile that vectorizes along a dimension the buffer does not store
    /// contiguously (`B[j, k]`, read along `j` by a batched matmul whose `B` is transposed)
    /// then loads contiguous vectors from the copy instead of gathering across rows.
    ///
    /// # Errors
    /// As [`Schedule::cache_read`]; `innermost` not a dimension of `buffer`.
    pub fn cache_read_transposed(
        &mut self,
        buffer: &str,
        at: &str,
        innermost: usize,
    ) -> ScheduleResult<String> {
        self.traced(
            || Step::CacheRead {
                buffer: buffer.into(),
                at: at.into(),
                panel: None,
                innermost: Some(innermost),
            },
            |s| s.cache_read_transposed_untraced(buffer, at, innermost),
        )
    }

    /// [`Schedule::cache_read`] into panels: the region's last dimension (extent `E`) is cut
    /// into `E / width` panels of `width`, and the cache is `[E / width, ..., width]`, each
    /// panel contiguous. The copy reads each row of the region in one sweep and writes it into
    /// the panels. A matmul task that covers several column panels of `B` packs all of them
    /// at once: a row of `B` is then read several panels at a time instead of one (with `B`'s
    /// rows pages apart, one TLB miss for each 64 bytes of a 16-float panel), and each register
    /// tile still reads one contiguous panel.
    ///
    /// # Errors
    /// As [`Schedule::cache_read`]; a `width` that does not divide `E`, or an access whose
    /// last index is not `panel * width + column` with the column from the loops that move
    /// within `width`.
    pub fn cache_read_panels(
        &mut self,
        buffer: &str,
        at: &str,
        width: i64,
    ) -> ScheduleResult<String> {
        self.traced(
            || Step::CacheRead {
                buffer: buffer.into(),
                at: at.into(),
                panel: Some(width),
                innermost: None,
            },
            |s| s.cache_read_untraced(buffer, at, Some(width)),
        )
    }

    /// [`Schedule::cache_read_panels`] with the panels cut along the buffer's dimension `dim`
    /// instead of its last: the region `[E_0, .., E_dim, .., E_last]` is cached as `[E_dim /
    /// width, E_0, .., E_last, width]`, each panel contiguous with the position within it
    /// innermost. `A[i, k]` read by a matmul's register tiles of `width` rows becomes row
    /// panels `[rows / width, k, width]` (as BLAS packs `A`): each step of `k` then reads the
    /// tile's `width` values of `A` side by side, not `width` rows apart. The copy fills one
    /// panel at a time, reading its rows side by side along the region and interleaving them.
    ///
    /// # Errors
    /// As [`Schedule::cache_read_panels`], for the dimension `dim`; `dim` not a dimension of
    /// `buffer`.
    pub fn cache_read_panels_of(
        &mut self,
        buffer: &str,
        at: &str,
        width: i64,
        dim: usize,
    ) -> ScheduleResult<String> {
        self.traced(
            || Step::CacheRead {
                buffer: buffer.into(),
                at: at.into(),
                panel: Some(width),
                innermost: Some(dim),
            },
            |s| s.cache_read_panels_of_untraced(buffer, at, width, dim),
        )
    }

    /// Factors a reduction: `outer` must be `for outer { for inner { X[ix] = X[ix] op f } }` with
    /// `op` a sum, max or min and `ix` independent of both loops. It becomes
    /// `rf[inner] = identity; for outer { for inner { rf[inner] = rf[inner] op f } };
    /// for inner { X[ix] = X[ix] op rf[inner] }`, so the inner loop can be vectorized with
    /// `rf` in registers. When the inner extent is a power of two (>= 4), the final reduction is
    /// a tree of vectorized halvings (`<inner>_t0, <inner>_t1, ...`) instead of the serial loop
    /// `<inner>_r`. Returns the name of the factor-init loop (`<inner>_z`).
    ///
    /// # Errors
    /// The loops do not have this form.
    pub fn rfactor(&mut self, outer: &str, inner: &str) -> ScheduleResult<String> {
        self.traced(
            || Step::Rfactor {
                outer: outer.into(),
                inner: inner.into(),
            },
            |s| s.rfactor_untraced(outer, inner),
        )
    }

    /// Binds loop `name` to the thread index `tag` (a [`ForKind::ThreadBinding`] loop). A loop
    /// that does not start at 0 is rebased: `for i in [m, m + e)` becomes `for i in [0, e)` with
    /// `i` replaced by `i + m` in the body. The usual pattern is a split and two binds:
    /// `let (bo, ti) = s.split("i", 64)?; s.bind(&bo, ThreadTag::Block(0))?;
    /// s.bind(&ti, ThreadTag::Thread(0))?;` — the guard that `split` inserts for a remainder keeps
    /// the threads past the end idle. Where the loop may be bound (`threadIdx` inside `blockIdx`,
    /// one extent per tag per kernel, ...) is checked by the verifier in [`finish`](Self::finish).
    ///
    /// ```
    /// use kiln::ir::{device, kernels, ThreadTag};
    /// use kiln::schedule::Schedule;
    /// let mut s = Schedule::new(kernels::vadd());
    /// let (bo, ti) = s.split("i", 256)?;
    /// s.bind(&bo, ThreadTag::Block(0))?;
    /// s.bind(&ti, ThreadTag::Thread(0))?;
    /// let f = s.finish()?;
    /// device::check_device_limits(&f, 256, 16384)?;
    /// assert!(f.to_string().contains("if i_o * 256i64 + i_i < n"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// No such loop, or a `parallel` or `vectorized` loop (its iterations are not meant for
    /// threads of a device).
    pub fn bind(&mut self, name: &str, tag: ThreadTag) -> ScheduleResult<()> {
        self.traced(
            || Step::Bind {
                loop_: name.into(),
                thread: tag.name().into(),
            },
            |s| s.bind_untraced(name, tag),
        )
    }

    /// Stages the tile of the read-only buffer `buffer` that one iteration of loop `at` reads in a
    /// `shared` buffer `<buffer>_shared` (TVM's `cache_read(.., "shared")` at `at`, with the load
    /// loop bound to the block's threads). `at` must be inside the `threadIdx` loops of a kernel
    /// (constant extents). The tile is the bounding box of the indices read in `at`'s body over
    /// the loops inside `at` and the enclosing `threadIdx` loops (indices affine, constant
    /// bounds); the other variables (`blockIdx`, `at`, outer loops) give its origin, which must
    /// be the same for every read. The body of `at` becomes
    ///
    /// ```text
    /// for <buffer>_l in [0, ceil(tile / threads)) {   // cooperative load, one element per thread
    ///   e = <buffer>_l * threads + thread_id           // guarded when threads do not divide the tile
    ///   <buffer>_shared[unflatten(e)] = buffer[origin + unflatten(e)]  // guarded at the buffer's end
    /// }
    /// barrier; <body reading <buffer>_shared>; barrier
    /// ```
    ///
    /// A second buffer staged at the same loop shares the two barriers. The shared buffer is
    /// allocated around the kernel's outermost `threadIdx` loop. Returns its name. `at` must not
    /// be under an `if` or in a loop whose bounds depend on the thread (the verifier rejects the
    /// barriers then).
    ///
    /// # Errors
    /// `at` not inside `threadIdx` loops, `buffer` not a parameter or written in `at`,
    /// non-affine indices, different origins, or symbolic inner bounds.
    pub fn cache_read_shared(&mut self, buffer: &str, at: &str) -> ScheduleResult<String> {
        self.traced(
            || Step::CacheReadShared {
                buffer: buffer.into(),
                at: at.into(),
            },
            |s| s.cache_read_shared_untraced(buffer, at),
        )
    }

    /// A block-wide reduction (TVM's cross-thread allreduce). `outer` must be
    /// `for outer { for inner { X[ix] = X[ix] op f } }` with `op` a sum, max or min, `ix`
    /// independent of both loops, `inner` of constant power-of-two extent `T` starting at 0,
    /// inside a kernel's `blockIdx` loops and outside its `threadIdx` loops. It becomes
    ///
    /// ```text
    /// allocate red[T] shared
    /// for inner in thread_binding[threadIdx.x](0, T) {
    ///   part = identity; for outer { part = part op f }     // part: local, per thread
    ///   red[inner] = part; barrier
    ///   for h = T/2, T/4, .., 1 { if inner < h { red[inner] op= red[inner + h] }; barrier }
    ///   X[ix] = X[ix] op red[0]          // under `if inner == 0` unless X is `local`
    /// }
    /// ```
    ///
    /// A `local` `X` allocated inside the kernel (one per thread) is updated by every thread,
    /// so all of them see the result (softmax's row max); any other `X` (including a `local` the
    /// host allocates: one copy for the whole block) by thread 0 only. When the statement just
    /// before `outer` is `X[ix] = v` (the reduction's init), it is folded in: `X[ix] = v op
    /// red[0]`. Returns the shared buffer's name (`red`, `red1`, ...).
    ///
    /// # Errors
    /// The loops do not have this form.
    pub fn block_reduce(&mut self, outer: &str, inner: &str) -> ScheduleResult<String> {
        self.traced(
            || Step::BlockReduce {
                outer: outer.into(),
                inner: inner.into(),
            },
            |s| s.block_reduce_untraced(outer, inner),
        )
    }

    /// Prefetches for loop `at`: before each store in `at`'s body that loads `buffer`, a
    /// [`Stmt::Prefetch`](crate::ir::Stmt::Prefetch) of each such load with the variable of loop
    /// `loop_` (`at` itself or a loop around it) advanced by `offset` iterations: the element
    /// the same load reads `offset` iterations later. A prefetch never changes a result and
    /// may name an element past the buffer's end (the last iterations'). Returns the number of
    /// prefetches inserted.
    ///
    /// Unlike TVM's `prefetch`, which issues an iteration's prefetches in a burst at the top of
    /// `loop_`, these sit beside the loads of `at` and are spread over its iterations: one per
    /// cache line of a vectorized loop's lanes. Apply it after the primitives that move those
    /// loads (`cache_read`, `transform_layout`), since it copies them as they are.
    ///
    /// ```
    /// use kiln::schedule::{kernels, Schedule};
    /// use kiln::ir::Intrinsic;
    ///
    /// // softmax: while the `exp` pass of row `i` computes, fetch row `i + 1` for the max pass.
    /// let mut s = Schedule::new(kernels::softmax_algorithm(8, 256, Intrinsic::FastExp));
    /// let (je_o, je_i) = s.split("je", 16)?;
    /// s.vectorize(&je_i)?;
    /// assert_eq!(s.prefetch(&je_o, "A", "i", 1)?, 1);
    /// assert!(s.finish()?.to_string().contains("prefetch A[i + 1i64, "));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// No loop `at`, `loop_` not `at` nor around it, `offset` 0, an unknown buffer, or no store
    /// in `at` that loads `buffer`.
    pub fn prefetch(
        &mut self,
        at: &str,
        buffer: &str,
        loop_: &str,
        offset: i64,
    ) -> ScheduleResult<usize> {
        self.traced(
            || Step::Prefetch {
                at: at.into(),
                buffer: buffer.into(),
                loop_: loop_.into(),
                offset,
            },
            |s| s.prefetch_untraced(at, buffer, loop_, offset),
        )
    }

    /// Prefetches what the copy into `cache` (a `cache_read`'s fill: a nest of loops from 0 of
    /// constant extents whose one store writes `cache` with a load of another buffer) will read
    /// in the next iteration of loop `loop_`, spread over this iteration's work: one prefetch
    /// per cache line of the copy's source (per element where its innermost loop does not read
    /// contiguous elements), each in its own slot, a slot being an iteration of the loops
    /// inside `loop_` down to loop `at`, with `at` split (as [`Schedule::split`] names its
    /// parts) into slots of as many of its iterations as still leave a slot for every line.
    /// Returns the number of lines.
    ///
    /// This is the prefetch for a matmul that packs its slice of `B` a `k` pass at a time (`B`
    /// too large for the caches, its rows pages apart): the copy of a pass waits on memory with
    /// nothing to compute, unless the pass before fetched its rows while computing (64 x 4096
    /// x 4096 on a Zen 3, both cores, `B` in 2 MiB pages: 14.72 ms -> 13.95 ms; in 4 KiB pages
    /// the prefetches cost more than they save). [`Schedule::prefetch`] puts its prefetches
    /// beside the loads it copies, which here are in the copy itself: too late.
    ///
    /// # Errors
    /// Not exactly one such copy into `cache`; `loop_` not around both the copy and `at`; a
    /// copy that reads a loop's variable between `loop_` and the copy (which `at` cannot see);
    /// loops from inside `loop_` to `at` that do not run from 0 to a constant.
    pub fn prefetch_next(&mut self, cache: &str, loop_: &str, at: &str) -> ScheduleResult<usize> {
        self.traced(
            || Step::PrefetchNext {
                cache: cache.into(),
                loop_: loop_.into(),
                at: at.into(),
            },
            |s| s.prefetch_next_untraced(cache, loop_, at),
        )
    }
}
