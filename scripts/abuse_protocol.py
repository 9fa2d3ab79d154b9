"""Raw-protocol abuse of a fresh Granian server, at full counts (the test suite runs the
same attacks from tests/protocol_abuse.py with fewer slow connections).

    python scripts/abuse_protocol.py [--connections 1000] [--slow 300] [--rounds 3]

Each round: slowloris connections (half headers, half bodies) while a normal request is
answered, bodies that stop mid-JSON, a chunked body over the size limit, invalid UTF-8 in
paths and headers, `--connections` connections opened at once and dropped, pipelining, a
half-closed client, and the Responses and Messages routes (mid-JSON bodies, reset streams,
pipelining). Then the server must be healthy, no admission slot leaked, and the
greedy answer unchanged. Exit status 0 when so.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import protocol_abuse as abuse  # noqa: E402
from live_server import LiveServer  # noqa: E402

BODY_LIMIT = 4096


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000, help="opened at once and dropped (1000)")
    parser.add_argument("--slow", type=int, default=300, help="slowloris connections held open (300)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    from tinyloop.model.testmodels import make_test_model
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.tinyloop"
        make_test_model(path, "tiny-looped", seed=0, eos_token_ids=(), max_seq_len=256)
        with LiveServer(path, env={"TINYLOOP_MAX_BODY_BYTES": str(BODY_LIMIT)}) as server:
            reference = abuse.reference_answer(server)
            for round_index in range(args.rounds):
                seen = {"slowloris": abuse.slowloris(server, args.slow)["status_while_stalled"],
                        "mid_json": abuse.body_stops_mid_json(server),
                        "chunked_over_limit": abuse.chunked_over_limit(server, BODY_LIMIT)["status"],
                        "invalid_utf8": abuse.invalid_utf8(server),
                        "open_and_drop": abuse.open_and_drop(server, args.connections),
                        "pipelining": abuse.pipelining(server)[:3],
                        "half_close": abuse.half_close(server),
                        "agent_routes": abuse.agent_routes(server)}
                print(f"round {round_index + 1}: {seen}")
                if seen["pipelining"] != [200, 200, 200]:
                    problems.append(f"round {round_index + 1}: pipelined requests answered {seen['pipelining']}")
                problems += abuse.after_abuse(server, reference)
            status = server.stop()
            if status != 0:
                problems.append(f"granian exited with {status} on SIGTERM")
    for problem in problems:
        print(f"FAIL {problem}")
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
