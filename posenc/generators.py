"""The generators ``X`` of one-parameter group encodings ``exp(tX)``, one constructor per family, with their
frequency laws.

* rotations: :func:`plane_generator` (any feature planes), :func:`rope_generator` (RoPE, 1-D) and
  :func:`rope_generators` (one generator per axis of N-D RoPE, :mod:`posenc.nd_rope`);
* damped rotations: :func:`xpos_generator` (with :func:`xpos_scales`), :func:`damped_rope_generator` (RetNet, with
  :func:`retnet_decays`); decays: :func:`decay_generator`;
* Jordan blocks: :func:`jordan_generator` (with :func:`copy_frequencies`), ALiBi's :func:`alibi_generator` and
  :func:`alibi_vectors`;
* any relative bias on a finite window of offsets, as rotations: :func:`window_bias_generator`;
* commuting skew generators: :func:`common_torus`, the one basis that block-diagonalises them all.

Every constructor builds in float64 and returns ``dtype`` (default float32). Feature pairs follow
:func:`posenc.rope.pair_indices`, so ``exp(tX)`` of :func:`rope_generator` is :func:`posenc.rope.rope_matrix`
``(t)``. The maps ``exp(tX)`` and ``exp(sum_i p_i X_i)`` are :func:`posenc.group_encodings.one_parameter_group` and
:func:`~posenc.group_encodings.multi_parameter_group`; the family of any generator is
:func:`posenc.jordan.classify_generator`.
"""

from __future__ import annotations

import torch

from ._checks import (
    check_frequencies,
    check_generator,
    check_head_dim,
    check_inv_freq,
    inspectable,
    require_int,
    require_positive_number,
    require_tensor,
)
from .group_encodings import check_commuting
from .rope import pair_indices
from .rope_types import rope_frequencies


def plane_generator(head_dim: int, planes: torch.Tensor, speeds: torch.Tensor) -> torch.Tensor:
    """Skew-symmetric ``(D, D)`` float64 matrix turning feature plane ``planes[j] = (a, b)`` at ``speeds[j]``.

    ``exp(t G)`` maps ``(x_a, x_b)`` to ``(x_a cos - x_b sin, x_b cos + x_a sin)`` of the angle ``t speeds[j]``
    when the planes are disjoint; overlapping planes are allowed (their rotations then do not commute).
    """
    require_int("head_dim", head_dim, minimum=2)
    require_tensor("planes", planes)
    require_tensor("speeds", speeds)
    if planes.ndim != 2 or planes.shape[-1] != 2 or speeds.shape != planes.shape[:1]:
        raise ValueError(f"planes must be (n, 2) and speeds (n,), got {tuple(planes.shape)} and {tuple(speeds.shape)}")
    valid = (planes >= 0).all() & (planes < head_dim).all() & (planes[:, 0] != planes[:, 1]).all()
    if inspectable(planes) and not bool(valid):  # no values to check on meta
        raise ValueError(f"planes must hold two different feature indices in [0, {head_dim}) per row")
    generator = torch.zeros(head_dim, head_dim, dtype=torch.float64, device=speeds.device)
    a, b = planes[:, 0].to(speeds.device), planes[:, 1].to(speeds.device)
    speeds = speeds.double()
    generator.index_put_((b, a), speeds, accumulate=True)
    generator.index_put_((a, b), -speeds, accumulate=True)
    return generator


def rope_generators(frequencies: torch.Tensor, layout: str = "half", head_dim: int | None = None) -> torch.Tensor:
    """One skew-symmetric generator per axis, ``(n_axes, D, D)`` float64, with ``exp(sum_a p_a G_a) x`` equal to
    :func:`posenc.nd_rope.rotate_nd` of ``x`` at ``p``. ``frequencies``: ``(P, n_axes)``; ``D`` defaults to ``2 P``."""
    n_pairs = check_frequencies(frequencies).shape[0]
    head_dim = 2 * n_pairs if head_dim is None else head_dim
    if head_dim < 2 * n_pairs:
        raise ValueError(f"head_dim must be >= 2 * P = {2 * n_pairs}, got {head_dim}")
    planes = pair_indices(2 * n_pairs, layout)  # partial rotary: only the first 2P features turn, as in apply_rope
    return torch.stack(
        [plane_generator(head_dim, planes, frequencies[:, axis]) for axis in range(frequencies.shape[1])]
    )


