//! Device modules: the device half of a compiled module or a loaded library, and the table of
//! backends that load device code.
//!
//! A module compiled for a device target (e.g. `opencl`) has two halves: host code (LLVM)
//! that checks the arguments and runs the host part of each function, and device code (e.g.
//! OpenCL C) holding the kernels. The host code launches kernel `k` by calling the context
//! slot `__KilnDeviceLaunch` ([`super::launch`]) with the module's *device module* (the slot
//! `__kiln_device_module`): a [`DeviceModule`], which knows each kernel's name and parameters,
//! and forwards the launch to the backend's [`KernelLauncher`] (which builds the device code on
//! first use and enqueues the kernel on the current stream of the device).
//!
//! ```text
//! host fn f(A, B, n)          DeviceModule { kernels: [f_kernel0(A: float32*, n: int32)], launcher }
//!   checks arguments                  ▲
//!   launch(k=0, dev, args, grid, block) ──► kiln_device_launch ──► launcher.launch(dev, "f_kernel0", ...)
//! ```
//!
//! A library exported by `kiln build` carries the device code and kernel table as the
//! constant `__kiln_device_meta` (JSON, format `kiln-device/1`); kiln's loader reads it,
//! creates the device module through the [`KernelLoader`] registered for its kind
//! ([`register_kernel_loader`]; the built-in backends are in one table, [`BUILTIN_LOADERS`])
//! and fills the two slots. The JIT path makes its device module the same way
//! ([`DeviceModule::load`]), so a compiled module and its exported library run the same code.
//! A host that does not fill the slots (plain C, tvm_ffi alone) gets a `RuntimeError` naming
//! what is missing, never a crash.
//!
//! Every argument is checked before the backend sees it: the launcher is told, for each
//! buffer, the bytes the host's shape checks vouch for, and refuses a handle that is not a live
//! allocation of that size on that device.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock, RwLock};

use serde_json::{json, Value};

use crate::device_api::kernel::{
    KernelArg, KernelInfo, KernelLauncher, KernelLoader, KernelParamKind,
};
use crate::device_api::DevicePtr;
use crate::packed_func::DLDataType;

/// The device half of a compiled module: the kernel table and the backend that runs them.
pub struct DeviceModule {
    kind: String,
    source: String,
    kernels: Vec<KernelInfo>,
    launcher: Box<dyn KernelLauncher>,
    formats: &'static [&'static str],
}

impl std::fmt::Debug for DeviceModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceModule")
            .field("kind", &self.kind)
            .field("kernels", &self.kernels)
            .finish()
    }
}

/// The raw form of one launch argument in generated code: `{value, extra}` (a buffer's handle
/// and byte span, or a scalar's bits and 0).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawKernelArg {
    /// The handle, or the scalar's bits (zero- or sign-extended).
    pub value: u64,
    /// The buffer's byte span (0 for scalars).
    pub extra: u64,
}

impl DeviceModule {
    /// A device module of `kind` (`opencl`) over `source`, with these kernels.
    pub fn new(
        kind: &str,
        source: String,
        kernels: Vec<KernelInfo>,
        launcher: Box<dyn KernelLauncher>,
    ) -> Self {
        DeviceModule {
            kind: kind.to_owned(),
            source,
            kernels,
            launcher,
            formats: &[],
        }
    }

    /// The device module of `source` (device code of target kind `kind`) with these kernels,
    /// its launcher made by the loader registered for `kind`.
    ///
    /// # Errors
    /// No loader for `kind` in this kiln, and the loader's errors.
    pub fn load(kind: &str, source: String, kernels: Vec<KernelInfo>) -> Result<Self, String> {
        let b = kernel_backend(kind)
            .ok_or_else(|| format!("no device runtime for `{kind}` kernels in this kiln"))?;
        let launcher = (b.load)(&source, &kernels)?;
        Ok(DeviceModule {
            kind: kind.to_owned(),
            source,
            kernels,
            launcher,
            formats: b.source_formats,
        })
    }

