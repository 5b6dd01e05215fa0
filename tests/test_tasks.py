"""posenc.lab.tasks: the order tasks (copy back, fetch a position) and the content-counting task (copy the token
after the k-th marker), and their position-blind ceilings."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.lab import tasks as order_tasks
from posenc.lab.tasks import IGNORE_INDEX, CopyBack, FetchPosition, position_blind_accuracy

VOCAB = 8
MARKER = VOCAB - 1


def _sample(task, batch=64, length=16, seed=0):
    return task.sample(batch, length, VOCAB, torch.Generator().manual_seed(seed))


def _slow_source(row, k):
    """Scan the row: the position after the k-th marker, or None."""
    seen = 0
    for position, token in enumerate(row.tolist()):
        if token == MARKER:
            seen += 1
            if seen == k:
                return position + 1 if position + 1 < len(row) else None
    return None


@pytest.mark.parametrize("k", [1, 2, 3])
def test_labels_copy_the_token_after_the_kth_marker(k):
    task = order_tasks.CopyAfterMarker(k=k)
    inputs, targets, mask = _sample(task, length=20, seed=k)
    for row in range(inputs.shape[0]):
        source = _slow_source(inputs[row], k)
        assert source is not None  # every sequence has k markers before its last token
        for i in range(inputs.shape[1]):
            if i >= source:
                assert mask[row, i] and targets[row, i] == inputs[row, source]
            else:
                assert not mask[row, i] and targets[row, i] == order_tasks.IGNORE_INDEX
    assert torch.equal(task.sources_of(inputs, VOCAB) >= 0, mask)


def test_markers_are_placed_as_documented():
    task = order_tasks.CopyAfterMarker(k=2, rate=0.25)
    inputs, _, _ = _sample(task, batch=256, length=32)
    is_marker = inputs == MARKER
    counts = is_marker.sum(-1)
    assert bool((counts >= 2).all()) and bool((counts <= 16).all())
    assert not bool((is_marker[:, 1:] & is_marker[:, :-1]).any())  # never two markers in a row
    assert not bool(is_marker[:, -1].any())  # never last: a token always follows
    # Binomial(31, 0.25): mean 7.75, standard deviation 2.4; the mean of 256 draws is within 0.6 of it
    # (four standard errors of 0.15)
    assert abs(counts.float().mean().item() - 31 * 0.25) < 0.6
    # the other tokens are uniform over 0 .. V - 2
    assert set(inputs[~is_marker].unique().tolist()) == set(range(VOCAB - 1))


def test_the_source_moves_with_the_markers():
    """Not a function of the position: the k-th marker sits at many places, and it is not the last marker (the
    shortcut 'copy after the last marker') in most sequences."""
    task = order_tasks.CopyAfterMarker(k=2)
    inputs, _, _ = _sample(task, batch=256, length=16)
    first_target = task.sources_of(inputs, VOCAB).amax(-1)  # the source, the same at every target of a row
    assert len(first_target.unique()) >= 5
    last_marker = 15 - (inputs == MARKER).flip(-1).int().argmax(-1)
    shortcut = (last_marker + 1 == first_target).float().mean().item()
    assert shortcut < 0.5


def test_seeded():
    task = order_tasks.CopyAfterMarker()
    first, second, other = _sample(task, seed=3), _sample(task, seed=3), _sample(task, seed=4)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])


def test_bad_input():
    with pytest.raises(ValueError, match="k"):
        order_tasks.CopyAfterMarker(k=0)
    with pytest.raises(ValueError, match="rate"):
        order_tasks.CopyAfterMarker(rate=1.5)
    task = order_tasks.CopyAfterMarker(k=3)
    with pytest.raises(ValueError, match="length"):
        task.sample(2, 5, VOCAB, torch.Generator())
    with pytest.raises(ValueError, match="vocab_size"):
        task.sample(2, 8, 2, torch.Generator())
    with pytest.raises(TypeError, match="sources_of"):
        task.sources(8)
    with pytest.raises(TypeError, match="generator"):
        task.sample(2, 8, VOCAB, 0)
    assert task.min_length() == 6 and task.order == "content"
    # the shortest sequence still has targets: markers at 0, 2, 4
    inputs, _, mask = task.sample(4, 6, VOCAB, torch.Generator().manual_seed(0))
    assert bool(mask.any(-1).all())


def _slow_content_ceiling(task, inputs, causal):
    """position_blind_accuracy for a content task, one position at a time: the markers left out of the multiset."""
    sources = task.sources_of(inputs, VOCAB)
    on_target = sources >= 0
    share_self = (sources == torch.arange(inputs.shape[1]))[on_target].float().mean().item()
    values = []
    for b in range(inputs.shape[0]):
        for i in range(inputs.shape[1]):
            s = sources[b, i].item()
            if s < 0:
                continue
            seen = inputs[b, : i + 1] if causal else inputs[b]
            counts = torch.bincount(seen, minlength=VOCAB).float()
            counts[MARKER] = 0
            own = inputs[b, i].item()
            if own != MARKER:
                counts[own] -= 1
            alpha = float(s == i) if causal else share_self
            guess = (1 - alpha) * counts / max(counts.sum().item(), 1)
            if own != MARKER:
                guess[own] += alpha
            values.append(guess.max().item())
    return sum(values) / len(values)


@pytest.mark.parametrize("causal", [True, False])
def test_position_blind_ceiling_of_the_content_task(causal):
    task = order_tasks.CopyAfterMarker(k=2, rate=0.25)
    inputs, targets, mask = _sample(task, batch=16, length=12, seed=5)
    got = order_tasks.position_blind_accuracy(task, inputs, VOCAB, causal=causal)
    assert got == pytest.approx(_slow_content_ceiling(task, inputs, causal), abs=1e-6)
    per_position = order_tasks.position_blind_accuracy(task, inputs, VOCAB, causal=causal, per_position=True)
    assert per_position.shape == (12,)
    assert torch.isnan(per_position[: task.first_target]).all()  # no sequence has a target there
    # the rule it bounds: guess the most frequent non-marker token of the prefix, excluding the own token
    if causal:
        counts = torch.nn.functional.one_hot(inputs, VOCAB).cumsum(1).float()
        counts[..., MARKER] = -1
        counts -= torch.nn.functional.one_hot(inputs, VOCAB).float()
        rule = ((counts.argmax(-1) == targets) & mask).sum().item() / mask.sum().item()
        assert rule <= got + 1e-6


def test_position_blind_ceilings_tabulates_both_ceilings_of_every_task_and_length():
    tasks = [order_tasks.CopyBack(2), order_tasks.FetchPosition(1)]
    data = {(t.name, n): _sample(t, batch=32, length=n, seed=n)[0] for t in tasks for n in (8, 16)}
    ceilings = order_tasks.position_blind_ceilings(tasks, (8, 16), lambda t, n: data[t.name, n], VOCAB)
    assert set(ceilings) == {t.name for t in tasks}
    for task in tasks:
        assert set(ceilings[task.name]) == set(order_tasks.CEILING_LABELS.values())
        for n in (8, 16):
            for causal in (False, True):
                expected = order_tasks.position_blind_accuracy(task, data[task.name, n], VOCAB, causal=causal)
                assert order_tasks.ceiling(ceilings, task, n, causal=causal) == expected
    # the two ceilings differ: one causal layer knows its own position's prefix size
    assert (
        ceilings[tasks[0].name][order_tasks.CEILING_LABELS[True]]
        != ceilings[tasks[0].name][order_tasks.CEILING_LABELS[False]]
    )


# the word problem of a finite group (chapter 14's state-tracking task) ---------------------------------------------
def _slow_product(group, letters):
    """Compose the letters' permutations one by one: apply the state, then the letter."""
    task = order_tasks.WordProblem(group)
    state = tuple(range(len(task.elements[0])))
    for letter in letters:
        state = tuple(task.elements[letter][x] for x in state)
    return task.elements.index(state)


