"""A captured TinyJit on a KILN device as a saved kiln plan (`kiln.tinygrad.save_jit`).

    jit = TinyJit(f)
    jit(x); jit(x)                          # the second call captures
    kiln.tinygrad.save_jit(jit, "f.kplan")  # inputs named after f's parameters
    kiln.load_plan("f.kplan")(x=x_array)    # in any process, without tinygrad: jit(x)'s bits

The captured JIT's calls (inside its graph batches, `KilnGraph`, and outside them) are recorded
again, in order, into one `kiln.Plan` (a `KilnGraph` over all of them) over the buffers the JIT
uses, with fresh buffers for its inputs, and that plan is saved (`kiln.Plan.save`) with the
JIT's inputs (each the tensor the JIT was called with, at its shape) and its returned tensors
as outputs. Which buffers are weights is the saver's to infer: a buffer the plan reads before
anything writes it is saved with its bytes as they are (weights, and state such as running
statistics); every other buffer starts empty.

What cannot be saved is refused with `kiln.PlanSaveError` rather than saved wrong: a JIT that has
not captured yet; work on more than one device or outside kiln (a copy from tinygrad's CPU
device, two KILN devices: a saved plan runs on one device); calls other than kernels and copies;
an input or output that is not a whole contiguous tensor (a view into a larger buffer); an
output that no call computes; inputs or outputs of several devices (`Tensor.shard`).
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union, cast

from tinygrad import Tensor
from tinygrad.device import Buffer, MultiBuffer
from tinygrad.device import Device as TinyDevice
from tinygrad.engine.realize import get_call_arg_uops, get_call_outs_ins
from tinygrad.uop.ops import Ops, UOp

import kiln

from .device import KilnDevice, KilnGraph
from .render import Unsupported, kiln_scalar

Names = Union[Sequence[str], Mapping[Union[int, str], str], None]
PlanTensor = tuple[kiln.Buffer, list[Union[int, str]]]


def refuse(message: str) -> kiln.PlanSaveError:
    return kiln.PlanSaveError(f"cannot save this TinyJit: {message}")


def flat_calls(linear: UOp) -> list[UOp]:
    """The captured JIT's calls in order, those of its graph batches inlined."""
    calls: list[UOp] = []
    for call in linear.src:
        ast = call.src[0]
        if ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph":
            calls.extend(ast.src[0].src)
        else:
            calls.append(call)
    return calls


def call_name(call: UOp) -> str:
    ast = call.src[0]
    if ast.op is Ops.PROGRAM:
        return f"kernel {ast.arg.name}"
    return f"{ast.op.name.lower()} {ast.arg!r}" if ast.arg is not None else ast.op.name.lower()


def the_device(calls: list[UOp]) -> str:
    """The one KILN device every call runs on, or a refusal naming what is not."""
    devices: set[str] = set()
    for call in calls:
        ast = call.src[0]
        if ast.op not in (Ops.PROGRAM, Ops.COPY):
            raise refuse(f"its {call_name(call)} is neither a kernel nor a copy; a saved plan holds only those")
        for arg in get_call_arg_uops(call):
            device = arg.device
            if isinstance(device, tuple):
                raise refuse(f"its {call_name(call)} runs on several devices {device}; a saved plan runs on one device")
            devices.add(cast(str, device))
    if not devices:
        raise refuse("it has no calls: nothing it computes depends on its inputs (with prune=True, tinygrad runs such "
                     "work once, at capture)")
    if len(devices) > 1:
        raise refuse(f"its calls run on {', '.join(sorted(devices))}; a saved plan runs on one KILN device (a copy from "
                     "another device inside the JIT counts: pass inputs already on the KILN device)")
    device = devices.pop()
    if not isinstance(TinyDevice[device], KilnDevice):
        raise refuse(f"it runs on {device}, not on a KILN device")
    return device


def dims(shape: tuple[Any, ...], what: str) -> list[Union[int, str]]:
    """A tinygrad shape as a saved plan's: ints, and a variable's name where a dimension is one."""
    out: list[Union[int, str]] = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, UOp) and (d.is_variable or (d.op is Ops.PARAM and d.arg.name is not None)):
            out.append(d.expr)
        else:
            raise refuse(f"{what} has a dimension {d} that is neither a number nor a variable")
    return out


