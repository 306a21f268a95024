//! kiln's RPC server and client, without Python: kiln's client against kiln's server, every bad
//! peer of the issue (wrong magic, wrong key, truncated packets, huge lengths, unknown codes,
//! the pre-0.21 encoding, a version mismatch, disconnects mid-call, forged tensors, paths that
//! try to leave the session's directory), and what a session leaves behind (nothing).
//!
//! After every bad peer a good client is served, so the server demonstrably keeps serving.

mod common;
#[path = "plugin_util/mod.rs"]
mod plugin_util;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kiln::codegen::llvm::{export, CodegenOptions};
use kiln::device_api::{registry, Device, DeviceType};
use kiln::ir::IRModule;
use kiln::packed_func::{DLDataType, DLDevice, DLDeviceType};
use kiln::rpc::wire::{self, RpcCode, WireTensor, WireValue, Writer, RPC_MAGIC};
use kiln::rpc::{RemoteSession, Server, ServerConfig, StopHandle};
use kiln::schedule::kernels as sk;
use kiln::target::Target;

/// The tests share the process's CPU allocation counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

struct Running {
    port: u16,
    stop: StopHandle,
    thread: Option<std::thread::JoinHandle<()>>,
    log: std::sync::Arc<Mutex<Vec<String>>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start(limits: Option<u64>) -> Running {
    start_with(limits, Duration::from_micros(200))
}

fn start_with(limits: Option<u64>, spin: Duration) -> Running {
    let log = std::sync::Arc::new(Mutex::new(Vec::new()));
    let l2 = log.clone();
    let mut cfg = ServerConfig {
        port: 0,
        spin,
        log: Some(std::sync::Arc::new(move |m: &str| {
            l2.lock().unwrap().push(m.to_owned());
        })),
        ..ServerConfig::default()
    };
    if let Some(max) = limits {
        cfg.limits.max_packet_bytes = max;
    }
    let server = Server::bind(cfg).unwrap();
    let port = server.port();
    let stop = server.stop_handle();
    let thread = std::thread::spawn(move || server.serve().unwrap());
    Running {
        port,
        stop,
        thread: Some(thread),
        log,
    }
}

fn kiln_vadd(dir: &Path) -> PathBuf {
    let path = dir.join("vadd.so");
    let t = Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap();
    let o = CodegenOptions::from_target(&t).unwrap();
    export(
        &IRModule::from_functions(vec![sk::vadd().unwrap()]),
        &o,
        &path,
    )
    .unwrap();
    path
}

const CPU: DLDevice = DLDevice {
    device_type: DLDeviceType::CPU,
    device_id: 0,
};

fn f32() -> DLDataType {
    DLDataType::parse("float32").unwrap()
}

fn bytes_of(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn cpu_in_use() -> u64 {
    let dev = Device::new(DeviceType::CPU, 0);
    registry::get_for(dev)
        .unwrap()
        .memory_stats(dev)
        .unwrap()
        .in_use
}

/// A good client: upload, load, call `vadd` on 1000 elements, check, time, clean up.
fn good_client(port: u16, lib: &Path) {
    let mut s = RemoteSession::connect(&format!("127.0.0.1:{port}"), "", None).unwrap();
    s.upload("vadd.so", &std::fs::read(lib).unwrap()).unwrap();
    let m = s.load_module("vadd.so").unwrap();
    let f = s.module_function(m, "vadd").unwrap();
    let n = 1000;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 0.5 - i as f32 * 2.0).collect();
    let ta = s.alloc(CPU, &[n], f32()).unwrap();
    let tb = s.alloc(CPU, &[n], f32()).unwrap();
    let tc = s.alloc(CPU, &[n], f32()).unwrap();
    s.copy_to(&ta, &bytes_of(&a)).unwrap();
    s.copy_to(&tb, &bytes_of(&b)).unwrap();
    let args = [
        WireValue::Tensor(ta.clone()),
        WireValue::Tensor(tb.clone()),
        WireValue::Tensor(tc.clone()),
    ];
    assert_eq!(s.call(f, &args).unwrap(), WireValue::None);
    let c = f32s(&s.copy_from(&tc).unwrap());
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(c, want);
    let times = s.time(m, "vadd", CPU, 10, 3, 1, &args).unwrap();
    assert_eq!(times.len(), 3);
    assert!(times.iter().all(|t| *t > 0.0 && *t < 1.0), "{times:?}");
    for t in [&ta, &tb, &tc] {
        s.free(t).unwrap();
    }
    s.free_handle(f).unwrap();
    s.free_handle(m).unwrap();
    s.shutdown().unwrap();
}

/// A raw connection for writing bad packets.
struct Raw {
    s: TcpStream,
}

impl Raw {
    fn connect(port: u16, key: &str) -> (Self, i32) {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let key = format!("client:{key}");
        let mut out = RPC_MAGIC.to_le_bytes().to_vec();
        out.extend_from_slice(&(key.len() as i32).to_le_bytes());
        out.extend_from_slice(key.as_bytes());
        s.write_all(&out).unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        let code = i32::from_le_bytes(b);
        if code == RPC_MAGIC {
            s.read_exact(&mut b).unwrap();
            let mut k = vec![0u8; i32::from_le_bytes(b) as usize];
            s.read_exact(&mut k).unwrap();
            assert_eq!(k, b"server:");
        }
        (Self { s }, code)
    }

