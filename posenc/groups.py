"""Positional encodings as one-parameter groups ``exp(tX)``, and the classification of their generators.

The maps, the generator of every family and the attention plug-ins live in :mod:`posenc.group_encodings` and are
re-exported here, so ``from posenc.groups import GroupEncoding, rope_generator`` works. This module adds the
classification of a generator by its real Jordan form (:func:`classify_generator`): each Jordan block of ``X``
is one family of encodings.

========================  ======================================  ==========================================
block of ``X``            ``exp(tX)`` on the block                family
========================  ======================================  ==========================================
eigenvalue 0              1                                       ``none`` (NoPE)
real ``u < 0``            ``e^{ut}``                              ``decay``
real ``u > 0``            ``e^{ut}``                              ``growth`` (rejected: unbounded)
pair ``+-i w``            rotation ``R(wt)``                      ``rotation`` (RoPE)
pair ``u +- i w, u < 0``  ``e^{ut} R(wt)``                        ``damped rotation`` (xPos, RetNet)
pair ``u +- i w, u > 0``  ``e^{ut} R(wt)``                        ``growth``
Jordan size ``k >= 2``    ``e^{ut}`` x polynomial of degree k-1   ``jordan`` (exotic; ALiBi is ``u = 0, k = 2``)
========================  ======================================  ==========================================

Tolerance (``tol``, relative; default :func:`default_tolerance`: ``1e-11`` for float64 generators, ``1.2e-5`` for
float32). Everything is computed in float64 (complex128), on the generator's device. Eigenvalues come from
``torch.linalg.eigvals``. Round-off splits a Jordan block of size ``k`` into ``k`` eigenvalues about
``eps^(1/k)`` apart, so eigenvalue distances alone cannot find blocks; instead

1. candidate clusters are eigenvalues linked by distances below a radius (first ``0.1 ||X||``, shrunk tenfold
   whenever a cluster fails step 2, down to ``tol ||X||``);
2. a cluster of ``m`` eigenvalues with mean ``mu`` (the mean of a split cluster is accurate to round-off even when
   its members are not) is accepted as one eigenvalue when the nullities ``n_j`` of ``(X - mu I)^j``,
   ``j = 1..m``, read off the singular values below ``tol * sigma_max(X - mu I)^j``, form a valid Jordan
   structure ending at ``n_m = m``; the number of blocks of size ``>= j`` is ``n_j - n_{j-1}``;
3. a real or imaginary part below ``tol * ||X||`` counts as zero.

A normal generator (``X X^T = X^T X`` within ``tol``; RoPE, xPos, RetNet, decay in their natural basis) is
diagonalisable, so every block has size 1 and step 2 is skipped. The classification is invariant under a change
of basis and under rescaling time (``X -> cX``, ``c > 0``). Limit: two distinct eigenvalues closer than about
``sqrt(tol) ||X||`` in a non-normal generator cannot be told apart from a Jordan block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .group_encodings import (COMMUTING_TOL, GroupEncoding, MultiGroupEncoding, alibi_generator, alibi_vectors,
                              check_commuting, check_generator, check_times, commutator, damped_rope_generator,
                              decay_generator, jordan_generator, multi_parameter_group, one_parameter_group,
                              relative_kernel, retnet_decays, rope_generator, xpos_generator, xpos_scales)

#: Eigenvalues ``i, j`` are candidates for one (Jordan-split) eigenvalue when ``|l_i - l_j| <= LINK_SAFETY * eps *
#: ||X|| * max(kappa_i, kappa_j)``: one lies within the round-off uncertainty of the other (``eps`` of the generator's
#: dtype, ``kappa`` the eigenvalue condition numbers; a simple eigenvalue moves by about ``kappa ||E||`` under a
#: perturbation ``E``, and the members of a split Jordan block have huge ``kappa``).
LINK_SAFETY = 1e3

#: Family -> (what exp(tX) does on the block, encodings of that family).
FAMILIES = {
    "none": ("constant 1", "NoPE"),
    "decay": ("e^{ut}, u < 0", "exponential decay (causal only)"),
    "growth": ("e^{ut} (R(wt)), u > 0: unbounded", "rejected as unstable"),
    "rotation": ("R(wt)", "RoPE"),
    "damped rotation": ("e^{ut} R(wt), u < 0", "xPos, RetNet"),
    "jordan": ("e^{ut} (polynomial of degree k-1 in t)", "exotic; ALiBi (u = 0, k = 2)"),
}


@dataclass(frozen=True)
class JordanBlock:
    """``multiplicity`` real Jordan blocks of Jordan size ``size`` for ``eigenvalue`` (imaginary part >= 0).

    A complex eigenvalue stands for the pair ``u +- iw``: its real block is ``2 * size`` wide (:attr:`real_size`).
    """

    family: str
    eigenvalue: complex
    size: int
    multiplicity: int

    @property
    def real_size(self) -> int:
        return self.size * (2 if self.eigenvalue.imag else 1)

    @property
    def bounded(self) -> bool:
        """Whether ``exp(tX)`` stays bounded for ``t -> +infinity`` on this block."""
        return self.eigenvalue.real < 0 or (self.eigenvalue.real == 0 and self.size == 1)

    def __str__(self) -> str:
        value = f"{self.eigenvalue.real:.4g}" + (f" ± {self.eigenvalue.imag:.4g}i" if self.eigenvalue.imag else "")
        return f"{self.multiplicity} x {self.family} (eigenvalue {value}, Jordan size {self.size})"


def default_tolerance(dtype: torch.dtype) -> float:
    """``1e-11`` for float64 generators; ``100 eps`` for lower precision (``1.2e-5`` for float32), at most ``1e-2``."""
    return 1e-11 if dtype == torch.float64 else min(1e-2, 100 * torch.finfo(dtype).eps)


def family_of(eigenvalue: complex, size: int) -> str:
    """The family of a Jordan block whose (already rounded) eigenvalue is ``u + iw``."""
    if size > 1:
        return "jordan"
    if eigenvalue.real > 0:
        return "growth"
    if eigenvalue.imag:
        return "damped rotation" if eigenvalue.real < 0 else "rotation"
    return "decay" if eigenvalue.real < 0 else "none"


def _link_clusters(values: torch.Tensor, radius: torch.Tensor) -> list[list[int]]:
    """Single-linkage clusters of complex ``values``: ``i`` and ``j`` linked when ``|v_i - v_j| <= radius[i, j]``."""
    close = (values[:, None] - values[None, :]).abs() <= radius
    labels = torch.arange(len(values), device=values.device)
    while True:  # every value takes the smallest label among its links, until nothing changes
        new = torch.where(close, labels[None, :], len(values)).min(dim=1).values
        if torch.equal(new, labels):
            break
        labels = new
    clusters: dict[int, list[int]] = {}
    for index, label in enumerate(labels.tolist()):
        clusters.setdefault(label, []).append(index)
    return list(clusters.values())


def _condition_numbers(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues and their condition numbers ``kappa_i = 1 / |y_i^H x_i|`` (unit right/left eigenvectors).

    A perturbation ``E`` moves a simple eigenvalue by about ``kappa_i ||E||``: the split members of a Jordan block
    have huge ``kappa`` (their left and right eigenvectors are nearly orthogonal), distinct well-conditioned
    eigenvalues small ones. Each right eigenvector is paired with the left one of the nearest eigenvalue.
    """
    values, right = torch.linalg.eig(x)
    left_values, left = torch.linalg.eig(x.mH)  # eigenvalues conj(lambda), left eigenvectors of x
    partner = (values[:, None] - left_values.conj()[None, :]).abs().argmin(dim=1)
    right = right / torch.linalg.vector_norm(right, dim=0)
    left = left[:, partner] / torch.linalg.vector_norm(left[:, partner], dim=0)
    overlap = (left.conj() * right).sum(dim=0).abs()
    return values, 1.0 / overlap.clamp(min=torch.finfo(torch.float64).tiny)


