"""The canvas as a user sees it: Debian's chromium, headless, driven by Playwright for Python
(the system browser through ``executable_path``; ``playwright install`` is never run).

On ``make run``'s server (conftest.py; authentication on, so every page first goes through
Langflow's login form) it opens the starter flow, finds "CreateOS Sandbox" in the component
search, runs the flow from the Playground, and checks that both outputs name a guest that
createos-local really ran; then runs the same starter through ``/api/v1/run``. Then it imports the shipped flow file through Langflow's own
"Upload a flow" button, as a user would, and runs the imported flow the same way.
Screenshots land in tests/artifacts/ (not committed):

  canvas-search.png    the canvas with the starter flow and the search result "CreateOS Sandbox"
  canvas-run.png       the Playground after "Run Flow": both outputs, each with its guest's id
  canvas-added.png     the canvas after adding a second CreateOS Sandbox from the search result
  canvas-imported.png  the flow imported from createos_starter_flow.json, with the sidebar
  canvas-imported-run.png  its Playground after "Run Flow"
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langflow_sandbox_createos import starter

from .test_executor_server import post

pytestmark = [pytest.mark.langflow, pytest.mark.timeout(600)]

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
SANDBOX_ID = re.compile(r"\bsb-[0-9a-z]{10,}\b")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[test]'")
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: run scripts/install-system-deps.sh")
    with sync_api.sync_playwright() as pw:
        # --no-sandbox: chromium's own sandbox refuses to run as root (CI containers).
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, langflow_server: Any) -> Iterator[Any]:
    """A logged-in page (the server has authentication on)."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    console: list[str] = []
    pg.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    langflow_server.login(pg)
    yield pg
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "canvas-console.txt").write_text("\n".join(console[-300:]))
    context.close()


def run_in_playground(page: Any, server: Any, screenshot: str) -> tuple[str, str]:
    """Open the Playground of the flow on screen, press Run Flow, and return the guest ids the
    Python Interpreter and the CreateOS Sandbox printed; both must be new guests createos-local ran."""
    before = {sb["id"] for sb in server.sandboxes()}
    page.click('[data-testid="playground-btn-flow-io"]')
    page.locator('[data-testid="button-send"]').wait_for(state="visible")
    page.wait_for_timeout(1000)  # earlier runs' messages, if any, render first
    seen = page.evaluate("() => (document.body.innerText.match(/ ran on sb-/g) || []).length")
    page.click('[data-testid="button-send"]')
    page.wait_for_function(
        f"() => (document.body.innerText.match(/ ran on sb-/g) || []).length >= {seen} + 2", timeout=180_000
    )
    page.wait_for_timeout(500)  # let the second message finish rendering before the screenshot
    page.screenshot(path=str(ARTIFACTS / screenshot))
    text = page.locator("body").inner_text()
    interpreter = re.findall(r"Python Interpreter ran on (sb-[0-9a-z]+)", text)[-1]
    sandbox = re.findall(r"CreateOS Sandbox ran on (sb-[0-9a-z]+)", text)[-1]
    new = {sb["id"] for sb in server.sandboxes()} - before
    assert interpreter in new and sandbox in new and interpreter != sandbox, (interpreter, sandbox, new)
    return interpreter, sandbox


