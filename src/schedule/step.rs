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
                    self.set_kind(loop_, k)?;
                }
                Step::TransformLayout { buffer, into, dims } => {
                    self.transform_layout(buffer, into, dims)?;
                }
                Step::CacheWrite { buffer, at } => {
                    self.cache_write(buffer, at)?;
                }
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
            }
        }
        Ok(())
    }
}
