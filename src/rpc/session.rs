//! One client's session on the server: the packet loop, its handles, its memory and its files.
//!
//! A session starts after the socket handshake and ends at the client's `Shutdown`, at the end
//! of the stream, or at an error that leaves the stream out of step. Everything it created goes
//! with it: allocations are freed (the session's allocation table, `memory.rs`), handles dropped (which unloads
//! libraries no one else holds) and the working directory removed.
//!
//! # What a client can do
//! The syscalls of TVM's protocol (functions by name, handles, device attributes, memory,
//! streams, copies), and these global functions, TVM's names and semantics:
//!
//! | name | does |
//! |---|---|
//! | `tvm.rpc.server.upload(path, bytes)` | writes a file into the session's directory |
//! | `tvm.rpc.server.download(path)` | reads one back |
//! | `tvm.rpc.server.remove(path)` | removes one |
//! | `tvm.rpc.server.listdir(path)` | lists a folder, names joined by `,` |
//! | `tvm.rpc.server.workpath(path)` | the absolute path of a file |
//! | `tvm.rpc.server.load_module(path)` | loads an uploaded shared library (kiln's or TVM's) |
//! | `tvm.rpc.server.ModuleGetFunction(mod, name, query_imports)` | a module's function |
//! | `runtime.RPCTimeEvaluator(mod, name, dev_type, dev_id, number, repeat, min_repeat_ms, limit_zero_time_iterations, cooldown_interval_ms, repeats_to_cooldown, cache_flush_bytes, f_preproc)` | a timer of a function, TVM's algorithm |
//! | `tvm.contrib.random.random_fill(t)`, `random_fill_for_measure(t)` | random contents |
//! | `cache_flush_cpu_non_first_arg(...)` | evicts the tensors after the first from the CPU caches |
//!
//! and every function of kiln's global registry. Paths are relative to the session's directory:
//! an absolute path, a `..` component or a symbolic link on the way is refused.

use std::collections::HashMap;
use std::ffi::CString;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::memory::{Allocations, Region};
use super::wire::{
    exception_packet, return_packet, Reader, RpcCode, WireError, WireTensor, WireValue, Writer,
    MAX_NDIM, PROTOCOL_VERSION,
};
use crate::device_api::{registry, Device, DeviceType};
use crate::packed_func::ffi::{DLDataType, DLDataTypeCode, DLTensor};
use crate::packed_func::{registry as globals, Any, AnyView, Module, PackedFunc, Value};
use crate::runtime::LibraryModule;

/// Limits of a session.
#[derive(Clone, Debug)]
pub struct SessionLimits {
    /// The largest packet accepted, other than a copy into an allocation (whose size the
    /// allocation bounds). Default 1 GiB.
    pub max_packet_bytes: u64,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            max_packet_bytes: 1 << 30,
        }
    }
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The client sent `Shutdown`.
    Shutdown,
    /// The client closed the connection between packets.
    Closed,
    /// The session was ended for an error, which the client was told where it could be.
    Error(String),
}

/// Server-side functions a client reaches by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Builtin {
    Upload,
    Download,
    Remove,
    ListDir,
    WorkPath,
    LoadModule,
    ModuleGetFunction,
    TimeEvaluator,
    RandomFill,
    CacheFlush,
}

const BUILTINS: &[(&str, Builtin)] = &[
    ("tvm.rpc.server.upload", Builtin::Upload),
    ("tvm.rpc.server.download", Builtin::Download),
    ("tvm.rpc.server.remove", Builtin::Remove),
    ("tvm.rpc.server.listdir", Builtin::ListDir),
    ("tvm.rpc.server.workpath", Builtin::WorkPath),
    ("tvm.rpc.server.load_module", Builtin::LoadModule),
    (
        "tvm.rpc.server.ModuleGetFunction",
        Builtin::ModuleGetFunction,
    ),
    ("runtime.RPCTimeEvaluator", Builtin::TimeEvaluator),
    ("tvm.contrib.random.random_fill", Builtin::RandomFill),
    (
        "tvm.contrib.random.random_fill_for_measure",
        Builtin::RandomFill,
    ),
    ("cache_flush_cpu_non_first_arg", Builtin::CacheFlush),
];

/// The names of the server's own global functions.
pub fn builtin_names() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|(n, _)| *n)
}

/// A timer made by `runtime.RPCTimeEvaluator`.
struct Timer {
    func: PackedFunc,
    name: String,
    dev: Device,
    number: i64,
    repeat: i64,
    min_repeat_ms: i64,
    limit_zero_time_iterations: i64,
    cooldown_interval_ms: i64,
    repeats_to_cooldown: i64,
    preproc: Option<Callee>,
}

/// What a timer calls before each repeat.
#[derive(Clone)]
enum Callee {
    Func(PackedFunc),
    CacheFlush,
}

/// An object a handle stands for.
enum Object {
    Builtin(Builtin),
    Func(PackedFunc),
    Module(Arc<dyn Module>),
    Timer(Box<Timer>),
}

/// A request that failed: the message goes back as an `Exception` packet and the session
/// continues.
type Reply = Result<Vec<WireValue>, String>;

/// One client's session. Generic over the stream so tests and fuzzers drive it from memory.
pub struct Session<R: Read, W: Write> {
    r: R,
    w: W,
    limits: SessionLimits,
    workdir: PathBuf,
    handles: HashMap<u64, Object>,
    next_handle: u64,
    memory: Allocations,
    initialized: bool,
    loaded: u64,
    rng: u64,
}

fn wire_err(e: WireError) -> String {
    format!("malformed request: {e}")
}

