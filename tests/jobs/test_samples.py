"""``samples``: n answers per row as list columns, from one request (OpenAI's ``n``) or, for an
engine that does not serve ``n``, from n requests with distinct seeds (``samples_by``); exactly once
across a kill -9 and a resume either way; refused up front when it clashes; under ``samples_by="n"``
an error row when the engine answers with fewer choices than asked."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _jobkit import job_argv, make_dataset, requests, run_job, write_spec

from prefect_swarm.exceptions import ConfigError, TooFewChoices
from prefect_swarm.jobs.api import join_choices, load_job
from prefect_swarm.jobs.checkpoint.plan import recorded_progress
from prefect_swarm.jobs.spec import JobSpec
from prefect_swarm.testing.stub_engine import answer
from prefect_swarm.testing.waiting import wait_until


@pytest.mark.parametrize(("ref", "path"), [("chat", "/v1/chat/completions"), ("completion", "/v1/completions")])
def test_one_request_asks_for_n_and_each_answer_lands_in_the_lists(ref: str, path: str) -> None:
    job = load_job(ref, {"samples": 4, "sampling": {"max_tokens": 8}})
    body = job.body({"prompt": "why is the sky blue"})
    assert body["n"] == 4 and body["max_tokens"] == 8
    assert job.outputs["text"] == pa.list_(pa.string()) and job.outputs["finish_reason"] == pa.list_(pa.string())
    out = job.parser()(answer(path, {**body, "model": "m"}, "m"))
    assert len(out["text"]) == 4 and len(set(out["text"])) == 4  # four different answers, in choice order
    assert out["text"][1].endswith("#1") and len(out["finish_reason"]) == 4
    single = load_job(ref, {"sampling": {"max_tokens": 8}})  # samples=1: plain strings, as before
    assert "n" not in single.body({"prompt": "x"}) and single.outputs["text"] == pa.string()


def test_an_engine_that_ignores_n_gets_the_row_refused_not_shortened() -> None:
    job = load_job("chat", {"samples": 3})
    one = answer("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "m")
    with pytest.raises(TooFewChoices, match=r"asked for 3 answers .* returned 1"):
        job.parser()(one)


@pytest.mark.parametrize(("sampling", "seeds"), [({"temperature": 0.8}, [0, 1, 2]), ({"seed": 7}, [7, 8, 9])])
def test_one_request_per_answer_each_with_its_own_seed_joined_in_seed_order(sampling: dict, seeds: list) -> None:
    job = load_job("completion", {"samples": 3, "sampling": sampling})
    body = {**job.body({"prompt": "why"}), "model": "m"}
    subs = job.sample_requests(body)
    assert [s["seed"] for s in subs] == seeds and all("n" not in s for s in subs)
    assert all({k: v for k, v in s.items() if k != "seed"} == {k: v for k, v in body.items() if k not in ("n", "seed")}
               for s in subs)  # fmt: skip
    answers = [answer("/v1/completions", s, "m") for s in subs]
    joined = join_choices(answers)
    out = job.parser()(joined)
    assert out["text"] == [a["choices"][0]["text"] for a in answers] and len(set(out["text"])) == 3
    assert [c["index"] for c in joined["choices"]] == [0, 1, 2]
    for key in ("prompt_tokens", "completion_tokens"):  # every request's tokens were paid for
        assert joined["usage"][key] == sum(a["usage"][key] for a in answers)
    assert load_job("completion", {"sampling": sampling}).sample_requests({"prompt": "x"}) == [{"prompt": "x"}]


def test_a_bad_samples_by_is_refused_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"samples_by must be one of auto, n, seeds \(got 'requests'\)"):
        load_job("chat", {"samples": 2, "samples_by": "requests"})


@pytest.mark.parametrize(
    ("kwargs", "wanted"),
    [
        ({"samples": 0}, "samples must be a whole number"),
        ({"samples": "4"}, "samples must be a whole number"),
        ({"samples": 2, "sampling": {"n": 2}}, "not also sampling.n"),
        ({"samples": 100000}, "samples is 100000, more than the 128 answers one row may ask for"),
        ({"sampling": {"n": 129}}, "sampling.n is 129, more than the 128 answers"),
    ],
)
def test_bad_samples_are_refused_naming_the_field(kwargs: dict, wanted: str) -> None:
    with pytest.raises(ConfigError, match=wanted):
        load_job("chat", kwargs)


def test_samples_with_a_response_schema_is_refused(tmp_path: Path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}')
    with pytest.raises(ConfigError, match="samples > 1 and response_schema"):
        load_job("chat", {"samples": 2, "response_schema": str(schema)})


@pytest.mark.parametrize("samples_by", ["n", "auto"])
def test_four_answers_per_row_exactly_once_across_a_kill_and_resume(
    tmp_path: Path, stub, stub_factory, samples_by: str
) -> None:
    """``n``: one request per row on an engine serving n. ``auto``: an engine without n, so each
    row's answers come from 4 seeded requests; the reference run asks for them so from the start
    (``seeds``), so both runs sent the same requests and must hold the same answers."""
    n = 1200
    make_dataset(tmp_path / "in.parquet", n)
    kwargs = {"samples": 4, "sampling": {"max_tokens": 8, "temperature": 0}}
    ref_kwargs = {**kwargs, "samples_by": "seeds" if samples_by == "auto" else "n"}
    ref = write_spec(tmp_path, "ref", endpoints=[stub.url], job_kwargs=ref_kwargs)
    assert run_job(ref).returncode == 0
    slow = stub_factory(latency_ms=20, ignore_n=samples_by == "auto")  # the kill lands mid-job
    spec = write_spec(
        tmp_path, "killed", endpoints=[slow.url], job_kwargs={**kwargs, "samples_by": samples_by}, concurrency=16,
        checkpoint_every=100, checkpoint_seconds=0.3,
    )  # fmt: skip
    proc = subprocess.Popen(job_argv(spec), stderr=subprocess.DEVNULL)
    job = JobSpec.load(spec)
    # killed once the checkpoint holds 100 rows: a part of 1 row (a loaded machine) saves fewer
    # requests than the rerun's first requests asked with n cost, so the count below would not show it
    wait_until(
        "a checkpoint of 100 rows (or the job's end)",
        lambda: (recorded_progress(job, 0).get("done", 0), proc.poll()),
        until=lambda seen: seen[0] >= 100 or seen[1] is not None,
        timeout_s=120,
        poll_s=0.05,
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    per_row = 1 if samples_by == "n" else 4
    first = requests(slow)
    assert first < n * per_row, "the job ended before the kill"
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    assert requests(slow) - first < n * per_row  # the rerun resumed: it did not ask every row again
    got, want = pq.read_table(tmp_path / "killed-out.parquet"), pq.read_table(tmp_path / "ref-out.parquet")
    assert got.num_rows == n and len(set(got.column("id").to_pylist())) == n
    texts = got.column("text").to_pylist()
    assert all(len(t) == 4 and len(set(t)) == 4 for t in texts)
    assert texts == want.column("text").to_pylist()  # the same answers as the run never killed
    assert got.column("completion_tokens").to_pylist() == want.column("completion_tokens").to_pylist()


def test_an_engine_without_n_under_each_samples_by(tmp_path: Path, stub_factory) -> None:
    """``n``: every row an error row saying the engine does not serve n, none shortened. ``auto``:
    the first answers show it, one warning says so, and every row gets 4 seeded answers (a row or
    so per request slot was asked with n first). ``seeds``: 4 requests per row from the start."""
    rows = 60
    make_dataset(tmp_path / "in.parquet", rows)
    without_n = stub_factory(ignore_n=True)
    kwargs = {"samples": 4, "sampling": {"max_tokens": 8, "temperature": 0}}
    sent = {}
    for by in ("n", "auto", "seeds"):
        before = requests(without_n)
        spec = write_spec(tmp_path, by, endpoints=[without_n.url], job_kwargs={**kwargs, "samples_by": by},
                          concurrency=4, max_failed_fraction=1.0)  # fmt: skip
        res = run_job(spec)
        assert res.returncode == 0, res.stderr
        sent[by] = requests(without_n) - before
        out = pq.read_table(tmp_path / f"{by}-out.parquet").to_pydict()
        if by == "n":
            assert set(out["status"]) == {"error"} and all(t is None for t in out["text"])
            assert all("does not serve OpenAI's n" in e for e in out["error"])
            continue
        assert set(out["status"]) == {"ok"}
        assert all(len(t) == 4 and len(set(t)) == 4 for t in out["text"])
        assert res.stderr.count("does not serve OpenAI's n") == (by == "auto"), res.stderr
    assert sent["seeds"] == 4 * rows
    assert 4 * rows < sent["auto"] <= 4 * rows + 4  # at most one n request per request slot
    auto = pq.read_table(tmp_path / "auto-out.parquet").column("text").to_pylist()
    assert auto == pq.read_table(tmp_path / "seeds-out.parquet").column("text").to_pylist()


def test_each_seeded_request_is_retried_on_its_own_and_the_row_counts_them_all(tmp_path: Path, stub_factory) -> None:
    rows = 80
    make_dataset(tmp_path / "in.parquet", rows)
    flaky = stub_factory(error_rate=0.25, seed=3)
    kwargs = {"samples": 3, "samples_by": "seeds", "sampling": {"max_tokens": 8, "temperature": 0}}
    spec = write_spec(tmp_path, "flaky", endpoints=[flaky.url], job_kwargs=kwargs, concurrency=4,
                      max_retries=20, backoff_base_s=0.01, backoff_max_s=0.05)  # fmt: skip
    res = run_job(spec)
    assert res.returncode == 0, res.stderr
    out = pq.read_table(tmp_path / "flaky-out.parquet").to_pydict()
    assert set(out["status"]) == {"ok"} and all(len(t) == 3 for t in out["text"])
    failed = flaky.stats()["5xx"]
    assert failed > 0 and requests(flaky) == 3 * rows + failed  # only the failed request was sent again
    clean = stub_factory()
    spec = write_spec(tmp_path, "clean", endpoints=[clean.url], job_kwargs=kwargs, concurrency=4)
    assert run_job(spec).returncode == 0
    want = pq.read_table(tmp_path / "clean-out.parquet").to_pydict()
    assert out["text"] == want["text"]  # a retried request is the same request: the same answer
    assert out["prompt_tokens"] == want["prompt_tokens"] and out["completion_tokens"] == want["completion_tokens"]


def test_seeded_answers_come_back_from_the_response_cache_whole(tmp_path: Path, stub_factory) -> None:
    """A row answered by its seeded requests is cached as one joined answer: a second job asking the
    same sends nothing and gets the same N answers (and, as any cache hit, no tokens spent)."""
    rows = 40
    make_dataset(tmp_path / "in.parquet", rows)
    without_n = stub_factory(ignore_n=True)
    kwargs = {"samples": 3, "samples_by": "auto", "sampling": {"max_tokens": 8, "temperature": 0}}
    cache = {"cache": True, "cache_dir": str(tmp_path / "cache"), "swarm_fingerprint": "stub-fp"}
    outs = []
    for name in ("first", "again"):
        before = requests(without_n)
        spec = write_spec(tmp_path, name, endpoints=[without_n.url], job_kwargs=kwargs, concurrency=4, **cache)
        res = run_job(spec)
        assert res.returncode == 0, res.stderr
        outs.append((requests(without_n) - before, pq.read_table(tmp_path / f"{name}-out.parquet").to_pydict()))
    (sent_first, first), (sent_again, again) = outs
    assert sent_first >= 3 * rows and sent_again == 0
    assert all(len(t) == 3 for t in again["text"]) and again["text"] == first["text"]
    assert min(first["completion_tokens"]) > 0 and set(again["completion_tokens"]) == {0}
