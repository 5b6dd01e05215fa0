"""Train small transformers with every encoding of the book on the tasks of :mod:`posenc.lab.tasks`.

The model is a pre-norm transformer of a few layers whose attention is :func:`posenc.multihead.self_attention`,
so the positional encoding is one :class:`posenc.encodings.PositionalEncoding` object: an "input" encoding is
added once to the token embeddings, a "qk" or "logits" encoding acts inside every attention layer.
Training and evaluation run many models at once in an :class:`Ensemble` (every weight stacked along a model axis,
one batched operation per step for all of them); :func:`run_plan` trains any list of ``(task, encoding)`` pairs
together. Everything is seeded: one plan always gives the same numbers on one machine.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.func import functional_call, vmap

from .._checks import require_int
from ..absolute import LearnedInput, SinusoidalInput
from ..alibi import ALiBi
from ..data_dependent import CoPE, FoX, PaTH
from ..encodings import NoPE, PositionalEncoding
from ..generators import copy_frequencies, jordan_generator, xpos_generator
from ..group_encodings import GroupEncoding
from ..layer_patterns import LayerEncodings, LocalWindow
from ..multihead import self_attention
from ..rope import RotaryEmbedding
from . import tables
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
    ``(head_dim / 2,)`` float64. Each copy (a 4 x 4 block, two pairs) turns at ``omega_c = base^(-c / n_copies)``."""
    return copy_frequencies(head_dim // 4, base).repeat_interleave(2)


def jordan_rotation_generator(
    head_dim: int, eigenvalue: float = 0.0, base: float = 10_000.0, dtype=torch.float32
) -> torch.Tensor:
    """The control for the Jordan block: :func:`posenc.generators.jordan_generator` ``(head_dim, eigenvalue)`` without
    its nilpotent part, i.e. (damped) rotations, Jordan blocks of size 1, at the Jordan generator's own
    frequencies: ``(D, D)``."""
    return jordan_generator(
        head_dim, eigenvalue=eigenvalue, frequency=jordan_frequencies(head_dim, base), block=1, dtype=dtype
    )


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
    "jordan-damped": (
        "Jordan block, damped",
        True,
        lambda c: GroupEncoding(jordan_generator(c.head_dim, eigenvalue=JORDAN_DAMPING)),
    ),
    "jordan-rotation": (
        "rotation at Jordan's frequencies",
        True,
        lambda c: GroupEncoding(jordan_rotation_generator(c.head_dim)),
    ),
    "jordan-rotation-damped": (
        "rotation at Jordan's frequencies, damped",
        True,
        lambda c: GroupEncoding(jordan_rotation_generator(c.head_dim, JORDAN_DAMPING)),
    ),
}

_PATTERNS: dict = {}  # name -> the per-layer encoding names it repeats (add_layer_pattern)
# models whose layers differ, by name -> (label, causal, factory), as in ENCODINGS; kept apart so that chapter 11's
# plan over ENCODINGS stays as it is (every function here takes a name from any of the tables)
LAYER_PATTERNS: dict = {}
_ADDED: set = set()  # names registered by add_encoding (a re-run notebook may define them again)


