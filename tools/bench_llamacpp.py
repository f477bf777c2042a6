#!/usr/bin/env python3
"""helixlm against llama.cpp on one GPU: decode time per token after a context, and prefill speed, for
the same Kimi Linear shapes with random bf16 weights.

The whole Kimi-Linear-48B-A3B in bf16 (98 GB) does not fit the GPU machine's disk as a GGUF, so both
engines run the first N layers of a config at its real widths (`helixlm bench --config ... --num-layers
N` is the same thing). llama.cpp's own converter (convert_hf_to_gguf.py's KimiLinearModel, imported from
the llama.cpp checkout given) writes the GGUF from random tensors that carry the checkpoint's names,
shapes and dtypes (docs/MODEL.md), so the file is what llama.cpp makes of a real checkpoint; the
tokenizer is llama.cpp's "none" vocabulary of the config's size (llama-bench feeds random ids).
llama-bench then times `-n` generated tokens after `-d` tokens of context (prefilled for real), and
`helixlm bench` a decode step at the same context over a synthetic one (the same bytes per step). The
floor of both is helixlm's: the bytes a step must move over the copy bandwidth measured in its process.

Usage (GPU machine; llama.cpp built with -DGGML_CUDA=ON, its source tree for the converter):
  python3 tools/bench_llamacpp.py --llama-cpp SRC --llama-bench BIN [--num-layers 8]
      [--contexts 4096,32768] [--prefill 8192] [--work-dir DIR] [--json-out FILE]
Needs torch and numpy (the converter's), and gguf-py from SRC.
"""
import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "tests/fixtures/configs/kimi-linear-48b-a3b.json"


def fail(msg):
    sys.exit(f"bench_llamacpp: error: {msg}")


def truncated_config(cfg, num_layers, path):
    """The config's first num_layers layers (Moonshot style: linear_attn_config lists 1-based layers)."""
    lac = cfg.get("linear_attn_config")
    if not isinstance(lac, dict) or "full_attn_layers" not in lac or "kda_layers" not in lac:
        fail(f"{path}: linear_attn_config with kda_layers and full_attn_layers is required (the Moonshot "
             "config style, which llama.cpp's converter reads)")
    total = cfg["num_hidden_layers"]
    if not 1 <= num_layers <= total:
        fail(f"--num-layers {num_layers}: the config has {total} layers")
    if not any(i <= num_layers for i in lac["full_attn_layers"]):
        # llama.cpp's hybrid cache aborts (GGML_ASSERT(buffer) in set_input_k_idxs) without an attention layer.
        fail(f"--num-layers {num_layers}: llama.cpp needs at least one MLA layer; the first is layer "
             f"{min(lac['full_attn_layers'])} (1-based)")
    out = copy.deepcopy(cfg)
    out["num_hidden_layers"] = num_layers
    out["linear_attn_config"]["kda_layers"] = [i for i in lac["kda_layers"] if i <= num_layers]
    out["linear_attn_config"]["full_attn_layers"] = [i for i in lac["full_attn_layers"] if i <= num_layers]
    return out


