"""Run a Hugging Face transformers causal LM with posenc's RoPE, unchanged or changed.

:func:`use_posenc_rope` patches a loaded model so that its rotary embedding takes its cos/sin tables from
:func:`posenc.rope_frequencies` and :func:`posenc.rope_cos_sin`, and its attention rotates queries and keys with
:func:`posenc.apply_rope`. With nothing changed the logits are bit-identical to the model's own in float32 (the
same operations on the same numbers), including ``generate`` with a KV cache and left padding, because the model
keeps its own position ids, masks and cache. The same call runs the experiments::

    with posenc.use_posenc_rope(model, {"rope_type": "yarn", "factor": 2.0, ...}) as patched:
        logits = patched(input_ids).logits
    handle = posenc.use_posenc_rope(model, unrotate_pairs=range(4))   # stays until handle.remove()

Supported: the families whose attention is Llama's (:data:`SUPPORTED`): Llama, Mistral, Qwen2, Qwen3, Gemma 2,
Gemma 3 (a table per layer type: local and global bases), Phi-3 (LongRoPE), SmolLM3 (its NoPE layers stay
NoPE) and GPT-NeoX (partial rotary). transformers is never imported here; the model brings it.

Pairs are numbered as in posenc: pair ``i`` holds features ``i`` and ``i + R/2`` of the rotated part (half
layout) and turns at ``inv_freq[i]``, so pair 0 is the fastest.
"""
from __future__ import annotations

import threading
from typing import Iterable

import torch

from ._checks import check_inv_freq
from .rope import apply_rope, rope_cos_sin
from .rope_types import ROPE_TYPES, check_rope_parameters, per_layer_types, rope_frequencies, rope_parameters_from_config

# causal-LM (or base model) class -> its family; the base model holds `rotary_emb` and `layers`
SUPPORTED = {
    "Llama": "llama", "Mistral": "mistral", "Qwen2": "qwen2", "Qwen3": "qwen3", "Gemma2": "gemma2",
    "Gemma3": "gemma3", "Gemma3Text": "gemma3", "Phi3": "phi3", "SmolLM3": "smollm3", "GPTNeoX": "gpt_neox",
}
_SUFFIXES = ("ForCausalLM", "Model")


def _family(model) -> str:
    name = type(model).__name__
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in SUPPORTED:
            return SUPPORTED[name[: -len(suffix)]]
    supported = ", ".join(f"{prefix}ForCausalLM" for prefix in SUPPORTED if prefix != "Gemma3Text")
    raise TypeError(f"use_posenc_rope supports the transformers classes {supported} (and their base models), "
                    f"got {name}")


def _attention(layer):
    return layer.self_attn if hasattr(layer, "self_attn") else layer.attention


def _pair_set(name: str, pairs, count: int) -> list[int]:
    """Pair indices from ``None``, an iterable of ints or a bool tensor ``(count,)``, checked."""
    if pairs is None:
        return []
    if isinstance(pairs, torch.Tensor) and pairs.dtype == torch.bool:
        if pairs.shape != (count,):
            raise ValueError(f"{name} as a bool tensor must have shape ({count},), got {tuple(pairs.shape)}")
        return pairs.nonzero().flatten().tolist()
    if isinstance(pairs, torch.Tensor):
        pairs = pairs.tolist()
    if not isinstance(pairs, Iterable) or isinstance(pairs, (str, bytes)):
        raise TypeError(f"{name} must be None, pair indices or a bool tensor, got {type(pairs).__name__}")
    pairs = list(pairs)
    for index in pairs:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise ValueError(f"{name} must hold pair indices in [0, {count}), got {index!r}")
    return sorted(set(pairs))


# The attention modules look `apply_rotary_pos_emb` up in their modeling module's globals; while any model of
# that module is patched it is posenc's rotation (which computes, for the model's own tables, exactly what the
# original computes, so an unpatched model of the same family is unaffected).
_PATCHED_MODULES: dict[int, list] = {}  # id(globals) -> [globals, original function, number of patched models]
_LOCK = threading.Lock()
_CAPTURE = threading.local()


def _posenc_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' ``apply_rotary_pos_emb`` signature; ``cos``, ``sin``: ``(B, L, R)`` full tables (both halves
    equal) -> posenc's :func:`apply_rope` of ``q`` ``(B, H, L, D)`` and ``k`` ``(B, H_kv, L, D)``."""
    if unsqueeze_dim != 1:
        raise ValueError(f"posenc's rotation expects (B, H, L, D) queries (unsqueeze_dim=1), got {unsqueeze_dim}")
    record = getattr(_CAPTURE, "record", None)
    if record is not None:
        record(q, k)
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


def _patch_module(namespace: dict) -> None:
    with _LOCK:
        entry = _PATCHED_MODULES.get(id(namespace))
        if entry is None:
            entry = _PATCHED_MODULES[id(namespace)] = [namespace, namespace["apply_rotary_pos_emb"], 0]
            namespace["apply_rotary_pos_emb"] = _posenc_rotary_pos_emb
        entry[2] += 1


