"""tinygrad's `KILN` device: renderer, compiler, allocator and program over kiln.

tinygrad opens a device `X` by importing `tinygrad.runtime.ops_x` and taking its `XDevice`; the
import hook in `kiln.tinygrad` gives it this module's `KilnDevice` as `tinygrad.runtime.ops_kiln`.

- The renderer names the kiln backend: `DEV=KILN` (or `KILN:CPU`) runs on kiln's CPU,
  `DEV=KILN:OPENCL`, `DEV=KILN:CUDA` and the rest on kiln's other backends (tinygrad's own
  `DEVICE:RENDERER` convention, `Target.parse`). A tensor's `KILN:1` is the backend's device 1.
- The renderer converts tinygrad's linearized UOps to kiln text (`kiln.tinygrad.render`); its
  capability flags are those of the backend, so tinygrad emits only what that backend runs.
- The compiler is kiln's `Device.compile` (through kiln's kernel cache); the text is the binary.
- Memory is kiln buffers of bytes, viewed as each kernel parameter's dtype at launch; host
  (CPU) buffers are shared with tinygrad (and so numpy) without a copy. numpy is not needed.
- A program call is one kiln kernel launch, bounds-proven by kiln; a refused launch raises
  kiln's error with the kernel's name, never a silent wrong result.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from typing import Any, Optional, cast

from tinygrad.codegen.opt import tc as tinygrad_tc
from tinygrad.codegen.opt.tc import TensorCore
from tinygrad.device import Allocator, BufferSpec, Compiled, CompileError, Compiler, TinyELF
from tinygrad.device import Device as TinyDevice
from tinygrad.engine.jit import GraphRunner
from tinygrad.dtype import DType, dtypes
from tinygrad.helpers import Target
from tinygrad.renderer import Renderer
from tinygrad.uop.ops import KernelInfo, UOp

import kiln

from .render import ALU, Converter, Unsupported, kiln_scalar, render

# tinygrad's dtypes that kiln has (kiln's names in `kiln.DTYPES`)
KILN_DTYPES = {
    dtypes.bool, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16,
    dtypes.uint32, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64,
}

HEADER = "tinygrad kernel "


def kernel_name(src: str) -> Optional[str]:
    """The kernel name the renderer wrote in the text's header, if any."""
    for line in src.splitlines()[:3]:
        if line.startswith("# " + HEADER):
            return line[len("# " + HEADER) :].strip()
    return None


class KilnCompiler(Compiler):
    """Compiles kiln text with kiln's `Device.compile` (through its kernel cache) and keeps the
    kernel until a program loads it; the text itself is the binary tinygrad stores. While
    `deferred` is a list, compiling only adds the text to it, for `compile_batch`
    (`kiln.tinygrad.beam`)."""

    def __init__(self, device: kiln.Device):
        super().__init__(None)
        self.device = device
        self.compiled: dict[str, kiln.Kernel] = {}
        self.deferred: Optional[list[str]] = None

    def compile(self, src: str) -> bytes:
        if self.deferred is not None:
            self.deferred.append(src)
            return src.encode()
        name = kernel_name(src)
        try:
            self.compiled[src] = self.device.compile(src, name)
        except kiln.Error as e:
            raise CompileError(f"kiln could not compile tinygrad kernel {name}: {e}") from e
        return src.encode()

    def compile_batch(self, sources: list[str]) -> set[str]:
        """Compiles the distinct `sources` at once on all cores (`compile_many`) into kiln's
        kernel cache, where loading them finds them; returns those that do not compile."""
        batch = [(src, kernel_name(src)) for src in dict.fromkeys(sources)]
        try:
            self.device.compile_many(batch)
            return set()
        except kiln.Error:  # some did not compile: compile each (the others from the cache) to know which
            failed = set()
            for src, name in batch:
                try:
                    self.device.compile(src, name)
                except kiln.Error:
                    failed.add(src)
            return failed

    def load(self, src: str) -> kiln.Kernel:
        """The kernel compiled from `src` (compiled again, from kiln's cache, if it was taken)."""
        if src not in self.compiled:
            self.compile(src)
        return self.compiled.pop(src)