def checkpoint_tensors(cfg):
    """(name, shape, dtype, kind) of every tensor of a Kimi Linear checkpoint (docs/MODEL.md)."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    lac = cfg["linear_attn_config"]
    kda_heads, kda_dim, conv = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    proj = kda_heads * kda_dim
    heads, rank = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope, vdim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    experts, inter = cfg["num_experts"], cfg["moe_intermediate_size"]
    shared = inter * cfg.get("num_shared_experts", 0)
    if cfg.get("q_lora_rank"):
        fail("q_lora_rank is set: only the 48B's uncompressed q_proj is written")
    t = [("model.embed_tokens.weight", (v, h), "bf16", "weight"), ("model.norm.weight", (h,), "bf16", "norm"),
         ("lm_head.weight", (v, h), "bf16", "weight")]
    kda = set(lac["kda_layers"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t += [(p + "input_layernorm.weight", (h,), "bf16", "norm"),
              (p + "post_attention_layernorm.weight", (h,), "bf16", "norm")]
        a = p + "self_attn."
        if i + 1 in kda:
            for x in "qkv":
                t += [(a + f"{x}_proj.weight", (proj, h), "bf16", "weight"),
                      (a + f"{x}_conv1d.weight", (proj, 1, conv), "bf16", "weight")]
            t += [(a + "A_log", (1, 1, kda_heads, 1), "f32", "a_log"), (a + "dt_bias", (proj,), "f32", "zero"),
                  (a + "f_a_proj.weight", (kda_dim, h), "bf16", "weight"),
                  (a + "f_b_proj.weight", (proj, kda_dim), "bf16", "weight"),
                  (a + "b_proj.weight", (kda_heads, h), "bf16", "weight"),
                  (a + "g_a_proj.weight", (kda_dim, h), "bf16", "weight"),
                  (a + "g_b_proj.weight", (proj, kda_dim), "bf16", "weight"),
                  (a + "o_norm.weight", (kda_dim,), "bf16", "norm"),
                  (a + "o_proj.weight", (h, proj), "bf16", "weight")]
        else:
            t += [(a + "q_proj.weight", (heads * (nope + rope), h), "bf16", "weight"),
                  (a + "kv_a_proj_with_mqa.weight", (rank + rope, h), "bf16", "weight"),
                  (a + "kv_a_layernorm.weight", (rank,), "bf16", "norm"),
                  (a + "kv_b_proj.weight", (heads * (nope + vdim), rank), "bf16", "weight"),
                  (a + "o_proj.weight", (h, heads * vdim), "bf16", "weight")]
        if i < cfg.get("first_k_dense_replace", 0):
            d = cfg["intermediate_size"]
            t += [(p + "mlp.gate_proj.weight", (d, h), "bf16", "weight"),
                  (p + "mlp.up_proj.weight", (d, h), "bf16", "weight"),
                  (p + "mlp.down_proj.weight", (h, d), "bf16", "weight")]
            continue
        m = p + "block_sparse_moe."
        t += [(m + "gate.weight", (experts, h), "bf16", "weight"),
              (m + "gate.e_score_correction_bias", (experts,), "bf16", "zero")]
        for e in range(experts):
            t += [(m + f"experts.{e}.w1.weight", (inter, h), "bf16", "weight"),
                  (m + f"experts.{e}.w3.weight", (inter, h), "bf16", "weight"),
                  (m + f"experts.{e}.w2.weight", (h, inter), "bf16", "weight")]
        if shared:
            t += [(m + "shared_experts.gate_proj.weight", (shared, h), "bf16", "weight"),
                  (m + "shared_experts.up_proj.weight", (shared, h), "bf16", "weight"),
                  (m + "shared_experts.down_proj.weight", (h, shared), "bf16", "weight")]
    return t


def write_gguf(llama_cpp, cfg, work, out):
    """Runs llama.cpp's Kimi Linear converter over random tensors with the checkpoint's names."""
    sys.path.insert(0, str(llama_cpp))
    sys.path.insert(1, str(llama_cpp / "gguf-py"))
    try:
        import torch
        import gguf
        from conversion.base import LazyTorchTensor
        from conversion.kimi_linear import KimiLinearModel
    except ImportError as e:
        fail(f"{llama_cpp}: cannot import llama.cpp's converter ({e}); --llama-cpp must be a llama.cpp source "
             "tree with conversion/ and gguf-py/, and torch must be installed")
    dtypes = {"bf16": torch.bfloat16, "f32": torch.float32}
    # Weights are windows into one pool of normals (std 0.02): random enough for the router to spread the
    # tokens over the experts, and fast to make at 30 GB.
    gen = torch.Generator().manual_seed(0)
    pool = (torch.randn(1 << 26, generator=gen) * 0.02).to(torch.bfloat16)

    def make(name, shape, dtype, kind):
        n = math.prod(shape)
        if kind == "norm":
            x = torch.ones(n)
        elif kind == "zero":
            x = torch.zeros(n)
        elif kind == "a_log":  # decay rates 1..16 per head, as trained models have
            x = torch.log(torch.linspace(1.0, 16.0, n))
        else:
            size = pool.numel()
            if n <= size:
                start = zlib.crc32(name.encode()) % (size - n + 1)
                x = pool[start:start + n]
            else:
                x = pool.repeat(math.ceil(n / size))[:n]
        return x.to(dtypes[dtype]).reshape(shape).contiguous()

    class RandomKimiLinear(KimiLinearModel):
        model_arch = KimiLinearModel.model_arch

        def index_tensors(self, remote_hf_model_id=None):
            tensors = {}
            for name, shape, dtype, kind in checkpoint_tensors(self.hparams):
                meta = LazyTorchTensor.meta_with_dtype_and_shape(dtypes[dtype], shape)
                lazy = LazyTorchTensor(meta=meta, args=(name, shape, dtype, kind), func=make)
                if item := self.filter_tensors((name, lambda t=lazy: t)):
                    tensors[item[0]] = item[1]
            return tensors

        def set_vocab(self):
            self.gguf_writer.add_tokenizer_model("none")  # the vocabulary size is written with the params

    with torch.inference_mode():
        model = RandomKimiLinear(work, gguf.LlamaFileType.MOSTLY_BF16, out, hparams=cfg)
        model.write()


def run(cmd, **kw):
    print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        fail(f"{cmd[0]} exited {r.returncode}:\n{r.stderr[-4000:]}")
    return r.stdout


def llama_bench(args, gguf_path, contexts):
    """Per context: ms per generated token (median over repeats); and prefill tokens/s."""
    base = [args.llama_bench, "-m", gguf_path, "-ngl", "99" if args.device == "cuda" else "0", "-fa",
            args.flash_attn, "-r", args.repeats, "-o", "json"]
    out = {}
    rows = json.loads(run(base + ["-p", "0", "-n", args.gen_tokens, "-d", ",".join(map(str, contexts))]))
    for row in rows:
        per_token = [ns / 1e6 / row["n_gen"] for ns in row["samples_ns"]]
        out[row["n_depth"]] = statistics.median(per_token)
    prefill = None
    if args.prefill:
        # The best of llama.cpp's physical batch sizes: its prefill speed depends on it.
        rows = json.loads(run(base + ["-p", args.prefill, "-n", "0", "-b", args.prefill, "-ub", args.ubatch]))
        prefill = max(statistics.median(row["samples_ts"]) for row in rows)
    return out, prefill, rows[0].get("build_commit", "?")


def helixlm_bench(args, config_path, context, prefill):
    cmd = [args.helixlm, "--log-level", "warn", "bench", "--device", args.device, "--config", config_path,
           "--random-weights", "--context", context, "--batch", "1", "--json"]
    if prefill:
        cmd += ["--steps", "1", "--repeats", args.repeats, "--prefill-tokens", prefill, "--prefill-chunk", prefill]
    else:
        cmd += ["--steps", args.gen_tokens, "--repeats", args.repeats, "--prefill-tokens", "0"]
    return json.loads(run(cmd).strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree (its converter)")
    ap.add_argument("--llama-bench", type=Path, required=True, help="llama-bench built with CUDA")
    ap.add_argument("--helixlm", type=Path, default=REPO / "build/helixlm")
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: both engines on the host (a check of this script on small configs)")
    ap.add_argument("--num-layers", type=int, default=8)
    ap.add_argument("--contexts", default="4096,32768", help="comma-separated context lengths")
    ap.add_argument("--gen-tokens", type=int, default=64, help="tokens generated per timed run")
    ap.add_argument("--prefill", type=int, default=8192, help="prompt length for the prefill row (0: none)")
    ap.add_argument("--ubatch", default="512,2048,8192", help="llama.cpp's physical batches tried for prefill")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--flash-attn", default="1", help="llama-bench -fa")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/hlm_llamacpp"))
    ap.add_argument("--json-out", type=Path, help="also write the results here")
    args = ap.parse_args()

    for p, what in ((args.llama_bench, "--llama-bench"), (args.helixlm, "--helixlm")):
        if not os.access(p, os.X_OK):
            fail(f"{what} {p}: not an executable")
    try:
        contexts = [int(c) for c in args.contexts.split(",")]
    except ValueError:
        fail(f"--contexts {args.contexts!r}: expected comma-separated integers")
    cfg = truncated_config(json.loads(args.config.read_text()), args.num_layers, args.config)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    config_path = args.work_dir / "config.json"
    config_path.write_text(json.dumps(cfg, indent=2))
    gguf_path = args.work_dir / f"kimi-linear-{args.num_layers}l-bf16.gguf"
    if not gguf_path.exists():  # written under another name first: a killed run leaves no partial file to reuse
        partial = gguf_path.with_suffix(".partial")
        write_gguf(args.llama_cpp, cfg, args.work_dir, partial)
        partial.rename(gguf_path)

    peer, peer_prefill, commit = llama_bench(args, gguf_path, contexts)
    results = []
    for c in contexts:
        ours = helixlm_bench(args, config_path, c, 0)
        results.append({"context": c, "layers": args.num_layers, "helixlm_ms": ours["decode_ms_per_step"],
                        "llamacpp_ms": peer[c], "floor_ms": ours["floor_ms"],
                        "copy_bandwidth_gb_s": ours["copy_bandwidth_gb_s"]})
    prefill = None
    if args.prefill:
        ours = helixlm_bench(args, config_path, args.prefill, args.prefill)
        prefill = {"tokens": args.prefill, "helixlm_tokens_per_s": ours["prefill_tokens_per_s"],
                   "llamacpp_tokens_per_s": peer_prefill}

    print(f"Kimi Linear, first {args.num_layers} layers of {args.config.name}, bf16 random weights, batch 1; "
          f"llama.cpp build {commit}")
    print("| context | helixlm ms/token | llama.cpp ms/token | llama.cpp / helixlm | floor ms | helixlm / floor "
          "| llama.cpp / floor |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['context']:,} | {r['helixlm_ms']:.3f} | {r['llamacpp_ms']:.3f} | "
              f"{r['llamacpp_ms'] / r['helixlm_ms']:.2f} | {r['floor_ms']:.3f} | "
              f"{r['helixlm_ms'] / r['floor_ms']:.2f} | {r['llamacpp_ms'] / r['floor_ms']:.2f} |")
    if prefill:
        print(f"prefill, {prefill['tokens']:,}-token prompt: helixlm {prefill['helixlm_tokens_per_s']:,.0f} "
              f"tokens/s, llama.cpp {prefill['llamacpp_tokens_per_s']:,.0f} tokens/s")
    if args.json_out:
        args.json_out.write_text(json.dumps({"decode": results, "prefill": prefill, "llamacpp_commit": commit},
                                            indent=2))


if __name__ == "__main__":
    main()
