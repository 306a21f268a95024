//! [`CodegenOptions`]: what the LLVM backend compiles for, from a target or the host.

use super::*;

/// What the LLVM backend compiles for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CodegenOptions {
    /// The LLVM target triple (`x86_64-unknown-linux-gnu`).
    pub triple: String,
    /// The CPU (`znver3`, `generic`); `native` is resolved to the host CPU.
    pub cpu: String,
    /// Features (`+avx2,+fma`), comma-separated; with `native` CPU, the host's.
    pub features: String,
    /// 0 to 3.
    pub opt_level: u32,
    /// Fast-math flags for every floating-point instruction: `""` (IEEE), or e.g. `"fast"`.
    pub fast_math: String,
    /// The DLPack device type arguments must be on (1 = CPU).
    pub device_type: i32,
    /// The device's name in messages.
    pub device_name: String,
    /// Whether this is the host code of a device target (`opencl`): tensors hold device
    /// handles, and each thread-bound loop nest is launched as a device kernel through the
    /// device runtime (`kiln::runtime::device_module`). `false` for CPU code.
    pub device_host: bool,
    /// With `device_host`: the `kiln-device/1` metadata (device source and kernel table) an
    /// exported library embeds as `__kiln_device_meta`.
    pub device_meta: Option<String>,
    /// Outputs written once of at least this many bytes are written with non-temporal
    /// (streaming) stores; `None`: never. x86 only ([`stream`] has the rule and the default,
    /// [`stream::stream_store_threshold`]).
    pub stream_store_bytes: Option<u64>,
}

impl CodegenOptions {
    /// The host: default triple, host CPU and features, O3, IEEE floats, CPU device.
    pub fn host() -> Self {
        init_llvm();
        CodegenOptions {
            triple: TargetMachine::get_default_triple()
                .as_str()
                .to_string_lossy()
                .into_owned(),
            cpu: TargetMachine::get_host_cpu_name().to_string(),
            features: TargetMachine::get_host_cpu_features().to_string(),
            opt_level: 3,
            fast_math: String::new(),
            device_type: 1,
            device_name: "cpu".into(),
            device_host: false,
            device_meta: None,
            stream_store_bytes: stream::stream_store_threshold(
                TargetMachine::get_default_triple()
                    .as_str()
                    .to_str()
                    .unwrap_or(""),
            ),
        }
    }

    /// The options a target asks for: `mtriple` (default: the host triple), `mcpu` (default
    /// `generic`, as TVM; `native` is the host), `mattr`, `opt-level` (default 3), the
    /// `fast-math*` flags (multiply-add contraction on unless `"fast-math-contract": false`,
    /// as TVM), and the kind's device type.
    ///
    /// # Errors
    /// An `opt-level` outside 0..=3.
    pub fn from_target(t: &crate::target::Target) -> R<Self> {
        init_llvm();
        let triple = match t.get_str("mtriple") {
            Some(s) if !s.is_empty() => s.to_owned(),
            _ => TargetMachine::get_default_triple()
                .as_str()
                .to_string_lossy()
                .into_owned(),
        };
        let cpu = t
            .get_str("mcpu")
            .filter(|s| !s.is_empty())
            .unwrap_or("generic")
            .to_owned();
        check_cpu(&triple, &cpu)?;
        let features = t
            .get_str_array("mattr")
            .map(|a| a.join(","))
            .unwrap_or_default();
        let opt_level = match t.get_int("opt-level") {
            None => 3,
            Some(l @ 0..=3) => l as u32,
            Some(l) => {
                return Err(CodegenError::Unsupported(format!(
                    "target option `opt-level` expects 0 to 3, found {l}"
                )))
            }
        };
        let fast_math = if t.get_bool("fast-math") == Some(true) {
            "fast".to_owned()
        } else {
            // Multiply-add contraction is allowed unless the target says
            // `"fast-math-contract": false`: TVM 0.27 creates its LLVM target machine with
            // `AllowFPOpFusion = Fast`, so its code fuses `a * b + c` into an FMA without any
            // option; kiln marks every float operation `contract`, which lets LLVM do the
            // same (docs/ir.md, "Floating-point contraction").
            let contract = t.get_bool("fast-math-contract") != Some(false);
            ["nnan", "ninf", "nsz", "arcp", "contract", "reassoc"]
                .iter()
                .filter(|f| {
                    t.get_bool(&format!("fast-math-{f}")) == Some(true)
                        || (**f == "contract" && contract)
                })
                .copied()
                .collect::<Vec<_>>()
                .join(" ")
        };
        let device_type = t.device_type();
        let device_name = if device_type == 1 {
            "cpu".to_owned()
        } else {
            t.kind_name().to_owned()
        };
        let stream_store_bytes = stream::stream_store_threshold(&triple);
        Ok(CodegenOptions {
            triple,
            cpu,
            features,
            opt_level,
            fast_math,
            device_type,
            device_name,
            device_host: false,
            device_meta: None,
            stream_store_bytes,
        })
    }

