//! The seed story of a TVM-style stack: add a backend `foo` to kiln from outside the crate, with
//! kiln's public API only, and run code on it.
//!
//! 1. `device_api.foo`: [`FooDeviceApi`], a device whose memory is its own arena (one 64-byte
//!    aligned block with a first-fit allocator). Host <-> foo copies go through the device API;
//!    it refuses pointers it did not hand out.
//! 2. target kind `foo`: options, defaults, default keys and a canonicalizer.
//! 3. `target.build.foo`: kiln's LLVM code generator with foo's device checks. The kernels run on
//!    the host CPU over foo's arena, like a simulator would.
//! 4. Build `{"kind": "foo", ...}`, allocate on foo, copy in, call, copy out, verify; show that
//!    CPU tensors are refused and that a kernel's workspace comes from foo.
//!
//! Run: `cargo run --example custom_backend` (also run by `cargo test --test custom_backend`).
//! Any mismatch is an error: the program exits non-zero.

use std::alloc::Layout;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kiln::codegen::{codegen_func, llvm::CodegenOptions, llvm::LlvmModule, ModuleRef};
use kiln::device_api::{
    self, AttrKind, AttrValue, Device, DeviceApi, DeviceError, DeviceMemoryApi, DevicePtr,
    DeviceResult, DeviceStreamApi, DeviceType, EventHandle, HandleTable, HostCallback, MemRegion,
    MemoryStats, StreamHandle, Tensor,
};
use kiln::ir::builder::compute;
use kiln::ir::{kernels, Buffer, DataType, Expr, IRModule, Param, PrimFunc, Stmt, StorageScope};
use kiln::packed_func::{ffi::DLDataType, registry, AnyView};
use kiln::target::{Target, TargetError, TargetKind, TargetValue};

type BoxError = Box<dyn std::error::Error>;

/// Bytes of foo's arena.
const ARENA_BYTES: usize = 16 << 20;
/// Every block starts on this boundary.
const ARENA_ALIGN: usize = 64;

/// Allocator state: live blocks by address, freed addresses (to tell a double free from a
/// foreign pointer), statistics, streams and events.
#[derive(Default)]
struct FooState {
    live: BTreeMap<usize, usize>,
    freed: BTreeSet<usize>,
    peak: u64,
    streams: HandleTable<()>,
    events: HandleTable<()>,
}

/// Device `foo`: one device with a private arena. Its [`DevicePtr`]s are addresses inside the
/// arena; it is not host-accessible, so kiln copies to and from it only through
/// [`DeviceMemoryApi::raw_copy`]. Everything runs synchronously.
pub struct FooDeviceApi {
    code: DeviceType,
    /// Start of the arena (from `std::alloc`, `ARENA_BYTES` long, freed in `Drop`).
    base: usize,
    state: Mutex<FooState>,
    /// Calls of `raw_alloc` that succeeded, to show where workspaces come from.
    allocations: AtomicU64,
}

impl FooDeviceApi {
    fn new(code: DeviceType) -> Self {
        let layout = Layout::from_size_align(ARENA_BYTES, ARENA_ALIGN).expect("arena layout");
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
        assert_ne!(base, 0, "cannot allocate foo's {ARENA_BYTES}-byte arena");
        Self {
            code,
            base,
            state: Mutex::new(FooState::default()),
            allocations: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, FooState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_mine(&self, r: MemRegion) -> bool {
        r.device.device_type == self.code
    }

    /// The host address of `nbytes` bytes at `r`, which must lie inside one live block.
    fn locate(&self, op: &'static str, r: MemRegion, nbytes: usize) -> DeviceResult<usize> {
        let st = self.state();
        let start = r.ptr.0.checked_add(r.offset as usize);
        let inside = st.live.get(&r.ptr.0).is_some_and(|&len| {
            (r.offset as usize)
                .checked_add(nbytes)
                .is_some_and(|end| end <= len)
        });
        match start {
            Some(s) if inside => Ok(s),
            _ => Err(DeviceError::OutOfBounds {
                op,
                device: r.device,
                ptr: r.ptr,
                offset: r.offset,
                nbytes: nbytes as u64,
                allocation: None,
            }),
        }
    }

    fn check_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        if s.is_default() || self.state().streams.get(s.to_raw()).is_some() {
            Ok(())
        } else {
            Err(DeviceError::InvalidStream {
                device: dev,
                handle: s.to_raw(),
            })
        }
    }

    fn check_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        match self.state().events.get(e.to_raw()) {
            Some(()) => Ok(()),
            None => Err(DeviceError::InvalidEvent {
                device: dev,
                handle: e.to_raw(),
            }),
        }
    }
}

impl Drop for FooDeviceApi {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(ARENA_BYTES, ARENA_ALIGN).expect("arena layout");
        // SAFETY: `base` came from `alloc_zeroed` with this layout and is freed only here.
        unsafe { std::alloc::dealloc(self.base as *mut u8, layout) };
    }
}