# generators of each family -------------------------------------------------------------------------------------
def _rope_inv_freq(head_dim: int, base: float, device) -> torch.Tensor:
    check_head_dim(head_dim)
    return rope_frequencies(head_dim, {"rope_theta": require_positive_number("base", base)}, device=device)[0]


def _rotation_generator(head_dim, frequencies, damping, layout, dtype, device):
    """Block generator: pair ``j`` gets ``[[damping_j, -frequency_j], [frequency_j, damping_j]]`` (in float64)."""
    planes = pair_indices(head_dim, layout, device)
    frequencies = frequencies.to(device=device, dtype=torch.float64)
    generator = plane_generator(head_dim, planes, frequencies)
    damping = torch.as_tensor(damping, dtype=torch.float64).to(device).expand_as(frequencies)
    generator[planes[:, 0], planes[:, 0]] = damping
    generator[planes[:, 1], planes[:, 1]] = damping
    return generator.to(dtype)


def rope_generator(
    head_dim: int, base: float = 10_000.0, layout: str = "half", inv_freq=None, dtype=torch.float32, device=None
) -> torch.Tensor:
    """RoPE as a generator: block skew-symmetric ``(D, D)``, pair ``j`` is ``theta_j [[0, -1], [1, 0]]``.

    ``exp(tX)`` equals :func:`posenc.rope_matrix` ``(t, inv_freq, layout)``. ``inv_freq`` ``(D/2,)`` overrides the
    default frequencies ``theta_j = base^(-2j/D)`` (any table of :mod:`posenc.rope_types` fits).
    """
    if inv_freq is None:
        inv_freq = _rope_inv_freq(head_dim, base, device)
    else:
        check_inv_freq("inv_freq", inv_freq, pairs=require_int("head_dim", head_dim) // 2)
    return _rotation_generator(head_dim, inv_freq, 0.0, layout, dtype, device)


def xpos_scales(head_dim: int) -> torch.Tensor:
    """xPos's per-pair ``zeta_j = (2j + 0.4 D) / (1.4 D)``, ``j = 0 .. D/2 - 1``: shape ``(D/2,)``, float64."""
    check_head_dim(head_dim)
    pairs = torch.arange(head_dim // 2, dtype=torch.float64)
    return (2 * pairs + 0.4 * head_dim) / (1.4 * head_dim)


def xpos_generator(
    head_dim: int,
    base: float = 10_000.0,
    scale_base: float = 512,
    layout: str = "half",
    dtype=torch.float32,
    device=None,
) -> torch.Tensor:
    """xPos as a damped rotation: pair ``j`` has eigenvalues ``ln(zeta_j) / B +- i theta_j`` (``B = scale_base``).

    ``F(n) = exp(nX)`` is RoPE at ``n`` times ``zeta_j^(n/B)`` (the xPos query) and ``G(m) = F(m)^{-T}`` is RoPE at
    ``m`` times ``zeta_j^(-m/B)`` (the xPos key).
    """
    check_head_dim(head_dim)
    # ln(zeta_j) = log1p(-(D - 2j) / (1.4 D)): the last zeta_j lie close to 1, where log(zeta) would first round
    # zeta to float64 and then amplify that error by 1 / |ln zeta| (about 2e-14 relative at D = 64); log1p does not
    pairs = torch.arange(head_dim // 2, dtype=torch.float64)
    damping = torch.log1p(-(head_dim - 2 * pairs) / (1.4 * head_dim)) / require_positive_number(
        "scale_base", scale_base
    )
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


def damped_rope_generator(
    head_dim: int, decay, base: float = 10_000.0, layout: str = "half", dtype=torch.float32, device=None
) -> torch.Tensor:
    """RetNet-style damped RoPE: pair ``j`` has eigenvalues ``ln(gamma) +- i theta_j``.

    ``decay``: ``gamma`` in ``(0, 1]``, a number or a tensor ``(D/2,)`` (one per pair). The logit of a query at
    ``n`` and a key at ``m`` is RoPE's times ``gamma^(n - m)``: RetNet's ``D_nm`` with ``Theta_n = e^{i n theta}``.
    For one generator per head, stack them: ``torch.stack([damped_rope_generator(D, g) for g in retnet_decays(H)])``.
    """
    check_head_dim(head_dim)
    gamma = _per_entry("decay", decay, head_dim // 2)
    if not bool(((gamma > 0) & (gamma <= 1)).all()):
        raise ValueError(f"decay must lie in (0, 1] (gamma^(n - m) damps the past), got {decay}")
    return _rotation_generator(
        head_dim, _rope_inv_freq(head_dim, base, device), torch.log(gamma), layout, dtype, device
    )


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


def jordan_generator(
    head_dim: int,
    eigenvalue=0.0,
    frequency=None,
    block: int = 2,
    base: float = 10_000.0,
    dtype=torch.float32,
    device=None,
) -> torch.Tensor:
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
        raise ValueError(
            f"head_dim must be a multiple of {width} (copies of a {width} x {width} block), got {head_dim}"
        )
    copies = head_dim // width
    if frequency is None:
        frequency = copy_frequencies(copies, base)
    blocks = []
    for a, b in zip(
        _per_entry("eigenvalue", eigenvalue, copies).tolist(), _per_entry("frequency", frequency, copies).tolist()
    ):
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


def window_bias_generator(bias: torch.Tensor):
    """Any relative bias on a finite window as a group logit: ``(X (2L+2, 2L+2), q_bar (2L+2,), k_bar (2L+2,))``.

    ``bias`` is ``(2L + 1,)``, its values at the offsets ``-L .. L``. Read as one period of a sequence of period
    ``2L + 1``, it is a discrete Fourier series over the frequencies ``w_k = 2 pi k / (2L + 1)``, ``k = 0 .. L``; plane
    ``k`` of ``X`` turns at ``w_k``, ``k_bar`` is ``(1, 0)`` in every plane and ``q_bar`` holds the cosine and sine
    coefficients, so that ``q_bar^T exp(Delta X^T) k_bar = bias[Delta + L]`` for every integer ``|Delta| <= L``
    (``X`` skew-symmetric: an orthogonal, RoPE-like encoding with L + 1 planes). Float64.
    """
    require_tensor("bias", bias)
    if bias.ndim != 1 or bias.numel() % 2 != 1:
        raise ValueError(f"bias must have shape (2L + 1,), its values at offsets -L..L, got shape {tuple(bias.shape)}")
    values = bias.to(torch.float64)
    period = values.numel()
    half = period // 2
    offsets = torch.arange(-half, half + 1, dtype=torch.float64, device=bias.device)
    frequencies = 2 * torch.pi * torch.arange(half + 1, dtype=torch.float64, device=bias.device) / period
    angles = frequencies[:, None] * offsets[None, :]  # (L + 1, 2L + 1)
    weight = torch.full((half + 1,), 2.0 / period, dtype=torch.float64, device=bias.device)
    weight[0] = 1.0 / period  # the constant term is not doubled
    cos_coef = weight * (torch.cos(angles) @ values)
    sin_coef = weight * (torch.sin(angles) @ values)
    # q^T R(w Delta)^T k with k = (1, 0) and q = (a, b) is a cos(w Delta) - b sin(w Delta)
    q_bar = torch.stack((cos_coef, -sin_coef), dim=-1).reshape(-1)
    k_bar = torch.zeros_like(q_bar)
    k_bar[0::2] = 1.0
    pair = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64, device=bias.device)
    generator = torch.block_diag(*(w * pair for w in frequencies))
    return generator, q_bar, k_bar


# commuting skew generators: one maximal torus ---------------------------------------------------------------------
#: Relative tolerance of :func:`common_torus`: a generator counts as skew-symmetric when ``||X + X^T|| <= tol ||X||``
#: and the common basis is accepted when every ``Q^T X_i Q`` is block diagonal to ``tol ||X_i||``. The planes come from
#: the eigenvectors of ``-Z^2`` for a random combination ``Z``; their round-off is about ``eps ||Z||^2 / gap`` (gap:
#: the smallest distance between distinct ``w_j^2``), so 1e-8 accepts gaps down to about 1e-8 ||Z||^2 in float64.
TORUS_TOL = 1e-8


def _skew_stack(generators: torch.Tensor, tol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generators ``(n, D, D)`` checked skew-symmetric (within ``tol``) and commuting, as float64, with their
    Frobenius norms ``(n,)``."""
    require_tensor("generators", generators)
    if generators.ndim != 3 or generators.shape[-1] != generators.shape[-2]:
        raise ValueError(f"generators must have shape (n, D, D), got shape {tuple(generators.shape)}")
    x = torch.stack([check_generator(f"generators[{i}]", g) for i, g in enumerate(generators)]).to(torch.float64)
    norms = torch.linalg.matrix_norm(x)
    for i in range(x.shape[0]):
        if torch.linalg.matrix_norm(x[i] + x[i].T) > tol * norms[i]:
            raise ValueError(f"generators[{i}] must be skew-symmetric (X^T = -X within tol = {tol:g})")
    check_commuting(x)
    return x, norms


def _planes_and_kernel(z: torch.Tensor, tol: float) -> tuple[torch.Tensor, int]:
    """An orthonormal basis ``(D, D)`` for a skew ``z``: its planes ``(v, z v / |z v|)`` (the 2-D eigenspaces of
    ``-z^2``, largest first) then its kernel; and the number of planes."""
    dim = z.shape[-1]
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
        raise ValueError(
            f"could not split R^{dim} into planes and a kernel (found {basis.shape[1]} directions); try another seed"
        )
    return basis, planes


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
    x, norms = _skew_stack(generators, tol)
    c = torch.rand(x.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) + 0.5
    z = torch.einsum("n,nij->ij", c / norms.clamp(min=torch.finfo(torch.float64).tiny), x)
    basis, planes = _planes_and_kernel(z, tol)
    blocks = basis.T @ x @ basis
    first, second = torch.arange(0, 2 * planes, 2), torch.arange(1, 2 * planes, 2)
    frequencies = (blocks[:, second, first] - blocks[:, first, second]) / 2
    rebuilt = torch.zeros_like(blocks)
    rebuilt[:, second, first], rebuilt[:, first, second] = frequencies, -frequencies
    residual = torch.linalg.matrix_norm(blocks - rebuilt)
    if bool((residual > tol * norms.clamp(min=torch.finfo(torch.float64).tiny)).any()):
        raise ValueError(
            f"no common block-diagonal basis within tol = {tol:g} (residual "
            f"{(residual / norms).max().item():.1e}): two planes are too close under the random "
            "combination; try another seed"
        )
    return basis, frequencies


__all__ = [
    "plane_generator",
    "rope_generator",
    "rope_generators",
    "xpos_scales",
    "xpos_generator",
    "retnet_decays",
    "damped_rope_generator",
    "decay_generator",
    "copy_frequencies",
    "jordan_generator",
    "alibi_generator",
    "alibi_vectors",
    "window_bias_generator",
    "TORUS_TOL",
    "common_torus",
]
