"""The block-wise low-rank prefix gated attention (attnlab.mechanisms.magnitude.prefix_blocks) against the formula
written out densely in float64, and the Attention layer that uses it against the explicit path."""

import pytest
import torch

from attnlab import GPT, AttentionConfig, GPTConfig
from attnlab.config import MagnitudeConfig
from attnlab.attention_config import GPU_MIN_BLOCK, prefix_block, route
from attnlab.mechanisms.magnitude.prefix_blocks import lowrank_prefix_attention
from attnlab.nn import Attention
from helpers import LEAK_TOL, VOCAB, T, max_leak, one_line_error


def _dense(q, k, v, phi, lam, c, beta, gamma, gate, scale, floor=None):
    """o_i = sum_{j <= i} softmax_j(s q_i'k_j) g((1 - phi_j'c_i) / lam_j) v_j, every matrix [T, T] (the magnitude write-up's prefix
    gate with the low-rank weights; gate() of attnlab.mechanisms.magnitude.reference written out again); with floor, o_i =
    sum_{j <= i} softmax_j(s q_i'k_j + log max(M_ij, floor)) v_j instead (the weights as a logit prior)."""
    n = q.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    m = (1.0 - c @ phi.mT) / lam[..., None, :]
    if floor is not None:
        z = scale * q @ k.mT + torch.log(torch.maximum(m, torch.tensor(floor, dtype=m.dtype)))
        return torch.softmax(z.masked_fill(~keep, float("-inf")), dim=-1) @ v
    p = torch.softmax((scale * q @ k.mT).masked_fill(~keep, float("-inf")), dim=-1)
    if gate == "clamp":
        g = torch.sigmoid(beta * m.clamp(0.0, 1.0) + gamma)
    elif gate == "sigmoid":
        g = torch.sigmoid(beta * m + gamma)
    else:
        g = (beta * m + gamma).clamp(0.0, 1.0)
    return (p * g) @ v


def _inputs(n=45, heads=3, d=6, r=5, seed=0):
    """q, k, v, phi, lam, c, beta, gamma in float64, each a leaf that requires grad. phi, lam and c are drawn
    freely (the function's contract holds for any phi, lam > 0 and c), so that M = (1 - c phi') / lam spans both
    sides of the gates' bends."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, heads, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    phi = 0.5 * torch.randn(2, heads, n, r, generator=g, dtype=torch.float64)
    c = torch.randn(2, heads, n, r, generator=g, dtype=torch.float64)
    lam = 0.2 + 0.8 * torch.rand(2, heads, n, generator=g, dtype=torch.float64)
    beta, gamma = torch.tensor(1.7, dtype=torch.float64), torch.tensor(-0.3, dtype=torch.float64)
    return [x.detach().requires_grad_() for x in (q, k, v, phi, lam, c, beta, gamma)]


@pytest.mark.parametrize("gate", ["clamp", "sigmoid", "linear"])
@pytest.mark.parametrize("block", [1, 7, 16, 64])
def test_values_and_gradients_match_the_dense_formula_in_float64(gate, block):
    """Every input's gradient (q, k, v, phi, lam, c, beta, gamma), for blocks that divide T = 45, that do not, of
    size 1 and larger than T. Tolerance 1e-10: the same sums in another order agree to ~1e-14 in float64; a wrong
    term of the hand-written backward is of order 1e-2 or more. The keys are spread so that M crosses both ends of
    the clamp ([0, 1]) and the linear gate's (clamp(1.7 M - 0.3, 0, 1)), which their gradients must respect."""
    leaves = _inputs()
    q, k, v, phi, lam, c, beta, gamma = leaves
    m = (1.0 - c @ phi.mT) / lam[..., None, :]
    lower = m[..., torch.ones(45, 45, dtype=torch.bool).tril()]
    assert (lower < 0).any() and (lower > 1).any() and ((lower > 0.2) & (lower < 0.7)).any()  # all three pieces
    out = lowrank_prefix_attention(q, k, v, phi, lam, c, beta, gamma, gate=gate, scale=0.4, block=block)
    ref = _dense(q, k, v, phi, lam, c, beta, gamma, gate, 0.4)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    weight = torch.randn_like(ref)
    grads = torch.autograd.grad((out * weight).sum(), leaves)
    ref_grads = torch.autograd.grad((ref * weight).sum(), leaves)
    for name, a, b in zip("q k v phi lam c beta gamma".split(), grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=lambda text, name=name: f"d{name}: {text}")