class KilnRenderer(Renderer):
    """Renders linear UOps as kiln text for one kiln backend (`backend`: one subclass per backend
    the package registers, `renderers()`), configured from its device's properties. A host device
    (kiln's CPU, whose properties give its `threads`) has no work groups or local memory; it runs
    `core_id` threads, one chunk per core, and contractions get kiln's register tile
    (`kiln.tinygrad.tile`). Another device has work groups and local memory of its own sizes
    (local memory at most what a kiln kernel may declare, `kiln.MAX_LOCAL_BYTES`), no global
    extent past kiln's `i32` launch indices, and tinygrad's tensor cores that it renders as
    `WMMA` (`properties["wmma"]`: CUDA's `mma.sync`)."""

    backend = ""
    # the ALU ops kiln has (tinygrad reads only the keys: it keeps these ops and rewrites the
    # others in terms of them)
    code_for_op = dict(ALU)

    def __init__(self, target: Target):
        super().__init__(target)
        self.device = kiln.Device(self.backend)
        self.compiler = KilnCompiler(self.device)
        props = self.device.properties
        host = props.get("threads") is not None
        self.has_local = self.has_shared = not host
        self.has_threads = self.contraction_tiles = host
        if host:
            self.supports_float4 = True
            self.global_max = (os.cpu_count() or 1, 0, 0)
        else:
            self.global_max = (2**31 - 1,) * 3
            self.local_max = tuple(props["max_work_group_dims"])
            self.shared_max = min(props["local_memory_bytes"], kiln.MAX_LOCAL_BYTES)
            self.tensor_cores = declared_tensor_cores(props.get("wmma") or [])

    def supported_dtypes(self) -> set[DType]:
        return {d for d in super().supported_dtypes() if d in KILN_DTYPES}

    def render(self, uops: list[UOp]) -> str:
        sink = uops[-1].arg
        name = sink.function_name if isinstance(sink, KernelInfo) else "kernel"
        try:
            root = Converter(uops).convert()
        except Unsupported as e:
            raise CompileError(f"tinygrad kernel {name} has what kiln's IR lacks: {e}") from e
        return render(root, [HEADER + name])


def declared_tensor_cores(forms: list[tuple[int, int, int, str, str, int]]) -> list[TensorCore]:
    """tinygrad's CUDA tensor cores (the newest architecture's list) that are among kiln's `WMMA`
    forms `(m, n, k, input, accumulator, threads)`; tinygrad's dims are `(N, M, K)`."""
    have = set(map(tuple, forms))

    def form(tc: TensorCore) -> Optional[tuple[int, int, int, str, str, int]]:
        try:
            return (tc.dims[1], tc.dims[0], tc.dims[2], kiln_scalar(tc.dtype_in), kiln_scalar(tc.dtype_out), tc.threads)
        except Unsupported:  # fp8, which kiln has no dtype for
            return None

    return [tc for tc in tinygrad_tc.get_cuda("sm_89") if form(tc) in have]


@functools.cache
def renderer_for(backend: str) -> type[KilnRenderer]:
    """The renderer class of kiln backend `backend`; tinygrad picks it by its name
    (`DEV=KILN:OPENCL` → `KilnOPENCLRenderer`)."""
    return type(f"Kiln{backend}Renderer", (KilnRenderer,), {"backend": backend})


def __getattr__(name: str) -> type[KilnRenderer]:
    """The classes `renderer_for` makes, by name (`KilnOPENCLRenderer`): pickle finds a class
    by its module and name, and tinygrad pickles renderers for its compile workers."""
    if name.startswith("Kiln") and name.endswith("Renderer") and len(name) > len("KilnRenderer"):
        return renderer_for(name[len("Kiln") : -len("Renderer")])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def renderers() -> list[type[KilnRenderer]]:
    """A renderer for every backend the package registers, in registration order (kiln's CPU
    first: `DEV=KILN` runs there)."""
    return [renderer_for(b) for b in kiln.backends()]


