//! A loaded CUDA kernel: a module from a cubin (`cuModuleLoadData`) and its entry point.
//!
//! Argument ABI (the renderer emits exactly this signature): for every buffer slot in
//! `ProgramSpec::globals` order, the view's device address (`CUdeviceptr` + byte offset);
//! then every variable in `var_names` order, as its own integer type.
//!
//! Launch shape: a grouped launch (`gidxN`/`lidxN`) runs a grid of `global` blocks of
//! `local` threads. A direct launch (`idxN`, no local size) picks the block: up to
//! [`DIRECT_BLOCK`] threads, filled along x first, and a grid rounded up to whole blocks
//! (the renderer guards every `idxN` against its extent).

use std::ffi::{CString, c_void};
use std::sync::Arc;

use cudarc::driver::result as cu;
use cudarc::driver::sys::{self, CUfunction_attribute as FnAttr};
use kiln_device::kiln_ir::{Arg, DType, Scalar, variables};
use kiln_device::{CompiledSpec, Error, LaunchDims, Program, RawView, Result};

use crate::allocator::address;
use crate::{CudaDevice, PER_THREAD_STREAM, driver};

/// The most threads the backend puts in one block of a direct (`idxN`) launch.
pub const DIRECT_BLOCK: usize = 256;

/// A kernel ready to launch on one CUDA device. `Send + Sync` and reentrant: arguments are
/// per launch (`cuLaunchKernel` copies them), so no state is shared between launches.
pub struct CudaProgram {
    cu: Arc<CudaDevice>,
    module: sys::CUmodule,
    function: sys::CUfunction,
    name: String,
    params: usize,
    /// Name and integer dtype of every variable argument, in `var_names` order.
    vars: Vec<(String, Scalar)>,
    /// The largest block this kernel can run with on this device.
    max_block: usize,
}

// SAFETY: module and function handles are immutable driver objects; driver calls are
// thread-safe and each binds the device's context first.
unsafe impl Send for CudaProgram {}
// SAFETY: as above.
unsafe impl Sync for CudaProgram {}

impl std::fmt::Debug for CudaProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaProgram({} on {})", self.name, self.cu.spec)
    }
}

impl CudaProgram {
    /// Loads `compiled.bytes` (a cubin, or PTX that the driver JIT-compiles).
    pub fn load(cu: Arc<CudaDevice>, compiled: &CompiledSpec) -> Result<CudaProgram> {
        if compiled.bytes.is_empty() {
            return Err(Error::Load(format!(
                "`{}` has no CUDA binary: compile it with the CUDA compiler",
                compiled.name
            )));
        }
        cu.bind()?;
        // The driver reads PTX as a NUL-terminated string; a cubin is an ELF image.
        let mut image = compiled.bytes.clone();
        if !image.starts_with(b"\x7fELF") {
            image.push(0);
        }
        // SAFETY: `image` is a complete cubin or NUL-terminated PTX and outlives the call.
        let module = unsafe { cu::module::load_data(image.as_ptr() as *const c_void) }.map_err(|e| {
            Error::Load(format!(
                "{} rejected the binary of `{}` ({}); it was built for another architecture or a newer toolkit: \
                 clear the kernel cache entry",
                cu.info.name.trim(),
                compiled.name,
                driver("cuModuleLoadData", e)
            ))
        })?;
        let unload = |e: Error| {
            // SAFETY: the module was loaded above and nothing refers to it yet.
            let _ = unsafe { cu::module::unload(module) };
            e
        };
        let name =
            CString::new(compiled.name.clone()).map_err(|_| unload(Error::Load("kernel name has a NUL".into())))?;
        // SAFETY: `module` is live and `name` NUL-terminated.
        let function = unsafe { cu::module::get_function(module, name) }
            .map_err(|e| unload(Error::Load(format!("kernel `{}` is not in the CUDA module ({e})", compiled.name))))?;
        // SAFETY: `function` belongs to the live module.
        let max_block =
            unsafe { cu::function::get_function_attribute(function, FnAttr::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) }
                .map_err(|e| unload(driver("cuFuncGetAttribute", e)))?
                .max(1) as usize;
        let spec = &compiled.spec;
        let vars = variables(&spec.ast)
            .iter()
            .map(|v| match (v.arg(), v.dtype()) {
                (Arg::Var { name, .. }, DType::Scalar(s)) if s.is_int() => Ok((name.clone(), s)),
                (_, dt) => Err(Error::Load(format!(
                    "`{}`: variable `{}` has the non-integer dtype {dt}; variables must be integers",
                    compiled.name,
                    v.arg_name().unwrap_or("?")
                ))),
            })
            .collect::<Result<Vec<_>>>()
            .map_err(unload)?;
        Ok(CudaProgram {
            cu,
            module,
            function,
            name: compiled.name.clone(),
            params: spec.globals.len(),
            vars,
            max_block,
        })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.cu
    }

