"""What every step shares: its one-line result, and the context the steps read the machine through
(platform, environment, registry, commands, network), so that tests describe a Windows machine on Linux."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable

# done: it changed something; ok: already fine; skipped: not applicable here (says why);
# failed: says why and what to do; todo: --check found work that a normal run would do; warn: works, with a caveat
STATUSES = ("done", "ok", "skipped", "failed", "todo", "warn")
_LABELS = {"done": "done", "ok": "ok", "skipped": "skipped", "failed": "FAILED", "todo": "to do", "warn": "warning"}


@dataclass
class StepResult:
    step: str
    status: str
    message: str
    fix: str | None = None
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown step status {self.status!r}")

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def line(self) -> str:
        text = f"[{_LABELS[self.status]}] {self.step}: {self.message}"
        if self.fix:
            text += f" -> {self.fix}"
        return text

    def to_dict(self) -> dict:
        return asdict(self)


def find_package_dir(site_packages: list[str], name: str) -> str | None:
    """The folder of package ``name`` (one with an ``__init__.py``) in the first of ``site_packages`` that has it."""
    for sp in site_packages or []:
        d = os.path.join(sp, name)
        if os.path.isfile(os.path.join(d, "__init__.py")):
            return d
    return None


def no_registry(hive: str, key: str, value: str):
    """The registry reader of a machine without a Windows registry: every value is absent."""
    return None


def windows_registry(hive: str, key: str, value: str):
    """Reads one registry value (``hive`` 'HKLM' or 'HKCU'; ``value`` '' for the default one);
    None when the key or value is absent or unreadable."""
    import winreg

    root = {"HKLM": winreg.HKEY_LOCAL_MACHINE, "HKCU": winreg.HKEY_CURRENT_USER}[hive]
    try:
        with winreg.OpenKey(root, key) as k:
            return winreg.QueryValueEx(k, value)[0]
    except OSError:
        return None


def run_command(argv: list[str], timeout: float | None = None) -> tuple[int, str]:
    """Runs a command with no stdin (ComfyUI-Manager gives none) and returns (exit code, output)."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, errors="replace", timeout=timeout)
    except OSError as exc:  # not found, not executable, not a program for this machine
        return 127, f"{argv[0]}: cannot run it ({exc})"
    except subprocess.TimeoutExpired as exc:
        return 124, f"{' '.join(argv)}: timed out after {exc.timeout} s"
    return p.returncode, p.stdout


def is_interactive(env: dict, stdin, stdout) -> bool:
    """Whether a person at a terminal runs install.py. ComfyUI-Manager pipes stdout and sets
    COMFYUI_PATH (its child may still inherit a console stdin), so neither case ever asks."""
    if env.get("COMFYUI_PATH") or env.get("__COMFY_CLI_SESSION__"):
        return False
    try:
        return bool(stdin is not None and stdin.isatty() and stdout is not None and stdout.isatty())
    except (ValueError, OSError):  # closed streams
        return False


NUGET_BASE = "https://api.nuget.org/v3-flatcontainer"
VCREDIST_URL = "https://aka.ms/vs/17/release/vc_redist.x64.exe"


@dataclass
class Context:
    """How the steps see the machine. Defaults describe the running process."""
    platform: str = sys.platform
    env: dict = field(default_factory=lambda: dict(os.environ))
    home: str = field(default_factory=lambda: os.path.expanduser("~"))
    read_registry: Callable[[str, str, str], object] | None = None
    run: Callable[..., tuple[int, str]] = run_command
    nuget_base: str = NUGET_BASE
    download_timeout: float = 120.0
    system32: str | None = None
    check: bool = False          # --check: detect and report, write nothing
    assume_yes: bool = False     # --yes
    interactive: bool = False    # stdin is a terminal (never under ComfyUI-Manager)
    log: Callable[[str], None] = lambda msg: None
    ask: Callable[[str], str] | None = None

    def __post_init__(self):
        if self.read_registry is None:
            self.read_registry = windows_registry if self.platform == "win32" and sys.platform == "win32" \
                else no_registry
        if self.system32 is None and self.platform == "win32":
            root = self.env.get("SystemRoot") or self.env.get("SYSTEMROOT") or self.env.get("windir")
            if root:
                cand = os.path.join(root, "System32")
                self.system32 = cand if os.path.isdir(cand) else None

    def confirm(self, question: str) -> bool:
        """Yes without asking under --yes or without a terminal (ComfyUI-Manager), so it never
        waits for input there; asks only a person at a terminal."""
        if self.assume_yes or not self.interactive:
            return True
        ask = self.ask or input
        try:
            answer = ask(f"{question} [Y/n] ").strip().lower()
        except EOFError:
            return True
        return answer in ("", "y", "yes")
