"""torch.compile for posenc's kernels: compiled once per process on first use, with a clean fallback.

A compiled kernel costs seconds on its first call (tracing plus a C++ or Triton build; later processes reuse
inductor's on-disk cache), so posenc only compiles where the caller asks for it (``compiled=True``). Where
torch.compile cannot work (no C++ compiler, an unsupported platform or Python, a failing build), the failure is
reported once per device type as a ``RuntimeWarning`` and the eager fallback runs instead: results never
depend on whether compiling worked.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch


class CompiledFunction:
    """``function`` compiled by ``torch.compile(**options)`` on first call; ``fallback`` where that fails.

    ``fallback`` (default ``function``) must compute the same result eagerly. It also runs on ``meta``
    tensors and while an outer ``torch.compile`` is tracing (the caller's graph then holds ``function``).
    """

    def __init__(self, function: Callable, fallback: Callable | None = None, **options):
        self.function, self.fallback, self.options = function, fallback or function, options
        self.failures: dict[str, BaseException] = {}  # device type -> the error that disabled compiling there
        self._compiled = None

    def __call__(self, *args):
        if torch.compiler.is_compiling():
            return self.function(*args)
        device_type = next(a.device.type for a in args if isinstance(a, torch.Tensor))
        if device_type == "meta" or device_type in self.failures:
            return self.fallback(*args)
        try:
            if self._compiled is None:
                self._compiled = torch.compile(self.function, **self.options)
            return self._compiled(*args)
        except Exception as error:  # compiling is an optimisation: any failure means "run eagerly"
            self.failures[device_type] = error
            warnings.warn(
                f"posenc: torch.compile of {self.function.__name__} failed on {device_type} "
                f"({type(error).__name__}: {str(error)[:300]}); using the eager kernel instead",
                RuntimeWarning,
                stacklevel=3,
            )
            return self.fallback(*args)

    def reset(self) -> None:
        """Forget the compiled function and past failures (the next call compiles again)."""
        self._compiled = None
        self.failures.clear()
