"""Each process of a run reads only its shard of the training file; joined, the shards are
the whole file's usable rows in file order, the same on every process (processes played by
threads, the all-gather by a barrier)."""

import json
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from explore_rl.data import jsonl, tasks
from explore_rl.data.sharded import Problems, take

SPEC = jsonl.JsonlSpec("q", "a")
# 13 rows: row 4 has no answer (skipped); in the JSONL file a torn line and blank lines too
ROWS = [{"q": f"What is {i} + 1?", "a": "" if i == 4 else str(i + 1)} for i in range(13)]


def _files(tmp_path) -> dict:
    lines = [json.dumps(r) for r in ROWS]
    lines[7:7] = ["", '{"q": "torn', "   "]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), str(tmp_path / "d.parquet"), row_group_size=4)
    table = pa.Table.from_pylist(ROWS)
    folder = tmp_path / "folder"
    folder.mkdir()
    # datasets' layout; batches of 2 rows: some hold no row of a shard of 3 or 4
    with pa.OSFile(str(folder / "data.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=2):
                writer.write_batch(batch)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data.arrow"}]}))
    return {n: str(tmp_path / n) for n in ("d.jsonl", "d.json", "d.parquet", "folder")}


def test_shards_partition_every_format_by_row(tmp_path):
    for name, path in _files(tmp_path).items():
        whole = jsonl.read_problems(path, SPEC)
        assert len(whole) == 12, name  # row 4 (and the torn line) skipped
        for n in (3, 4):
            shards = [jsonl.read_problems(path, SPEC, shard=tasks.Shard(p, n)) for p in range(n)]
            for p, shard in enumerate(shards):
                assert all(x.row % n == p for x in shard), name
            joined = sorted((x for s in shards for x in s), key=lambda x: x.row)
            assert joined == whole and [x.row for x in joined] == [x.row for x in whole], name


def _as_processes(n: int, fn) -> list:
    """fn(p, gather) in n threads at once, `gather` an all-gather between them; each
    thread's result, or the exception it raised."""
    barrier, slots, out = threading.Barrier(n, timeout=30), [None] * n, [None] * n

    def gather_of(p):
        def gather(data: bytes) -> list[bytes]:
            slots[p] = data
            barrier.wait()
            every = list(slots)
            barrier.wait()  # nobody writes the next call's slot before all have read
            return every

        return gather

    def body(p):
        try:
            out[p] = fn(p, gather_of(p))
        except Exception as e:  # noqa: BLE001 - handed to the test
            out[p] = e

    threads = [threading.Thread(target=body, args=(p,)) for p in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_joined_shards_are_the_whole_file_on_every_process(tmp_path):
    path = _files(tmp_path)["d.jsonl"]
    whole = jsonl.read_problems(path, SPEC)
    picks = [11, 0, 5, 5, 3]

    def process(p, gather):
        shard = tasks.Shard(p, 3)
        local = jsonl.read_problems(path, SPEC, shard=shard)
        joined = Problems.join(local, shard, gather, longest=10 + p)
        problems = joined.problems
        return len(local), joined.longest, len(problems), take(problems, picks), problems[2:6]

    results = _as_processes(3, process)
    held = [r[0] for r in results]
    assert sum(held) == len(whole) and max(held) <= 5  # each holds its third only
    for _, longest, n, picked, sliced in results:
        assert (longest, n) == (12, len(whole))
        assert picked == [whole[i] for i in picks] and sliced == whole[2:6]
    assert take(whole, picks) == [whole[i] for i in picks]  # a plain list, as benches give


def test_an_error_of_one_shard_is_raised_by_every_process(tmp_path):
    def process(p, gather):
        error = f"{tmp_path}/train.jsonl: line 3: no field 'q'" if p == 1 else None
        return Problems.join([], tasks.Shard(p, 2), gather, error=error)

    for result in _as_processes(2, process):
        with pytest.raises(ValueError, match=r"^process 1: .*train.jsonl: line 3: no field 'q'"):
            raise result
    problems = [tasks.Problem("What is 1 + 1?", "2"), tasks.Problem("What is 2 + 2?", "4")]
    with pytest.raises(ValueError, match="problems 1 share a `row` and 0 are another shard's"):
        Problems.join(problems)  # a task that took `shard` but numbered no row
    with pytest.raises(ValueError, match="process 0: .* 0 share a `row` and 1 are another"):
        Problems.join(problems[1:], tasks.Shard(1, 2))  # row 0 is shard 0's


def test_the_stream_is_one_seeded_shuffle_per_epoch():
    from explore_rl.train import steps

    first, second = (np.random.default_rng([3, epoch]).permutation(5) for epoch in (0, 1))
    expected = [first[3], first[4], second[0], second[1]]  # positions 3-6, 5 problems an epoch
    assert steps.stream(list("abcde"), 3, 3, 4) == ["abcde"[i] for i in expected]
