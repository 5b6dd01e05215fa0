"""Measuring RoPE: the long-range bound, per-pair logits, angle errors, and whether scores are relative.

Conventions: a query at position ``m`` and a key at ``n`` are ``distance = m - n`` apart (positive for keys in
the past). The RoPE logit is ``<R(m) q, R(n) k> = q^T R(n - m) k``; pair ``i``, written as the complex numbers
``z_q = q_a + i q_b`` and ``z_k = k_a + i k_b``, contributes ``Re(z_q conj(z_k) exp(i distance theta_i))``
(RoFormer's convention, as chapter 6 writes it).
"""

from __future__ import annotations

import math

import torch

from ._checks import as_float64, check_inv_freq, require_tensor
from .rope import pair_indices


def relative_upper_bound(distances, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoFormer's long-range bound ``(1 / P) sum_{j=1}^{P} |S_j|`` with ``S_j = sum_{i<j} exp(i distance theta_i)``.

    ``distances``: ``(N,)``; ``inv_freq``: ``(P,)`` (``P = d / 2``). Returns ``(N,)`` float64. The logit of a
    query and a key ``distance`` apart is at most ``max_i |h_{i+1} - h_i|`` times ``P`` times this value
    (Abel summation, Su et al. 2021, section 3.4.3), where ``h_i = z_q conj(z_k)`` per pair.
    """
    inv_freq = check_inv_freq("inv_freq", inv_freq)
    distances = as_float64("distances", distances, inv_freq.device)
    if distances.ndim != 1:
        raise ValueError(f"distances must have shape (N,), got {tuple(distances.shape)}")
    phases = torch.polar(
        torch.ones((), dtype=torch.float64, device=inv_freq.device), distances[:, None] * inv_freq.double()
    )  # (N, P)
    partial_sums = phases.cumsum(-1)  # S_1 .. S_P: S_j sums the first j phases
    return partial_sums.abs().mean(-1)


def _as_complex_pairs(x: torch.Tensor, layout: str) -> torch.Tensor:
    planes = pair_indices(x.shape[-1], layout, device=x.device)
    x = x.double()
    return torch.complex(x[..., planes[:, 0]], x[..., planes[:, 1]])


def pair_logit_contributions(
    q: torch.Tensor, k: torch.Tensor, distances, inv_freq: torch.Tensor, layout: str = "half"
) -> torch.Tensor:
    """Each pair's share of the RoPE logit ``<R(m) q, R(n) k>`` for ``m - n = distance``: ``(..., N, P)`` float64.

    ``q``, ``k``: ``(..., D)`` with ``D = 2 P`` (broadcast together); ``distances``: ``(N,)``; ``inv_freq``:
    ``(P,)``. Summing over the last axis gives the logit (before the ``1 / sqrt(D)`` scale).
    """
    require_tensor("q", q)
    require_tensor("k", k)
    inv_freq = check_inv_freq("inv_freq", inv_freq)
    if q.shape[-1] != k.shape[-1] or q.shape[-1] != 2 * inv_freq.shape[-1]:
        raise ValueError(
            f"q and k must have last axis D = 2 * len(inv_freq) = {2 * inv_freq.shape[-1]}, "
            f"got {q.shape[-1]} and {k.shape[-1]}"
        )
    distances = as_float64("distances", distances, q.device)
    if distances.ndim != 1:
        raise ValueError(f"distances must have shape (N,), got {tuple(distances.shape)}")
    product = _as_complex_pairs(q, layout) * _as_complex_pairs(k, layout).conj()  # (..., P)
    turn = torch.polar(
        torch.ones((), dtype=torch.float64, device=q.device), distances[:, None] * inv_freq.to(q.device).double()
    )  # (N, P)
    return (product[..., None, :] * turn).real


def wrapped_angle_error(angles: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``|angles - reference|`` measured around the circle, in ``[0, pi]``, float64 (shapes broadcast).

    Computed without cancellation: ``fmod`` of the absolute difference by ``2 pi`` is exact, and ``2 pi - r`` is
    exact for ``r >= pi`` (Sterbenz), so a small error keeps all its digits (shifting by ``pi`` and back, the
    usual formula, would round every error below ``4e-16`` to 0 and keep no relative accuracy for small ones).
    The only rounding left is that of ``2 pi`` itself, ``2.4e-16`` per full turn in the difference.
    """
    require_tensor("angles", angles)
    require_tensor("reference", reference)
    turn = 2 * math.pi
    remainder = torch.fmod((angles.double() - reference.double()).abs(), turn)  # in [0, 2 pi), exact
    return torch.minimum(remainder, turn - remainder)


def max_offset_spread(scores: torch.Tensor, q_positions, k_positions) -> float:
    """How far ``scores`` are from relative: the largest ``max - min`` among scores that share one offset.

    ``scores``: ``(Lq, Lk)``; positions ``(Lq,)``/``(Lk,)`` or ``(Lq, n_axes)``/``(Lk, n_axes)``. A score that is a
    function of ``q_position - k_position`` alone gives 0 (up to round-off). Offsets are grouped by exact
    equality of their float64 values, so positions should be integers (or values whose differences are exact,
    such as multiples of a power of two); ``0.3 - 0.1`` and ``0.4 - 0.2`` would count as two offsets.
    """
    require_tensor("scores", scores)
    q_positions = as_float64("q_positions", q_positions, scores.device)
    k_positions = as_float64("k_positions", k_positions, scores.device)
    q_positions = q_positions[:, None] if q_positions.ndim == 1 else q_positions
    k_positions = k_positions[:, None] if k_positions.ndim == 1 else k_positions
    if scores.shape != (q_positions.shape[0], k_positions.shape[0]) or q_positions.shape[1] != k_positions.shape[1]:
        raise ValueError(
            f"scores must be (Lq, Lk) = ({q_positions.shape[0]}, {k_positions.shape[0]}) and the "
            f"positions must have the same number of axes, got {tuple(scores.shape)}, "
            f"{tuple(q_positions.shape)}, {tuple(k_positions.shape)}"
        )
    offsets = (q_positions[:, None, :] - k_positions[None, :, :]).reshape(-1, q_positions.shape[1])
    # one integer label per distinct offset row, axis by axis (1-D uniques are much faster than unique(dim=0))
    _, group = torch.unique(offsets[:, 0], return_inverse=True)
    for axis in range(1, offsets.shape[1]):
        _, labels = torch.unique(offsets[:, axis], return_inverse=True)
        _, group = torch.unique(group * (int(labels.max()) + 1) + labels, return_inverse=True)
    values = scores.reshape(-1).double()
    n_groups = int(group.max()) + 1
    highest = torch.full((n_groups,), -math.inf, dtype=torch.float64, device=scores.device)
    lowest = torch.full((n_groups,), math.inf, dtype=torch.float64, device=scores.device)
    highest = highest.scatter_reduce(0, group, values, reduce="amax")
    lowest = lowest.scatter_reduce(0, group, values, reduce="amin")
    return float((highest - lowest).max())


EULER_GAMMA = 0.5772156649015329


def cosine_integral(x) -> torch.Tensor:
    """The cosine integral ``Ci(x) = gamma + ln x + int_0^x (cos t - 1) / t dt`` for ``x > 0``, elementwise.

    Chapter 4's smooth part of the sinusoidal kernel, ``K(Delta) / K(0) ~ -Ci(omega_min Delta) / ln b``, and
    chapter 6's RoPE lobe use it. ``x``: a number or a tensor of any shape; returns float64 of the same shape, in
    memory proportional to ``x``'s. Up to 4 the power series ``gamma + ln x + sum_k (-x^2)^k / (2k (2k)!)`` (its
    largest term is 4 in size, at x = 4, against a sum of about -2, so little is cancelled); beyond,
    ``Ci(x) = -Re E1(i x)`` with ``E1``'s continued fraction (Numerical Recipes' ``cisi``). Against
    ``scipy.special.sici`` the error stays below 1e-13 on ``1e-3 .. 1e6``.
    """
    if isinstance(x, bool) or not isinstance(x, (int, float, torch.Tensor)):
        raise TypeError(f"x must be a positive number or a tensor of them, got {type(x).__name__}")
    x = as_float64("x", x if isinstance(x, torch.Tensor) else torch.tensor(float(x), dtype=torch.float64))
    if x.numel() and not bool((x > 0).all()):
        raise ValueError("x must be positive: Ci has a logarithmic singularity at 0 and is complex below")
    small = x <= 4
    result = torch.empty_like(x)
    near = x[small]
    square, term, total = near.square(), torch.ones_like(near), torch.zeros_like(near)
    for k in range(1, 31):  # the 30th term is below 1e-45 at x = 4
        term = -term * square / ((2 * k - 1) * (2 * k))  # (-x^2)^k / (2k)!
        total = total + term / (2 * k)
    result[small] = EULER_GAMMA + near.log() + total
    far = x[~small]
    b = torch.complex(torch.ones_like(far), far)  # modified Lentz's method for E1(i x), x > 4
    c = torch.full_like(b, 1e300)
    d = 1 / b
    h = d.clone()  # d is updated in place below
    active = torch.arange(far.numel(), device=x.device)  # elements whose fraction has not converged yet
    for i in range(2, 200):
        a = -float((i - 1) ** 2)
        b_a = b[active] + 2
        d_a = 1 / (a * d[active] + b_a)
        c_a = b_a + a / c[active]
        step = c_a * d_a
        b[active], d[active], c[active] = b_a, d_a, c_a
        h[active] = h[active] * step
        active = active[(step - 1).abs() >= 1e-16]
        if active.numel() == 0:
            break
    result[~small] = -(torch.complex(far.cos(), -far.sin()) * h).real
    return result


__all__ = [
    "relative_upper_bound",
    "pair_logit_contributions",
    "wrapped_angle_error",
    "max_offset_spread",
    "cosine_integral",
]