def _nullities(x: torch.Tensor, mu: complex, m: int, tol: float) -> list[int]:
    """``[n_0 = 0, n_1, ..., n_m]`` with ``n_j`` = nullity of ``(X - mu I)^j`` (relative tolerance ``tol``).

    Stops early (returns the list so far) as soon as the sequence cannot end in a valid structure.
    """
    eye = torch.eye(x.shape[0], dtype=x.dtype, device=x.device)
    shifted = x - mu * eye
    norm = torch.linalg.matrix_norm(shifted, ord=2).item()
    if norm == 0.0:
        return [0] + [x.shape[0]] * m
    shifted = shifted / norm  # normalised, so the threshold for every power is simply tol

    def nullity(power):  # at most m: outside the cluster X - mu I is invertible
        return min(m, int((torch.linalg.svdvals(power) <= tol).sum()))

    if nullity(torch.linalg.matrix_power(shifted, m)) != m:
        return [0, 0]
    power, result = eye, [0]
    for _ in range(m):
        power = power @ shifted
        result.append(nullity(power))
        if result[-1] == m:
            break
    return result + [m] * (m + 1 - len(result))


def _valid_structure(nullities: list[int], m: int) -> bool:
    steps = [b - a for a, b in zip(nullities, nullities[1:])]
    return nullities[-1] == m and steps[0] >= 1 and all(a >= b >= 0 for a, b in zip(steps, steps[1:]))


