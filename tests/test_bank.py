"""The experience bank with the real MiniLM embedder and a real faiss index (no Ray)."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import lopd_ray.bank.bank as bank_mod
from lopd_ray.bank.bank import ExperienceBank
from lopd_ray.bank.embedder import Embedder
from lopd_ray.bank.traces import (BankEntry, composer_input_text, document_text, entries_from_successes,
                                  entry_from_trajectory, observation_lite_trace)
from lopd_ray.cli.build_bank import check_build, parse_args
from lopd_ray.config import BankConfig, ConfigError, load_config
from lopd_ray.data.trajectory import Trajectory

TASKS = [
    "Sort a list of integers in ascending order", "Reverse a linked list in place",
    "Compute the nth Fibonacci number", "Parse a CSV file and sum the second column",
    "Book a flight from Paris to Tokyo for next Monday", "Find a vegetarian lasagna recipe",
    "Translate a paragraph from English to German", "Fix the off-by-one error in the pagination code",
    "Write a SQL query returning the top five customers by revenue", "Buy a red umbrella under 20 dollars",
    "Summarize the news article about the election", "Rename all .txt files in a folder to .md",
    "Check the weather forecast for Berlin tomorrow", "Solve the quadratic equation x^2 - 5x + 6 = 0",
    "Convert a temperature from Celsius to Fahrenheit", "Count the vowels in a string",
    "Schedule a meeting with the design team on Friday", "Add a unit test for the login handler",
    "Find the shortest path in a weighted graph", "Resize an image to 256 by 256 pixels",
    "Extract all email addresses from a web page", "Merge two sorted arrays into one",
    "Plan a three-day hiking trip in the Alps", "Return the most frequent word in a document",
]
QUERIES = ["order these numbers from smallest to largest", "reserve plane tickets to Japan",
           "a pasta dish without meat", "write tests for authentication", "what will the weather be like"]


def entry(task_id: str, task_text: str, trace: str = "Action: done", reward: float = 1.0, version: int = 0,
          entry_id: str | None = None) -> BankEntry:
    return BankEntry(entry_id or f"{task_id}@v{version}#{abs(hash(trace)) % 10**6}", task_id, task_text, trace,
                     reward, version)


def corpus() -> list[BankEntry]:
    return [entry(f"t{i}", text) for i, text in enumerate(TASKS)]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(BankConfig())


def make_bank(embedder: Embedder, **overrides) -> ExperienceBank:
    return ExperienceBank(dataclasses.replace(BankConfig(), **overrides), embedder=embedder)


def ids(results: list[list[BankEntry]]) -> list[list[str]]:
    return [[e.entry_id for e in r] for r in results]


# ---- retrieval -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("self_retrieval,index", [(True, "flat"), (False, "flat"), (False, "hnsw")])
def test_top_k_equals_brute_force_cosine(embedder, self_retrieval, index):
    """The approximate index is exact at this size (its candidate list holds the whole bank)."""
    entries = corpus()
    bank = make_bank(embedder, self_retrieval=self_retrieval, index=index)
    assert bank.add(entries) == len(entries)
    docs = embedder.encode([e.task_text for e in entries])
    np.testing.assert_allclose(bank.vectors, docs, atol=1e-5)
    queries = QUERIES + [TASKS[3], TASKS[17]]
    excludes = [None] * len(QUERIES) + ["t3", "t17"]
    k = 5
    got = bank.retrieve(queries, k, excludes)

    scores = embedder.encode(queries) @ docs.T
    for row, exclude, result in zip(scores, excludes, got):
        order = [i for i in np.argsort(-row, kind="stable") if self_retrieval or entries[i].task_id != exclude]
        assert [e.entry_id for e in result] == [entries[i].entry_id for i in order[:k]]
    # the crafted queries find their obvious match first
    assert [r[0].task_id for r in got[:5]] == ["t0", "t4", "t5", "t17", "t12"]
    assert bank.stats()["bank/hit_rate"] == 1.0 and bank.stats()["bank/size"] == len(entries)
    assert bank.stats()["bank/retrieve_ms"] > 0


def test_repeated_queries_get_the_answers_of_single_queries(embedder):
    """A step's samples of one task share its text; they are encoded once but excluded per query."""
    bank = make_bank(embedder, self_retrieval=False)
    bank.add(corpus())
    queries, excludes = [TASKS[3], QUERIES[0], TASKS[3], TASKS[3]], ["t3", None, None, "t3"]
    alone = [ids(bank.retrieve([q], 4, [x]))[0] for q, x in zip(queries, excludes)]
    assert ids(bank.retrieve(queries, 4, excludes)) == alone
    assert alone[0] != alone[2] and alone[0] == alone[3]  # the exclude id still applies per query


