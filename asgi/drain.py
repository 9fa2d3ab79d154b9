"""Drain on SIGTERM (and SIGINT): finish what was admitted, take nothing new, within a bound.

Granian stops a worker on these signals by closing its listening socket (new connections
are refused: a load balancer moves on before it has sent anything) and waiting for the
requests it has open. It learns of the signal through asyncio (loop.add_signal_handler),
which reads the signal from the loop's wake-up file descriptor whatever Python-level
handler is installed; so a Python-level handler placed in front of it runs as well, and
Granian's own handling is left as it is. Ours tells the server state to drain
(state.py): a generation request that still arrives on an open connection gets 503
`draining` with Retry-After, /health answers 503 "draining", and what still runs or waits
after TINYLOOP_DRAIN_TIMEOUT seconds is stopped (503 `shutting_down`, or an error event
on a stream) so that the worker exits before a supervisor's kill cuts streams mid-token.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import threading

log = logging.getLogger("tinyloop.server")

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def drain_on_signals(state, loop: asyncio.AbstractEventLoop | None = None) -> list:
    """Chain a drain in front of the current handlers of SIGTERM and SIGINT; the signals
    it was installed for. Only in the main thread, and only in front of a Python-level
    handler (asyncio's, under Granian): a process whose signals nobody handles in Python
    keeps their default meaning."""
    if threading.current_thread() is not threading.main_thread():
        return []
    loop = loop or asyncio.get_running_loop()
    installed = []
    for signum in DRAIN_SIGNALS:
        previous = signal.getsignal(signum)
        if not callable(previous):
            continue

        def handler(number, frame, previous=previous):
            # A signal handler may interrupt the loop thread anywhere: only schedule.
            if not loop.is_closed():
                loop.call_soon_threadsafe(state.drain)
            previous(number, frame)

        signal.signal(signum, handler)
        installed.append(signum)
    return installed
