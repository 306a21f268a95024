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
//! # Files
//! - `mod.rs`: the backend type, its [`DeviceApi`] impl and the host's attributes (`/proc`,
//!   `/sys`).
//! - `memory.rs`: the heap bookkeeping, the [`DeviceMemoryApi`] impl and the host copies
//!   (`strided_copy_host`, also used by the generic copy path). It holds the backend's `unsafe`
//!   code: the allocator calls and the host copies.
//! - `stream.rs`: the stream and event tables and the [`DeviceStreamApi`] impl.
//!
//! [`DeviceMemoryApi`]: super::DeviceMemoryApi
//! [`DeviceStreamApi`]: super::DeviceStreamApi

mod memory;
mod stream;

use std::sync::{Mutex, OnceLock};

use super::api::{AttrKind, AttrValue, DeviceApi};
use super::device::{Device, DeviceType};
use super::error::DeviceResult;

pub(crate) use memory::strided_copy_host;

/// The version of kiln's device API, reported as the CPU's `api_version` attribute.
pub const DEVICE_API_VERSION: i64 = 1;

/// The CPU backend (`device_api.cpu`, device type 1, one device).
#[derive(Default)]
pub struct CpuDeviceApi {
    heap: Mutex<memory::Heap>,
    queues: Mutex<stream::Queues>,
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
