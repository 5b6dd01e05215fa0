"""Group encodings: the maps ``exp(tX)`` and ``exp(sum_i p_i X_i)`` (the Lie view, for 1-D and N-D positions) and
the attention plug-ins built on them.

Convention (the one the book uses everywhere). A real ``D x D`` generator ``X`` defines the query map
``F(t) = exp(tX)`` and the key map ``G(s) = F(s)^{-T} = exp(-sX)^T``. The logit of a query at time ``t`` and a key
at time ``s`` is then

    q^T F(t)^T G(s) k = q^T exp((t - s) X^T) k,

a function of the offset ``t - s`` only (translation invariance). With this convention ``exp(tX)`` of
:func:`rope_generator` is :func:`posenc.rope_matrix` ``(t)``, and a generator whose eigenvalues have negative real
parts damps the logit as the key recedes into the past (``t - s > 0``), which is what a causal model wants.
Generators of every family are built in :mod:`posenc.generators`; the classification of any generator is
:mod:`posenc.jordan`.

Shapes: a generator is ``(D, D)``; :class:`GroupEncoding` also takes one generator per head ``(H, D, D)``.
Times are real (integer or float) tensors of any shape; positions for attention are ``(L,)`` or ``(B, L)``;
N-D positions are ``(..., n)`` for ``n`` generators ``(n, D, D)``.

Maps are computed with :func:`torch.linalg.matrix_exp` in the generator's dtype promoted to at least float32,
on the generator's device.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._checks import as_positions, check_generator, check_times, inspectable, require_tensor
from .encodings import PositionalEncoding

#: Relative tolerance of :func:`check_commuting`: ``||[X_i, X_j]|| <= COMMUTING_TOL * ||X_i|| ||X_j||``.
#: Float32 round-off in a product of two generators is ~1e-7 relative, so 1e-5 leaves a wide margin while a
#: genuinely non-commuting pair (e.g. random skew generators) gives a ratio of order 1.
COMMUTING_TOL = 1e-5


# dtype rule ----------------------------------------------------------------------------------------------------
def _work_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = torch.float32
    for tensor in tensors:
        if tensor.is_floating_point():
            dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


# the maps ------------------------------------------------------------------------------------------------------
#: From this many integer times on, :func:`_exp_times` uses the group law on a grid instead of one exp per time.
GRID_MIN_TIMES = 64


def _exp_each(generator: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    view = generator.reshape(*generator.shape[:-2], *([1] * times.ndim), *generator.shape[-2:])
    return torch.linalg.matrix_exp(times[..., None, None] * view)


def _exp_on_grid(generator: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """Integer times ``t = t0 + c step + f``, ``0 <= f < step ~ sqrt(span)``: ``A(t) = A(t0 + c step) A(f)``.

    About ``2 sqrt(span)`` matrix exponentials (of smaller norm) and one batched product instead of one
    exponential per time: the group law ``A(a + b) = A(a) A(b)`` put to work.
    """
    flat = times.reshape(-1)
    start, span = flat.min(), int((flat.max() - flat.min()).item())
    step = math.isqrt(span) + 1
    shifted = (flat - start).round()
    coarse, fine = torch.div(shifted, step, rounding_mode="floor"), torch.remainder(shifted, step)
    grid = torch.arange(int(coarse.max().item()) + 1, device=times.device, dtype=times.dtype)
    big = _exp_each(generator, start + step * grid)
    small = _exp_each(generator, torch.arange(step, device=times.device, dtype=times.dtype))
    product = big[..., coarse.long(), :, :] @ small[..., fine.long(), :, :]
    return product.reshape(*generator.shape[:-2], *times.shape, *generator.shape[-2:])


def _exp_times(generator: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """``exp(t X)`` for ``generator`` ``(*G, D, D)`` and ``times`` ``(*T)``: ``(*G, *T, D, D)``."""
    dtype = _work_dtype(generator, times)
    generator = generator.to(dtype)
    if not inspectable(times):
        return _exp_each(generator, times.to(device=generator.device, dtype=dtype))
    integer = not times.is_floating_point() or bool((times == times.round()).all())
    times = times.to(device=generator.device, dtype=dtype)
    if integer and times.numel() >= GRID_MIN_TIMES:
        return _exp_on_grid(generator, times)
    return _exp_each(generator, times)


def one_parameter_group(generator: torch.Tensor, t) -> torch.Tensor:
    """``A(t) = exp(tX)``: ``generator`` ``(D, D)``, ``t`` a number or a tensor of any shape -> ``(*t.shape, D, D)``.

    Float32 or better (the promoted dtype of ``generator`` and ``t``), on the generator's device.
    ``A(0) = I`` and ``A(a) A(b) = A(a + b)``.
    """
    generator = check_generator("generator", generator)
    return _exp_times(generator, check_times("t", t, generator.device, _work_dtype(generator)))


def commutator(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``[X, Y] = XY - YX``."""
    return x @ y - y @ x


