"""Batch invariance of the server: 16 concurrent greedy requests of different prompt and output lengths
give exactly the token ids each gives alone, while they share engine steps (checked: their lifetimes
overlap) and long prompts are prefilled in chunks between the others' decode steps."""
import concurrent.futures
import random
import time
import unittest

from server_harness import Server


class BatchInvariance(unittest.TestCase):
    def test_sixteen_concurrent_greedy_requests_match_each_alone(self):
        rng = random.Random(11)
        requests = [([rng.randrange(512) for _ in range(rng.randint(1, 200))], rng.randint(20, 80))
                    for _ in range(16)]
        # A 64-token step budget splits the longer prompts into chunks that share steps with decodes.
        with Server("--max-num-seqs", "16", "--max-num-batched-tokens", "64", "--max-model-len", "512") as s:
            def run(req):
                prompt, n = req
                start = time.monotonic()
                status, body = s.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                          "ignore_eos": True, "return_token_ids": True})
                self.assertEqual(status, 200, body)
                choice = body["choices"][0]
                self.assertEqual(body["usage"]["completion_tokens"], n)
                self.assertEqual(choice["prompt_token_ids"], prompt)
                return choice["token_ids"], (start, time.monotonic())

            alone = [run(r)[0] for r in requests]
            barrier = __import__("threading").Barrier(16)

            def together_one(req):
                barrier.wait()
                return run(req)

            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                together = list(pool.map(together_one, requests))
            spans = [span for _, span in together]
            overlap = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
            self.assertGreaterEqual(overlap, 12, "the requests did not run at the same time")
            for i, (ids, _) in enumerate(together):
                self.assertEqual(ids, alone[i], f"request {i} (prompt {len(requests[i][0])} tokens)")


if __name__ == "__main__":
    unittest.main()
