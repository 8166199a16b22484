"""tinygrad's linearized UOps as kiln kernel text.

`Converter` walks one linear UOp list (what tinygrad's own C renderer walks) in order and builds
a kiln graph: tinygrad's register accumulators (a BUFFER in REG memory, stored before a loop and
reloaded through AFTER) become DEFINE_ACC / ASSIGN / valued END, gated INDEX/LOAD and IF-guarded
stores become gated LOAD and STORE, SHRINK (a float4 access) becomes an INDEX of a vector
pointer, local memory becomes DEFINE_LOCAL / BARRIER / AFTER, and `core_id` becomes a SPECIAL
launch index. `render` prints the graph in kiln's text format (README.md, "The text format").

The same converter serves the KILN device (`kiln.tinygrad.device`) and the corpus exporter
(tools/tinygrad_corpus.py). A construct it does not translate raises `Unsupported`, naming it.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Optional, Union

from tinygrad.dtype import AddrSpace, DType, dtypes
from tinygrad.uop.ops import Ops, UOp

# ---------------------------------------------------------------------------------------------
# kiln graph: hash-consed nodes, as kiln interns them
# ---------------------------------------------------------------------------------------------

ArgT = Union[None, int, float, bool, str, tuple[str, int, int]]


class K:
    """One kiln node. Nodes are interned (`Graph.node`), so identity is structural equality."""

    __slots__ = ("op", "dtype", "arg", "src")

    def __init__(self, op: str, dtype: str, arg: ArgT, src: tuple[K, ...]):
        self.op, self.dtype, self.arg, self.src = op, dtype, arg, src

    @property
    def is_ptr(self) -> bool:
        return self.dtype.startswith(("ptr<", "lptr<"))

    def __repr__(self) -> str:
        return f"K({self.op} {self.dtype} {self.arg!r})"


class Graph:
    def __init__(self) -> None:
        self._interned: dict[tuple[object, ...], K] = {}

    def node(self, op: str, dtype: str, arg: ArgT = None, src: Iterable[K] = ()) -> K:
        srcs = tuple(src)
        key = (op, dtype, type(arg).__name__, repr(arg), tuple(id(s) for s in srcs))
        if (n := self._interned.get(key)) is None:
            n = self._interned[key] = K(op, dtype, arg, srcs)
        return n

    def const(self, dtype: str, value: Union[int, float, bool]) -> K:
        scalar, width = split_dtype(dtype)
        c = self.node("CONST", scalar, normalize_const(scalar, value))
        return c if width == 1 else self.node("VECTORIZE", dtype, None, [c] * width)


class Unsupported(Exception):
    """A kernel the converter does not translate; the message is the reason in the summary."""


FLOATS = {"f16", "bf16", "f32", "f64"}
INT_BITS = {"i8": 8, "i16": 16, "i32": 32, "i64": 64, "u8": 8, "u16": 16, "u32": 32, "u64": 64}


def split_dtype(dt: str) -> tuple[str, int]:
    """`f32x4` -> ("f32", 4); `ptr<f32x4>` -> ("f32", 4)."""
    inner = dt[dt.index("<") + 1 : -1] if "<" in dt else dt
    m = re.fullmatch(r"([a-z]+\d*)x(\d+)", inner)
    return (m.group(1), int(m.group(2))) if m else (inner, 1)


def vec(scalar: str, width: int) -> str:
    return scalar if width == 1 else f"{scalar}x{width}"


def normalize_const(scalar: str, value: Union[int, float, bool]) -> Union[int, float, bool]:
    if scalar == "bool":
        return bool(value)
    if scalar in FLOATS:
        return float(value)
    bits = INT_BITS[scalar]
    v = int(value)
    if scalar.startswith("i"):
        v = (v + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))
    else:
        v %= 1 << bits
    return v


def kiln_scalar(dt: DType) -> str:
    table = {
        dtypes.bool: "bool", dtypes.int8: "i8", dtypes.int16: "i16", dtypes.int32: "i32", dtypes.int64: "i64",
        dtypes.uint8: "u8", dtypes.uint16: "u16", dtypes.uint32: "u32", dtypes.uint64: "u64",
        dtypes.float16: "f16", dtypes.bfloat16: "bf16", dtypes.float32: "f32", dtypes.float64: "f64",
        dtypes.weakint: "i32", dtypes.weakfloat: "f32",
    }
    base = dt.scalar() if hasattr(dt, "scalar") else dt
    if base not in table:
        raise Unsupported(f"dtype {dt}")
    return table[base]


def width_of(u: UOp) -> int:
    try:
        shape = u.shape
    except Exception:
        return 1
    return int(math.prod(int(s) for s in shape)) if shape else 1


def const_value(u: UOp) -> Optional[Union[int, float, bool]]:
    """The Python value of a (casted) scalar constant, else None."""
    if u.op is Ops.CAST and u.src[0].op is Ops.CONST:
        u = u.src[0]
    if u.op is Ops.CONST and isinstance(u.arg, (int, float, bool)):
        return u.arg
    return None


# ---------------------------------------------------------------------------------------------
# tinygrad linear UOps -> kiln graph
# ---------------------------------------------------------------------------------------------

# Ops.MAX is left out on purpose: tinygrad then decomposes it as for its own C renderers
# (`a < b ? b : a`), so NaN and the sign of zero come out as on DEV=CPU; kiln's MAX is fmax,
# which drops a NaN (`max()` of a tensor holding NaN gave inf).
ALU = {
    Ops.ADD: "ADD", Ops.SUB: "SUB", Ops.MUL: "MUL", Ops.CDIV: "IDIV", Ops.CMOD: "MOD", Ops.FDIV: "DIV",
    Ops.SHL: "SHL", Ops.SHR: "SHR", Ops.AND: "AND", Ops.OR: "OR", Ops.XOR: "XOR",
    Ops.POW: "POW", Ops.CMPLT: "CMPLT", Ops.CMPNE: "CMPNE", Ops.CMPEQ: "CMPEQ", Ops.WHERE: "WHERE",
    Ops.MULACC: "MULACC", Ops.NEG: "NEG", Ops.RECIPROCAL: "RECIP", Ops.EXP2: "EXP2", Ops.LOG2: "LOG2",
    Ops.SIN: "SIN", Ops.SQRT: "SQRT", Ops.TRUNC: "TRUNC",
}
COMPARISONS = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ}


@dataclass
class Lit:
    """A constant not yet given a kiln node: tinygrad writes `CAST(dtype, CONST weakint)`, and
    the node is made in the cast's dtype when an operation uses it."""

    value: Union[int, float, bool]
    dtype: str


