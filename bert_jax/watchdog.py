"""The step watchdog (config.watchdog_s): a process whose step has not finished within that time ends, with one line
naming the step.

A live process that hangs (input from a stalled mount, a device that stopped answering, a peer that waits in a
collective for one of these) keeps sending JAX's heartbeats, so the coordination service never notices it
(jax-ml/jax#38503). The loop arms the watchdog for each step and disarms it for what may rightly take longer:
compiling the step for a batch shape it has not run yet, saving, evaluating. On a run over several processes the
watchdog's end is every process's (bert_jax.pod).
"""
from __future__ import annotations

import threading
import time
from typing import Callable


class Watchdog:
    """Calls `on_timeout(step)` from its own thread when the step armed last has run `seconds` without `disarm`
    (0 seconds: never)."""

    def __init__(self, seconds: float, on_timeout: Callable[[int], None]):
        self.seconds, self.on_timeout = seconds, on_timeout
        self._armed: tuple[int, float] | None = None  # (step, monotonic deadline)
        self._changed, self._closed = threading.Condition(), False
        if seconds > 0:
            threading.Thread(target=self._watch, name="bert_jax: step watchdog", daemon=True).start()

    def arm(self, step: int) -> None:
        with self._changed:
            self._armed = (step, time.monotonic() + self.seconds)
            self._changed.notify()

    def disarm(self) -> None:
        with self._changed:
            self._armed = None
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._armed, self._closed = None, True
            self._changed.notify()

    def _watch(self) -> None:
        with self._changed:
            while not self._closed:
                if self._armed is None:
                    self._changed.wait()
                    continue
                step, deadline = self._armed
                left = deadline - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                self._closed = True
                break
            else:
                return
        self.on_timeout(step)
