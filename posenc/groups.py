"""The families of one-parameter group encodings ``exp(tX)``: a generator for each, and the classification of any.

Constructors build the generator of every family (RoPE, xPos, RetNet, decay, Jordan blocks, ALiBi's block);
:func:`classify_generator` recognises the family of any real generator from its real Jordan form. The maps and the
attention plug-ins (:class:`GroupEncoding`, :class:`MultiGroupEncoding`) live in :mod:`posenc.group_encodings` and
are re-exported here, so ``from posenc.groups import GroupEncoding, rope_generator`` works. Convention:
``F(t) = exp(tX)`` for queries, ``G(s) = F(s)^{-T}`` for keys, logit ``q^T exp((t - s) X^T) k``.

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

from ._checks import require_int, require_positive_number, require_tensor
from .group_encodings import (COMMUTING_TOL, GroupEncoding, MultiGroupEncoding, check_commuting, check_generator,
                              check_times, commutator, multi_parameter_group, one_parameter_group, relative_kernel)
from .rope import _check_layout
from .rope_frequencies import rope_frequencies

# generators of each family -------------------------------------------------------------------------------------
def _pair_indices(head_dim: int, layout: str, device):
    half = torch.arange(head_dim // 2, device=device)
    return (half, half + head_dim // 2) if layout == "half" else (2 * half, 2 * half + 1)


def _rope_inv_freq(head_dim: int, base: float, device) -> torch.Tensor:
    require_int("head_dim", head_dim, minimum=2, even=True)
    return rope_frequencies(head_dim, {"rope_theta": require_positive_number("base", base)}, device=device)[0]


def _rotation_generator(head_dim, frequencies, damping, layout, dtype, device):
    """Block generator: pair ``j`` gets ``[[damping_j, -frequency_j], [frequency_j, damping_j]]`` (in float64)."""
    _check_layout(layout)
    first, second = _pair_indices(head_dim, layout, device)
    generator = torch.zeros(head_dim, head_dim, dtype=torch.float64, device=device)
    frequencies = frequencies.to(device=device, dtype=torch.float64)
    damping = torch.as_tensor(damping, dtype=torch.float64).to(device).expand_as(frequencies)
    generator[first, second] = -frequencies
    generator[second, first] = frequencies
    generator[first, first] = damping
    generator[second, second] = damping
    return generator.to(dtype)


def rope_generator(head_dim: int, base: float = 10_000.0, layout: str = "half", inv_freq=None,
                   dtype=torch.float32, device=None) -> torch.Tensor:
    """RoPE as a generator: block skew-symmetric ``(D, D)``, pair ``j`` is ``theta_j [[0, -1], [1, 0]]``.

    ``exp(tX)`` equals :func:`posenc.rope_matrix` ``(t, inv_freq, layout)``. ``inv_freq`` ``(D/2,)`` overrides the
    default frequencies ``theta_j = base^(-2j/D)`` (any table of :mod:`posenc.rope_frequencies` fits).
    """
    if inv_freq is None:
        inv_freq = _rope_inv_freq(head_dim, base, device)
    elif not isinstance(inv_freq, torch.Tensor) or inv_freq.shape != (require_int("head_dim", head_dim) // 2,):
        raise ValueError(f"inv_freq must be a tensor of shape ({head_dim // 2},), got {inv_freq!r}")
    return _rotation_generator(head_dim, inv_freq, 0.0, layout, dtype, device)


def xpos_scales(head_dim: int) -> torch.Tensor:
    """xPos's per-pair ``zeta_j = (2j + 0.4 D) / (1.4 D)``, ``j = 0 .. D/2 - 1``: shape ``(D/2,)``, float64."""
    require_int("head_dim", head_dim, minimum=2, even=True)
    pairs = torch.arange(head_dim // 2, dtype=torch.float64)
    return (2 * pairs + 0.4 * head_dim) / (1.4 * head_dim)


def xpos_generator(head_dim: int, base: float = 10_000.0, scale_base: float = 512, layout: str = "half",
                   dtype=torch.float32, device=None) -> torch.Tensor:
    """xPos as a damped rotation: pair ``j`` has eigenvalues ``ln(zeta_j) / B +- i theta_j`` (``B = scale_base``).

    ``F(n) = exp(nX)`` is RoPE at ``n`` times ``zeta_j^(n/B)`` (the xPos query) and ``G(m) = F(m)^{-T}`` is RoPE at
    ``m`` times ``zeta_j^(-m/B)`` (the xPos key).
    """
    require_int("head_dim", head_dim, minimum=2, even=True)
    # ln(zeta_j) = log1p(-(D - 2j) / (1.4 D)): the last zeta_j lie close to 1, where log(zeta) would first round
    # zeta to float64 and then amplify that error by 1 / |ln zeta| (about 2e-14 relative at D = 64); log1p does not
    pairs = torch.arange(head_dim // 2, dtype=torch.float64)
    damping = torch.log1p(-(head_dim - 2 * pairs) / (1.4 * head_dim)) / require_positive_number("scale_base",
                                                                                                  scale_base)
    return _rotation_generator(head_dim, _rope_inv_freq(head_dim, base, device), damping, layout, dtype, device)


def _per_entry(name: str, value, count: int) -> torch.Tensor:
    """A number or a tensor ``(count,)`` as a finite float64 tensor ``(count,)``."""
    value = torch.as_tensor(value, dtype=torch.float64)
    if value.ndim > 1 or (value.ndim == 1 and value.shape[0] != count):
        raise ValueError(f"{name} must be a number or a tensor of shape ({count},), got shape {tuple(value.shape)}")
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} must be finite")
    return value.expand(count)


def retnet_decays(n_heads: int) -> torch.Tensor:
    """RetNet's per-head decay ``gamma_h = 1 - 2^(-5 - h)``, ``h = 0 .. H-1``: shape ``(H,)``, float64."""
    require_int("n_heads", n_heads, minimum=1)
    return 1 - 2.0 ** (-5 - torch.arange(n_heads, dtype=torch.float64))


def damped_rope_generator(head_dim: int, decay, base: float = 10_000.0, layout: str = "half",
                          dtype=torch.float32, device=None) -> torch.Tensor:
    """RetNet-style damped RoPE: pair ``j`` has eigenvalues ``ln(gamma) +- i theta_j``.

    ``decay``: ``gamma`` in ``(0, 1]``, a number or a tensor ``(D/2,)`` (one per pair). The logit of a query at
    ``n`` and a key at ``m`` is RoPE's times ``gamma^(n - m)``: RetNet's ``D_nm`` with ``Theta_n = e^{i n theta}``.
    For one generator per head, stack them: ``torch.stack([damped_rope_generator(D, g) for g in retnet_decays(H)])``.
    """
    require_int("head_dim", head_dim, minimum=2, even=True)
    gamma = _per_entry("decay", decay, head_dim // 2)
    if not bool(((gamma > 0) & (gamma <= 1)).all()):
        raise ValueError(f"decay must lie in (0, 1] (gamma^(n - m) damps the past), got {decay}")
    return _rotation_generator(head_dim, _rope_inv_freq(head_dim, base, device), torch.log(gamma), layout, dtype,
                               device)


def decay_generator(dim: int, rates, dtype=torch.float32, device=None) -> torch.Tensor:
    """Pure exponential decay ``X = -diag(rates)``: ``exp(tX) = diag(e^{-rate t})``.

    ``rates``: a number or a tensor ``(dim,)``. A rate of 0 is NoPE on that feature; a negative rate is growth
    (kept possible on purpose: the classification rejects it as unstable).
    """
    return torch.diag(-_per_entry("rates", rates, require_int("dim", dim, minimum=1))).to(device=device, dtype=dtype)


def copy_frequencies(copies: int, base: float = 10_000.0) -> torch.Tensor:
    """RoPE's geometric law over ``copies`` blocks, the default frequencies of :func:`jordan_generator`:
    ``b_c = base^(-c / copies)`` for ``c = 0 .. copies - 1``, ``(copies,)`` float64."""
    return require_positive_number("base", base) ** (-torch.arange(copies, dtype=torch.float64) / copies)


def jordan_generator(head_dim: int, eigenvalue=0.0, frequency=None, block: int = 2, base: float = 10_000.0,
                     dtype=torch.float32, device=None) -> torch.Tensor:
    """Copies of one Jordan block, so ``exp(tX)`` is ``e^{at}`` (times a rotation) times a polynomial in ``t``.

    With ``block >= 2`` and ``eigenvalue <= 0``, ``frequency = 0`` gives the family ``real jordan`` (unipotent for
    ``eigenvalue = 0``, ALiBi's kind) and a complex pair gives ``jordan``, the exotic class; ``block = 1`` gives
    decays or (damped) rotations.

    * ``frequency = 0``: a real Jordan block of size ``block`` for ``eigenvalue = a``; ``exp(tX)`` has entry
      ``(i, i + j) = e^{at} t^j / j!``. ``head_dim`` must be a multiple of ``block``.
    * ``frequency = b != 0``: a complex pair ``a +- ib`` with Jordan size ``block``: ``block`` 2x2 rotation blocks
      ``[[a, -b], [b, a]]`` on the diagonal and the 2x2 identity on the block super-diagonal, so for ``block = 2``
      ``exp(tX) = e^{at} [[R(bt), t R(bt)], [0, R(bt)]]``. ``head_dim`` must be a multiple of ``2 * block``.
    * ``frequency = None`` (default): complex pairs whose frequencies follow RoPE's geometric law over the copies,
      ``b_c = base^(-c / n_copies)``.

    ``eigenvalue`` and ``frequency`` are numbers or tensors with one entry per copy.
    """
    require_int("head_dim", head_dim, minimum=1)
    require_int("block", block, minimum=1)
    real = frequency is not None and not isinstance(frequency, torch.Tensor) and float(frequency) == 0.0
    width = block if real else 2 * block
    if head_dim % width:
        raise ValueError(f"head_dim must be a multiple of {width} (copies of a {width} x {width} block), "
                         f"got {head_dim}")
    copies = head_dim // width
    if frequency is None:
        frequency = copy_frequencies(copies, base)
    blocks = []
    for a, b in zip(_per_entry("eigenvalue", eigenvalue, copies).tolist(),
                    _per_entry("frequency", frequency, copies).tolist()):
        if real:
            diagonal, step = torch.tensor([[a]], dtype=torch.float64), torch.eye(1, dtype=torch.float64)
        else:
            diagonal, step = torch.tensor([[a, -b], [b, a]], dtype=torch.float64), torch.eye(2, dtype=torch.float64)
        shift = torch.diag(torch.ones(block - 1, dtype=torch.float64), 1)
        blocks.append(torch.kron(torch.eye(block, dtype=torch.float64), diagonal) + torch.kron(shift, step))
    return torch.block_diag(*blocks).to(device=device, dtype=dtype)


def alibi_generator(dtype=torch.float32, device=None) -> torch.Tensor:
    """ALiBi's unipotent block ``N = [[0, 1], [0, 0]]``: ``exp(tN) = [[1, t], [0, 1]]``."""
    return torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=dtype, device=device)


def alibi_vectors(slopes: torch.Tensor):
    """The constant 2-D query and keys that turn :func:`alibi_generator` into ALiBi: ``(q_bar (2,), k_bar (H, 2))``.

    ``q_bar = (0, 1)`` and ``k_bar_h = (-m_h, 0)`` give ``q_bar^T F(t)^T G(s) k_bar_h = -m_h (t - s)``, the causal
    ALiBi bias (in the transposed convention of the Jane Street post, ``(1, 0)^T exp(aN) (0, -m) = -m a``).
    """
    require_tensor("slopes", slopes)
    if slopes.ndim != 1:
        raise ValueError(f"slopes must have shape (H,), got shape {tuple(slopes.shape)}")
    q_bar = torch.tensor([0.0, 1.0], dtype=slopes.dtype, device=slopes.device)
    k_bar = torch.stack((-slopes, torch.zeros_like(slopes)), dim=-1)
    return q_bar, k_bar


# commuting skew generators: one maximal torus ---------------------------------------------------------------------
#: Relative tolerance of :func:`common_torus`: a generator counts as skew-symmetric when ``||X + X^T|| <= tol ||X||``
#: and the common basis is accepted when every ``Q^T X_i Q`` is block diagonal to ``tol ||X_i||``. The planes come from
#: the eigenvectors of ``-Z^2`` for a random combination ``Z``; their round-off is about ``eps ||Z||^2 / gap`` (gap:
#: the smallest distance between distinct ``w_j^2``), so 1e-8 accepts gaps down to about 1e-8 ||Z||^2 in float64.
TORUS_TOL = 1e-8


def common_torus(generators: torch.Tensor, tol: float = TORUS_TOL, seed: int = 0):
    """One orthogonal basis that block-diagonalises commuting skew-symmetric generators ``(n, D, D)``.

    Returns ``(basis (D, D), frequencies (n, P))``, float64, with ``P`` planes: ``X_i = Q B_i Q^T`` where ``B_i``
    has ``frequencies[i, j] * [[0, -1], [1, 0]]`` on the plane of columns ``2j, 2j + 1`` of ``Q`` and zeros on the
    remaining ``D - 2P`` columns (the common kernel). So ``exp(sum_i p_i X_i)`` turns plane ``j`` by the angle
    ``<w_j, p>`` with ``w_j = frequencies[:, j]``: a linear functional of ``p`` per plane (the maximal-torus theorem).

    Method: the planes of a generic combination ``Z = sum_i c_i X_i`` (random ``c``, ``seed``) are the 2-D
    eigenspaces of the symmetric ``-Z^2 = Z^T Z``; each is ``span(v, Z v / |Z v|)``. ``ValueError`` if a generator is
    not skew, the generators do not commute, or the result is not block diagonal within ``tol`` (two planes whose
    frequencies under ``Z`` nearly coincide; try another ``seed``).
    """
    require_tensor("generators", generators)
    if generators.ndim != 3 or generators.shape[-1] != generators.shape[-2]:
        raise ValueError(f"generators must have shape (n, D, D), got shape {tuple(generators.shape)}")
    x = torch.stack([check_generator(f"generators[{i}]", g) for i, g in enumerate(generators)]).to(torch.float64)
    norms = torch.linalg.matrix_norm(x)
    for i in range(x.shape[0]):
        if torch.linalg.matrix_norm(x[i] + x[i].T) > tol * norms[i]:
            raise ValueError(f"generators[{i}] must be skew-symmetric (X^T = -X within tol = {tol:g})")
    check_commuting(x)
    dim = x.shape[-1]
    c = torch.rand(x.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) + 0.5
    z = torch.einsum("n,nij->ij", c / norms.clamp(min=torch.finfo(torch.float64).tiny), x)
    squares, vectors = torch.linalg.eigh(z.T @ z)  # ascending w_j^2, each (ideally) twice
    scale = squares[-1].clamp(min=torch.finfo(torch.float64).tiny)
    columns, used = [], torch.zeros(dim, dtype=torch.bool)
    for index in range(dim - 1, -1, -1):  # largest first; a plane is (v, Z v / |Z v|)
        if used[index] or squares[index] <= tol * scale:
            continue
        v = vectors[:, index]
        w = z @ v
        w = w / torch.linalg.vector_norm(w)
        # the partner eigenvector of the same w^2 is the one most aligned with w
        partner = (vectors.T @ w).abs().masked_fill(used, -1.0)
        partner[index] = -1.0
        used[index] = used[int(partner.argmax())] = True
        columns += [v, w]
    planes = len(columns) // 2
    kernel = vectors[:, squares <= tol * scale]
    if planes and kernel.shape[1]:  # keep the kernel orthogonal to the planes (it is, up to round-off)
        plane_basis = torch.stack(columns, dim=1)
        kernel = kernel - plane_basis @ (plane_basis.T @ kernel)
        kernel, _ = torch.linalg.qr(kernel)
    basis = torch.cat(([torch.stack(columns, dim=1)] if columns else []) + [kernel], dim=1)
    if basis.shape[1] != dim:
        raise ValueError(f"could not split R^{dim} into planes and a kernel (found {basis.shape[1]} directions); "
                         "try another seed")
    blocks = basis.T @ x @ basis
    first, second = torch.arange(0, 2 * planes, 2), torch.arange(1, 2 * planes, 2)
    frequencies = (blocks[:, second, first] - blocks[:, first, second]) / 2
    rebuilt = torch.zeros_like(blocks)
    rebuilt[:, second, first], rebuilt[:, first, second] = frequencies, -frequencies
    residual = torch.linalg.matrix_norm(blocks - rebuilt)
    if bool((residual > tol * norms.clamp(min=torch.finfo(torch.float64).tiny)).any()):
        raise ValueError(f"no common block-diagonal basis within tol = {tol:g} (residual "
                         f"{(residual / norms).max().item():.1e}): two planes are too close under the random "
                         "combination; try another seed")
    return basis, frequencies


# classification -------------------------------------------------------------------------------------------------
#: Eigenvalues ``i, j`` are candidates for one (Jordan-split) eigenvalue when ``|l_i - l_j| <= LINK_SAFETY * eps *
#: ||X|| * max(kappa_i, kappa_j)``: one lies within the round-off uncertainty of the other (``eps`` of the generator's
#: dtype, ``kappa`` the eigenvalue condition numbers; a simple eigenvalue moves by about ``kappa ||E||`` under a
#: perturbation ``E``, and the members of a split Jordan block have huge ``kappa``).
LINK_SAFETY = 1e3

#: For a normal generator and the default ``tol``, eigenvalues closer than
#: ``NORMAL_SAFETY * (eps * ||X||_F + D * eps_64 * ||X||_2)`` are one eigenvalue, and real or imaginary parts below it are zero (``eps`` of the generator's dtype; see
#: :func:`classify_generator`). An explicit ``tol`` replaces it by ``tol * ||X||_2``.
NORMAL_SAFETY = 4.0

#: Family -> (what exp(tX) does on the block, encodings of that family).
FAMILIES = {
    "none": ("constant 1", "NoPE"),
    "decay": ("e^{ut}, u < 0", "exponential decay (causal only)"),
    "growth": ("e^{ut} (R(wt)), u > 0: unbounded", "rejected as unstable"),
    "rotation": ("R(wt)", "RoPE"),
    "damped rotation": ("e^{ut} R(wt), u < 0", "xPos, RetNet"),
    "real jordan": ("e^{ut} x polynomial of degree k-1 in t, u <= 0 real (u = 0: unipotent)",
                    "ALiBi (u = 0, k = 2)"),
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


def classify_generator(generator: torch.Tensor, tol: float | None = None) -> list[JordanBlock]:
    """The real Jordan form of ``generator`` ``(D, D)`` as a list of :class:`JordanBlock`, one per family entry.

    Each block has a family (see :data:`FAMILIES`), an eigenvalue (``u + iw`` with ``w >= 0``), a Jordan size and
    a multiplicity; ``sum(block.real_size * block.multiplicity) == D``. ``tol``: see the module docstring.
    """
    generator = check_generator("generator", generator)
    default = tol is None
    tol = default_tolerance(generator.dtype) if default else float(tol)
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
    "FAMILIES", "NORMAL_SAFETY", "TORUS_TOL", "JordanBlock", "default_tolerance", "family_of", "classify_generator", "families", "summarize",
    "COMMUTING_TOL", "GroupEncoding", "MultiGroupEncoding", "alibi_generator", "alibi_vectors", "check_commuting",
    "check_generator", "check_times", "common_torus", "commutator", "damped_rope_generator", "decay_generator", "jordan_generator",
    "multi_parameter_group", "one_parameter_group", "relative_kernel", "retnet_decays", "rope_generator",
    "xpos_generator", "xpos_scales",
]
