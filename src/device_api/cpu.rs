//! [`CpuDeviceApi`]: the host as a device. Real memory (64-byte aligned, tracked so that bad
//! frees are errors), real attributes from the OS, synchronous streams.
//!
//! # Streams on the CPU
//! Every operation completes before its call returns (TVM's CPU does the same with a NULL
//! stream). Streams and events are still real objects with generation-checked handles, so a
//! freed one is an error; and the ordering contract holds trivially: a host callback queued on
//! a stream runs at once, after all earlier work (which has completed) and before any later work
//! (which has not been queued yet); an event is complete as soon as it is recorded.
//!
//! This file holds the backend's `unsafe` code: the allocator calls and the host copies.

use std::alloc::Layout;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::api::{shape_of, strides_of, AttrKind, AttrValue, DeviceApi, ALLOC_ALIGNMENT};
use super::device::{Device, DeviceType};
use super::error::{DeviceError, DeviceResult};
use super::memory::{DeviceMemoryApi, DevicePtr, HostCallback, MemRegion, MemoryStats};
use super::stream::{DeviceStreamApi, EventHandle, HandleTable, StreamHandle};
use crate::packed_func::ffi::{DLDataType, DLTensor};

/// The version of kiln's device API, reported as the CPU's `api_version` attribute.
pub const DEVICE_API_VERSION: i64 = 1;

/// How many freed addresses are remembered to tell a double free from an unknown pointer.
const FREED_MEMORY: usize = 1 << 14;

#[derive(Default)]
struct Heap {
    /// Live allocations: address -> layout.
    live: BTreeMap<usize, Layout>,
    /// Recently freed addresses (for double-free detection), in free order.
    freed: HashSet<usize>,
    freed_order: VecDeque<usize>,
    in_use: u64,
    peak: u64,
}

#[derive(Default)]
struct Queues {
    streams: HandleTable<()>,
    /// Events: whether recorded (irrelevant for completion on the CPU, kept for debugging).
    events: HandleTable<bool>,
}

/// The CPU backend (`device_api.cpu`, device type 1, one device).
#[derive(Default)]
pub struct CpuDeviceApi {
    heap: Mutex<Heap>,
    queues: Mutex<Queues>,
}

impl std::fmt::Debug for CpuDeviceApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuDeviceApi").finish_non_exhaustive()
    }
}

impl CpuDeviceApi {
    /// A new CPU backend with its own allocation bookkeeping.
    pub fn new() -> Self {
        Self::default()
    }

    // A panic while a lock is held leaves the maps consistent (each update is one insert or
    // remove), so a poisoned lock is still usable.
    fn heap(&self) -> MutexGuard<'_, Heap> {
        self.heap.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn queues(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_stream(q: &Queues, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        if s.is_default() || q.streams.get(s.to_raw()).is_some() {
            Ok(())
        } else {
            Err(DeviceError::InvalidStream {
                device: dev,
                handle: s.to_raw(),
            })
        }
    }

    fn check_event(q: &Queues, dev: Device, e: EventHandle) -> DeviceResult<()> {
        if q.events.get(e.to_raw()).is_some() {
            Ok(())
        } else {
            Err(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            })
        }
    }

