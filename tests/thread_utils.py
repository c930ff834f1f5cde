"""Running one test function from several threads at once (the node and a route can start the
same work together)."""
from __future__ import annotations

import threading


def run_in_threads(fn, n: int = 4, timeout: float = 300) -> tuple[list, list]:
    """Calls ``fn(i)`` for i in range(n), each in its own thread, all started before any is joined;
    returns (the results by i, the exceptions raised)."""
    results, errors = [None] * n, []

    def one(i):
        try:
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - the caller asserts on them
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results, errors
