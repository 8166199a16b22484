"""kiln.Channel and the collectives of kiln.Plan: ranks on the CPU's devices, run at once."""

import math
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import INC

import kiln

# One rank per device: the CPU and its virtual devices, each with its own thread pool.
DEVICES = ["CPU", "CPU:1", "CPU:2", "CPU:3"]
OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def ranks(count, timeout=None):
    """`count` devices, a channel end for each and an empty plan on each, rank 0 first."""
    devs = [kiln.Device(name) for name in DEVICES[:count]]
    return devs, kiln.Channel.local(count, timeout), [kiln.Plan(d) for d in devs]


def run_all(plans):
    """Runs every rank's plan at once (a collective waits for every rank)."""
    for run in [p.run_async() for p in plans]:
        run.wait()


def reduced(xs, op):
    """The reduction over ranks, in rank order; f16 in f32, rounded once at the end."""
    wide = [x.astype(np.float32) if x.dtype == np.float16 else x for x in xs]
    acc = wide[0]
    for x in wide[1:]:
        acc = OPS[op](acc, x)
    return acc.astype(xs[0].dtype)


def rank_data(rng, dtype, count, n):
    if np.dtype(dtype).kind == "f":
        return [rng.uniform(-8, 8, n).astype(dtype) for _ in range(count)]
    return [rng.integers(-1000, 1000, n).astype(dtype) for _ in range(count)]


def test_local_channel_ends():
    ends = kiln.Channel.local(3, timeout=2.5)
    assert [e.rank for e in ends] == [0, 1, 2]
    assert {(e.count, e.provider, e.timeout, e.broken) for e in ends} == {(3, "local", 2.5, None)}
    assert repr(ends[1]) == "<kiln.Channel local rank 1 of 3, timeout 2.5s>"
    (only,) = kiln.Channel.local(1)
    assert (only.rank, only.count, only.timeout) == (0, 1, 60.0)
    assert isinstance(only, kiln.Channel)


@pytest.mark.parametrize(
    "count, timeout",
    [
        (0, None), (-1, None), (2**70, None), (5000, None), ("2", None),
        (2, -1.0), (2, math.nan), (2, math.inf), (2, "1"), (2, 0), (2, 0.0),
    ],
)
def test_invalid_channels_raise_invalid_argument(count, timeout):
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.Channel.local(count, timeout)


def test_virtual_cpu_devices_hold_their_own_buffers():
    dev = kiln.Device("CPU:1")
    assert dev.name == "CPU:1"
    assert dev.empty("f32", 4).device == "CPU:1"
    buf = dev.from_numpy(np.arange(4, dtype=np.float32))
    assert buf.device == "CPU:1" and buf.is_host
    inc = dev.compile(INC, name="inc")
    out = dev.empty("f32", 4)
    inc(buf, out, n=4)
    np.testing.assert_array_equal(out.numpy(), np.arange(4) + 1)
    with pytest.raises(kiln.UnavailableError, match="CPU:63"):
        kiln.Device("CPU:64")


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
@pytest.mark.parametrize("count", [1, 2, 4])
def test_all_reduce(count, dtype, op, in_place):
    rng = np.random.default_rng(count)
    devs, ends, plans = ranks(count)
    xs = rank_data(rng, dtype, count, 1001)
    sends = [d.from_numpy(x) for d, x in zip(devs, xs)]
    recvs = sends if in_place else [d.empty(sends[0].dtype, 1001) for d in devs]
    for plan, end, s, r in zip(plans, ends, sends, recvs):
        node = plan.all_reduce(end, s, op=op) if in_place else plan.all_reduce(end, s, r, op)
        assert node == 0 and len(plan) == 1
    run_all(plans)
    want = reduced(xs, op)
    # An f16 sum may round after each rank's addition: within half an ulp of the partial
    # sums (up to 32 here: 2**-6) per addition.
    atol = (count - 1) * 2**-7 if dtype == np.float16 and op == "sum" else 0
    for r in recvs:
        assert r.numpy().dtype == want.dtype
        np.testing.assert_allclose(r.numpy(), want, rtol=0, atol=atol)
    if not in_place:
        for s, x in zip(sends, xs):
            np.testing.assert_array_equal(s.numpy(), x)  # send is only read


