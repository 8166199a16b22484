#!/usr/bin/env python3
"""A fuzzer of kiln's Python API.

Each case is a short random program against the public API (devices, buffers, kernels,
plans, saved plans), generated from its seed alone, that mixes valid calls with invalid
arguments: negative, zero and huge sizes and offsets, unknown dtypes, odd numpy arrays, closed
devices, buffers of other devices, unknown variables, mutated kernel text, missing files, plan
files cut short or with a byte changed, inputs of a loaded plan of other names, dtypes and shapes.

The contract checked: every call into kiln either succeeds or raises a subclass of
``kiln.Error``. A finding is any of:

* a crash (the worker process died) or a hang (a case ran past ``--timeout``);
* any other exception from a kiln call (OverflowError, BufferError, SystemError, ...), and a
  ``kiln.Error`` that reports a caught Rust panic;
* a valid call that raised, or a valid launch or copy whose result differs from numpy's;
* an inconsistency: a second ``PlanRun.wait()`` raising another class than the first, a
  ``run_async`` that accepts a variable ``run`` refuses, ``done()`` false after ``wait()``,
  a closed device handle that does not refuse a call.

Recorded separately as notes, which do not fail a case: a ``TypeError`` for an argument of
the wrong type or arity (the fuzzer knows when it passes one), and a ``BufferError`` from an
export protocol (``__dlpack__``, ``__dlpack_device__``, ``__array_interface__``), which the
DLPack standard asks for.

Cases run in worker processes that print each case's seed before running it; the parent
records a worker that dies or hangs as a crash or hang of that case and starts a new worker
at the next case. Every call is a line of Python run in the case's namespace, so
``--replay SEED`` prints a case as a script, with each call's outcome. Unless already set,
cases run with ``KILN_MEMORY_BUDGET=256MiB`` (huge sizes must fail, not take the machine's
memory), ``NODEVICE_SELECT=1``, and kiln's and PoCL's kernel caches in a temporary folder.

    python crates/kiln-py/tests/fuzz_api.py --cases 1000 [--seed 0]
        [--devices CPU,OPENCL:0,WEBGPU:0] [--timeout 30] [--jobs 2]
    python crates/kiln-py/tests/fuzz_api.py --replay SEED [--devices ...]

The last line of a run is ``N passed, M failed`` (cases without and with a finding); the
exit status is 1 when M > 0.
"""

from __future__ import annotations

import argparse
import collections
import enum
import faulthandler
import itertools
import json
import os
import pathlib
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

import kiln

KERNELS = pathlib.Path(__file__).resolve().parents[3] / "examples" / "kernels"
EXAMPLES: dict[str, str] = {p.stem: p.read_text() for p in sorted(KERNELS.glob("*.kiln"))}
BACKENDS = ("CPU", "OPENCL", "CUDA", "WEBGPU")

# Workers run under a memory budget, so that huge buffers (allocated when first used) fail
# with OutOfMemoryError instead of taking the machine's memory.
MEMORY_BUDGET = "256MiB"
# Buffers for launches hold this many elements: enough for every example kernel with
# variables up to 64, few enough that no launch runs long.
FIT = 4096

# ---------------------------------------------------------------------------------------
# Argument pools: Python expressions, each with whether it is of a wrong *type* for the
# parameter it is passed to (a TypeError from Python for those is a note, not a finding).

Arg = tuple[str, bool]

SMALL_INTS = ["0", "1", "2", "3", "7", "8", "63", "64", "100", "4096"]
HUGE_INTS = ["2**31 - 1", "2**31", "2**32", "2**62", "2**63 - 1", "2**63", "2**64 - 1", "2**64", "2**70"]
NEGATIVE_INTS = ["-1", "-2", "-2**31", "-2**63", "-2**63 - 1", "-2**64", "-2**70"]
INT_LIKES = ["True", "False", "np.int64(5)", "np.uint64(2**64 - 1)", "np.int8(-1)", "np.intp(3)"]
NOT_INTS = ["4.0", "'8'", "None", "[3]", "1j", "np.float32(2)"]

NUMPY_TO_KILN = {
    **{"bool": "bool", "float16": "f16", "float32": "f32", "float64": "f64"},
    **{f"{kind}int{bits}": f"{kind[:1] or 'i'}{bits}" for kind in ("", "u") for bits in (8, 16, 32, 64)},
}
NUMERIC = list(NUMPY_TO_KILN)
GOOD_DTYPES = [repr(d) for d in kiln.DTYPES] + [
    *["'float32'", "'int64'", "'bfloat16'", "'float16'", "'uint8'"],
    *["np.float32", "np.bool_", "np.dtype('<i8')", "np.dtype('>f4')", "None"],
]
BAD_DTYPES = [
    *["'f31'", "''", "'F32'", "'float'", "'i4'", "'complex64'", "np.complex64", "'object'", "'U3'"],
    *["np.dtype('V8')", "'datetime64[s]'", "np.dtype([('a', 'i4')])", "' f32'", "'f32\\x00'", "'x' * 10000"],
]
WRONG_TYPE_DTYPES = ["3", "object()", "[]", "b'f32'", "1.5"]

# Arrays (and other objects) for from_numpy, from_dlpack and copy_from that are not valid
# arrays of a kiln dtype; the valid ones are made by Case.numeric_array.
ODD_ARRAYS = [
    *["np.arange(6, dtype='complex64')", "np.arange(8, dtype='complex128')[::2]"],
    *["np.array([object(), 1], dtype=object)", "np.array(['a', 'bc'])"],
    *["np.zeros(3, dtype=[('x', 'f4'), ('y', 'i4')])"],
    *["np.array([1, 2, 3], dtype='datetime64[s]')", "np.arange(3, dtype='timedelta64[ms]')"],
    *["np.zeros(3, dtype=np.longdouble)", "np.arange(8, dtype='>f4')", "np.arange(8, dtype='>i8')[::2]"],
    *["np.broadcast_to(np.float32(1), (2**50,))", "np.ma.masked_array([1.0, 2.0], mask=[0, 1])", "np.float32(2.5)"],
    *["[1.0, 2.0, 3.0]", "[[1, 2], [3]]", "[]", "[[]]", "3.5", "7", "True", "None", "'abc'", "b'abcd'"],
    *["bytearray(8)", "memoryview(b'abcdefgh')", "range(5)", "{'a': 1}"],
]

DEVICE_NAMES_BAD = [
    *["'cpu'", "'CPU:x'", "'CPU:0'", "'OPENCL:99'", "'OPENCL:-1'", "'OPENCL:99999999999999999999'"],
    *["'OPENCL:0:1'", "'TPU:0'", "'CUDA:0'", "''", "' CPU'", "'CPU\\x00'", "'\\U0001f4a5'", "'x' * 1000"],
]
KERNEL_NAMES = ["'k'", "''", "'a b'", "'\\xf1'", "'x' * 5000", "'\\x00'", "'1abc'", "'main'", "'int'", "None"]
MISSING_SOURCES = [
    *["pathlib.Path('/nonexistent/k.kiln')", "'/nonexistent/k.kiln'", "KERNELS", "str(KERNELS)"],
    *["''", "'\\n'", "'%x = BOGUS'", "'\\x00'"],
]
TIMEOUTS = ["None", "0", "0.0", "1e-9", "1.0", "60", "-1.0", "float('nan')", "float('inf')", "1e300", "2**64", "2**70"]

# ---------------------------------------------------------------------------------------
# Kernel text mutations

OPS = sorted({m.group(1) for text in EXAMPLES.values() for m in re.finditer(r"^%\w+\s*=\s*([A-Z_]+)\s", text, re.M)})
OPS += ["BOGUS", "add", "SINK"]
DTYPE_TOKEN = re.compile(r"\b(?:l?ptr<\w+>|bool|void|bf16|[fiu]\d+)\b")
DTYPE_TOKENS = ["f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool", "void", "ptr<f32>", "lptr<f32>", "ptr<i64>"]
NUMBER_TOKEN = re.compile(r"(?<![\w%<])-?\d+(?:\.\d+)?\b|\b(?:inf|nan)\b")
NUMBERS = [
    *["0", "-1", "1", "2", "4096", "65536", "2147483647", "2147483648", "-2147483649", "9223372036854775807"],
    *["9223372036854775808", "18446744073709551616", "1e400", "nan", "-inf", "0.5", "00", "0x10"],
]
REF_TOKEN = re.compile(r"%\w*")
QUOTED = re.compile(r'"[^"]*"')
SPECIALS = ['"idx0"', '"idx1"', '"idx3"', '"gidx7"', '"lidx0"', '""', '"n"', '"idx0 "']
JUNK = ["\x00", "\xe9", "(", ")", "%", "%%", "\t", ",", '"', "9" * 30, "# ", "\r", "\u2028", "x" * 300]
# A mutant whose constants stay below this is launched (with small variables); bigger
# constants can make loops that run for minutes, so those are only compiled.
LAUNCHABLE_CONSTANT = 1024


def _drop(rng: random.Random, lines: list[str]) -> list[str]:
    i = rng.randrange(len(lines))
    return lines[:i] + lines[i + 1 :]


def _duplicate(rng: random.Random, lines: list[str]) -> list[str]:
    i = rng.randrange(len(lines))
    return lines[: i + 1] + lines[i:]


def _swap_lines(rng: random.Random, lines: list[str]) -> list[str]:
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    out = list(lines)
    out[i], out[j] = out[j], out[i]
    return out


