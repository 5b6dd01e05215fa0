"""The encodings the experiments train, by name: one registry, each name tagged with its group.

* ``"position"``: chapter 11's comparison of position encodings (:data:`ENCODINGS`; :func:`add_encoding` adds to it);
* ``"pattern"``: models whose layers have different encodings, chapter 13's (:data:`LAYER_PATTERNS`;
  :func:`add_layer_pattern` adds to it);
* ``"content"``: chapter 14's data-dependent encodings CoPE, FoX and PaTH (:data:`BEYOND_ENCODINGS`).

Every function of the experiments takes a name of any group; the three tables are read-only views of
:data:`REGISTRY`, one per group, that map a name to ``(label, causal, factory)`` in registration order, so that a
chapter's plan over one group does not change when another group grows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ...absolute import LearnedInput, SinusoidalInput
from ...alibi import ALiBi
from ...data_dependent import CoPE, FoX, PaTH
from ...encodings import NoPE, PositionalEncoding
from ...generators import copy_frequencies, jordan_generator, xpos_generator
from ...group_encodings import GroupEncoding
from ...layer_patterns import LayerEncodings
from ...rope import RotaryEmbedding
from .config import ExperimentConfig

GROUPS = ("position", "pattern", "content")


@dataclass(frozen=True)
class Registered:
    """One registered encoding: ``factory(config) -> PositionalEncoding`` shown as ``label``, trained with a causal
    mask if ``causal``; ``layers``: a pattern's per-layer names; ``added``: by :func:`add_encoding` or
    :func:`add_layer_pattern` (so it may be registered again or removed), not built in."""

    label: str
    causal: bool
    factory: Callable[[ExperimentConfig], PositionalEncoding]
    group: str
    layers: tuple = ()
    added: bool = False


REGISTRY: dict[str, Registered] = {}


class EncodingGroup(Mapping):
    """The names of one group of :data:`REGISTRY` as a read-only mapping name -> ``(label, causal, factory)``."""

    def __init__(self, group: str):
        if group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS}, got {group!r}")
        self.group = group

    def __getitem__(self, name: str) -> tuple:
        entry = REGISTRY.get(name)
        if entry is None or entry.group != self.group:
            raise KeyError(name)
        return entry.label, entry.causal, entry.factory

    def __iter__(self):
        return iter([name for name, entry in REGISTRY.items() if entry.group == self.group])

    def __len__(self) -> int:
        return sum(entry.group == self.group for entry in REGISTRY.values())

    def __repr__(self) -> str:
        return f"EncodingGroup({self.group!r}: {list(self)})"


ENCODINGS = EncodingGroup("position")
LAYER_PATTERNS = EncodingGroup("pattern")
BEYOND_ENCODINGS = EncodingGroup("content")


def registered(name: str) -> Registered:
    """The entry of encoding ``name``; ValueError listing every name when there is none."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"encoding must be one of {list(REGISTRY)}, got {name!r}")
    return REGISTRY[name]


def encoding_label(name: str) -> str:
    return registered(name).label


def _check_new_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")


def _taken(name: str) -> ValueError:
    return ValueError(f"encoding name {name!r} is taken (by {REGISTRY[name].label!r}); pick another name")


