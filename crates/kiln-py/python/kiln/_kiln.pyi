"""Type stubs of kiln's native module (re-exported by the ``kiln`` package)."""

import os
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

__version__: str

DTYPES: list[str]
"""kiln's dtype names: ``bool``, ``i8`` … ``u64``, ``f16``, ``bf16``, ``f32``, ``f64``."""

MAX_LOCAL_BYTES: int
"""The most local (work-group shared) memory one kernel may declare, in bytes, whatever its
device has (``Device.properties["local_memory_bytes"]``)."""

DType = Union[str, Any]
"""A kiln dtype name (``"f32"``), a numpy name (``"float32"``, ``"bfloat16"``) or anything
``numpy.dtype()`` accepts (``numpy.float32``)."""

Source = Union[str, "os.PathLike[str]"]
"""Kernel text in kiln's text format, or the path of a ``.kiln`` file (a one-line string that
names an existing file is a path)."""

class Error(Exception):
    """Every failure kiln reports.

    Attributes: ``root_cause`` (the message of the error that started the chain), and where
    known ``line`` / ``col`` (1-based, in the kernel text) and ``node`` (``%N`` in print order).
    """

    root_cause: str
    line: Optional[int]
    col: Optional[int]
    node: Optional[int]

class DeviceLostError(Error):
    """The device context is gone (a fatal driver error, or an object of an older generation
    after ``Device.reset()``): reset the device and recreate what ran on it."""

class OutOfMemoryError(Error):
    """Memory ran out even after the allocator's cache was freed."""

class InvalidArgumentError(Error):
    """The caller passed something wrong: retrying the same call cannot succeed."""

class ParseError(InvalidArgumentError):
    """Kernel text that does not parse or validate; ``line`` and ``col`` say where."""

class TimeoutError(Error):
    """A wait ran out of time; the work may still complete."""

class CompileError(Error):
    """Rendering, compiling or loading a kernel failed."""

class LaunchError(Error):
    """A launch was refused before it ran (buffer count, dtype, length, device)."""

class OutOfBoundsError(LaunchError):
    """An access no proof keeps inside its buffer (or a guarded access that tried to leave
    it); ``node`` and ``line`` say which."""

class UnavailableError(Error):
    """A device, backend or tool is not present."""

class IoError(Error):
    """The kernel cache or a host file failed."""

class DriverError(Error):
    """Any other (non-fatal) driver failure."""

class ChannelError(Error):
    """A collective failed (a peer did not arrive in time, failed, or passed other buffers); the channel is broken: make a new one."""

class PlanFileError(InvalidArgumentError):
    """A file that is not a plan this kiln can load; ``kind`` says why:

    - ``"not_a_plan"``: it does not start with a plan file's magic bytes;
    - ``"unknown_version"``: a format version this kiln does not read (``PlanVersionError``);
    - ``"truncated"``, ``"checksum"``: damaged after it was written (cut short, changed bytes);
    - ``"malformed"``: intact but not a plan (sizes, indices, windows, constants that do not fit);
    - ``"kernel"``: a kernel's text that does not parse or validate;
    - ``"node"``: a launch or copy that does not fit its kernel or buffers.

    Save the plan again, or fetch the file again. What is not the file's fault keeps kiln's own
    class: ``IoError`` (the file cannot be read), ``UnavailableError`` (a kernel needs what the
    device lacks), ``CompileError``, ``OutOfMemoryError``, ``OutOfBoundsError`` (a launch the
    bounds proof refuses under ``strict_bounds``)."""

    kind: str

class PlanVersionError(PlanFileError):
    """A plan file of a format version this kiln does not read: load it with the kiln that saved
    it, or save it again with this one."""

    found: int
    """The version in the file."""
    known: int
    """The version this kiln reads."""

class PlanSaveError(InvalidArgumentError):
    """A plan that cannot be saved: a collective (a channel joins running processes), a buffer
    of another device, input or output names that are empty or repeated, a shape that names no
    plan variable or needs more elements than its buffer; from ``kiln.tinygrad.save_jit``, a JIT
    whose work is not one KILN device's kernels and copies."""