    /// Checks that `[ptr + offset, + nbytes)` lies inside one live allocation.
    fn check_range(
        &self,
        op: &'static str,
        dev: Device,
        ptr: DevicePtr,
        offset: u64,
        nbytes: usize,
    ) -> DeviceResult<usize> {
        let oob = || DeviceError::OutOfBounds {
            op,
            device: dev,
            ptr,
            offset,
            nbytes: nbytes as u64,
            allocation: None,
        };
        let start = usize::try_from(offset)
            .ok()
            .and_then(|o| ptr.0.checked_add(o))
            .ok_or_else(oob)?;
        let end = start.checked_add(nbytes).ok_or_else(oob)?;
        let heap = self.heap();
        let (&base, layout) = heap.live.range(..=start).next_back().ok_or_else(oob)?;
        if end > base + layout.size() {
            return Err(oob());
        }
        Ok(start)
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Facts about the host read once from `/proc` and `/sys`.
struct HostInfo {
    model: Option<String>,
    cores: Option<i64>,
    max_clock_khz: Option<i64>,
    l2_bytes: Option<i64>,
    kernel: Option<String>,
}

fn parse_cache_size(s: &str) -> Option<i64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' => (&s[..s.len() - 1], 1024),
        'M' => (&s[..s.len() - 1], 1024 * 1024),
        'G' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    num.trim().parse::<i64>().ok().map(|v| v * mult)
}

fn host_info() -> &'static HostInfo {
    static INFO: OnceLock<HostInfo> = OnceLock::new();
    INFO.get_or_init(|| {
        let cpuinfo = read("/proc/cpuinfo").unwrap_or_default();
        let field = |line: &str, key: &str| -> Option<String> {
            let (k, v) = line.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        };
        let model = cpuinfo
            .lines()
            .find_map(|l| field(l, "model name").or_else(|| field(l, "Model")));
        let processors = cpuinfo
            .lines()
            .filter(|l| field(l, "processor").is_some())
            .count();
        let cores = if processors > 0 {
            Some(processors as i64)
        } else {
            std::thread::available_parallelism()
                .ok()
                .map(|n| n.get() as i64)
        };
        let max_clock_khz = read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
            .and_then(|s| s.trim().parse::<i64>().ok())
            .or_else(|| {
                cpuinfo
                    .lines()
                    .filter_map(|l| field(l, "cpu MHz"))
                    .filter_map(|v| v.parse::<f64>().ok())
                    .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
                    .map(|mhz| (mhz * 1000.0) as i64)
            });
        let mut l2_bytes = None;
        for i in 0..8 {
            let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
            let Some(level) = read(&format!("{dir}/level")) else {
                break;
            };
            if level.trim() == "2" {
                l2_bytes = read(&format!("{dir}/size")).and_then(|s| parse_cache_size(&s));
                break;
            }
        }
        let kernel = read("/proc/sys/kernel/osrelease").map(|s| s.trim().to_owned());
        HostInfo {
            model,
            cores,
            max_clock_khz,
            l2_bytes,
            kernel,
        }
    })
}

/// `(MemTotal, MemAvailable)` in bytes, from `/proc/meminfo`.
fn meminfo() -> (Option<u64>, Option<u64>) {
    let text = read("/proc/meminfo").unwrap_or_default();
    let get = |key: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            let kb = rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()?;
            Some(kb * 1024)
        })
    };
    (
        get("MemTotal"),
        get("MemAvailable").or_else(|| get("MemFree")),
    )
}

impl DeviceApi for CpuDeviceApi {
    fn name(&self) -> &str {
        "cpu"
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::CPU
    }

    fn device_count(&self) -> DeviceResult<usize> {
        Ok(1)
    }

    fn raw_attr(&self, _dev: Device, kind: AttrKind) -> DeviceResult<Option<AttrValue>> {
        let info = host_info();
        Ok(match kind {
            AttrKind::WARP_SIZE => Some(AttrValue::Int(1)),
            AttrKind::DEVICE_NAME => info.model.clone().map(AttrValue::Str),
            AttrKind::MAX_CLOCK_RATE => info.max_clock_khz.map(AttrValue::Int),
            AttrKind::MULTI_PROCESSOR_COUNT => info.cores.map(AttrValue::Int),
            AttrKind::API_VERSION => Some(AttrValue::Int(DEVICE_API_VERSION)),
            AttrKind::DRIVER_VERSION => info.kernel.clone().map(AttrValue::Str),
            AttrKind::L2_CACHE_SIZE_BYTES => info.l2_bytes.map(AttrValue::Int),
            AttrKind::TOTAL_GLOBAL_MEMORY => meminfo().0.map(|v| AttrValue::Int(v as i64)),
            AttrKind::AVAILABLE_GLOBAL_MEMORY => meminfo().1.map(|v| AttrValue::Int(v as i64)),
            _ => None,
        })
    }
}

impl DeviceMemoryApi for CpuDeviceApi {
    fn raw_alloc(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        _dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr> {
        let align = align.max(ALLOC_ALIGNMENT);
        let oom = |reason: &str| DeviceError::OutOfMemory {
            device: dev,
            nbytes: nbytes as u64,
            align: align as u64,
            reason: reason.to_owned(),
        };
        let layout = Layout::from_size_align(nbytes, align)
            .map_err(|_| oom("the size exceeds isize::MAX once aligned"))?;
        if layout.size() == 0 {
            return Err(DeviceError::ZeroSize { device: dev });
        }
        // Zeroed, so that safe code never reads uninitialised bytes (`Tensor::empty` followed by
        // `to_vec`). Large zeroed allocations come from fresh pages, so this costs little.
        // SAFETY: the layout has a non-zero size (checked above).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(oom("the system allocator returned NULL"));
        }
        let addr = p as usize;
        let mut heap = self.heap();
        heap.live.insert(addr, layout);
        heap.freed.remove(&addr);
        heap.in_use += nbytes as u64;
        heap.peak = heap.peak.max(heap.in_use);
        Ok(DevicePtr(addr))
    }

