//! The built-in kinds with TVM 0.27's schemas, and their canonicalizers.
//!
//! What a canonicalizer would learn from a device (CUDA compute capability, ROCm gfx version)
//! is not probed: kiln uses TVM's fallbacks (`sm_50`, `gfx900`), exactly as TVM does on a
//! machine without the device. The LLVM facts (default triple, host CPU) come from LLVM when
//! the `llvm` feature is on.

use std::sync::OnceLock;

use super::error::{TargetError, TargetResult};
use super::kind::{Config, TargetKind, TargetKindBuilder};
use super::value::TargetValue;

/// DLPack device codes used by the built-in kinds (from the one table, `packed_func::dlpack`).
mod dev {
    use crate::packed_func::DLDeviceType as D;
    pub const CPU: i32 = D::CPU.0;
    pub const CUDA: i32 = D::CUDA.0;
    pub const OPENCL: i32 = D::OPENCL.0;
    pub const VULKAN: i32 = D::VULKAN.0;
    pub const METAL: i32 = D::METAL.0;
    pub const ROCM: i32 = D::ROCM.0;
    pub const EXT_DEV: i32 = D::EXT_DEV.0;
    pub const WEBGPU: i32 = D::WEBGPU.0;
    pub const HEXAGON: i32 = D::HEXAGON.0;
    pub const TRN: i32 = D::TRN.0;
}

type S = String;
type A = Vec<String>;

fn int(b: TargetKindBuilder, name: &str, default: Option<i64>) -> TargetKindBuilder {
    b.option::<i64>(name, default)
}