def _unpatch_module(namespace: dict) -> None:
    with _LOCK:
        entry = _PATCHED_MODULES[id(namespace)]
        entry[2] -= 1
        if entry[2] == 0:
            namespace["apply_rotary_pos_emb"] = entry[1]
            del _PATCHED_MODULES[id(namespace)]


class PosencRope:
    """The patch made by :func:`use_posenc_rope`: a context manager (``with ... as model``) and ``remove()``.

    ``captured``: ``{layer: (q, k)}``, the un-rotated queries ``(B, H, L, D)`` and keys ``(B, H_kv, L, D)`` of the
    layers in ``capture_layers`` at the last forward pass (detached).
    """

    def __init__(self, model, rope_parameters, inv_freq, attention_factor, max_position_embeddings,
                 unrotate_pairs, drop_pairs, rotate_pairs, nope_layers, capture_layers):
        family = _family(model)
        self.model = model
        base = model.base_model
        self.config = base.config
        config = self.config
        self.layers = list(base.layers)
        self.rotary = base.rotary_emb
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.max_position_embeddings = (config.max_position_embeddings if max_position_embeddings is None
                                        else max_position_embeddings)
        self.layer_types = sorted(set(getattr(config, "layer_types", None) or [])) if family == "gemma3" else [None]
        self.parameters = self._parameters(rope_parameters, inv_freq, attention_factor)
        self.head_dim = head_dim
        probe = self._table(next(iter(self.parameters)), 1)[0]
        pairs = probe.shape[0]
        self.pairs = pairs
        unrotate = _pair_set("unrotate_pairs", unrotate_pairs, pairs)
        if rotate_pairs is not None:
            kept = set(_pair_set("rotate_pairs", rotate_pairs, pairs))
            unrotate = sorted(set(unrotate) | {i for i in range(pairs) if i not in kept})
        drop = _pair_set("drop_pairs", drop_pairs, pairs)
        if set(unrotate) & set(drop):
            raise ValueError(f"a pair cannot be both dropped and un-rotated: {sorted(set(unrotate) & set(drop))}")
        self.unrotate = torch.zeros(pairs, dtype=torch.bool)
        self.unrotate[unrotate] = True
        self.drop = torch.zeros(pairs, dtype=torch.bool)
        self.drop[drop] = True
        n_layers = len(self.layers)
        for name, chosen in (("nope_layers", nope_layers), ("capture_layers", capture_layers)):
            if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers for i in chosen):
                raise ValueError(f"{name} must hold layer indices in [0, {n_layers}), got {sorted(chosen)}")
        self.nope_layers, self.capture_layers = sorted(set(nope_layers)), sorted(set(capture_layers))
        self.captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        if getattr(model, "_posenc_rope", None) is not None:
            raise RuntimeError("this model is already patched by use_posenc_rope: remove() that patch first")
        self._namespace = type(_attention(self.layers[0])).forward.__globals__
        self._hooks = []
        self._apply()

    # ---------------------------------------------------------------------------------------- the tables
    def _parameters(self, rope_parameters, inv_freq, attention_factor) -> dict:
        """layer type (``None`` for one table) -> rope_parameters dict, or ``("table", inv_freq, factor)``."""
        if inv_freq is not None:
            if rope_parameters is not None:
                raise ValueError("give rope_parameters or inv_freq, not both")
            check_inv_freq("inv_freq", inv_freq)
            factor = 1.0 if attention_factor is None else attention_factor
            if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
                raise ValueError(f"attention_factor must be a positive number, got {attention_factor!r}")
            return {t: ("table", inv_freq.detach().float().cpu(), float(factor)) for t in self.layer_types}
        if attention_factor is not None:
            raise ValueError("attention_factor goes with inv_freq; rope_parameters sets its own")
        if rope_parameters is None:
            return {t: rope_parameters_from_config(self.config, layer_type=t) for t in self.layer_types}
        if not isinstance(rope_parameters, dict):
            raise TypeError(f"rope_parameters must be None or a dict, got {type(rope_parameters).__name__}")
        nested = per_layer_types(rope_parameters)
        if nested:
            if self.layer_types == [None]:
                raise ValueError(f"this model has one rotary table; rope_parameters is per layer type "
                                 f"({', '.join(map(repr, nested))})")
            missing = [t for t in self.layer_types if t not in nested]
            if missing:
                raise ValueError(f"rope_parameters must give every layer type of the model "
                                 f"({', '.join(map(repr, self.layer_types))}); missing {missing}")
            return {t: check_rope_parameters(rope_parameters[t]) for t in self.layer_types}
        return {t: check_rope_parameters(rope_parameters) for t in self.layer_types}

    def _table(self, layer_type, seq_len: int):
        """``(inv_freq (R/2,) float32, attention_factor)`` for one layer type at a pass of ``seq_len`` positions."""
        spec = self.parameters[layer_type]
        if isinstance(spec, tuple):
            return spec[1], spec[2]
        head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        uses_length = ROPE_TYPES[spec.get("rope_type", "default")].uses_seq_len
        return rope_frequencies(head_dim, spec, self.max_position_embeddings, seq_len if uses_length else None)

    def cos_sin(self, position_ids: torch.Tensor, layer_type=None, dtype=torch.float32):
        """Full tables ``(B, L, R)`` (both halves equal, as transformers passes them) for ``position_ids``
        ``(B, L)``, with the un-rotated pairs at angle 0 and the dropped pairs at cos = sin = 0."""
        seq_len = int(position_ids.max()) + 1 if position_ids.numel() else 1  # the length transformers uses
        inv_freq, factor = self._table(layer_type, seq_len)
        inv_freq = inv_freq.to(position_ids.device)
        if self.unrotate.any():
            inv_freq = inv_freq.masked_fill(self.unrotate.to(inv_freq.device), 0.0)
        cos, sin = rope_cos_sin(position_ids, inv_freq, factor)  # (B, L, R/2) float32
        if self.drop.any():
            keep = (~self.drop).to(cos.device, cos.dtype)
            cos, sin = cos * keep, sin * keep
        return torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype)

    # ---------------------------------------------------------------------------------------- patching
    def _apply(self) -> None:
        handle = self

        def rotary_forward(x, position_ids, layer_type=None):
            return handle.cos_sin(position_ids, layer_type, x.dtype if x.dtype == torch.float64 else torch.float32)

        self.rotary.forward = rotary_forward
        for index in self.nope_layers:
            self._hooks.append(_attention(self.layers[index]).register_forward_pre_hook(_no_rotation,
                                                                                        with_kwargs=True))
        for index in self.capture_layers:
            attention = _attention(self.layers[index])
            self._hooks.append(attention.register_forward_pre_hook(self._start_capture(index), with_kwargs=True))
            self._hooks.append(attention.register_forward_hook(_stop_capture))
        _patch_module(self._namespace)
        self.model._posenc_rope = self

    def _start_capture(self, index):
        def hook(module, args, kwargs):
            _CAPTURE.record = lambda q, k: self.captured.__setitem__(index, (q.detach().clone(),
                                                                             k.detach().clone()))
        return hook

    def remove(self) -> None:
        """Undo the patch (idempotent)."""
        if getattr(self.model, "_posenc_rope", None) is not self:
            return
        del self.rotary.forward
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        _unpatch_module(self._namespace)
        self.model._posenc_rope = None

    def __enter__(self):
        return self.model

    def __exit__(self, *exc) -> None:
        self.remove()