impl<R: Read, W: Write> Session<R, W> {
    /// A session reading requests from `r`, answering on `w`, with files under `workdir`
    /// (which must exist; the caller removes it).
    pub fn new(r: R, w: W, workdir: PathBuf, limits: SessionLimits) -> Self {
        crate::runtime::init();
        Self {
            r,
            w,
            limits,
            workdir,
            handles: HashMap::new(),
            next_handle: 0x1000,
            memory: Allocations::default(),
            initialized: false,
            loaded: 0,
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// The number of live allocations (for tests).
    pub fn live_allocations(&self) -> usize {
        self.memory.len()
    }

    /// The number of live handles (for tests).
    pub fn live_handles(&self) -> usize {
        self.handles.len()
    }

    /// Serves packets until the session ends. Everything the session holds is released when it
    /// is dropped.
    pub fn run(&mut self) -> SessionEnd {
        loop {
            match self.step() {
                Ok(None) => continue,
                Ok(Some(end)) => return end,
                Err(e) => {
                    // The stream is out of step (or gone): tell the client if it still listens.
                    let _ = self.send(&exception_packet(&format!("kiln rpc server: {e}")));
                    return SessionEnd::Error(e);
                }
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.w.write_all(bytes)?;
        self.w.flush()
    }

    /// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream before the first.
    fn read_exact_or_eof(&mut self, buf: &mut [u8]) -> Result<bool, String> {
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => {
                    return Err(format!(
                        "the connection closed after {got} of {} bytes",
                        buf.len()
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading from the client: {e}")),
            }
        }
        Ok(true)
    }

    fn read_exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), String> {
        match self.read_exact_or_eof(buf) {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!("the connection closed before {what}")),
            Err(e) => Err(format!("{e} (reading {what})")),
        }
    }

    /// Reads `n` bytes, growing the buffer only as they arrive (a length that lies costs no
    /// memory up front).
    fn read_body(&mut self, n: u64, what: &str) -> Result<Vec<u8>, String> {
        let mut body = Vec::with_capacity(n.min(1 << 20) as usize);
        let got = (&mut self.r)
            .take(n)
            .read_to_end(&mut body)
            .map_err(|e| format!("reading {what}: {e}"))?;
        if (got as u64) < n {
            return Err(format!(
                "the connection closed after {got} of the {n} bytes of {what}"
            ));
        }
        Ok(body)
    }

    /// One packet. `Ok(Some(end))` ends the session.
    fn step(&mut self) -> Result<Option<SessionEnd>, String> {
        let mut len = [0u8; 8];
        if !self.read_exact_or_eof(&mut len)? {
            return Ok(Some(SessionEnd::Closed));
        }
        let len = u64::from_le_bytes(len);
        if len == 0 {
            return Ok(None);
        }
        if len < 4 {
            return Err(format!(
                "a packet of {len} bytes cannot hold its 4-byte code"
            ));
        }
        let mut code = [0u8; 4];
        self.read_exact(&mut code, "the packet code")?;
        let raw_code = i32::from_le_bytes(code);
        let body_len = len - 4;
        let code = RpcCode::from_i32(raw_code);
        match code {
            Some(RpcCode::CopyToRemote) if self.initialized => {
                return self.copy_to_remote(body_len).map(|()| None)
            }
            Some(RpcCode::Shutdown) => {
                self.read_body(
                    body_len.min(self.limits.max_packet_bytes),
                    "the shutdown packet",
                )?;
                return Ok(Some(SessionEnd::Shutdown));
            }
            _ => {}
        }
        if body_len > self.limits.max_packet_bytes {
            return Err(format!(
                "a packet of {body_len} bytes (code {raw_code}) exceeds the server's limit of {} \
                 bytes",
                self.limits.max_packet_bytes
            ));
        }
        let body = self.read_body(body_len, "the packet body")?;
        let reply = match code {
            None => Err(format!(
                "unknown RPC code {raw_code} (TVM's protocol defines 0-21); the packet was skipped"
            )),
            Some(RpcCode::InitServer) => self.init_server(&body),
            Some(c) if !self.initialized => Err(format!(
                "{c:?} before InitServer: a session starts with InitServer (protocol \
                 {PROTOCOL_VERSION})"
            )),
            Some(RpcCode::CallFunc) => self.call_func(&body),
            Some(RpcCode::CopyFromRemote) => return self.copy_from_remote(&body).map(|()| None),
            Some(
                c @ (RpcCode::Return
                | RpcCode::Exception
                | RpcCode::CopyAck
                | RpcCode::None
                | RpcCode::CopyToRemote),
            ) => Err(format!("{c:?} is not a request a server answers")),
            Some(c) => self.syscall(c, &body),
        };
        let packet = match reply {
            Ok(values) => return_packet(&values),
            Err(msg) => exception_packet(&msg),
        };
        self.send(&packet)
            .map_err(|e| format!("writing the reply: {e}"))?;
        Ok(None)
    }

    fn init_server(&mut self, body: &[u8]) -> Reply {
        let mut r = Reader::new(body);
        let ver = r.string("the protocol version").map_err(wire_err)?;
        let args = r.seq().map_err(wire_err)?;
        r.finish("InitServer").map_err(wire_err)?;
        if self.initialized {
            return Err("the session is already initialized".into());
        }
        if ver != PROTOCOL_VERSION {
            return Err(format!(
                "client protocol version mismatch with the server: server protocol={PROTOCOL_VERSION}, \
                 client protocol={ver}"
            ));
        }
        match args.first() {
            None => {}
            Some(WireValue::Str(s)) if s == "rpc.LocalSession" => {}
            Some(other) => {
                return Err(format!(
                    "session constructor {other}: kiln's server serves its local devices \
                     (`rpc.LocalSession`, the default); nested sessions are not supported"
                ))
            }
        }
        self.initialized = true;
        Ok(vec![WireValue::None])
    }

    fn new_handle(&mut self, o: Object) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(h, o);
        h
    }

    // ------------------------------------------------------------------------------- syscalls

    fn syscall(&mut self, code: RpcCode, body: &[u8]) -> Reply {
        let args = super::wire::decode_seq(body).map_err(wire_err)?;
        let name = format!("{code:?}");
        let a = Args { f: &name, v: &args };
        let one = |v: WireValue| Ok(vec![v]);
        match code {
            RpcCode::GetGlobalFunc => {
                let fname = a.str(0)?;
                let obj = if let Some((_, b)) = BUILTINS.iter().find(|(n, _)| *n == fname) {
                    Some(Object::Builtin(*b))
                } else {
                    globals::get(fname).map(Object::Func)
                };
                match obj {
                    Some(o) => one(WireValue::Handle(self.new_handle(o))),
                    None => one(WireValue::None),
                }
            }
            RpcCode::FreeHandle => {
                let h = a.handle(0)?;
                // TVM's client frees tensors it got back as results through the same call; a
                // handle this session never gave out is reported, not ignored.
                match self.handles.remove(&h) {
                    Some(_) => one(WireValue::None),
                    None => Err(format!(
                        "FreeHandle: {h:#x} is not a handle of this session"
                    )),
                }
            }
            RpcCode::DevSetDevice => {
                let dev = a.device(0)?;
                let api = registry::get_for(dev).map_err(|e| e.to_string())?;
                api.set_device(dev).map_err(|e| e.to_string())?;
                one(WireValue::None)
            }
            RpcCode::DevGetAttr => {
                let dev = a.device(0)?;
                let kind = a.int(1)?;
                self.get_attr(dev, kind).map(|v| vec![v])
            }
            RpcCode::DevAllocData => {
                let dev = a.device(0)?;
                let nbytes = a.uint(1)?;
                let align = a.uint(2)?;
                let dtype = a.dtype(3)?;
                let p = self.memory.alloc(dev, nbytes, align, dtype)?;
                one(WireValue::Handle(p.0 as u64))
            }
            RpcCode::DevAllocDataWithScope => {
                let t = a.tensor(0)?;
                match a.v.get(1) {
                    None | Some(WireValue::None) => {}
                    Some(WireValue::Str(s)) if s.is_empty() || s == "global" => {}
                    Some(other) => {
                        return Err(format!(
                            "DevAllocDataWithScope: memory scope {other}: kiln's server allocates \
                             global memory only"
                        ))
                    }
                }
                let nbytes = t.nbytes().ok_or_else(|| {
                    format!("DevAllocDataWithScope: shape {:?} is invalid", t.shape)
                })?;
                let elem = (u64::from(t.dtype.bits) * u64::from(t.dtype.lanes)).div_ceil(8);
                let align = 64u64.max(elem.next_power_of_two());
                let p = self.memory.alloc(t.device.into(), nbytes, align, t.dtype)?;
                one(WireValue::Handle(p.0 as u64))
            }
            RpcCode::DevFreeData => {
                let dev = a.device(0)?;
                let ptr = a.handle(1)?;
                self.memory.free(dev, ptr)?;
                one(WireValue::None)
            }
            RpcCode::DevStreamSync => {
                let dev = a.device(0)?;
                let s = a.handle(1)?;
                let api = registry::get_for(dev).map_err(|e| e.to_string())?;
                let stream = if s == 0 {
                    api.current_stream(dev)
                } else {
                    crate::device_api::StreamHandle::from_raw(s)
                };
                api.sync_stream(dev, stream).map_err(|e| e.to_string())?;
                one(WireValue::None)
            }
            RpcCode::CopyAmongRemote => {
                let from = a.tensor(0)?;
                let to = a.tensor(1)?;
                let n = from
                    .nbytes()
                    .ok_or_else(|| "CopyAmongRemote: invalid source shape".to_owned())?;
                if to.nbytes() != Some(n) || from.dtype != to.dtype {
                    return Err(format!(
                        "CopyAmongRemote: source {:?} {} and destination {:?} {} differ",
                        from.shape, from.dtype, to.shape, to.dtype
                    ));
                }
                let rf = self.region(from, "CopyAmongRemote source")?;
                let rt = self.region(to, "CopyAmongRemote destination")?;
                self.memory.copy(rf, rt)?;
                one(WireValue::None)
            }
            RpcCode::DevCreateStream
            | RpcCode::DevFreeStream
            | RpcCode::DevSetStream
            | RpcCode::DevGetCurrentStream => {
                let dev = a.device(0)?;
                let api = registry::get_for(dev).map_err(|e| e.to_string())?;
                match code {
                    RpcCode::DevCreateStream => api
                        .create_stream(dev)
                        .map(|s| vec![WireValue::Handle(s.to_raw())])
                        .map_err(|e| e.to_string()),
                    RpcCode::DevFreeStream => api
                        .free_stream(dev, crate::device_api::StreamHandle::from_raw(a.handle(1)?))
                        .map(|()| vec![WireValue::None])
                        .map_err(|e| e.to_string()),
                    RpcCode::DevSetStream => api
                        .set_current_stream(
                            dev,
                            crate::device_api::StreamHandle::from_raw(a.handle(1)?),
                        )
                        .map(|_| vec![WireValue::None])
                        .map_err(|e| e.to_string()),
                    _ => one(WireValue::Handle(api.current_stream(dev).to_raw())),
                }
            }
            other => Err(format!("{other:?} is not a syscall")),
        }
    }

    fn get_attr(&self, dev: Device, kind: i64) -> Result<WireValue, String> {
        use crate::device_api::{AttrKind, AttrValue};
        let api = match registry::get_for(dev) {
            Ok(api) => api,
            // `kExist` of a device type the server lacks is 0, as in TVM.
            Err(_) if kind == 0 => return Ok(WireValue::Int(0)),
            Err(e) => return Err(e.to_string()),
        };
        let kind = AttrKind(kind as i32);
        match api.attr(dev, kind) {
            Ok(Some(AttrValue::Int(v))) => Ok(WireValue::Int(v)),
            Ok(Some(AttrValue::Str(s))) => Ok(WireValue::Str(s)),
            Ok(None) if kind.0 == 0 => Ok(WireValue::Int(0)),
            Ok(None) => Ok(WireValue::None),
            Err(_) if kind.0 == 0 => Ok(WireValue::Int(0)),
            Err(e) => Err(e.to_string()),
        }
    }

    fn region(&self, t: &WireTensor, what: &str) -> Result<Region, String> {
        let n = t.nbytes().ok_or_else(|| {
            format!(
                "{what}: shape {:?} has a negative extent or overflows",
                t.shape
            )
        })?;
        self.memory.check(t.device, t.data, t.byte_offset, n, what)
    }

    // --------------------------------------------------------------------------------- copies

    /// `CopyToRemote`: the header is read and checked first; the data then streams straight
    /// into the allocation (host memory) or through one buffer (other devices).
    fn copy_to_remote(&mut self, body_len: u64) -> Result<(), String> {
        let mut head = [0u8; 24];
        self.read_exact(&mut head, "the CopyToRemote header")?;
        let ndim = i32::from_le_bytes(head[16..20].try_into().unwrap_or_default());
        if !(0..=MAX_NDIM).contains(&ndim) {
            return Err(format!(
                "CopyToRemote: ndim {ndim} is outside 0..={MAX_NDIM}; the stream cannot be \
                 followed further"
            ));
        }
        let mut rest = vec![0u8; ndim as usize * 8 + 16];
        self.read_exact(&mut rest, "the CopyToRemote header")?;
        let mut all = head.to_vec();
        all.extend_from_slice(&rest);
        let mut r = Reader::new(&all);
        let t = r.tensor("CopyToRemote").map_err(wire_err)?;
        let nbytes = r.u64("CopyToRemote").map_err(wire_err)?;
        let head_len = all.len() as u64;
        if head_len.checked_add(nbytes) != Some(body_len) {
            return Err(format!(
                "CopyToRemote: the packet holds {body_len} bytes, but its header says {head_len} \
                 + {nbytes}"
            ));
        }
        let region = self.memory.check(
            t.device,
            t.data,
            t.byte_offset,
            nbytes,
            "CopyToRemote destination",
        );
        let result = match region {
            Err(e) => {
                // Skip the data (bounded) so that the stream stays in step.
                if nbytes > self.limits.max_packet_bytes {
                    return Err(e);
                }
                self.read_body(nbytes, "the CopyToRemote data")?;
                Err(e)
            }
            Ok(region) => {
                if let Some(dst) = self.memory.host_slice_mut(region) {
                    let mut got = 0;
                    while got < dst.len() {
                        match self.r.read(&mut dst[got..]) {
                            Ok(0) => {
                                return Err(format!(
                                    "the connection closed after {got} of the {nbytes} bytes of a \
                                     CopyToRemote"
                                ))
                            }
                            Ok(n) => got += n,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(format!("reading CopyToRemote data: {e}")),
                        }
                    }
                    Ok(())
                } else {
                    let data = self.read_body(nbytes, "the CopyToRemote data")?;
                    self.memory.write(region, &data)
                }
            }
        };
        let packet = match result {
            Ok(()) => return_packet(&[WireValue::None]),
            Err(e) => exception_packet(&e),
        };
        self.send(&packet)
            .map_err(|e| format!("writing the reply: {e}"))
    }

    fn copy_from_remote(&mut self, body: &[u8]) -> Result<(), String> {
        let parsed = (|| {
            let mut r = Reader::new(body);
            let t = r.tensor("CopyFromRemote")?;
            let n = r.u64("CopyFromRemote")?;
            r.finish("CopyFromRemote")?;
            Ok::<_, WireError>((t, n))
        })();
        let region = parsed.map_err(wire_err).and_then(|(t, n)| {
            self.memory
                .check(t.device, t.data, t.byte_offset, n, "CopyFromRemote source")
        });
        let region = match region {
            Ok(r) => r,
            Err(e) => {
                return self
                    .send(&exception_packet(&e))
                    .map_err(|e| format!("writing the reply: {e}"))
            }
        };
        let head = Writer::packet(RpcCode::CopyAck).finish_with_len(4 + region.nbytes);
        let io = |w: &mut W, data: &[u8]| -> std::io::Result<()> {
            w.write_all(&head)?;
            w.write_all(data)?;
            w.flush()
        };
        if let Some(src) = self.memory.host_slice(region) {
            return io(&mut self.w, src).map_err(|e| format!("writing CopyAck: {e}"));
        }
        match self.memory.read(region) {
            Ok(data) => io(&mut self.w, &data).map_err(|e| format!("writing CopyAck: {e}")),
            Err(e) => self
                .send(&exception_packet(&e))
                .map_err(|e| format!("writing the reply: {e}")),
        }
    }

    // ------------------------------------------------------------------------------ functions

    fn call_func(&mut self, body: &[u8]) -> Reply {
        let mut r = Reader::new(body);
        let h = r.u64("the function handle").map_err(wire_err)?;
        let args = r.seq().map_err(wire_err)?;
        r.finish("CallFunc").map_err(wire_err)?;
        let target = match self.handles.get(&h) {
            Some(Object::Builtin(b)) => Ok(*b),
            Some(Object::Func(f)) => Err(Callee::Func(f.clone())),
            Some(Object::Timer(_)) => return self.run_timer(h, &args),
            Some(Object::Module(_)) => {
                return Err(format!(
                    "CallFunc: handle {h:#x} is a module, not a function"
                ))
            }
            None => {
                return Err(format!(
                    "CallFunc: {h:#x} is not a function handle of this session"
                ))
            }
        };
        match target {
            Ok(b) => self.builtin(b, &args),
            Err(Callee::Func(f)) => {
                let ret = self.call_packed(&f, &args)?;
                self.encode_return(ret)
            }
            Err(Callee::CacheFlush) => unreachable!("not a handle"),
        }
    }

    fn encode_return(&mut self, ret: Any) -> Reply {
        let tname = ret.type_index().to_string();
        let v = match ret.value() {
            Value::None => WireValue::None,
            Value::Int(v) => WireValue::Int(v),
            Value::Bool(b) => WireValue::Bool(b),
            Value::Float(x) => WireValue::Float(x),
            Value::Str(s) => return Ok(vec![WireValue::Int(65), WireValue::Str(s.to_owned())]),
            Value::Bytes(b) => return Ok(vec![WireValue::Int(66), WireValue::Bytes(b.to_vec())]),
            Value::DataType(d) => WireValue::DataType(d),
            Value::Device(d) => WireValue::Device(d),
            Value::OpaquePtr(p) => WireValue::Handle(p as u64),
            _ => {
                return Err(format!(
                    "the function returned {tname}, which kiln's server does not send back (it \
                     returns None, numbers, strings, bytes and its own handles)"
                ))
            }
        };
        Ok(vec![WireValue::Int(v.type_index().into()), v])
    }

    /// Calls a packed function with wire arguments: tensors are checked against the session's
    /// memory first.
    fn call_packed(&self, f: &PackedFunc, args: &[WireValue]) -> Result<Any, String> {
        let mut shapes: Vec<Box<[i64]>> = Vec::new();
        let mut strs: Vec<CString> = Vec::new();
        let mut bytes: Vec<Any> = Vec::new();
        for (i, a) in args.iter().enumerate() {
            match a {
                WireValue::Tensor(t) => {
                    self.region(t, &format!("argument #{i} of `{}`", f.name()))?;
                    shapes.push(t.shape.clone().into_boxed_slice());
                }
                WireValue::Str(s) => strs.push(CString::new(s.as_str()).map_err(|_| {
                    format!(
                        "argument #{i} of `{}`: the string holds a NUL byte",
                        f.name()
                    )
                })?),
                WireValue::Bytes(b) => bytes.push(Any::bytes(b)),
                _ => {}
            }
        }
        let mut tensors: Vec<DLTensor> = Vec::with_capacity(shapes.len());
        let mut si = 0;
        for a in args {
            if let WireValue::Tensor(t) = a {
                tensors.push(DLTensor {
                    data: t.data as usize as *mut std::ffi::c_void,
                    device: t.device,
                    ndim: t.shape.len() as i32,
                    dtype: t.dtype,
                    shape: shapes[si].as_mut_ptr(),
                    strides: std::ptr::null_mut(),
                    byte_offset: t.byte_offset,
                });
                si += 1;
            }
        }
        let none = Any::none();
        let (mut ti, mut sti, mut bi) = (0, 0, 0);
        let mut views: Vec<AnyView<'_>> = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            views.push(match a {
                WireValue::None => AnyView::from(&none),
                WireValue::Int(v) => AnyView::from(*v),
                WireValue::Bool(b) => AnyView::from(*b),
                WireValue::Float(x) => AnyView::from(*x),
                WireValue::DataType(d) => AnyView::from(*d),
                WireValue::Device(d) => AnyView::from(*d),
                WireValue::Tensor(_) => {
                    ti += 1;
                    AnyView::dltensor(&tensors[ti - 1])
                }
                WireValue::Str(_) => {
                    sti += 1;
                    AnyView::c_str(&strs[sti - 1])
                }
                WireValue::Bytes(_) => {
                    bi += 1;
                    bytes[bi - 1].view()
                }
                other => {
                    return Err(format!(
                        "argument #{i} of `{}`: a {} cannot be passed to a compiled function",
                        f.name(),
                        other.type_name()
                    ))
                }
            });
        }
        f.call(&views).map_err(|e| e.to_string())
    }

    // ------------------------------------------------------------------------------- builtins

    fn builtin(&mut self, b: Builtin, args: &[WireValue]) -> Reply {
        let name = BUILTINS
            .iter()
            .find(|(_, x)| *x == b)
            .map(|(n, _)| *n)
            .unwrap_or("builtin");
        let a = Args { f: name, v: args };
        let none = || Ok(vec![WireValue::Int(0), WireValue::None]);
        match b {
            Builtin::Upload => {
                let path = self.resolve(a.str(0)?, name)?;
                let data = a.bytes(1)?;
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| format!("{name}: creating {}: {e}", parent.display()))?;
                }
                std::fs::write(&path, data)
                    .map_err(|e| format!("{name}: writing {}: {e}", path.display()))?;
                log::info!("rpc: upload {} ({} bytes)", path.display(), data.len());
                none()
            }
            Builtin::Download => {
                let path = self.resolve(a.str(0)?, name)?;
                let data = std::fs::read(&path)
                    .map_err(|e| format!("{name}: reading {}: {e}", path.display()))?;
                Ok(vec![WireValue::Int(66), WireValue::Bytes(data)])
            }
            Builtin::Remove => {
                let rel = a.str(0)?;
                if rel.is_empty() || rel == "." {
                    // MetaSchedule's cleanup removes "" (the working directory in TVM's server):
                    // the session's directory goes when the session ends.
                    return none();
                }
                let path = self.resolve(rel, name)?;
                match std::fs::symlink_metadata(&path) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => none(),
                    Err(e) => Err(format!("{name}: {}: {e}", path.display())),
                    Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path)
                        .map_err(|e| format!("{name}: {}: {e}", path.display()))
                        .and_then(|()| none()),
                    Ok(_) => std::fs::remove_file(&path)
                        .map_err(|e| format!("{name}: {}: {e}", path.display()))
                        .and_then(|()| none()),
                }
            }
            Builtin::ListDir => {
                let rel = a.str(0)?;
                let path = if rel.is_empty() || rel == "." {
                    self.workdir.clone()
                } else {
                    self.resolve(rel, name)?
                };
                let mut names: Vec<String> = std::fs::read_dir(&path)
                    .map_err(|e| format!("{name}: {}: {e}", path.display()))?
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n != LOADED_DIR)
                    .collect();
                names.sort();
                Ok(vec![WireValue::Int(65), WireValue::Str(names.join(","))])
            }
            Builtin::WorkPath => {
                let path = self.resolve(a.str(0)?, name)?;
                Ok(vec![
                    WireValue::Int(65),
                    WireValue::Str(path.to_string_lossy().into_owned()),
                ])
            }
            Builtin::LoadModule => {
                let m = self.load_module(a.str(0)?)?;
                let h = self.new_handle(Object::Module(m));
                Ok(vec![WireValue::Int(73), WireValue::Handle(h)])
            }
            Builtin::ModuleGetFunction => {
                let m = self.module_arg(&a, 0)?;
                let fname = a.str(1)?;
                match m.get_function(fname) {
                    Some(f) => {
                        let h = self.new_handle(Object::Func(f));
                        Ok(vec![WireValue::Int(68), WireValue::Handle(h)])
                    }
                    None => none(),
                }
            }
            Builtin::TimeEvaluator => {
                let fname = a.str(1)?.to_owned();
                let func = match a.v.first() {
                    Some(WireValue::None) | None => globals::get(&fname)
                        .ok_or_else(|| format!("{name}: no global function `{fname}` to time"))?,
                    _ => {
                        let m = self.module_arg(&a, 0)?;
                        m.get_function(&fname).ok_or_else(|| {
                            format!(
                                "{name}: the module has no function `{fname}` (it has {:?})",
                                m.function_names()
                            )
                        })?
                    }
                };
                let dev = Device::new(DeviceType(a.int(2)? as i32), a.int(3)? as i32);
                registry::get_for(dev).map_err(|e| format!("{name}: {e}"))?;
                let preproc = match a.v.get(11) {
                    None | Some(WireValue::None) => None,
                    Some(WireValue::Str(s)) if s.is_empty() => None,
                    Some(WireValue::Str(s)) if s == "cache_flush_cpu_non_first_arg" => {
                        Some(Callee::CacheFlush)
                    }
                    Some(WireValue::Str(s)) => {
                        Some(Callee::Func(globals::get(s).ok_or_else(|| {
                            format!("{name}: no global function `{s}` to call before each repeat")
                        })?))
                    }
                    Some(other) => {
                        return Err(format!("{name}: argument #11: expected str, got {other}"))
                    }
                };
                let t = Timer {
                    func,
                    name: fname,
                    dev,
                    number: a.int(4)?.max(1),
                    repeat: a.int(5)?.max(1),
                    min_repeat_ms: a.int(6)?.max(0),
                    limit_zero_time_iterations: a.int(7)?,
                    cooldown_interval_ms: a.int(8)?.max(0),
                    repeats_to_cooldown: a.int(9)?.max(1),
                    preproc,
                };
                if a.int(10)? > 0 {
                    return Err(format!(
                        "{name}: cache_flush_bytes > 0 is not supported by kiln's server; use \
                         f_preproc=\"cache_flush_cpu_non_first_arg\""
                    ));
                }
                let h = self.new_handle(Object::Timer(Box::new(t)));
                Ok(vec![WireValue::Int(68), WireValue::Handle(h)])
            }
            Builtin::RandomFill => {
                let t = a.tensor(0)?;
                let r = self.region(t, name)?;
                let mut rng = self.rng;
                if let Some(dst) = self.memory.host_slice_mut(r) {
                    fill_random(&mut rng, t.dtype, dst).map_err(|e| format!("{name}: {e}"))?;
                } else {
                    let mut data = vec![0u8; r.nbytes as usize];
                    fill_random(&mut rng, t.dtype, &mut data)
                        .map_err(|e| format!("{name}: {e}"))?;
                    self.memory.write(r, &data)?;
                }
                self.rng = rng;
                none()
            }
            Builtin::CacheFlush => {
                self.cache_flush(args)?;
                none()
            }
        }
    }

    fn cache_flush(&mut self, args: &[WireValue]) -> Result<(), String> {
        for (i, v) in args.iter().enumerate().skip(1) {
            if let WireValue::Tensor(t) = v {
                let r = self.region(t, &format!("cache_flush_cpu_non_first_arg #{i}"))?;
                self.memory.flush_from_cache(r);
            }
        }
        Ok(())
    }

    fn module_arg(&self, a: &Args<'_>, i: usize) -> Result<Arc<dyn Module>, String> {
        let h = match a.v.get(i) {
            Some(WireValue::Module(h)) | Some(WireValue::Handle(h)) => *h,
            other => {
                return Err(format!(
                    "{}: argument #{i}: expected a module, got {}",
                    a.f,
                    other.map_or("nothing".to_owned(), |v| v.to_string())
                ))
            }
        };
        match self.handles.get(&h) {
            Some(Object::Module(m)) => Ok(m.clone()),
            _ => Err(format!(
                "{}: {h:#x} is not a module handle of this session",
                a.f
            )),
        }
    }

    fn run_timer(&mut self, h: u64, args: &[WireValue]) -> Reply {
        let Some(Object::Timer(t)) = self.handles.get(&h) else {
            return Err("not a timer".into());
        };
        let t = Timer {
            func: t.func.clone(),
            name: t.name.clone(),
            preproc: t.preproc.clone(),
            ..**t
        };
        let api = registry::get_for(t.dev).map_err(|e| e.to_string())?;
        let sync = || {
            api.sync_stream(t.dev, api.current_stream(t.dev))
                .map_err(|e| e.to_string())
        };
        self.call_packed(&t.func, args)?;
        sync()?;
        let mut number = t.number;
        let mut out = Vec::with_capacity(t.repeat as usize * 8);
        for i in 0..t.repeat {
            match &t.preproc {
                Some(Callee::Func(p)) => {
                    self.call_packed(p, args)?;
                }
                Some(Callee::CacheFlush) => self.cache_flush(args)?,
                None => {}
            }
            let mut duration_ms = 0.0f64;
            let mut zero_times = 0;
            loop {
                if duration_ms > 0.0 {
                    let per = duration_ms / number as f64;
                    number =
                        ((t.min_repeat_ms as f64 / per + 1.0).max(number as f64 * 1.618)) as i64;
                }
                sync()?;
                let start = Instant::now();
                for _ in 0..number {
                    self.call_packed(&t.func, args)
                        .map_err(|e| format!("timing `{}`: {e}", t.name))?;
                }
                sync()?;
                let nanos = start.elapsed().as_nanos();
                if nanos == 0 {
                    zero_times += 1;
                }
                duration_ms = nanos as f64 / 1e6;
                if duration_ms >= t.min_repeat_ms as f64
                    || zero_times >= t.limit_zero_time_iterations
                {
                    break;
                }
            }
            out.extend_from_slice(&(duration_ms / 1e3 / number as f64).to_le_bytes());
            if t.cooldown_interval_ms > 0 && i % t.repeats_to_cooldown == 0 {
                std::thread::sleep(Duration::from_millis(t.cooldown_interval_ms as u64));
            }
        }
        Ok(vec![WireValue::Int(66), WireValue::Bytes(out)])
    }

    // ---------------------------------------------------------------------------------- files

    /// A client's path inside the session's directory: relative, no `..`, no symbolic link.
    fn resolve(&self, rel: &str, what: &str) -> Result<PathBuf, String> {
        let p = Path::new(rel);
        if rel.is_empty() || rel.contains('\0') {
            return Err(format!("{what}: an empty path or one with a NUL byte"));
        }
        let mut out = self.workdir.clone();
        for c in p.components() {
            match c {
                Component::Normal(s) if s != LOADED_DIR => {
                    out.push(s);
                    if let Ok(m) = std::fs::symlink_metadata(&out) {
                        if m.file_type().is_symlink() {
                            return Err(format!(
                                "{what}: `{rel}` goes through a symbolic link; paths stay inside \
                                 the session's directory"
                            ));
                        }
                    }
                }
                Component::CurDir => {}
                _ => {
                    return Err(format!(
                        "{what}: `{rel}` is not a plain relative path (absolute paths, `..` and \
                         `{LOADED_DIR}` are refused); paths stay inside the session's directory"
                    ))
                }
            }
        }
        Ok(out)
    }

    fn load_module(&mut self, rel: &str) -> Result<Arc<dyn Module>, String> {
        let what = "tvm.rpc.server.load_module";
        let path = self.resolve(rel, what)?;
        let m = std::fs::symlink_metadata(&path)
            .map_err(|e| format!("{what}: {}: {e}", path.display()))?;
        if !m.is_file() {
            return Err(format!("{what}: {} is not a file", path.display()));
        }
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        // `dlopen` hands back a library it already holds for the same path: a client that
        // uploads a new `lib.so` over the old one must get the new code, so every load is of
        // its own copy.
        let dir = self.workdir.join(LOADED_DIR);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{what}: {e}"))?;
        self.loaded += 1;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let copy = dir.join(format!("{}-{name}.so", self.loaded));
        match ext {
            "so" => {
                std::fs::copy(&path, &copy).map_err(|e| format!("{what}: {e}"))?;
            }
            // Objects, as TVM's `export_library(fcompile=tar)` and MetaSchedule's builder
            // write them: linked here, as TVM's server does.
            "o" | "tar" => {
                let objects = if ext == "o" {
                    vec![path.clone()]
                } else {
                    let raw = std::fs::read(&path).map_err(|e| format!("{what}: {e}"))?;
                    let data = super::link::maybe_gunzip(&raw, self.limits.max_packet_bytes)
                        .map_err(|e| format!("{what}: `{rel}`: {e}"))?;
                    let members = super::link::tar_members(&data)
                        .map_err(|e| format!("{what}: `{rel}`: {e}"))?;
                    let unpack = dir.join(format!("{}-{name}.d", self.loaded));
                    std::fs::create_dir_all(&unpack).map_err(|e| format!("{what}: {e}"))?;
                    let mut objects = Vec::new();
                    for (m, bytes) in members {
                        let p = unpack.join(&m);
                        std::fs::write(&p, bytes).map_err(|e| format!("{what}: {e}"))?;
                        if m.ends_with(".o") {
                            objects.push(p);
                        }
                    }
                    if objects.is_empty() {
                        return Err(format!("{what}: `{rel}` holds no `.o` file"));
                    }
                    objects
                };
                super::link::link_shared(&objects, &copy)
                    .map_err(|e| format!("{what}: `{rel}`: {e}"))?;
            }
            _ => {
                return Err(format!(
                    "{what}: `{rel}`: kiln's server loads shared libraries (`.so`, from \
                     `export_library` or `kiln build`) and links `.o` and `.tar` files of \
                     objects; `.{ext}` is neither"
                ))
            }
        }
        // SAFETY: running the client's code is what an RPC server is for: a client that can
        // connect can upload and run any library (as with TVM's server; the docs say so and the
        // server listens on loopback unless told otherwise). The library is a private copy no
        // one else writes.
        let lib = unsafe { LibraryModule::load(&copy) }.map_err(|e| format!("{what}: {e}"))?;
        log::info!("rpc: load_module {}", path.display());
        Ok(Arc::new(lib))
    }
}