def whole(view: UOp) -> bool:
    """Whether `view` (a tensor's UOp over its buffer) is the buffer itself, reshaped at most."""
    while view.op is Ops.RESHAPE:
        view = view.src[0]
    return view.op in (Ops.NOOP, Ops.BUFFER)


def param_names(jit: Any) -> list[Optional[str]]:
    """The names of the JIT function's positional parameters, `None` past them (`*args`)."""
    try:
        params = list(inspect.signature(jit.fxn).parameters.values())
    except (TypeError, ValueError):  # no function (a JIT made from a CapturedJit), or a builtin
        return []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in positional]


def input_names(jit: Any, count: int, names: Names) -> list[str]:
    """A name per input slot: `names` (a list for every slot, or a mapping from the JIT's own
    names, argument positions or keywords, to new ones), else the keyword's name, the positional
    parameter's name, or `input{slot}`."""
    captured = jit.captured
    given: list[Union[int, str]] = list(captured.expected_names)
    if isinstance(names, Sequence) and not isinstance(names, str):
        if len(names) != count:
            raise refuse(f"names has {len(names)} entries for {count} inputs")
        chosen = [str(n) for n in names]
    else:
        positional = param_names(jit)
        chosen = []
        for slot in range(count):
            key = given[slot] if slot < len(given) else None
            if isinstance(key, str):
                name = key
            elif isinstance(key, int) and key < len(positional) and positional[key] is not None:
                name = cast(str, positional[key])
            else:
                name = f"input{slot}"
            if isinstance(names, Mapping):
                name = names.get(key, names.get(name, name)) if key is not None else names.get(name, name)
            chosen.append(name)
    if len(set(chosen)) != len(chosen) or not all(chosen):
        raise refuse(f"input names {chosen} are not unique and non-empty; pass names=[...]")
    return chosen


def output_tensors(ret: Any, outputs: Names) -> list[tuple[str, Tensor]]:
    """The JIT's returned tensors, named: a dict's keys, `output` for one tensor, `output{i}` for
    a tuple or list; `outputs` renames them (a list, or a mapping from those names)."""
    if isinstance(ret, Tensor):
        found = [("output", ret)]
    elif isinstance(ret, (tuple, list)):
        found = [(f"output{i}", t) for i, t in enumerate(ret)]
    elif isinstance(ret, dict):
        found = [(str(k), t) for k, t in ret.items()]
    elif ret is None:
        found = []
    else:
        raise refuse(f"it returns a {type(ret).__name__}; a saved plan's outputs are the tensors of a Tensor, tuple, list or dict")
    for name, t in found:
        if not isinstance(t, Tensor):
            raise refuse(f"its output {name} is a {type(t).__name__}, not a Tensor")
    if isinstance(outputs, Sequence) and not isinstance(outputs, str):
        if len(outputs) != len(found):
            raise refuse(f"outputs has {len(outputs)} names for {len(found)} outputs")
        found = [(str(n), t) for n, (_, t) in zip(outputs, found)]
    elif isinstance(outputs, Mapping):
        found = [(outputs.get(n, n), t) for n, t in found]
    names = [n for n, _ in found]
    if len(set(names)) != len(names) or not all(names):
        raise refuse(f"output names {names} are not unique and non-empty; pass outputs=[...]")
    return found


def kiln_window(buf: Buffer, dtype: Any, what: str) -> kiln.Buffer:
    """The kiln buffer behind tinygrad buffer `buf`, as `dtype`."""
    try:
        scalar = kiln_scalar(dtype)
    except Unsupported as e:
        raise refuse(f"{what} has dtype {dtype}, which kiln lacks") from e
    return cast(kiln.Buffer, buf.ensure_allocated()._buf).reinterpret(scalar)