def _no_rotation(module, args, kwargs):
    cos, sin = kwargs["position_embeddings"]
    kwargs["position_embeddings"] = (torch.ones_like(cos), torch.zeros_like(sin))
    return args, kwargs


def _stop_capture(module, args, output):
    _CAPTURE.record = None


def use_posenc_rope(model, rope_parameters: dict | None = None, *, inv_freq: torch.Tensor | None = None,
                    attention_factor: float | None = None, max_position_embeddings: int | None = None,
                    unrotate_pairs=None, drop_pairs=None, rotate_pairs=None, nope_layers=(),
                    capture_layers=()) -> PosencRope:
    """Patch a transformers causal LM (or its base model) to rotate with posenc; returns a :class:`PosencRope`.

    The patch holds until ``remove()`` (or the end of a ``with`` block, whose ``as`` target is ``model``).

    * ``rope_parameters``: ``None`` keeps the model's own (:func:`posenc.rope_parameters_from_config`); a flat dict
      (any ``rope_type`` of :data:`posenc.ROPE_TYPES`) replaces every layer's; for Gemma 3 a dict per layer type
      (``sliding_attention``, ``full_attention``). Length-dependent types (dynamic, LongRoPE) are evaluated at the
      length transformers uses, ``max(position_ids) + 1`` of each forward pass.
    * ``inv_freq`` ``(R/2,)`` with ``attention_factor`` (default 1): an explicit table instead.
    * ``max_position_embeddings``: what the tables read as the trained length (default: the config's).
    * ``unrotate_pairs``: pairs held at angle 0 (their content stays in every logit, without position);
      ``rotate_pairs``: the only pairs that keep turning (the others are un-rotated); ``drop_pairs``: pairs whose
      query and key features are zeroed (removed from every logit). Each: indices or a bool ``(R/2,)`` tensor.
    * ``nope_layers``: layer indices that get no rotation at all (SmolLM3's own NoPE layers stay NoPE).
    * ``capture_layers``: layer indices whose un-rotated q and k are kept in ``.captured`` (see PosencRope).

    Raises TypeError naming the supported classes for any other model.
    """
    return PosencRope(model, rope_parameters, inv_freq, attention_factor, max_position_embeddings,
                      unrotate_pairs, drop_pairs, rotate_pairs, tuple(nope_layers), tuple(capture_layers))
