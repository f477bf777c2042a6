"""`helixlm serve` under mpirun: rank 0 serves HTTP and schedules, the other rank executes the broadcast
step plans; concurrent greedy requests give the same ids as on one rank (Helix cp = 2 splits the KV pages
of every sequence over the two ranks), and a scored prompt (echo with logprobs, every position's logits in
the step) the same log-probabilities."""
import concurrent.futures
import unittest

from server_harness import Server

REQUESTS = [([5, 17, 300, 41, 7], 24), (list(range(1, 150)), 12), ([9] * 70, 30), ([3], 20)]


def run_all(server):
    def one(req):
        prompt, n = req
        status, body = server.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                        "ignore_eos": True, "return_token_ids": True})
        assert status == 200, body
        return body["choices"][0]["token_ids"]

    def scored():
        status, body = server.post("/v1/completions", {"prompt": list(range(1, 100)), "max_tokens": 1, "echo": True,
                                                        "logprobs": 1, "temperature": 0})
        assert status == 200, body
        return body["choices"][0]["logprobs"]["token_logprobs"]

    with concurrent.futures.ThreadPoolExecutor(len(REQUESTS) + 1) as pool:
        scoring = pool.submit(scored)
        return list(pool.map(one, REQUESTS)), scoring.result()


class MultiRank(unittest.TestCase):
    def test_two_ranks_give_the_ids_of_one(self):
        # A 16-token page keeps several pages per sequence, so both CP ranks hold KV.
        args = ("--max-model-len", "256", "--tokens-per-block", "16", "--max-num-batched-tokens", "32")
        with Server(*args) as one:
            expected, expected_scores = run_all(one)
        with Server(*args, "--cp", "2", ranks=2) as two:
            ids, scores = run_all(two)
            self.assertEqual(ids, expected)
            self.assertIsNone(scores[0])
            self.assertEqual(len(scores), len(expected_scores))
            for a, b in zip(scores[1:], expected_scores[1:]):
                # DESIGN.md: multi-rank logits within 1e-4 of one rank, so a log-softmax within 2e-4.
                self.assertAlmostEqual(a, b, delta=2e-4)
            status, _ = two.get("/v1/models")
            self.assertEqual(status, 200)


if __name__ == "__main__":
    unittest.main()