impl DeviceApi for FooDeviceApi {
    fn name(&self) -> &str {
        "foo"
    }
    fn device_type(&self) -> DeviceType {
        self.code
    }
    fn device_count(&self) -> DeviceResult<usize> {
        Ok(1)
    }
    fn raw_attr(&self, _dev: Device, kind: AttrKind) -> DeviceResult<Option<AttrValue>> {
        Ok(match kind {
            AttrKind::DEVICE_NAME => Some(AttrValue::Str("foo simulator (host arena)".into())),
            AttrKind::TOTAL_GLOBAL_MEMORY => Some(AttrValue::Int(ARENA_BYTES as i64)),
            AttrKind::WARP_SIZE => Some(AttrValue::Int(1)),
            _ => None,
        })
    }
}

impl DeviceMemoryApi for FooDeviceApi {
    fn raw_alloc(
        &self,
        dev: Device,
        nbytes: usize,
        align: usize,
        _dtype_hint: DLDataType,
    ) -> DeviceResult<DevicePtr> {
        let align = align.max(ARENA_ALIGN);
        let mut st = self.state();
        // First fit: the first aligned gap between live blocks that holds `nbytes`.
        let mut cursor = self.base;
        let end = self.base + ARENA_BYTES;
        let mut found = None;
        for (&addr, &len) in st.live.iter().chain([(&end, &0)]) {
            let start = cursor.next_multiple_of(align);
            if start.checked_add(nbytes).is_some_and(|e| e <= addr) {
                found = Some(start);
                break;
            }
            cursor = addr + len;
        }
        let Some(addr) = found else {
            let used: usize = st.live.values().sum();
            return Err(DeviceError::OutOfMemory {
                device: dev,
                nbytes: nbytes as u64,
                align: align as u64,
                reason: format!(
                    "no free block in foo's arena ({used} of {ARENA_BYTES} bytes in use)"
                ),
            });
        };
        st.live.insert(addr, nbytes);
        st.freed.remove(&addr);
        let in_use: usize = st.live.values().sum();
        st.peak = st.peak.max(in_use as u64);
        self.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(DevicePtr(addr))
    }

    fn raw_free(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
        let mut st = self.state();
        if st.live.remove(&ptr.0).is_some() {
            st.freed.insert(ptr.0);
            Ok(())
        } else if st.freed.contains(&ptr.0) {
            Err(DeviceError::DoubleFree { device: dev, ptr })
        } else {
            Err(DeviceError::UnknownPointer {
                device: dev,
                ptr,
                what: "foo's arena".into(),
            })
        }
    }

    unsafe fn raw_copy(
        &self,
        src: MemRegion,
        dst: MemRegion,
        nbytes: usize,
        stream: StreamHandle,
    ) -> DeviceResult<()> {
        let dev = if self.is_mine(src) {
            src.device
        } else {
            dst.device
        };
        self.check_stream(dev, stream)?;
        let host = |r: MemRegion| r.ptr.0.wrapping_add(r.offset as usize);
        let from = if self.is_mine(src) {
            self.locate("copy", src, nbytes)?
        } else {
            host(src)
        };
        let to = if self.is_mine(dst) {
            self.locate("copy", dst, nbytes)?
        } else {
            host(dst)
        };
        // SAFETY: a foo side was checked to lie inside a live arena block; a host side is valid
        // for `nbytes` bytes (the caller's contract). `copy` allows overlap within the arena.
        unsafe { std::ptr::copy(from as *const u8, to as *mut u8, nbytes) };
        Ok(())
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
        self.check_stream(dev, stream)?;
        let r = MemRegion {
            device: dev,
            ptr,
            offset,
        };
        let at = self.locate("memset", r, nbytes)?;
        // SAFETY: `locate` checked that the range lies inside a live arena block.
        unsafe { std::ptr::write_bytes(at as *mut u8, value, nbytes) };
        Ok(())
    }

    fn raw_memory_stats(&self, _dev: Device) -> DeviceResult<MemoryStats> {
        let st = self.state();
        let in_use: u64 = st.live.values().map(|&l| l as u64).sum();
        Ok(MemoryStats {
            total: Some(ARENA_BYTES as u64),
            free: Some(ARENA_BYTES as u64 - in_use),
            in_use,
            peak: st.peak,
            allocations: st.live.len() as u64,
        })
    }
}