@pytest.mark.parametrize("block", [1, 16, 64])
def test_the_logit_prior_matches_the_dense_formula_in_float64(block):
    """prior_floor: softmax(z + log max(M, floor)); values and the gradients of q, k, v, phi, lam and c to 1e-10
    (as above), with M below the floor in part of the lower triangle (there the prior is flat: no gradient)."""
    leaves = _inputs()
    q, k, v, phi, lam, c, beta, gamma = leaves
    floor = 0.05
    lower = ((1.0 - c @ phi.mT) / lam[..., None, :])[..., torch.ones(45, 45, dtype=torch.bool).tril()]
    assert (lower < floor).any() and (lower > floor).any()
    out = lowrank_prefix_attention(q, k, v, phi, lam, c, scale=0.4, prior_floor=floor, block=block)
    ref = _dense(q, k, v, phi, lam, c, beta, gamma, "clamp", 0.4, floor=floor)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    weight = torch.randn_like(ref)
    grads = torch.autograd.grad((out * weight).sum(), leaves[:6])
    ref_grads = torch.autograd.grad((ref * weight).sum(), leaves[:6])
    for name, a, b in zip("q k v phi lam c".split(), grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=lambda text, name=name: f"d{name}: {text}")


@pytest.mark.slow  # the float64 gradients above already match the block path's to 1e-10; CI runs it with the slow tests
def test_gradcheck():
    """torch.autograd.gradcheck (finite differences in float64) on a small problem with blocks of 4."""
    leaves = _inputs(n=10, heads=2, d=3, r=3, seed=1)

    def fn(*xs):
        return lowrank_prefix_attention(*xs, gate="clamp", scale=0.5, block=4)

    assert torch.autograd.gradcheck(fn, tuple(leaves), eps=1e-6, atol=1e-7)
    prior = lambda *xs: lowrank_prefix_attention(*xs, scale=0.5, prior_floor=0.05, block=4)  # noqa: E731
    assert torch.autograd.gradcheck(prior, tuple(leaves[:6]), eps=1e-6, atol=1e-7)


def test_bad_gate_and_shapes_get_one_line_errors():
    q, k, v, phi, lam, c, beta, gamma = _inputs(n=8)
    with pytest.raises(ValueError, match="gate='tanh' is not allowed; choose one of: 'clamp', 'sigmoid', 'linear'"):
        lowrank_prefix_attention(q, k, v, phi, lam, c, beta, gamma, gate="tanh", scale=1.0)
    with pytest.raises(ValueError, match="prior_floor=0.0 must be > 0"):
        lowrank_prefix_attention(q, k, v, phi, lam, c, scale=1.0, prior_floor=0.0)
    with pytest.raises(ValueError, match="needs as many keys as queries"):
        lowrank_prefix_attention(q[..., :4, :], k, v, phi, lam, c, beta, gamma, scale=1.0)


def _layers(gate="clamp", n_kv_head=None, n=40, apply="values"):
    """The same lowrank prefix layer twice, fused (backend auto) and on the explicit path, float64."""
    attn = {"magnitude": "prefix", "magnitude_solver": "lowrank", "magnitude_rank": 6, "magnitude_chunk": 8,
            "magnitude_eps": 0.05, "n_kv_head": n_kv_head, "magnitude_apply": apply}
    if apply == "values":
        attn["magnitude_gate"] = gate
    cfg = GPTConfig(block_size=n, n_head=4, n_embd=32, attention=attn).resolved_attention()
    fused = Attention(cfg, 32).double()
    explicit = Attention(cfg.replace(backend="explicit"), 32).double()
    explicit.load_state_dict(fused.state_dict())
    return fused, explicit


@pytest.mark.parametrize("gate,n_kv_head,apply", [("clamp", None, "values"), ("linear", 2, "values"),
                                                  ("sigmoid", 1, "values"), (None, 2, "logits")])
def test_the_layer_takes_the_block_path_and_agrees_with_the_explicit_one(gate, n_kv_head, apply):
    """Attention with magnitude="prefix" and solver "lowrank", gated values or the logit prior, runs
    lowrank_prefix_attention unless backend="explicit" (then the [T, T] gate or prior goes through attention());
    same output and parameter gradients to 1e-10 in float64, with GQA / MQA."""
    fused, explicit = _layers(gate, n_kv_head, apply=apply)
    assert route(fused.config).path == "prefix_blocks" and route(explicit.config).path == "explicit"
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    out_f, out_e = fused(x), explicit(x)
    torch.testing.assert_close(out_f, out_e, rtol=0, atol=1e-10)
    out_f.square().sum().backward()
    out_e.square().sum().backward()
    for (name, a), b in zip(fused.named_parameters(), explicit.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-10, msg=lambda text, name=name: f"{name}: {text}")