class PlanInputError(InvalidArgumentError):
    """An input of a loaded plan's call that does not fit: an unknown or missing name, a name
    given twice, a dtype or shape the plan does not take (the message says what it takes), a
    dimension outside its variable's range, or an object that is not an array."""

    input: str
    """The input's name, as given."""

class DeviceInfo:
    """One row of ``devices()``."""

    name: str
    """``"CPU"``, ``"OPENCL"`` (device 0), ``"OPENCL:1"``, or the backend's name when it has no usable device."""
    available: bool
    """Whether ``Device(name)`` can open it."""
    description: str
    """The device's description when available, else why it is not."""

def backends() -> list[str]:
    """The backends this build registers, in registration order (``CPU`` first): the names
    of their devices, without an ordinal. Opens nothing."""

def devices() -> list[DeviceInfo]:
    """Every device of every backend this build has, available or not and why not (as
    ``kiln devices``)."""

def _drain() -> None:
    """Waits for work made from Python that is still in flight (registered with ``atexit``)."""

def from_dlpack(x: Any, device: Optional[Device] = None) -> Buffer:
    """A buffer sharing ``x``'s memory (a numpy array or any DLPack tensor) when the device
    (the CPU unless given) can use it in place: host memory, writable, aligned to its element
    size. Otherwise a copy on the device. The buffer keeps ``x``'s memory alive.

    Raises ``TypeError`` when ``x`` has no ``__dlpack__``, ``BufferError`` for strided memory."""

class Device:
    """A compute device, opened by name: ``Device("CPU")``, ``Device("OPENCL")``,
    ``Device("CUDA:0")``. A device is opened once per process and shared by every handle;
    ``Device("CPU", compiler="cc-avx2")`` is a device of its own whose default compiler pair is
    that one (see ``compilers``). ``Device("CPU:1")`` .. ``Device("CPU:63")`` are further CPU
    devices, each with its own thread pool (``KILN_CPU_DEVICES=n`` splits the cores between
    ``CPU:0`` .. ``CPU:n-1``): the ranks of a ``Channel`` in one process. Usable as a context
    manager, which closes the handle."""

    def __init__(self, name: str, compiler: Optional[str] = None) -> None: ...
    @property
    def name(self) -> str:
        """The device's name (``"CPU"``, ``"OPENCL"``, ``"OPENCL:1"``)."""
    @property
    def compilers(self) -> list[str]:
        """The device's compiler pairs, the default first: the CPU's ``llvm`` (in process,
        where libLLVM 16 is installed) and ``cc`` (the system C compiler) for the host's
        instruction set, ``cc-avx2`` and ``cc-sse2`` (older ones, where the CPU runs them);
        ``opencl-c``, ``nvrtc``, ``wgsl`` elsewhere."""
    @property
    def missing_compilers(self) -> dict[str, str]:
        """The pairs the device cannot offer on this machine, each with why (the CPU's
        ``llvm`` where libLLVM 16 is not installed)."""
    @property
    def description(self) -> str:
        """Model, driver and compiler, in words."""
    @property
    def properties(self) -> dict[str, Any]:
        """``isa``, ``vector_bytes``, ``l1d_bytes``, ``l2_bytes``, ``l3_bytes``;
        ``max_work_group_size``, ``max_work_group_dims`` (x, y, z) and ``local_memory_bytes`` on
        devices with work groups (OpenCL, CUDA, WebGPU). Each is ``None`` when unknown or absent.
        ``wmma``: the matrix-multiply-accumulate forms (kiln's ``WMMA`` op) the device renders,
        each ``(m, n, k, input dtype, accumulator dtype, threads)``, e.g.
        ``(16, 8, 16, "f16", "f32", 32)`` on CUDA sm_80+; empty where it has none."""
    @property
    def generation(self) -> int:
        """0 when opened, +1 per ``reset()``; objects of an older generation raise ``DeviceLostError``."""
    @property
    def is_lost(self) -> bool:
        """Whether a fatal error lost the device (``reset()`` recovers it)."""
    bounds_policy: str
    """``"guard"`` (run the guarded form of a kernel whose accesses no proof covers) or
    ``"refuse"`` (raise ``OutOfBoundsError``); applies to kernels compiled afterwards."""
    def reset(self) -> None:
        """Starts a new generation: every buffer, kernel and plan made before raises
        ``DeviceLostError`` from now on."""
    def synchronize(self) -> None:
        """Waits for every launch made from Python on this device and raises the first error
        among them, or the error that lost the device. (On a host device such as the CPU a
        launch has completed when it returns.)"""
    def memory_stats(self) -> dict[str, Optional[int]]:
        """``in_use``, ``cached``, ``high_water`` (bytes), ``hits``, ``misses``, ``budget``."""
    def trim(self) -> int:
        """Frees the allocator's cached blocks; returns the bytes released."""
    def compile(self, source: Source, name: Optional[str] = None, compiler: Optional[str] = None) -> Kernel:
        """Compiles kernel text or a ``.kiln`` file through the kernel cache, with the compiler
        pair ``compiler`` (one of ``compilers``; the default when ``None``: an unknown one
        raises ``UnavailableError`` naming the pairs). Parse and validation errors raise
        ``ParseError`` with ``line`` and ``col``. The name defaults to the file's stem."""
    def compile_many(self, sources: Iterable[Union[Source, Tuple[Source, Optional[str]]]]) -> list[Kernel]:
        """Compiles several kernels on all cores; each entry is a source or ``(source, name)``.
        Returns the kernels in order; raises the first failing entry's error."""
    def empty(self, dtype: DType, n: int) -> Buffer:
        """An uninitialized buffer of ``n`` elements of ``dtype``, allocated now: a size the
        device cannot hold raises ``OutOfMemoryError`` here, a negative or impossible one
        ``InvalidArgumentError``."""
    def from_numpy(self, array: Any) -> Buffer:
        """A buffer holding a copy of ``array`` (any shape, flattened in C order)."""
    def close(self) -> None:
        """Closes this handle: every later call through it (but ``name`` and ``repr``) raises
        ``InvalidArgumentError``. The device is opened once per process and stays open for
        other handles and for the buffers, kernels and plans made from it, which keep working;
        its memory is freed when the last of them is gone."""
    def __enter__(self) -> Device: ...
    def __exit__(self, *exc: Any) -> None: ...

