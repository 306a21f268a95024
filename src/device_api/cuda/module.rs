//! [`CudaModule`]: PTX text loaded lazily per device, and kernel launches on the calling
//! thread's current stream, checked before the driver sees them.
//!
//! The PTX is loaded (`cuModuleLoadDataEx`: the driver JIT-compiles it for the device) once per
//! device, on the first launch there (or [`CudaModule::load`]); the result, success or failure
//! (with the JIT's log), is cached, so broken PTX is not recompiled on every launch. Functions
//! are looked up once per device and name, with the attributes launches are checked against.
//!
//! Every launch is checked first: the kernel is in the module's kernel table, the arguments
//! match its parameters (count, buffer or scalar, scalar size), each buffer is a live allocation
//! of that device holding `min_bytes`, the block and grid fit the device's limits
//! (`MAX_BLOCK_DIM_*`, `MAX_THREADS_PER_BLOCK`, `MAX_GRID_DIM_*`) and the function's (its
//! `MAX_THREADS_PER_BLOCK`), and its shared memory (the kernel table's `dyn_shared_bytes` plus
//! the function's static shared memory) fits the device's opt-in limit. Kernels with 48 KiB of
//! dynamic shared memory or more opt in once per function
//! (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`; apache/tvm#11478). The PTX itself is read
//! when the module is made: each kernel of the table must be an `.entry` with as many
//! parameters, none over 8 bytes, because `cuLaunchKernel` reads one value per parameter of
//! the entry, of the entry's size, and kiln passes 8-byte values.
//!
//! A kernel that faults (an illegal address) does so asynchronously: the launch succeeds, and
//! the next synchronization reports the sticky error, after which the device fails every call
//! (see the backend's module docs).
//!
//! Dropping a module waits for its device's work (`cuCtxSynchronize`, unless the device
//! faulted) and unloads it from every device it was loaded on.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

use super::{sys, CudaDeviceApi};
use crate::device_api::api::{noted, DeviceApi};
use crate::device_api::device::{Device, DeviceType};
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::util::lock;

pub use crate::device_api::kernel::KernelArg;
use crate::device_api::kernel::{KernelInfo, KernelLauncher, KernelParamKind};

use sys::func_attr;

/// Arguments converted on the stack, without allocating per launch.
const INLINE_ARGS: usize = 16;

/// A function of a loaded module, with what launches are checked against.
struct FuncEntry {
    func: sys::Function,
    /// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`.
    max_threads: u64,
    /// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`.
    static_shared: u64,
    /// The result of opting in to the kernel's dynamic shared memory (once per function).
    opt_in: OnceLock<DeviceResult<()>>,
}

/// The module loaded on one device.
struct Loaded {
    module: sys::Module,
    functions: Mutex<HashMap<String, Arc<FuncEntry>, foldhash::fast::RandomState>>,
}

type LoadSlot = Arc<OnceLock<DeviceResult<Arc<Loaded>>>>;

/// PTX text and its kernel table, loaded lazily once per device on first use (cached), its
/// functions cached per device. See the module docs.
pub struct CudaModule {
    source: String,
    ptx: CString,
    /// The kernel table, by name.
    kernels: HashMap<String, KernelInfo, foldhash::fast::RandomState>,
    loads: Mutex<HashMap<usize, LoadSlot, foldhash::fast::RandomState>>,
}

impl std::fmt::Debug for CudaModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModule")
            .field("ptx_bytes", &self.source.len())
            .field("kernels", &self.kernels.len())
            .finish()
    }
}

fn cuda(device_id: usize) -> Device {
    Device::new(
        DeviceType::CUDA,
        i32::try_from(device_id).unwrap_or(i32::MAX),
    )
}

/// The bytes of a PTX parameter declaration (`.param .u64 k_param_0`, `.param .align 4 .b8
/// s[12]`), or `None` when it names no type kiln knows.
fn ptx_param_bytes(decl: &str) -> Option<u64> {
    let mut elem: Option<u64> = None;
    let mut count = 1u64;
    for tok in decl.split_whitespace() {
        let t = tok.split('[').next().unwrap_or(tok);
        let size = match t {
            ".u8" | ".s8" | ".b8" => Some(1),
            ".u16" | ".s16" | ".b16" | ".f16" | ".bf16" => Some(2),
            ".u32" | ".s32" | ".b32" | ".f32" | ".f16x2" | ".bf16x2" => Some(4),
            ".u64" | ".s64" | ".b64" | ".f64" => Some(8),
            _ => None,
        };
        if size.is_some() {
            elem = size;
        }
        if let Some((_, rest)) = tok.split_once('[') {
            let (n, _) = rest.split_once(']')?;
            count = count.checked_mul(n.trim().parse().ok()?)?;
        }
    }
    elem?.checked_mul(count)
}

