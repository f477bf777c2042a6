#!/usr/bin/env python3
"""Fixed-load benchmark of `helixlm serve`: C clients, each sending streaming /v1/completions requests
back to back (prompt of P random token ids, exactly O generated tokens: ignore_eos), N requests in all.
Reports requests/s, generated tokens/s, and time to first token (TTFT) and inter-token latency (ITL)
percentiles twice: on the client, from the arrival of SSE chunks (what a client sees, including its own
delays: a Python client reading a fast model falls behind and then reads tokens in bursts), and on the
server, from the delta of its /metrics histograms over the run (timed at the engine step that made each
token; percentiles interpolated within buckets as Prometheus' histogram_quantile does). Starts the server
on the bundled tiny model unless --url points at a running one. Loopback only; the request count bounds
the run.

  tools/load_test.py --concurrency 8 --requests 64 --prompt-len 128 --output-len 64
"""
import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "server"))


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def histograms(host, port):
    """{metric: [(upper bound, cumulative count)]} of the server's /metrics histograms."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for line in text.splitlines():
        if "_bucket{le=" in line:
            name, rest = line.split("_bucket{le=\"", 1)
            le, value = rest.split("\"} ")
            out.setdefault(name, []).append((float("inf") if le == "+Inf" else float(le), float(value)))
    return out


def histogram_quantile(before, after, q):
    """q-quantile of the observations made between two scrapes of one histogram."""
    buckets = [(le, a - b) for (le, a), (_, b) in zip(after, before)]
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank, lower, prev = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - prev) / max(count - prev, 1e-12)
        lower, prev = le, count
    return lower


def one_request(host, port, body):
    """(ttft, [inter-token gaps], tokens, e2e) of one streaming request."""
    conn = http.client.HTTPConnection(host, port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    times = []
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        payload = line[6:].strip()
        if payload == b"[DONE]":
            break
        chunk = json.loads(payload)
        now = time.perf_counter()
        for choice in chunk.get("choices", []):
            times += [now] * len(choice.get("token_ids", []))
    conn.close()
    end = time.perf_counter()
    gaps = [b - a for a, b in zip(times, times[1:])]
    return times[0] - start, gaps, len(times), end - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (default: start one on the bundled tiny model)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=512, help="prompt ids are drawn from [0, vocab)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-args", default="", help="extra `helixlm serve` arguments when starting one")
    args = ap.parse_args()

    server = None
    if args.url:
        u = urllib.parse.urlparse(args.url)
        host, port = u.hostname, u.port
    else:
        from server_harness import Server
        server = Server("--max-num-seqs", str(args.concurrency),
                        "--max-model-len", str(args.prompt_len + args.output_len + 16), *args.server_args.split())
        host, port = "127.0.0.1", server.port

    rng = random.Random(args.seed)
    bodies = [{"prompt": [rng.randrange(args.vocab) for _ in range(args.prompt_len)], "max_tokens": args.output_len,
               "temperature": 0, "ignore_eos": True, "stream": True, "return_token_ids": True}
              for _ in range(args.requests)]
    # One warm-up request, outside the measurement.
    one_request(host, port, dict(bodies[0], max_tokens=2))
    before = histograms(host, port)

    results, errors, lock = [], [], threading.Lock()
    queue = list(range(args.requests))

    def client():
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop()
            try:
                r = one_request(host, port, bodies[i])
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - reported below, the run goes on
                with lock:
                    errors.append(str(e))

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    after = histograms(host, port)
    if server:
        server.__exit__(None, None, None)

    ttft = [r[0] * 1e3 for r in results]
    itl = [g * 1e3 for r in results for g in r[1]]
    tokens = sum(r[2] for r in results)
    report = {
        "concurrency": args.concurrency, "requests": args.requests, "prompt_len": args.prompt_len,
        "output_len": args.output_len, "errors": len(errors), "wall_s": round(wall, 3),
        "requests_per_s": round(len(results) / wall, 3), "output_tokens_per_s": round(tokens / wall, 1),
        "ttft_ms_p50": round(percentile(ttft, 50), 2), "ttft_ms_p99": round(percentile(ttft, 99), 2),
        "itl_ms_p50": round(percentile(itl, 50), 2), "itl_ms_p99": round(percentile(itl, 99), 2),
        **{f"server_{short}_ms_p{q}": round(1e3 * histogram_quantile(before[name], after[name], q / 100), 3)
           for short, name in (("ttft", "helixlm:time_to_first_token_seconds"),
                               ("itl", "helixlm:inter_token_latency_seconds"))
           for q in (50, 99)},
        "e2e_s_mean": round(statistics.mean(r[3] for r in results), 3) if results else None,
    }
    print(json.dumps(report, indent=1))
    if errors:
        print(f"{len(errors)} requests failed, e.g. {errors[0]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
