"""tinygrad's `KILN` device: renderer, compiler, allocator and program over kiln.

tinygrad opens a device `X` by importing `tinygrad.runtime.ops_x` and taking its `XDevice`; the
import hook in `kiln.tinygrad` gives it this module's `KilnDevice` as `tinygrad.runtime.ops_kiln`.

- The renderer names the kiln backend: `DEV=KILN` (or `KILN:CPU`) runs on kiln's CPU,
  `DEV=KILN:OPENCL`, `DEV=KILN:CUDA` and the rest on kiln's other backends (tinygrad's own
  `DEVICE:RENDERER` convention, `Target.parse`). A tensor's `KILN:n` is the backend's device n
  (`kiln_device`): on the CPU, the virtual device `CPU:n` with its own queues and thread pool
  (`KILN_CPU_DEVICES=k` splits the cores between `CPU:0` .. `CPU:k-1`); where the backend has
  fewer devices, the ordinals share them in turn (one PoCL device serves `KILN:0` and `KILN:1`).
  So `Tensor.shard(("KILN:0", "KILN:1"))` runs on two kiln devices, and tinygrad's all-reduce
  (copies between them and kernels) runs on kiln.
- The renderer converts tinygrad's linearized UOps to kiln text (`kiln.tinygrad.render`); its
  capability flags are those of the backend, so tinygrad emits only what that backend runs.
- The compiler is kiln's `Device.compile` (through kiln's kernel cache); the text is the binary.
- Memory is kiln buffers of bytes, viewed as each kernel parameter's dtype at launch; host
  (CPU) buffers are shared with tinygrad (and so numpy) without a copy. numpy is not needed.
- A program call is one kiln kernel launch, bounds-proven by kiln; a refused launch raises
  kiln's error with the kernel's name, never a silent wrong result.
- TinyJit's graph (`KilnGraph`) is one `kiln.Plan` per captured batch, and a batch may span
  several KILN devices with the copies between them (all-reduces included) where one plan can
  run them all: kiln's CPU devices (host memory; each kernel runs on its own device's threads),
  or ordinals that share one kiln device. Other multi-device work (two GPUs) is left to
  tinygrad's per-call path, single-device batches still becoming plans.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import time
from typing import Any, Optional, cast

from tinygrad.codegen.opt import tc as tinygrad_tc
from tinygrad.codegen.opt.tc import TensorCore
from tinygrad.device import Allocator, BufferSpec, Compiled, CompileError, Compiler, MultiBuffer, TinyELF
from tinygrad.device import Device as TinyDevice
from tinygrad.engine.jit import GraphRunner, MultiGraphRunner
from tinygrad.engine.realize import get_call_arg_uops, resolve_params
from tinygrad.dtype import DType, dtypes
from tinygrad.helpers import Target
from tinygrad.renderer import Renderer
from tinygrad.uop.ops import KernelInfo, Ops, UOp

import kiln

from . import compat
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

    def load(self, src: str, device: Optional[kiln.Device] = None) -> kiln.Kernel:
        """The kernel compiled from `src`, loaded on `device` (the compiler's own by default): the
        one `compile` kept, or compiled again from kiln's cache (another device of the backend,
        such as `CPU:1`, loads the same binary to run on its own threads)."""
        kernel = self.compiled.pop(src, None)
        target = self.device if device is None else device
        if kernel is not None and target.name == self.device.name:
            return kernel
        name = kernel_name(src)
        try:
            return target.compile(src, name)
        except kiln.Error as e:
            raise CompileError(f"kiln could not compile tinygrad kernel {name}: {e}") from e


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


# the variable tinygrad binds to each device's index in a multi-device kernel (`unwrap_multi`)
DEVICE_NUM = "_device_num"
DEVICE_NUM_VAR = re.compile(r'^(%\S+) = DEFINE_VAR (\S+) "' + DEVICE_NUM + r'" -?\d+ -?\d+$', re.MULTILINE)


def with_device_num(src: str, n: int) -> str:
    """Kernel text `src` with tinygrad's device index a constant `n` instead of a variable: one
    plan records the kernel for several devices, each with its own index, and a plan variable
    has one value per run."""
    return DEVICE_NUM_VAR.sub(lambda m: f"{m.group(1)} = CONST {m.group(2)} {n}", src)


class KilnProgram:
    """One compiled kernel on one KILN device; a call is one kiln launch (tinygrad's launch sizes
    are the kernel's own SPECIAL extents in kiln, so they are not passed again)."""

    def __init__(self, dev: KilnDevice, obj: TinyELF):
        self.dev, self.name, self.source = dev, obj.name, obj.lib.decode()
        self.kernel = dev.renderer.compiler.load(self.source, dev.kiln)
        self.generation = dev.kiln.generation
        # the kernel with tinygrad's device index fixed, per index (`for_device`)
        self.per_device: dict[int, kiln.Kernel] = {}
        # the signature lists the buffers (in the order tinygrad passes them) and then the variables
        self.dtypes = [dt for _, dt in sorted(self.kernel.params)]
        nbufs = len(self.dtypes)
        # kiln numbers the buffers in the order of tinygrad's slots
        self.order = sorted(range(nbufs), key=lambda i: obj.signature[i][1])
        self.var_names = [entry[0] for entry in obj.signature[nbufs:]]
        # the call's argument positions of the buffers tinygrad passes, in the order it passes them
        self.globals = sorted(entry[1] for entry in obj.signature[:nbufs])
        self.wanted = set(self.kernel.var_names)

    def current(self) -> kiln.Kernel:
        """The kernel, loaded again if the device was reset since it was loaded (tinygrad keeps
        programs in its caches across that): into the device's generation."""
        if self.generation != self.dev.kiln.generation:
            self.kernel = self.dev.renderer.compiler.load(self.source, self.dev.kiln)
            self.per_device.clear()
            self.generation = self.dev.kiln.generation
        return self.kernel

    def for_device(self, device_vars: dict[str, int]) -> kiln.Kernel:
        """The kernel as one device of a multi-device call runs it: with tinygrad's device index
        (`device_vars`, from `unwrap_multi`) a constant where the kernel reads it."""
        kernel = self.current()
        if DEVICE_NUM not in device_vars or DEVICE_NUM not in self.wanted:
            return kernel
        n = device_vars[DEVICE_NUM]
        if n not in self.per_device:
            try:
                self.per_device[n] = self.dev.kiln.compile(with_device_num(self.source, n), self.name)
            except kiln.Error as e:
                raise CompileError(f"kiln could not compile tinygrad kernel {self.name} for device {n}: {e}") from e
        return self.per_device[n]

    def __call__(self, *bufs: kiln.Buffer, global_size: Any = None, local_size: Any = None, vals: tuple[Optional[int], ...] = (),
                 wait: bool = False, **kw: Any) -> Optional[float]:
        args = [bufs[i] for i in self.order]
        named = {n: v for n, v in zip(self.var_names, vals) if v is not None and n in self.wanted}
        kernel = self.current()
        try:
            if wait:
                st = time.perf_counter()
                kernel.launch(args, named, reinterpret=True)
                self.dev.kiln.synchronize()
                return time.perf_counter() - st
            kernel.launch(args, named, reinterpret=True)
        except kiln.Error as e:
            raise type(e)(f"tinygrad kernel {self.name}: {e}") from e
        return None


def shares_plan(devs: list[Compiled]) -> bool:
    """Whether one `kiln.Plan` can run the work of KILN devices `devs`: every one is a host
    device (kiln's CPU devices: a plan's queues run any of their kernels, each on its own
    device's threads, over host memory), or all are one kiln device (ordinals that share it)."""
    if not all(isinstance(d, KilnDevice) for d in devs):
        return False
    kdevs = cast(list[KilnDevice], devs)
    return all(isinstance(d.allocator, KilnHostAllocator) for d in kdevs) or len({d.kiln.name for d in kdevs}) == 1


def from_inputs(arg: UOp) -> bool:
    """Whether call argument `arg` is (a device's part or window of) a JIT input, which each
    call of the graph may bind to other buffers (the forms `resolve_params` resolves)."""
    if arg.op in (Ops.MSELECT, Ops.SHRINK):
        return arg.src[0].op is Ops.PARAM
    if arg.op is Ops.MSTACK:
        return any(from_inputs(x) for x in arg.src)
    return arg.op is Ops.PARAM


def buffer_key(buf: Any) -> tuple[Any, int, int]:
    """What a tinygrad buffer is in memory: its base buffer (by identity), offset and size."""
    return (buf._base if buf._base is not None else buf, buf.offset, buf.nbytes)


class KilnGraph(MultiGraphRunner):
    """TinyJit's graph on kiln: a captured batch of kernel calls and copies is one `kiln.Plan`,
    recorded once and replayed with each call's variable values and input buffers
    (`Plan.rebind`). The plan orders the nodes by the bytes they share and runs independent ones
    at once. A batch may span several KILN devices (`shares_plan`): a sharded step with
    tinygrad's all-reduce (its copies between the devices and the kernels that add the parts)
    is then one plan on the first device, each kernel recorded for its own device (with
    tinygrad's device index fixed, `KilnProgram.for_device`). A rebinding the plan refuses (new
    inputs that share memory the recorded ones did not), or new inputs of a copy (a plan copy
    cannot be rebound), records the plan again over the new buffers."""

    @staticmethod
    def supports_uop(batch_devs: list[Compiled], new_call: UOp) -> bool:
        if new_call.src[0].op not in (Ops.PROGRAM, Ops.COPY):
            return False
        return shares_plan(GraphRunner._all_devs(batch_devs, new_call))

    def __init__(self, linear: UOp, input_uops: tuple[UOp, ...] = ()):
        super().__init__(linear, input_uops)
        self.kdev: KilnDevice = TinyDevice[self.calls[0][2][0].device]  # type: ignore[assignment]
        # per call (one per device of a multi-device call, device index 0 first): the captured call
        calls = iter(self.linear.src)
        self.call_of: list[UOp] = []
        for dev_idx, *_ in self.calls:
            self.call_of.append(next(calls) if dev_idx == 0 else self.call_of[-1])
        # per call: (kernel slot, call argument position) of every buffer the kernel takes
        self.slots = [
            [(k, prg.globals[prg.order[k]]) for k in range(len(prg.dtypes))] if isinstance(prg, KilnProgram) else []
            for prg in self.runtimes
        ]
        # per call: the argument positions a JIT input binds, for the calls that have them
        dynamic = [{p for p, arg in enumerate(get_call_arg_uops(call)) if from_inputs(arg)} for call in self.call_of]
        self.dynamic = {j: positions for j, positions in enumerate(dynamic) if positions}
        self.bufs: list[list[Any]] = [list(bufs) for _, _, bufs, _ in self.calls]
        self.nodes: list[int] = []
        self.copied: dict[int, tuple[tuple[Any, int, int], ...]] = {}
        self.plan = self._record()

    def _record(self) -> kiln.Plan:
        """A plan of every call over the buffers now bound (`self.bufs`)."""
        plan = kiln.Plan(self.kdev.kiln)
        self.nodes, self.copied = [], {}
        for j, (_, ast, _, device_vars) in enumerate(self.calls):
            bufs = self.bufs[j]
            if ast.op is Ops.COPY:
                dst, src = bufs[0].ensure_allocated(), bufs[1].ensure_allocated()
                self.copied[j] = (buffer_key(dst), buffer_key(src))
                self.nodes.append(plan.copy(dst._buf, src._buf))
                continue
            prg = cast(KilnProgram, self.runtimes[j])
            kernel = prg.for_device(device_vars)
            args = [self._arg(j, k, bufs[pos]) for k, pos in self.slots[j]]
            # recorded at each variable's lower bound; every run binds the values it is given
            lows = {name: lo for name, lo, _ in kernel.vars}
            self.nodes.append(plan.launch(kernel, args, lows))
        return plan

    def _arg(self, j: int, k: int, buf: Any) -> kiln.Buffer:
        """Tinygrad buffer `buf` as kernel slot `k` of call `j` takes it (its dtype)."""
        return cast(kiln.Buffer, buf.ensure_allocated()._buf).reinterpret(cast(KilnProgram, self.runtimes[j]).dtypes[k])

    def _bind(self, input_uops: tuple[UOp, ...]) -> tuple[list[tuple[int, int, kiln.Buffer]], bool]:
        """Binds this call's inputs (`self.bufs`). Returns the rebindings of the plan's launches,
        and whether a copy's buffers changed (the plan must be recorded again)."""
        resolved: dict[UOp, list[UOp]] = {}
        bindings: list[tuple[int, int, kiln.Buffer]] = []
        copies_changed = False
        for j, positions in self.dynamic.items():
            call, dev_idx, bufs = self.call_of[j], self.calls[j][0], self.bufs[j]
            if call not in resolved:
                resolved[call] = resolve_params(call, input_uops)
            for pos in positions:  # this device's buffer, as `unwrap_multi` picks it
                buf = resolved[call][pos].buffer
                bufs[pos] = buf.bufs[dev_idx] if isinstance(buf, MultiBuffer) else buf
            if self.calls[j][1].op is Ops.COPY:
                copies_changed |= self.copied[j] != (buffer_key(bufs[0]), buffer_key(bufs[1]))
                continue
            bindings += [(self.nodes[j], k, self._arg(j, k, bufs[pos])) for k, pos in self.slots[j] if pos in positions]
        return bindings, copies_changed

    def __call__(self, input_uops: tuple[UOp, ...], var_vals: dict[str, int], wait: bool = False) -> Optional[float]:
        bindings, copies_changed = self._bind(input_uops)
        if copies_changed:
            self.plan = self._record()
        else:
            try:
                self.plan.rebind(bindings)
            except kiln.LaunchError:
                self.plan = self._record()
        st = time.perf_counter()
        try:
            self.plan.run(**{n: var_vals[n] for n in self.plan.var_names if n in var_vals})
        except kiln.Error as e:
            raise type(e)(f"tinygrad graph of {len(self.calls)} calls: {e}") from e
        return time.perf_counter() - st if wait else None


def kiln_device(backend: str, ordinal: int) -> kiln.Device:
    """The kiln device behind `KILN:ordinal` on `backend`: the backend's device `ordinal` (on
    the CPU, virtual device `CPU:ordinal`, up to `CPU:63`); where the backend has no such device
    (one PoCL device), the ordinals share its devices in turn."""
    if ordinal == 0:
        return kiln.Device(backend)
    try:
        return kiln.Device(f"{backend}:{ordinal}")
    except kiln.UnavailableError:
        count = sum(1 for d in kiln.devices() if d.available and d.name.split(":")[0] == backend)
        shared = ordinal % max(count, 1)
        return kiln.Device(backend if shared == 0 else f"{backend}:{shared}")


class KilnDevice(Compiled):
    """A tinygrad device backed by one kiln device (the renderer's backend, this ordinal:
    `kiln_device`)."""

    def __init__(self, device: str = ""):
        super().__init__(device, KilnAllocator(self), renderers(), KilnProgram, graph=KilnGraph)  # type: ignore[arg-type]
        backend = type(self.renderer).backend  # type: ignore[attr-defined]
        self.kiln = kiln_device(backend, self.device_id)
        if self.kiln.empty("u8", 1).is_host:
            self.allocator = KilnHostAllocator(self)
        compat.opened(self.device, self.renderer)

    def synchronize(self) -> None:
        self.kiln.synchronize()

