"""Data-dependent positions: CoPE, FoX and PaTH, the encodings whose logit depends on what lies between two tokens.

Every encoding of chapters 2 to 12 is a function of positions alone; these read the content. They are plug-ins of
the kind ``"content"`` (:mod:`posenc.encodings`): :func:`posenc.attention` hands them the queries, the keys, the
hidden states of the key tokens and the causal mask, and they return the logits ``(B, H, Lq, Lk)``. Positions are
not used: they count tokens in sequence order, the queries being the last ``Lq`` of the ``Lk`` keys.

* :class:`CoPE` (Golovneva et al. 2024, arXiv 2405.18719). Gates ``g_ij = sigmoid(q_i . k_j / sqrt(D))`` (0 for a
  masked key); the position of key ``j`` seen from query ``i`` is ``p_ij = sum_{t = j..i} g_it``, a fraction; the
  logit adds ``q_i . e(p_ij)``, with ``e`` linearly interpolated between learned integer embeddings ``e[0..P-1]``
  (``p`` clamped to ``P - 1``). As in the authors' code (facebookresearch/RAM, ``projects/cope``): gates from the
  scaled, masked logits; ``e`` shared by the heads, zero at initialisation. ``q . e`` is not scaled, as in the
  paper's listing and in that code with ``--cope-nodiv``; the code's default divides the sum ``q . k + q . e`` by
  ``sqrt(D)``, position term included (with Adam, a position logit that moves ``sqrt(D)`` times more slowly).
* :class:`FoX`, forgetting attention (Lin et al., ICLR 2025, arXiv 2503.02130). Forget gates
  ``f_t = sigmoid(w_h . x_t + b_h)`` per head from the token's hidden state; the logit adds
  ``sum_{l = j+1..i} log f_l``, computed as ``c_i - c_j`` with ``c = cumsum(log f)`` (as the authors' kernel,
  zhixuan-lin/forgetting-transformer, ``ops/forgetting_attention.py``). This is ALiBi (slope 1) on the learned clock
  ``tau_t = -sum_{u <= t} log f_u``.
* :class:`PaTH` (Yang et al., NeurIPS 2025, arXiv 2505.16381). Householder-like maps ``H_t = I - beta_t w_t w_t^T``
  with ``w_t`` a unit vector and ``beta_t = 2 sigmoid(.) in (0, 2)``, both from the hidden state of token ``t``;
  the logit is ``q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(D)``, a path-ordered product (the identity for
  ``j = i``), the order of the naive reference in flash-linear-attention (``tests/ops/test_path_attn.py``). The
  authors' layer computes ``w_t`` through a short causal convolution over tokens ``t - 2 .. t`` (``short_conv=3``);
  the default ``short_conv=0`` reads token ``t`` alone.

Which of chapter 8's axioms each keeps (``AXIOMS``, checked in the tests): all three give up data independence (the
logit of one pair at one offset changes with the tokens between them) and keep translation invariance (shift the
whole sequence, e.g. by prepending tokens, and the logit of every pair of the shifted tokens is unchanged: the
gates, clocks and products run from the key to the query only). FoX is moreover a function of the offset alone in
its learned clock; PaTH keeps normalisation and linearity (invertible unless some ``beta_t = 1``) but its maps do
not form a one-parameter group ``exp(tX)``: the product is path-ordered and its factors do not commute; CoPE gives
up linearity (the logit is not bilinear in ``q``, ``k``) and normalisation (at offset 0 the position ``g_ii`` is
not 0).

Gates, positions, clocks and Householder products are computed in float32 or better whatever the inputs' dtype;
the logits come back in the dtype of ``q``.

Cost: CoPE ``O(Lq Lk P)``, FoX ``O(Lq Lk)`` on top of attention; PaTH here ``O(Lk^2 D)`` in a loop over the keys
(the flash-linear-attention kernel is blockwise and far faster; this one is for reading and for small models).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import require_int, require_tensor
from .encodings import PositionalEncoding

#: Chapter 8's axioms (and data independence), kept (True) or given up (False), per encoding. Translation invariance
#: is the logits' invariance under a shift of the whole sequence (data independence is what a change of the tokens
#: between a query and a key tests). Each entry is checked numerically in tests/test_data_dependent.py.
AXIOMS = {
    "CoPE": {"data independence": False, "translation invariance": True, "linearity": False, "normalisation": False},
    "FoX": {"data independence": False, "translation invariance": True, "linearity": True, "normalisation": True},
    "PaTH": {"data independence": False, "translation invariance": True, "linearity": True, "normalisation": True},
}


def _check_qk(q, k):
    for name, t in (("q", q), ("k", k)):
        require_tensor(name, t)
        if t.ndim != 4:
            raise ValueError(f"{name} must have shape (B, H, L, D), got {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1] or q.shape[:2] != k.shape[:2] or q.shape[-2] > k.shape[-2]:
        raise ValueError(
            f"q (B, H, Lq, D) and k (B, H, Lk, D) must share B, H and D with Lq <= Lk, "
            f"got {tuple(q.shape)} and {tuple(k.shape)}"
        )


def _check_hidden(hidden, k, d_model: int, name: str):
    if hidden is None:
        raise ValueError(
            f"{name} computes its gates from the hidden states: pass hidden (B, Lk, d_model) "
            "(posenc.self_attention does)"
        )
    require_tensor("hidden", hidden)
    if (
        hidden.ndim != 3
        or hidden.shape[0] not in (1, k.shape[0])
        or hidden.shape[1] != k.shape[-2]
        or hidden.shape[2] != d_model
    ):
        raise ValueError(
            f"hidden must have shape (B, Lk, d_model) = ({k.shape[0]}, {k.shape[-2]}, {d_model}), "
            f"got {tuple(hidden.shape)}"
        )


def _require_causal(allowed, name: str):
    if allowed is None:
        raise ValueError(f"{name} sums over the tokens between key and query, so it is causal only: use causal=True")


class ContentEncoding(PositionalEncoding):
    """Base class of the data-dependent encodings: ``kind = "content"``, override
    :meth:`~posenc.encodings.PositionalEncoding.content_logits`."""

    kind = "content"


class CoPE(ContentEncoding):
    """Contextual position encoding as a "content" plug-in (see the module docstring).

    ``head_dim``: ``D``; ``max_positions``: ``P``, the number of integer embeddings (fractional positions are clamped
    to ``P - 1``). ``embeddings`` ``(P, D)`` start at zero, as the authors'; ``init_scale > 0`` draws them normal
    instead (``generator`` for reproducible draws).
    """

    def __init__(self, head_dim: int, max_positions: int, init_scale: float = 0.0, generator=None):
        super().__init__()
        self.head_dim = require_int("head_dim", head_dim, minimum=1)
        self.max_positions = require_int("max_positions", max_positions, minimum=2)
        self.embeddings = nn.Parameter(init_scale * torch.randn(max_positions, head_dim, generator=generator))

    def positions(self, logits: torch.Tensor, allowed=None) -> torch.Tensor:
        """Fractional positions ``p_ij = sum_{t >= j} g_it`` (``g = sigmoid(logits)``, 0 where not ``allowed``), not
        clamped: ``logits`` ``(..., Lq, Lk)`` scaled -> ``(..., Lq, Lk)``."""
        gates = torch.sigmoid(logits)
        if allowed is not None:
            gates = gates.masked_fill(~allowed, 0.0)
        return gates.flip(-1).cumsum(-1).flip(-1)

    def position_logits(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``q_i . e(p_ij)``, ``e`` interpolated linearly between integer embeddings: ``(B, H, Lq, Lk)``."""
        positions = positions.clamp(max=self.max_positions - 1)
        table = q @ self.embeddings.to(q.dtype).T  # (B, H, Lq, P): q . e[n] for every integer n
        low = positions.floor()
        weight = positions - low
        low = low.long()
        high = (low + 1).clamp(max=self.max_positions - 1)
        return table.gather(-1, low) * (1 - weight) + table.gather(-1, high) * weight

    def content_logits(self, q, k, hidden=None, allowed=None):
        """``q k^T / sqrt(D) + q . e(p)``: ``(B, H, Lq, Lk)``. Works with and without a causal mask."""
        _check_qk(q, k)
        if q.shape[-1] != self.head_dim:
            raise ValueError(f"q and k must have head dimension {self.head_dim}, got {q.shape[-1]}")
        wide = torch.promote_types(q.dtype, torch.float32)  # gates and their sums in float32 or better
        logits = (q.to(wide) @ k.to(wide).transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return (logits + self.position_logits(q.to(wide), self.positions(logits, allowed))).to(q.dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_positions={self.max_positions}"


class FoX(ContentEncoding):
    """Forgetting attention as a "content" plug-in (causal only; see the module docstring).

    ``d_model``: the width of the hidden states; ``n_heads``: one forget gate per head. ``gate_weight`` ``(H, d_model)``
    starts as ``nn.Linear``'s default, ``gate_bias`` ``(H,)`` at ``bias`` (a positive bias starts the gates near 1,
    i.e. forgetting slowly).
    """

    def __init__(self, d_model: int, n_heads: int, bias: float = 0.0):
        super().__init__()
        self.d_model = require_int("d_model", d_model, minimum=1)
        self.n_heads = require_int("n_heads", n_heads, minimum=1)
        linear = nn.Linear(d_model, n_heads)
        self.gate_weight = nn.Parameter(linear.weight.detach().clone())
        self.gate_bias = nn.Parameter(torch.full((n_heads,), float(bias)))

    def log_forget_gates(self, hidden: torch.Tensor) -> torch.Tensor:
        """``log f_t = log sigmoid(w_h . x_t + b_h)``: ``hidden`` ``(B, L, d_model)`` -> ``(B, H, L)``, float32 or
        better."""
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        gates = hidden.to(dtype) @ self.gate_weight.to(dtype).T + self.gate_bias.to(dtype)
        return nn.functional.logsigmoid(gates).transpose(-1, -2)

    def clock(self, hidden: torch.Tensor) -> torch.Tensor:
        """The learned time ``tau_t = -sum_{u <= t} log f_u`` ``(B, H, L)``, increasing: the bias is ``-(tau_i -
        tau_j)``,
        causal ALiBi with slope 1 read at the times ``tau`` (chapter 8's unipotent block
        :func:`posenc.generators.alibi_generator` at real times; GRAPE's additive form, arXiv 2512.07805)."""
        return -self.log_forget_gates(hidden).cumsum(-1)

    def bias(self, hidden: torch.Tensor, query_length: int | None = None) -> torch.Tensor:
        """``sum_{l = j+1..i} log f_l`` for the last ``query_length`` tokens (default all) against every token:
        ``(B, H, Lq, Lk)`` (entries with ``j > i`` are the negated sum; the causal mask removes them)."""
        clock = self.log_forget_gates(hidden).cumsum(-1)  # c_t = sum_{l <= t} log f_l
        lq = clock.shape[-1] if query_length is None else query_length
        return clock[..., -lq:, None] - clock[..., None, :]

    def content_logits(self, q, k, hidden=None, allowed=None):
        _check_qk(q, k)
        _check_hidden(hidden, k, self.d_model, "FoX")
        _require_causal(allowed, "FoX")
        if q.shape[1] != self.n_heads:
            raise ValueError(f"q and k must have {self.n_heads} heads (one forget gate each), got {q.shape[1]}")
        bias = self.bias(hidden, q.shape[-2])  # float32 or better
        logits = (q.to(bias.dtype) @ k.to(bias.dtype).transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return (logits + bias).to(q.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}"


class PaTH(ContentEncoding):
    """PaTH attention as a "content" plug-in (causal only; see the module docstring).

    ``w_t``: ``normalize(W_w x_t)`` per head, ``W_w`` ``(H * D, d_model)``; ``beta_t = 2 sigmoid(w_b . x_t + b_b)``
    per head, ``w_b`` ``(H, d_model)``, ``b_b`` ``(H,)``. ``short_conv = K > 0``: the authors' layer
    (flash-linear-attention's ``PaTHAttention``, ``use_w_shortconv=True`` by default, ``K = 3``) passes ``W_w x``
    through a causal depthwise convolution of width ``K`` (no bias) and SiLU before the normalisation, so ``w_t``
    reads tokens ``t - K + 1 .. t``: ``w_t = normalize(silu(sum_{s < K} c_s * W_w x_{t-s}))``, ``c`` ``(H * D, K)``
    (``conv_weight`` ``(H * D, 1, K)``, ``c_s`` its entry ``K - 1 - s``). ``short_conv = 0`` (the default): ``w_t``
    from token ``t`` alone, a simplification. (The layer also makes ``W_w`` low-rank and optionally adds FoX's
    forget gate; here one linear map and no gate. Its decoding step updates the cached keys by
    ``k - beta_t (k . w_t) w_t``, the step of :meth:`content_logits`.)
    """

    def __init__(self, d_model: int, n_heads: int, head_dim: int, short_conv: int = 0):
        super().__init__()
        self.d_model = require_int("d_model", d_model, minimum=1)
        self.n_heads = require_int("n_heads", n_heads, minimum=1)
        self.head_dim = require_int("head_dim", head_dim, minimum=1)
        self.short_conv = require_int("short_conv", short_conv, minimum=0)
        self.w_weight = nn.Parameter(nn.Linear(d_model, n_heads * head_dim, bias=False).weight.detach().clone())
        beta = nn.Linear(d_model, n_heads)
        self.beta_weight = nn.Parameter(beta.weight.detach().clone())
        self.beta_bias = nn.Parameter(beta.bias.detach().clone())
        if self.short_conv:  # nn.Conv1d's initialisation, as the layer's ShortConvolution (a depthwise Conv1d)
            width = n_heads * head_dim
            conv = nn.Conv1d(width, width, self.short_conv, groups=width, bias=False)
            self.conv_weight = nn.Parameter(conv.weight.detach().clone())

    def householder_parameters(self, hidden: torch.Tensor):
        """``(w (B, H, L, D) unit vectors, beta (B, H, L) in (0, 2))`` from ``hidden`` ``(B, L, d_model)``, float32 or
        better."""
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        x = hidden.to(dtype)
        b, length, _ = x.shape
        w = x @ self.w_weight.to(dtype).T  # (B, L, H * D)
        if self.short_conv:  # left padding K - 1: position t sees t - K + 1 .. t
            padded = nn.functional.pad(w.transpose(1, 2), (self.short_conv - 1, 0))
            w = nn.functional.silu(nn.functional.conv1d(padded, self.conv_weight.to(dtype), groups=w.shape[-1]))
            w = w.transpose(1, 2)
        w = nn.functional.normalize(w.view(b, length, self.n_heads, self.head_dim).transpose(1, 2), dim=-1)
        beta = 2 * torch.sigmoid(x @ self.beta_weight.to(dtype).T + self.beta_bias.to(dtype)).transpose(-1, -2)
        return w, beta

    def content_logits(self, q, k, hidden=None, allowed=None):
        """``q_i^T H_i ... H_{j+1} k_j / sqrt(D)`` for ``j <= i`` (plain ``q_i . k_j / sqrt(D)`` for ``j > i``, which
        the
        causal mask removes): ``(B, H, Lq, Lk)``. One pass over the keys: after step ``t`` the keys ``j < t`` hold
        ``H_t ... H_{j+1} k_j``."""
        _check_qk(q, k)
        _check_hidden(hidden, k, self.d_model, "PaTH")
        _require_causal(allowed, "PaTH")
        if q.shape[1] != self.n_heads or q.shape[-1] != self.head_dim:
            raise ValueError(
                f"q and k must have {self.n_heads} heads of dimension {self.head_dim}, "
                f"got {q.shape[1]} of {q.shape[-1]}"
            )
        w, beta = self.householder_parameters(hidden)
        dtype = w.dtype
        q, keys = q.to(dtype), k.to(dtype)
        lq, lk = q.shape[-2], k.shape[-2]
        index = torch.arange(lk, device=k.device)
        rows = []
        for t in range(lk):
            if t > 0:  # keys j < t go through H_t = I - beta_t w_t w_t^T
                w_t = w[:, :, t, None, :]  # (B, H, 1, D)
                step = beta[:, :, t, None, None] * (keys * w_t).sum(-1, keepdim=True) * w_t
                keys = keys - step * (index < t)[:, None]
            if t >= lk - lq:
                rows.append(q[:, :, t - (lk - lq), None, :] @ keys.transpose(-1, -2))
        return (torch.cat(rows, dim=-2) / math.sqrt(q.shape[-1])).to(k.dtype)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim}, short_conv={self.short_conv}"


__all__ = ["AXIOMS", "ContentEncoding", "CoPE", "FoX", "PaTH"]
