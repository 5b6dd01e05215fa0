"""Synthetic copying tasks where order matters, at any length.

Every task copies tokens: the target at position ``i`` is the input token at a *source* position
``source(i)``, or there is no target at ``i`` (``source(i) = -1``). The source map says what the task needs:

* :class:`CopyBack` (``source(i) = i - offset``): a **relative** task, the same offset at every position;
* :class:`FetchPosition` (``source(i) = position``): an **absolute** task, one fixed position for everyone;
* :class:`CopyAfterMarker` (``source(i)`` = the token after the ``k``-th marker): a **content** task, whose source
  moves with the markers from one sequence to the next, so only counting markers finds it.

Both can be solved causally (the source is never after ``i``), so decoders and encoders train on the same data.
Tokens are i.i.d. uniform over ``0 .. vocab_size - 1``; :meth:`CopyTask.sample` returns ``(inputs, targets,
mask)`` of shape ``(B, L)``, with ``targets = IGNORE_INDEX`` where ``mask`` is False.
"""

from __future__ import annotations

import torch

from .._checks import require_int

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy skips these targets by default


class CopyTask:
    """Base class: subclasses define :meth:`_source_of` and the attributes ``name``, ``order`` and ``first_target``
    (the first position that has a target)."""

    name = "copy"
    order = "absolute"  # "absolute" or "relative": what the source map depends on
    first_target = 0

    def min_length(self) -> int:
        """The shortest sequence that has at least one target."""
        return self.first_target + 1

    def sources(self, length: int, device=None) -> torch.Tensor:
        """``(length,)`` int64: the source position of each target, ``-1`` where there is no target."""
        self._check_length(length)
        return self._source_of(torch.arange(length, device=device))

    def _source_of(self, positions: torch.Tensor) -> torch.Tensor:
        """The source of the target at each of ``positions`` ``(L,)``, ``-1`` where there is none."""
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
        self.offset = self.first_target = require_int("offset", offset, minimum=1)
        self.name = f"copy {offset} back"

    def _source_of(self, positions):
        return (positions - self.offset).clamp(min=-1)


class FetchPosition(CopyTask):
    """Output the token at absolute position ``position``: ``target[i] = x[position]`` for ``i >= position``."""

    order = "absolute"

    def _source_of(self, positions):
        return torch.where(positions >= self.position, self.position, -1)

    def __init__(self, position: int = 1):
        self.position = self.first_target = require_int("position", position, minimum=0)
        self.name = f"fetch position {position}"


