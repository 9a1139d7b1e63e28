"""Distributed data parallel helpers (``torchrun``: the RANK / WORLD_SIZE / LOCAL_RANK environment variables).

Semantics used by the trainer: ``train.batch_size`` is the *global* micro-batch. Every rank draws the same
global batch from an identically seeded generator and trains on its own contiguous slice of
``batch_size / world_size`` rows; DistributedDataParallel averages the gradients, so the update is the one a
single process would make on the whole batch (up to floating-point reduction order). Only rank 0 writes files
or prints.

Validation is shared out: rank r evaluates the validation batches i with i % world_size == r and the
(loss x rows, rows) sums are all-reduced in float64, so every rank gets the single-process value. The
logged train loss is the mean of the ranks' losses (equal slices, so the global batch mean). Dropout draws
from per-rank RNG streams (seed + rank), so with dropout > 0 results depend on the world size; without
dropout they do not (beyond reduction order). A Ctrl-C / SIGTERM is agreed on through the per-step loss
all-reduce, so all ranks stop at the same step; a KeyboardInterrupt raised on one rank alone would hang
the others in their next collective.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import ConfigError

__all__ = ["DistInfo", "dist_info", "init_distributed", "shutdown_distributed", "local_slice", "all_reduce",
           "broadcast_object", "gather_objects", "barrier"]


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} must be an integer (set by torchrun)") from None


def dist_info() -> DistInfo:
    """The rank / world size / local rank from the environment (torchrun sets them), or from an initialised group."""
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", 0))
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"RANK={rank} and WORLD_SIZE={world} are inconsistent (need 0 <= RANK < WORLD_SIZE)")
    return DistInfo(rank, world, _env_int("LOCAL_RANK", rank))


def init_distributed(info: DistInfo, device_type: str) -> bool:
    """Join the process group (nccl on CUDA, gloo otherwise) if ``info`` is distributed and none exists yet.

    Returns True if this call created the group (and :func:`shutdown_distributed` should destroy it).
    """
    if not info.enabled or dist.is_initialized():
        return False
    if not dist.is_available():
        raise ConfigError("WORLD_SIZE > 1 but this PyTorch build has no torch.distributed support")
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size)
    return True


def shutdown_distributed(owned: bool) -> None:
    """Destroy the process group if :func:`init_distributed` created it."""
    if owned and dist.is_initialized():
        dist.destroy_process_group()


def local_slice(batch_size: int, info: DistInfo) -> slice:
    """The rows of a global batch of ``batch_size`` that this rank trains on; ConfigError if not divisible."""
    if batch_size % info.world_size:
        raise ConfigError(
            f"train.batch_size={batch_size} is the global micro-batch and must be divisible by the number of "
            f"processes ({info.world_size}); use a multiple of {info.world_size}"
        )
    per_rank = batch_size // info.world_size
    return slice(info.rank * per_rank, (info.rank + 1) * per_rank)


def all_reduce(tensor: torch.Tensor, info: DistInfo, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce ("sum", "max" or "mean") of ``tensor``; a no-op when not distributed."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        if op == "mean":
            tensor /= info.world_size
    return tensor


def broadcast_object(obj, info: DistInfo):
    """Rank 0's ``obj`` on every rank."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj, info: DistInfo) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def device_for(info: DistInfo, device_type: str) -> torch.device:
    """The device of this rank: ``cuda:LOCAL_RANK`` for CUDA jobs, else the device type itself."""
    if device_type == "cuda":
        if info.enabled:
            if info.local_rank >= torch.cuda.device_count():
                raise ConfigError(
                    f"LOCAL_RANK={info.local_rank} but only {torch.cuda.device_count()} CUDA device(s) are visible"
                )
            torch.cuda.set_device(info.local_rank)
            return torch.device("cuda", info.local_rank)
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device_type)
