"""Layer patterns: which layers of a model rotate, with which table, and what its NoPE layers do instead.

Today's models do not give every layer the same encoding:

* Llama 4 (iRoPE) and SmolLM3 switch RoPE off in every fourth layer (:func:`nope_every`); transformers spells the
  pattern ``no_rope_layers``, a list with **1 where the layer uses RoPE** and 0 where it is NoPE.
* Llama 4's NoPE layers also scale the query by a function of its absolute position, "attention temperature tuning"
  (:func:`attention_temperature`, the plug-in :class:`AttentionTemperature`), and its RoPE layers attend within
  chunks (``attention_chunk_size``).
* Gemma 3 rotates in every layer, with one table per layer type (local sliding-window layers and global ones).
* Cohere2 (Command R7B, Command A) rotates only in its sliding-window layers; its global layers are NoPE.
* Local layers attend within a window (:class:`LocalWindow`: a sliding window, or Llama 4's chunks).

:func:`layer_pattern` reads any of these from a transformers config, one :class:`LayerSpec` per layer, and
:class:`LayerEncodings` gives a model of the book one plug-in per layer (``posenc.lab.experiments`` trains them).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import nn

from ._checks import as_positions, require_int, require_positive_number
from .encodings import PositionalEncoding
from .rope_types import per_layer_types, rope_parameters_from_config


def nope_every(n_layers: int, interval: int = 4) -> list[bool]:
    """Whether each of ``n_layers`` layers rotates (True) or is NoPE (False) when every ``interval``-th layer is
    NoPE: layer ``i`` is NoPE iff ``(i + 1) % interval == 0`` (transformers' default ``no_rope_layers`` of Llama 4
    and SmolLM3, ``interval = 4``: layers 3, 7, 11, ... are NoPE)."""
    require_int("n_layers", n_layers, minimum=1)
    require_int("interval", interval, minimum=1)
    return [(index + 1) % interval != 0 for index in range(n_layers)]


def attention_temperature(positions, floor_scale: float = 8192, attn_scale: float = 0.1) -> torch.Tensor:
    """Llama 4's query scale for NoPE layers, ``log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1``, in
    float32 for ``positions`` ``(*P,)`` (the query's absolute position ``p``; transformers takes the number of
    tokens already cached plus the index in the current input, not ``position_ids``): ``(*P,)`` float32, with
    transformers' order of operations.

    It is 1 for ``p < floor_scale - 1`` and grows like ``attn_scale * log(p / floor_scale)`` after: a sharper
    softmax for late queries, which face more keys (transformers' code cites arXiv 2501.19399, scalable softmax).
    Defaults: Llama 4's (8192, 0.1).
    """
    positions = as_positions("positions", positions)
    floor_scale = require_positive_number("floor_scale", floor_scale)
    if isinstance(attn_scale, bool) or not isinstance(attn_scale, numbers.Real):
        raise TypeError(f"attn_scale must be a number, got {type(attn_scale).__name__}")
    attn_scale = float(attn_scale)
    if not attn_scale >= 0:
        raise ValueError(f"attn_scale must be a number >= 0, got {attn_scale!r}")
    return torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0


class AttentionTemperature(PositionalEncoding):
    """A NoPE layer with Llama 4's temperature tuning, as a "qk" plug-in: the query at position ``m`` is multiplied
    by :func:`attention_temperature` ``(m)``, the key is left alone, nothing rotates.

    The logit becomes ``s(m) q_m^T k_n``: a function of the query's absolute position, not of the offset ``m - n``
    alone, so a shifted sequence gets other logits. In chapter 8's terms ``F(m) = s(m) I`` and ``G(n) = I`` are
    linear (axiom 1 holds) but ``F(m)^T G(n) = s(m) I`` is not a function of ``n - m`` (axiom 2, translation
    invariance, fails) except while every ``m + 1 < floor_scale``, where ``s(m) = 1``.

    ``encode_qk``: ``q`` ``(B, H, Lq, D)`` scaled in its own dtype (as transformers does:
    ``(q * scale).to(q.dtype)``), ``k`` ``(B, H, Lk, D)`` returned as it is.
    """

    kind = "qk"

    def __init__(self, floor_scale: float = 8192, attn_scale: float = 0.1):
        super().__init__()
        attention_temperature(torch.zeros(1), floor_scale, attn_scale)  # checks both
        self.floor_scale, self.attn_scale = floor_scale, attn_scale

    def encode_qk(self, q, k, q_positions, k_positions):
        scale = attention_temperature(q_positions, self.floor_scale, self.attn_scale).to(q.device)
        scale = scale[..., None] if scale.ndim == 1 else scale[:, None, :, None]  # (Lq, 1) or (B, 1, Lq, 1)
        return (q * scale).to(q.dtype), k


WINDOW_MODES = ("sliding", "chunked")


class LocalWindow(PositionalEncoding):
    """Local attention around another "qk" or "none" encoding: ``encoding`` acts on q and k as it would alone, and
    the logit bias is ``-inf`` outside the window (0 inside), so a query sees only nearby keys.

    ``mode="sliding"`` (Mistral, Gemma's local layers, RNoPE-SWA): key ``n`` is visible to query ``m`` iff
    ``m - n < size`` (with a causal mask: the ``size`` most recent positions, itself included), transformers'
    ``sliding_window``. ``mode="chunked"`` (Llama 4's RoPE layers, ``attention_chunk_size``): iff ``m`` and ``n``
    lie in the same chunk, ``floor(m / size) == floor(n / size)``. ``logit_bias``: ``(Lq, Lk)`` or
    ``(B, 1, Lq, Lk)`` float32 for positions ``(L,)`` or ``(B, L)``.
    """

    kind = "qk"

    def __init__(self, encoding: PositionalEncoding, size: int, mode: str = "sliding"):
        super().__init__()
        if not isinstance(encoding, PositionalEncoding):
            raise TypeError(f"encoding must be a posenc PositionalEncoding, got {type(encoding).__name__}")
        if encoding.kind not in ("qk", "none") or isinstance(encoding, (LayerEncodings, LocalWindow)):
            raise ValueError(
                f"encoding must act on q and k or not at all (RoPE, NoPE, ...), got a {encoding.kind!r} "
                f"encoding {type(encoding).__name__}"
            )
        if mode not in WINDOW_MODES:
            raise ValueError(f"mode must be one of {WINDOW_MODES}, got {mode!r}")
        self.inner, self.size, self.mode = encoding, require_int("size", size, minimum=1), mode

    def encode_qk(self, q, k, q_positions, k_positions):
        return self.inner.encode_qk(q, k, q_positions, k_positions)

    def visible(self, q_positions, k_positions) -> torch.Tensor:
        """``(Lq, Lk)`` or ``(B, Lq, Lk)`` bool: True where the window lets query ``m`` see key ``n``."""
        m, n = q_positions[..., :, None], k_positions[..., None, :]
        if self.mode == "sliding":
            return m - n < self.size
        return torch.div(m, self.size, rounding_mode="floor") == torch.div(n, self.size, rounding_mode="floor")

    def logit_bias(self, q_positions, k_positions):
        visible = self.visible(q_positions, k_positions)
        bias = torch.zeros(visible.shape, device=visible.device).masked_fill(~visible, float("-inf"))
        return bias if bias.ndim == 2 else bias[:, None]


class LayerEncodings(PositionalEncoding):
    """One plug-in encoding per layer: ``layer(i)`` is layer ``i``'s (``encodings[i]``).

    ``encodings``: a sequence of :class:`posenc.encodings.PositionalEncoding` of kind ``"qk"`` (RoPE, the group
    encodings, :class:`AttentionTemperature`, :class:`LocalWindow` around one of them) or ``"none"`` (NoPE); an
    "input" encoding is added once before the first layer and a "logits" bias is shared by all layers in the book's
    models, so neither is accepted here.
    It is a "qk" plug-in only through ``layer(i)``: calling ``encode_qk`` on the whole raises a TypeError.
    """

    kind = "qk"

    def __init__(self, encodings):
        super().__init__()
        encodings = list(encodings)
        if not encodings:
            raise ValueError("encodings must hold one encoding per layer, got none")
        for index, encoding in enumerate(encodings):
            if not isinstance(encoding, PositionalEncoding):
                raise TypeError(
                    f"encodings[{index}] must be a posenc PositionalEncoding, got {type(encoding).__name__}"
                )
            if encoding.kind not in ("qk", "none") or isinstance(encoding, LayerEncodings):
                raise ValueError(
                    f"encodings[{index}] must be a 'qk' or 'none' encoding (one per layer), got a "
                    f"{encoding.kind!r} encoding {type(encoding).__name__}"
                )
        self.encodings = nn.ModuleList(encodings)

    def __len__(self) -> int:
        return len(self.encodings)

    def layer(self, index: int) -> PositionalEncoding:
        """Layer ``index``'s encoding."""
        require_int("index", index, minimum=0)
        if index >= len(self):
            raise ValueError(f"index must be a layer in [0, {len(self)}), got {index}")
        return self.encodings[index]

    def encode_qk(self, q, k, q_positions, k_positions):
        raise TypeError("LayerEncodings holds one encoding per layer: use .layer(i).encode_qk(...)")


@dataclass(frozen=True)
class LayerSpec:
    """What one layer of a transformers model does with positions.

    ``rotary``: whether it rotates q and k; ``rope_parameters``: its table (flat, checked, for
    :func:`posenc.rope_frequencies`), None for a NoPE layer; ``layer_type``: the config's attention type
    (``"full_attention"``, ``"sliding_attention"``, ``"chunked_attention"``) or None; ``window``: the sliding window
    or attention chunk of that type (None: global); ``temperature``: ``(floor_scale, attn_scale)`` where the
    layer scales q by :func:`attention_temperature` (Llama 4's NoPE layers), else None; ``layout``: the pairing
    of the rotated features (Llama 4, Cohere and Cohere2 rotate interleaved pairs, the others half-split ones).
    """

    rotary: bool
    rope_parameters: dict | None
    layer_type: str | None = None
    window: int | None = None
    temperature: tuple | None = None
    layout: str = "half"


#: Families (transformers' ``model_type``) that pair neighbouring features ``(2i, 2i + 1)``: Llama 4 by a complex
#: product, Cohere and Cohere2 by their own ``rotate_half``; every other family pairs halves ``(i, i + R/2)``.
INTERLEAVED_FAMILIES = frozenset({"llama4_text", "cohere", "cohere2"})
#: Families whose attention rotates only in its sliding-window layers (``Cohere2Attention``: RoPE iff the layer has
#: a window), so a global layer, or every layer when ``sliding_window`` is None, is NoPE.
ROPE_ONLY_IN_SLIDING_LAYERS = frozenset({"cohere2"})
#: Entries of a config's ``layer_types`` for layers without softmax attention, which no family rotates: recurrent
#: layers (Mamba, Gated DeltaNet in Qwen3-Next, lightning attention: ``"linear_attention"``), convolutions and MoE-only
#: layers (Nemotron-H).
NON_ATTENTION_LAYER_TYPES = frozenset({"linear_attention", "conv", "moe"})


def _text_config(config):
    if isinstance(config, dict) or not hasattr(config, "to_dict"):
        raise TypeError(f"config must be a transformers config, got {type(config).__name__}")
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def rotary_layers(config) -> list[bool]:
    """Whether each layer of a transformers (text) config rotates q and k (True) or is NoPE (False).

    Read: ``num_hidden_layers``; ``no_rope_layers`` (Llama 4, SmolLM3: 1 = RoPE, 0 = NoPE; absent: every layer
    rotates); for the families of :data:`ROPE_ONLY_IN_SLIDING_LAYERS` (Cohere2), ``layer_types`` and
    ``sliding_window``: only a ``"sliding_attention"`` layer with a window rotates; in every family a layer whose
    ``layer_types`` entry is in :data:`NON_ATTENTION_LAYER_TYPES` (Qwen3-Next's Gated DeltaNet layers) does not.
    """
    config = _text_config(config)
    n_layers = require_int("config.num_hidden_layers", config.num_hidden_layers, minimum=1)
    flags = getattr(config, "no_rope_layers", None)
    rotary = [True] * n_layers if flags is None else [bool(flag) for flag in flags]
    if len(rotary) < n_layers:
        raise ValueError(f"config.no_rope_layers must give each of the {n_layers} layers, got {len(rotary)}")
    types = getattr(config, "layer_types", None) or [None] * n_layers
    rotary = [flag and types[i] not in NON_ATTENTION_LAYER_TYPES for i, flag in enumerate(rotary[:n_layers])]
    if getattr(config, "model_type", None) in ROPE_ONLY_IN_SLIDING_LAYERS:
        has_window = getattr(config, "sliding_window", None) is not None
        rotary = [flag and types[i] == "sliding_attention" and has_window for i, flag in enumerate(rotary)]
    return rotary[:n_layers]


def layer_pattern(config) -> list[LayerSpec]:
    """One :class:`LayerSpec` per layer of a transformers (text) config.

    Read: which layers rotate (:func:`rotary_layers`); ``layer_types`` with ``sliding_window`` (sliding layers)
    or ``attention_chunk_size`` (chunked layers); ``rope_parameters`` flat or per layer type (Gemma 3), through
    :func:`posenc.rope_parameters_from_config`; ``attn_temperature_tuning``, ``floor_scale`` and ``attn_scale``
    (Llama 4's NoPE layers). A multimodal config (Llama 4's ``Llama4Config``) is read through its text config.
    The family (``config.model_type``) decides the layout (:data:`INTERLEAVED_FAMILIES`).
    """
    rotary = rotary_layers(config)
    config = _text_config(config)
    types = getattr(config, "layer_types", None) or [None] * len(rotary)
    nested = per_layer_types(getattr(config, "rope_parameters", None))
    temperature = None
    if getattr(config, "attn_temperature_tuning", False):
        temperature = (config.floor_scale, config.attn_scale)
    layout = "interleaved" if getattr(config, "model_type", None) in INTERLEAVED_FAMILIES else "half"
    specs = []
    for index, rotates in enumerate(rotary):
        layer_type = types[index]
        window = None
        if layer_type == "sliding_attention" and getattr(config, "use_sliding_window", True):
            window = getattr(config, "sliding_window", None)
        elif layer_type == "chunked_attention":
            window = getattr(config, "attention_chunk_size", None)
        parameters = None
        if rotates:
            parameters = rope_parameters_from_config(config, layer_type=layer_type if nested else None)
        nope_attention = not rotates and layer_type not in NON_ATTENTION_LAYER_TYPES  # a NoPE attention layer
        specs.append(
            LayerSpec(rotates, parameters, layer_type, window, temperature if nope_attention else None, layout)
        )
    return specs


__all__ = [
    "nope_every",
    "attention_temperature",
    "AttentionTemperature",
    "WINDOW_MODES",
    "INTERLEAVED_FAMILIES",
    "ROPE_ONLY_IN_SLIDING_LAYERS",
    "NON_ATTENTION_LAYER_TYPES",
    "LocalWindow",
    "LayerEncodings",
    "LayerSpec",
    "rotary_layers",
    "layer_pattern",
]
