//! kiln as an RPC client: [`RemoteSession`] drives any server of TVM's protocol (kiln's or
//! TVM's own): upload a library, load it, move tensors, call and time functions.
//!
//! ```no_run
//! use kiln::rpc::RemoteSession;
//! use kiln::packed_func::{DLDataType, DLDevice};
//!
//! let mut s = RemoteSession::connect("127.0.0.1:9091", "", None)?;
//! s.upload("vadd.so", &std::fs::read("vadd.so")?)?;
//! let m = s.load_module("vadd.so")?;
//! let f = s.module_function(m, "vadd")?;
//! let cpu = DLDevice { device_type: kiln::packed_func::DLDeviceType::CPU, device_id: 0 };
//! let f32 = DLDataType::parse("float32").unwrap();
//! let a = s.alloc(cpu, &[1024], f32)?;
//! s.copy_to(&a, &vec![0u8; 4096])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::{BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::tracker::TrackerConn;
use super::wire::{
    Reader, RpcCode, WireTensor, WireValue, Writer, PROTOCOL_VERSION, RPC_CODE_MISMATCH, RPC_MAGIC,
};
use super::RpcError;
use crate::packed_func::ffi::{DLDataType, DLDevice};

/// Connects to `addr` (`host:port`) with a timeout.
pub(crate) fn connect_addr(addr: &str, timeout: Duration) -> Result<TcpStream, RpcError> {
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| RpcError::io(addr, e))?
        .collect();
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(RpcError::io(
        addr,
        last.unwrap_or_else(|| std::io::Error::other("the address resolves to nothing")),
    ))
}

/// A session with a remote server.
pub struct RemoteSession {
    r: BufReader<TcpStream>,
    w: TcpStream,
    addr: String,
    remote_key: String,
}

impl std::fmt::Debug for RemoteSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSession")
            .field("addr", &self.addr)
            .field("remote_key", &self.remote_key)
            .finish()
    }
}

impl RemoteSession {
    /// Connects to the server at `addr` with the match key `key` (`""` for a server started
    /// without a tracker), asking for a session of at most `timeout` (the server ends it then).
    ///
    /// # Errors
    /// The server cannot be reached, refuses the key, or does not speak the protocol.
    pub fn connect(addr: &str, key: &str, timeout: Option<Duration>) -> Result<Self, RpcError> {
        let sock = connect_addr(addr, Duration::from_secs(10))?;
        let _ = sock.set_nodelay(true);
        let mut w = sock.try_clone().map_err(|e| RpcError::io(addr, e))?;
        let mut hello = format!("client:{key}");
        if let Some(t) = timeout {
            hello.push_str(&format!(" -timeout={}", t.as_secs().max(1)));
        }
        let mut out = RPC_MAGIC.to_le_bytes().to_vec();
        out.extend_from_slice(&(hello.len() as i32).to_le_bytes());
        out.extend_from_slice(hello.as_bytes());
        w.write_all(&out).map_err(|e| RpcError::io(addr, e))?;
        let mut r = BufReader::new(sock);
        let mut b = [0u8; 4];
        r.read_exact(&mut b).map_err(|e| RpcError::io(addr, e))?;
        match i32::from_le_bytes(b) {
            RPC_MAGIC => {}
            RPC_CODE_MISMATCH => {
                return Err(RpcError::Protocol(format!(
                    "{addr}: the server does not serve the key `{key}`"
                )))
            }
            other => {
                return Err(RpcError::Protocol(format!(
                    "{addr} is not a TVM RPC server (it answered {other:#x})"
                )))
            }
        }
        r.read_exact(&mut b).map_err(|e| RpcError::io(addr, e))?;
        let n = i32::from_le_bytes(b);
        if !(0..=4096).contains(&n) {
            return Err(RpcError::Protocol(format!(
                "{addr}: a server key of {n} bytes"
            )));
        }
        let mut k = vec![0u8; n as usize];
        r.read_exact(&mut k).map_err(|e| RpcError::io(addr, e))?;
        let mut s = Self {
            r,
            w,
            addr: addr.to_owned(),
            remote_key: String::from_utf8_lossy(&k).into_owned(),
        };
        let mut p = Writer::packet(RpcCode::InitServer);
        p.blob(PROTOCOL_VERSION.as_bytes());
        p.seq(&[]);
        s.roundtrip(p.finish())?;
        Ok(s)
    }

    /// Asks the tracker at `tracker` for a server of `key` (waiting until one is free) and
    /// connects to it.
    ///
    /// # Errors
    /// As [`RemoteSession::connect`], and the tracker's.
    pub fn connect_tracker(
        tracker: &str,
        key: &str,
        priority: i64,
        timeout: Option<Duration>,
    ) -> Result<Self, RpcError> {
        let mut t = TrackerConn::connect(tracker, Duration::from_secs(10))?;
        let (host, port, matchkey) = t.request_server(key, priority)?;
        Self::connect(&format!("{host}:{port}"), &matchkey, timeout)
    }

    /// The key the server answered with (`server:<key>`).
    pub fn remote_key(&self) -> &str {
        &self.remote_key
    }

