#!/usr/bin/env python3
"""Prints the import circles between the top-level modules of each crate under crates/, and
between the submodules of each module folder (`cache/disk.rs` and `cache/toolchain.rs`).

A module's references are the `crate::name` paths in its code (a `use` or an inline path),
outside comments and `#[cfg(test)]` modules, inline or in their own file (a test may build
its module's users). A path
through a name the crate root re-exports (`crate::Device`) counts as a reference to the
module it is re-exported from. Between top-level modules, submodules count as their top-level
module; within a module folder, a submodule's references to its siblings are its `super::name`
and `crate::folder::name` paths (a reference to the folder's own `mod.rs` is none: the parent
declares its children).

Usage: python3 tools/import_cycles.py [crate-dir ...]   (default: every crate under crates/)
Exit status 1 when any crate has a circle.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Moving to a crate of its own (kiln-cstyle); not part of the device layer's structure.
IGNORED = {"cstyle"}
PATH = re.compile(r"\bcrate::(\{|[A-Za-z_][A-Za-z0-9_]*)")
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
# A module file the crate root declares only for tests (`#[cfg(test)] mod testing;`).
TEST_FILE = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def strip_test_modules(text):
    out, pos = [], 0
    for m in TEST_MOD.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos:m.start()])
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        pos = i
    out.append(text[pos:])
    return "".join(out)


def code(path):
    return strip_test_modules(strip_comments(path.read_text(encoding="utf-8")))


def module_of(src, path):
    rel = path.relative_to(src).with_suffix("")
    parts = rel.parts
    return None if parts in (("lib",), ("main",)) else parts[0]


def reexports(lib_code, modules):
    """Names the crate root re-exports, mapped to the module they come from."""
    names = {}
    for m in re.finditer(r"pub\s+use\s+(\w+)::(\{[^}]*\}|\w+)\s*;", lib_code, flags=re.S):
        if m.group(1) in modules:
            for name in re.findall(r"\w+", m.group(2)):
                names[name] = m.group(1)
    return names


def first_segments(text, start):
    """The first path segment of each item of the `{...}` group opening at `start - 1`."""
    depth, item, names, i = 1, "", [], start
    while i < len(text) and depth:
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if depth == 1 and c == ",":
            names.append(item)
            item = ""
        elif depth >= 1 and not (depth == 1 and c == "}"):
            item += c
        i += 1
    names.append(item)
    return [m.group(1) for m in (re.match(r"\s*(\w+)", n) for n in names) if m]


def test_files_of(files):
    """The files declared only for tests: `#[cfg(test)] mod tests;` in `a/mod.rs` or `a.rs` is
    the file `a/tests.rs`."""
    out = set()
    for path in files:
        folder = path.parent if path.stem in ("mod", "lib", "main") else path.with_suffix("")
        for name in TEST_FILE.findall(strip_comments(path.read_text(encoding="utf-8"))):
            out |= {folder / f"{name}.rs", folder / name / "mod.rs"}
    return out


def edges(src):
    files = sorted(p for p in src.rglob("*.rs"))
    modules = {module_of(src, p) for p in files} - {None}
    lib = src / "lib.rs"
    roots = reexports(code(lib), modules) if lib.exists() else {}
    ignored = IGNORED | (set(TEST_FILE.findall(strip_comments(lib.read_text(encoding="utf-8")))) if lib.exists() else set())
    test_files = test_files_of(files)
    graph = {m: set() for m in modules - ignored}
    for path in files:
        here = module_of(src, path)
        if here is None or here in ignored or path in test_files:
            continue
        text = code(path)
        for m in PATH.finditer(text):
            names = first_segments(text, m.end()) if m.group(1) == "{" else [m.group(1)]
            for name in names:
                target = name if name in modules else roots.get(name)
                if target and target != here and target not in ignored:
                    graph[here].add(target)
    return graph


def sibling_edges(src):
    """For each module folder under `src` (by its path, `cache`), its submodules' references to
    each other."""
    files = sorted(p for p in src.rglob("*.rs"))
    skip = test_files_of(files)
    out = {}
    for folder in sorted(p for p in src.rglob("*") if p.is_dir() and p.relative_to(src).parts[0] not in IGNORED):
        children = {p.stem: [p] for p in folder.glob("*.rs") if p.stem != "mod" and p not in skip}
        children |= {p.name: [f for f in sorted(p.rglob("*.rs")) if f not in skip] for p in folder.iterdir()
                     if p.is_dir() and (p / "mod.rs").exists() and p / "mod.rs" not in skip}
        if len(children) < 2:
            continue
        prefix = "::".join(folder.relative_to(src).parts)
        refs = re.compile(rf"\b(?:crate::{prefix}|super)::(\{{|[A-Za-z_][A-Za-z0-9_]*)")
        graph = {c: set() for c in children}
        for child, paths in children.items():
            for path in paths:
                text = code(path)
                # `super` means the folder only in the child's own file (or a child folder's mod.rs)
                pattern = refs if path.parent == folder or path.name == "mod.rs" and path.parent.parent == folder else \
                    re.compile(rf"\bcrate::{prefix}::(\{{|[A-Za-z_][A-Za-z0-9_]*)")
                for m in pattern.finditer(text):
                    names = first_segments(text, m.end()) if m.group(1) == "{" else [m.group(1)]
                    graph[child] |= {n for n in names if n in children and n != child}
        out[prefix] = graph
    return out


def cycles(graph):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main(args):
    crates = [Path(a).resolve() for a in args] or sorted(p for p in (ROOT / "crates").iterdir() if (p / "src").is_dir())
    found = False
    for crate in crates:
        graph = edges(crate / "src")
        circles = cycles(graph)
        name = crate.name
        if not circles:
            print(f"{name}: no import circles ({len(graph)} modules)")
        for comp in circles:
            found = True
            links = ", ".join(f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp)
            print(f"{name}: circle of {len(comp)} modules: {' '.join(comp)} ({links})")
        for folder, sub in sibling_edges(crate / "src").items():
            for comp in cycles(sub):
                found = True
                links = ", ".join(f"{a} -> {b}" for a in comp for b in sorted(sub[a]) if b in comp)
                print(f"{name}: circle of {len(comp)} submodules of {folder}: {' '.join(comp)} ({links})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
