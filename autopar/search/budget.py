"""How long a solve may run and whether it must stop now: the wall clock of the whole solve (``--time-limit``)
and Ctrl-C.

A Budget starts when the solve starts, so tracing the model, building the bounds, every CP-SAT solve (each
is given at most what is left) and the regret's corner searches all draw on the same seconds. What cannot
be cut short is counted, not stopped: a trace of the model, the runtime's check of what it can run, and the
search's work until its first plan that fits (a search stopped before it has one would have nothing to
report); the plan says how long the solve took against its limit.

Ctrl-C (``catch_ctrl_c``): the first stops the search at once (CP-SAT's ``StopSearch`` on the solve that is
running, the branch and bound before its next step) and the solve reports the best plan so far with its
proven gap; a second one aborts (KeyboardInterrupt). CP-SAT's own SIGINT handler is off
(``catch_sigint_signal``): it would end only the inner solve that is running and let the search go on.
Python runs a signal handler only in the main thread between bytecodes, so while a handler is installed
each CP-SAT solve runs in a worker thread (it releases the GIL) and the main thread waits on it.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Any, Callable, Iterator

CTRL_C = "Ctrl-C"
TIME_LIMIT = "time limit"
_POLL_S = 0.1  # how often a waiting main thread re-checks a stop that raced with a solve's start


class Stop:
    """A stop request shared by every budget of one solve (or of a sweep's solves), and the CP-SAT solvers
    running under them."""

    def __init__(self) -> None:
        self.reason = ""            # CTRL_C once requested
        self.catching = False       # a Ctrl-C handler is installed (catch_ctrl_c)
        self._solvers: list[Any] = []

    def request(self, reason: str = CTRL_C) -> None:
        """Stop every search under this request: running CP-SAT solves now, the branch and bound at its next
        step. Safe from a signal handler (it only sets a flag and asks the solvers to stop)."""
        self.reason = reason
        for solver in list(self._solvers):
            solver.stop_search()

    def solve(self, solver: Any, model: Any) -> Any:
        """``solver.solve(model)``, stoppable by ``request``: in a worker thread while a Ctrl-C handler is
        installed, so that the handler runs while CP-SAT works."""
        solver.parameters.catch_sigint_signal = False
        if not self.catching:
            return solver.solve(model)
        status: list[Any] = []

        def run() -> None:
            try:
                status.append(solver.solve(model))
            except Exception as err:  # raised again in the caller's thread, where it belongs
                status.append(err)

        worker = threading.Thread(target=run, daemon=True)
        self._solvers.append(solver)
        try:
            worker.start()
            while worker.is_alive():
                worker.join(_POLL_S)
                if self.reason:  # a request may have come before the solve had started listening
                    solver.stop_search()
        finally:
            self._solvers.remove(solver)
        if isinstance(status[0], Exception):
            raise status[0]
        return status[0]


class Budget:
    """The seconds a search may take from ``start`` (by ``clock``, time.monotonic unless a test injects its own),
    and the stop request it obeys. ``part`` gives a share of what is left, under the same stop request."""

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic, start: float | None = None,
                 stop: Stop | None = None):
        self.seconds = seconds
        self.clock = clock
        self.start = clock() if start is None else start
        self.stop = stop or Stop()

    @property
    def deadline(self) -> float:
        return self.start + self.seconds

    def elapsed(self) -> float:
        return self.clock() - self.start

    def remaining(self) -> float:
        """Seconds left (0 once stopped)."""
        return 0.0 if self.stop.reason else max(0.0, self.deadline - self.clock())

    def spent(self) -> bool:
        return self.remaining() <= 0.0

    @property
    def interrupted(self) -> bool:
        return bool(self.stop.reason)

    def reason(self) -> str:
        """Why a search under this budget stops early: Ctrl-C, else the time limit."""
        return self.stop.reason or TIME_LIMIT

    def part(self, seconds: float) -> "Budget":
        """A budget of ``seconds`` from now, ending no later than this one, under the same stop request."""
        now = self.clock()
        return Budget(max(0.0, min(seconds, self.deadline - now)), clock=self.clock, start=now, stop=self.stop)


@contextlib.contextmanager
def catch_ctrl_c(stop: Stop) -> Iterator[Stop]:
    """While inside: the first Ctrl-C requests ``stop`` (the search stops cleanly with what it has), the second
    raises KeyboardInterrupt. Only in the main thread (Python delivers signals there); nested, the outer
    handler stays."""
    if stop.catching or threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def second(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    def first(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, second)
        stop.request(CTRL_C)

    previous = signal.signal(signal.SIGINT, first)
    stop.catching = True
    try:
        yield stop
    finally:
        stop.catching = False
        signal.signal(signal.SIGINT, previous)
