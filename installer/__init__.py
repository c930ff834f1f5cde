"""install.py's set-up steps, as functions over explicit paths, platform and environment.

Each module does one step of the issue "install.py" and returns a :class:`common.StepResult`;
:mod:`steps` runs them in order. Nothing here imports torch or Triton, so the steps work (and
are tested) on a machine where either is missing or broken, and for a Python other than the one
running install.py (``--python-dir``)."""
