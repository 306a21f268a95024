//! `kiln rpc-server` and `kiln run --rpc/--tracker`: kiln's devices over TVM's RPC protocol.

use std::sync::Arc;

use crate::device_api::Device;
use crate::packed_func::{DLDevice, Value};
use crate::rpc::wire::{WireTensor, WireValue};
use crate::rpc::{RemoteSession, Server, ServerConfig};
use crate::target::Target;

use super::codegen::{finish, read_module, run_args, spread, write_library, Arg, RunArgs};
use super::CmdResult;

/// `kiln rpc-server`.
#[derive(clap::Args)]
pub struct RpcServerArgs {
    /// The address to listen on. The default serves this machine only: a client that can
    /// connect can run any code here, so listen on a network only behind a trusted boundary.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The first port to try (0: any free port).
    #[arg(long, default_value_t = 9091)]
    port: u16,
    /// One past the last port to try.
    #[arg(long, default_value_t = 9199)]
    port_end: u16,
    /// Register with the RPC tracker at HOST:PORT (reconnecting when it restarts).
    #[arg(long, value_name = "HOST:PORT")]
    tracker: Option<String>,
    /// The device key to register under (clients ask the tracker for it).
    #[arg(long, default_value = "")]
    key: String,
    /// The address the tracker gives clients, when not `--host`.
    #[arg(long)]
    custom_addr: Option<String>,
    /// Where session directories are made (default: the system's temporary directory).
    #[arg(long)]
    workdir: Option<std::path::PathBuf>,
    /// The largest request accepted, in MiB (copies into an allocation are bounded by it).
    #[arg(long, default_value_t = 1024)]
    max_packet_mib: u64,
    /// Microseconds a session polls for the next request before it blocks (0: block at once).
    #[arg(long, default_value_t = 200)]
    spin_us: u64,
    /// Print nothing but errors.
    #[arg(long, short)]
    quiet: bool,
}

/// `kiln rpc-server`: serves until killed.
pub fn run_server(a: &RpcServerArgs) -> CmdResult {
    if a.tracker.is_some() && a.key.is_empty() {
        return Err("--tracker needs --key: the key clients ask the tracker for".into());
    }
    let quiet = a.quiet;
    let cfg = ServerConfig {
        host: a.host.clone(),
        port: a.port,
        port_end: a.port_end,
        key: a.key.clone(),
        tracker: a.tracker.clone(),
        custom_addr: a.custom_addr.clone(),
        limits: crate::rpc::SessionLimits {
            max_packet_bytes: a.max_packet_mib.saturating_mul(1 << 20),
        },
        workdir_root: a.workdir.clone(),
        spin: std::time::Duration::from_micros(a.spin_us),
        log: Some(Arc::new(move |m: &str| {
            if !quiet || m.starts_with("kiln rpc server listening") {
                eprintln!("[kiln rpc] {m}");
            }
        })),
    };
    let server = Server::bind(cfg)?;
    server.serve()?;
    Ok(())
}

fn dl_device(s: &str) -> Result<DLDevice, Box<dyn std::error::Error>> {
    let d: Device = s.parse()?;
    Ok(d.into())
}

/// `kiln run --rpc HOST:PORT` / `--tracker HOST:PORT --key KEY`.
pub fn run_remote(a: &RunArgs) -> CmdResult {
    let dev = dl_device(&a.device)?;
    let is_lib = a.module.extension().is_some_and(|e| e == "so");
    let tmp = tempfile::tempdir()?;
    let (lib_path, pf) = if is_lib {
        if a.check {
            return Err("--check needs an IR module, not a library".into());
        }
        (a.module.clone(), None)
    } else {
        let module = read_module(&a.module)?;
        module
            .verify()
            .map_err(|e| format!("`{}`: {e}", a.module.display()))?;
        let target = Target::parse(&a.target)?;
        let out = tmp.path().join("module.so");
        write_library(&module, &target, &out)?;
        (out, module.get(&a.function).cloned())
    };
    let bytes = crate::util::read_regular_file(&lib_path)
        .map_err(|e| format!("reading `{}`: {e}", lib_path.display()))?;
    let mut args = run_args(a, pf.as_ref())?;
    let interp_inputs = match (&pf, a.check) {
        (Some(p), true) => Some(super::codegen::to_interp(&args, p)?),
        _ => None,
    };
    let mut s = match (&a.rpc, &a.tracker) {
        (Some(addr), _) => RemoteSession::connect(addr, &a.key, None)?,
        (None, Some(t)) => RemoteSession::connect_tracker(t, &a.key, 1, None)?,
        (None, None) => unreachable!("run_remote is called with --rpc or --tracker"),
    };
    eprintln!(
        "connected to {} ({})",
        a.rpc.as_deref().or(a.tracker.as_deref()).unwrap_or("?"),
        s.remote_key()
    );
    let name = format!(
        "{}.so",
        lib_path
            .file_stem()
            .map(|x| x.to_string_lossy().into_owned())
            .unwrap_or_else(|| "module".into())
    );
    s.upload(&name, &bytes)?;
    let m = s.load_module(&name)?;
    let f = s.module_function(m, &a.function)?;
    let mut wire: Vec<WireValue> = Vec::with_capacity(args.len());
    let mut remote: Vec<Option<WireTensor>> = Vec::with_capacity(args.len());
    for x in &args {
        match x {
            Arg::Tensor(_, t) => {
                let r = s.alloc(dev, &t.shape, t.dtype)?;
                s.copy_to(&r, t.data.as_slice())?;
                wire.push(WireValue::Tensor(r.clone()));
                remote.push(Some(r));
            }
            Arg::Scalar(v) => {
                wire.push(match v.value() {
                    Value::Int(i) => WireValue::Int(i),
                    Value::Float(f) => WireValue::Float(f),
                    Value::Bool(b) => WireValue::Bool(b),
                    _ => WireValue::None,
                });
                remote.push(None);
            }
        }
    }
    let result = s.call(f, &wire)?;
    if a.repeat > 0 {
        let mut times = s.time(m, &a.function, dev, 1, a.repeat as i64, 0, &wire)?;
        let mut ms: Vec<f64> = times.iter_mut().map(|t| *t * 1e3).collect();
        let (median, min, max) = spread(&mut ms);
        println!(
            "{}: {} runs on the remote {}, median {median:.4} ms, min {min:.4} ms, max {max:.4} ms",
            a.function, a.repeat, a.device
        );
    }
    for (x, r) in args.iter_mut().zip(&remote) {
        if let (Arg::Tensor(_, t), Some(r)) = (x, r) {
            let data = s.copy_from(r)?;
            t.data.as_mut_slice().copy_from_slice(&data);
            s.free(r)?;
        }
    }
    s.free_handle(f)?;
    s.free_handle(m)?;
    s.shutdown()?;
    if !matches!(result, WireValue::None) {
        println!("result: {result}");
    }
    finish(a, &args, interp_inputs, pf)
}