def check_commuting(generators: torch.Tensor, tol: float = COMMUTING_TOL) -> torch.Tensor:
    """Raise ``ValueError`` unless the generators ``(n, D, D)`` commute pairwise; returns them.

    Pair ``(i, j)`` commutes when ``||X_i X_j - X_j X_i||_F <= tol * ||X_i||_F ||X_j||_F`` (see
    :data:`COMMUTING_TOL`).
    """
    require_tensor("generators", generators)
    if generators.ndim != 3:
        raise ValueError(f"generators must have shape (n, D, D), got shape {tuple(generators.shape)}")
    if not inspectable(generators):  # no values to check on meta
        return generators
    norms = torch.linalg.matrix_norm(generators.double())
    for i in range(generators.shape[0]):
        for j in range(i + 1, generators.shape[0]):
            size = torch.linalg.matrix_norm(commutator(generators[i].double(), generators[j].double()))
            if size > tol * norms[i] * norms[j]:
                ratio = (size / (norms[i] * norms[j])).item()
                raise ValueError(
                    f"generators {i} and {j} do not commute: ||[X_{i}, X_{j}]|| / (||X_{i}|| ||X_{j}||) = "
                    f"{ratio:.3g} > tol = {tol:g}; exp(sum_i p_i X_i) is then not a relative encoding "
                    "(pass check=False to use it anyway)"
                )
    return generators


def _check_generators(generators) -> torch.Tensor:
    require_tensor("generators", generators)
    if generators.ndim != 3:
        raise ValueError(f"generators must have shape (n, D, D), got shape {tuple(generators.shape)}")
    for i in range(generators.shape[0]):
        check_generator(f"generators[{i}]", generators[i])
    return generators if generators.is_floating_point() else generators.float()


def multi_parameter_group(
    generators: torch.Tensor, positions, check: bool = True, tol: float = COMMUTING_TOL, sequential: bool = False
) -> torch.Tensor:
    """The Lie view ``A(p) = exp(sum_i p_i X_i)``: ``generators`` ``(n, D, D)``, ``positions`` ``(..., n)`` ->
    ``(..., D, D)``, in the promoted dtype of both (at least float32), on the generators' device.

    With ``check`` (default) the generators must commute (:func:`check_commuting`); only then is
    ``A(p)^T A(p')^{-T}`` a function of ``p - p'``. ``sequential=True`` gives the product
    ``exp(p_{n-1} X_{n-1}) ... exp(p_0 X_0)`` (axis 0 applied first) instead: the same map when the generators commute,
    another one (turning one axis after the other) when they do not.
    """
    generators = _check_generators(generators)
    if check:
        check_commuting(generators, tol)
    positions = check_times("positions", positions, generators.device)
    if positions.ndim == 0 or positions.shape[-1] != generators.shape[0]:
        raise ValueError(
            f"positions must have shape (..., n) with n = {generators.shape[0]} (one coordinate per generator), "
            f"got shape {tuple(positions.shape)}"
        )
    dtype = _work_dtype(generators, positions)
    positions, generators = positions.to(device=generators.device, dtype=dtype), generators.to(dtype)
    if not sequential:
        return torch.linalg.matrix_exp(torch.einsum("...n,nij->...ij", positions, generators))
    factors = torch.linalg.matrix_exp(positions[..., :, None, None] * generators)  # (..., n, D, D)
    result = factors[..., 0, :, :]
    for axis in range(1, generators.shape[0]):
        result = factors[..., axis, :, :] @ result
    return result


