//! cuBLAS single-precision matmul, loaded at run time: the baseline `kiln bench` measures
//! kiln's matmul against on a CUDA device. Not part of kiln's compute path.
//!
//! cudarc panics when it calls into a library it cannot load, so [`Sgemm::new`] first
//! probes for libcublas (`libcublas.so`, `.so.13`, `.so.12`, ... on the loader's path) and
//! returns [`Error::Unavailable`] when it is absent; callers fall back to another baseline.

use std::sync::Arc;

use cudarc::cublas::result as blas;
use cudarc::cublas::sys as bsys;
use kiln_device::kiln_ir::{DeviceSpec, Scalar};
use kiln_device::{Buffer, Error, Result};

use crate::allocator::address;
use crate::{CudaDevice, PER_THREAD_STREAM, cuda_device};

fn blas_err(what: &str, e: blas::CublasError) -> Error {
    Error::Driver { backend: "CUDA", code: Some(e.0 as i64), fatal: false, message: format!("{what} failed: {e:?}") }
}

/// A cuBLAS handle on one CUDA device's primary context, working on the calling thread's
/// default stream (the stream kiln's synchronous launches use).
pub struct Sgemm {
    cu: Arc<CudaDevice>,
    handle: bsys::cublasHandle_t,
}

impl Sgemm {
    /// A handle for `spec`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when libcublas cannot be loaded or CUDA is unavailable; the
    /// driver's error when the handle cannot be created.
    pub fn new(spec: &DeviceSpec) -> Result<Sgemm> {
        let cu = cuda_device(spec)?;
        // SAFETY: only tries to dlopen the candidate names of libcublas.
        if !unsafe { bsys::is_culib_present() } {
            return Err(Error::Unavailable(
                "libcublas was not found on the loader's path (it ships with the CUDA toolkit, or the \
                 nvidia-cublas-cu12 wheel): add its directory to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        cu.bind()?;
        let handle = blas::create_handle().map_err(|e| blas_err("cublasCreate", e))?;
        let sgemm = Sgemm { cu, handle };
        // SAFETY: the handle is live; the per-thread default stream is valid in every context.
        unsafe { blas::set_stream(handle, PER_THREAD_STREAM as bsys::cudaStream_t) }
            .map_err(|e| blas_err("cublasSetStream", e))?;
        Ok(sgemm)
    }

    /// `c = a · b` for n×n row-major f32 matrices in buffers of this device; returns when
    /// `c` is written.
    ///
    /// # Errors
    /// [`Error::Invalid`] when a buffer is not f32 on this device, holds fewer than n·n
    /// elements, or `c` overlaps an input; the driver's error when the call fails.
    pub fn row_major(&self, a: &Buffer, b: &Buffer, c: &Buffer, n: usize) -> Result<()> {
        let side = i32::try_from(n).map_err(|_| Error::Invalid(format!("sgemm size {n} exceeds i32")))?;
        let need = n.checked_mul(n).ok_or_else(|| Error::Invalid(format!("sgemm size {n} overflows")))?;
        for (name, buf) in [("a", a), ("b", b), ("c", c)] {
            if buf.dtype() != Scalar::F32 || buf.device() != &self.cu.spec || buf.len() < need {
                return Err(Error::Invalid(format!(
                    "sgemm operand {name} must be at least {need} f32 on {}, got {} x {} on {}",
                    self.cu.spec,
                    buf.len(),
                    buf.dtype(),
                    buf.device()
                )));
            }
        }
        if c.overlaps(a) || c.overlaps(b) {
            return Err(Error::Invalid("sgemm output c overlaps an input".into()));
        }
        let (pa, pb, pc) = (address(&a.raw()?), address(&b.raw()?), address(&c.raw()?));
        self.cu.bind()?;
        let (one, zero) = (1f32, 0f32);
        let op = bsys::cublasOperation_t::CUBLAS_OP_N;
        // Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ: B goes first.
        // SAFETY: the three device addresses lie in live allocations of this device holding
        // at least n·n f32 each (checked above), c does not overlap a or b, and alpha/beta
        // point to host floats that outlive the call.
        unsafe {
            blas::sgemm(
                self.handle,
                op,
                op,
                side,
                side,
                side,
                &one,
                pb as *const f32,
                side,
                pa as *const f32,
                side,
                &zero,
                pc as *mut f32,
                side,
            )
        }
        .map_err(|e| blas_err("cublasSgemm", e))?;
        // SAFETY: the context is current; the per-thread stream is valid in it.
        unsafe { cudarc::driver::result::stream::synchronize(PER_THREAD_STREAM) }
            .map_err(|e| crate::driver("cuStreamSynchronize after cublasSgemm", e))
    }
}

impl Drop for Sgemm {
    fn drop(&mut self) {
        if self.cu.bind().is_ok() {
            // SAFETY: the handle was created in `new` and is destroyed once, here.
            let _ = unsafe { blas::destroy_handle(self.handle) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without CUDA (or without libcublas) the handle is a typed error, never a panic; with
    /// both, cuBLAS computes an exact product (inputs in 1/8 steps).
    #[test]
    fn sgemm_is_exact_or_unavailable() {
        let Some(dev) = crate::test_device() else {
            let e = Sgemm::new(&DeviceSpec::new(crate::BACKEND, 0)).err();
            assert!(matches!(e, Some(Error::Unavailable(_))), "{e:?}");
            return;
        };
        let sgemm = match Sgemm::new(dev.spec()) {
            Ok(s) => s,
            Err(Error::Unavailable(why)) => return println!("skipped: {why}"),
            Err(e) => panic!("{e}"),
        };
        let n = 48usize;
        let a: Vec<f32> = (0..n * n).map(|i| ((i * 7) % 13) as f32 * 0.125 - 0.75).collect();
        let b: Vec<f32> = (0..n * n).map(|i| ((i * 5) % 11) as f32 * 0.125 - 0.625).collect();
        let buf = |v: &[f32]| Buffer::from_slice(dev.allocator(), v).unwrap();
        let (ba, bb, bc) = (buf(&a), buf(&b), buf(&vec![0f32; n * n]));
        sgemm.row_major(&ba, &bb, &bc, n).unwrap();
        let want: Vec<f32> = (0..n * n).map(|e| (0..n).map(|k| a[e / n * n + k] * b[k * n + e % n]).sum()).collect();
        assert_eq!(bc.to_vec::<f32>().unwrap(), want);
        let short = buf(&[0f32; 4]);
        assert!(matches!(sgemm.row_major(&ba, &bb, &short, n), Err(Error::Invalid(_))));
        assert!(matches!(sgemm.row_major(&ba, &bb, &ba, n), Err(Error::Invalid(_))));
    }
}