impl DeviceStreamApi for FooDeviceApi {
    fn raw_create_stream(&self, _dev: Device) -> DeviceResult<StreamHandle> {
        Ok(StreamHandle::from_raw(self.state().streams.insert(())))
    }
    fn raw_free_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        self.check_stream(dev, s)?;
        self.state().streams.remove(s.to_raw());
        Ok(())
    }
    fn raw_sync_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
        self.check_stream(dev, s)
    }
    fn raw_query_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<bool> {
        self.check_stream(dev, s).map(|()| true)
    }
    fn raw_add_callback(&self, dev: Device, s: StreamHandle, cb: HostCallback) -> DeviceResult<()> {
        self.check_stream(dev, s)?;
        cb(); // synchronous device: everything queued before has completed
        Ok(())
    }
    fn raw_create_event(&self, _dev: Device) -> DeviceResult<EventHandle> {
        Ok(EventHandle::from_raw(self.state().events.insert(())))
    }
    fn raw_record_event(&self, dev: Device, s: StreamHandle, e: EventHandle) -> DeviceResult<()> {
        self.check_stream(dev, s)?;
        self.check_event(dev, e)
    }
    fn raw_query_event(&self, dev: Device, e: EventHandle) -> DeviceResult<bool> {
        self.check_event(dev, e).map(|()| true)
    }
    fn raw_sync_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        self.check_event(dev, e)
    }
    fn raw_stream_wait_event(
        &self,
        dev: Device,
        s: StreamHandle,
        e: EventHandle,
    ) -> DeviceResult<()> {
        self.check_stream(dev, s)?;
        self.check_event(dev, e)
    }
    fn raw_destroy_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
        self.check_event(dev, e)?;
        self.state().events.remove(e.to_raw());
        Ok(())
    }
}

/// Registers target kind `foo` for device type `code`: options `version` (`v1` or `v2`, default
/// `v1`) and `opt-level` (default 3); `v2` adds `feature.has_fma`.
fn register_foo_kind(code: DeviceType) -> Result<(), TargetError> {
    TargetKind::builder("foo", code.0)
        .option::<String>("version", None)
        .option::<i64>("opt-level", Some(3))
        .default_keys(["foo", "cpu"])
        .canonicalizer(|cfg| {
            let version = cfg.get_str("version").unwrap_or("v1").to_owned();
            if version != "v1" && version != "v2" {
                return Err(TargetError::Canonicalizer {
                    kind: "foo".into(),
                    message: format!("`version` expects v1 or v2, found {version:?}"),
                });
            }
            cfg.set("feature.has_fma", version == "v2");
            cfg.set("version", version);
            Ok(())
        })
        .register()?;
    Ok(())
}

/// Registers `target.build.foo`: kiln's LLVM code generator for the host CPU, whose packed
/// wrappers accept only tensors on foo.
fn register_foo_codegen() -> Result<(), kiln::Error> {
    let build = codegen_func(
        "target.build.foo",
        |module, target| -> kiln::Result<ModuleRef> {
            let opts = CodegenOptions {
                cpu: "native".into(), // foo's kernels run on the host CPU
                device_type: target.device_type(),
                device_name: "foo".into(),
                ..CodegenOptions::from_target(target)?
            }
            .resolved();
            let m: ModuleRef = Arc::new(LlvmModule::jit(module, &opts)?);
            Ok(m)
        },
    );
    registry::register("target.build.foo", build, false)?;
    Ok(())
}

/// `axpy_ws(A[n], B[n], C[n])`: `T = 2 * A` in a workspace buffer, then `C = T + B`.
fn axpy_ws() -> PrimFunc {
    let n = kiln::ir::builder::size_var("n");
    let buf = |name| Buffer::new(name, DataType::f32(), vec![Expr::from(&n)]);
    let (a, b, c) = (buf("A"), buf("B"), buf("C"));
    let t = Buffer::temp(
        "T",
        DataType::f32(),
        vec![Expr::from(&n)],
        StorageScope::Workspace,
    );
    let body = t.allocate(Stmt::Seq(vec![
        compute(&t, |i| a.load(i) * 2.0f32),
        compute(&c, |i| t.load(i) + b.load(i)),
    ]));
    PrimFunc::new(
        "axpy_ws",
        vec![Param::Buffer(a), Param::Buffer(b), Param::Buffer(c)],
        body,
    )
    .with_noalias(true)
}

/// Three tensors as packed-call arguments.
fn args<'a>(x: &'a Tensor, y: &'a Tensor, z: &'a Tensor) -> [AnyView<'a>; 3] {
    [
        AnyView::from(x.as_dltensor()),
        AnyView::from(y.as_dltensor()),
        AnyView::from(z.as_dltensor()),
    ]
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), BoxError> {
    if ok {
        Ok(())
    } else {
        Err(what().into())
    }
}