# attention plug-ins ---------------------------------------------------------------------------------------------
def _apply_maps(maps: torch.Tensor, x: torch.Tensor, batched_positions: bool, per_head: bool) -> torch.Tensor:
    """``maps @ x`` per position. ``maps``: ``([B,] [H,] L, D, D)``; ``x``: ``(..., L, D)`` / ``(B, [H,] L, D)``."""
    if per_head and batched_positions:
        return torch.einsum("bhlij,bhlj->bhli", maps, x)
    if per_head:
        return torch.einsum("hlij,...hlj->...hli", maps, x)
    if batched_positions:
        return torch.einsum("blij,blj->bli", maps, x) if x.ndim == 3 else torch.einsum("blij,bhlj->bhli", maps, x)
    return torch.einsum("lij,...lj->...li", maps, x)


def _check_qk(name: str, x, head_dim: int, positions: torch.Tensor, per_head: int | None):
    require_tensor(name, x)
    if x.ndim < 2 or x.shape[-1] != head_dim:
        raise ValueError(f"{name} must have shape (..., L, {head_dim}), got shape {tuple(x.shape)}")
    if positions.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"{name}_positions must have length {x.shape[-2]} (the length of {name}), "
            f"got shape {tuple(positions.shape)}"
        )
    if positions.ndim == 2 and (x.ndim not in (3, 4) or positions.shape[0] not in (1, x.shape[0])):
        raise ValueError(
            f"{name} must have shape (B, H, L, D) or (B, L, D) with B = {positions.shape[0]} for "
            f"batched {name}_positions, got shape {tuple(x.shape)}"
        )
    if per_head is not None and (x.ndim < 3 or x.shape[-3] != per_head):
        raise ValueError(
            f"{name} must have shape (..., H, L, D) with H = {per_head} (one generator per head), "
            f"got shape {tuple(x.shape)}"
        )


def _shared_rows(positions: torch.Tensor) -> torch.Tensor:
    """``(B, L)`` positions whose rows are all equal (the usual case) -> ``(L,)``: one map per position, not B."""
    if positions.ndim == 2 and inspectable(positions) and bool((positions == positions[:1]).all()):
        return positions[0]
    return positions


