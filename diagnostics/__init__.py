"""Environment report, triage of known Triton failures and the self-test.

Pure Python: importable without ComfyUI, and used by both the nodes and ``install.py``.
Nothing here imports Triton at module import time; a missing or broken Triton is a
finding of the report, never an import error of the pack."""