    /// A session after InitServer.
    fn session(port: u16) -> Self {
        let (mut r, code) = Self::connect(port, "");
        assert_eq!(code, RPC_MAGIC);
        let mut p = Writer::packet(RpcCode::InitServer);
        p.blob(b"0.8.0");
        p.seq(&[]);
        assert_eq!(
            r.roundtrip(&p.finish()),
            (RpcCode::Return, vec![WireValue::None])
        );
        r
    }

    fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).unwrap();
    }

    fn recv(&mut self) -> (RpcCode, Vec<u8>) {
        let mut b = [0u8; 8];
        self.s.read_exact(&mut b).unwrap();
        let len = u64::from_le_bytes(b);
        let mut c = [0u8; 4];
        self.s.read_exact(&mut c).unwrap();
        let mut body = vec![0u8; len as usize - 4];
        self.s.read_exact(&mut body).unwrap();
        (RpcCode::from_i32(i32::from_le_bytes(c)).unwrap(), body)
    }

    fn roundtrip(&mut self, b: &[u8]) -> (RpcCode, Vec<WireValue>) {
        self.send(b);
        let (code, body) = self.recv();
        (code, wire::decode_seq(&body).unwrap())
    }

    /// Sends a request and expects an exception whose text contains `needle`.
    fn expect_exception(&mut self, b: &[u8], needle: &str) -> String {
        let (code, v) = self.roundtrip(b);
        assert_eq!(code, RpcCode::Exception, "{v:?}");
        let WireValue::Str(msg) = &v[0] else {
            panic!("{v:?}")
        };
        assert!(msg.contains(needle), "expected `{needle}` in: {msg}");
        msg.clone()
    }

    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0) | Err(_))
    }

    fn syscall(code: RpcCode, args: &[WireValue]) -> Vec<u8> {
        let mut p = Writer::packet(code);
        p.seq(args);
        p.finish()
    }
}

#[test]
fn kiln_client_runs_on_kiln_server() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let lib = kiln_vadd(dir.path());
    let srv = start(None);
    good_client(srv.port, &lib);
    good_client(srv.port, &lib);
    // A server that blocks at once for each request (no polling).
    let srv = start_with(None, Duration::ZERO);
    good_client(srv.port, &lib);
}

#[test]
fn kiln_run_over_rpc() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let lib = kiln_vadd(dir.path());
    let srv = start(None);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run"])
        .arg(&lib)
        .args([
            "vadd",
            "rand:4096",
            "rand:4096",
            "zeros:4096",
            "--repeat",
            "5",
        ])
        .args(["--rpc", &format!("127.0.0.1:{}", srv.port), "--out"])
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("5 runs on the remote cpu"), "{text}");
    // The result came back: C = A + B.
    let read = |n: &str| kiln::npy::NpyArray::read(&dir.path().join("out").join(n)).unwrap();
    let (a, b, c) = (read("arg0.npy"), read("arg1.npy"), read("arg2.npy"));
    let (a, b, c) = (
        f32s(a.data.as_slice()),
        f32s(b.data.as_slice()),
        f32s(c.data.as_slice()),
    );
    assert!(a.iter().zip(&b).zip(&c).all(|((x, y), z)| x + y == *z));
}

