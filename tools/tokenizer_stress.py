"""The tokenizer stress set: a deterministic generator of test strings (bytes) from a seed and the pools
of tests/fixtures/tokenizer/stress_pools.json. tests/unit/tokenizer/stress_strings.cc implements the same
generator in C++ step for step, so the goldens only need to store the seed and a hash of the expected ids
of each string. Change one side only together with the other (and regenerate the goldens)."""
import json

MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


def load_pools(path):
    doc = json.load(open(path, encoding="utf-8"))
    return {k: [s.encode("utf-8") for s in doc[k]] for k in ("fragments", "separators", "whitespace", "specials")} | {
        "ranges": [tuple(r) for r in doc["code_point_ranges"]]}


def _pick(rng, items):
    return items[rng.below(len(items))]


def _code_point(rng, ranges):
    total = sum(w for _, _, w in ranges)
    r = rng.below(total)
    for lo, hi, w in ranges:
        if r < w:
            return chr(lo + rng.below(hi - lo + 1)).encode("utf-8")
        r -= w
    raise AssertionError("unreachable")


def make_string(index, rng, pools):
    """String `index` of the set (bytes; kind 5 is not valid UTF-8 in general)."""
    kind = index % 8
    out = bytearray()
    if kind <= 2:  # fragments, sometimes separated
        for _ in range(1 + rng.below(8)):
            out += _pick(rng, pools["fragments"])
            if rng.below(3) == 0:
                out += _pick(rng, pools["separators"])
    elif kind == 3:  # random code points over weighted ranges
        for _ in range(1 + rng.below(24)):
            out += _code_point(rng, pools["ranges"])
    elif kind == 4:  # fragments and code points interleaved
        for _ in range(1 + rng.below(10)):
            if rng.below(2) == 0:
                out += _pick(rng, pools["fragments"])
            else:
                out += _code_point(rng, pools["ranges"])
    elif kind == 5:  # arbitrary bytes (mostly invalid UTF-8) and fragments
        for _ in range(1 + rng.below(16)):
            if rng.below(4) == 0:
                out += _pick(rng, pools["fragments"])
            else:
                out.append(rng.below(256))
    elif kind == 6:  # whitespace runs between fragments
        for _ in range(1 + rng.below(12)):
            ws = _pick(rng, pools["whitespace"])
            out += ws * (1 + rng.below(5))
            if rng.below(2) == 0:
                out += _pick(rng, pools["fragments"])
    else:  # special-token strings (and near misses) inside text
        for _ in range(1 + rng.below(8)):
            if rng.below(2) == 0:
                out += _pick(rng, pools["specials"])
            else:
                out += _pick(rng, pools["fragments"])
    return bytes(out)


def long_strings():
    """Pathological inputs for the chunking rules: runs around the 25,000-character limit and texts past
    the 400,000-character chunk (as (name, bytes))."""
    im_end = "<|im_end|>"
    cases = [
        ("a*25000", "a" * 25000),
        ("a*25001", "a" * 25001),
        ("a*60000", "a" * 60000),
        ("space*25001", " " * 25001),
        ("space*24999+a", " " * 24999 + "a"),
        ("newline*30000", "\n" * 30000),
        ("x*24999 space y*26000", "x" * 24999 + " " + "y" * 26000),
        ("U+001C*30000+x (isspace, not White_Space)", "\x1c" * 30000 + "x"),
        ("U+3000*25005+z", "\u3000" * 25005 + "z"),
        ("Han*30000", "中" * 30000),
        ("digits*30000", "1" * 30000),
        ("punct*30000", "!" * 30000),
        ("e+U+0301 *30000", "e\u0301" * 30000),
        ("base64-like 40000", "".join("QUJDRGVm+/0123xyz"[(i * 7) % 17] for i in range(40000))),
        ("Aa*20000", "Aa" * 20000),
        ("emoji*26000", "😀" * 26000),
        ("words*40000 with <|im_end|> across the 400,000 boundary",
         ("hello world " * 40000)[:399995] + im_end + "tail " * 10),
        ("a*399990 + <|im_end|> across the 400,000 boundary", "a" * 399990 + im_end + "b"),
        ("space-separated words 410,000", "ab " * 136667),
        ("CRLF*20000 + text", "\r\n" * 20000 + "end"),
    ]
    return [(name, s.encode("utf-8")) for name, s in cases]