def host_memory(buf: kiln.Buffer) -> memoryview:
    """The bytes of a host buffer, shared (no numpy needed: kiln's array interface gives the
    address); the view keeps the buffer alive."""
    window = (ctypes.c_uint8 * buf.nbytes).from_address(buf.__array_interface__["data"][0])
    window.owner = buf  # type: ignore[attr-defined]
    return memoryview(window).cast("B")


class KilnAllocator(Allocator["KilnDevice"]):
    """Buffers are kiln `u8` buffers of the requested bytes, viewed as each kernel parameter's
    dtype at launch. Host buffers (kiln's CPU) are read and written in place, and tinygrad reads
    them without a copy; other devices' buffers go through a host buffer of kiln's CPU."""

    def __init__(self, dev: KilnDevice):
        super().__init__(dev, supports_copy_from_disk=False, supports_transfer=True)

    def _alloc(self, size: int, options: BufferSpec) -> kiln.Buffer:
        if options.external_ptr is not None:
            raise RuntimeError("the KILN device does not adopt external pointers")
        try:
            return self.dev.kiln.empty("u8", size)
        except kiln.OutOfMemoryError as e:
            raise MemoryError(str(e)) from e

    def _offset(self, buf: kiln.Buffer, size: int, offset: int) -> kiln.Buffer:
        return buf.view(offset, size)

    def _copyin(self, dest: kiln.Buffer, src: memoryview) -> None:
        host = dest if dest.is_host else kiln.Device("CPU").empty("u8", dest.nbytes)
        host_memory(host)[:] = src.cast("B")
        if host is not dest:
            dest.copy_from(host)

    def _copyout(self, dest: memoryview, src: kiln.Buffer) -> None:
        host = src if src.is_host else kiln.Device("CPU").empty("u8", src.nbytes)
        if host is not src:
            host.copy_from(src)
        dest.cast("B")[:] = host_memory(host)

    def _transfer(self, dest: kiln.Buffer, src: kiln.Buffer, sz: int, src_dev: KilnDevice, dest_dev: KilnDevice) -> None:
        dest.copy_from(src)


class KilnHostAllocator(KilnAllocator):
    """Host memory (kiln's CPU): tinygrad reads it without a copy."""

    def _as_buffer(self, src: kiln.Buffer) -> memoryview:
        return host_memory(src)


class KilnProgram:
    """One compiled kernel; a call is one kiln launch (tinygrad's launch sizes are the kernel's
    own SPECIAL extents in kiln, so they are not passed again)."""

    def __init__(self, dev: KilnDevice, obj: TinyELF):
        self.dev, self.name, self.source = dev, obj.name, obj.lib.decode()
        self.kernel = dev.renderer.compiler.load(self.source)
        self.generation = dev.kiln.generation
        # the signature lists the buffers (in the order tinygrad passes them) and then the variables
        self.dtypes = [dt for _, dt in sorted(self.kernel.params)]
        nbufs = len(self.dtypes)
        # kiln numbers the buffers in the order of tinygrad's slots
        self.order = sorted(range(nbufs), key=lambda i: obj.signature[i][1])
        self.var_names = [entry[0] for entry in obj.signature[nbufs:]]
        # the call's argument positions of the buffers tinygrad passes, in the order it passes them
        self.globals = sorted(entry[1] for entry in obj.signature[:nbufs])
        self.wanted = set(self.kernel.var_names)

    def __call__(self, *bufs: kiln.Buffer, global_size: Any = None, local_size: Any = None, vals: tuple[Optional[int], ...] = (),
                 wait: bool = False, **kw: Any) -> Optional[float]:
        args = [bufs[i] for i in self.order]
        named = {n: v for n, v in zip(self.var_names, vals) if v is not None and n in self.wanted}
        if self.generation != self.dev.kiln.generation:
            # the device was reset since this kernel was loaded (tinygrad keeps programs in its
            # caches across that): load it again, into the device's generation
            self.kernel = self.dev.renderer.compiler.load(self.source)
            self.generation = self.dev.kiln.generation
        try:
            if wait:
                st = time.perf_counter()
                self.kernel.launch(args, named, reinterpret=True)
                self.dev.kiln.synchronize()
                return time.perf_counter() - st
            self.kernel.launch(args, named, reinterpret=True)
        except kiln.Error as e:
            raise type(e)(f"tinygrad kernel {self.name}: {e}") from e
        return None


