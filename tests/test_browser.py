"""The Triton panel in a real browser: Debian's headless Chromium, driven by Playwright for
Python, against a real ComfyUI server (CPU) with its pinned frontend (0.3.75: 1.32.9; 0.8.0: 1.35.9).

Chromium must be there (scripts/setup_browser.sh installs it; so does CI): without it these
tests fail, they do not skip. Screenshots go to artifacts/browser/ (git-ignored)."""
import json
import os
import tempfile
import threading

import pytest

from comfy_harness import PACK_LINK_NAME, REPO, ComfyServer

pytestmark = [pytest.mark.browser, pytest.mark.comfyui]

CHROMIUM = os.environ.get("TK_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO / "artifacts" / "browser"
README_URL = "https://github.com/tritonkit/ComfyUI-TritonKit#readme"
SETTING = "TritonKit.RunSelfTestOnStartup"
TAB_BUTTON = '.side-bar-button[aria-label="Triton"]'
UI_WORKFLOWS = sorted(p.stem for p in (REPO / "workflows").glob("*.json") if not p.stem.endswith("_api"))
PACK_NODE_IDS = ("TritonKitSelfTest", "TritonKitAttention", "TritonKitFp8Fallback")
MODEL_FILE_INPUTS = {"unet_name", "clip_name1", "clip_name2", "vae_name", "ckpt_name"}  # the user provides these


def shot(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


# ---------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def playwright():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"Chromium is not installed at {CHROMIUM}: run scripts/setup_browser.sh (apt-get install "
                    "chromium); the browser tests need it and do not skip")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright for Python is missing: pip install -r tests/requirements.txt "
                    "(never 'playwright install': the tests use Debian's chromium)")
    with sync_playwright() as p:
        yield p


# TK_FRONTEND_ROOT=<a newer comfyui_frontend_package/static> runs the same tests on that frontend
FRONTEND_ROOT = os.environ.get("TK_FRONTEND_ROOT")


def start_server(base, env):
    srv = ComfyServer(base, env=env, extra_args=["--front-end-root", FRONTEND_ROOT] if FRONTEND_ROOT else None)
    srv.start()
    # a fresh user folder opens the template browser over the canvas otherwise
    code, _ = srv.request("POST", "/api/settings/Comfy.TutorialCompleted", True)
    assert code == 200
    return srv


class Browser:
    """A fresh Chromium profile with one page on ``srv``; collects console messages, page errors
    and failed requests."""

    def __init__(self, playwright, srv):
        self.srv = srv
        self.profile = tempfile.TemporaryDirectory(prefix="tk-chromium-")
        self.ctx = playwright.chromium.launch_persistent_context(
            self.profile.name, executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 900})
        # no "Nodes 2.0" promotion banner over the screenshots (the frontend keeps its dismissal here)
        self.ctx.add_init_script("try { localStorage.setItem('vueNodesBannerDismissed', 'true'); } catch (e) {}")
        self.page = self.ctx.pages[0] if self.ctx.pages else self.ctx.new_page()
        self.page.set_default_timeout(60_000)
        self.console, self.errors, self.responses, self.requests = [], [], [], []
        self.page.on("console", lambda m: self.console.append(
            {"type": m.type, "text": m.text, "url": (m.location or {}).get("url", "")}))
        self.page.on("pageerror", lambda e: self.errors.append(f"{e}\n{getattr(e, 'stack', '')}"))
        self.page.on("response", lambda r: self.responses.append((r.status, r.url)))
        self.page.on("request", lambda r: self.requests.append((r.method, r.url)))

    def load(self):
        self.page.goto(self.srv.url)
        self.page.wait_for_selector(TAB_BUTTON, timeout=120_000)
        return self.page

    def _is_ours(self, text):
        # the pack's script, its routes on this server, or its own log prefix; not the frontend's
        # other noise (its registry look-ups name our node ids, pitfall 7 of the harness notes)
        return (f"/extensions/{PACK_LINK_NAME}/" in text or f"{self.srv.url}/api/tritonkit/" in text
                or f"{self.srv.url}/tritonkit/" in text or "[TritonKit]" in text)

    def ours(self):
        """Console errors/warnings, page errors and failed requests that come from the pack."""
        bad = [m for m in self.console if m["type"] in ("error", "warning")
               and self._is_ours(m["text"] + " " + m["url"])]
        bad += [e for e in self.errors if self._is_ours(e)]
        bad += [(s, u) for s, u in self.responses if s >= 400 and self._is_ours(u)]
        return bad

    def close(self):
        self.ctx.close()
        self.profile.cleanup()


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-caches")
    return {"triton": root / "triton", "inductor": root / "inductor"}


