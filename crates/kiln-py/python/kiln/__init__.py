"""kiln from Python: compile kernels written in kiln's text format and launch them on CPU,
OpenCL, CUDA and WebGPU devices, with numpy and DLPack interop, typed exceptions, replayable plans,
collectives between devices (``Channel``), and saved plans (``Plan.save``, ``load_plan``): a
model in one file that loads and runs on any device without the compiler that made it.

>>> import kiln, numpy as np
>>> dev = kiln.Device("CPU")
>>> add = dev.compile("examples/kernels/add.kiln")
>>> a, b = dev.from_numpy(np.ones(8, np.float32)), dev.from_numpy(np.arange(8, dtype=np.float32))
>>> c = dev.empty("f32", 8)
>>> add(a, b, c, n=8)
>>> c.numpy()
"""

import atexit
import os

# Mesa's Vulkan device-select layer (loaded with wgpu's Vulkan instance) prints "error:
# XDG_RUNTIME_DIR is invalid" on every device listing where that variable is unset; it only
# reorders devices, so kiln turns it off before Vulkan loads, unless the user chose.
os.environ.setdefault("NODEVICE_SELECT", "1")

from ._kiln import _drain
from ._kiln import (
    DTYPES,
    MAX_LOCAL_BYTES,
    Buffer,
    Channel,
    ChannelError,
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
    LoadedPlan,
    OutOfBoundsError,
    OutOfMemoryError,
    ParseError,
    Plan,
    PlanFileError,
    PlanInputError,
    PlanRun,
    PlanSaveError,
    PlanVariable,
    PlanVersionError,
    TensorSpec,
    TimeoutError,
    UnavailableError,
    __version__,
    backends,
    devices,
    from_dlpack,
    load_plan,
)

# Work still in flight at exit (an unsynchronized launch, an unwaited `run_async`) finishes
# before the interpreter unloads the drivers' libraries, whose threads may be running it.
atexit.register(_drain)

__all__ = [
    "DTYPES",
    "MAX_LOCAL_BYTES",
    "Buffer",
    "Channel",
    "ChannelError",
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
    "LoadedPlan",
    "OutOfBoundsError",
    "OutOfMemoryError",
    "ParseError",
    "Plan",
    "PlanFileError",
    "PlanInputError",
    "PlanRun",
    "PlanSaveError",
    "PlanVariable",
    "PlanVersionError",
    "TensorSpec",
    "TimeoutError",
    "UnavailableError",
    "__version__",
    "backends",
    "devices",
    "from_dlpack",
    "load_plan",
]
