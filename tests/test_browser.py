"""End to end: the learner's JupyterLab in a real headless browser.

JupyterLab starts the way `make lab` starts it (the command is read from `make -n lab`), on a free
localhost port, serving a copy of the learner course (notebooks/, assessments/,
nbgrader_config.py) in a temporary folder, so nothing the browser saves lands in the repo.
Debian's Chromium, driven by Playwright, then checks what a learner sees: nbgrader's Validate
button but no instructor tools, no "Jupyter news" pop-up, a notebook that runs, Validate failing
on the blank learner copy, progress bars drawn as widgets (and as rare plain text under
papermill), Lab 1's batch-size slider redrawing its plot once the exercises above it are answered
(the test types in the answers from solutions/, as a learner would have), the assessment opening. The instructor view (`make lab-instructor`) is the control:
there the instructor tools are present.

Every step leaves a screenshot in screenshots/browser/ (gitignored) for a person to look at.
`make test-deps` installs Chromium (apt-get, no browser download) and playwright; the tests
skip only where Chromium is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil
import pytest

from conftest import REPO

CHROMIUM = os.environ.get("MULTIGPU_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = REPO / "screenshots" / "browser"
LAB1 = "notebooks/01-gd-vs-sgd.ipynb"

# plugin ids from the installed labextensions (@jupyter/nbgrader 0.9.6, JupyterLab 4.6)
INSTRUCTOR_PLUGINS = (
    "@jupyter/nbgrader:formgrader",
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:course-list",
)
NEWS_PLUGIN = "@jupyterlab/apputils-extension:announcements"
NEWS_TEXT = re.compile("Jupyter news", re.I)

# generous: the machine may be a busy 2-core laptop
START_S = 150  # JupyterLab server up
LOAD_MS = 120_000  # page, notebook and kernel ready
VALIDATE_MS = 240_000  # nbgrader runs the whole notebook in a fresh kernel

NO_CHROMIUM = (
    f"no Chromium at {CHROMIUM}: `make test-deps` installs Debian's chromium with apt-get "
    "(needs root or passwordless sudo), or set MULTIGPU_CHROMIUM to a Chromium binary"
)

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------------ the server
@dataclass
class Lab:
    base: str  # http://127.0.0.1:PORT
    token: str
    root: Path  # the folder JupyterLab serves
    log: Path

    def get(self, path: str, *, token: bool = True) -> int:
        """HTTP status of GET path (with or without the token)."""
        url = self.base + path + (f"?token={self.token}" if token else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as reply:
                return reply.status
        except urllib.error.HTTPError as err:
            return err.code


def make_lab_command(target: str, port: int) -> tuple[dict[str, str], list[str]]:
    """The environment assignments and argv of the `jupyter lab` line of `make TARGET`."""
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", ".venv/.setup-done", target, "IP=127.0.0.1", f"PORT={port}"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    lines = [line for line in dry.replace("\\\n", " ").splitlines() if re.search(r"jupyter\s+lab\b", line)]
    assert len(lines) == 1, f"expected one `jupyter lab` command in `make -n {target}`, got:\n{dry}"
    words = shlex.split(lines[0])
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    assert words and words[0].endswith("jupyter") and words[1] == "lab", f"unexpected command: {lines[0]}"
    words[0] = str(Path(sys.executable).parent / "jupyter")  # the environment running the tests
    return env, words


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def course_copy(dest: Path) -> Path:
    """What a learner has: the learner copies and the nbgrader config, nothing from solutions/."""
    dest.mkdir(parents=True)
    for name in ("notebooks", "assessments"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copy2(REPO / "nbgrader_config.py", dest / "nbgrader_config.py")
    (dest / "grading").mkdir()
    return dest


def stop_server(proc: subprocess.Popen, lab: Lab | None) -> None:
    """Shut JupyterLab down politely, then by force; its kernels and workers too."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        family = []
    if lab is not None and proc.poll() is None:
        try:
            request = urllib.request.Request(f"{lab.base}/api/shutdown?token={lab.token}", method="POST")
            urllib.request.urlopen(request, timeout=15).close()
            proc.wait(timeout=30)
        except Exception:  # falls through to the signals below
            pass
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    for child in family:  # kernels run in their own session: not in the process group
        try:
            child.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="module")