def test_canvas_search_and_run(langflow_server: Any, page: Any) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    # 1. The starter flow that make run imported, on the canvas.
    page.goto(f"{langflow_server.url}/flow/{langflow_server.starter_flow_id}", timeout=120_000)
    page.wait_for_selector('[data-testid="rf__node-PythonREPLComponent-cos01"]', timeout=120_000)
    page.wait_for_selector('[data-testid="rf__node-CreateOSSandbox-cos02"]')

    # 2. The component search finds "CreateOS Sandbox" (the extension's component).
    page.fill('[data-testid="sidebar-search-input"]', "CreateOS Sandbox")
    sidebar = page.locator('[data-testid="shad-sidebar"]')
    hit = sidebar.locator('[data-testid="display-name"]', has_text="CreateOS Sandbox")
    hit.first.wait_for(state="visible")
    assert sidebar.locator('[data-testid="add-component-button-createos-sandbox"]').count() == 1
    page.screenshot(path=str(ARTIFACTS / "canvas-search.png"))

    # 3. Run the flow from the Playground; both Chat Outputs must name their guest.
    _, sandbox = run_in_playground(page, langflow_server, "canvas-run.png")
    text = page.locator("body").inner_text()
    assert f'"sandbox_id": "{sandbox}"' in text  # the component's Results, as rendered

    # 4. The search result is usable: "+" drops a second CreateOS Sandbox on the canvas.
    page.click('[data-testid="playground-close-button"]')
    page.fill('[data-testid="sidebar-search-input"]', "CreateOS Sandbox")
    page.click('[data-testid="add-component-button-createos-sandbox"]')
    titles = page.locator('[data-testid="title-CreateOS Sandbox"]')
    page.wait_for_function(
        "() => document.querySelectorAll('[data-testid=\"title-CreateOS Sandbox\"]').length === 2"
    )
    assert titles.count() == 2
    page.screenshot(path=str(ARTIFACTS / "canvas-added.png"))

    # 5. The same starter through the API, as an integration calls it: both nodes run on new
    # guests there too (tests/e2e/test_executor_server.py does it under the executor).
    before = {sb["id"] for sb in langflow_server.sandboxes()}
    client = langflow_server.client()
    body = {"input_value": "hi", "input_type": "chat", "output_type": "any"}
    answer = json.loads(post(langflow_server, client, f"/api/v1/run/{langflow_server.starter_flow_id}", body))
    texts = " ".join(o["results"]["message"]["text"] for o in answer["outputs"][0]["outputs"])
    ran_on = set(re.findall(r"(?:Python Interpreter|CreateOS Sandbox) ran on (sb-[0-9a-z]+)", texts))
    new = {sb["id"] for sb in langflow_server.sandboxes()} - before
    assert len(ran_on) == 2 and ran_on <= new, (texts, new)


def test_flow_file_imported_through_the_ui_runs(langflow_server: Any, page: Any, tmp_path: Path) -> None:
    """The shipped export, saved the way the docs say, goes through Langflow's "Upload a flow"
    (its file chooser) untouched, and the imported flow runs both nodes on guests."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    flow_file = tmp_path / starter.EXPORT_FILE
    assert starter.main(["--save", str(flow_file)]) == 0
    client = langflow_server.client()
    before = {f["id"] for f in client.flows()}

    page.goto(f"{langflow_server.url}/", timeout=120_000)
    with page.expect_file_chooser() as chooser:
        page.click('[data-testid="upload-project-button"]', timeout=120_000)
    chooser.value.set_files(str(flow_file))
    deadline = time.monotonic() + 120
    while not (new := {f["id"]: f for f in client.flows() if f["id"] not in before}):
        assert time.monotonic() < deadline, "the upload created no flow"
        time.sleep(1)
    [(flow_id, flow)] = new.items()
    assert flow["name"].startswith(starter.load_export()["name"])  # "CreateOS starter (1)" next to make run's
    stored = client.request("GET", f"/api/v1/flows/{flow_id}")
    assert sorted(n["data"]["type"] for n in stored["data"]["nodes"]) == sorted(
        n["data"]["type"] for n in starter.load_export()["data"]["nodes"]
    )
    assert len(stored["data"]["edges"]) == 2

    page.goto(f"{langflow_server.url}/flow/{flow_id}", timeout=120_000)
    page.wait_for_selector('[data-testid="title-Python Interpreter"]', timeout=120_000)
    page.wait_for_selector('[data-testid="title-CreateOS Sandbox"]')
    page.screenshot(path=str(ARTIFACTS / "canvas-imported.png"))
    run_in_playground(page, langflow_server, "canvas-imported-run.png")
