//! [`OpenClProgram`]: an OpenCL C source built lazily per device, and kernel launches on the
//! calling thread's current stream, checked before the driver sees them.
//!
//! A program is built once per device on first use; the result, success or failure (with the
//! driver's build log), is cached, so a broken source is not recompiled on every launch. Kernel
//! objects are created once per device and name and reused. `clSetKernelArg` is not thread-safe
//! on one kernel object, so each kernel is behind a lock held from setting the arguments to the
//! enqueue. Queued launches keep what they use alive in the driver (OpenCL retains kernels,
//! programs and buffers for queued commands), so dropping a program, or freeing a buffer, while
//! a launch is in flight is safe.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::{driver, sys, OpenClDeviceApi};
use crate::device_api::api::noted;
use crate::device_api::api::DeviceApi;
use crate::device_api::device::{Device, DeviceType};
use crate::device_api::error::{DeviceError, DeviceResult};
use crate::util::lock;

pub use crate::device_api::kernel::KernelArg;
use crate::device_api::kernel::{KernelInfo, KernelLauncher};

/// What a kernel parameter takes, from `clGetKernelArgInfo`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Param {
    /// A `__global` or `__constant` pointer: a buffer.
    Buffer,
    /// A `__local` pointer (not expressible as a [`KernelArg`]).
    Local,
    /// A value.
    Scalar,
}

struct KernelEntry {
    kernel: sys::Kernel,
    num_args: u32,
    max_work_group: usize,
    /// Each parameter's kind and type name, when the driver reports them.
    params: Option<Vec<(Param, String)>>,
}

struct Built {
    program: sys::Program,
    names: Vec<String>,
    kernels: Mutex<HashMap<String, Arc<Mutex<KernelEntry>>, foldhash::fast::RandomState>>,
}

type BuildSlot = Arc<OnceLock<DeviceResult<Arc<Built>>>>;

/// An OpenCL C source, built lazily once per device on first use (cached), its kernels cached
/// per device. See the module docs.
pub struct OpenClProgram {
    source: String,
    builds: Mutex<HashMap<usize, BuildSlot, foldhash::fast::RandomState>>,
}

impl std::fmt::Debug for OpenClProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClProgram")
            .field("source_bytes", &self.source.len())
            .finish()
    }
}

fn opencl(device_id: usize) -> Device {
    Device::new(
        DeviceType::OPENCL,
        i32::try_from(device_id).unwrap_or(i32::MAX),
    )
}

impl OpenClProgram {
    /// A program from OpenCL C source; nothing is built until [`OpenClProgram::build`] or
    /// [`OpenClProgram::launch`].
    pub fn new(source: String) -> Self {
        Self {
            source,
            builds: Mutex::new(HashMap::default()),
        }
    }

    /// The OpenCL C source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Builds for `device_id` if not yet built. A build failure is an error carrying the
    /// driver's build log, and is cached: not rebuilt on every launch.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`] (including "no OpenCL platform"); [`DeviceError::Backend`]
    /// with the build log.
    pub fn build(&self, device_id: usize) -> DeviceResult<()> {
        let api = super::global()?;
        let dev = opencl(device_id);
        let r = self.built(&api, dev).map(|_| ());
        noted(&*api, r)
    }

    fn built(&self, api: &OpenClDeviceApi, dev: Device) -> DeviceResult<Arc<Built>> {
        api.check_device(dev)?;
        let slot = lock(&self.builds)
            .entry(dev.device_id as usize)
            .or_default()
            .clone();
        // The build runs outside the table lock; concurrent first users of one device wait.
        slot.get_or_init(|| self.compile(api, dev)).clone()
    }

    fn compile(&self, api: &OpenClDeviceApi, dev: Device) -> DeviceResult<Arc<Built>> {
        let d = api.dev(dev)?;
        let program = d
            .context
            .program(&self.source)
            .map_err(|e| driver(dev, e))?;
        // Argument info lets launches check buffer-versus-scalar parameters.
        if let Err((e, log)) = program.build(d.id, "-cl-kernel-arg-info") {
            return Err(DeviceError::Backend {
                device: dev,
                message: format!("building the OpenCL program: {e}; build log:\n{log}"),
            });
        }
        let names = program.kernel_names().map_err(|e| driver(dev, e))?;
        Ok(Arc::new(Built {
            program,
            names,
            kernels: Mutex::new(HashMap::default()),
        }))
    }