def start_lab(tmp_path_factory) -> Iterator:
    """start_lab(target) -> Lab: `make TARGET`'s JupyterLab on a free port, stopped at the end."""
    started: list[tuple[subprocess.Popen, Lab | None]] = []

    def start(target: str) -> Lab:
        port = free_port()
        make_env, argv = make_lab_command(target, port)
        home = tmp_path_factory.mktemp(f"{target}-jupyter")
        root = course_copy(home / "course")
        # root_dir: the copy, not the repo; no desktop browser; the app object for the test
        argv = [a for a in argv if not a.startswith("--ServerApp.root_dir=")] + [
            f"--ServerApp.root_dir={root}",
            "--ServerApp.open_browser=False",
            "--LabApp.expose_app_in_browser=True",
        ]  # as root (CI) the server starts only if `make lab` itself passes --ServerApp.allow_root
        env = dict(os.environ, **make_env)
        # the tester's own ~/.jupyter and saved workspaces must not change what the test sees
        for var, sub in (
            ("JUPYTER_CONFIG_DIR", "user-config"),
            ("JUPYTER_DATA_DIR", "user-data"),
            ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("JUPYTERLAB_SETTINGS_DIR", "settings"),
            ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
            ("IPYTHONDIR", "ipython"),
        ):
            (home / sub).mkdir()
            env[var] = str(home / sub)
        env["MULTIGPU_QUICK"] = "1"
        log = home / "jupyter.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        started.append((proc, None))
        deadline = time.monotonic() + START_S
        pattern = re.compile(rf"http://127\.0\.0\.1:{port}/\S*\?token=([0-9a-f]+)")
        while time.monotonic() < deadline:
            match = pattern.search(log.read_text(errors="replace"))
            if match:
                break
            if proc.poll() is not None:
                pytest.fail(f"`make {target}`'s JupyterLab exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        else:
            pytest.fail(f"JupyterLab did not start within {START_S} s:\n{log.read_text()[-3000:]}")
        lab = Lab(base=f"http://127.0.0.1:{port}", token=match.group(1), root=root, log=log)
        started[-1] = (proc, lab)
        return lab

    try:
        yield start
    finally:
        for proc, lab in started:
            stop_server(proc, lab)


@pytest.fixture(scope="module")
def learner(start_lab) -> Lab:
    return start_lab("lab")


# ------------------------------------------------------------------------------------ the browser
@contextmanager
def headless_chromium() -> Iterator:
    """Debian's Chromium, headless, through Playwright (every browser test of the course uses this):
    skipped without Chromium, failed with what to run without playwright."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(NO_CHROMIUM)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: run `make test-deps`")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as chromium:
        SHOTS.mkdir(parents=True, exist_ok=True)
        for old in SHOTS.glob("*.png"):
            old.unlink()
        yield chromium


@pytest.fixture(scope="module")
def page(browser, learner):
    """One learner tab for the whole module (JupyterLab loads once)."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(LOAD_MS)
    try:
        yield tab
    finally:
        context.close()


def shot(page, name: str) -> Path:
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def current_notebook_ready(page, path: str) -> None:
    """Wait until `path` is the open notebook, rendered, with an idle kernel."""
    page.wait_for_function(
        """(path) => {
            const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            if (!w || !w.context || w.context.path !== path || !w.context.isReady) return false;
            const k = w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
            return !!k && k.status === 'idle' && w.content.widgets.length > 0;
        }""",
        arg=path, timeout=LOAD_MS,
    )
    page.locator(".jp-NotebookPanel:visible .jp-Cell").first.wait_for(state="visible")


def open_notebook(page, path: str) -> None:
    """Open a notebook the way the file browser does (docmanager:open)."""
    page.evaluate("async (path) => { await window.jupyterapp.commands.execute('docmanager:open', {path}); }", path)
    current_notebook_ready(page, path)


def close_all(page) -> None:
    """Close every tab and shut every kernel down (keeps a 2-core machine breathing)."""
    page.evaluate(
        """async () => {
            const app = window.jupyterapp;
            await app.commands.execute('docmanager:save-all');  // the course copy: no "save?" dialogs
            await app.commands.execute('application:close-all');
            await app.serviceManager.sessions.refreshRunning();
            for (const s of Array.from(app.serviceManager.sessions.running()))
                await app.serviceManager.sessions.shutdown(s.id);
        }"""
    )


def run_cell(page, index: int, timeout_ms: int = LOAD_MS) -> bool:
    """Run cell `index` of the open notebook (Run > Run Selected Cell); True when it raised nothing."""
    return page.evaluate(
        """async ([index, ms]) => {
            const app = window.jupyterapp;
            const nb = app.shell.currentWidget.content;
            nb.activeCellIndex = index;
            nb.deselectAll();
            const ran = app.commands.execute('notebook:run-cell').then((ok) => ok !== false);
            const late = new Promise((_, fail) => setTimeout(() => fail(new Error('cell ' + index + ' still running after ' + ms + ' ms')), ms));
            return await Promise.race([ran, late]);
        }""",
        [index, timeout_ms],
    )


def nbgrader_role(cell) -> str:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if meta.get("grade") and not meta.get("solution"):
        return "test"
    return "exercise" if meta.get("solution") else ""


# ------------------------------------------------------------------------------------ the tests
def test_learner_view_has_validate_but_no_instructor_tools_or_news(page, learner):
    # learners get a token URL, like any JupyterLab; without it the server says no
    assert learner.get("/api/status", token=False) == 403, "JupyterLab must ask for its token"
    assert learner.get("/api/status") == 200
    # nbgrader's instructor server extensions are off in the learner view, the learner ones on
    assert learner.get("/formgrader") == 404, "the formgrader must be off in `make lab`"
    assert learner.get("/assignments") != 404, "nbgrader's assignment list must be on in `make lab`"

    # `make lab` opens the welcome notebook
    page.goto(f"{learner.base}/?token={learner.token}")
    current_notebook_ready(page, "notebooks/00-welcome.ipynb")
    page.locator(".jp-NotebookPanel:visible .validate-button").wait_for(state="visible")
    config = json.loads(page.locator("#jupyter-config-data").text_content())
    disabled = config.get("disabledExtensions", [])
    for plugin in (*INSTRUCTOR_PLUGINS, NEWS_PLUGIN):
        assert plugin in disabled, f"{plugin} should be disabled in the learner view (jupyter/learner/)"
    assert "@jupyter/nbgrader:validate-assignment" not in disabled
    assert "@jupyter/nbgrader:assignment-list" not in disabled
    page.wait_for_timeout(3000)  # JupyterLab asks about news shortly after start-up, when it asks
    shot(page, "01-learner-welcome")
    assert page.locator("#nbgrader-create_assignemnt").count() == 0, "Create Assignment sidebar present"
    assert page.get_by_text("Create Assignment").count() == 0, "the learner sees 'Create Assignment'"
    assert page.get_by_text(NEWS_TEXT).count() == 0, "the 'Jupyter news' pop-up is shown"

    # the Nbgrader menu: the assignment list only
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
    menu = page.locator(".lm-Menu:visible").first
    menu.wait_for(state="visible")
    items = [t.strip() for t in menu.locator(".lm-Menu-itemLabel").all_inner_texts() if t.strip()]
    shot(page, "02-learner-nbgrader-menu")
    page.keyboard.press("Escape")
    assert "Assignment List" in items, f"Nbgrader menu: {items}"
    for tool in ("Formgrader", "Course List", "Create assignment"):
        assert not any(tool.lower() in item.lower() for item in items), f"learner menu offers {tool}: {items}"


def test_welcome_notebook_runs_and_validate_fails_on_blank_copy(page, learner):
    path = "notebooks/00-welcome.ipynb"
    if page.evaluate("() => window.jupyterapp.shell.currentWidget?.context?.path") != path:
        open_notebook(page, path)
    notebook = page.locator(".jp-NotebookPanel:visible")
    code = notebook.locator(".jp-CodeCell")
    # a learner's first steps: click a code cell, Shift+Enter, twice
    for i in range(2):
        code.nth(i).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        page.wait_for_function(
            """([sel, i]) => /\\[\\d+\\]/.test(document.querySelectorAll(sel)[i].querySelector('.jp-InputPrompt').textContent)""",
            arg=[".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell", i], timeout=LOAD_MS,
        )
        assert re.search(r"\[\d+\]", code.nth(i).locator(".jp-InputPrompt").inner_text())
    described = code.nth(1).locator(".jp-OutputArea-output").first.inner_text()
    assert "mode" in described.lower(), f"devices.describe() printed: {described!r}"
    shot(page, "03-welcome-cells-run")

    # nbgrader's Validate: runs the whole notebook as the grader will; the blank copy must fail
    notebook.locator(".validate-button").click()
    result = page.locator("#validation-message")
    result.wait_for(state="visible", timeout=VALIDATE_MS)
    text = result.inner_text()
    classes = result.get_attribute("class") or ""
    shot(page, "04-welcome-validate-fails")
    page.locator(".jp-Dialog button", has_text=re.compile("^ok$", re.I)).click()
    assert "validation-failed" in classes, f"Validate should fail on the blank learner copy; it said: {text[:500]}"
    assert "The following cell failed" in text and "NotImplementedError" in text, text[:1000]
    assert page.get_by_text(NEWS_TEXT).count() == 0, "the 'Jupyter news' pop-up is shown"
    close_all(page)


def test_progress_bar_is_a_widget_in_jupyterlab(page, learner):
    scratch = nbformat.v4.new_notebook()
    scratch.cells = [
        nbformat.v4.new_code_cell(
            "import time\n"
            "from multigpu.core.notebook import in_jupyter, progress\n"
            "print('widget mode:', in_jupyter())\n"
            "for _ in progress(range(40), desc='demo', unit='step'):\n"
            "    time.sleep(0.05)"
        )
    ]
    scratch.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(scratch, learner.root / "progress-check.ipynb")
    open_notebook(page, "progress-check.ipynb")
    assert run_cell(page, 0), "the progress cell raised"
    output = page.locator(".jp-NotebookPanel:visible .jp-CodeCell").first.locator(".jp-OutputArea")
    output.locator(".widget-hprogress").wait_for(state="visible")  # ipywidgets' progress bar
    page.wait_for_function(
        "() => /40\\/40/.test(document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea').innerText)",
        timeout=LOAD_MS,
    )
    text = output.inner_text()
    shot(page, "05-progress-widget")
    assert "widget mode: True" in text, text
    assert "40/40" in text and "demo" in text, f"progress widget text: {text!r}"
    assert "\r" not in text
    close_all(page)


def test_progress_bar_is_rare_plain_text_under_papermill(tmp_path, monkeypatch):
    """No browser: the same cell run headless (papermill) writes text, not a widget, and rarely."""
    import papermill

    source = nbformat.v4.new_notebook()
    source.cells = [
        nbformat.v4.new_code_cell(
            "import time\n"
            "from multigpu.core.notebook import in_jupyter, progress\n"
            "print('widget mode:', in_jupyter())\n"
            "for _ in progress(range(300), desc='demo'):\n"
            "    time.sleep(0.01)"
        )
    ]
    source.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(source, tmp_path / "in.ipynb")
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)  # in case pytest itself runs in JupyterLab
    monkeypatch.delenv("MULTIGPU_PLAIN_PROGRESS", raising=False)
    papermill.execute_notebook(str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3",
                               progress_bar=False, cwd=str(tmp_path))
    outputs = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0].outputs
    assert all(o.output_type == "stream" for o in outputs), [o.output_type for o in outputs]
    stdout = "".join(o.text for o in outputs if o.name == "stdout")
    stderr = "".join(o.text for o in outputs if o.name == "stderr")
    assert "widget mode: False" in stdout
    assert "300/300" in stderr
    assert stderr.count("\r") <= 4, f"the text bar redraws too often for a log: {stderr!r}"