class KilnGraph(GraphRunner):
    """TinyJit's graph on kiln: a captured batch of kernel calls is one `kiln.Plan`, recorded
    once and replayed with each call's variable values and input buffers (`Plan.rebind`).
    The plan orders the kernels by the bytes they share and runs independent ones at once.
    A rebinding the plan refuses (the new inputs share memory the recorded ones did not)
    records the plan again over the new buffers."""

    def __init__(self, linear: UOp, input_uops: tuple[UOp, ...] = ()):
        super().__init__(linear, input_uops)
        self.kdev: KilnDevice = TinyDevice[self.calls[0][2][0].device]  # type: ignore[assignment]
        # per call: (kernel slot, call argument position) of every buffer the kernel takes
        self.slots = [[(k, prg.globals[prg.order[k]]) for k in range(len(prg.dtypes))] for prg in self._programs()]
        self.plan = self._record(input_uops)

    def _programs(self) -> list[KilnProgram]:
        return [cast(KilnProgram, rt) for rt in self.runtimes]

    def _buffer(self, j: int, k: int, buf: Any) -> kiln.Buffer:
        return cast(kiln.Buffer, buf.ensure_allocated()._buf).reinterpret(self._programs()[j].dtypes[k])

    def _record(self, input_uops: tuple[UOp, ...]) -> kiln.Plan:
        plan = kiln.Plan(self.kdev.kiln)
        for j, prg in enumerate(self._programs()):
            bufs = self.calls[j][2]
            inputs = dict(self.uop_replace[j])
            args = [
                self._buffer(j, k, input_uops[inputs[pos]].buffer if pos in inputs and input_uops else bufs[pos])
                for k, pos in self.slots[j]
            ]
            # recorded at each variable's lower bound; every run binds the values it is given
            lows = {name: lo for name, lo, _ in prg.kernel.vars}
            plan.launch(prg.kernel, args, lows)
        return plan

    def __call__(self, input_uops: tuple[UOp, ...], var_vals: dict[str, int], wait: bool = False) -> Optional[float]:
        bindings = []
        for j, replace in enumerate(self.uop_replace):
            inputs = dict(replace)
            bindings += [(j, k, self._buffer(j, k, input_uops[inputs[pos]].buffer)) for k, pos in self.slots[j] if pos in inputs]
        try:
            self.plan.rebind(bindings)
        except kiln.LaunchError:
            self.plan = self._record(input_uops)
        st = time.perf_counter()
        try:
            self.plan.run(**{n: var_vals[n] for n in self.plan.var_names if n in var_vals})
        except kiln.Error as e:
            raise type(e)(f"tinygrad graph of {len(self.calls)} kernels: {e}") from e
        return time.perf_counter() - st if wait else None


class KilnDevice(Compiled):
    """A tinygrad device backed by one kiln device (the renderer's backend, this ordinal)."""

    def __init__(self, device: str = ""):
        super().__init__(device, KilnAllocator(self), renderers(), KilnProgram, graph=KilnGraph)  # type: ignore[arg-type]
        backend = type(self.renderer).backend  # type: ignore[attr-defined]
        self.kiln = kiln.Device(backend if backend == "CPU" or self.device_id == 0 else f"{backend}:{self.device_id}")
        if self.kiln.empty("u8", 1).is_host:
            self.allocator = KilnHostAllocator(self)

    def synchronize(self) -> None:
        self.kiln.synchronize()


from . import compat  # noqa: E402  (its BEAM pool needs this module's classes: imported last)

compat.install()