def test_the_block_path_under_bfloat16_autocast():
    """Under CPU autocast (bfloat16) the layer's logits and values run in bfloat16 and M, the gate in float32: the
    output and the input gradient stay within bfloat16 rounding (3e-2, about four of its steps at these magnitudes)
    of the float32 layer's, and every parameter gets a finite gradient."""
    fused, _ = _layers()
    fused = fused.float()
    x = torch.randn(2, 40, 32, requires_grad=True)
    ref = fused(x)
    (gx_ref,) = torch.autograd.grad(ref.sum(), x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused(x)
    assert out.dtype == torch.bfloat16
    (gx,) = torch.autograd.grad(out.float().sum(), x)
    assert (out.float() - ref).abs().max() < 3e-2 and (gx - gx_ref).abs().max() < 3e-2 * gx_ref.abs().max()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused(x).float().square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in fused.parameters())


@pytest.mark.parametrize("apply", ["values", "logits"])
def test_the_block_path_does_not_leak_the_future(apply):
    """The perturbation leak test (tests/test_causal_leak.py's bound) on a GPT whose layers take the block path,
    T = 16 with blocks of 3 (the layer's block is magnitude_chunk): a query block ends inside a key block."""
    cfg = GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=2, n_head=4, n_embd=32,
                    attention={"magnitude": "prefix", "magnitude_solver": "lowrank", "magnitude_rank": 5,
                               "magnitude_chunk": 3, "magnitude_apply": apply})
    model = GPT(cfg)
    assert all(route(block.attn.config).path == "prefix_blocks" for block in model.blocks)
    assert max_leak(model) < LEAK_TOL


def test_the_block_is_a_config_value_and_by_default_the_chunk_on_the_cpu_and_at_least_256_elsewhere(monkeypatch):
    """prefix_block: magnitude_block when set; otherwise magnitude_chunk on the CPU and max(chunk, 256) on other
    devices, where every block costs a fixed number of kernel launches (docs/speed.md has the chunk sweep). The
    layer passes the block of its config for the device of its inputs (captured here on the CPU)."""
    import attnlab.nn.attention as attention_module

    def cfg(**extra):
        return AttentionConfig(magnitude={"form": "prefix", "solver": "lowrank", **extra})

    assert GPU_MIN_BLOCK == 256
    assert [prefix_block(cfg(), "cpu"), prefix_block(cfg(chunk=300), "cpu"), prefix_block(cfg(), "cuda"),
            prefix_block(cfg(chunk=512), "cuda")] == [64, 300, 256, 512]
    assert [prefix_block(cfg(block=16), device) for device in ("cpu", "cuda")] == [16, 16]
    one_line_error(lambda: cfg(block=0), "attention.magnitude.block")
    seen = []

    def spy(*args, block, **kwargs):
        seen.append(block)
        return lowrank_prefix_attention(*args, block=block, **kwargs)

    monkeypatch.setattr(attention_module, "lowrank_prefix_attention", spy)
    for extra in ({"magnitude_chunk": 24}, {"magnitude_chunk": 24, "magnitude_block": 7}):
        gpt = GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=1, n_head=2, n_embd=16,
                        attention={"magnitude": "prefix", "magnitude_solver": "lowrank", "magnitude_rank": 4, **extra})
        Attention(gpt.resolved_attention(), 16)(torch.randn(1, T, 16))
    assert seen == [24, 7]


def test_a_request_that_forces_a_slower_route_is_said_once(caplog):
    """Returning the weights or attention dropout in training take the prefix form off its blocks: route() names
    the reason and the fallback, the layer logs it once per reason, and the output is still the same function."""
    from attnlab.attention_config import say_route

    base = AttentionConfig(magnitude=MagnitudeConfig("prefix", solver="lowrank", apply="logits"))
    assert route(base) == ("prefix_blocks", None, False)
    weights = route(base, return_weights=True)
    assert weights.path == "explicit" and "weights" in weights.forced and "prefix_blocks" in weights.forced
    dropped = route(base, dropout=True)  # the logit prior keeps SDPA, which takes dropout
    assert dropped.path == "sdpa" and "dropout" in dropped.forced
    assert route(base.replace(magnitude=base.magnitude.replace(apply="values")), dropout=True).path == "explicit"
    assert route(AttentionConfig(), return_weights=True).path == "explicit"
    assert route(AttentionConfig(), dropout=True) == ("sdpa", None, True)
    one_line_error(lambda: route(AttentionConfig(backend="sdpa"), return_weights=True), "backend='sdpa'")
    say_route.cache_clear()
    layer = _layers("clamp", None)[0]
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    with caplog.at_level("INFO", logger="attnlab"):
        for _ in range(3):
            out, _ = layer(x, return_weights=True)
    assert [r.getMessage() for r in caplog.records].count(f"attention: {route(layer.config, return_weights=True).forced}") == 1
    torch.testing.assert_close(out, layer(x), rtol=0, atol=1e-10)
