"""Batch invariance of the server: 16 concurrent greedy requests of different prompt and output lengths
give exactly the token ids each gives alone, while they share engine steps (checked: their lifetimes
overlap) and long prompts are prefilled in chunks between the others' decode steps. Sequences constrained
to a JSON schema or a choice keep their own recognizer state in a shared batch: each gives what it gives
alone."""
import concurrent.futures
import json
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

    def test_constrained_sequences_in_one_batch_match_each_alone(self):
        schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 4}},
                  "required": ["n", "s"], "additionalProperties": False}
        formats = [{"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}},
                   {"response_format": {"type": "json_object"}},
                   {"guided_choice": ["alpha", "beta", "alphabet"]},
                   {"ignore_eos": True}]  # unconstrained, beside them
        requests = [dict(formats[i % 4], prompt=[5 + i, 17, 300], max_tokens=40, temperature=1.0, seed=i,
                         return_token_ids=True) for i in range(12)]
        with Server("--max-num-seqs", "12", "--max-model-len", "256") as s:
            def run(body):
                status, answer = s.post("/v1/completions", body)
                self.assertEqual(status, 200, answer)
                return answer["choices"][0]

            alone = [run(r) for r in requests]
            barrier = __import__("threading").Barrier(len(requests))

            def together_one(body):
                barrier.wait()
                return run(body)

            with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
                together = list(pool.map(together_one, requests))
            for i, (a, t) in enumerate(zip(alone, together)):
                self.assertEqual(t["token_ids"], a["token_ids"], f"request {i}: {requests[i]}")
                if "guided_choice" in requests[i]:
                    self.assertIn(t["text"], ("alpha", "beta", "alphabet"))
                elif "response_format" in requests[i] and t["finish_reason"] == "stop":
                    self.assertIsInstance(json.loads(t["text"]), dict)


if __name__ == "__main__":
    unittest.main()