@dataclass
class RegBuf:
    """A BUFFER in REG memory: `size` scalar registers, each converted on its own."""

    uop: UOp
    scalar: str
    size: int


@dataclass
class RegRef:
    """Registers `first .. first + width` of a RegBuf (an INDEX or SHRINK into it)."""

    buf: RegBuf
    first: int
    width: int


@dataclass
class Group:
    """A GROUP: the kiln nodes of its operands (stores), for the AFTERs and BARRIERs that use it."""

    nodes: list[K]


@dataclass
class Frame:
    """An open loop while walking the linear list: its kiln RANGE, its side effects (stores,
    inner ENDs, barriers) for its void END, and the registers it carries as accumulators."""

    range: Optional[K]
    effects: list[K] = field(default_factory=list)
    carried: dict[tuple[int, int], K] = field(default_factory=dict)


RegKey = tuple[int, int]  # (the BUFFER's position in the linear list, register number)


class Converter:
    """Converts one linear UOp list (a tinygrad PROGRAM's LINEAR) to a kiln graph, walking it in
    order. Loops are tracked as a stack of frames; registers are values in `regval` that a loop
    turns into accumulators where it carries them (see `prepass`)."""

    def __init__(self, lin: list[UOp]):
        self.lin = lin
        self.g = Graph()
        self.m: dict[UOp, object] = {}
        self.regval: dict[RegKey, K] = {}
        self.reg_scalar: dict[RegKey, str] = {}
        self.frames: list[Frame] = [Frame(None)]
        self.ifs: list[K] = []
        self.next_axis = 0
        self.next_acc = 0
        self.next_local = 0
        self.buffer_slots: dict[int, int] = {}
        self.carried_at: dict[UOp, list[RegKey]] = {}
        self.pos: dict[UOp, int] = {u: i for i, u in enumerate(lin)}

    # -- pre-pass: which registers each loop carries ------------------------------------------

    def reg_keys(self, ptr: UOp) -> Optional[list[RegKey]]:
        if ptr.op not in (Ops.INDEX, Ops.SHRINK) or len(ptr.src) < 2:
            return None
        base = ptr.src[0]
        while base.op is Ops.AFTER:
            base = base.src[0]
        if base.op is not Ops.BUFFER or base.arg.addrspace != AddrSpace.REG:
            return None
        first = const_value(ptr.src[1])
        if not isinstance(first, int):
            raise Unsupported("register indexed by a non-constant")
        width = 1
        if ptr.op is Ops.SHRINK:
            w = const_value(ptr.src[2])
            if not isinstance(w, int):
                raise Unsupported("register SHRINK of a non-constant width")
            width = w
        keys = [(self.pos[base], first + k) for k in range(width)]
        for k in keys:
            self.reg_scalar[k] = kiln_scalar(base.dtype)
        return keys

    def prepass(self) -> None:
        """Decides which registers each loop carries: those it stores and either reads before
        its first store in the body (a reduction) or that are read after the loop before being
        written again (the last iteration's value). They become DEFINE_ACC at the RANGE and
        ASSIGN + valued END at the END; every other register is a plain value."""
        access: list[tuple[int, str, RegKey]] = []
        start: dict[UOp, int] = {}
        spans: list[tuple[UOp, int, int]] = []
        for i, u in enumerate(self.lin):
            if u.op is Ops.RANGE:
                start[u] = i
            elif u.op is Ops.END:
                for r in u.src[1:]:
                    if r.op is Ops.RANGE:
                        spans.append((r, start[r], i))
            elif u.op in (Ops.LOAD, Ops.STORE):
                keys = self.reg_keys(u.src[0])
                for k in keys or []:
                    access.append((i, "load" if u.op is Ops.LOAD else "store", k))
        by_key: dict[RegKey, list[tuple[int, str]]] = defaultdict(list)
        for i, kind, k in access:
            by_key[k].append((i, kind))
        for r, s, e in spans:
            carried: list[RegKey] = []
            for k, acc in by_key.items():
                inside = [(i, kind) for i, kind in acc if s < i < e]
                if not any(kind == "store" for _, kind in inside):
                    continue
                after = [kind for i, kind in acc if i > e]
                if inside[0][1] == "load" or (after and after[0] == "load"):
                    carried.append(k)
            self.carried_at[r] = sorted(carried)

    # -- helpers ---------------------------------------------------------------------------------

    def val(self, u: UOp) -> K:
        v = self.m.get(u)
        if isinstance(v, K):
            return v
        if isinstance(v, Lit):
            return self.g.const(v.dtype, v.value)
        raise Unsupported(f"{u.op.name} used as a value")

    def dtype_of(self, u: UOp) -> str:
        return vec(kiln_scalar(u.dtype), width_of(u))

    def i32(self, v: int) -> K:
        return self.g.const("i32", v)

    def if_gate(self, gate: Optional[K]) -> Optional[K]:
        for c in self.ifs:
            gate = c if gate is None else self.g.node("AND", "bool", None, [gate, c])
        return gate

    def deps(self, srcs: Iterable[UOp]) -> list[K]:
        """The kiln nodes an AFTER, BARRIER or GROUP orders on (groups flattened, registers left out)."""
        out: list[K] = []
        for s in srcs:
            d = self.m.get(s)
            for k in d.nodes if isinstance(d, Group) else [d]:
                if isinstance(k, K) and k not in out:
                    out.append(k)
        return out

    def extent(self, u: UOp) -> K:
        k = self.val(u)
        if k.dtype != "i32":
            raise Unsupported(f"extent of dtype {k.dtype}")
        return k

    # -- the walk ------------------------------------------------------------------------------

    def convert(self) -> K:
        self.prepass()
        slots = sorted({u.arg.slot for u in self.lin if u.op is Ops.PARAM and u.arg.addrspace != AddrSpace.ALU})
        self.buffer_slots = {s: i for i, s in enumerate(slots)}
        sink: Optional[K] = None
        for u in self.lin:
            sink = self.step(u) or sink
        if sink is None:
            raise Unsupported("no SINK")
        return sink

    def step(self, u: UOp) -> Optional[K]:
        g, op = self.g, u.op
        if op is Ops.CONST:
            if not isinstance(u.arg, (int, float, bool)):
                raise Unsupported(f"CONST {u.arg!r}")
            self.m[u] = Lit(u.arg, self.dtype_of(u))
        elif op is Ops.CAST:
            src = self.m.get(u.src[0])
            dt = self.dtype_of(u)
            if isinstance(src, Lit):
                self.m[u] = Lit(src.value, dt)
            elif isinstance(src, K) and src.is_ptr:
                self.m[u] = src
            else:
                x = self.val(u.src[0])
                self.m[u] = x if x.dtype == dt else g.node("CAST", dt, None, [x])
        elif op is Ops.BITCAST:
            self.m[u] = g.node("BITCAST", self.dtype_of(u), None, [self.val(u.src[0])])
        elif op is Ops.PARAM:
            self.param(u)
        elif op is Ops.BUFFER:
            size = const_value(u.src[0])
            if not isinstance(size, int):
                raise Unsupported("BUFFER of a non-constant size")
            space = u.arg.addrspace
            if space == AddrSpace.REG:
                self.m[u] = RegBuf(u, kiln_scalar(u.dtype), size)
            elif space == AddrSpace.LOCAL:
                self.m[u] = g.node("DEFINE_LOCAL", f"lptr<{kiln_scalar(u.dtype)}>", self.next_local, [self.i32(size)])
                self.next_local += 1
            else:
                raise Unsupported(f"BUFFER in {space}")
        elif op is Ops.SPECIAL:
            self.m[u] = g.node("SPECIAL", "i32", str(u.arg), [self.extent(u.src[0])])
        elif op is Ops.RANGE:
            self.open_range(u)
        elif op is Ops.END:
            return self.close_ranges(u)
        elif op is Ops.AFTER:
            self.after(u)
        elif op in (Ops.INDEX, Ops.SHRINK):
            self.index(u)
        elif op is Ops.LOAD:
            self.load(u)
        elif op is Ops.STORE:
            self.store(u)
        elif op is Ops.STACK:
            if not u.src:
                self.m[u] = None
            else:
                lanes = [self.val(s) for s in u.src]
                if any(x.is_ptr for x in lanes):
                    raise Unsupported("vector of pointers")
                self.m[u] = g.node("VECTORIZE", vec(lanes[0].dtype, len(lanes)), None, lanes)
        elif op is Ops.GROUP:
            self.m[u] = Group(self.deps(u.src))
        elif op is Ops.BARRIER:
            deps = self.deps(u.src)
            if not deps:
                raise Unsupported("BARRIER without kiln operands")
            b = g.node("BARRIER", "void", None, deps)
            self.frames[-1].effects.append(b)
            self.m[u] = b
        elif op is Ops.IF:
            self.ifs.append(self.val(u.src[0]))
            self.m[u] = None
        elif op is Ops.ENDIF:
            self.ifs.pop()
            self.m[u] = None
        elif op is Ops.SINK:
            if len(self.frames) != 1:
                raise Unsupported("unclosed loop at SINK")
            effects = self.frames[0].effects
            if not effects:
                raise Unsupported("kernel without stores")
            return g.node("SINK", "void", None, effects)
        elif op is Ops.WMMA:
            # tinygrad's arg: (name, (N, M, K), dtype_in, dtype_out, device, threads, upcasts, reduces)
            (n, m, k), dtype_in, dtype_out, threads = u.arg[1], u.arg[2], u.arg[3], u.arg[5]
            form = f"m{m}n{n}k{k} {kiln_scalar(dtype_in)} {kiln_scalar(dtype_out)} threads {threads}"
            self.m[u] = g.node("WMMA", self.dtype_of(u), form, [self.val(s) for s in u.src])
        elif op in ALU:
            srcs = [self.val(s) for s in u.src]
            if op in COMPARISONS:
                dt = vec("bool", split_dtype(srcs[0].dtype)[1])
            else:
                dt = self.dtype_of(u)
            self.m[u] = g.node(ALU[op], dt, None, srcs)
        else:
            raise Unsupported(f"op {op.name}")
        return None

    def param(self, u: UOp) -> None:
        g = self.g
        if u.arg.addrspace == AddrSpace.ALU:
            lo, hi = (int(x) for x in u.arg.vmin_vmax)
            if u.arg.name == "core_id":
                self.m[u] = g.node("SPECIAL", "i32", "core_id", [self.i32(hi + 1)])
            else:
                self.m[u] = g.node("DEFINE_VAR", kiln_scalar(u.dtype), (u.arg.name, lo, hi))
            return
        size = self.m.get(u.src[0])
        if isinstance(size, Lit):
            length = self.i32(int(size.value))
        else:
            length = self.val(u.src[0])
        self.m[u] = g.node("PARAM", f"ptr<{kiln_scalar(u.dtype)}>", self.buffer_slots[u.arg.slot], [length])

    def open_range(self, u: UOp) -> None:
        r = self.g.node("RANGE", "i32", self.next_axis, [self.extent(u.src[0])])
        self.next_axis += 1
        self.m[u] = r
        frame = Frame(r)
        for k in self.carried_at.get(u, []):
            scalar = self.reg_scalar.get(k)
            init = self.regval.get(k)
            if init is None:  # read before tinygrad ever wrote it: any value will do
                scalar = scalar or "i32"
                init = self.g.const(scalar, 0)
            acc = self.g.node("DEFINE_ACC", init.dtype, self.next_acc, [init, r])
            self.next_acc += 1
            frame.carried[k] = acc
            self.regval[k] = acc
        self.frames.append(frame)

    def close_ranges(self, u: UOp) -> Optional[K]:
        ranges = [self.m[r] for r in u.src[1:] if r.op is Ops.RANGE]
        last: Optional[K] = None
        while ranges:
            frame = self.frames.pop()
            if frame.range is None or frame.range not in ranges:
                raise Unsupported("END closes a loop that is not the innermost")
            ranges.remove(frame.range)
            for k, acc in frame.carried.items():
                assign = self.g.node("ASSIGN", acc.dtype, None, [acc, self.regval[k]])
                self.regval[k] = self.g.node("END", acc.dtype, None, [frame.range, assign])
            if frame.effects:
                last = self.g.node("END", "void", None, [frame.range, *frame.effects])
                self.frames[-1].effects.append(last)
        self.m[u] = last
        return None

    def after(self, u: UOp) -> None:
        base = self.m.get(u.src[0])
        if isinstance(base, RegBuf):
            self.m[u] = base
            return
        if not (isinstance(base, K) and base.is_ptr):
            raise Unsupported(f"AFTER of {u.src[0].op.name}")
        deps = [d for d in self.deps(u.src[1:]) if d.dtype == "void" or d.op == "RANGE"]
        self.m[u] = self.g.node("AFTER", base.dtype, None, [base, *deps]) if deps else base

    def index(self, u: UOp) -> None:
        base = self.m.get(u.src[0])
        if len(u.src) != (3 if u.op is Ops.SHRINK else 2):
            raise Unsupported(f"{u.op.name} with {len(u.src)} operands")
        width = 1
        if u.op is Ops.SHRINK:
            w = const_value(u.src[2])
            if not isinstance(w, int):
                raise Unsupported("SHRINK of a non-constant width")
            width = w
        if isinstance(base, RegBuf):
            first = const_value(u.src[1])
            if not isinstance(first, int) or first + width > base.size or first < 0:
                raise Unsupported("register access out of its buffer")
            self.m[u] = RegRef(base, first, width)
            return
        if isinstance(base, K) and base.is_ptr:
            scalar, bw = split_dtype(base.dtype)
            if bw != 1:
                raise Unsupported("INDEX of a vector pointer")
            space = "lptr" if base.dtype.startswith("lptr") else "ptr"
            self.m[u] = self.g.node("INDEX", f"{space}<{vec(scalar, width)}>", None, [base, self.val(u.src[1])])
            return
        if isinstance(base, K) and u.op is Ops.INDEX:
            lane = const_value(u.src[1])
            scalar, bw = split_dtype(base.dtype)
            if not isinstance(lane, int) or bw == 1:
                raise Unsupported("INDEX into a value with a non-constant lane")
            self.m[u] = self.g.node("GEP", scalar, lane, [base])
            return
        raise Unsupported(f"{u.op.name} of {u.src[0].op.name}")

    def load(self, u: UOp) -> None:
        ptr = self.m.get(u.src[0])
        if isinstance(ptr, RegRef):
            lanes = []
            for k in range(ptr.width):
                key = (self.pos[ptr.buf.uop], ptr.first + k)
                self.reg_scalar[key] = ptr.buf.scalar
                lanes.append(self.regval.get(key) or self.g.const(ptr.buf.scalar, 0))
            self.m[u] = lanes[0] if ptr.width == 1 else self.g.node("VECTORIZE", vec(ptr.buf.scalar, ptr.width), None, lanes)
            return
        if not (isinstance(ptr, K) and ptr.is_ptr):
            raise Unsupported(f"LOAD through {u.src[0].op.name}")
        scalar, width = split_dtype(ptr.dtype)
        dt = vec(scalar, width)
        gate: Optional[K] = None
        alt: Optional[K] = None
        if len(u.src) >= 3:
            alt, gate = self.val(u.src[1]), self.val(u.src[2])
            if alt.dtype != dt:
                raise Unsupported(f"gated load alternative {alt.dtype} for {dt}")
        elif len(u.src) != 1:
            raise Unsupported(f"LOAD with {len(u.src)} operands")
        gate = self.if_gate(gate)
        if gate is None:
            self.m[u] = self.g.node("LOAD", dt, None, [ptr])
        else:
            if gate.dtype != "bool":
                raise Unsupported(f"gate of dtype {gate.dtype}")
            self.m[u] = self.g.node("LOAD", dt, None, [ptr, alt or self.g.const(dt, 0), gate])

    def store(self, u: UOp) -> None:
        ptr = self.m.get(u.src[0])
        if isinstance(ptr, RegRef):
            value = self.val(u.src[1])
            for k in range(ptr.width):
                key = (self.pos[ptr.buf.uop], ptr.first + k)
                self.reg_scalar[key] = ptr.buf.scalar
                lane = value if ptr.width == 1 else self.g.node("GEP", ptr.buf.scalar, k, [value])
                if lane.dtype != ptr.buf.scalar:
                    raise Unsupported(f"register store of {lane.dtype} into {ptr.buf.scalar}")
                self.regval[key] = lane
            self.m[u] = None
            return
        if not (isinstance(ptr, K) and ptr.is_ptr):
            raise Unsupported(f"STORE through {u.src[0].op.name}")
        value = self.val(u.src[1])
        scalar, width = split_dtype(ptr.dtype)
        if value.dtype != vec(scalar, width):
            raise Unsupported(f"store of {value.dtype} through {ptr.dtype}")
        gate = self.val(u.src[2]) if len(u.src) >= 3 else None
        gate = self.if_gate(gate)
        st = self.g.node("STORE", "void", None, [ptr, value] + ([gate] if gate is not None else []))
        self.frames[-1].effects.append(st)
        self.m[u] = st


