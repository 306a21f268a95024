//! The policy behind [`DeviceApi::copy_data_from_to`]: checks, routing to the backend that owns
//! the device side, bounce copies through host memory, and strided layouts.

use std::sync::Arc;

use super::api::{is_compact, shape_of, strides_of, DeviceApi};
use super::device::Device;
use super::error::{DeviceError, DeviceResult};
use super::memory::{data_size, DevicePtr, MemRegion};
use super::stream::StreamHandle;
use crate::packed_func::ffi::{DLDevice, DLTensor};

fn describe(t: &DLTensor, shape: &[i64]) -> String {
    format!("{} {}{:?}", Device::from(t.device), t.dtype, shape)
}

fn region(t: &DLTensor) -> MemRegion {
    MemRegion {
        device: t.device.into(),
        ptr: DevicePtr::from_raw(t.data),
        offset: t.byte_offset,
    }
}

/// A backend that serves `dev`, other than `me` (looked up in the registry).
fn other_api(dev: Device) -> DeviceResult<Arc<dyn DeviceApi>> {
    let api = super::registry::get(dev.device_type)?;
    api.check_device(dev)?;
    Ok(api)
}

/// Flat copy of `n` bytes between two regions whose devices differ in type and are not the CPU:
/// device to host buffer, then host buffer to device. Both legs are synchronized, because the
/// host buffer dies at the end of this call.
///
/// # Safety
/// As [`DeviceApi::copy_data_from_to`].
unsafe fn bounce(
    src_api: &dyn DeviceApi,
    src: MemRegion,
    dst_api: &dyn DeviceApi,
    dst: MemRegion,
    n: usize,
) -> DeviceResult<()> {
    let mut host = vec![0u8; n];
    let host_region = MemRegion {
        device: Device::cpu(),
        ptr: DevicePtr::from_raw(host.as_mut_ptr().cast()),
        offset: 0,
    };
    // SAFETY: `host` is valid for `n` bytes and outlives both legs (each is synchronized);
    // the device sides are valid by the caller's contract.
    unsafe {
        src_api.raw_copy(src, host_region, n, StreamHandle::DEFAULT)?;
        src_api.raw_sync_stream(src.device, StreamHandle::DEFAULT)?;
        dst_api.raw_copy(host_region, dst, n, StreamHandle::DEFAULT)?;
    }
    dst_api.raw_sync_stream(dst.device, StreamHandle::DEFAULT)
}

