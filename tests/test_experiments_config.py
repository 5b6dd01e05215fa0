"""posenc.lab.experiments.config: the sizes of an experiment and the thread count of its runs."""

import pytest
import torch

from posenc.lab.experiments.config import ExperimentConfig, threads


def test_threads_restores_the_count_even_after_an_error():
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(RuntimeError), threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
    with pytest.raises(ValueError, match="count"), threads(0):
        pass


def test_long_evaluations_use_fewer_sequences():
    config = ExperimentConfig()
    assert config.eval_lengths == (16, 32, 64, 256, 512) and config.head_dim == 8
    assert [config.eval_batch(n) for n in config.eval_lengths] == [256, 128, 64, 16, 8]
    assert config.eval_batch(10**6) == 8