def add_encoding(name: str, label: str, factory, causal: bool = True) -> str:
    """Register ``factory(config) -> PositionalEncoding`` as the encoding name ``name`` of :data:`ENCODINGS`
    (shown as ``label``, trained with a causal mask unless ``causal=False``); returns ``name``. Built-in names
    and names of :func:`add_layer_pattern` are refused; a name added here may be added again (its new factory
    replaces the old one). Example: Llama 4's NoPE layer at the harness's scale,
    ``add_encoding("nope-temperature", "NoPE, temperature", lambda c: AttentionTemperature(c.train_length))``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not isinstance(label, str):
        raise TypeError(f"label must be a str, got {type(label).__name__}")
    if not callable(factory) or isinstance(factory, nn.Module):  # an encoding itself is not a factory
        raise TypeError(f"factory must be a callable config -> PositionalEncoding, got {type(factory).__name__}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if (name in ENCODINGS and name not in _ADDED) or name in LAYER_PATTERNS or name in BEYOND_ENCODINGS:
        raise ValueError(f"encoding name {name!r} is taken (by {_entry(name)[0]!r}); pick another name")
    encoding = factory(ExperimentConfig())
    if not isinstance(encoding, PositionalEncoding):
        raise TypeError(f"factory must return a posenc PositionalEncoding, got {type(encoding).__name__}")
    ENCODINGS[name] = (label, causal, factory)
    _ADDED.add(name)
    return name


def add_layer_pattern(name: str, layers, label: str | None = None) -> str:
    """Register a model whose layers have different encodings as the encoding name ``name`` in
    :data:`LAYER_PATTERNS` (so :func:`build_model`, :func:`train`, :func:`run_plan` and the tables take it like any
    other, while chapter 11's plan over :data:`ENCODINGS` stays as it is); returns ``name``.

    ``layers``: names of :data:`ENCODINGS` (built in, or added by :func:`add_encoding`), repeated over the model's
    depth: layer ``i`` gets ``layers[i % len(layers)]`` (``("rope", "rope", "rope", "nope-causal")`` is the 3:1
    pattern at any depth, the built-in ``"hybrid"``; ``("nope-causal", "rope")`` alternates). Each must act on q and k
    or not at all (RoPE, the group encodings, causal NoPE: not an input or a logit-bias encoding, not another
    pattern), and all must be causal or all
    bidirectional. Registering the same pattern under the same name again is allowed (a re-run notebook);
    another pattern under a taken name raises ValueError.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if isinstance(layers, str):
        raise TypeError(f"layers must be a sequence of encoding names, got the str {layers!r}")
    layers = tuple(_check_name(each) for each in layers)
    if not layers:
        raise ValueError("layers must name at least one encoding")
    if name in ENCODINGS or name in LAYER_PATTERNS or name in BEYOND_ENCODINGS:
        if _PATTERNS.get(name) == layers and (label is None or LAYER_PATTERNS[name][0] == label):
            return name  # names resolve when a model is built: a re-added member encoding takes effect
        raise ValueError(f"encoding name {name!r} is taken (by {_entry(name)[0]!r}); pick another name")
    probe = ExperimentConfig()
    for each in layers:
        encoding = ENCODINGS[each][2](probe)
        if encoding.kind not in ("qk", "none") or isinstance(encoding, LayerEncodings):
            raise ValueError(
                f"layers must name encodings that act on q and k or not at all, got {each!r} "
                f"(a {encoding.kind!r} encoding)"
            )
    causal = {ENCODINGS[each][1] for each in layers}
    if len(causal) > 1:
        raise ValueError(f"layers must be all causal or all bidirectional, got {layers}")
    if label is None:
        label = (
            "layers " + ", ".join(ENCODINGS[each][0] for each in layers) + (" (repeated)" if len(layers) > 1 else "")
        )
    LAYER_PATTERNS[name] = (
        label,
        causal.pop(),
        lambda c: LayerEncodings(ENCODINGS[layers[i % len(layers)]][2](c) for i in range(c.n_layers)),
    )
    _PATTERNS[name] = layers
    return name


# chapter 14's data-dependent encodings ("content" plug-ins), kept apart so that chapter 11's plan over ENCODINGS stays
# as it is; every function here takes a name from either table
BEYOND_ENCODINGS = {
    # CoPE's integer embeddings cover the positions a training sequence can produce (0 .. train_length); larger
    # fractional positions are clamped, as the paper's npos_max does
    "cope": ("CoPE", True, lambda c: CoPE(c.head_dim, c.train_length + 1)),
    "fox": ("FoX (forgetting attention)", True, lambda c: FoX(c.d_model, c.n_heads)),
    "path": ("PaTH", True, lambda c: PaTH(c.d_model, c.n_heads, c.head_dim)),
}


def _entry(name: str):
    for table in (ENCODINGS, LAYER_PATTERNS, BEYOND_ENCODINGS):
        if name in table:
            return table[name]
    raise KeyError(name)


def encoding_label(name: str) -> str:
    return _entry(_check_name(name))[0]


def _check_name(name: str) -> str:
    if name not in ENCODINGS and name not in LAYER_PATTERNS and name not in BEYOND_ENCODINGS:
        raise ValueError(
            f"encoding must be one of {list(ENCODINGS) + list(LAYER_PATTERNS) + list(BEYOND_ENCODINGS)}, got {name!r}"
        )
    return name


# Llama 4 / SmolLM3's 3:1 pattern: layer i is NoPE iff (i + 1) % 4 == 0, transformers' default no_rope_layers
# (posenc.layer_patterns.nope_every); pure RoPE below 4 layers
add_layer_pattern("hybrid", ("rope", "rope", "rope", "nope-causal"), "RoPE, NoPE every 4th layer (3:1)")


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
        mixed, weights = self_attention(
            self.attention_norm(x),
            self.q.weight,
            self.k.weight,
            self.v.weight,
            self.n_heads,
            encoding=encoding,
            positions=positions,
            causal=causal,
            w_o=self.o.weight,
            return_weights=True,
        )
        x = x + mixed
        x = x + self.mlp(self.mlp_norm(x))
        return (x, weights) if return_weights else x


class TinyTransformer(nn.Module):
    """Token embedding, ``n_layers`` blocks, a final norm and a linear read-out to the vocabulary.

    ``encoding``: one plug-in for every layer, or a :class:`posenc.layer_patterns.LayerEncodings` with one per
    layer (a hybrid: block ``i`` uses ``encoding.layer(i)``).

    ``forward(tokens (B, L)) -> logits (B, L, V)``; with ``return_hidden=True`` also the residual stream
    after each block, a list of ``(B, L, d_model)``, and with ``return_weights=True`` the attention weights of
    each block, a list of ``(B, H, L, L)`` (in that order).
    """

    def __init__(self, config: ExperimentConfig, encoding: PositionalEncoding, causal: bool):
        super().__init__()
        if isinstance(encoding, LayerEncodings) and len(encoding) != config.n_layers:
            raise ValueError(
                f"a LayerEncodings encoding must give one encoding per layer ({config.n_layers}), got {len(encoding)}"
            )
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
        for index, block in enumerate(self.blocks):
            x, layer_weights = block(
                x, _layer_encoding(layer_encoding, index), positions, self.causal, return_weights=True
            )
            hidden.append(x)
            weights.append(layer_weights)
        logits = self.readout(self.norm(x))
        extras = ([hidden] if return_hidden else []) + ([weights] if return_weights else [])
        return (logits, *extras) if extras else logits


def _layer_encoding(encoding: PositionalEncoding, layer: int) -> PositionalEncoding:
    """Layer ``layer``'s encoding: the layer's own for a :class:`LayerEncodings`, else ``encoding`` itself."""
    return encoding.layer(layer) if isinstance(encoding, LayerEncodings) else encoding


def build_model(name: str, config: ExperimentConfig, seed: int, device=None) -> TinyTransformer:
    """A freshly initialised model with encoding ``name`` (a key of :data:`ENCODINGS` or :data:`BEYOND_ENCODINGS`,
    or a pattern added by :func:`add_layer_pattern`), seeded by ``seed``."""
    _, causal, factory = _entry(_check_name(name))
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


def _equivalent(first: PositionalEncoding, other: PositionalEncoding) -> bool:
    """Whether two encodings compute the same function of their parameters: same class, parameters of the same
    names and shapes, equal buffers and equal public attributes."""
    if type(first) is not type(other):
        return False
    if isinstance(first, LayerEncodings):
        return len(first) == len(other) and all(_equivalent(a, b) for a, b in zip(first.encodings, other.encodings))
    if isinstance(first, LocalWindow):
        return (first.size, first.mode) == (other.size, other.mode) and _equivalent(first.inner, other.inner)
    shapes = [{key: value.shape for key, value in e.named_parameters()} for e in (first, other)]
    buffers, others = dict(first.named_buffers()), dict(other.named_buffers())
    if shapes[0] != shapes[1] or buffers.keys() != others.keys():
        return False
    if any(value.shape != others[key].shape or not torch.equal(value, others[key]) for key, value in buffers.items()):
        return False
    public = [
        {key: value for key, value in vars(e).items() if not key.startswith("_") and key != "training"}
        for e in (first, other)
    ]
    try:
        return bool(public[0] == public[1])
    except (RuntimeError, TypeError, ValueError):  # an attribute that does not compare to one bool (a tensor)
        return False


class _Method(nn.Module):
    """Calls one method of an encoding as ``forward``, so that ``functional_call`` can swap its parameters."""

    def __init__(self, encoding: PositionalEncoding, method: str):
        super().__init__()
        self.encoding, self.method = encoding, method

    def forward(self, *args):
        return getattr(self.encoding, self.method)(*args)


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Layer norm over the last axis of ``x`` ``(M, ..., d)`` with one ``weight``, ``bias`` ``(M, d)`` per model."""
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1],)
    return torch.addcmul(bias.view(shape), nn.functional.layer_norm(x, x.shape[-1:]), weight.view(shape))


class Ensemble:
    """Several models of one configuration trained side by side: every parameter stacked along a leading model
    axis, one batched operation per step of the forward pass instead of one per model.

    ``name``: an encoding name (one model per seed of ``config``) or a list of names (one group of
    ``len(config.seeds)`` models per name, in that order: model ``g * n_seeds + s`` has name ``g`` and seed
    ``s``). ``models``: one model per name and seed to continue from instead (a fine-tune; they are copied, the
    originals stay as they are).

    The models never mix: each has its own initialisation, data and loss, and AdamW updates every parameter entry
    on its own, so this is the same computation as training them one by one, up to float rounding (a batched
    matrix product may add in another order), with far fewer Python calls. Consecutive models whose encodings
    are equivalent (no parameters, same class, equal tables) share one call of the encoding; an encoding with
    parameters (the learned table; the "content" encodings CoPE, FoX, PaTH) is called once per model, through
    ``vmap``. With a "content" encoding in the stack every model's attention runs unfused (``softmax(logits) v``).
    """

    def __init__(self, name, config: ExperimentConfig, device=None, models=None):
        names = [name] if isinstance(name, str) else list(name)
        for each in names:
            _check_name(each)
        if models is None:
            models = [build_model(each, config, seed, device) for each in names for seed in config.seeds]
        else:  # continue from trained models (a fine-tune): copies, so the originals stay as they are
            if len(models) != len(names) * len(config.seeds):
                raise ValueError(
                    f"models must hold one model per seed ({len(config.seeds)}) and encoding name, got {len(models)}"
                )
            models = [copy.deepcopy(model).to(device) for model in models]
        self.name, self.names = name, [each for each in names for _ in config.seeds]
        self._stack(models, config)

    @classmethod
    def from_models(cls, models: list, config: ExperimentConfig) -> Ensemble:
        """A stack of copies of built :class:`TinyTransformer` models of ``config``, with any encodings."""
        if not models or not all(isinstance(model, TinyTransformer) for model in models):
            raise TypeError("models must be a non-empty list of TinyTransformer")
        ensemble = cls.__new__(cls)
        ensemble.name, ensemble.names = None, [None] * len(models)
        ensemble._stack([copy.deepcopy(model) for model in models], config)
        return ensemble

    def _stack(self, models: list, config: ExperimentConfig):
        self.config, self.models = config, models
        first = models[0]
        self.n_heads, self.n_layers = first.blocks[0].n_heads, len(first.blocks)
        self.device = first.embed.weight.device
        self.groups = []  # (start, stop, encoding, causal): consecutive models that share one encoding call
        for index, model in enumerate(models):
            if self.groups and self.groups[-1][3] == model.causal and _equivalent(self.groups[-1][2], model.encoding):
                self.groups[-1] = (self.groups[-1][0], index + 1, *self.groups[-1][2:])
            else:
                self.groups.append((index, index + 1, model.encoding, model.causal))
        named = [dict(model.named_parameters()) for model in models]
        keys = [key for key in named[0] if not key.startswith("encoding.")]
        if any([key for key in each if not key.startswith("encoding.")] != keys for each in named):
            raise ValueError("models must share one configuration to be stacked")
        self.params = {key: torch.stack([each[key].detach() for each in named]).requires_grad_() for key in keys}
        # the encodings' own parameters (the learned table), stacked per group
        if any(
            isinstance(encoding, LayerEncodings) and any(True for _ in encoding.parameters())
            for _, _, encoding, _ in self.groups
        ):
            raise NotImplementedError("per-layer encodings with trainable parameters are not stacked")
        self.encoding_params = [
            {
                key: torch.stack(
                    [dict(m.encoding.named_parameters())[key].detach() for m in models[start:stop]]
                ).requires_grad_()
                for key, _ in encoding.named_parameters()
            }
            for start, stop, encoding, _ in self.groups
        ]
        self._tables, self._callers = {}, {}  # per length: position tables; per group: its encoding's skeleton
        self._mask_key, self._mask = None, None

    def part(self, start: int, stop: int) -> Ensemble:
        """Models ``start .. stop - 1`` as an ensemble that shares this one's parameters (views, no copy)."""
        part = Ensemble.__new__(Ensemble)
        part.name, part.names, part.config, part.models = (
            self.name,
            self.names[start:stop],
            self.config,
            self.models[start:stop],
        )
        part.n_heads, part.n_layers, part.device = self.n_heads, self.n_layers, self.device
        part.params = {key: value[start:stop] for key, value in self.params.items()}
        part.groups, part.encoding_params = [], []
        for (first, last, encoding, causal), params in zip(self.groups, self.encoding_params):
            low, high = max(first, start), min(last, stop)
            if low < high:
                part.groups.append((low - start, high - start, encoding, causal))
                part.encoding_params.append({key: value[low - first : high - first] for key, value in params.items()})
        part._tables, part._callers, part._mask_key, part._mask = {}, {}, None, None
        return part

    def __len__(self) -> int:
        return len(self.models)

    def parameters(self) -> list:
        """Every stacked parameter tensor, for the optimiser."""
        return list(self.params.values()) + [p for group in self.encoding_params for p in group.values()]

    def _per_model(self, g: int, method: str, *args, positions=None):
        """``method`` of group ``g``'s encoding, once per model with its own parameters (``vmap``): ``args`` carry
        a leading model axis, followed by the ``positions`` (shared) as many times as the method takes them."""
        if (g, method) not in self._callers:
            self._callers[g, method] = _Method(copy.deepcopy(self.groups[g][2]).to("meta"), method)
        call = self._callers[g, method]
        params = {f"encoding.{key}": value for key, value in self.encoding_params[g].items()}
        shared = (positions,) * (len(args) if method == "encode_qk" else 1)
        return vmap(lambda p, *a: functional_call(call, p, (*a, *shared)))(params, *args)

    def _position_tables(self, length: int):
        """Computed once per length for the parameter-free encodings: the input tables ``(M, 1, L, d)`` (None
        when no model has an input encoding) and the logit bias plus the causal mask ``(M, 1, H, L, L)``."""
        if length not in self._tables:
            positions = torch.arange(length, device=self.device)
            embed = self.params["embed.weight"]
            inputs, additive = [], []
            for g, (start, stop, encoding, causal) in enumerate(self.groups):
                table = torch.zeros(1, length, embed.shape[-1], device=self.device, dtype=embed.dtype)
                if encoding.kind == "input" and not self.encoding_params[g]:
                    table = encoding.encode_input(table, positions)
                inputs.append(table.expand(stop - start, -1, -1))
                bias = torch.zeros(1, 1, length, length, device=self.device, dtype=embed.dtype)
                if encoding.kind == "logits" and not self.encoding_params[g]:
                    bias = bias + encoding.logit_bias(positions, positions).to(embed.dtype)
                if causal:
                    bias = bias.masked_fill(positions[:, None] < positions[None, :], float("-inf"))
                additive.append(bias.expand(stop - start, self.n_heads, length, length))
            has_input = any(encoding.kind == "input" for _, _, encoding, _ in self.groups)
            self._tables[length] = (torch.cat(inputs)[:, None] if has_input else None, torch.cat(additive)[:, None])
        return self._tables[length]

    def _window_bias(self, layer: int, length: int):
        """The extra ``-inf`` bias ``(M, 1, H, L, L)`` of the local windows (:class:`LocalWindow`, "qk" encodings
        with a logit bias) at ``layer``, or None when no model has one there (computed once per layer and length)."""
        key = ("window", layer, length)
        if key not in self._tables:
            positions = torch.arange(length, device=self.device)
            parts, found = [], False
            for start, stop, encoding, _ in self.groups:
                encoding = _layer_encoding(encoding, layer)
                bias = encoding.logit_bias(positions, positions) if encoding.kind == "qk" else None
                found = found or bias is not None
                bias = torch.zeros(length, length, device=self.device) if bias is None else bias.to(self.device)
                parts.append(bias.expand(stop - start, self.n_heads, length, length))
            self._tables[key] = torch.cat(parts)[:, None] if found else None
        return self._tables[key]

    def _flat_mask(self, length: int, batch: int) -> torch.Tensor:
        """The logit bias plus causal mask expanded to ``(M B, H, L, L)`` for the fused attention (kept for the
        last ``(length, batch)`` asked)."""
        if self._mask_key != (length, batch):
            additive = self._position_tables(length)[1]
            self._mask = additive.expand(-1, batch, -1, -1, -1).reshape(len(self) * batch, self.n_heads, length, length)
            self._mask_key = (length, batch)
        return self._mask

    def logits(self, inputs: torch.Tensor, return_weights: bool = False):
        """``inputs`` ``(M, B, L)`` (one batch per model) -> logits ``(M, B, L, V)``; with ``return_weights``
        also the attention weights of each block, a list of ``(M, B, H, L, L)``."""
        p, (n_models, batch, length) = self.params, inputs.shape
        if n_models != len(self):
            raise ValueError(f"inputs must have shape (M, B, L) with M = {len(self)} models, got {tuple(inputs.shape)}")
        positions = torch.arange(length, device=inputs.device)
        input_table, additive = self._position_tables(length)
        vocab, width = p["embed.weight"].shape[1:]
        heads, head_dim = self.n_heads, width // self.n_heads
        offsets = torch.arange(n_models, device=inputs.device)[:, None, None] * vocab
        x = nn.functional.embedding(inputs + offsets, p["embed.weight"].flatten(0, 1))  # (M, B, L, d)
        if input_table is not None:
            x = x + input_table
        sizes = [stop - start for start, stop, _, _ in self.groups]
        if any(
            params and encoding.kind == "input"
            for (_, _, encoding, _), params in zip(self.groups, self.encoding_params)
        ):
            pieces = list(x.split(sizes))  # split, not slices: its backward is one concatenation
            for g, (_, _, encoding, _) in enumerate(self.groups):
                if encoding.kind == "input" and self.encoding_params[g]:  # a table per model (learned)
                    pieces[g] = self._per_model(g, "encode_input", pieces[g], positions=positions)
            x = torch.cat(pieces)
        if any(
            params and encoding.kind == "logits"
            for (_, _, encoding, _), params in zip(self.groups, self.encoding_params)
        ):
            raise NotImplementedError("logits encodings with parameters are not stacked")
        has_qk = any(encoding.kind == "qk" for _, _, encoding, _ in self.groups)
        has_content = any(encoding.kind == "content" for _, _, encoding, _ in self.groups)
        if has_content:
            causal_allowed = positions[:, None] >= positions[None, :]
        weights = []
        for layer in range(self.n_layers):
            prefix = f"blocks.{layer}."
            h = _layer_norm(x, p[prefix + "attention_norm.weight"], p[prefix + "attention_norm.bias"]).flatten(1, 2)
            w_qkv = torch.cat([p[prefix + key + ".weight"] for key in "qkv"], dim=1)  # (M, 3d, d)
            qkv = torch.bmm(h, w_qkv.transpose(1, 2)).view(n_models, batch, length, 3, heads, head_dim)
            q, k, v = qkv.permute(3, 0, 1, 4, 2, 5)  # each (M, B, H, L, D)
            if has_qk:
                q_parts, k_parts = list(q.split(sizes)), list(k.split(sizes))
                for g, (start, stop, encoding, _) in enumerate(self.groups):
                    encoding = _layer_encoding(encoding, layer)
                    if encoding.kind == "qk" and self.encoding_params[g]:
                        q_parts[g], k_parts[g] = self._per_model(
                            g, "encode_qk", q_parts[g], k_parts[g], positions=positions
                        )
                    elif encoding.kind == "qk":
                        q_parts[g], k_parts[g] = (
                            t.view(stop - start, batch, heads, length, head_dim)
                            for t in encoding.encode_qk(
                                q_parts[g].flatten(0, 1), k_parts[g].flatten(0, 1), positions, positions
                            )
                        )
                q, k = torch.cat(q_parts), torch.cat(k_parts)
            window = self._window_bias(layer, length)
            bias = additive if window is None else additive + window
            if has_content:  # logits from the content, per model (vmap), then the same softmax for every group
                scores = list((q @ k.transpose(-1, -2) / math.sqrt(head_dim)).split(sizes))
                hidden_states = h.view(n_models, batch, length, width).split(sizes)
                q_parts, k_parts = q.split(sizes), k.split(sizes)
                for g, (_, _, encoding, causal) in enumerate(self.groups):
                    if encoding.kind == "content":
                        scores[g] = self._per_model(
                            g,
                            "content_logits",
                            q_parts[g],
                            k_parts[g],
                            hidden_states[g],
                            positions=causal_allowed if causal else None,
                        )
                attention = torch.softmax(torch.cat(scores) + bias, dim=-1)
                if return_weights:
                    weights.append(attention)
                mixed = attention @ v
            elif return_weights:
                attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim) + bias, dim=-1)
                weights.append(attention)
                mixed = attention @ v
            else:  # the same attention, fused (its scores are never stored whole): about half the time
                flat = (t.reshape(n_models * batch, heads, length, head_dim) for t in (q, k, v))
                mask = self._flat_mask(length, batch)
                if window is not None:  # this layer's windows on top (a fresh tensor: one per local layer)
                    mask = mask + window.expand(-1, batch, -1, -1, -1).reshape_as(mask)
                mixed = nn.functional.scaled_dot_product_attention(*flat, attn_mask=mask)
            mixed = (
                mixed.reshape(n_models, batch, heads, length, head_dim)
                .transpose(2, 3)
                .reshape(n_models, batch * length, width)
            )
            x = x + torch.bmm(mixed, p[prefix + "o.weight"].transpose(1, 2)).view_as(x)
            h = _layer_norm(x, p[prefix + "mlp_norm.weight"], p[prefix + "mlp_norm.bias"]).flatten(1, 2)
            h = torch.baddbmm(p[prefix + "mlp.0.bias"][:, None], h, p[prefix + "mlp.0.weight"].transpose(1, 2))
            h = torch.baddbmm(
                p[prefix + "mlp.2.bias"][:, None], nn.functional.gelu(h), p[prefix + "mlp.2.weight"].transpose(1, 2)
            )
            x = x + h.view_as(x)
        x = _layer_norm(x, p["norm.weight"], p["norm.bias"]).flatten(1, 2)
        logits = torch.baddbmm(p["readout.bias"][:, None], x, p["readout.weight"].transpose(1, 2))
        logits = logits.view(n_models, batch, length, vocab)
        return (logits, weights) if return_weights else logits

    def trained_models(self) -> list:
        """One ordinary :class:`TinyTransformer` per model, holding the trained weights."""
        with torch.no_grad():
            for index, model in enumerate(self.models):
                for key, parameter in model.named_parameters():
                    if not key.startswith("encoding."):
                        parameter.copy_(self.params[key][index])
            for (start, stop, _, _), params in zip(self.groups, self.encoding_params):
                for index in range(start, stop):
                    for key, parameter in self.models[index].encoding.named_parameters():
                        parameter.copy_(params[key][index - start])
        return self.models