def test_all_reduce_of_a_large_buffer_on_threads():
    """Several reduction blocks a rank; each rank's `run` on its own Python thread (the GIL
    is released while a rank waits for its peers)."""
    n = 300_007
    devs, ends, plans = ranks(4)
    xs = [np.arange(n, dtype=np.float32) * (r + 1) for r in range(4)]
    bufs = [d.from_numpy(x) for d, x in zip(devs, xs)]
    for plan, end, b in zip(plans, ends, bufs):
        plan.all_reduce(end, b)
    errors = []

    def rank(plan):
        try:
            plan.run()
        except kiln.Error as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for b in bufs:
        np.testing.assert_array_equal(b.numpy(), np.arange(n, dtype=np.float32) * 10)


def test_collectives_run_between_kernels_and_replay():
    """A kernel writes what the all-reduce reads; a replay sees new inputs."""
    devs, ends, plans = ranks(2)
    ins = [d.from_numpy(np.full(16, r, np.float32)) for r, d in enumerate(devs)]
    mids, outs = [d.empty("f32", 16) for d in devs], [d.empty("f32", 16) for d in devs]
    for d, plan, end, a, m, o in zip(devs, plans, ends, ins, mids, outs):
        inc = d.compile(INC, name="inc")
        assert plan.launch(inc, [a, m], {"n": 16}) == 0
        assert plan.all_reduce(end, m, o) == 1
        assert plan.launch(inc, [o, m], {"n": 16}) == 2  # reads what the collective writes
    run_all(plans)
    for o, m in zip(outs, mids):
        np.testing.assert_array_equal(o.numpy(), 1 + 2)  # (0 + 1) + (1 + 1)
        np.testing.assert_array_equal(m.numpy(), 4)
    ins[1].copy_from(np.full(16, 10, np.float32))
    run_all(plans)
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), 1 + 11)


@pytest.mark.parametrize("count", [1, 2, 4])
def test_all_gather_concatenates_in_rank_order(count):
    devs, ends, plans = ranks(count)
    xs = [np.arange(5, dtype=np.int32) + 100 * r for r in range(count)]
    sends = [d.from_numpy(x) for d, x in zip(devs, xs)]
    recvs = [d.empty("i32", 5 * count) for d in devs]
    for plan, end, s, r in zip(plans, ends, sends, recvs):
        assert plan.all_gather(end, s, r) == 0
    run_all(plans)
    for r in recvs:
        assert len(r) == 5 * count
        np.testing.assert_array_equal(r.numpy(), np.concatenate(xs))


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("count", [1, 2, 4])
def test_reduce_scatter_gives_each_rank_its_block(count, op):
    rng = np.random.default_rng(7)
    devs, ends, plans = ranks(count)
    xs = rank_data(rng, np.float32, count, 6 * count)
    sends = [d.from_numpy(x) for d, x in zip(devs, xs)]
    recvs = [d.empty("f32", 6) for d in devs]
    for plan, end, s, r in zip(plans, ends, sends, recvs):
        plan.reduce_scatter(end, s, r, op=op)
    run_all(plans)
    want = reduced(xs, op)
    for rank, r in enumerate(recvs):
        np.testing.assert_array_equal(r.numpy(), want[6 * rank : 6 * (rank + 1)])


@pytest.mark.parametrize("count", [1, 2, 4])
def test_broadcast_from_each_root(count):
    for root in range(count):
        devs, ends, plans = ranks(count)
        xs = [np.full(9, r + 1, np.int64) for r in range(count)]
        bufs = [d.from_numpy(x) for d, x in zip(devs, xs)]
        for plan, end, b in zip(plans, ends, bufs):
            assert plan.broadcast(end, b, root) == 0
        run_all(plans)
        for b in bufs:
            np.testing.assert_array_equal(b.numpy(), root + 1)


def test_send_and_recv_between_two_ranks():
    devs, ends, plans = ranks(2)
    ping = devs[0].from_numpy(np.arange(12, dtype=np.float64))
    got = devs[1].from_numpy(np.zeros(12, np.float64))
    back = devs[0].from_numpy(np.zeros(12, np.float64))
    assert plans[0].send(ends[0], ping, 1) == 0
    assert plans[0].recv(ends[0], back, 1) == 1
    assert plans[1].recv(ends[1], got, 0) == 0
    assert plans[1].send(ends[1], got, 0) == 1  # after the receive: sends what arrived
    run_all(plans)
    np.testing.assert_array_equal(got.numpy(), np.arange(12))
    np.testing.assert_array_equal(back.numpy(), np.arange(12))


