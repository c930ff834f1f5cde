"""A real ComfyUI server with this pack in ``custom_nodes/``, for end-to-end tests.

The tree is ``TK_COMFYUI`` (default ``.comfyui``, ComfyUI 0.3.75; ``.comfyui-0.8.0`` is the
other supported line). A tree that needs packages beyond the venv has them in an overlay folder,
``TK_COMFYUI_SITE`` or else ``<tree>-site`` beside it (``.comfyui-0.8.0-site``): it is put on the
PYTHONPATH of every server started here (after any PYTHONPATH a test passes, which may shadow
a package on purpose), and conftest puts it on this process's path for in-process imports.

Each server gets its own base directory (models/, custom_nodes/, output/, user/) so tests
stay apart; the pack is linked in under a name unlike the repository's folder name, which
proves that nothing in the pack depends on its folder name. See scripts/setup_env.sh for
where ComfyUI comes from."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACK_LINK_NAME = "tritonkit_under_test"


def comfyui_dir() -> Path:
    return Path(os.environ.get("TK_COMFYUI", REPO / ".comfyui"))


def comfyui_version(tree: Path | None = None) -> str:
    """The ``__version__`` in ``comfyui_version.py`` of a ComfyUI tree (default: the one in use)."""
    tree = comfyui_dir() if tree is None else Path(tree)
    try:
        m = re.search(r'__version__\s*=\s*"([^"]+)"', (tree / "comfyui_version.py").read_text())
    except OSError:
        return "unknown"
    return m.group(1) if m else "unknown"


def comfyui_at_least(version: str) -> bool:
    """Whether the ComfyUI in use is ``version`` or newer ("0.8.0")."""
    def key(v):
        return tuple(int(x) for x in re.findall(r"\d+", v)[:3])
    return key(comfyui_version()) >= key(version)


def comfyui_site() -> Path | None:
    """The overlay of extra packages for the tree (see the module docstring), or None."""
    if os.environ.get("TK_COMFYUI_SITE"):
        return Path(os.environ["TK_COMFYUI_SITE"])
    site = Path(str(comfyui_dir()) + "-site")
    return site if site.is_dir() else None


def with_site(pythonpath: str | None) -> str:
    """``pythonpath`` with the tree's overlay appended (once)."""
    parts = [p for p in (pythonpath or "").split(os.pathsep) if p]
    site = comfyui_site()
    if site is not None and str(site) not in parts:
        parts.append(str(site))
    return os.pathsep.join(parts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    def __init__(self, base_dir: Path, env: dict | None = None, extra_args: list[str] | None = None,
                 pack_src: Path = REPO, python: str = sys.executable, ready_timeout: float = 180.0,
                 extra_packs: dict | None = None):
        self.base = Path(base_dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.base / "comfyui.log"
        (self.base / "custom_nodes").mkdir(parents=True, exist_ok=True)
        for sub in ("models/diffusion_models", "models/checkpoints", "output", "input", "temp", "user"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        link = self.base / "custom_nodes" / PACK_LINK_NAME
        if not link.exists():
            link.symlink_to(pack_src, target_is_directory=True)
        # extra_packs: {folder name in custom_nodes: source directory}, e.g. the test-only nodes
        # {"tritonkit_test_nodes": REPO / "tests" / "comfy_test_nodes"}.
        for name, src in (extra_packs or {}).items():
            extra = self.base / "custom_nodes" / name
            if not extra.exists():
                extra.symlink_to(Path(src).resolve(), target_is_directory=True)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.env["PYTHONPATH"] = with_site(self.env.get("PYTHONPATH"))
        self.args = [python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
                     "--base-directory", str(self.base), "--disable-auto-launch",
                     "--database-url", "sqlite:///:memory:", *(extra_args or [])]
        self.proc = None
        self.ready_timeout = ready_timeout

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        if os.environ.get("TK_TEST_MARKED_COMFYUI") == "0":
            raise RuntimeError("this test starts a ComfyUI server but is not marked comfyui: add "
                               "@pytest.mark.comfyui (or pytestmark) so scripts/dev.sh test also runs it "
                               "against every supported ComfyUI line")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, cwd=comfyui_dir(), env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + self.ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.get("/system_stats", timeout=2)
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"ComfyUI did not answer within {self.ready_timeout}s:\n{self.log_tail()}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 80) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    # -------------------------------------------------------------- HTTP
    def request(self, method: str, path: str, body=None, timeout: float = 30, raw: bool = False):
        data = None
        headers = {}
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                payload = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            payload, status = e.read(), e.code
        if raw:
            return status, payload
        try:
            return status, json.loads(payload or b"null")
        except json.JSONDecodeError:
            return status, payload.decode(errors="replace")

    def get(self, path: str, timeout: float = 30):
        status, payload = self.request("GET", path, timeout=timeout)
        if status != 200:
            raise urllib.error.URLError(f"GET {path} -> {status}: {payload}")
        return payload

    def post(self, path: str, body, timeout: float = 30):
        return self.request("POST", path, body, timeout=timeout)

    # -------------------------------------------------------------- prompts
    def queue(self, prompt: dict) -> str:
        status, resp = self.post("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
        if status != 200:
            raise AssertionError(f"/prompt refused the workflow ({status}): {json.dumps(resp, indent=1)}")
        return resp["prompt_id"]

    def wait(self, prompt_id: str, timeout: float = 600) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            hist = self.get(f"/history/{prompt_id}")
            if prompt_id in hist and hist[prompt_id].get("status", {}).get("completed") is not None:
                entry = hist[prompt_id]
                if entry["status"].get("status_str") in ("success", "error"):
                    return entry
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI died while running {prompt_id}:\n{self.log_tail()}")
            time.sleep(0.25)
        raise TimeoutError(f"prompt {prompt_id} did not finish in {timeout}s:\n{self.log_tail()}")

    def run(self, prompt: dict, timeout: float = 600) -> dict:
        entry = self.wait(self.queue(prompt), timeout)
        if entry["status"]["status_str"] != "success":
            msgs = json.dumps(entry["status"].get("messages"), indent=1)[-4000:]
            raise AssertionError(f"workflow failed: {msgs}\n--- server log ---\n{self.log_tail()}")
        return entry


TEST_NODES = {"tritonkit_test_nodes": REPO / "tests" / "comfy_test_nodes"}


def comfyui_available() -> bool:
    return (comfyui_dir() / "main.py").is_file()