    fn send(&mut self, packet: &[u8]) -> Result<(), RpcError> {
        self.w
            .write_all(packet)
            .map_err(|e| RpcError::io(&self.addr, e))
    }

    /// Reads one reply: its code and body.
    fn recv(&mut self) -> Result<(RpcCode, Vec<u8>), RpcError> {
        let mut b = [0u8; 8];
        self.r
            .read_exact(&mut b)
            .map_err(|e| RpcError::io(&self.addr, e))?;
        let len = u64::from_le_bytes(b);
        if !(4..=(1u64 << 40)).contains(&len) {
            return Err(RpcError::Protocol(format!(
                "{}: a reply of {len} bytes",
                self.addr
            )));
        }
        let mut c = [0u8; 4];
        self.r
            .read_exact(&mut c)
            .map_err(|e| RpcError::io(&self.addr, e))?;
        let raw = i32::from_le_bytes(c);
        let code = RpcCode::from_i32(raw)
            .ok_or_else(|| RpcError::Protocol(format!("{}: reply code {raw}", self.addr)))?;
        let mut body = Vec::new();
        let n = (&mut self.r)
            .take(len - 4)
            .read_to_end(&mut body)
            .map_err(|e| RpcError::io(&self.addr, e))?;
        if n as u64 != len - 4 {
            return Err(RpcError::Protocol(format!(
                "{}: the connection closed in a reply",
                self.addr
            )));
        }
        Ok((code, body))
    }

    /// Sends a request and reads its `Return` values (an `Exception` is an error).
    fn roundtrip(&mut self, packet: Vec<u8>) -> Result<Vec<WireValue>, RpcError> {
        self.send(&packet)?;
        let (code, body) = self.recv()?;
        let values = super::wire::decode_seq(&body)
            .map_err(|e| RpcError::Protocol(format!("{}: a malformed reply: {e}", self.addr)))?;
        match code {
            RpcCode::Return => Ok(values),
            RpcCode::Exception => Err(RpcError::Remote(match values.first() {
                Some(WireValue::Str(s)) => s.clone(),
                _ => "an exception without a message".to_owned(),
            })),
            other => Err(RpcError::Protocol(format!(
                "{}: expected Return, got {other:?}",
                self.addr
            ))),
        }
    }

    fn syscall(&mut self, code: RpcCode, args: &[WireValue]) -> Result<WireValue, RpcError> {
        let mut p = Writer::packet(code);
        p.seq(args);
        let mut v = self.roundtrip(p.finish())?;
        if v.len() != 1 {
            return Err(RpcError::Protocol(format!(
                "{}: {code:?} returned {} values, expected 1",
                self.addr,
                v.len()
            )));
        }
        Ok(v.remove(0))
    }

    fn handle_of(&self, v: WireValue, what: &str) -> Result<u64, RpcError> {
        match v {
            WireValue::Handle(h) if h != 0 => Ok(h),
            other => Err(RpcError::Remote(format!(
                "{what}: the server returned {other}"
            ))),
        }
    }

    /// A global function of the server, or `None`.
    pub fn get_function(&mut self, name: &str) -> Result<Option<u64>, RpcError> {
        match self.syscall(RpcCode::GetGlobalFunc, &[WireValue::Str(name.to_owned())])? {
            WireValue::Handle(h) if h != 0 => Ok(Some(h)),
            _ => Ok(None),
        }
    }

    fn require_function(&mut self, name: &str) -> Result<u64, RpcError> {
        self.get_function(name)?
            .ok_or_else(|| RpcError::Remote(format!("the server has no function `{name}`")))
    }

    /// Calls a function handle; the result is the value (a handle stays a handle).
    pub fn call(&mut self, func: u64, args: &[WireValue]) -> Result<WireValue, RpcError> {
        let mut p = Writer::packet(RpcCode::CallFunc);
        p.u64(func);
        p.seq(args);
        let mut v = self.roundtrip(p.finish())?;
        match v.len() {
            2 => Ok(v.remove(1)),
            3 => Ok(v.remove(1)),
            n => Err(RpcError::Protocol(format!(
                "{}: a call returned {n} values, expected 2",
                self.addr
            ))),
        }
    }

    /// Releases a handle of the server.
    pub fn free_handle(&mut self, h: u64) -> Result<(), RpcError> {
        self.syscall(RpcCode::FreeHandle, &[WireValue::Handle(h)])
            .map(drop)
    }

    /// Writes `data` to `name` in the session's directory.
    pub fn upload(&mut self, name: &str, data: &[u8]) -> Result<(), RpcError> {
        let f = self.require_function("tvm.rpc.server.upload")?;
        self.call(
            f,
            &[
                WireValue::Str(name.to_owned()),
                WireValue::Bytes(data.to_vec()),
            ],
        )?;
        self.free_handle(f)
    }

    /// Loads an uploaded library; the result is its module handle.
    pub fn load_module(&mut self, name: &str) -> Result<u64, RpcError> {
        let f = self.require_function("tvm.rpc.server.load_module")?;
        let m = self.call(f, &[WireValue::Str(name.to_owned())])?;
        self.free_handle(f)?;
        self.handle_of(m, "load_module")
    }