def test_mismatched_buffers_are_refused_at_record_time():
    devs, ends, plans = ranks(2)
    plan, end, dev = plans[0], ends[0], devs[0]
    f8, i8 = dev.empty("f32", 8), dev.empty("i32", 8)
    with pytest.raises(kiln.InvalidArgumentError, match="dtype"):
        plan.all_reduce(end, f8, i8)
    with pytest.raises(kiln.InvalidArgumentError, match="recv needs 8"):
        plan.all_reduce(end, f8, dev.empty("f32", 4))
    with pytest.raises(kiln.InvalidArgumentError, match="recv needs 16"):
        plan.all_gather(end, f8, dev.empty("f32", 8))
    with pytest.raises(kiln.InvalidArgumentError, match="not a multiple"):
        plan.reduce_scatter(end, dev.empty("f32", 7), dev.empty("f32", 3))
    with pytest.raises(kiln.InvalidArgumentError, match="bool"):
        plan.all_reduce(end, dev.empty("bool", 8))
    with pytest.raises(kiln.InvalidArgumentError, match="overlap"):
        plan.all_reduce(end, f8.view(0, 6), f8.view(2, 6))
    with pytest.raises(kiln.InvalidArgumentError, match="plan on CPU"):
        plan.all_reduce(end, devs[1].empty("f32", 8))  # a buffer of another device
    with pytest.raises(kiln.InvalidArgumentError, match="no reduction `prod`"):
        plan.all_reduce(end, f8, op="prod")
    with pytest.raises(kiln.InvalidArgumentError, match="root rank 2 is not a rank of this channel of 2"):
        plan.broadcast(end, f8, 2)
    with pytest.raises(kiln.InvalidArgumentError, match="itself"):
        plan.send(end, f8, 0)
    with pytest.raises(kiln.InvalidArgumentError):
        plan.recv(end, f8, -1)
    with pytest.raises(kiln.InvalidArgumentError, match="kiln.Buffer"):
        plan.all_reduce(end, np.zeros(8, np.float32))
    assert len(plan) == 0  # nothing refused was recorded
    assert end.broken is None  # nor did it break the channel


def test_ranks_that_disagree_break_the_channel_when_they_meet():
    devs, ends, plans = ranks(2, timeout=10)
    plans[0].all_reduce(ends[0], devs[0].empty("f32", 8))
    plans[1].all_reduce(ends[1], devs[1].empty("f32", 4))
    runs = [p.run_async() for p in plans]
    for run in runs:
        with pytest.raises(kiln.ChannelError):
            run.wait()


def test_a_missing_peer_raises_channel_error_at_the_timeout():
    devs, ends, plans = ranks(2, timeout=0.2)
    buf = devs[0].empty("f32", 8)
    plans[0].all_reduce(ends[0], buf)
    start = time.monotonic()
    with pytest.raises(kiln.ChannelError):
        plans[0].run()  # rank 1 never runs
    assert time.monotonic() - start < 5
    assert ends[0].broken and ends[1].broken  # every end of the channel is broken
    assert "broken" in repr(ends[1])
    with pytest.raises(kiln.ChannelError):
        plans[0].run()  # at once, with the same error
    with pytest.raises(kiln.ChannelError):
        plans[1].all_reduce(ends[1], devs[1].empty("f32", 8))  # refused at record time
    plan = kiln.Plan(devs[0])  # the device and new channels still work
    plan.all_reduce(kiln.Channel.local(1)[0], buf)
    plan.run()


def test_a_zero_timeout_is_refused_with_what_to_do():
    with pytest.raises(kiln.InvalidArgumentError, match="more than 0"):
        kiln.Channel.local(2, 0)


