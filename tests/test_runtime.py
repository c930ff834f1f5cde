"""kernels/runtime.py's host helpers: the plain cdiv / next_pow2 the launchers use instead of
Triton's constexpr functions agree with Triton's on every value a launcher passes; eager_plain
lets only eager calls on plain CPU / CUDA tensors skip the custom ops."""
import torch
import triton

from tritonkit.kernels.runtime import cdiv, eager_plain, next_pow2


def test_cdiv_and_next_pow2_match_tritons():
    values = list(range(0, 4200)) + [2**k + d for k in range(12, 40) for d in (-1, 0, 1)]
    for n in values:
        assert next_pow2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 16, 64, 128, 1000):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)


def test_eager_plain_is_only_for_plain_eager_tensors():
    assert eager_plain(torch.zeros(2, dtype=torch.float8_e4m3fn))
    assert not eager_plain(torch.empty(2, device="meta"))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert not eager_plain(torch.empty(2))


def test_interpreted_launches_from_several_threads_are_serialized():
    # the Triton interpreter patches triton.language while a kernel runs: without the lock a
    # second thread's launch fails ("Did you forget to add @triton.jit?")
    from thread_utils import run_in_threads
    from tritonkit.kernels import vector_add

    def one(i):
        x = torch.rand(4099 + i)
        y = torch.rand(4099 + i)
        out = torch.full_like(x, float("nan"))
        vector_add.add(x, y, out=out)
        return torch.equal(out, x + y)

    results, errors = run_in_threads(one)
    assert not errors, errors
    assert results == [True] * 4


def _fake_interpreter_tensor():
    """A class shaped like the interpreter's tensor (``.handle.data``, a NumPy array), for its hook to patch."""
    class Handle:
        def __init__(self, data):
            self.data = data

    class Tensor:
        def __init__(self, data):
            self.handle = Handle(data)
    return Tensor


def test_interpreter_index_shim_takes_one_element_arrays(monkeypatch):
    """Triton < 3.8's interpreter converts a tensor to an int with ``int(array)``, which NumPy 2.4
    refuses for a one-element array of one dimension (every kernel with an in-kernel loop bound failed
    on CPU with Triton 3.6): after the shim the conversion takes such an array, and the scope's
    restore removes what it set."""
    import operator

    import numpy as np
    import pytest
    ti = pytest.importorskip("triton.runtime.interpreter")
    if not hasattr(ti, "_patch_lang_tensor") or not hasattr(ti, "_LangPatchScope"):
        pytest.skip("this Triton's interpreter has no _patch_lang_tensor hook")
    from tritonkit.kernels import runtime as R

    def before_38(tensor, scope):  # what Triton 3.6 sets
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))
    monkeypatch.setattr(ti, "_patch_lang_tensor", before_38)
    R.interpreter_index_shim.cache_clear()
    try:
        assert R.interpreter_index_shim()
        assert R.interpreter_index_shim()  # once

        Tensor = _fake_interpreter_tensor()

        scope = ti._LangPatchScope()
        ti._patch_lang_tensor(Tensor, scope)
        for data, want in ((np.array([7], dtype=np.int32), 7), (np.array(5, dtype=np.int64), 5),
                           (np.array([[3]], dtype=np.int32), 3)):
            assert operator.index(Tensor(data)) == want
            assert list(range(Tensor(data))) == list(range(want))
        scope.restore()
        assert not hasattr(Tensor, "__index__")
    finally:
        R.interpreter_index_shim.cache_clear()


def test_interpreter_index_shim_on_the_one_argument_hook_of_triton_3_5_and_older(monkeypatch):
    """Triton 3.3-3.5's ``_patch_lang_tensor(tensor)`` sets the class's attributes itself (no patch scope): the
    shim wraps it the same way (it raised a TypeError on every interpreted launch with Triton 3.3, torch 2.7's)."""
    import operator

    import numpy as np
    import pytest
    ti = pytest.importorskip("triton.runtime.interpreter")
    if not hasattr(ti, "_patch_lang_tensor"):
        pytest.skip("this Triton's interpreter has no _patch_lang_tensor hook")
    from tritonkit.kernels import runtime as R

    def before_36(tensor):  # what Triton 3.3-3.5 do
        tensor.__index__ = lambda self: int(self.handle.data)
    monkeypatch.setattr(ti, "_patch_lang_tensor", before_36)
    R.interpreter_index_shim.cache_clear()
    try:
        assert R.interpreter_index_shim()

        Tensor = _fake_interpreter_tensor()

        ti._patch_lang_tensor(Tensor)
        for data, want in ((np.array([7], dtype=np.int32), 7), (np.array(5, dtype=np.int64), 5)):
            assert operator.index(Tensor(data)) == want
    finally:
        R.interpreter_index_shim.cache_clear()
