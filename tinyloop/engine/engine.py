"""The engine: one dedicated thread that steps generations, schedule -> run -> postprocess.

Admission: one generation runs; up to `max_waiting` wait in order; a submit beyond
that is refused (the HTTP layer answers 429). A request is validated when submitted
(a bad one never queues). A generation whose client left is cancelled: dropped from
the queue if waiting, stopped before its next step if running. Stopping the engine
ends every generation with finish reason "shutdown". An unexpected error inside a
step marks the engine failed; it then refuses everything (503).

Each engine step schedules the sequences to advance (today: the one running, admitting
the next waiting one when none runs), runs one step of each (a prefill, a decode step
or a speculative round), then postprocesses: finished and cancelled sequences report
their result and give their KV cache back to the pool. Running several sequences in
one step is a change to the scheduler (and a batched forward), not to this loop.
"""
from __future__ import annotations

import logging
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field

from tinyloop.engine.output import FINISH_CANCELLED, FINISH_SHUTDOWN
from tinyloop.engine.request import GenerationRequest, check_request
from tinyloop.engine.sequence import Sequence
from tinyloop.errors import RequestError, TinyLoopError
from tinyloop.kv.pool import KVPool, default_pool_bytes

log = logging.getLogger("tinyloop.engine")


class QueueFull(TinyLoopError):
    """Every waiting place is taken."""


class EngineFailed(TinyLoopError):
    """The engine hit an internal error and takes no more work."""


class ShuttingDown(EngineFailed):
    """The engine is stopping: it takes no more work and ends what it had."""


@dataclass
class Submission:
    """A request handed to the engine, and how to reach its submitter."""
    request: GenerationRequest
    # Called on the engine thread: ("token", (id, text)) (after ("logprobs", TokenLogprobs) when
    # the request asks for logprobs), then ("done", GenerationResult) or
    # ("error", exception). The caller moves them to its own thread or event loop.
    on_event: object = None
    cancel: threading.Event = field(default_factory=threading.Event)
    sequence: Sequence | None = None

    def emit(self, kind: str, payload) -> None:
        if self.on_event is not None:
            self.on_event(kind, payload)


class Engine:
    def __init__(self, loaded, max_waiting: int = 8, on_failure=None, on_job_done=None,
                 kv_budget_bytes: int | None = None, faults=None):
        self.loaded = loaded
        self.faults = faults                    # a FaultPlan (tests only: engine/faults.py) or None
        model = loaded.model
        self.max_waiting = max_waiting
        self.on_failure = on_failure
        self.on_job_done = on_job_done          # (GenerationResult) -> None, on the engine thread
        self.failure: str | None = None
        self.pool = KVPool(model.backend, kv_budget_bytes or default_pool_bytes(model),
                           from_setting=kv_budget_bytes is not None)
        self._lock = threading.Condition()
        self._waiting: deque[Submission] = deque()
        self._running: Submission | None = None
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

    def submit(self, request: GenerationRequest, on_event=None) -> Submission:
        """Validate and queue; RequestError for a bad request, QueueFull, EngineFailed."""
        self.check(request)
        submission = Submission(request, on_event)
        with self._lock:
            if self.failure is not None:
                raise EngineFailed(self.failure)
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            # Capacity is one running + max_waiting waiting. While the engine thread has not yet
            # taken the head of the queue, that request holds the running slot, not a waiting one:
            # admission must not depend on how soon the engine thread wakes up.
            free_runner = 1 if self._running is None else 0
            if len(self._waiting) >= self.max_waiting + free_runner:
                raise QueueFull(f"{self.running} generation running and {len(self._waiting)} waiting "
                                f"(TINYLOOP_MAX_WAITING={self.max_waiting})")
            self._waiting.append(submission)
            self._lock.notify_all()
        return submission

    def check(self, request: GenerationRequest) -> None:
        """Everything that can be refused before queueing: the request and its KV cache size."""
        model = self.loaded.model
        Sequence.check_cache(model, request, check_request(model, request), self.pool)

    def cancel(self, submission: Submission) -> None:
        """The client left: forget the request if it waits, stop it if it runs."""
        submission.cancel.set()
        with self._lock:
            try:
                self._waiting.remove(submission)
            except ValueError:
                pass

    def stop(self) -> None:
        """End every generation (finish reason "shutdown") and the engine thread."""
        with self._lock:
            self._stopping = True
            waiting, self._waiting = list(self._waiting), deque()
            self._lock.notify_all()
        for submission in waiting:
            submission.emit("error", ShuttingDown("the server is shutting down"))
        self._thread.join(timeout=10)

    # -- the engine thread ----------------------------------------------------------------
    def _loop(self) -> None:
        while self.step():
            pass

    def step(self) -> bool:
        """One engine step: schedule, run, postprocess. False once the engine stops."""
        batch = self._schedule()
        if batch is None:
            return False
        for submission in batch:
            self._run(submission)
        self._postprocess(batch)
        return True

    def _schedule(self) -> list[Submission] | None:
        """The sequences to advance this step: the running one, or the next waiting one."""
        with self._lock:
            while self._running is None and not self._waiting and not self._stopping:
                self._lock.wait()
            if self._running is None and self._waiting and not self._stopping:
                self._running = self._waiting.popleft()
            running = self._running
        if running is None:
            return None
        return [running]

    def _run(self, submission: Submission) -> None:
        """One step of one sequence (creating it on its first step)."""
        try:
            if submission.sequence is None:
                submission.sequence = Sequence(
                    self.loaded.model, submission.request, self.loaded.tokenizer, self.pool,
                    on_token=lambda token, text: submission.emit("token", (token, text)),
                    on_logprobs=lambda logprobs: submission.emit("logprobs", logprobs))
            sequence = submission.sequence
            if self._stopping:
                sequence.end(FINISH_SHUTDOWN)
            elif submission.cancel.is_set():
                sequence.end(FINISH_CANCELLED)
            else:
                if self.faults is not None:
                    self.faults.before_step(sequence)
                sequence.step()
        except RequestError as exc:
            submission.sequence = None
            self._finish(submission, ("error", exc))
        except Exception as exc:          # noqa: BLE001 - any other error is an engine failure
            self._fail(submission, exc)

    def _postprocess(self, batch: list[Submission]) -> None:
        for submission in batch:
            sequence = submission.sequence
            if sequence is None or not sequence.finished:
                continue
            result = sequence.result()
            if self.on_job_done is not None:
                self.on_job_done(result)
            self._finish(submission, ("done", result))

    def _finish(self, submission: Submission, final: tuple) -> None:
        # Free the engine before telling the client, so whoever sees the result also
        # sees the engine idle.
        with self._lock:
            if self._running is submission:
                self._running = None
        submission.sequence = None                 # its cache goes back to the pool
        submission.emit(*final)

    def _fail(self, submission: Submission, exc: Exception) -> None:
        self.failure = f"engine error: {type(exc).__name__}: {exc}"
        log.error("engine failed:\n%s", traceback.format_exc())
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
        for other in waiting:
            other.cancel.set()
            other.emit("error", EngineFailed(self.failure))
        if self.on_failure is not None:
            self.on_failure(self.failure)
        self._finish(submission, ("error", EngineFailed(self.failure)))