def record(jit: Any, names: Names = None, outputs: Names = None) -> tuple[kiln.Plan, dict[str, PlanTensor], dict[str, PlanTensor]]:
    """The captured `jit` as one plan, with its inputs and outputs by name (see `save_jit`)."""
    captured = getattr(jit, "captured", None)
    if captured is None:
        raise refuse("it has not captured yet: call it twice (the second call captures) before saving")
    calls = flat_calls(captured.linear)
    device = the_device(calls)
    info = captured.expected_input_info  # per input slot: (view over its buffer, variables, dtype, device)

    # a fresh buffer per input slot, of the size the captured calls see it with
    sizes: dict[int, int] = {}
    for call in calls:
        for arg in get_call_arg_uops(call):
            if arg.op is Ops.PARAM:
                sizes[arg.arg.slot] = max(sizes.get(arg.arg.slot, 0), math.prod(arg.max_shape))
            elif any(u.op is Ops.PARAM for u in arg.toposort()):
                raise refuse(f"its {call_name(call)} takes a part of an input ({arg.op.name}); save a single-device JIT")
    input_uops: list[UOp] = []
    for slot, (view, _, dtype, dev) in enumerate(info):
        if dev != device:
            raise refuse(f"input {slot} is on {dev}, the JIT runs on {device}")
        if not whole(view):
            raise refuse(f"input {slot} is a view into a larger buffer ({view.op.name}); pass x.contiguous().realize()")
        if slot in sizes:
            numel = sizes[slot]
        elif view.op is not Ops.NOOP:  # an input no call reads: as large as its shape can be
            numel = math.prod(d if isinstance(d, int) else int(d.vmax) for d in view.shape)
        else:
            raise refuse(f"input {slot} is one-dimensional and no call reads it, so its size is unknown; leave it out")
        input_uops.append(UOp.new_buffer(device, max(numel, 1), dtype))

    # every call, in order, over the JIT's buffers and the fresh inputs
    graph = KilnGraph(UOp(Ops.CUSTOM_FUNCTION, src=(UOp(Ops.LINEAR, src=tuple(calls)),), arg="graph"), tuple(input_uops))
    written = [bufs[k] for call, (_, _, bufs, _) in zip(calls, graph.calls) for k in get_call_outs_ins(call)[0]]

    plan_inputs: dict[str, PlanTensor] = {}
    for slot, name in enumerate(input_names(jit, len(info), names)):
        view, _, dtype, _ = info[slot]
        buf = cast(Buffer, input_uops[slot].buffer)
        shape: list[Union[int, str]] = [buf.size] if view.op is Ops.NOOP else dims(view.shape, f"input {name}")  # NOOP: the buffer
        plan_inputs[name] = (kiln_window(buf, dtype, f"input {name}"), shape)
    plan_outputs: dict[str, PlanTensor] = {}
    for name, t in output_tensors(captured.ret, outputs):
        u = t.uop
        if not t.uop.is_realized or not whole(u) or u.device != device:
            raise refuse(f"output {name} is not a whole tensor the JIT computes on {device} (a view, or another "
                         "device's); return x.contiguous()")
        out = u.base.buffer
        if isinstance(out, MultiBuffer):
            raise refuse(f"output {name} is on several devices")
        if not any(overlaps(out, w) for w in written):
            raise refuse(f"output {name} is not written by any of the JIT's calls (an input or a constant returned as is)")
        plan_outputs[name] = (kiln_window(out, t.dtype, f"output {name}"), dims(t.shape, f"output {name}"))
    return graph.plan, plan_inputs, plan_outputs


def overlaps(a: Buffer, b: Buffer) -> bool:
    """Whether tinygrad buffers `a` and `b` share bytes (views of one base buffer)."""
    base_a, base_b = a._base if a._base is not None else a, b._base if b._base is not None else b
    return base_a is base_b and a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes


def save_jit(jit: Any, path: Union[str, Path], *, names: Names = None, outputs: Names = None) -> int:
    """Saves captured TinyJit `jit` (on one KILN device) to the plan file `path`; returns its
    size in bytes. Inputs are named after the JIT's arguments: a keyword's name, a positional
    parameter's name, else `input{slot}`; `names` renames them (a list, one per input in the
    JIT's order: positional arguments, then keywords sorted, then tensors inside lists and dicts;
    or a mapping from those names or argument positions). Outputs are named after the returned
    dict's keys, `output` for one tensor, `output{i}` for a tuple or list; `outputs` renames
    them likewise. `kiln.load_plan(path)` then runs it with arrays by those names, giving what
    `jit` gives on the same device, bit for bit. Raises `kiln.PlanSaveError` for a JIT it cannot
    save (see the module docs) and `kiln.IoError` when the file cannot be written."""
    plan, inputs, outs = record(jit, names, outputs)
    return plan.save(path, inputs=inputs, outputs=outs)
