"""The engine: one dedicated thread that steps generations, schedule -> run -> postprocess.

Admission: up to `max_running` generations step together (TINYLOOP_MAX_RUNNING; 1 is the
local-agent contract: one runs, the rest wait their turn); up to `max_waiting` wait in
order; a submit beyond that is refused (the HTTP layer answers 429). A request is validated
when submitted (a bad one never queues). The head of the queue starts when a running place
is free and the KV pool can reserve every block its cache may need (kv/pool.py); until
then it, and everything behind it, waits (first come, first served), so a running request
never runs out of cache and is never disturbed by a new one.

Each step: every running sequence names the forward it needs next (a prefill chunk, a
decode step, a draft level or a verify: its decoder's next Pass, model/batch.py); decode,
draft and verify passes all run, prefill chunks run while the step's token budget
(`step_tokens`) allows, at least one per step, so a long prompt is taken a chunk at a time
between the other requests' tokens; the chosen passes run as one batched forward; then each
sequence takes its results (tokens reach its client) and names its next pass.

A generation whose client left is cancelled: dropped from the queue if waiting, ended
before the engine's next step if running. Stopping the engine ends every generation with
finish reason "shutdown". A request-level error (RequestError) in one sequence ends that
sequence alone; any other error inside a step is an engine fault: the engine is marked
failed and refuses everything (503).
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field

from tinyloop.engine.output import FINISH_CANCELLED, FINISH_SHUTDOWN
from tinyloop.engine.request import GenerationRequest, check_request
from tinyloop.engine.sequence import Sequence
from tinyloop.errors import RequestError, TinyLoopError
from tinyloop.kv.pool import KVPool, default_pool_bytes
from tinyloop.kv.prefix import PrefixCache
from tinyloop.limits import DEFAULT_PREFILL_CHUNK
from tinyloop.model.batch import run_passes

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
    submitted: float = field(default_factory=time.perf_counter)
    queue_s: float = 0.0                   # submitted -> admitted
    loops: int = 0                         # what check_request gave (checked once, at submit)
    blocks: int = 0                        # KV pool blocks its cache reserves

    def emit(self, kind: str, payload) -> None:
        if self.on_event is not None:
            self.on_event(kind, payload)


@dataclass
class StepStats:
    """What the engine did, for /metrics (read from other threads: plain counters)."""
    steps: int = 0
    rows: int = 0                          # rows of every batched forward, summed
    batch_sizes: dict = field(default_factory=dict)     # sequences per forward -> forwards


def default_max_running(backend) -> int:
    return getattr(backend, "default_max_running", 1)


def default_prefill_chunk(backend) -> int:
    return getattr(backend, "default_prefill_chunk", DEFAULT_PREFILL_CHUNK)


class Engine:
    def __init__(self, loaded, max_waiting: int = 8, on_failure=None, on_job_done=None,
                 kv_budget_bytes: int | None = None, faults=None, max_running: int | None = None,
                 prefill_chunk: int | None = None, step_tokens: int | None = None, prefix_cache: bool = True):
        self.loaded = loaded
        self.faults = faults                    # a FaultPlan (tests only: engine/faults.py) or None
        model = loaded.model
        self.max_waiting = max_waiting
        self.max_running = max_running or default_max_running(model.backend)
        self.prefill_chunk = prefill_chunk or default_prefill_chunk(model.backend)
        self.step_tokens = max(step_tokens or 2 * self.prefill_chunk, 1)
        self.on_failure = on_failure
        self.on_job_done = on_job_done          # (GenerationResult) -> None, on the engine thread
        self.failure: str | None = None
        self.pool = KVPool.for_model(model, kv_budget_bytes or default_pool_bytes(model),
                                     from_setting=kv_budget_bytes is not None)
        # The prefix cache needs a cached row to be the row a cold prefill computes: on a backend
        # whose bulk path is not row-exact (the NumPy reference, CUDA's prefill kernels) it stays off.
        self.prefix = None
        if prefix_cache and model.backend.bulk_is_exact:
            # the key's seed: what changes a block's bits besides its tokens and slot (the model
            # is this engine's; its recurrence's initial state is named for the record)
            c = model.config
            self.prefix = PrefixCache(self.pool, (model.kv_mode, model.backend.activations,
                                                  c.initial_state, c.state_seed, c.state_std))
        self.stats = StepStats()
        self._lock = threading.Condition()
        self._waiting: deque[Submission] = deque()
        self._running: list[Submission] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="tinyloop-engine", daemon=True)
        self._thread.start()

    # -- admission (any thread) ------------------------------------------------------------
    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, request: GenerationRequest, on_event=None) -> Submission:
        """Validate and queue; RequestError for a bad request, QueueFull, EngineFailed."""
        loops = self.check(request)
        submission = Submission(request, on_event, loops=loops,
                                blocks=Sequence.cache_blocks(self.loaded.model, request, loops))
        with self._lock:
            if self.failure is not None:
                raise EngineFailed(self.failure)
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            # Capacity is max_running running + max_waiting waiting. Requests the engine thread
            # has not taken yet hold free running places, not waiting ones: admission must not
            # depend on how soon the engine thread wakes up.
            free_runners = max(self.max_running - len(self._running), 0)
            if len(self._waiting) >= self.max_waiting + free_runners:
                plural = "" if self.running == 1 else "s"
                raise QueueFull(f"{self.running} generation{plural} running (TINYLOOP_MAX_RUNNING={self.max_running}) "
                                f"and {len(self._waiting)} waiting (TINYLOOP_MAX_WAITING={self.max_waiting})")
            self._waiting.append(submission)
            self._lock.notify_all()
        return submission

    def check(self, request: GenerationRequest) -> int:
        """Everything that can be refused before queueing: the request and its KV cache size.
        -> the loop count it runs at."""
        model = self.loaded.model
        loops = check_request(model, request)
        Sequence.check_cache(model, request, loops, self.pool)
        return loops

    def cancel(self, submission: Submission) -> None:
        """The client left: forget the request if it waits, stop it if it runs."""
        submission.cancel.set()
        with self._lock:
            try:
                self._waiting.remove(submission)
            except ValueError:
                pass
            self._lock.notify_all()

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
        self._run(batch)
        self._postprocess(batch)
        return True

    def _schedule(self) -> list[Submission] | None:
        """The sequences to advance this step: the running ones, and the waiting ones that fit now."""
        with self._lock:
            while not self._running and not self._waiting and not self._stopping:
                self._lock.wait()
            if self._stopping and not self._running:
                return None
            admitted, promised = [], 0          # blocks the admitted will reserve when their caches are made
            while self._waiting and len(self._running) < self.max_running and not self._stopping:
                head = self._waiting[0]
                if not self.pool.can_reserve(promised + head.blocks):
                    break                       # first come, first served: what follows waits too
                promised += head.blocks
                self._waiting.popleft()
                self._running.append(head)
                admitted.append(head)
            if not self._running and self._waiting:
                # nothing runs and the head cannot reserve its blocks: only blocks the prefix
                # cache keeps could be in the way, and evicting frees them; wait for a change
                self._lock.wait(0.05)
            batch = list(self._running)
        for submission in admitted:
            self._admit(submission)
        return batch

    def _admit(self, submission: Submission) -> None:
        """The sequence of a newly admitted request: its cache reserves its blocks now."""
        submission.queue_s = time.perf_counter() - submission.submitted
        try:
            submission.sequence = Sequence(
                self.loaded.model, submission.request, self.loaded.tokenizer, self.pool,
                on_token=lambda token, text: submission.emit("token", (token, text)),
                on_logprobs=lambda logprobs: submission.emit("logprobs", logprobs),
                prefill_chunk=self.prefill_chunk, checked_loops=submission.loops)
            submission.sequence.queue_s = submission.queue_s
        except RequestError as exc:
            self._finish(submission, ("error", exc))
        except Exception as exc:          # noqa: BLE001 - any other error is an engine failure
            self._fail(exc)

    def _run(self, batch: list[Submission]) -> None:
        """One step of every running sequence: their passes in one batched forward."""
        ready = []
        for submission in batch:
            sequence = submission.sequence
            if sequence is None or self.failure is not None:
                continue
            if self._stopping:
                sequence.end(FINISH_SHUTDOWN)
                continue
            if submission.cancel.is_set():
                sequence.end(FINISH_CANCELLED)
                continue
            try:
                if self.faults is not None:
                    self.faults.before_step(sequence)
                step = sequence.next_pass()
            except RequestError as exc:
                self._finish(submission, ("error", exc))
                continue
            except Exception as exc:      # noqa: BLE001 - any other error is an engine failure
                self._fail(exc)
                return
            if step is not None:
                ready.append((submission, step))
        chosen = self._within_budget(ready)
        if not chosen:
            return
        try:
            run_passes(self.loaded.model, [step for _, step in chosen])
        except Exception as exc:          # noqa: BLE001 - a fault in the batched forward fails the engine
            self._fail(exc)
            return
        self.stats.steps += 1
        self.stats.rows += sum(step.n_rows for _, step in chosen)
        self.stats.batch_sizes[len(chosen)] = self.stats.batch_sizes.get(len(chosen), 0) + 1
        for submission, _ in chosen:
            try:
                submission.sequence.advance()
            except RequestError as exc:
                self._finish(submission, ("error", exc))
            except Exception as exc:      # noqa: BLE001
                self._fail(exc)
                return

    def _within_budget(self, ready: list) -> list:
        """Every decode, draft and verify pass; prefill chunks in admission order while the
        step's rows stay within step_tokens, and at least one, so prompts always advance."""
        chosen = [(s, p) for s, p in ready if p.exact]
        rows = sum(p.n_rows for _, p in chosen)
        prefills = 0
        for submission, step in ready:
            if step.exact:
                continue
            if prefills and rows + step.n_rows > self.step_tokens:
                continue
            chosen.append((submission, step))
            rows += step.n_rows
            prefills += 1
        return chosen

    def _postprocess(self, batch: list[Submission]) -> None:
        for submission in batch:
            sequence = submission.sequence
            if sequence is None or not sequence.finished or submission not in self._running:
                continue
            result = sequence.result()
            if self.on_job_done is not None:
                self.on_job_done(result)
            self._finish(submission, ("done", result))

    def _finish(self, submission: Submission, final: tuple) -> None:
        # Free the engine's place and the cache's blocks before telling the client, so whoever
        # sees the result also sees them free.
        with self._lock:
            if submission in self._running:
                self._running.remove(submission)
            self._lock.notify_all()
        if submission.sequence is not None:
            submission.sequence.release()
        submission.sequence = None
        submission.emit(*final)

    def _fail(self, exc: Exception) -> None:
        """An engine fault: every running and waiting generation ends with EngineFailed."""
        self.failure = f"engine error: {type(exc).__name__}: {exc}"
        log.error("engine failed:\n%s", traceback.format_exc())
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
            running = list(self._running)
        for other in waiting:
            other.cancel.set()
            other.emit("error", EngineFailed(self.failure))
        if self.on_failure is not None:
            self.on_failure(self.failure)
        for submission in running:
            self._finish(submission, ("error", EngineFailed(self.failure)))
