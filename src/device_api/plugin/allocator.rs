//! [`ChunkAllocator`]: device memory carved out of large chunks requested from the plugin, as
//! PaddlePaddle manages CustomDevice memory (auto-growth best fit), so that steady allocation and
//! freeing does not call into the plugin every time.
//!
//! - Requests round up to the plugin's minimum chunk size (the block granularity, a power of two
//!   >= 64) after adding its extra padding.
//! - A block comes from the smallest free block that fits (best fit). When none fits, a new chunk
//!   of `max(realloc size, block)` bytes is requested (capped at the maximum chunk size; requests
//!   larger than that get a chunk of their own). If the plugin is out of memory, cached free
//!   chunks are returned to it and the request is retried once, with the exact size.
//! - Freed blocks merge with free neighbours in the same chunk. [`ChunkAllocator::trim`] returns
//!   wholly free chunks to the plugin.
//! - Requests above the maximum allocation size fail without calling the plugin.
//!
//! The allocator is generic over the calls into the plugin ([`ChunkSource`]), so it is tested
//! without one.

use std::collections::{BTreeMap, BTreeSet};

/// The plugin's allocator tuning, with kiln's defaults for what it does not provide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChunkConfig {
    /// Block granularity (a power of two >= 64).
    pub min_chunk_size: usize,
    /// The largest chunk carved into blocks.
    pub max_chunk_size: usize,
    /// The largest single allocation.
    pub max_alloc_size: usize,
    /// Bytes added to every block.
    pub extra_padding_size: usize,
    /// The first chunk, allocated at load (0: none).
    pub init_alloc_size: usize,
    /// The size of each new chunk.
    pub realloc_size: usize,
}

impl ChunkConfig {
    /// The default block granularity.
    pub const DEFAULT_MIN_CHUNK: usize = 256;
    /// The default maximum chunk size.
    pub const DEFAULT_MAX_CHUNK: usize = 64 << 20;
    /// The default size of new chunks.
    pub const DEFAULT_REALLOC: usize = 8 << 20;

    /// Kiln's defaults.
    pub fn defaults() -> Self {
        Self {
            min_chunk_size: Self::DEFAULT_MIN_CHUNK,
            max_chunk_size: Self::DEFAULT_MAX_CHUNK,
            max_alloc_size: usize::MAX,
            extra_padding_size: 0,
            init_alloc_size: 0,
            realloc_size: Self::DEFAULT_REALLOC,
        }
    }

    /// Makes the values consistent: granularity a power of two >= 64, chunk sizes multiples of
    /// it and non-zero.
    pub fn normalized(mut self) -> Self {
        self.min_chunk_size = self.min_chunk_size.clamp(64, 1 << 30).next_power_of_two();
        let g = self.min_chunk_size;
        let round = |v: usize| v.checked_next_multiple_of(g).unwrap_or(usize::MAX / g * g);
        self.max_chunk_size = round(self.max_chunk_size.max(g));
        self.realloc_size = round(self.realloc_size.max(g)).min(self.max_chunk_size);
        self.init_alloc_size = round(self.init_alloc_size).min(self.max_chunk_size);
        if self.max_alloc_size == 0 {
            self.max_alloc_size = usize::MAX;
        }
        self
    }
}

/// Allocator statistics of one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChunkStats {
    /// Bytes held from the plugin (all chunks).
    pub reserved: u64,
    /// Bytes handed out to callers (their requested sizes).
    pub in_use: u64,
    /// The largest `in_use` seen.
    pub peak: u64,
    /// Live allocations.
    pub allocations: u64,
    /// Chunks held from the plugin.
    pub chunks: u64,
    /// Calls to the plugin's `device_memory_allocate`.
    pub plugin_allocs: u64,
    /// Calls to the plugin's `device_memory_deallocate`.
    pub plugin_frees: u64,
    /// Allocations served from cached chunks without calling the plugin.
    pub cache_hits: u64,
}

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocFailure {
    /// Above the maximum allocation size (the plugin was not called).
    TooLarge {
        /// The limit.
        max: usize,
    },
    /// The plugin failed; its message.
    Plugin(String),
}

/// Why a free failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeFailure {
    /// The address was never handed out.
    Unknown,
    /// The address was freed already (and not handed out again).
    DoubleFree,
}