#[test]
fn bad_handshakes_are_refused_and_the_server_goes_on() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let lib = kiln_vadd(dir.path());
    let srv = start(None);
    // A wrong magic: the connection is closed.
    let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&0x1234i32.to_le_bytes()).unwrap();
    let mut b = [0u8; 4];
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
    // A key the server does not serve: the mismatch code.
    let (_, code) = Raw::connect(srv.port, "someone-else");
    assert_eq!(code, wire::RPC_CODE_MISMATCH);
    // A huge key length.
    let mut s = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&RPC_MAGIC.to_le_bytes()).unwrap();
    s.write_all(&i32::MAX.to_le_bytes()).unwrap();
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
    good_client(srv.port, &lib);
    let log = srv.log.lock().unwrap().join("\n");
    assert!(log.contains("wrong magic 0x1234"), "{log}");
    assert!(log.contains("key mismatch"), "{log}");
    assert!(log.contains("a key of 2147483647 bytes"), "{log}");
}

#[test]
fn bad_packets_get_clear_errors() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let lib = kiln_vadd(dir.path());
    let srv = start(Some(1 << 20));

    // A request before InitServer.
    let (mut r, _) = Raw::connect(srv.port, "");
    r.expect_exception(
        &Raw::syscall(RpcCode::GetGlobalFunc, &[WireValue::Str("x".into())]),
        "before InitServer",
    );
    // A protocol version mismatch.
    let mut p = Writer::packet(RpcCode::InitServer);
    p.blob(b"0.7.0");
    p.seq(&[]);
    r.expect_exception(&p.finish(), "client protocol=0.7.0");
    drop(r);

    let mut r = Raw::session(srv.port);
    // An unknown code: answered, and the session goes on.
    let mut p = Writer::packet(RpcCode::None);
    p.raw(&[1, 2, 3]);
    let mut pk = p.finish();
    pk[8..12].copy_from_slice(&99i32.to_le_bytes());
    r.expect_exception(&pk, "unknown RPC code 99");
    // TVM 0.20's encoding of a string (type code 11, then a u64 length).
    let mut p = Writer::packet(RpcCode::GetGlobalFunc);
    p.i32(1);
    p.i32(11);
    p.blob(b"tvm.rpc.server.upload");
    r.expect_exception(&p.finish(), "pre-0.21");
    // A truncated argument inside a well-framed packet.
    let mut p = Writer::packet(RpcCode::GetGlobalFunc);
    p.i32(1);
    p.i32(8);
    p.u64(1 << 40);
    r.expect_exception(&p.finish(), "truncated packet");
    // An unknown handle, a double free, a foreign pointer.
    r.expect_exception(
        &Raw::syscall(RpcCode::FreeHandle, &[WireValue::Handle(0xdead)]),
        "not a handle of this session",
    );
    let (code, v) = r.roundtrip(&Raw::syscall(
        RpcCode::DevAllocData,
        &[
            WireValue::Device(CPU),
            WireValue::Int(64),
            WireValue::Int(64),
            WireValue::DataType(f32()),
        ],
    ));
    assert_eq!(code, RpcCode::Return);
    let WireValue::Handle(ptr) = v[0] else {
        panic!("{v:?}")
    };
    let free = Raw::syscall(
        RpcCode::DevFreeData,
        &[WireValue::Device(CPU), WireValue::Handle(ptr)],
    );
    assert_eq!(r.roundtrip(&free).0, RpcCode::Return);
    r.expect_exception(&free, "already freed");
    // The session still works.
    let (code, v) = r.roundtrip(&Raw::syscall(
        RpcCode::GetGlobalFunc,
        &[WireValue::Str("tvm.rpc.server.upload".into())],
    ));
    assert_eq!(code, RpcCode::Return);
    assert!(matches!(v[0], WireValue::Handle(h) if h != 0));
    // A packet larger than the limit: refused, and the session ends (the stream cannot be
    // followed past a body the server will not read).
    let mut huge = 0u64.to_le_bytes().to_vec();
    huge[..8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    huge.extend_from_slice(&(RpcCode::CallFunc as i32).to_le_bytes());
    r.send(&huge);
    let (code, body) = r.recv();
    assert_eq!(code, RpcCode::Exception);
    let msg = format!("{:?}", wire::decode_seq(&body).unwrap());
    assert!(msg.contains("exceeds the server's limit"), "{msg}");
    assert!(r.closed());

    // A client that disconnects mid-packet, and one that disconnects mid-copy.
    let mut r = Raw::session(srv.port);
    let mut p = Writer::packet(RpcCode::CallFunc);
    p.u64(1);
    let mut pk = p.finish();
    pk[..8].copy_from_slice(&1000u64.to_le_bytes());
    r.send(&pk);
    drop(r);
    let mut r = Raw::session(srv.port);
    let t = alloc(&mut r, 1 << 16);
    let mut p = Writer::packet(RpcCode::CopyToRemote);
    p.tensor(&t);
    p.u64(1 << 16);
    let len = p.body_len() as u64 + (1 << 16);
    r.send(&p.finish_with_len(len));
    r.send(&[7u8; 1000]);
    drop(r);

    good_client(srv.port, &lib);
}