impl<R: Read, W: Write> Drop for Session<R, W> {
    fn drop(&mut self) {
        // Functions of loaded libraries may reference the memory: drop them first.
        self.handles.clear();
        self.memory.free_all();
    }
}

/// The folder of private copies of loaded libraries inside a session's directory.
const LOADED_DIR: &str = ".kiln-loaded";

/// Positional arguments of a request, with typed accessors whose errors name the function.
struct Args<'a> {
    f: &'a str,
    v: &'a [WireValue],
}

impl<'a> Args<'a> {
    fn get(&self, i: usize, expected: &str) -> Result<&'a WireValue, String> {
        self.v.get(i).ok_or_else(|| {
            format!(
                "{}: argument #{i} ({expected}) is missing; got {} arguments",
                self.f,
                self.v.len()
            )
        })
    }

    fn bad<T>(&self, i: usize, expected: &str, got: &WireValue) -> Result<T, String> {
        Err(format!(
            "{}: argument #{i}: expected {expected}, got {got}",
            self.f
        ))
    }

    fn str(&self, i: usize) -> Result<&'a str, String> {
        match self.get(i, "str")? {
            WireValue::Str(s) => Ok(s),
            v => self.bad(i, "str", v),
        }
    }

    fn bytes(&self, i: usize) -> Result<&'a [u8], String> {
        match self.get(i, "bytes")? {
            WireValue::Bytes(b) => Ok(b),
            WireValue::Str(s) => Ok(s.as_bytes()),
            v => self.bad(i, "bytes", v),
        }
    }

    fn int(&self, i: usize) -> Result<i64, String> {
        match self.get(i, "int")? {
            WireValue::Int(v) => Ok(*v),
            WireValue::Bool(b) => Ok(i64::from(*b)),
            v => self.bad(i, "int", v),
        }
    }

    fn uint(&self, i: usize) -> Result<u64, String> {
        let v = self.int(i)?;
        u64::try_from(v).map_err(|_| format!("{}: argument #{i}: expected a size, got {v}", self.f))
    }

    fn handle(&self, i: usize) -> Result<u64, String> {
        match self.get(i, "handle")? {
            WireValue::Handle(h) | WireValue::Function(h) | WireValue::Module(h) => Ok(*h),
            WireValue::None => Ok(0),
            v => self.bad(i, "handle", v),
        }
    }

    fn device(&self, i: usize) -> Result<Device, String> {
        match self.get(i, "Device")? {
            WireValue::Device(d) => Ok(Device::from(*d)),
            v => self.bad(i, "Device", v),
        }
    }

    fn dtype(&self, i: usize) -> Result<DLDataType, String> {
        match self.get(i, "DataType")? {
            WireValue::DataType(d) => Ok(*d),
            v => self.bad(i, "DataType", v),
        }
    }

    fn tensor(&self, i: usize) -> Result<&'a WireTensor, String> {
        match self.get(i, "DLTensor*")? {
            WireValue::Tensor(t) => Ok(t),
            v => self.bad(i, "DLTensor*", v),
        }
    }
}

