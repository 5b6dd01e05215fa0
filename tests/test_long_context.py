"""posenc.lab.long_context: chapter 12's long-context study, its committed files and their readers."""

import json
import math

import pytest
import torch

from posenc.lab import long_context as study


def test_window_losses_predict_the_right_tokens_from_the_right_context():
    ids = torch.arange(100)  # token t is t
    # a fake pass: "loss" i is the token it predicts (ids[i + 1]) plus 1000 x the context it has seen (i + 1)
    run = lambda window_ids: window_ids[1:].double() + 1000 * torch.arange(1, window_ids.numel()).double()
    out = study.window_losses(ids, begin=32, end=96, window=32, stride=8, run=run)
    predicted, seen = out % 1000, out // 1000
    assert torch.equal(predicted, ids[33:97].double())  # loss index t predicts token t + 1
    assert seen.min() == 32 - 8 + 1 and seen.max() == 32  # never more than the window, never from further back
    with pytest.raises(ValueError, match="stride"):
        study.window_losses(ids, begin=32, end=95, window=32, stride=8, run=run)


def test_committed_long_context_result_has_what_chapter_12_reads():
    # the file make long-context wrote and chapter 12 reads: it must be committed and complete
    record = study.results()
    assert record["trained_length"] == 8192 and record["factor"] == 2.0 and record["bin"] == 512
    assert record["text"]["tokens"][1] - record["text"]["tokens"][0] == 16385
    assert {"cpu", "threads"} <= set(record["machine"]) and {"torch", "transformers"} <= set(record["versions"])
    assert record["command"].startswith("python") and "long_context" in record["command"]
    bands = ["0-8192", "8192-12288", "12288-16384"]
    for name in study.METHODS:
        result = record["methods"][name]
        assert all(math.isfinite(result["bands"][band]) and result["bands"][band] > 0 for band in bands), name
        if name != "dynamic NTK":
            assert len(result["bin_means"]) == 32 and all(math.isfinite(x) for x in result["bin_means"]), name
            # the mean of the bins of one band is that band's mean (equal-size bins)
            assert math.isclose(sum(result["bin_means"][:16]) / 16, result["bands"]["0-8192"], rel_tol=1e-9), name
    # dynamic NTK is plain RoPE up to the trained length and NTK-aware (s = 2) at 16k, by construction
    assert record["methods"]["dynamic NTK"]["bands"]["0-8192"] == record["methods"]["RoPE"]["bands"]["0-8192"]
    assert (
        record["methods"]["dynamic NTK"]["bands"]["12288-16384"]
        == record["methods"]["NTK-aware"]["bands"]["12288-16384"]
    )


def test_long_context_results_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="make long-context"):
        study.results(tmp_path / "absent.json")
    with pytest.raises(TypeError, match="path"):
        study.results(3)
    record = study.results()
    record["methods"]["YaRN"]["bands"]["12288-16384"] = float("nan")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="YaRN.*12288-16384.*finite"):
        study.results(broken)
    record = study.results()
    del record["methods"]["PI"]
    broken.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="missing method 'PI'"):
        study.results(broken)


def test_committed_sliding_window_baseline_matches_the_long_context_run():
    window, record = study.window_results(), study.results()
    assert window["command"].startswith("python") and "--part window" in window["command"]
    assert window["text"]["tokens"] == record["text"]["tokens"] and window["model"] == record["model"]
    assert window["trained_length"] == window["window"] == 8192 and window["context_seen"] == [7169, 8192]
    assert set(window["bands"]) == {"8192-12288", "12288-16384"} and len(window["bin_means"]) == 16
    # equal-size bins: each band's mean is the mean of its bins
    assert math.isclose(sum(window["bin_means"][:8]) / 8, window["bands"]["8192-12288"], rel_tol=1e-9)
    with pytest.raises(FileNotFoundError, match="make long-context"):
        study.window_results("/nonexistent/window.json")