/// All built-in kinds, in registration order.
pub(crate) fn kinds() -> Vec<TargetKind> {
    let mut out = Vec::new();
    let mut add = |b: TargetKindBuilder| match b.build() {
        Ok(k) => out.push(k),
        // The built-in declarations are fixed; a duplicate here is a bug in this file.
        Err(e) => panic!("built-in target kind is ill-formed: {e}"),
    };

    let mut llvm = TargetKind::builder("llvm", dev::CPU)
        .option::<A>("mattr", None)
        .option::<S>("mcpu", None)
        .option::<S>("mtriple", None)
        .option::<S>("mfloat-abi", None)
        .option::<S>("mabi", None)
        .option::<i64>("num-cores", None)
        .option::<bool>("fast-math", None);
    for f in ["nnan", "ninf", "nsz", "arcp", "contract", "reassoc"] {
        llvm = llvm.option::<bool>(format!("fast-math-{f}"), None);
    }
    add(llvm
        .option::<i64>("opt-level", None)
        .option::<A>("cl-opt", None)
        .option::<S>("jit", None)
        .option::<i64>("vector-width", None)
        .default_keys(["cpu"])
        .canonicalizer(canonicalize_llvm));

    add(TargetKind::builder("c", dev::CPU)
        .option::<S>("mcpu", None)
        .option::<S>("march", None)
        .option::<i64>("workspace-byte-alignment", None)
        .option::<i64>("constants-byte-alignment", None)
        .default_keys(["cpu"])
        .canonicalizer(canonicalize_llvm));

    add(TargetKind::builder("cuda_host", dev::CPU).default_keys(["cpu"]));

    let mut cuda = TargetKind::builder("cuda", dev::CUDA)
        .option::<S>("mcpu", None)
        .option::<S>("arch", None);
    for (name, d) in [
        ("max_shared_memory_per_block", None),
        ("max_threads_per_block", None),
        ("thread_warp_size", Some(32)),
        ("registers_per_block", None),
        ("l2_cache_size_bytes", None),
        ("max_num_threads", Some(1024)),
    ] {
        cuda = int(cuda, name, d);
    }
    add(cuda
        .default_keys(["cuda", "gpu"])
        .canonicalizer(canonicalize_cuda));

    add(TargetKind::builder("nvptx", dev::CUDA)
        .option::<S>("mcpu", None)
        .option::<S>("mtriple", None)
        .option::<i64>("max_num_threads", Some(1024))
        .option::<i64>("thread_warp_size", Some(32))
        .default_keys(["cuda", "gpu"])
        .canonicalizer(canonicalize_nvptx));

    add(TargetKind::builder("rocm", dev::ROCM)
        .option::<S>("mcpu", None)
        .option::<S>("mtriple", None)
        .option::<A>("mattr", None)
        .option::<i64>("max_num_threads", Some(256))
        .option::<i64>("max_threads_per_block", Some(256))
        .option::<i64>("max_shared_memory_per_block", Some(65536))
        .option::<i64>("thread_warp_size", Some(64))
        .default_keys(["rocm", "gpu"])
        .canonicalizer(canonicalize_rocm));

    let mut vulkan = TargetKind::builder("vulkan", dev::VULKAN).option::<A>("mattr", None);
    for (name, d) in [
        ("supports_float16", None),
        ("supports_float32", Some(true)),
        ("supports_float64", None),
        ("supports_int8", None),
        ("supports_int16", None),
        ("supports_int32", Some(true)),
        ("supports_int64", None),
        ("supports_8bit_buffer", None),
        ("supports_16bit_buffer", None),
        ("supports_storage_buffer_storage_class", None),
        ("supports_push_descriptor", None),
        ("supports_dedicated_allocation", None),
        ("supports_integer_dot_product", None),
        ("supports_cooperative_matrix", None),
    ] {
        vulkan = vulkan.option::<bool>(name, d);
    }
    for (name, d) in [
        ("supported_subgroup_operations", None),
        ("max_num_threads", Some(256)),
        ("max_threads_per_block", Some(256)),
        ("thread_warp_size", Some(1)),
        ("max_block_size_x", None),
        ("max_block_size_y", None),
        ("max_block_size_z", None),
        ("max_push_constants_size", None),
        ("max_uniform_buffer_range", None),
        ("max_storage_buffer_range", None),
        ("max_per_stage_descriptor_storage_buffer", None),
        ("max_shared_memory_per_block", None),
    ] {
        vulkan = int(vulkan, name, d);
    }
    vulkan = vulkan
        .option::<S>("device_type", None)
        .option::<S>("device_name", None)
        .option::<S>("driver_name", None);
    for name in ["driver_version", "vulkan_api_version", "max_spirv_version"] {
        vulkan = int(vulkan, name, None);
    }
    add(vulkan.default_keys(["vulkan", "gpu"]));

    let mut metal = TargetKind::builder("metal", dev::METAL);
    for (name, d) in [
        ("max_num_threads", 256),
        ("max_threads_per_block", 256),
        ("max_shared_memory_per_block", 32768),
        ("thread_warp_size", 16),
        ("max_function_args", 31),
    ] {
        metal = int(metal, name, Some(d));
    }
    add(metal.default_keys(["metal", "gpu"]));

    let mut opencl = TargetKind::builder("opencl", dev::OPENCL);
    for (name, d) in [
        ("max_threads_per_block", 256),
        ("max_shared_memory_per_block", 16384),
        ("max_num_threads", 256),
        ("thread_warp_size", 1),
        ("texture_spatial_limit", 16384),
        ("texture_depth_limit", 2048),
        ("max_function_args", 128),
        ("image_base_address_alignment", 64),
    ] {
        opencl = int(opencl, name, Some(d));
    }
    add(opencl.default_keys(["opencl", "gpu"]));

    add(TargetKind::builder("webgpu", dev::WEBGPU)
        .option::<i64>("max_num_threads", Some(256))
        .option::<bool>("supports_subgroups", Some(false))
        .option::<i64>("thread_warp_size", Some(1))
        .option::<i64>("max_shared_memory_per_block", Some(32768))
        .default_keys(["webgpu", "gpu"])
        .canonicalizer(canonicalize_webgpu));

    add(TargetKind::builder("ext_dev", dev::EXT_DEV));

    add(TargetKind::builder("hexagon", dev::HEXAGON)
        .option::<A>("mattr", None)
        .option::<S>("mcpu", None)
        .option::<S>("mtriple", None)
        .option::<A>("llvm-options", None)
        .option::<i64>("num-cores", None)
        .option::<i64>("vtcm-capacity", None)
        .default_keys(["hexagon", "cpu"]));

    add(TargetKind::builder("composite", dev::CPU).option::<Vec<super::Target>>("devices", None));

    add(
        TargetKind::builder("test", dev::CPU).canonicalizer(|c: &mut Config| {
            c.set("feature.is_test", true);
            Ok(())
        }),
    );

    // TVM's `trn` declares raw-integer "defaults" that its config schema ignores; so does kiln.
    let mut trn = TargetKind::builder("trn", dev::TRN);
    for name in [
        "partition_size",
        "max_sbuf_size_per_partition",
        "max_psum_size_per_partition",
        "num-cores",
    ] {
        trn = int(trn, name, None);
    }
    add(trn);

    out
}