    /// The device code.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The names of its source besides its kind (`cl` for `opencl`); the first is the file
    /// extension of the source.
    pub fn source_formats(&self) -> &'static [&'static str] {
        self.formats
    }

    /// Whether `get_source(format)` means this module's device source: the kind's name or one
    /// of its source formats.
    pub fn answers(&self, format: &str) -> bool {
        format == self.kind || self.formats.contains(&format)
    }

    /// The target kind it was compiled for.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The kernels.
    pub fn kernels(&self) -> &[KernelInfo] {
        &self.kernels
    }

    /// Launches kernel number `kernel` from raw arguments (what generated code passes).
    ///
    /// # Errors
    /// An unknown kernel index, a wrong argument count, negative or oversized extents, and the
    /// launcher's errors.
    pub fn launch_raw(
        &self,
        kernel: usize,
        device_id: i32,
        args: &[RawKernelArg],
        grid: [i64; 3],
        block: [i64; 3],
    ) -> Result<(), String> {
        let k = self.kernels.get(kernel).ok_or_else(|| {
            format!(
                "device module has {} kernels, kernel #{kernel} was launched (a kiln bug)",
                self.kernels.len()
            )
        })?;
        if args.len() != k.params.len() {
            return Err(format!(
                "kernel `{}` takes {} arguments, {} were passed (a kiln bug)",
                k.name,
                k.params.len(),
                args.len()
            ));
        }
        let device_id = usize::try_from(device_id)
            .map_err(|_| format!("kernel `{}`: device id {device_id} is negative", k.name))?;
        let mut global = [1usize; 3];
        let mut local = [1usize; 3];
        for a in 0..3 {
            let axis = ["x", "y", "z"][a];
            let (g, b) = (grid[a], block[a]);
            if g <= 0 || b <= 0 {
                // An empty launch runs nothing, like a loop with no iteration.
                return Ok(());
            }
            let total = g.checked_mul(b).and_then(|t| usize::try_from(t).ok());
            global[a] = total.ok_or_else(|| {
                format!(
                    "kernel `{}`: blockIdx.{axis} {g} × threadIdx.{axis} {b} work-items overflow",
                    k.name
                )
            })?;
            local[a] = b as usize;
        }
        // Up to 8 arguments are converted on the stack: no allocation per launch.
        const INLINE: usize = 8;
        let mut inline = [KernelArg::Scalar {
            bytes: [0; 8],
            size: 0,
        }; INLINE];
        let mut heap = Vec::new();
        let out: &mut [KernelArg] = if args.len() <= INLINE {
            &mut inline[..args.len()]
        } else {
            heap.resize(args.len(), inline[0]);
            &mut heap
        };
        for ((o, p), a) in out.iter_mut().zip(&k.params).zip(args) {
            *o = match p {
                KernelParamKind::Buffer(_) => KernelArg::Buffer {
                    ptr: DevicePtr::from_raw(a.value as usize as *const c_void),
                    min_bytes: a.extra,
                },
                KernelParamKind::Scalar(_) => KernelArg::Scalar {
                    bytes: a.value.to_le_bytes(),
                    size: p.arg_size(),
                },
            };
        }
        self.launcher
            .launch(device_id, &k.name, out, global, local)
            .map_err(|e| format!("launching kernel `{}`: {e}", k.name))
    }

    /// The `kiln-device/1` JSON that an exported library embeds as `__kiln_device_meta`.
    pub fn meta_json(kind: &str, source: &str, kernels: &[KernelInfo]) -> String {
        let ks: Vec<Value> = kernels
            .iter()
            .map(|k| {
                let ps: Vec<Value> = k
                    .params
                    .iter()
                    .map(|p| match p {
                        KernelParamKind::Buffer(t) => json!({"buffer": t.to_string()}),
                        KernelParamKind::Scalar(t) => json!({"scalar": t.to_string()}),
                    })
                    .collect();
                let mut k_json = json!({"name": k.name, "params": ps});
                if k.dyn_shared_bytes > 0 {
                    k_json["dyn_shared_bytes"] = json!(k.dyn_shared_bytes);
                }
                k_json
            })
            .collect();
        json!({"format": "kiln-device/1", "kind": kind, "source": source, "kernels": ks})
            .to_string()
    }

    /// Reads `kiln-device/1` JSON: `(kind, source, kernels)`.
    ///
    /// # Errors
    /// Anything malformed, with what was expected.
    pub fn parse_meta(text: &str) -> Result<(String, String, Vec<KernelInfo>), String> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| format!("device metadata is not JSON: {e}"))?;
        if v.get("format").and_then(Value::as_str) != Some("kiln-device/1") {
            return Err(format!(
                "device metadata: expected format `kiln-device/1`, found {}",
                v.get("format").unwrap_or(&Value::Null)
            ));
        }
        let s = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| format!("device metadata: `{k}` must be a string"))
        };
        let (kind, source) = (s("kind")?, s("source")?);
        let mut kernels = Vec::new();
        for k in v
            .get("kernels")
            .and_then(Value::as_array)
            .ok_or("device metadata: `kernels` must be an array")?
        {
            let name = k
                .get("name")
                .and_then(Value::as_str)
                .ok_or("device metadata: a kernel has no `name`")?;
            let mut params = Vec::new();
            for p in k
                .get("params")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("device metadata: kernel `{name}` has no `params`"))?
            {
                let (is_buf, t) = match (p.get("buffer"), p.get("scalar")) {
                    (Some(t), None) => (true, t),
                    (None, Some(t)) => (false, t),
                    _ => return Err(format!("device metadata: kernel `{name}`: a parameter must be {{\"buffer\": T}} or {{\"scalar\": T}}, found {p}")),
                };
                let t = t
                    .as_str()
                    .and_then(DLDataType::parse)
                    .filter(|t| t.lanes == 1 && matches!(t.bits, 8 | 16 | 32 | 64))
                    .ok_or_else(|| format!("device metadata: kernel `{name}`: bad type {t}"))?;
                params.push(if is_buf {
                    KernelParamKind::Buffer(t)
                } else {
                    KernelParamKind::Scalar(t)
                });
            }
            let dyn_shared_bytes = match k.get("dyn_shared_bytes") {
                None => 0,
                Some(n) => n.as_u64().ok_or_else(|| {
                    format!("device metadata: kernel `{name}`: `dyn_shared_bytes` must be a non-negative integer, found {n}")
                })?,
            };
            kernels.push(KernelInfo {
                name: name.to_owned(),
                params,
                dyn_shared_bytes,
            });
        }
        Ok((kind, source, kernels))
    }
}

