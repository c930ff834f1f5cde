"""The compute capability of a CUDA device, looked up once per process and device.

Dynamo keeps ``torch.cuda.get_device_capability`` as an operation of the graph it traces, so a
lookup in code that ``torch.compile`` traces (the nodes' per-call checks inside a compiled model)
runs on every call of the compiled graph: five per attention call, 285 host calls a Flux step
under TorchCompileModel (``bench/workflow.py --compile-backend census``, H100, 2026-11-24). Here
the answer is kept in a plain dict that eager calls fill (the nodes look their device up when they
patch a model), and traced code reads it as a constant. No Triton import: the nodes use it too."""
from __future__ import annotations

from typing import Optional

import torch

_CC: dict = {}  # CUDA device index -> compute capability as an int (86 for sm86)


def capability(device) -> Optional[int]:
    """The compute capability of ``device`` as an int (86 for sm86); None for a non-CUDA device."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    cc = _CC.get(index)
    if cc is None:
        major, minor = torch.cuda.get_device_capability(index)
        cc = major * 10 + minor
        if not torch.compiler.is_compiling():
            _CC[index] = cc
    return cc
