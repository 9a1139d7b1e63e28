"""The duplicate-count prior softmax(z_ij - log c_ij): the control for magnitude's logit prior on exact duplicates."""

from .reference import count_log_prior

__all__ = ["count_log_prior"]
