//! Allocate tensors on the CPU device, copy between them, read attributes and use a workspace.
//!
//! Run with `cargo run --example cpu_alloc_copy --no-default-features`.

use kiln::device_api::{self, AttrKind, Device, StreamHandle, Tensor};

fn main() -> Result<(), kiln::Error> {
    let cpu = Device::cpu();
    let api = device_api::get_by_name("cpu")?;
    for kind in [
        AttrKind::DEVICE_NAME,
        AttrKind::MULTI_PROCESSOR_COUNT,
        AttrKind::L2_CACHE_SIZE_BYTES,
    ] {
        let value = api
            .attr(cpu, kind)?
            .map_or("-".to_owned(), |v| v.to_string());
        println!("{kind:<24} {value}");
    }

    // A tensor from host data, copied to a second tensor, read back.
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], cpu)?;
    let mut b = Tensor::zeros(&[2, 3], a.dtype(), cpu)?;
    b.copy_from(&a)?;
    println!("b = {:?} {:?}", b.shape(), b.to_vec::<f32>()?);

    // The same copy through the DeviceApi boundary, on a stream of our own.
    let stream = api.create_stream(cpu)?;
    let c = Tensor::empty(&[2, 3], a.dtype(), cpu)?;
    // SAFETY: both DLTensors describe live tensors of the same shape; synchronized below.
    unsafe { api.copy_data_from_to(a.as_dltensor(), c.as_dltensor(), stream)? };
    api.sync_stream(cpu, stream)?;
    api.free_stream(cpu, stream)?;
    println!("c = {:?}", c.to_vec::<f32>()?);

    // A temporary buffer from this thread's workspace pool.
    let w = api.alloc_workspace(cpu, 64 << 10, a.dtype())?;
    api.memset(cpu, w, 0, 0, 64 << 10, StreamHandle::DEFAULT)?;
    api.free_workspace(cpu, w)?;
    println!("memory: {:?}", api.memory_stats(cpu)?);
    Ok(())
}