def add_encoding(name: str, label: str, factory, causal: bool = True) -> str:
    """Register ``factory(config) -> PositionalEncoding`` as the encoding name ``name`` of :data:`ENCODINGS`
    (shown as ``label``, trained with a causal mask unless ``causal=False``); returns ``name``. Built-in names
    and the names of other groups are refused; a name added here may be added again (its new factory
    replaces the old one). Example: Llama 4's NoPE layer at the harness's scale,
    ``add_encoding("nope-temperature", "NoPE, temperature", lambda c: AttentionTemperature(c.train_length))``.
    """
    _check_new_name(name)
    if not isinstance(label, str):
        raise TypeError(f"label must be a str, got {type(label).__name__}")
    if not callable(factory) or isinstance(factory, nn.Module):  # an encoding itself is not a factory
        raise TypeError(f"factory must be a callable config -> PositionalEncoding, got {type(factory).__name__}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if name in REGISTRY and not (REGISTRY[name].added and REGISTRY[name].group == "position"):
        raise _taken(name)
    encoding = factory(ExperimentConfig())
    if not isinstance(encoding, PositionalEncoding):
        raise TypeError(f"factory must return a posenc PositionalEncoding, got {type(encoding).__name__}")
    REGISTRY[name] = Registered(label, causal, factory, "position", added=True)
    return name


def add_layer_pattern(name: str, layers, label: str | None = None) -> str:
    """Register a model whose layers have different encodings as the encoding name ``name`` in
    :data:`LAYER_PATTERNS` (so that the model, training and tables take it like any other, while chapter 11's plan
    over :data:`ENCODINGS` stays as it is); returns ``name``.

    ``layers``: names of :data:`ENCODINGS` (built in, or added by :func:`add_encoding`), repeated over the model's
    depth: layer ``i`` gets ``layers[i % len(layers)]`` (``("rope", "rope", "rope", "nope-causal")`` is the 3:1
    pattern at any depth, the built-in ``"hybrid"``; ``("nope-causal", "rope")`` alternates). Each must act on q and k
    or not at all (RoPE, the group encodings, causal NoPE: not an input or a logit-bias encoding, not another
    pattern), and all must be causal or all bidirectional. Registering the same pattern under the same name again is
    allowed (a re-run notebook); another pattern under a taken name raises ValueError.
    """
    return _register_pattern(name, layers, label, added=True)


def _register_pattern(name: str, layers, label: str | None, added: bool) -> str:
    _check_new_name(name)
    if isinstance(layers, str):
        raise TypeError(f"layers must be a sequence of encoding names, got the str {layers!r}")
    layers = tuple(layers)
    for each in layers:
        registered(each)
    if not layers:
        raise ValueError("layers must name at least one encoding")
    if name in REGISTRY:
        if REGISTRY[name].layers == layers and (label is None or REGISTRY[name].label == label):
            return name  # names resolve when a model is built: a re-added member encoding takes effect
        raise _taken(name)
    probe = ExperimentConfig()
    for each in layers:
        encoding = REGISTRY[each].factory(probe)
        if encoding.kind not in ("qk", "none") or isinstance(encoding, LayerEncodings):
            raise ValueError(
                f"layers must name encodings that act on q and k or not at all, got {each!r} "
                f"(a {encoding.kind!r} encoding)"
            )
    causal = {REGISTRY[each].causal for each in layers}
    if len(causal) > 1:
        raise ValueError(f"layers must be all causal or all bidirectional, got {layers}")
    if label is None:
        label = (
            "layers " + ", ".join(REGISTRY[each].label for each in layers) + (" (repeated)" if len(layers) > 1 else "")
        )

    def factory(config: ExperimentConfig) -> LayerEncodings:
        return LayerEncodings(REGISTRY[layers[i % len(layers)]].factory(config) for i in range(config.n_layers))

    REGISTRY[name] = Registered(label, causal.pop(), factory, "pattern", layers=layers, added=added)
    return name


def remove_encoding(name: str) -> bool:
    """Forget encoding ``name`` added by :func:`add_encoding` or :func:`add_layer_pattern` (built-in names are
    refused with ValueError); returns whether it was registered."""
    if name in REGISTRY and not REGISTRY[name].added:
        raise ValueError(f"name {name!r} is built in; only added encodings can be removed")
    return REGISTRY.pop(name, None) is not None


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


_BUILT_IN = (  # group, name, label, causal, factory
    ("position", "nope-bidirectional", "NoPE, bidirectional", False, lambda c: NoPE()),
    ("position", "nope-causal", "NoPE, causal", True, lambda c: NoPE()),
    ("position", "sinusoidal", "sinusoidal", True, lambda c: SinusoidalInput(c.d_model)),
    # sized for the longest evaluation; rows of positions never trained keep their random initial values, only
    # shrunk by AdamW's weight decay
    ("position", "learned", "learned", True, lambda c: LearnedInput(max(c.eval_lengths), c.d_model)),
    ("position", "rope", "RoPE", True, lambda c: RotaryEmbedding(c.head_dim)),
    ("position", "alibi", "ALiBi", True, lambda c: ALiBi(c.n_heads, causal=True)),
    ("position", "xpos", "xPos (damped RoPE)", True, lambda c: GroupEncoding(xpos_generator(c.head_dim))),
    ("position", "jordan", "Jordan block", True, lambda c: GroupEncoding(jordan_generator(c.head_dim))),
    (
        "position",
        "jordan-damped",
        "Jordan block, damped",
        True,
        lambda c: GroupEncoding(jordan_generator(c.head_dim, eigenvalue=JORDAN_DAMPING)),
    ),
    (
        "position",
        "jordan-rotation",
        "rotation at Jordan's frequencies",
        True,
        lambda c: GroupEncoding(jordan_rotation_generator(c.head_dim)),
    ),
    (
        "position",
        "jordan-rotation-damped",
        "rotation at Jordan's frequencies, damped",
        True,
        lambda c: GroupEncoding(jordan_rotation_generator(c.head_dim, JORDAN_DAMPING)),
    ),
    # CoPE's integer embeddings cover the positions a training sequence can produce (0 .. train_length); larger
    # fractional positions are clamped, as the paper's npos_max does
    ("content", "cope", "CoPE", True, lambda c: CoPE(c.head_dim, c.train_length + 1)),
    ("content", "fox", "FoX (forgetting attention)", True, lambda c: FoX(c.d_model, c.n_heads)),
    ("content", "path", "PaTH", True, lambda c: PaTH(c.d_model, c.n_heads, c.head_dim)),
)
for _group, _name, _label, _causal, _factory in _BUILT_IN:
    REGISTRY[_name] = Registered(_label, _causal, _factory, _group)

# Llama 4 / SmolLM3's 3:1 pattern: layer i is NoPE iff (i + 1) % 4 == 0, transformers' default no_rope_layers
# (posenc.layer_patterns.nope_every); pure RoPE below 4 layers
_register_pattern("hybrid", ("rope", "rope", "rope", "nope-causal"), "RoPE, NoPE every 4th layer (3:1)", added=False)
