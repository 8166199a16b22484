//! Buffers: zero-copy views and their bounds, exact-size host transfers, copies on one
//! device and across devices, dtype-checked host access.

use std::sync::Arc;

use kiln_device::kiln_ir::Scalar;
use kiln_device::{Buffer, Device, Error};

use crate::{Outcome, ensure, expect_err};

fn is_buffer_error(e: &Error) -> bool {
    matches!(e, Error::Buffer(_))
}

fn iota(n: usize, start: i32) -> Vec<i32> {
    (0..n as i32).map(|i| start + i).collect()
}

/// Views see and change the window of their base, nest relative to their own window, and
/// refuse any window that does not fit.
pub fn views(dev: &Arc<Device>) -> Outcome {
    let base = Buffer::from_slice(dev.allocator(), &iota(16, 0))?;
    let v = base.view(4, 8)?;
    ensure!(v.len() == 8 && v.nbytes() == 32, "view(4, 8) has {} elements / {} bytes", v.len(), v.nbytes());
    ensure!(v.to_vec::<i32>()? == iota(8, 4), "view(4, 8) reads {:?}", v.to_vec::<i32>()?);

    v.copy_from_slice(&iota(8, 100))?;
    let mut want = iota(16, 0);
    want[4..12].copy_from_slice(&iota(8, 100));
    ensure!(base.to_vec::<i32>()? == want, "a write through view(4, 8) gave base {:?}", base.to_vec::<i32>()?);

    let nested = v.view(2, 3)?;
    ensure!(nested.to_vec::<i32>()? == [102, 103, 104], "view(2, 3) of view(4, 8) reads {:?}", nested.to_vec::<i32>()?);
    ensure!(v.overlaps(&base) && nested.overlaps(&v), "views of one base must overlap their base");
    ensure!(!base.view(0, 4)?.overlaps(&base.view(4, 4)?), "adjacent views must not overlap");

    let empty = base.view(16, 0)?;
    ensure!(empty.is_empty() && empty.to_vec::<i32>()?.is_empty(), "an empty view at the end is valid and empty");

    for (offset, len) in [(10, 7), (17, 0), (0, 17), (usize::MAX, 2), (1, usize::MAX)] {
        expect_err(&format!("view({offset}, {len}) of 16 elements"), base.view(offset, len), is_buffer_error)?;
    }
    // Bounds are those of the view, not of the base behind it.
    expect_err("view(6, 3) of an 8-element view", v.view(6, 3), is_buffer_error)?;

    // A view keeps the memory alive after its base handle is gone.
    drop(base);
    ensure!(nested.to_vec::<i32>()? == [102, 103, 104], "a view outlived its base but its data changed");

    // Views at odd byte offsets (no alignment beyond the element size).
    let bytes: Vec<u8> = (0..10).collect();
    let b = Buffer::from_slice(dev.allocator(), &bytes)?;
    let odd = b.view(3, 5)?;
    ensure!(odd.to_vec::<u8>()? == [3, 4, 5, 6, 7], "u8 view(3, 5) reads {:?}", odd.to_vec::<u8>()?);
    odd.copyin(&[9; 5])?;
    ensure!(b.to_vec::<u8>()? == [0, 1, 2, 9, 9, 9, 9, 9, 8, 9], "u8 view write gave {:?}", b.to_vec::<u8>()?);

    // Reinterpretation shares bytes and checks divisibility.
    let words = Buffer::from_slice(dev.allocator(), &[0x0403_0201u32, 0x0807_0605])?;
    let as_bytes = words.view(1, 1)?.reinterpret(Scalar::U8)?;
    ensure!(as_bytes.to_vec::<u8>()? == [5, 6, 7, 8], "reinterpret as u8 reads {:?}", as_bytes.to_vec::<u8>()?);
    expect_err("u8 view(1, 3) reinterpreted as u32", b.view(1, 4)?.reinterpret(Scalar::U32), is_buffer_error)?;
    Ok(())
}

/// Host transfers move exactly `nbytes()` bytes; any other size is refused and leaves the
/// buffer unchanged.
pub fn exact_size_transfers(dev: &Arc<Device>) -> Outcome {
    let data: Vec<f32> = (0..8).map(|i| i as f32 * 0.5).collect();
    let buf = Buffer::from_slice(dev.allocator(), &data)?;
    for n in [0usize, 31, 33, 64] {
        expect_err(&format!("copyin of {n} bytes into 32"), buf.copyin(&vec![0xff; n]), is_buffer_error)?;
        expect_err(&format!("copyout of 32 bytes into {n}"), buf.copyout(&mut vec![0; n]), is_buffer_error)?;
    }
    expect_err("copy_from_slice of 7 f32 into 8", buf.copy_from_slice(&[0f32; 7]), is_buffer_error)?;
    expect_err("copy_from_slice of 9 f32 into 8", buf.copy_from_slice(&[0f32; 9]), is_buffer_error)?;
    ensure!(buf.to_vec::<f32>()? == data, "a refused transfer changed the buffer: {:?}", buf.to_vec::<f32>()?);

    let mut out = vec![0u8; 32];
    buf.copyout(&mut out)?;
    let want: Vec<u8> = data.iter().flat_map(|f| f.to_ne_bytes()).collect();
    ensure!(out == want, "copyout bytes differ from the f32 data");

    let empty = dev.buffer(Scalar::F32, 0)?;
    empty.copyin(&[])?;
    ensure!(empty.to_vec::<f32>()?.is_empty(), "an empty buffer reads back non-empty");
    expect_err("copyin of 4 bytes into an empty buffer", empty.copyin(&[0; 4]), is_buffer_error)?;

    // A larger transfer with a pattern that exposes swapped or shifted pages.
    let big: Vec<u32> = (0..1u32 << 16).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let b = Buffer::from_slice(dev.allocator(), &big)?;
    ensure!(b.to_vec::<u32>()? == big, "a 256 KiB round trip changed the data");
    Ok(())
}