    fn kernel(
        &self,
        api: &OpenClDeviceApi,
        dev: Device,
        built: &Built,
        name: &str,
    ) -> DeviceResult<Arc<Mutex<KernelEntry>>> {
        let mut kernels = lock(&built.kernels);
        if let Some(k) = kernels.get(name) {
            return Ok(k.clone());
        }
        if !built.names.iter().any(|n| n == name) {
            return Err(DeviceError::InvalidLaunch {
                device: dev,
                kernel: name.to_owned(),
                reason: format!(
                    "the program has no such kernel; its kernels: {}",
                    if built.names.is_empty() {
                        "none".to_owned()
                    } else {
                        built.names.join(", ")
                    }
                ),
            });
        }
        let d = api.dev(dev)?;
        let kernel = built.program.kernel(name).map_err(|e| driver(dev, e))?;
        let num_args = kernel.num_args().map_err(|e| driver(dev, e))?;
        let max_work_group = kernel
            .work_group_size(d.id)
            .map_err(|e| driver(dev, e))?
            .min(d.max_work_group);
        let params = (0..num_args)
            .map(|i| {
                let kind = match kernel.arg_address_qualifier(i).ok()? {
                    sys::CL_KERNEL_ARG_ADDRESS_GLOBAL | sys::CL_KERNEL_ARG_ADDRESS_CONSTANT => {
                        Param::Buffer
                    }
                    sys::CL_KERNEL_ARG_ADDRESS_LOCAL => Param::Local,
                    _ => Param::Scalar,
                };
                Some((kind, kernel.arg_type_name(i).unwrap_or_default()))
            })
            .collect();
        let entry = Arc::new(Mutex::new(KernelEntry {
            kernel,
            num_args,
            max_work_group,
            params,
        }));
        kernels.insert(name.to_owned(), entry.clone());
        Ok(entry)
    }

    /// Enqueues kernel `name` on the calling thread's current stream of opencl:`device_id` and
    /// returns without waiting. `global[i]` is the total work-items per axis (grid * block),
    /// `local[i]` the work-group size per axis (block). Checked before the driver is called:
    /// the device exists, the kernel exists, the argument count matches, each argument is a
    /// buffer or a scalar as its parameter wants (from the driver's argument info, the program
    /// being built with `-cl-kernel-arg-info`), each buffer is a live
    /// allocation of that device holding at least `min_bytes`, `global` is a multiple of
    /// `local`, and the work-group fits the kernel's and device's limits. Any zero global extent
    /// launches nothing.
    ///
    /// # Errors
    /// [`DeviceError::InvalidDevice`]; [`DeviceError::InvalidLaunch`] for a launch that fails a
    /// check; [`DeviceError::Backend`] for build and driver failures; [`DeviceError::InvalidStream`]
    /// when the current stream was freed.
    pub fn launch(
        &self,
        device_id: usize,
        name: &str,
        args: &[KernelArg],
        global: [usize; 3],
        local: [usize; 3],
    ) -> DeviceResult<()> {
        let api = super::global()?;
        let r = self.launch_on(&api, opencl(device_id), name, args, global, local);
        noted(&*api, r)
    }

