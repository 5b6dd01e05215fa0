"""Side-by-side timing: the contenders' repetitions are interleaved, so a slow spell of a shared machine
falls on all of them alike, and every reported figure is a ratio taken within one round."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable

import torch


def synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def time_call(function: Callable, sync: Callable[[], None]) -> float:
    """Wall time of one call, with the device drained before and after; its result is freed untimed."""
    sync()
    start = time.perf_counter()
    result = function()
    sync()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def interleaved(
    contenders: dict[str, Callable], rounds: int, sync: Callable[[], None], prepare: dict[str, Callable] | None = None
) -> dict[str, list[float]]:
    """``rounds`` rounds; in each, every contender runs once, in an order rotated from round to round.

    ``prepare[name]()`` (untimed) returns the function to time, for contenders that need fresh inputs
    (a forward pass before a timed backward).
    """
    names = list(contenders)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            function = prepare[name]() if prepare and name in prepare else contenders[name]
            gc.collect()
            times[name].append(time_call(function, sync))
            del function
    return times


def rounds_for(seconds_per_round: float, budget: float, low: int = 3, high: int = 9) -> int:
    """How many rounds fit into ``budget`` seconds (at least ``low``: a median needs a few)."""
    return max(low, min(high, int(budget / max(seconds_per_round, 1e-9))))


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over rounds of ``numerator[r] / denominator[r]``."""
    return statistics.median(n / d for n, d in zip(numerator, denominator))