/// `copy_from` on one device: whole buffers, views, refused size mismatches and overlaps.
pub fn copies(dev: &Arc<Device>) -> Outcome {
    let a = Buffer::from_slice(dev.allocator(), &iota(16, 0))?;
    let b = Buffer::from_slice(dev.allocator(), &[-1i32; 16])?;
    b.copy_from(&a)?;
    ensure!(b.to_vec::<i32>()? == iota(16, 0), "copy_from of a whole buffer gave {:?}", b.to_vec::<i32>()?);

    let c = Buffer::from_slice(dev.allocator(), &[-1i32; 16])?;
    c.view(2, 4)?.copy_from(&a.view(12, 4)?)?;
    let mut want = vec![-1; 16];
    want[2..6].copy_from_slice(&[12, 13, 14, 15]);
    ensure!(c.to_vec::<i32>()? == want, "copy between views gave {:?}", c.to_vec::<i32>()?);

    // Disjoint windows of one buffer may be copied; overlapping ones may not.
    a.view(0, 4)?.copy_from(&a.view(8, 4)?)?;
    ensure!(a.view(0, 4)?.to_vec::<i32>()? == [8, 9, 10, 11], "copy within one buffer gave {:?}", a.to_vec::<i32>()?);
    expect_err("copy between overlapping windows", a.view(0, 8)?.copy_from(&a.view(4, 8)?), is_buffer_error)?;
    expect_err("copy of 16 elements into 15", a.view(0, 15)?.copy_from(&b), is_buffer_error)?;
    ensure!(b.to_vec::<i32>()? == iota(16, 0), "a refused copy changed its source");
    Ok(())
}

/// Copies between `dev` and `peer` (staged through the host when the allocators differ),
/// with views on both sides.
pub fn cross_device_copies(dev: &Arc<Device>, peer: &Arc<Device>) -> Outcome {
    let data: Vec<f32> = (0..64).map(|i| i as f32 - 20.25).collect();
    let a = Buffer::from_slice(dev.allocator(), &data)?;
    let p = peer.buffer(Scalar::F32, 64)?;
    p.copy_from(&a)?;
    ensure!(p.to_vec::<f32>()? == data, "{} -> {} copy gave wrong data", dev.spec(), peer.spec());

    let back = Buffer::from_slice(dev.allocator(), &[0f32; 64])?;
    back.view(8, 16)?.copy_from(&p.view(40, 16)?)?;
    let mut want = vec![0f32; 64];
    want[8..24].copy_from_slice(&data[40..56]);
    ensure!(back.to_vec::<f32>()? == want, "{} view -> {} view copy gave wrong data", peer.spec(), dev.spec());
    expect_err("cross-device copy of 64 elements into 63", p.view(0, 63)?.copy_from(&a), is_buffer_error)?;
    Ok(())
}

/// An allocation no device can satisfy is a typed out-of-memory error (lazily, at first
/// use), and the device keeps allocating normally afterwards.
pub fn oversized_allocation(dev: &Arc<Device>) -> Outcome {
    expect_err("a buffer of usize::MAX f32 elements", dev.buffer(Scalar::F32, usize::MAX), is_buffer_error)?;
    let huge = dev.buffer(Scalar::U8, 1 << 56)?;
    expect_err("allocating 64 PiB", huge.raw(), |e| matches!(e, Error::OutOfMemory { .. }))?;
    ensure!(!huge.is_allocated(), "a failed allocation left the buffer marked allocated");
    let ok = Buffer::from_slice(dev.allocator(), &[1u8, 2, 3])?;
    ensure!(ok.to_vec::<u8>()? == [1, 2, 3], "after a failed allocation a small buffer reads wrong data");
    Ok(())
}

/// Typed host access checks the element type; the bytes themselves are reachable through
/// `reinterpret` or the untyped transfers.
pub fn dtype_checked_access(dev: &Arc<Device>) -> Outcome {
    let buf = Buffer::from_slice(dev.allocator(), &[1i32, -2, 3])?;
    expect_err("to_vec::<f32> on an i32 buffer", buf.to_vec::<f32>(), is_buffer_error)?;
    expect_err("to_vec::<u32> on an i32 buffer", buf.to_vec::<u32>(), is_buffer_error)?;
    expect_err("to_vec::<i64> on an i32 buffer", buf.to_vec::<i64>(), is_buffer_error)?;
    expect_err("copy_from_slice::<f32> on an i32 buffer", buf.copy_from_slice(&[0f32; 3]), is_buffer_error)?;
    ensure!(buf.to_vec::<i32>()? == [1, -2, 3], "a refused typed write changed the buffer");
    let bits = buf.reinterpret(Scalar::U32)?.to_vec::<u32>()?;
    ensure!(bits == [1, (-2i32) as u32, 3], "reinterpret as u32 reads {bits:?}");
    let f = dev.buffer(Scalar::F64, 2)?;
    expect_err("to_vec::<f32> on an f64 buffer", f.to_vec::<f32>(), is_buffer_error)?;
    Ok(())
}