fn next_rand(s: &mut u64) -> u64 {
    // splitmix64: fast, and good enough to fill tensors for timing.
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `out` with random elements of `dtype`: floats uniform in [-1, 1), integers in [-8, 8)
/// (or [0, 16) unsigned), booleans 0 or 1. Finite and small, so that timing never meets NaNs,
/// denormals or overflow.
fn fill_random(s: &mut u64, dtype: DLDataType, out: &mut [u8]) -> Result<(), String> {
    let unif = |s: &mut u64| (next_rand(s) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    let elem = match (dtype.code, dtype.bits) {
        (DLDataTypeCode::FLOAT, 16 | 32 | 64)
        | (DLDataTypeCode::BFLOAT, 16)
        | (DLDataTypeCode::INT | DLDataTypeCode::UINT, 8 | 16 | 32 | 64) => {
            usize::from(dtype.bits / 8)
        }
        (DLDataTypeCode::INT | DLDataTypeCode::UINT, 1) => 1,
        _ => return Err(format!("no random fill for {dtype}")),
    };
    for chunk in out.chunks_mut(elem) {
        let v: [u8; 8] = match (dtype.code, dtype.bits) {
            (DLDataTypeCode::FLOAT, 32) => {
                let b = (unif(s) as f32).to_le_bytes();
                [b[0], b[1], b[2], b[3], 0, 0, 0, 0]
            }
            (DLDataTypeCode::FLOAT, 64) => unif(s).to_le_bytes(),
            (DLDataTypeCode::FLOAT, 16) => {
                let b = half::f16::from_f64(unif(s)).to_le_bytes();
                [b[0], b[1], 0, 0, 0, 0, 0, 0]
            }
            (DLDataTypeCode::BFLOAT, 16) => {
                let b = half::bf16::from_f64(unif(s)).to_le_bytes();
                [b[0], b[1], 0, 0, 0, 0, 0, 0]
            }
            (DLDataTypeCode::INT, _) if dtype.bits > 1 => {
                ((next_rand(s) % 16) as i64 - 8).to_le_bytes()
            }
            _ if dtype.bits == 1 => (next_rand(s) & 1).to_le_bytes(),
            _ => (next_rand(s) % 16).to_le_bytes(),
        };
        let n = chunk.len();
        chunk.copy_from_slice(&v[..n]);
    }
    Ok(())
}