def _replace_one(rng: random.Random, lines: list[str], pattern: re.Pattern[str], choices: Sequence[str]) -> list[str]:
    """`lines` with one match of `pattern` (in a random line that has one) replaced."""
    candidates = [i for i, line in enumerate(lines) if pattern.search(line)]
    if not candidates:
        return lines
    i = rng.choice(candidates)
    match = rng.choice(list(pattern.finditer(lines[i])))
    out = list(lines)
    out[i] = lines[i][: match.start()] + rng.choice(choices) + lines[i][match.end() :]
    return out


def _swap_op(rng: random.Random, lines: list[str]) -> list[str]:
    return _replace_one(rng, lines, re.compile(r"(?<== )[A-Z_]+|^SINK"), OPS)


def _swap_dtype(rng: random.Random, lines: list[str]) -> list[str]:
    return _replace_one(rng, lines, DTYPE_TOKEN, DTYPE_TOKENS)


def _swap_number(rng: random.Random, lines: list[str]) -> list[str]:
    return _replace_one(rng, lines, NUMBER_TOKEN, NUMBERS)


def _swap_ref(rng: random.Random, lines: list[str]) -> list[str]:
    refs = sorted({m.group(0) for line in lines for m in REF_TOKEN.finditer(line)}) + ["%nope", "%"]
    return _replace_one(rng, lines, REF_TOKEN, refs)


def _swap_special(rng: random.Random, lines: list[str]) -> list[str]:
    return _replace_one(rng, lines, QUOTED, SPECIALS)


def _truncate(rng: random.Random, lines: list[str]) -> list[str]:
    text = "\n".join(lines)
    return text[: rng.randrange(len(text) + 1)].split("\n")


def _junk(rng: random.Random, lines: list[str]) -> list[str]:
    i = rng.randrange(len(lines))
    at = rng.randrange(len(lines[i]) + 1)
    out = list(lines)
    out[i] = lines[i][:at] + rng.choice(JUNK) + lines[i][at:]
    return out


MUTATIONS: list[Callable[[random.Random, list[str]], list[str]]] = [
    *[_drop, _duplicate, _swap_lines, _truncate, _junk],
    *[_swap_op, _swap_dtype, _swap_number, _swap_ref, _swap_special],
]