    fn raw_free(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
        let mut heap = self.heap();
        let Some(layout) = heap.live.remove(&ptr.0) else {
            return Err(if heap.freed.contains(&ptr.0) {
                DeviceError::DoubleFree { device: dev, ptr }
            } else {
                DeviceError::UnknownPointer {
                    device: dev,
                    ptr,
                    what: "the cpu backend".to_owned(),
                }
            });
        };
        heap.in_use -= layout.size() as u64;
        if heap.freed_order.len() >= FREED_MEMORY {
            if let Some(old) = heap.freed_order.pop_front() {
                heap.freed.remove(&old);
            }
        }
        heap.freed.insert(ptr.0);
        heap.freed_order.push_back(ptr.0);
        drop(heap);
        // SAFETY: `ptr` was returned by `std::alloc::alloc` with `layout` (it was in `live`,
        // which only `raw_alloc` fills) and is removed from `live`, so it is freed once.
        unsafe { std::alloc::dealloc(ptr.0 as *mut u8, layout) };
        Ok(())
    }

    unsafe fn raw_copy(
        &self,
        src: MemRegion,
        dst: MemRegion,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        // The copy runs at once, but a freed stream is still an error (as on every backend).
        Self::check_stream(&self.queues(), src.device, stream)?;
        for r in [src, dst] {
            if !r.device.is_cpu() {
                return Err(DeviceError::Unsupported {
                    device: r.device,
                    what: "copies by the cpu backend (the device's own backend copies)".to_owned(),
                });
            }
        }
        let addr = |r: MemRegion| {
            usize::try_from(r.offset)
                .ok()
                .and_then(|o| r.ptr.0.checked_add(o))
                .filter(|a| a.checked_add(nbytes).is_some())
                .ok_or_else(|| {
                    DeviceError::InvalidTensor(format!(
                        "byte offset {} from {} overflows the address space",
                        r.offset, r.ptr
                    ))
                })
        };
        let (s, d) = (addr(src)?, addr(dst)?);
        // SAFETY: both are host ranges valid for `nbytes` bytes (caller); `copy` allows overlap.
        unsafe { std::ptr::copy(s as *const u8, d as *mut u8, nbytes) };
        Ok(())
    }

    unsafe fn raw_copy_strided(
        &self,
        from: &DLTensor,
        to: &DLTensor,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        Self::check_stream(&self.queues(), Device::cpu(), stream)?;
        // SAFETY: forwarded contract (host memory on the CPU).
        unsafe { strided_copy_host(from, to) }
    }

    fn raw_memset(
        &self,
        dev: Device,
        ptr: DevicePtr,
        offset: u64,
        value: u8,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        Self::check_stream(&self.queues(), dev, stream)?;
        let start = self.check_range("memset", dev, ptr, offset, nbytes)?;
        // SAFETY: `[start, start + nbytes)` lies inside a live allocation (checked above).
        unsafe { std::ptr::write_bytes(start as *mut u8, value, nbytes) };
        Ok(())
    }

    fn raw_memory_stats(&self, _dev: Device) -> DeviceResult<MemoryStats> {
        let (total, free) = meminfo();
        let heap = self.heap();
        Ok(MemoryStats {
            total,
            free,
            in_use: heap.in_use,
            peak: heap.peak,
            allocations: heap.live.len() as u64,
        })
    }

    fn host_accessible(&self) -> bool {
        true
    }
}

impl DeviceStreamApi for CpuDeviceApi {
    fn raw_create_stream(&self, _dev: Device) -> DeviceResult<StreamHandle> {
        Ok(StreamHandle::from_raw(self.queues().streams.insert(())))
    }