class Background:
    """Starts a server in a thread, so that it boots while other tests run."""

    def __init__(self, base, env):
        self.srv, self.exc = None, None
        self.thread = threading.Thread(target=self._run, args=(base, env), daemon=True)
        self.thread.start()

    def _run(self, base, env):
        try:
            self.srv = start_server(base, env)
        except BaseException as exc:  # re-raised in the test that needs it
            self.exc = exc

    def get(self):
        self.thread.join(300)
        if self.exc:
            raise self.exc
        assert self.srv is not None, "the server did not start in 300 s"
        return self.srv

    def stop(self):
        self.thread.join(300)
        if self.srv:
            self.srv.stop()


@pytest.fixture(scope="module")
def broken_triton_server(tmp_path_factory):
    """A server whose Triton fails to import as with too-old vcredist DLLs on Windows; booted
    in the background from the start of the module."""
    tmp = tmp_path_factory.mktemp("broken-triton")
    shadow = tmp / "shadow" / "triton"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ImportError('DLL load failed while importing libtriton: The specified module could not be found.')\n")
    bg = Background(tmp / "base", {"PYTHONPATH": str(shadow.parent), "TRITON_CACHE_DIR": str(tmp / "tc"),
                                   "TORCHINDUCTOR_CACHE_DIR": str(tmp / "ic")})
    yield bg
    bg.stop()


@pytest.fixture(scope="module")
def good(playwright, tmp_path_factory, caches, broken_triton_server):
    env = {"TRITON_CACHE_DIR": str(caches["triton"]), "TORCHINDUCTOR_CACHE_DIR": str(caches["inductor"])}
    srv = start_server(tmp_path_factory.mktemp("comfy-browser"), env)
    b = Browser(playwright, srv)
    try:
        b.load()
        yield b
    finally:
        b.close()
        srv.stop()


def open_tab(page):
    if not page.query_selector("[data-tk=panel]"):
        page.click(TAB_BUTTON)
    page.wait_for_selector("[data-tk=panel]", state="visible")


def eval_app(page, body, arg=None):
    return page.evaluate(f"async (arg) => {{ const app = window.comfyAPI.app.app; {body} }}", arg)


# ---------------------------------------------------------------------------- the good server

def test_extension_loads_without_errors(good):
    page = good.page
    exts = good.srv.get("/extensions")
    ours = [e for e in exts if f"/extensions/{PACK_LINK_NAME}/" in e]
    assert ours == [f"/extensions/{PACK_LINK_NAME}/tritonkit.js"], ours  # one entry module, nothing else
    assert any(s == 200 and u.endswith(f"/extensions/{PACK_LINK_NAME}/tritonkit.js") for s, u in good.responses)
    assert eval_app(page, "return app.extensions.some((e) => e.name === 'TritonKit');")
    assert eval_app(page, "return app.extensionManager.setting.get(arg);", SETTING) is True  # default on
    page.wait_for_timeout(500)
    assert good.ours() == [], good.ours()


def test_triton_tab_shows_status(good, caches):
    page = good.page
    open_tab(page)
    # the startup self-test (setting on by default) has run or is running; wait for its verdict
    page.wait_for_selector("[data-tk=verdict][data-state=pass]", timeout=180_000)
    verdict = page.inner_text("[data-tk=verdict]")
    assert "Self-test: PASS" in verdict and "cpu" in verdict, verdict
    facts = page.inner_text("[data-tk=facts]")
    for word in ("Python", "torch", "Triton", "GPU", "C compiler", "no CUDA GPU"):
        assert word in facts, facts
    cache_text = page.inner_text("[data-tk=caches]")
    assert str(caches["triton"]) in cache_text and str(caches["inductor"]) in cache_text, cache_text
    assert page.query_selector("[data-tk=triage]") is None
    assert "Triton self-test failed" not in page.inner_text("body")  # no failure notice
    assert any(m == "POST" and u.endswith("/api/tritonkit/selftest") for m, u in good.requests) or \
        good.srv.get("/tritonkit/status")["selftest"] is not None
    shot(page, "panel-pass")
    assert good.ours() == [], good.ours()


