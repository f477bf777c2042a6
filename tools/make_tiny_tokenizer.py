#!/usr/bin/env python3
"""Writes the bundled tiny model's tokenizer (tiktoken.model + tokenizer_config.json, the Kimi file
format) into tests/fixtures/kimi-tiny-dense-first/ (models/kimi-linear-tiny), so text goes in and out of
the tiny model. Every id is below the model's vocab_size (512):

  0..16     the Kimi Linear added tokens; [PAD] 0, [BOS] 1, [EOS] 2 as the model's config.json has them
  17..272   the 256 single bytes, in GPT-2's bytes_to_unicode order
  273..511  BPE merges learned on a small built-in English/chat/code text, pre-tokenized with the Kimi
            pat_str, most frequent pair first (ties: the smaller byte pair)

Then checks with pip tiktoken that the files load and round-trip, and writes
tests/fixtures/tokenizer/tiny_expected.json (texts and tiktoken's ids) for the C++ tests.

  python3 tools/make_tiny_tokenizer.py
"""
import collections
import json
import os
import sys

import regex
import tiktoken

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_tokenizer_spec import KIMI_PAT_STR, kimi_encode  # noqa: E402
from make_tokenizer_goldens import FIXTURES, ROOT, gpt2_byte_order, write_cases, write_config, write_ranks  # noqa: E402

MODEL_DIR = os.path.join(ROOT, "tests", "fixtures", "kimi-tiny-dense-first")

ADDED = [  # (content, special), ids 0.. in this order
    ("[PAD]", True), ("[BOS]", True), ("[EOS]", True), ("<|im_end|>", True), ("<|im_user|>", True),
    ("<|im_assistant|>", True), ("<|im_system|>", True), ("<|im_middle|>", True), ("<|start_header_id|>", True),
    ("<|end_header_id|>", True), ("[EOT]", True), ("<|tool_calls_section_begin|>", False),
    ("<|tool_calls_section_end|>", False), ("<|tool_call_begin|>", False), ("<|tool_call_argument_begin|>", False),
    ("<|tool_call_end|>", False), ("[UNK]", True),
]

CORPUS = """\
You are a helpful assistant. The user asks a question and the assistant answers it.
Hello, world! Hello there. How are you today? I am fine, thank you. What can I do for you?
Tell me about the weather in the city. It is sunny and warm; tomorrow it will rain.
The engine runs the model on the CPU and on the GPU. It reads the weights and the tokenizer from
the model directory, then it generates tokens one step at a time for every sequence in the batch.
Kimi Linear is a hybrid model: linear attention layers with a recurrent state, and full attention
layers with a latent cache. The experts of the mixture are split over the ranks.
def generate(model, prompt, steps):
    tokens = tokenize(prompt)
    for step in range(steps):
        tokens.append(model.next_token(tokens))
    return detokenize(tokens)
{"name": "get_weather", "arguments": {"city": "Beijing", "days": 3}}
The quick brown fox jumps over the lazy dog. This is a test of the tokenizer, and that is the end.
"""


def train_merges(count):
    pat = regex.compile(KIMI_PAT_STR, flags=regex.V1)
    words = collections.Counter(tuple(bytes([b]) for b in piece.encode()) for piece in pat.findall(CORPUS))
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for word, n in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], [-x for x in kv[0][0] + kv[0][1]]))[0]
        merged = best[0] + best[1]
        merges.append(merged)
        new_words = collections.Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words[tuple(out)] += n
        words = new_words
    return merges


def main():
    vocab = json.load(open(os.path.join(MODEL_DIR, "config.json")))["vocab_size"]
    first_rank = len(ADDED)
    ranks = {bytes([b]): first_rank + i for i, b in enumerate(gpt2_byte_order())}
    for merged in train_merges(vocab - len(ranks) - first_rank):
        assert merged not in ranks
        ranks[merged] = first_rank + len(ranks)
    assert max(ranks.values()) < vocab and len(ranks) + first_rank == vocab, (len(ranks), vocab)
    write_ranks(os.path.join(MODEL_DIR, "tiktoken.model"), ranks)
    added = {i: a for i, a in enumerate(ADDED)}
    write_config(os.path.join(MODEL_DIR, "tokenizer_config.json"), added, "[BOS]", "<|im_end|>")

    enc = tiktoken.Encoding("kimi-tiny", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks,
                            special_tokens={c: i for i, (c, _) in added.items()})
    texts = [
        ("Hello, world! How are you today?", False),
        ("The assistant answers the user.", False),
        ("def generate(model, prompt):\n    return tokens\n", False),
        ("Ünïcödé 中文 and emoji 😀 fall back to bytes", False),
        ("<|im_user|>user<|im_middle|>Hello<|im_end|><|im_assistant|>assistant<|im_middle|>", True),
        ("<|im_end|> typed by a user stays text", False),
    ]
    expected = []
    for text, allow in texts:
        ids = kimi_encode(enc, text, allow)
        assert all(0 <= i < vocab for i in ids) and enc.decode(ids) == text
        expected.append({"text": text, "allow_special": allow, "ids": ids})
    write_cases(os.path.join(FIXTURES, "tiny_expected.json"), expected)
    print(f"{MODEL_DIR}: {len(ranks)} ranks ({len(ranks) - 256} merges) + {len(added)} added tokens = {vocab} ids")


if __name__ == "__main__":
    main()
