"""posenc.lab.results: how a results file records the machine, versions and command that made it."""

import pytest

from posenc.lab import results


def test_provenance_records_how_a_results_file_was_made():
    record = results.provenance(3, "book.tools.example")
    assert record["machine"]["threads"] == 3 and record["machine"]["cpu"] == results.cpu_name()
    assert {"python", "torch", "posenc", "git_commit"} <= set(record["versions"])
    assert len(record["versions"]["git_commit"]) == 40 or record["versions"]["git_commit"] == "unknown"
    assert record["command"].split()[1:3] == ["-m", "book.tools.example"]
    assert record["date"].endswith("+00:00")


def test_default_arithmetic_is_false_when_the_cpu_path_is_forced(monkeypatch):
    for name in results.ARITHMETIC_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    assert results.default_arithmetic()
    for name in results.ARITHMETIC_OVERRIDES:
        monkeypatch.setenv(name, "default")
        assert not results.default_arithmetic()
        monkeypatch.delenv(name)


def test_same_platform_reads_provenance_cpu_threads_torch_and_the_arithmetic_path(monkeypatch):
    import torch

    for name in results.ARITHMETIC_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    record = results.provenance(1, "book.tools.example")
    assert results.same_platform(record) and not results.same_platform(record, threads=2)
    assert not results.same_platform(dict(record, machine=dict(record["machine"], cpu="another CPU")))
    assert not results.same_platform(dict(record, versions=dict(record["versions"], torch="0.0")))
    assert results.same_platform(
        {"machine": {"cpu": results.cpu_name(), "threads": 1}, "versions": {"torch": torch.__version__}}
    )
    assert not results.same_platform({})
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert not results.same_platform(record)
    with pytest.raises(TypeError, match="record"):
        results.same_platform([])
