"""The API fuzzer (fuzz_api.py) over 1000 cases on every available device finds nothing: no
crash, hang, exception other than kiln.Error, or wrong result."""

import os
import subprocess
import sys

import pytest
from fuzz_api import BACKENDS, first_devices

CASES = 1000


def fuzz_devices() -> list[str]:
    """The first available device of each backend; a backend without one is left out, unless
    ``KILN_REQUIRE`` names it (as conftest.require does)."""
    found = first_devices()
    required = {n.strip().upper() for n in os.environ.get("KILN_REQUIRE", "").split(",")}
    for backend in BACKENDS:
        if backend in required and backend not in found:
            pytest.fail(f"KILN_REQUIRE names {backend}, but this machine has no {backend} device")
    return list(found.values())


def test_the_api_fuzzer_finds_nothing() -> None:
    fuzzer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_api.py")
    command = [sys.executable, fuzzer, "--cases", str(CASES), "--seed", "0", "--devices", ",".join(fuzz_devices())]
    out = subprocess.run(command, capture_output=True, text=True, timeout=280)
    report = out.stdout[-30000:] + out.stderr[-5000:]
    assert out.stdout.splitlines()[-1:] == [f"{CASES} passed, 0 failed"], report
    assert out.returncode == 0, report
