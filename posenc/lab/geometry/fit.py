"""How well one set of distances follows another: metric, offset-aware and non-metric stress, (partial)
correlation, the shift-invariant floor, non-negative least squares, and the RoPE family fitted at its best.

Part of :mod:`posenc.lab.geometry` (which re-exports every public name); float64 on the input's device.
"""

from __future__ import annotations

import torch

from ..._checks import require_int, require_tensor
from .distances import FLOAT, _distance_matrix, pairwise_distances


def _pair_vectors(encoding_distances, distances) -> tuple[torch.Tensor, torch.Tensor]:
    """The pair distances ``(delta_ij)_{i<j}`` and ``(D_ij)_{i<j}`` of two ``(n, n)`` distance matrices, ``(m,)``
    each."""
    target = _distance_matrix("distances", distances)
    fitted = _distance_matrix("encoding_distances", encoding_distances)
    if fitted.shape != target.shape:
        raise ValueError(
            f"encoding_distances and distances must have the same shape, got "
            f"{tuple(fitted.shape)} and {tuple(target.shape)}"
        )
    rows, cols = torch.triu_indices(len(target), len(target), 1, device=target.device)
    return fitted[rows, cols], target[rows, cols]


def stress_of_distances(encoding_distances: torch.Tensor, distances: torch.Tensor, return_scale: bool = False):
    """Metric ratio stress of distances ``delta`` ``(n, n)`` against a target ``D`` ``(n, n)``, with a fitted scale.

    ``stress = sqrt(sum_{i<j} (c delta_ij - D_ij)^2 / sum_{i<j} D_ij^2)`` where ``c = sum delta D / sum delta^2``
    is the least-squares scale (a scale but no offset; normalised by the target's sum of squares, over pairs
    ``i < j``). This is *not* Kruskal's stress-1, which is non-metric (:func:`nonmetric_stress`); the offset-aware
    version is :func:`affine_stress`. The result is invariant to rescaling either argument and equals
    ``sqrt(1 - rho^2)``, ``rho`` the cosine between the two vectors of pair distances (computed from the residuals,
    not from that difference); 0 means the same geometry up to scale, 1 means none at all (an encoding that gives
    every position the same point has ``c = 0`` and stress 1). Returns a 0-d float64 tensor, and ``c`` when asked.
    """
    fitted, target = _pair_vectors(encoding_distances, distances)
    target_norm = target.square().sum()
    if float(target_norm) == 0:
        raise ValueError("distances must not be all zero: stress is relative to the target's spread")
    fitted_norm = fitted.square().sum()
    scale = (fitted @ target) / fitted_norm if float(fitted_norm) > 0 else fitted_norm
    value = ((scale * fitted - target).square().sum() / target_norm).sqrt()
    return (value, scale) if return_scale else value


def stress(encoding: torch.Tensor, distances: torch.Tensor, return_scale: bool = False):
    """Stress of an encoding ``(n, d)`` (one vector per position) against target distances ``(n, n)``.

    The Euclidean distances between its rows go into :func:`stress_of_distances` (metric ratio stress; see there).
    """
    return stress_of_distances(pairwise_distances(encoding), distances, return_scale)


