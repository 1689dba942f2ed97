"""Load held by the reward server (``verifiers.reward_server.RewardServer``) on loopback: requests/s and latency.

Workload: ``C`` client threads (C = 1, 8, 64 by default) each send ``POST /score`` requests of
``--items`` (question, answer) pairs back to back for ``--seconds``, each on a fresh connection (as
``RewardClient`` and ``urllib`` do), with no retries: any reset, timeout or non-200 reply is
counted as an error. The scorer answers from the text (no model), optionally after
``--batch-cost-ms`` per batch to stand in for a model's forward pass, so the figures are the
server's own overhead: HTTP parsing, the batching queue and JSON. Client and server share the
machine's cores.

Prints, per client count, requests/s, items/s, p50 and p99 latency, items per scored batch and
errors; the last line is ``ratio=<requests/s at the most clients / at 1 client>`` (above 1: the
batching server turns concurrency into throughput).

    PYTHONPATH=. python benchmarks/reward_server_load.py --seconds 5
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import threading
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from verifiers import Verdict
from verifiers.reward_server import RewardServer


def text_scorer(batch_cost_s: float):
    """A scorer whose verdict depends on the answer only, taking ``batch_cost_s`` per batch."""
    def score(pairs: Sequence[tuple[str, str]]) -> list[Verdict]:
        if batch_cost_s:
            time.sleep(batch_cost_s)
        return [Verdict(float(len(a) % 7) / 7, None, {}) for _, a in pairs]
    return score


def run_level(server: RewardServer, clients: int, seconds: float, items: int) -> dict[str, float]:
    """``clients`` threads posting for ``seconds``; throughput, latency percentiles and errors."""
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(c: int) -> None:
        body = json.dumps({"items": [{"question": f"client {c} question {i}", "answer": f"answer {i}"}
                                     for i in range(items)]})
        start.wait()
        mine, failed = [], []
        while time.perf_counter() < stop_at[0]:
            began = time.perf_counter()
            connection = http.client.HTTPConnection(host, port, timeout=30)
            try:
                connection.request("POST", "/score", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                reply = response.read()
                if response.status != 200 or len(json.loads(reply)["verdicts"]) != items:
                    failed.append(f"HTTP {response.status}: {reply[:100]!r}")
                else:
                    mine.append(time.perf_counter() - began)
            except Exception as error:
                failed.append(f"{type(error).__name__}: {error}")
            finally:
                connection.close()
        with lock:
            latencies.extend(mine)
            errors.extend(failed)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    batches_before, requests_before = server.num_batches, server.num_requests
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    latencies.sort()
    served = server.num_requests - requests_before
    return {
        "clients": clients, "requests": len(latencies), "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "requests_per_s": len(latencies) / elapsed, "items_per_s": len(latencies) * items / elapsed,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else float("nan"),
        "items_per_batch": served * items / max(1, server.num_batches - batches_before),
    }


def main() -> None:
    """Measure each client count in turn against one server and print the table and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64], help="concurrent client counts")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each level")
    parser.add_argument("--items", type=int, default=2, help="(question, answer) pairs per request")
    parser.add_argument("--batch-cost-ms", type=float, default=0.0, help="scorer time per batch (a model stand-in)")
    parser.add_argument("--max-batch-size", type=int, default=64, help="server: items scored together at most")
    parser.add_argument("--max-wait-ms", type=float, default=2.0, help="server: how long a batch waits to fill")
    args = parser.parse_args()
    results = []
    with RewardServer(text_scorer(args.batch_cost_ms / 1000), max_batch_size=args.max_batch_size,
                      max_wait_ms=args.max_wait_ms) as server:
        run_level(server, 1, min(1.0, args.seconds), args.items)            # warm-up
        for clients in args.clients:
            results.append(run_level(server, clients, args.seconds, args.items))
        refused = server.num_overloaded
    print(f"items/request={args.items} batch_cost_ms={args.batch_cost_ms} max_batch_size={args.max_batch_size} "
          f"max_wait_ms={args.max_wait_ms} seconds/level={args.seconds}")
    print(f"{'clients':>7} {'req/s':>8} {'items/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'items/batch':>11} {'errors':>6}")
    for r in results:
        print(f"{r['clients']:>7} {r['requests_per_s']:>8.1f} {r['items_per_s']:>8.1f} {r['p50_ms']:>7.2f} "
              f"{r['p99_ms']:>7.2f} {r['items_per_batch']:>11.1f} {r['errors']:>6}"
              + (f"  first error: {r['first_error']}" if r["errors"] else ""))
    print(f"503 answers: {refused}")
    if any(r["errors"] for r in results):
        raise SystemExit("some requests failed: the server did not hold this load")
    print(f"ratio={results[-1]['requests_per_s'] / results[0]['requests_per_s']:.2f}")


if __name__ == "__main__":
    main()
