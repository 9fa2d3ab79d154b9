"""HTTP layer cost against a real Granian process, with the engine-only baseline.

    python scripts/bench_http.py [--requests 300] [--concurrency 8] [--stream-tokens 400]

1. Latency of a 1-token /generate request over HTTP (keep-alive, sequential) next to
   the same generation called in-process: the difference is what the HTTP layer adds.
2. Requests per second for 1-token requests with several concurrent clients.
3. Streamed tokens per second (SSE, /generate stream=true) next to the in-process
   decode rate of the same request.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinyloop.engine.generate import GenerationRequest, generate  # noqa: E402
from tinyloop.model.loader import load_model  # noqa: E402
from tinyloop.model.testmodels import make_test_model  # noqa: E402

KEY = "bench-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--stream-tokens", type=int, default=400)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp())
    model_path = folder / "tiny.tinyloop"
    make_test_model(model_path, "tiny-looped", seed=0, eos_token_ids=())
    loaded = load_model(model_path)
    prompt_ids = loaded.tokenizer.encode("Hi")

    def engine_once(max_tokens):
        start = time.perf_counter()
        generate(loaded.model, GenerationRequest(prompt_ids, max_tokens))
        return time.perf_counter() - start

    port = free_port()
    env = {**os.environ, "TINYLOOP_MODEL_PATH": str(model_path), "TINYLOOP_API_KEY": KEY,
           "TINYLOOP_MAX_WAITING": str(args.concurrency * 2), "TINYLOOP_STATE_DIR": str(folder)}
    server = subprocess.Popen([sys.executable, "-m", "granian", "--interface", "asgi", "--port", str(port),
                               "--log-level", "warning", "asgi.app:app"], cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {KEY}"}
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/health", headers=headers).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        one = {"prompt": "Hi", "max_tokens": 1}
        with httpx.Client(headers=headers) as client:
            for _ in range(20):                                        # warm up both paths
                client.post(f"{base}/generate", json=one)
                engine_once(1)
            http_times, engine_times, health_times = [], [], []
            for _ in range(args.requests):                             # interleaved, side by side
                start = time.perf_counter()
                response = client.post(f"{base}/generate", json=one)
                http_times.append(time.perf_counter() - start)
                assert response.status_code == 200
                engine_times.append(engine_once(1))
                start = time.perf_counter()
                client.get(f"{base}/health")
                health_times.append(time.perf_counter() - start)
        http_ms, engine_ms = statistics.median(http_times) * 1000, statistics.median(engine_times) * 1000
        print(f"1-token generation, median of {args.requests}: HTTP {http_ms:.2f} ms, in-process engine "
              f"{engine_ms:.2f} ms, added by HTTP {http_ms - engine_ms:.2f} ms ({http_ms / engine_ms:.2f}x); "
              f"a bare GET /health round trip (client + Granian + auth + JSON): "
              f"{statistics.median(health_times) * 1000:.2f} ms")

        done = []

        def worker(count):
            with httpx.Client(headers=headers, timeout=60) as client:
                for _ in range(count):
                    assert client.post(f"{base}/generate", json=one).status_code == 200
                    done.append(1)

        per = args.requests // args.concurrency
        threads = [threading.Thread(target=worker, args=(per,)) for _ in range(args.concurrency)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        print(f"1-token requests/s with {args.concurrency} concurrent clients: {len(done) / elapsed:.1f} "
              f"(in-process engine alone: {1000 / engine_ms:.1f}/s)")

        n = args.stream_tokens
        engine_s = min(engine_once(n) for _ in range(3))
        best = 0.0
        for _ in range(3):
            count, start = 0, time.perf_counter()
            with httpx.stream("POST", f"{base}/generate", headers=headers,
                              json={"prompt": "Hi", "max_tokens": n, "stream": True}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {\"token_id\"") and '"token_id":-1' not in line:
                        count += 1
            best = max(best, count / (time.perf_counter() - start))
        print(f"streamed tokens/s ({n} tokens, SSE): {best:.1f}; in-process engine: {n / engine_s:.1f} "
              f"({best / (n / engine_s):.2f}x)")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