def test_self_retrieval_off_excludes_the_same_task_and_on_returns_it(embedder):
    off, on = make_bank(embedder, self_retrieval=False), make_bank(embedder, self_retrieval=True)
    for bank in (off, on):
        bank.add(corpus())
    query, task_id = [TASKS[7]], ["t7"]
    assert on.retrieve(query, 3, task_id)[0][0].task_id == "t7"
    got = off.retrieve(query, 3, task_id)[0]
    assert len(got) == 3 and "t7" not in {e.task_id for e in got}
    # None excludes nothing even with self-retrieval off
    assert off.retrieve(query, 3, [None])[0][0].task_id == "t7"


def test_self_retrieval_off_excludes_another_id_with_the_same_task_text(embedder):
    """A split may hold one task under two ids: off, neither id's entries come back for that text."""
    bank = make_bank(embedder, self_retrieval=False)
    twin = entry("t7-copy", TASKS[7], trace="Action: the twin's solution")
    bank.add(corpus() + [twin])
    got = bank.retrieve([TASKS[7], TASKS[7]], 3, ["t7", "t7-copy"])
    assert [len(r) for r in got] == [3, 3]
    assert all(e.task_text != TASKS[7] for r in got for e in r)
    # with self-retrieval on (or no exclude id) both entries of the text rank first
    on = make_bank(embedder, self_retrieval=True)
    on.add(corpus() + [twin])
    assert {e.task_id for e in on.retrieve([TASKS[7]], 2, ["t7"])[0]} == {"t7", "t7-copy"}
    assert {e.task_id for e in bank.retrieve([TASKS[7]], 2, [None])[0]} == {"t7", "t7-copy"}


def test_k_entries_come_back_when_the_excluded_task_has_many_entries(embedder):
    bank = make_bank(embedder, self_retrieval=False)
    same = [entry("x", "Sort a list of integers in ascending order", trace=f"Action: attempt {i}") for i in range(6)]
    assert bank.add(same + corpus()) == 6 + len(TASKS)
    got = bank.retrieve(["Sort a list of integers in ascending order"], 4, ["x"])[0]
    # t0 has the query's text too: 7 entries excluded, 4 others still come back
    assert len(got) == 4 and not {"x", "t0"} & {e.task_id for e in got}
    # a bank holding fewer than k other entries returns what it has
    small = make_bank(embedder, self_retrieval=False)
    small.add(same + corpus()[:2])
    assert len(small.retrieve(["sort numbers"], 4, ["x"])[0]) == 2


def test_empty_bank_and_hit_rate(embedder):
    bank = make_bank(embedder)
    assert bank.retrieve(["anything"], 3, [None]) == [[]]
    assert bank.stats()["bank/hit_rate"] == 0.0
    bank.add([entry("t0", TASKS[0])])
    # one query only finds entries of its own (excluded) task: 1 of 2 queries gets a hit
    assert [len(r) for r in bank.retrieve(["sort", "sort"], 3, ["t0", "t9"])] == [0, 1]
    assert bank.stats()["bank/hit_rate"] == 0.5
    with pytest.raises(ValueError, match="exclude id"):
        bank.retrieve(["a", "b"], 3, [None])


# ---- add -------------------------------------------------------------------------------------------------------
def test_failed_entries_are_not_added_and_duplicates_are_skipped(embedder):
    bank = make_bank(embedder, success_threshold=0.8)
    good, bad = entry("t0", TASKS[0], reward=0.8), entry("t1", TASKS[1], reward=0.79)
    dup = dataclasses.replace(good, trace_text="another trace, same id")
    assert bank.add([good, bad, dup]) == 1
    assert bank.add([good]) == 0
    assert [e.entry_id for e in bank.entries] == [good.entry_id] and bank.size() == 1
    assert bank.index.ntotal == 1 and bank.vectors.shape == (1, embedder.dim)
    assert bank.retrieve([TASKS[1]], 3, [None]) == [[good]]