    /// Grid and block for `launch`, checked against this kernel's and the device's limits.
    pub(crate) fn shape(&self, launch: &LaunchDims) -> Result<([u32; 3], [u32; 3])> {
        let info = &self.cu.info;
        let refuse =
            |why: String| Error::Launch(format!("`{}` on {} ({}): {why}", self.name, self.cu.spec, info.name.trim()));
        if launch.global.contains(&0) || launch.local.is_some_and(|l| l.contains(&0)) {
            return Err(refuse(format!("launch {launch:?} has an empty dimension; every size must be at least 1")));
        }
        let (grid, block) = match launch.local {
            Some(local) => (launch.global, local),
            None => {
                let mut room = DIRECT_BLOCK.min(self.max_block);
                let block = [0, 1, 2].map(|a| {
                    let b = launch.global[a].min(room).min(info.max_block_dims[a] as usize).max(1);
                    room /= b;
                    b
                });
                let grid = [0, 1, 2].map(|a| launch.global[a].div_ceil(block[a]));
                (grid, block)
            }
        };
        let threads: usize = block.iter().product();
        if threads > self.max_block {
            return Err(refuse(format!(
                "a block (work-group) of {block:?} = {threads} threads exceeds this kernel's limit of {}; use smaller \
                 work-groups",
                self.max_block
            )));
        }
        if let Some(a) = (0..3).find(|&a| block[a] > info.max_block_dims[a] as usize) {
            return Err(refuse(format!(
                "local size {} on axis {a} exceeds the device limit {:?}",
                block[a], info.max_block_dims
            )));
        }
        if let Some(a) = (0..3).find(|&a| grid[a] > info.max_grid_dims[a] as usize) {
            return Err(refuse(format!(
                "{} blocks on axis {a} exceed the device's grid limit {:?}; use larger work-groups or split the work \
                 over several launches",
                grid[a], info.max_grid_dims
            )));
        }
        Ok((grid.map(|g| g as u32), block.map(|b| b as u32)))
    }

    /// The checked shape and argument slots of one launch (see the module docs for the ABI).
    ///
    /// # Errors
    /// [`Error::Launch`] when the counts of buffers or values are wrong, a value does not fit
    /// its variable's dtype, or the shape exceeds a limit.
    pub(crate) fn arguments(&self, bufs: &[RawView], vals: &[i64], launch: &LaunchDims) -> Result<Arguments> {
        if bufs.len() != self.params || vals.len() != self.vars.len() {
            return Err(Error::Launch(format!(
                "`{}` takes {} buffer(s) and {} variable(s), got {} and {}",
                self.name,
                self.params,
                self.vars.len(),
                bufs.len(),
                vals.len()
            )));
        }
        let (grid, block) = self.shape(launch)?;
        // One 8-byte slot per argument; the driver reads each at its parameter's size.
        let mut slots: Vec<u64> = bufs.iter().map(address).collect();
        for ((name, dtype), &v) in self.vars.iter().zip(vals) {
            slots.push(int_arg(v, *dtype).ok_or_else(|| {
                Error::Launch(format!(
                    "`{}`: variable `{name}` is bound to {v}, which does not fit its dtype {dtype}; bind a value in \
                     {dtype}'s range or declare `{name}` with a wider dtype",
                    self.name
                ))
            })?);
        }
        let pointers = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        Ok(Arguments { function: self.function, grid, block, _slots: slots, pointers })
    }

