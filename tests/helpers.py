"""What several test files share, in one module (test files do not import each other):

* :func:`attention_ref`: float64 attention written straight from the formulas, in numpy loops, independent of
  attnlab's torch code;
* :func:`max_leak` / :func:`build` / ``LEAK_TOL``: the causality (perturbation leak) check;
* :func:`one_line_error`: a call must raise a one-line ConfigError containing given fragments;
* :func:`tiny`: the tiny preset's RunConfig in a test's directories, with overrides;
* :func:`last_logged`: per seed, the last value a shipped comparison's runs logged for a metric;
* :func:`extreme_logit_inputs`: q, k, v whose logits are +-80 on keys that differ by 1e-6 (finiteness tests);
* :func:`require_kernels` / :func:`lowrank_kernel_inputs` / :func:`relative_error` /
  :func:`assert_lowrank_kernel_causal`: what the Triton kernel tests share.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig, get_variant
from attnlab.configio import apply_overrides
from attnlab.errors import ConfigError
from attnlab.presets import load_preset

VOCAB, T = 37, 16  # the leak check's model: vocabulary and context
LEAK_TOL = 1e-6  # float64: only rounding (~1e-15) may differ; the bound is the one the causality tests were specified with


def attention_ref(q, k, v, *, causal=False, scale=None, temperature=1.0, kernel="dot", normalizer="softmax",
                  mask_form="additive", attn_mask=None):
    """o_i = sum_j p_ij v_j for every batch b and head h, one query row at a time.

    q [B, H, T, d], k/v [B, Hkv, S, d]; head h reads K/V head h // (H / Hkv). Causal: query i sits at position
    S - T + i. attn_mask (broadcast to [B, H, T, S]): boolean, key j hidden from query i where False, or float,
    added to z (-inf hides). A query that sees no key gets p = 0.
    Returns (out [B, H, T, dv], weights [B, H, T, S]) as float64 numpy arrays.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    b_, h_, t_, d = q.shape
    s_ = k.shape[2]
    mask = None if attn_mask is None else np.broadcast_to(np.asarray(attn_mask), (b_, h_, t_, s_))
    allowed = np.ones((b_, h_, t_, s_), dtype=bool) if mask is None else (mask if mask.dtype == bool else mask > -np.inf)
    bias = np.zeros((b_, h_, t_, s_)) if mask is None or mask.dtype == bool else np.where(allowed, mask, 0.0)
    group = h_ // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((b_, h_, t_, v.shape[-1]))
    weights = np.zeros((b_, h_, t_, s_))
    for b in range(b_):
        for h in range(h_):
            kh, vh = k[b, h // group], v[b, h // group]
            for i in range(t_):
                if kernel == "dot":
                    z = np.array([q[b, h, i] @ kh[j] for j in range(s_)]) * scale / temperature
                else:  # Gaussian kernel exp(-||q-k||^2 / (2 sigma^2)), sigma^2 = T / scale
                    z = np.array([-np.sum((q[b, h, i] - kh[j]) ** 2) for j in range(s_)]) * scale / (2 * temperature)
                z = z + bias[b, h, i]
                ok = allowed[b, h, i]
                visible = (np.arange(s_) <= s_ - t_ + i if causal else np.ones(s_, dtype=bool)) & ok
                if not visible.any():
                    p = np.zeros(s_)
                elif normalizer == "softmax":
                    if causal and mask_form == "renormalize":
                        a = np.where(ok, np.exp(z - z[ok].max()), 0.0)
                        a /= a.sum()  # A = softmax(z) over every key the mask leaves
                        p = np.where(visible, a, 0.0) / a[visible].sum()  # Mask(A)
                    else:
                        e = np.where(visible, np.exp(z - z[visible].max()), 0.0)
                        p = e / e.sum()
                else:
                    raw = z if kernel == "dot" else np.exp(z)
                    p = np.where(visible, raw, 0.0)
                weights[b, h, i] = p
                out[b, h, i] = p @ vh
    return out, weights


def max_leak(model: GPT, positions=(0, 3, 8, 14), device: str | torch.device = "cpu") -> float:
    """Largest change of logits[:, :i+1] when tokens i+1.. (of T random tokens from the model's vocabulary) are
    replaced, over the given positions i; the model runs in float64 on ``device``."""
    model = model.double().to(device).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, vocab, (2, T), generator=g)
    with torch.no_grad():
        base = model(idx.to(device))[0]
        worst = 0.0
        for i in positions:
            perturbed = idx.clone()
            perturbed[:, i + 1:] = (idx[:, i + 1:] + 1 + torch.randint(0, vocab - 1, (2, T - i - 1), generator=g)) % vocab
            out = model(perturbed.to(device))[0]
            worst = max(worst, (out[:, : i + 1] - base[:, : i + 1]).abs().max().item())
            assert (out[:, i + 1:] - base[:, i + 1:]).abs().max() > 1e-6  # the perturbation does reach the future
    return worst