def test_task_trace_documents_change_what_is_embedded(embedder):
    query = "Make the weather API client retry when HTTP requests time out"
    entries = [entry("db", "Make the database client retry when queries time out",
                     trace="Action: open the garden planner\nAction: water the tomatoes and prune the roses"),
               entry("build", "Fix the failing build",
                     trace="Action: rewrite the weather API client so HTTP requests retry after a timeout\n"
                           "Observation: weather client tests pass")]
    tops = {}
    for mode in ("task", "task_trace"):
        bank = make_bank(embedder, documents=mode)
        bank.add(entries)
        np.testing.assert_allclose(bank.vectors, embedder.encode([document_text(e, mode) for e in entries]),
                                   atol=1e-5)
        tops[mode] = [e.task_id for e in bank.retrieve([query], 2, [None])[0]]
    assert tops == {"task": ["db", "build"], "task_trace": ["build", "db"]}
    with pytest.raises(ValueError, match="bank.documents"):
        make_bank(embedder, documents="trace")


# ---- snapshots -------------------------------------------------------------------------------------------------
def test_snapshot_then_restore_gives_identical_retrieval_and_stats(embedder, tmp_path, monkeypatch):
    bank = make_bank(embedder, self_retrieval=False)
    bank.add(corpus())
    excludes = ["t0", None, "t5", None, "t12"]
    before = bank.retrieve(QUERIES, 4, excludes)
    bank.snapshot(str(tmp_path / "bank"))
    assert sorted(os.listdir(tmp_path)) == ["bank"]  # no temp or backup dirs left behind

    fresh = make_bank(embedder, self_retrieval=False)
    with monkeypatch.context() as m:  # restoring must not re-encode anything
        m.setattr(embedder, "encode", lambda texts: pytest.fail("restore re-encoded the documents"))
        fresh.restore(str(tmp_path / "bank"))
    assert fresh.stats() == bank.stats()
    assert fresh.entries == bank.entries
    np.testing.assert_array_equal(fresh.vectors, bank.vectors)
    assert ids(fresh.retrieve(QUERIES, 4, excludes)) == ids(before) == ids(bank.retrieve(QUERIES, 4, excludes))
    for key in ("bank/size", "bank/hit_rate"):
        assert fresh.stats()[key] == bank.stats()[key]
    # a restored bank keeps growing and deduplicating
    assert fresh.add(corpus()) == 0 and fresh.add([entry("new", "Water the plants")]) == 1


def test_a_text_the_bank_holds_is_encoded_once_and_a_restored_bank_reuses_its_vector(embedder, tmp_path,
                                                                                      monkeypatch):
    encoded: list[str] = []
    real_encode = embedder.encode
    monkeypatch.setattr(embedder, "encode", lambda texts: encoded.extend(texts) or real_encode(texts))
    bank = make_bank(embedder)  # documents = the task text
    assert bank.add([entry("t0", TASKS[0], "a"), entry("t1", TASKS[1], "b"), entry("t1b", TASKS[1], "c")]) == 3
    assert encoded == TASKS[:2]  # two entries with the same document: one encoding
    np.testing.assert_array_equal(bank.vectors[2], bank.vectors[1])
    # encoded in a batch of two, so equal to its encoding alone up to the padding's float rounding
    np.testing.assert_allclose(bank.vectors[0], real_encode([TASKS[0]])[0], atol=1e-6)
    encoded.clear()
    assert bank.add([entry("t0", TASKS[0], "a2", version=1)]) == 1  # a later entry of a known task
    assert bank.retrieve([TASKS[1], QUERIES[0]], 2, [None, None])[0][0].task_text == TASKS[1]
    assert encoded == [QUERIES[0]]  # the known text's query took the document's vector
    np.testing.assert_array_equal(bank.vectors[3], bank.vectors[0])

    bank.snapshot(str(tmp_path / "bank"))
    fresh = make_bank(embedder)
    fresh.restore(str(tmp_path / "bank"))
    encoded.clear()
    assert fresh.add([entry("t1", TASKS[1], "d", version=2)]) == 1 and encoded == []
    np.testing.assert_array_equal(fresh.vectors[4], bank.vectors[1])


