"""Analyses of attention without training a new mechanism (seed 001).

* :mod:`.consensus` — parameterless attention iterated as a consensus / clustering algorithm; the norm explosion
  of raw correlation.
* :mod:`.colors` — clustering the colours of an image with consensus attention, against k-means.
* :mod:`.rank` — singular spectra, pseudo-rank and participation ratio of attention weights (:func:`rank_metrics`
  for a training log).
* :mod:`.sweep` — the weight-decay sweep: pseudo-rank and validation loss per lambda.
* :mod:`.ngram` — count n-gram reference losses on the validation tokens a run is scored on.
"""

from .colors import cluster_colors, load_image
from .consensus import ConsensusResult, attention_step, blobs, consensus, count_clusters, raw_correlation_growth
from .ngram import ngram_loss, reference_losses
from .rank import participation_ratio, pseudo_rank, rank_metrics, rank_report, singular_spectra
from .sweep import rank_sweep

__all__ = [
    "ConsensusResult", "attention_step", "blobs", "cluster_colors", "consensus", "count_clusters", "load_image",
    "ngram_loss", "participation_ratio", "pseudo_rank", "rank_metrics", "rank_report", "rank_sweep",
    "raw_correlation_growth", "reference_losses", "singular_spectra",
]
