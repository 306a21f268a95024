//! The device conformance suite (`tests/conformance/mod.rs`), instantiated for every backend
//! of a plain process: `conformance_suite!(name, || (api, device))` runs every test body on a
//! backend. A new backend (e.g. a plugin) joins with one more `conformance_suite!` line.

use std::sync::{Arc, OnceLock};

mod common;
#[macro_use]
mod conformance;
#[path = "plugin_util/mod.rs"]
mod plugin_util;

use kiln::device_api::{self, Device, DeviceApi, NullDeviceApi};

conformance_suite!(cpu, || (
    device_api::get_by_name("cpu").unwrap(),
    Device::cpu()
));

/// A registered `NullDeviceApi` with two devices; the suite runs on device 1.
fn null_backend() -> (Arc<dyn DeviceApi>, Device) {
    static API: OnceLock<Arc<dyn DeviceApi>> = OnceLock::new();
    let api = API.get_or_init(|| {
        let code = device_api::next_extension_code().unwrap();
        let api: Arc<dyn DeviceApi> =
            Arc::new(NullDeviceApi::new("conformance_null", code, 2, 256 << 20));
        device_api::register_device_api("conformance_null", code, api.clone()).unwrap();
        api
    });
    (api.clone(), Device::new(api.device_type(), 1))
}

conformance_suite!(null, null_backend);

/// The sample device plugin (`plugins/sample/sample.c`, built with `cc`): asynchronous streams on
/// worker threads, device pointers that are not host pointers. The suite runs on device 1.
fn plugin_backend() -> (Arc<dyn DeviceApi>, Device) {
    let api = plugin_util::sample("conformance_plugin", &[]);
    let dev = Device::new(api.code(), 1);
    (api, dev)
}

conformance_suite!(plugin, plugin_backend);

/// The sample plugin with only the required entries: every kiln fallback (sync copies, memset by
/// host fill, query by synchronize, callbacks on the host, default chunk sizes) is exercised.
fn plugin_minimal_backend() -> (Arc<dyn DeviceApi>, Device) {
    let api = plugin_util::sample("conformance_plugin_minimal", &["SAMPLE_MINIMAL"]);
    let dev = Device::new(api.code(), 0);
    (api, dev)
}

conformance_suite!(plugin_minimal, plugin_minimal_backend);

/// The first OpenCL device (PoCL on CI); the tests skip visibly without one, and fail under
/// `KILN_REQUIRE_OPENCL=1`.
fn opencl_backend() -> Option<(Arc<dyn DeviceApi>, Device)> {
    let (api, dev) = common::opencl_device("the opencl conformance test")?;
    let api: Arc<dyn DeviceApi> = api;
    Some((api, dev))
}

conformance_suite!(opencl, opencl_backend);

/// The first CUDA device (none on CI: no GPU); the tests skip visibly without one, and fail
/// under `KILN_REQUIRE_CUDA=1`. `KILN_CUDA_DRIVER` picks another driver library (the mock of
/// `tests/device_cuda.rs`, which also runs this suite on it).
fn cuda_backend() -> Option<(Arc<dyn DeviceApi>, Device)> {
    let (api, dev) = common::cuda_device("the cuda conformance test")?;
    let api: Arc<dyn DeviceApi> = api;
    Some((api, dev))
}

conformance_suite!(cuda, cuda_backend);
