"""Run a Hugging Face transformers model with posenc's RoPE, unchanged or changed.

:func:`use_posenc_rope` patches one loaded model instance so that its rotary embedding takes its cos/sin tables
from :func:`posenc.rope_frequencies` and :func:`posenc.rope_cos_sin`, and its attention rotates queries and keys
with :func:`posenc.apply_rope_qk`. With nothing changed the float32 logits are bit-identical to the model's own
(the same operations on the same numbers), including ``generate`` with a KV cache and left padding, because the
model keeps its own position ids, masks and cache. The same call runs the experiments::

    with posenc.use_posenc_rope(model, {"rope_type": "yarn", "factor": 2.0, ...}) as patched:
        logits = patched(input_ids).logits
    handle = posenc.use_posenc_rope(model, unrotate_pairs=range(4))   # stays until handle.remove()

Supported, decided by the model's structure (:mod:`posenc._transformers_structure`) and not by its class name:
any model (causal LM, base model, task head such as ``...ForSequenceClassification``, a subclass, a multimodal
wrapper through its language model) whose decoder holds ``rotary_emb`` returning real ``(cos, sin)`` tables and
``layers`` whose attention takes ``position_embeddings`` and calls a module-level rotation of ``(q, k, cos, sin)``
that a probe with the model's own tables finds to be the half layout (Llama and most families; partial rotary as
in Phi, StableLM and GPT-NeoX), the interleaved layout (Cohere, Cohere2), or DeepSeek-V3's interleaved-in, half-out
rotation. Anything else (Llama 4's complex product) gets a TypeError saying what was found. transformers is never
imported here; the model brings it.

bf16, measured on CPU against a float64 run: rotating ``q`` ``(1, 8, 1024, 64)`` at positions 0 to 1023 (theta
10,000), the float32 default's error is the bf16 rounding of the exact result (mean 1.1e-3, max 1.6e-2);
transformers' bf16 products give mean 1.8e-3 (max 2.7e-2) with a float32 ``inv_freq``, and mean 2.7e-2 (max 1.65)
after ``model.to(torch.bfloat16)`` rounded the frequencies. On the last-token logits of a random 4-layer Llama
(d 256, 1,024 tokens, 3 seeds) the other bf16 roundings dominate: mean error 2.12e-3 (the float32 default)
against 2.13e-3 (``rounding="model"``), within the spread over seeds.

Pairs are numbered as in posenc: pair ``i`` holds features ``i`` and ``i + R/2`` of the rotated part (half
layout; features ``2i`` and ``2i + 1`` in the interleaved layout) and turns at ``inv_freq[i]``, so pair 0 is the
fastest.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from . import _transformers_structure as structure
from ._checks import check_inv_freq
from .layer_patterns import rotary_layers
from .rope import apply_rope_qk, rope_cos_sin
from .rope_types import (
    ROPE_TYPES,
    check_rope_parameters,
    per_layer_types,
    rope_frequencies,
    rope_parameters_from_config,
)

ROUNDINGS = ("float32", "model")


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


class PosencRope:
    """The patch made by :func:`use_posenc_rope`: a context manager (``with ... as model``) and ``remove()``.

    Attributes: ``model`` (the model given), ``decoder`` (its module holding ``rotary_emb`` and ``layers``),
    ``layout`` (``"half"`` or ``"interleaved"``: how the model lays out its pairs), ``rotations`` (per layer,
    ``{function name: layout}``: the rotation functions its attention calls and what a probe found them to be),
    ``rounding``, ``rotary_layers`` (per layer, whether the model itself rotates there, read from its config by
    :func:`posenc.layer_patterns.rotary_layers`: False on SmolLM3's NoPE layers and Cohere2's global layers), and
    ``captured``: ``{layer: (q, k)}``, the un-rotated queries ``(B, H, L, R)`` and keys ``(B, H_kv, L, R)`` that
    the layers in ``capture_layers`` handed to their rotation at the last forward pass (detached copies; ``R``
    the rotated features, the whole head for most models).
    """

    def __init__(self, model, rope_parameters, options):
        """Made by :func:`use_posenc_rope`, whose keyword arguments ``options`` holds by name."""
        rounding, inv_freq = options["rounding"], options["inv_freq"]
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {', '.join(map(repr, ROUNDINGS))}, got {rounding!r}")
        _, decoder = structure.find_decoder(model)
        for module in (model, decoder):
            if getattr(module, "_posenc_rope", None) is not None:
                raise RuntimeError("this model is already patched by use_posenc_rope: remove() that patch first")
        self.model, self.decoder, self.rounding = model, decoder, rounding
        self.config = config = decoder.config
        self.rotary = decoder.rotary_emb
        self.layers = list(decoder.layers)
        self.attentions = [structure.attention_of(layer) for layer in self.layers]
        self.layer_types = sorted(set(config.layer_types)) if structure.rotary_takes_layer_type(self.rotary) else [None]
        own = {t: structure.own_tables(self.rotary, t) for t in self.layer_types}
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        chosen_length = options["max_position_embeddings"]
        self.max_position_embeddings = config.max_position_embeddings if chosen_length is None else chosen_length
        self.parameters = self._parameters(rope_parameters, inv_freq, options["attention_factor"])
        self.pairs = self._table(self.layer_types[0], 1)[0].shape[0]
        self._check_pair_count(own[self.layer_types[0]][0].shape[-1] // 2, inv_freq, rope_parameters)
        self._choose_layers(tuple(options["nope_layers"]), tuple(options["capture_layers"]))
        self.captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        device = own[self.layer_types[0]][0].device
        self._edit_pairs(options["unrotate_pairs"], options["drop_pairs"], options["rotate_pairs"], device)

        probed = {}  # attention class -> (forward, rotations): one probe per class, not per layer
        self._plans = [self._plan(index, own, probed) for index in range(len(self.layers))]
        layouts = sorted({plan[2] for plan in self._plans})
        if len(layouts) > 1:
            raise TypeError(
                f"use_posenc_rope: the layers of {type(model).__name__} rotate in different layouts "
                f"({', '.join(layouts)})"
            )
        self.layout = layouts[0]
        self.rotations = [plan[3] for plan in self._plans]
        if rope_parameters is None and inv_freq is None:
            self._check_own_tables(own)
        self._apply()

    def _check_pair_count(self, own_pairs: int, inv_freq, rope_parameters) -> None:
        if self.pairs == own_pairs:
            return
        given = "inv_freq" if inv_freq is not None else "rope_parameters" if rope_parameters is not None else None
        message = (
            f"the model's rotary embedding rotates {own_pairs} pairs per head, "
            f"{given or 'the table read from its config'} gives {self.pairs}"
        )
        raise ValueError(message) if given else TypeError(message)

    def _choose_layers(self, nope_layers, capture_layers) -> None:
        """Check and keep ``nope_layers`` and ``capture_layers``; read which layers the model itself rotates."""
        n_layers = len(self.layers)
        for name, chosen in (("nope_layers", nope_layers), ("capture_layers", capture_layers)):
            if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers for i in chosen):
                raise ValueError(f"{name} must hold layer indices in [0, {n_layers}), got {sorted(chosen)}")
        self.nope_layers, self.capture_layers = sorted(set(nope_layers)), sorted(set(capture_layers))
        flags = rotary_layers(self.config)  # from the config: SmolLM3's no_rope_layers, Cohere2's global layers
        self.rotary_layers = flags if len(flags) == n_layers else [True] * n_layers
        not_rotating = [i for i in self.capture_layers if not self.rotary_layers[i]]
        if not_rotating:
            raise ValueError(
                f"capture_layers: layers {not_rotating} of {type(self.model).__name__} do not rotate (its own NoPE "
                f"layers), so they hand no q and k to a rotation; layers that rotate: "
                f"{[i for i, rotates in enumerate(self.rotary_layers) if rotates]}"
            )

    def _edit_pairs(self, unrotate_pairs, drop_pairs, rotate_pairs, device) -> None:
        """Decided once here, so that a forward pass holds no data-dependent branch and no host read."""
        pairs = self.pairs
        unrotate = _pair_set("unrotate_pairs", unrotate_pairs, pairs)
        if rotate_pairs is not None:
            kept = set(_pair_set("rotate_pairs", rotate_pairs, pairs))
            unrotate = sorted(set(unrotate) | {i for i in range(pairs) if i not in kept})
        drop = _pair_set("drop_pairs", drop_pairs, pairs)
        if set(unrotate) & set(drop):
            raise ValueError(f"a pair cannot be both dropped and un-rotated: {sorted(set(unrotate) & set(drop))}")
        self._unrotate = torch.zeros(pairs, dtype=torch.bool, device=device)
        self._unrotate[unrotate] = True
        self._keep = None if not drop else (~torch.isin(torch.arange(pairs), torch.tensor(drop))).float().to(device)
        self._has_unrotate = bool(unrotate)
        self._static = {}  # layer type -> (inv_freq (R/2,) float32 on the model's device, attention_factor)
        for t in self.layer_types:
            spec = self.parameters[t]
            if isinstance(spec, tuple) or not ROPE_TYPES[spec["rope_type"]].uses_seq_len:
                table, factor = self._table(t, None)
                self._static[t] = (self._masked(table.to(device)), factor)

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
            return {
                t: check_rope_parameters(rope_parameters_from_config(self.config, layer_type=t))
                for t in self.layer_types
            }
        if not isinstance(rope_parameters, dict):
            raise TypeError(f"rope_parameters must be None or a dict, got {type(rope_parameters).__name__}")
        nested = per_layer_types(rope_parameters)
        if nested:
            if self.layer_types == [None]:
                raise ValueError(
                    f"this model has one rotary table; rope_parameters is per layer type "
                    f"({', '.join(map(repr, nested))})"
                )
            missing = [t for t in self.layer_types if t not in nested]
            if missing:
                raise ValueError(
                    f"rope_parameters must give every layer type of the model "
                    f"({', '.join(map(repr, self.layer_types))}); missing {missing}"
                )
            return {t: check_rope_parameters(rope_parameters[t]) for t in self.layer_types}
        return {t: check_rope_parameters(rope_parameters) for t in self.layer_types}

    def _table(self, layer_type, seq_len):
        """``(inv_freq (R/2,) float32, attention_factor)`` for one layer type at a pass of ``seq_len`` positions
        (an int or a 0-d integer tensor; read only by the length-dependent rope types), unmasked."""
        spec = self.parameters[layer_type]
        if isinstance(spec, tuple):
            return spec[1], spec[2]
        uses_length = ROPE_TYPES[spec["rope_type"]].uses_seq_len
        device = seq_len.device if isinstance(seq_len, torch.Tensor) else None
        return rope_frequencies(
            self.head_dim, spec, self.max_position_embeddings, seq_len if uses_length else None, device=device
        )

    def _masked(self, inv_freq: torch.Tensor) -> torch.Tensor:
        return inv_freq.masked_fill(self._unrotate.to(inv_freq.device), 0.0) if self._has_unrotate else inv_freq

    def cos_sin(self, position_ids: torch.Tensor, layer_type=None, dtype=torch.float32):
        """The tables the patched rotary embedding returns, for ``position_ids`` ``(B, L)``.

        Args:
            position_ids: ``(B, L)`` integer positions (the model's own, padding and cache included).
            layer_type: the layer type for a model with a table per type (Gemma 3), else None.
            dtype: the tables' dtype (computed in float32, then cast).

        Returns:
            ``(cos, sin)``, each ``(B, L, R)`` with both members of every pair equal (duplicated as the model's
            layout does: halves for ``"half"``, neighbours for ``"interleaved"``), the un-rotated pairs at angle 0
            and the dropped pairs at cos = sin = 0. The length-dependent rope types (dynamic NTK, LongRoPE) read
            ``max(position_ids) + 1`` as a tensor: no host read, no branch on values.
        """
        static = self._static.get(layer_type)
        if static is not None:
            inv_freq, factor = static
            inv_freq = inv_freq.to(position_ids.device)
        else:
            seq_len = position_ids.max() + 1  # the length transformers uses, kept on the device
            inv_freq, factor = self._table(layer_type, seq_len)
            inv_freq = self._masked(inv_freq.to(position_ids.device))
        if self.rounding == "model":  # the model stores its table in its buffer's dtype (bf16 after .to(bf16))
            inv_freq = inv_freq.to(self._buffer_dtype(layer_type)).float()
        cos, sin = rope_cos_sin(position_ids, inv_freq, factor)  # (B, L, R/2) float32
        if self._keep is not None:
            keep = self._keep.to(cos.device)
            cos, sin = cos * keep, sin * keep
        cos, sin = self._full(cos), self._full(sin)
        return cos.to(dtype), sin.to(dtype)

    def _full(self, table: torch.Tensor) -> torch.Tensor:
        """A half table ``(..., R/2)`` as the model passes it, ``(..., R)``: each pair's value twice."""
        if self.layout == "interleaved":
            return table.repeat_interleave(2, dim=-1)
        return torch.cat((table, table), -1)

    def _check_own_tables(self, own: dict) -> None:
        """The tables read from the config must be the model's own (rounded as the model rounds them): else the
        patch would silently change the model."""
        for layer_type, (own_cos, own_sin) in own.items():
            positions = torch.arange(own_cos.shape[1], device=own_cos.device)[None]
            inv_freq, factor = self._table(layer_type, positions.max() + 1)  # no pair edits
            inv_freq = inv_freq.to(own_cos.device).to(self._buffer_dtype(layer_type)).float()
            cos, sin = (self._full(t) for t in rope_cos_sin(positions, inv_freq, factor))
            error = max((cos - own_cos).abs().max().item(), (sin - own_sin).abs().max().item())
            if not error <= 1e-5:
                raise ValueError(
                    f"posenc's table read from the config of {type(self.model).__name__} differs from its "
                    f"rotary embedding's own by {error:.2e} (layer type {layer_type!r}); pass "
                    f"rope_parameters or inv_freq explicitly"
                )

    def _buffer_dtype(self, layer_type) -> torch.dtype:
        """The dtype of the rotary embedding's own frequency buffer (``inv_freq``, or ``<layer_type>_inv_freq``)."""
        name = "inv_freq" if layer_type is None else f"{layer_type}_inv_freq"
        buffer = getattr(self.rotary, name, None)
        return buffer.dtype if isinstance(buffer, torch.Tensor) and buffer.is_floating_point() else torch.float32

    # ---------------------------------------------------------------------------------------- patching
    def _plan(self, index: int, own: dict, probed: dict):
        """``(attention forward, {name: posenc's rotation}, table layout, {name: layout found})`` for layer
        ``index``."""
        attention = self.attentions[index]
        if type(attention) not in probed:
            probed[type(attention)] = structure.rotations_of(attention, *own[self.layer_types[0]])
        forward, rotations = probed[type(attention)]
        layouts = {"interleaved" if r.layout == "interleaved" else "half" for r in rotations}
        if len(layouts) > 1:
            raise TypeError(
                f"use_posenc_rope: {type(attention).__name__} rotates with both the half and the "
                f"interleaved layout ({', '.join(r.name for r in rotations)})"
            )
        replacements = {r.name: self._rotation(index, r) for r in rotations}
        return forward, replacements, layouts.pop(), {r.name: r.layout for r in rotations}

    def _rotation(self, index: int, rotation: structure.Rotation):
        """The function layer ``index`` calls instead of ``rotation.function``: same signature, returns
        ``(q_rot, k_rot)``."""
        capture = index in self.capture_layers
        nope = index in self.nope_layers
        model_rounding = self.rounding == "model"
        original, layout, signature = rotation.function, rotation.layout, rotation.signature
        rotate_as = "interleaved" if layout == "interleaved" else "half"
        captured = self.captured

        def rotate(q, k, cos, sin, *args, **kwargs):
            if capture:
                captured[index] = (q.detach().clone(), k.detach().clone())
            if nope:
                return (structure.deinterleave(q), structure.deinterleave(k)) if layout == "deinterleaved" else (q, k)
            if model_rounding:  # posenc's tables, the model's own products and sums
                return original(q, k, cos, sin, *args, **kwargs)
            unsqueeze_dim = 1
            if args or kwargs:
                unsqueeze_dim = signature.bind(q, k, cos, sin, *args, **kwargs).arguments.get("unsqueeze_dim", 1)
            if unsqueeze_dim not in (1, 2):
                raise ValueError(
                    f"posenc rotates (B, H, L, D) or (B, L, H, D) inputs (unsqueeze_dim 1 or 2), "
                    f"got unsqueeze_dim={unsqueeze_dim}"
                )
            half = cos.shape[-1] // 2
            if layout == "interleaved":
                cos, sin = cos[..., 0::2], sin[..., 0::2]
            else:
                cos, sin = cos[..., :half], sin[..., :half]
            if layout == "deinterleaved":
                q, k = structure.deinterleave(q), structure.deinterleave(k)
            return apply_rope_qk(q, k, cos, sin, rotate_as, seq_dim=-2 if unsqueeze_dim == 1 else -3)

        return rotate

    def _apply(self) -> None:
        handle = self
        table_dtype = None if self.rounding == "model" else torch.float32

        def rotary_forward(x, position_ids, layer_type=None):
            dtype = x.dtype if table_dtype is None or x.dtype == torch.float64 else table_dtype
            return handle.cos_sin(position_ids, layer_type, dtype)

        self.rotary.forward = rotary_forward
        for attention, (forward, replacements, *_) in zip(self.attentions, self._plans):
            structure.bind_forward(attention, forward, replacements)
        self.model._posenc_rope = self
        self.decoder._posenc_rope = self

    def remove(self) -> None:
        """Undo the patch (idempotent)."""
        if getattr(self.model, "_posenc_rope", None) is not self:
            return
        del self.rotary.forward
        for attention in self.attentions:
            del attention.forward
        self.model._posenc_rope = None
        self.decoder._posenc_rope = None

    def __enter__(self):
        return self.model

    def __exit__(self, *exc) -> None:
        self.remove()


def use_posenc_rope(
    model,
    rope_parameters: dict | None = None,
    *,
    inv_freq: torch.Tensor | None = None,
    attention_factor: float | None = None,
    max_position_embeddings: int | None = None,
    unrotate_pairs=None,
    drop_pairs=None,
    rotate_pairs=None,
    nope_layers=(),
    capture_layers=(),
    rounding: str = "float32",
) -> PosencRope:
    """Patch one transformers model instance (any the module docstring supports) to rotate with posenc.

    The patch holds until ``remove()`` (or the end of a ``with`` block, whose ``as`` target is ``model``), on this
    instance only: the modeling module and every other model of the same family stay as they were.

    Args:
        model: a transformers ``torch.nn.Module``.
        rope_parameters: ``None`` keeps the model's own (:func:`posenc.rope_parameters_from_config`); a flat dict
            (any ``rope_type`` of :data:`posenc.ROPE_TYPES`) replaces every layer's; a dict per layer type for a
            model with a table per type (Gemma 3). Length-dependent types (dynamic, LongRoPE) read
            ``max(position_ids) + 1`` of each forward pass, as transformers does, as a tensor (no host read).
        inv_freq: ``(R/2,)`` an explicit table instead, with ``attention_factor`` (default 1);
            ``max_position_embeddings``: what the tables read as the trained length (default: the config's).
        unrotate_pairs: pairs held at angle 0 (content kept, position gone); ``rotate_pairs``: the only pairs
            that keep turning; ``drop_pairs``: pairs whose q and k features are zeroed (removed from every
            logit). Each: indices or a bool ``(R/2,)`` tensor.
        nope_layers: layer indices that get no rotation at all (SmolLM3's own NoPE layers stay NoPE).
        capture_layers: layers whose un-rotated q and k are kept in ``.captured`` (see PosencRope); a layer
            the model does not rotate is refused.
        rounding: ``"float32"`` (default): float32 tables, posenc rotates in float32 and rounds once to the
            model's dtype; ``"model"``: posenc's tables rounded as the model rounds its own (through the dtype of
            its ``inv_freq`` buffer, bf16 after ``model.to(torch.bfloat16)``) and the model's own rotation does
            the products and sums, so a bf16 model computes its own logits bit for bit (tested on CPU; GPU
            unverified). Identical in float32. Their errors in bf16: the module docstring.

    Returns:
        The :class:`PosencRope` handle (``remove()``, ``captured``, context manager).

    Raises:
        TypeError: a model that does not rotate with cos/sin (the message says what was found).
        ValueError: bad pairs, layers, tables or ``rounding``.
        RuntimeError: the model is already patched.
    """
    options = dict(locals())  # every argument above, by name
    del options["model"], options["rope_parameters"]
    return PosencRope(model, rope_parameters, options)