class Buffer:
    """A typed window onto device memory. Views share the memory, which stays alive as long
    as any view, numpy array or DLPack tensor made from it. Host buffers (CPU) are shared
    with numpy without a copy: ``numpy.from_dlpack(buf)`` and ``numpy.asarray(buf)``."""

    @property
    def dtype(self) -> str:
        """The element type, as a kiln name (``"f32"``)."""
    @property
    def nbytes(self) -> int:
        """The size in bytes."""
    @property
    def device(self) -> str:
        """The device the memory lives on."""
    @property
    def is_host(self) -> bool:
        """Whether the host addresses the memory (zero-copy numpy and DLPack)."""
    def __len__(self) -> int:
        """The number of elements."""
    def numpy(self) -> Any:
        """A copy of the contents as a new 1-D numpy array."""
    def copy_from(self, source: Union[Buffer, Any]) -> None:
        """Copies a buffer of the same byte size (any device), or an array of the same
        dtype and element count, into this buffer."""
    def view(self, offset: int, length: Optional[int] = None) -> Buffer:
        """A zero-copy view of elements ``offset .. offset + length`` (to the end by default)."""
    def reinterpret(self, dtype: DType) -> Buffer:
        """The same bytes as another dtype."""
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule sharing this buffer's memory (host: ``kDLCPU``, CUDA: ``kDLCUDA``)."""
    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(1, 0)`` for host memory, ``(2, n)`` for CUDA device ``n``."""
    @property
    def __array_interface__(self) -> dict[str, Any]:
        """numpy's array interface of host memory (``numpy.asarray(buf)`` shares it)."""