def toposort(root: K) -> list[K]:
    order: list[K] = []
    seen: set[int] = set()
    stack: list[tuple[K, bool]] = [(root, False)]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        for s in reversed(n.src):
            if id(s) not in seen:
                stack.append((s, False))
    return order


def fmt_arg(n: K) -> str:
    a = n.arg
    if n.op == "CONST":
        if isinstance(a, bool):
            return "true" if a else "false"
        if isinstance(a, float):
            if math.isnan(a):
                return "nan"
            if math.isinf(a):
                return "inf" if a > 0 else "-inf"
            r = repr(a)
            return r if ("." in r or "e" in r) else r + ".0"
        return str(a)
    if n.op == "DEFINE_VAR":
        name, lo, hi = var_arg(n)
        return f'"{name}" {lo} {hi}'
    if n.op == "SPECIAL":
        return f'"{a}"'
    return "" if a is None else str(a)


def render(root: K, header: list[str]) -> str:
    order = toposort(root)
    names = {id(n): f"%{i}" for i, n in enumerate(order)}
    lines = ["# kiln kernel v1"] + [f"# {h}" for h in header]
    for n in order:
        arg = fmt_arg(n)
        srcs = f" ({', '.join(names[id(s)] for s in n.src)})" if n.src else ""
        head = "" if n is root else f"{names[id(n)]} = "
        lines.append(f"{head}{n.op} {n.dtype}{' ' + arg if arg else ''}{srcs}")
    return "\n".join(lines) + "\n"


def var_arg(n: K) -> tuple[str, int, int]:
    """A DEFINE_VAR's (name, min, max)."""
    assert isinstance(n.arg, tuple), n
    return n.arg
