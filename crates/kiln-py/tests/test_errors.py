"""One exception class per error class under kiln.Error; panics are kiln.Error too."""

import os
import subprocess
import sys

import numpy as np
import pytest

import kiln

CLASSES = [
    kiln.DeviceLostError,
    kiln.OutOfMemoryError,
    kiln.InvalidArgumentError,
    kiln.TimeoutError,
    kiln.CompileError,
    kiln.LaunchError,
    kiln.UnavailableError,
    kiln.IoError,
    kiln.DriverError,
]


def test_the_hierarchy():
    assert issubclass(kiln.Error, Exception)
    for cls in CLASSES:
        assert issubclass(cls, kiln.Error) and cls.__module__ == "kiln" and cls.__doc__
    assert issubclass(kiln.OutOfBoundsError, kiln.LaunchError)
    assert issubclass(kiln.ParseError, kiln.InvalidArgumentError)
    assert len(set(CLASSES)) == len(CLASSES)


@pytest.mark.parametrize(
    "kind, cls, root",
    [
        ("driver", kiln.DriverError, "a test failure"),
        ("timeout", kiln.TimeoutError, "waited 5 ms"),
        ("fatal_driver", kiln.DeviceLostError, "gone"),
        ("chained_oom", kiln.OutOfMemoryError, "requested 64 B"),
    ],
)
def test_errors_without_a_cause_on_demand_map_to_their_class(kind, cls, root):
    with pytest.raises(cls) as e:
        kiln._kiln._raise_for_test(kind)
    assert root in e.value.root_cause
    assert root in str(e.value)


def test_a_chained_error_carries_its_root_cause():
    with pytest.raises(kiln.OutOfMemoryError) as e:
        kiln._kiln._raise_for_test("chained_oom")
    assert "failed earlier" in str(e.value) and "failed earlier" not in e.value.root_cause


def test_a_rust_panic_is_a_kiln_error_not_an_abort():
    with pytest.raises(kiln.Error, match="panic was caught"):
        kiln._kiln._panic_for_test()


def test_out_of_memory_under_a_budget():
    code = (
        "import kiln, numpy as np\n"
        "d = kiln.Device('CPU')\n"
        "try:\n"
        "    d.from_numpy(np.zeros(1 << 20, np.float32))\n"
        "except kiln.OutOfMemoryError as e:\n"
        "    print('OOM', e.root_cause)\n"
    )
    env = dict(os.environ, KILN_MEMORY_BUDGET="1MiB")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith("OOM") and "budget" in out.stdout, out.stdout + out.stderr


def test_a_plan_run_past_its_timeout(dev):
    sum_ = dev.compile(__import__("conftest").KERNELS / "sum.kiln")
    big = dev.from_numpy(np.ones(1 << 24, np.float32))
    out = dev.empty("f32", 1)
    plan = kiln.Plan(dev, timeout=1e-6)
    for _ in range(4):
        plan.launch(sum_, [big, out], {"n": 1 << 24})
    with pytest.raises(kiln.TimeoutError, match="timeout"):
        plan.run()
    with pytest.raises(kiln.InvalidArgumentError, match="timeout"):
        kiln.Plan(dev, timeout=-1.0)
