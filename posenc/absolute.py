"""Absolute encodings: a vector per position, added to the token embeddings.

Every encoding function takes ``positions`` of shape ``(L,)`` or ``(B, L)`` and returns ``(*P, L, dim)``.
Two measurements help compare them: :func:`consecutive_distances` (how far one step moves the encoding) and
:func:`sinusoidal_dot_product` (the sinusoidal dot product as a function of the offset alone).
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import as_positions, require_int, require_positive_number, require_tensor
from .encodings import PositionalEncoding


def integer_encoding(positions, dim: int, length: int | None = None, dtype=torch.float32) -> torch.Tensor:
    """The position itself in every feature; divided by ``length`` when it is given (normalised form)."""
    require_int("dim", dim, minimum=1)
    positions = as_positions("positions", positions)
    values = positions.to(dtype)
    if length is not None:
        values = values / require_positive_number("length", length)
    return values[..., None].expand(*values.shape, dim)


def binary_encoding(positions, bits: int, dtype=torch.float32, wrap: bool = False) -> torch.Tensor:
    """Bit ``j`` (least significant first) of each integer position: ``(*P, L, bits)`` of zeros and ones.

    ``bits`` bits tell apart ``2**bits`` positions. A position ``>= 2**bits`` is a ValueError, unless
    ``wrap=True``: then the code is that of ``position % 2**bits`` (every bit is periodic).
    """
    require_int("bits", bits, minimum=1)
    if not isinstance(wrap, bool):
        raise TypeError(f"wrap must be True or False, got {type(wrap).__name__}")
    positions = as_positions("positions", positions)
    if positions.is_floating_point():
        raise TypeError(f"positions must be integers for a binary encoding, got dtype {positions.dtype}")
    if positions.device.type != "meta" and positions.numel():
        low, high = int(positions.min()), int(positions.max())
        if low < 0:
            raise ValueError(f"positions must be >= 0 for a binary encoding, got {low}")
        if high >= 2**bits and not wrap:
            raise ValueError(
                f"positions must be < 2**bits = {2**bits} for bits={bits}, got {high} (it would share "
                f"its code with {high % 2**bits}); use more bits, or wrap=True to wrap on purpose"
            )
    powers = 2 ** torch.arange(bits, device=positions.device)
    return ((positions[..., None] // powers) % 2).to(dtype)


def sinusoidal_frequencies(dim: int, base: float = 10_000.0, device=None, dtype=torch.float64) -> torch.Tensor:
    """``omega_i = base^(-2i/dim)`` for ``i`` from 0 to ``dim/2 - 1``: shape ``(dim/2,)``."""
    require_int("dim", dim, minimum=2, even=True)
    require_positive_number("base", base)
    return base ** (-torch.arange(0, dim, 2, device=device, dtype=dtype) / dim)


def sinusoidal_encoding(
    positions, dim: int, base: float = 10_000.0, layout: str = "interleaved", dtype=torch.float32
) -> torch.Tensor:
    """The Transformer's sinusoidal table: ``(*P, L, dim)``.

    ``layout="interleaved"``: ``PE[p, 2i] = sin(p omega_i)``, ``PE[p, 2i+1] = cos(p omega_i)`` (Vaswani et al.);
    ``layout="half"``: all sines first, then all cosines. Angles are computed in float64 (float32 on devices
    without float64) and rounded once to ``dtype``.
    """
    if layout not in ("interleaved", "half"):
        raise ValueError(f"layout must be 'interleaved' or 'half', got {layout!r}")
    positions = as_positions("positions", positions)
    wide = _angle_dtype(positions.device)
    omega = sinusoidal_frequencies(dim, base, device=positions.device, dtype=wide)
    angles = positions[..., None].to(wide) * omega
    if layout == "interleaved":
        table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    else:
        table = torch.cat((angles.sin(), angles.cos()), dim=-1)
    return table.to(dtype)


def sinusoidal_dot_product(offsets, dim: int, base: float = 10_000.0, chunk: int = 1 << 22) -> torch.Tensor:
    """``PE(p) @ PE(p + k) = sum_i cos(omega_i k)`` for each offset ``k``: shape of ``offsets``, float64.

    The dot product of two sinusoidal encodings depends on their offset only, so this needs no positions.
    Offsets may be huge (a million of them): the ``(K, dim/2)`` cosines are summed ``chunk`` elements at a time.
    float32 on devices without float64.
    """
    require_int("chunk", chunk, minimum=1)
    offsets = as_positions("offsets", offsets)
    wide = _angle_dtype(offsets.device)
    omega = sinusoidal_frequencies(dim, base, device=offsets.device, dtype=wide)
    flat = offsets.reshape(-1).to(wide)
    rows = max(1, chunk // omega.numel())
    sums = [torch.cos(part[:, None] * omega).sum(-1) for part in flat.split(rows)]
    return torch.cat(sums).reshape(offsets.shape)


def consecutive_distances(encodings: torch.Tensor) -> torch.Tensor:
    """Length of each step ``||E[p + 1] - E[p]||`` along the position axis: ``(*P, L, dim) -> (*P, L - 1)``.

    Computed in the input's floating dtype (integers and bools are promoted to float32).
    """
    require_tensor("encodings", encodings)
    if encodings.ndim < 2 or encodings.shape[-2] < 2:
        raise ValueError(f"encodings must have shape (*P, L, dim) with L >= 2, got shape {tuple(encodings.shape)}")
    if not encodings.is_floating_point():
        encodings = encodings.to(torch.float32)
    return (encodings[..., 1:, :] - encodings[..., :-1, :]).norm(dim=-1)


def _angle_dtype(device) -> torch.dtype:
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


class LearnedPositionalEmbedding(nn.Module):
    """A trainable table of ``max_positions`` vectors: ``forward(positions) -> (*P, L, dim)``.

    Positions must be integers in ``[0, max_positions)``; a longer sequence is an error, not a silent wrap.
    """

    def __init__(self, max_positions: int, dim: int, init_std: float = 0.02):
        super().__init__()
        require_int("max_positions", max_positions, minimum=1)
        require_int("dim", dim, minimum=1)
        self.table = nn.Parameter(torch.randn(max_positions, dim) * init_std)

    def forward(self, positions) -> torch.Tensor:
        positions = as_positions("positions", positions, device=self.table.device)
        if positions.is_floating_point():
            raise TypeError(f"positions must be integers for a learned table, got dtype {positions.dtype}")
        if positions.device.type != "meta" and positions.numel():
            low, high = int(positions.min()), int(positions.max())
            if low < 0 or high >= self.table.shape[0]:
                raise ValueError(
                    f"positions must lie in [0, {self.table.shape[0]}) for this table, got range [{low}, {high}]"
                )
        return self.table[positions]


class SinusoidalInput(PositionalEncoding):
    """The sinusoidal table added to the token embeddings: an "input" plug-in."""

    kind = "input"

    def __init__(self, dim: int, base: float = 10_000.0):
        super().__init__()
        self.dim, self.base = dim, base

    def encode_input(self, x, positions):
        return x + sinusoidal_encoding(positions, self.dim, self.base, dtype=x.dtype).to(x.device)


class LearnedInput(PositionalEncoding):
    """A learned table added to the token embeddings: an "input" plug-in."""

    kind = "input"

    def __init__(self, max_positions: int, dim: int):
        super().__init__()
        self.table = LearnedPositionalEmbedding(max_positions, dim)

    def encode_input(self, x, positions):
        return x + self.table(positions).to(x.dtype)
