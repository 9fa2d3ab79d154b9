"""Prometheus text metrics (exposition format 0.0.4), kept in plain Python."""
from __future__ import annotations

import os
import threading
from collections import Counter

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# core loops per token under adaptive depth: Ouro's 1-4 one by one, then up to MAX_LOOPS_LIMIT
LOOPS_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests = Counter()            # (route, status) -> count
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.generations = Counter()         # (mode, finish_reason) -> count
        self.disconnects = 0
        self.ttft_buckets = [0] * len(TTFT_BUCKETS)
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.loops_used = Counter()          # loops "auto": depth -> generated tokens that ran it
        self.spec_rounds = 0
        self.spec_drafted = 0
        self.spec_accepted = 0
        self.admitted = 0
        self.refused = Counter()             # reason -> count (queue_full, draining, ...)
        self.settled = Counter()             # completed / cancelled / failed -> count
        self.queue_sum = 0.0                 # seconds generations waited for a running place
        self.queue_count = 0

    def on_admitted(self) -> None:
        with self._lock:
            self.admitted += 1

    def on_refused(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] += 1

    def on_settled(self, end: str) -> None:
        with self._lock:
            self.settled[end] += 1

    def on_request(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[(route, status)] += 1

    def on_disconnect(self) -> None:
        with self._lock:
            self.disconnects += 1

    def on_job_done(self, result) -> None:
        """Every engine job, whether its client stayed or not (engine thread)."""
        with self._lock:
            self.queue_sum += result.queue_s
            self.queue_count += 1
            self.prompt_tokens += result.prompt_tokens
            self.completion_tokens += result.completion_tokens
            self.generations[(result.mode, result.finish_reason)] += 1
            if result.speculative is not None:
                self.spec_rounds += result.speculative.rounds
                self.spec_drafted += result.speculative.drafted
                self.spec_accepted += result.speculative.accepted
            self.loops_used.update(result.loops_used or ())     # only adaptive-depth generations record depths

    def on_first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft_sum += seconds
            self.ttft_count += 1
            for i, bound in enumerate(TTFT_BUCKETS):
                if seconds <= bound:
                    self.ttft_buckets[i] += 1

    def render(self, running: int, waiting: int, draining: bool = False, engine=None) -> str:
        lines = []

        def metric(name, kind, help_text, samples):
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines.append(f"{name}{{{label_text}}} {value}" if label_text else f"{name} {value}")

        with self._lock:
            metric("tinyloop_requests_total", "counter", "HTTP requests by route and status.",
                   [({"route": r, "status": s}, n) for (r, s), n in sorted(self.requests.items())])
            metric("tinyloop_generations_running", "gauge",
                   "Generations running (stepped together, up to TINYLOOP_MAX_RUNNING).", [({}, running)])
            metric("tinyloop_generations_waiting", "gauge", "Generations waiting for the engine.",
                   [({}, waiting)])
            metric("tinyloop_draining", "gauge", "1 once the server was told to stop: it takes no new generations.",
                   [({}, int(draining))])
            if engine is not None:
                engine_samples(metric, lines, engine)
            metric("tinyloop_generations_total", "counter",
                   "Engine jobs by mode and finish reason (cancelled: the client left or a stop string matched).",
                   [({"mode": m, "finish_reason": f}, n) for (m, f), n in sorted(self.generations.items())])
            metric("tinyloop_client_disconnects_total", "counter", "Generations cancelled by a client leaving.",
                   [({}, self.disconnects)])
            metric("tinyloop_prompt_tokens_total", "counter", "Prompt tokens processed.", [({}, self.prompt_tokens)])
            metric("tinyloop_completion_tokens_total", "counter", "Tokens generated.",
                   [({}, self.completion_tokens)])
            cumulative = []
            for bound, count in zip(TTFT_BUCKETS, self.ttft_buckets):
                cumulative.append(({"le": bound}, count))
            cumulative.append(({"le": "+Inf"}, self.ttft_count))
            lines.append("# HELP tinyloop_time_to_first_token_seconds Request arrival to first token.")
            lines.append("# TYPE tinyloop_time_to_first_token_seconds histogram")
            for labels, value in cumulative:
                lines.append(f'tinyloop_time_to_first_token_seconds_bucket{{le="{labels["le"]}"}} {value}')
            lines.append(f"tinyloop_time_to_first_token_seconds_sum {self.ttft_sum:.6f}")
            lines.append(f"tinyloop_time_to_first_token_seconds_count {self.ttft_count}")
            name = "tinyloop_adaptive_loops_per_token"
            lines.append(f"# HELP {name} Core loops each generated token ran under loops \"auto\" (adaptive "
                         "depth; a generation's first token comes from the full-depth prefill).")
            lines.append(f"# TYPE {name} histogram")
            for bound in LOOPS_BUCKETS:
                below = sum(n for depth, n in self.loops_used.items() if depth <= bound)
                lines.append(f'{name}_bucket{{le="{bound}"}} {below}')
            lines.append(f'{name}_bucket{{le="+Inf"}} {sum(self.loops_used.values())}')
            lines.append(f"{name}_sum {sum(d * n for d, n in self.loops_used.items())}")
            lines.append(f"{name}_count {sum(self.loops_used.values())}")
            metric("tinyloop_speculative_rounds_total", "counter", "Speculative draft-verify rounds.",
                   [({}, self.spec_rounds)])
            metric("tinyloop_speculative_drafted_tokens_total", "counter", "Draft tokens proposed.",
                   [({}, self.spec_drafted)])
            metric("tinyloop_speculative_accepted_tokens_total", "counter", "Draft tokens accepted.",
                   [({}, self.spec_accepted)])
            lines.append("# HELP tinyloop_queue_seconds Time finished generations waited for a running place.")
            lines.append("# TYPE tinyloop_queue_seconds summary")
            lines.append(f"tinyloop_queue_seconds_sum {self.queue_sum:.6f}")
            lines.append(f"tinyloop_queue_seconds_count {self.queue_count}")
            metric("tinyloop_admitted_total", "counter", "Generations admitted to the engine's queue.",
                   [({}, self.admitted)])
            metric("tinyloop_refused_total", "counter", "Generations refused at admission, by reason.",
                   [({"reason": r}, n) for r, n in sorted(self.refused.items())])
            metric("tinyloop_settled_total", "counter", "Admitted generations that ended: completed, cancelled "
                   "(the client left) or failed. admitted = settled + running + waiting.",
                   [({"end": e}, n) for e, n in sorted(self.settled.items())])
        for name, kind, help_text, value in process_samples():
            metric(name, kind, help_text, [({}, value)])
        return "\n".join(lines) + "\n"


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def engine_samples(metric, lines, engine) -> None:
    """The engine's steps (sequences per batched forward, rows), its KV pool's blocks and its
    prefix cache (counters the engine thread keeps; read here without its lock: each value
    is a plain int, and a scrape one step stale is fine)."""
    stats, pool = engine.stats, engine.pool
    metric("tinyloop_engine_steps_total", "counter", "Engine steps that ran a batched forward.", [({}, stats.steps)])
    metric("tinyloop_engine_rows_total", "counter", "Token rows run by the engine's forwards (prompt chunks, decode "
           "steps, draft and verify rows).", [({}, stats.rows)])
    name = "tinyloop_engine_batch_size"
    sizes = dict(stats.batch_sizes)
    lines.append(f"# HELP {name} Sequences sharing each batched forward.")
    lines.append(f"# TYPE {name} histogram")
    for bound in BATCH_BUCKETS:
        lines.append(f'{name}_bucket{{le="{bound}"}} {sum(n for size, n in sizes.items() if size <= bound)}')
    lines.append(f'{name}_bucket{{le="+Inf"}} {sum(sizes.values())}')
    lines.append(f"{name}_sum {sum(size * n for size, n in sizes.items())}")
    lines.append(f"{name}_count {sum(sizes.values())}")
    prefix = pool.prefix
    cached = prefix.cached_blocks if prefix is not None else 0
    metric("tinyloop_kv_blocks", "gauge", "KV pool blocks (64 rows of one layer instance each): held by running "
           "generations, kept by the prefix cache only, free.",
           [({"state": "held"}, pool.used_blocks - (prefix.idle_blocks if prefix is not None else 0)),
            ({"state": "cached_idle"}, prefix.idle_blocks if prefix is not None else 0),
            ({"state": "free"}, pool.usable_blocks - pool.used_blocks)])
    metric("tinyloop_kv_block_bytes", "gauge", "Bytes of one KV pool block.", [({}, pool.block_bytes)])
    metric("tinyloop_kv_reserved_blocks", "gauge", "KV blocks promised to running generations, not yet taken.",
           [({}, pool.reserved)])
    if prefix is not None:
        metric("tinyloop_prefix_cache_blocks", "gauge", "KV blocks the prefix cache can serve (in use or idle).",
               [({}, cached)])
        metric("tinyloop_prefix_cache_lookups_total", "counter", "Prompt tokens looked up in the prefix cache, by "
               "outcome (hit: their KV was reused).", [({"outcome": "hit"}, prefix.hit_tokens),
                                                       ({"outcome": "miss"}, prefix.miss_tokens)])
        metric("tinyloop_prefix_cache_evictions_total", "counter", "Idle cached blocks evicted for room.",
               [({}, prefix.evictions)])


def process_samples() -> list[tuple]:
    """This worker process's resident memory, open file descriptors and threads, from
    /proc (Linux; empty elsewhere): what a soak test watches for leaks."""
    try:
        with open("/proc/self/statm") as f:
            rss_pages = int(f.read().split()[1])
        fds = len(os.listdir("/proc/self/fd"))
        with open("/proc/self/status") as f:
            threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    except (OSError, ValueError, StopIteration):
        return []
    return [("process_resident_memory_bytes", "gauge", "Resident memory of the worker.",
             rss_pages * os.sysconf("SC_PAGE_SIZE")),
            ("process_open_fds", "gauge", "Open file descriptors of the worker.", fds),
            ("process_threads", "gauge", "OS threads of the worker.", threads)]
