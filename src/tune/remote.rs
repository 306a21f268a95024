//! Measuring on another machine: [`Remote`], a [`Measurer`] that drives a TVM RPC server
//! (`kiln rpc-server`, or TVM's) through [`crate::rpc::RemoteSession`].
//!
//! Candidates are built here (for the target, which names the remote CPU, or a device kind:
//! `opencl`, `cuda`, whose library holds the kernels and their host code), exported as `.so`,
//! uploaded, loaded there, run on the remote CPU or on device 0 of the target's kind there,
//! checked against the default build's results computed there on the same inputs, and timed
//! there with TVM's time evaluator (`runtime.RPCTimeEvaluator`: batches of at least 2 ms, 7 of
//! them, the device synchronized). A candidate that kills the session costs one trial: the
//! next one connects again.

use std::path::PathBuf;

use super::measure::{arrays, compare, Outcome, Timing};
use super::worker::Measurer;
use crate::ir::{IRModule, PrimFunc};
use crate::npy::NpyArray;
use crate::packed_func::{DLDevice, DLDeviceType};
use crate::rpc::wire::{WireTensor, WireValue};
use crate::rpc::{RemoteSession, RpcError};
use crate::schedule::{Schedule, Step};
use crate::target::Target;

/// Where the server is.
#[derive(Clone, Debug)]
pub enum Endpoint {
    /// A server at `host:port` (match key `""`).
    Direct(String),
    /// A tracker at `host:port` and the device key to ask it for.
    Tracker(String, String),
}

impl Endpoint {
    fn connect(&self) -> Result<RemoteSession, RpcError> {
        match self {
            Endpoint::Direct(a) => RemoteSession::connect(a, "", None),
            Endpoint::Tracker(t, k) => RemoteSession::connect_tracker(t, k, 1, None),
        }
    }
}

/// Measures on a remote CPU or device.
pub struct Remote {
    at: Endpoint,
    sess: Option<RemoteSession>,
    f: PrimFunc,
    target: Target,
    /// Where the function runs there: the CPU, or device 0 of the target's kind.
    dev: DLDevice,
    inputs: Vec<NpyArray>,
    reference: Vec<NpyArray>,
    baseline: Timing,
    dir: tempfile::TempDir,
    n: u64,
}

const CPU: DLDevice = DLDevice {
    device_type: DLDeviceType::CPU,
    device_id: 0,
};

impl Remote {
    /// Connects, builds and measures the default of `f` there.
    ///
    /// # Errors
    /// The server cannot be reached, or the default does not build or run there.
    pub fn new(at: Endpoint, f: &PrimFunc, target: &Target, seed: u64) -> Result<Self, String> {
        let dev = if target.kind_name() == "llvm" {
            CPU
        } else {
            let cg = crate::codegen::device::codegen_for(target.kind_name()).ok_or_else(|| {
                format!(
                    "measuring remotely needs a CPU target (`llvm`) or a device kind kiln \
                     generates code for (`opencl`, `cuda`); found `{}`",
                    target.kind_name()
                )
            })?;
            DLDevice {
                device_type: cg.device_type(),
                device_id: 0,
            }
        };
        let inputs = arrays(f, seed)?;
        let mut me = Self {
            at,
            sess: None,
            f: f.clone(),
            target: target.clone(),
            dev,
            reference: Vec::new(),
            inputs,
            baseline: Timing {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            },
            dir: tempfile::tempdir().map_err(|e| e.to_string())?,
            n: 0,
        };
        let (out, t) = me.run(f, None)?;
        me.reference = out;
        me.baseline = t;
        Ok(me)
    }

    /// Builds `g`, runs it there once on the inputs, and times it: its outputs and its time.
    fn run(
        &mut self,
        g: &PrimFunc,
        cutoff: Option<f64>,
    ) -> Result<(Vec<NpyArray>, Timing), String> {
        self.n += 1;
        let name = format!("cand{}.so", self.n);
        let path: PathBuf = self.dir.path().join(&name);
        crate::codegen::export_library(
            &IRModule::from_functions(vec![g.clone()]),
            &self.target,
            &path,
        )
        .map_err(|e| e.to_string())?;
        let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(&path);
        if self.sess.is_none() {
            self.sess = Some(self.at.connect().map_err(|e| e.to_string())?);
        }
        let s = self.sess.as_mut().ok_or("no session")?;
        let result = (|| -> Result<(Vec<NpyArray>, Timing), RpcError> {
            s.upload(&name, &bytes)?;
            let m = s.load_module(&name)?;
            let func = s.module_function(m, &g.name)?;
            let mut remote: Vec<WireTensor> = Vec::new();
            for a in &self.inputs {
                let t = s.alloc(self.dev, &a.shape, a.dtype)?;
                s.copy_to(&t, a.data.as_slice())?;
                remote.push(t);
            }
            let args: Vec<WireValue> = remote.iter().cloned().map(WireValue::Tensor).collect();
            s.call(func, &args)?;
            let mut out = Vec::new();
            for (t, a) in remote.iter().zip(&self.inputs) {
                let mut b = NpyArray::zeros(a.dtype, &a.shape)
                    .map_err(|e| RpcError::Protocol(e.to_string()))?;
                b.data.as_mut_slice().copy_from_slice(&s.copy_from(t)?);
                out.push(b);
            }
            // One timed call first: a candidate far slower than the best is not timed further.
            let first = s.time(m, &g.name, self.dev, 1, 1, 0, &args)?;
            let t = if first
                .first()
                .is_some_and(|&x| super::measure::cut_off_by(x, cutoff))
            {
                Timing::of(first)
            } else {
                Timing::of(s.time(m, &g.name, self.dev, 1, 7, 2, &args)?)
            };
            for t in &remote {
                s.free(t)?;
            }
            s.free_handle(func)?;
            s.free_handle(m)?;
            let remove = s.get_function("tvm.rpc.server.remove")?;
            if let Some(r) = remove {
                s.call(r, &[WireValue::Str(name.clone())])?;
                s.free_handle(r)?;
            }
            Ok((out, t))
        })();
        match result {
            Ok(x) => Ok(x),
            Err(e) => {
                if matches!(e, RpcError::Io { .. } | RpcError::Protocol(_)) {
                    // The session is gone or out of step: the next candidate reconnects.
                    self.sess = None;
                }
                Err(e.to_string())
            }
        }
    }
}

impl Measurer for Remote {
    fn baseline(&self) -> Timing {
        self.baseline
    }

    fn measure(&mut self, steps: &[Step], cutoff: Option<f64>) -> Outcome {
        let mut s = Schedule::new(self.f.clone());
        let g = match s.apply(steps).and_then(|()| s.finish()) {
            Ok(g) => g,
            Err(e) => return Outcome::Invalid(e.to_string()),
        };
        let had_session = self.sess.is_some();
        match self.run(&g, cutoff) {
            Ok((out, t)) => match compare(&out, &self.reference, &self.f) {
                Ok(()) => Outcome::Ok(t),
                Err(e) => Outcome::Wrong(e),
            },
            Err(e) if had_session && self.sess.is_none() => Outcome::Crashed(e),
            Err(e) => Outcome::Invalid(e),
        }
    }
}
