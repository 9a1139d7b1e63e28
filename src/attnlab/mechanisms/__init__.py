"""One package per mechanism family: each holds its float64 reference math, its fast paths and its module.

    magnitude/     the Magnitude Attention write-up's key weights: reference.py (the formulas), lowrank.py (the
                   low-rank solver), fused.py (the fused autograd node), prefix_blocks.py (the prefix form block by
                   block), module.py (MagnitudeGate: t, beta, gamma)
    count_prior/   the duplicate-count prior, the control for magnitude's logit prior on exact duplicates
    heads/         how the heads combine: talking heads, mixture of heads, CODA (functional.py, module.py)
    projections/   how Q, K and V are made: identity, identity-initialised, residual, low rank, MLA's latent K/V
    softpick/      the rectified softmax ReLU(e^z - 1) / sum |e^z - 1| (normalizer "softpick")
    stick_breaking/ stick-breaking attention, log space (normalizer "stickbreaking")
    normalizers.py the two above by their AttentionConfig.normalizer name, for attnlab.functional.attention

The shared core below them (attnlab.functional: scores, masks, positions, attention itself) is what every mechanism
uses; attnlab.nn.Attention composes the mechanisms an AttentionConfig switches on. Adding a mechanism: see the
contributing page's recipe.
"""