/// The `.entry` functions of PTX text: each name and the byte size of each of its parameters
/// (`None` for a declaration not understood). Comments are skipped.
pub(crate) fn ptx_entries(ptx: &str) -> Vec<(String, Vec<Option<u64>>)> {
    // Comments out, one pass: `//` to the end of the line, `/* ... */`.
    let mut text = String::with_capacity(ptx.len());
    let mut rest = ptx;
    while !rest.is_empty() {
        match (rest.find("//"), rest.find("/*")) {
            (Some(a), b) if b.is_none_or(|b| a < b) => {
                text.push_str(&rest[..a]);
                rest = rest[a..].find('\n').map_or("", |n| &rest[a + n..]);
            }
            (_, Some(b)) => {
                text.push_str(&rest[..b]);
                text.push(' ');
                rest = rest[b + 2..]
                    .find("*/")
                    .map_or("", |e| &rest[b + 2 + e + 2..]);
            }
            _ => {
                text.push_str(rest);
                rest = "";
            }
        }
    }
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find(".entry") {
        let start = at + i;
        at = start + ".entry".len();
        let before_ok = text[..start]
            .chars()
            .next_back()
            .is_none_or(char::is_whitespace);
        let after = &text[at..];
        if !before_ok || !after.starts_with(char::is_whitespace) {
            continue;
        }
        let after = after.trim_start();
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '%'))
            .unwrap_or(after.len());
        let name = &after[..name_len];
        if name.is_empty() {
            continue;
        }
        let tail = after[name_len..].trim_start();
        let params = match tail.strip_prefix('(') {
            Some(list) => {
                let list = &list[..list.find(')').unwrap_or(list.len())];
                list.split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(ptx_param_bytes)
                    .collect()
            }
            None => Vec::new(),
        };
        out.push((name.to_owned(), params));
    }
    out
}

