"""book/tools/long_context.py: the sliding-window baseline's blocks (no model needed)."""
import pytest
import torch

from book.tools.long_context import window_losses


def test_window_losses_predict_the_right_tokens_from_the_right_context():
    ids = torch.arange(100)  # token t is t
    # a fake pass: "loss" i is the token it predicts (ids[i + 1]) plus 1000 x the context it has seen (i + 1)
    run = lambda window_ids: window_ids[1:].double() + 1000 * torch.arange(1, window_ids.numel()).double()
    out = window_losses(None, ids, begin=32, end=96, window=32, stride=8, run=run)
    predicted, seen = out % 1000, out // 1000
    assert torch.equal(predicted, ids[33:97].double())  # loss index t predicts token t + 1
    assert seen.min() == 32 - 8 + 1 and seen.max() == 32  # never more than the window, never from further back
    with pytest.raises(ValueError, match="stride"):
        window_losses(None, ids, begin=32, end=95, window=32, stride=8, run=run)
