//! What a device (or one of its compiler pairs) offers the code that generates its kernels.

use kiln_ir::Wmma;

/// What a device offers to the code that generates its kernels: the sizes to choose vector
/// widths and tiles from. Every field is optional: a backend fills what it knows, and a
/// generator falls back to its own default for the rest. Describes the hardware (and any
/// forced instruction set), not a generation: it survives [`Device::reset`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceProperties {
    /// The instruction set kernels are compiled for (`AVX-512`, `AVX2`, `NEON`, `SSE2`).
    pub isa: Option<String>,
    /// The widest vector register that instruction set has, in bytes (64 for AVX-512).
    pub vector_bytes: Option<usize>,
    /// Per-core level-1 data cache, in bytes.
    pub l1d_bytes: Option<usize>,
    /// Level-2 cache (per core on most CPUs), in bytes.
    pub l2_bytes: Option<usize>,
    /// Last-level (L3) cache, shared by the cores that see it, in bytes.
    pub l3_bytes: Option<usize>,
    /// The most work items one work group may have (OpenCL's `CL_DEVICE_MAX_WORK_GROUP_SIZE`,
    /// CUDA's threads per block); `None` on devices without work groups.
    pub max_work_group_size: Option<usize>,
    /// The most work items a work group may have along each dimension (x, y, z); their product
    /// may exceed [`DeviceProperties::max_work_group_size`], which bounds it too.
    pub max_work_group_dims: Option<[usize; 3]>,
    /// Local (work-group shared) memory one work group may use, in bytes. A kiln kernel
    /// declares at most [`kiln_ir::MAX_LOCAL_BYTES`] whatever the device has.
    pub local_memory_bytes: Option<usize>,
    /// The matrix multiply-accumulate forms ([`kiln_ir::Op::Wmma`] arguments: shape, dtypes,
    /// threads) the device's renderer turns into its matrix unit or register micro-tile, so
    /// a compiler can shape its matmuls around them (tinygrad's `tensor_cores`). A kernel
    /// with a WMMA the list lacks may be refused with [`Error::Render`]. Empty: none.
    pub wmma: Vec<Wmma>,
    /// The threads a kernel's work is spread over on a host device (the CPU's core pool), so
    /// that a host baseline can be given as many; `None` on devices that are not the host.
    pub threads: Option<usize>,
}

impl DeviceProperties {
    /// How many f32 lanes fill the widest vector ([`DeviceProperties::vector_bytes`] / 4), when known.
    pub fn f32_lanes(&self) -> Option<usize> {
        self.vector_bytes.map(|b| b / 4).filter(|&l| l > 0)
    }

    /// The largest cache the device reports (usually its L3), in bytes, when known.
    pub fn largest_cache_bytes(&self) -> Option<usize> {
        [self.l1d_bytes, self.l2_bytes, self.l3_bytes].into_iter().flatten().max()
    }
}