def _block_sizes(nullities: list[int]) -> dict[int, int]:
    """Jordan size -> number of blocks, from ``n_j``: blocks of size >= j are ``n_j - n_{j-1}``."""
    at_least = [b - a for a, b in zip(nullities, nullities[1:])] + [0]
    return {size: at_least[size - 1] - at_least[size] for size in range(1, len(nullities))
            if at_least[size - 1] - at_least[size]}


def _resolve(x, values, links, indices, cap, floor, tol, found):
    """Split ``indices`` into eigenvalues with their Jordan blocks; append ``(mu, {size: count})`` to ``found``.

    ``links`` ``(D, D)``: the linking radius of each pair of eigenvalues, capped at ``cap``.
    """
    for cluster in _link_clusters(values[indices], links[indices][:, indices].clamp(max=cap)):
        members = [indices[i] for i in cluster]
        mu = complex(values[members].mean().item())
        if len(members) == 1:
            found.append((mu, {1: 1}))
            continue
        nullities = _nullities(x, mu, len(members), tol)
        if _valid_structure(nullities, len(members)):
            found.append((mu, _block_sizes(nullities)))
        elif cap / 10 >= floor:
            _resolve(x, values, links, members, cap / 10, floor, tol, found)
        else:  # no consistent cluster at any radius: simple eigenvalues
            found.extend((complex(values[i].item()), {1: 1}) for i in members)


