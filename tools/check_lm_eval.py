#!/usr/bin/env python3
"""lm-evaluation-harness against `helixlm serve`, checked against transformers.

Starts the server on a model (the bundled tiny one by default), writes two small local tasks (a
multiple-choice one, scored by loglikelihood: echo, logprobs 1, max_tokens 1, a batch of id prompts; and a
generate_until one), runs lm-eval's `local-completions` model on them with `tokenizer_backend=remote` (the
server's /tokenizer_info, /tokenize and /detokenize), then recomputes every loglikelihood lm-eval logged
with transformers' kimi_linear in fp32 on the same token ids and reports the largest difference. Exits 1
when a loglikelihood is further from transformers than DESIGN.md's 1e-3 per logit allows (2e-3 per
continuation token, a log-softmax moving at most twice its logits' error).

Needs lm-eval with its API extra (`pip install "lm-eval[api]"`, offline datasets are local JSON files) and
transformers with kimi_linear (the golden reference). The model's scores are meaningless for a random
model; what is checked is that the harness's requests get the reference's numbers.

  tools/check_lm_eval.py --lm-eval /path/to/venv/bin/lm-eval
"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "server"))

from server_harness import TINY_MODEL, Server, helixlm_binary  # noqa: E402

LOGIT_TOLERANCE = 1e-3  # DESIGN.md: CPU logits within 1e-3 of transformers


def write_tasks(work):
    """A 12-question arithmetic set as a multiple-choice task and as a generation task."""
    rng = random.Random(0)
    data = os.path.join(work, "data.jsonl")
    with open(data, "w") as f:
        for _ in range(12):
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            f.write(json.dumps({"question": f"What is {a} plus {b}? Answer:",
                                "choices": [f" {a + b}", f" {a + b + 1}", f" {a * b}"], "answer": 0}) + "\n")
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n" \
             "doc_to_text: \"{{question}}\"\n"
    with open(os.path.join(work, "helixlm_choice.yaml"), "w") as f:
        f.write("task: helixlm_choice\n" + common + "output_type: multiple_choice\n"
                "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\nmetric_list:\n  - metric: acc\n")
    with open(os.path.join(work, "helixlm_generate.yaml"), "w") as f:
        f.write("task: helixlm_generate\n" + common + "output_type: generate_until\n"
                "doc_to_target: \"{{choices[0]}}\"\ngeneration_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 8\n"
                "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")


def tokenize(text, model):
    """Ids as the server reads a completion prompt (special-token strings are those tokens)."""
    out = subprocess.run([helixlm_binary(), "tokenize", "--tokenizer", model, "--allow-special"],
                         input=text.encode(), capture_output=True, check=True).stdout.decode().strip()
    return [int(x) for x in out.split(",")] if out else []


def reference_loglikelihoods(samples_file, model_dir):
    """(lm-eval's value, transformers' value, continuation length) for every loglikelihood request."""
    import torch
    from transformers import KimiLinearForCausalLM

    model = KimiLinearForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    rows = []
    for line in open(samples_file):
        sample = json.loads(line)
        for k, args in enumerate(sample["arguments"].values()):
            context, continuation = args["arg_0"], args["arg_1"]
            # lm-eval's _encode_pair: trailing spaces of the context belong to the continuation.
            spaces = len(context) - len(context.rstrip())
            if spaces:
                context, continuation = context[:-spaces], context[-spaces:] + continuation
            whole = tokenize(context + continuation, model_dir)
            n_context = len(tokenize(context, model_dir))
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
            ref = sum(logp[i - 1, whole[i]].item() for i in range(n_context, len(whole)))
            rows.append((float(sample["resps"][k][0][0]), ref, len(whole) - n_context))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lm-eval", default="lm-eval", help="the lm-eval executable")
    ap.add_argument("--model", default=TINY_MODEL, help="model directory (transformers must load it)")
    ap.add_argument("--work-dir", help="where tasks and results go (default: a temporary directory)")
    args = ap.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="helixlm-lm-eval-")
    os.makedirs(work, exist_ok=True)
    write_tasks(work)
    out = os.path.join(work, "results")
    with Server("--served-model-name", "helixlm", model=args.model) as server:
        model_args = (f"model=helixlm,base_url={server.base}/v1/completions,tokenizer_backend=remote,"
                      "num_concurrent=2,max_length=1024")
        cmd = [args.lm_eval, "run", "--model", "local-completions", "--model_args", model_args, "--tasks",
               "helixlm_choice", "helixlm_generate", "--include_path", work, "--log_samples", "--output_path", out]
        env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"lm-eval failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    print(run.stdout[run.stdout.find("|"):] if "|" in run.stdout else run.stdout[-2000:])
    samples = glob.glob(os.path.join(out, "*", "samples_helixlm_choice_*.jsonl"))
    if not samples:
        sys.exit(f"lm-eval wrote no samples under {out}")
    rows = reference_loglikelihoods(samples[0], args.model)
    worst = max(abs(got - ref) for got, ref, _ in rows)
    over = [(got, ref, n) for got, ref, n in rows if abs(got - ref) > 2 * LOGIT_TOLERANCE * n]
    print(f"{len(rows)} loglikelihoods from lm-eval through helixlm; largest difference from transformers "
          f"{worst:.2e}; {len(over)} beyond 2e-3 per continuation token")
    sys.exit(1 if over or not rows else 0)


if __name__ == "__main__":
    main()
