//! Devices: [`DeviceType`] (DLPack's codes plus extension codes of registered backends), its
//! names both ways (`cpu` <-> 1, like TVM's `DeviceName`), and [`Device`] `{ type, id }`.

use std::fmt;
use std::str::FromStr;

use super::error::{DeviceError, DeviceResult};
use crate::packed_func::ffi::{DLDevice, DLDeviceType};

/// A device type code: DLPack's `DLDeviceType` values, or an extension code (from
/// [`DeviceType::EXT_BASE`]) given to a backend registered at run time.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct DeviceType(pub i32);

impl DeviceType {
    /// `kDLCPU`.
    pub const CPU: Self = Self(DLDeviceType::CPU.0);
    /// `kDLCUDA`.
    pub const CUDA: Self = Self(DLDeviceType::CUDA.0);
    /// `kDLOpenCL`.
    pub const OPENCL: Self = Self(DLDeviceType::OPENCL.0);
    /// `kDLVulkan`.
    pub const VULKAN: Self = Self(DLDeviceType::VULKAN.0);
    /// `kDLMetal`.
    pub const METAL: Self = Self(DLDeviceType::METAL.0);
    /// `kDLROCM`.
    pub const ROCM: Self = Self(DLDeviceType::ROCM.0);
    /// `kDLExtDev`.
    pub const EXT_DEV: Self = Self(DLDeviceType::EXT_DEV.0);
    /// The first extension code. DLPack uses 1..=18 today and TVM reserves up to 35
    /// (`TVMDeviceExtType_End`), so kiln hands out codes from 64 upwards, below TVM's RPC mask
    /// (128).
    pub const EXT_BASE: i32 = 64;
    /// One past the last extension code (TVM's `kRPCSessMask`).
    pub const EXT_END: i32 = 128;

    /// The DLPack name of a built-in code (`cpu`, `cuda`, ...), without consulting the registry.
    pub fn builtin_name(self) -> Option<&'static str> {
        DLDeviceType(self.0).name()
    }

    /// The built-in code of a DLPack name or TVM alias (`"cpu"`, `"llvm"`, `"cuda"`, ...).
    pub fn from_builtin_name(name: &str) -> Option<Self> {
        DLDeviceType::from_name(name).map(Self::from)
    }

    /// The DLPack device type names, in code order.
    pub fn builtin_names() -> impl Iterator<Item = &'static str> {
        DLDeviceType::names()
    }

    /// The type's name: DLPack's for built-in codes, the registered name for extension codes,
    /// `"device_type(N)"` for anything else.
    pub fn name(self) -> String {
        if let Some(n) = self.builtin_name() {
            return n.to_owned();
        }
        super::registry::name_of(self).unwrap_or_else(|| format!("device_type({})", self.0))
    }

    /// The type called `name`: a DLPack name, a TVM alias, or a registered backend's name.
    ///
    /// # Errors
    /// [`DeviceError::UnknownDevice`], listing the known names.
    pub fn from_name(name: &str) -> DeviceResult<Self> {
        if let Some(t) = Self::from_builtin_name(name) {
            return Ok(t);
        }
        if let Some(t) = super::registry::code_of(name) {
            return Ok(t);
        }
        let mut known: Vec<String> = super::registry::list()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        for n in Self::builtin_names() {
            if !known.iter().any(|k| k == n) {
                known.push(n.to_owned());
            }
        }
        Err(DeviceError::UnknownDevice {
            name: name.to_owned(),
            known,
        })
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.name())
    }
}

impl From<DLDeviceType> for DeviceType {
    fn from(t: DLDeviceType) -> Self {
        Self(t.0)
    }
}

impl From<DeviceType> for DLDeviceType {
    fn from(t: DeviceType) -> Self {
        DLDeviceType(t.0)
    }
}

/// A device: a type and an ordinal, like DLPack's `DLDevice`. Prints as `cpu:0`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Device {
    /// The device type.
    pub device_type: DeviceType,
    /// The ordinal among devices of that type.
    pub device_id: i32,
}

impl Device {
    /// The device `device_type:device_id`.
    pub const fn new(device_type: DeviceType, device_id: i32) -> Self {
        Self {
            device_type,
            device_id,
        }
    }

    /// `cpu:0`, the host.
    pub const fn cpu() -> Self {
        Self::new(DeviceType::CPU, 0)
    }

    /// The DLPack struct.
    pub const fn to_dl(self) -> DLDevice {
        DLDevice {
            device_type: DLDeviceType(self.device_type.0),
            device_id: self.device_id,
        }
    }

    /// Whether this is a CPU device (host memory).
    pub fn is_cpu(self) -> bool {
        self.device_type == DeviceType::CPU
    }
}

impl From<DLDevice> for Device {
    fn from(d: DLDevice) -> Self {
        Self::new(DeviceType(d.device_type.0), d.device_id)
    }
}

impl From<Device> for DLDevice {
    fn from(d: Device) -> Self {
        d.to_dl()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.device_type, self.device_id)
    }
}

impl FromStr for Device {
    type Err = DeviceError;

    /// Parses `cpu`, `cpu:0`, `cuda:1`, or a registered backend's name with an optional id.
    fn from_str(s: &str) -> DeviceResult<Self> {
        let (name, id) = match s.split_once(':') {
            Some((n, i)) => (n, Some(i)),
            None => (s, None),
        };
        let device_type = DeviceType::from_name(name.trim())?;
        let device_id = match id {
            None => 0,
            Some(i) => i
                .trim()
                .parse::<i32>()
                .ok()
                .filter(|v| *v >= 0)
                .ok_or_else(|| DeviceError::InvalidDevice {
                    device: Device::new(device_type, -1),
                    reason: format!("`{s}`: the id `{i}` is not a non-negative integer"),
                })?,
        };
        Ok(Self::new(device_type, device_id))
    }
}