fn alloc(r: &mut Raw, n: i64) -> WireTensor {
    let mut t = WireTensor {
        data: 0,
        device: CPU,
        dtype: DLDataType::parse("uint8").unwrap(),
        shape: vec![n],
        byte_offset: 0,
    };
    let (code, v) = r.roundtrip(&Raw::syscall(
        RpcCode::DevAllocDataWithScope,
        &[WireValue::Tensor(t.clone()), WireValue::None],
    ));
    assert_eq!(code, RpcCode::Return, "{v:?}");
    let WireValue::Handle(h) = v[0] else {
        panic!("{v:?}")
    };
    t.data = h;
    t
}

#[test]
fn forged_tensors_never_touch_memory() {
    let _g = serial();
    let srv = start(None);
    let mut r = Raw::session(srv.port);
    let t = alloc(&mut r, 256);
    // A pointer the session never allocated.
    let forged = WireTensor {
        data: 0xdead_0000,
        ..t.clone()
    };
    let mut p = Writer::packet(RpcCode::CopyToRemote);
    p.tensor(&forged);
    p.u64(256);
    p.raw(&[0u8; 256]);
    r.expect_exception(&p.finish(), "not memory this session allocated");
    // An offset that runs past the allocation, both ways.
    let past = WireTensor {
        byte_offset: 200,
        ..t.clone()
    };
    let mut p = Writer::packet(RpcCode::CopyToRemote);
    p.tensor(&past);
    p.u64(100);
    p.raw(&[0u8; 100]);
    r.expect_exception(&p.finish(), "run past its end");
    let mut p = Writer::packet(RpcCode::CopyFromRemote);
    p.tensor(&t);
    p.u64(257);
    r.expect_exception(&p.finish(), "run past its end");
    // An offset so large it wraps around.
    let wrap = WireTensor {
        byte_offset: u64::MAX - 10,
        ..t.clone()
    };
    let mut p = Writer::packet(RpcCode::CopyFromRemote);
    p.tensor(&wrap);
    p.u64(100);
    r.expect_exception(&p.finish(), "run past its end");
    // A header whose sizes disagree with the packet: the session cannot go on.
    let mut p = Writer::packet(RpcCode::CopyToRemote);
    p.tensor(&t);
    p.u64(10);
    p.raw(&[0u8; 20]);
    r.expect_exception(&p.finish(), "header says");
    assert!(r.closed());

    // The same checks guard function arguments: a forged tensor passed to a kernel.
    let dir = tempfile::tempdir().unwrap();
    let lib = kiln_vadd(dir.path());
    let mut s = RemoteSession::connect(&format!("127.0.0.1:{}", srv.port), "", None).unwrap();
    s.upload("v.so", &std::fs::read(&lib).unwrap()).unwrap();
    let m = s.load_module("v.so").unwrap();
    let f = s.module_function(m, "vadd").unwrap();
    let a = s.alloc(CPU, &[16], f32()).unwrap();
    let big = WireTensor {
        shape: vec![1 << 20],
        ..a.clone()
    };
    let err = s
        .call(
            f,
            &[
                WireValue::Tensor(a.clone()),
                WireValue::Tensor(a.clone()),
                WireValue::Tensor(big),
            ],
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("argument #2 of `vadd`") && err.contains("run past its end"),
        "{err}"
    );
    // A timer of a function that does not exist.
    let err = s
        .time(m, "nope", CPU, 1, 1, 0, &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("no function `nope`"), "{err}");
    s.shutdown().unwrap();
}