    /// Enqueues one launch on `stream`. Does not wait.
    ///
    /// # Safety
    /// As [`Program::execute`], except that the launch runs asynchronously: the memory must
    /// stay valid and unraced until the stream has finished it. `stream` belongs to this
    /// program's context, which is current on the calling thread.
    pub unsafe fn enqueue_raw(
        &self,
        stream: sys::CUstream,
        bufs: &[RawView],
        vals: &[i64],
        launch: &LaunchDims,
    ) -> Result<()> {
        let mut args = self.arguments(bufs, vals, launch)?;
        let (grid, block) = (args.grid, args.block);
        // SAFETY: `args` points at one live slot per kernel parameter, in the order and with
        // the sizes (≤ 8 bytes, little-endian) of the signature the renderer emitted; the
        // caller guarantees the buffers; grid and block were checked against the limits.
        unsafe {
            cu::launch_kernel(
                self.function,
                (grid[0], grid[1], grid[2]),
                (block[0], block[1], block[2]),
                0,
                stream,
                &mut args.pointers,
            )
        }
        .map_err(|e| driver(&format!("cuLaunchKernel of `{}` (grid {grid:?}, block {block:?})", self.name), e))
    }
}

/// One launch's function, shape and arguments: the argument slots and a pointer to each,
/// as `cuLaunchKernel` and kernel graph nodes take them. The pointers stay valid while this
/// value lives (they point into the slots' heap buffer, which moving the value does not move).
pub(crate) struct Arguments {
    pub function: sys::CUfunction,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    _slots: Vec<u64>,
    pub pointers: Vec<*mut c_void>,
}

impl Arguments {
    /// The parameters of a kernel graph node for this launch; valid while `self` lives.
    pub fn node_params(&mut self) -> sys::CUDA_KERNEL_NODE_PARAMS {
        let [gx, gy, gz] = self.grid;
        let [bx, by, bz] = self.block;
        sys::CUDA_KERNEL_NODE_PARAMS {
            func: self.function,
            gridDimX: gx,
            gridDimY: gy,
            gridDimZ: gz,
            blockDimX: bx,
            blockDimY: by,
            blockDimZ: bz,
            sharedMemBytes: 0,
            kernelParams: self.pointers.as_mut_ptr(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        }
    }
}

/// `v` as the bits of an integer argument of dtype `dtype` in the low bytes of a slot
/// (little-endian, as on every CUDA host), if it fits.
fn int_arg(v: i64, dtype: Scalar) -> Option<u64> {
    let fits = match dtype {
        Scalar::I8 => i8::try_from(v).is_ok(),
        Scalar::I16 => i16::try_from(v).is_ok(),
        Scalar::I32 => i32::try_from(v).is_ok(),
        Scalar::I64 => true,
        Scalar::U8 => u8::try_from(v).is_ok(),
        Scalar::U16 => u16::try_from(v).is_ok(),
        Scalar::U32 => u32::try_from(v).is_ok(),
        Scalar::U64 => v >= 0,
        _ => false,
    };
    fits.then_some(v as u64 & (u64::MAX >> (64 - 8 * dtype.size() as u32)))
}

impl Program for CudaProgram {
    /// Launches on the calling thread's default stream and waits for completion.
    unsafe fn execute(&self, bufs: &[RawView], vals: &[i64], launch: &LaunchDims) -> Result<()> {
        self.cu.bind()?;
        // SAFETY: forwarded from this function's contract; we wait below, so the memory
        // outlives the launch.
        unsafe { self.enqueue_raw(PER_THREAD_STREAM, bufs, vals, launch) }?;
        // SAFETY: the calling thread's default stream, in the current context.
        unsafe { cu::stream::synchronize(PER_THREAD_STREAM) }.map_err(|e| {
            driver(
                &format!("kernel `{}` while running on {} (cuStreamSynchronize)", self.name, self.cu.info.name.trim()),
                e,
            )
        })
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for CudaProgram {
    fn drop(&mut self) {
        if self.cu.bind().is_ok() {
            // SAFETY: the module is unloaded once; kiln keeps a program alive while any queue
            // command uses it.
            let _ = unsafe { cu::module::unload(self.module) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_arguments_are_checked_and_truncated() {
        assert_eq!(int_arg(-1, Scalar::I32), Some(0xffff_ffff));
        assert_eq!(int_arg(-1, Scalar::I64), Some(u64::MAX));
        assert_eq!(int_arg(255, Scalar::U8), Some(255));
        assert_eq!(int_arg(256, Scalar::U8), None);
        assert_eq!(int_arg(-1, Scalar::U64), None);
        assert_eq!(int_arg(1, Scalar::F32), None);
    }
}