fn invalid(kind: &str, option: &str, category: &'static str, message: String) -> TargetError {
    TargetError::InvalidValue {
        kind: kind.to_string(),
        option: option.to_string(),
        message,
        category,
    }
}

fn canonicalize_cuda(c: &mut Config) -> TargetResult<()> {
    match c.get_str("arch") {
        Some(arch) if !arch.starts_with("sm_") => Err(invalid(
            "cuda",
            "arch",
            "cuda_arch",
            format!("expects a CUDA arch `sm_XX` (e.g. sm_80), found {arch:?}"),
        )),
        Some(_) => Ok(()),
        None => {
            // No CUDA device is probed: TVM's fallback when detection fails.
            log::warn!("Unable to detect CUDA version, default to \"-arch=sm_50\" instead");
            c.set("arch", "sm_50");
            Ok(())
        }
    }
}

/// TVM's `CheckOrSetAttr`: the attribute must be `value`, or is set to it.
fn check_or_set(c: &mut Config, kind: &str, name: &str, value: &str) -> TargetResult<()> {
    match c.get(name) {
        None => {
            c.set(name, value);
            Ok(())
        }
        Some(TargetValue::Str(s)) if s == value => Ok(()),
        Some(other) => Err(invalid(
            kind,
            name,
            "fixed_attr",
            format!("must be {value:?}, found {other}"),
        )),
    }
}

fn canonicalize_nvptx(c: &mut Config) -> TargetResult<()> {
    check_or_set(c, "nvptx", "mtriple", "nvptx64-nvidia-cuda")?;
    match c.get_str("mcpu") {
        Some(mcpu) if !mcpu.starts_with("sm_") => Err(invalid(
            "nvptx",
            "mcpu",
            "cuda_arch",
            format!("expects a CUDA arch `sm_XX` (e.g. sm_80), found {mcpu:?}"),
        )),
        Some(_) => Ok(()),
        None => {
            log::warn!("Unable to detect CUDA version, default to \"-mcpu=sm_50\" instead");
            c.set("mcpu", "sm_50");
            Ok(())
        }
    }
}

fn canonicalize_rocm(c: &mut Config) -> TargetResult<()> {
    check_or_set(c, "rocm", "mtriple", "amdgcn-amd-amdhsa-hcc")?;
    match c.get_str("mcpu") {
        Some(mcpu) => {
            let ok = mcpu
                .strip_prefix("gfx")
                .and_then(|rest| rest.chars().next())
                .is_some_and(|ch| ch.is_ascii_alphanumeric());
            if !ok {
                return Err(invalid(
                    "rocm",
                    "mcpu",
                    "rocm_gfx",
                    format!("expects a GFX version `gfxNNN` (e.g. gfx908), found {mcpu:?}"),
                ));
            }
        }
        None => {
            log::warn!("ROCm not detected, using default gfx900");
            c.set("mcpu", "gfx900");
        }
    }
    // No ROCm runtime is probed: TVM then assumes ROCm >= 3.5 and leaves `mattr` alone.
    Ok(())
}

fn canonicalize_webgpu(c: &mut Config) -> TargetResult<()> {
    let subgroups = c.get_bool("supports_subgroups").unwrap_or(false);
    if let Some(w) = c.get_int("thread_warp_size") {
        if !subgroups && w > 1 {
            return Err(invalid(
                "webgpu",
                "thread_warp_size",
                "webgpu_subgroups",
                format!("is {w}, which requires supports_subgroups=true"),
            ));
        }
    }
    if subgroups {
        c.set("thread_warp_size", 32i64);
    }
    Ok(())
}

