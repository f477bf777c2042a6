#!/usr/bin/env python3
"""helixlm's CUDA KDA and MLA kernels next to their peers, in one job on one GPU.

Runs build/tests/bench/kernel_bench (ours: also the small decode ops and the routed experts, which have no
peer here) and, in this process, the peers at the same shapes and with the
same timing method: fla's fused_recurrent_kda (decode) and chunk_kda (prefill) from fla-core, and a plain
PyTorch absorbed MLA decode (FlashMLA is not installable on the GPU machine), and with --mla-prefill
PyTorch's scaled_dot_product_attention (the fused kernel it picks: FlashAttention, cuDNN or
memory-efficient) on the expanded MLA prefill's shapes. Decode ops are captured
`CALLS` times in one CUDA graph and the graph replayed; prefill runs eagerly. Inputs are random, drawn
separately on each side (the shapes, dtypes and value ranges match; the values do not). Prints one JSON
object per measurement and a table with the ratio ours / peer in time.

Needs torch, triton, einops and fla-core 0.6.0 (pip install fla-core==0.6.0; on a machine without a
package index: pip install --no-deps the wheels). With --mla, only the MLA decode cases (kernel_bench --mla)
and their PyTorch peer; with --mla-prefill, only the MLA prefill cases (kernel_bench --mla-prefill) and
theirs: torch alone; with --kda-prefill, only the KDA prefill cases (kernel_bench --kda-prefill) and fla's
chunk_kda.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

CALLS = 20
REPEATS = 7
HEADS, DIM = 32, 128


def graph_seconds_per_call(torch, op):
    op()  # compile and warm outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            op()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / CALLS)
    return statistics.median(times)


def eager_seconds(torch, op):
    op()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        op()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kda_decode_peers(torch, copy_bw, rand):
    from fla.ops.kda import fused_recurrent_kda

    out = []
    for b in (1, 8, 64):
        q, k, v = (rand((b, 1, HEADS, DIM), torch.bfloat16) for _ in range(3))
        g = rand((b, 1, HEADS, DIM), torch.float32, 0.05, -0.1)
        beta = rand((b, 1, HEADS), torch.float32, 0.4, 0.5)
        state = rand((b, HEADS, DIM, DIM), torch.float32, 0.05)
        op = lambda: fused_recurrent_kda(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                         use_qk_l2norm_in_kernel=True)
        t = graph_seconds_per_call(torch, op)
        nbytes = 2.0 * state.numel() * 4
        out.append({"op": "kda_decode", "impl": "fla fused_recurrent_kda", "batch": b, "us": t * 1e6,
                    "gb_s": nbytes / t / 1e9, "fraction_of_copy_bandwidth": nbytes / t / copy_bw})
    return out


def kda_prefill_peers(torch, rand):
    from fla.ops.kda import chunk_kda

    dev = "cuda"
    out = []
    for b in (1, 4):
        for tokens in (8192, 65536):
            q, k, v = (rand((b, tokens, HEADS, DIM), torch.bfloat16) for _ in range(3))
            g = rand((b, tokens, HEADS, DIM), torch.float32, 0.05, -0.1)
            beta = rand((b, tokens, HEADS), torch.float32, 0.4, 0.5)
            state = torch.zeros((b, HEADS, DIM, DIM), device=dev, dtype=torch.float32)
            op = lambda: chunk_kda(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True)
            t = eager_seconds(torch, op)
            out.append({"op": "kda_prefill", "impl": "fla chunk_kda", "batch": b, "tokens": tokens,
                        "us": t * 1e6, "tokens_per_s": b * tokens / t})
    return out


def uniform(torch):
    def rand(shape, dtype, scale=1.0, offset=0.0):
        return ((torch.rand(shape, device="cuda", dtype=torch.float32) * 2 - 1) * scale + offset).to(dtype)

    return rand


def peers(torch, copy_bw, mla_only):
    rand = uniform(torch)
    out = []
    if not mla_only:
        out += kda_decode_peers(torch, copy_bw, rand) + kda_prefill_peers(torch, rand)
    for heads in (32, 96):
        for b in (1, 8):
            keys, latent, cache_dim = 65536, 512, 576
            q = rand((b, heads, cache_dim), torch.bfloat16)
            cache = rand((b, keys, cache_dim), torch.bfloat16)

            def mla():
                scores = torch.einsum("bhd,bnd->bhn", q, cache).float() * 0.0625
                p = torch.softmax(scores, dim=-1).to(torch.bfloat16)
                return torch.einsum("bhn,bnl->bhl", p, cache[:, :, :latent])

            t = graph_seconds_per_call(torch, mla)
            nbytes = float(b * keys * cache_dim * 2)
            out.append({"op": "mla_decode", "impl": "PyTorch absorbed (einsum, softmax)", "batch": b,
                        "heads": heads, "keys": keys, "us": t * 1e6, "gb_s": nbytes / t / 1e9,
                        "fraction_of_copy_bandwidth": nbytes / t / copy_bw})
    return out


def mla_prefill_peers(torch, rand):
    """Causal attention over keys already expanded, 8192 queries and keys, 32 heads of (192, 192, 128):
    the work of kernel_bench's mla_prefill_expanded_attention_only."""
    import torch.nn.functional as F

    heads, tokens = 32, 8192
    q = rand((1, heads, tokens, 192), torch.bfloat16)
    k = rand((1, heads, tokens, 192), torch.bfloat16)
    v = rand((1, heads, tokens, 128), torch.bfloat16)
    t = eager_seconds(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=192**-0.5))
    pairs = tokens * (tokens + 1) / 2
    return [{"op": "mla_prefill_expanded_attention_only", "impl": "PyTorch scaled_dot_product_attention",
             "tokens": tokens, "prefix": 0, "heads": heads, "us": t * 1e6,
             "tflop_s": pairs * heads * 2 * (192 + 128) / t / 1e12}]