#[test]
fn paths_stay_in_the_session_directory() {
    let _g = serial();
    let srv = start(None);
    let outside = tempfile::tempdir().unwrap();
    let mut s = RemoteSession::connect(&format!("127.0.0.1:{}", srv.port), "", None).unwrap();
    for bad in [
        "../x.so",
        "/tmp/x.so",
        "a/../../x.so",
        "",
        ".kiln-loaded/x.so",
    ] {
        let err = s.upload(bad, b"x").unwrap_err().to_string();
        assert!(
            err.contains("session's directory") || err.contains("empty path"),
            "{bad}: {err}"
        );
    }
    // A symbolic link inside the directory (made here, as only someone on the server could)
    // is not followed.
    let wp = s.get_function("tvm.rpc.server.workpath").unwrap().unwrap();
    let WireValue::Str(link) = s.call(wp, &[WireValue::Str("link".into())]).unwrap() else {
        panic!()
    };
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
    let err = s.upload("link/evil.so", b"x").unwrap_err().to_string();
    assert!(err.contains("symbolic link"), "{err}");
    assert!(!outside.path().join("evil.so").exists());
    // Nested folders inside are fine, and load_module refuses what it cannot load.
    s.upload("sub/dir/x.txt", b"hello").unwrap();
    let err = s.load_module("sub/dir/x.txt").unwrap_err().to_string();
    assert!(err.contains("loads shared libraries"), "{err}");
    s.upload("bad.tar", &[0u8; 100]).unwrap();
    s.upload("bad.o", b"not an object").unwrap();
    let err = s.load_module("bad.o").unwrap_err().to_string();
    assert!(
        err.contains("-shared` failed") || err.contains("C compiler"),
        "{err}"
    );
    s.upload("junk.so", b"not an ELF file").unwrap();
    let err = s.load_module("junk.so").unwrap_err().to_string();
    assert!(err.contains("junk.so"), "{err}");
    s.shutdown().unwrap();
}

#[test]
fn a_session_leaves_nothing_behind() {
    let _g = serial();
    let srv = start(None);
    let before = cpu_in_use();
    let mut workdir = None;
    for i in 0..20 {
        let mut s = RemoteSession::connect(&format!("127.0.0.1:{}", srv.port), "", None).unwrap();
        // Allocations the client never frees, a handle it never releases, a file.
        for _ in 0..4 {
            s.alloc(CPU, &[1 << 16], f32()).unwrap();
        }
        // The counter sees them (so the check at the end means something).
        assert!(cpu_in_use() >= before + 4 * (1 << 18));
        s.get_function("tvm.rpc.server.upload").unwrap();
        s.upload("f.bin", &[1u8; 1000]).unwrap();
        let wp = s.get_function("tvm.rpc.server.workpath").unwrap().unwrap();
        if let WireValue::Str(p) = s.call(wp, &[WireValue::Str("f.bin".into())]).unwrap() {
            workdir = Some(PathBuf::from(p).parent().unwrap().to_owned());
        }
        // Half the clients vanish without a shutdown.
        if i % 2 == 0 {
            s.shutdown().unwrap();
        }
    }
    let dir = workdir.unwrap();
    let start = Instant::now();
    while (cpu_in_use() != before || dir.exists()) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(cpu_in_use(), before, "allocations outlived their sessions");
    assert!(!dir.exists(), "{} outlived its session", dir.display());
}

