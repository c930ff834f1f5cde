"""The Triton panel's HTTP routes (nodes/routes.py) against a real ComfyUI server (0.3.75 and 0.8.0):
every route, every kind of bad input, and concurrent self-tests. The server gets its own
Triton and TorchInductor cache folders, so clearing them never touches the machine's."""
import http.client
import json
import os
import threading
import time
from pathlib import Path

import pytest

from comfy_harness import ComfyServer

pytestmark = pytest.mark.comfyui


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("caches")
    dirs = {"triton": root / "triton-cache", "inductor": root / "inductor-cache"}
    for d in dirs.values():
        d.mkdir()
    return dirs


@pytest.fixture(scope="module")
def srv(tmp_path_factory, caches):
    env = {"TRITON_CACHE_DIR": str(caches["triton"]), "TORCHINDUCTOR_CACHE_DIR": str(caches["inductor"])}
    with ComfyServer(tmp_path_factory.mktemp("comfy-routes"), env=env) as s:
        yield s


def no_traceback(body):
    text = body if isinstance(body, str) else json.dumps(body)
    assert "Traceback" not in text and 'File "' not in text, text


def assert_error(resp, status, *words):
    code, body = resp
    assert code == status, (code, body)
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    for w in words:
        assert w in body["error"], body
    no_traceback(body)
    return body


# ---------------------------------------------------------------------------- status

def test_status_reports_the_environment(srv, caches):
    code, body = srv.request("GET", "/tritonkit/status")
    assert code == 200, body
    env = body["environment"]
    assert env["python"]["version"] and env["torch"]["version"]
    assert "distributions" in env["triton"] and env["gpu"]["class"] == "none"  # CPU-only CI
    assert env["caches"]["triton"]["path"] == str(caches["triton"])
    assert env["caches"]["inductor"]["path"] == str(caches["inductor"])
    assert body["pack_version"] == "0.1.0"
    assert body["running"] is None
    # the frontend calls it through /api (api.fetchApi prefixes it)
    code2, body2 = srv.request("GET", "/api/tritonkit/status")
    assert code2 == 200 and body2["environment"]["python"] == env["python"]
    # cached: the same collection time until a refresh is asked for
    assert body2["environment_at"] == body["environment_at"]
    code3, body3 = srv.request("GET", "/tritonkit/status?refresh=true")
    assert code3 == 200 and body3["environment_at"] > body["environment_at"]


def test_status_bad_input(srv):
    assert_error(srv.request("GET", "/tritonkit/status?refresh=maybe"), 400, "refresh")
    assert_error(srv.request("GET", "/tritonkit/status?path=/etc"), 400, "unknown query parameter", "'path'")
    body = assert_error(srv.request("POST", "/tritonkit/status", {}), 405, "GET")
    for method in ("PUT", "DELETE", "PATCH"):
        assert_error(srv.request(method, "/api/tritonkit/status", {}), 405)
    assert body


# ---------------------------------------------------------------------------- self-test

def test_selftest_runs_and_is_remembered(srv):
    code, body = srv.request("POST", "/api/tritonkit/selftest", timeout=300)
    assert code == 200, body
    assert body["ok"] is True and body["triage"] is None, body  # the body says why, where it fails
    assert body["text"].startswith("Triton self-test: PASS"), body["text"]
    assert body["report"]["selftest"]["device"] == "cpu" and body["report"]["selftest"]["max_abs_diff"] == 0
    code, status = srv.request("GET", "/tritonkit/status")
    assert status["ok"] is True and status["selftest"]["finished_at"] == body["finished_at"]
    assert status["selftest"]["text"] == body["text"]
    # an explicit, valid body works too
    code, body = srv.request("POST", "/tritonkit/selftest", {"device": "cpu", "n": 1000}, timeout=300)
    assert code == 200 and body["ok"] is True and body["n"] == 1000, body


def test_selftest_on_a_missing_gpu_is_a_result_not_an_error(srv):
    code, body = srv.request("POST", "/tritonkit/selftest", {"device": "cuda", "n": 16}, timeout=300)
    assert code == 200, body
    assert body["ok"] is False and body["triage"]["error"], body
    no_traceback(body["triage"]["error"])


