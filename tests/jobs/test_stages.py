"""Pipeline stages, the data side: prompt templates over several columns, the keep filter, and the
hand-over from one stage's committed output to the next stage's input (real job processes, the stub)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _jobkit import run_job, write_spec
from pydantic import ValidationError

from prefect_swarm.exceptions import ConfigError, RowRefused
from prefect_swarm.jobs.api import load_job
from prefect_swarm.jobs.columns import RESERVED_COLUMNS
from prefect_swarm.jobs.stages import RowFilter, check_stage, hand_over
from prefect_swarm.jobs.template import PromptTemplate


def test_a_template_names_columns_and_nothing_else() -> None:
    t = PromptTemplate("Q: {prompt}\nA: {generate_text} {{literal}} {n} {tags}")
    assert t.columns == ["prompt", "generate_text", "n", "tags"]
    row = {"prompt": "why?", "generate_text": "because", "n": 3, "tags": ["a", "b"]}
    assert t.render(row) == 'Q: why?\nA: because {literal} 3 ["a", "b"]'
    with pytest.raises(RowRefused, match="column 'generate_text' is null"):
        t.render({**row, "generate_text": None})
    for bad, says in [
        ("{}", "not a column reference"),
        ("{prompt!r}", "not a column reference"),
        ("{prompt:>9}", "not a column reference"),
        ("a } b {prompt}", "Single '}'"),
        ("no columns", "names no column"),
    ]:
        with pytest.raises(ConfigError, match=says):
            PromptTemplate(bad)


def test_the_chat_job_takes_a_template() -> None:
    job = load_job("chat", {"prompt_template": "{prompt} -> {generate_text}", "system_prompt": "Judge."})
    assert job.columns() == {"prompt": "any", "generate_text": "any"}
    body = job.body({"prompt": "2+2", "generate_text": "4"})
    assert body["messages"] == [{"role": "system", "content": "Judge."}, {"role": "user", "content": "2+2 -> 4"}]
    with pytest.raises(ConfigError, match="messages_column or prompt_template"):
        load_job("chat", {"prompt_template": "{a}", "messages_column": "m"})


def test_the_keep_filter() -> None:
    values = ["pass", "PASS", "fail", None, "passable"]
    assert RowFilter(column="v", equals="pass").passes(values) == [True, False, False, False, False]
    assert RowFilter(column="v", one_of=["pass", "fail"]).passes(values) == [True, False, True, False, False]
    assert RowFilter(column="v", matches="(?i)^pass$").passes(values) == [True, True, False, False, False]
    assert RowFilter(column="v", equals="pass", negate=True).passes(values) == [False, True, True, False, True]
    assert RowFilter(column="n", equals=3).passes([3, 4, None]) == [True, False, False]
    assert RowFilter(column="v", matches="^p").describe() == "v ~ /^p/"
    for bad in [{"column": "v"}, {"column": "v", "equals": "a", "matches": "a"}, {"column": "v", "matches": "("}]:
        with pytest.raises(ValidationError):
            RowFilter.model_validate(bad)


def _output(path: Path) -> Path:
    """A committed job output: input columns, the job's outputs, the bookkeeping columns."""
    n = 6
    table = pa.table(
        {
            "id": [f"r{i}" for i in range(n)],
            "prompt": [f"p{i}" for i in range(n)],
            "text": [f"t{i}" if i != 1 else None for i in range(n)],
            "verdict": ["pass", None, "fail", "pass", "pass", "fail"],
            "status": ["ok", "error", "ok", "ok", "ok", "ok"],
            "error": [None, "HTTP 500", None, None, None, None],
            "prompt_tokens": [1] * n,
            "completion_tokens": [1] * n,
            "latency_ms": pa.array([1.0] * n, pa.float32()),
            "attempts": pa.array([1] * n, pa.int16()),
            "http_status": pa.array([200, 500, 200, 200, 200, 200], pa.int16()),
        }
    )
    pq.write_table(table, path)
    return path


def test_hand_over_keeps_answered_passing_rows_and_renames_the_outputs(tmp_path: Path) -> None:
    src = _output(tmp_path / "judge.parquet")
    keep = RowFilter(column="verdict", equals="pass")
    got = hand_over(src, str(tmp_path / "next.parquet"), stage="judge", outputs=["text", "verdict"], keep=keep)
    assert (got.rows, got.answered, got.kept) == (6, 5, 3)
    table = pq.read_table(tmp_path / "next.parquet")
    assert table.column_names == ["id", "prompt", "judge_text", "judge_verdict"]
    assert not set(RESERVED_COLUMNS) & set(table.column_names)
    assert table.column("id").to_pylist() == ["r0", "r3", "r4"]
    assert set(table.column("judge_verdict").to_pylist()) == {"pass"}
    # no filter: every answered row goes on; none at all: an empty file with the columns
    assert hand_over(src, str(tmp_path / "all.parquet"), stage="judge", outputs=["text", "verdict"]).kept == 5
    none = RowFilter(column="verdict", equals="maybe")
    assert hand_over(src, str(tmp_path / "none.parquet"), stage="judge", outputs=["text"], keep=none).kept == 0
    assert pq.read_table(tmp_path / "none.parquet").column_names == ["id", "prompt", "judge_text", "verdict"]


def test_check_stage_refuses_columns_a_stage_will_not_have() -> None:
    gen = load_job("chat", {"prompt_column": "prompt"})
    after_gen = check_stage("generate", gen, ["id", "prompt"], id_column="id")
    assert after_gen == ["id", "prompt", "generate_text", "generate_finish_reason"]
    judge = load_job("chat", {"prompt_template": "{prompt} {text}"})
    with pytest.raises(ConfigError, match=r"'text' are not among the columns.*<stage>_<column>"):
        check_stage("judge", judge, after_gen)
    judge = load_job("chat", {"prompt_template": "{prompt} {generate_text}"})
    with pytest.raises(ConfigError, match=r"keep\.column 'judge_text' is not a column of its output"):
        check_stage("judge", judge, after_gen, keep=RowFilter(column="judge_text", matches="x"))
    assert (
        check_stage("judge", judge, after_gen, keep=RowFilter(column="text", matches="x"))[-1] == "judge_finish_reason"
    )
    with pytest.raises(ConfigError, match="would become column 'judge_text', which its input already has"):
        check_stage("judge", judge, [*after_gen, "judge_text"])


def test_a_second_stage_prompt_carries_the_first_stage_answer(tmp_path: Path, stub) -> None:
    """A real job process over a hand-over: its template names stage 1's answer, and the engine got
    that answer in the prompt (the stub echoes the first words of the prompt it got)."""
    src = _output(tmp_path / "gen.parquet")
    hand_over(src, str(tmp_path / "in.parquet"), stage="generate", outputs=["text", "verdict"])
    kwargs = {"prompt_template": "{generate_text} was the answer to: {prompt}", "sampling": {"max_tokens": 8}}
    res = run_job(write_spec(tmp_path, "judge", endpoints=[stub.url], job_kwargs=kwargs))
    assert res.returncode == 0, res.stderr
    rows = pq.read_table(tmp_path / "judge-out.parquet").to_pylist()
    assert [r["id"] for r in rows] == ["r0", "r2", "r3", "r4", "r5"] and all(r["status"] == "ok" for r in rows)
    for r in rows:  # "stub-<hash> <first three words of the prompt it got>"
        assert r["text"].split()[1:4] == [r["generate_text"], "was", "the"], r
