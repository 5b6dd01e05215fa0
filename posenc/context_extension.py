"""What a stretched RoPE frequency table resolves and reaches: wavelengths, turns, YaRN's ramp, trade-offs.

All functions take ``inv_freq`` tables of shape ``(P,)`` (one angle per unit of position for each feature pair,
as :func:`posenc.rope_frequencies` returns them) and compute in float64 on the table's device.
"""
from __future__ import annotations

import math

import torch

from ._checks import require_int, require_positive_number, require_tensor


def _table(name: str, inv_freq) -> torch.Tensor:
    require_tensor(name, inv_freq)
    if inv_freq.ndim != 1 or not inv_freq.is_floating_point():
        raise ValueError(f"{name} must be a 1-D real tensor of shape (P,), "
                         f"got {inv_freq.dtype} {tuple(inv_freq.shape)}")
    return inv_freq.double()


def wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """Positions per full turn of each pair, ``2 pi / theta_i``: ``(P,)`` -> ``(P,)`` (inf where theta_i = 0)."""
    return 2 * math.pi / _table("inv_freq", inv_freq)


def turns(inv_freq: torch.Tensor, length: int) -> torch.Tensor:
    """Full turns each pair makes across ``length`` positions, ``length theta_i / 2 pi`` (YaRN's ``r``): ``(P,)``."""
    require_int("length", length, minimum=1)
    return length * _table("inv_freq", inv_freq) / (2 * math.pi)


def yarn_ramp(r: torch.Tensor, alpha: float = 1.0, beta: float = 32.0) -> torch.Tensor:
    """YaRN's ramp as the paper writes it: 0 for ``r < alpha``, 1 for ``r > beta``, linear in ``r`` between."""
    require_tensor("r", r)
    alpha, beta = require_positive_number("alpha", alpha), require_positive_number("beta", beta)
    if not beta > alpha:
        raise ValueError(f"beta must be larger than alpha, got alpha={alpha}, beta={beta}")
    return ((r.double() - alpha) / (beta - alpha)).clamp(0, 1)


def unseen_arc(inv_freq: torch.Tensor, trained_inv_freq: torch.Tensor, trained_length: int,
               length: int) -> torch.Tensor:
    """Per pair, the arc swept over ``length`` positions with ``inv_freq`` divided by the arc swept over
    ``trained_length`` positions with ``trained_inv_freq``, each capped at one full turn: ``(P,)``.

    Above 1, the pair reaches angles it never produced in training.
    """
    require_int("trained_length", trained_length, minimum=1)
    require_int("length", length, minimum=1)
    new, old = _table("inv_freq", inv_freq), _table("trained_inv_freq", trained_inv_freq)
    if new.shape != old.shape:
        raise ValueError(f"inv_freq and trained_inv_freq must have the same shape, got {tuple(new.shape)} "
                         f"and {tuple(old.shape)}")
    full_turn = 2 * math.pi
    return (length * new).clamp(max=full_turn) / (trained_length * old).clamp(max=full_turn)


def tradeoffs(inv_freq: torch.Tensor, trained_inv_freq: torch.Tensor, trained_length: int, length: int,
              rtol: float = 1e-4) -> dict[str, float]:
    """Resolution against reach of a table used up to ``length`` by a model trained with ``trained_inv_freq``
    up to ``trained_length``:

    * ``finest_step``: angle (rad) between neighbouring positions for the fastest pair;
    * ``kept_pairs``: pairs whose frequency is the trained one (within ``rtol``);
    * ``long_pairs``: pairs whose wavelength exceeds ``trained_length``;
    * ``slowest_turns``: full turns of the slowest pair across ``length`` positions;
    * ``unseen_pairs``: pairs that sweep, across ``length``, more arc than in training (ratio > 1 + rtol);
    * ``worst_overshoot``: the largest of those arc ratios (1.0 when nothing is unseen).
    """
    arc = unseen_arc(inv_freq, trained_inv_freq, trained_length, length)
    table, trained = _table("inv_freq", inv_freq), _table("trained_inv_freq", trained_inv_freq)
    return {
        "finest_step": table.max().item(),
        "kept_pairs": int(((table - trained).abs() <= rtol * trained).sum()),
        "long_pairs": int((wavelengths(table) > trained_length).sum()),
        "slowest_turns": turns(table, length).min().item(),
        "unseen_pairs": int((arc > 1 + rtol).sum()),
        "worst_overshoot": max(arc.max().item(), 1.0),
    }
