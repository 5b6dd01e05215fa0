"""Learned generators for N-D positions: ComRoPE, Cayley-STRING and LieRE, and how far from relative they are.

All three encode a position ``p`` (``n`` coordinates) by an orthogonal map ``R(p) = exp(sum_i p_i X_i)`` with
learned skew-symmetric generators ``X_i`` ``(D, D)``, applied to queries and keys alike (for an orthogonal map the
key map ``R(p')^{-T}`` of :mod:`posenc.group_encodings` is ``R(p')`` itself). The logit of a query at ``p`` and a
key at ``p'`` is ``q^T R(p)^T R(p') k``. It is a function of ``p' - p`` alone for every ``q``, ``k`` exactly when
the generators commute pairwise (ComRoPE, Yu et al. 2025, arXiv 2506.03737, Theorem 1; chapter 8's maximal-torus
argument): then ``R(p)^T R(p') = R(p' - p)``.

* :class:`ComRoPE`: commuting by construction. Block-diagonal generators ``X_i = diag(a_{i1} S_1, ..., a_{im} S_m)``
  with one learned skew block ``S_c = P_c - P_c^T`` ``(b, b)`` per block and coefficients ``a_{ic}``: two
  generators are multiples of the same ``S_c`` block by block, so they commute. ``variant="ap"`` (axis-partitioned:
  block ``c`` turns with axis ``c mod n`` only, ``a`` one-hot and fixed) and ``variant="ld"`` (linearly dependent:
  learned ``a_{ic}``, one per axis and block, so block ``c`` turns with its own combination ``sum_i a_{ic} p_i``),
  the two solutions of the authors' code (github.com/Longin-Yu/ComRoPE, ``model.py``: ``ComRoPEAPAttention``,
  ``ComRoPELDAttention`` with its multiplier of shape ``(1, num_axes, num_blocks, 1, 1)``, drawn N(0, 1)).
* :class:`CayleySTRING`: ``R(p) = P^T RoPE(p) P`` with N-D RoPE (:class:`posenc.nd_rope.NDRoPE`, learnable
  frequencies) and one learned orthogonal ``P = (I + S)^{-1} (I - S)`` (the Cayley transform of a skew ``S``;
  Schenck et al., "Learning the RoPEs", ICML 2025). Its generators ``P^T G_a P`` commute because RoPE's do. In the
  logit ``P^T`` cancels: ``q^T R(p)^T R(p') k = (P q)^T RoPE(p' - p) (P k)``, so ``P`` folds into ``W_q`` and
  ``W_k`` (:func:`fold_into_projection`) and costs nothing at inference.
* :class:`LieRE`: dense learned skew generators ``X_i = A_i - A_i^T`` that need not commute (Ostmeier et al.,
  ICML 2025). Exactly relative in 1-D (one generator always commutes with itself), not in N-D;
  :func:`relative_spread` measures by how much.

Shapes: ``head_dim`` ``D``; generators ``(n, D, D)``; positions ``(L, n)`` / ``(B, L, n)`` coordinates, or integer
indices ``(L,)`` / ``(B, L)`` into a ``coordinates`` table ``(N, n)`` given at construction (what
:func:`posenc.attention` passes: token ``i`` at ``coordinates[i]``); ``q`` ``(B, H, Lq, D)``, ``k``
``(B, H, Lk, D)``. The maps are computed in float32 or better, whatever the model's dtype
(:func:`posenc.group_encodings.multi_parameter_group`).
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import as_coordinates, check_head_dim, coordinates_table, require_int, require_tensor
from .generators import rope_generators
from .group_encodings import MultiGroupEncoding, commutator, multi_parameter_group
from .nd_rope import NDRoPE, indexed_coordinates

COMROPE_VARIANTS = ("ap", "ld")


# parametrisations ----------------------------------------------------------------------------------------------
def skew(matrix: torch.Tensor) -> torch.Tensor:
    """``A - A^T`` for ``matrix`` ``(..., D, D)``: every skew-symmetric matrix, and only those."""
    require_tensor("matrix", matrix)
    if matrix.ndim < 2 or matrix.shape[-1] != matrix.shape[-2]:
        raise ValueError(f"matrix must have shape (..., D, D), got {tuple(matrix.shape)}")
    return matrix - matrix.transpose(-1, -2)


def cayley(skew_matrix: torch.Tensor) -> torch.Tensor:
    """The Cayley transform ``P = (I + S)^{-1} (I - S)`` of a skew-symmetric ``S`` ``(..., D, D)``: orthogonal,
    ``det P = +1``, ``P = I`` at ``S = 0``. (``I + S`` is always invertible: ``S`` has imaginary eigenvalues.)"""
    require_tensor("skew_matrix", skew_matrix)
    if skew_matrix.ndim < 2 or skew_matrix.shape[-1] != skew_matrix.shape[-2]:
        raise ValueError(f"skew_matrix must have shape (..., D, D), got {tuple(skew_matrix.shape)}")
    eye = torch.eye(skew_matrix.shape[-1], dtype=skew_matrix.dtype, device=skew_matrix.device)
    return torch.linalg.solve(eye + skew_matrix, eye - skew_matrix)


def block_diagonal_generators(blocks: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
    """ComRoPE's commuting generators ``X_i = diag(a_{i1} S_1, ..., a_{im} S_m)``: ``(n, m b, m b)``.

    ``blocks``: ``(m, b, b)`` skew-symmetric blocks ``S_c``; ``coefficients``: ``(n, m)`` (or ``(n, 1)``, one scale
    per axis for every block). ``X_i X_j = diag(a_ic a_jc S_c^2) = X_j X_i``: they commute for any values.
    """
    require_tensor("blocks", blocks)
    require_tensor("coefficients", coefficients)
    if blocks.ndim != 3 or blocks.shape[-1] != blocks.shape[-2]:
        raise ValueError(f"blocks must have shape (m, b, b), got {tuple(blocks.shape)}")
    if coefficients.ndim != 2 or coefficients.shape[1] not in (1, blocks.shape[0]):
        raise ValueError(
            f"coefficients must have shape (n, {blocks.shape[0]}) or (n, 1), got {tuple(coefficients.shape)}"
        )
    m, b = blocks.shape[0], blocks.shape[-1]
    scaled = coefficients.expand(-1, m)[:, :, None, None] * blocks  # (n, m, b, b)
    out = scaled.new_zeros(coefficients.shape[0], m * b, m * b)
    for c in range(m):
        out[:, c * b : (c + 1) * b, c * b : (c + 1) * b] = scaled[:, c]
    return out


# the plug-ins --------------------------------------------------------------------------------------------------
class _LearnedGenerators(MultiGroupEncoding):
    """A :class:`~posenc.group_encodings.MultiGroupEncoding` whose generators ``(n, D, D)`` are computed from
    parameters at every call (subclasses define :meth:`generator_matrices`). Positions are coordinates ``(L, n)``,
    or indices ``(L,)`` into the ``coordinates`` table; with ``n = 1``, plain positions ``(L,)`` are coordinates."""

    coordinates: torch.Tensor | None  # (N, n): the table integer positions index, or None

    def __init__(self, head_dim: int, n_axes: int, coordinates: torch.Tensor | None = None):
        nn.Module.__init__(self)  # not MultiGroupEncoding.__init__: the generators are a function, not a tensor
        self.head_dim, self.n_axes = check_head_dim(head_dim), require_int("n_axes", n_axes, minimum=1)
        self.check, self.tol = False, None  # type: ignore[assignment]  # no generator tensor to check
        self.register_buffer("coordinates", coordinates_table(coordinates, n_axes), persistent=False)

    def generator_matrices(self) -> torch.Tensor:
        """The generators ``(n, D, D)`` (differentiable in the parameters)."""
        raise NotImplementedError

    @property
    def generators(self) -> torch.Tensor:  # type: ignore[override]  # a function of the parameters here
        return self.generator_matrices()

    def maps(self, positions) -> torch.Tensor:
        """``R(p) = exp(sum_i p_i X_i)`` for ``positions`` (see the module docstring): ``(*B, L, D, D)``."""
        return multi_parameter_group(self.generator_matrices(), self.coordinates_of(positions), check=False)

    def coordinates_of(self, positions) -> torch.Tensor:
        """Coordinates ``(*B, L, n)`` of ``positions``."""
        if self.coordinates is not None:
            return indexed_coordinates(self.coordinates, positions)
        positions = torch.as_tensor(positions)
        if self.n_axes == 1 and positions.ndim in (1, 2) and positions.shape[-1] != 1:
            positions = positions[..., None]
        return as_coordinates("positions", positions, self.n_axes)

    def encode_qk(self, q, k, q_positions, k_positions):
        return super().encode_qk(q, k, self.coordinates_of(q_positions), self.coordinates_of(k_positions))

    def commutator_norm(self) -> torch.Tensor:
        """``max_{i<j} ||[X_i, X_j]||_F``: 0 exactly when the encoding is relative (a scalar tensor)."""
        return max_commutator_norm(self.generator_matrices())


class ComRoPE(_LearnedGenerators):
    """ComRoPE as a "qk" plug-in: commuting block-diagonal learned generators (see the module docstring).

    ``head_dim`` ``D`` must be a multiple of ``block_size`` ``b`` (``m = D / b`` blocks). ``variant="ap"``: block
    ``c`` belongs to axis ``c mod n_axes``; ``variant="ld"``: block ``c`` turns with ``sum_i a_{ic} p_i``, learned
    ``coefficients`` ``a`` ``(n_axes, m)`` drawn N(0, 1) as in the authors' code. ``scale`` sets the initial entries
    of each ``P_c`` (normal with that standard deviation; ``generator`` a ``torch.Generator`` for reproducible
    draws). Logits are functions of ``p' - p`` alone, whatever the parameters.

    Where this departs from the authors' ``model.py``: one set of blocks for all heads (theirs: one per head); their
    ``init_std`` defaults to 1 (``scale`` here 0.5); they scale each coordinate to ``(p + 1/2) / N`` on an ``N``-patch
    axis, which in a relative logit is the coefficients divided by ``N`` (the shift cancels), so integer coordinates
    here change the scale the coefficients start at, not the maps they can reach.
    """

    def __init__(
        self,
        head_dim: int,
        n_axes: int = 2,
        block_size: int = 4,
        variant: str = "ap",
        coordinates: torch.Tensor | None = None,
        scale: float = 0.5,
        generator=None,
    ):
        super().__init__(head_dim, n_axes, coordinates)
        require_int("block_size", block_size, minimum=2)
        if head_dim % block_size:
            raise ValueError(f"head_dim must be a multiple of block_size = {block_size}, got {head_dim}")
        if variant not in COMROPE_VARIANTS:
            raise ValueError(f"variant must be one of {COMROPE_VARIANTS}, got {variant!r}")
        self.variant, self.block_size = variant, block_size
        m = head_dim // block_size
        self.raw_blocks = nn.Parameter(scale * torch.randn(m, block_size, block_size, generator=generator))
        if variant == "ap":
            self.register_buffer(
                "coefficients",
                (torch.arange(m)[None, :] % n_axes == torch.arange(n_axes)[:, None]).float(),
                persistent=False,
            )
        else:
            self.coefficients = nn.Parameter(torch.randn(n_axes, m, generator=generator))

    def generator_matrices(self) -> torch.Tensor:
        return block_diagonal_generators(skew(self.raw_blocks), self.coefficients)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, n_axes={self.n_axes}, block_size={self.block_size}, variant={self.variant!r}"


class LieRE(_LearnedGenerators):
    """LieRE as a "qk" plug-in: ``R(p) = exp(sum_i p_i (A_i - A_i^T))`` with dense learned ``A_i`` ``(D, D)``.

    ``scale``: the standard deviation of the initial entries of ``A_i`` (``generator`` for reproducible draws).
    The generators do not commute in general, so the logit depends on the absolute positions too
    (:func:`relative_spread`); with ``n_axes = 1`` it is exactly relative.
    """

    def __init__(
        self,
        head_dim: int,
        n_axes: int = 2,
        coordinates: torch.Tensor | None = None,
        scale: float = 0.1,
        generator=None,
    ):
        super().__init__(head_dim, n_axes, coordinates)
        self.raw = nn.Parameter(scale * torch.randn(n_axes, head_dim, head_dim, generator=generator))

    def generator_matrices(self) -> torch.Tensor:
        return skew(self.raw)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, n_axes={self.n_axes}"


class CayleySTRING(NDRoPE):
    """Cayley-STRING as a "qk" plug-in: ``R(p) = P^T RoPE(p) P``, ``P`` the Cayley transform of a learned skew matrix.

    The RoPE part is :class:`posenc.nd_rope.NDRoPE` (same arguments, those after ``variant`` by keyword;
    ``variant="mixed"``, learnable frequencies by default); ``P`` ``(D, D)`` starts at the identity (``S = 0``)
    unless ``scale > 0`` draws ``S`` at random. Queries and keys are both mapped by ``R(p)``, so the logit is
    ``(P q)^T RoPE(p' - p) (P k)``: relative, and the same as N-D RoPE applied to projections with ``P`` folded in
    (:func:`fold_into_projection`).
    """

    def __init__(self, head_dim: int, n_axes: int = 2, variant: str = "mixed", *, scale: float = 0.0, **options):
        # options: NDRoPE's other (keyword) arguments: base, coordinates, learnable, layout, generator, seq_dim
        super().__init__(head_dim, n_axes, variant, **options)
        self.raw_skew = nn.Parameter(scale * torch.randn(head_dim, head_dim, generator=options.get("generator")))

    @property
    def orthogonal(self) -> torch.Tensor:
        """``P = cayley(S - S^T)`` ``(D, D)``, float32 or better."""
        raw = self.raw_skew if self.raw_skew.dtype in (torch.float32, torch.float64) else self.raw_skew.float()
        return cayley(skew(raw))

    def rotate(self, x: torch.Tensor, positions) -> torch.Tensor:
        """``x`` ``(..., L, D)`` mapped by ``P^T RoPE(p) P`` at ``positions``."""
        p = self.orthogonal
        mixed = super().rotate(x.to(p.dtype) @ p.T, positions)
        return (mixed @ p).to(x.dtype)

    def rope_part(self) -> NDRoPE:
        """Plain :class:`NDRoPE` with this encoding's frequencies (a copy): what runs after folding ``P``."""
        rope = NDRoPE(
            self.weights.shape[0] * 2,
            self.weights.shape[1],
            "axial",
            layout=self.layout,
            coordinates=self.coordinates,
            learnable=False,
        )
        with torch.no_grad():
            rope.weights = self.frequencies.detach().clone()
            rope.mask = torch.ones_like(rope.mask)
        return rope

    def generator_matrices(self) -> torch.Tensor:
        """``P^T G_a P`` ``(n, D, D)`` float64, ``G_a`` RoPE's generators (:func:`posenc.generators.rope_generators`):
        ``exp(sum_a p_a P^T G_a P) = R(p)``."""
        p = self.orthogonal.detach().double()
        gens = rope_generators(self.frequencies.detach(), self.layout, self.weights.shape[0] * 2)
        return p.T @ gens.to(p.device) @ p


def fold_into_projection(weight: torch.Tensor, orthogonal: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``W -> diag(P, ..., P) W``: ``weight`` ``(n_heads * D, d_model)`` (``nn.Linear`` layout), ``orthogonal``
    ``(D, D)``. Queries and keys made with the folded weights, then N-D RoPE, give Cayley-STRING's logits."""
    require_tensor("weight", weight)
    require_tensor("orthogonal", orthogonal)
    require_int("n_heads", n_heads, minimum=1)
    d = orthogonal.shape[-1]
    if orthogonal.ndim != 2 or orthogonal.shape[0] != d:
        raise ValueError(f"orthogonal must have shape (D, D), got {tuple(orthogonal.shape)}")
    if weight.ndim != 2 or weight.shape[0] != n_heads * d:
        raise ValueError(
            f"weight must have shape (n_heads * D, d_model) = ({n_heads * d}, d_model), got {tuple(weight.shape)}"
        )
    per_head = weight.view(n_heads, d, weight.shape[1])
    return (orthogonal.to(weight.dtype) @ per_head).reshape_as(weight)


# how far from relative -----------------------------------------------------------------------------------------
def max_commutator_norm(generators: torch.Tensor) -> torch.Tensor:
    """``max_{i<j} ||X_i X_j - X_j X_i||_F`` over generators ``(n, D, D)`` (0 for ``n = 1``): a scalar tensor."""
    require_tensor("generators", generators)
    if generators.ndim != 3 or generators.shape[-1] != generators.shape[-2]:
        raise ValueError(f"generators must have shape (n, D, D), got {tuple(generators.shape)}")
    norms = [
        torch.linalg.matrix_norm(commutator(generators[i], generators[j]))
        for i in range(len(generators))
        for j in range(i + 1, len(generators))
    ]
    return torch.stack(norms).max() if norms else generators.new_zeros(())


def logits_at_offset(generators: torch.Tensor, q: torch.Tensor, k: torch.Tensor, offset, key_positions) -> torch.Tensor:
    """The logit ``q^T R(n + Delta)^T R(n) k`` of one query and one key at a fixed offset ``Delta = m - n`` (query
    minus key), for every key position ``n``: ``(S,)``, unscaled (no ``1 / sqrt(D)``).

    ``generators`` ``(n_axes, D, D)`` skew-symmetric (``R(p) = exp(sum_i p_i X_i)``, orthogonal); ``q``, ``k``
    ``(D,)``; ``offset`` ``(n_axes,)``; ``key_positions`` ``(S, n_axes)``. For a relative encoding every entry is the
    same.
    """
    require_tensor("generators", generators)
    if generators.ndim != 3 or generators.shape[-1] != generators.shape[-2]:
        raise ValueError(f"generators must have shape (n, D, D), got {tuple(generators.shape)}")
    n, d = generators.shape[0], generators.shape[-1]
    for name, vector in (("q", q), ("k", k)):
        require_tensor(name, vector)
        if vector.shape != (d,):
            raise ValueError(f"{name} must have shape ({d},), got {tuple(vector.shape)}")
    key_positions = as_coordinates("key_positions", key_positions, n)
    if key_positions.ndim != 2:
        raise ValueError(f"key_positions must have shape (S, {n}), got {tuple(key_positions.shape)}")
    offset = torch.as_tensor(offset, dtype=key_positions.dtype if key_positions.is_floating_point() else None)
    if offset.shape != (n,):
        raise ValueError(f"offset must have shape ({n},), got {tuple(offset.shape)}")
    query_maps = multi_parameter_group(generators, key_positions + offset, check=False)  # (S, D, D)
    key_maps = multi_parameter_group(generators, key_positions, check=False)
    dtype = query_maps.dtype
    return torch.einsum("i,sji,sjk,k->s", q.to(dtype), query_maps, key_maps, k.to(dtype))


def relative_spread(generators: torch.Tensor, q: torch.Tensor, k: torch.Tensor, offset, key_positions) -> torch.Tensor:
    """How far from relative: ``max - min`` of :func:`logits_at_offset` over the key positions (a scalar tensor).

    0 (up to rounding) when the generators commute; for generators ``X_i + s Y_i`` that commute at ``s = 0`` it grows
    from 0 with ``s``, i.e. with the commutator norm.
    """
    logits = logits_at_offset(generators, q, k, offset, key_positions)
    return logits.max() - logits.min()


# fitting a score map -------------------------------------------------------------------------------------------
def _check_pairs(query_positions, key_positions, target):
    require_tensor("target", target)
    for name, positions in (("query_positions", query_positions), ("key_positions", key_positions)):
        require_tensor(name, positions)
        if positions.ndim != 2:
            raise ValueError(f"{name} must have shape (N, n_axes), got {tuple(positions.shape)}")
    if query_positions.shape != key_positions.shape or target.shape != query_positions.shape[:1]:
        raise ValueError(
            f"query_positions and key_positions must both have shape (N, n_axes) and target (N,), got "
            f"{tuple(query_positions.shape)}, {tuple(key_positions.shape)} and {tuple(target.shape)}"
        )


def relative_floor(query_positions: torch.Tensor, key_positions: torch.Tensor, target: torch.Tensor) -> float:
    """The smallest mean squared error any relative encoding can reach on ``target`` ``(N,)``: a relative score is
    one number per offset ``key - query``, so the best it can do is the mean of the target over the pairs of each
    offset, and its error is the target's variance within offsets. ``query_positions``, ``key_positions``:
    ``(N, n_axes)``."""
    _check_pairs(query_positions, key_positions, target)
    offsets = key_positions - query_positions
    _, group = torch.unique(offsets, dim=0, return_inverse=True)
    target = target.double()
    count = torch.zeros(int(group.max()) + 1, dtype=torch.float64).index_add_(0, group, torch.ones_like(target))
    mean = torch.zeros_like(count).index_add_(0, group, target) / count
    return (target - mean[group]).square().mean().item()


def fit_scores(
    encoding,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    target: torch.Tensor,
    steps: int = 200,
    lr: float = 0.05,
    seed: int = 0,
):
    """Train ``encoding`` (a "qk" plug-in taking coordinates ``(N, n_axes)``: :class:`ComRoPE`, :class:`LieRE`,
    :class:`CayleySTRING` or :class:`posenc.nd_rope.NDRoPE` without a coordinates table) and one content vector
    ``c`` (used as query and key) with Adam so that the normalised score ``<R(p_q) c, R(p_k) c> / |c|^2`` of each
    pair matches ``target`` ``(N,)`` in mean squared error; chapter 7's :func:`posenc.nd_rope.fit_score_map` for any
    pair of positions, so that non-relative targets can be asked for.

    The content starts from the generator seed ``seed`` (the encoding keeps its own initialisation). Returns
    ``(loss, score (N,))`` of the final parameters; the encoding is trained in place.
    """
    _check_pairs(query_positions, key_positions, target)
    require_int("steps", steps, minimum=1)
    if not isinstance(encoding, (_LearnedGenerators, NDRoPE)):
        raise TypeError(f"encoding must be a ComRoPE, LieRE, CayleySTRING or NDRoPE, got {type(encoding).__name__}")
    head_dim = encoding.head_dim if isinstance(encoding, _LearnedGenerators) else 2 * encoding.weights.shape[0]
    content = nn.Parameter(torch.randn(head_dim, generator=torch.Generator().manual_seed(seed)))
    optimizer = torch.optim.Adam([*encoding.parameters(), content], lr=lr)
    # the maps are orthogonal and shared by queries and keys, so R(p) c is computed once per distinct position
    # (the pairs of an N x N grid of pairs use only N positions)
    unique, index = torch.unique(torch.cat((query_positions, key_positions)), dim=0, return_inverse=True)
    query_index, key_index = index[: len(target)], index[len(target) :]

    def scores():
        vectors = content.expand(len(unique), -1)[None, None]
        q, k = encoding.encode_qk(vectors, vectors, unique, unique)
        return (q[0, 0, query_index] * k[0, 0, key_index]).sum(-1) / content.square().sum()

    for _ in range(steps):
        loss = (scores() - target).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        final = scores()
    return (final - target).square().mean().item(), final


__all__ = [
    "COMROPE_VARIANTS",
    "skew",
    "cayley",
    "block_diagonal_generators",
    "ComRoPE",
    "LieRE",
    "CayleySTRING",
    "fold_into_projection",
    "max_commutator_norm",
    "logits_at_offset",
    "relative_spread",
    "relative_floor",
    "fit_scores",
]