def train(task, name, config: ExperimentConfig, device=None, models=None):
    """Train one model per seed and encoding with AdamW on freshly drawn batches of length
    ``config.train_length``, all of them side by side in one :class:`Ensemble`.

    ``name``: an encoding name or a list of them; ``task``: one task for all, or a list with one task per name.
    ``models``: one model per name and seed to continue from (a fine-tune; copied, not changed), else fresh ones.
    Each seed draws its data from its own generator, so a seed sees the same batches whatever else is trained.
    Returns the :class:`Ensemble` and the losses, a float tensor ``(n_models, steps)``.
    """
    ensemble = Ensemble(name, config, device, models)
    names = [name] if isinstance(name, str) else list(name)
    task_list = list(task) if isinstance(task, (list, tuple)) else [task] * len(names)
    if len(task_list) != len(names) or not all(isinstance(t, CopyTask) for t in task_list):
        raise ValueError(f"task must be a CopyTask or a list of {len(names)} CopyTasks (one per name), got {task!r}")
    # one data stream per (task, seed); model g * n_seeds + s reads stream (task g, seed s)
    keys = list(dict.fromkeys((id(t), seed) for t in task_list for seed in config.seeds))
    streams = {key: torch.Generator().manual_seed(key[1]) for key in keys}
    task_of = {id(t): t for t in task_list}
    reads = torch.tensor([keys.index((id(t), seed)) for t in task_list for seed in config.seeds])
    optimizer = torch.optim.AdamW(
        ensemble.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay, foreach=True
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _learning_rate_factor(step, config))
    losses = []
    for _ in range(config.steps):
        batches = [
            task_of[key[0]].sample(config.batch_size, config.train_length, config.vocab_size, streams[key], device)
            for key in keys
        ]
        inputs, targets = (torch.stack(parts)[reads.to(parts[0].device)] for parts in list(zip(*batches))[:2])
        per_token = nn.functional.cross_entropy(
            ensemble.logits(inputs).flatten(0, 2), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
        ).view(len(reads), -1)
        per_model = per_token.sum(1) / (targets != IGNORE_INDEX).flatten(1).sum(1)
        optimizer.zero_grad(set_to_none=True)
        per_model.sum().backward()  # the models share no parameter, so each gets the gradient of its own loss
        optimizer.step()
        schedule.step()
        losses.append(per_model.detach())
    return ensemble, torch.stack(losses, dim=1).cpu()