/// A device-code backend of the runtime: the target kind whose code it loads, the names of
/// that code (`get_source` formats; the first is its file extension), and its loader.
#[derive(Debug, Clone, Copy)]
pub struct KernelBackend {
    /// The target kind (`opencl`), also the device module's kind.
    pub kind: &'static str,
    /// The formats `get_source` answers with the device source (`cl`); the first is the file
    /// extension an export writes it to.
    pub source_formats: &'static [&'static str],
    /// Makes the launcher of one source.
    pub load: KernelLoader,
}

/// The backends kiln builds in that load device code, by target kind: adding a device
/// backend with kernels adds one line here.
pub const BUILTIN_LOADERS: &[KernelBackend] = &[
    KernelBackend {
        kind: "opencl",
        source_formats: &["cl"],
        load: crate::device_api::opencl::load_kernels,
    },
    KernelBackend {
        kind: "cuda",
        source_formats: &["ptx"],
        load: crate::device_api::cuda::load_kernels,
    },
];

fn loaders() -> &'static RwLock<BTreeMap<String, KernelBackend>> {
    static L: OnceLock<RwLock<BTreeMap<String, KernelBackend>>> = OnceLock::new();
    L.get_or_init(|| {
        let m = BUILTIN_LOADERS
            .iter()
            .map(|b| (b.kind.to_owned(), *b))
            .collect();
        RwLock::new(m)
    })
}