def test_restore_refuses_a_snapshot_of_other_documents(embedder, tmp_path):
    bank = make_bank(embedder, documents="task")
    bank.add(corpus()[:2])
    bank.snapshot(str(tmp_path / "b"))
    with pytest.raises(ValueError, match="bank.documents"):
        make_bank(embedder, documents="task_trace").restore(str(tmp_path / "b"))
    with pytest.raises(FileNotFoundError, match="no bank snapshot"):
        make_bank(embedder).restore(str(tmp_path / "missing"))


@pytest.mark.parametrize("crash", ["write", "swap"])
def test_interrupted_snapshot_leaves_the_previous_one_loadable(embedder, tmp_path, monkeypatch, crash):
    directory = str(tmp_path / "bank")
    bank = make_bank(embedder)
    bank.add(corpus()[:5])
    bank.snapshot(directory)
    bank.add(corpus()[5:])

    real_write, real_rename = bank_mod.write_file, os.rename
    writes, renames = [], []

    def write_then_crash(path, data):
        writes.append(path)
        if len(writes) == 2:  # the entries file is written, the vectors are not
            raise OSError("disk full")
        real_write(path, data)

    def crash_before_second_rename(src, dst):  # old snapshot moved aside, new one not yet in place
        renames.append(dst)
        if len(renames) == 2:
            raise OSError("power cut")
        real_rename(src, dst)

    with monkeypatch.context() as m:
        if crash == "write":
            m.setattr(bank_mod, "write_file", write_then_crash)
        else:
            m.setattr(bank_mod.os, "rename", crash_before_second_rename)
        with pytest.raises(OSError):
            bank.snapshot(directory)
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]

    restored = make_bank(embedder)
    restored.restore(directory)
    assert restored.size() == 5 and restored.entries == bank.entries[:5]

    bank.snapshot(directory)  # the next snapshot completes and clears the leftovers
    assert sorted(os.listdir(tmp_path)) == ["bank"]
    restored = make_bank(embedder)
    restored.restore(directory)
    assert restored.size() == len(TASKS)


# ---- traces and texts ------------------------------------------------------------------------------------------
def test_observation_lite_trace_cuts_observations_and_the_whole_trace():
    turns = [("ls", "a" * 10), ("cat f.txt", "done"), ("submit", "")]
    assert observation_lite_trace(turns, 4, 1000) == (
        "Action: ls\nObservation: aaaa...\nAction: cat f.txt\nObservation: done\nAction: submit")
    assert observation_lite_trace(turns, 10, 1000).startswith("Action: ls\nObservation: aaaaaaaaaa\n")
    assert observation_lite_trace(turns, 4, 12) == "Action: ls\nO..."
    exact = observation_lite_trace([("bbbbbb", "")], 4, 14)
    assert exact == "Action: bbbbbb"  # exactly at the limit: not cut


def trajectory(task_id="letters/train/3", version=2, reward=1.0, actions=("look", "bbb"),
               observations=("long observation",)) -> Trajectory:
    return Trajectory(task_id=task_id, group_id=0, prompt_ids=[1], response_ids=[5, 6], loss_mask=[1, 1],
                      turn_spans=[(0, 2)], rollout_logprobs=[0.0, 0.0], policy_version=version, reward=reward,
                      task_text="Say b", action_texts=list(actions), observation_texts=list(observations))


def test_entry_from_trajectory_ids_and_texts():
    cfg = BankConfig(max_observation_chars=3)
    e = entry_from_trajectory(trajectory(), cfg)
    assert e.trace_text == "Action: look\nObservation: lon...\nAction: bbb"
    assert (e.task_id, e.task_text, e.reward, e.policy_version) == ("letters/train/3", "Say b", 1.0, 2)
    assert e.entry_id.startswith("letters/train/3@v2#")
    assert e == entry_from_trajectory(trajectory(), cfg)
    other_version = entry_from_trajectory(trajectory(version=3), cfg)
    other_trace = entry_from_trajectory(trajectory(actions=("look", "bb")), cfg)
    assert len({e.entry_id, other_version.entry_id, other_trace.entry_id}) == 3
    with pytest.raises(ValueError, match="observation"):
        entry_from_trajectory(trajectory(actions=("a",), observations=("o1", "o2")), cfg)

    assert document_text(e, "task") == "Say b"
    assert document_text(e, "task_trace") == "Say b\nAction: look\nObservation: lon...\nAction: bbb"
    assert composer_input_text(e) == ("Task to solve:\nSay b\n\nReference past trajectory:\n"
                                      "Action: look\nObservation: lon...\nAction: bbb")
    with pytest.raises(ValueError, match="bank.documents"):
        document_text(e, "trace")


