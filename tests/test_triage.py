"""diagnostics/triage.py against the corpus of real error texts (tests/fixtures/triage/corpus.json):
every text gets its expected entry, no earlier entry takes it, every entry is covered, and the
README's troubleshooting table is the one generated from the entries."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

from tritonkit.diagnostics import triage

REPO = Path(__file__).resolve().parents[1]
CORPUS = json.loads((REPO / "tests" / "fixtures" / "triage" / "corpus.json").read_text(encoding="utf-8"))["entries"]
KEYS = [e.key for e in triage.ENTRIES]


def _load_gen():
    spec = importlib.util.spec_from_file_location("gen_troubleshooting", REPO / "scripts" / "gen_troubleshooting.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_corpus_is_well_formed():
    assert len(CORPUS) >= 60
    ids = [e["id"] for e in CORPUS]
    assert len(ids) == len(set(ids)), "duplicate fixture ids"
    for e in CORPUS:
        assert e["expected"] in KEYS, f"{e['id']}: unknown key {e['expected']!r}"
        assert re.match(r"https://(github\.com|learn\.microsoft\.com)/", e["source"]), e["id"]
        assert e["text"].strip() and e["os"] in ("windows", "linux", "macos"), e["id"]
        assert e["compiler"] in ("none", "tcc", "msvc", "gcc", "clang"), e["id"]
        if e["synthetic"]:
            assert e.get("note"), f"{e['id']}: a synthetic text must say what it is based on"
    assert sum(not e["synthetic"] for e in CORPUS) >= 60  # real texts, not variants


@pytest.mark.parametrize("fx", CORPUS, ids=[e["id"] for e in CORPUS])
def test_each_fixture_is_classified_as_expected(fx):
    entry = triage.classify_text(fx["text"])
    assert entry.key == fx["expected"], (fx["id"], triage.all_matches(fx["text"]))
    assert len(entry.fix) > 40


def match_table(entries, corpus) -> tuple[list[str], list[str]]:
    """For each fixture, every entry of ``entries`` that matches it (the rows), and the fixtures whose
    first match is not the expected entry, with the earlier entries that took them (the wrongs)."""
    keys = [e.key for e in entries]
    rows, wrong = [], []
    for fx in corpus:
        hits = [k for k, _ in triage.all_matches(fx["text"], entries)]
        rows.append(f"{fx['id']}: expected {fx['expected']}, matches {hits or ['(none)']}")
        exp = keys.index(fx["expected"]) if fx["expected"] in keys else len(keys)
        earlier = [k for k in hits if keys.index(k) < exp]
        if earlier or fx["expected"] not in hits:
            wrong.append(f"{fx['id']}: expected {fx['expected']} but " +
                         (f"earlier entries match first: {earlier}" if earlier else f"it does not match ({hits})"))
    return rows, wrong


def test_no_fixture_is_taken_by_an_earlier_broader_entry():
    """Rebuilds the match table: for each fixture, every entry that matches it. The first one must be
    the expected one; the report lists what else matches so an overlap is visible when it fails."""
    rows, wrong = match_table(triage.ENTRIES, CORPUS)
    assert not wrong, "\n".join(wrong + ["", "match table:"] + rows)


def test_a_new_broad_entry_placed_first_is_caught():
    """What the table check is for: an entry matching on 'error' put before the others steals texts."""
    broad = triage.TriageEntry("compile-error", "any error", (r"\berror\b",), "x" * 50)
    _, wrong = match_table((broad,) + triage.ENTRIES, CORPUS)
    assert any("tw3-msvc-c1083-zh" in w and "compile-error" in w for w in wrong)
    _, wrong = match_table(triage.ENTRIES + (broad,), CORPUS)  # last, it takes nothing
    assert wrong == []


def test_every_entry_has_real_fixtures():
    real = {}
    for fx in CORPUS:
        if not fx["synthetic"]:
            real.setdefault(fx["expected"], []).append(fx["id"])
    assert [k for k in KEYS if k not in real] == []


def test_localised_windows_messages_are_recognised_by_their_tokens():
    by_locale = {}
    for fx in CORPUS:
        if fx["locale"] != "en":
            by_locale.setdefault(fx["locale"], []).append(fx)
    assert {"zh-CN", "de-DE", "ru-RU", "ja-JP", "fr-FR"} <= set(by_locale)
    for fxs in by_locale.values():
        for fx in fxs:
            assert triage.classify_text(fx["text"]).key == fx["expected"], fx["id"]


def test_the_embedded_python_without_headers_is_not_stale_cache():
    """The known miss: MSVC's C1083 for Python.h while compiling cuda_utils.c."""
    text = ("cuda_utils.c\nC:\\Users\\u\\AppData\\Local\\Temp\\tmpx\\cuda_utils.c(12): fatal error C1083: "
            "Cannot open include file: 'Python.h': No such file or directory")
    assert triage.classify_text(text).key == "python-h-missing"
    keys = [k for k, _ in triage.all_matches(text)]
    assert "dll-cuda-utils" not in keys