@pytest.mark.parametrize("op", [None, 3, b"sum"])
def test_an_op_that_is_no_name_raises_invalid_argument(op):
    devs, ends, plans = ranks(2)
    buf = devs[0].empty("f32", 8)
    with pytest.raises(kiln.InvalidArgumentError, match='op is "sum", "max" or "min"'):
        plans[0].all_reduce(ends[0], buf, op=op)
    with pytest.raises(kiln.InvalidArgumentError, match='op is "sum", "max" or "min"'):
        plans[0].reduce_scatter(ends[0], buf, devs[0].empty("f32", 4), op=op)
    with pytest.raises(kiln.InvalidArgumentError):
        plans[0].all_reduce(ends[0], None)  # as a buffer that is no buffer
    assert len(plans[0]) == 0


@pytest.mark.parametrize("rank", [2, -1, 2**70, -(2**70), 2**200])
def test_a_root_or_peer_out_of_range_names_the_channels_ranks(rank):
    devs, ends, plans = ranks(2)
    buf = devs[0].empty("f32", 8)
    for record in (plans[0].broadcast, plans[0].send, plans[0].recv):
        with pytest.raises(kiln.InvalidArgumentError, match=r"not a rank of this channel of 2: ranks are 0 to 1") as e:
            record(ends[0], buf, rank)
        assert "buffer" not in str(e.value)
    with pytest.raises(kiln.InvalidArgumentError, match="the root rank must be an int, got float"):
        plans[0].broadcast(ends[0], buf, 1.0)
    assert len(plans[0]) == 0


def test_a_rank_whose_run_is_refused_before_anything_runs_releases_its_peer_at_once():
    """Rank 1's launch is refused for the run's value of `n` (its buffers hold 16): nothing of
    its run is queued, and its peer, waiting with a 30 s timeout, must fail at once."""
    devs, ends, plans = ranks(2, timeout=30)
    a, out = devs[1].empty("f32", 16), devs[1].empty("f32", 16)
    plans[1].launch(devs[1].compile(INC, name="inc"), [a, out], {"n": 16})
    plans[1].all_reduce(ends[1], out)
    plans[0].all_reduce(ends[0], devs[0].empty("f32", 16))
    start = time.monotonic()
    waiting = plans[0].run_async()
    with pytest.raises(kiln.LaunchError, match="17"):
        plans[1].run(n=17)
    with pytest.raises(kiln.ChannelError, match="rank 1 left"):
        waiting.wait()
    assert time.monotonic() - start < 10  # not the channel's 30 s


def test_a_run_async_refused_for_an_unknown_variable_releases_the_peer_at_once():
    devs, ends, plans = ranks(2, timeout=30)
    for plan, end, dev in zip(plans, ends, devs):
        plan.all_reduce(end, dev.empty("f32", 16))
    start = time.monotonic()
    waiting = plans[0].run_async()
    with pytest.raises(kiln.LaunchError, match="no variable `nope`"):
        plans[1].run_async(nope=1)
    with pytest.raises(kiln.ChannelError, match="rank 1 left"):
        waiting.wait()
    assert time.monotonic() - start < 10


def test_a_missing_peer_past_a_shorter_plan_timeout_is_always_a_channel_error():
    """The plan gives up after 0.2 s, the channel after 30: the run raises ChannelError (never
    TimeoutError), and the replay meets the broken channel, not the previous run's collective."""
    for _ in range(5):
        dev = kiln.Device("CPU")
        ends = kiln.Channel.local(2, timeout=30)
        plan = kiln.Plan(dev, timeout=0.2)
        plan.all_reduce(ends[0], dev.empty("f32", 8))
        start = time.monotonic()
        with pytest.raises(kiln.ChannelError) as first:
            plan.run()  # rank 1 never runs
        assert time.monotonic() - start < 10
        with pytest.raises(kiln.ChannelError) as again:
            plan.run()
        assert str(again.value) == str(first.value)


# Rank 0's collective waits for rank 1, which never runs, when the script ends.
EXIT_WAITING = textwrap.dedent(
    """\
    import kiln
    dev = kiln.Device("CPU")
    ends = kiln.Channel.local(2)                 # the default timeout: 60 s
    plan = kiln.Plan(dev)
    plan.all_reduce(ends[0], dev.empty("f32", 8))
    run = plan.run_async()
    print("exiting", flush=True)
    """
)


def test_exiting_while_a_collective_waits_for_a_peer_does_not_wait_for_its_timeout():
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", EXIT_WAITING], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == "exiting\n"
    assert took < 30, f"the interpreter took {took:.1f} s to exit (the channel's timeout is 60 s)"