def evaluation_data(task: CopyTask, length: int, config: ExperimentConfig, device=None):
    """The fixed evaluation batch at ``length`` (the same for every encoding and seed)."""
    generator = torch.Generator().manual_seed(config.eval_seed + length)
    return task.sample(config.eval_batch(length), length, config.vocab_size, generator, device)


@torch.no_grad()
def evaluate(model: TinyTransformer, task: CopyTask, length: int, config: ExperimentConfig):
    """Accuracy of the most likely token on the evaluation batch: ``(overall, per_position (L,))``."""
    device = next(model.parameters()).device
    return batch_accuracy(model, *evaluation_data(task, length, config, device))


@torch.no_grad()
def batch_accuracy(model: TinyTransformer, inputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor):
    """Accuracy of ``model``'s most likely token on one batch ``inputs``, ``targets``, ``mask`` (each ``(B, L)``):
    ``(overall, per_position (L,))``, per position NaN where there is no target."""
    model.eval()
    correct = (model(inputs).argmax(dim=-1) == targets) & mask
    per_position = correct.sum(0).float() / mask.sum(0).float()
    return (correct.sum() / mask.sum()).item(), per_position.cpu()


#: Largest attention-score tensor (elements) one evaluation chunk of stacked models may build (128 MB in float32).
EVAL_CHUNK_SCORES = 2**25


