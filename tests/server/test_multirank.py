"""`helixlm serve` under mpirun: rank 0 serves HTTP and schedules, the other rank executes the broadcast
step plans; concurrent greedy requests give the same ids as on one rank (Helix cp = 2 splits the KV pages
of every sequence over the two ranks)."""
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

    with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
        return list(pool.map(one, REQUESTS))


class MultiRank(unittest.TestCase):
    def test_two_ranks_give_the_ids_of_one(self):
        # A 16-token page keeps several pages per sequence, so both CP ranks hold KV.
        args = ("--max-model-len", "256", "--tokens-per-block", "16", "--max-num-batched-tokens", "32")
        with Server(*args) as one:
            expected = run_all(one)
        with Server(*args, "--cp", "2", ranks=2) as two:
            self.assertEqual(run_all(two), expected)
            status, _ = two.get("/v1/models")
            self.assertEqual(status, 200)


if __name__ == "__main__":
    unittest.main()