def distance_correlation(encoding_distances: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """Pearson correlation between the pair distances ``(delta_ij)_{i<j}`` and ``(D_ij)_{i<j}`` (two ``(n, n)``
    matrices): a 0-d float64 tensor in ``[-1, 1]``. Invariant to any affine map ``a + c delta`` with ``c > 0``.
    Undefined (``ValueError``) when either set of pair distances is constant."""
    fitted, target = _pair_vectors(encoding_distances, distances)
    fitted, target = fitted - fitted.mean(), target - target.mean()
    norms = fitted.norm() * target.norm()
    if float(norms) == 0:
        raise ValueError(
            "encoding_distances and distances must not have constant pair distances: the correlation is undefined"
        )
    return ((fitted @ target) / norms).clamp(-1.0, 1.0)


def partial_correlation(
    encoding_distances: torch.Tensor, distances: torch.Tensor, control: torch.Tensor
) -> torch.Tensor:
    """Partial correlation of the pair distances ``delta`` with ``D`` controlling for ``control``: the Pearson
    correlation of the residuals of ``(delta_ij)_{i<j}`` and ``(D_ij)_{i<j}`` after each is regressed on an
    intercept and the control's pair distances. Arguments are ``(n, n)`` distance matrices; ``control`` may also be
    a ``(k, n, n)`` stack (several controls at once). Returns a 0-d float64 tensor in ``[-1, 1]``; with one control it
    equals ``(r_dD - r_dC r_DC) / sqrt((1 - r_dC^2)(1 - r_DC^2))``.

    Use it to ask whether an encoding follows the part of a target that a null (a shuffled corpus) does not
    explain: correlations with two different targets are not comparable, this is. Undefined (``ValueError``) when
    either residual is zero (a distance set the control explains exactly)."""
    fitted, target = _pair_vectors(encoding_distances, distances)
    require_tensor("control", control)
    controls = control[None] if control.ndim == 2 else control
    if controls.ndim != 3 or controls.shape[0] == 0 or controls.shape[1:] != distances.shape:
        raise ValueError(
            f"control must be an (n, n) distance matrix like distances {tuple(distances.shape)} or a "
            f"(k, n, n) stack of them, got shape {tuple(control.shape)}"
        )
    rows, cols = torch.triu_indices(len(distances), len(distances), 1, device=target.device)
    columns = [_distance_matrix("control", one)[rows, cols] for one in controls]
    design = torch.stack([torch.ones_like(target), *columns], dim=1)  # (pairs, 1 + k)
    both = torch.stack([fitted, target], dim=1)  # (pairs, 2)
    residuals = both - design @ torch.linalg.lstsq(design, both).solution
    norms = residuals.norm(dim=0)
    if bool((norms <= 1e-12 * (both - both.mean(dim=0)).norm(dim=0)).any()):  # round-off of an exact fit
        raise ValueError(
            "the control explains encoding_distances or distances exactly: the partial correlation is undefined"
        )
    return ((residuals[:, 0] @ residuals[:, 1]) / (norms[0] * norms[1])).clamp(-1.0, 1.0)


def affine_stress(encoding_distances: torch.Tensor, distances: torch.Tensor, return_fit: bool = False):
    """Offset-aware (interval) stress: ``sqrt(min_{a, c >= 0} sum (a + c delta - D)^2 / sum (D - mean D)^2)``.

    Arguments are ``(n, n)`` distance matrices; sums run over pairs ``i < j``. The best line gives
    ``sqrt(1 - r^2)`` for a positive Pearson correlation ``r`` (:func:`distance_correlation`) and 1 when ``r <= 0``
    (``c`` is held at 0: a distance that falls as the target grows is no fit). Computed from the residuals, not
    from ``1 - r^2``. Returns a 0-d float64 tensor, and ``(a, c)`` when asked.
    """
    fitted, target = _pair_vectors(encoding_distances, distances)
    centred_target = target - target.mean()
    spread = centred_target.square().sum()
    if float(spread) == 0:
        raise ValueError(
            "distances must not have constant pair distances: affine stress is relative to their variation"
        )
    centred = fitted - fitted.mean()
    norm = centred.square().sum()
    scale = (centred @ centred_target) / norm if float(norm) > 0 else norm
    scale = scale.clamp_min(0.0)
    offset = target.mean() - scale * fitted.mean()
    value = ((offset + scale * fitted - target).square().sum() / spread).sqrt()
    return (value, (offset, scale)) if return_fit else value


def toeplitz_projection(distances: torch.Tensor) -> torch.Tensor:
    """The matrix closest to ``distances`` ``(n, n)`` among those that depend only on ``|i - j|``: ``(n, n)``.

    Each diagonal is replaced by its mean (least squares, diagonal kept at 0). Every shift-invariant encoding
    (sinusoidal, RoPE features, ALiBi) has distances of this form, so since that set is a linear space closed
    under scaling, ``stress_of_distances(toeplitz_projection(D), D)`` is a lower bound on the stress of any of them.
    """
    distances = _distance_matrix("distances", distances)
    positions = torch.arange(distances.shape[0], device=distances.device)
    offsets = (positions[:, None] - positions[None, :]).abs()
    sums = torch.zeros(distances.shape[0], dtype=FLOAT, device=distances.device).index_add_(
        0, offsets.reshape(-1), distances.reshape(-1)
    )
    means = sums / torch.bincount(offsets.reshape(-1), minlength=distances.shape[0])
    return means[offsets]


def isotonic_regression(values: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """The non-decreasing sequence closest to ``values`` ``(m,)`` in weighted least squares: ``(m,)``, float64.

    Pool-adjacent-violators algorithm (Ayer et al. 1955; Kruskal 1964): scan left to right, keep blocks with their
    weighted means, and merge the last two blocks while their means decrease. ``O(m)`` amortised. ``weights``
    ``(m,)`` must be positive (default 1). Each output value is the weighted mean of its block.
    """
    values = require_tensor("values", values)
    if values.ndim != 1 or not values.numel():
        raise ValueError(f"values must be a non-empty 1-D tensor, got shape {tuple(values.shape)}")
    values = values.to(FLOAT)
    if weights is None:
        weights = torch.ones_like(values)
    else:
        weights = require_tensor("weights", weights).to(FLOAT)
        if weights.shape != values.shape:
            raise ValueError(f"weights must have the shape of values {tuple(values.shape)}, got {tuple(weights.shape)}")
        if not bool((weights > 0).all()):
            raise ValueError("weights must be positive")
    if not bool(torch.isfinite(values).all() and torch.isfinite(weights).all()):
        raise ValueError("values and weights must be finite")
    means, totals, sizes = [], [], []
    for value, weight in zip(values.tolist(), weights.tolist()):
        means.append(value)
        totals.append(weight)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            weight = totals[-2] + totals[-1]
            means[-2] = (totals[-2] * means[-2] + totals[-1] * means[-1]) / weight
            totals[-2] = weight
            sizes[-2] += sizes[-1]
            del means[-1], totals[-1], sizes[-1]
    return torch.repeat_interleave(torch.tensor(means, dtype=FLOAT), torch.tensor(sizes)).to(values.device)


def nonnegative_least_squares(matrix: torch.Tensor, target: torch.Tensor, free: int = 0) -> torch.Tensor:
    """``x`` ``(n,)`` minimising ``||matrix @ x - target||`` with ``x[free:] >= 0`` and the first ``free`` entries
    unconstrained; ``matrix`` ``(m, n)``, ``target`` ``(m,)``; float64.

    The free columns are projected out first (QR), the rest is the active-set method of Lawson and Hanson (1974):
    move into the passive set the coordinate whose gradient most wants to grow, solve least squares on the passive
    set, and step back to the boundary while a passive coordinate would turn negative. The free entries are then
    least squares on what the bounded ones leave. It stops when no coordinate's gradient exceeds its round-off
    (or after ``3 (n - free)`` steps); a constraint that binds shows as an entry at exactly 0."""
    matrix, target = require_tensor("matrix", matrix), require_tensor("target", target)
    if matrix.ndim != 2 or target.shape != matrix.shape[:1]:
        raise ValueError(f"matrix must be (m, n) and target (m,), got {tuple(matrix.shape)} and {tuple(target.shape)}")
    require_int("free", free)
    if not 0 <= free <= matrix.shape[1]:
        raise ValueError(f"free must lie in 0..{matrix.shape[1]}, got {free}")
    matrix, target = matrix.to(FLOAT), target.to(FLOAT)
    if not bool(torch.isfinite(matrix).all() and torch.isfinite(target).all()):
        raise ValueError("matrix and target must be finite")
    unconstrained, bounded = matrix[:, :free], matrix[:, free:]
    a, b = bounded, target
    if free:
        basis = torch.linalg.qr(unconstrained).Q  # (m, free)
        a, b = a - basis @ (basis.T @ a), b - basis @ (basis.T @ b)
    k = a.shape[1]
    x = torch.zeros(k, dtype=FLOAT, device=matrix.device)
    passive = torch.zeros(k, dtype=torch.bool, device=matrix.device)
    tol = 10 * torch.finfo(FLOAT).eps * float(torch.linalg.matrix_norm(a) * b.norm())  # round-off of a.T @ residual
    for _ in range(3 * k):
        gradient = a.T @ (b - a @ x)  # minus half the gradient of the squared error
        wanted = ~passive & (gradient > tol)
        if not bool(wanted.any()):
            break
        passive[torch.where(wanted, gradient, -torch.inf).argmax()] = True
        while True:
            z = torch.zeros_like(x)
            q, r = torch.linalg.qr(a[:, passive])  # QR: no rank cut on ill-conditioned sets
            z[passive] = torch.linalg.solve_triangular(r, (q.T @ b)[:, None], upper=True)[:, 0]
            if bool((z[passive] > 0).all()):
                x = z
                break
            blocking = passive & (z <= 0)
            step = (x[blocking] / (x[blocking] - z[blocking])).min()
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0
    if not free:
        return x
    rest = torch.linalg.lstsq(unconstrained, (target - bounded @ x)[:, None]).solution[:, 0]
    return torch.cat((rest, x))


def nonmetric_stress(
    encoding_distances: torch.Tensor, distances: torch.Tensor, formula: int = 1, return_disparities: bool = False
):
    """Kruskal's non-metric stress of distances ``delta`` against the *order* of a target ``D`` (both ``(n, n)``).

    The disparities ``dhat`` are the isotonic regression of ``delta`` on the ranking of ``D`` (pairs ``i < j``
    sorted by ``D``; pairs with tied ``D`` get one common disparity, Kruskal's secondary approach). Stress-1
    (``formula=1``, Kruskal 1964) is ``sqrt(sum (delta - dhat)^2 / sum delta^2)``; stress-2 (``formula=2``) divides
    by ``sum (delta - mean delta)^2`` instead. Only the order of ``D`` matters, and ``delta`` may be rescaled.
    Stress-1 is 0 for equidistant points whatever ``D`` is (a constant is monotone in anything); stress-2 is
    undefined for them (``ValueError``). Returns a 0-d float64 tensor, and ``dhat`` ``(m,)`` (in the order of
    the pairs ``i < j``) when asked.
    """
    if formula not in (1, 2):
        raise ValueError(f"formula must be 1 (stress-1) or 2 (stress-2), got {formula!r}")
    fitted, target = _pair_vectors(encoding_distances, distances)
    order = torch.argsort(target, stable=True)
    _, tie_sizes = torch.unique_consecutive(target[order], return_counts=True)
    block = torch.repeat_interleave(torch.arange(len(tie_sizes), device=target.device), tie_sizes)
    block_means = (
        torch.zeros(len(tie_sizes), dtype=FLOAT, device=target.device).index_add_(0, block, fitted[order]) / tie_sizes
    )
    disparities = torch.empty_like(fitted)
    disparities[order] = isotonic_regression(block_means, tie_sizes.to(FLOAT))[block]
    if formula == 1:
        normaliser = fitted.square().sum()
    else:
        normaliser = (fitted - fitted.mean()).square().sum()
    if float(normaliser) == 0:
        raise ValueError(
            "encoding_distances must not be "
            + ("all zero" if formula == 1 else "constant (stress-2 is undefined for equidistant points)")
        )
    value = ((fitted - disparities).square().sum() / normaliser).sqrt()
    return (value, disparities) if return_disparities else value


def _pair_chords(n: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """``(n, n, P)``: ``2 - 2 cos((i - j) theta_p)``, the squared chord of pair ``p`` between positions ``i`` and ``j``,
    computed as ``4 sin^2((i - j) theta_p / 2)``, which does not cancel at small angles."""
    offsets = torch.arange(n, dtype=FLOAT, device=inv_freq.device)
    return 4 * torch.sin((offsets[:, None] - offsets[None, :])[..., None] * inv_freq.to(FLOAT) / 2).square()


def rope_family_distances(n: int, inv_freq: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Distances between ``phi(i) = R(i) u`` for positions ``0 .. n-1``, where ``u`` has squared amplitude
    ``weights[p]`` in rotation pair ``p`` (frequencies ``inv_freq`` ``(P,)``): ``(n, n)`` float64,
    ``||phi(i) - phi(j)||^2 = sum_p weights[p] (2 - 2 cos((i - j) theta_p))``. Equal weights give RoPE's vectors with
    every pair ``(1, 0)``; all weight on the slowest pair gives a chord that is linear in ``|i - j|`` while
    ``n theta_min`` is small (ALiBi's line)."""
    require_int("n", n, minimum=1)
    require_tensor("inv_freq", inv_freq)
    require_tensor("weights", weights)
    if inv_freq.ndim != 1 or weights.shape != inv_freq.shape:
        raise ValueError(
            f"inv_freq and weights must both have shape (P,), got {tuple(inv_freq.shape)} and {tuple(weights.shape)}"
        )
    if bool((weights < 0).any()):
        raise ValueError("weights must be >= 0 (they are squared amplitudes)")
    return (_pair_chords(n, inv_freq) @ weights.to(FLOAT)).clamp_min(0).sqrt()


ROPE_FIT_CRITERIA = ("pearson", "ratio")


def fit_rope_amplitudes(
    distances: torch.Tensor, inv_freq: torch.Tensor, criterion: str = "pearson", max_iter: int = 200
) -> torch.Tensor:
    """The member of the RoPE family (:func:`rope_family_distances`) that fits ``distances`` ``(n, n)`` best: the
    squared amplitudes ``(P,)`` (float64, summing to 1) that maximise the Pearson correlation
    (``criterion="pearson"``, so also minimise affine stress) or minimise ratio stress (``"ratio"``). In a model,
    ``W_q`` and ``W_k`` choose these amplitudes. L-BFGS from equal weights, softplus-parametrised; a local optimum,
    deterministic for a given input."""
    target = _distance_matrix("distances", distances)
    require_tensor("inv_freq", inv_freq)
    if criterion not in ROPE_FIT_CRITERIA:
        raise ValueError(f"criterion must be one of {ROPE_FIT_CRITERIA}, got {criterion!r}")
    require_int("max_iter", max_iter, minimum=1)
    rows, cols = torch.triu_indices(len(target), len(target), 1, device=target.device)
    chords = _pair_chords(len(target), inv_freq)[rows, cols]  # (pairs, P)
    wanted = target[rows, cols]
    raw = torch.zeros(inv_freq.shape[0], dtype=FLOAT, device=target.device, requires_grad=True)
    optimiser = torch.optim.LBFGS([raw], max_iter=max_iter, line_search_fn="strong_wolfe")

    def loss():
        optimiser.zero_grad()
        delta = (chords @ torch.nn.functional.softplus(raw) + 1e-300).sqrt()
        if criterion == "pearson":
            centred, target_centred = delta - delta.mean(), wanted - wanted.mean()
            value = -(centred @ target_centred) / (centred.norm() * target_centred.norm())
        else:  # ratio stress^2 = 1 - cosine^2 at the fitted scale
            value = -((delta @ wanted) / (delta.norm() * wanted.norm())).square()
        value.backward()
        return value

    optimiser.step(loss)
    weights = torch.nn.functional.softplus(raw.detach())
    return weights / weights.sum()