/// The default target triple: LLVM's (`llvm` feature), else one built from `std::env::consts`.
pub fn default_triple() -> &'static str {
    static TRIPLE: OnceLock<String> = OnceLock::new();
    TRIPLE.get_or_init(|| {
        #[cfg(feature = "llvm")]
        {
            inkwell::targets::TargetMachine::get_default_triple()
                .as_str()
                .to_string_lossy()
                .into_owned()
        }
        #[cfg(not(feature = "llvm"))]
        {
            let vendor = if cfg!(target_vendor = "apple") {
                "apple"
            } else {
                "unknown"
            };
            let abi = if cfg!(target_env = "gnu") {
                "-gnu"
            } else if cfg!(target_env = "musl") {
                "-musl"
            } else if cfg!(target_env = "msvc") {
                "-msvc"
            } else {
                ""
            };
            format!(
                "{}-{vendor}-{}{abi}",
                std::env::consts::ARCH,
                std::env::consts::OS
            )
        }
    })
}

/// The host CPU's name and LLVM feature list (`+avx2`, `-avx512f`, ...), if LLVM is built in.
pub fn host_cpu() -> Option<&'static (String, Vec<String>)> {
    static HOST: OnceLock<Option<(String, Vec<String>)>> = OnceLock::new();
    HOST.get_or_init(|| {
        #[cfg(feature = "llvm")]
        {
            use inkwell::targets::TargetMachine;
            let name = TargetMachine::get_host_cpu_name().to_string();
            let features = TargetMachine::get_host_cpu_features().to_string();
            let mut features: Vec<String> = features
                .split(',')
                .filter(|f| !f.is_empty())
                .map(str::to_string)
                .collect();
            // LLVM lists them in hash order; sort by feature name for a stable export.
            features.sort_by(|a, b| a.get(1..).cmp(&b.get(1..)));
            Some((name, features))
        }
        #[cfg(not(feature = "llvm"))]
        {
            None
        }
    })
    .as_ref()
}

/// The data caches of the machine kiln runs on, in bytes per cache instance (what one core
/// sees), as Linux reports them in `/sys/devices/system/cpu/cpu0/cache`. `None` where the
/// system does not say (another OS, a container hiding sysfs).
///
/// Hypervisors report what they like: a 2-vCPU VM on a Xeon here reports a 480 MiB L3 "shared
/// by 2 CPUs". Users of these sizes bound them (e.g. the streaming-store threshold of
/// [`crate::codegen::llvm::CodegenOptions`] takes at most 32 MiB of the last level).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CacheSizes {
    /// Level 1 data cache.
    pub l1d: Option<u64>,
    /// Level 2 (data or unified) cache.
    pub l2: Option<u64>,
    /// The last level (the highest level of data or unified cache listed; may be `l2`).
    pub last_level: Option<u64>,
}

/// The host's data cache sizes ([`CacheSizes`]), read once per process.
pub fn host_caches() -> CacheSizes {
    static CACHES: OnceLock<CacheSizes> = OnceLock::new();
    *CACHES.get_or_init(|| read_caches(std::path::Path::new("/sys/devices/system/cpu/cpu0/cache")))
}

/// Parses sysfs cache directories (`index0`, `index1`, ...: files `level`, `type`, `size` such
/// as `48K` or `32M`) under `dir`.
fn read_caches(dir: &std::path::Path) -> CacheSizes {
    let mut out = CacheSizes::default();
    let mut last: Option<(u32, u64)> = None;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
        let (Some(level), Some(ty), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        let Ok(level) = level.trim().parse::<u32>() else {
            continue;
        };
        if ty.trim() == "Instruction" {
            continue;
        }
        let Some(bytes) = parse_cache_size(size.trim()) else {
            continue;
        };
        match level {
            1 => out.l1d = Some(bytes),
            2 => out.l2 = Some(bytes),
            _ => {}
        }
        if last.is_none_or(|(l, _)| level > l) {
            last = Some((level, bytes));
        }
    }
    out.last_level = last.map(|(_, b)| b);
    out
}

