"""Registers kiln's tinygrad device (`DEV=KILN`) without importing kiln or tinygrad.

`kiln-tinygrad.pth` calls `install()` when the interpreter starts; see `kiln.tinygrad`.
"""

import importlib.abc
import importlib.machinery
import sys

MODULE = "tinygrad.runtime.ops_kiln"


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        from kiln.tinygrad import beam
        from kiln.tinygrad.device import KilnDevice

        beam.install()
        module.KilnDevice = KilnDevice
        module.__all__ = ["KilnDevice"]


class _Finder(importlib.abc.MetaPathFinder):
    """Answers `tinygrad.runtime.ops_kiln`, and nothing else."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.machinery.ModuleSpec(MODULE, _Loader()) if fullname == MODULE else None


def install():
    """Makes `tinygrad.runtime.ops_kiln` importable (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