def test_run_selftest_button(good):
    page = good.page
    open_tab(page)
    page.wait_for_selector("[data-tk=run]:not([disabled])")
    before = good.srv.get("/tritonkit/status")["selftest"]
    with page.expect_response(lambda r: r.url.endswith("/api/tritonkit/selftest") and r.request.method == "POST",
                              timeout=180_000) as resp:
        page.click("[data-tk=run]")
        page.wait_for_selector("[data-tk=verdict][data-state=running]", timeout=5_000)
        page.wait_for_selector("[data-tk=progress]", timeout=5_000)
        assert page.is_disabled("[data-tk=run]")
        shot(page, "panel-running")
    assert resp.value.status == 200
    page.wait_for_selector("[data-tk=verdict][data-state=pass]", timeout=60_000)
    after = good.srv.get("/tritonkit/status")["selftest"]
    assert after["finished_at"] > (before or {}).get("finished_at", 0)
    page.click("[data-tk=report] summary")
    report = page.inner_text("[data-tk=report] pre")
    assert report.startswith("Triton self-test: PASS"), report
    assert good.ours() == [], good.ours()


def test_clear_caches_is_behind_a_confirmation(good, caches):
    page = good.page
    open_tab(page)
    (caches["triton"] / "0a1b").mkdir(parents=True, exist_ok=True)
    kernel = caches["triton"] / "0a1b" / "add_kernel.so"
    kernel.write_bytes(b"k" * 5000)
    caches["inductor"].mkdir(parents=True, exist_ok=True)
    page.click("[data-tk=refresh]")
    page.wait_for_function("() => document.querySelector('[data-tk=caches]').innerText.includes('4.9 KiB')")
    page.click("[data-tk=clear]")
    page.wait_for_selector("[data-tk=confirm]")
    assert "Delete everything inside" in page.inner_text("[data-tk=confirm]")
    page.click("[data-tk=cancel-clear]")
    page.wait_for_selector("[data-tk=confirm]", state="detached")
    assert kernel.exists()
    page.click("[data-tk=clear]")
    shot(page, "panel-clear-confirm")
    page.click("[data-tk=confirm-clear]")
    page.wait_for_selector("[data-tk=clear-result]")
    assert "Cleared 4.9 KiB" in page.inner_text("[data-tk=clear-result]")
    assert not kernel.exists() and caches["triton"].is_dir() and not any(caches["triton"].iterdir())
    assert "0 B" in page.inner_text("[data-tk=caches]")
    assert good.ours() == [], good.ours()


LOAD_TEMPLATE = """
const wf = await (await fetch(window.comfyAPI.api.api.apiURL(`/workflow_templates/${arg.pack}/${arg.name}.json`))).json();
const types = (wf.nodes || []).map((n) => n.type);
const missing = types.filter((t) => !(t in window.LiteGraph.registered_node_types));
await app.loadGraphData(wf, true, true, arg.name, { openSource: "template" });
await new Promise((r) => setTimeout(r, 300));
const dialogs = [...document.querySelectorAll(".p-dialog")].map((d) => d.innerText);
return { types, missing, dialogs, count: (app.graph.nodes || app.graph._nodes).length };
"""


def test_selftest_node_shows_its_report(good):
    page = good.page
    r = eval_app(page, LOAD_TEMPLATE, {"pack": PACK_LINK_NAME, "name": "triton_selftest"})
    assert r["missing"] == [] and "TritonKitSelfTest" in r["types"], r
    eval_app(page, "await app.queuePrompt(0, 1); return true;")
    page.wait_for_function("() => (document.querySelector('textarea[data-tk=node-text]') || {}).value"
                           "?.startsWith('Triton self-test: PASS')", timeout=180_000)
    text = page.input_value("textarea[data-tk=node-text]")
    assert "max abs diff vs torch: 0" in text and "Triton " in text, text
    open_tab(page)
    page.wait_for_timeout(300)
    shot(page, "node-report")
    assert good.ours() == [], good.ours()


@pytest.mark.parametrize("node_id", ["TritonKitAttention", "TritonKitFp8Fallback"])
def test_patch_nodes_show_the_path_they_took(good, node_id):
    # The servers' side (the nodes' ui.text through /prompt) is tested with the nodes; here the
    # frontend hook gets such an output, as the frontend hands it to a node after a run.
    page = good.page
    path_text = f"{node_id}: test path line"
    r = eval_app(page, """
        await app.loadGraphData({last_node_id: 0, last_link_id: 0, nodes: [], links: [], groups: [], config: {},
                                 extra: {}, version: 0.4}, true, true, "tk-" + arg.id);
        const node = window.LiteGraph.createNode(arg.id);
        if (!node) return {created: false};
        node.pos = [420, 160];
        app.graph.add(node);
        node.onExecuted({text: [arg.text]});
        await new Promise((r) => setTimeout(r, 300));
        const ta = [...document.querySelectorAll("textarea[data-tk=node-text]")].find((t) => t.value === arg.text);
        return {created: true, shown: !!ta, visible: !!ta && ta.getBoundingClientRect().height > 10};
    """, {"id": node_id, "text": path_text})
    assert r == {"created": True, "shown": True, "visible": True}, r
    shot(page, f"node-path-{node_id}")
    assert good.ours() == [], good.ours()


