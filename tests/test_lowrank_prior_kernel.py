"""The Triton kernel for causal attention with the low-rank prefix magnitude prior against two independent paths.

    o_i = sum_{j <= i} softmax_j(q_i . k_j * scale + log max(M_ij, floor)) v_j,   M_ij = (1 - phi_j . c_i) / lam_j

Without a GPU the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1, set by conftest.py before the
kernels are defined) in float32; with one they run compiled on it, in float32 and bfloat16. Every case compares the
output and the gradients of q, k, v, phi, lam and c with

- :func:`attnlab.functional.kernels.lowrank_prior_attention_reference`: the formula with whole [T, T] matrices in
  float64 (autograd), on the same inputs;
- :func:`attnlab.mechanisms.magnitude.prefix_blocks.lowrank_prefix_attention` with ``prior_floor`` (the PyTorch
  block path the kernel is to replace, with its hand-written backward), on the same inputs in the same dtype, with
  K/V and the factors repeated to every query head as the attention layer does (autograd sums the repeats back).

Shapes do not fill the blocks of 16 (T = 1, 7, 33; ranks 1, 3, 8 padded to 16, 17 to 32, and 64), with GQA and the
factors per K/V head, per query head or broadcast; the factors are drawn so that M crosses the floor (about one
entry in eight of the lower triangle sits below it, where every factor gradient must vanish).
The error measure is max |x - ref| / max(max |ref|, 1): relative to the tensor's scale, absolute where the
reference is small (at T = 1 every gradient but v's is exactly 0).

Tolerances: float32, 2e-5 on the output and the gradients of q, k, v, 5e-5 on those of phi, lam and c, against
both. The kernel accumulates at most T products and block sums in float32 (unit roundoff 6e-8) and keeps IEEE
float32 through its products (no TF32); the factor gradients weight dS by 1 / w, w = 1 - phi . c (G = dS / w,
which the kernel forms as exp(z - lse) (da - delta) / lam without dividing), so their sums are led by the terms where
M sits just above the floor (there w = lam M >= 0.01) and carry those terms' rounding. Measured
under the interpreter over the T, rank and GQA cases: output and dq, dk, dv 2e-7 to 7e-7 against float64 and
against the block path; dphi, dlam, dc up to 3.5e-6 against float64 and 8e-6 against the float32 block path (whose
own error against float64 is of that size). A wrong mask, floor, sign or factor index errs by 1e-2 or more.
bfloat16 (GPU only; q, k, v in bfloat16, the factors in float32): 2e-2 on the output, 5e-2 on every gradient, as the
per-key kernel's test argues: the reference gets the same bfloat16-rounded inputs, and what remains is the kernel's
rounding of a_ij and dS_ij to bfloat16 before its products and of o (hence delta_i) to bfloat16; the factor
gradients' products take G in TF32 (2^-11, finer than bfloat16's 2^-8).
"""

import pytest
import torch
from helpers import assert_lowrank_kernel_causal, lowrank_kernel_inputs, relative_error as error, require_kernels

CUDA = torch.cuda.is_available()
require_kernels()  # TRITON_INTERPRET is on without CUDA (tests/conftest.py)

from attnlab.functional import kernels  # noqa: E402

from attnlab.functional.kernels import (  # noqa: E402
    lowrank_prior_attention, lowrank_prior_attention_reference, prior_attention)
from attnlab.mechanisms.magnitude.prefix_blocks import lowrank_prefix_attention  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]
TOLERANCE = {torch.float32: (2e-5, 2e-5, 5e-5), torch.bfloat16: (2e-2, 5e-2, 5e-2)}  # (output, dq dk dv, factors)
FLOOR = 0.05  # M_ij = (1 - phi_j . c_i) / lam_j below this in ~1/8 of the lower triangle for the draws of make()
SCALE = 0.4
NAMES = ["q", "k", "v", "phi", "lam", "c"]
BLOCKS = dict(block_m=16, block_n=16)


pytestmark = pytest.mark.usefixtures("one_thread")  # the interpreter's small numpy products gain nothing from threads


def make(b, h, hkv, t, d, r, factors="kv", dtype=torch.float32, seed=0):
    """[q, k, v, phi, lam, c] and an upstream gradient (helpers.lowrank_kernel_inputs on this module's device)."""
    return lowrank_kernel_inputs(b, h, hkv, t, d, r, device=DEVICE, factors=factors, dtype=dtype, seed=seed)


def kernel_run(inputs, do, floor=FLOOR, blocks=BLOCKS):
    """(output, [gradients of q, k, v, phi, lam, c]) of the kernel; blocks={} takes the default blocks."""
    leaves = [x.clone().requires_grad_() for x in inputs]
    out = lowrank_prior_attention(*leaves, prior_floor=floor, scale=SCALE, **blocks)
    out.backward(do)
    assert out.dtype == inputs[0].dtype and out.shape == inputs[0].shape
    for x, leaf in zip(inputs, leaves):
        assert leaf.grad.shape == x.shape and leaf.grad.dtype == x.dtype
    return out, [leaf.grad for leaf in leaves]


