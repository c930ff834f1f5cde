"""HTTP routes of the Triton panel, registered on ComfyUI's server under ``/tritonkit/``
(ComfyUI also serves each one under ``/api/tritonkit/``, which is what the frontend's
``api.fetchApi`` calls):

    GET  /tritonkit/status        the environment report (cached) and the last self-test result
    POST /tritonkit/selftest      runs the vector-add self-test now; 409 while one is running
    GET  /tritonkit/caches        Triton's and TorchInductor's cache folders and their sizes
    POST /tritonkit/caches/clear  empties those folders (never a path from the client)
    GET  /tritonkit/calibration   what auto measured on this machine's GPUs (choices and timings)

Every answer is JSON; bad input gets a 4xx with an ``error`` message, never a traceback.
The work runs in a thread, so the server's event loop never waits on Triton or the disk.

Importing this module needs neither ComfyUI nor aiohttp; ``register()`` does nothing
outside a running ComfyUI server."""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shutil
import stat
import sys
import time

log = logging.getLogger("TritonKit")

PREFIX = "/tritonkit"
MAX_BODY = 64 * 1024
SELFTEST_FIELDS = {"device": str, "n": int}
DEVICES = ("auto", "cuda", "cpu")
MAX_N = 1 << 26


class HTTPProblem(Exception):
    """A client error (or a refusal) answered as ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str, **extra):
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


# ---------------------------------------------------------------------------- state

class _State:
    def __init__(self):
        self.environment = None        # collect_environment() output
        self.environment_at = None     # unix time it was collected
        self.last_selftest = None      # the answer of the last POST selftest
        self.running_since = None      # unix time the running self-test started, or None
        self.clearing = False
        self.env_lock = None           # asyncio.Lock, made on the server's loop


STATE = _State()


def _pack_version() -> str | None:
    try:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with open(os.path.join(here, "pyproject.toml"), encoding="utf-8") as f:
            for line in f:
                if line.strip().startswith("version"):
                    return line.split("=", 1)[1].strip().strip('"\'')
    except OSError:
        pass
    return None


def jsonable(obj):
    """The report as strict JSON: NaN/inf become None (a browser's JSON.parse rejects them),
    anything unknown becomes its string."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


# ---------------------------------------------------------------------------- the work (runs in threads)

def _diag():
    from ..diagnostics import environment, selftest
    return environment, selftest


def compute_environment() -> dict:
    _, selftest = _diag()
    return jsonable(selftest.collect_environment())


def compute_selftest(device: str, n: int) -> dict:
    _, selftest = _diag()
    t0 = time.time()
    rep = selftest.full_report(device=device, n=n)
    text = selftest.format_report(rep)
    st = rep.get("selftest") or {}
    tri = st.get("triage") or (rep.get("triton") or {}).get("import_error")
    return jsonable({
        "ok": bool(rep.get("ok")),
        "finished_at": time.time(),
        "duration_s": time.time() - t0,
        "device": device,
        "n": n,
        "text": text,
        "triage": {k: tri.get(k) for k in ("key", "title", "fix", "error")} if tri else None,
        "report": rep,
    })


def cache_info() -> dict:
    environment, _ = _diag()
    out = {}
    for name, path in environment.cache_dirs().items():
        exists = os.path.isdir(path)
        size = environment.folder_size(path) if exists and not os.path.islink(path) else 0
        out[name] = {"path": path, "exists": exists, "is_symlink": os.path.islink(path), "bytes": size,
                     "human": environment.human_bytes(size)}
    return out


def _installer_caches():
    """install.py's cache step (installer/caches.py), whose guards and deletion the panel shares."""
    try:
        from ..installer import caches
        return caches if hasattr(caches, "empty_folder") and hasattr(caches, "refuse_reason") else None
    except Exception:
        return None


def _local_refuse_reason(path: str) -> str | None:
    real = os.path.normpath(path)
    home = os.path.normpath(os.path.expanduser("~"))
    if real in (os.path.sep, home) or os.path.dirname(real) == real:
        return "refusing to empty a root or home folder"
    if len([p for p in real.replace("\\", "/").split("/") if p]) < 2:
        return "refusing to empty a top-level folder"
    return None


def refuse_reason(path: str) -> str | None:
    """Why a cache folder must not be emptied, or None. The folders come from Triton's and
    TorchInductor's own rules (and their environment variables), never from the client; this
    guards against an environment variable pointing at something precious."""
    if not path or not os.path.isabs(path):
        return "not an absolute path"
    inst = _installer_caches()
    why = inst.refuse_reason(path, os.path.expanduser("~"), dict(os.environ)) if inst else _local_refuse_reason(path)
    if why is None and os.path.islink(path):
        why = f"{path} is itself a symbolic link (to {os.path.realpath(path)}); links are not followed"
    return why


def _local_empty_folder(path: str) -> tuple[int, list[str]]:
    environment, _ = _diag()
    freed, errors = 0, []
    with os.scandir(path) as it:
        entries = list(it)
    for e in entries:
        try:
            st = os.lstat(e.path)
            if stat.S_ISDIR(st.st_mode):  # a real folder (lstat: a link to a folder is not one)
                size = environment.folder_size(e.path)
                shutil.rmtree(e.path)  # rmtree unlinks links inside and does not follow them
            else:
                size = st.st_size if not stat.S_ISLNK(st.st_mode) else 0
                os.unlink(e.path)
            freed += size
        except OSError as exc:
            errors.append(f"{e.path}: {exc.strerror or exc}")
    return freed, errors


def clear_folder(path: str) -> dict:
    """Empties ``path`` (keeps the folder itself), with install.py's deletion when installer/ is
    there: links inside are removed as links, never followed, so nothing outside is touched."""
    res = {"path": path, "existed": os.path.isdir(path), "removed_bytes": 0, "removed_entries": 0, "errors": []}
    if not res["existed"]:
        return res
    why = refuse_reason(path)
    if why:
        res["errors"].append(f"{path}: {why}")
        return res
    before = len(os.listdir(path))
    inst = _installer_caches()
    freed, errors = inst.empty_folder(path) if inst else _local_empty_folder(path)
    res["removed_bytes"], res["errors"] = freed, list(errors)
    try:
        res["removed_entries"] = before - len(os.listdir(path))
    except OSError:
        pass
    return res


def clear_caches(names: list[str]) -> dict:
    environment, _ = _diag()
    dirs = environment.cache_dirs()
    return {name: clear_folder(dirs[name]) for name in names}


# ---------------------------------------------------------------------------- request parsing

async def read_json_object(request, allowed: dict) -> dict:
    """The request body as a JSON object whose keys are in ``allowed`` (name -> type); an
    empty body is ``{}``."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise HTTPProblem(413, f"request body too large (at most {MAX_BODY} bytes)")
    chunks, total = [], 0
    while True:  # read() may return less than asked for: read to the end, or past the limit
        chunk = await request.content.read(16384)
        if not chunk:
            break
        total += len(chunk)
        if total > MAX_BODY:
            raise HTTPProblem(413, f"request body too large (at most {MAX_BODY} bytes)")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HTTPProblem(400, f"the body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        raise HTTPProblem(400, f"the body must be a JSON object, not {type(body).__name__}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise HTTPProblem(400, f"unknown field(s) {', '.join(map(repr, unknown))}; allowed: "
                               f"{', '.join(allowed) or 'none'}")
    for k, typ in allowed.items():
        if k in body and (not isinstance(body[k], typ) or (typ is int and isinstance(body[k], bool))):
            raise HTTPProblem(400, f"field {k!r} must be of type {typ.__name__}")
    return body


def check_query(request, allowed: tuple[str, ...] = ()):
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        raise HTTPProblem(400, f"unknown query parameter(s) {', '.join(map(repr, unknown))}; allowed: "
                               f"{', '.join(allowed) or 'none'}")


def _flag(value: str, name: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise HTTPProblem(400, f"query parameter {name!r} must be true or false, not {value!r}")


async def _in_thread(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


# ---------------------------------------------------------------------------- handlers

async def _environment(refresh: bool = False) -> dict:
    if STATE.env_lock is None:
        STATE.env_lock = asyncio.Lock()
    async with STATE.env_lock:
        if STATE.environment is None or refresh:
            STATE.environment = await _in_thread(compute_environment)
            STATE.environment_at = time.time()
    return STATE.environment


def _running_info() -> dict | None:
    if STATE.running_since is None:
        return None
    return {"since": STATE.running_since, "elapsed_s": time.time() - STATE.running_since}


async def get_status(request):
    check_query(request, ("refresh",))
    refresh = _flag(request.query.get("refresh", ""), "refresh")
    env = await _environment(refresh)
    last = STATE.last_selftest
    return {"pack_version": _pack_version(), "environment": env, "environment_at": STATE.environment_at,
            "selftest": last, "ok": None if last is None else last["ok"], "running": _running_info()}


async def post_selftest(request):
    check_query(request)
    body = await read_json_object(request, SELFTEST_FIELDS)
    device = body.get("device", "auto")
    n = body.get("n")
    if device not in DEVICES:
        raise HTTPProblem(400, f"field 'device' must be one of {', '.join(DEVICES)}, not {device!r}")
    if n is None:
        _, selftest = _diag()
        n = selftest.DEFAULT_N
    if not 1 <= n <= MAX_N:
        raise HTTPProblem(400, f"field 'n' must be between 1 and {MAX_N}, not {n}")
    # The check and the claim happen with no await between them: on the one event loop, that is atomic.
    if STATE.running_since is not None:
        raise HTTPProblem(409, f"a Triton self-test is already running (started "
                               f"{time.time() - STATE.running_since:.1f} s ago); wait for it to finish, "
                               f"then ask again or read GET {PREFIX}/status", running=_running_info())
    if STATE.clearing:
        raise HTTPProblem(409, "the caches are being cleared; run the self-test when that has finished")
    STATE.running_since = time.time()
    try:
        result = await _in_thread(compute_selftest, device, n)
    finally:
        STATE.running_since = None
    STATE.last_selftest = result
    env = {k: v for k, v in result["report"].items() if k not in ("selftest", "ok")}
    STATE.environment, STATE.environment_at = env, result["finished_at"]
    _notify("tritonkit.selftest", {k: result[k] for k in ("ok", "finished_at", "triage")})
    return result


async def get_caches(request):
    check_query(request)
    return {"caches": await _in_thread(cache_info)}


async def post_caches_clear(request):
    check_query(request)
    body = await read_json_object(request, {"which": list})
    environment, _ = _diag()
    known = list(environment.cache_dirs())
    which = body.get("which", known)
    if not which or any(not isinstance(w, str) or w not in known for w in which):
        raise HTTPProblem(400, f"field 'which' must be a non-empty list of cache names from "
                               f"{', '.join(known)} (folders are never taken from the request), not "
                               f"{json.dumps(which)[:200]}")
    if STATE.running_since is not None:
        raise HTTPProblem(409, "a Triton self-test is running; clear the caches when it has finished")
    if STATE.clearing:
        raise HTTPProblem(409, "the caches are already being cleared")
    STATE.clearing = True
    try:
        cleared = await _in_thread(clear_caches, list(dict.fromkeys(which)))
        caches = await _in_thread(cache_info)
    finally:
        STATE.clearing = False
    if STATE.environment is not None:
        STATE.environment["caches"] = {k: {"path": v["path"], "exists": v["exists"], "bytes": v["bytes"]}
                                       for k, v in caches.items()}
    ok = not any(r["errors"] for r in cleared.values())
    return {"ok": ok, "cleared": cleared, "caches": caches}


def calibration_info() -> dict:
    """The calibration files in the store folder (one per GPU / driver / torch / Triton / pack
    version), with their choices and timings, and the switches that change auto's choice."""
    from ..kernels import calibration as C, compile_pool
    from . import calibration as NC  # points the store at ComfyUI's user folder
    d = C.store_dir()
    files = []
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    for name in names:
        if not (name.startswith("calibration-") and name.endswith(".json")):
            continue
        path = os.path.join(d, name)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("format") != C.FORMAT:
                raise ValueError("not a TritonKit calibration file")
            files.append({"path": path, "env": data.get("env"), "entries": data.get("entries", {})})
        except (OSError, ValueError) as e:
            files.append({"path": path, "error": f"{type(e).__name__}: {e}"})
    return {"dir": d, "timing": C.timing_enabled(), "counters": dict(C.COUNTERS),
            "forced": {NC.ATTN_PATH_ENV: NC.forced(NC.ATTN_PATH_ENV, NC.ATTN_PATHS),
                       NC.FP8_PATH_ENV: NC.forced(NC.FP8_PATH_ENV, NC.FP8_PATHS)},
            "compile_workers": compile_pool.status(), "files": files}


async def get_calibration(request):
    check_query(request)
    return await _in_thread(calibration_info)


ROUTES = {
    "status": {"GET": get_status},
    "calibration": {"GET": get_calibration},
    "selftest": {"POST": post_selftest},
    "caches": {"GET": get_caches},
    "caches/clear": {"POST": post_caches_clear},
}


def _notify(event: str, data: dict) -> None:
    try:
        srv = sys.modules.get("server")
        inst = getattr(getattr(srv, "PromptServer", None), "instance", None)
        if inst is not None:
            inst.send_sync(event, jsonable(data))
    except Exception:
        log.debug("TritonKit: could not send %s", event, exc_info=True)


def make_handler(name: str, methods: dict):
    from aiohttp import web

    async def handler(request):
        fn = methods.get(request.method)
        try:
            if fn is None:
                raise HTTPProblem(405, f"{request.method} is not allowed on {PREFIX}/{name}; use "
                                       f"{' or '.join(methods)}")
            return web.json_response(await fn(request))
        except HTTPProblem as p:
            headers = {"Allow": ", ".join(methods)} if p.status == 405 else None
            return web.json_response({"error": p.message, **jsonable(p.extra)}, status=p.status, headers=headers)
        except Exception as exc:  # a bug or an unexpected environment: logged here, a message there
            log.exception("TritonKit: %s %s failed", request.method, request.path)
            return web.json_response({"error": f"internal error in {PREFIX}/{name}: {type(exc).__name__}: {exc}"},
                                     status=500)
    handler.__name__ = f"tritonkit_{name.replace('/', '_')}"
    return handler


async def not_found(request):
    from aiohttp import web
    return web.json_response({"error": f"no such TritonKit route: {request.path}; known: "
                                       f"{', '.join(PREFIX + '/' + r for r in ROUTES)}"}, status=404)


def register(prompt_server=None) -> bool:
    """Adds the routes to ComfyUI's server. Returns False (and changes nothing) when there is no
    running ComfyUI server, or when its router is already frozen."""
    if prompt_server is None:
        srv = sys.modules.get("server")  # ComfyUI's server module; never imported from here
        prompt_server = getattr(getattr(srv, "PromptServer", None), "instance", None)
    if prompt_server is None:
        return False
    app = getattr(prompt_server, "app", None)
    if app is not None and app.router.frozen:
        log.warning("TritonKit: the server's router is frozen; the Triton panel's routes are not available")
        return False
    routes = prompt_server.routes
    for name, methods in ROUTES.items():
        routes.route("*", f"{PREFIX}/{name}")(make_handler(name, methods))
    routes.route("*", PREFIX + "/{tail:.*}")(not_found)
    return True