def test_example_workflows_are_served_as_templates(good):
    templates = good.srv.get("/workflow_templates")
    listed = set(templates.get(PACK_LINK_NAME, []))
    assert {"triton_selftest", "flux_fp8_triton", "hunyuan_video_fp8_triton"} <= set(UI_WORKFLOWS) <= listed, templates


@pytest.mark.parametrize("name", UI_WORKFLOWS)
def test_example_workflow_loads_without_missing_nodes(good, name):
    page = good.page
    wf = json.loads((REPO / "workflows" / f"{name}.json").read_text())
    assert isinstance(wf.get("nodes"), list) and wf["nodes"], "UI-format workflow expected"
    r = eval_app(page, LOAD_TEMPLATE, {"pack": PACK_LINK_NAME, "name": name})
    shot(page, f"workflow-{name}")
    page.keyboard.press("Escape")
    assert r["missing"] == [], f"{name}: node types the server does not have: {r['missing']}"
    assert not [d for d in r["dialogs"] if "missing" in d.lower()], r["dialogs"]
    assert r["count"] == len(wf["nodes"]), r
    assert set(r["types"]) & set(PACK_NODE_IDS), r["types"]  # every example uses the pack
    # what the frontend would queue passes the server's validation, apart from the model files
    prompt = eval_app(page, "return (await app.graphToPrompt()).output;")
    code, resp = good.srv.post("/prompt", {"prompt": prompt, "client_id": "tk-browser-test"})
    if code != 200:
        problems = [(nid, err["type"], (err.get("extra_info") or {}).get("input_name"))
                    for nid, ne in resp.get("node_errors", {}).items() for err in ne["errors"]]
        assert problems and all(t == "value_not_in_list" and i in MODEL_FILE_INPUTS for _, t, i in problems), \
            json.dumps(resp, indent=1)[:3000]
    else:
        good.srv.wait(resp["prompt_id"], timeout=180)
    assert good.ours() == [], good.ours()


def test_about_page_badge_links_to_the_readme(good):
    page = good.page
    eval_app(page, "await app.extensionManager.command.execute('Comfy.Help.AboutComfyUI'); return true;")
    link = page.wait_for_selector(f'a[href="{README_URL}"]', timeout=15_000)
    assert "TritonKit" in link.inner_text()
    shot(page, "about-badge")
    page.keyboard.press("Escape")


def test_startup_setting_off_runs_no_selftest(good):
    page = good.page
    eval_app(page, "await app.extensionManager.setting.set(arg, false); return true;", SETTING)
    try:
        good.requests.clear()
        with page.expect_response(lambda r: "/api/tritonkit/status" in r.url, timeout=120_000):
            good.load()
        page.wait_for_timeout(1500)
        assert not [u for m, u in good.requests if m == "POST" and "/tritonkit/selftest" in u], good.requests
        assert eval_app(page, "return app.extensionManager.setting.get(arg);", SETTING) is False
    finally:
        eval_app(page, "await app.extensionManager.setting.set(arg, true); return true;", SETTING)
    assert good.ours() == [], good.ours()


# ---------------------------------------------------------------------------- a broken Triton

def test_toast_names_the_triage_entry_when_the_selftest_fails(playwright, broken_triton_server):
    srv = broken_triton_server.get()
    b = Browser(playwright, srv)
    try:
        page = b.load()
        # the notice: found by its text, since frontends render toasts with different markup
        text = page.wait_for_function("""() => {
            const hit = [...document.querySelectorAll("body *")].find((e) => e.children.length === 0
                && e.textContent.startsWith("Triton self-test failed"));
            let box = hit;
            while (box && !box.innerText.includes("Fix:")) box = box.parentElement;
            return box && box !== document.body ? box.innerText : null;
        }""", timeout=180_000).json_value()
        assert "vcredist DLLs too old" in text and "[dll-libtriton]" in text and "vc_redist" in text, text
        shot(page, "toast-failure")
        open_tab(page)
        page.wait_for_selector("[data-tk=verdict][data-state=fail]")
        triage = page.inner_text("[data-tk=triage]")
        assert "dll-libtriton" in triage and "Fix:" in triage and "DLL load failed" in triage, triage
        shot(page, "panel-fail")
        assert b.ours() == [], b.ours()
    finally:
        b.close()