/// `48K`, `2048K`, `32M`, `1G` or a plain byte count.
fn parse_cache_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1u64 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Whether LLVM's x86 CPU `name` has AVX-512 (`avx512f`): the CPUs of LLVM 14's x86 table
/// that do, and the `x86-64-v4` level. Unknown names are taken not to.
pub fn cpu_has_avx512(name: &str) -> bool {
    matches!(
        name,
        "knl"
            | "knm"
            | "skylake-avx512"
            | "skx"
            | "cascadelake"
            | "cooperlake"
            | "cannonlake"
            | "icelake-client"
            | "icelake-server"
            | "tigerlake"
            | "sapphirerapids"
            | "rocketlake"
            | "graniterapids"
            | "emeraldrapids"
            | "znver4"
            | "znver5"
            | "x86-64-v4"
    )
}

/// Whether the LLVM feature list `features` (`+avx2,-avx512f,...`) turns `name` on (`Some(true)`)
/// or off; `None` where it does not name it. The last word on a feature wins, as in LLVM.
pub fn feature_flag(features: &str, name: &str) -> Option<bool> {
    features
        .split(',')
        .rev()
        .find(|w| w.get(1..) == Some(name))
        .map(|w| w.starts_with('+'))
}

/// The widest vector register of LLVM's x86 CPU `name` with the LLVM feature list `features`
/// (`+avx2,-avx512f,...`; the last word on a feature wins), in bits: 512 with AVX-512F, 256
/// with AVX, 128 without (the CPUs of LLVM 14's x86 table that have no AVX, `x86-64` and
/// `x86-64-v2`, TVM's default). An unknown name without those features counts as AVX.
pub fn cpu_vector_bits(name: &str, features: &str) -> u32 {
    let feature = |f: &str| feature_flag(features, f);
    let by_name = if cpu_has_avx512(name) {
        512
    } else if matches!(
        name,
        "generic"
            | "x86-64"
            | "x86-64-v2"
            | "i686"
            | "pentium4"
            | "prescott"
            | "nocona"
            | "core2"
            | "penryn"
            | "bonnell"
            | "atom"
            | "silvermont"
            | "slm"
            | "goldmont"
            | "goldmont-plus"
            | "tremont"
            | "nehalem"
            | "corei7"
            | "westmere"
            | "k8"
            | "k8-sse3"
            | "opteron"
            | "opteron-sse3"
            | "athlon64"
            | "athlon64-sse3"
            | "amdfam10"
            | "barcelona"
            | "btver1"
    ) {
        128
    } else {
        256
    };
    match (feature("avx512f"), feature("avx")) {
        (Some(true), _) => 512,
        (_, Some(true)) => 256,
        (_, Some(false)) => 128,
        (Some(false), None) => by_name.min(256),
        (None, None) => by_name,
    }
}

/// Whether code for the `llvm` target `t` may use AVX-512: its `mcpu` (`native` = the host
/// CPU and its features) has it, unless `mattr` says `-avx512f`; or `mattr` says `+avx512f`.
pub fn has_avx512(t: &super::Target) -> bool {
    // `native` becomes the host's CPU name with its features ahead of `mattr`.
    let resolved = t.resolve_native().unwrap_or_else(|_| t.clone());
    let attrs = resolved.get_str_array("mattr").unwrap_or_default();
    // The last word on avx512f wins, as in LLVM's feature strings.
    match attrs
        .iter()
        .rev()
        .find(|a| a.get(1..) == Some("avx512f"))
        .map(String::as_str)
    {
        Some("+avx512f") => true,
        Some(_) => false,
        None => cpu_has_avx512(resolved.get_str("mcpu").unwrap_or("")),
    }
}