@pytest.mark.parametrize("raw, words", [
    (b'{"device": ', ("not valid JSON",)),
    (b"\xff\xfe not utf8", ("not valid JSON",)),
    (b"[1, 2]", ("JSON object", "list")),
    (b'"auto"', ("JSON object", "str")),
    (b'{"devices": "cpu"}', ("unknown field", "'devices'")),
    (b'{"device": "gpu"}', ("'device'", "auto, cuda, cpu")),
    (b'{"device": 3}', ("'device'", "str")),
    (b'{"n": 0}', ("'n'", "between")),
    (b'{"n": 99999999999}', ("'n'", "between")),
    (b'{"n": "5"}', ("'n'", "int")),
    (b'{"n": true}', ("'n'", "int")),
    (b'{"n": 1.5}', ("'n'", "int")),
])
def test_selftest_bad_body(srv, raw, words):
    assert_error(srv.request("POST", "/tritonkit/selftest", raw), 400, *words)


def test_selftest_other_bad_requests(srv):
    assert_error(srv.request("GET", "/tritonkit/selftest"), 405, "POST")
    assert_error(srv.request("POST", "/tritonkit/selftest?device=cpu", {}), 400, "unknown query parameter")
    assert_error(srv.request("POST", "/tritonkit/selftest", b"{" + b" " * (70 * 1024) + b"}"), 413, "too large")
    # the same without a Content-Length (chunked): counted while reading
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        conn.request("POST", "/tritonkit/caches/clear", headers={"Content-Type": "application/json"},
                     body=iter([b'{"which": ["triton"]', b" " * (40 * 1024), b" " * (40 * 1024), b"}"]),
                     encode_chunked=True)
        resp = conn.getresponse()
        assert_error((resp.status, json.loads(resp.read())), 413, "too large")
    finally:
        conn.close()


def test_concurrent_selftests_get_one_409(srv):
    results = []
    barrier = threading.Barrier(2)

    def post():
        barrier.wait()
        # 8M elements: a few seconds in the Triton interpreter, so the checks below run while it
        # runs (with the default size a warm run could end before them on a fast or idle machine)
        results.append(srv.request("POST", "/tritonkit/selftest", {"device": "cpu", "n": 1 << 23}, timeout=300))

    threads = [threading.Thread(target=post) for _ in range(2)]
    for t in threads:
        t.start()
    # while it runs: the server answers at once (the work is in a thread), status says it runs,
    # and clearing the caches is refused. Polled, not slept for: on a loaded 2-core CI machine the
    # self-test's thread had not started 0.5 s after the requests
    deadline = time.time() + 60
    while True:
        t0 = time.time()
        code, status = srv.request("GET", "/tritonkit/status")
        assert time.time() - t0 < 2.0
        if status.get("running") or time.time() > deadline:
            break
        time.sleep(0.05)
    assert code == 200 and status["running"] and status["running"]["elapsed_s"] >= 0, status
    assert_error(srv.request("POST", "/tritonkit/caches/clear", {}), 409, "self-test is running")
    for t in threads:
        t.join(300)
    codes = sorted(c for c, _ in results)
    assert codes == [200, 409], results
    busy = next(b for c, b in results if c == 409)
    assert "already running" in busy["error"] and busy["running"]["since"] > 0, busy
    no_traceback(busy)
    # and afterwards a new one is accepted
    code, body = srv.request("POST", "/tritonkit/selftest", {"n": 64}, timeout=300)
    assert code == 200 and body["ok"] is True


# ---------------------------------------------------------------------------- caches

def _fill(d: Path, tag: str) -> int:
    (d / "ab12" / "deep").mkdir(parents=True, exist_ok=True)
    (d / "ab12" / "deep" / f"{tag}.so").write_bytes(b"x" * 3000)
    (d / f"{tag}.json").write_bytes(b"y" * 500)
    return 3500


def test_caches_lists_the_folders_and_sizes(srv, caches):
    n = _fill(caches["triton"], "t")
    code, body = srv.request("GET", "/tritonkit/caches")
    assert code == 200, body
    tri = body["caches"]["triton"]
    assert tri["path"] == str(caches["triton"]) and tri["exists"] is True and tri["bytes"] >= n
    assert tri["human"].endswith(("B", "KiB", "MiB", "GiB"))
    assert body["caches"]["inductor"]["path"] == str(caches["inductor"])
    assert_error(srv.request("POST", "/tritonkit/caches", {}), 405, "GET")
    assert_error(srv.request("GET", "/tritonkit/caches?path=/"), 400, "unknown query parameter")


