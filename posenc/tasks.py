"""Synthetic copying tasks where order matters, at any length.

Every task copies tokens: the target at position ``i`` is the input token at a *source* position
``source(i)``, or there is no target at ``i`` (``source(i) = -1``). The source map says what the task needs:

* :class:`CopyBack` (``source(i) = i - offset``): a **relative** task, the same offset at every position;
* :class:`FetchPosition` (``source(i) = position``): an **absolute** task, one fixed position for everyone.

Both can be solved causally (the source is never after ``i``), so decoders and encoders train on the same data.
Tokens are i.i.d. uniform over ``0 .. vocab_size - 1``; :meth:`CopyTask.sample` returns ``(inputs, targets,
mask)`` of shape ``(B, L)``, with ``targets = IGNORE_INDEX`` where ``mask`` is False.
"""
from __future__ import annotations

import torch

from ._checks import require_int

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy skips these targets by default


class CopyTask:
    """Base class: subclasses define :meth:`sources` and the attributes ``name`` and ``order``."""

    name = "copy"
    order = "absolute"  # "absolute" or "relative": what the source map depends on

    def min_length(self) -> int:
        """The shortest sequence that has at least one target."""
        raise NotImplementedError

    def sources(self, length: int, device=None) -> torch.Tensor:
        """``(length,)`` int64: the source position of each target, ``-1`` where there is no target."""
        raise NotImplementedError

    def _check_length(self, length: int) -> int:
        return require_int("length", length, minimum=self.min_length())

    def sample(self, batch_size: int, length: int, vocab_size: int, generator: torch.Generator, device=None):
        """Draw ``batch_size`` sequences of ``length`` tokens with ``generator`` (a CPU ``torch.Generator``).

        The tokens are drawn on the CPU and then moved to ``device``, so one seed gives the same data on every
        device. Returns ``inputs`` (int64), ``targets`` (int64, ``IGNORE_INDEX`` off the mask) and ``mask``
        (bool), each ``(batch_size, length)``.
        """
        require_int("batch_size", batch_size, minimum=1)
        require_int("vocab_size", vocab_size, minimum=2)
        self._check_length(length)
        if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
            raise TypeError(f"generator must be a CPU torch.Generator, got {generator!r}")
        inputs = torch.randint(vocab_size, (batch_size, length), generator=generator).to(device)
        source = self.sources(length, device=inputs.device)
        mask = (source >= 0).expand(batch_size, length)
        targets = inputs[:, source.clamp(min=0)].masked_fill(~mask, IGNORE_INDEX)
        return inputs, targets, mask

    def __repr__(self) -> str:
        return self.name


class CopyBack(CopyTask):
    """Output the token ``offset`` steps back: ``target[i] = x[i - offset]`` for ``i >= offset``."""

    order = "relative"

    def __init__(self, offset: int = 2):
        self.offset = require_int("offset", offset, minimum=1)
        self.name = f"copy {offset} back"

    def min_length(self) -> int:
        return self.offset + 1

    def sources(self, length, device=None):
        self._check_length(length)
        source = torch.arange(length, device=device) - self.offset
        return source.masked_fill(source < 0, -1)


class FetchPosition(CopyTask):
    """Output the token at absolute position ``position``: ``target[i] = x[position]`` for ``i >= position``."""

    order = "absolute"

    def __init__(self, position: int = 1):
        self.position = require_int("position", position, minimum=0)
        self.name = f"fetch position {position}"

    def min_length(self) -> int:
        return self.position + 1

    def sources(self, length, device=None):
        self._check_length(length)
        positions = torch.arange(length, device=device)
        return torch.where(positions >= self.position, self.position, -1)


def position_blind_accuracy(task: CopyTask, inputs: torch.Tensor, vocab_size: int) -> float:
    """The best expected accuracy of a predictor that sees only its own token and the *set* of tokens.

    That is all a bidirectional transformer without positions sees (chapter 1: it is permutation-equivariant).
    With i.i.d. uniform tokens, given the multiset ``S`` of a sequence and the token ``a`` at a random target
    position, the other tokens are a random arrangement of ``S - {a}``. So the target equals ``a`` with the
    probability ``alpha`` that the source is the position itself, and otherwise is a uniform draw from
    ``S - {a}``: the best guess has probability ``max_b alpha [b = a] + (1 - alpha) count_{S-a}(b) / (L - 1)``.
    Returns its mean over the target positions of ``inputs`` ``(B, L)``.
    """
    length = inputs.shape[-1]
    source = task.sources(length, device=inputs.device)
    on_target = source >= 0
    alpha = (source[on_target] == torch.arange(length, device=inputs.device)[on_target]).float().mean()
    own = torch.nn.functional.one_hot(inputs, vocab_size).float()  # (B, L, V)
    others = own.sum(dim=1, keepdim=True) - own  # counts of S - {a}
    best = (alpha * own + (1 - alpha) * others / (length - 1)).amax(dim=-1)  # (B, L)
    return best[:, on_target].mean().item()


__all__ = ["IGNORE_INDEX", "CopyTask", "CopyBack", "FetchPosition", "position_blind_accuracy"]
