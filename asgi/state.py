"""What the server holds: settings, the model, the engine, the key, metrics, status."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

from tinyloop import __version__
from tinyloop.engine.engine import Engine
from tinyloop.engine.faults import fault_plan_from_env
from tinyloop.model.loader import LoadedModel, load_model
from tinyloop.text.chat import ChatTemplate

from .auth import load_or_create_key
from .metrics import Metrics
from .settings import Settings

log = logging.getLogger("tinyloop.server")
if not logging.getLogger().handlers and not log.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[%(levelname)s] %(name)s: %(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)

LOADING, READY, FAILED, DRAINING = "loading", "ready", "worker_failed", "draining"


class ServerState:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.metrics = Metrics()
        self.status = LOADING
        self.failure: str | None = None
        self.loaded: LoadedModel | None = None
        self.engine: Engine | None = None
        self.template: ChatTemplate | None = None
        self.created = int(time.time())
        self.key, self.key_file = None, None
        if settings.auth:
            if settings.api_key:
                self.key = settings.api_key
                log.info("auth: API key from TINYLOOP_API_KEY")
            else:
                self.key, self.key_file = load_or_create_key(settings.state_dir)
                log.info("auth: API key in %s", self.key_file)
        else:
            log.warning("auth: OFF (TINYLOOP_AUTH=0)")
        self._load_started = threading.Lock()
        self._load_thread: threading.Thread | None = None
        self.draining = False
        self._drain_deadline: threading.Timer | None = None

    def start_loading(self) -> None:
        """Load the model on a background thread (health says 'loading' meanwhile)."""
        with self._load_started:
            if self._load_thread is None:
                self._load_thread = threading.Thread(target=self._load, name="tinyloop-load", daemon=True)
                self._load_thread.start()

    def _load(self) -> None:
        path = self.settings.model_path
        if not path:
            self._fail("no model configured: set TINYLOOP_MODEL_PATH (or use `tinyloop serve --model`)")
            return
        try:
            faults = fault_plan_from_env(os.environ)
            if faults is not None:
                log.warning("TEST HOOK: fault injection is on (%s:%d); never set TINYLOOP_TEST_HOOKS in "
                            "production", faults.point, faults.after)
            loaded = load_model(path, self.settings.device, self.settings.kv_mode)
            template = ChatTemplate.from_metadata(loaded.file.chat_template)
            engine = Engine(loaded, self.settings.max_waiting, on_failure=self._engine_failed,
                            on_job_done=self.metrics.on_job_done, kv_budget_bytes=self.settings.kv_budget_bytes,
                            faults=faults, max_running=self.settings.max_running,
                            prefill_chunk=self.settings.prefill_chunk, step_tokens=self.settings.step_tokens,
                            prefix_cache=self.settings.prefix_cache)
        except Exception as exc:         # noqa: BLE001 - any load failure keeps the server up, 503
            self._fail(f"model failed to load: {exc}")
            return
        self.loaded, self.template, self.engine = loaded, template, engine
        self.created = int(os.path.getmtime(path))
        self.status = READY
        prefix = "on" if engine.prefix is not None else \
            "off" if not self.settings.prefix_cache else "off (this backend's prefill rows are not row-exact)"
        log.info("model %s loaded in %.2fs: device %s, KV cache %s (pool %.0f MiB, prefix cache %s), %s; up to %d "
                 "generations at once", path, loaded.load_s, loaded.backend.description, self.kv_cache_mode,
                 engine.pool.nbytes / 2**20, prefix, loaded.file.quant_summary(), engine.max_running)

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self.status = FAILED
        log.error("%s", reason)

    def _engine_failed(self, reason: str) -> None:
        self._fail(reason)
        if self.settings.exit_on_failure:
            log.error("TINYLOOP_EXIT_ON_FAILURE is set: exiting so the supervisor restarts the worker")
            os.kill(os.getpid(), signal.SIGTERM)

    def drain(self) -> None:
        """Take no new generations (503 `draining`, /health 503) and let the admitted ones,
        running and waiting, finish; after settings.drain_timeout_s stop what is left (503
        `shutting_down`, or an error event on a stream). Called once the server is told to
        stop (asgi/drain.py); a second call changes nothing."""
        if self.draining:
            return
        self.draining = True
        engine = self.engine
        running, waiting = (engine.running, engine.waiting) if engine else (0, 0)
        log.info("draining: %d generation(s) running and %d waiting may finish within %gs; new ones get 503",
                 running, waiting, self.settings.drain_timeout_s)
        self._drain_deadline = threading.Timer(self.settings.drain_timeout_s, self._drain_timed_out)
        self._drain_deadline.daemon = True
        self._drain_deadline.start()

    def _drain_timed_out(self) -> None:
        engine = self.engine
        if engine is not None and (engine.running or engine.waiting):
            log.warning("drain timeout (%gs): stopping %d running and %d waiting generation(s)",
                        self.settings.drain_timeout_s, engine.running, engine.waiting)
        self.shutdown()

    def shutdown(self) -> None:
        if self._drain_deadline is not None:
            self._drain_deadline.cancel()
        if self.engine is not None:
            self.engine.stop()

    @property
    def health(self) -> str:
        """What /health reports: loading, ready, worker_failed or draining."""
        if self.draining and self.status != FAILED:
            return DRAINING
        return self.status

    @property
    def kv_cache_mode(self) -> str:
        return self.loaded.model.kv_mode if self.loaded else self.settings.kv_mode

    def model_info(self) -> dict:
        c = self.loaded.config
        return {"arch": c.arch, "dim": c.dim, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads,
                "ffn_dim": c.ffn_dim, "vocab_size": c.vocab_size, "default_loops": c.default_loops,
                "min_loops": c.min_loops, "max_loops": c.max_loops, "max_seq_len": c.max_seq_len,
                "quant": self.loaded.file.quant_summary(), "quantization": self.loaded.file.quant_details(),
                "kv_cache_mode": self.kv_cache_mode}

    def runtime(self) -> dict:
        return {"name": "tinyloop", "version": __version__, "commit": self.settings.commit,
                "device": self.loaded.backend.name if self.loaded else None,
                "activations": self.loaded.backend.activations if self.loaded else None}

    @property
    def model_id(self) -> str:
        return self.settings.model_path or "tinyloop"