def test_lab1_batch_size_slider_redraws_the_plot(page, learner):
    assert (learner.root / LAB1).exists(), f"{LAB1} is missing from the release"
    nb = nbformat.read(learner.root / LAB1, as_version=4)
    slider = next(
        (i for i, c in enumerate(nb.cells) if c.cell_type == "code"
         and re.search(r"Slider|interact|explorer", c.source) and re.search(r"batch|explorer", c.source, re.I)),
        None,
    )
    assert slider is not None, f"{LAB1} has no cell with a batch-size slider"
    # A learner reaches the slider after the exercises above it: type in their answers (the
    # instructor's solutions), run every code cell above (the graded test cells are skipped: the
    # Validate step covers them), then the slider cell.
    source = REPO / "solutions" / LAB1
    answers = {}
    if source.exists():
        answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in nbformat.read(source, as_version=4).cells
                   if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    open_notebook(page, LAB1)
    for i, cell in enumerate(nb.cells[:slider]):
        if cell.cell_type != "code" or nbgrader_role(cell) == "test":
            continue
        if nbgrader_role(cell) == "exercise" and cell.metadata["nbgrader"].get("grade_id") in answers:
            page.evaluate(
                "([i, src]) => window.jupyterapp.shell.currentWidget.content.widgets[i].model.sharedModel.setSource(src)",
                [i, answers[cell.metadata["nbgrader"]["grade_id"]]],
            )
        run_cell(page, i, timeout_ms=150_000)
    assert run_cell(page, slider), f"the slider cell (cell {slider}) of {LAB1} raised"
    cell = page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(slider)
    batch = cell.locator(".widget-slider", has=page.locator(".widget-label", has_text=re.compile("batch", re.I))).first
    batch.wait_for(state="visible")
    image = cell.locator(".jp-OutputArea img").first
    image.wait_for(state="visible")
    cell.scroll_into_view_if_needed()
    before_value = batch.locator(".widget-readout").inner_text()
    before = image.get_attribute("src")
    shot(page, "06-lab1-batch-slider")

    batch.locator(".noUi-handle").first.focus()  # move it like a learner with the keyboard
    page.keyboard.press("ArrowRight")
    page.wait_for_function(
        "([el, old]) => { const img = el.querySelector('.jp-OutputArea img'); return img && img.src !== old; }",
        arg=[cell.element_handle(), before], timeout=LOAD_MS,
    )
    after_value = batch.locator(".widget-readout").inner_text()
    cell.scroll_into_view_if_needed()
    shot(page, "07-lab1-batch-slider-moved")
    assert after_value != before_value, f"the batch readout did not change ({before_value})"
    assert image.get_attribute("src") != before
    close_all(page)


