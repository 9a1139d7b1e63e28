"""Training: :func:`train` a :class:`~attnlab.train.config.RunConfig`, then :func:`load_run` / :func:`sample`.

:func:`train` builds a launch (:mod:`attnlab.train.setup`) and runs the loop (:mod:`attnlab.train.loop`, whose
docstring lists one step in order); the details live in small modules: :mod:`attnlab.train.guards` (non-finite
and divergence guards), :mod:`attnlab.train.resume` (checkpoint state, undo of an interrupted step),
:mod:`attnlab.train.signals` (Ctrl-C), :mod:`attnlab.train.report` (rows, summary), :mod:`attnlab.train.optim`.

A run directory holds::

    config.toml      the resolved RunConfig (model.vocab_size from the tokenizer, out_dir = this directory)
    tokenizer.json   a copy of the tokenizer (sampling needs no data cache)
    metrics.jsonl    one JSON object per logged step (see attnlab.train.report.row)
    checkpoint/      model.safetensors + state.pt + meta.json, replaced atomically (see .checkpoint)
    loss.png         train and validation loss against step
    samples.txt      train.sample_tokens tokens sampled from the final model (seeded with train.seed)
    summary.json     status ("finished" | "interrupted" | "diverged"), losses, throughput, MFU, ...
    tensorboard/     TensorBoard event files (only with train.tensorboard = true)
    wandb/, wandb_id.txt   the Weights & Biases run and its id (only with train.wandb_project; attnlab.train.trackers)

Magnitude gates (the magnitude write-up; model.attention with a magnitude table, e.g. magnitude-causal): every row of a step
that trained also carries, per attention layer i (0 = the first block), the gate's stats from the forward pass of
that step (its last micro-batch; rank 0's under DDP), under flat keys "mag/L<i>/<stat>" (also TensorBoard scalars):

    mag/L<i>/t                 t of Z = exp(-t ||k_j - k_l||^2 / d) used in that forward pass (before the update)
    mag/L<i>/magnitude_over_n  |X| / N of the layer's whole key set (mean over batch and heads), in (0, 1]
    mag/L<i>/residual          largest relative residual ||1 - (Z + eps I) mu|| / ||1|| (CG: truncation error;
                               Cholesky: rounding)
    mag/L<i>/mu_min, mu_max    smallest and largest weight the gate read (mu_j, w_j or M_ij with j <= i)
    mag/L<i>/jitter            largest diagonal jitter a failed Cholesky needed (0 normally)
    mag/L<i>/gate_mean         mean gate value (magnitude.apply="values")
    mag/L<i>/prior_floored     fraction of the weights read that sit at the logit prior's floor ("logits")

Pseudo-rank (the Boneless write-up; train.track_rank, on by default): every row with a validation loss also carries
attnlab.analysis.rank.rank_metrics of the model at that step: "pseudo_rank/<m>/L<i>" (fraction of singular values
holding 95% of the squared-singular-value energy) and "participation_ratio/<m>/L<i>" for m in q, k, v, o, qk
(W_q W_k' per head, averaged), plus ".../<m>/mean" over layers. Matrices a variant does not have (identity Q/K)
are absent. Cost: one small SVD per matrix per evaluation (milliseconds at the cpu preset).

Both reach the trainer as hooks (:mod:`attnlab.train.hooks`: MagnitudeGateHook, RankHook), not as imports. The
gates record only on the steps that are logged (the hook switches MagnitudeGate.record_stats on for those steps
and off otherwise), so the other steps pay no device syncs and no residual product.

Steps are counted from 1: step k is the k-th optimizer update, made with learning rate ``lr_at(k)``; the
metrics row of step k describes the model *after* that update. Step 0 is the untrained model (one validation
row, when train.eval_interval > 0).

Determinism: ``torch.manual_seed(train.seed)`` before the model is built (initialisation, dropout) and a
dedicated ``torch.Generator`` seeded with train.seed draws the training batches; validation uses fixed windows.
On CPU the same config gives bit-identical losses. A checkpoint stores everything the rest of the run depends on
(weights, optimizer and grad-scaler state, batch-generator and RNG states, step, tokens, best val loss), so a
resumed run continues bit-for-bit as if it had never stopped.

Convergence: with train.stop_at (e.g. "val_accuracy >= 0.99", :class:`~attnlab.train.config.StopRule`) the run
stops at the first evaluation that meets the rule, with status "finished"; summary.json gives that step as
threshold_step (the steps-to-threshold) and converged = true. A run that reaches train.max_steps first is finished
with converged = false: its levels are those of a run that had not reached the threshold. The learning-rate
schedule is the one of train.max_steps either way, so a rule never changes the steps before it is met.

Stopping: the first Ctrl-C (SIGINT) or SIGTERM asks the loop to stop at the end of the current step; it then
saves a checkpoint and returns with status "interrupted". A second one raises KeyboardInterrupt at once (but not
inside the optimizer update, which lands whole); a KeyboardInterrupt that lands in a step before its update rolls
the step back (batch generator and RNG restored, gradients dropped), so the saved checkpoint is still a consistent
step boundary.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..data import load_tokenizer
from ..errors import ConfigError
from ..model import GPT
from ..rundir import TOKENIZER_FILE
from .checkpoint import WEIGHTS, find_checkpoint, load_weights
from .config import RunConfig
from .guards import TrainingDiverged
from .hooks import TrainHook
from .loop import run
from .sampling import generate_text
from .setup import Trainer, configure_tf32, load_run_config

__all__ = ["train", "load_run", "load_model", "sample", "generate_text", "configure_tf32", "TrainingDiverged"]


def train(cfg: RunConfig | None = None, *, resume: str | Path | None = None, quiet: bool = False,
          hooks: Sequence[TrainHook] = (), _after_step: Callable[[int], None] | None = None) -> dict:
    """Train ``cfg`` (or continue the run in directory ``resume``) and return the summary dict.

    With ``resume=DIR`` the config is DIR/config.toml and training continues from DIR's latest complete
    checkpoint (from scratch in DIR if it has none). ``cfg`` may then be None; if given, its model must match
    the saved one and its other settings (e.g. a larger train.max_steps) replace the saved ones. Otherwise the
    run directory is ``cfg.resolved_out_dir()``, which must not already hold a run.

    Returns the summary (also written to summary.json). Ctrl-C saves a checkpoint and returns with status
    "interrupted"; a NaN/inf loss raises :class:`TrainingDiverged` after writing summary.json.
    ``quiet=True`` prints nothing. Under ``torchrun`` every rank calls this; only rank 0 writes files.
    ``hooks``: measurements logged besides :func:`attnlab.train.hooks.default_hooks` (:mod:`attnlab.train.hooks`).
    ``_after_step(step)`` is an internal hook called after each completed step (tests raise
    KeyboardInterrupt from it to simulate Ctrl-C).
    """
    trainer = Trainer(cfg, resume=resume, quiet=quiet, hooks=hooks)  # the set-up (attnlab.train.setup)
    try:
        return run(trainer, _after_step)  # the loop (attnlab.train.loop)
    finally:
        trainer.close()


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, object, RunConfig]:
    """(model in eval mode with the latest checkpoint's weights, tokenizer, RunConfig) of a run directory.

    Does not touch the global RNG state. ConfigError if ``run_dir`` is not a run or has no checkpoint yet.
    """
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    tokenizer_path = run_dir / TOKENIZER_FILE
    if not tokenizer_path.is_file():
        raise ConfigError(f"{run_dir} has no {TOKENIZER_FILE}; it is not a complete run directory")
    tokenizer = load_tokenizer(tokenizer_path)
    folder = find_checkpoint(run_dir)
    if folder is None:
        raise ConfigError(f"{run_dir} has no checkpoint yet (train it, or resume it, first)")
    with torch.random.fork_rng(devices=[]):
        model = GPT(cfg.model)
    load_weights(model, folder / WEIGHTS)
    return model.to(device).eval(), tokenizer, cfg


def load_model(path) -> tuple[GPT, str]:
    """(model in eval mode, what it is) from a run directory (:func:`load_run`) or a Hugging Face GPT-2 directory
    (config.json with model_type "gpt2": attnlab.GPT.from_hf_gpt2)."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path} not found (expected a run directory or a Hugging Face GPT-2 directory)")
    hf_config = path / "config.json"
    if hf_config.is_file():
        try:
            model_type = json.loads(hf_config.read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError):
            raise ConfigError(f"{hf_config} is not a readable JSON config") from None
        if model_type != "gpt2":
            raise ConfigError(f"{hf_config} has model_type={model_type!r}; only Hugging Face 'gpt2' is supported")
        return GPT.from_hf_gpt2(path).eval(), "Hugging Face GPT-2"
    return load_run(path)[0], "attnlab run"


def sample(run_dir: str | Path, prompt: str = "\n", max_new_tokens: int = 500, temperature: float = 0.8,
           top_k: int | None = 200, seed: int = 0) -> str:
    """Text sampled from a run's latest checkpoint after ``prompt``: the ``max_new_tokens`` generated tokens
    decoded by the run's tokenizer (the prompt itself is not repeated). Reproducible for a given ``seed``."""
    model, tokenizer, _ = load_run(run_dir)
    return generate_text(model, tokenizer, prompt, max_new_tokens, temperature, top_k, seed)