/// See [`DeviceApi::copy_data_from_to`].
///
/// # Safety
/// As [`DeviceApi::copy_data_from_to`].
pub(crate) unsafe fn copy_tensor<A: DeviceApi + ?Sized>(
    api: &A,
    from: &DLTensor,
    to: &DLTensor,
    stream: StreamHandle,
) -> DeviceResult<()> {
    let fdev = Device::from(from.device);
    let tdev = Device::from(to.device);
    // SAFETY: shape pointers hold `ndim` entries (caller).
    let (fshape, tshape) = unsafe { (shape_of(from)?, shape_of(to)?) };
    if from.dtype != to.dtype {
        return Err(DeviceError::CopyMismatch {
            from: describe(from, fshape),
            to: describe(to, tshape),
            reason: format!(
                "dtypes differ: the destination expects {}, the source is {}",
                to.dtype, from.dtype
            ),
        });
    }
    if fshape != tshape {
        return Err(DeviceError::CopyMismatch {
            from: describe(from, fshape),
            to: describe(to, tshape),
            reason: format!(
                "shapes differ: the destination expects {tshape:?}, the source is {fshape:?}"
            ),
        });
    }
    let nbytes = data_size(fshape, from.dtype).ok_or_else(|| {
        DeviceError::InvalidTensor(format!(
            "shape {fshape:?} has a negative extent or overflows"
        ))
    })?;
    if nbytes == 0 {
        return Ok(());
    }
    let n = usize::try_from(nbytes)
        .map_err(|_| DeviceError::InvalidTensor(format!("{nbytes} bytes do not fit in memory")))?;
    if from.data.is_null() || to.data.is_null() {
        return Err(DeviceError::InvalidTensor(format!(
            "copying {} to {}: data is NULL",
            describe(from, fshape),
            describe(to, tshape)
        )));
    }
    let me = api.device_type();
    if fdev.device_type != me && tdev.device_type != me {
        return Err(DeviceError::InvalidDevice {
            device: fdev,
            reason: format!(
                "backend `{}` copies to or from its own devices only (asked {fdev} -> {tdev}); \
                 use kiln::device_api::copy_data_from_to",
                api.name()
            ),
        });
    }
    // The other side's backend, when it is another one.
    let mut other: Option<(Device, Arc<dyn DeviceApi>)> = None;
    for d in [fdev, tdev] {
        if d.device_type == me {
            api.check_device(d)?;
        } else {
            other = Some((d, other_api(d)?));
        }
    }
    let me_dev = if fdev.device_type == me { fdev } else { tdev };
    // SAFETY: strides hold `ndim` entries when non-NULL (caller).
    let (fcompact, tcompact) = unsafe {
        (
            is_compact(fshape, strides_of(from)),
            is_compact(tshape, strides_of(to)),
        )
    };

    if fcompact && tcompact {
        let (src, dst) = (region(from), region(to));
        return match &other {
            // Same backend on both sides (any device ids), or this backend and the CPU.
            None => {
                // SAFETY: regions valid by the caller's contract.
                match unsafe { api.raw_copy(src, dst, n, stream) } {
                    Err(DeviceError::Unsupported { .. }) if fdev != tdev => {
                        // No peer copy between two devices of this backend.
                        api.raw_sync_stream(me_dev, stream)?;
                        // SAFETY: as above.
                        unsafe { bounce(&ForwardRef(api), src, &ForwardRef(api), dst, n) }
                    }
                    r => r,
                }
            }
            Some((odev, oapi)) if me_dev.is_cpu() || odev.is_cpu() => {
                if me_dev.is_cpu() {
                    // The other backend owns the device side; it runs on its default stream,
                    // synchronized, since `stream` belongs to the CPU.
                    // SAFETY: regions valid by the caller's contract.
                    unsafe { oapi.raw_copy(src, dst, n, StreamHandle::DEFAULT)? };
                    oapi.raw_sync_stream(*odev, StreamHandle::DEFAULT)
                } else {
                    // SAFETY: regions valid by the caller's contract.
                    unsafe { api.raw_copy(src, dst, n, stream) }
                }
            }
            Some((_, oapi)) => {
                api.raw_sync_stream(me_dev, stream)?;
                let mine = ForwardRef(api);
                // SAFETY: regions valid by the caller's contract.
                unsafe {
                    if fdev.device_type == me {
                        bounce(&mine, src, oapi.as_ref(), dst, n)
                    } else {
                        bounce(oapi.as_ref(), src, &mine, dst, n)
                    }
                }
            }
        };
    }

    // Strided: walk on the host when both sides are host memory.
    let host = |d: Device| -> bool {
        if d.device_type == me {
            api.host_accessible()
        } else {
            other.as_ref().is_some_and(|(_, a)| a.host_accessible())
        }
    };
    if host(fdev) && host(tdev) {
        api.raw_sync_stream(me_dev, stream)?;
        // SAFETY: both sides are host memory valid for the described elements (caller).
        return unsafe { super::cpu::strided_copy_host(from, to) };
    }
    // The device side's backend may walk strides itself.
    let owner: &dyn DeviceApi = match &other {
        Some((d, a)) if !d.is_cpu() => a.as_ref(),
        _ => &ForwardRef(api),
    };
    // SAFETY: as the caller's contract.
    match unsafe { owner.raw_copy_strided(from, to, stream) } {
        Err(DeviceError::Unsupported { .. }) => {}
        r => return r,
    }
    // Otherwise pack or unpack the strided host side through a compact host buffer.
    let elem_bits = usize::from(from.dtype.bits) * usize::from(from.dtype.lanes);
    let mut buf = vec![0u8; n];
    let temp = DLTensor {
        data: buf.as_mut_ptr().cast(),
        device: DLDevice::from(Device::cpu()),
        ndim: from.ndim,
        dtype: from.dtype,
        shape: from.shape,
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    if fdev.is_cpu() && !fcompact && tcompact && elem_bits % 8 == 0 {
        // SAFETY: `from` is valid host memory (caller), `temp` is `buf`, n bytes.
        unsafe { super::cpu::strided_copy_host(from, &temp)? };
        // SAFETY: `temp` is valid and outlives the copy (synchronized below).
        unsafe { copy_tensor(api, &temp, to, stream)? };
        return api.raw_sync_stream(me_dev, stream);
    }
    if tdev.is_cpu() && !tcompact && fcompact && elem_bits % 8 == 0 {
        // SAFETY: `temp` is `buf`, n bytes; `from` is valid (caller).
        unsafe { copy_tensor(api, from, &temp, stream)? };
        api.raw_sync_stream(me_dev, stream)?;
        // SAFETY: `to` is valid host memory (caller).
        return unsafe { super::cpu::strided_copy_host(&temp, to) };
    }
    Err(DeviceError::Unsupported {
        device: if fcompact { tdev } else { fdev },
        what: format!(
            "strided copies between {fdev} and {tdev} (a strided device tensor must be made \
             compact on its device first)"
        ),
    })
}

/// Lends a `&A` (possibly unsized) as a `&dyn DeviceApi`.
struct ForwardRef<'a, A: DeviceApi + ?Sized>(&'a A);

mod forward {
    use super::super::api::{AttrKind, AttrValue, DeviceApi};
    use super::super::device::{Device, DeviceType};
    use super::super::error::DeviceResult;
    use super::super::memory::{DeviceMemoryApi, DevicePtr, HostCallback, MemRegion, MemoryStats};
    use super::super::stream::{DeviceStreamApi, EventHandle, StreamHandle};
    use super::ForwardRef;
    use crate::packed_func::ffi::{DLDataType, DLTensor};

