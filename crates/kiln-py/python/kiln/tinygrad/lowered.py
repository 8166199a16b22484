"""tinygrad's lowered kernels for kiln's CPU devices, kept between processes (tinygrad 0.14.0).

tinygrad lowers every kernel of a schedule (its AST) to a program in Python, in every process:
optimizing, expanding, devectorizing, linearizing and rendering it. Its disk cache keeps only
the compiled binaries, keyed by the rendered source, so a model's first call in a new process
lowers every kernel again, and on kiln's CPU the register tiles (`kiln.tinygrad.tile`) make that
lowering the larger part of the first call.

This module keeps the programs tinygrad lowers for kiln's CPU devices in tinygrad's own disk
cache (`CACHEDB`, table `kiln_program`; `CACHELEVEL=0` turns it off with tinygrad's), keyed by
what decides them: the AST, the renderer (its class, target and the device properties it was
built from), the settings that tinygrad keys its in-memory programs by, tinygrad's version and
the source of kiln's tinygrad layer. `kiln.tinygrad.compat` puts `to_program` in place of the
name tinygrad's `lower_and_compile` lowers each kernel with (in its compile workers too): a
program found on disk is not lowered again. Kernels that BEAM searches, and those of KILN
devices with work groups (tinygrad tunes a GPU kernel's work-group size from its lowered graph,
which a kept program does not hold), are lowered as before.

A kept program holds what running, timing and saving a program reads: its `ProgramInfo`, its
kernel's `KernelInfo` (name, applied opts, estimates), its buffer parameters in order, its kiln
source and binary; not the lowered graph. It is stored as tinygrad stores every entry of that
cache (pickled): the cache is trusted as tinygrad's own compile cache is.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from pathlib import Path
from typing import Any

from tinygrad import codegen
from tinygrad.helpers import diskcache_get, diskcache_put
from tinygrad.uop.ops import Ops, UOp

from . import originals

TABLE = "kiln_program"


@functools.cache
def layer_id() -> str:
    """kiln's and tinygrad's versions and the source of kiln's tinygrad layer (this package),
    which renders the programs: a changed layer never reads programs of an older one."""
    h = hashlib.sha256()
    for dist in ("kiln", "tinygrad"):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:  # run from a source tree: its source decides
            version = "not installed"
        h.update(f"{dist} {version}\0".encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def renderer_id(renderer: Any) -> str:
    """What the renderer renders by besides the AST: its class and target, the limits and
    features tinygrad's optimizer reads, and the properties of the kiln device it renders for."""
    props = sorted((k, repr(v)) for k, v in renderer.device.properties.items())
    fields = ("global_max", "local_max", "shared_max", "has_local", "has_shared", "has_threads", "supports_float4",
              "contraction_tiles", "tensor_cores")
    return repr((type(renderer).__qualname__, renderer.target, [(f, repr(getattr(renderer, f, None))) for f in fields],
                 props))


def disk_key(ast: UOp, renderer: Any) -> str:
    """The key of the program tinygrad lowers from `ast` with `renderer`."""
    h = hashlib.sha256()
    for part in (layer_id(), ast.key.hex(), renderer_id(renderer), *(repr(x.value) for x in codegen.to_program_config)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def kept_form(program: UOp) -> UOp:
    """`program` without its lowered graph: its kernel's SINK keeps only its `KernelInfo`, its
    LINEAR only its PARAMs (`UOp.to_elf` reads their names, slots and dtypes)."""
    sink, linear, *rest = program.src
    params = tuple(u for u in linear.src if u.op is Ops.PARAM)
    return program.replace(src=(UOp(Ops.SINK, arg=sink.arg), UOp(Ops.LINEAR, src=params), *rest))


def to_program(ast: UOp, renderer: Any) -> UOp:
    """tinygrad's `to_program` (AST to compiled program, through tinygrad's in-memory cache), with
    the programs of kiln's CPU devices kept on disk: one found there is compiled into kiln's kernel
    cache (where an earlier process left it, found there) and returned without lowering; one
    lowered is kept. Called where tinygrad lowers a schedule's kernels (its compile workers
    too)."""
    from .device import KilnRenderer  # imports `compat`, which imports this module

    kept = isinstance(renderer, KilnRenderer) and not renderer.has_local
    if not kept or ast.op is not Ops.SINK or getattr(ast.arg, "beam", 0):
        return originals.tinygrad(originals.TO_PROGRAM)(ast, renderer)
    key = disk_key(ast, renderer)
    program = diskcache_get(TABLE, key)
    if isinstance(program, UOp) and program.op is Ops.PROGRAM and len(program.src) == 4:
        renderer.compiler.compile_cached(program.src[2].arg)
        return program
    program = originals.tinygrad(originals.TO_PROGRAM)(ast, renderer)
    diskcache_put(TABLE, key, kept_form(program))
    return program