class Kernel:
    """A compiled kernel. Call it with its buffers in slot order and its variables by name:
    ``kernel(a, b, out, n=1024)``. On a host device (the CPU) it has run when the call
    returns; on OpenCL, CUDA and WebGPU it is queued, and reading a buffer (``numpy()``,
    ``copy_from``, DLPack), a plan run or ``Device.synchronize()`` waits for it. Argument
    errors are raised by the call; failures while running by the next wait."""

    def __call__(self, *buffers: Buffer, **vars: int) -> None: ...
    def launch(self, buffers: Sequence[Buffer], vars: Optional[Mapping[str, int]] = None, *, reinterpret: bool = False) -> None:
        """``kernel(*buffers, **vars)``. With ``reinterpret=True`` each buffer is first viewed as
        its parameter's dtype, as ``buffer.reinterpret(dtype)`` would, without making the view
        objects (for callers that hold untyped byte buffers)."""
    @property
    def name(self) -> str:
        """The entry-point name."""
    @property
    def device(self) -> str:
        """The device family it was compiled for."""
    @property
    def var_names(self) -> list[str]:
        """The variables' names."""
    @property
    def vars(self) -> list[Tuple[str, int, int]]:
        """Each variable as ``(name, min, max)``."""
    @property
    def params(self) -> list[Tuple[int, str]]:
        """Each buffer parameter as ``(slot, dtype)``."""
    @property
    def outs(self) -> list[int]:
        """The slots the kernel writes."""
    @property
    def source(self) -> str:
        """The backend source it was rendered to."""

class Channel:
    """One rank's end of a group of ranks, which ``Plan``'s collectives combine buffers over.
    Every rank records the same collectives of a channel in the same order, each in its own
    plan, and the ranks' plans run at once (``run_async`` on each, then ``wait`` on each; or a
    thread per rank): a collective waits for every rank. A peer that does not arrive within
    the timeout, fails, or passes other buffers breaks the channel: every rank raises
    ``ChannelError``, and so does every later collective on it; make a new channel. A missing
    peer is always ``ChannelError``, also when the plan's own timeout is the shorter (the
    collective gives up with the run). A rank whose run fails before a collective (a kernel
    fault, a launch refused for the run's values) tells its peers, which fail at once. At
    interpreter exit every channel is broken first, so a run still waiting for a peer that
    will not come does not hold up the exit."""

    @staticmethod
    def local(count: int, timeout: Optional[float] = None) -> list[Channel]:
        """The ``count`` ends of a new channel between devices of this process, rank 0 first.
        A collective waits at most ``timeout`` seconds (60 by default) for its peers. A count
        of 0 (or above 4096), or a timeout that is 0, negative, infinite or NaN, raises
        ``InvalidArgumentError``."""
    @staticmethod
    def mpi_world(timeout: Optional[float] = None) -> Channel:
        """This process's end of a new channel over every process of the MPI job (``mpirun -n N
        python ...``): rank and count come from MPI. Host buffers go to MPI directly, buffers
        of other devices through host memory. Waits at most ``timeout`` seconds (60 by default;
        0 raises ``InvalidArgumentError``) for the other processes, now and in each collective:
        raises ``ChannelError`` when one does not come in time. Raises ``UnavailableError`` when
        this build of kiln has no MPI (build the wheel with the ``mpi`` feature)."""
    @property
    def rank(self) -> int:
        """This end's rank, ``0 .. count``."""
    @property
    def count(self) -> int:
        """How many ranks the channel joins."""
    @property
    def provider(self) -> str:
        """How the ranks meet: ``"local"`` (devices of one process) or ``"mpi"``."""
    @property
    def timeout(self) -> float:
        """The longest a collective waits for its peers, in seconds."""
    @property
    def broken(self) -> Optional[str]:
        """The message of the error that broke the channel, or ``None`` while it works."""

