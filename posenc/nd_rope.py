"""RoPE for positions with several coordinates (images, video): axial and mixed frequencies, and the Lie view.

Pair ``j`` of a head turns by the angle ``<f_j, p>``, where ``p`` is the position (one coordinate per axis) and
``f_j`` the pair's frequency vector, a row of ``frequencies``. Because the angle is linear in ``p``, the score
between a query at ``p`` and a key at ``p'`` depends on ``p' - p`` only, exactly as in 1-D RoPE.

* axial (RoPE-Axial): the pairs are split into ``n_axes`` equal groups and group ``a`` turns with coordinate
  ``a`` alone, with the 1-D RoPE frequencies of a head of size ``head_dim / n_axes``;
* mixed (RoPE-Mixed, Heo et al. 2024): every pair turns with a mixture of the coordinates, ``f_j`` pointing in
  any direction; usually learned. Here it starts as axial turned by one random rotation (uniform on the rotation
  group; in 2-D: one uniformly random angle, Heo et al.'s initialisation).

Shapes used throughout:

* ``positions``: ``(L, n_axes)`` or ``(B, L, n_axes)``, integer or real; axis order is the caller's choice
  (:func:`grid_positions` gives ``(row, column)`` for an image);
* ``frequencies``: ``(P, n_axes)`` with ``P = head_dim / 2`` pairs;
* ``x``: ``(..., L, D)`` as in :mod:`posenc.rope` (``(B, H, L, D)`` for heads).

The Lie view writes the rotation at ``p`` as ``exp(sum_a p_a G_a)`` with one skew-symmetric generator per axis
(:func:`posenc.generators.rope_generators`, :func:`posenc.group_encodings.multi_parameter_group`): axial and
mixed RoPE are the case where the generators are 2x2 blocks on shared planes, so they commute; generators that do
not commute (LieRE, or turning overlapping planes one axis after the other) lose the relative property.
"""

from __future__ import annotations

import torch

from ._checks import (
    as_coordinates,
    check_frequencies,
    check_head_dim,
    check_layout,
    check_seq_dim,
    coordinates_table,
    require_int,
    require_positive_number,
    require_tensor,
)
from .encodings import PositionalEncoding
from .rope import apply_rope
from .rope_types import rope_frequencies

VARIANTS = ("axial", "mixed")
DEFAULT_BASE = 100.0  # Heo et al. use 100 for axial (10 for mixed) on ViT patch grids, short along each axis


def grid_positions(*sizes: int, device=None) -> torch.Tensor:
    """Every point of a grid of shape ``sizes``, row-major: ``(prod(sizes), len(sizes))`` int64.

    ``grid_positions(H, W)[i] = (row, column)`` of the ``i``-th pixel of a flattened ``H x W`` image.
    """
    if not sizes:
        raise ValueError("sizes must name at least one axis, e.g. grid_positions(16, 16)")
    for axis, size in enumerate(sizes):
        require_int(f"sizes[{axis}]", size, minimum=1)
    axes = torch.meshgrid(*(torch.arange(size, device=device) for size in sizes), indexing="ij")
    return torch.stack([axis.flatten() for axis in axes], dim=-1)


def _check_head(head_dim: int, n_axes: int) -> None:
    require_int("n_axes", n_axes, minimum=1)
    check_head_dim(head_dim)
    if head_dim % (2 * n_axes):
        raise ValueError(
            f"head_dim must be a multiple of 2 * n_axes = {2 * n_axes} (equal pairs per axis), got {head_dim}"
        )


