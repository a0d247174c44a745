"""The Prefect UI as a person sees it, in a real headless Chromium (Debian's `chromium`, installed
by `make setup` / scripts/slurm/ci-up.sh, driven by playwright; no browser download, loopback only):
the run form offers a block picker for ``swarm`` and refuses ``shards=0`` before submit, and the
summary artifact shows swarm, model and counts."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import job_options, prompts, stub_swarm
from stack import PrefectStack

from prefect_swarm.blocks import SwarmSpec
from prefect_swarm.config import load_config

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextmanager
def chromium_page(tmp_path: Path) -> Iterator[Any]:
    """A page of a headless Chromium; a screenshot lands in tmp_path when the test fails. Open it
    after the Prefect calls a test makes: playwright's sync API runs an event loop in this thread,
    under which Prefect's sync calls would return coroutines."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), "no /usr/bin/chromium: `make setup` (scripts/slurm/ci-up.sh) installs Debian's chromium"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        tab = browser.new_page()
        tab.set_default_timeout(60_000)
        seen: list[str] = []  # what the UI got wrong from the API, for the failure message
        tab.on("console", lambda msg: seen.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
        tab.on(
            "response",
            lambda r: seen.append(f"{r.request.method} {r.url} -> {r.status} {_body(r)}") if r.status >= 400 else None,
        )
        try:
            yield tab
        except BaseException as exc:
            tab.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            if seen:
                exc.add_note("the browser saw:\n" + "\n".join(seen[-20:]))
            raise
        finally:
            browser.close()


def _body(response: Any) -> str:
    try:
        return str(response.text())[:500]
    except Exception as exc:  # a body the browser no longer holds
        return f"(no body: {type(exc).__name__})"


def _ui(stack: PrefectStack) -> str:
    return stack.api_url.removesuffix("/api")


def _flow_runs(deployment_id: Any) -> int:
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    return len(runs)


def _saved(name: str) -> Callable[[], bool]:
    """Whether the SwarmSpec block ``name`` is saved (a loaded server may answer 503 meanwhile)."""
    import httpx

    def saved() -> bool:
        try:
            SwarmSpec.load(name, _sync=True)  # a sync read: the browser page runs an event loop in this thread
        except (ValueError, httpx.HTTPError):
            return False
        return True

    return saved


def _field(page: Any, label: str) -> Any:
    return page.locator(".schema-form-property").filter(
        has=page.locator(".schema-form-property__label", has_text=re.compile(rf"^{label}( \(Optional\))?$"))
    )


def test_run_form_picks_a_block_and_refuses_zero_shards(prefect_stack: PrefectStack, tmp_path: Path) -> None:
    from prefect import get_client

    SwarmSpec.from_config(load_config(data=stub_swarm("ui-picked"), use_defaults_file=False)).save(
        "ui-picked", overwrite=True
    )
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("batch-inference/on-demand")
    before = _flow_runs(deployment.id)
    with chromium_page(tmp_path) as page:
        refused = _run_form(
            page, f"{_ui(prefect_stack)}/deployments/deployment/{deployment.id}/run", deployment.id, before
        )
    assert refused, "the run form submitted shards=0"
    assert _flow_runs(deployment.id) > before, "the same form with shards=1 created no run"
    print("swarm: the block picker offers and takes 'ui-picked'; shards=0 refused before submit, shards=1 accepted")


def _run_form(page: Any, url: str, deployment_id: Any, before: int) -> bool:
    """Check the picker; submit shards=0 (return whether the form refused it), then shards=1."""
    from playwright.sync_api import expect

    page.goto(url)
    swarm = _field(page, "swarm").first
    swarm.get_by_role("button", name="SwarmSpec", exact=True).wait_for()
    picker = swarm.locator(".block-document-input")
    picker.wait_for()  # the SwarmSpec option of `swarm` is a block picker, not free text
    picker.locator(".block-documents-select .p-select-button").click()
    page.keyboard.press("ArrowDown")  # opens the list when the click only focused it
    option = page.locator(".p-select-option", has_text="ui-picked").first
    option.wait_for()  # the saved block is offered
    option.click()
    expect(picker.locator(".p-select-button__value")).to_contain_text("ui-picked")  # picked

    _field(page, "input").first.locator("textarea, input").first.fill("/data/in.parquet")
    _field(page, "output").first.locator("textarea, input").first.fill("/data/out.parquet")
    shards = _field(page, "shards").first.locator("input")
    submit = page.get_by_role("button", name="Submit", exact=True)
    shards.fill("0")
    shards.press("Tab")
    assert shards.input_value() == "0"
    submit.click()
    page.wait_for_timeout(5000)  # a submit that got through would have created the run and left the form
    refused = _flow_runs(deployment_id) == before and page.url.endswith("/run")
    shards.fill("1")  # the same form with a valid shard count is accepted: the refusal was about shards
    shards.press("Tab")
    _submit_until(page, submit, lambda: _flow_runs(deployment_id) > before, "the form with shards=1 made no run")
    return refused


def _submit_until(page: Any, button: Any, saved: Callable[[], bool], what: str, timeout_s: float = 240) -> int:
    """Click ``button`` until the server holds what the form makes (``saved``, read at the API: the
    UI's redirect after it can take minutes on a loaded machine). A loaded Prefect server may answer
    the form's request with 503, and the UI then shows an error and keeps the form: after 20 s with
    nothing saved the form is submitted again, as a person would. Returns the clicks it took."""
    deadline = time.monotonic() + timeout_s
    button.click()
    clicks, resubmit = 1, time.monotonic() + 20
    while not saved():
        assert time.monotonic() < deadline, f"{what} in {timeout_s:g} s"
        if time.monotonic() > resubmit:
            button.click()
            clicks, resubmit = clicks + 1, time.monotonic() + 20
        page.wait_for_timeout(2000)
    return clicks


def test_summary_artifact_shows_swarm_model_and_counts(prefect_api: PrefectStack, tmp_path: Path) -> None:
    from prefect_swarm.flows import batch_inference

    inp = prompts(tmp_path / "in.parquet", 24)
    res = batch_inference(stub_swarm("ui-art"), job_options(), str(inp), str(tmp_path / "answers.parquet"), shards=2)
    assert res["ok"] == 24
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        latest = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["ui-art-answers-summary"])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )[0]
    from playwright.sync_api import expect

    with chromium_page(tmp_path) as page:
        page.goto(f"{_ui(prefect_api)}/artifacts/artifact/{latest.id}")
        table = page.locator("table").first
        # the UI draws the numbers first and the text cells a moment later (seen under load): wait
        # for each, up to a minute, rather than read the table once
        for wanted in ("swarm", "model", "ok", "failed", "ui-art", "stub-model", "24"):
            expect(table).to_contain_text(wanted, timeout=60_000)
        text = str(table.inner_text())
    print(f"summary artifact shows: {' '.join(text.split())[:300]}")