    fn launch_on(
        &self,
        api: &OpenClDeviceApi,
        dev: Device,
        name: &str,
        args: &[KernelArg],
        global: [usize; 3],
        local: [usize; 3],
    ) -> DeviceResult<()> {
        let invalid = |reason: String| DeviceError::InvalidLaunch {
            device: dev,
            kernel: name.to_owned(),
            reason,
        };
        let built = self.built(api, dev)?;
        let entry = self.kernel(api, dev, &built, name)?;
        // The kernel's lock is held from the checks to the enqueue: its parameter table is
        // read in place (not cloned per launch) and its arguments set under the same lock.
        let mut k = lock(&entry);
        let (num_args, max_wg) = (k.num_args, k.max_work_group);
        if args.len() != num_args as usize {
            return Err(invalid(format!(
                "the kernel takes {num_args} argument(s), the launch passes {}",
                args.len()
            )));
        }
        // A value passed for a pointer parameter would make the driver read it as a `cl_mem`.
        for (i, (a, (param, ty))) in args.iter().zip(k.params.iter().flatten()).enumerate() {
            let given = match a {
                KernelArg::Buffer { .. } => Param::Buffer,
                KernelArg::Scalar { .. } => Param::Scalar,
            };
            if *param == Param::Local {
                return Err(invalid(format!(
                    "argument {i}: the parameter is `__local {ty}`, which launches cannot set"
                )));
            }
            if given != *param {
                let (want, got) = match param {
                    Param::Buffer => ("a buffer", "a scalar"),
                    _ => ("a scalar", "a buffer"),
                };
                return Err(invalid(format!(
                    "argument {i}: the parameter `{ty}` takes {want}, the launch passes {got}"
                )));
            }
        }
        // The buffers stay held (`held`: clones of the device table's `Arc`s, no driver call)
        // until the command is enqueued, so one freed by another thread meanwhile is still
        // alive when the driver reads the arguments.
        let mut held = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            match *a {
                KernelArg::Buffer { ptr, min_bytes } => {
                    let Some((buf, size)) = api.kernel_buffer(dev, ptr) else {
                        return Err(invalid(format!(
                            "argument {i}: {ptr} is not a live allocation of {dev} (freed, or \
                             allocated elsewhere)"
                        )));
                    };
                    if size < min_bytes {
                        return Err(invalid(format!(
                            "argument {i}: the kernel needs at least {min_bytes} bytes, the \
                             buffer {ptr} has {size}"
                        )));
                    }
                    held.push(buf);
                }
                KernelArg::Scalar { size, .. } => {
                    if !(1..=8).contains(&size) {
                        return Err(invalid(format!(
                            "argument {i}: a scalar has 1 to 8 bytes, not {size}"
                        )));
                    }
                }
            }
        }
        if global.contains(&0) {
            return Ok(());
        }
        if let Some(axis) = local.iter().position(|&l| l == 0) {
            return Err(invalid(format!("local size {local:?} is 0 on axis {axis}")));
        }
        if let Some(axis) = (0..3).find(|&a| global[a] % local[a] != 0) {
            return Err(invalid(format!(
                "global size {global:?} is not a multiple of local size {local:?} on axis {axis}"
            )));
        }
        let group = local
            .iter()
            .try_fold(1usize, |acc, &l| acc.checked_mul(l))
            .unwrap_or(usize::MAX);
        if group > max_wg {
            return Err(invalid(format!(
                "a work-group of {group} work-items ({local:?}) exceeds the limit of {max_wg} \
                 (the kernel's CL_KERNEL_WORK_GROUP_SIZE and the device's \
                 CL_DEVICE_MAX_WORK_GROUP_SIZE)"
            )));
        }
        let d = api.dev(dev)?;
        for (axis, (&l, &limit)) in local.iter().zip(&d.max_work_items).enumerate() {
            if l > limit {
                return Err(invalid(format!(
                    "local size {l} on axis {axis} exceeds the device's \
                     CL_DEVICE_MAX_WORK_ITEM_SIZES[{axis}] = {limit}"
                )));
            }
        }
        let dims = (0..3)
            .rev()
            .find(|&a| global[a] > 1 || local[a] > 1)
            .map_or(1, |a| a + 1);
        let stream = api.stream(dev, api.current_stream(dev))?;
        let mut bufs = held.iter();
        for (i, a) in args.iter().enumerate() {
            let r = match a {
                KernelArg::Buffer { .. } => match bufs.next() {
                    Some(b) => k.kernel.set_arg_mem(i as u32, b),
                    None => Ok(()),
                },
                KernelArg::Scalar { bytes, size } => {
                    k.kernel.set_arg_bytes(i as u32, &bytes[..*size])
                }
            };
            r.map_err(|e| invalid(format!("argument {i}: {e}")))?;
        }
        stream
            .enqueue(|q| q.launch(&k.kernel, dims, &global, &local))
            .map_err(|e| driver(dev, e))?;
        drop(k);
        drop(held);
        stream.queue.flush().map_err(|e| driver(dev, e))
    }
}

impl KernelLauncher for OpenClProgram {
    fn launch(
        &self,
        device_id: usize,
        name: &str,
        args: &[KernelArg],
        global: [usize; 3],
        local: [usize; 3],
    ) -> DeviceResult<()> {
        OpenClProgram::launch(self, device_id, name, args, global, local)
    }
}

/// The launcher of OpenCL C `source`: the [`crate::device_api::kernel::KernelLoader`] of
/// kind `opencl` (the driver builds the source per device on first launch).
///
/// # Errors
/// None today: building is deferred to the first launch, which reports the build log.
pub fn load_kernels(
    source: &str,
    _kernels: &[KernelInfo],
) -> Result<Box<dyn KernelLauncher>, String> {
    Ok(Box::new(OpenClProgram::new(source.to_owned())))
}
