"""Registers kiln's tinygrad device (`DEV=KILN`) without importing kiln or tinygrad, and applies
kiln's declared changes to tinygrad (`kiln.tinygrad.compat`) when tinygrad is imported.

`kiln-tinygrad.pth` calls `install()` when the interpreter starts; see `kiln.tinygrad`.
"""

import importlib.abc
import importlib.machinery
import sys

MODULE = "tinygrad.runtime.ops_kiln"
TINYGRAD = "tinygrad"
ONNX = "tinygrad.nn.onnx"


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module):
        from kiln.tinygrad.device import KilnDevice

        module.KilnDevice = KilnDevice
        module.__all__ = ["KilnDevice"]


class _PatchingLoader(importlib.abc.Loader):
    """tinygrad's own loader of `tinygrad` or `tinygrad.nn.onnx`, then kiln's changes to it
    (`kiln.tinygrad.compat.install` or `install_onnx`)."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _patch(module.__name__)


_PENDING = []  # modules imported while kiln.tinygrad.compat itself was being imported


def _patch(name):
    try:
        from kiln.tinygrad import compat
    except Exception as e:  # a tinygrad whose internals kiln's layer cannot even import
        import warnings

        warnings.warn(f"kiln.tinygrad: tinygrad's internals differ from those kiln was written for; "
                      f"none of kiln's changes to tinygrad applied ({type(e).__name__}: {e})", stacklevel=2)
        return
    if not getattr(compat, "READY", False):  # compat imported tinygrad: it calls apply_pending when whole
        _PENDING.append(name)
    elif name == TINYGRAD:
        compat.install()
    else:
        compat.install_onnx(sys.modules[name])


def apply_pending():
    """Applies what `_patch` was asked for while `kiln.tinygrad.compat` was being imported."""
    while _PENDING:
        _patch(_PENDING.pop(0))


class _Finder(importlib.abc.MetaPathFinder):
    """Answers `tinygrad.runtime.ops_kiln`, and `tinygrad` and `tinygrad.nn.onnx` with tinygrad's
    modules plus kiln's changes to them; nothing else."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == MODULE:
            return importlib.machinery.ModuleSpec(MODULE, _Loader())
        if fullname in (TINYGRAD, ONNX):
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
            return spec
        return None


def install():
    """Makes `tinygrad.runtime.ops_kiln` importable and applies kiln's changes to tinygrad when it
    is imported (`kiln.tinygrad.compat`; idempotent)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in (TINYGRAD, ONNX):
        if name in sys.modules:  # imported before (python -S, then kiln.tinygrad.install())
            _patch(name)
