"""Train small transformers with every encoding of the book on the tasks of :mod:`posenc.tasks`.

The model is a pre-norm transformer of a few layers whose attention is :func:`posenc.attention.self_attention`,
so the positional encoding is one :class:`posenc.encodings.PositionalEncoding` object: an "input" encoding is
added once to the token embeddings, a "qk" or "logits" encoding acts inside every attention layer.
Everything is seeded: one ``(task, encoding, seed)`` always gives the same numbers on one machine.
"""
from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from . import tables
from ._checks import require_int
from .absolute import LearnedInput, SinusoidalInput
from .alibi import ALiBi
from .attention import self_attention
from .encodings import NoPE, PositionalEncoding
from .generators import copy_frequencies, jordan_generator, xpos_generator
from .group_encodings import GroupEncoding
from .rope import RotaryEmbedding
from .tasks import IGNORE_INDEX, CopyTask


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


JORDAN_DAMPING = -0.05  # eigenvalue a of the damped Jordan variant: its maps carry e^{a t}


def jordan_frequencies(head_dim: int, base: float = 10_000.0) -> torch.Tensor:
    """The rotation frequency of every feature pair of :func:`posenc.generators.jordan_generator` ``(head_dim)``:
    ``(head_dim / 2,)`` float64. Each copy (a 4 x 4 block, two pairs) turns at ``b_c = base^(-c / n_copies)``."""
    return copy_frequencies(head_dim // 4, base).repeat_interleave(2)


def jordan_rotation_generator(head_dim: int, eigenvalue: float = 0.0, base: float = 10_000.0,
                              dtype=torch.float32) -> torch.Tensor:
    """The control for the Jordan block: :func:`posenc.generators.jordan_generator` ``(head_dim, eigenvalue)`` without
    its nilpotent part, i.e. (damped) rotations, Jordan blocks of size 1, at the Jordan generator's own
    frequencies: ``(D, D)``."""
    return jordan_generator(head_dim, eigenvalue=eigenvalue, frequency=jordan_frequencies(head_dim, base), block=1,
                            dtype=dtype)


# name -> (label, causal, factory(config) -> PositionalEncoding)
ENCODINGS = {
    "nope-bidirectional": ("NoPE, bidirectional", False, lambda c: NoPE()),
    "nope-causal": ("NoPE, causal", True, lambda c: NoPE()),
    "sinusoidal": ("sinusoidal", True, lambda c: SinusoidalInput(c.d_model)),
    # sized for the longest evaluation; rows of positions never trained keep their random initial values, only
    # shrunk by AdamW's weight decay
    "learned": ("learned", True, lambda c: LearnedInput(max(c.eval_lengths), c.d_model)),
    "rope": ("RoPE", True, lambda c: RotaryEmbedding(c.head_dim)),
    "alibi": ("ALiBi", True, lambda c: ALiBi(c.n_heads, causal=True)),
    "xpos": ("xPos (damped RoPE)", True, lambda c: GroupEncoding(xpos_generator(c.head_dim))),
    "jordan": ("Jordan block", True, lambda c: GroupEncoding(jordan_generator(c.head_dim))),
    "jordan-damped": ("Jordan block, damped", True,
                      lambda c: GroupEncoding(jordan_generator(c.head_dim, eigenvalue=JORDAN_DAMPING))),
    "jordan-rotation": ("rotation at Jordan's frequencies", True,
                        lambda c: GroupEncoding(jordan_rotation_generator(c.head_dim))),
    "jordan-rotation-damped": ("rotation at Jordan's frequencies, damped", True,
                               lambda c: GroupEncoding(jordan_rotation_generator(c.head_dim, JORDAN_DAMPING))),
}


def encoding_label(name: str) -> str:
    return ENCODINGS[_check_name(name)][0]


def _check_name(name: str) -> str:
    if name not in ENCODINGS:
        raise ValueError(f"encoding must be one of {list(ENCODINGS)}, got {name!r}")
    return name


class Block(nn.Module):
    """Pre-norm block: ``x + attention(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, config: ExperimentConfig):
        super().__init__()
        width = config.d_model
        self.n_heads = config.n_heads
        self.attention_norm, self.mlp_norm = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.mlp = nn.Sequential(nn.Linear(width, config.d_mlp), nn.GELU(), nn.Linear(config.d_mlp, width))

    def forward(self, x, encoding, positions, causal: bool, return_weights: bool = False):
        mixed, weights = self_attention(self.attention_norm(x), self.q.weight, self.k.weight, self.v.weight,
                                        self.n_heads, encoding=encoding, positions=positions, causal=causal,
                                        w_o=self.o.weight, return_weights=True)
        x = x + mixed
        x = x + self.mlp(self.mlp_norm(x))
        return (x, weights) if return_weights else x


class TinyTransformer(nn.Module):
    """Token embedding, ``n_layers`` blocks, a final norm and a linear read-out to the vocabulary.

    ``forward(tokens (B, L)) -> logits (B, L, V)``; with ``return_hidden=True`` also the residual stream
    after each block, a list of ``(B, L, d_model)``, and with ``return_weights=True`` the attention weights of
    each block, a list of ``(B, H, L, L)`` (in that order).
    """

    def __init__(self, config: ExperimentConfig, encoding: PositionalEncoding, causal: bool):
        super().__init__()
        self.causal = causal
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.encoding = encoding
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.readout = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, tokens: torch.Tensor, return_hidden: bool = False, return_weights: bool = False):
        positions = torch.arange(tokens.shape[-1], device=tokens.device)
        x = self.embed(tokens)
        layer_encoding = self.encoding
        if self.encoding.kind == "input":  # added once, as in the original transformer
            x, layer_encoding = self.encoding.encode_input(x, positions), NoPE()
        hidden, weights = [], []
        for block in self.blocks:
            x, layer_weights = block(x, layer_encoding, positions, self.causal, return_weights=True)
            hidden.append(x)
            weights.append(layer_weights)
        logits = self.readout(self.norm(x))
        extras = ([hidden] if return_hidden else []) + ([weights] if return_weights else [])
        return (logits, *extras) if extras else logits


def build_model(name: str, config: ExperimentConfig, seed: int, device=None) -> TinyTransformer:
    """A freshly initialised model with encoding ``name`` (a key of :data:`ENCODINGS`), seeded by ``seed``."""
    _, causal, factory = ENCODINGS[_check_name(name)]
    torch.manual_seed(seed)
    return TinyTransformer(config, factory(config), causal).to(device)


@dataclass
class Run:
    """One trained model: its training losses and accuracy per evaluation length."""

    task: str
    encoding: str
    seed: int
    losses: list
    accuracy: dict = field(default_factory=dict)  # length -> accuracy over all targets
    position_accuracy: dict = field(default_factory=dict)  # length -> (L,) accuracy per position (NaN: no target)
    model: nn.Module | None = None  # the trained model


def _learning_rate_factor(step: int, config: ExperimentConfig) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * progress))


class Ensemble:
    """The models of several seeds trained side by side: their parameters stacked, one ``vmap`` per step.

    The seeds never mix: each has its own initialisation, its own data stream and its own loss, and AdamW
    updates every parameter entry on its own, so this is the same computation as training them one by one,
    only with fewer Python calls.
    """

    def __init__(self, name: str, config: ExperimentConfig, device=None, models=None):
        self.name, self.config = name, config
        if models is None:
            self.models = [build_model(name, config, seed, device) for seed in config.seeds]
        else:  # continue from trained models (a fine-tune): copies, so the originals stay as they are
            if len(models) != len(config.seeds):
                raise ValueError(f"models must hold one model per seed ({len(config.seeds)}), got {len(models)}")
            self.models = [copy.deepcopy(model).to(device) for model in models]
        self.params, _ = stack_module_state(self.models)
        # buffers (RoPE frequencies, ALiBi slopes, group generators) are fixed tables, the same for every seed
        self.buffers = dict(self.models[0].named_buffers())
        for model in self.models[1:]:
            if any(not torch.equal(value, self.buffers[key]) for key, value in model.named_buffers()):
                raise ValueError(f"encoding {name!r} has buffers that differ between seeds; they cannot be shared")
        self._skeleton = copy.deepcopy(self.models[0]).to("meta")

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """``inputs`` ``(S, B, L)`` (one batch per seed) -> logits ``(S, B, L, V)``."""
        def one(params, tokens):
            return functional_call(self._skeleton, (params, self.buffers), (tokens,))

        return vmap(one)(self.params, inputs)

    def trained_models(self) -> list:
        """One ordinary :class:`TinyTransformer` per seed, holding the trained weights."""
        with torch.no_grad():
            for index, model in enumerate(self.models):
                for key, parameter in model.named_parameters():  # buffers are fixed, identical for every seed
                    parameter.copy_(self.params[key][index])
        return self.models


def train(task: CopyTask, name: str, config: ExperimentConfig, device=None, models=None):
    """Train one model per seed with AdamW on freshly drawn batches of length ``config.train_length``.

    ``models``: one model per seed to continue from (a fine-tune; they are copied, not changed), else fresh ones.
    Returns the :class:`Ensemble` and the losses, a float tensor ``(n_seeds, steps)``.
    """
    ensemble = Ensemble(name, config, device, models)
    optimizer = torch.optim.AdamW(list(ensemble.params.values()), lr=config.learning_rate,
                                  weight_decay=config.weight_decay, foreach=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _learning_rate_factor(step, config))
    streams = [torch.Generator().manual_seed(seed) for seed in config.seeds]
    losses = []
    for _ in range(config.steps):
        batches = [task.sample(config.batch_size, config.train_length, config.vocab_size, stream, device)
                   for stream in streams]
        inputs, targets = (torch.stack(parts) for parts in list(zip(*batches))[:2])
        per_token = nn.functional.cross_entropy(ensemble.logits(inputs).flatten(0, 2), targets.flatten(),
                                                ignore_index=IGNORE_INDEX, reduction="none").view(len(streams), -1)
        per_seed = per_token.sum(1) / (targets != IGNORE_INDEX).flatten(1).sum(1)
        optimizer.zero_grad(set_to_none=True)
        per_seed.sum().backward()  # the seeds share no parameter, so each gets the gradient of its own loss
        optimizer.step()
        schedule.step()
        losses.append(per_seed.detach())
    return ensemble, torch.stack(losses, dim=1).cpu()


def evaluation_data(task: CopyTask, length: int, config: ExperimentConfig, device=None):
    """The fixed evaluation batch at ``length`` (the same for every encoding and seed)."""
    generator = torch.Generator().manual_seed(config.eval_seed + length)
    return task.sample(config.eval_batch(length), length, config.vocab_size, generator, device)


@torch.no_grad()
def evaluate(model: TinyTransformer, task: CopyTask, length: int, config: ExperimentConfig):
    """Accuracy of the most likely token on the evaluation batch: ``(overall, per_position (L,))``."""
    model.eval()
    device = next(model.parameters()).device
    inputs, targets, mask = evaluation_data(task, length, config, device)
    correct = (model(inputs).argmax(dim=-1) == targets) & mask
    per_position = correct.sum(0).float() / mask.sum(0).float()  # NaN where no target
    return (correct.sum() / mask.sum()).item(), per_position.cpu()


def accuracies(models: list, task: CopyTask, config: ExperimentConfig, lengths=None) -> torch.Tensor:
    """Accuracy of each model (one per seed) at each of ``lengths`` (default ``config.eval_lengths``):
    ``(n_models, n_lengths)``."""
    lengths = config.eval_lengths if lengths is None else tuple(lengths)
    return torch.tensor([[evaluate(model, task, length, config)[0] for length in lengths] for model in models])


def run_encoding(task: CopyTask, name: str, config: ExperimentConfig, device=None) -> list:
    """Train encoding ``name`` on ``task`` with every seed, evaluate at every length: one :class:`Run` per seed."""
    ensemble, losses = train(task, name, config, device)
    runs = []
    for seed, model, seed_losses in zip(config.seeds, ensemble.trained_models(), losses):
        run = Run(task.name, name, seed, seed_losses.tolist(), model=model)
        for length in config.eval_lengths:
            run.accuracy[length], run.position_accuracy[length] = evaluate(model, task, length, config)
        runs.append(run)
    return runs


def run_experiments(tasks, names, config: ExperimentConfig, device=None, progress=None) -> list:
    """Every task x encoding x seed of ``config``; ``progress(runs)`` is called after each task and encoding."""
    runs = []
    for task in tasks:
        for name in names:
            runs.extend(run_encoding(task, name, config, device))
            if progress is not None:
                progress(runs[-len(config.seeds):])
    return runs


def accuracy_spread(runs: list, task: str, name: str, length: int) -> tuple:
    """``(mean, min, max)`` accuracy over the seeds of one task and encoding at one length."""
    values = [run.accuracy[length] for run in runs if run.task == task and run.encoding == name]
    if not values:
        raise ValueError(f"no run of encoding {name!r} on task {task!r}")
    return sum(values) / len(values), min(values), max(values)


def mean_position_accuracy(runs: list, task: str, name: str, length: int) -> torch.Tensor:
    """Accuracy per position ``(length,)`` averaged over the seeds (NaN where there is no target)."""
    values = [run.position_accuracy[length] for run in runs if run.task == task and run.encoding == name]
    if not values:
        raise ValueError(f"no run of encoding {name!r} on task {task!r}")
    return torch.stack(values).mean(0)


def with_rope(models: list, rope_parameters: dict, original_length: int) -> list:
    """Copies of RoPE models whose rotary table is rebuilt from ``rope_parameters`` (a transformers-style dict such
    as ``{"rope_type": "yarn", "factor": 4.0}``), with ``original_length`` as the trained context (transformers'
    ``max_position_embeddings``; the dict may also name ``original_max_position_embeddings``)."""
    extended = []
    for model in models:
        if not isinstance(model.encoding, RotaryEmbedding):
            raise TypeError(f"models must use RoPE, got {type(model.encoding).__name__}")
        rotary = model.encoding
        base = rotary.rope_parameters.get("rope_theta", 10_000.0)
        copy_ = copy.deepcopy(model)
        copy_.encoding = RotaryEmbedding(rotary.head_dim, {"rope_theta": base, **rope_parameters},
                                  max_position_embeddings=original_length, layout=rotary.layout).to(
                                      rotary.inv_freq.device)
        extended.append(copy_)
    return extended


def fine_tune(models: list, task: CopyTask, config: ExperimentConfig, length: int, steps: int,
              batch_size: int | None = None, learning_rate: float | None = None, device=None):
    """Continue training copies of ``models`` (one per seed of ``config``) for ``steps`` steps at ``length``, with
    the optimiser and schedule of :func:`train` (warm-up over a tenth of the steps); ``batch_size`` and
    ``learning_rate`` default to the config's. Returns the fine-tuned copies."""
    tuned = replace(config, train_length=require_int("length", length, minimum=1),
                    steps=require_int("steps", steps, minimum=1), warmup_steps=max(1, steps // 10),
                    batch_size=config.batch_size if batch_size is None else require_int("batch_size", batch_size,
                                                                                         minimum=1),
                    learning_rate=config.learning_rate if learning_rate is None else learning_rate)
    ensemble, _ = train(task, "rope", tuned, device, models=models)
    return ensemble.trained_models()


def results_table(runs: list, config: ExperimentConfig, baselines: dict | None = None, html: bool = False) -> str:
    """One row per task and encoding, ``mean (min-max)`` accuracy in % at each length (see :func:`posenc.tables.format_table`).

    ``baselines``: optional ``{task name: {row label: {length: accuracy}}}``, printed as extra rows of that task.
    """
    header = ["task", "encoding"] + [f"L = {length} ({length // config.train_length}x)"
                                     for length in config.eval_lengths]
    rows = []
    for task in dict.fromkeys(run.task for run in runs):
        for name in dict.fromkeys(run.encoding for run in runs if run.task == task):
            cells = []
            for length in config.eval_lengths:
                mean, low, high = accuracy_spread(runs, task, name, length)
                cells.append(f"{100 * mean:5.1f} ({100 * low:.0f}-{100 * high:.0f})")
            rows.append([task, encoding_label(name)] + cells)
        for label, values in (baselines or {}).get(task, {}).items():
            rows.append([task, label] + [f"{100 * values[length]:5.1f}" for length in config.eval_lengths])
    return tables.format_table(header, rows, html)


def position_probe_r2(hidden: torch.Tensor) -> float:
    """How much of the absolute position a read-out recovers from hidden states ``(B, L, d)``.

    Least squares from the features ``[h, h * h, 1]`` (squares too: a norm can carry the position) to the
    position ``i`` on the first half of the sequences, scored on the other half by ``R^2 = 1 - SSE / SST``
    (1: exact, 0: no better than always guessing the mean position).
    """
    batch, length, _ = hidden.shape
    features = torch.cat((hidden, hidden * hidden, torch.ones_like(hidden[..., :1])), -1).flatten(0, 1)
    position = torch.arange(length, dtype=hidden.dtype, device=hidden.device).repeat(batch)[:, None]
    train = torch.arange(batch * length, device=hidden.device) < (batch // 2) * length
    fit = torch.linalg.lstsq(features[train], position[train]).solution
    error = features[~train] @ fit - position[~train]
    return (1 - (error**2).sum() / ((position[~train] - position[~train].mean()) ** 2).sum()).item()


__all__ = ["ExperimentConfig", "threads", "ENCODINGS", "JORDAN_DAMPING", "jordan_frequencies", "jordan_rotation_generator",
           "with_rope", "fine_tune", "accuracies", "encoding_label", "Block", "TinyTransformer", "build_model", "Run",
           "Ensemble", "train", "evaluation_data", "evaluate", "run_encoding", "run_experiments", "accuracy_spread",
           "mean_position_accuracy", "results_table", "position_probe_r2"]
