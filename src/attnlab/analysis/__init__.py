"""Analyses of attention without training a new mechanism (the Boneless write-up). They take models, tensors and token
arrays; loading a run and training belong to the layers above (:mod:`attnlab.train`, :mod:`attnlab.experiments`,
where the weight-decay sweep lives: :mod:`attnlab.experiments.sweep`).

* :mod:`.consensus` — parameterless attention iterated as a consensus / clustering algorithm; the norm explosion
  of raw correlation.
* :mod:`.colors` — clustering the colours of an image with consensus attention, against k-means.
* :mod:`.rank` — singular spectra, pseudo-rank and participation ratio of attention weights (:func:`rank_metrics`
  for a training log).
* :mod:`.ngram` — count n-gram reference losses on the validation tokens a run is scored on.
"""

from .colors import cluster_colors, load_image
from .consensus import ConsensusResult, attention_step, blobs, consensus, count_clusters, raw_correlation_growth
from .ngram import ngram_loss, reference_losses
from .rank import participation_ratio, pseudo_rank, rank_metrics, rank_report, singular_spectra

__all__ = [
    "ConsensusResult", "attention_step", "blobs", "cluster_colors", "consensus", "count_clusters", "load_image",
    "ngram_loss", "participation_ratio", "pseudo_rank", "rank_metrics", "rank_report",
    "raw_correlation_growth", "reference_losses", "singular_spectra",
]
