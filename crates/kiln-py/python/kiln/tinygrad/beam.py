"""BEAM search on kiln: each round's candidates compile together, through `Device.compile_many`.

tinygrad's `beam_search` (`tinygrad.codegen.opt.search`) hands each round's candidates to its
worker pool (`get_worker_pool`: processes when `PARALLEL` > 0, else a plain `map` here), which
renders and compiles them one at a time, then times the ones that compiled. kiln compiles a batch
on all cores in one call, so `install` gives `beam_search` a pool that, for a round of kiln
candidates, renders them all here with their compiles held back, compiles the distinct kernels
with one `compile_many` (they stay in kiln's kernel cache, where loading them for timing finds
them) and drops the candidates whose kernel does not compile, as tinygrad drops a candidate that
fails to compile. Rounds of other renderers, and every other user of the pool, keep tinygrad's.
`kiln.tinygrad.compat.PATCHES` puts this pool in place of `get_worker_pool` in the search module.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from tinygrad.codegen.opt import search

from . import originals



class KilnBeamPool:
    """The pool `beam_search` gets: batches rounds of kiln candidates, passes others on to
    tinygrad's pool (opened only if needed) or, without one (`PARALLEL=0`), to `map`."""

    def imap_unordered(self, fn: Callable, items: Iterable[tuple[int, Any]]) -> Iterable[tuple[int, Optional[tuple]]]:
        from .device import KilnRenderer  # not at import: the device module imports `compat`, which imports this

        items = list(items)
        if fn is not search._try_compile or not items or not all(isinstance(s.ren, KilnRenderer) for _, s in items):
            pool = originals.tinygrad(originals.POOL)()
            return map(fn, items) if pool is None else pool.imap_unordered(fn, items)
        compiler = items[0][1].ren.compiler
        compiler.deferred = []
        try:
            results = [fn(item) for item in items]
            sources = compiler.deferred
        finally:
            compiler.deferred = None
        failed = {src.encode() for src in compiler.compile_batch(sources)}
        # a result is (index, (program, seconds)) or (index, None); the program's binary is its text
        return [(i, None if r is None or r[0].src[3].arg in failed else r) for i, r in results]

