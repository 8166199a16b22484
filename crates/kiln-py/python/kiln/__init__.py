"""kiln from Python: compile kernels written in kiln's text format and launch them on CPU,
OpenCL and CUDA devices, with numpy and DLPack interop, typed exceptions and replayable plans.

>>> import kiln, numpy as np
>>> dev = kiln.Device("CPU")
>>> add = dev.compile("examples/kernels/add.kiln")
>>> a, b = dev.from_numpy(np.ones(8, np.float32)), dev.from_numpy(np.arange(8, dtype=np.float32))
>>> c = dev.empty("f32", 8)
>>> add(a, b, c, n=8)
>>> c.numpy()
"""

from ._kiln import (
    DTYPES,
    MAX_LOCAL_BYTES,
    Buffer,
    CompileError,
    Device,
    DeviceInfo,
    DeviceLostError,
    DriverError,
    Error,
    InvalidArgumentError,
    IoError,
    Kernel,
    LaunchError,
    OutOfBoundsError,
    OutOfMemoryError,
    ParseError,
    Plan,
    PlanRun,
    TimeoutError,
    UnavailableError,
    __version__,
    devices,
    from_dlpack,
)

__all__ = [
    "DTYPES",
    "MAX_LOCAL_BYTES",
    "Buffer",
    "CompileError",
    "Device",
    "DeviceInfo",
    "DeviceLostError",
    "DriverError",
    "Error",
    "InvalidArgumentError",
    "IoError",
    "Kernel",
    "LaunchError",
    "OutOfBoundsError",
    "OutOfMemoryError",
    "ParseError",
    "Plan",
    "PlanRun",
    "TimeoutError",
    "UnavailableError",
    "__version__",
    "devices",
    "from_dlpack",
]