class _MapsEncoding(PositionalEncoding):
    """Shared machinery: ``q -> F(t) q``, ``k -> F(s)^{-T} k``, with ``F`` given by :meth:`query_maps`."""

    kind = "qk"
    _fixed_dtype_buffers = ("generator", "generators")  # a learnable generator is a Parameter: it follows the model

    def query_maps(self, positions: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
        raise NotImplementedError

    def key_maps(self, positions: torch.Tensor) -> torch.Tensor:
        """``G(s) = F(s)^{-T}``, computed as ``F(-s)^T`` (exact inverse, no matrix inversion)."""
        return self.query_maps(positions, sign=-1.0).transpose(-1, -2)

    def _encode(self, x, maps, batched_positions, per_head):
        out = _apply_maps(maps, x.to(maps.dtype), batched_positions, per_head)
        return out.to(x.dtype) if x.is_floating_point() else out


class GroupEncoding(_MapsEncoding):
    """A one-parameter group ``F(t) = exp(tX)`` as a "qk" encoding; keys get ``G(s) = F(s)^{-T}``.

    ``generator``: ``(D, D)``, or ``(H, D, D)`` for one generator per head (then ``q``, ``k`` are ``(..., H, L, D)``).
    Any real generator works (rotation, decay, damped rotation, Jordan blocks); ``learnable=True`` makes it an
    ``nn.Parameter``. Positions: ``(L,)`` or ``(B, L)``, integer or real.

    ``encode_qk(q, k, q_positions, k_positions)`` with ``q`` ``(B, H, Lq, D)`` and ``k`` ``(B, H, Lk, D)`` returns
    the encoded pair; their logit ``q'^T k'`` is ``q^T exp((t - s) X^T) k``, a function of ``t - s`` only.
    """

    def __init__(self, generator: torch.Tensor, learnable: bool = False):
        super().__init__()
        generator = check_generator("generator", generator, batched=True)
        generator = generator.detach().clone().to(_work_dtype(generator))
        if learnable:
            self.generator = nn.Parameter(generator)
        else:
            self.register_buffer("generator", generator, persistent=False)

    @property
    def head_dim(self) -> int:
        return self.generator.shape[-1]

    def _per_head(self) -> int | None:
        return self.generator.shape[0] if self.generator.ndim == 3 else None

    def query_maps(self, positions, sign: float = 1.0) -> torch.Tensor:
        """``F(t)`` for ``positions`` ``(*P)``: ``(*P, D, D)``, or ``(H, L, D, D)`` / ``(B, H, L, D, D)`` per head."""
        positions = as_positions("positions", positions, device=self.generator.device)
        # one exponential per distinct time (when the values may be inspected)
        times, inverse = torch.unique(positions, return_inverse=True) if inspectable(positions) else (positions, None)
        maps = _exp_times(self.generator, sign * times.to(_work_dtype(self.generator, times)))
        per_head = self.generator.ndim == 3  # maps (H, *P, D, D) -> ([B,] H, L, D, D)
        if inverse is not None:
            maps = maps[:, inverse] if per_head else maps[inverse]
        return maps.movedim(0, 1) if per_head and positions.ndim == 2 else maps

    def encode_qk(self, q, k, q_positions, k_positions):
        q_positions = as_positions("q_positions", q_positions, device=self.generator.device)
        k_positions = as_positions("k_positions", k_positions, device=self.generator.device)
        _check_qk("q", q, self.head_dim, q_positions, self._per_head())
        _check_qk("k", k, self.head_dim, k_positions, self._per_head())
        per_head = self._per_head() is not None
        q_positions, k_positions = _shared_rows(q_positions), _shared_rows(k_positions)
        q_out = self._encode(q, self.query_maps(q_positions), q_positions.ndim == 2, per_head)
        k_out = self._encode(k, self.key_maps(k_positions), k_positions.ndim == 2, per_head)
        return q_out, k_out

    def extra_repr(self) -> str:
        return f"generator={tuple(self.generator.shape)}, learnable={isinstance(self.generator, nn.Parameter)}"


class MultiGroupEncoding(_MapsEncoding):
    """N-D positions: ``F(p) = exp(sum_i p_i X_i)`` for ``generators`` ``(n, D, D)``; keys ``F(p')^{-T}``.

    Positions ``(L, n)`` or ``(B, L, n)``. With ``check=True`` (default) the generators must commute
    (:func:`check_commuting`), which is exactly when the logit depends on ``p - p'`` only; ``check=False`` allows
    non-commuting ones (LieRE's learned dense skew generators), which are not relative.
    """

    def __init__(
        self, generators: torch.Tensor, learnable: bool = False, check: bool = True, tol: float = COMMUTING_TOL
    ):
        super().__init__()
        generators = _check_generators(generators)
        if check:
            check_commuting(generators, tol)
        generators = generators.detach().clone().to(_work_dtype(generators))
        self.check, self.tol = check, tol
        if learnable:
            self.generators = nn.Parameter(generators)
        else:
            self.register_buffer("generators", generators, persistent=False)

    def query_maps(self, positions, sign: float = 1.0) -> torch.Tensor:
        """``F(p)`` for ``positions`` ``(..., L, n)``: ``(..., L, D, D)``."""
        return multi_parameter_group(
            self.generators, sign * check_times("positions", positions, self.generators.device), check=False
        )

    def _check_nd(self, name, positions):
        positions = check_times(f"{name}_positions", positions, self.generators.device)
        n = self.generators.shape[0]
        if positions.ndim not in (2, 3) or positions.shape[-1] != n:
            raise ValueError(
                f"{name}_positions must have shape (L, {n}) or (B, L, {n}), got shape {tuple(positions.shape)}"
            )
        return positions

    def encode_qk(self, q, k, q_positions, k_positions):
        q_positions, k_positions = self._check_nd("q", q_positions), self._check_nd("k", k_positions)
        head_dim = self.generators.shape[-1]
        _check_qk("q", q, head_dim, q_positions[..., 0], None)
        _check_qk("k", k, head_dim, k_positions[..., 0], None)
        q_out = self._encode(q, self.query_maps(q_positions), q_positions.ndim == 3, False)
        k_out = self._encode(k, self.key_maps(k_positions), k_positions.ndim == 3, False)
        return q_out, k_out


def relative_kernel(generator: torch.Tensor, offsets) -> torch.Tensor:
    """``K(a) = F(t)^T G(t - a) = exp(a X^T)``: the bilinear form the logit applies, ``q^T K(t - s) k``.

    ``offsets`` ``(*A)`` (query time minus key time) -> ``(*A, D, D)``.
    """
    return one_parameter_group(generator, offsets).transpose(-1, -2)


__all__ = [
    "COMMUTING_TOL",
    "GRID_MIN_TIMES",
    "one_parameter_group",
    "commutator",
    "check_commuting",
    "multi_parameter_group",
    "GroupEncoding",
    "MultiGroupEncoding",
    "relative_kernel",
]