/// The calls into the plugin the allocator makes.
pub trait ChunkSource {
    /// Allocates a chunk of `size` bytes; its address, or the plugin's message.
    ///
    /// # Errors
    /// The plugin's message.
    fn allocate(&mut self, size: usize) -> Result<usize, String>;
    /// Frees a chunk.
    ///
    /// # Errors
    /// The plugin's message.
    fn deallocate(&mut self, addr: usize, size: usize) -> Result<(), String>;
}

#[derive(Clone, Copy, Debug)]
struct Live {
    block: usize,
    block_size: usize,
    size: usize,
}

/// The allocator of one device; see the module docs.
#[derive(Debug)]
pub struct ChunkAllocator {
    config: ChunkConfig,
    /// Chunk base -> size.
    chunks: BTreeMap<usize, usize>,
    /// Free blocks by address -> size, and by (size, address) for best fit.
    free_by_addr: BTreeMap<usize, usize>,
    free_by_size: BTreeSet<(usize, usize)>,
    /// User address -> block.
    live: BTreeMap<usize, Live>,
    /// User addresses freed and not handed out since (bounded).
    freed: BTreeSet<usize>,
    stats: ChunkStats,
}

impl ChunkAllocator {
    /// An empty allocator with `config` (normalized).
    pub fn new(config: ChunkConfig) -> Self {
        Self {
            config: config.normalized(),
            chunks: BTreeMap::new(),
            free_by_addr: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
            live: BTreeMap::new(),
            freed: BTreeSet::new(),
            stats: ChunkStats::default(),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> ChunkConfig {
        self.config
    }

    /// The statistics.
    pub fn stats(&self) -> ChunkStats {
        self.stats
    }

    fn insert_free(&mut self, addr: usize, size: usize) {
        self.free_by_addr.insert(addr, size);
        self.free_by_size.insert((size, addr));
    }

    fn remove_free(&mut self, addr: usize) -> Option<usize> {
        let size = self.free_by_addr.remove(&addr)?;
        self.free_by_size.remove(&(size, addr));
        Some(size)
    }

    fn chunk_of(&self, addr: usize) -> Option<(usize, usize)> {
        self.chunks
            .range(..=addr)
            .next_back()
            .filter(|(b, s)| addr < *b + *s)
            .map(|(b, s)| (*b, *s))
    }

    /// Requests a chunk of at least `need` bytes, trimming and retrying once on failure.
    fn grow(&mut self, src: &mut dyn ChunkSource, need: usize) -> Result<(), String> {
        let c = self.config;
        let size = if need > c.max_chunk_size {
            need
        } else {
            need.max(c.realloc_size)
        };
        self.stats.plugin_allocs += 1;
        let addr = match src.allocate(size) {
            Ok(a) => a,
            Err(first) => {
                // Give cached chunks back, then try the exact size once.
                let released = self.trim(src);
                if released == 0 && size == need {
                    return Err(first);
                }
                self.stats.plugin_allocs += 1;
                match src.allocate(need) {
                    Ok(a) => {
                        self.add_chunk(a, need);
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        self.add_chunk(addr, size);
        Ok(())
    }

    fn add_chunk(&mut self, addr: usize, size: usize) {
        self.chunks.insert(addr, size);
        self.stats.chunks += 1;
        self.stats.reserved += size as u64;
        self.insert_free(addr, size);
    }

    /// Allocates the first chunk (`init_alloc_size`), if configured.
    ///
    /// # Errors
    /// The plugin's message.
    pub fn preallocate(&mut self, src: &mut dyn ChunkSource) -> Result<(), String> {
        if self.config.init_alloc_size > 0 && self.chunks.is_empty() {
            let n = self.config.init_alloc_size;
            self.stats.plugin_allocs += 1;
            let a = src.allocate(n)?;
            self.add_chunk(a, n);
        }
        Ok(())
    }

    /// Allocates `size > 0` bytes aligned to `align` (a power of two).
    ///
    /// # Errors
    /// [`AllocFailure`].
    pub fn allocate(
        &mut self,
        src: &mut dyn ChunkSource,
        size: usize,
        align: usize,
    ) -> Result<usize, AllocFailure> {
        let c = self.config;
        if size > c.max_alloc_size {
            return Err(AllocFailure::TooLarge {
                max: c.max_alloc_size,
            });
        }
        let g = c.min_chunk_size;
        // Block starts are multiples of `g` relative to chunk bases, which are at least
        // 256-aligned; larger alignments take slack inside the block.
        let slack = align.saturating_sub(g.min(super::sys::KILN_PLUGIN_MIN_ALIGNMENT));
        let need = size
            .checked_add(c.extra_padding_size)
            .and_then(|n| n.checked_add(slack))
            .and_then(|n| n.checked_next_multiple_of(g))
            .ok_or(AllocFailure::TooLarge {
                max: c.max_alloc_size,
            })?;
        let fit = |me: &Self| {
            me.free_by_size
                .range((need, 0)..)
                .next()
                .map(|&(s, a)| (s, a))
        };
        let (bsize, baddr) = match fit(self) {
            Some(b) => {
                self.stats.cache_hits += 1;
                b
            }
            None => {
                self.grow(src, need).map_err(AllocFailure::Plugin)?;
                fit(self).ok_or_else(|| {
                    AllocFailure::Plugin("no block fits after growing (internal error)".to_owned())
                })?
            }
        };
        self.remove_free(baddr);
        if bsize > need {
            self.insert_free(baddr + need, bsize - need);
        }
        let user = baddr.next_multiple_of(align);
        self.live.insert(
            user,
            Live {
                block: baddr,
                block_size: need,
                size,
            },
        );
        self.freed.remove(&user);
        let st = &mut self.stats;
        st.in_use += size as u64;
        st.peak = st.peak.max(st.in_use);
        st.allocations += 1;
        Ok(user)
    }

    /// Frees an address from [`ChunkAllocator::allocate`] (the block goes back to the cache).
    ///
    /// # Errors
    /// [`FreeFailure`].
    pub fn free(&mut self, addr: usize) -> Result<(), FreeFailure> {
        let Some(l) = self.live.remove(&addr) else {
            return Err(if self.freed.contains(&addr) {
                FreeFailure::DoubleFree
            } else {
                FreeFailure::Unknown
            });
        };
        if self.freed.len() >= 4096 {
            self.freed.pop_first();
        }
        self.freed.insert(addr);
        self.stats.in_use -= l.size as u64;
        self.stats.allocations -= 1;
        let (mut start, mut size) = (l.block, l.block_size);
        let chunk = self.chunk_of(start);
        // Merge with the next free block in the same chunk.
        let end = start + size;
        if let Some(&next) = self.free_by_addr.get(&end) {
            if chunk == self.chunk_of(end) {
                self.remove_free(end);
                size += next;
            }
        }
        // And with the previous one.
        if let Some((&p, &psize)) = self.free_by_addr.range(..start).next_back() {
            if p + psize == start && chunk == self.chunk_of(p) {
                self.remove_free(p);
                start = p;
                size += psize;
            }
        }
        self.insert_free(start, size);
        Ok(())
    }

    /// The live allocation containing `[addr, addr + len)`: its user address and size.
    pub fn find(&self, addr: usize, len: usize) -> Option<(usize, usize)> {
        let (&base, l) = self.live.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        (end <= base + l.size).then_some((base, l.size))
    }

    /// The live allocation that `addr` points into (its first byte up to, not including, its
    /// end): its user address and size. A copy or memset is checked against the allocation its
    /// base pointer belongs to, never against one its offset happens to land in.
    pub fn containing(&self, addr: usize) -> Option<(usize, usize)> {
        let (&base, l) = self.live.range(..=addr).next_back()?;
        (addr == base || addr < base.checked_add(l.size)?).then_some((base, l.size))
    }

    /// Returns wholly free chunks to the plugin; the bytes released.
    pub fn trim(&mut self, src: &mut dyn ChunkSource) -> u64 {
        let whole: Vec<(usize, usize)> = self
            .chunks
            .iter()
            .filter(|(b, s)| self.free_by_addr.get(b) == Some(s))
            .map(|(b, s)| (*b, *s))
            .collect();
        let mut released = 0;
        for (b, s) in whole {
            self.stats.plugin_frees += 1;
            match src.deallocate(b, s) {
                Ok(()) => {
                    self.remove_free(b);
                    self.chunks.remove(&b);
                    self.stats.chunks -= 1;
                    self.stats.reserved -= s as u64;
                    released += s as u64;
                }
                Err(e) => log::warn!("returning a chunk of {s} bytes to the plugin: {e}"),
            }
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Fake {
        next: usize,
        live: BTreeMap<usize, usize>,
        fail_next: bool,
        calls: usize,
    }

    impl ChunkSource for Fake {
        fn allocate(&mut self, size: usize) -> Result<usize, String> {
            self.calls += 1;
            if std::mem::take(&mut self.fail_next) {
                return Err("fake out of memory".into());
            }
            let a = 0x10_0000 + self.next;
            self.next += size.next_multiple_of(4096) + 4096;
            self.live.insert(a, size);
            Ok(a)
        }
        fn deallocate(&mut self, addr: usize, size: usize) -> Result<(), String> {
            assert_eq!(self.live.remove(&addr), Some(size));
            Ok(())
        }
    }

    fn cfg() -> ChunkConfig {
        ChunkConfig {
            realloc_size: 1 << 16,
            max_chunk_size: 1 << 20,
            ..ChunkConfig::defaults()
        }
    }

    #[test]
    fn steady_alloc_and_free_calls_the_plugin_once() {
        let (mut src, mut a) = (Fake::default(), ChunkAllocator::new(cfg()));
        for _ in 0..100 {
            let p = a.allocate(&mut src, 1000, 64).unwrap();
            let q = a.allocate(&mut src, 3000, 64).unwrap();
            a.free(p).unwrap();
            a.free(q).unwrap();
        }
        assert_eq!(src.calls, 1);
        let s = a.stats();
        assert_eq!(
            (s.plugin_allocs, s.chunks, s.in_use, s.allocations),
            (1, 1, 0, 0)
        );
        assert_eq!(s.peak, 4000);
        assert!(s.cache_hits >= 199);
    }

    #[test]
    fn freed_neighbours_merge_and_trim_returns_whole_chunks() {
        let (mut src, mut a) = (Fake::default(), ChunkAllocator::new(cfg()));
        let ps: Vec<usize> = (0..8)
            .map(|_| a.allocate(&mut src, 8000, 64).unwrap())
            .collect();
        for p in [ps[1], ps[0], ps[3], ps[2], ps[5], ps[7], ps[6], ps[4]] {
            a.free(p).unwrap();
        }
        assert_eq!(a.trim(&mut src), 1 << 16);
        assert!(src.live.is_empty());
        assert_eq!(a.stats().reserved, 0);
    }

    #[test]
    fn large_requests_get_their_own_chunk_and_oversized_ones_fail_without_a_call() {
        let mut c = cfg();
        c.max_alloc_size = 4 << 20;
        let (mut src, mut a) = (Fake::default(), ChunkAllocator::new(c));
        let p = a.allocate(&mut src, 2 << 20, 64).unwrap();
        assert_eq!(src.live.get(&p), Some(&(2 << 20)));
        assert_eq!(
            a.allocate(&mut src, 5 << 20, 64),
            Err(AllocFailure::TooLarge { max: 4 << 20 })
        );
        assert_eq!(src.calls, 1);
    }

    #[test]
    fn alignment_padding_and_bounds_are_honoured() {
        let mut c = cfg();
        c.extra_padding_size = 32;
        let (mut src, mut a) = (Fake::default(), ChunkAllocator::new(c));
        let x = a.allocate(&mut src, 100, 64).unwrap();
        let y = a.allocate(&mut src, 100, 4096).unwrap();
        assert_eq!(y % 4096, 0);
        assert!(y >= x + 132);
        assert_eq!(a.find(x + 10, 90), Some((x, 100)));
        assert_eq!(a.find(x + 10, 91), None);
        assert_eq!(a.free(x), Ok(()));
        assert_eq!(a.free(x), Err(FreeFailure::DoubleFree));
        assert_eq!(a.free(x + 8), Err(FreeFailure::Unknown));
    }

    #[test]
    fn a_failed_chunk_request_trims_the_cache_and_retries_with_the_exact_size() {
        let (mut src, mut a) = (Fake::default(), ChunkAllocator::new(cfg()));
        let p = a.allocate(&mut src, 100, 64).unwrap();
        a.free(p).unwrap();
        let q = a.allocate(&mut src, 70_000, 64).unwrap_or(0);
        assert_ne!(q, 0);
        src.fail_next = true;
        // The cached 64 KiB chunk is returned to the plugin and the exact size retried.
        let big = a.allocate(&mut src, 200_000, 64).unwrap();
        assert!(a.find(big, 200_000).is_some());
        src.fail_next = true;
        a.free(q).unwrap();
        a.free(big).unwrap();
        let e = a.allocate(&mut src, 300_000, 64);
        assert!(e.is_ok(), "trimmed chunks make room: {e:?}");
    }
}