def test_assessment_opens_with_validate(page, learner):
    found = sorted((learner.root / "assessments").glob("*.ipynb"))
    assert found, "assessments/ has no notebook: run make release"
    path = found[0].relative_to(learner.root).as_posix()
    open_notebook(page, path)
    panel = page.locator(".jp-NotebookPanel:visible")
    panel.locator(".validate-button").wait_for(state="visible")
    panel.locator(".jp-MarkdownCell h1").first.wait_for(state="visible")
    shot(page, "08-assessment")
    assert panel.locator(".jp-Cell").count() >= 3
    assert page.get_by_text("Create Assignment").count() == 0
    close_all(page)


def test_instructor_view_has_the_instructor_tools(start_lab, browser):
    """The control: the same checks see the formgrader and Create Assignment where they belong."""
    lab = start_lab("lab-instructor")
    assert lab.get("/formgrader") == 200, "the formgrader must be on in `make lab-instructor`"
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        tab = context.new_page()
        tab.set_default_timeout(LOAD_MS)
        tab.goto(f"{lab.base}/lab/tree/notebooks/00-welcome.ipynb?token={lab.token}")
        current_notebook_ready(tab, "notebooks/00-welcome.ipynb")
        tab.locator(".jp-SideBar .lm-TabBar-tab[title*='Create Assignment']").first.wait_for(state="attached")
        tab.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
        menu = tab.locator(".lm-Menu:visible").first
        menu.wait_for(state="visible")
        items = [t.strip() for t in menu.locator(".lm-Menu-itemLabel").all_inner_texts() if t.strip()]
        shot(tab, "09-instructor-view")
        tab.keyboard.press("Escape")
        assert "Formgrader" in items and "Assignment List" in items, items
        assert tab.get_by_text(NEWS_TEXT).count() == 0, "the 'Jupyter news' pop-up is shown"
    finally:
        context.close()
