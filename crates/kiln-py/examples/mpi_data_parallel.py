"""Data-parallel training over MPI with kiln: ``mpirun -n 2 python mpi_data_parallel.py``.

Every rank trains the same small MLP (tinygrad on ``DEV=KILN``: forward and backward run on
kiln) on its share of each batch of random data. After each backward pass, a kiln ``Plan``
all-reduces the rank's gradients over ``kiln.Channel.mpi_world()`` (an MPI channel), and every
rank takes the same SGD step with the mean gradient. Rank 0 then trains the same MLP alone on
the whole batches and checks that the weights agree within 1e-5: data parallelism over MPI
computes what one process computes.

Needs a kiln built with MPI (``MATURIN_PEP517_ARGS="--features mpi" pip install ./crates/kiln-py``,
with OpenMPI installed). ``--steps N`` sets the number of steps (default 8).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("DEV", "KILN")

import numpy as np
from tinygrad import Tensor

import kiln

SIZES = (16, 32, 4)  # inputs, hidden, outputs
BATCH = 32
LR = 0.05


def initial_weights() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((SIZES[0], SIZES[1])).astype(np.float32) * 0.3
    b1 = np.zeros(SIZES[1], np.float32)
    w2 = rng.standard_normal((SIZES[1], SIZES[2])).astype(np.float32) * 0.3
    b2 = np.zeros(SIZES[2], np.float32)
    return [w1, b1, w2, b2]


def batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(11)
    return [
        (rng.standard_normal((BATCH, SIZES[0])).astype(np.float32), rng.standard_normal((BATCH, SIZES[2])).astype(np.float32))
        for _ in range(steps)
    ]


def gradients(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """The gradients of the mean squared error over (x, y), computed by tinygrad on kiln."""
    params = [Tensor(w) for w in weights]
    w1, b1, w2, b2 = params
    out = (Tensor(x) @ w1 + b1).relu() @ w2 + b2
    loss = ((out - Tensor(y)) ** 2).mean()
    return [g.numpy() for g in loss.gradient(*params)]


def sgd(weights: list[np.ndarray], grads: list[np.ndarray]) -> list[np.ndarray]:
    return [(w - np.float32(LR) * g).astype(np.float32) for w, g in zip(weights, grads)]


def train_data_parallel(channel: kiln.Channel, data: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """Each rank takes its slice of every batch; the gradients' mean comes from an all_reduce."""
    rank, count = channel.rank, channel.count
    if BATCH % count:
        raise SystemExit(f"the batch of {BATCH} does not split over {count} ranks")
    share = BATCH // count
    device = kiln.Device("CPU")
    weights = initial_weights()
    total = sum(w.size for w in weights)
    grads_buf = device.empty("float32", total)
    plan = kiln.Plan(device)
    plan.all_reduce(channel, grads_buf)  # in place: the sum over ranks
    for x, y in data:
        mine = slice(rank * share, (rank + 1) * share)
        grads = gradients(weights, x[mine], y[mine])
        grads_buf.copy_from(np.concatenate([g.ravel() for g in grads]))
        plan.run()
        summed = grads_buf.numpy() / np.float32(count)
        mean, at = [], 0
        for w in weights:
            mean.append(summed[at : at + w.size].reshape(w.shape))
            at += w.size
        weights = sgd(weights, mean)
    return weights


def train_alone(data: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    weights = initial_weights()
    for x, y in data:
        weights = sgd(weights, gradients(weights, x, y))
    return weights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    channel = kiln.Channel.mpi_world(timeout=60)
    data = batches(args.steps)
    together = train_data_parallel(channel, data)
    if channel.rank != 0:
        return 0
    alone = train_alone(data)
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(together, alone))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(together, initial_weights()))
    print(
        f"data parallel over {channel.count} MPI ranks, {args.steps} steps: largest weight difference from one "
        f"process {worst:.2e} (the weights moved by up to {moved:.2e})"
    )
    if not worst <= 1e-5 or moved < 1e-3:
        print("FAILED: the data-parallel weights differ from one process's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
