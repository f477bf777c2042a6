"""The Kimi tokenizer conventions shared by the tools that generate tokenizer fixtures and goldens:
the pre-tokenizer pattern and the input chunking of Moonshot's tokenization_kimi.py, written from its
published behaviour (ECOSYSTEM.md §3), and the Kimi added tokens of ../shared/tokenizer."""

# The Kimi pat_str, verbatim (`&&` class intersections included): pip tiktoken accepts it as is.
KIMI_PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000
NUM_RESERVED_SPECIAL = 256


def split_runs(s, limit=MAX_RUN_CHARS):
    """Cuts s so that no slice holds more than `limit` consecutive whitespace or non-whitespace characters
    (str.isspace), as tokenization_kimi.py's _split_whitespaces_or_nonwhitespaces does."""
    run_len = 0
    run_is_space = s[0].isspace() if s else False
    start = 0
    for i, ch in enumerate(s):
        is_space = ch.isspace()
        if run_is_space ^ is_space:
            run_len = 1
            run_is_space = is_space
        else:
            run_len += 1
            if run_len > limit:
                yield s[start:i]
                start = i
                run_len = 1
    yield s[start:]


def kimi_encode(enc, text, allow_special):
    """tokenization_kimi.py's encode(): 400,000-character chunks, each cut into runs, each run encoded by
    tiktoken with every special token allowed, or with none (special strings stay text)."""
    ids = []
    for i in range(0, len(text), MAX_ENCODE_CHARS):
        for run in split_runs(text[i:i + MAX_ENCODE_CHARS]):
            if allow_special:
                ids += enc.encode(run, allowed_special="all")
            else:
                ids += enc.encode(run, disallowed_special=())
    return ids


def kimi_special_tokens(num_ranks, named):
    """Added tokens as tokenization_kimi.py builds them: ids num_ranks .. num_ranks+255, named from
    `named` (offset from num_ranks -> (content, special)), the rest <|reserved_token_{id}|>."""
    out = {}
    for k in range(NUM_RESERVED_SPECIAL):
        content, special = named.get(k, (f"<|reserved_token_{num_ranks + k}|>", True))
        out[num_ranks + k] = (content, special)
    return out


def load_kimi_named(shared_json):
    """The Kimi Linear / K2 added tokens of ../shared/tokenizer/kimi_special_tokens.json, keyed by offset
    from the first added id (163584)."""
    import json
    doc = json.load(open(shared_json))["kimi_linear_k2"]
    return {int(k) - 163584: (v["content"], v["special"]) for k, v in doc.items()}
