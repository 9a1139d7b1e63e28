"""The Triton kernel for causal attention with the low-rank prefix value gate against two independent paths.

    o_i = sum_{j <= i} softmax_j(q_i . k_j * scale) g(M_ij) v_j,   M_ij = (1 - phi_j . c_i) / lam_j

with g the clamp, sigmoid or linear gate of beta and gamma (:func:`attnlab.functional.kernels.lowrank_gate_attention`).
Without a GPU the kernels run under Triton's CPU interpreter in float32; with one, compiled, in float32 and
bfloat16. Every case compares the output and the gradients of q, k, v, phi, lam, c, beta and gamma with

- :func:`attnlab.functional.kernels.lowrank_gate_attention_reference`: the formula with whole [T, T] matrices in
  float64 (autograd; its three gates written out there, not imported from the magnitude package);
- :func:`attnlab.mechanisms.magnitude.prefix_blocks.lowrank_prefix_attention` with the same gate (the PyTorch block
  path with its hand-written backward), on the same inputs in float32, K/V and the factors repeated to every query
  head as the attention layer does.

Shapes do not fill the blocks of 16 (T = 1, 7, 33), with GQA and the factors per K/V head, per query head or
broadcast. The draws put M on both sides of 0 and 1 (the clamp gate's kinks) and the linear gate's pre-activation
on both sides of 0 and 1, so every branch of every gate's derivative is exercised.

Tolerances: float32, 2e-5 on every output and gradient against both paths, as for the prior kernel: the kernel
sums at most T products and block sums in float32 (unit roundoff 6e-8) with IEEE float32 products; measured under
the interpreter, 4e-8 to 6e-6 (the largest on lam's gradient with the sigmoid gate, whose slope does not vanish
where M is large and lam small). A wrong gate, mask or factor index errs by 1e-2 or more. bfloat16 (GPU only):
2e-2 on the output, 5e-2 on the gradients, the prior kernel's bounds and reasons.
"""

import pytest
import torch
from helpers import assert_lowrank_kernel_causal, lowrank_kernel_inputs, relative_error as error, require_kernels

CUDA = torch.cuda.is_available()
require_kernels()  # TRITON_INTERPRET is on without CUDA (tests/conftest.py)

from attnlab.functional import kernels  # noqa: E402

from attnlab.functional.kernels import lowrank_gate_attention, lowrank_gate_attention_reference  # noqa: E402
from attnlab.mechanisms.magnitude.prefix_blocks import lowrank_prefix_attention  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 5e-2)}  # (output, gradients)
SCALE = 0.4
NAMES = ["q", "k", "v", "phi", "lam", "c", "beta", "gamma"]
BLOCKS = dict(block_m=16, block_n=16)
GATE_PARAMS = {"clamp": (1.7, -0.3), "sigmoid": (1.7, -0.3), "linear": (0.8, 0.2)}  # (beta, gamma)

pytestmark = pytest.mark.usefixtures("one_thread")


def make(b, h, hkv, t, d, r, factors="kv", gate="clamp", dtype=torch.float32, seed=0):
    """[q, k, v, phi, lam, c, beta, gamma] and an upstream gradient: helpers.lowrank_kernel_inputs on this module's
    device, and the gate's parameters."""
    inputs, do = lowrank_kernel_inputs(b, h, hkv, t, d, r, device=DEVICE, factors=factors, dtype=dtype, seed=seed)
    return [*inputs, *(torch.tensor(x).to(DEVICE) for x in GATE_PARAMS[gate])], do


def kernel_run(inputs, do, gate, blocks=BLOCKS):
    leaves = [x.clone().requires_grad_() for x in inputs]
    out = lowrank_gate_attention(*leaves, gate=gate, scale=SCALE, **blocks)
    out.backward(do)
    assert out.dtype == inputs[0].dtype and out.shape == inputs[0].shape
    for x, leaf in zip(inputs, leaves):
        assert leaf.grad.shape == x.shape and leaf.grad.dtype == x.dtype
    return out, [leaf.grad for leaf in leaves]


def reference_run(inputs, do, gate):
    leaves = [x.detach().double().requires_grad_() for x in inputs]
    out = lowrank_gate_attention_reference(*leaves, gate=gate, scale=SCALE)
    out.backward(do.double())
    return out, [leaf.grad for leaf in leaves]


