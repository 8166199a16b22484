"""Shared fixtures: the CPU device, the repository's example kernels, small kernel texts."""

import os
import pathlib

import pytest

import kiln

KERNELS = pathlib.Path(__file__).resolve().parents[3] / "examples" / "kernels"

# out[i] = a[i] + 1.0 over n elements; slot 0 in, slot 1 out.
INC = """\
%n  = DEFINE_VAR i32 "n" 1 1048576
%a  = PARAM ptr<f32> 0 (%n)
%o  = PARAM ptr<f32> 1 (%n)
%i  = SPECIAL i32 "idx0" (%n)
%pa = INDEX ptr<f32> (%a, %i)
%po = INDEX ptr<f32> (%o, %i)
%x  = LOAD f32 (%pa)
%c  = CONST f32 1.0
%y  = ADD f32 (%x, %c)
%st = STORE void (%po, %y)
SINK void (%st)
"""

# Writes o[i + 1] for i < n over a buffer of n: the last store leaves the buffer.
SHIFTED = """\
%n   = DEFINE_VAR i32 "n" 1 1024
%o   = PARAM ptr<f32> 0 (%n)
%i   = SPECIAL i32 "idx0" (%n)
%one = CONST i32 1
%j   = ADD i32 (%i, %one)
%po  = INDEX ptr<f32> (%o, %j)
%v   = CONST f32 2.0
%st  = STORE void (%po, %v)
SINK void (%st)
"""


@pytest.fixture
def dev():
    return kiln.Device("CPU")


@pytest.fixture
def add(dev):
    return dev.compile(KERNELS / "add.kiln")


@pytest.fixture
def inc(dev):
    return dev.compile(INC, name="inc")


def require(backend):
    """The first available device of `backend` ("OPENCL"); the test is skipped when the machine
    has none, and fails instead when ``KILN_REQUIRE`` names the backend (as kiln's Rust tests)."""
    for info in kiln.devices():
        if info.name.split(":")[0] == backend and info.available:
            return kiln.Device(info.name)
    required = {n.strip().upper() for n in os.environ.get("KILN_REQUIRE", "").split(",")}
    if backend in required:
        pytest.fail(f"KILN_REQUIRE names {backend}, but this machine has no {backend} device")
    pytest.skip(f"no {backend} device on this machine")