def test_caches_clear_empties_only_those_folders(srv, caches, tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep me")
    nt = _fill(caches["triton"], "t")
    ni = _fill(caches["inductor"], "i")
    os.symlink(outside, caches["triton"] / "link-to-dir")
    os.symlink(outside / "keep.txt", caches["inductor"] / "link-to-file")
    os.symlink(outside, caches["triton"] / "ab12" / "inner-link")

    code, body = srv.request("POST", "/tritonkit/caches/clear", {"which": ["triton"]})
    assert code == 200 and body["ok"] is True, body
    assert set(body["cleared"]) == {"triton"}
    assert body["cleared"]["triton"]["removed_bytes"] == nt
    assert caches["triton"].is_dir() and list(caches["triton"].iterdir()) == []
    assert len(list(caches["inductor"].iterdir())) == 3  # untouched
    assert body["caches"]["triton"]["bytes"] == 0

    code, body = srv.request("POST", "/api/tritonkit/caches/clear", b"")  # empty body: both folders
    assert code == 200 and body["ok"] is True, body
    assert body["cleared"]["inductor"]["removed_bytes"] == ni
    assert list(caches["inductor"].iterdir()) == []
    assert (outside / "keep.txt").read_text() == "keep me"  # links were removed, not followed
    code, status = srv.request("GET", "/tritonkit/status")
    assert status["environment"]["caches"]["inductor"]["bytes"] == 0


@pytest.mark.parametrize("body, status, words", [
    ({"path": "/tmp"}, 400, ("unknown field", "'path'")),
    ({"which": ["/etc"]}, 400, ("'which'", "never taken from the request")),
    ({"which": ["triton", "../.."]}, 400, ("'which'",)),
    ({"which": []}, 400, ("'which'",)),
    ({"which": "triton"}, 400, ("'which'", "list")),
    ({"which": [1]}, 400, ("'which'",)),
    (b"not json", 400, ("not valid JSON",)),
    (b"null", 400, ("JSON object",)),
])
def test_caches_clear_bad_input(srv, caches, body, status, words):
    marker = caches["triton"] / "marker"
    marker.write_text("still here")
    assert_error(srv.request("POST", "/tritonkit/caches/clear", body), status, *words)
    assert marker.exists()
    marker.unlink()


def test_caches_clear_wrong_method(srv):
    assert_error(srv.request("GET", "/tritonkit/caches/clear"), 405, "POST")
    assert_error(srv.request("DELETE", "/tritonkit/caches/clear"), 405, "POST")


def test_unknown_route_is_a_json_404(srv):
    body = assert_error(srv.request("GET", "/tritonkit/nope"), 404, "no such TritonKit route")
    assert "/tritonkit/status" in body["error"]
    assert_error(srv.request("POST", "/api/tritonkit/selftest/extra", {}), 404)


def test_server_log_has_no_tracebacks_from_the_routes(srv):
    log = srv.log()
    assert "TritonKit: GET" not in log and "TritonKit: POST" not in log, log[-3000:]
    assert "could not register the Triton panel" not in log, log[-3000:]


# ---------------------------------------------------------------------------- in-process guards

def test_clear_folder_refuses_dangerous_folders(tmp_path):
    from tritonkit.nodes import routes

    # only the pure checks on precious folders: never call clear_folder on them
    assert routes.refuse_reason("/") and routes.refuse_reason(os.path.expanduser("~"))
    assert routes.refuse_reason("/tmp") and routes.refuse_reason("relative/path")
    assert routes.refuse_reason(str(tmp_path / "cache")) is None
    real = tmp_path / "real"
    real.mkdir()
    (real / "f").write_text("x")
    link = tmp_path / "cache-link"
    link.symlink_to(real, target_is_directory=True)
    res = routes.clear_folder(str(link))
    assert res["errors"] and "link" in res["errors"][0]
    assert (real / "f").exists()
    assert routes.clear_folder(str(tmp_path / "absent")) == {
        "path": str(tmp_path / "absent"), "existed": False, "removed_bytes": 0, "removed_entries": 0, "errors": []}


def test_clear_folder_uses_the_installers_deletion(tmp_path, monkeypatch):
    from tritonkit.nodes import routes

    inst = routes._installer_caches()
    if inst is None:
        pytest.fail("installer/caches.py (install.py's cache step) should be importable from the pack")
    calls = []
    real_empty = inst.empty_folder
    monkeypatch.setattr(inst, "empty_folder", lambda p: calls.append(p) or real_empty(p))
    d = tmp_path / "cache"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "k.bin").write_bytes(b"z" * 100)
    res = routes.clear_folder(str(d))
    assert calls == [str(d)] and res["removed_bytes"] == 100 and res["removed_entries"] == 1, res
    assert d.is_dir() and not any(d.iterdir())


def test_report_json_is_strict():
    from tritonkit.nodes import routes

    out = routes.jsonable({"a": float("nan"), "b": [float("inf"), 1.5], "c": Path("/x"), 3: True})
    assert out == {"a": None, "b": [None, 1.5], "c": "/x", "3": True}
    json.dumps(out, allow_nan=False)
