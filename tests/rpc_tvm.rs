//! kiln's RPC server driven by TVM 0.27's own client and tracker, unchanged
//! (`tests/python/rpc_client.py`): the `kiln rpc-server` binary on loopback, a library kiln
//! exported and one TVM exported, numpy tensors copied both ways, `time_evaluator`, files,
//! refused escapes; then TVM's tracker (`python -m tvm.exec.rpc_tracker`) with sequential and
//! concurrent clients, and a tracker restart the server must survive.
//!
//! Needs `KILN_PYTHON` with TVM 0.27 (skips without it, fails under `KILN_REQUIRE_TVM=1`).
//! Every process is killed at the end, and every wait is bounded.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln::codegen::llvm::{export, CodegenOptions};
use kiln::ir::IRModule;
use kiln::schedule::kernels as sk;
use kiln::target::Target;

/// A child process killed when dropped.
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

fn kiln_vadd(dir: &Path) -> PathBuf {
    let path = dir.join("kiln_vadd.so");
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

/// Starts `kiln rpc-server` with `args` and waits for its "listening" line.
fn start_server(args: &[&str], log: &Path) -> Guard {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("rpc-server")
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting kiln rpc-server");
    let stderr = child.stderr.take().unwrap();
    let log = log.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut f = std::fs::File::create(&log).unwrap();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            use std::io::Write;
            let _ = writeln!(f, "{line}");
            if line.contains("listening on") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("kiln rpc-server did not start listening");
    Guard(child)
}

/// Runs the Python client with a deadline; returns its output, panicking with it on failure.
fn run_client(py: &str, args: &[&str], limit: Duration) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/rpc_client.py");
    let mut child = Command::new(py)
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut out)
                .unwrap();
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            assert!(
                status.success(),
                "rpc_client.py {args:?} failed:\n{out}\n{err}"
            );
            return out;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("rpc_client.py {args:?} ran past {limit:?}:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start_tracker(py: &str, port: u16) -> Guard {
    let child = Command::new(py)
        .args([
            "-m",
            "tvm.exec.rpc_tracker",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--port-end",
            &(port + 1).to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting TVM's tracker");
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "TVM's tracker did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Guard(child)
}

#[test]
fn tvm_client_drives_kiln_server() {
    let Some(py) = common::python_with_tvm() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lib = kiln_vadd(dir.path());
    let port = free_port();
    let log = dir.path().join("server.log");
    let _server = start_server(&["--port", &port.to_string()], &log);
    // With an OpenCL device here (PoCL in CI), the TVM client also runs a kiln OpenCL kernel
    // on the server's `remote.cl(0)`.
    let cl_lib = dir.path().join("vadd_cl.so");
    let has_cl = common::opencl_device("tvm_client_drives_kiln_server").is_some();
    if has_cl {
        let m = IRModule::from_functions(vec![common::device_vadd()]);
        kiln::codegen::opencl::build(&m, &Target::parse(r#"{"kind": "opencl"}"#).unwrap())
            .unwrap()
            .export(&cl_lib)
            .unwrap();
    }
    let port_s = port.to_string();
    let mut args = vec![
        "direct",
        &port_s,
        lib.to_str().unwrap(),
        dir.path().to_str().unwrap(),
    ];
    if has_cl {
        args.push(cl_lib.to_str().unwrap());
    }
    let out = run_client(&py, &args, Duration::from_secs(180));
    assert!(out.contains("OK direct"), "{out}");
    assert_eq!(out.contains("OK opencl"), has_cl, "{out}");
    // The session's directory is gone once it ended.
    let log_text = std::fs::read_to_string(&log).unwrap();
    let session_dir = log_text
        .lines()
        .find_map(|l| l.split(" in ").nth(1))
        .map(|s| s.split(' ').next().unwrap().to_owned())
        .expect("the server logs the session directory");
    let start = Instant::now();
    while Path::new(&session_dir).exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !Path::new(&session_dir).exists(),
        "{session_dir} outlived its session:\n{log_text}"
    );
}

#[test]
fn tvm_tracker_hands_out_kiln_server() {
    let Some(py) = common::python_with_tvm() else {
        return;
    };
    // TVM's tracker runs on tornado.
    let has_tornado = Command::new(&py)
        .args(["-c", "import tornado, cloudpickle"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_tornado {
        assert_ne!(
            std::env::var("KILN_REQUIRE_TVM").as_deref(),
            Ok("1"),
            "KILN_REQUIRE_TVM=1 but `{py}` cannot import tornado, cloudpickle (pip install tornado cloudpickle)"
        );
        eprintln!(
            "skipped: `{py}` cannot import tornado and cloudpickle, which TVM's tracker needs"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lib = kiln_vadd(dir.path());
    let tracker_port = free_port();
    let tracker = start_tracker(&py, tracker_port);
    let tracker_addr = format!("127.0.0.1:{tracker_port}");
    let log = dir.path().join("server.log");
    let _server = start_server(
        &[
            "--port",
            "0",
            "--tracker",
            &tracker_addr,
            "--key",
            "kiln-cpu",
        ],
        &log,
    );
    let args = |seq: &str, conc: &str| -> Vec<String> {
        vec![
            "tracker".into(),
            tracker_port.to_string(),
            "kiln-cpu".into(),
            lib.to_str().unwrap().into(),
            seq.into(),
            conc.into(),
        ]
    };
    let a = args("5", "4");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = run_client(&py, &a, Duration::from_secs(240));
    assert!(out.contains("OK tracker"), "{out}");

    // MetaSchedule's RPCRunner: a `.tar.gz` of objects linked on the server, inputs from
    // `random_fill_for_measure`, the CPU cache flushed before each repeat.
    let port_s = tracker_port.to_string();
    let out = run_client(
        &py,
        &["metaschedule", &port_s, "kiln-cpu"],
        Duration::from_secs(240),
    );
    assert!(out.contains("OK metaschedule"), "{out}");

    // kiln as the client, through the same tracker.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .arg(&lib)
        .args(["vadd", "rand:100", "rand:100", "zeros:100", "--repeat", "3"])
        .args(["--tracker", &tracker_addr, "--key", "kiln-cpu", "--out"])
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("3 runs on the remote cpu"), "{text}");

    // The tracker restarts: the server registers again and serves the next client.
    drop(tracker);
    std::thread::sleep(Duration::from_millis(500));
    let _tracker = start_tracker(&py, tracker_port);
    let a = args("1", "0");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = run_client(&py, &a, Duration::from_secs(120));
    assert!(
        out.contains("OK tracker"),
        "{out}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