@pytest.mark.parametrize("text,key", [
    # variants no fixture has verbatim: other versions, compilers and wordings of the same failure
    ("LINK : fatal error LNK1104: Datei \"python312.lib\" kann nicht geöffnet werden.", "python-h-missing"),
    ("main.c:1:10: fatal error: 'Python.h' file not found\n#include <Python.h>", "python-h-missing"),
    ("/usr/bin/ld: cannot find -lpython3.12: No such file or directory", "python-h-missing"),
    ("ImportError: DLL load failed while importing cuda_utils: Не найден указанный модуль.", "dll-cuda-utils"),
    ("ImportError: DLL load failed while importing __triton_launcher: 指定されたモジュールが見つかりません。",
     "dll-cuda-utils"),
    ("ptxas fatal   : Value 'sm_120' is not defined for option 'gpu-name'", "ptxas-too-old"),
    ("OSError: [Errno 28] No space left on device: '/home/u/.triton/cache/AB/k.cubin'", "disk-full"),
    ("ImportError: cannot import name 'triton_key' from 'triton.compiler.compiler'", "triton-torch-mismatch"),
    ("PermissionError: [WinError 5] Zugriff verweigert: 'C:\\\\Users\\\\x\\\\.triton\\\\cache\\\\AB\\\\cuda_utils.pyd'",
     "cache-file-locked"),
    # CC naming a folder: CreateProcess on it fails with access denied, no path in the message
    ('  File "C:\\Python310\\lib\\subprocess.py", line 1456, in _execute_child\n'
     "    hp, ht, pid, tid = _winapi.CreateProcess(executable, args,\n"
     "PermissionError: [WinError 5] Access is denied", "wrong-cc"),
])
def test_token_matching_generalises(text, key):
    assert triage.classify_text(text).key == key, triage.all_matches(text)


def test_unrelated_errors_stay_unknown():
    for text in ("ZeroDivisionError: division by zero", "KeyError: 'model.diffusion_model.x'",
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"):
        assert triage.classify_text(text) is triage.UNKNOWN, triage.all_matches(text)


def test_decisive_lines_put_compiler_errors_before_traceback_noise():
    text = ("Traceback (most recent call last):\n"
            '  File "C:\\x\\jit.py", line 607, in run\n'
            "    device = driver.active.get_current_device()\n"
            "             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
            "cuda_utils.c\n"
            "C:\\T\\cuda_utils.c(12): fatal error C1083: Cannot open include file: 'Python.h'\n"
            "subprocess.CalledProcessError: Command '['cl.exe']' returned non-zero exit status 2.\n"
            "subprocess.CalledProcessError: Command '['cl.exe']' returned non-zero exit status 2.\n")
    lines = triage.decisive_lines(text)
    assert lines[0].endswith("fatal error C1083: Cannot open include file: 'Python.h'")
    assert lines[1].startswith("subprocess.CalledProcessError") and len(lines) == 2  # deduplicated, no frames


def test_classify_keeps_compiler_output_and_chain_output():
    try:
        try:
            raise subprocess.CalledProcessError(1, ["tcc.exe", "cuda_utils.c"],
                                                stderr=b"cuda_utils.c:13: error: include file 'Python.h' not found")
        except subprocess.CalledProcessError as inner:
            raise RuntimeError("launcher build failed") from inner
    except RuntimeError as exc:
        res = triage.classify(exc)
    assert res["key"] == "python-h-missing"
    assert "include file 'Python.h' not found" in res["compiler_output"]
    assert res["decisive"][0].startswith("cuda_utils.c:13: error")
    try:
        raise subprocess.CalledProcessError(1, ["gcc", "main.c"])
    except subprocess.CalledProcessError as exc:
        res = triage.classify(exc, native_output="main.c:5:10: fatal error: Python.h: No such file or directory")
    assert res["key"] == "python-h-missing" and res["compiler_output"].startswith("main.c:5:10")


def test_readme_troubleshooting_table_is_generated_from_the_entries():
    gen = _load_gen()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert gen.render(readme, gen.table()) == readme, \
        "README.md's troubleshooting table drifted from diagnostics/triage.py: run scripts/gen_troubleshooting.py"
    for key in KEYS:
        assert f"| `{key}` |" in readme


def test_readme_check_fails_when_an_entry_changes():
    gen = _load_gen()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    changed = list(triage.ENTRIES)
    e = changed[0]
    changed[0] = triage.TriageEntry(e.key, e.title, e.patterns, e.fix, shows=e.shows, cause="something else",
                                    remedy=e.remedy)
    assert gen.render(readme, gen.table(changed)) != readme
