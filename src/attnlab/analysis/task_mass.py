"""Where a trained model's attention goes on a task: the mass at the query position that falls on the unique key
and on the redundant cluster (the magnitude write-up's "hijacking", measured in the mechanism itself, not only in accuracy).

For sequences of a task whose ``roles(x)`` marks positions (1: the unique key, 2: a redundant cluster key, 3: a query
position; attnlab.tasks.Hijack does), and for every layer l and head h of the model:

    unique[l, h]  = mean over queries i of  sum_{j: role_j = 1} p^{l,h}_{ij}      (the key tokens)
    cluster[l, h] = mean over queries i of  sum_{j: role_j = 2} p^{l,h}_{ij}

and the same sums over the whole *binding*, the key token and the value token after it (``unique_binding``,
``cluster_binding``): a trained recall head usually attends to the value token, which has read its key in an
earlier layer, so the binding is where the retrieval shows. A task whose ``binding_len`` is 1 (hijack with
``fused=true``: one token per binding) has its binding in the key position alone.

with p the layer's attention weights (GPT.attention_maps: the softmax weights, a logit prior included; a value gate,
magnitude_apply="values", scales the values after them and is not in p). A model that ignores the cluster puts no
mass on it; under hijacking the cluster takes the mass that the unique key needs.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import ConfigError

ROLE_UNIQUE, ROLE_CLUSTER, ROLE_QUERY = 1, 2, 3

__all__ = ["attention_mass", "at_length", "format_mass", "task_accuracy"]

EVAL_SEQUENCES = 512
"""Sequences a task's answer accuracy is measured on by default (seeded: the same for every run)."""


@torch.no_grad()
def task_accuracy(model, task, n: int = EVAL_SEQUENCES, seed: int | list[int] = 11, batch_size: int = 128) -> float:
    """Exact-match accuracy of ``model`` (a GPT) over every answer position of ``n`` sequences of ``task`` (numpy
    seed ``seed``), in eval mode (the model's mode is restored)."""
    x_all, y_all = task.sample(n, np.random.default_rng(seed))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct = total = 0
    try:
        for i in range(0, n, batch_size):
            x = torch.as_tensor(x_all[i:i + batch_size], device=device)
            y = torch.as_tensor(y_all[i:i + batch_size], device=device)
            logits, _ = model(x)
            answer = y >= 0
            correct += int((logits.argmax(-1) == y)[answer].sum())
            total += int(answer.sum())
    finally:
        model.train(was_training)
    return correct / total


def at_length(model, block_size: int):
    """A copy of ``model`` (a GPT) that reads sequences of up to ``block_size`` tokens: the same parameters (copied),
    positions recomputed for the new length, in eval mode. For length extrapolation: no parameter depends on the
    context length except learned positions, which have no rows beyond the trained block_size (a one-line
    ConfigError); RoPE, sinusoidal and no positions are functions of the position, and every attention variant's
    parameters are per head or per channel, not per position."""
    from ..model import GPT

    config = model.config
    if block_size > config.block_size and config.pos_encoding == "learned":
        raise ConfigError(f"a GPT with learned positions has none beyond block_size={config.block_size}, so it "
                          f"cannot read {block_size} tokens; length extrapolation needs pos_encoding rope, alibi, "
                          f"sinusoidal or none")
    longer = GPT(config.replace(block_size=block_size))
    longer.load_state_dict(model.state_dict())
    param = next(model.parameters())
    return longer.to(device=param.device, dtype=param.dtype).eval()


@torch.no_grad()
def attention_mass(model, task, n: int = 256, seed: int = 0, batch_size: int = 64) -> dict:
    """{"unique", "cluster", "unique_binding", "cluster_binding": [L, H] arrays, "n_queries": int,
    "accuracy": float} for ``n`` sequences of ``task``
    drawn from ``numpy.random.default_rng(seed)``; accuracy is the model's exact-match accuracy at the measured
    query positions (role 3: hijack's final query; its other queries are controls, not counted here)."""
    x_all, y_all = task.sample(n, np.random.default_rng(seed))
    roles_all = task.roles(x_all)
    if roles_all is None:
        raise ConfigError(f"task {task.name!r} does not mark key roles; attention mass is measured on tasks that do "
                          f"(hijack)")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sums, queries, correct, answers = None, 0, 0, 0
    try:
        for i in range(0, n, batch_size):
            x = torch.as_tensor(x_all[i : i + batch_size], dtype=torch.long, device=device)
            y = torch.as_tensor(y_all[i : i + batch_size], dtype=torch.long, device=device)
            roles = torch.as_tensor(roles_all[i : i + batch_size], device=device)
            maps = torch.stack(model.attention_maps(x))  # [L, B, H, T, T]
            query = roles == ROLE_QUERY  # [B, T]
            if sums is None:
                sums = torch.zeros(4, maps.shape[0], maps.shape[2], dtype=torch.float64)
            for k, role in enumerate((ROLE_UNIQUE, ROLE_CLUSTER)):
                key = roles == role
                binding = key  # the key token and, unless the task fuses them into one token, the value after it
                if getattr(task, "binding_len", 2) == 2:
                    binding = key | torch.nn.functional.pad(key, (1, 0))[:, :-1]
                for slot, where in ((k, key), (k + 2, binding)):
                    on_role = (maps * where[None, :, None, None, :]).sum(-1)  # [L, B, H, T]: mass on those positions
                    sums[slot] += (on_role * query[None, :, None, :]).sum(dim=(1, 3)).double().cpu()
            queries += int(query.sum())
            logits, _ = model(x)
            answer = (y >= 0) & query
            correct += int((logits.argmax(-1) == y)[answer].sum())
            answers += int(answer.sum())
    finally:
        model.train(was_training)
    if not queries:
        raise ConfigError("the sampled sequences have no query positions (role 3); nothing to measure")
    mean = (sums / queries).numpy()
    return {"unique": mean[0], "cluster": mean[1], "unique_binding": mean[2], "cluster_binding": mean[3],
            "n_queries": queries, "accuracy": correct / max(answers, 1)}


def format_mass(mass: dict) -> str:
    """A Markdown table: per layer, the mass on the unique binding and on the cluster's bindings (key and value
    tokens; mean over heads, and the head that gives the unique binding the most), then the key tokens alone."""
    lines = ["| layer | unique binding (mean over heads) | cluster bindings (mean) | best head for the unique binding: "
             "unique / cluster | key tokens only: unique / cluster (mean) |", "|---|---|---|---|---|"]
    for layer in range(len(mass["unique"])):
        u, c = mass["unique_binding"][layer], mass["cluster_binding"][layer]
        h = int(np.argmax(u))
        lines.append(f"| {layer} | {u.mean():.4f} | {c.mean():.4f} | head {h}: {u[h]:.4f} / {c[h]:.4f} | "
                     f"{mass['unique'][layer].mean():.4f} / {mass['cluster'][layer].mean():.4f} |")
    return "\n".join(lines) + f"\n\n{mass['n_queries']} queries; accuracy at them {mass['accuracy']:.2%}.\n"