class CopyAfterMarker(CopyTask):
    """Copy the token that follows the ``k``-th occurrence of a marker: ``target[i] = x[s]`` for ``i >= s``, where
    ``s - 1`` is the position of the ``k``-th marker; no target before ``s``.

    The marker is token ``vocab_size - 1``; the other tokens are i.i.d. uniform over ``0 .. vocab_size - 2``. Each
    sequence has ``n = clamp(Binomial(L - 1, rate), k, L // 2)`` markers at uniformly random positions in
    ``0 .. L - 2``, no two adjacent (so the token after a marker is never a marker): their number and places change
    from sequence to sequence, and at every length the ``k``-th marker sits near ``k / rate`` on average. The
    sources depend on the content (:meth:`sources_of`), not on the length alone.
    """

    order = "content"

    def __init__(self, k: int = 2, rate: float = 0.25):
        self.k = require_int("k", k, minimum=1)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 1:
            raise ValueError(f"rate must be a number in (0, 1), the chance of a marker at each position, got {rate!r}")
        self.rate = float(rate)
        self.first_target = 2 * self.k - 1  # the earliest possible: markers at 0, 2, .., 2k - 2
        self.name = f"copy after marker {self.k}"

    def min_length(self) -> int:
        return 2 * self.k  # k markers, none adjacent, none last

    def sources(self, length: int, device=None) -> torch.Tensor:
        raise TypeError(f"the sources of {self.name!r} depend on the tokens: use sources_of(inputs)")

    def marker(self, vocab_size: int) -> int:
        """The marker token: ``vocab_size - 1``."""
        return require_int("vocab_size", vocab_size, minimum=3) - 1

    def sources_of(self, inputs: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """``(B, L)`` int64: the source of each target of ``inputs`` ``(B, L)``, ``-1`` where there is none (before the
        token after the ``k``-th marker, or everywhere in a sequence with fewer than ``k`` markers before its end)."""
        if not isinstance(inputs, torch.Tensor) or inputs.ndim != 2:
            raise ValueError(f"inputs must be a (B, L) tensor of tokens, got {inputs!r}")
        is_marker = inputs == self.marker(vocab_size)
        count = is_marker.long().cumsum(-1)
        kth = is_marker & (count == self.k)  # one True per row at most
        found = kth[:, :-1].any(-1)
        source = kth.float().argmax(-1) + 1  # (B,)
        positions = torch.arange(inputs.shape[-1], device=inputs.device)
        valid = found[:, None] & (positions[None, :] >= source[:, None])
        return torch.where(valid, source[:, None], torch.full_like(inputs, -1))

    def sample(self, batch_size: int, length: int, vocab_size: int, generator: torch.Generator, device=None):
        """As :meth:`CopyTask.sample`; every sequence has at least ``k`` markers, so every row has targets."""
        require_int("batch_size", batch_size, minimum=1)
        marker = self.marker(vocab_size)
        self._check_length(length)
        if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
            raise TypeError(f"generator must be a CPU torch.Generator, got {generator!r}")
        inputs = torch.randint(vocab_size - 1, (batch_size, length), generator=generator)
        counts = (
            torch.binomial(
                torch.full((batch_size,), float(length - 1)), torch.full((batch_size,), self.rate), generator=generator
            )
            .long()
            .clamp(self.k, length // 2)
        )
        for row, n in enumerate(counts.tolist()):
            # n of the L - n slots, spread apart by 0, 1, .., n - 1: non-adjacent positions in 0 .. L - 2, uniformly
            slots = torch.randperm(length - n, generator=generator)[:n].sort().values
            inputs[row, slots + torch.arange(n)] = marker
        inputs = inputs.to(device)
        source = self.sources_of(inputs, vocab_size)
        mask = source >= 0
        targets = inputs.gather(-1, source.clamp(min=0)).masked_fill(~mask, IGNORE_INDEX)
        return inputs, targets, mask


def position_blind_accuracy(
    task: CopyTask, inputs: torch.Tensor, vocab_size: int, causal: bool = False, per_position: bool = False
):
    """The best expected accuracy of a predictor that sees only its own token and a *multiset* of tokens.

    ``causal=False``: the multiset of the whole sequence, which is all a bidirectional transformer without
    positions sees (it is permutation-equivariant, chapter 1). ``causal=True``: the multiset of the prefix
    ``0..i``, all that *one* causal attention layer without positions sees at position ``i`` (its size tells
    ``i``, nothing tells the order inside it).

    With i.i.d. uniform tokens, given the multiset ``S`` (of ``n + 1`` tokens) and the own token ``a``, the other
    tokens are a random arrangement of ``S - {a}``. The target is ``a`` itself with the probability ``alpha``
    that the source is the position itself, otherwise a uniform draw from ``S - {a}``; the best guess is right
    with probability ``max_b alpha [b = a] + (1 - alpha) count_{S-a}(b) / n``. In the bidirectional case the
    position is unknown, so ``alpha`` is the fraction of targets whose source is themselves; in the causal case
    it is 0 or 1 per position. Returns the mean over the targets of ``inputs`` ``(B, L)``, or with
    ``per_position`` a ``(L,)`` tensor (NaN where there is no target).

    For a content task (:class:`CopyAfterMarker`, ``task.order == "content"``) the sources come from the tokens
    (:meth:`CopyAfterMarker.sources_of`) and the source token is never a marker: the non-marker tokens are i.i.d.
    and independent of where the markers are, so the same formula holds with the markers left out of ``S`` (and
    ``n`` counting the other non-marker tokens). The causal ``alpha`` is still the true 0 or 1 of each position, an
    oracle the predictor does not have, so here the value is an upper bound (a ceiling), not an exact optimum.
    """
    length = inputs.shape[-1]
    positions = torch.arange(length, device=inputs.device)
    content = getattr(task, "order", None) == "content"
    if content:
        source = task.sources_of(inputs, vocab_size)  # (B, L)
    else:
        source = task.sources(length, device=inputs.device).expand(inputs.shape[0], length)
    on_target = source >= 0  # (B, L)
    own = torch.nn.functional.one_hot(inputs, vocab_size).float()  # (B, L, V)
    counted = own
    if content:  # the markers never are a source: leave them out of the multiset
        counted = own.clone()
        counted[..., task.marker(vocab_size)] = 0
    if causal:
        seen = counted.cumsum(dim=1)
        alpha = (source == positions).float()[..., None]  # (B, L, 1)
    else:
        seen = counted.sum(dim=1, keepdim=True)
        alpha = (source[on_target] == positions.expand_as(source)[on_target]).float().mean()
    others = (seen.sum(-1, keepdim=True) - counted.sum(-1, keepdim=True)).clamp(min=1)  # tokens besides the own
    best = (alpha * own + (1 - alpha) * (seen - counted) / others).amax(dim=-1)  # (B, L)
    if per_position:
        count = on_target.sum(0)
        mean = (best * on_target).sum(0) / count.clamp(min=1)
        return mean.masked_fill(count == 0, float("nan"))
    return best[on_target].mean().item()


CEILING_LABELS = {False: "ceiling without positions", True: "ceiling of one causal layer"}


def position_blind_ceilings(tasks, lengths, inputs_of, vocab_size: int) -> dict:
    """Both position-blind ceilings (:func:`position_blind_accuracy`, bidirectional and one causal layer) of each
    task at each length: ``{task name: {label: {length: accuracy}}}``, the ``baselines`` a results table takes.

    ``inputs_of(task, length)`` gives the evaluation inputs ``(B, length)`` the models are scored on.
    """
    return {
        task.name: {
            label: {n: position_blind_accuracy(task, inputs_of(task, n), vocab_size, causal=causal) for n in lengths}
            for causal, label in CEILING_LABELS.items()
        }
        for task in tasks
    }


def ceiling(ceilings: dict, task: CopyTask, length: int, *, causal: bool) -> float:
    """One entry of :func:`position_blind_ceilings`: without positions (``causal=False``) or of one causal layer."""
    return ceilings[task.name][CEILING_LABELS[causal]][length]


def _group_elements(group: str):
    """``(elements, cayley)`` of ``group``: the elements as permutation tuples (the identity first) and the
    ``(n, n)`` int64 table ``cayley[a, b] = index of a . b``, where ``(a . b)(x) = b(a(x))``: apply ``a``, then
    ``b``, so a word ``x_1 x_2 ... x_t`` acts as its letters read left to right."""
    from itertools import permutations

    kind, size = group[:1], group[1:]
    if kind not in ("S", "A", "Z") or not size.isdigit() or not 2 <= int(size) <= (6 if kind != "Z" else 60):
        raise ValueError(f"group must be 'S<n>' or 'A<n>' (2 <= n <= 6) or 'Z<n>' (2 <= n <= 60), got {group!r}")
    n = int(size)
    if kind == "Z":  # the cyclic group as rotations of n points
        elements = [tuple((x + shift) % n for x in range(n)) for shift in range(n)]
    else:
        elements = list(permutations(range(n)))  # lexicographic: the identity first
        if kind == "A":
            elements = [p for p in elements if _sign(p) == 1]
    index = {p: i for i, p in enumerate(elements)}
    cayley = torch.tensor([[index[tuple(b[a[x]] for x in range(n))] for b in elements] for a in elements])
    return elements, cayley


def _sign(permutation) -> int:
    seen, sign = set(), 1
    for start in range(len(permutation)):
        length, x = 0, start
        while x not in seen:
            seen.add(x)
            x, length = permutation[x], length + 1
        sign *= -1 if length and length % 2 == 0 else 1
    return sign


class WordProblem(CopyTask):
    """The word problem of a finite group: the state after each letter of a word.

    Position 0 holds a start token (``vocab_size - 1``, no target); every other position ``t`` holds a group
    element ``x_t`` (token = its index, drawn uniformly from the ``n = |G|`` elements) and its target is the running
    product ``s_t = x_1 . x_2 ... x_t`` (:attr:`cayley` gives ``s_t = cayley[s_{t-1}, x_t]``, with ``s_0`` the
    identity, index 0). ``group``: ``"S3"`` (order 6, the smallest non-abelian group), ``"Z6"`` (order 6, abelian:
    the product is a sum mod 6, so the order of the letters does not matter), or any ``"S<n>"``, ``"A<n>"``
    (n <= 6), ``"Z<n>"``. The target depends on every earlier letter and, for a non-abelian group, on their order:
    not a copy of one token, so :meth:`sources` raises; :meth:`states` computes the labels.
    """

    order = "content"
    first_target = 1

    def __init__(self, group: str = "S3"):
        if not isinstance(group, str):
            raise TypeError(f"group must be a str such as 'S3' or 'Z6', got {type(group).__name__}")
        self.group = group
        self.elements, self.cayley = _group_elements(group)
        self.name = f"word problem {group}"

    @property
    def size(self) -> int:
        """``|G|``, the number of elements (and of classes a model chooses from: chance is ``1 / size``)."""
        return len(self.elements)

    @property
    def abelian(self) -> bool:
        return bool((self.cayley == self.cayley.T).all())

    def min_length(self) -> int:
        return 2  # the start token and one letter

    def sources(self, length: int, device=None) -> torch.Tensor:
        raise TypeError(f"the targets of {self.name!r} are products, not copies: use states(letters)")

    def start_token(self, vocab_size: int) -> int:
        """The start token: ``vocab_size - 1`` (``vocab_size`` must leave room for it after the ``size`` letters)."""
        require_int("vocab_size", vocab_size, minimum=2)
        if vocab_size < self.size + 1:
            raise ValueError(
                f"vocab_size must be at least |G| + 1 = {self.size + 1} for {self.group}, got {vocab_size}"
            )
        return vocab_size - 1

    def states(self, letters: torch.Tensor) -> torch.Tensor:
        """The running products of ``letters`` ``(B, T)`` (element indices): ``(B, T)``, ``s_t = s_{t-1} . x_t``."""
        if not isinstance(letters, torch.Tensor) or letters.ndim != 2:
            raise ValueError(f"letters must be a (B, T) tensor of element indices, got {letters!r}")
        table = self.cayley.to(letters.device)
        state = torch.zeros(letters.shape[0], dtype=torch.long, device=letters.device)  # the identity
        out = []
        for t in range(letters.shape[1]):
            state = table[state, letters[:, t]]
            out.append(state)
        return torch.stack(out, dim=1) if out else letters.clone()

    def sample(self, batch_size: int, length: int, vocab_size: int, generator: torch.Generator, device=None):
        """As :meth:`CopyTask.sample`: ``inputs`` the start token then ``length - 1`` uniform letters, ``targets``
        their running products (``IGNORE_INDEX`` at position 0), ``mask`` True from position 1 on."""
        require_int("batch_size", batch_size, minimum=1)
        start = self.start_token(vocab_size)
        self._check_length(length)
        if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
            raise TypeError(f"generator must be a CPU torch.Generator, got {generator!r}")
        letters = torch.randint(self.size, (batch_size, length - 1), generator=generator)
        inputs = torch.cat((torch.full((batch_size, 1), start), letters), dim=1)
        targets = torch.cat((torch.full((batch_size, 1), IGNORE_INDEX), self.states(letters)), dim=1)
        mask = targets != IGNORE_INDEX
        return inputs.to(device), targets.to(device), mask.to(device)


__all__ = [
    "IGNORE_INDEX",
    "CopyTask",
    "CopyBack",
    "FetchPosition",
    "CopyAfterMarker",
    "position_blind_accuracy",
    "CEILING_LABELS",
    "position_blind_ceilings",
    "ceiling",
    "WordProblem",
]
