"""The engine: one dedicated thread that runs generation jobs, one at a time.

Admission: one job runs; up to `max_waiting` wait in order; a submit beyond that is
refused (the HTTP layer answers 429). A job whose client left is cancelled: dropped
from the queue if waiting, stopped within one step if running. An unexpected error
inside a job marks the engine failed; it then refuses everything (503).
"""
from __future__ import annotations

import logging
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field

from tinyloop.errors import RequestError, TinyLoopError
from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.model.loader import LoadedModel
from tinyloop.engine.speculative import SpeculativeParams, speculative_generate

log = logging.getLogger("tinyloop.engine")

MODES = ("generate", "speculative", "tree_speculative")


class QueueFull(TinyLoopError):
    """Every waiting place is taken."""


class EngineFailed(TinyLoopError):
    """The engine hit an internal error and takes no more work."""


@dataclass
class Job:
    request: GenerationRequest
    mode: str = "generate"
    speculative: SpeculativeParams | None = None
    # Called on the engine thread: ("token", id), then ("done", GenerationResult) or
    # ("error", exception). The caller moves them to its own thread or event loop.
    on_event: object = None
    cancel: threading.Event = field(default_factory=threading.Event)


class Engine:
    def __init__(self, loaded: LoadedModel, max_waiting: int = 8, on_failure=None, on_job_done=None):
        self.loaded = loaded
        self.max_waiting = max_waiting
        self.on_failure = on_failure
        self.on_job_done = on_job_done          # (GenerationResult) -> None, on the engine thread
        self.failure: str | None = None
        self._lock = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="tinyloop-engine", daemon=True)
        self._thread.start()

    # -- admission (any thread) ------------------------------------------------------------
    @property
    def running(self) -> int:
        return 1 if self._running is not None else 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, job: Job) -> None:
        with self._lock:
            if self.failure is not None:
                raise EngineFailed(self.failure)
            busy = self._running is not None or self._waiting
            if busy and len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"{self.running} generation running and {len(self._waiting)} waiting "
                                f"(TINYLOOP_MAX_WAITING={self.max_waiting})")
            self._waiting.append(job)
            self._lock.notify_all()

    def cancel(self, job: Job) -> None:
        """The client left: forget the job if it waits, stop it if it runs."""
        job.cancel.set()
        with self._lock:
            try:
                self._waiting.remove(job)
            except ValueError:
                pass

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            if self._running is not None:
                self._running.cancel.set()
            for job in self._waiting:
                job.cancel.set()
            self._lock.notify_all()
        self._thread.join(timeout=10)

    # -- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    return
                job = self._waiting.popleft()
                self._running = job
            final = ("error", EngineFailed("engine stopped"))
            try:
                final = self._run(job)
            finally:
                # Free the engine before telling the client, so whoever sees the result
                # also sees the engine idle.
                with self._lock:
                    self._running = None
                if job.on_event is not None:
                    job.on_event(*final)

    def _run(self, job: Job) -> tuple:
        """Run one job; return the final event ("done", result) or ("error", exception)."""
        emit = job.on_event or (lambda kind, payload: None)
        model = self.loaded.model
        try:
            if job.mode == "generate":
                result = generate(model, job.request, on_token=lambda t: emit("token", t),
                                  cancel=job.cancel)
            elif job.mode in ("speculative", "tree_speculative"):
                result = speculative_generate(model, job.request, job.speculative,
                                              on_token=lambda t: emit("token", t), cancel=job.cancel,
                                              mode=job.mode)
            else:
                raise RequestError(f"mode must be one of {', '.join(MODES)}, got {job.mode!r}", "mode")
        except RequestError as exc:
            return "error", exc
        except Exception as exc:          # noqa: BLE001 - any other error is an engine failure
            self.failure = f"engine error: {type(exc).__name__}: {exc}"
            log.error("engine failed:\n%s", traceback.format_exc())
            with self._lock:
                for waiting in self._waiting:
                    waiting.cancel.set()
                    if waiting.on_event:
                        waiting.on_event("error", EngineFailed(self.failure))
                self._waiting.clear()
            if self.on_failure is not None:
                self.on_failure(self.failure)
            return "error", EngineFailed(self.failure)
        if self.on_job_done is not None:
            self.on_job_done(result)
        return "done", result