    /// Resolves `native` to the host CPU name and features (the host's LLVM features sorted by
    /// name, then the features given), as [`crate::target::Target::resolve_native`] does: the
    /// options of a `native` target and of its resolved form are equal.
    pub fn resolved(mut self) -> Self {
        if self.cpu == "native" {
            init_llvm();
            // Asked once per process: LLVM reads them with `cpuid`, which traps in a VM.
            if let Some((cpu, host)) = crate::target::host_cpu() {
                let host = host.join(",");
                self.cpu = cpu.clone();
                self.features = if self.features.is_empty() {
                    host
                } else {
                    format!("{host},{}", self.features)
                };
            }
        }
        if self.cpu.is_empty() {
            self.cpu = "generic".into();
        }
        self
    }

    /// The widest vector register the code may use, in bits, for vector widths kiln picks
    /// itself: on x86 the CPU's ([`crate::target::cpu_vector_bits`]; call on resolved
    /// options), 128 on other CPUs (NEON).
    pub fn vector_register_bits(&self) -> u32 {
        if super::is_x86(&self.triple) {
            crate::target::cpu_vector_bits(&self.cpu, &self.features)
        } else {
            128
        }
    }

    /// What code built with these options gets, in one line for people: the CPU (`native`
    /// resolved), its vector ISA, the floating-point rule and the streaming-store threshold,
    /// e.g. `cpu rocketlake (native), AVX-512; float: a*b+c fused to FMA (contraction on),
    /// otherwise IEEE; streaming stores for outputs of 32 MiB or more`.
    pub fn describe(&self) -> String {
        let r = self.clone().resolved();
        let native = if self.cpu == "native" {
            " (native)"
        } else {
            ""
        };
        let feature = |name: &str| crate::target::feature_flag(&r.features, name);
        let x86 = super::is_x86(&r.triple);
        let isa = if !x86 {
            String::new()
        } else if feature("avx512f").unwrap_or_else(|| crate::target::cpu_has_avx512(&r.cpu)) {
            ", AVX-512".to_owned()
        } else if feature("avx2") == Some(true) || r.cpu == "haswell" || r.cpu.starts_with("znver")
        {
            ", AVX2".to_owned()
        } else if feature("avx2") == Some(false) {
            ", no AVX2".to_owned()
        } else {
            String::new()
        };
        let flags: Vec<&str> = r.fast_math.split_whitespace().collect();
        let float = if flags.contains(&"fast") {
            "fast math (every LLVM fast-math flag)".to_owned()
        } else if flags.is_empty() {
            "IEEE, no contraction".to_owned()
        } else if flags == ["contract"] {
            "a*b+c fused to FMA (contraction on), otherwise IEEE".to_owned()
        } else {
            format!("fast-math flags `{}`", flags.join(" "))
        };
        let streaming = match r.stream_store_bytes {
            None => "no streaming stores".to_owned(),
            Some(b) if b >= 1 << 20 && b % (1 << 20) == 0 => {
                format!("streaming stores for outputs of {} MiB or more", b >> 20)
            }
            Some(b) => format!("streaming stores for outputs of {b} bytes or more"),
        };
        format!("cpu {}{native}{isa}; float: {float}; {streaming}", r.cpu)
    }

