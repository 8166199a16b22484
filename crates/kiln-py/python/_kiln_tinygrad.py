"""Registers kiln's tinygrad device (`DEV=KILN`) without importing kiln or tinygrad.

`kiln-tinygrad.pth` calls `install()` when the interpreter starts; see `kiln.tinygrad`.
"""

import importlib.abc
import importlib.machinery
import sys

MODULE = "tinygrad.runtime.ops_kiln"
ONNX = "tinygrad.nn.onnx"


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        from kiln.tinygrad.device import KilnDevice  # installs kiln.tinygrad.compat

        module.KilnDevice = KilnDevice
        module.__all__ = ["KilnDevice"]


class _OnnxLoader(importlib.abc.Loader):
    """tinygrad's own loader of `tinygrad.nn.onnx`, then kiln's fix to its runner
    (`kiln.tinygrad.compat.install_onnx`)."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        from kiln.tinygrad import compat

        compat.install_onnx(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Answers `tinygrad.runtime.ops_kiln`, and `tinygrad.nn.onnx` with tinygrad's module plus
    kiln's fix to it; nothing else."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == MODULE:
            return importlib.machinery.ModuleSpec(MODULE, _Loader())
        if fullname == ONNX:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _OnnxLoader(spec.loader)
            return spec
        return None


def install():
    """Makes `tinygrad.runtime.ops_kiln` importable and fixes `tinygrad.nn.onnx` (idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    if ONNX in sys.modules:  # imported before (python -S, then kiln.tinygrad.install())
        from kiln.tinygrad import compat

        compat.install_onnx(sys.modules[ONNX])
