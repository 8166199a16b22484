"""tinygrad's own functions that `kiln.tinygrad.compat` replaced, by the entry's target: what
kiln's replacements fall back to. It imports nothing, so every module of `kiln.tinygrad` can read
it whatever order the modules were imported in (one of them imported before tinygrad has
tinygrad's import apply the table while that module is still being imported)."""

from __future__ import annotations

from typing import Any

POOL = "tinygrad.codegen.opt.search:get_worker_pool"
HEURISTIC = "tinygrad.codegen.opt.heuristic:hand_coded_optimizations"
KERNEL_GRAPH = "tinygrad.schedule:get_kernel_graph"
GRAPH_SPLIT = "tinygrad.engine.jit:graph_split_rewrite"
LOWER_AND_COMPILE = "tinygrad.engine.realize:lower_and_compile"
TO_PROGRAM = "tinygrad.engine.realize:to_program"

# target -> tinygrad's function that kiln's replacement stands in front of
REPLACED: dict[str, Any] = {}


def tinygrad(target: str) -> Any:
    """tinygrad's own function at `target`, which kiln's replacement calls where the change does not
    apply."""
    return REPLACED[target]