def reference_run(inputs, do, floor=FLOOR):
    leaves = [x.detach().double().requires_grad_() for x in inputs]
    out = lowrank_prior_attention_reference(*leaves, floor, SCALE)
    out.backward(do.double())
    return out, [leaf.grad for leaf in leaves]


def block_path_run(inputs, do, floor=FLOOR):
    """The PyTorch block path on the same inputs: K/V and factors repeated to every query head (head h reads K/V
    head h // (H / Hkv), as repeat_kv orders them), a batch of 1 expanded; gradients back through the repeats."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    q, k, v, phi, lam, c = leaves
    b, h = q.shape[:2]
    k, v = (x.repeat_interleave(h // x.shape[1], dim=1) for x in (k, v))
    phi, lam, c = (x.repeat_interleave(h // x.shape[1], dim=1).expand(b, h, *x.shape[2:]) for x in (phi, lam, c))
    out = lowrank_prefix_attention(q, k, v, phi, lam, c, scale=SCALE, prior_floor=floor, block=16)
    out.backward(do)
    return out, [leaf.grad for leaf in leaves]


def errors_against(mine, theirs):
    (out, grads), (ref, ref_grads) = mine, theirs
    errors = {"out": error(out, ref)}
    errors.update({"d" + name: error(a, b) for name, a, b in zip(NAMES, grads, ref_grads)})
    return errors


def assert_close(errors, dtype, against, looser=None):
    """Every error within TOLERANCE[dtype]; looser: {name: a larger tolerance} for named ones."""
    out_tol, qkv_tol, factor_tol = TOLERANCE[dtype]
    tolerance = {"out": out_tol, "dq": qkv_tol, "dk": qkv_tol, "dv": qkv_tol, "dphi": factor_tol, "dlam": factor_tol,
                 "dc": factor_tol} | (looser or {})
    bad = {name: e for name, e in errors.items() if not e <= tolerance[name]}
    assert not bad, f"against {against}: over tolerance {tolerance}: {bad}; all: {errors}"


def check(inputs, do, dtype=torch.float32, blocks=BLOCKS, looser=None):
    """The kernel against the float64 reference and, in float32, against the block path."""
    mine = kernel_run(inputs, do, blocks=blocks)
    assert_close(errors_against(mine, reference_run(inputs, do)), dtype, "the float64 reference", looser)
    if dtype == torch.float32:  # the block path computes its logits in q's dtype: compare like with like
        assert_close(errors_against(mine, block_path_run(inputs, do)), dtype, "lowrank_prefix_attention", looser)
    return mine


def below_floor_fraction(inputs):
    q, _, _, phi, lam, c = inputs
    t = q.shape[2]
    m = (1.0 - c.double() @ phi.double().mT) / lam.double()[..., None, :]
    return (m[..., torch.ones(t, t, dtype=torch.bool, device=m.device).tril()] < FLOOR).double().mean().item()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("r", [1, 3, 8])
@pytest.mark.parametrize("t", [1, 7, 33])
def test_values_and_gradients(t, r, dtype):
    """B = 2, H = 2, D = 16, blocks of 16: T below, at and across the block edge, ranks padded to 16."""
    inputs, do = make(2, 2, 2, t, 16, r, dtype=dtype)
    if t > 1:
        assert 0.02 < below_floor_fraction(inputs) < 0.5  # both sides of the floor are exercised
    check(inputs, do, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("factors", ["kv", "query", "shared"])
def test_gqa(factors, dtype):
    """H = 4 query heads on Hkv = 2 K/V heads, T = 33, r = 3: factors per K/V head (their gradients sum the group's
    query heads), per query head, and one [1, 1, T, r] set broadcast over batch and heads."""
    check(*make(2, 4, 2, 33, 16, 3, factors, dtype=dtype), dtype)


@pytest.mark.parametrize("r, d, blocks", [(17, 20, (16, 32)), (64, 16, (32, 16))])
def test_large_ranks_odd_head_dim_and_unequal_blocks(r, d, blocks):
    """r = 17 (padded to 32) with D = 20 (padded to 32) and r = 64 (the largest), with unequal query and key
    blocks, T = 40, GQA."""
    inputs, do = make(1, 2, 1, 40, d, r)
    inputs[3] = inputs[3] / r ** 0.5  # phi . c keeps the spread of the rank-1 to 8 cases
    check(inputs, do, blocks=dict(block_m=blocks[0], block_n=blocks[1]))


@pytest.mark.parametrize("backward_blocks", [(32, 16), (16, 32), (64, 16), (64, 32)])
def test_backward_tiles_apart_from_the_forward(backward_blocks):
    """The backward kernels with their own (outer, inner) tiles: the dK/dV kernel owns `outer` keys and steps over
    `inner` queries, the dq kernel the reverse, beside a forward of 16 x 16 (T = 40 crosses several tiles of each
    and ends inside one; GQA with factors per K/V head). The forward is the same launch, so only the gradients can
    move."""
    inputs, do = make(1, 4, 2, 40, 16, 5, seed=3)
    check(inputs, do, blocks=dict(**BLOCKS, backward_blocks=backward_blocks))


@pytest.mark.skipif(not CUDA, reason="the default blocks of 64 at a longer T: compiled kernels only (slow "
                    "under the interpreter)")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_default_blocks_on_the_gpu(dtype):
    inputs, do = make(2, 4, 2, 300, 64, 16, dtype=dtype)
    inputs[3] = inputs[3] / 2.0  # phi . c keeps the spread of the rank-1 to 8 cases
    check(inputs, do, dtype, blocks={})


def test_a_floor_above_every_weight_is_plain_causal_attention():
    """With the floor above every M_ij the prior is the constant log(floor): the output and the gradients of q, k, v
    are plain causal attention's (the per-key kernel without a prior; up to 1.3e-6 apart under the interpreter, dq's
    error: the kernel shifts the scores by log2 lambda_j and weights them by floor lambda_j, which the constant
    prior cancels only up to rounding), and the factors get exactly zero gradient."""
    inputs, do = make(2, 2, 2, 33, 16, 3)
    out, grads = kernel_run(inputs, do, floor=1e6)
    plain_leaves = [x.clone().requires_grad_() for x in inputs[:3]]
    plain = prior_attention(*plain_leaves, None, SCALE, **BLOCKS)
    plain.backward(do)
    errors = {"out": error(out, plain)}
    errors.update({"d" + name: error(grad, leaf.grad) for name, grad, leaf in zip(NAMES, grads, plain_leaves)})
    assert_close(errors, torch.float32, "prior_attention without a prior")
    for name, grad in zip(NAMES[3:], grads[3:]):
        assert torch.count_nonzero(grad) == 0, f"d{name} is not zero with every M below the floor"


@pytest.mark.parametrize("floor, lam_range", [(1e-20, (1e-6, 1e3)), (1e-12, (1e-12, 1e6))],
                         ids=["tiny-floor", "wide-lambda"])
def test_small_floor_lambda_products_stay_finite_and_exact(floor, lam_range):
    """The kernels take exp(z - log lambda_j) times max(w, floor lambda_j) with the running maximum over z - log
    lambda alone (lowrank's docstring): the row sum is at least floor lambda_j and each backward exponential at most
    1 / (floor lambda_j). With floor lambda_j down to 1e-26 and lambda over 18 decades, the output and every
    gradient stay finite and within the float32 tolerances of the float64 reference (measured under the
    interpreter: 1.4e-6 at most on the output and dq, dk, dv, 3.0e-6 on the factors' gradients)."""
    inputs, do = make(2, 2, 2, 33, 16, 3)
    g = torch.Generator().manual_seed(1)
    low, high = (torch.log(torch.tensor(x)).item() for x in lam_range)
    inputs[4] = torch.exp(torch.empty(inputs[4].shape).uniform_(low, high, generator=g)).to(DEVICE)
    mine = kernel_run(inputs, do, floor=floor)
    assert all(torch.isfinite(x).all() for x in [mine[0], *mine[1]])
    assert_close(errors_against(mine, reference_run(inputs, do, floor=floor)), torch.float32,
                 "the float64 reference")


def test_one_token():
    """T = 1: the only key is the query's own, so o_0 = v_0 whatever the factors."""
    inputs, _ = make(2, 2, 2, 1, 16, 3)
    out = lowrank_prior_attention(*inputs, prior_floor=FLOOR, **BLOCKS)
    assert torch.allclose(out, inputs[2], atol=1e-6, rtol=0)


def test_factors_in_other_dtypes():
    """Float64 factors are read in float32; their gradients come back in float64."""
    inputs, do = make(2, 2, 2, 7, 16, 3)
    inputs[3:] = [x.double() for x in inputs[3:]]
    check(inputs, do)


def test_near_duplicate_keys_are_finite():
    """Every key (and every phi) a copy of the first up to 1e-6 and large logits (|s| up to ~80): the online
    softmax stays finite and equal to both references. dc to 1e-4: with every phi_j nearly phi_0, dc_i =
    -sum_j (dS_ij / w_ij) phi_j ~ -(phi_0 / w_i) sum_j dS_ij, and sum_j dS_ij = 0 (softmax), so dc_i is what is left
    of T terms of size |dS| / w that cancel; float32 keeps ~eps T max |dS / w| of them, 2.4e-5 here for the kernel
    and 2.1e-5 for the float32 block path against float64 (the two agree to 9e-6)."""
    inputs, do = make(2, 2, 2, 33, 16, 3)
    q, k, _, phi, _, _ = inputs
    inputs[1] = (k[:, :, :1] + 1e-6 * k).contiguous()
    inputs[3] = (phi[:, :, :1] + 1e-6 * phi).contiguous()
    inputs[0] = q * 12.0
    out, grads = check(inputs, do, looser={"dc": 1e-4})
    assert all(torch.isfinite(x).all() for x in [out, *grads])


@pytest.mark.parametrize("heads", [(2, 2), (4, 2)], ids=["mha", "gqa"])
def test_no_causal_leak(heads):
    """Changing token t's key, value and factors (phi_t, lam_t, c_t) leaves the outputs before t exactly
    unchanged (t = 17 sits inside the second block of 16, so masked entries share tiles with visible ones), and a
    loss on those outputs gives exactly zero gradient to every input from t on."""
    inputs, _ = make(2, heads[0], heads[1], 33, 16, 3)
    assert_lowrank_kernel_causal(lambda *x: lowrank_prior_attention(*x, prior_floor=FLOOR, **BLOCKS), inputs, 17)


def test_available_here():
    assert kernels.available()


@pytest.mark.parametrize("case, match", [
    (lambda x: x.update(q=x["q"][0]), r"q must be a 4-D tensor \[B, H, T, D\], got \(2, 7, 16\)"),
    (lambda x: x.update(k=x["k"][:, :, :5]), r"k has shape \(2, 2, 5, 16\); allowed: \[2, Hkv, 7, 16\]"),
    (lambda x: x.update(v=x["v"][..., :8]), r"v has shape \(2, 2, 7, 8\); allowed: the shape of k"),
    (lambda x: x.update(q=x["q"].double()), r"q has dtype torch.float64; allowed: float16"),
    (lambda x: x.update(k=x["k"].half()), r"q, k, v must share one dtype"),
    (lambda x: x.update(q=torch.cat([x["q"], x["q"][:, :1]], 1)), r"k and v have 2 heads; allowed: a divisor"),
    (lambda x: x.update(phi=x["phi"][:, :, :6]), r"phi has shape \(2, 2, 6, 3\); allowed: \[2 or 1, 1 or 2, 7, r\]"),
    (lambda x: x.update(phi=x["phi"][..., 0]), r"phi has shape \(2, 2, 7\); allowed"),
    (lambda x: x.update(phi=x["phi"].new_zeros(2, 2, 7, 65)), r"rank 65 \(phi's last dimension\); allowed: 1 to 64"),
    (lambda x: x.update(c=x["c"][..., :2]), r"c has shape \(2, 2, 7, 2\); allowed: the shape of phi"),
    (lambda x: x.update(lam=x["lam"][:, :1]), r"lam has shape \(2, 1, 7\); allowed: phi's shape without its rank"),
    (lambda x: x.update(lam=x["lam"].long()), r"lam must be a floating-point tensor"),
    (lambda x: x.update(prior_floor=0.0), r"prior_floor=0.0; allowed: a finite number > 0"),
    (lambda x: x.update(prior_floor=float("nan")), r"prior_floor=nan; allowed"),
    (lambda x: x.update(scale=float("inf")), r"scale inf; allowed: a finite number or None"),
    (lambda x: x.update(block_m=24), r"block_m=24; allowed: a power of two, at least 16"),
    (lambda x: x.update(backward_blocks=(64, 8)), r"backward_blocks=\(64, 8\); allowed: None or \(outer, inner\)"),
    (lambda x: x.update(backward_blocks=64), r"backward_blocks=64; allowed: None or \(outer, inner\), two powers"),
])
def test_bad_inputs_are_one_line_errors(case, match):
    inputs, _ = make(2, 2, 2, 7, 16, 3)
    kwargs = dict(zip(NAMES, inputs), prior_floor=FLOOR, block_m=16)
    case(kwargs)
    with pytest.raises(ValueError, match=r"^lowrank_prior_attention: " + match) as caught:
        lowrank_prior_attention(**kwargs)
    assert "\n" not in str(caught.value)


def test_too_large_for_32_bit_offsets_is_a_one_line_error():
    big = torch.zeros(1, 1, 1, 16).expand(2**15, 64, 64, 16)  # 2**31 elements as a view: no memory
    phi = torch.zeros(1, 1, 64, 1)
    with pytest.raises(ValueError, match=r"q has 2147483648 elements; allowed: fewer than 2\*\*31") as caught:
        lowrank_prior_attention(big, big, big, phi, phi[..., 0], phi, prior_floor=FLOOR)
    assert "\n" not in str(caught.value)
