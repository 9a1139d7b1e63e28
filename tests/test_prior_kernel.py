"""The Triton kernel for causal attention with a per-key log-prior against the formula written out in float64.

Without a GPU the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1, set by conftest.py before the
kernels are defined) in float32, the interpreter having no bfloat16; with one they run compiled on it, in float32
and bfloat16. Every case compares the output and the gradients of q, k, v and the prior against
:func:`attnlab.functional.kernels.prior_attention_reference` in float64 (autograd), on the same inputs, at shapes
that are not multiples of the blocks (T = 1, 7, 33 with blocks of 16), with GQA and with priors of every allowed
layout. The error measure is max |x - ref| / max(max |ref|, 1): relative to the tensor's scale, absolute where the
reference is small (at T = 1 the gradients of q, k and the prior are exactly 0).

Tolerances: float32, 2e-5. The kernel accumulates at most T products and block sums in float32 (unit roundoff
6e-8) and keeps float32 through its matrix products (tl.dot with input_precision="ieee", no TF32); the errors
measured under the interpreter are 1e-7 to 1.2e-6, and a wrong mask, prior or scale errs by 1e-2 or more.
bfloat16 (GPU only), 2e-2 on the output and 5e-2 on the gradients: the reference gets the same bfloat16-rounded
inputs, so what remains is the kernel's own rounding of the weights a_ij and dS_ij to bfloat16 before their matrix
products (unit roundoff 4e-3) and of its results to bfloat16, summed over up to T terms.
"""

import pytest
import torch
from helpers import relative_error as error, require_kernels

CUDA = torch.cuda.is_available()
require_kernels()  # TRITON_INTERPRET is on without CUDA (tests/conftest.py)

from attnlab.functional import kernels  # noqa: E402

from attnlab.functional.kernels import prior_attention, prior_attention_reference  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 5e-2)}  # (output, gradients)
FLOOR = -20.0  # log of a prior floor: the very negative values a clamped magnitude prior takes


pytestmark = pytest.mark.usefixtures("one_thread")  # the interpreter's small numpy products gain nothing from threads