def test_swarm_spec_form_submits_as_it_opens(prefect_stack: PrefectStack, tmp_path: Path) -> None:
    """Blocks → Swarm Spec → Create: with only the required fields filled (block name, swarm name,
    model), Create saves a block that loads as a valid config; an optional nested model (``stage``)
    opens as null, not as an empty object whose required fields block the form."""
    prefect_stack.cli("block", "register", "-m", "prefect_swarm")
    with chromium_page(tmp_path) as page:
        page.goto(f"{_ui(prefect_stack)}/blocks/catalog/swarm-spec/create")
        page.get_by_text("Block Name", exact=True).wait_for()
        boxes = page.get_by_role("textbox")  # in form order: block name, swarm name, model, ...
        boxes.nth(0).fill("ui-made")
        boxes.nth(1).fill("uimade")
        boxes.nth(2).fill("stub-model")
        create = page.get_by_role("button", name="Create", exact=True)
        if _submit_until(page, create, _saved("ui-made"), "no block saved") == 1:  # a second Create meets a 409
            page.wait_for_url(re.compile(r"/blocks/block/"), timeout=120_000)  # saved: the UI shows the new block
    cfg = SwarmSpec.load("ui-made").to_config()
    assert (cfg.name, cfg.model, cfg.replicas, cfg.stage) == ("uimade", "stub-model", 1, None)


def test_a_failed_runs_reasons_show_in_the_ui(prefect_api: PrefectStack, tmp_path: Path) -> None:
    """The run's page shows why its rows failed (the state message's *Why:* line), and so does its
    failed-rows artifact; screenshots of both are left in the test's folder."""
    from prefect_swarm.flows import batch_inference
    from prefect_swarm.testing.stub_engine import engine_command

    cfg = stub_swarm("ui-why", latency_ms=1)
    cfg["engine"]["command"] = engine_command(latency_ms=1, error_rate=0.4)
    inp = prompts(tmp_path / "in.parquet", 40)
    state = batch_inference(
        cfg, job_options(max_retries=0), str(inp), str(tmp_path / "answers.parquet"), shards=1, return_state=True
    )
    assert state.is_failed() and "\nWhy: HTTP 50" in (state.message or ""), state.message
    run_id = state.state_details.flow_run_id
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        (art,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["ui-why-answers-failed-rows"])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])),
        )
    from playwright.sync_api import expect

    with chromium_page(tmp_path) as page:
        page.goto(f"{_ui(prefect_api)}/runs/flow-run/{run_id}")
        why = page.get_by_text(re.compile(r"Why: HTTP 50\d x\d+")).first  # the run's log line of the reasons
        expect(why).to_be_visible(timeout=60_000)
        why.scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "failed-run.png"))
        page.goto(f"{_ui(prefect_api)}/artifacts/artifact/{art.id}")
        table = page.locator("table").first
        for wanted in ("reason", "rows", "example_row", "engine_said", "HTTP 50", "injected failure"):
            expect(table).to_contain_text(wanted, timeout=60_000)
        page.screenshot(path=str(tmp_path / "failed-rows-artifact.png"), full_page=True)
    print(f"screenshots: {tmp_path / 'failed-run.png'}, {tmp_path / 'failed-rows-artifact.png'}")