impl CudaModule {
    /// A module of PTX text (as LLVM's NVPTX backend writes it) and its kernel table. Nothing is
    /// loaded until [`CudaModule::load`] or [`CudaModule::launch`].
    ///
    /// # Errors
    /// PTX with a NUL byte; a kernel of the table that is not an `.entry` of the PTX, or whose
    /// entry takes another number of parameters, one over 8 bytes, or a buffer that is not a
    /// 64-bit pointer.
    pub fn new(ptx: String, kernels: &[KernelInfo]) -> Result<Self, String> {
        let c = CString::new(ptx.as_bytes())
            .map_err(|e| format!("the PTX holds a NUL byte at offset {}", e.nul_position()))?;
        let entries = ptx_entries(&ptx);
        for k in kernels {
            let Some((_, params)) = entries.iter().find(|(n, _)| *n == k.name) else {
                let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
                return Err(format!(
                    "kernel `{}`: the PTX has no `.entry {}`; its entries: {}",
                    k.name,
                    k.name,
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    }
                ));
            };
            if params.len() != k.params.len() {
                return Err(format!(
                    "kernel `{}`: the PTX entry takes {} parameter(s), the kernel table lists {}",
                    k.name,
                    params.len(),
                    k.params.len()
                ));
            }
            for (i, (bytes, kind)) in params.iter().zip(&k.params).enumerate() {
                match (*bytes, kind) {
                    (None, _) => {
                        return Err(format!(
                            "kernel `{}`: parameter {i} of the PTX entry has no type kiln knows",
                            k.name
                        ))
                    }
                    (Some(b), _) if b > 8 => {
                        return Err(format!(
                            "kernel `{}`: parameter {i} of the PTX entry has {b} bytes; kiln \
                             passes pointers and scalars of at most 8 bytes",
                            k.name
                        ))
                    }
                    (Some(b), KernelParamKind::Buffer(_)) if b != 8 => {
                        return Err(format!(
                            "kernel `{}`: parameter {i} is a buffer, but the PTX entry takes \
                             {b} bytes there, not a 64-bit pointer",
                            k.name
                        ))
                    }
                    _ => {}
                }
            }
        }
        Ok(Self {
            source: ptx,
            ptx: c,
            kernels: kernels
                .iter()
                .map(|k| (k.name.clone(), k.clone()))
                .collect(),
            loads: Mutex::new(HashMap::default()),
        })
    }

    /// The PTX text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Loads the PTX on cuda:`device_id` if not yet loaded. A JIT failure is an error carrying
    /// the driver's log, and is cached: not retried on every launch.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`] (including "no CUDA driver"); [`DeviceError::Backend`]
    /// with the JIT log, or the device's fault.
    pub fn load(&self, device_id: usize) -> DeviceResult<()> {
        let api = super::global()?;
        let dev = cuda(device_id);
        let r = api.check_device(dev).and_then(|()| self.loaded(&api, dev));
        noted(&*api, r.map(|_| ()))
    }

    fn loaded(&self, api: &CudaDeviceApi, dev: Device) -> DeviceResult<Arc<Loaded>> {
        let slot = lock(&self.loads)
            .entry(dev.device_id as usize)
            .or_default()
            .clone();
        // The load runs outside the table lock; concurrent first users of one device wait.
        slot.get_or_init(|| self.load_on(api, dev)).clone()
    }

    fn load_on(&self, api: &CudaDeviceApi, dev: Device) -> DeviceResult<Arc<Loaded>> {
        let d = api.dev(dev)?;
        let ctx = d.context(dev)?;
        // A JIT failure is the module's (returned with its log), not the device's.
        let module = d
            .call(dev, || match ctx.load_ptx(&self.ptx) {
                Ok(m) => Ok(Ok(m)),
                Err((e, _)) if e.is_sticky() => Err(e),
                Err(failed) => Ok(Err(failed)),
            })?
            .map_err(|(e, log)| DeviceError::Backend {
                device: dev,
                message: format!("loading the PTX module: {e}; JIT log:\n{log}"),
            })?;
        Ok(Arc::new(Loaded {
            module,
            functions: Mutex::new(HashMap::default()),
        }))
    }

    fn function(
        &self,
        api: &CudaDeviceApi,
        dev: Device,
        loaded: &Loaded,
        name: &str,
    ) -> DeviceResult<Arc<FuncEntry>> {
        let mut functions = lock(&loaded.functions);
        if let Some(f) = functions.get(name) {
            return Ok(f.clone());
        }
        let d = api.dev(dev)?;
        let drv = api.drv(dev)?;
        let entry = d.call(dev, || {
            let func = drv.module_function(&loaded.module, name)?;
            let attr = |a| {
                drv.func_attribute(&func, a)
                    .map(|v| u64::try_from(v).unwrap_or(0))
            };
            let max_threads = attr(func_attr::MAX_THREADS_PER_BLOCK)?;
            let static_shared = attr(func_attr::SHARED_SIZE_BYTES)?;
            Ok(FuncEntry {
                func,
                max_threads,
                static_shared,
                opt_in: OnceLock::new(),
            })
        })?;
        let entry = Arc::new(entry);
        functions.insert(name.to_owned(), entry.clone());
        Ok(entry)
    }

    /// Launches kernel `name` on the calling thread's current stream of cuda:`device_id` and
    /// returns without waiting. `global[i]` is the total threads per axis (grid * block),
    /// `local[i]` the block per axis; the grid is `global / local`. Checked before the driver
    /// is called: see the module docs. Any zero global extent launches nothing (after the
    /// argument checks).
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`]; [`DeviceError::InvalidLaunch`] for a launch that fails a
    /// check (naming the value and the limit); [`DeviceError::Backend`] for JIT and driver
    /// failures and a faulted device; [`DeviceError::InvalidStream`] when the current stream
    /// was freed.
    pub fn launch(
        &self,
        device_id: usize,
        name: &str,
        args: &[KernelArg],
        global: [usize; 3],
        local: [usize; 3],
    ) -> DeviceResult<()> {
        let api = super::global()?;
        let r = self.launch_on(&api, cuda(device_id), name, args, global, local);
        noted(&*api, r)
    }

    fn launch_on(
        &self,
        api: &CudaDeviceApi,
        dev: Device,
        name: &str,
        args: &[KernelArg],
        global: [usize; 3],
        local: [usize; 3],
    ) -> DeviceResult<()> {
        const AXES: [&str; 3] = ["X", "Y", "Z"];
        let invalid = |reason: String| DeviceError::InvalidLaunch {
            device: dev,
            kernel: name.to_owned(),
            reason,
        };
        api.check_device(dev)?;
        let Some(info) = self.kernels.get(name) else {
            let mut names: Vec<&str> = self.kernels.keys().map(String::as_str).collect();
            names.sort_unstable();
            return Err(invalid(format!(
                "the module's kernel table has no such kernel; its kernels: {}",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            )));
        };
        if args.len() != info.params.len() {
            return Err(invalid(format!(
                "the kernel takes {} argument(s), the launch passes {}",
                info.params.len(),
                args.len()
            )));
        }
        for (i, (a, p)) in args.iter().zip(&info.params).enumerate() {
            match (a, p) {
                (KernelArg::Buffer { .. }, KernelParamKind::Buffer(_)) => {}
                (KernelArg::Scalar { size, .. }, KernelParamKind::Scalar(t)) => {
                    if *size != p.arg_size() {
                        return Err(invalid(format!(
                            "argument {i}: the parameter is a {t} of {} bytes, the launch \
                             passes {size} bytes",
                            p.arg_size()
                        )));
                    }
                }
                (KernelArg::Buffer { .. }, KernelParamKind::Scalar(t)) => {
                    return Err(invalid(format!(
                        "argument {i}: the parameter takes a {t} scalar, the launch passes a \
                         buffer"
                    )))
                }
                (KernelArg::Scalar { .. }, KernelParamKind::Buffer(t)) => {
                    return Err(invalid(format!(
                        "argument {i}: the parameter takes a buffer of {t}, the launch passes \
                         a scalar"
                    )))
                }
            }
        }
        let d = api.dev(dev)?;
        d.check_fault(dev)?;
        if global.contains(&0) {
            // Nothing runs, but the buffers are still checked.
            return check_buffers(&lock(&d.mem), dev, args, &invalid).map(|_| ());
        }
        if let Some(axis) = local.iter().position(|&l| l == 0) {
            return Err(invalid(format!(
                "block size {local:?} is 0 on axis {}",
                AXES[axis]
            )));
        }
        if let Some(axis) = (0..3).find(|&a| global[a] % local[a] != 0) {
            return Err(invalid(format!(
                "global size {global:?} is not a multiple of block size {local:?} on axis {}",
                AXES[axis]
            )));
        }
        let grid: [u64; 3] = std::array::from_fn(|a| (global[a] / local[a]) as u64);
        let block: [u64; 3] = local.map(|l| l as u64);
        let l = d.limits;
        for a in 0..3 {
            if block[a] > l.max_block[a] {
                return Err(invalid(format!(
                    "block size {} on axis {} exceeds the device's limit of {} \
                     (CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_{})",
                    block[a], AXES[a], l.max_block[a], AXES[a]
                )));
            }
        }
        let threads = block.iter().product::<u64>();
        if threads > l.max_threads_per_block {
            return Err(invalid(format!(
                "a block of {threads} threads ({local:?}) exceeds the device's limit of {} \
                 (CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)",
                l.max_threads_per_block
            )));
        }
        for a in 0..3 {
            if grid[a] > l.max_grid[a] {
                return Err(invalid(format!(
                    "grid size {} on axis {} (global {} / block {}) exceeds the device's limit \
                     of {} (CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_{})",
                    grid[a], AXES[a], global[a], local[a], l.max_grid[a], AXES[a]
                )));
            }
        }
        let loaded = self.loaded(api, dev)?;
        let f = self.function(api, dev, &loaded, name)?;
        if threads > f.max_threads {
            return Err(invalid(format!(
                "a block of {threads} threads ({local:?}) exceeds the kernel's limit of {} \
                 (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: its registers or `.maxntid`)",
                f.max_threads
            )));
        }
        let dyn_shared = info.dyn_shared_bytes;
        let shared = dyn_shared.saturating_add(f.static_shared);
        if shared > l.shared_per_block_optin {
            return Err(invalid(format!(
                "{dyn_shared} bytes of dynamic shared memory + {} bytes of static shared memory \
                 exceed the device's limit of {} bytes per block \
                 (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)",
                f.static_shared, l.shared_per_block_optin
            )));
        }
        let (Ok(dyn32), Ok(dyn_attr)) = (u32::try_from(dyn_shared), i32::try_from(dyn_shared))
        else {
            return Err(invalid(format!(
                "{dyn_shared} bytes of dynamic shared memory do not fit the driver's 32 bits"
            )));
        };
        let drv = api.drv(dev)?;
        // Beyond the default 48 KiB per block, a kernel must opt in to its dynamic shared memory
        // (apache/tvm#11478; also when static + dynamic crosses it).
        if dyn_shared >= l.shared_per_block || (dyn_shared > 0 && shared > l.shared_per_block) {
            f.opt_in
                .get_or_init(|| {
                    d.call(dev, || {
                        drv.func_set_attribute(
                            &f.func,
                            func_attr::MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            dyn_attr,
                        )
                    })
                })
                .clone()?;
        }
        let grid32 = grid.map(|g| g as u32);
        let block32 = block.map(|b| b as u32);
        let stream = api.stream(dev, api.current_stream(dev))?;
        // The device's allocation table stays locked from the buffer checks until the launch
        // is queued, so no buffer is freed in between.
        let mem = lock(&d.mem);
        let mut vals_inline = [[0u8; 8]; INLINE_ARGS];
        let mut vals_heap = Vec::new();
        let vals: &mut [[u8; 8]] = if args.len() <= INLINE_ARGS {
            &mut vals_inline[..args.len()]
        } else {
            vals_heap.resize(args.len(), [0u8; 8]);
            &mut vals_heap
        };
        check_buffers(&mem, dev, args, &invalid)?;
        for (v, a) in vals.iter_mut().zip(args) {
            *v = match *a {
                KernelArg::Buffer { ptr, .. } => (ptr.0 as u64).to_le_bytes(),
                KernelArg::Scalar { bytes, .. } => bytes,
            };
        }
        let mut ptrs_inline = [std::ptr::null_mut::<c_void>(); INLINE_ARGS];
        let mut ptrs_heap = Vec::new();
        let ptrs: &mut [*mut c_void] = if args.len() <= INLINE_ARGS {
            &mut ptrs_inline[..args.len()]
        } else {
            ptrs_heap.resize(args.len(), std::ptr::null_mut());
            &mut ptrs_heap
        };
        for (p, v) in ptrs.iter_mut().zip(vals.iter_mut()) {
            *p = v.as_mut_ptr().cast();
        }
        let r = d.call(dev, || {
            // SAFETY: `ptrs` holds one pointer per parameter of the kernel (the table's count,
            // which `CudaModule::new` checked equals the PTX entry's), each to an 8-byte value
            // (no parameter of the entry is larger); each buffer is a live allocation of this
            // device holding the bytes the kernel may touch (`check_buffers`), and stays
            // allocated until the launch is queued (the table is locked).
            unsafe { drv.launch(&f.func, grid32, block32, dyn32, &stream.stream, ptrs) }
        });
        drop(mem);
        r.map_err(|e| match e {
            DeviceError::Backend { device, message } => DeviceError::Backend {
                device,
                message: format!(
                    "launching kernel `{name}` with grid {grid:?}, block {block:?} and \
                     {dyn_shared} bytes of dynamic shared memory: {message}"
                ),
            },
            e => e,
        })
    }
}

/// Checks every buffer argument: a live allocation of `dev` (the address may lie inside one)
/// with at least `min_bytes` from the address to the allocation's end.
fn check_buffers(
    mem: &super::memory::MemTable,
    dev: Device,
    args: &[KernelArg],
    invalid: &dyn Fn(String) -> DeviceError,
) -> DeviceResult<()> {
    for (i, a) in args.iter().enumerate() {
        let KernelArg::Buffer { ptr, min_bytes } = *a else {
            continue;
        };
        let Some((start, size)) = mem.containing(ptr.0 as u64) else {
            return Err(invalid(format!(
                "argument {i}: {ptr} is not a live allocation of {dev} (freed, or allocated \
                 elsewhere)"
            )));
        };
        let avail = start + size - ptr.0 as u64;
        if avail < min_bytes {
            return Err(invalid(format!(
                "argument {i}: the kernel needs at least {min_bytes} bytes, the buffer {ptr} has \
                 {avail}"
            )));
        }
    }
    Ok(())
}

impl Drop for CudaModule {
    fn drop(&mut self) {
        let loads = std::mem::take(&mut *lock(&self.loads));
        if loads.is_empty() {
            return;
        }
        let api = super::instance();
        for (id, slot) in loads {
            let Some(Ok(loaded)) = Arc::into_inner(slot).and_then(OnceLock::into_inner) else {
                continue;
            };
            let dev = cuda(id);
            if let (Ok(d), Ok(drv)) = (api.dev(dev), api.drv(dev)) {
                // No launch of the module may still run when it is unloaded; a faulted device
                // fails at once here.
                if let Err(e) = d.call(dev, || drv.ctx_synchronize()) {
                    log::warn!("unloading a CUDA module from {dev}: {e}");
                }
            }
            // Unloads (`cuModuleUnload`) with the device's context made current.
            drop(loaded);
        }
    }
}

impl KernelLauncher for CudaModule {
    fn launch(
        &self,
        device_id: usize,
        name: &str,
        args: &[KernelArg],
        global: [usize; 3],
        local: [usize; 3],
    ) -> DeviceResult<()> {
        CudaModule::launch(self, device_id, name, args, global, local)
    }
}

/// The launcher of PTX `source` with these kernels: the
/// [`crate::device_api::kernel::KernelLoader`] of kind `cuda` (the driver loads the PTX per
/// device on first launch).
///
/// # Errors
/// As [`CudaModule::new`]: PTX that does not declare the table's kernels as it says.
pub fn load_kernels(
    source: &str,
    kernels: &[KernelInfo],
) -> Result<Box<dyn KernelLauncher>, String> {
    Ok(Box::new(CudaModule::new(source.to_owned(), kernels)?))
}

#[cfg(test)]
mod tests {
    use super::{ptx_entries, ptx_param_bytes};

    #[test]
    fn entries_and_their_parameter_sizes_are_read_from_llvm_ptx() {
        let ptx = "//\n// Generated by LLVM NVPTX Back-End\n//\n.version 7.0\n.target sm_80\n\
                   .address_size 64\n\n\t// .globl\tvadd // -- Begin function vadd\n\
                   .visible .entry vadd(\n\t.param .u64 vadd_param_0,\n\t.param .u64 .ptr \
                   .global .align 4 vadd_param_1,\n\t.param .u32 vadd_param_2\n)\n\
                   .maxntid 256, 1, 1\n{\n\tret;\n}\n/* .entry hidden( */\n\
                   .visible .entry noargs()\n{\n\tret;\n}\n.visible .entry bare\n{\n}\n";
        let e = ptx_entries(ptx);
        assert_eq!(
            e,
            vec![
                ("vadd".to_owned(), vec![Some(8), Some(8), Some(4)]),
                ("noargs".to_owned(), vec![]),
                ("bare".to_owned(), vec![]),
            ]
        );
    }

    proptest::proptest! {
        // PTX comes from libraries on disk too: no text makes the reader panic.
        #[test]
        fn any_text_is_read_without_panicking(text in ".{0,200}") {
            let _ = ptx_entries(&text);
            let _ = ptx_param_bytes(&text);
        }

        #[test]
        fn mangled_ptx_is_read_without_panicking(
            cut in 0usize..400,
            insert in "[\\[\\]().,/* a-z0-9\n]{0,12}",
        ) {
            let ptx = ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .align 8 .b8 s[16]\n)\n{\n\tret;\n}\n/* c */ // d\n";
            let at = cut.min(ptx.len());
            let text = format!("{}{insert}{}", &ptx[..at], &ptx[at..]);
            let _ = ptx_entries(&text);
            for decl in text.split(',') {
                let _ = ptx_param_bytes(decl);
            }
        }
    }

    #[test]
    fn parameter_declarations_give_their_bytes() {
        assert_eq!(ptx_param_bytes(".param .b8 s]1[2"), None);
        assert_eq!(ptx_param_bytes(".param .f32 k_param_1"), Some(4));
        assert_eq!(ptx_param_bytes(".param .align 8 .b8 s[16]"), Some(16));
        assert_eq!(ptx_param_bytes(".param .u8 c"), Some(1));
        assert_eq!(ptx_param_bytes(".param .texref t"), None);
    }
}