    pub(super) fn llvm_opt(&self) -> OptimizationLevel {
        match self.opt_level {
            0 => OptimizationLevel::None,
            1 => OptimizationLevel::Less,
            2 => OptimizationLevel::Default,
            _ => OptimizationLevel::Aggressive,
        }
    }
}

/// The x86-64 CPUs LLVM 14 knows (`llc -mtriple=x86_64 -mcpu=help`), less those without 64-bit
/// mode. kiln links LLVM 14, so this list is fixed with it.
const X86_64_CPUS: &[&str] = &[
    "alderlake",
    "amdfam10",
    "athlon-fx",
    "athlon64",
    "athlon64-sse3",
    "atom",
    "barcelona",
    "bdver1",
    "bdver2",
    "bdver3",
    "bdver4",
    "bonnell",
    "broadwell",
    "btver1",
    "btver2",
    "cannonlake",
    "cascadelake",
    "cooperlake",
    "core-avx-i",
    "core-avx2",
    "core2",
    "corei7",
    "corei7-avx",
    "generic",
    "goldmont",
    "goldmont-plus",
    "haswell",
    "icelake-client",
    "icelake-server",
    "ivybridge",
    "k8",
    "k8-sse3",
    "knl",
    "knm",
    "nehalem",
    "nocona",
    "opteron",
    "opteron-sse3",
    "penryn",
    "rocketlake",
    "sandybridge",
    "sapphirerapids",
    "silvermont",
    "skx",
    "skylake",
    "skylake-avx512",
    "slm",
    "tigerlake",
    "tremont",
    "westmere",
    "x86-64",
    "x86-64-v2",
    "x86-64-v3",
    "x86-64-v4",
    "znver1",
    "znver2",
    "znver3",
];

/// The x86 CPUs LLVM 14 knows that have no 64-bit mode: code for an x86-64 triple with one of
/// them makes LLVM abort the process ("64-bit code requested on a subtarget that doesn't
/// support it"), so kiln refuses them first.
const X86_32_ONLY_CPUS: &[&str] = &[
    "athlon",
    "athlon-4",
    "athlon-mp",
    "athlon-tbird",
    "athlon-xp",
    "c3",
    "c3-2",
    "geode",
    "i386",
    "i486",
    "i586",
    "i686",
    "k6",
    "k6-2",
    "k6-3",
    "lakemont",
    "pentium",
    "pentium-m",
    "pentium-mmx",
    "pentium2",
    "pentium3",
    "pentium3m",
    "pentium4",
    "pentium4m",
    "pentiumpro",
    "prescott",
    "winchip-c6",
    "winchip2",
    "yonah",
];

/// Refuses an x86-64 `mcpu` LLVM 14 does not know or cannot generate 64-bit code for: LLVM
/// would ignore an unknown name with a warning on stderr, give the subtarget no features (not
/// even 64-bit mode) and abort the process when it emits code. Other triples are LLVM's to
/// check.
fn check_cpu(triple: &str, cpu: &str) -> R<()> {
    let x86_64 = triple.starts_with("x86_64") || triple.starts_with("amd64");
    if !x86_64 || cpu == "native" || X86_64_CPUS.contains(&cpu) {
        return Ok(());
    }
    if X86_32_ONLY_CPUS.contains(&cpu) {
        return Err(CodegenError::Unsupported(format!(
            "target option `mcpu`: `{cpu}` is a 32-bit x86 CPU, which has no code for the \
             64-bit triple `{triple}`; name a 64-bit CPU (e.g. `x86-64`, `haswell`) or `native`"
        )));
    }
    let mut near: Vec<(usize, &str)> = X86_64_CPUS
        .iter()
        .map(|c| (crate::util::edit_distance(cpu, c), *c))
        .filter(|(d, _)| *d <= 3)
        .collect();
    near.sort();
    let hint = match near.first() {
        Some((_, c)) => format!("did you mean `{c}`? "),
        None => String::new(),
    };
    Err(CodegenError::Unsupported(format!(
        "target option `mcpu`: `{cpu}` is not an x86-64 CPU that kiln's LLVM (14) knows; \
         {hint}`native` is this machine's CPU as LLVM 14 sees it, and the known CPUs are: {}",
        X86_64_CPUS.join(", ")
    )))
}