def make(b, h, hkv, t, d, prior, dtype, seed=0):
    """q, k, v, prior (or None) and an upstream gradient, rounded to ``dtype``; the prior stays float32."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, t, d, generator=g) for n in (h, hkv, hkv))
    do = torch.randn(b, h, t, d, generator=g)
    shapes = {"none": None, "zeros": (b, hkv, t), "kv": (b, hkv, t), "query": (b, h, t), "shared": (1, 1, t)}
    p = None
    if shapes[prior] is not None:
        p = torch.zeros(shapes[prior]) if prior == "zeros" else torch.randn(shapes[prior], generator=g) * 2
        if prior != "zeros":
            p.view(-1)[::3] = FLOOR  # every third key at the floor
    cast = [x.to(DEVICE, dtype) for x in (q, k, v, do)]
    return (*cast[:3], None if p is None else p.to(DEVICE), cast[3])


def compare(q, k, v, p, do, **blocks):
    """The kernel's output and gradients against the float64 reference's: {name: error}."""
    leaves = [x.clone().requires_grad_() for x in (q, k, v) + ((p,) if p is not None else ())]
    out = prior_attention(*leaves[:3], leaves[3] if p is not None else None, **blocks)
    out.backward(do)
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    ref = prior_attention_reference(*ref_leaves[:3], ref_leaves[3] if p is not None else None)
    ref.backward(do.double())
    assert out.dtype == q.dtype and out.shape == q.shape
    names = ["q", "k", "v", "p"]
    errors = {"out": error(out, ref)}
    for name, mine, theirs in zip(names, leaves, ref_leaves):
        assert mine.grad.shape == mine.shape and mine.grad.dtype == mine.dtype
        errors["d" + name] = error(mine.grad, theirs.grad)
    return errors


def assert_close(errors, dtype):
    out_tol, grad_tol = TOLERANCE[dtype]
    bad = {name: e for name, e in errors.items() if not e <= (out_tol if name == "out" else grad_tol)}
    assert not bad, f"errors over tolerance ({out_tol} output, {grad_tol} gradients): {bad}; all: {errors}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t", [1, 7, 33])
@pytest.mark.parametrize("prior", ["none", "zeros", "kv"])
def test_values_and_gradients(t, prior, dtype):
    """B = 2, H = 2, D = 16, blocks of 16: T below, at and across the block edge; no prior, a zero prior (must
    equal no prior), a random prior with keys at the floor."""
    assert_close(compare(*make(2, 2, 2, t, 16, prior, dtype), block_m=16, block_n=16), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("prior", ["kv", "query", "shared"])
def test_gqa(prior, dtype):
    """H = 4 query heads on Hkv = 2 K/V heads, D = 32, T = 33: the prior per K/V head (its gradient sums the
    group's query heads), per query head, and one [1, 1, T] prior broadcast over batch and heads."""
    assert_close(compare(*make(2, 4, 2, 33, 32, prior, dtype), block_m=16, block_n=16), dtype)


@pytest.mark.parametrize("blocks", [(16, 32), (32, 16)])
def test_unequal_blocks_and_odd_head_dim(blocks):
    """Query and key blocks of different sizes, and D = 20 (padded to 32 inside the kernel)."""
    dtype = DTYPES[0]
    assert_close(compare(*make(2, 4, 2, 40, 20, "kv", dtype), block_m=blocks[0], block_n=blocks[1]), dtype)


@pytest.mark.skipif(not CUDA, reason="the default blocks of 64 at a longer T: compiled kernels only (slow "
                    "under the interpreter)")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_default_blocks_on_the_gpu(dtype):
    assert_close(compare(*make(2, 4, 2, 300, 64, "kv", dtype)), dtype)


def test_one_token():
    """T = 1: the only key is the query's own, so o_0 = v_0 whatever the prior."""
    q, k, v, p, _ = make(2, 2, 2, 1, 16, "kv", torch.float32)
    out = prior_attention(q, k, v, p * 0 + 30.0, block_m=16, block_n=16)
    assert torch.allclose(out, v, atol=1e-6, rtol=0)


def test_near_duplicate_keys_are_finite():
    """Every key a copy of the first up to 1e-6, large logits (|s| up to ~200) and priors of +5 and the floor:
    the online softmax stays finite and equal to the reference."""
    q, k, v, p, do = make(2, 2, 2, 33, 16, "kv", torch.float32)
    k = (k[:, :, :1] + 1e-6 * k).contiguous()
    q = q * 12.0
    p[..., 1::4] = 5.0
    errors = compare(q, k, v, p, do, block_m=16, block_n=16)
    assert all(e == e and e < float("inf") for e in errors.values()), errors
    assert_close(errors, torch.float32)


@pytest.mark.parametrize("heads", [(2, 2), (4, 2)], ids=["mha", "gqa"])
def test_no_causal_leak(heads):
    """Changing token t's key, value and prior leaves the outputs before t exactly unchanged (t = 17 sits inside
    the second block of 16, so the masked entries share tiles with visible ones), and a loss on those outputs
    gives exactly zero gradient to the keys, values and priors from t on."""
    t = 17
    q, k, v, p, _ = make(2, heads[0], heads[1], 33, 16, "kv", torch.float32)
    before = prior_attention(q, k, v, p, block_m=16, block_n=16)
    k2, v2, p2 = k.clone(), v.clone(), p.clone()
    k2[:, :, t] += 100.0
    v2[:, :, t] -= 50.0
    p2[:, :, t] = 40.0
    after = prior_attention(q, k2, v2, p2, block_m=16, block_n=16)
    assert torch.equal(before[:, :, :t], after[:, :, :t])
    assert not torch.equal(before[:, :, t:], after[:, :, t:])  # the perturbation does reach token t
    leaves = [x.clone().requires_grad_() for x in (q, k, v, p)]
    prior_attention(*leaves, block_m=16, block_n=16)[:, :, :t].sum().backward()
    for name, leaf in zip("qkvp", leaves):
        assert torch.count_nonzero(leaf.grad[:, :, t:]) == 0, f"d{name} after token {t} is not zero"
        assert torch.count_nonzero(leaf.grad[:, :, :t]) > 0, f"d{name} before token {t} is all zero"


def test_available_here():
    assert kernels.available()


@pytest.mark.parametrize("case, match", [
    (lambda q, k, v, p: (q[0], k, v, p), r"q must be a 4-D tensor \[B, H, T, D\], got \(2, 7, 16\)"),
    (lambda q, k, v, p: (q, k[:, :, :5], v, p), r"k has shape \(2, 2, 5, 16\); allowed: \[2, Hkv, 7, 16\]"),
    (lambda q, k, v, p: (q, k, v[..., :8], p), r"v has shape \(2, 2, 7, 8\); allowed: the shape of k"),
    (lambda q, k, v, p: (q.double(), k.double(), v.double(), p), r"q has dtype torch.float64; allowed: float16"),
    (lambda q, k, v, p: (q, k.half(), v, p), r"q, k, v must share one dtype"),
    (lambda q, k, v, p: (torch.cat([q, q[:, :1]], 1), k, v, None), r"k and v have 2 heads; allowed: a divisor"),
    (lambda q, k, v, p: (q, k, v, p[..., :6]), r"prior has shape \(2, 2, 6\); allowed: \[2 or 1, 1 or 2, 7\]"),
    (lambda q, k, v, p: (q, k, v, p[:, :, None]), r"prior has shape \(2, 2, 1, 7\)"),
    (lambda q, k, v, p: (q, k, v, p.long()), r"prior must be a floating-point tensor"),
])
def test_bad_inputs_are_one_line_errors(case, match):
    q, k, v, p, _ = make(2, 2, 2, 7, 16, "kv", torch.float32)
    with pytest.raises(ValueError, match=match) as caught:
        prior_attention(*case(q, k, v, p), block_m=16, block_n=16)
    assert "\n" not in str(caught.value)


def test_bad_block_is_a_one_line_error():
    q, k, v, p, _ = make(1, 1, 1, 7, 16, "kv", torch.float32)
    with pytest.raises(ValueError, match=r"block_m=24; allowed: a power of two, at least 16"):
        prior_attention(q, k, v, p, block_m=24)


def test_too_large_for_32_bit_offsets_is_a_one_line_error():
    big = torch.zeros(1, 1, 1, 16).expand(2**15, 64, 64, 16)  # 2**31 elements as a view: no memory
    with pytest.raises(ValueError, match=r"q has 2147483648 elements; allowed: fewer than 2\*\*31") as caught:
        prior_attention(big, big, big)
    assert "\n" not in str(caught.value)