@pytest.mark.parametrize(
    "group, size, abelian", [("S3", 6, False), ("Z6", 6, True), ("A4", 12, False), ("S4", 24, False)]
)
def test_word_problem_groups_are_groups(group, size, abelian):
    task = order_tasks.WordProblem(group)
    table = task.cayley
    assert task.size == size and task.abelian is abelian and table.shape == (size, size)
    assert torch.equal(table[0], torch.arange(size)) and torch.equal(table[:, 0], torch.arange(size))  # identity first
    for row in table:  # a Latin square: every element once per row and column (inverses exist)
        assert sorted(row.tolist()) == list(range(size))
    assert sorted(table[:, 3].tolist()) == list(range(size))
    # associative, on every triple
    assert torch.equal(table[table[:, :, None], torch.arange(size)], table[torch.arange(size)[:, None, None], table])


@pytest.mark.parametrize("group", ["S3", "Z6", "A4"])
def test_word_problem_targets_are_the_running_products(group):
    task = order_tasks.WordProblem(group)
    vocab = task.size + 1
    inputs, targets, mask = task.sample(16, 12, vocab, torch.Generator().manual_seed(3))
    assert (inputs[:, 0] == vocab - 1).all() and (inputs[:, 1:] < task.size).all()
    assert (targets[:, 0] == order_tasks.IGNORE_INDEX).all() and mask[:, 1:].all() and not mask[:, 0].any()
    for row in range(16):
        for t in range(1, 12):
            assert targets[row, t].item() == _slow_product(group, inputs[row, 1 : t + 1].tolist())


def test_word_problem_order_matters_only_for_the_non_abelian_group():
    s3, z6 = order_tasks.WordProblem("S3"), order_tasks.WordProblem("Z6")
    words = torch.tensor([[1, 3], [3, 1]])  # the same letters, in both orders
    assert s3.states(words)[0, -1] != s3.states(words)[1, -1]
    swapped = torch.randint(6, (64, 5), generator=torch.Generator().manual_seed(0))
    assert torch.equal(z6.states(swapped)[:, -1], z6.states(swapped.flip(-1))[:, -1])
    assert torch.equal(z6.states(swapped)[:, -1], swapped.sum(-1) % 6)  # Z6's product is the sum mod 6