def mutate(rng: random.Random, text: str) -> str:
    """`text` (an example kernel) without comments and with one to three random mutations."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for _ in range(rng.choice([1, 1, 2, 3])):
        if lines:
            lines = rng.choice(MUTATIONS)(rng, lines)
    out = "\n".join(lines)
    return out + "\n" if rng.random() < 0.9 else out


def launchable(text: str) -> bool:
    """Whether every number in a mutant is small enough that its loops end quickly."""
    numbers = re.findall(r"\d+", "\n".join(line for line in text.splitlines() if "DEFINE_VAR" not in line))
    return all(len(n) < 6 and int(n) <= LAUNCHABLE_CONSTANT for n in numbers)


# ---------------------------------------------------------------------------------------
# Findings


class Kind(enum.Enum):
    CRASH = "crash"
    HANG = "hang"
    FOREIGN = "non-kiln exception"
    PANIC = "caught Rust panic"
    REFUSED = "valid call failed"
    WRONG = "wrong result"
    INCONSISTENT = "inconsistent"
    INTERNAL = "fuzzer error"
    TYPE_NOTE = "note: TypeError for a wrong argument type"
    EXPORT_NOTE = "note: BufferError from an export protocol"

    @property
    def is_note(self) -> bool:
        return self in (Kind.TYPE_NOTE, Kind.EXPORT_NOTE)


@dataclass(frozen=True)
class Finding:
    seed: int
    kind: Kind
    op: str  # the API called, e.g. "Device.empty"
    error: str  # the exception's class, or the signal that killed the worker
    message: str
    code: str  # the line of Python that did it

    def pattern(self) -> str:
        """The message with numbers and quoted names blurred, to group findings."""
        text = re.sub(r"0x[0-9a-fA-F]+", "0x…", self.message)
        text = re.sub(r"(['`\"]).*?\1", r"\1…\1", text)
        return re.sub(r"\d+", "N", text)[:100]

    def key(self) -> tuple[str, str, str, str]:
        return (self.kind.value, self.op, self.error, self.pattern())

    def to_json(self) -> str:
        return json.dumps([self.seed, self.kind.name, self.op, self.error, self.message, self.code])

    @staticmethod
    def from_json(text: str) -> Finding:
        seed, kind, op, error, message, code = json.loads(text)
        return Finding(seed, Kind[kind], op, error, message, code)


# ---------------------------------------------------------------------------------------
# One case


class Abandon(Exception):
    """A step an operation needs failed: the operation stops (its failure is already recorded)."""


@dataclass
class DevRef:
    name: str  # the variable
    device: str  # as given in --devices
    closed: bool = False


@dataclass
class BufRef:
    name: str
    dtype: Optional[str]  # when known
    length: Optional[int]


@dataclass
class KernelRef:
    name: str
    device: str
    params: list[tuple[int, str]]
    vars: list[tuple[str, int, int]]
    mutant: bool


@dataclass
class RunRef:
    name: str
    waits: list[Optional[type]] = field(default_factory=list)  # each wait's exception class, None if it returned


@dataclass
class Outcome:
    ok: bool
    value: Any = None
    error: Optional[BaseException] = None


Hook = Callable[[str, str], None]


class Case:
    """One random program, generated and run step by step from `seed`."""

    def __init__(self, seed: int, devices: Sequence[str], before: Optional[Hook] = None, after: Optional[Hook] = None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.devices = list(devices)
        self.before = before  # (op, line) before each line runs
        self.after = after  # (op, outcome) after each call
        self.ns: dict[str, Any] = {"kiln": kiln, "np": np, "pathlib": pathlib, "KERNELS": KERNELS}
        self.findings: list[Finding] = []
        self.counter = itertools.count()
        self.devs: list[DevRef] = []
        self.bufs: list[BufRef] = []
        self.kernels: list[KernelRef] = []
        self.plans: list[str] = []
        self.runs: list[RunRef] = []
        self.plan_files: list[str] = []  # names bound to paths of saved plans (some damaged)
        self.loaded: list[str] = []  # names bound to loaded plans
        self.folder: Optional[str] = None  # the case's folder for plan files, made on first use

    # -- running lines -------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self.counter)}"

    def run_line(self, op: str, line: str) -> None:
        if self.before:
            self.before(op, line)
        exec(compile(line, "<fuzz>", "exec"), self.ns)

    def let(self, code: str, prefix: str) -> str:
        """Binds a plain Python value (an array, kernel text), not a kiln call; returns its name."""
        name = self.fresh(prefix)
        self.run_line("python", f"{name} = {code}")
        return name

    def report(self, kind: Kind, op: str, error: str, message: str, line: str) -> None:
        self.findings.append(Finding(self.seed, kind, op, error, message, line))
        if self.after:
            self.after(op, f"FINDING {kind.value}: {error}: {message}")

    def call(
        self,
        code: str,
        op: str,
        *,
        bind: Optional[str] = None,
        valid: bool = False,
        wrong_type: bool = False,
        export: bool = False,
        through: Optional[DevRef] = None,
    ) -> Outcome:
        """Runs one call into kiln and checks the contract: success or a kiln.Error (or, when
        `valid`, success). `wrong_type`: an argument is of the wrong type (a TypeError is a
        note); `export`: an export protocol (a BufferError is a note); `through`: the device
        handle the call goes through (a closed one must refuse it)."""
        line = f"{bind} = {code}" if bind else code
        try:
            self.run_line(op, line)
        except kiln.Error as e:
            if "panic was caught" in str(e):
                self.report(Kind.PANIC, op, type(e).__name__, str(e), line)
            elif valid:
                self.report(Kind.REFUSED, op, type(e).__name__, str(e), line)
            elif self.after:
                self.after(op, f"{type(e).__name__}: {e}")
            return Outcome(False, error=e)
        except (NameError, SyntaxError) as e:
            self.report(Kind.INTERNAL, op, type(e).__name__, str(e), line)
            raise Abandon from e
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: B036 - pyo3's PanicException is a BaseException
            kind = Kind.FOREIGN
            if wrong_type and type(e) is TypeError:
                kind = Kind.TYPE_NOTE
            elif export and type(e) is BufferError and not valid:
                kind = Kind.EXPORT_NOTE
            self.report(kind, op, type(e).__name__, str(e), line)
            return Outcome(False, error=e)
        value = self.ns.get(bind) if bind else None
        if self.after:
            self.after(op, "ok" if bind is None else f"ok: {_short(value)}")
        if through is not None and through.closed:
            self.report(Kind.INCONSISTENT, op, "-", "a closed device handle did not refuse the call", line)
        return Outcome(True, value)

    def need(self, code: str, op: str, *, bind: Optional[str] = None, valid: bool = False) -> Any:
        """`call`, abandoning the operation when it fails."""
        out = self.call(code, op, bind=bind, valid=valid)
        if not out.ok:
            raise Abandon
        return out.value

    def check(self, condition: str, op: str, what: str) -> None:
        """Evaluates `condition` (Python over the case's names); false is a wrong result of
        `op`, and ends the operation."""
        if self.before:
            self.before("check", f"assert {condition}")
        if not eval(condition, self.ns):
            self.report(Kind.WRONG, op, "-", what, f"assert {condition}")
            raise Abandon

    # -- picking ---------------------------------------------------------------------------

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def an_int(self, near: Optional[int] = None) -> Arg:
        """A size, offset or index: mostly small or near `near`, sometimes huge, negative, an
        int-like, or not an int at all."""
        r = self.rng.random()
        if near is not None and r < 0.35:
            return str(max(0, near + self.rng.choice([-1, 0, 0, 1]))), False
        if r < 0.55:
            return self.rng.choice(SMALL_INTS), False
        if r < 0.72:
            return self.rng.choice(HUGE_INTS), False
        if r < 0.85:
            return self.rng.choice(NEGATIVE_INTS), False
        if r < 0.93:
            return self.rng.choice(INT_LIKES), False
        return self.rng.choice(NOT_INTS), True

    def a_dtype(self) -> Arg:
        r = self.rng.random()
        if r < 0.6:
            return self.rng.choice(GOOD_DTYPES), False
        if r < 0.9:
            return self.rng.choice(BAD_DTYPES), False
        return self.rng.choice(WRONG_TYPE_DTYPES), True

    def numeric_array(self, dtype: Optional[str] = None, size: Optional[int] = None) -> str:
        """An expression for a numpy array of a kiln dtype, in a random layout."""
        dt = dtype or self.rng.choice(NUMERIC)
        n = size if size is not None else self.rng.choice([0, 1, 2, 3, 5, 8, 17, 64, 100])
        r, c = self.rng.choice([(0, 3), (3, 0), (1, 1), (2, 3), (4, 4), (3, 5)])
        values = f"(np.arange({{}}) % 7).astype({dt!r})"
        layouts = [
            values.format(n),
            values.format(2 * n) + "[::2]",
            values.format(n) + "[::-1]",
            values.format(r * c) + f".reshape({r}, {c})",
            values.format(r * c) + f".reshape({r}, {c}).T",
            values.format(2 * r * c) + f".reshape({r}, {2 * c})[:, ::2]",
            f"np.asfortranarray({values.format(r * c)}.reshape({r}, {c}))",
            f"np.array(3, dtype={dt!r})",
            f"np.zeros(({n}, 0), {dt!r})",
            f"np.broadcast_to(np.array(1, {dt!r}), ({n},))",
            f"np.frombuffer(bytes(64), dtype={dt!r})",
            f"np.frombuffer(bytearray(72), dtype={dt!r}, count=8, offset=1)",
        ]
        return layouts[0] if size is not None else self.rng.choice(layouts)

    def an_array(self) -> tuple[str, bool]:
        """A name bound to an array or other object for from_numpy/from_dlpack/copy_from, and
        whether it is a valid array of a kiln dtype."""
        if self.chance(0.6):
            return self.let(self.numeric_array(), "a"), True
        return self.let(self.rng.choice(ODD_ARRAYS), "a"), False

    def a_dev(self) -> DevRef:
        return self.rng.choice(self.devs)

    def a_buf(self) -> Optional[BufRef]:
        return self.rng.choice(self.bufs) if self.bufs else None

    def open_device(self, device: str, valid: bool = True) -> Optional[DevRef]:
        name = self.fresh("d")
        if self.call(f"kiln.Device({device!r})", "Device", bind=name, valid=valid).ok:
            self.devs.append(DevRef(name, device))
            return self.devs[-1]
        return None

    def make_buf(self, dev: DevRef, dtype: str, length: int, *, valid: bool = False) -> BufRef:
        name = self.fresh("b")
        self.need(f"{dev.name}.empty({dtype!r}, {length})", "Device.empty", bind=name, valid=valid)
        self.bufs.append(BufRef(name, dtype, length))
        return self.bufs[-1]

    def compile_example(self, dev: DevRef, example: str, *, valid: bool = False) -> Optional[KernelRef]:
        name = self.fresh("k")
        code = f"{dev.name}.compile(KERNELS / '{example}.kiln')"
        if not self.call(code, "Device.compile", bind=name, valid=valid).ok:
            return None
        return self.adopt_kernel(name, dev, mutant=False)

    def adopt_kernel(self, name: str, dev: DevRef, mutant: bool) -> Optional[KernelRef]:
        """Adds a compiled kernel to the pool, reading its parameters and variables."""
        params = self.call(f"{name}.params", "Kernel.params", bind=self.fresh("_"), valid=True)
        variables = self.call(f"{name}.vars", "Kernel.vars", bind=self.fresh("_"), valid=True)
        if not (params.ok and variables.ok):
            return None
        self.kernels.append(KernelRef(name, dev.device, list(params.value), list(variables.value), mutant))
        return self.kernels[-1]

    # -- the program ----------------------------------------------------------------------

    def run(self) -> list[Finding]:
        """Generates and runs the case; returns its findings."""
        try:
            self.prologue()
        except Abandon:
            return self.findings
        ops: list[tuple[Callable[[], None], int]] = [
            (self.op_device, 4),
            (self.op_open, 2),
            (self.op_close, 1),
            (self.op_reset, 1),
            (self.op_empty, 6),
            (self.op_from_numpy, 5),
            (self.op_from_dlpack, 4),
            (self.op_buffer_read, 6),
            (self.op_view, 6),
            (self.op_reinterpret, 3),
            (self.op_copy_from, 4),
            (self.op_export, 3),
            (self.op_compile, 4),
            (self.op_compile_many, 2),
            (self.op_launch, 8),
            (self.op_plan, 2),
            (self.op_plan_record, 5),
            (self.op_plan_rebind, 2),
            (self.op_plan_run, 4),
            (self.op_plan_wait, 3),
            (self.op_plan_save, 3),
            (self.op_load_plan, 3),
            (self.op_loaded_call, 4),
            (self.op_forget, 2),
            (self.op_arity, 1),
            (self.oracle_roundtrip, 2),
            (self.oracle_add, 2),
            (self.oracle_sum, 1),
            (self.oracle_plan, 2),
        ]
        functions, weights = zip(*ops)
        for op in self.rng.choices(functions, weights, k=self.rng.randint(8, 24)):
            try:
                op()
            except Abandon:
                pass
        self.epilogue()
        return self.findings

    def prologue(self) -> None:
        """A device (two when there are), an add kernel and a few buffers to start from."""
        first = self.open_device(self.rng.choice(self.devices))
        if first is None:
            raise Abandon
        if len(self.devices) > 1 and self.chance(0.5):
            self.open_device(self.rng.choice(self.devices))
        self.compile_example(first, "add", valid=True)
        for _ in range(self.rng.randint(1, 3)):
            dtype = self.rng.choice(["f32", "f32", "i32", "u8", "f64", "bf16"])
            self.make_buf(self.a_dev(), dtype, self.rng.choice([0, 1, 8, 64, FIT]), valid=True)

    def epilogue(self) -> None:
        """Waits (twice) for each run and for each device, so nothing of this case runs on."""
        for run in self.runs:
            for _ in range(2 - len(run.waits)):
                self.wait(run)
        for dev in self.devs:
            self.call(f"{dev.name}.synchronize()", "Device.synchronize")
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- devices --------------------------------------------------------------------------

    def op_open(self) -> None:
        r = self.rng.random()
        if r < 0.4:
            self.open_device(self.rng.choice(self.devices))
        elif r < 0.85:
            self.call(f"kiln.Device({self.rng.choice(DEVICE_NAMES_BAD)})", "Device", bind=self.fresh("_"))
        elif r < 0.95:
            name = self.rng.choice(["None", "0", "b'CPU'"])
            self.call(f"kiln.Device({name})", "Device", wrong_type=True)
        else:
            name = self.fresh("d")
            self.call(
                f"with kiln.Device({self.rng.choice(self.devices)!r}) as {name}: {name}.empty('f32', 4)",
                "Device.__enter__",
                valid=True,
            )

    def op_close(self) -> None:
        dev = self.a_dev()
        how = self.rng.choice([f"{dev.name}.close()", f"{dev.name}.__exit__(None, None, None)"])
        dev.closed |= self.call(how, "Device.close").ok

    def op_reset(self) -> None:
        dev = self.a_dev()
        self.call(f"{dev.name}.reset()", "Device.reset", through=dev)

    def op_device(self) -> None:
        dev = self.a_dev()
        r = self.rng.random()
        if r < 0.1:
            self.call("kiln.devices()", "kiln.devices", bind=self.fresh("_"))
        elif r < 0.2:  # what a closed handle still answers
            what, op = self.rng.choice([(f"{dev.name}.name", "Device.name"), (f"repr({dev.name})", "Device.__repr__")])
            self.call(what, op, bind=self.fresh("_"))
        elif r < 0.8:
            call = self.rng.choice(
                ["synchronize()", "memory_stats()", "trim()", "properties", "description", "generation", "is_lost"]
                + ["bounds_policy"]
            )
            self.call(f"{dev.name}.{call}", f"Device.{call.rstrip('()')}", bind=self.fresh("_"), through=dev)
        else:
            policies = [(p, False) for p in ("'guard'", "'refuse'", "'loose'", "''")]
            policy, wrong = self.rng.choice(policies + [("None", True)])
            self.call(f"{dev.name}.bounds_policy = {policy}", "Device.bounds_policy", wrong_type=wrong, through=dev)

    # -- buffers --------------------------------------------------------------------------

    def op_empty(self) -> None:
        dev = self.a_dev()
        (dtype, wrong_dtype), (n, wrong_n) = self.a_dtype(), self.an_int()
        name = self.fresh("b")
        code = f"{dev.name}.empty({dtype}, {n})"
        out = self.call(code, "Device.empty", bind=name, wrong_type=wrong_dtype or wrong_n, through=dev)
        if not out.ok:
            return
        length = int(eval(n, self.ns))
        self.bufs.append(BufRef(name, out.value.dtype, length))
        # The size reads back as asked, whatever it is; copying huge contents out fails as a kiln.Error.
        if self.chance(0.5):
            got = self.fresh("_")
            if self.call(f"len({name})", "Buffer.__len__", bind=got).ok:
                self.check(f"{got} == {length}", "Buffer.__len__", f"len() of an empty buffer of {length} elements")
        if self.chance(0.25):
            self.call(f"{name}.numpy()", "Buffer.numpy", bind=self.fresh("_"))

    def op_from_numpy(self) -> None:
        dev = self.a_dev()
        array, valid = self.an_array()
        name = self.fresh("b")
        out = self.call(f"{dev.name}.from_numpy({array})", "Device.from_numpy", bind=name, through=dev)
        if out.ok:
            self.bufs.append(BufRef(name, out.value.dtype, int(np.asarray(self.ns[array]).size) if valid else None))

    def op_from_dlpack(self) -> None:
        if self.bufs and self.chance(0.25):
            source, valid = self.rng.choice(self.bufs).name, False
        else:
            source, valid = self.an_array()
        wrong = not hasattr(self.ns[source], "__dlpack__")
        dev = self.a_dev()
        device, through, wrong_device = self.rng.choice(
            [("", None, False), (", None", None, False), (f", {dev.name}", dev, False)]
            + [(f", device={dev.name}", dev, False), (", 'CPU'", None, True)]
        )
        name = self.fresh("b")
        code = f"kiln.from_dlpack({source}{device})"
        out = self.call(code, "kiln.from_dlpack", bind=name, wrong_type=wrong or wrong_device, through=through)
        if out.ok:
            length = int(np.asarray(self.ns[source]).size) if valid else None
            self.bufs.append(BufRef(name, out.value.dtype, length))

    def op_buffer_read(self) -> None:
        buf = self.a_buf()
        if buf is None:
            return
        what, op = self.rng.choice(
            [
                (f"len({buf.name})", "Buffer.__len__"),
                (f"{buf.name}.nbytes", "Buffer.nbytes"),
                (f"{buf.name}.dtype", "Buffer.dtype"),
                (f"{buf.name}.device", "Buffer.device"),
                (f"{buf.name}.is_host", "Buffer.is_host"),
                (f"repr({buf.name})", "Buffer.__repr__"),
                (f"{buf.name}.numpy()", "Buffer.numpy"),
                (f"{buf.name}.numpy()", "Buffer.numpy"),
            ]
        )
        self.call(what, op, bind=self.fresh("_"))

    def op_view(self) -> None:
        buf = self.a_buf()
        if buf is None:
            return
        offset, wrong_offset = self.an_int(buf.length)
        args = offset
        wrong_length = False
        r = self.rng.random()
        if r < 0.6:
            length, wrong_length = self.an_int(None if buf.length is None else max(0, buf.length - 1))
            args += f", {length}"
        elif r < 0.7:
            args += ", None"
        name = self.fresh("b")
        out = self.call(f"{buf.name}.view({args})", "Buffer.view", bind=name, wrong_type=wrong_offset or wrong_length)
        if out.ok:
            self.bufs.append(BufRef(name, buf.dtype, None))

    def op_reinterpret(self) -> None:
        buf = self.a_buf()
        if buf is None:
            return
        dtype, wrong = self.a_dtype()
        name = self.fresh("b")
        if self.call(f"{buf.name}.reinterpret({dtype})", "Buffer.reinterpret", bind=name, wrong_type=wrong).ok:
            self.bufs.append(BufRef(name, None, None))

    def op_copy_from(self) -> None:
        buf = self.a_buf()
        if buf is None:
            return
        r = self.rng.random()
        if r < 0.4 and self.bufs:
            source = self.rng.choice(self.bufs).name
        elif r < 0.6 and buf.length is not None and buf.dtype in NUMPY_TO_KILN.values() and buf.length <= FIT:
            numpy_name = next(k for k, v in NUMPY_TO_KILN.items() if v == buf.dtype)
            source = self.let(self.numeric_array(numpy_name, buf.length), "a")
        else:
            source, _ = self.an_array()
        self.call(f"{buf.name}.copy_from({source})", "Buffer.copy_from")

    def op_export(self) -> None:
        buf = self.a_buf()
        if buf is None:
            return
        r = self.rng.random()
        if r < 0.5:
            kwargs: list[str] = []
            wrong = False
            if self.chance(0.5):
                versions = ["None", "(1, 0)", "(0, 8)", "(1, 5)", "(2**40, 0)", "(-1, 0)"]
                version, w = self.rng.choice([(v, False) for v in versions] + [("('a', 0)", True)])
                kwargs.append(f"max_version={version}")
                wrong |= w
            if self.chance(0.4):
                devices = ["None", "(1, 0)", "(2, 0)", "(1, 1)", "(2**40, 0)", "(-1, -1)"]
                device, w = self.rng.choice([(d, False) for d in devices] + [("'cpu'", True)])
                kwargs.append(f"dl_device={device}")
                wrong |= w
            if self.chance(0.3):
                kwargs.append(f"copy={self.rng.choice(['None', 'True', 'False'])}")
            if self.chance(0.2):
                kwargs.append(f"stream={self.rng.choice(['None', '0', '1', '-1'])}")
            code = f"{buf.name}.__dlpack__({', '.join(kwargs)})"
            self.call(code, "Buffer.__dlpack__", bind=self.fresh("_"), wrong_type=wrong, export=True)
        else:
            what, op = self.rng.choice(
                [
                    (f"{buf.name}.__dlpack_device__()", "Buffer.__dlpack_device__"),
                    (f"{buf.name}.__array_interface__", "Buffer.__array_interface__"),
                ]
            )
            self.call(what, op, bind=self.fresh("_"), export=True)

    def op_arity(self) -> None:
        """A call with too few or too many arguments, or an unknown keyword."""
        dev = self.a_dev().name
        buf = self.a_buf()
        calls = [
            (f"{dev}.empty('f32')", "Device.empty"),
            (f"{dev}.empty('f32', 1, 2)", "Device.empty"),
            (f"{dev}.empty('f32', size=4)", "Device.empty"),
            (f"{dev}.compile()", "Device.compile"),
            (f"{dev}.synchronize(1)", "Device.synchronize"),
            (f"{dev}.from_numpy()", "Device.from_numpy"),
            ("kiln.from_dlpack()", "kiln.from_dlpack"),
            ("kiln.Plan()", "Plan"),
            (f"kiln.Plan({dev}, 1.0)", "Plan"),
        ]
        if buf is not None:
            calls += [
                (f"{buf.name}.view()", "Buffer.view"),
                (f"{buf.name}.view(0, 1, 2)", "Buffer.view"),
                (f"{buf.name}.view(0, size=1)", "Buffer.view"),
                (f"{buf.name}.copy_from()", "Buffer.copy_from"),
                (f"{buf.name}.reinterpret()", "Buffer.reinterpret"),
                (f"{buf.name}.__dlpack__(None)", "Buffer.__dlpack__"),
            ]
        if self.plans and buf is not None:
            plan = self.rng.choice(self.plans)
            calls += [(f"{plan}.copy({buf.name})", "Plan.copy"), (f"{plan}.rebind()", "Plan.rebind")]
            calls.append((f"{plan}.run(1)", "Plan.run"))
        if self.runs:
            calls.append((f"{self.rng.choice(self.runs).name}.wait(1)", "PlanRun.wait"))
        code, op = self.rng.choice(calls)
        self.call(code, op, bind=self.fresh("_"), wrong_type=True)

    def op_forget(self) -> None:
        """Drops a buffer or kernel (views, arrays and plans may still hold its memory)."""
        pool: list[Any] = self.rng.choice([self.bufs, self.kernels])
        if pool:
            ref = pool.pop(self.rng.randrange(len(pool)))
            self.run_line("python", f"del {ref.name}; import gc; gc.collect()")

    # -- kernels --------------------------------------------------------------------------

    def a_source(self) -> tuple[str, bool, Optional[str]]:
        """Kernel source code, whether it is of a wrong type, and the example it is (None when
        mutated or not a kernel)."""
        r = self.rng.random()
        example = self.rng.choice(list(EXAMPLES))
        if r < 0.3:
            path = f"KERNELS / '{example}.kiln'"
            return self.rng.choice([path, f"str({path})", f"({path}).read_text()"]), False, example
        if r < 0.8:
            return self.let(repr(mutate(self.rng, EXAMPLES[example])), "s"), False, None
        if r < 0.93:
            return self.rng.choice(MISSING_SOURCES), False, None
        return self.rng.choice(["42", "None", "b'%x = BOGUS'", "['add']"]), True, None

    def op_compile(self) -> None:
        dev = self.a_dev()
        source, wrong, example = self.a_source()
        args = source
        wrong_name = False
        if self.chance(0.3):
            kernel_name, wrong_name = self.rng.choice([(n, False) for n in KERNEL_NAMES] + [("5", True)])
            args += f", {kernel_name}" if self.chance(0.5) else f", name={kernel_name}"
        name = self.fresh("k")
        code = f"{dev.name}.compile({args})"
        out = self.call(code, "Device.compile", bind=name, wrong_type=wrong or wrong_name, through=dev)
        if out.ok:
            text = self.ns[source] if source in self.ns else EXAMPLES.get(example or "", "")
            if example is not None or launchable(text):
                self.adopt_kernel(name, dev, mutant=example is None)

    def op_compile_many(self) -> None:
        dev = self.a_dev()
        entries: list[str] = []
        wrong = False
        for _ in range(self.rng.randint(0, 3)):
            source, w, _ = self.a_source()
            wrong |= w
            r = self.rng.random()
            if r < 0.5:
                entries.append(source)
            elif r < 0.8:
                entries.append(f"({source}, {self.rng.choice(KERNEL_NAMES)})")
            else:
                entries.append(self.rng.choice([f"({source},)", f"({source}, 'a', 'b')", f"({source}, 5)"]))
                wrong = True
        container = self.rng.choice(["[{}]", "({})", "(x for x in [{}])"]).format("".join(e + ", " for e in entries))
        if self.chance(0.1):
            container, wrong = self.rng.choice(["5", "None"]), True
        code = f"{dev.name}.compile_many({container})"
        self.call(code, "Device.compile_many", bind=self.fresh("_"), wrong_type=wrong, through=dev)

    def var_value(self, lo: int, hi: int, mutant: bool) -> Arg:
        if mutant:
            return self.rng.choice([str(self.rng.randint(1, 8)), "2**64", "0"]), False
        r = self.rng.random()
        if r < 0.6:
            return str(self.rng.randint(max(lo, 1), max(lo, min(hi, 64)))), False
        if r < 0.9:
            edges = [str(lo - 1), str(hi), str(hi + 1), "0", "-1", "2**31", "2**63", "2**64", "2**70", "-2**63 - 1"]
            return self.rng.choice(edges + ["True", "np.int64(3)", "np.uint64(2**63)"]), False
        return self.rng.choice(["1.5", "'8'", "None"]), True

    def launch_args(self, kernel: KernelRef) -> tuple[list[str], dict[str, str], bool]:
        """Buffers (names or other objects) and variables for a launch of `kernel`: mostly
        fitting, sometimes not, and whether any is of a wrong type."""
        devs = [d for d in self.devs if d.device == kernel.device and not d.closed] or self.devs
        buffers: list[str] = []
        wrong = False
        for _, dtype in kernel.params:
            r = self.rng.random()
            if r < 0.7:
                buffers.append(self.make_buf(self.rng.choice(devs), dtype, FIT).name)
            elif r < 0.9 and self.bufs:
                buffers.append(self.rng.choice(self.bufs).name)
            else:
                buffers.append(self.rng.choice(["np.zeros(8, 'float32')", "None", "3"]))
                wrong = True
        if buffers and self.chance(0.1):
            buffers.pop(self.rng.randrange(len(buffers)))
        elif self.chance(0.1) and self.bufs:
            buffers.append(self.rng.choice(self.bufs).name)
        variables: dict[str, str] = {}
        for var, lo, hi in kernel.vars:
            if self.chance(0.05):
                continue  # missing
            value, w = self.var_value(lo, hi, kernel.mutant)
            variables[var] = value
            wrong |= w
        if self.chance(0.08):
            variables[self.rng.choice(["m", "nope", "", "n ", "\\x00"])] = "1"
        return buffers, variables, wrong

    @staticmethod
    def dict_code(variables: dict[str, str]) -> str:
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in variables.items()) + "}"

    def op_launch(self) -> None:
        if not self.kernels:
            return
        kernel = self.rng.choice(self.kernels)
        buffers, variables, wrong = self.launch_args(kernel)
        r = self.rng.random()
        if r < 0.5:
            args = ", ".join(buffers + ([f"**{self.dict_code(variables)}"] if variables else []))
            self.call(f"{kernel.name}({args})", "Kernel.__call__", wrong_type=wrong)
        elif r < 0.9:
            seq = self.rng.choice(["[{}]", "({})", "iter([{}])"]).format("".join(b + ", " for b in buffers))
            extra = self.rng.choice(["", ", reinterpret=True", ", reinterpret=False"])
            code = f"{kernel.name}.launch({seq}, {self.dict_code(variables)}{extra})"
            self.call(code, "Kernel.launch", wrong_type=wrong)
        else:
            bad = self.rng.choice(["5", "[('n', 1)]", "{1: 2}"])  # vars that are not a Mapping[str, int]
            self.call(f"{kernel.name}.launch([{', '.join(buffers)}], {bad})", "Kernel.launch", wrong_type=True)
        if self.chance(0.3):
            attr = self.rng.choice(["name", "device", "var_names", "vars", "params", "outs", "source"])
            self.call(f"{kernel.name}.{attr}", f"Kernel.{attr}", bind=self.fresh("_"))

    # -- plans ----------------------------------------------------------------------------

    def op_plan(self) -> None:
        dev = self.a_dev()
        timeout = "" if self.chance(0.5) else f", timeout={self.rng.choice(TIMEOUTS)}"
        wrong = False
        if self.chance(0.05):
            timeout, wrong = ", timeout='1'", True
        name = self.fresh("p")
        if self.call(f"kiln.Plan({dev.name}{timeout})", "Plan", bind=name, wrong_type=wrong, through=dev).ok:
            self.plans.append(name)

    def a_plan(self) -> str:
        if not self.plans:
            self.op_plan()
            if not self.plans:
                raise Abandon
        return self.rng.choice(self.plans)

    def op_plan_record(self) -> None:
        plan = self.a_plan()
        if self.chance(0.6) and self.kernels:
            kernel = self.rng.choice(self.kernels)
            buffers, variables, wrong = self.launch_args(kernel)
            code = f"{plan}.launch({kernel.name}, [{', '.join(buffers)}], {self.dict_code(variables)})"
            self.call(code, "Plan.launch", bind=self.fresh("_"), wrong_type=wrong)
        elif self.bufs:
            dst, src = self.rng.choice(self.bufs).name, self.rng.choice(self.bufs).name
            wrong = False
            if self.chance(0.1):
                src, wrong = "np.zeros(4, 'float32')", True
            self.call(f"{plan}.copy({dst}, {src})", "Plan.copy", bind=self.fresh("_"), wrong_type=wrong)

    def op_plan_rebind(self) -> None:
        plan = self.a_plan()
        bindings = []
        wrong = False
        for _ in range(self.rng.randint(0, 3)):
            node = self.rng.choice(["0", "1", "2", "-1", "2**64", f"len({plan})"])
            slot = self.rng.choice(["0", "1", "2", "3", "-1", "2**64"])
            if self.bufs and self.chance(0.85):
                buf = self.rng.choice(self.bufs).name
            else:
                buf, wrong = "np.zeros(8)", True
            bindings.append(f"({node}, {slot}, {buf})")
        self.call(f"{plan}.rebind([{', '.join(bindings)}])", "Plan.rebind", wrong_type=wrong)

    def op_plan_run(self) -> None:
        plan = self.a_plan()
        names = self.call(f"{plan}.var_names", "Plan.var_names", bind=self.fresh("_"), valid=True)
        known: list[str] = list(names.value) if names.ok else []
        variables: dict[str, str] = {}
        for var in known:
            if self.chance(0.5):
                variables[var] = self.var_value(1, 16777216, mutant=False)[0]
        unknown = self.chance(0.15)
        if unknown:
            variables[self.rng.choice([v for v in ("m", "nope", "zz") if v not in known])] = "1"
        args = f"**{self.dict_code(variables)}" if variables else ""
        if self.chance(0.5):
            self.call(f"{plan}.run({args})", "Plan.run")
            return
        name = self.fresh("r")
        out = self.call(f"{plan}.run_async({args})", "Plan.run_async", bind=name)
        if out.ok:
            self.runs.append(RunRef(name))
            if unknown and names.ok:
                what = "accepted a variable the plan does not have (Plan.run refuses it)"
                self.report(Kind.INCONSISTENT, "Plan.run_async", "-", what, f"{name} = {plan}.run_async({args})")

    # -- saved plans ----------------------------------------------------------------------

    def a_shape(self, length: int, variables: list[str]) -> str:
        """A shape for `Plan.save`: mostly the buffer's length or a plan variable, sometimes
        dimensions that do not fit, unknown variables or wrong types."""
        r = self.rng.random()
        if r < 0.5:
            return f"[{length}]"
        if r < 0.7 and variables:
            return f"[{self.rng.choice(variables)!r}]"
        if r < 0.93:
            dims = [self.an_int()[0] if self.chance(0.7) else repr(self.rng.choice(variables + ["nope", ""]))
                    for _ in range(self.rng.randint(0, 3))]
            return f"[{', '.join(dims)}]"
        return self.rng.choice(["5", "None", "'n'", "[1.5]", "[None]"])

    def op_plan_save(self) -> None:
        plan = self.a_plan()
        names = self.call(f"{plan}.var_names", "Plan.var_names", bind=self.fresh("_"), valid=True)
        variables: list[str] = list(names.value) if names.ok else []
        entries: dict[str, list[str]] = {"inputs": [], "outputs": []}
        used: set[str] = set()
        for kind in entries:
            for _ in range(self.rng.randint(0 if self.chance(0.2) else 1, 2)):
                name = self.rng.choice(["'x'", "'y'", "'w'", "'z'"] if self.chance(0.9) else ["''", "'a b'", "'\\xf1'", "3"])
                if name in used:
                    continue
                used.add(name)
                if self.bufs and self.chance(0.95):
                    buf = self.rng.choice(self.bufs)
                    value = buf.name if self.chance(0.3) else f"({buf.name}, {self.a_shape(buf.length, variables)})"
                else:
                    value = self.rng.choice(["np.zeros(4)", "None", "(None, [1])"])
                entries[kind].append(f"{name}: {value}")
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="kiln-fuzz-plans-")
        path = self.let(repr(os.path.join(self.folder, f"p{next(self.counter)}.kplan")), "f")
        r = self.rng.random()
        target = path if r < 0.9 else self.rng.choice(["'/nonexistent/p.kplan'", repr(self.folder), "3", "None"])
        args = ", ".join(f"{kind}={{{', '.join(e)}}}" for kind, e in entries.items())
        out = self.call(f"{plan}.save({target}, {args})", "Plan.save", bind=self.fresh("_"), wrong_type=r >= 0.9)
        if out.ok and target == path:
            self.check(f"{out.value} == pathlib.Path({path}).stat().st_size", "Plan.save", "returned another size than the file's")
            self.plan_files.append(path)

    def op_load_plan(self) -> None:
        if not self.plan_files:
            self.op_plan_save()
            if not self.plan_files:
                return
        path = self.rng.choice(self.plan_files)
        r = self.rng.random()
        if r < 0.25:  # a damaged copy: cut short, or one byte changed
            size = os.path.getsize(self.ns[path])
            at = self.rng.randrange(max(size, 1))
            damaged = self.let(f"{path} + '.{next(self.counter)}'", "f")
            cut = f"raw[:{at}]" if self.chance(0.4) else f"raw[:{at}] + bytes([raw[{at}] ^ {1 << self.rng.randrange(8)}]) + raw[{at + 1}:]"
            self.run_line("python", f"raw = pathlib.Path({path}).read_bytes(); pathlib.Path({damaged}).write_bytes({cut})")
            path = damaged
        elif r < 0.3:
            path = self.rng.choice(["'/nonexistent/p.kplan'", "str(KERNELS)", "str(KERNELS / 'add.kiln')"])
        device = self.rng.choice([repr(d) for d in self.devices] + [d.name for d in self.devs] + DEVICE_NAMES_BAD[:4])
        options = ""
        wrong = False
        if self.chance(0.3):
            options += f", compiler={self.rng.choice(['None', repr('cc'), repr('llvm'), repr('nope'), '3'])}"
            wrong |= options.endswith("3")
        if self.chance(0.3):
            options += f", strict_bounds={self.rng.choice(['True', 'False', '1'])}"
            wrong |= options.endswith("1")  # an int for a bool
        if self.chance(0.3):
            options += f", map_constants={self.rng.choice(['True', 'False', 'None'])}"
            wrong |= options.endswith("None")
        if self.chance(0.05):
            path, wrong = self.rng.choice(["3", "None", "b'x'"]), True
        name = self.fresh("lp")
        if self.call(f"kiln.load_plan({path}, {device}{options})", "load_plan", bind=name, wrong_type=wrong).ok:
            self.loaded.append(name)
            for attr in ("inputs", "outputs", "variables", "device", "stats", "path"):
                self.call(f"{name}.{attr}", f"LoadedPlan.{attr}", bind=self.fresh("_"), valid=True)
            self.call(f"repr({name})", "LoadedPlan.__repr__", bind=self.fresh("_"), valid=True)

    def op_loaded_call(self) -> None:
        if not self.loaded:
            self.op_load_plan()
            if not self.loaded:
                return
        plan = self.rng.choice(self.loaded)
        specs = self.call(f"[(t.name, t.dtype, t.shape) for t in {plan}.inputs]", "LoadedPlan.inputs",
                          bind=self.fresh("_"), valid=True)
        if not specs.ok:
            return
        ranges = {v.name: (v.min, v.max) for v in self.ns[plan].variables}
        inputs: dict[str, str] = {}
        chosen: dict[str, int] = {}
        kiln_to_numpy = {k: n for n, k in NUMPY_TO_KILN.items()}
        for name, dtype, shape in specs.value:
            if self.chance(0.05):
                continue  # missing
            if self.chance(0.15):
                inputs[name] = self.an_array()[0]
                continue
            dims = []
            for d in shape:
                if isinstance(d, str):
                    lo, hi = ranges.get(d, (1, 1))
                    chosen.setdefault(d, self.rng.randint(max(lo, 1), max(lo, min(hi, 64))) if self.chance(0.9) else hi + 1)
                    dims.append(chosen[d])
                else:
                    dims.append(d if self.chance(0.95) else d + 1)
            np_dtype = kiln_to_numpy.get(dtype, "uint16") if self.chance(0.9) else self.rng.choice(NUMERIC)
            inputs[name] = self.let(f"(np.arange({int(np.prod(dims))}) % 5).astype({np_dtype!r}).reshape({tuple(dims)})", "a")
        if self.chance(0.1):
            inputs[self.rng.choice(["nope", "", "x "])] = "np.zeros(3, 'float32')"
        r = self.rng.random()
        if r < 0.4:
            code = f"{plan}({self.dict_code(inputs)})"
        elif r < 0.7 and all(n.isidentifier() for n in inputs):
            code = f"{plan}(**{self.dict_code(inputs)})"
        elif r < 0.95:
            variables = {v: self.var_value(*ranges[v], mutant=False)[0] for v in ranges if self.chance(0.3)}
            code = f"{plan}.run({self.dict_code(inputs)}, vars={self.dict_code(variables)})"
        else:
            code = f"{plan}({self.rng.choice(['[1, 2]', '3', 'None'])})"
        wrong = code.endswith("(3)") or code.endswith("([1, 2])") or "vars=" in code and ("1.5" in code or "'8'" in code or "None" in code)
        self.call(code, "LoadedPlan.__call__", bind=self.fresh("_"), wrong_type=wrong)

    def op_plan_wait(self) -> None:
        if not self.runs:
            return
        run = self.rng.choice(self.runs)
        if self.chance(0.3):
            self.call(f"{run.name}.done()", "PlanRun.done", bind=self.fresh("_"))
        else:
            self.wait(run)

    def wait(self, run: RunRef) -> None:
        """Waits for a run; every wait must end as the first did, and done() must then be True."""
        out = self.call(f"{run.name}.wait()", "PlanRun.wait")
        run.waits.append(None if out.ok else type(out.error))
        first, last = run.waits[0], run.waits[-1]
        if last is not first:
            what = f"wait() #{len(run.waits)} gave {_name(last)}, the first gave {_name(first)}"
            self.report(Kind.INCONSISTENT, "PlanRun.wait", _name(last), what, f"{run.name}.wait()")
        if out.ok:
            done = self.call(f"{run.name}.done()", "PlanRun.done", bind=self.fresh("_"), valid=True)
            if done.ok and done.value is not True:
                what = "done() is not True after wait() returned"
                self.report(Kind.INCONSISTENT, "PlanRun.done", "-", what, f"{run.name}.done()")

    # -- oracles: valid calls that must succeed, with results checked against numpy -------

    def oracle_device(self) -> DevRef:
        """A new handle of a random device, after a synchronize that takes up failures of
        earlier launches (reported by the next wait)."""
        dev = self.open_device(self.rng.choice(self.devices))
        if dev is None:
            raise Abandon
        self.call(f"{dev.name}.synchronize()", "Device.synchronize")
        return dev

    def f32_input(self, dev: DevRef, values: str) -> str:
        """A buffer holding the float32 array `values`, made one of several ways."""
        array = self.let(values, "a")
        name = self.fresh("b")
        r = self.rng.random()
        if r < 0.4:
            self.need(f"{dev.name}.from_numpy({array})", "Device.from_numpy", bind=name, valid=True)
        elif r < 0.6:
            self.need(f"kiln.from_dlpack({array}, {dev.name})", "kiln.from_dlpack", bind=name, valid=True)
        elif r < 0.8:
            self.need(f"{dev.name}.empty('f32', {array}.size)", "Device.empty", bind=name, valid=True)
            self.need(f"{name}.copy_from({array})", "Buffer.copy_from", valid=True)
        else:
            other = self.rng.choice(self.devices)
            staging = self.fresh("b")
            self.need(f"kiln.Device({other!r}).from_numpy({array})", "Device.from_numpy", bind=staging, valid=True)
            self.need(f"{dev.name}.empty('f32', {array}.size)", "Device.empty", bind=name, valid=True)
            self.need(f"{name}.copy_from({staging})", "Buffer.copy_from", valid=True)
        return name

    def padded(self, dev: DevRef, values: str, n: int) -> tuple[str, str, int]:
        """A view of `n` elements at a random offset into a buffer of `values` (float32 with
        at least `n` + 8 elements): (the whole buffer, the view, the offset)."""
        whole = self.f32_input(dev, values)
        offset = self.rng.choice([0, 0, 1, 5])
        view = self.fresh("b")
        self.need(f"{whole}.view({offset}, {n})", "Buffer.view", bind=view, valid=True)
        return whole, view, offset

    def oracle_roundtrip(self) -> None:
        """from_numpy / from_dlpack, numpy(), view, reinterpret and copy_from of a valid array
        give back its bytes."""
        dev = self.oracle_device()
        dt = self.rng.choice(NUMERIC)
        x = self.let(self.numeric_array(dt), "a")
        flat = self.let(f"np.ascontiguousarray({x}).ravel()", "a")
        array = self.ns[x]
        contiguous = array.flags.c_contiguous
        b = self.fresh("b")
        imported = self.chance(0.5)
        if imported:
            self.need(f"kiln.from_dlpack({x}, {dev.name})", "kiln.from_dlpack", bind=b, valid=contiguous)
        else:
            self.need(f"{dev.name}.from_numpy({x})", "Device.from_numpy", bind=b, valid=True)
        self.need(f"{b}.numpy()", "Buffer.numpy", bind=(got := self.fresh("_")), valid=True)
        same = f"{got}.tobytes() == {flat}.tobytes() and {got}.dtype == {flat}.dtype"
        self.check(same, "Buffer.numpy", f"numpy() of a {dt} buffer differs from the array")
        meta = self.fresh("_")
        self.need(f"({b}.dtype, len({b}), {b}.nbytes)", "Buffer.dtype", bind=meta, valid=True)
        want = f"({NUMPY_TO_KILN[dt]!r}, {flat}.size, {flat}.nbytes)"
        self.check(f"{meta} == {want}", "Buffer.dtype", "dtype, len or nbytes differ from the array's")
        size = array.size
        offset = self.rng.randint(0, size)
        length = self.rng.randint(0, size - offset)
        v = self.fresh("b")
        self.need(f"{b}.view({offset}, {length})", "Buffer.view", bind=v, valid=True)
        self.need(f"{v}.numpy()", "Buffer.numpy", bind=(got := self.fresh("_")), valid=True)
        same = f"{got}.tobytes() == {flat}[{offset}:{offset + length}].tobytes()"
        self.check(same, "Buffer.view", "a view's numpy() differs from the slice")
        self.need(f"{b}.reinterpret('u8').numpy()", "Buffer.reinterpret", bind=(got := self.fresh("_")), valid=True)
        same = f"{got}.tobytes() == {flat}.tobytes()"
        self.check(same, "Buffer.reinterpret", "reinterpret('u8') differs from the array's bytes")
        host = self.need(f"{b}.is_host", "Buffer.is_host", bind=self.fresh("_"), valid=True)
        if host:
            self.need(f"np.from_dlpack({b})", "Buffer.__dlpack__", bind=(got := self.fresh("_")), valid=True)
            same = f"{got}.tobytes() == {flat}.tobytes()"
            self.check(same, "Buffer.__dlpack__", "numpy.from_dlpack(buffer) differs from the array")
        shared = array.flags.c_contiguous and array.flags.writeable and array.flags.aligned and size > 0
        if imported and host and shared:  # from_dlpack promises to share such memory
            self.run_line("python", f"{x}.reshape(-1)[0] = 1")
            self.need(f"{b}.numpy()[0]", "Buffer.numpy", bind=(got := self.fresh("_")), valid=True)
            what = "a buffer imported from a writable host array is not a view of it"
            self.check(f"{got} == 1", "kiln.from_dlpack", what)
        y = self.let(f"(np.arange({size}) % 5 + 1).astype({dt!r})", "a")
        if self.chance(0.5):
            self.need(f"{b}.copy_from({y})", "Buffer.copy_from", valid=True)
        else:
            other = self.fresh("b")
            code = f"kiln.Device({self.rng.choice(self.devices)!r}).from_numpy({y})"
            self.need(code, "Device.from_numpy", bind=other, valid=True)
            self.need(f"{b}.copy_from({other})", "Buffer.copy_from", valid=True)
        self.need(f"{b}.numpy()", "Buffer.numpy", bind=(got := self.fresh("_")), valid=True)
        same = f"{got}.tobytes() == {y}.tobytes()"
        self.check(same, "Buffer.copy_from", "numpy() after copy_from differs from the source")

    def run_add(self, kernel: str, dev: DevRef, a: str, b: str, c: str, n: int, m: int) -> None:
        """Launches add over (a, b, c) with n = m, one of several ways."""
        how = self.rng.choice(["call", "launch", "reinterpret", "plan", "async"])
        if how == "call":
            self.need(f"{kernel}({a}, {b}, {c}, n={m})", "Kernel.__call__", valid=True)
        elif how == "launch":
            self.need(f"{kernel}.launch([{a}, {b}, {c}], {{'n': {m}}})", "Kernel.launch", valid=True)
        elif how == "reinterpret":
            u8 = ", ".join(f"{x}.reinterpret('u8')" for x in (a, b, c))
            self.need(f"{kernel}.launch([{u8}], {{'n': {m}}}, reinterpret=True)", "Kernel.launch", valid=True)
        else:
            plan, run = self.fresh("p"), self.fresh("r")
            self.need(f"kiln.Plan({dev.name})", "Plan", bind=plan, valid=True)
            self.need(f"{plan}.launch({kernel}, [{a}, {b}, {c}], {{'n': {n}}})", "Plan.launch", valid=True)
            if how == "plan":
                self.need(f"{plan}.run(n={m})", "Plan.run", valid=True)
            else:
                self.need(f"{plan}.run_async(n={m})", "Plan.run_async", bind=run, valid=True)
                self.need(f"{run}.wait()", "PlanRun.wait", valid=True)

    def oracle_add(self) -> None:
        """c = a + b over views at offsets; the rest of c's buffer stays as it was."""
        dev = self.oracle_device()
        kernel = self.fresh("k")
        self.need(f"{dev.name}.compile(KERNELS / 'add.kiln')", "Device.compile", bind=kernel, valid=True)
        n = self.rng.choice([1, 2, 3, 7, 8, 64, 100, 257, 1000, 4097])
        m = n if self.chance(0.7) else self.rng.randint(1, n)
        va, vb = (f"np.arange({n + 8}, dtype='float32') * {x}" for x in ("0.5 - 3", "-0.25 + 100"))
        _, a, pa = self.padded(dev, va, n)
        _, b, pb = self.padded(dev, vb, n)
        whole, c, pc = self.padded(dev, f"np.full({n + 8}, -7, dtype='float32')", n)
        self.run_add(kernel, dev, a, b, c, n, m)
        want = self.let(f"np.full({n + 8}, -7, dtype='float32')", "w")
        self.run_line("python", f"{want}[{pc}:{pc + m}] = ({va})[{pa}:{pa + m}] + ({vb})[{pb}:{pb + m}]")
        self.need(f"{whole}.numpy()", "Buffer.numpy", bind=(got := self.fresh("_")), valid=True)
        self.check(f"np.array_equal({got}, {want})", "add", f"add over n={m} differs from numpy")

    def oracle_sum(self) -> None:
        """out = sum(a[:m]) (integer values, so exact in f32), into a view of a bigger buffer."""
        dev = self.oracle_device()
        kernel = self.fresh("k")
        self.need(f"{dev.name}.compile(KERNELS / 'sum.kiln')", "Device.compile", bind=kernel, valid=True)
        n = self.rng.choice([1, 2, 5, 64, 1000, 4096, 65536])
        m = n if self.chance(0.7) else self.rng.randint(1, n)
        values = f"(np.arange({n + 8}) % 7 - 3).astype('float32')"
        _, a, pa = self.padded(dev, values, n)
        whole, out, po = self.padded(dev, "np.full(9, -7, dtype='float32')", 1)
        if self.chance(0.5):
            self.need(f"{kernel}({a}, {out}, n={m})", "Kernel.__call__", valid=True)
        else:
            plan = self.fresh("p")
            self.need(f"kiln.Plan({dev.name})", "Plan", bind=plan, valid=True)
            self.need(f"{plan}.launch({kernel}, [{a}, {out}], {{'n': {n}}})", "Plan.launch", valid=True)
            self.need(f"{plan}.run(n={m})", "Plan.run", valid=True)
        want = self.let("np.full(9, -7, dtype='float32')", "w")
        self.run_line("python", f"{want}[{po}] = {values}[{pa}:{pa + m}].sum()")
        self.need(f"{whole}.numpy()", "Buffer.numpy", bind=(got := self.fresh("_")), valid=True)
        self.check(f"np.array_equal({got}, {want})", "sum", f"sum over n={m} differs from numpy")

    def oracle_plan(self) -> None:
        """A plan of add, a copy of its output (and perhaps a zero-byte copy), run with a
        smaller n, then rebound to new inputs and run again."""
        dev = self.oracle_device()
        kernel, plan = self.fresh("k"), self.fresh("p")
        self.need(f"{dev.name}.compile(KERNELS / 'add.kiln')", "Device.compile", bind=kernel, valid=True)
        n = self.rng.choice([1, 3, 8, 100, 1000])
        m = self.rng.randint(1, n)
        a = self.f32_input(dev, f"np.arange({n}, dtype='float32')")
        b = self.f32_input(dev, f"np.full({n}, 2, dtype='float32')")
        c = self.f32_input(dev, f"np.full({n}, -7, dtype='float32')")
        d = self.make_buf(dev, "f32", n, valid=True).name
        self.need(f"kiln.Plan({dev.name})", "Plan", bind=plan, valid=True)
        self.need(f"{plan}.launch({kernel}, [{a}, {b}, {c}], {{'n': {n}}})", "Plan.launch", valid=True)
        self.need(f"{plan}.copy({d}, {c})", "Plan.copy", valid=True)
        if self.chance(0.3):
            empty = self.rng.choice([f"{dev.name}.empty('f32', 0)", f"{d}.view({n}, 0)"])
            self.need(f"{plan}.copy({empty}, {dev.name}.empty('f32', 0))", "Plan.copy", valid=True)
        if self.chance(0.5):
            self.need(f"{plan}.run(n={m})", "Plan.run", valid=True)
        else:
            run = self.fresh("r")
            self.need(f"{plan}.run_async(n={m})", "Plan.run_async", bind=run, valid=True)
            self.need(f"{run}.wait()", "PlanRun.wait", valid=True)
        self.need(f"{d}.numpy()", "Buffer.numpy", bind=(got := self.fresh("_")), valid=True)
        same = f"np.array_equal({got}[:{m}], np.arange({m}) + 2) and ({got}[{m}:] == -7).all()"
        self.check(same, "Plan.run", f"a plan of add then copy over n={m} differs from numpy")
        if self.chance(0.5):
            a2 = self.f32_input(dev, f"np.full({n}, 10, dtype='float32')")
            self.need(f"{plan}.rebind([(0, 0, {a2})])", "Plan.rebind", valid=True)
            self.need(f"{plan}.run()", "Plan.run", valid=True)
            self.need(f"{d}.numpy()", "Buffer.numpy", bind=(got := self.fresh("_")), valid=True)
            self.check(f"({got} == 12).all()", "Plan.rebind", f"a rebound plan over n={n} differs from numpy")


def _name(cls: Optional[type]) -> str:
    return "success" if cls is None else cls.__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


# ---------------------------------------------------------------------------------------
# Processes: the worker runs cases; the parent drives workers and reports.


def first_devices() -> dict[str, str]:
    """The first available device of each backend: {"CPU": "CPU", "OPENCL": "OPENCL", ...}."""
    found: dict[str, str] = {}
    for info in kiln.devices():
        backend = info.name.split(":")[0]
        if backend in BACKENDS and info.available and backend not in found:
            found[backend] = info.name
    return found


def configure_environment(scratch: str) -> None:
    """Settings for kiln in this process and its workers, unless already set: PoCL's and
    kiln's kernel caches in `scratch`, lavapipe without device selection, and a memory
    budget. kiln reads them when it opens a device."""
    os.environ.setdefault("POCL_CACHE_DIR", os.path.join(scratch, "pocl"))
    os.environ.setdefault("KILN_CACHE_DIR", os.path.join(scratch, "kiln"))
    os.environ.setdefault("NODEVICE_SELECT", "1")
    os.environ.setdefault("KILN_MEMORY_BUDGET", MEMORY_BUDGET)


def run_worker(devices: Sequence[str]) -> None:
    """Reads seeds from stdin and runs each case: CASE before it, STEP before each line,
    FINDING for each finding, DONE after it."""
    faulthandler.enable()  # a crash prints where it happened, for the parent's report
    policies = {name: kiln.Device(name).bounds_policy for name in devices}

    def step(op: str, line: str) -> None:
        print("STEP", json.dumps([op, line]), flush=True)

    print("READY", flush=True)
    for text in sys.stdin:
        seed = int(text)
        print(f"CASE {seed}", flush=True)
        try:
            findings = Case(seed, devices, before=step).run()
        except Exception as e:  # a bug of the fuzzer, not of kiln
            findings = [Finding(seed, Kind.INTERNAL, "fuzzer", type(e).__name__, str(e), "")]
        for finding in findings:
            print("FINDING", finding.to_json(), flush=True)
        for name, policy in policies.items():  # a case may have changed the shared device's policy
            try:
                kiln.Device(name).bounds_policy = policy
            except kiln.Error:
                pass
        print(f"DONE {seed}", flush=True)


class Worker:
    """A worker process, restarted after it dies or hangs, and the threads that read it."""

    STARTUP_TIMEOUT = 120.0
    EXIT_TIMEOUT = 30.0

    def __init__(self, devices: Sequence[str], timeout: float):
        self.devices, self.timeout = devices, timeout
        self.start()

    def start(self) -> None:
        command = [sys.executable, os.path.abspath(__file__), "--worker", "--devices", ",".join(self.devices)]
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen(command, stdin=pipe, stdout=pipe, stderr=pipe, text=True, bufsize=1)
        # Each process gets its own queue and deque: the threads of a killed one may still run.
        self.lines: queue.Queue[Optional[str]] = queue.Queue()
        self.stderr: collections.deque[str] = collections.deque(maxlen=30)
        threading.Thread(target=_pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self.stderr.extend, args=(self.proc.stderr,), daemon=True).start()
        line = self._next(time.monotonic() + self.STARTUP_TIMEOUT)
        if line != "READY":
            self.proc.kill()
            raise RuntimeError(f"the fuzz worker did not start ({line!r}):\n" + "".join(self.stderr))

    def _next(self, deadline: float) -> Optional[str]:
        """The next line of output (stripped); None at its end; raises queue.Empty when the
        deadline passes first."""
        line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        return None if line is None else line.rstrip("\n")

    def why(self) -> str:
        """The line of the worker's last words that says why it died."""
        time.sleep(0.2)  # for the stderr thread to catch up
        lines = [s.strip() for s in self.stderr if s.strip()]
        telling = [s for s in lines if re.search(r"Fatal Python error|panicked|fatal runtime error|abort", s)]
        return (telling or lines or [""])[0]

    def died(self) -> str:
        """How the worker ended: a signal's name or its exit status."""
        code = self.proc.wait()
        return signal.Signals(-code).name if code < 0 else f"exit status {code}"

    def run_case(self, seed: int) -> list[Finding]:
        """Runs one case; a worker that dies or hangs is a finding, and is replaced."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{seed}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died after the last case; reading says how
        findings: list[Finding] = []
        last_op, last_line = "", ""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                line = self._next(deadline)
            except queue.Empty:
                self.proc.kill()
                self.proc.wait()
                why = f"no result after {self.timeout:g} s"
                findings.append(Finding(seed, Kind.HANG, last_op, "hang", why, last_line))
                break
            if line is None:
                findings.append(Finding(seed, Kind.CRASH, last_op, self.died(), self.why(), last_line))
                break
            if line.startswith("STEP "):
                last_op, last_line = json.loads(line[5:])
            elif line.startswith("FINDING "):
                findings.append(Finding.from_json(line[8:]))
            elif line == f"DONE {seed}":
                return findings
        self.start()
        return findings

    def finish(self, seed: int) -> list[Finding]:
        """Ends the worker as a user's program ends; dying on the way out is a crash of the
        last case it ran (`seed`)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(self.EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return [Finding(seed, Kind.HANG, "exit", "hang", f"no exit after {self.EXIT_TIMEOUT:g} s", "")]
        if self.proc.returncode == 0:
            return []
        return [Finding(seed, Kind.CRASH, "exit", self.died(), self.why(), "")]


def _pump(stream: Any, lines: queue.Queue[Optional[str]]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_cases(seeds: Sequence[int], devices: Sequence[str], timeout: float, jobs: int) -> dict[int, list[Finding]]:
    """Runs the cases on `jobs` workers; returns each seed's findings."""
    results: dict[int, list[Finding]] = {}
    errors: list[BaseException] = []

    def drive(share: Sequence[int]) -> None:
        try:
            worker = Worker(devices, timeout)
            for seed in share:
                results[seed] = worker.run_case(seed)
            results[share[-1]] += worker.finish(share[-1])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(seeds[j::jobs],)) for j in range(jobs) if seeds[j::jobs]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def summarize(results: dict[int, list[Finding]], devices: Sequence[str]) -> int:
    """Prints the distinct notes, then the distinct findings, then the summary line; returns
    the number of cases with a finding."""
    groups: dict[tuple[str, str, str, str], list[Finding]] = collections.defaultdict(list)
    for seed in sorted(results):
        for finding in results[seed]:
            groups[finding.key()].append(finding)
    failed = sum(1 for fs in results.values() if any(not f.kind.is_note for f in fs))
    for notes in (True, False):
        keys = sorted(k for k, fs in groups.items() if fs[0].kind.is_note == notes)
        if not keys:
            continue
        print(f"\n{'notes' if notes else 'findings'} ({len(keys)} distinct):")
        for key in keys:
            fs = groups[key]
            seeds = sorted({f.seed for f in fs})
            first = fs[0]
            print(f"- [{first.kind.value}] {first.op}: {first.error}: {first.message[:300]}")
            more = " ..." if len(seeds) > 5 else ""
            print(f"    {len(seeds)} case(s), seed {', '.join(map(str, seeds[:5]))}{more}: {first.code[:300]}")
    if groups:
        print(f"\nreplay a case: python {os.path.relpath(__file__)} --replay SEED --devices {','.join(devices)}")
    passed = len(results) - failed
    print(f"{passed} passed, {failed} failed")
    return failed


def replay(seed: int, devices: Sequence[str]) -> int:
    """Runs one case in this process, printing it as a script with each call's outcome."""
    print("import pathlib, kiln, numpy as np")
    print(f"KERNELS = pathlib.Path({str(KERNELS)!r})")
    findings = Case(
        seed,
        devices,
        before=lambda op, line: print(line, flush=True),
        after=lambda op, outcome: print(f"#   -> {_short(outcome)}", flush=True),
    ).run()
    return summarize({seed: findings}, devices)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100, help="how many cases (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="the first case's seed; case i has seed + i")
    parser.add_argument(
        "--devices",
        type=lambda s: [d.strip() for d in s.split(",") if d.strip()],
        help="devices to fuzz, comma-separated (default: the first available device of each backend)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a case may run (default 30)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: one a core)")
    parser.add_argument("--replay", type=int, metavar="SEED", help="run one case in this process and print its calls")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker(args.devices)
        return 0
    with tempfile.TemporaryDirectory(prefix="kiln-fuzz-") as scratch:
        configure_environment(scratch)
        devices: list[str] = args.devices or list(first_devices().values())
        if args.replay is not None:
            return 1 if replay(args.replay, devices) else 0
        started = time.monotonic()
        seeds = list(range(args.seed, args.seed + args.cases))
        results = run_cases(seeds, devices, args.timeout, max(1, min(args.jobs, len(seeds))))
        print(f"{len(seeds)} cases on {', '.join(devices)} in {time.monotonic() - started:.1f} s")
        return 1 if summarize(results, devices) else 0


if __name__ == "__main__":
    sys.exit(main())