class Plan:
    """Records launches, copies and collectives once, then replays them with new variable
    values: the object a compiler's JIT replays. Work is ordered by the bytes each node reads
    and writes."""

    def __init__(self, device: Device, *, timeout: Optional[float] = None) -> None:
        """An empty plan; ``timeout`` (seconds) bounds how long a run waits. A collective of a
        run waits for its peers until the run's timeout or the channel's, whichever ends first,
        and raises ``ChannelError`` either way."""
    def launch(self, kernel: Kernel, buffers: Sequence[Buffer], vars: Optional[Mapping[str, int]] = None) -> int:
        """Records a launch; returns the node's index. The values are the later runs' defaults."""
    def rebind(self, bindings: Iterable[Tuple[int, int, Buffer]]) -> None:
        """Binds new buffers to recorded launches for the runs that follow: each (node, slot,
        buffer) replaces the buffer of parameter `slot` of launch `node`. All are applied or
        none; refused (LaunchError) when the new buffers would share memory in a way
        the recorded ones did not."""
    def copy(self, dst: Buffer, src: Buffer) -> int:
        """Records a copy; returns the node's index."""
    def all_reduce(self, channel: Channel, send: Buffer, recv: Optional[Buffer] = None, op: str = "sum") -> int:
        """Records an all-reduce: ``recv`` (same dtype and length; ``None`` reduces in place into
        ``send``) gets ``op`` (``"sum"``, ``"max"``, ``"min"``) over every rank's ``send``.
        Reductions take every numeric dtype (not ``bool``); f16 and bf16 are reduced in f32.

        Every collective returns the node's index, and raises ``InvalidArgumentError`` when it
        is recorded for buffers that do not fit it (dtype, length, not on the plan's device), a
        root or peer that is no rank of the channel, or an ``op`` that is not one of the three
        names (``None`` included), ``ChannelError`` on a broken channel. A run raises
        ``ChannelError`` when the collective fails on any rank."""
    def all_gather(self, channel: Channel, send: Buffer, recv: Buffer) -> int:
        """Records an all-gather: ``recv`` (``count`` times ``send``'s length) gets every
        rank's ``send`` in rank order."""
    def reduce_scatter(self, channel: Channel, send: Buffer, recv: Buffer, op: str = "sum") -> int:
        """Records a reduce-scatter: ``recv`` gets this rank's block of ``op`` over every
        rank's ``send`` (``count`` times ``recv``'s length)."""
    def broadcast(self, channel: Channel, buffer: Buffer, root: int) -> int:
        """Records a broadcast: every rank's ``buffer`` gets rank ``root``'s (``0 .. count``)."""
    def send(self, channel: Channel, buffer: Buffer, peer: int) -> int:
        """Records a send of ``buffer`` to rank ``peer``, which records the matching ``recv``
        (same dtype and length: a receive of other elements fails both with ``ChannelError``)."""
    def recv(self, channel: Channel, buffer: Buffer, peer: int) -> int:
        """Records a receive into ``buffer`` (same dtype and length as the sender's) from rank
        ``peer``, which records the matching ``send``."""
    def run(self, **vars: int) -> None:
        """Replays every node (variables not given keep their recorded values) and waits."""
    def run_async(self, **vars: int) -> PlanRun:
        """Starts a replay and returns at once; runs of one plan never overlap."""
    def save(
        self,
        path: Union[str, "os.PathLike[str]"],
        inputs: Optional[Mapping[str, Union[Buffer, Tuple[Buffer, Sequence[Union[int, str]]]]]] = None,
        outputs: Optional[Mapping[str, Union[Buffer, Tuple[Buffer, Sequence[Union[int, str]]]]]] = None,
    ) -> int:
        """Saves the plan to one file that ``load_plan`` loads on any device (the format:
        ``docs/saved-plans.md``); returns its size in bytes. ``inputs`` and ``outputs`` name
        buffers the plan uses: a buffer (one-dimensional, all of it), or ``(buffer, shape)``
        with the shape's dimensions ints or plan variable names (``("x", ["batch", 16])``: the
        dimension a run binds ``batch`` from). A buffer some node reads before anything wrote
        it is saved with its bytes as they are now (weights, state); every other buffer starts
        empty. Raises ``PlanSaveError`` for what cannot be saved, ``IoError`` when the file
        cannot be written (a failed save leaves an older file whole)."""
    @property
    def var_names(self) -> list[str]:
        """The plan's variables."""
    def __len__(self) -> int:
        """The number of recorded nodes."""

ArrayLike = Any
"""A numpy array, another DLPack tensor of host memory, or what ``numpy.asarray`` takes."""

class TensorSpec:
    """A named input or output of a loaded plan."""

    name: str
    dtype: str
    """Its element type, as a kiln name (``"f32"``)."""
    shape: list[Union[int, str]]
    """An int per fixed dimension, a plan variable's name per dimension that follows one."""