# ---- embedder --------------------------------------------------------------------------------------------------
def test_embedder_vectors_are_unit_norm_and_batching_does_not_change_them(embedder, monkeypatch):
    texts = TASKS[:5] + ["", "a much longer sentence " * 20]
    vectors = embedder.encode(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (len(texts), embedder.dim) and embedder.dim == 384
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    monkeypatch.setattr(embedder, "batch_size", 2)
    np.testing.assert_allclose(embedder.encode(texts), vectors, atol=1e-5)
    assert embedder.encode([]).shape == (0, embedder.dim)


def test_missing_embedder_path_names_the_key(tmp_path):
    with pytest.raises(ConfigError) as info:
        Embedder(BankConfig(embedder_path=str(tmp_path / "nope")))
    message = str(info.value)
    assert "bank.embedder_path" in message and "\n" not in message


# ---- build (no Ray here) ---------------------------------------------------------------------------------------
def test_build_cli_parses_and_helps(capsys):
    from lopd_ray.cli.build_bank import main

    args = parse_args(["r.yaml", "--out", "d", "--samples-per-task", "2", "bank.top_j=5", "env.seed=1"])
    assert (args.recipe, args.out, args.samples_per_task) == ("r.yaml", "d", 2)
    assert args.overrides == ["bank.top_j=5", "env.seed=1"]
    assert parse_args(["r.yaml", "--out", "d"]).samples_per_task is None
    assert capsys.readouterr().err == ""
    # The older --recipe flag: the same arguments, and one line naming the new style.
    old = parse_args(["--out", "d", "--recipe", "r.yaml", "bank.top_j=5"])
    assert (old.recipe, old.out, old.overrides) == ("r.yaml", "d", ["bank.top_j=5"])
    assert capsys.readouterr().err.strip().splitlines() == [
        "python -m lopd_ray.build_bank: --recipe is deprecated, give the recipe first: "
        "python -m lopd_ray.build_bank r.yaml ..."]
    with pytest.raises(SystemExit) as info:
        parse_args(["--out", "d", "bank.top_j=5"])  # no recipe
    assert info.value.code == 2 and "give the recipe first" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "--samples-per-task" in capsys.readouterr().out


def test_entries_come_from_successes_only_and_build_refuses_a_non_train_split():
    cfg = load_config(None, ["bank.success_threshold=0.5"])
    win = dataclasses.replace(trajectory(actions=("a1", "a2"), observations=("o1",)), reward=0.5, task_text="T")
    loss = dataclasses.replace(win, reward=0.4)
    entries = entries_from_successes([win, loss], cfg.bank)
    assert len(entries) == 1 and entries[0].task_text == "T"
    assert "a1" in entries[0].trace_text and "o1" in entries[0].trace_text and "a2" in entries[0].trace_text
    with pytest.raises(ConfigError, match="env.split"):
        check_build(load_config(None, ["env.split=test"]), 1)


def test_build_refuses_to_write_an_empty_bank(tmp_path, monkeypatch):
    """No episode reached the success threshold: an error naming the threshold and the fixes, nothing written."""
    from lopd_ray.cli import build_bank
    from lopd_ray.errors import RolloutError

    failed = dataclasses.replace(trajectory(actions=("a",), observations=()), reward=0.25)
    monkeypatch.setattr(build_bank, "rollout_train_split", lambda cfg, model_path, samples: [failed, failed])
    with pytest.raises(RolloutError) as info:
        build_bank.build(load_config(None, []), "unused", str(tmp_path / "bank"), 2)
    assert "bank.success_threshold=1" in str(info.value) and "best reward 0.25" in str(info.value)
    assert not (tmp_path / "bank").exists()