def block_path_run(inputs, do, gate):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    q, k, v, phi, lam, c, beta, gamma = leaves
    b, h = q.shape[:2]
    k, v = (x.repeat_interleave(h // x.shape[1], dim=1) for x in (k, v))
    phi, lam, c = (x.repeat_interleave(h // x.shape[1], dim=1).expand(b, h, *x.shape[2:]) for x in (phi, lam, c))
    out = lowrank_prefix_attention(q, k, v, phi, lam, c, beta, gamma, gate=gate, scale=SCALE, block=16)
    out.backward(do)
    return out, [leaf.grad for leaf in leaves]


def check(inputs, do, gate, dtype=torch.float32, blocks=BLOCKS):
    mine = kernel_run(inputs, do, gate, blocks)
    out_tol, grad_tol = TOLERANCE[dtype]
    paths = [("the float64 reference", reference_run)]
    paths += [("lowrank_prefix_attention", block_path_run)] if dtype == torch.float32 else []
    for against, run in paths:
        ref, ref_grads = run(inputs, do, gate)
        errors = {"out": error(mine[0], ref)} | {"d" + n: error(a, b) for n, a, b in zip(NAMES, mine[1], ref_grads)}
        bad = {n: e for n, e in errors.items() if not e <= (out_tol if n == "out" else grad_tol)}
        assert not bad, f"{gate} gate against {against}: over tolerance: {bad}; all: {errors}"
    return mine


def test_the_draws_cross_every_kink():
    """M below 0, inside [0, 1] and above 1 in the lower triangle, and the linear gate's pre-activation below 0
    and above 1: each branch of the gates' derivatives is taken somewhere."""
    inputs, _ = make(2, 2, 2, 33, 16, 3)
    _, _, _, phi, lam, c, _, _ = inputs
    m = ((1.0 - c.double() @ phi.double().mT) / lam.double()[..., None, :])[..., torch.ones(33, 33).tril().bool()]
    for part in (m < 0, (m >= 0) & (m <= 1), m > 1):
        assert 0.05 < part.double().mean() < 0.9
    beta, gamma = GATE_PARAMS["linear"]
    u = beta * m + gamma
    assert (u < 0).any() and (u > 1).any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gate", list(GATE_PARAMS))
@pytest.mark.parametrize("t", [1, 7, 33])
def test_values_and_gradients(t, gate, dtype):
    """B = 2, H = 2, D = 16, r = 3, blocks of 16: T below, at and across the block edge."""
    check(*make(2, 2, 2, t, 16, 3, gate=gate, dtype=dtype), gate, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("factors", ["kv", "query", "shared"])
def test_gqa(factors, dtype):
    """H = 4 query heads on Hkv = 2 K/V heads, T = 33, the clamp gate (the layer's default)."""
    check(*make(2, 4, 2, 33, 16, 3, factors, dtype=dtype), "clamp", dtype)


@pytest.mark.parametrize("gate", list(GATE_PARAMS))
def test_backward_tiles_apart_from_the_forward(gate):
    """The backward kernels with (outer, inner) tiles of (32, 16) beside a forward of 16 x 16, T = 40, GQA: the gate's
    gradients (beta and gamma summed per query row in the dq kernel) do not depend on the tiling."""
    check(*make(1, 4, 2, 40, 16, 5, gate=gate, seed=3), gate, blocks=dict(**BLOCKS, backward_blocks=(32, 16)))


def test_numbers_for_beta_and_gamma():
    """beta and gamma given as numbers: the same output as with tensors, and no gradient is asked for them."""
    inputs, _ = make(2, 2, 2, 33, 16, 3)
    with_tensors = lowrank_gate_attention(*inputs, gate="clamp", scale=SCALE, **BLOCKS)
    with_numbers = lowrank_gate_attention(*inputs[:6], *GATE_PARAMS["clamp"], gate="clamp", scale=SCALE, **BLOCKS)
    assert torch.equal(with_tensors, with_numbers)


def test_a_gate_of_one_is_plain_causal_attention():
    """The linear gate with beta = 0, gamma = 1 passes every value whole: the output and the gradients of q, k, v
    are plain causal attention's (the per-key kernel without a prior), and the factors get exactly zero gradient."""
    inputs, do = make(2, 2, 2, 33, 16, 3, gate="linear")
    inputs[6], inputs[7] = torch.tensor(0.0, device=DEVICE), torch.tensor(1.0, device=DEVICE)
    out, grads = kernel_run(inputs, do, "linear")
    leaves = [x.clone().requires_grad_() for x in inputs[:3]]
    plain = kernels.prior_attention(*leaves, None, SCALE, **BLOCKS)
    plain.backward(do)
    assert error(out, plain) < 2e-5
    for name, grad, leaf in zip(NAMES, grads, leaves):
        assert error(grad, leaf.grad) < 2e-5, name
    for name, grad in zip(NAMES[3:6], grads[3:6]):
        assert torch.count_nonzero(grad) == 0, f"d{name} is not zero through a flat gate"


@pytest.mark.parametrize("heads", [(2, 2), (4, 2)], ids=["mha", "gqa"])
def test_no_causal_leak(heads):
    """Changing token t's key, value and factors leaves the outputs before t exactly unchanged, and a loss on those
    outputs gives exactly zero gradient to every input from t on (t = 17, inside the second block of 16)."""
    inputs, _ = make(2, heads[0], heads[1], 33, 16, 3)
    gate = inputs[6:]  # beta and gamma: the same for every token
    assert_lowrank_kernel_causal(lambda *x: lowrank_gate_attention(*x, *gate, scale=SCALE, **BLOCKS), inputs[:6], 17)


@pytest.mark.parametrize("case, match", [
    (dict(gate="seed"), r"gate='seed'; allowed: 'clamp', 'sigmoid', 'linear'"),
    (dict(beta=float("nan")), r"beta=nan; allowed: a finite number"),
    (dict(gamma=torch.zeros(2)), r"gamma has shape \(2,\) and dtype torch.float32; allowed: a number or a one-element"),
    (dict(beta="1"), r"beta='1'; allowed: a finite number"),
])
def test_bad_gates_are_one_line_errors(case, match):
    inputs, _ = make(2, 2, 2, 7, 16, 3)
    kwargs = dict(zip(NAMES, inputs)) | case
    with pytest.raises(ValueError, match=r"^lowrank_gate_attention: " + match) as caught:
        lowrank_gate_attention(**kwargs)
    assert "\n" not in str(caught.value)
