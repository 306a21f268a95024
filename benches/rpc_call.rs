//! The server's cost of a remote call, without a Python client in the way: kiln's Rust client
//! (`kiln::rpc::RemoteSession`) calls a 1-element `vadd` on `kiln rpc-server` and on TVM 0.27's
//! `python -m tvm.exec.rpc_server` over loopback, in interleaved rounds, and reports the median
//! round trip per call with its spread. Both servers load the same kiln-exported library.
//!
//! `cargo bench --bench rpc_call` (TVM's server needs `KILN_PYTHON` with apache-tvm 0.27,
//! tornado and cloudpickle; without it only kiln's server is measured).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln::codegen::llvm::{export, CodegenOptions};
use kiln::ir::IRModule;
use kiln::packed_func::{DLDataType, DLDevice, DLDeviceType};
use kiln::rpc::wire::WireValue;
use kiln::rpc::RemoteSession;
use kiln::schedule::kernels as sk;
use kiln::target::Target;

struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_port(port: u16) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            // TVM's server accepts and drops a probe; give it a moment to listen again.
            std::thread::sleep(Duration::from_millis(300));
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Microseconds per call of `calls` calls, after a warm-up.
fn measure(port: u16, lib: &[u8], calls: usize) -> f64 {
    let mut s = RemoteSession::connect(&format!("127.0.0.1:{port}"), "", None).unwrap();
    s.upload("vadd1.so", lib).unwrap();
    let m = s.load_module("vadd1.so").unwrap();
    let f = s.module_function(m, "vadd").unwrap();
    let cpu = DLDevice {
        device_type: DLDeviceType::CPU,
        device_id: 0,
    };
    let f32 = DLDataType::parse("float32").unwrap();
    let t: Vec<_> = (0..3).map(|_| s.alloc(cpu, &[1], f32).unwrap()).collect();
    for x in &t {
        s.copy_to(x, &1f32.to_le_bytes()).unwrap();
    }
    let args: Vec<WireValue> = t.iter().cloned().map(WireValue::Tensor).collect();
    for _ in 0..300 {
        s.call(f, &args).unwrap();
    }
    let start = Instant::now();
    for _ in 0..calls {
        s.call(f, &args).unwrap();
    }
    let us = start.elapsed().as_secs_f64() / calls as f64 * 1e6;
    assert_eq!(s.copy_from(&t[2]).unwrap(), 2f32.to_le_bytes());
    for x in &t {
        s.free(x).unwrap();
    }
    s.shutdown().unwrap();
    us
}

fn median(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vadd1.so");
    let t = Target::parse(r#"{"kind": "llvm", "mcpu": "native"}"#).unwrap();
    let o = CodegenOptions::from_target(&t).unwrap();
    export(
        &IRModule::from_functions(vec![sk::vadd().unwrap()]),
        &o,
        &path,
    )
    .unwrap();
    let lib = std::fs::read(&path).unwrap();

    let kiln_server = |spin: &str| {
        let port = free_port();
        let g = Guard(
            Command::new(env!("CARGO_BIN_EXE_kiln"))
                .args(["rpc-server", "--quiet", "--port", &port.to_string()])
                .args(["--spin-us", spin])
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        assert!(wait_port(port), "kiln rpc-server did not start");
        (port, g)
    };
    let (kport, _kiln) = kiln_server("200");
    // The same server blocking at once for each request (no polling): what the polling buys.
    let (bport, _kiln_blocking) = kiln_server("0");
    let py = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    let tport = free_port();
    let tvm = Command::new(&py)
        .args([
            "-m",
            "tvm.exec.rpc_server",
            "--host",
            "127.0.0.1",
            "--silent",
        ])
        .args([
            "--port",
            &tport.to_string(),
            "--port-end",
            &(tport + 1).to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
        .map(Guard);
    let have_tvm = tvm.is_some() && wait_port(tport);
    if !have_tvm {
        eprintln!("TVM's rpc_server did not start (KILN_PYTHON={py}): measuring kiln's only");
    }

    let rounds = 9;
    let calls = 5000;
    let (mut k, mut v, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        b.push(measure(bport, &lib, calls));
        if r % 2 == 0 || !have_tvm {
            k.push(measure(kport, &lib, calls));
        }
        if have_tvm {
            v.push(measure(tport, &lib, calls));
        }
        if r % 2 == 1 && have_tvm {
            k.push(measure(kport, &lib, calls));
        }
    }
    let cpu = kiln::tune::db::host_cpu();
    println!("rpc_call: {rounds} rounds of {calls} calls, kiln's Rust client, loopback, {cpu}");
    let (km, kmin, kmax) = median(&mut k);
    println!("  kiln rpc-server      {km:7.2} us per call [{kmin:.2}, {kmax:.2}]");
    let (bm, bmin, bmax) = median(&mut b);
    println!("  kiln, --spin-us 0    {bm:7.2} us per call [{bmin:.2}, {bmax:.2}]");
    if have_tvm {
        let (vm, vmin, vmax) = median(&mut v);
        println!("  TVM rpc_server       {vm:7.2} us per call [{vmin:.2}, {vmax:.2}]");
        println!("  kiln costs {:.2}x TVM's time", km / vm);
    }
}
