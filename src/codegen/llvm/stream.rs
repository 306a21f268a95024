//! Streaming (non-temporal) stores on x86: which outputs get them, and from what size.
//!
//! A kernel that writes an output larger than the caches (vector add of 16M floats) pays for
//! every cache line it writes twice with ordinary stores: the line is read from memory first
//! (a read for ownership), then written back. Non-temporal stores (`movntps`) write whole
//! lines to memory through the write-combining buffers without reading them, and do not evict
//! the inputs from the cache: on an Intel Xeon (Sapphire-Rapids-class, 2 vCPUs) vector add of
//! 16M floats runs 1.4x faster with them. Below the cache size they are slower (the output
//! would have stayed in the cache for whoever reads it next), so they are used only for big
//! outputs.
//!
//! The rule (`stream_outputs` here, and the emitter's `counted_loop`):
//!
//! - the function is `noalias` (its buffers do not overlap: the emitter vectorizes the loop
//!   itself, see below);
//! - the output is a `float32`/`float64` buffer parameter, compact (no strides), written by
//!   exactly one store and never read in the function;
//! - that store is the only store of a serial loop (or of the chunk of a parallel loop each
//!   thread runs, or of a vectorized loop: a `cache_write`'s write-back of a row) whose body
//!   is lane-wise (the emitter's vectorizer accepts it: the store, lets and conditions that do
//!   not depend on the loop variable, no inner loop), and its index moves
//!   by one element per iteration in the last dimension, with no variable bound in the body
//!   (its address is taken before the loop); a loop of constant extent writes at least 512
//!   bytes, or the threshold if smaller (else it would run mostly in the scalar head and tail). With one store to an output nobody
//!   reads, no iteration sees another's effects: computing them out of order and 16 at a time
//!   gives what the serial loop gives;
//! - the output's size in bytes is at least [`CodegenOptions::stream_store_bytes`]: decided at
//!   compile time for constant shapes, at run time (before the loop) for symbolic ones.
//!
//! The streaming form of the loop: from the first 64-byte-aligned element of the output, 64
//! bytes of the output per step (16 `float32` lanes) as one vector store marked `!nontemporal`
//! and aligned to 64 (LLVM emits `movntps`/`vmovntps`, in zmm, ymm or xmm registers as the CPU
//! has them); then the iterations before that element and after the last whole step in one
//! scalar loop; then an `sfence`, so that the stores are visible to whoever synchronizes with
//! this thread next (the caller, or the thread that joins a parallel launch). For a symbolic
//! shape the vector part is there twice, with and without non-temporal stores, chosen by the
//! size; an output below the threshold gets the same loop with ordinary stores. The loops carry
//! metadata that keeps LLVM from vectorizing or unrolling them again: they cost about as much
//! compile time as the one loop LLVM would vectorize (vadd: 1.03-1.04x the build time,
//! `cargo bench --bench codegen`). Values are those of the ordinary loop, bit for bit: the same
//! expressions, computed lane by lane.
//!
//! The threshold is a compile-time constant, so a library exported for one machine and run on
//! another keeps it: for the host's CPU (`mcpu: native`, or the name LLVM gives the host CPU),
//! the host's last-level cache size, at most [`STREAM_STORE_MAX_BYTES`]; for any other CPU,
//! [`STREAM_STORE_MAX_BYTES`]. The bound exists
//! because the reported last level is often not what one kernel can use: a server's L3 is
//! shared by every core of the socket, and a VM may report the host's whole cache (480 MiB on
//! the Xeon above, where ordinary stores already lose from 32 MiB of output).
//!
//! [`CodegenOptions::stream_store_bytes`]: super::CodegenOptions::stream_store_bytes

use std::collections::{HashMap, HashSet};

use crate::ir::visit::Visitor;
use crate::ir::{Buffer, Param, PrimFunc, StorageScope, TypeCode, VarId};

/// The largest streaming-store threshold: outputs of at least this many bytes are streamed on
/// every x86 target, whatever cache the host reports.
pub const STREAM_STORE_MAX_BYTES: u64 = 32 << 20;

/// The streaming-store threshold for a target triple: `None` off x86; else the last-level
/// cache of the machine the code is built on, whatever CPU the target names (`mcpu` chooses the
/// instructions, the host's caches the blocking, as [`crate::target::l2_bytes`]), at most
/// [`STREAM_STORE_MAX_BYTES`]; that maximum where the host's caches cannot be read.
pub fn stream_store_threshold(triple: &str) -> Option<u64> {
    if !super::is_x86(triple) {
        return None;
    }
    let llc = crate::target::host_caches().last_level;
    Some(llc.map_or(STREAM_STORE_MAX_BYTES, |l| l.min(STREAM_STORE_MAX_BYTES)))
}

/// The data variables of `f`'s buffer parameters that may be written with streaming stores:
/// `f` is `noalias`; the buffer is a compact `float32`/`float64` parameter in global scope,
/// stored to once in the body and never loaded.
pub(crate) fn stream_outputs(f: &PrimFunc) -> HashSet<VarId> {
    if !f.attrs.noalias {
        return HashSet::new();
    }
    let mut count = Counts::default();
    count.stmt(&f.body);
    f.params
        .iter()
        .filter_map(|p| match p {
            Param::Buffer(b)
                if b.strides.is_none()
                    && b.scope == StorageScope::Global
                    && b.dtype.code == TypeCode::Float
                    && matches!(b.dtype.bits, 32 | 64)
                    && b.dtype.lanes == 1
                    && count.stores.get(&b.data.id) == Some(&1)
                    && !count.loads.contains(&b.data.id) =>
            {
                Some(b.data.id)
            }
            _ => None,
        })
        .collect()
}

/// Stores and loads per buffer data variable.
#[derive(Default)]
struct Counts {
    stores: HashMap<VarId, usize>,
    loads: HashSet<VarId>,
}

impl Visitor for Counts {
    fn store(&mut self, buffer: &Buffer) {
        *self.stores.entry(buffer.data.id).or_default() += 1;
    }

    fn load(&mut self, buffer: &Buffer) {
        self.loads.insert(buffer.data.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_x86_streams_and_the_threshold_is_bounded() {
        assert_eq!(stream_store_threshold("aarch64-unknown-linux-gnu"), None);
        let want = crate::target::host_caches()
            .last_level
            .map_or(STREAM_STORE_MAX_BYTES, |l| l.min(STREAM_STORE_MAX_BYTES));
        assert!(want > 0 && want <= STREAM_STORE_MAX_BYTES);
        for triple in ["x86_64-unknown-linux-gnu", "i686-pc-linux-gnu"] {
            assert_eq!(stream_store_threshold(triple), Some(want), "{triple}");
        }
    }

    #[test]
    fn outputs_written_once_and_never_read_stream() {
        use crate::ir::kernels;
        let vadd = kernels::vadd();
        let out = stream_outputs(&vadd);
        let names: Vec<&str> = vadd
            .params
            .iter()
            .filter_map(|p| match p {
                Param::Buffer(b) if out.contains(&b.data.id) => Some(b.name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["C"]);
        // Without `noalias` nothing streams (the emitter vectorizes the loop itself).
        assert!(stream_outputs(&vadd.clone().with_noalias(false)).is_empty());
        // softmax's output is read back (the sum, the scaling): not streamed.
        let sm = crate::schedule::kernels::softmax_sized(4, 64).unwrap();
        assert!(stream_outputs(&sm).is_empty());
    }
}
