"""tinygrad on kiln computes what tinygrad computes: the same programs on `KILN` (the backend
`DEV` names: `DEV=KILN:OPENCL` runs them on kiln's OpenCL) and on tinygrad's own `CPU` device,
compared value by value (losses, every gradient, the weights after each step), up to the
reassociation of float sums.

The programs exercise what kiln's tinygrad layer changes (`kiln.tinygrad.compat`): matrix
products on both sides of `layout.MIN_ROWS` with widths the register tile's column block
divides and does not, concatenations, optimizer steps that assign the weights a product read,
lazy tensors read after an `assign`, BatchNorm in training mode, eager calls and TinyJit.
"""

from __future__ import annotations

import importlib.metadata
import shutil
from typing import Callable

import numpy as np
import pytest

tinygrad = pytest.importorskip("tinygrad", reason="tinygrad is not installed (pip install tinygrad==0.14.0)")
if importlib.metadata.version("tinygrad") != "0.14.0":
    pytest.skip("kiln.tinygrad is written for tinygrad 0.14.0", allow_module_level=True)
if shutil.which("clang") is None:
    pytest.skip("tinygrad's CPU device, the reference, needs clang on PATH", allow_module_level=True)

import kiln.tinygrad  # noqa: E402
from kiln.tinygrad import layout  # noqa: E402
from tinygrad import Context, Tensor, TinyJit, nn  # noqa: E402

kiln.tinygrad.install()
KILN, REFERENCE = "KILN", "CPU"
RTOL, ATOL = 2e-5, 2e-6

Program = Callable[[str], list[np.ndarray]]


def same_results(program: Program) -> None:
    """Runs `program` on kiln and on tinygrad's CPU; every array it returns must agree."""
    got, want = program(KILN), program(REFERENCE)
    assert len(got) == len(want) > 0
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"result {i} of {len(want)}")


def params_of(*layers: object) -> list[Tensor]:
    return nn.state.get_parameters(list(layers))


def on(device: str, layers: list[object]) -> list[Tensor]:
    """Moves the parameters of `layers` to `device` (in place) and returns them."""
    params = params_of(*layers)
    for p in params:
        p.replace(p.to(device)).realize()
    return params


def optimizer(name: str, params: list[Tensor]) -> nn.optim.Optimizer:
    if name == "sgd":
        return nn.optim.SGD(params, lr=0.05, momentum=0.9)
    if name == "adam":
        return nn.optim.Adam(params, lr=0.01)
    return nn.optim.AdamW(params, lr=0.01, weight_decay=0.1)


def data(rows: int, features: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, features)).astype(np.float32), rng.integers(0, classes, rows).astype(np.int32)


def mlp_training(rows: int, hidden: int, opt: str, steps: int = 3, jit: bool = False) -> Program:
    """A two-layer perceptron trained `steps` steps: each step's loss (read after the step, as a
    training loop prints it), each parameter's gradient, and the weights at the end."""
    x_np, y_np = data(rows, 47, 10, seed=rows + hidden)

    def program(device: str) -> list[np.ndarray]:
        Tensor.manual_seed(1)
        l1, l2 = nn.Linear(47, hidden), nn.Linear(hidden, 10)
        params = on(device, [l1, l2])
        o = optimizer(opt, params)
        x, y = Tensor(x_np, device=device), Tensor(y_np, device=device)

        def step(x: Tensor, y: Tensor) -> Tensor:
            o.zero_grad()
            loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            o.step()
            return loss

        run = TinyJit(lambda x, y: step(x, y).realize()) if jit else step
        out: list[np.ndarray] = []
        with Context(TRAINING=1):
            for _ in range(steps):
                loss = run(x, y)
                out.append(loss.numpy())
                if not jit:  # a JIT's gradients are its own buffers, overwritten each call
                    out += [p.grad.numpy() for p in params if p.grad is not None]
        return out + [p.numpy() for p in params]

    return program


@pytest.mark.parametrize("rows", [layout.MIN_ROWS - 1, layout.MIN_ROWS, layout.MIN_ROWS + 1])
@pytest.mark.parametrize("hidden", [64, 48])
def test_an_mlp_trains_as_on_tinygrads_cpu(rows, hidden):
    """Batches below, at and above the rows from which kiln packs a product's right operand, and
    hidden widths the column block (32) divides (packed) and does not (64, 48)."""
    same_results(mlp_training(rows, hidden, "sgd"))


