"""The sizes of an experiment (model, training run, evaluation) and the thread count its runs use."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..._checks import require_int


@dataclass(frozen=True)
class ExperimentConfig:
    """Sizes of the model, the training run and the evaluation (defaults: a few seconds per run on a CPU)."""

    vocab_size: int = 16
    train_length: int = 16
    length_factors: tuple = (1, 2, 4, 16, 32)  # evaluate at train_length times each
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 2
    d_mlp: int = 64
    steps: int = 200
    batch_size: int = 32
    learning_rate: float = 1e-2
    weight_decay: float = 0.01
    warmup_steps: int = 20
    eval_batch_size: int = 256
    eval_tokens: int = 4_096  # longer evaluations use fewer sequences: about this many tokens, at least 8 rows
    eval_seed: int = 12_345
    seeds: tuple = (0, 1, 2, 3, 4)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def eval_lengths(self) -> tuple:
        return tuple(self.train_length * factor for factor in self.length_factors)

    def eval_batch(self, length: int) -> int:
        """Sequences in the evaluation batch at ``length``: ``eval_batch_size``, fewer when ``length`` is long."""
        return min(self.eval_batch_size, max(8, self.eval_tokens // length))


@contextlib.contextmanager
def threads(count: int = 1):
    """Run the ``with`` block with ``count`` intra-op threads, then restore the previous count.

    The models here are tiny, so more threads buy nothing; on a loaded machine OpenMP threads that wait for each
    other at every operation make training many times slower (wall and CPU time)."""
    require_int("count", count, minimum=1)
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
