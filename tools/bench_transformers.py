#!/usr/bin/env python3
"""Time transformers' kimi_linear decode on CPU: the peer that docs/benchmarks.md compares helixlm with.

Mirrors `helixlm bench`: prefill `--context` random tokens (fixed seed) into a cache, then time `--steps`
single-token decode steps with that cache, `--repeats` times, and print the median step time. fp32
weights from the checkpoint (as helixlm's CPU backend), pure-PyTorch paths (no fla / hub kernels).

transformers 5.x names the cache argument of KimiLinearForCausalLM.forward `cache` (`past_key_values` is its
deprecated alias). An unknown keyword would vanish into **kwargs and every step would decode without its
context, timing the wrong thing, so each run checks that the cache grew by one token per decode step.

    python3 tools/bench_transformers.py -m tests/fixtures/kimi-tiny-dense-first --context 512 --steps 32 --threads 1
"""

import argparse
import statistics
import time

import torch
from transformers import KimiLinearForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = KimiLinearForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager").eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1234)
    step_times = []
    prefill_rates = []
    with torch.no_grad():
        for _ in range(args.repeats):
            ids = torch.randint(0, vocab, (1, args.context), generator=gen)
            start = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            prefill_rates.append(args.context / (time.perf_counter() - start))
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            token = out.logits[:, -1:].argmax(-1)
            for step in range(args.steps):
                start = time.perf_counter()
                out = model(input_ids=token, cache=cache, use_cache=True)
                step_times.append(time.perf_counter() - start)
                token = out.logits[:, -1:].argmax(-1)
                seen = cache.get_seq_length()
                assert seen == args.context + step + 1, f"decode step {step} saw {seen} cached tokens: no context"
    step = statistics.median(step_times)
    print(f"transformers {args.model}: context {args.context}, threads {args.threads}")
    print(f"prefill: {statistics.median(prefill_rates):.0f} tokens/s (median)")
    print(f"decode: {step * 1e3:.3f} ms/step median, {1 / step:.1f} tokens/s")


if __name__ == "__main__":
    main()