    impl<A: DeviceApi + ?Sized> DeviceApi for ForwardRef<'_, A> {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn device_type(&self) -> DeviceType {
            self.0.device_type()
        }
        fn device_count(&self) -> DeviceResult<usize> {
            self.0.device_count()
        }
        fn raw_attr(&self, dev: Device, kind: AttrKind) -> DeviceResult<Option<AttrValue>> {
            self.0.raw_attr(dev, kind)
        }
        // Forwarded rather than provided: the provided method would instantiate `copy_tensor`
        // for `ForwardRef<ForwardRef<...>>` without end.
        unsafe fn copy_data_from_to(
            &self,
            from: &DLTensor,
            to: &DLTensor,
            stream: StreamHandle,
        ) -> DeviceResult<()> {
            // SAFETY: forwarded contract.
            unsafe { self.0.copy_data_from_to(from, to, stream) }
        }
    }

    impl<A: DeviceApi + ?Sized> DeviceMemoryApi for ForwardRef<'_, A> {
        fn raw_alloc(
            &self,
            dev: Device,
            nbytes: usize,
            align: usize,
            dtype_hint: DLDataType,
        ) -> DeviceResult<DevicePtr> {
            self.0.raw_alloc(dev, nbytes, align, dtype_hint)
        }
        fn raw_free(&self, dev: Device, ptr: DevicePtr) -> DeviceResult<()> {
            self.0.raw_free(dev, ptr)
        }
        unsafe fn raw_copy(
            &self,
            src: MemRegion,
            dst: MemRegion,
            nbytes: usize,
            stream: StreamHandle,
        ) -> DeviceResult<()> {
            // SAFETY: forwarded contract.
            unsafe { self.0.raw_copy(src, dst, nbytes, stream) }
        }
        unsafe fn raw_copy_strided(
            &self,
            from: &DLTensor,
            to: &DLTensor,
            stream: StreamHandle,
        ) -> DeviceResult<()> {
            // SAFETY: forwarded contract.
            unsafe { self.0.raw_copy_strided(from, to, stream) }
        }
        fn raw_memset(
            &self,
            dev: Device,
            ptr: DevicePtr,
            offset: u64,
            value: u8,
            nbytes: usize,
            stream: StreamHandle,
        ) -> DeviceResult<()> {
            self.0.raw_memset(dev, ptr, offset, value, nbytes, stream)
        }
        fn raw_memory_stats(&self, dev: Device) -> DeviceResult<MemoryStats> {
            self.0.raw_memory_stats(dev)
        }
        fn host_accessible(&self) -> bool {
            self.0.host_accessible()
        }
        fn pointers_are_handles(&self) -> bool {
            self.0.pointers_are_handles()
        }
    }

    impl<A: DeviceApi + ?Sized> DeviceStreamApi for ForwardRef<'_, A> {
        fn raw_create_stream(&self, dev: Device) -> DeviceResult<StreamHandle> {
            self.0.raw_create_stream(dev)
        }
        fn raw_free_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
            self.0.raw_free_stream(dev, s)
        }
        fn raw_sync_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
            self.0.raw_sync_stream(dev, s)
        }
        fn raw_query_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<bool> {
            self.0.raw_query_stream(dev, s)
        }
        fn raw_check_stream(&self, dev: Device, s: StreamHandle) -> DeviceResult<()> {
            self.0.raw_check_stream(dev, s)
        }
        fn raw_add_callback(
            &self,
            dev: Device,
            s: StreamHandle,
            cb: HostCallback,
        ) -> DeviceResult<()> {
            self.0.raw_add_callback(dev, s, cb)
        }
        fn raw_create_event(&self, dev: Device) -> DeviceResult<EventHandle> {
            self.0.raw_create_event(dev)
        }
        fn raw_record_event(
            &self,
            dev: Device,
            s: StreamHandle,
            e: EventHandle,
        ) -> DeviceResult<()> {
            self.0.raw_record_event(dev, s, e)
        }
        fn raw_query_event(&self, dev: Device, e: EventHandle) -> DeviceResult<bool> {
            self.0.raw_query_event(dev, e)
        }
        fn raw_sync_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
            self.0.raw_sync_event(dev, e)
        }
        fn raw_stream_wait_event(
            &self,
            dev: Device,
            s: StreamHandle,
            e: EventHandle,
        ) -> DeviceResult<()> {
            self.0.raw_stream_wait_event(dev, s, e)
        }
        fn raw_destroy_event(&self, dev: Device, e: EventHandle) -> DeviceResult<()> {
            self.0.raw_destroy_event(dev, e)
        }
        fn raw_event_elapsed(
            &self,
            dev: Device,
            start: EventHandle,
            end: EventHandle,
        ) -> DeviceResult<std::time::Duration> {
            self.0.raw_event_elapsed(dev, start, end)
        }
    }
}
