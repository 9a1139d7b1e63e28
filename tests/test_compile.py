"""torch.compile (train.compile=true) works for every registered variant and for the low-rank magnitude solver: the
compiled model's loss equals eager's and its backward pass runs. Slow (inductor compiles each model). The exact magnitude kernel runs eagerly inside the compiled graph (torch.compiler.disable): its
in-place writes into slices and data-dependent jitter retries do not trace."""

import pytest
import torch

from attnlab import GPT, GPTConfig, variants
from helpers import fit_rank

LOWRANK = {f"lowrank-{form}": {"magnitude": form, "magnitude_solver": "lowrank", "magnitude_rank": 8,
                               "magnitude_chunk": 8} for form in ("causal", "prefix")}


STOCHASTIC = {"coda"}  # variants that sample in training (CODA's logit noise)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*variants(), *LOWRANK])
def test_compiled_loss_matches_eager(name):
    """Tolerance 1e-4 (the specified one): inductor may fuse and reorder float32 reductions (~1e-6 here)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=37, block_size=16, n_layer=2 if name in STOCHASTIC else 1, n_head=2, n_embd=32,
                          attention=fit_rank(LOWRANK.get(name, name), 16)))
    x = torch.randint(0, 37, (2, 16), generator=torch.Generator().manual_seed(1))
    if name in STOCHASTIC:  # noise in training: compare the deterministic evaluation path, then train compiled
        model.eval()
    eager = model(x, x)[1]
    compiled = torch.compile(model)(x, x)[1]
    assert abs(compiled.item() - eager.item()) < 1e-4
    if name in STOCHASTIC:
        model.train()
        compiled = torch.compile(model)(x, x)[1]
    compiled.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