def fit_rank(attention, block_size: int):
    """attention (a variant name or an AttentionConfig) with a low-rank solver's rank cut to block_size, so that the
    registered low-rank variants (r = 32) build at the small contexts of the tests; anything else unchanged."""
    from attnlab import AttentionConfig, get_variant

    cfg = get_variant(attention) if isinstance(attention, str) else attention
    m = cfg.magnitude if isinstance(cfg, AttentionConfig) else None
    if m is not None and m.solver == "lowrank" and m.rank > block_size:
        return cfg.replace(magnitude=m.replace(rank=block_size))
    return attention


def build(attention, pos="learned", **kw) -> GPT:
    """The leak check's model (T = 16); a low-rank variant gets r = 16 (:func:`fit_rank`)."""
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=2, n_head=4, n_embd=32,
                         attention=fit_rank(attention, T), pos_encoding=pos, **kw))


def alibi_refused(variant: str, pos: str) -> bool:
    """Whether a GPT refuses this variant with these positions: ALiBi is a logit bias inside a softmax, so the
    variants with another normalizer refuse pos_encoding='alibi' with one line (tests/test_alibi.py checks it)."""
    return pos == "alibi" and get_variant(variant).normalizer != "softmax"


def one_line_error(fn, *patterns):
    with pytest.raises(ConfigError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg
    for p in patterns:
        assert p in msg, msg
    return msg


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def tiny(out_dir, cache_dir, **overrides) :
    """The tiny preset writing to out_dir; overrides like train__max_steps=8 or model__dropout=0.1."""
    items = [f"out_dir={out_dir}", f"data.cache_dir={cache_dir}"]
    items += [f"{k.replace('__', '.')}={_value(v)}" for k, v in overrides.items()]
    return apply_overrides(load_preset("tiny"), items)


# ------------------------------------------------------------------------------------------ the hijack-v2 parser


@dataclasses.dataclass
class HijackV2Parse:
    """What parse_hijack_v2 reads off one row of hijack-v2."""

    expected: list[int]
    answer: int
    query_spelling: int
    target_pos: int
    target_spelling: int
    cluster_pos: list[int]
    cluster_tokens: list[int]
    cluster_values: set
    unmarked_keys: list[int]  # the keys of the unmarked bindings that are not the query's
    fillers: list[int]


def parse_hijack_v2(task, row) -> HijackV2Parse:
    """One row of x of a hijack-v2 task, read with nothing but its docstring's id layout: marker 0, query token 1, key
    spellings k<a>.<s> from 2 (a * synonyms + s), values after them, binding tokens k<a>.<s>=v<b> after the values
    ((a * synonyms + s) * n_values + b), filler tokens last. Records ``[*] k.s=v`` or a filler, then queries
    ``? k.s v``, the last cut off after its key. A query's answer is the value of the marked binding of its key."""
    row = [int(t) for t in row]
    n_sp = task.n_keys * task.synonyms
    value0, bind0 = 2 + n_sp, 2 + n_sp + task.n_values
    filler0 = bind0 + n_sp * task.n_values
    first_query = len(row) + 1 - 3 * task.n_queries
    records, fillers, t = [], [], 0  # records: (marked, position, key, spelling, value)
    while t < first_query:
        marked = row[t] == 0
        t += marked
        tok = row[t]
        if not marked and tok >= filler0:
            fillers.append(tok)
            t += 1
            continue
        assert bind0 <= tok < filler0, f"a record is [*] k.s=v or a filler, at {t}"
        spelling, value = divmod(tok - bind0, task.n_values)
        records.append((marked, t, spelling // task.synonyms, spelling, value))
        t += 1
    assert t == first_query
    expected, asked = [-1] * len(row), []
    while t < len(row):
        assert row[t] == 1 and 2 <= row[t + 1] < value0, f"a query is ? k.s [v], at {t}"
        key = (row[t + 1] - 2) // task.synonyms
        marked = [r for r in records if r[0] and r[2] == key]
        assert len(marked) == 1, "(c) exactly one marked binding of a query's key"
        expected[t + 1] = value0 + marked[0][4]
        if t + 2 < len(row):
            assert row[t + 2] == value0 + marked[0][4], "a query's value is its answer"
        asked.append(key)
        t += 3
    assert t == len(row) + 1 and len(set(asked)) == len(asked) == task.n_queries
    query_key = asked[-1]
    target = [r for r in records if r[0] and r[2] == query_key][0]
    cluster = [r for r in records if not r[0] and r[2] == query_key]
    return HijackV2Parse(expected, value0 + target[4], row[-1] - 2, target[1], target[3], [r[1] for r in cluster],
                 [row[r[1]] for r in cluster], {r[4] for r in cluster},
                 [r[2] for r in records if not r[0] and r[2] != query_key], fillers)


def last_logged(comparison, variant: str, key: str) -> dict[int, float]:
    """{seed: the last value of ``key`` in metrics.jsonl} for the runs of ``variant`` in the comparison directory
    ``comparison`` (results/NAME): a run's value at its threshold, or at its cap."""
    import json
    from pathlib import Path

    out = {}
    for seed_dir in sorted((Path(comparison) / variant).glob("seed*")):
        rows = [json.loads(line) for line in (seed_dir / "metrics.jsonl").read_text().splitlines()]
        out[int(seed_dir.name[4:])] = [r for r in rows if key in r][-1][key]
    return out


def require_kernels() -> None:
    """Skip the calling test module unless the Triton kernels can run here: triton installed, and a CUDA device or
    Triton's CPU interpreter (which tests/conftest.py switches on before anything imports triton when there is no
    CUDA)."""
    pytest.importorskip("triton", reason="triton is not installed (pip install attnlab[kernels])")
    from attnlab.functional import kernels

    if not kernels.available():
        pytest.skip("Triton cannot run here: no CUDA device and TRITON_INTERPRET is off", allow_module_level=True)


def lowrank_kernel_inputs(b, h, hkv, t, d, r, *, device, factors="kv", dtype=torch.float32, seed=0):
    """The low-rank kernels' inputs [q, k, v, phi, lam, c] and an upstream gradient; q, k, v (and it) rounded to
    ``dtype`` on ``device``, the factors float32. factors: "kv" (one set per K/V head), "query" (per query head) or
    "shared" ([1, 1, T, .]: one set for all). phi ~ N(0, 0.25), c ~ N(0, 1), lam ~ U(0.2, 1) (the kernels' contract
    holds for any phi, c and lam > 0), so that M = (1 - phi . c) / lam spreads over both sides of the floor and of 1."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, t, d, generator=g) for n in (h, hkv, hkv))
    do = torch.randn(b, h, t, d, generator=g)
    fb, fh = {"kv": (b, hkv), "query": (b, h), "shared": (1, 1)}[factors]
    phi = 0.5 * torch.randn(fb, fh, t, r, generator=g)
    lam = 0.2 + 0.8 * torch.rand(fb, fh, t, generator=g)
    c = torch.randn(fb, fh, t, r, generator=g)
    cast = [x.to(device, dtype) for x in (q, k, v, do)]
    return [*cast[:3], *(x.to(device) for x in (phi, lam, c))], cast[3]


def relative_error(x, ref) -> float:
    """max |x - ref| / max(max |ref|, 1), in float64 on the CPU."""
    ref = ref.detach().double().cpu()
    return ((x.detach().double().cpu() - ref).abs().max() / ref.abs().max().clamp(min=1.0)).item()


def assert_lowrank_kernel_causal(run, inputs, t: int) -> None:
    """The low-rank kernels' leak check: run(q, k, v, phi, lam, c) -> output [B, H, T, D]. Changing token t's key,
    value and factors (phi_t, lam_t, c_t) leaves the outputs before t exactly unchanged (and does change token t's),
    and a loss on those outputs gives exactly zero gradient to every input from t on (and some before it)."""
    before = run(*inputs)
    changed = [x.clone() for x in inputs]
    changed[1][:, :, t] += 100.0
    changed[2][:, :, t] -= 50.0
    changed[3][:, :, t] += 3.0
    changed[4][:, :, t] *= 0.01
    changed[5][:, :, t] -= 7.0
    after = run(*changed)
    assert torch.equal(before[:, :, :t], after[:, :, :t])
    assert not torch.equal(before[:, :, t:], after[:, :, t:])  # the perturbation does reach token t
    leaves = [x.clone().requires_grad_() for x in inputs]
    run(*leaves)[:, :, :t].sum().backward()
    for name, leaf in zip(["q", "k", "v", "phi", "lam", "c"], leaves):
        assert torch.count_nonzero(leaf.grad[:, :, t:]) == 0, f"d{name} after token {t} is not zero"
        assert torch.count_nonzero(leaf.grad[:, :, :t]) > 0, f"d{name} before token {t} is all zero"


def extreme_logit_inputs(sign: float, t: int = 8):
    """float32 q, k, v (requiring grad) of shape [1, 1, t, 4] whose logits at scale 1 are 80 * sign on keys that
    differ by 1e-6; sign 0 alternates +80 and -80 along the keys (t even)."""
    q = torch.zeros(1, 1, t, 4)
    q[..., 0] = 80.0
    k = torch.zeros(1, 1, t, 4)
    k[..., 0] = sign if sign else torch.tensor([1.0, -1.0] * (t // 2))
    k = (k + 1e-6 * torch.randn(1, 1, t, 4)).requires_grad_()
    return q.requires_grad_(), k, torch.randn(1, 1, t, 4, requires_grad=True)


def script(relative: str, name: str):
    """A script of the repository (benchmarks/, docs/: not part of the package) as a module called `name`. Its
    folder is on sys.path only while it loads, for its imports of its neighbours: left there, a script's name would
    shadow an installed package of the same name (benchmarks/kernels.py hides the `kernels` that transformers
    imports)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / relative
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    before = list(sys.path)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = before  # also undoes a script's own edits of the path
    return module


def docs_generate():
    """docs/generate.py as a module."""
    return script("docs/generate.py", "docs_generate")