/// Registers how device code of a kind is loaded (a backend of your own; kiln's are in
/// [`BUILTIN_LOADERS`]). A later registration for the same kind replaces the earlier one.
pub fn register_kernel_loader(backend: KernelBackend) {
    loaders()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(backend.kind.to_owned(), backend);
}

/// The registered backend of `kind`.
pub fn kernel_backend(kind: &str) -> Option<KernelBackend> {
    loaders()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(kind)
        .copied()
}

/// The device module described by `meta` (`kiln-device/1` JSON).
///
/// # Errors
/// Malformed metadata, or no loader for its kind.
pub fn load_device_module(meta: &str) -> Result<Arc<DeviceModule>, String> {
    let (kind, source, kernels) = DeviceModule::parse_meta(meta)?;
    DeviceModule::load(&kind, source, kernels).map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_api::DeviceResult;
    use std::sync::Mutex;

    /// One recorded launch: device id, kernel, arguments, global and local sizes.
    type Launch = (usize, String, Vec<KernelArg>, [usize; 3], [usize; 3]);

    /// A launcher that records what it was asked to launch.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<Launch>>);

    impl KernelLauncher for Arc<Recorder> {
        fn launch(
            &self,
            device_id: usize,
            name: &str,
            args: &[KernelArg],
            global: [usize; 3],
            local: [usize; 3],
        ) -> DeviceResult<()> {
            crate::util::lock(&self.0).push((device_id, name.into(), args.to_vec(), global, local));
            Ok(())
        }
    }

    fn t(s: &str) -> DLDataType {
        DLDataType::parse(s).unwrap()
    }

    fn module() -> (DeviceModule, Arc<Recorder>) {
        let rec = Arc::new(Recorder::default());
        let k = KernelInfo {
            dyn_shared_bytes: 0,
            name: "f_kernel0".into(),
            params: vec![
                KernelParamKind::Buffer(t("float32")),
                KernelParamKind::Scalar(t("bool")),
                KernelParamKind::Scalar(t("int16")),
            ],
        };
        (
            DeviceModule::new("test", "src".into(), vec![k], Box::new(rec.clone())),
            rec,
        )
    }

    fn raw(value: u64, extra: u64) -> RawKernelArg {
        RawKernelArg { value, extra }
    }

    #[test]
    fn raw_launches_become_checked_launches_with_dlpack_sizes() {
        let (m, rec) = module();
        let args = [raw(0x1000, 64), raw(1, 0), raw(7, 0)];
        m.launch_raw(0, 2, &args, [3, 1, 1], [32, 1, 1]).unwrap();
        let calls = crate::util::lock(&rec.0);
        let (dev, name, a, global, local) = &calls[0];
        assert_eq!(
            (*dev, name.as_str(), *global, *local),
            (2, "f_kernel0", [96, 1, 1], [32, 1, 1])
        );
        assert!(matches!(a[0], KernelArg::Buffer { min_bytes: 64, .. }));
        // bool is passed as a 4-byte int, int16 as 2 bytes.
        assert!(matches!(a[1], KernelArg::Scalar { size: 4, .. }));
        assert!(matches!(a[2], KernelArg::Scalar { size: 2, .. }));
    }

    #[test]
    fn bad_raw_launches_are_errors_that_say_what_is_wrong() {
        let (m, rec) = module();
        let args = [raw(0x1000, 64), raw(1, 0), raw(7, 0)];
        let e = m.launch_raw(1, 0, &args, [1; 3], [1; 3]).unwrap_err();
        assert!(e.contains("has 1 kernels, kernel #1 was launched"), "{e}");
        let e = m.launch_raw(0, 0, &args[..2], [1; 3], [1; 3]).unwrap_err();
        assert!(
            e.contains("`f_kernel0` takes 3 arguments, 2 were passed"),
            "{e}"
        );
        let e = m.launch_raw(0, -1, &args, [1; 3], [1; 3]).unwrap_err();
        assert!(e.contains("device id -1 is negative"), "{e}");
        let e = m
            .launch_raw(0, 0, &args, [i64::MAX, 1, 1], [2, 1, 1])
            .unwrap_err();
        assert!(
            e.contains("blockIdx.x 9223372036854775807 × threadIdx.x 2 work-items overflow"),
            "{e}"
        );
        // An empty grid runs nothing, like a loop without iterations.
        m.launch_raw(0, 0, &args, [0, 1, 1], [32, 1, 1]).unwrap();
        assert!(crate::util::lock(&rec.0).is_empty());
    }

    #[test]
    fn dynamic_shared_memory_is_in_the_metadata_only_when_used() {
        let k = |n| KernelInfo {
            name: "k".into(),
            params: vec![],
            dyn_shared_bytes: n,
        };
        let none = DeviceModule::meta_json("cuda", "", &[k(0)]);
        assert!(!none.contains("dyn_shared_bytes"), "{none}");
        let some = DeviceModule::meta_json("cuda", "", &[k(65536)]);
        let (_, _, back) = DeviceModule::parse_meta(&some).unwrap();
        assert_eq!(back, vec![k(65536)]);
    }

    #[test]
    fn metadata_reads_back_what_it_writes() {
        let (m, _) = module();
        let text = DeviceModule::meta_json("opencl", "kernel src", m.kernels());
        let (kind, source, kernels) = DeviceModule::parse_meta(&text).unwrap();
        assert_eq!((kind.as_str(), source.as_str()), ("opencl", "kernel src"));
        assert_eq!(kernels, m.kernels());
    }

    #[test]
    fn malformed_metadata_is_refused_with_what_was_expected() {
        let ok = |params: &str| {
            format!(
                r#"{{"format": "kiln-device/1", "kind": "opencl", "source": "", "kernels": [{{"name": "k", "params": {params}}}]}}"#
            )
        };
        for (text, want) in [
            ("not json".to_owned(), "device metadata is not JSON"),
            (
                r#"{"format": "kiln-device/2"}"#.to_owned(),
                "expected format `kiln-device/1`, found \"kiln-device/2\"",
            ),
            (
                r#"{"format": "kiln-device/1", "kind": 4}"#.to_owned(),
                "`kind` must be a string",
            ),
            (
                r#"{"format": "kiln-device/1", "kind": "opencl", "source": ""}"#.to_owned(),
                "`kernels` must be an array",
            ),
            (
                ok(r#"[{"buffer": "float33"}]"#),
                "kernel `k`: bad type \"float33\"",
            ),
            (
                ok(r#"[{"scalar": "float32x4"}]"#),
                "kernel `k`: bad type \"float32x4\"",
            ),
            (
                ok(r#"[{"buffer": "float32", "scalar": "int32"}]"#),
                "a parameter must be {\"buffer\": T} or {\"scalar\": T}",
            ),
            (ok("3"), "kernel `k` has no `params`"),
            (
                r#"{"format": "kiln-device/1", "kind": "cuda", "source": "", "kernels": [{"name": "k", "params": [], "dyn_shared_bytes": -1}]}"#.to_owned(),
                "kernel `k`: `dyn_shared_bytes` must be a non-negative integer, found -1",
            ),
        ] {
            let e = DeviceModule::parse_meta(&text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        let meta = DeviceModule::meta_json("nosuchkind", "", &[]);
        let e = load_device_module(&meta).unwrap_err();
        assert!(
            e.contains("no device runtime for `nosuchkind` kernels"),
            "{e}"
        );
    }
}