/// The whole story; writes what it does to `out`. Registers `foo` globally, so it runs once per
/// process.
pub fn run(out: &mut dyn Write) -> Result<(), BoxError> {
    // 1. The device.
    let code = device_api::next_extension_code()?;
    let api = Arc::new(FooDeviceApi::new(code));
    device_api::register_device_api("foo", code, api.clone())?;
    let foo0: Device = "foo:0".parse()?;
    let reported: i64 = registry::require("device_api.foo")?.call_typed(())?;
    check(reported == i64::from(code.0), || {
        format!("device_api.foo returned {reported}, expected {}", code.0)
    })?;
    writeln!(
        out,
        "registered device_api.foo: device type {} ({foo0}), {} MiB arena",
        code.0,
        ARENA_BYTES >> 20
    )?;

    // 2. The target kind.
    register_foo_kind(code)?;
    let target = Target::parse(r#"{"kind": "foo", "version": "v2"}"#)?;
    check(Target::parse("foo -version=v2")? == target, || {
        "the legacy form differs from the JSON form".into()
    })?;
    check(
        target.feature("has_fma") == Some(&TargetValue::Bool(true)),
        || format!("the canonicalizer did not run: {target}"),
    )?;
    writeln!(out, "registered target kind foo: {target}")?;
    let bad = Target::parse(r#"{"kind": "foo", "version": "v9"}"#)
        .err()
        .ok_or("version v9 was accepted")?;
    writeln!(out, "  rejected: {bad}")?;

    // 3. The code generator, and a module built for foo.
    register_foo_codegen()?;
    let module = IRModule::from_functions(vec![kernels::vadd(), axpy_ws()]);
    let rt = kiln::codegen::build(&module, &target)?;
    writeln!(out, "built {:?} with target.build.foo", rt.function_names())?;

    // 4. Allocate on foo, copy in, call, copy out, verify.
    let n = 100_000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let ta = Tensor::from_slice(&a, &[n as i64], foo0)?;
    let tb = Tensor::from_slice(&b, &[n as i64], foo0)?;
    let tc = Tensor::zeros(&[n as i64], ta.dtype(), foo0)?;
    rt.require_function("vadd")?.call(&args(&ta, &tb, &tc))?;
    let c: Vec<f32> = tc.to_vec()?;
    let bad = (0..n).find(|&i| c[i] != a[i] + b[i]);
    check(bad.is_none(), || {
        let i = bad.unwrap_or(0);
        format!("vadd on foo: C[{i}] = {}, expected {}", c[i], a[i] + b[i])
    })?;
    writeln!(
        out,
        "vadd on foo:0, n = {n}: C = A + B exactly (copied in and out through device_api.foo)"
    )?;

    let before = api.allocations.load(Ordering::Relaxed);
    rt.require_function("axpy_ws")?.call(&args(&ta, &tb, &tc))?;
    let ws_allocs = api.allocations.load(Ordering::Relaxed) - before;
    check(ws_allocs >= 1, || {
        "axpy_ws ran without allocating its workspace on foo".into()
    })?;
    let c: Vec<f32> = tc.to_vec()?;
    let bad = (0..n).find(|&i| c[i] != 2.0 * a[i] + b[i]);
    check(bad.is_none(), || {
        let i = bad.unwrap_or(0);
        format!(
            "axpy_ws on foo: C[{i}] = {}, expected {}",
            c[i],
            2.0 * a[i] + b[i]
        )
    })?;
    writeln!(out, "axpy_ws on foo:0: C = 2A + B exactly; its workspace came from foo's arena ({ws_allocs} allocation)")?;

    // Tensors on the CPU are refused by foo's code...
    let cpu = Device::cpu();
    let (ha, hb, hc) = (ta.copy_to(cpu)?, tb.copy_to(cpu)?, tc.copy_to(cpu)?);
    let err = rt
        .require_function("vadd")?
        .call(&args(&ha, &hb, &hc))
        .err()
        .ok_or("vadd accepted CPU tensors")?
        .to_string();
    check(
        err.contains("Mismatched A.device_type") && err.contains("expected foo"),
        || format!("unexpected error for CPU tensors: {err}"),
    )?;
    writeln!(
        out,
        "vadd with CPU tensors: {}",
        err.split_whitespace().collect::<Vec<_>>().join(" ")
    )?;

    // ... and foo refuses to free memory it did not hand out.
    let err = api
        .free_data_space(foo0, ha.data_ptr())
        .err()
        .ok_or("foo freed a CPU pointer")?;
    check(matches!(err, DeviceError::UnknownPointer { .. }), || {
        format!("unexpected error freeing a CPU pointer on foo: {err}")
    })?;
    writeln!(out, "free of a CPU pointer on foo: {err}")?;

    let stats = api.memory_stats(foo0)?;
    writeln!(
        out,
        "foo:0 memory: {} bytes in {} blocks, peak {} bytes",
        stats.in_use, stats.allocations, stats.peak
    )?;
    writeln!(out, "ok")?;
    Ok(())
}

fn main() -> Result<(), BoxError> {
    run(&mut std::io::stdout())
}