    /// A function of a loaded module.
    pub fn module_function(&mut self, module: u64, name: &str) -> Result<u64, RpcError> {
        let f = self.require_function("tvm.rpc.server.ModuleGetFunction")?;
        let v = self.call(
            f,
            &[
                WireValue::Module(module),
                WireValue::Str(name.to_owned()),
                WireValue::Bool(true),
            ],
        )?;
        self.free_handle(f)?;
        match v {
            WireValue::Handle(h) if h != 0 => Ok(h),
            _ => Err(RpcError::Remote(format!(
                "the remote module has no function `{name}`"
            ))),
        }
    }

    /// Allocates a compact tensor on the server's `dev`.
    pub fn alloc(
        &mut self,
        dev: DLDevice,
        shape: &[i64],
        dtype: DLDataType,
    ) -> Result<WireTensor, RpcError> {
        let mut t = WireTensor {
            data: 0,
            device: dev,
            dtype,
            shape: shape.to_vec(),
            byte_offset: 0,
        };
        let v = self.syscall(
            RpcCode::DevAllocDataWithScope,
            &[WireValue::Tensor(t.clone()), WireValue::None],
        )?;
        t.data = self.handle_of(v, "DevAllocDataWithScope")?;
        Ok(t)
    }

    /// Frees a tensor from [`RemoteSession::alloc`].
    pub fn free(&mut self, t: &WireTensor) -> Result<(), RpcError> {
        self.syscall(
            RpcCode::DevFreeData,
            &[WireValue::Device(t.device), WireValue::Handle(t.data)],
        )
        .map(drop)
    }

    /// Copies `data` (all of the tensor's bytes) into a remote tensor.
    pub fn copy_to(&mut self, t: &WireTensor, data: &[u8]) -> Result<(), RpcError> {
        let mut p = Writer::packet(RpcCode::CopyToRemote);
        p.tensor(t);
        p.u64(data.len() as u64);
        let len = p.body_len() as u64 + data.len() as u64;
        let head = p.finish_with_len(len);
        self.send(&head)?;
        self.send(data)?;
        let (code, body) = self.recv()?;
        match code {
            RpcCode::Return => Ok(()),
            _ => Err(RpcError::Remote(exception_text(&body))),
        }
    }

    /// Copies a remote tensor's bytes back.
    pub fn copy_from(&mut self, t: &WireTensor) -> Result<Vec<u8>, RpcError> {
        let n = t
            .nbytes()
            .ok_or_else(|| RpcError::Protocol(format!("invalid shape {:?}", t.shape)))?;
        let mut p = Writer::packet(RpcCode::CopyFromRemote);
        p.tensor(t);
        p.u64(n);
        self.send(&p.finish())?;
        let (code, body) = self.recv()?;
        match code {
            RpcCode::CopyAck if body.len() as u64 == n => Ok(body),
            RpcCode::CopyAck => Err(RpcError::Protocol(format!(
                "{}: CopyAck of {} bytes, expected {n}",
                self.addr,
                body.len()
            ))),
            _ => Err(RpcError::Remote(exception_text(&body))),
        }
    }

    /// Times `name` of `module` on `dev` with TVM's time evaluator: `repeat` means of `number`
    /// calls each (raised until a repeat takes `min_repeat_ms`), in seconds.
    #[allow(clippy::too_many_arguments)]
    pub fn time(
        &mut self,
        module: u64,
        name: &str,
        dev: DLDevice,
        number: i64,
        repeat: i64,
        min_repeat_ms: i64,
        args: &[WireValue],
    ) -> Result<Vec<f64>, RpcError> {
        let te = self.require_function("runtime.RPCTimeEvaluator")?;
        let timer = self.call(
            te,
            &[
                WireValue::Module(module),
                WireValue::Str(name.to_owned()),
                WireValue::Int(dev.device_type.0.into()),
                WireValue::Int(dev.device_id.into()),
                WireValue::Int(number),
                WireValue::Int(repeat),
                WireValue::Int(min_repeat_ms),
                WireValue::Int(100),
                WireValue::Int(0),
                WireValue::Int(1),
                WireValue::Int(0),
                WireValue::Str(String::new()),
            ],
        )?;
        self.free_handle(te)?;
        let timer = self.handle_of(timer, "runtime.RPCTimeEvaluator")?;
        let out = self.call(timer, args);
        self.free_handle(timer)?;
        match out? {
            WireValue::Bytes(b) => Ok(b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect()),
            other => Err(RpcError::Protocol(format!(
                "the time evaluator returned {other}"
            ))),
        }
    }

    /// Ends the session (the server frees what it holds).
    pub fn shutdown(mut self) -> Result<(), RpcError> {
        let p = Writer::packet(RpcCode::Shutdown).finish();
        self.send(&p)
    }
}

fn exception_text(body: &[u8]) -> String {
    let mut r = Reader::new(body);
    match r.seq() {
        Ok(v) => match v.first() {
            Some(WireValue::Str(s)) => s.clone(),
            _ => "an exception without a message".to_owned(),
        },
        Err(e) => format!("a malformed reply: {e}"),
    }
}
