"""The small transformer the experiments train, and its one forward pass, batched over a model axis.

The model is a pre-norm transformer of a few layers whose positional encoding is one
:class:`posenc.encodings.PositionalEncoding` object: an "input" encoding is added once to the token embeddings, a
"qk", "logits" or "content" encoding acts inside every attention layer (a
:class:`posenc.layer_patterns.LayerEncodings` gives each layer its own). :class:`TinyTransformer` holds the
parameters; :class:`ModelStack` computes the forward pass of several models at once, every parameter stacked along a
leading model axis, and a single model runs as a stack of one (its parameters viewed with a model axis of size 1),
so there is one forward to keep right.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.func import functional_call, vmap

from ...encodings import PositionalEncoding
from ...layer_patterns import LayerEncodings, LocalWindow
from .config import ExperimentConfig
from .registry import registered


class Block(nn.Module):
    """The parameters of one pre-norm block, ``x + attention(norm(x))`` then ``x + mlp(norm(x))`` (the
    computation is :meth:`ModelStack.logits`)."""

    def __init__(self, config: ExperimentConfig):
        super().__init__()
        width = config.d_model
        self.n_heads = config.n_heads
        self.attention_norm, self.mlp_norm = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.mlp = nn.Sequential(nn.Linear(width, config.d_mlp), nn.GELU(), nn.Linear(config.d_mlp, width))


class TinyTransformer(nn.Module):
    """Token embedding, ``n_layers`` blocks, a final norm and a linear read-out to the vocabulary.

    ``encoding``: one plug-in for every layer, or a :class:`posenc.layer_patterns.LayerEncodings` with one per
    layer (a hybrid: block ``i`` uses ``encoding.layer(i)``).

    ``forward(tokens (B, L)) -> logits (B, L, V)``; with ``return_hidden=True`` also the residual stream
    after each block, a list of ``(B, L, d_model)``, and with ``return_weights=True`` the attention weights of
    each block, a list of ``(B, H, L, L)`` (in that order). The forward is :meth:`ModelStack.logits` on this model
    alone.
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
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2:
            raise ValueError(f"tokens must be a tensor of shape (B, L), got {getattr(tokens, 'shape', tokens)!r}")
        outputs = ModelStack.of_model(self).logits(tokens[None], return_hidden, return_weights)
        if not (return_hidden or return_weights):
            return outputs[0]
        logits, *extras = outputs
        return (logits[0], *([each[0] for each in extra] for extra in extras))


def build_model(name: str, config: ExperimentConfig, seed: int, device=None) -> TinyTransformer:
    """A freshly initialised model with the registered encoding ``name`` (any group of
    :mod:`~posenc.lab.experiments.registry`), seeded by ``seed``."""
    entry = registered(name)
    torch.manual_seed(seed)
    return TinyTransformer(config, entry.factory(config), entry.causal).to(device)


def _layer_encoding(encoding: PositionalEncoding, layer: int) -> PositionalEncoding:
    """Layer ``layer``'s encoding: the layer's own for a :class:`LayerEncodings`, else ``encoding`` itself."""
    return encoding.layer(layer) if isinstance(encoding, LayerEncodings) else encoding


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


def stacked_parameters(models: list) -> tuple:
    """Copies of the parameters of ``models`` (built :class:`TinyTransformer` of one configuration) stacked along
    a leading model axis, as trainable leaves: ``(params, groups, encoding_params)`` for :class:`ModelStack`.
    Consecutive models with equivalent encodings and the same mask form one group."""
    groups = []  # (start, stop, encoding, causal): consecutive models that share one encoding call
    for index, model in enumerate(models):
        if groups and groups[-1][3] == model.causal and _equivalent(groups[-1][2], model.encoding):
            groups[-1] = (groups[-1][0], index + 1, *groups[-1][2:])
        else:
            groups.append((index, index + 1, model.encoding, model.causal))
    named = [dict(model.named_parameters()) for model in models]
    keys = [key for key in named[0] if not key.startswith("encoding.")]
    if any([key for key in each if not key.startswith("encoding.")] != keys for each in named):
        raise ValueError("models must share one configuration to be stacked")
    params = {key: torch.stack([each[key].detach() for each in named]).requires_grad_() for key in keys}
    encoding_params = [  # the encodings' own parameters (the learned table), stacked per group
        {
            key: torch.stack(
                [dict(m.encoding.named_parameters())[key].detach() for m in models[start:stop]]
            ).requires_grad_()
            for key, _ in encoding.named_parameters()
        }
        for start, stop, encoding, _ in groups
    ]
    return params, groups, encoding_params


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