/// The per-core L2 cache size of LLVM's x86 CPU `name`, in bytes, for the CPUs whose size is
/// one figure across their parts (`None`: not known here).
pub fn cpu_l2_bytes(name: &str) -> Option<u64> {
    const K: u64 = 1 << 10;
    Some(match name {
        "haswell" | "broadwell" | "skylake" | "kabylake" | "coffeelake" | "sandybridge"
        | "ivybridge" | "x86-64-v3" => 256 * K,
        "znver1" | "znver2" | "znver3" | "cannonlake" | "icelake-client" => 512 * K,
        "skylake-avx512" | "skx" | "cascadelake" | "cooperlake" | "znver4" | "znver5"
        | "alderlake" | "x86-64-v4" => 1024 * K,
        "icelake-server" | "tigerlake" => 1280 * K,
        "sapphirerapids" | "emeraldrapids" | "graniterapids" | "raptorlake" => 2048 * K,
        "rocketlake" => 512 * K,
        _ => return None,
    })
}

/// The L2 size kernels for the `llvm` target `t` block for: the host's ([`host_caches`]), for
/// every CPU the target names; a named CPU's ([`cpu_l2_bytes`]) only where the host's cannot be
/// read; else 256 KiB (the smallest L2 of the x86 CPUs with AVX2).
///
/// `mcpu` chooses the instructions (and so the register tiles), the machine the kernels are
/// built on their cache blocking, as TVM's schedules are tuned on the machine they run on: code
/// built for `haswell` on a Zen 4 is portable AVX2 code blocked for the Zen 4's 1 MiB L2. (Built
/// that way, with the 256 KiB of a Haswell, the AVX2 matmul took `k` in passes and ran 10 % slower
/// on the Zen 4; on a Xeon with a 2 MiB L2 the two ran alike.) To block for another machine's
/// caches, build on it.
pub fn l2_bytes(t: &super::Target) -> u64 {
    const SMALLEST: u64 = 256 << 10;
    host_caches()
        .l2
        .or_else(|| t.get_str("mcpu").and_then(cpu_l2_bytes))
        .unwrap_or(SMALLEST)
}

/// The llvm/c canonicalizer: the default triple, Arm features.
///
/// `mcpu: native` is kept as written (as TVM 0.27 keeps it): a target string means the same
/// thing on every machine. It is resolved only where code is generated
/// ([`crate::codegen::llvm::CodegenOptions::resolved`]) and by
/// [`super::Target::resolve_native`].
fn canonicalize_llvm(c: &mut Config) -> TargetResult<()> {
    let is_llvm = c.get_str("kind") == Some("llvm");
    if is_llvm && !c.contains("mtriple") && !c.contains("mcpu") {
        c.set("mtriple", default_triple());
    }
    let mcpu = c.get_str("mcpu").map(str::to_string);
    let mtriple = c.get_str("mtriple").map(str::to_string);
    let mattr: Vec<String> = c
        .get_str_array("mattr")
        .map(<[_]>::to_vec)
        .unwrap_or_default();

    const M_BASE: [&str; 2] = ["cortex-m0", "cortex-m3"];
    const M_DSP: [&str; 6] = [
        "cortex-m55",
        "cortex-m4",
        "cortex-m7",
        "cortex-m33",
        "cortex-m35p",
        "cortex-m85",
    ];
    const M_MVE: [&str; 2] = ["cortex-m55", "cortex-m85"];
    let starts = |list: &[&str]| {
        mcpu.as_deref()
            .is_some_and(|m| list.iter().any(|p| m.starts_with(p)))
    };
    if starts(&M_BASE) || starts(&M_DSP) || starts(&M_MVE) {
        let has = |flag: &str| {
            mcpu.as_deref().is_some_and(|m| m.contains(flag))
                || mattr.iter().any(|a| a.contains(flag))
        };
        let (nomve, nodsp) = (has("+nomve"), has("+nodsp"));
        let (dsp, mve) = if starts(&M_MVE) && !nomve && !nodsp {
            (true, true)
        } else if starts(&M_DSP) && !nodsp {
            (true, false)
        } else {
            (false, false)
        };
        c.set("feature.has_dsp", dsp);
        c.set("feature.has_mve", mve);
        merge_arm_keys(c);
        return Ok(());
    }

    let Some(triple) = mtriple else { return Ok(()) };
    let is_aarch64 = triple.starts_with("aarch64");
    let is_mprofile_cpu = mcpu.as_deref().is_some_and(|m| m.starts_with("cortex-m"));
    let is_aarch32 = triple.starts_with("arm") && !is_mprofile_cpu;
    if !(is_aarch64 || is_aarch32) {
        return Ok(());
    }
    if is_llvm {
        let f = arm_features(&triple, mcpu.as_deref(), &mattr);
        c.set("feature.is_aarch64", is_aarch64);
        c.set("feature.has_asimd", f.neon);
        c.set("feature.has_sve", f.sve);
        c.set("feature.has_dotprod", f.dotprod);
        c.set("feature.has_matmul_i8", f.i8mm);
        c.set("feature.has_fp16_simd", f.fullfp16);
        c.set("feature.has_sme", f.sme);
    }
    merge_arm_keys(c);
    Ok(())
}

