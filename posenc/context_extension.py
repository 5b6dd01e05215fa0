"""What a stretched RoPE frequency table resolves and reaches: wavelengths, turns, YaRN's ramp, trade-offs,
the score kernel, and Liu et al.'s critical dimension.

All functions take ``inv_freq`` tables of shape ``(P,)`` (one angle per unit of position for each feature pair,
as :func:`posenc.rope_frequencies` returns them) and compute in float64 on the table's device.

Numerics: nothing here subtracts nearly equal numbers to get a small result. ``yarn_ramp``'s ``r - alpha`` is
exact near the edge in absolute terms (its rounding error is a few ulp of ``r``, far below the ramp's step), and
``tradeoffs`` compares tables with a relative tolerance, never with ``==``.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_head_dim, check_inv_freq, require_int, require_positive_number, require_tensor

# LongRoPE factors searched for a real model: the ``rope_scaling`` of the config of Phi-3-vision-128k-instruct
# (head dimension 3072 / 32 = 96, so 48 pairs; base 10000; original context 4096; max_position_embeddings 131072;
# rope type "su", LongRoPE's old name), as that config is reproduced in public code.
PHI3_VISION_128K = {
    "head_dim": 96,
    "rope_theta": 10000.0,
    "original_max_position_embeddings": 4096,
    "max_position_embeddings": 131072,
    "long_factor": [
        1.0299999713897705,
        1.0499999523162842,
        1.0499999523162842,
        1.0799999237060547,
        1.2299998998641968,
        1.2299998998641968,
        1.2999999523162842,
        1.4499999284744263,
        1.5999999046325684,
        1.6499998569488525,
        1.8999998569488525,
        2.859999895095825,
        3.68999981880188,
        5.419999599456787,
        5.489999771118164,
        5.489999771118164,
        9.09000015258789,
        11.579999923706055,
        15.65999984741211,
        15.769999504089355,
        15.789999961853027,
        18.360000610351562,
        21.989999771118164,
        23.079999923706055,
        30.009998321533203,
        32.35000228881836,
        32.590003967285156,
        35.56000518798828,
        39.95000457763672,
        53.840003967285156,
        56.20000457763672,
        57.95000457763672,
        59.29000473022461,
        59.77000427246094,
        59.920005798339844,
        61.190006256103516,
        61.96000671386719,
        62.50000762939453,
        63.3700065612793,
        63.48000717163086,
        63.48000717163086,
        63.66000747680664,
        63.850006103515625,
        64.08000946044922,
        64.760009765625,
        64.80001068115234,
        64.81001281738281,
        64.81001281738281,
    ],
    "short_factor": [
        1.05,
        1.05,
        1.05,
        1.1,
        1.1,
        1.1,
        1.2500000000000002,
        1.2500000000000002,
        1.4000000000000004,
        1.4500000000000004,
        1.5500000000000005,
        1.8500000000000008,
        1.9000000000000008,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.000000000000001,
        2.1000000000000005,
        2.1000000000000005,
        2.2,
        2.3499999999999996,
        2.3499999999999996,
        2.3499999999999996,
        2.3499999999999996,
        2.3999999999999995,
        2.3999999999999995,
        2.6499999999999986,
        2.6999999999999984,
        2.8999999999999977,
        2.9499999999999975,
        3.049999999999997,
        3.049999999999997,
        3.049999999999997,
    ],
}


def _table(name: str, inv_freq) -> torch.Tensor:
    return check_inv_freq(name, inv_freq, floating=True).double()


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


def unseen_arc(
    inv_freq: torch.Tensor, trained_inv_freq: torch.Tensor, trained_length: int, length: int
) -> torch.Tensor:
    """Per pair, the arc swept over ``length`` positions with ``inv_freq`` divided by the arc swept over
    ``trained_length`` positions with ``trained_inv_freq``, each capped at one full turn: ``(P,)``.

    Above 1, the pair reaches angles it never produced in training.
    """
    require_int("trained_length", trained_length, minimum=1)
    require_int("length", length, minimum=1)
    new, old = _table("inv_freq", inv_freq), _table("trained_inv_freq", trained_inv_freq)
    if new.shape != old.shape:
        raise ValueError(
            f"inv_freq and trained_inv_freq must have the same shape, got {tuple(new.shape)} and {tuple(old.shape)}"
        )
    full_turn = 2 * math.pi
    return (length * new).clamp(max=full_turn) / (trained_length * old).clamp(max=full_turn)


def score_kernel(inv_freq: torch.Tensor, distances: torch.Tensor, attention_factor: float = 1.0) -> torch.Tensor:
    """RoPE's logit between a query and a key ``Delta`` apart that carry the same unit vector in every pair, averaged
    over the pairs:
    ``a^2 / P * sum_i cos(Delta theta_i)`` (``a``: the attention factor that multiplies cos and sin; for YaRN
    ``a = sqrt(1/t)`` with ``t`` the paper's softmax temperature). ``distances`` ``(N,)`` -> ``(N,)``, 1 at
    ``Delta = 0`` when ``a = 1``. It shows how fast a table
    forgets: where it stays near 1 the pairs cannot tell the two positions apart."""
    table = _table("inv_freq", inv_freq)
    require_tensor("distances", distances)
    a = require_positive_number("attention_factor", attention_factor)
    return a**2 * torch.cos(distances.to(table).reshape(-1, 1) * table).mean(-1)


def critical_pair(head_dim: int, base: float, length: int) -> int:
    """The first pair whose wavelength exceeds ``length``: ``ceil((d/2) log_base(length / 2 pi))`` (Liu et al.
    2023); pairs from it on never complete a turn in training. Its double is their critical dimension."""
    check_head_dim(head_dim)
    require_positive_number("base", base)
    require_int("length", length, minimum=1)
    if base <= 1:
        raise ValueError(f"base must be larger than 1, got {base}")
    exponent = (head_dim / 2) * math.log(length / (2 * math.pi)) / math.log(base)
    return min(head_dim // 2, max(0, math.ceil(exponent)))


def extrapolation_bound(head_dim: int, base: float, critical_dimension: int) -> float:
    """Liu et al.'s bound on the usable context after training with ``base``: the wavelength of the pair at the
    critical dimension, ``2 pi base^(critical_dimension / d)``."""
    check_head_dim(head_dim)
    require_int("critical_dimension", critical_dimension, minimum=0)
    return 2 * math.pi * require_positive_number("base", base) ** (critical_dimension / head_dim)


def tradeoffs(
    inv_freq: torch.Tensor, trained_inv_freq: torch.Tensor, trained_length: int, length: int, rtol: float = 1e-4
) -> dict[str, float]:
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