def test_word_problem_bad_input():
    with pytest.raises(ValueError, match="group"):
        order_tasks.WordProblem("D4")
    with pytest.raises(ValueError, match="group"):
        order_tasks.WordProblem("S9")
    with pytest.raises(TypeError, match="group"):
        order_tasks.WordProblem(6)
    task = order_tasks.WordProblem("S3")
    with pytest.raises(ValueError, match="vocab_size"):
        task.sample(2, 8, 6, torch.Generator())
    with pytest.raises(ValueError, match="length"):
        task.sample(2, 1, 7, torch.Generator())
    with pytest.raises(TypeError, match="generator"):
        task.sample(2, 8, 7, None)
    with pytest.raises(TypeError, match="states"):
        task.sources(8)
    with pytest.raises(ValueError, match="letters"):
        task.states(torch.zeros(3, dtype=torch.long))


# the order tasks ----------------------------------------------------------------------------------------------
def sample(task, length, seed, batch=5, vocab=7):
    return task.sample(batch, length, vocab, torch.Generator().manual_seed(seed))


@settings(max_examples=40, deadline=None)
@given(offset=st.integers(1, 6), extra=st.integers(0, 40), seed=st.integers(0, 2**31 - 1))
def test_copy_back_targets_are_the_token_offset_steps_back(offset, extra, seed):
    length = offset + 1 + extra
    inputs, targets, mask = sample(CopyBack(offset), length, seed)
    assert inputs.shape == targets.shape == mask.shape == (5, length)
    assert inputs.dtype == targets.dtype == torch.int64 and mask.dtype == torch.bool
    for b, i in itertools.product(range(5), range(length)):
        if i >= offset:
            assert mask[b, i] and targets[b, i] == inputs[b, i - offset]
        else:
            assert not mask[b, i] and targets[b, i] == IGNORE_INDEX


@settings(max_examples=40, deadline=None)
@given(position=st.integers(0, 6), extra=st.integers(0, 40), seed=st.integers(0, 2**31 - 1))
def test_fetch_position_targets_are_the_token_at_that_position(position, extra, seed):
    length = position + 1 + extra
    inputs, targets, mask = sample(FetchPosition(position), length, seed)
    for b, i in itertools.product(range(5), range(length)):
        if i >= position:
            assert mask[b, i] and targets[b, i] == inputs[b, position]
        else:
            assert not mask[b, i] and targets[b, i] == IGNORE_INDEX


@pytest.mark.parametrize("task", [CopyBack(2), FetchPosition(1)])
def test_sampling_is_deterministic_per_seed_and_uses_the_whole_vocabulary(task):
    first, again, other = sample(task, 64, 3, batch=32), sample(task, 64, 3, batch=32), sample(task, 64, 4, batch=32)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    assert set(first[0].unique().tolist()) == set(range(7))


def test_tasks_say_what_order_they_need_and_reject_bad_arguments():
    assert CopyBack(3).order == "relative" and FetchPosition(2).order == "absolute"
    with pytest.raises(ValueError, match="length"):
        CopyBack(3).sample(2, 3, 5, torch.Generator())
    with pytest.raises(ValueError, match="offset"):
        CopyBack(0)
    with pytest.raises(TypeError, match="generator"):
        CopyBack(1).sample(2, 4, 5, generator=0)
    with pytest.raises(ValueError, match="vocab_size"):
        FetchPosition(1).sample(2, 4, 1, torch.Generator())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("task", [CopyBack(1), CopyBack(2), FetchPosition(0), FetchPosition(1)])
def test_position_blind_accuracy_is_the_bayes_optimum_of_a_set_function(task, causal):
    """Brute force over every sequence of length 4 on 3 tokens: the best predictor that sees only its own token
    and the multiset of the sequence (causal: of the prefix, whose size reveals the position), pooled over all
    target positions, scores exactly the formula's mean."""
    length, vocab = 4, 3
    sequences = torch.tensor(list(itertools.product(range(vocab), repeat=length)))
    source = task.sources(length)
    votes = {}  # what the predictor sees -> counts of targets
    for sequence in sequences.tolist():
        for i in range(length):
            if source[i] >= 0:
                seen = sequence[: i + 1] if causal else sequence
                key = (tuple(sorted(seen)), sequence[i])
                votes.setdefault(key, [0] * vocab)[sequence[source[i]]] += 1
    best = sum(max(counts) for counts in votes.values()) / sum(sum(counts) for counts in votes.values())
    assert position_blind_accuracy(task, sequences, vocab, causal=causal) == pytest.approx(best, abs=1e-6)
    per_position = position_blind_accuracy(task, sequences, vocab, causal=causal, per_position=True)
    assert torch.isnan(per_position[source < 0]).all()
    assert per_position[source >= 0].mean().item() == pytest.approx(best, abs=1e-6)
