//! The device runtime: TVM's `DeviceAPI`, made complete with what PaddlePaddle's CustomDevice
//! and DIOPI runtimes add, a real CPU backend, and a [`Tensor`] users can hold.
//!
//! # Design
//!
//! - [`Device`] is `{ type, id }`; [`DeviceType`] holds DLPack's codes plus extension codes (from
//!   [`DeviceType::EXT_BASE`]) for backends registered at run time, with names both ways
//!   (`cpu` <-> 1).
//! - [`DeviceApi`] is the one boundary a backend implements: four required methods plus two
//!   facets, [`DeviceMemoryApi`] (allocate, free, copy, memset, statistics) and
//!   [`DeviceStreamApi`] (streams, events, host callbacks). Their `raw_*` methods stay small;
//!   the *provided* methods of `DeviceApi` check arguments, build errors, record the thread's
//!   last error, and layer policy over them: the per-thread [`workspace`] pool, bounce copies
//!   through the host, the per-thread current device and stream.
//! - Device memory is a [`DevicePtr`]: an opaque address generic code never dereferences.
//!   Streams and events are generation-checked handles ([`StreamHandle`], [`EventHandle`]): a
//!   freed one is an error, not a dangling pointer.
//! - The [`registry`] maps names and codes to `Arc<dyn DeviceApi>` ([`get`], [`get_by_name`],
//!   [`register_device_api`]) and registers the global function `device_api.<name>` for each
//!   backend. [`init`] also fills the context slots `__TVMBackendAllocWorkspace` /
//!   `__TVMBackendFreeWorkspace` that generated code calls.
//! - [`CpuDeviceApi`] is the host; [`NullDeviceApi`] a device without hardware for tests;
//!   [`OpenClDeviceApi`] any OpenCL 1.2+ driver, loaded at run time ([`opencl`]);
//!   [`CudaDeviceApi`] NVIDIA GPUs through the CUDA driver API, loaded at run time ([`cuda`]);
//!   [`plugin`] loads vendor backends from shared libraries (`include/kiln/device_plugin.h`).
//! - [`kernel`] is what a backend implements to run device code: a [`kernel::KernelLauncher`]
//!   per device source, and the launch arguments it receives (DLPack types, device pointers).
//!   The runtime ([`crate::runtime`]) pairs launchers with compiled modules.
//!
//! Each backend is a folder with the same file for the same concern: `mod.rs` (the backend type,
//! its [`DeviceApi`] impl and attributes, the module doc), `memory.rs` (its [`DeviceMemoryApi`]
//! impl), `stream.rs` (its [`DeviceStreamApi`] impl), `sys.rs` when it binds a foreign API (the C
//! declarations and the calls into them), and `module.rs` when it runs kernels (its
//! [`kernel::KernelLauncher`]). A concern of one backend only gets its own clearly named file,
//! listed in that backend's module doc (`plugin/load.rs`, `plugin/allocator.rs`).
//!
//! `unsafe` code lives in `cpu/memory.rs` (allocator and host copies), `null/memory.rs` (host
//! side of its copies), `opencl/sys.rs` (the OpenCL C API; `opencl/memory.rs` forwards the copy
//! contract to it), `cuda/sys.rs` (the CUDA driver API; `cuda/memory.rs` hands it checked copy
//! ranges, `cuda/module.rs` checked kernel parameters), `plugin/sys.rs` (the plugin ABI) and `plugin/memory.rs` (host side of staged
//! copies), and outside the backends in `tensor.rs` (slice views and DLPack), `copy.rs`, `api.rs`
//! and `registry.rs` (reading a `DLTensor`'s shape and strides, forwarding the copy contract).
//!
//! # Example
//!
//! ```
//! use kiln::device_api::{self, AttrKind, Device, Tensor};
//!
//! let cpu = Device::cpu();
//! let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], cpu)?;
//! let b = a.copy_to(cpu)?;
//! assert_eq!(b.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
//!
//! let api = device_api::get_by_name("cpu")?;
//! assert_eq!(api.attr(cpu, AttrKind::WARP_SIZE)?.and_then(|v| v.as_int()), Some(1));
//! # Ok::<(), kiln::Error>(())
//! ```

pub mod api;
mod copy;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod error;
pub mod kernel;
pub mod memory;
pub mod null;
pub mod opencl;
pub mod plugin;
pub mod registry;
pub mod stream;
pub mod tensor;
pub mod workspace;

pub use api::{is_compact, AttrKind, AttrValue, DeviceApi, ALLOC_ALIGNMENT};
pub use cpu::CpuDeviceApi;
pub use cuda::CudaDeviceApi;
pub use device::{Device, DeviceType};
pub use error::{DeviceError, DeviceResult};
pub use memory::{data_size, DeviceMemoryApi, DevicePtr, HostCallback, MemRegion, MemoryStats};
pub use null::NullDeviceApi;
pub use opencl::OpenClDeviceApi;
pub use plugin::{load_plugin, load_plugins_from_env, PluginDeviceApi, PluginError};
pub use registry::{
    copy_data_from_to, get, get_by_name, get_for, init, list, next_extension_code,
    register_device_api,
};
pub use stream::{DeviceStreamApi, EventHandle, HandleTable, StreamHandle};
pub use tensor::{Element, Tensor};
pub use workspace::{
    backend_alloc_workspace, backend_alloc_workspace_ptr, backend_free_workspace,
    backend_free_workspace_ptr, WorkspacePool, WorkspaceStats,
};
