"""Greedy decoding with tinygrad's Llama-style `Transformer`: tinygrad's compiler on kiln's runtime
(`DEV=KILN`) against the same compiler on tinygrad's own CPU runtime (`DEV=CPU`), one run.

    python crates/kiln-py/bench/tinygrad_decode.py [--tokens N] [--dim 512] [--blocks 8]

Each device runs in its own process (tinygrad's `DEV` is process-wide) on the same random
weights (numpy, fixed seed) and the same prompt; the JIT is warmed up by a first generation, then
a second one is timed token by token. Prints tokens/s (the median token time), kernels per token
(those the decode JIT launches, inside its graphs too) and the calls that launch them (a graph
replay is one call: `DEV=KILN` replays TinyJit's graphs as kiln plans, tinygrad's CPU has no
graph), and the tokens, and fails unless both devices generated the same tokens.

tinygrad 0.14.0's wheel lacks `tinygrad/llm/kernels/`, so `import tinygrad.llm.model` fails as
shipped. Its plain Llama path needs only that package's `Linear` (`nn.Linear`) and
`amd_custom_kernels_supported` (false here); `provide_llm_kernels` puts such a module in
`sys.modules` before the import.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types

from tinygrad_common import kernels_per_call, run_children


def provide_llm_kernels() -> None:
    """The stand-in for the missing `tinygrad.llm.kernels.amd` (see the module docstring)."""
    from tinygrad import nn

    def missing(*args: object, **kwargs: object) -> None:
        raise NotImplementedError("AMD custom kernels are not part of tinygrad 0.14.0's wheel")

    pkg, amd = types.ModuleType("tinygrad.llm.kernels"), types.ModuleType("tinygrad.llm.kernels.amd")
    amd.Linear = nn.Linear  # type: ignore[attr-defined]
    amd.amd_custom_kernels_supported = lambda device: False  # type: ignore[attr-defined]
    amd.gated_delta_prefill = amd.flash_attention = missing  # type: ignore[attr-defined]
    pkg.amd = amd  # type: ignore[attr-defined]
    sys.modules.update({"tinygrad.llm.kernels": pkg, "tinygrad.llm.kernels.amd": amd})


def run_device(args: argparse.Namespace) -> dict:
    """Builds the model on this process's device, warms the JIT up, then times a generation."""
    import numpy as np

    provide_llm_kernels()
    from tinygrad import Device, GlobalCounters, nn
    from tinygrad.llm.model import Transformer, TransformerConfig

    head_dim = args.dim // args.heads
    config = TransformerConfig(
        num_blocks=args.blocks, dim=args.dim, hidden_dim=args.hidden, n_heads=args.heads, n_kv_heads=args.heads,
        norm_eps=1e-5, vocab_size=args.vocab, head_dim=head_dim, rope_theta=10000.0, rope_dim=head_dim,
        v_head_dim=head_dim, max_context=args.context,
    )
    model = Transformer(config)
    rng = np.random.default_rng(0)
    weights = 0
    for name, p in sorted(nn.state.get_state_dict(model).items()):
        scale = 1.0 if "norm" in name else 1.0 / np.sqrt(p.shape[-1])
        value = (rng.standard_normal(p.shape) * scale + (1.0 if "norm" in name else 0.0)).astype(np.float32)
        p.replace(p.__class__(value, device=p.device)).realize()
        weights += value.nbytes
    prompt = [1, 2, 3, 4]

    def generate() -> tuple[list[int], list[float], list[int]]:
        model._cached_tokens = []
        tokens, times, kernels = [], [], []
        st, k0 = time.perf_counter(), GlobalCounters.kernel_count
        for tok in model.generate(list(prompt)):
            Device[Device.DEFAULT].synchronize()
            now = time.perf_counter()
            tokens.append(tok)
            times.append(now - st)
            kernels.append(GlobalCounters.kernel_count - k0)
            st, k0 = now, GlobalCounters.kernel_count
            if len(tokens) == args.tokens:
                break
        return tokens, times, kernels

    warm, _, _ = generate()
    tokens, times, kernels = generate()
    assert tokens == warm, "a second generation differs from the first"
    decode = times[1:]  # the first token includes the prompt
    return {
        "device": Device.DEFAULT, "renderer": type(Device[Device.DEFAULT].renderer).__name__, "tokens": tokens,
        "tok_s": 1.0 / statistics.median(decode), "kernels_per_token": kernels_per_call(model.rollout_jit),
        "graph_batches": statistics.median(kernels[1:]),
        "weights_mb": weights / 1e6,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--devices", default="KILN,CPU")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_device(args)))
        return 0
    results, failed = run_children(__file__, args.devices)
    for r in results:
        print(f"{r['device']:<12} {r['renderer']:<18} {r['tok_s']:8.1f} tokens/s  {r['kernels_per_token']:5d} kernels/token"
              f" in {r['graph_batches']:3.0f} calls  weights {r['weights_mb']:.0f} MB")
    same = all(r["tokens"] == results[0]["tokens"] for r in results)
    if results:
        print("tokens", results[0]["tokens"], "equal on every device" if same else "DIFFER")
    return 0 if same and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