class PlanVariable:
    """A plan variable of a loaded plan (a dimension that may change from run to run)."""

    name: str
    value: int
    """The value it was saved with: a run that does not bind it uses this."""
    min: int
    """The smallest value every kernel that uses it accepts."""
    max: int
    """The largest."""

class LoadedPlan:
    """A saved plan loaded on a device (``load_plan``). Call it with arrays by input name,
    ``plan(x=array)`` or ``plan({"x": array})``; it returns a dict of new numpy arrays by output
    name. A dimension that is a plan variable takes the input's size and gives the outputs
    theirs. Calls take turns (one plan runs once at a time) and release the GIL."""

    def __call__(self, inputs: Optional[Mapping[str, ArrayLike]] = None, /, **named: ArrayLike) -> dict[str, Any]:
        """Runs the plan on every input, each given once by name (in ``inputs`` or as a
        keyword): numpy arrays and contiguous DLPack tensors of host memory are read in place,
        anything else numpy can make an array of is copied (strided arrays too). Returns every
        output as a new numpy array of its shape (bf16, which numpy lacks, as ``uint16`` holding
        its bits). Raises ``PlanInputError`` for an input that does not fit (it names the input
        and what the plan takes); the run's own errors as kiln's."""
    def run(self, inputs: Mapping[str, ArrayLike], *, vars: Optional[Mapping[str, int]] = None) -> dict[str, Any]:
        """``plan(inputs)`` with plan variables ``vars`` bound by name too (a variable no input
        shape names; one an input names must agree with it)."""
    @property
    def inputs(self) -> list[TensorSpec]:
        """The inputs, in the order they were saved."""
    @property
    def outputs(self) -> list[TensorSpec]:
        """The outputs, in the order they were saved."""
    @property
    def variables(self) -> list[PlanVariable]:
        """The plan variables."""
    @property
    def device(self) -> str:
        """The device it runs on (``"CPU"``, ``"OPENCL:0"``)."""
    @property
    def path(self) -> "os.PathLike[str]":
        """The file it was loaded from (a ``pathlib.Path``)."""
    @property
    def stats(self) -> dict[str, Union[int, float]]:
        """What loading did: ``file_bytes``, ``kernels``, ``nodes``, ``constant_bytes``,
        ``mapped_bytes`` (constants used in place from the mapped file) and ``load_seconds``."""

def load_plan(
    path: Union[str, "os.PathLike[str]"],
    device: Union[str, Device, None] = "CPU",
    *,
    compiler: Optional[str] = None,
    strict_bounds: bool = False,
    map_constants: bool = True,
) -> LoadedPlan:
    """Loads the plan file at ``path`` (written by ``Plan.save``, ``kiln.tinygrad.save_jit``,
    ``python -m kiln.onnx`` or kiln-runtime's ``SavedPlan``) on ``device`` (a name or a
    ``Device``; a plan saved on one device loads on any that has its kernels' features), with
    the device's compiler pair ``compiler`` instead of its default. Every part of the file is
    checked before anything runs; kernels come from kiln's kernel cache (``KILN_CACHE_DIR``) or
    are compiled on all cores. ``strict_bounds`` refuses at load a launch whose accesses the
    bounds proof cannot keep inside its buffers (``OutOfBoundsError``) instead of running its
    guarded form; ``map_constants=False`` reads the weights into memory instead of mapping the
    file (mapping assumes no other process truncates the file while it is loaded).

    Imports no compiler (neither tinygrad nor numpy: numpy is imported by the first call).
    Raises ``IoError`` (the file cannot be read), ``PlanFileError`` (not a plan, damaged,
    malformed; ``PlanVersionError`` for an unknown format version), ``UnavailableError`` (no
    such device, or a kernel needs what it lacks), ``CompileError``, ``OutOfMemoryError``."""

class PlanRun:
    """A replay started by ``Plan.run_async``."""

    def wait(self) -> None:
        """Waits for the run and raises its error, if any."""
    def done(self) -> bool:
        """Whether the run has finished."""