@pytest.mark.parametrize("opt", ["adam", "adamw"])
def test_adam_and_adamw_train_as_on_tinygrads_cpu(opt):
    same_results(mlp_training(layout.MIN_ROWS + 1, 64, opt))


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_a_jitted_training_step_trains_as_on_tinygrads_cpu(opt):
    same_results(mlp_training(2 * layout.MIN_ROWS, 64, opt, steps=4, jit=True))


def test_a_convnet_with_batchnorm_in_training_mode_trains_as_on_tinygrads_cpu():
    """Convolutions, BatchNorm's batch statistics and running averages (compared with the
    weights), a concatenation of channels, global pooling and a linear head, trained with Adam."""
    rng = np.random.default_rng(7)
    x_np = rng.standard_normal((4, 3, 10, 10)).astype(np.float32)
    y_np = rng.integers(0, 5, 4).astype(np.int32)

    def program(device: str) -> list[np.ndarray]:
        Tensor.manual_seed(3)
        # no bias before BatchNorm: its gradient is rounding noise, which Adam scales up to lr
        c1, b1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        c2, b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        head = nn.Linear(16, 5)
        params = on(device, [c1, b1, c2, b2, head])
        trained = [c1.weight, b1.weight, b1.bias, c2.weight, b2.weight, b2.bias, head.weight, head.bias]
        o = nn.optim.Adam(trained, lr=0.01)
        x, y = Tensor(x_np, device=device), Tensor(y_np, device=device)
        out: list[np.ndarray] = []
        with Context(TRAINING=1):
            for _ in range(3):
                o.zero_grad()
                h = b1(c1(x)).relu()
                h = h.cat(b2(c2(h)).relu(), dim=1)  # DenseNet-style: new channels after the old
                loss = head(h.mean(axis=(2, 3))).sparse_categorical_crossentropy(y)
                loss.backward()
                o.step()
                out += [loss.numpy()] + [p.grad.numpy() for p in o.params if p.grad is not None]
        return out + [p.numpy() for p in params]

    same_results(program)


def test_a_lazy_product_read_after_its_operand_is_assigned_reads_the_new_value():
    """A product built on a weight, the weight then assigned in place, then the product read:
    tinygrad reads the new weight (the lazy product is computed when realized)."""
    rng = np.random.default_rng(1)
    w_np, x_np = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)

    def program(device: str) -> list[np.ndarray]:
        w, x = Tensor(w_np, device=device).realize(), Tensor(x_np, device=device).realize()
        y = x @ w.T
        w.assign(w - (x @ w.T).T @ x * 1e-3).realize()
        return [w.numpy(), y.numpy()]

    same_results(program)


def test_a_concatenation_read_after_its_input_is_assigned_reads_the_new_value():
    """Two concatenations of one lazy input, the first realized before an `assign` to what the
    input reads, the second after: the second reads the new value, as on tinygrad's devices."""
    w_np = np.arange(12, dtype=np.float32).reshape(3, 4)

    def program(device: str) -> list[np.ndarray]:
        w = Tensor(w_np, device=device).realize()
        u, u2 = Tensor.ones(2, 4, device=device).contiguous().realize(), Tensor.zeros(5, 4, device=device).contiguous().realize()
        a = w * 2
        first, second = a.cat(u), a.cat(u2)
        first.realize()
        w.assign(w + 1).realize()
        return [first.numpy(), second.numpy()]

    same_results(program)


@pytest.mark.parametrize("rows", [layout.MIN_ROWS - 1, layout.MIN_ROWS + 1])
def test_eager_products_and_concatenations_match_tinygrads_cpu(rows):
    """Eager calls, each realized at once, run again with the same shapes (tinygrad's caches)."""
    rng = np.random.default_rng(rows)
    a_np, b_np = rng.standard_normal((rows, 40)).astype(np.float32), rng.standard_normal((40, 96)).astype(np.float32)

    def program(device: str) -> list[np.ndarray]:
        a, b = Tensor(a_np, device=device), Tensor(b_np, device=device)
        out = []
        for i in range(3):
            p = (a @ (b + i)).realize()
            out += [p.numpy(), p.cat(a @ b, dim=1).relu().realize().numpy()]
        return out

    same_results(program)