#[test]
fn opencl_kernels_run_on_the_remote_device() {
    let _g = serial();
    if common::opencl_device("opencl_kernels_run_on_the_remote_device").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ir = dir.path().join("vadd_cl.json");
    std::fs::write(
        &ir,
        IRModule::from_functions(vec![common::device_vadd()]).to_json_string(),
    )
    .unwrap();
    let srv = start(None);
    // `kiln run --rpc`: built here for OpenCL, uploaded, run on the server's OpenCL device,
    // checked against the interpreter.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .arg(&ir)
        .args([
            "vadd",
            "rand:1000",
            "rand:1000",
            "zeros:1000",
            "--check",
            "--repeat",
            "3",
        ])
        .args(["--target", "opencl", "--device", "opencl"])
        .args(["--rpc", &format!("127.0.0.1:{}", srv.port), "--out"])
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("max abs difference 0e0"), "{text}");
    assert!(text.contains("3 runs on the remote opencl"), "{text}");
    // A CPU pointer passed where the kernel wants the OpenCL device's memory.
    let lib = dir.path().join("vadd_cl.so");
    kiln::cli::run([
        "kiln",
        "build",
        ir.to_str().unwrap(),
        "-t",
        "opencl",
        "-o",
        lib.to_str().unwrap(),
    ]);
    let mut s = RemoteSession::connect(&format!("127.0.0.1:{}", srv.port), "", None).unwrap();
    s.upload("cl.so", &std::fs::read(&lib).unwrap()).unwrap();
    let m = s.load_module("cl.so").unwrap();
    let f = s.module_function(m, "vadd").unwrap();
    let cl = DLDevice {
        device_type: DLDeviceType::OPENCL,
        device_id: 0,
    };
    let a = s.alloc(cl, &[8], f32()).unwrap();
    let h = s.alloc(CPU, &[8], f32()).unwrap();
    s.copy_to(&a, &bytes_of(&[1.0; 8])).unwrap();
    let err = s
        .call(
            f,
            &[
                WireValue::Tensor(a.clone()),
                WireValue::Tensor(a.clone()),
                WireValue::Tensor(h),
            ],
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("device"), "{err}");
    s.call(
        f,
        &[
            WireValue::Tensor(a.clone()),
            WireValue::Tensor(a.clone()),
            WireValue::Tensor(a.clone()),
        ],
    )
    .unwrap();
    assert_eq!(f32s(&s.copy_from(&a).unwrap()), vec![2.0; 8]);
    s.shutdown().unwrap();
}

#[test]
fn a_session_past_its_timeout_is_closed_and_the_server_goes_on() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let lib = kiln_vadd(dir.path());
    let srv = start(None);
    let mut s = RemoteSession::connect(
        &format!("127.0.0.1:{}", srv.port),
        "",
        Some(Duration::from_secs(1)),
    )
    .unwrap();
    s.alloc(CPU, &[1024], f32()).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(s.get_function("tvm.rpc.server.upload").is_err());
    good_client(srv.port, &lib);
    let log = srv.log.lock().unwrap().join("\n");
    assert!(log.contains("timeout expired"), "{log}");
}

#[test]
fn plugin_devices_are_served_too() {
    use kiln::device_api::DeviceApi;
    let _g = serial();
    // The sample plugin (a C library on the plugin ABI) registered in the server's process.
    let api = plugin_util::sample("rpc_sample", &[]);
    let dev = DLDevice {
        device_type: DLDeviceType(api.device_type().0),
        device_id: 0,
    };
    let srv = start(None);
    let mut s = RemoteSession::connect(&format!("127.0.0.1:{}", srv.port), "", None).unwrap();
    let t = s.alloc(dev, &[256], f32()).unwrap();
    let data: Vec<f32> = (0..256).map(|i| i as f32 * 0.25).collect();
    s.copy_to(&t, &bytes_of(&data)).unwrap();
    assert_eq!(f32s(&s.copy_from(&t).unwrap()), data);
    // Into a second plugin tensor on the server, and back.
    let u = s.alloc(dev, &[256], f32()).unwrap();
    let among = s
        .get_function("tvm.contrib.random.random_fill")
        .unwrap()
        .unwrap();
    s.call(among, &[WireValue::Tensor(u.clone())]).unwrap();
    let filled = f32s(&s.copy_from(&u).unwrap());
    assert!(filled.iter().all(|x| (-1.0..1.0).contains(x)) && filled.iter().any(|x| *x != 0.0));
    // A handle-based device takes no pointer arithmetic.
    let inside = WireTensor {
        data: t.data + 4,
        shape: vec![1],
        ..t.clone()
    };
    let err = s.copy_from(&inside).unwrap_err().to_string();
    assert!(
        err.contains("handle") || err.contains("not memory"),
        "{err}"
    );
    s.free(&t).unwrap();
    s.free(&u).unwrap();
    s.shutdown().unwrap();
}