/// Existing keys plus `arm_cpu` and `cpu` if missing, or `[arm_cpu, cpu]`.
fn merge_arm_keys(c: &mut Config) {
    let mut keys: Vec<String> = c
        .get_str_array("keys")
        .map(<[_]>::to_vec)
        .unwrap_or_default();
    for k in ["arm_cpu", "cpu"] {
        if !keys.iter().any(|x| x == k) {
            keys.push(k.to_string());
        }
    }
    c.set("keys", keys);
}

/// The Arm features TVM reports.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ArmFeatures {
    /// Advanced SIMD (`neon`).
    pub neon: bool,
    /// `sve`.
    pub sve: bool,
    /// `dotprod`.
    pub dotprod: bool,
    /// `i8mm`.
    pub i8mm: bool,
    /// `fullfp16`.
    pub fullfp16: bool,
    /// `sme`.
    pub sme: bool,
}

/// The Arm features of (`triple`, `mcpu`, `mattr`), from LLVM's processor definitions.
///
/// LLVM's C API (all that inkwell reaches) cannot list a subtarget's implied features, so kiln
/// carries the relevant part of LLVM's AArch64/ARM processor table and feature implications
/// (`sve` ⇒ `fullfp16`, `v8.4a` ⇒ `dotprod`, `v8.6a` ⇒ `i8mm`, `v9a` ⇒ `sve`). The values are
/// host-dependent in TVM too (they follow the LLVM version).
pub fn arm_features(triple: &str, mcpu: Option<&str>, mattr: &[String]) -> ArmFeatures {
    let aarch64 = triple.starts_with("aarch64") || triple.starts_with("arm64");
    let mut f = ArmFeatures {
        // Every AArch64 CPU, generic included, has Advanced SIMD; 32-bit Arm needs +neon.
        neon: aarch64,
        ..ArmFeatures::default()
    };
    let cpu = mcpu.unwrap_or("generic");
    const NEON: &[&str] = &[
        "cortex-a5",
        "cortex-a7",
        "cortex-a8",
        "cortex-a9",
        "cortex-a12",
        "cortex-a15",
        "cortex-a17",
        "cortex-a32",
        "cortex-a34",
        "cortex-a35",
        "cortex-a53",
        "cortex-a57",
        "cortex-a72",
        "cortex-a73",
        "thunderx",
        "thunderxt81",
        "thunderxt83",
        "thunderxt88",
        "thunderx2t99",
        "thunderx3t110",
        "kryo",
        "falkor",
        "saphira",
        "cyclone",
        "apple-a7",
        "apple-a8",
        "apple-a9",
        "apple-a10",
        "exynos-m3",
        "swift",
        "krait",
    ];
    const FP16: &[&str] = &["carmel", "apple-a11", "apple-a12", "a64fx"];
    const DOT: &[&str] = &[
        "cortex-a55",
        "cortex-a65",
        "cortex-a65ae",
        "cortex-a75",
        "cortex-a76",
        "cortex-a76ae",
        "cortex-a77",
        "cortex-a78",
        "cortex-a78c",
        "cortex-x1",
        "cortex-x1c",
        "neoverse-n1",
        "neoverse-e1",
        "apple-a13",
        "apple-a14",
        "apple-m1",
        "exynos-m4",
        "exynos-m5",
        "tsv110",
    ];
    const SVE_I8MM: &[&str] = &[
        "neoverse-v1",
        "neoverse-512tvb",
        "neoverse-n2",
        "neoverse-v2",
        "neoverse-v3",
        "neoverse-n3",
        "cortex-a510",
        "cortex-a520",
        "cortex-a710",
        "cortex-a715",
        "cortex-a720",
        "cortex-x2",
        "cortex-x3",
        "cortex-x4",
    ];
    const I8MM: &[&str] = &[
        "apple-a15",
        "apple-a16",
        "apple-a17",
        "apple-m2",
        "apple-m3",
        "ampere1",
    ];
    if NEON.contains(&cpu) {
        f.neon = true;
    } else if FP16.contains(&cpu) {
        f.neon = true;
        f.fullfp16 = true;
        f.sve = cpu == "a64fx";
    } else if DOT.contains(&cpu) {
        f.neon = true;
        f.fullfp16 = true;
        f.dotprod = true;
    } else if SVE_I8MM.contains(&cpu) {
        f.neon = true;
        f.fullfp16 = true;
        f.dotprod = true;
        f.sve = aarch64;
        f.i8mm = true;
    } else if I8MM.contains(&cpu) {
        f.neon = true;
        f.fullfp16 = true;
        f.dotprod = true;
        f.i8mm = true;
    }
    for attr in mattr {
        let (on, name) = match attr.split_at_checked(1) {
            Some(("+", n)) => (true, n),
            Some(("-", n)) => (false, n),
            _ => continue,
        };
        if on {
            match name {
                "neon" | "simd" => f.neon = true,
                "fullfp16" | "fp16fml" => f.fullfp16 = true,
                "dotprod" => f.dotprod = true,
                "i8mm" => f.i8mm = true,
                "sme" | "sme2" | "sme-f64f64" | "sme-i16i64" => f.sme = true,
                n if n == "sve" || n.starts_with("sve2") => {
                    f.sve = true;
                    f.fullfp16 = true;
                }
                n => {
                    if let Some(ver) = n.strip_prefix('v').and_then(|v| v.strip_suffix('a')) {
                        let (major, minor) = match ver.split_once('.') {
                            Some((a, b)) => (a.parse().unwrap_or(0), b.parse().unwrap_or(0)),
                            None => (ver.parse().unwrap_or(0), 0),
                        };
                        let v: (u32, u32) = (major, minor);
                        if v >= (8, 0) {
                            f.neon |= aarch64;
                        }
                        if v >= (8, 4) || v >= (9, 0) {
                            f.dotprod = true;
                        }
                        if v >= (8, 6) || v >= (9, 1) {
                            f.i8mm = true;
                        }
                        if v >= (9, 0) {
                            f.sve = true;
                            f.fullfp16 = true;
                        }
                    }
                }
            }
        } else {
            match name {
                "neon" | "simd" => {
                    f.neon = false;
                    f.dotprod = false;
                    f.i8mm = false;
                }
                "fullfp16" => {
                    f.fullfp16 = false;
                    f.sve = false;
                }
                "dotprod" => f.dotprod = false,
                "i8mm" => f.i8mm = false,
                "sve" => f.sve = false,
                "sme" => f.sme = false,
                _ => {}
            }
        }
    }
    f
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("48K"), Some(48 << 10));
        assert_eq!(parse_cache_size("32M"), Some(32 << 20));
        assert_eq!(parse_cache_size("1G"), Some(1 << 30));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size(""), None);
        assert_eq!(parse_cache_size("12Q"), None);
    }

    #[test]
    fn cache_directories_give_l1d_l2_and_the_last_level() {
        let dir = std::env::temp_dir().join(format!("kiln-caches-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (i, level, ty, size) in [
            (0, "1", "Data", "48K"),
            (1, "1", "Instruction", "64K"),
            (2, "2", "Unified", "2048K"),
            (3, "3", "Unified", "32M"),
        ] {
            let d = dir.join(format!("index{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("type"), format!("{ty}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        let c = read_caches(&dir);
        assert_eq!(c.l1d, Some(48 << 10));
        assert_eq!(c.l2, Some(2 << 20));
        assert_eq!(c.last_level, Some(32 << 20));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(read_caches(&dir), CacheSizes::default());
    }
}