@torch.no_grad()
def evaluate_ensemble(ensemble: Ensemble, tasks, length: int, config: ExperimentConfig):
    """:func:`evaluate` for every model of ``ensemble`` at once (in chunks of models, see
    :data:`EVAL_CHUNK_SCORES`): ``tasks`` one task for all or one per model. Returns ``(overall (M,),
    per_position (M, L))`` on the CPU."""
    tasks = list(tasks) if isinstance(tasks, (list, tuple)) else [tasks] * len(ensemble)
    if len(tasks) != len(ensemble):
        raise ValueError(f"tasks must hold one task per model ({len(ensemble)}), got {len(tasks)}")
    data = {id(task): evaluation_data(task, length, config, ensemble.device) for task in tasks}
    batch = config.eval_batch(length)
    chunk = max(1, EVAL_CHUNK_SCORES // (batch * ensemble.n_heads * length * length))
    overall, per_position = [], []
    for start in range(0, len(ensemble), chunk):
        stop = min(start + chunk, len(ensemble))
        inputs, targets, mask = (torch.stack(parts) for parts in zip(*(data[id(t)] for t in tasks[start:stop])))
        correct = (ensemble.part(start, stop).logits(inputs).argmax(dim=-1) == targets) & mask  # (m, B, L)
        overall.append(correct.flatten(1).sum(1) / mask.flatten(1).sum(1))
        per_position.append(correct.sum(1).float() / mask.sum(1).float())  # NaN where no target
    return torch.cat(overall).cpu(), torch.cat(per_position).cpu()


def accuracies(models: list, task: CopyTask, config: ExperimentConfig, lengths=None) -> torch.Tensor:
    """Accuracy of each model (one per seed) at each of ``lengths`` (default ``config.eval_lengths``):
    ``(n_models, n_lengths)``, all models evaluated together."""
    lengths = config.eval_lengths if lengths is None else tuple(lengths)
    ensemble = Ensemble.from_models(models, config)
    return torch.stack([evaluate_ensemble(ensemble, task, length, config)[0] for length in lengths], dim=1)


def run_plan(plan, config: ExperimentConfig, device=None, progress=None) -> list:
    """Train every ``(task, encoding name)`` of ``plan`` with every seed, all side by side in one
    :class:`Ensemble`, and evaluate them at every length: one :class:`Run` per pair and seed, in plan order.
    ``progress(runs)`` is called with the runs of each pair once all are evaluated."""
    plan = [(task, _check_name(name)) for task, name in plan]
    tasks = [task for task, _ in plan]
    ensemble, losses = train(tasks, [name for _, name in plan], config, device)
    per_model = [task for task in tasks for _ in config.seeds]
    results = {length: evaluate_ensemble(ensemble, per_model, length, config) for length in config.eval_lengths}
    models, seeds, runs = ensemble.trained_models(), len(config.seeds), []
    for index, (task, name) in enumerate(plan):
        pair = []
        for offset, seed in enumerate(config.seeds):
            m = index * seeds + offset
            run = Run(task.name, name, seed, losses[m].tolist(), model=models[m])
            for length, (overall, positions) in results.items():
                run.accuracy[length], run.position_accuracy[length] = overall[m].item(), positions[m]
            pair.append(run)
        runs.extend(pair)
        if progress is not None:
            progress(pair)
    return runs


def run_encoding(task: CopyTask, name: str, config: ExperimentConfig, device=None) -> list:
    """Train encoding ``name`` on ``task`` with every seed, evaluate at every length: one :class:`Run` per seed."""
    return run_plan([(task, name)], config, device)


def run_experiments(tasks, names, config: ExperimentConfig, device=None, progress=None) -> list:
    """Every task x encoding x seed of ``config``, trained together (:func:`run_plan`); ``progress(runs)`` is
    called with the runs of each task and encoding."""
    return run_plan([(task, name) for task in tasks for name in names], config, device, progress)


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
        copy_.encoding = RotaryEmbedding(
            rotary.head_dim,
            {"rope_theta": base, **rope_parameters},
            max_position_embeddings=original_length,
            layout=rotary.layout,
        ).to(rotary.inv_freq.device)
        extended.append(copy_)
    return extended


def fine_tune(
    models: list,
    task: CopyTask,
    config: ExperimentConfig,
    length: int,
    steps: int,
    batch_size: int | None = None,
    learning_rate: float | None = None,
    device=None,
):
    """Continue training copies of ``models`` (one per seed of ``config``) for ``steps`` steps at ``length``, with
    the optimiser and schedule of :func:`train` (warm-up over a tenth of the steps); ``batch_size`` and
    ``learning_rate`` default to the config's. Returns the fine-tuned copies."""
    tuned = replace(
        config,
        train_length=require_int("length", length, minimum=1),
        steps=require_int("steps", steps, minimum=1),
        warmup_steps=max(1, steps // 10),
        batch_size=config.batch_size if batch_size is None else require_int("batch_size", batch_size, minimum=1),
        learning_rate=config.learning_rate if learning_rate is None else learning_rate,
    )
    ensemble, _ = train(task, "rope", tuned, device, models=models)
    return ensemble.trained_models()


def results_table(runs: list, config: ExperimentConfig, baselines: dict | None = None, html: bool = False) -> str:
    """One row per task and encoding, ``mean (min-max)`` accuracy in % at each length (see
    :func:`posenc.lab.tables.format_table`).

    ``baselines``: optional ``{task name: {row label: {length: accuracy}}}``, printed as extra rows of that task.
    """
    header = ["task", "encoding"] + [
        f"L = {length} ({length // config.train_length}x)" for length in config.eval_lengths
    ]
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


__all__ = [
    "ExperimentConfig",
    "threads",
    "ENCODINGS",
    "LAYER_PATTERNS",
    "BEYOND_ENCODINGS",
    "add_encoding",
    "add_layer_pattern",
    "JORDAN_DAMPING",
    "jordan_frequencies",
    "jordan_rotation_generator",
    "with_rope",
    "fine_tune",
    "accuracies",
    "encoding_label",
    "Block",
    "TinyTransformer",
    "build_model",
    "Run",
    "Ensemble",
    "train",
    "evaluation_data",
    "evaluate",
    "batch_accuracy",
    "EVAL_CHUNK_SCORES",
    "evaluate_ensemble",
    "run_plan",
    "run_encoding",
    "run_experiments",
    "accuracy_spread",
    "mean_position_accuracy",
    "results_table",
    "position_probe_r2",
]