def classify_generator(generator: torch.Tensor, tol: float | None = None) -> list[JordanBlock]:
    """The real Jordan form of ``generator`` ``(D, D)`` as a list of :class:`JordanBlock`, one per family entry.

    Each block has a family (see :data:`FAMILIES`), an eigenvalue (``u + iw`` with ``w >= 0``), a Jordan size and
    a multiplicity; ``sum(block.real_size * block.multiplicity) == D``. ``tol``: see the module docstring.
    """
    generator = check_generator("generator", generator)
    tol = default_tolerance(generator.dtype) if tol is None else float(tol)
    if not 0 < tol < 1:
        raise ValueError(f"tol must lie in (0, 1), got {tol}")
    x = generator.to(torch.complex128)
    dim, scale = x.shape[0], torch.linalg.matrix_norm(x, ord=2).item()
    if scale == 0.0:
        return [JordanBlock("none", 0j, 1, dim)]
    found: list[tuple[complex, dict[int, int]]] = []
    normal = torch.linalg.matrix_norm(x @ x.mH - x.mH @ x).item() <= tol * scale**2
    if normal:  # diagonalisable: only merge (numerically) equal eigenvalues
        values = torch.linalg.eigvals(x)
        equal = torch.full((dim, dim), tol * scale, dtype=torch.float64, device=x.device)
        for cluster in _link_clusters(values, equal):
            found.append((complex(values[cluster].mean().item()), {1: len(cluster)}))
    else:
        values, kappa = _condition_numbers(x)
        # eigenvalues i, j may be one eigenvalue split by round-off when they are closer than their sensitivity
        # kappa beyond 1/eps only comes from exactly parallel eigenvectors: an exact, unsplit multiple eigenvalue
        exact = kappa >= 1 / torch.finfo(torch.float64).eps
        radius = torch.where(exact, 0.0, LINK_SAFETY * torch.finfo(generator.dtype).eps * scale * kappa)
        links = torch.maximum(radius[:, None], radius[None, :]).clamp(min=tol * scale)
        _resolve(x, values, links, list(range(dim)), 0.1 * scale, tol * scale, tol, found)
    counts: dict[tuple[complex, int], int] = {}
    for mu, sizes in found:
        mu = complex(0.0 if abs(mu.real) <= tol * scale else mu.real, 0.0 if abs(mu.imag) <= tol * scale else mu.imag)
        if mu.imag < 0:
            continue  # the conjugate partner is reported once, with w > 0
        for size, count in sizes.items():
            key = next((k for k in counts if k[1] == size and abs(k[0] - mu) <= tol * scale), (mu, size))
            counts[key] = counts.get(key, 0) + count
    blocks = [JordanBlock(family_of(mu, size), mu, size, count) for (mu, size), count in counts.items()]
    covered = sum(block.real_size * block.multiplicity for block in blocks)
    if covered != dim:
        raise ValueError(f"the blocks found cover {covered} of {dim} dimensions: the generator is too close to a "
                         f"boundary between Jordan structures for tol={tol:g}; try another tol")
    order = list(FAMILIES)
    return sorted(blocks, key=lambda b: (order.index(b.family), b.size, b.eigenvalue.imag, b.eigenvalue.real))


def families(blocks: list[JordanBlock]) -> dict[str, int]:
    """Family -> number of real dimensions it covers."""
    result: dict[str, int] = {}
    for block in blocks:
        result[block.family] = result.get(block.family, 0) + block.real_size * block.multiplicity
    return result


def summarize(blocks: list[JordanBlock]) -> str:
    """A readable multi-line summary of :func:`classify_generator`'s blocks, with verdicts."""
    lines = [str(block) for block in blocks]
    dims = families(blocks)
    lines.append("families: " + ", ".join(f"{name} ({dims[name]} dims, {FAMILIES[name][1]})" for name in dims))
    unstable = [b for b in blocks if not b.bounded]
    lines.append("bounded for t -> +inf: " + ("yes" if not unstable else
                                              "no (" + ", ".join(sorted({b.family for b in unstable})) + ")"))
    return "\n".join(lines)


__all__ = [
    "FAMILIES", "JordanBlock", "default_tolerance", "family_of", "classify_generator", "families", "summarize",
    "COMMUTING_TOL", "GroupEncoding", "MultiGroupEncoding", "alibi_generator", "alibi_vectors", "check_commuting",
    "check_generator", "check_times", "commutator", "damped_rope_generator", "decay_generator", "jordan_generator",
    "multi_parameter_group", "one_parameter_group", "relative_kernel", "retnet_decays", "rope_generator",
    "xpos_generator", "xpos_scales",
]
