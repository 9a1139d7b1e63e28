"""Benchmark: generation tokens/s with the K/V cache against full recomputation, measured in the same run.

For each variant and each length N, a prompt of 8 tokens is extended by N - 8 greedy tokens, once with
GPT.generate(use_cache=True) and once with use_cache=False, alternating the two over --repeats runs (medians), on
a GPT whose block_size is N (so the cache never restarts its window). The two outputs are checked equal.

    python benchmarks/generate.py                       # cpu-preset-sized GPT, N = 256 and 1024, CPU fp32
    python benchmarks/generate.py --variants standard,mla --lengths 256
Prints one JSON object: per variant and N, tokens/s of both and the speedup (cached / recomputed).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from attnlab import GPT, GPTConfig


def _timed(fn) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run(variant: str, length: int, args) -> dict:
    cfg = GPTConfig(vocab_size=args.vocab, block_size=length, n_layer=args.n_layer, n_head=args.n_head,
                    n_embd=args.n_embd, attention=variant, pos_encoding=args.pos)
    torch.manual_seed(0)
    model = GPT(cfg).to(args.dtype).eval()
    prompt = torch.randint(0, args.vocab, (args.batch, 8), generator=torch.Generator().manual_seed(1))
    new = length - prompt.shape[1]
    times = {True: [], False: []}
    outputs = {}
    for _ in range(args.repeats):
        for use_cache in (True, False):
            seconds, outputs[use_cache] = _timed(lambda: model.generate(prompt, new, temperature=0.0,
                                                                         use_cache=use_cache))
            times[use_cache].append(seconds)
    cached, full = statistics.median(times[True]), statistics.median(times[False])
    tokens = new * args.batch
    return {
        "variant": variant, "tokens": length, "batch": args.batch,
        "cached_tokens_per_s": round(tokens / cached, 1), "recomputed_tokens_per_s": round(tokens / full, 1),
        "speedup": round(full / cached, 2), "same_tokens": bool(torch.equal(outputs[True], outputs[False])),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="standard,mla")
    p.add_argument("--lengths", default="256,1024")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--pos", default="learned")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    args.dtype = torch.float32
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [run(v, int(n), args) for v in args.variants.split(",") for n in args.lengths.split(",")]
    print(json.dumps({
        "benchmark": "generate", "device": "cpu", "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "model": {"n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd, "pos": args.pos},
        "rows": rows,
    }, indent=1))


if __name__ == "__main__":
    main()
