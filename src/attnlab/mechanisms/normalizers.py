"""The normalizers that replace the softmax, by their AttentionConfig.normalizer name: the function
attnlab.functional.attention applies to the logits on its explicit path (it computes "softmax" and "none" itself)."""

from __future__ import annotations

from .softpick.functional import softpick
from .stick_breaking.functional import stick_breaking

NORMALIZE = {"softpick": softpick, "stickbreaking": stick_breaking}  # switches.MECHANISM_NORMALIZERS


def normalizer_fn(name: str):
    """What attention()'s ``normalizer`` takes for the config name ``name``: the function for a mechanism's
    normalizer (softpick, stick-breaking), the name itself for "softmax" and "none"."""
    return NORMALIZE.get(name, name)