def directed_frequencies(head_dim: int, directions: torch.Tensor, base: float = DEFAULT_BASE) -> torch.Tensor:
    """Frequencies ``(head_dim / 2, n_axes)``: pair group ``a`` has the 1-D RoPE magnitudes along ``directions[:, a]``.

    ``directions``: ``(n_axes, n_axes)``, one direction per column; the identity gives axial RoPE.
    """
    require_tensor("directions", directions)
    if directions.ndim != 2 or directions.shape[0] != directions.shape[1]:
        raise ValueError(f"directions must be a square matrix (n_axes, n_axes), got {tuple(directions.shape)}")
    n_axes = directions.shape[0]
    _check_head(head_dim, n_axes)
    require_positive_number("base", base)
    magnitudes, _ = rope_frequencies(head_dim // n_axes, {"rope_theta": float(base)}, device=directions.device)
    # (n_axes groups, pairs per group, n_axes coordinates) -> (P, n_axes), group by group
    per_group = magnitudes[None, :, None] * directions.T.to(magnitudes.dtype)[:, None, :]
    return per_group.reshape(head_dim // 2, n_axes)


def axial_frequencies(head_dim: int, n_axes: int = 2, base: float = DEFAULT_BASE, device=None) -> torch.Tensor:
    """Axial RoPE: the first ``P / n_axes`` pairs turn with axis 0 only, the next with axis 1, ... ``(P, n_axes)``."""
    require_int("n_axes", n_axes, minimum=1)
    return directed_frequencies(head_dim, torch.eye(n_axes, device=device), base)


def mixed_frequencies(
    head_dim: int, n_axes: int = 2, base: float = DEFAULT_BASE, generator=None, device=None
) -> torch.Tensor:
    """RoPE-Mixed initialisation ``(P, n_axes)``: axial frequencies turned by one random rotation.

    The rotation is uniform (Haar) on the rotation group SO(n_axes), determinant +1, never a reflection; in 2-D it
    is a turn by one uniformly random angle, as Heo et al. initialise RoPE-Mixed.
    ``generator``: a ``torch.Generator`` for reproducible draws (the global RNG otherwise).
    """
    require_int("n_axes", n_axes, minimum=1)
    gaussian = torch.randn(n_axes, n_axes, generator=generator, dtype=torch.float64)
    orthogonal, triangular = torch.linalg.qr(gaussian)
    orthogonal = orthogonal * torch.sign(torch.diagonal(triangular))  # uniform (Haar) among orthogonal matrices
    if torch.linalg.det(orthogonal) < 0:  # a reflection: flipping one column gives a rotation, uniform on SO(n)
        orthogonal[:, -1] = -orthogonal[:, -1]
    return directed_frequencies(head_dim, orthogonal.to(device=device, dtype=torch.float32), base)


def nd_rope_angles(positions, frequencies: torch.Tensor) -> torch.Tensor:
    """Angle of every pair at every position, ``<f_j, p>``: ``(*B, L, n_axes)`` -> ``(*B, L, P)``.

    float32, or float64 when ``positions`` or ``frequencies`` are float64, whatever narrower type they have.
    """
    frequencies = check_frequencies(frequencies)
    positions = as_coordinates("positions", positions, frequencies.shape[-1], frequencies.device)
    wide = torch.float64 if torch.float64 in (positions.dtype, frequencies.dtype) else torch.float32
    # an explicit product and sum (not a matmul, which may run in TF32 or bf16) keeps the angles exact
    products = positions.to(device=frequencies.device, dtype=wide)[..., None, :] * frequencies.to(wide)
    return products.sum(-1)


def nd_rope_cos_sin(positions, frequencies: torch.Tensor):
    """Half-size tables ``(cos, sin)``, each ``(*B, L, P)``, typed as :func:`nd_rope_angles`, for
    :func:`posenc.apply_rope`."""
    angles = nd_rope_angles(positions, frequencies)
    return angles.cos(), angles.sin()


def rotate_nd(
    x: torch.Tensor,
    positions: torch.Tensor | list[list[float]],
    frequencies: torch.Tensor,
    layout: str = "half",
    *,
    seq_dim: int = -2,
) -> torch.Tensor:
    """N-D RoPE in one call: ``x`` rotated at ``positions`` with the pairs' frequency vectors.

    Args:
        x: ``(..., L, D)`` with ``seq_dim=-2`` (e.g. ``(B, H, L, D)``), or ``(..., L, H, D)`` with ``seq_dim=-3``
            (``(B, L, H, D)``); real floating point.
        positions: coordinates ``(L, n_axes)`` or ``(B, L, n_axes)``.
        frequencies: ``(P, n_axes)`` with ``D >= 2 P`` (the first ``2 P`` features rotate, the rest pass through).
        layout: ``"half"`` or ``"interleaved"`` pairs.
        seq_dim: the sequence axis of ``x``, -2 or -3.

    Returns:
        ``x`` rotated, with its shape and dtype (the angles in float32, or float64 for float64 positions or
        frequencies).

    Example:
        >>> x = torch.randn(1, 16, 4, 32)                                   # (B, L, H, D): a 4 x 4 grid
        >>> rotate_nd(x, grid_positions(4, 4), axial_frequencies(32), seq_dim=-3).shape
        torch.Size([1, 16, 4, 32])
    """
    require_tensor("x", x)
    axis = check_seq_dim(seq_dim, x.ndim)
    frequencies = check_frequencies(frequencies)
    positions = as_coordinates("positions", positions, frequencies.shape[-1], x.device)
    length = positions.shape[-2]
    if x.ndim >= 2 and x.shape[axis] != length:
        message = (
            f"positions have {length} rows but x {tuple(x.shape)} has sequence length {x.shape[axis]} on "
            f"axis seq_dim={axis}"
        )
        other = -3 if axis == -2 else -2
        if x.ndim >= 3 and x.shape[other] == length:
            message += f"; axis {other} has length {length}: pass seq_dim={other}"
        raise ValueError(message)
    cos, sin = nd_rope_cos_sin(positions, frequencies.to(x.device))
    return apply_rope(x, cos, sin, layout, seq_dim=axis)


def mrope_frequencies(
    head_dim: int, sections, base: float = 10_000.0, interleaved: bool = False, device=None
) -> torch.Tensor:
    """M-RoPE frequency table ``(head_dim / 2, len(sections))``: pair ``j`` turns with one axis at ``theta_j``.

    ``theta_j`` is the 1-D RoPE ladder of the *whole* head (``rope_frequencies(head_dim)``). ``sections`` gives the
    number of pairs per axis (Qwen2-VL: ``(16, 24, 24)`` for time, height, width at ``head_dim = 128``) and must
    sum to ``head_dim / 2``. ``interleaved=False``: the sections are contiguous, in order (Qwen2-VL, Qwen2.5-VL),
    so the last axis gets the slowest pairs. ``interleaved=True``: pair ``j`` with ``j % 3 == a`` (``a = 1, 2``)
    and ``j < 3 * sections[a]`` belongs to axis ``a``, every other pair to axis 0 (Qwen3-VL; three axes only).
    """
    check_head_dim(head_dim)
    require_positive_number("base", base)
    sections = [int(section) for section in sections] if isinstance(sections, (list, tuple)) else sections
    if not isinstance(sections, list) or not sections or any(section < 0 for section in sections):
        raise ValueError(f"sections must be a list of pair counts per axis, e.g. [16, 24, 24], got {sections!r}")
    if sum(sections) != head_dim // 2:
        raise ValueError(
            f"sections must sum to head_dim / 2 = {head_dim // 2} pairs, got {sections} (sum {sum(sections)})"
        )
    if interleaved and len(sections) != 3:
        raise ValueError(f"interleaved=True needs three sections (time, height, width), got {sections}")
    magnitudes, _ = rope_frequencies(head_dim, {"rope_theta": float(base)}, device=device)
    pairs = torch.arange(head_dim // 2, device=device)
    if interleaved:
        axis = torch.zeros_like(pairs)
        for a in (1, 2):
            axis[(pairs % 3 == a) & (pairs < 3 * sections[a])] = a
    else:
        axis = torch.repeat_interleave(
            torch.arange(len(sections), device=device), torch.tensor(sections, device=device)
        )
    table = torch.zeros(head_dim // 2, len(sections), dtype=magnitudes.dtype, device=device)
    table[pairs, axis] = magnitudes
    return table


def mrope_positions(segments, device=None) -> torch.Tensor:
    """M-RoPE positions ``(L, 3)`` (time, height, width) of a sequence of text runs and images, as Qwen2-VL.

    ``segments``: a list whose items are an ``int`` (that many text tokens) or a pair ``(h, w)`` (an image of
    ``h x w`` tokens after patch merging, row-major). Text token ``i`` of the running count sits at ``(i, i, i)``;
    an image starting at index ``s`` puts patch ``(r, c)`` at ``(s, s + r, s + c)``, and the text after it
    continues at ``s + max(h, w)``.
    """
    if not isinstance(segments, (list, tuple)):
        raise TypeError(f"segments must be a list of ints (text runs) and (h, w) pairs (images), got {segments!r}")
    chunks, start = [], 0
    for index, segment in enumerate(segments):
        if isinstance(segment, int) and not isinstance(segment, bool):
            require_int(f"segments[{index}]", segment, minimum=1)
            run = torch.arange(segment, device=device) + start
            chunks.append(run[:, None].expand(-1, 3))
            start += segment
        elif isinstance(segment, (list, tuple)) and len(segment) == 2:
            height, width = segment
            grid = grid_positions(1, height, width, device=device)
            chunks.append(grid + start)
            start += max(height, width)
        else:
            raise TypeError(f"segments[{index}] must be an int (text run) or an (h, w) pair (image), got {segment!r}")
    if not chunks:
        raise ValueError("segments must not be empty")
    return torch.cat(chunks)


def sincos_2d_encoding(positions, dim: int, base: float = 10_000.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The fixed 2-D sin-cos code of ViT/MAE, added to the patch embeddings: ``(L, 2)`` -> ``(L, dim)``.

    Each coordinate gets a 1-D sinusoidal code of width ``dim / 2`` with frequencies ``base^(-i / (dim / 4))``,
    laid out as ``[sin(p_0 w) | cos(p_0 w) | sin(p_1 w) | cos(p_1 w)]``; computed in float64, then cast.
    """
    require_int("dim", dim, minimum=4)
    if dim % 4:
        raise ValueError(f"dim must be a multiple of 4 (sin and cos for each of 2 axes), got {dim}")
    require_positive_number("base", base)
    positions = as_coordinates("positions", positions, 2)
    if positions.ndim != 2:
        raise ValueError(f"positions must have shape (L, 2), got {tuple(positions.shape)}")
    quarter = dim // 4
    omega = torch.arange(quarter, dtype=torch.float64, device=positions.device) / quarter
    omega = 1.0 / float(base) ** omega  # (dim/4,)
    first, second = (positions[:, axis].to(torch.float64)[:, None] * omega for axis in (0, 1))
    return torch.cat([first.sin(), first.cos(), second.sin(), second.cos()], dim=1).to(dtype)


def indexed_coordinates(coordinates: torch.Tensor, positions) -> torch.Tensor:
    """``coordinates[positions]``: rows ``(*B, L, n)`` of a coordinates table ``(N, n)`` picked by integer indices
    ``(L,)`` or ``(B, L)`` (ValueError for other shapes, float indices or indices outside ``[0, N)``)."""
    positions = torch.as_tensor(positions, device=coordinates.device)
    if positions.is_floating_point() or positions.ndim not in (1, 2):
        raise ValueError(
            f"positions must be integer indices (L,) or (B, L) into coordinates, got "
            f"dtype {positions.dtype} and shape {tuple(positions.shape)}"
        )
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= len(coordinates)):
        raise ValueError(f"positions must index coordinates, i.e. lie in [0, {len(coordinates)})")
    return coordinates[positions]


class NDRoPE(PositionalEncoding):
    """N-D RoPE as a plug-in "qk" encoding for :func:`posenc.attention` (axial or mixed).

    Positions reach :meth:`encode_qk` either as coordinates ``(L, n_axes)`` / ``(B, L, n_axes)``, or, when the
    module holds a table ``coordinates`` ``(N, n_axes)`` (e.g. :func:`grid_positions`), as integer indices
    ``(L,)`` / ``(B, L)`` into it: that is what :func:`posenc.attention` passes (token ``i`` -> pixel ``i``).

    ``learnable`` (default: True for mixed, False for axial) makes the frequencies trainable. A learnable axial
    encoding stays axial: only each pair's speed along its own axis is trained (the other entries are masked).
    ``seq_dim``: the sequence axis of ``q`` and ``k``, -2 for ``(B, H, L, D)`` (as :func:`posenc.attention` passes
    them) or -3 for ``(B, L, H, D)``.
    """

    weights: torch.Tensor  # (P, n_axes) frequencies: a parameter when learnable, else a buffer
    mask: torch.Tensor  # (P, n_axes): which entries are trained
    coordinates: torch.Tensor | None  # (N, n_axes): the table integer positions index, or None

    kind = "qk"
    _fixed_dtype_buffers = ("weights", "coordinates")  # learnable weights are a Parameter: they follow the model

    def __init__(
        self,
        head_dim: int,
        n_axes: int = 2,
        variant: str = "axial",
        base: float = DEFAULT_BASE,
        coordinates: torch.Tensor | None = None,
        learnable: bool | None = None,
        layout: str = "half",
        generator: torch.Generator | None = None,
        seq_dim: int = -2,
    ) -> None:
        super().__init__()
        if seq_dim not in (-2, -3):
            raise ValueError(f"seq_dim must be -2 ((B, H, L, D)) or -3 ((B, L, H, D)), got {seq_dim!r}")
        self.seq_dim = seq_dim
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.variant, self.layout = variant, check_layout(layout)
        if variant == "axial":
            initial = axial_frequencies(head_dim, n_axes, base)
            mask = axial_frequencies(head_dim, n_axes, base) != 0
        else:
            initial = mixed_frequencies(head_dim, n_axes, base, generator=generator)
            mask = torch.ones_like(initial, dtype=torch.bool)
        self.register_buffer("mask", mask, persistent=False)
        learnable = variant == "mixed" if learnable is None else learnable
        if learnable:
            self.weights = torch.nn.Parameter(initial)
        else:
            self.register_buffer("weights", initial, persistent=True)
        self.register_buffer("coordinates", coordinates_table(coordinates, n_axes), persistent=False)

    @property
    def frequencies(self) -> torch.Tensor:
        """The frequency table ``(P, n_axes)`` in use (differentiable when learnable)."""
        return self.weights * self.mask

    @property
    def learnable(self) -> bool:
        return isinstance(self.weights, torch.nn.Parameter)

    def coordinates_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Coordinates ``(*B, L, n_axes)`` of ``positions`` (indices into ``coordinates`` when it is set)."""
        if self.coordinates is None:
            return as_coordinates("positions", positions, self.frequencies.shape[-1], self.frequencies.device)
        return indexed_coordinates(self.coordinates, positions)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x`` ``(..., L, D)`` (``(..., L, H, D)`` with ``seq_dim=-3``) rotated at ``positions`` (see the class
        docstring); same shape and dtype."""
        return rotate_nd(x, self.coordinates_of(positions), self.frequencies, self.layout, seq_dim=self.seq_dim)

    def encode_qk(
        self, q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q`` ``(B, H, Lq, D)`` and ``k`` ``(B, H, Lk, D)`` (or ``(B, L, H, D)`` with ``seq_dim=-3``) rotated at
        their positions: ``(q_rot, k_rot)``, shaped and typed like ``q`` and ``k``."""
        return self.rotate(q, q_positions), self.rotate(k, k_positions)

    def extra_repr(self) -> str:
        return (
            f"variant={self.variant!r}, pairs={self.weights.shape[0]}, n_axes={self.weights.shape[1]}, "
            f"layout={self.layout!r}, learnable={self.learnable}, seq_dim={self.seq_dim}"
        )


def fit_score_map(
    variant: str,
    target: torch.Tensor,
    offsets: torch.Tensor,
    head_dim: int = 32,
    base: float = DEFAULT_BASE,
    steps: int = 200,
    lr: float = 0.05,
    seed: int = 0,
):
    """Train a learnable :class:`NDRoPE` table and one content vector ``q`` (used as query and key) with Adam so that
    the normalised score ``<R(0) q, R(o) q> / |q|^2`` of a query at the origin against a key at each offset ``o``
    matches ``target`` in mean squared error.

    ``offsets``: ``(N, n_axes)``; ``target``: ``(N,)``. The frequencies start from the generator seed ``seed``, the
    content from ``seed + 1``. Returns ``(loss, score (N,), frequencies (P, n_axes), content (head_dim,))``.
    """
    require_tensor("target", target)
    require_tensor("offsets", offsets)
    if offsets.ndim != 2:
        raise ValueError(f"offsets must have shape (N, n_axes), got {tuple(offsets.shape)}")
    offsets = as_coordinates("offsets", offsets, offsets.shape[-1])
    if target.shape != offsets.shape[:1]:
        raise ValueError(f"target must have shape (N,) = ({offsets.shape[0]},), got {tuple(target.shape)}")
    require_int("steps", steps, minimum=1)
    encoding = NDRoPE(
        head_dim,
        n_axes=offsets.shape[-1],
        variant=variant,
        base=base,
        learnable=True,
        generator=torch.Generator().manual_seed(seed),
    )
    content = torch.nn.Parameter(torch.randn(head_dim, generator=torch.Generator().manual_seed(seed + 1)))
    optimizer = torch.optim.Adam([*encoding.parameters(), content], lr=lr)
    origin = torch.zeros(1, offsets.shape[-1], dtype=offsets.dtype)
    for _ in range(steps):
        score = (encoding.rotate(content[None], origin) @ encoding.rotate(content.expand(len(offsets), -1), offsets).T)[
            0
        ]
        score = score / content.square().sum()
        loss = (score - target).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():  # the score and loss of the final parameters
        score = (encoding.rotate(content[None], origin) @ encoding.rotate(content.expand(len(offsets), -1), offsets).T)[
            0
        ]
        score = score / content.square().sum()
        loss = (score - target).square().mean()
    return loss.item(), score, encoding.frequencies.detach(), content.detach()


__all__ = [
    "VARIANTS",
    "grid_positions",
    "directed_frequencies",
    "axial_frequencies",
    "mixed_frequencies",
    "nd_rope_angles",
    "nd_rope_cos_sin",
    "rotate_nd",
    "mrope_frequencies",
    "mrope_positions",
    "sincos_2d_encoding",
    "fit_score_map",
    "indexed_coordinates",
    "NDRoPE",
]