    fn raw_free_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        self.queues()
            .streams
            .remove(s.to_raw())
            .ok_or(DeviceError::InvalidStream {
                device: dev,
                handle: s.to_raw(),
            })
    }

    fn raw_sync_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        Self::check_stream(&self.queues(), dev, s)
    }

    fn raw_query_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<bool> {
        Self::check_stream(&self.queues(), dev, s).map(|()| true)
    }

    fn raw_add_callback(&self, dev: Device, s: StreamHandle, cb: HostCallback) -> DeviceResult<()> {
        Self::check_stream(&self.queues(), dev, s)?;
        // Run outside the lock: the callback may call back into the backend.
        cb();
        Ok(())
    }

    fn raw_create_event(&self, _dev: Device) -> DeviceResult<EventHandle> {
        Ok(EventHandle::from_raw(self.queues().events.insert(false)))
    }

    fn raw_record_event(&self, dev: Device, s: StreamHandle, e: EventHandle) -> DeviceResult<()> {
        let mut q = self.queues();
        Self::check_stream(&q, dev, s)?;
        let rec = q
            .events
            .get_mut(e.to_raw())
            .ok_or(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            })?;
        *rec = true;
        Ok(())
    }

    fn raw_query_event(&self, dev: Device, e: EventHandle) -> DeviceResult<bool> {
        Self::check_event(&self.queues(), dev, e).map(|()| true)
    }

    fn raw_sync_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        Self::check_event(&self.queues(), dev, e)
    }

    fn raw_stream_wait_event(
        &self,
        dev: Device,
        s: StreamHandle,
        e: EventHandle,
    ) -> DeviceResult<()> {
        let q = self.queues();
        Self::check_stream(&q, dev, s)?;
        Self::check_event(&q, dev, e)
    }

    fn raw_destroy_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        self.queues()
            .events
            .remove(e.to_raw())
            .map(|_| ())
            .ok_or(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            })
    }
}

/// Compact row-major strides (in elements) of `shape`.
pub(crate) fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    s
}

/// Copies the elements of `from` into `to` on the host, walking both tensors' strides.
///
/// # Errors
/// [`DeviceError::Unsupported`] for dtypes whose elements are not whole bytes.
///
/// # Safety
/// - Both tensors have the same shape and dtype, and their `shape`/`strides` hold `ndim` entries.
/// - Every element they address (`data + byte_offset + index · strides · elem_size`) is valid host
///   memory, readable for `from` and writable for `to`.
pub(crate) unsafe fn strided_copy_host(from: &DLTensor, to: &DLTensor) -> DeviceResult<()> {
    // SAFETY: shapes and strides hold `ndim` entries (caller).
    let (shape, fs, ts) = unsafe { (shape_of(from)?, strides_of(from), strides_of(to)) };
    let bits = usize::from(from.dtype.bits) * usize::from(from.dtype.lanes);
    if bits % 8 != 0 {
        return Err(DeviceError::Unsupported {
            device: from.device.into(),
            what: format!("strided copies of {bits}-bit elements"),
        });
    }
    let elem = (bits / 8) as isize;
    if shape.contains(&0) || elem == 0 {
        return Ok(());
    }
    let fs = fs.map_or_else(|| compact_strides(shape), <[i64]>::to_vec);
    let ts = ts.map_or_else(|| compact_strides(shape), <[i64]>::to_vec);
    let fbase = (from.data as *const u8).wrapping_add(from.byte_offset as usize);
    let tbase = (to.data as *mut u8).wrapping_add(to.byte_offset as usize);
    let nd = shape.len();
    if nd == 0 {
        // SAFETY: one element at each base (caller).
        unsafe { std::ptr::copy(fbase, tbase, elem as usize) };
        return Ok(());
    }
    let inner = shape[nd - 1] as isize;
    let (fin, tin) = (fs[nd - 1] as isize * elem, ts[nd - 1] as isize * elem);
    let mut idx = vec![0i64; nd - 1];
    loop {
        let mut fo: isize = 0;
        let mut to_: isize = 0;
        for (d, &i) in idx.iter().enumerate() {
            fo += i as isize * fs[d] as isize * elem;
            to_ += i as isize * ts[d] as isize * elem;
        }
        let (f, t) = (fbase.wrapping_offset(fo), tbase.wrapping_offset(to_));
        if fin == elem && tin == elem {
            // SAFETY: a contiguous run of `inner` elements in both tensors (caller).
            unsafe { std::ptr::copy(f, t, (inner * elem) as usize) };
        } else {
            for j in 0..inner {
                let (src, dst) = (f.wrapping_offset(j * fin), t.wrapping_offset(j * tin));
                // SAFETY: each addresses one element of its tensor (caller); unaligned
                // accesses because strides in elements do not guarantee alignment of `data`.
                unsafe {
                    match elem {
                        1 => *dst = *src,
                        2 => dst
                            .cast::<u16>()
                            .write_unaligned(src.cast::<u16>().read_unaligned()),
                        4 => dst
                            .cast::<u32>()
                            .write_unaligned(src.cast::<u32>().read_unaligned()),
                        8 => dst
                            .cast::<u64>()
                            .write_unaligned(src.cast::<u64>().read_unaligned()),
                        n => std::ptr::copy(src, dst, n as usize),
                    }
                }
            }
        }
        // Advance the odometer over the outer dimensions.
        let mut d = nd - 1;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}
