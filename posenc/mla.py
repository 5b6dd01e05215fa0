"""Multi-head latent attention (MLA, DeepSeek-V2 and V3) and why its RoPE lives in a separate slice of the head.

The book's conventions: column vectors, ``q_m = W_q x_m``, logit ``q_m^T k_n / sqrt(d_h)``, offset ``m - n``.

MLA caches one latent vector per token, ``c_n = W_DKV x_n`` of ``kv_lora_rank = d_c`` numbers shared by every
head, instead of every head's key and value. Head ``h`` reads its key back as ``k_n = W_UK^h c_n``. Without a
position in the way the logit regroups,

    q_m^T k_n = (W_q^h x_m)^T (W_UK^h c_n) = ((W_UK^h)^T W_q^h x_m)^T c_n,

so ``W_UK`` is absorbed into the query side once (:func:`absorb_key_up_projection`) and the keys are never built:
each query is a ``d_c``-vector scored against the cache itself (:func:`absorbed_logits`). With RoPE on the whole
key the logit is ``(R(m) W_q x_m)^T R(n) W_UK c_n = x_m^T W_q^T R(m)^T R(n) W_UK c_n``: the rotation sits between
``W_q`` and ``W_UK`` and changes with the offset, so no one matrix absorbs it (:func:`full_key_rope_logits`
differs from :func:`absorbed_logits` except where ``m = n``); it would take one matrix ``W_UK^T R(m - n) W_q`` per
offset (:func:`absorb_key_up_projection` with ``inv_freq`` and ``offset``).

DeepSeek's way out, "decoupled RoPE" (:class:`LatentAttention`): every head's query and key have two parts, a
``qk_nope_head_dim`` part that carries no position (it absorbs ``W_UK``) and a ``qk_rope_head_dim`` part that is
rotated. The key's rotated part ``R(n) W_KR x_n`` is one vector shared by all heads, cached beside ``c_n``; the
logit is the sum of the two parts' dot products, scaled by ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``.

Layout of the rotated slice. DeepSeek's checkpoints pair features ``(2i, 2i + 1)`` (``layout="interleaved"``,
transformers' ``rope_interleave=True``, the default of ``DeepseekV3Config``). transformers rotates those pairs and
writes the result de-interleaved (the ``2i`` members first, then the ``2i + 1`` members), which is
:func:`posenc.interleaved_to_half_permutation` followed by the half-layout rotation; :class:`LatentAttention` does
exactly that, so its rotated slices equal transformers' bit for bit. The permutation is applied to queries and keys
alike, so no dot product changes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import as_positions, check_head_dim, check_layout, require_int, require_real_floating
from .multihead import merge_heads, split_heads
from .rope import apply_rope, interleaved_to_half_permutation, rope_cos_sin, rope_matrix
from .rope_types import _yarn_mscale, check_rope_parameters, rope_frequencies


def _check_matrix(name: str, w, rows: int | None = None, columns: int | None = None) -> torch.Tensor:
    require_real_floating(name, w)
    if w.ndim != 2 or (rows is not None and w.shape[0] != rows) or (columns is not None and w.shape[1] != columns):
        expected = f"({'*' if rows is None else rows}, {'*' if columns is None else columns})"
        raise ValueError(f"{name} must be a matrix of shape {expected}, got {tuple(w.shape)}")
    return w


def _check_heads(name: str, w: torch.Tensor, n_heads: int) -> int:
    """The per-head size ``D`` of a projection ``(n_heads * D, ...)``."""
    if w.shape[0] % n_heads:
        raise ValueError(f"{name} must have n_heads * D = {n_heads} * D rows, got {w.shape[0]}")
    return w.shape[0] // n_heads


def absorb_key_up_projection(
    w_q: torch.Tensor,
    w_uk: torch.Tensor,
    n_heads: int,
    inv_freq: torch.Tensor | None = None,
    offset: float = 0.0,
    layout: str = "half",
) -> torch.Tensor:
    """``(W_UK^h)^T W_q^h`` for every head: ``(H, d_c, d_model)``.

    ``w_q``: ``(H * D, d_model)``, the query projection; ``w_uk``: ``(H * D, d_c)``, the key up-projection from the
    latent (both ``nn.Linear`` layout). The absorbed query of ``x_m`` is ``absorbed[h] @ x_m``, a ``d_c``-vector.

    With ``inv_freq`` ``(R/2,)`` (RoPE on the whole key): ``(W_UK^h)^T R(offset) W_q^h`` instead, in float64 (the
    rotation from :func:`posenc.rope_matrix`), the matrix that serves only the query-key pairs at that offset
    ``m - n``: the logit ``(R(m) q_m)^T R(n) k_n`` is ``(absorbed x_m)^T c_n``. One matrix per offset, so no single
    absorbed query scores a whole cache.
    """
    require_int("n_heads", n_heads, minimum=1)
    _check_matrix("w_q", w_q)
    _check_matrix("w_uk", w_uk, rows=w_q.shape[0])
    head_dim = _check_heads("w_q", w_q, n_heads)
    w_q, w_uk = w_q.view(n_heads, head_dim, -1), w_uk.view(n_heads, head_dim, -1)
    if inv_freq is None:
        return w_uk.transpose(1, 2) @ w_q
    check_layout(layout)
    if 2 * inv_freq.shape[-1] > head_dim:
        raise ValueError(f"inv_freq must have at most D/2 = {head_dim // 2} entries, got {inv_freq.shape[-1]}")
    # q^T R(m)^T R(n) k = q^T R(n - m) k = (W_UK^T R(m - n) W_q x_m)^T c_n
    return w_uk.double().transpose(1, 2) @ rope_matrix(offset, inv_freq, layout, head_dim) @ w_q.double()


def _check_inputs(x, latents, w_q, w_uk, n_heads):
    require_int("n_heads", n_heads, minimum=1)
    for name, t in (("x", x), ("latents", latents)):
        require_real_floating(name, t)
        if t.ndim != 3:
            raise ValueError(f"{name} must have shape (B, L, width), got {tuple(t.shape)}")
    if latents.shape[:2] != x.shape[:2]:
        raise ValueError(f"latents must have the (B, L) of x, {tuple(x.shape[:2])}, got {tuple(latents.shape[:2])}")
    _check_matrix("w_q", w_q, columns=x.shape[-1])
    _check_matrix("w_uk", w_uk, rows=w_q.shape[0], columns=latents.shape[-1])
    return _check_heads("w_q", w_q, n_heads)


def full_key_rope_logits(
    x: torch.Tensor,
    latents: torch.Tensor,
    w_q: torch.Tensor,
    w_uk: torch.Tensor,
    n_heads: int,
    inv_freq: torch.Tensor | None = None,
    positions=None,
    layout: str = "half",
) -> torch.Tensor:
    """Logits ``(B, H, L, L)`` of queries ``W_q x_m`` against keys ``W_UK c_n`` built from the latents, both
    rotated by RoPE over the whole head, the way a model without decoupled RoPE would compute them.

    ``x``: ``(B, L, d_model)``; ``latents``: ``(B, L, d_c)``; ``w_q``: ``(H * D, d_model)``; ``w_uk``:
    ``(H * D, d_c)``; ``inv_freq``: ``(R/2,)`` with ``R <= D`` (None: no rotation, then this equals
    :func:`absorbed_logits` up to rounding); ``positions``: ``(L,)`` or ``(B, L)``, default ``0 .. L-1``.
    Logits are divided by ``sqrt(D)``.
    """
    head_dim = _check_inputs(x, latents, w_q, w_uk, n_heads)
    check_layout(layout)
    q, k = split_heads(x @ w_q.T, n_heads), split_heads(latents @ w_uk.T, n_heads)
    if inv_freq is not None:
        positions = torch.arange(x.shape[1], device=x.device) if positions is None else positions
        cos, sin = rope_cos_sin(as_positions("positions", positions, device=x.device), inv_freq)
        if cos.ndim == 3:  # (B, L, R/2) against (B, H, L, D)
            cos, sin = cos[:, None], sin[:, None]
        q, k = apply_rope(q, cos, sin, layout), apply_rope(k, cos, sin, layout)
    return q @ k.transpose(-1, -2) / math.sqrt(head_dim)


def absorbed_logits(
    x: torch.Tensor, latents: torch.Tensor, w_q: torch.Tensor, w_uk: torch.Tensor, n_heads: int
) -> torch.Tensor:
    """Logits ``(B, H, L, L)`` computed with ``W_UK`` absorbed: the query ``(W_UK^h)^T W_q^h x_m`` (``d_c``
    numbers) scored against the latent ``c_n`` itself, divided by ``sqrt(D)``; no key is built and no position
    enters. Shapes as in :func:`full_key_rope_logits`."""
    head_dim = _check_inputs(x, latents, w_q, w_uk, n_heads)
    absorbed = absorb_key_up_projection(w_q, w_uk, n_heads)  # (H, d_c, d_model)
    queries = torch.einsum("hcd,bld->bhlc", absorbed, x)
    return queries @ latents[:, None].transpose(-1, -2) / math.sqrt(head_dim)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # DeepSeek's RMSNorm, in transformers' order of operations (float32 statistics)
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class LatentAttention(nn.Module):
    """DeepSeek-V2/V3 multi-head latent attention with decoupled RoPE (no bias, no dropout, no KV cache: every
    call sees the whole sequence).

    Sizes: ``d_model``; ``n_heads`` = H; ``kv_lora_rank`` = d_c; ``qk_nope_head_dim`` = d_n and
    ``qk_rope_head_dim`` = d_r (even), the two parts of each query and key head; ``v_head_dim`` = d_v;
    ``q_lora_rank`` = d_q, or None for an uncompressed query projection.

    Weights (``nn.Linear`` layout, named after the paper, laid out as DeepSeek's checkpoints and transformers'
    ``DeepseekV3Attention``, see :meth:`from_transformers`):

    * ``w_q`` ``(H (d_n + d_r), d_model)``, or ``w_dq`` ``(d_q, d_model)``, ``q_norm`` ``(d_q,)`` and ``w_uq``
      ``(H (d_n + d_r), d_q)``; each head's rows are its nope part, then its rope part;
    * ``w_dkv`` ``(d_c + d_r, d_model)``: the latent's down-projection ``W_DKV`` (first ``d_c`` rows) and the shared
      rope key's ``W_KR`` (last ``d_r`` rows); ``kv_norm`` ``(d_c,)``;
    * ``w_ukv`` ``(H (d_n + d_v), d_c)``: per head, ``W_UK`` (``d_n`` rows) then ``W_UV`` (``d_v`` rows);
    * ``w_o`` ``(d_model, H d_v)``.

    ``rope_parameters`` (any posenc ``rope_type``; default theta 10 000) and ``max_position_embeddings`` give the
    rotated slice's table ``inv_freq`` ``(d_r / 2,)`` float32; ``layout`` is the pairing of that slice
    (``"interleaved"``: DeepSeek's). The softmax scale is ``1 / sqrt(d_n + d_r)``, times ``mscale^2`` for YaRN with
    ``mscale_all_dim`` (DeepSeek-V3's rule, as transformers applies it).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        rope_parameters: dict | None = None,
        max_position_embeddings: int = 4096,
        layout: str = "interleaved",
        eps: float = 1e-6,
    ):
        super().__init__()
        self.d_model = require_int("d_model", d_model, minimum=1)
        self.n_heads = require_int("n_heads", n_heads, minimum=1)
        self.kv_lora_rank = require_int("kv_lora_rank", kv_lora_rank, minimum=1)
        self.qk_nope_head_dim = require_int("qk_nope_head_dim", qk_nope_head_dim, minimum=0)
        self.qk_rope_head_dim = check_head_dim(qk_rope_head_dim, "qk_rope_head_dim")
        self.v_head_dim = require_int("v_head_dim", v_head_dim, minimum=1)
        self.q_lora_rank = None if q_lora_rank is None else require_int("q_lora_rank", q_lora_rank, minimum=1)
        self.layout, self.eps = check_layout(layout), float(eps)
        self.rope_parameters = check_rope_parameters(rope_parameters)
        inv_freq, self.attention_factor = rope_frequencies(
            self.qk_rope_head_dim, self.rope_parameters, max_position_embeddings
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.scaling = self.qk_head_dim ** (-0.5)
        if self.rope_parameters["rope_type"] != "default" and self.rope_parameters.get("mscale_all_dim"):
            mscale = _yarn_mscale(self.rope_parameters["factor"], self.rope_parameters["mscale_all_dim"])
            self.scaling = self.scaling * mscale * mscale

        def weight(rows, columns):
            return nn.Parameter(torch.randn(rows, columns) / math.sqrt(columns))

        q_rows = self.n_heads * self.qk_head_dim
        if self.q_lora_rank is None:
            self.w_q = weight(q_rows, d_model)
        else:
            self.w_dq, self.w_uq = weight(self.q_lora_rank, d_model), weight(q_rows, self.q_lora_rank)
            self.q_norm = nn.Parameter(torch.ones(self.q_lora_rank))
        self.w_dkv = weight(kv_lora_rank + self.qk_rope_head_dim, d_model)
        self.kv_norm = nn.Parameter(torch.ones(kv_lora_rank))
        self.w_ukv = weight(self.n_heads * (self.qk_nope_head_dim + self.v_head_dim), kv_lora_rank)
        self.w_o = weight(d_model, self.n_heads * self.v_head_dim)

    # ------------------------------------------------------------------------------------------ transformers
    @classmethod
    def from_transformers(cls, attention) -> LatentAttention:
        """A copy of a transformers ``DeepseekV3Attention`` (or V2-style module with the same weights): sizes,
        ``rope_parameters``, ``rope_interleave`` and weights. Raises ValueError for biases (``attention_bias``)."""
        from .rope_types import rope_parameters_from_config

        config = getattr(attention, "config", None)
        if config is None or not hasattr(attention, "kv_b_proj"):
            raise TypeError(f"attention must be a transformers DeepseekV3Attention, got {type(attention).__name__}")
        if getattr(config, "attention_bias", False):
            raise ValueError("LatentAttention has no biases: the config must have attention_bias=False")
        layer = cls(
            config.hidden_size,
            config.num_attention_heads,
            config.kv_lora_rank,
            config.qk_nope_head_dim,
            config.qk_rope_head_dim,
            config.v_head_dim,
            config.q_lora_rank,
            rope_parameters_from_config(config),
            config.max_position_embeddings,
            "interleaved" if getattr(config, "rope_interleave", False) else "half",
            config.rms_norm_eps,
        )
        source = attention.kv_a_proj_with_mqa.weight
        layer.to(device=source.device, dtype=source.dtype)
        with torch.no_grad():
            if layer.q_lora_rank is None:
                layer.w_q.copy_(attention.q_proj.weight)
            else:
                layer.w_dq.copy_(attention.q_a_proj.weight)
                layer.q_norm.copy_(attention.q_a_layernorm.weight)
                layer.w_uq.copy_(attention.q_b_proj.weight)
            layer.w_dkv.copy_(attention.kv_a_proj_with_mqa.weight)
            layer.kv_norm.copy_(attention.kv_a_layernorm.weight)
            layer.w_ukv.copy_(attention.kv_b_proj.weight)
            layer.w_o.copy_(attention.o_proj.weight)
        return layer

    def _apply(self, fn, *args, **kwargs):
        inv_freq = self.inv_freq
        super()._apply(fn, *args, **kwargs)
        if self.inv_freq.dtype != inv_freq.dtype:  # the angles stay float32 whatever the weights' dtype
            self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    # ------------------------------------------------------------------------------------------ the parts
    @property
    def w_uk(self) -> torch.Tensor:
        """``W_UK`` of every head, ``(H, d_n, d_c)`` (a view of ``w_ukv``)."""
        return self.w_ukv.view(self.n_heads, -1, self.kv_lora_rank)[:, : self.qk_nope_head_dim]

    @property
    def w_uv(self) -> torch.Tensor:
        """``W_UV`` of every head, ``(H, d_v, d_c)`` (a view of ``w_ukv``)."""
        return self.w_ukv.view(self.n_heads, -1, self.kv_lora_rank)[:, self.qk_nope_head_dim :]

    def _positions(self, x, positions):
        require_real_floating("x", x)
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, L, {self.d_model}), got {tuple(x.shape)}")
        if positions is None:
            return torch.arange(x.shape[1], device=x.device)[None]
        positions = as_positions("positions", positions, device=x.device)
        if positions.shape[-1] != x.shape[1]:
            raise ValueError(f"positions must have length L = {x.shape[1]}, got {positions.shape[-1]}")
        return positions if positions.ndim == 2 else positions[None]

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on the rope slice ``x`` ``(B, H, L, d_r)`` at ``positions`` ``(B, L)``, written in the half layout
        (for ``layout="interleaved"``: de-interleaved first, as transformers does)."""
        if self.layout == "interleaved":
            x = x[..., interleaved_to_half_permutation(self.qk_rope_head_dim, device=x.device)]
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.attention_factor)
        return apply_rope(x, cos[:, None], sin[:, None])

    def queries(self, x: torch.Tensor, positions=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q_nope (B, H, L, d_n), q_rope (B, H, L, d_r))``, the rope part rotated, for ``x`` ``(B, L, d_model)``
        at ``positions`` ``(L,)`` or ``(B, L)`` (default ``0 .. L-1``)."""
        positions = self._positions(x, positions)
        if self.q_lora_rank is None:
            q = nn.functional.linear(x, self.w_q)
        else:
            q = nn.functional.linear(_rms_norm(nn.functional.linear(x, self.w_dq), self.q_norm, self.eps), self.w_uq)
        q = q.view(*x.shape[:2], self.n_heads, self.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        return q_nope, self.rotate(q_rope, positions)

    def latents(self, x: torch.Tensor, positions=None) -> tuple[torch.Tensor, torch.Tensor]:
        """What MLA caches per token: ``(c (B, L, d_c), k_rope (B, L, d_r))``, the normalised latent and the shared
        rotated key part."""
        positions = self._positions(x, positions)
        c, k_rope = nn.functional.linear(x, self.w_dkv).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        c = _rms_norm(c, self.kv_norm, self.eps)
        return c, self.rotate(k_rope[:, None], positions)[:, 0]

    def keys_values(self, c: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys ``(B, H, L, d_n + d_r)`` (nope part from ``W_UK c``, then the shared rope part) and values
        ``(B, H, L, d_v)``, expanded from the cache ``c`` ``(B, L, d_c)``, ``k_rope`` ``(B, L, d_r)``."""
        kv = nn.functional.linear(c, self.w_ukv).view(*c.shape[:2], self.n_heads, -1).transpose(1, 2)
        k_nope, values = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k_rope = k_rope[:, None].expand(-1, self.n_heads, -1, -1)
        return torch.cat((k_nope, k_rope), dim=-1), values

    def logits(self, x: torch.Tensor, positions=None) -> torch.Tensor:
        """Scaled logits ``(B, H, L, L)`` with the keys expanded from the cache (no mask)."""
        return self._logits_values(x, positions)[0]

    def _logits_values(self, x, positions):
        q_nope, q_rope = self.queries(x, positions)
        keys, values = self.keys_values(*self.latents(x, positions))
        # transformers' order: one product of the concatenated parts, then the scale
        return torch.matmul(torch.cat((q_nope, q_rope), dim=-1), keys.transpose(2, 3)) * self.scaling, values

    def absorbed_logits(self, x: torch.Tensor, positions=None) -> torch.Tensor:
        """The same logits ``(B, H, L, L)`` computed from the cache without building a key: the nope query
        absorbs ``W_UK`` (``(W_UK^h)^T q_nope``, ``d_c`` numbers) and meets ``c`` directly; the rope parts meet
        as they are. Equal to :meth:`logits` up to float rounding (the sums are grouped differently)."""
        q_nope, q_rope = self.queries(x, positions)
        c, k_rope = self.latents(x, positions)
        q_latent = q_nope @ self.w_uk  # (B, H, L, d_n) @ (H, d_n, d_c) -> (B, H, L, d_c)
        scores = q_latent @ c[:, None].transpose(-1, -2) + q_rope @ k_rope[:, None].transpose(-1, -2)
        return scores * self.scaling

    def forward(self, x: torch.Tensor, positions=None, causal: bool = True, return_weights: bool = False):
        """``x`` ``(B, L, d_model)`` -> ``(B, L, d_model)`` (and the weights ``(B, H, L, L)`` when asked): the
        logits of :meth:`logits`, a causal mask, a float32 softmax, the values, ``w_o``."""
        logits, values = self._logits_values(x, positions)
        if causal:
            length = x.shape[1]
            future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
            logits = logits.masked_fill(future, float("-inf"))
        weights = torch.softmax(logits, dim=-1, dtype=torch.float32).to(x.dtype)
        out = nn.functional.linear(merge_heads(torch.matmul(weights, values)), self.w_o)
        return (out, weights) if return_weights else out


__all__ = ["absorb_key_up_projection", "full_key_rope_logits", "absorbed_logits", "LatentAttention"]