def key(m):
    return (m["op"], m.get("batch"), m.get("tokens"), m.get("heads", HEADS))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel-bench", default="build/tests/bench/kernel_bench")
    ap.add_argument("--mla", action="store_true", help="only the MLA decode cases (no fla needed)")
    ap.add_argument("--mla-prefill", action="store_true", help="only the MLA prefill cases (no fla needed)")
    ap.add_argument("--kda-prefill", action="store_true", help="only the KDA prefill cases and fla's chunk_kda")
    args = ap.parse_args()
    only = [f"--{name}" for name in ("mla", "mla-prefill", "kda-prefill") if getattr(args, name.replace("-", "_"))]
    command = [args.kernel_bench] + only
    ours_text = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    ours = [json.loads(line) for line in ours_text.splitlines() if line.startswith("{")]
    copy_bw = next(m["gb_s"] for m in ours if m["op"] == "copy") * 1e9
    for m in ours:
        m["impl"] = "helixlm"
        print(json.dumps(m))
    import torch

    if args.mla_prefill:
        theirs = mla_prefill_peers(torch, uniform(torch))
    elif args.kda_prefill:
        theirs = kda_prefill_peers(torch, uniform(torch))
    else:
        theirs = peers(torch, copy_bw, args.mla)
    for m in theirs:
        print(json.dumps(m))
    by_key = {key(m): m for m in theirs}
    print(f"\n{'op':<12} {'batch':>5} {'tokens':>6} {'heads':>5} {'helixlm us':>11} {'peer us':>9} "
          f"{'peer/ours':>9}  {'ours %bw':>8} {'peer %bw':>8}  peer")
    for m in ours:
        p = by_key.get(key(m))
        if p is None:
            continue
        fo, fp = m.get("fraction_of_copy_bandwidth"), p.get("fraction_of_copy_bandwidth")
        print(f"{m['op']:<12} {m.get('batch', ''):>5} {m.get('tokens', ''):>6} {m.get('heads', HEADS):>5} "
              f"{m['us']:>11.1f} {p['us']:>9.1f} {p['us'] / m['us']:>9.2f}  "
              f"{'' if fo is None or m['op'] == 'kda_prefill' else f'{100 * fo:7.0f}%':>8} "
              f"{'' if fp is None else f'{100 * fp:7.0f}%':>8}  {p['impl']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