class ModelStack:
    """``M`` models of one configuration, every parameter stacked along a leading model axis, and their forward
    pass: one batched operation per step for all of them (:meth:`logits`).

    ``params``: parameter name (as in :class:`TinyTransformer`) -> ``(M, ...)``, the encodings' parameters aside;
    ``groups``: ``(start, stop, encoding, causal)`` for each run of consecutive models that share one call of their
    encoding (no parameters, or parameters of the same shapes called per model through ``vmap``);
    ``encoding_params``: per group, the encoding's parameters stacked ``(stop - start, ...)``. ``fused``: the
    attention runs fused (``scaled_dot_product_attention``, about half the time) unless weights are asked for or a
    "content" encoding is in the stack; else unfused, ``softmax(logits) v``, the order of
    :func:`posenc.multihead.self_attention` (a single model's forward, :meth:`of_model`, runs unfused).
    """

    def __init__(
        self, params: dict, groups: list, encoding_params: list, n_heads: int, n_layers: int, fused: bool = True
    ):
        if any(isinstance(e, LayerEncodings) and any(True for _ in e.parameters()) for _, _, e, _ in groups):
            raise NotImplementedError("per-layer encodings with trainable parameters are not stacked")
        self.params, self.groups, self.encoding_params = params, groups, encoding_params
        self.n_heads, self.n_layers, self.fused = n_heads, n_layers, fused
        self.device = params["embed.weight"].device
        self._tables, self._callers = {}, {}  # per length: position tables; per group: its encoding's skeleton
        self._mask_key, self._mask = None, None

    @classmethod
    def of_model(cls, model: TinyTransformer) -> ModelStack:
        """``model`` as a stack of one: its own parameters viewed with a model axis of size 1 (no copy), attention
        unfused."""
        params = {key: value[None] for key, value in model.named_parameters() if not key.startswith("encoding.")}
        encoding_params = [{key: value[None] for key, value in model.encoding.named_parameters()}]
        groups = [(0, 1, model.encoding, model.causal)]
        return cls(params, groups, encoding_params, model.blocks[0].n_heads, len(model.blocks), fused=False)

    def __len__(self) -> int:
        return self.params["embed.weight"].shape[0]

    def part(self, start: int, stop: int) -> ModelStack:
        """Models ``start .. stop - 1`` as a stack that shares this one's parameters (views, no copy)."""
        params = {key: value[start:stop] for key, value in self.params.items()}
        groups, encoding_params = [], []
        for (first, last, encoding, causal), group_params in zip(self.groups, self.encoding_params):
            low, high = max(first, start), min(last, stop)
            if low < high:
                groups.append((low - start, high - start, encoding, causal))
                encoding_params.append({key: value[low - first : high - first] for key, value in group_params.items()})
        part = copy.copy(self)  # a subclass's own attributes come along
        ModelStack.__init__(part, params, groups, encoding_params, self.n_heads, self.n_layers, self.fused)
        return part

    def _sizes(self) -> list:
        return [stop - start for start, stop, _, _ in self.groups]

    def _has(self, kind: str, with_params: bool = False) -> bool:
        """Whether a group's encoding is of ``kind`` (and, with ``with_params``, has parameters)."""
        return any(
            encoding.kind == kind and (params or not with_params)
            for (_, _, encoding, _), params in zip(self.groups, self.encoding_params)
        )

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
            has_input = self._has("input")
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

    def logits(self, inputs: torch.Tensor, return_hidden: bool = False, return_weights: bool = False):
        """``inputs`` ``(M, B, L)`` (one batch per model) -> logits ``(M, B, L, V)``; with ``return_hidden`` also
        the residual stream after each block, a list of ``(M, B, L, d)``, and with ``return_weights`` the attention
        weights of each block, a list of ``(M, B, H, L, L)`` (in that order)."""
        p = self.params
        if not isinstance(inputs, torch.Tensor) or inputs.ndim != 3 or inputs.shape[0] != len(self):
            shape = tuple(getattr(inputs, "shape", ()))
            raise ValueError(f"inputs must have shape (M, B, L) with M = {len(self)} models, got {shape}")
        n_models, batch, length = inputs.shape
        positions = torch.arange(length, device=inputs.device)
        input_table, additive = self._position_tables(length)
        x = self._embed(inputs, positions, input_table)
        if self._has("logits", with_params=True):
            raise NotImplementedError("logits encodings with parameters are not stacked")
        hidden, weights = [], []
        for layer in range(self.n_layers):
            x, layer_weights = self._block(layer, x, positions, additive, return_weights)
            hidden.append(x)
            weights.append(layer_weights)
        x = _layer_norm(x, p["norm.weight"], p["norm.bias"]).flatten(1, 2)
        logits = torch.baddbmm(p["readout.bias"][:, None], x, p["readout.weight"].transpose(1, 2))
        logits = logits.view(n_models, batch, length, -1)
        extras = ([hidden] if return_hidden else []) + ([weights] if return_weights else [])
        return (logits, *extras) if extras else logits

    def _embed(self, inputs: torch.Tensor, positions: torch.Tensor, input_table) -> torch.Tensor:
        """Token embeddings ``(M, B, L, d)`` of ``inputs`` ``(M, B, L)``, each model's own, plus its input
        encoding (a shared table, or its own parameters)."""
        embed = self.params["embed.weight"]
        offsets = torch.arange(len(self), device=inputs.device)[:, None, None] * embed.shape[1]
        x = nn.functional.embedding(inputs + offsets, embed.flatten(0, 1))  # (M, B, L, d)
        if input_table is not None:
            x = x + input_table
        if self._has("input", with_params=True):
            pieces = list(x.split(self._sizes()))  # split, not slices: its backward is one concatenation
            for g, (_, _, encoding, _) in enumerate(self.groups):
                if encoding.kind == "input" and self.encoding_params[g]:  # a table per model (learned)
                    pieces[g] = self._per_model(g, "encode_input", pieces[g], positions=positions)
            x = torch.cat(pieces)
        return x

    def _block(self, layer: int, x: torch.Tensor, positions, additive, return_weights: bool):
        """Block ``layer`` on the residual stream ``x`` ``(M, B, L, d)``: the new stream and, with
        ``return_weights``, the attention weights ``(M, B, H, L, L)`` (else None)."""
        p, prefix = self.params, f"blocks.{layer}."
        n_models, batch, length, width = x.shape
        heads, head_dim = self.n_heads, width // self.n_heads
        h = _layer_norm(x, p[prefix + "attention_norm.weight"], p[prefix + "attention_norm.bias"]).flatten(1, 2)
        w_qkv = torch.cat([p[prefix + key + ".weight"] for key in "qkv"], dim=1)  # (M, 3d, d)
        qkv = torch.bmm(h, w_qkv.transpose(1, 2)).view(n_models, batch, length, 3, heads, head_dim)
        q, k, v = qkv.permute(3, 0, 1, 4, 2, 5)  # each (M, B, H, L, D)
        q, k = self._encode_qk(layer, q, k, positions)
        mixed, weights = self._attend(layer, q, k, v, h, positions, additive, return_weights)
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
        return x + h.view_as(x), weights

    def _encode_qk(self, layer: int, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple:
        """``q``, ``k`` ``(M, B, H, L, D)`` with layer ``layer``'s "qk" encodings applied, group by group."""
        if not self._has("qk"):
            return q, k
        _, batch, heads, length, head_dim = q.shape
        sizes = self._sizes()
        q_parts, k_parts = list(q.split(sizes)), list(k.split(sizes))
        for g, (start, stop, encoding, _) in enumerate(self.groups):
            encoding = _layer_encoding(encoding, layer)
            if encoding.kind == "qk" and self.encoding_params[g]:
                q_parts[g], k_parts[g] = self._per_model(g, "encode_qk", q_parts[g], k_parts[g], positions=positions)
            elif encoding.kind == "qk":
                q_parts[g], k_parts[g] = (
                    t.view(stop - start, batch, heads, length, head_dim)
                    for t in encoding.encode_qk(
                        q_parts[g].flatten(0, 1), k_parts[g].flatten(0, 1), positions, positions
                    )
                )
        return torch.cat(q_parts), torch.cat(k_parts)

    def _attend(self, layer: int, q, k, v, h, positions, additive, return_weights: bool) -> tuple:
        """Attention of ``q``, ``k``, ``v`` ``(M, B, H, L, D)`` under the stack's bias and masks and layer
        ``layer``'s windows: ``(mixed (M, B, H, L, D) or (M B, H, L, D), weights or None)``; ``h`` ``(M, B L, d)``
        are the normed states the "content" encodings read."""
        n_models, batch, heads, length, head_dim = q.shape
        window = self._window_bias(layer, length)
        if self._has("content") or return_weights or not self.fused:
            bias = additive if window is None else additive + window
        if self._has("content"):  # logits from the content, per model (vmap), then the same softmax for every group
            sizes = self._sizes()
            scores = list((q @ k.transpose(-1, -2) / math.sqrt(head_dim)).split(sizes))
            hidden_states = h.view(n_models, batch, length, -1).split(sizes)
            q_parts, k_parts = q.split(sizes), k.split(sizes)
            allowed = positions[:, None] >= positions[None, :]
            for g, (_, _, encoding, causal) in enumerate(self.groups):
                if encoding.kind == "content":
                    scores[g] = self._per_model(
                        g,
                        "content_logits",
                        q_parts[g],
                        k_parts[g],
                        hidden_states[g],
                        positions=allowed if causal else None,
                    )
            attention = torch.softmax(torch.cat(scores) + bias, dim=-1)
            return attention @ v, attention if return_weights else None
        if return_weights or not self.fused:
            attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim) + bias, dim=-1)
            return attention @ v, attention if return_weights else None
        # the same attention, fused (its scores are never stored whole): about half the time
        flat = (t.reshape(n_models * batch, heads, length, head_dim) for t in (q, k, v))
        mask = self._flat_mask(length, batch)
        if window is not None:  # this layer's windows on top (a fresh tensor: one per local layer)
            mask = mask + window.expand(-1, batch, -1, -1, -1).reshape_as(mask)
        return nn.functional.scaled_dot_product_attention(*flat, attn_mask=mask), None
