"""The classification of one-parameter group encodings ``exp(tX)``: the real Jordan form of a generator, read
numerically.

:func:`classify_generator` recognises the family of any real generator ``X`` from its real Jordan form. The
generators of every family are built in :mod:`posenc.generators`, the maps and the attention plug-ins are in
:mod:`posenc.group_encodings`. Convention: ``F(t) = exp(tX)`` for queries, ``G(s) = F(s)^{-T}`` for keys, logit
``q^T exp((t - s) X^T) k``.

================================  ======================================  ====================================
block of ``X`` (Jordan size k)    ``exp(tX)`` on the block                family
================================  ======================================  ====================================
eigenvalue 0, k = 1               1                                       ``none`` (NoPE)
real ``u < 0``, k = 1             ``e^{ut}``                              ``decay``
real ``u > 0``, any k             ``e^{ut}`` (times a polynomial)         ``growth`` (rejected: unbounded)
pair ``+-iw``, k = 1              rotation ``R(wt)``                      ``rotation`` (RoPE)
pair ``u +- iw, u < 0``, k = 1    ``e^{ut} R(wt)``                        ``damped rotation`` (xPos, RetNet)
pair ``u +- iw, u > 0``, any k    ``e^{ut} R(wt)`` (times a polynomial)   ``growth``
real ``u <= 0``, k >= 2           ``e^{ut}`` x polynomial, degree k-1     ``real jordan`` (ALiBi: u = 0, k = 2)
pair ``u +- iw, u <= 0``, k >= 2  ``e^{ut} R(wt)`` x polynomial           ``jordan`` (the exotic class)
================================  ======================================  ====================================

``real jordan`` with ``u = 0`` is unipotent (``exp(tX) = I + tN + ...``); ``jordan`` (complex Jordan blocks) is
the class the Jane Street post calls exotic. The family name ``jordan`` is kept for the complex blocks only.

Tolerance (``tol``, relative; default :func:`default_tolerance`: ``1e-11`` for float64 generators, ``1.2e-5`` for
float32). Everything is computed in float64 (complex128), on the generator's device. Eigenvalues come from
``torch.linalg.eigvals``. Round-off splits a Jordan block of size ``k`` into ``k`` eigenvalues about
``eps^(1/k)`` apart, so eigenvalue distances alone cannot find blocks; instead

1. candidate clusters: eigenvalues ``i, j`` are linked when ``|l_i - l_j|`` is below the round-off uncertainty of
   either, ``LINK_SAFETY * eps * ||X|| * kappa`` (``kappa``: the eigenvalue's condition number, huge for the split
   members of a Jordan block), but at least ``tol ||X||`` and at most a cap that starts at ``0.1 ||X||`` and
   shrinks tenfold whenever a cluster fails step 2;
2. a cluster of ``m`` eigenvalues with mean ``mu`` (the mean of a split cluster is accurate to round-off even when
   its members are not) is accepted as one eigenvalue when the nullities ``n_j`` of ``(X - mu I)^j``,
   ``j = 1..m``, read off the singular values below ``tol * sigma_max(X - mu I)^j``, form a valid Jordan
   structure ending at ``n_m = m``; the number of blocks of size ``>= j`` is ``n_j - n_{j-1}``;
3. a real or imaginary part below ``tol * ||X||`` counts as zero.

A normal generator (``X X^T = X^T X`` within ``tol``; RoPE, xPos, RetNet, decay in their natural basis) is
diagonalisable, so every block has size 1 and step 2 is skipped. Since the commutator is quadratic in a Jordan
coupling ``e``, normality is confirmed by the departure from normality (the strict upper part of a Schur form), which
is linear in ``e`` and must lie below ``tol * ||X||``, the ranks' resolution; otherwise the generator takes the
general path. Its eigenvalues are perfectly conditioned, so with
the default ``tol`` the resolution for "equal" and "zero" is the round-off bound of the generator's own entries and
of the eigensolver, ``NORMAL_SAFETY * (eps * ||X||_F + D * eps_64 * ||X||_2)``, when that is smaller than
``tol * ||X||``: in float32 this keeps xPos's slowest
damping at ``D = 256`` (``u = -1.1e-5``) from reading as a rotation and RoPE's slowest frequencies at ``D = 512``
(gaps ``3.7e-6``) from merging, both of which ``100 eps ||X||`` did. Pass ``tol`` to read small parts as zero on
purpose. The classification is invariant under a change
of basis and under rescaling time (``X -> cX``, ``c > 0``). Limit: in a non-normal generator, two distinct
eigenvalues closer than about ``sqrt(tol) ||X||`` (more in an ill-conditioned basis) cannot be told apart from a
Jordan block, and in float32 the slowest frequencies of an ill-conditioned generator drown in round-off: with
``tol = 1.2e-5`` ranks resolve eigenvalues only about ``sqrt(tol) ||X|| = 3.5e-3 ||X||`` apart, so
``jordan_generator(16)`` in float32 (copies at frequencies 1, 0.1, 0.01, 0.001) reports its slowest copy as rotations,
while its float64 version classifies correctly; cast such generators to float64 first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import check_generator

#: Eigenvalues ``i, j`` are candidates for one (Jordan-split) eigenvalue when ``|l_i - l_j| <= LINK_SAFETY * eps *
#: ||X|| * max(kappa_i, kappa_j)``: one lies within the round-off uncertainty of the other (``eps`` of the generator's
#: dtype, ``kappa`` the eigenvalue condition numbers; a simple eigenvalue moves by about ``kappa ||E||`` under a
#: perturbation ``E``, and the members of a split Jordan block have huge ``kappa``).
LINK_SAFETY = 1e3

#: For a normal generator and the default ``tol``, eigenvalues closer than
#: ``NORMAL_SAFETY * (eps * ||X||_F + D * eps_64 * ||X||_2)`` are one eigenvalue, and real or imaginary parts
#: below it are zero (``eps`` of the generator's dtype; see :func:`classify_generator`). An explicit ``tol``
#: replaces it by ``tol * ||X||_2``.
NORMAL_SAFETY = 4.0

#: Family -> (what exp(tX) does on the block, encodings of that family).
FAMILIES = {
    "none": ("constant 1", "NoPE"),
    "decay": ("e^{ut}, u < 0", "exponential decay (causal only)"),
    "growth": ("e^{ut} (R(wt)), u > 0: unbounded", "rejected as unstable"),
    "rotation": ("R(wt)", "RoPE"),
    "damped rotation": ("e^{ut} R(wt), u < 0", "xPos, RetNet"),
    "real jordan": ("e^{ut} x polynomial of degree k-1 in t, u <= 0 real (u = 0: unipotent)", "ALiBi (u = 0, k = 2)"),
    "jordan": ("e^{ut} R(wt) x polynomial of degree k-1 in t, u <= 0, w > 0", "exotic (complex Jordan blocks)"),
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
    """The family of a Jordan block of Jordan size ``size`` whose (already rounded) eigenvalue is ``u + iw``.

    ``u > 0`` is ``growth`` whatever the size (exponential growth beats any polynomial); a block of size ``>= 2``
    is ``real jordan`` for a real eigenvalue (``w = 0``; ALiBi's unipotent block) and ``jordan`` for a complex pair
    (the exotic class).
    """
    if eigenvalue.real > 0:
        return "growth"
    if size > 1:
        return "jordan" if eigenvalue.imag else "real jordan"
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
    return {
        size: at_least[size - 1] - at_least[size]
        for size in range(1, len(nullities))
        if at_least[size - 1] - at_least[size]
    }


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


def _eigenvalues_and_departure(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Eigenvalues ``(D,)`` of ``x`` and its departure from normality ``||N||_F``, ``N`` the strict upper part of a
    Schur form ``Q^H X Q = diag(lambda) + N``: 0 for a normal matrix, its round-off for a rounded one, and of the
    order of ``e`` for a Jordan coupling ``e`` (linear in ``e``, unlike ``||[X, X^H]|| ~ e^2``).

    The Schur basis is the QR factor of the eigenvectors ``V = Q R`` (then ``Q^H X Q = R diag(lambda) R^{-1}``); an
    eigenvector basis that is (nearly) singular, as for an exact Jordan block, counts as ``inf``.
    """
    values, vectors = torch.linalg.eig(x)
    _, r = torch.linalg.qr(vectors / torch.linalg.vector_norm(vectors, dim=0))
    if r.diagonal().abs().min().item() <= 1e-6:  # eigenvectors (nearly) dependent: not diagonalisable in practice
        return values, float("inf")
    schur = torch.linalg.solve_triangular(r, r * values[None, :], upper=True, left=False)
    return values, torch.linalg.matrix_norm(schur - torch.diag_embed(schur.diagonal())).item()


def _real_blocks(
    found: list[tuple[complex, dict[int, int]]], resolution: float, dim: int, tol: float
) -> list[JordanBlock]:
    """The blocks of the real Jordan form from eigenvalues ``mu`` with their Jordan sizes: parts within
    ``resolution`` of zero set to zero, conjugate pairs reported once (``w > 0``), equal eigenvalues merged; sorted
    by family. ValueError if they do not cover all ``dim`` dimensions."""
    counts: dict[tuple[complex, int], int] = {}
    for mu, sizes in found:
        mu = complex(0.0 if abs(mu.real) <= resolution else mu.real, 0.0 if abs(mu.imag) <= resolution else mu.imag)
        if mu.imag < 0:
            continue  # the conjugate partner is reported once, with w > 0
        for size, count in sizes.items():
            key = next((k for k in counts if k[1] == size and abs(k[0] - mu) <= resolution), (mu, size))
            counts[key] = counts.get(key, 0) + count
    blocks = [JordanBlock(family_of(mu, size), mu, size, count) for (mu, size), count in counts.items()]
    covered = sum(block.real_size * block.multiplicity for block in blocks)
    if covered != dim:
        raise ValueError(
            f"the blocks found cover {covered} of {dim} dimensions: the generator is too close to a "
            f"boundary between Jordan structures for tol={tol:g}; try another tol"
        )
    order = list(FAMILIES)
    return sorted(blocks, key=lambda b: (order.index(b.family), b.size, b.eigenvalue.imag, b.eigenvalue.real))


def classify_generator(generator: torch.Tensor, tol: float | None = None) -> list[JordanBlock]:
    """The real Jordan form of ``generator`` ``(D, D)`` as a list of :class:`JordanBlock`, one per family entry.

    Each block has a family (see :data:`FAMILIES`), an eigenvalue (``u + iw`` with ``w >= 0``), a Jordan size and
    a multiplicity; ``sum(block.real_size * block.multiplicity) == D``. ``tol``: see the module docstring.
    """
    generator = check_generator("generator", generator)
    default = tol is None
    tol = default_tolerance(generator.dtype) if tol is None else float(tol)
    if not 0 < tol < 1:
        raise ValueError(f"tol must lie in (0, 1), got {tol}")
    x = generator.to(torch.complex128)
    dim, scale = x.shape[0], torch.linalg.matrix_norm(x, ord=2).item()
    if scale == 0.0:
        return [JordanBlock("none", 0j, 1, dim)]
    found: list[tuple[complex, dict[int, int]]] = []
    normal = torch.linalg.matrix_norm(x @ x.mH - x.mH @ x).item() <= tol * scale**2
    resolution = tol * scale  # below this, eigenvalues are equal and real or imaginary parts are zero
    if normal and default:
        # a normal matrix has perfectly conditioned eigenvalues: rounding its entries to the dtype (|E_ij| <=
        # eps/2 |X_ij|) moves each by at most ||E||_2 <= eps/2 ||X||_F (Bauer-Fike with kappa = 1). NORMAL_SAFETY
        # covers generators computed in that dtype too (e.g. Q B Q^T in float32 moves real parts by ~0.1 eps ||X||_F)
        # while keeping, in float32, xPos's slowest damping at D = 256 (1.1e-5) and RoPE's frequency gaps at
        # D = 512 (3.7e-6) apart from zero and from each other, which 100 eps ||X|| = 1.2e-5 ||X|| does not
        # plus the backward error of the float64 eigensolver itself, about dim * eps_64 * ||X||_2
        frobenius = torch.linalg.matrix_norm(x).item()
        rounding = torch.finfo(generator.dtype).eps * frobenius + dim * torch.finfo(torch.float64).eps * scale
        resolution = min(resolution, NORMAL_SAFETY * rounding)
    if normal:  # diagonalisable: only merge (numerically) equal eigenvalues
        # the commutator is quadratic in a Jordan coupling e (||[X, X^H]|| ~ e^2), so the test above lets couplings up
        # to sqrt(tol) ||X|| through, far above what the ranks resolve (e.g. ALiBi's block beside a rotation 1000 times
        # faster, in float32); the departure from normality is linear in e and is held to the ranks' resolution
        values, departure = _eigenvalues_and_departure(x)
        normal = departure <= tol * scale
        if normal:
            equal = torch.full((dim, dim), resolution, dtype=torch.float64, device=x.device)
            found.extend((complex(values[c].mean().item()), {1: len(c)}) for c in _link_clusters(values, equal))
        else:
            resolution = tol * scale  # not normal after all: the general resolution
    if not normal:
        values, kappa = _condition_numbers(x)
        # eigenvalues i, j may be one eigenvalue split by round-off when they are closer than their sensitivity
        # kappa beyond 1/eps only comes from exactly parallel eigenvectors: an exact, unsplit multiple eigenvalue
        exact = kappa >= 1 / torch.finfo(torch.float64).eps
        radius = torch.where(exact, 0.0, LINK_SAFETY * torch.finfo(generator.dtype).eps * scale * kappa)
        links = torch.maximum(radius[:, None], radius[None, :]).clamp(min=tol * scale)
        _resolve(x, values, links, list(range(dim)), 0.1 * scale, tol * scale, tol, found)
    return _real_blocks(found, resolution, dim, tol)


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
    lines.append(
        "bounded for t -> +inf: "
        + ("yes" if not unstable else "no (" + ", ".join(sorted({b.family for b in unstable})) + ")")
    )
    return "\n".join(lines)


__all__ = [
    "LINK_SAFETY",
    "NORMAL_SAFETY",
    "FAMILIES",
    "JordanBlock",
    "default_tolerance",
    "family_of",
    "classify_generator",
    "families",
    "summarize",
]
