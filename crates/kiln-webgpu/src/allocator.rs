//! Storage buffers, and host transfers staged through mappable buffers.
//!
//! A kiln address on this backend is a key into the device's buffer table (wgpu has no
//! device addresses). Buffers are rounded up to whole 4-byte words (wgpu copies and WGSL
//! arrays are in words); a transfer of a window that does not start and end on a word is
//! widened to the words around it (read, patched on the host, written back).
//! A buffer larger than the adapter's storage binding limit could never be bound to a
//! kernel, so it is refused when allocated ([`Error::Limit`]).

use std::sync::Arc;
use std::sync::mpsc;

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::{Allocator, Error, RawPtr, RawView, Result};

use crate::{WgpuDevice, driver};

/// wgpu's copy granularity.
const WORD: u64 = wgpu::COPY_BUFFER_ALIGNMENT;

/// Storage buffers of one wgpu device.
pub struct WgpuAllocator {
    gpu: Arc<WgpuDevice>,
}

impl WgpuAllocator {
    pub fn new(gpu: Arc<WgpuDevice>) -> WgpuAllocator {
        WgpuAllocator { gpu }
    }
}

/// `[start, end)` widened to whole words.
fn words(offset: usize, bytes: usize) -> (u64, u64) {
    let start = offset as u64 / WORD * WORD;
    let end = (offset + bytes) as u64;
    (start, end.div_ceil(WORD) * WORD)
}

/// Reads `[start, end)` (word aligned) of `buffer` to the host through a staging buffer.
pub(crate) fn read(gpu: &WgpuDevice, buffer: &wgpu::Buffer, start: u64, end: u64) -> Result<Vec<u8>> {
    let size = end - start;
    if size == 0 {
        return Ok(Vec::new());
    }
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("kiln staging (read)"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, start, &staging, 0, size);
    gpu.submit(Some(encoder))?;
    let (tx, rx) = mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    gpu.wait(None)?;
    rx.recv()
        .map_err(|_| driver("Buffer::map_async", "the map callback never ran", true))?
        .map_err(|e| driver("Buffer::map_async", e, false))?;
    let out = staging.get_mapped_range(..).map_err(|e| driver("get_mapped_range", e, false))?.to_vec();
    staging.unmap();
    Ok(out)
}

/// Records `dst <- src` (word-aligned windows of equal size) into `encoder`. Two windows of
/// one buffer go through a scratch buffer (wgpu copies between two buffers only).
pub(crate) fn encode_copy(
    gpu: &WgpuDevice,
    encoder: &mut wgpu::CommandEncoder,
    dst: RawView,
    src: RawView,
) -> Result<()> {
    let (d, s) = (gpu.buffer(dst.base)?, gpu.buffer(src.base)?);
    let bytes = src.bytes as u64;
    if bytes == 0 {
        return Ok(());
    }
    if d != s {
        encoder.copy_buffer_to_buffer(&s, src.offset as u64, &d, dst.offset as u64, bytes);
        return Ok(());
    }
    let scratch = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("kiln copy scratch"),
        size: bytes,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    encoder.copy_buffer_to_buffer(&s, src.offset as u64, &scratch, 0, bytes);
    encoder.copy_buffer_to_buffer(&scratch, 0, &d, dst.offset as u64, bytes);
    Ok(())
}

/// Writes whole words `data` at `start` of `buffer` and waits until the write landed.
fn write(gpu: &WgpuDevice, buffer: &wgpu::Buffer, start: u64, data: &[u8]) -> Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    gpu.queue.write_buffer(buffer, start, data);
    let index = gpu.submit(None)?;
    gpu.wait(Some(index))
}

impl Allocator for WgpuAllocator {
    /// DLPack's `kDLWebGPU`.
    fn dlpack_device_type(&self) -> Option<i32> {
        Some(15)
    }

    fn device(&self) -> &DeviceSpec {
        &self.gpu.spec
    }

    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        self.gpu.check_lost()?;
        let size = (bytes as u64).max(WORD).div_ceil(16) * 16;
        if size > self.gpu.limits.max_buffer_size {
            return Err(Error::OutOfMemory {
                device: format!(
                    "{} (the adapter's largest buffer is {} B)",
                    self.gpu.spec, self.gpu.limits.max_buffer_size
                ),
                requested: bytes,
                in_use: 0,
                cached: 0,
                budget: None,
            });
        }
        let binding = self.gpu.limits.max_storage_buffer_binding_size;
        if size > binding {
            return Err(Error::Limit {
                device: self.gpu.spec.to_string(),
                message: format!(
                    "{bytes} B is more than its storage binding limit of {binding} B: a kernel could never bind it; \
                     split the data into smaller buffers"
                ),
            });
        }
        let scope = self.gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if crate::ready("pop_error_scope", scope.pop())?.is_some() {
            return Err(Error::OutOfMemory {
                device: self.gpu.spec.to_string(),
                requested: bytes,
                in_use: 0,
                cached: 0,
                budget: None,
            });
        }
        Ok(self.gpu.insert(buffer))
    }

    unsafe fn free(&self, ptr: RawPtr, _bytes: usize) {
        if let Some(b) = self.gpu.remove(ptr) {
            b.destroy();
        }
    }

    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()> {
        let buffer = self.gpu.buffer(dst.base)?;
        let (start, end) = words(dst.offset, dst.bytes);
        if start == dst.offset as u64 && end == (dst.offset + dst.bytes) as u64 {
            return write(&self.gpu, &buffer, start, src);
        }
        let mut around = read(&self.gpu, &buffer, start, end)?;
        let at = dst.offset - start as usize;
        around[at..at + src.len()].copy_from_slice(src);
        write(&self.gpu, &buffer, start, &around)
    }

    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()> {
        let buffer = self.gpu.buffer(src.base)?;
        let (start, end) = words(src.offset, src.bytes);
        let around = read(&self.gpu, &buffer, start, end)?;
        let at = src.offset - start as usize;
        dst.copy_from_slice(&around[at..at + dst.len()]);
        Ok(())
    }

    unsafe fn copy(&self, dst: RawView, src: RawView) -> Result<()> {
        let aligned = |v: &RawView| (v.offset as u64).is_multiple_of(WORD) && (v.bytes as u64).is_multiple_of(WORD);
        if !(aligned(&dst) && aligned(&src)) {
            let mut host = vec![0u8; src.bytes];
            // SAFETY: the caller's contract: both windows are live allocations of this
            // allocator with equal sizes.
            unsafe {
                self.copyout(&mut host, src)?;
                return self.copyin(dst, &host);
            }
        }
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        encode_copy(&self.gpu, &mut encoder, dst, src)?;
        let index = self.gpu.submit(Some(encoder))?;
        self.gpu.wait(Some(index))
    }

    fn is_host(&self) -> bool {
        false
    }
}
