"""Benchmark: attnlab's training step against the same GPT written straight, nanoGPT-style, in this file.

attnlab's side is the real trainer (attnlab.train.train on the `cpu` preset's model and batch, `standard`
attention, Shakespeare characters), timed between consecutive steps by the trainer's step callback, so it pays
for everything a real run pays for per step (batch drawing, hooks, bookkeeping, logging rows). The reference is
~80 lines below: the same sizes, the same weights (copied from attnlab's model at step 0, so the step-0 losses
are checked equal), the same AdamW groups and schedule, the same batches (the same dataset and generator), and
the same clip. The two alternate in blocks of --steps steps, --repeats times; medians of the per-step times.

    python benchmarks/train_step.py                 # cpu preset, 3 x 60 steps each
    python benchmarks/train_step.py --device cuda   # the same on a GPU (float32 with TF32, as the trainer runs it)
Prints one JSON object with both medians and the ratio attnlab / reference (goal: at most 1.02).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.configio import apply_overrides
from attnlab.data import prepare
from attnlab.presets import load_preset
from attnlab.train import train
from attnlab.train.optim import lr_at
from attnlab.train.trainer import configure_tf32


# ------------------------------------------------------------------------- the reference, nanoGPT-style
class SelfAttention(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(c), SelfAttention(c, n_head), nn.LayerNorm(c)
        self.fc, self.proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class RefGPT(nn.Module):
    def __init__(self, vocab, block_size, n_layer, n_head, c):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(block_size, c)
        self.blocks = nn.ModuleList(Block(c, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(c)
        self.head = nn.Linear(c, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def load_from(self, ours):
        """Copy attnlab.GPT's weights (q, k, v fused into one Linear as nanoGPT has them)."""
        sd, mine = ours.state_dict(), {}
        mine.update({"wte.weight": sd["wte.weight"], "wpe.weight": sd["pos.weight"], "head.weight": sd["wte.weight"],
                     "ln_f.weight": sd["ln_f.weight"], "ln_f.bias": sd["ln_f.bias"]})
        for i in range(len(self.blocks)):
            p = f"blocks.{i}."
            for part in ("weight", "bias"):
                mine[p + f"attn.qkv.{part}"] = torch.cat([sd[p + f"attn.{n}_proj.{part}"] for n in "qkv"])
                for a, b in (("ln_1", "ln_1"), ("ln_2", "ln_2"), ("attn.proj", "attn.out_proj"), ("fc", "mlp.fc"),
                             ("proj", "mlp.proj")):
                    mine[p + f"{a}.{part}"] = sd[p + f"{b}.{part}"]
        self.load_state_dict(mine, strict=True)


def reference_steps(model, ds, cfg, steps, gen, start_step):
    """nanoGPT's loop: batch, forward, backward, clip, AdamW step; per-step seconds."""
    tc, block = cfg.train, cfg.model.block_size
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "wpe" not in n and "wte" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "wpe" not in n and "wte" not in n)]
    device = next(model.parameters()).device
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay}, {"params": rest, "weight_decay": 0}],
                            lr=tc.lr, betas=(tc.beta1, tc.beta2), fused=device.type == "cuda")  # nanoGPT's choice
    times, last = [], time.perf_counter()
    for k in range(start_step + 1, start_step + steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(k, tc)
        x, y = (z.to(device, non_blocking=True) for z in ds.get_batch("train", tc.batch_size, block, gen))
        loss = model(x, y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            loss.item()  # wait for the step, as attnlab's side is timed between completed steps
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times


# -------------------------------------------------------------------------------------------- timing
def attnlab_steps(cfg, steps, device="cpu"):
    times, last = [], [time.perf_counter()]

    def tick(step):
        if device == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    with tempfile.TemporaryDirectory() as out:
        run = apply_overrides(cfg, [f"out_dir={out}/run", f"train.max_steps={steps}", "train.eval_interval=0",
                                    "train.checkpoint_interval=0", "train.sample_tokens=0", "train.track_rank=false",
                                    f"train.device={device}"])
        train(run, quiet=True, _after_step=tick)
    return times[1:]  # the first interval includes the set-up


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = apply_overrides(load_preset("cpu"), ["train.warmup_steps=10"])
    ds = prepare(cfg.data)
    cfg = cfg.replace(model=cfg.model.replace(vocab_size=ds.vocab_size))
    from attnlab import GPT

    torch.manual_seed(cfg.train.seed)
    ours = GPT(cfg.model)
    ref = RefGPT(ds.vocab_size, cfg.model.block_size, cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd)
    ref.load_from(ours)
    x, y = ds.get_batch("train", cfg.train.batch_size, cfg.model.block_size, torch.Generator().manual_seed(0))
    with torch.no_grad():
        loss_ours, loss_ref = ours(x, y)[1].item(), ref(x, y).item()
    assert math.isclose(loss_ours, loss_ref, rel_tol=1e-5), (loss_ours, loss_ref)
    ref.to(args.device)
    if args.device == "cuda":
        configure_tf32("cuda", cfg.train.dtype)  # what the trainer sets for its side
    a, b = [], []
    for r in range(args.repeats):
        a += attnlab_steps(cfg, args.steps, args.device)
        b += reference_steps(ref, ds, cfg, args.steps, torch.Generator().manual_seed(cfg.train.seed), r * args.steps)
    ma, mb = statistics.median(a), statistics.median(b)
    print(json.dumps({
        "benchmark": "train_step", "preset": "cpu", "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "dtype": cfg.train.dtype,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "step0_loss": {"attnlab": round(loss_ours, 6), "reference": round(loss_ref, 6)},
        "median_step_ms": {"attnlab": round(1e3 * ma, 2), "reference": round(1e3 * mb, 2)},
        "ratio": round(ma / mb, 3), "steps_each": len(a),
    }, indent=1))


if __name__ == "__main__":
    main()
