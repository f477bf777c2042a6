"""The server under abuse: more concurrent requests than --max-num-seqs plus the queue (the surplus gets
429 at once, the rest complete), clients that disconnect mid-stream or before their whole answer (their
sequence is cancelled and its KV pages freed, seen through /metrics), malformed or refused requests (the
right 4xx in OpenAI's error shape, and the server keeps serving, a running request undisturbed), API keys,
body limits, HTTP/1.0 clients, and shutdown by signal (running requests drain; a second signal ends them
with an error)."""
import concurrent.futures
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

from server_harness import TINY_MODEL, Server, helixlm_binary

PROMPT = [5, 17, 300, 41, 7]


def greedy(n, **extra):
    return {"prompt": PROMPT, "max_tokens": n, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
            **extra}


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def post_stream(server, body):
    """An open streaming response whose first event has arrived."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.status
    first = resp.readline()
    assert first.startswith(b"data: "), first
    return conn, resp, first


def sse_events(text):
    """The data of each event of an SSE body, JSON-decoded except the final [DONE]."""
    events = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def raw_exchange(port, request, timeout=120):
    """Sends bytes on a fresh connection and reads until the server closes it: (status line, headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return lines[0], headers, body


def assert_openai_error(test, body, status):
    test.assertIsInstance(body, dict, body)
    err = body["error"]
    test.assertEqual(err["code"], status)
    test.assertTrue(err["message"])
    test.assertIn("type", err)
    test.assertIn("param", err)


class Overload(unittest.TestCase):
    def test_surplus_gets_429_at_once_and_the_rest_complete(self):
        with Server("--max-num-seqs", "2", "--max-queued-requests", "2", "--max-model-len", "4096") as s:
            # Long enough that no admitted request can finish before the last of the ten arrives, even on a
            # loaded 2-core machine (400 tokens let three more in there: 7 of 10 completed).
            n = 3000
            results = [None] * 10
            barrier = threading.Barrier(10)

            def send(i):
                barrier.wait()
                start = time.monotonic()
                status, body = s.post("/v1/completions", greedy(n))
                results[i] = (status, body, time.monotonic() - start)

            threads = [threading.Thread(target=send, args=(i,)) for i in range(10)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            ok = [r for r in results if r[0] == 200]
            refused = [r for r in results if r[0] == 429]
            self.assertEqual(len(ok), 4, [r[0] for r in results])
            self.assertEqual(len(refused), 6, [r[0] for r in results])
            slowest_ok = max(r[2] for r in ok)
            for status, body, seconds in refused:
                assert_openai_error(self, body, 429)
                # Refused at once, not after waiting for room.
                self.assertLess(seconds, slowest_ok / 2)
            reference = ok[0][1]["choices"][0]["token_ids"]
            for status, body, _ in ok:
                self.assertEqual(body["choices"][0]["token_ids"], reference)
                self.assertEqual(body["usage"]["completion_tokens"], n)
            m = s.metrics()
            self.assertEqual(m['helixlm:requests_total{status="429"}'], 6)
            self.assertEqual(m["helixlm:num_requests_running"], 0)
            self.assertEqual(m["helixlm:kv_pages_used"], 0)


class Disconnect(unittest.TestCase):
    def test_a_client_leaving_mid_stream_frees_its_sequence(self):
        with Server("--max-model-len", "16384") as s:
            total = s.metrics()["helixlm:kv_pages_free"]
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
            body = json.dumps(greedy(16000, stream=True))
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.assertEqual(resp.status, 200)
            first = resp.readline()
            self.assertTrue(first.startswith(b"data: "), first)
            self.assertTrue(wait_for(lambda: s.metrics()["helixlm:kv_pages_used"] > 0, 10.0))
            conn.sock.shutdown(2)
            conn.close()
            left = time.monotonic()

            def freed():
                m = s.metrics()
                return (m["helixlm:num_requests_running"] == 0 and m["helixlm:kv_pages_used"] == 0
                        and m.get('helixlm:requests_finished_total{finish_reason="abort"}') == 1)

            self.assertTrue(wait_for(freed, 15.0), s.metrics())
            m = s.metrics()
            self.assertEqual(m["helixlm:kv_pages_free"], total)
            # Cancelled long before its 16000 tokens.
            self.assertLess(m["helixlm:generation_tokens_total"], 16000)
            self.assertLess(time.monotonic() - left, 15.0)
            status, body = s.post("/v1/completions", greedy(4))
            self.assertEqual(status, 200, body)


    def test_a_client_leaving_before_its_whole_answer_frees_its_sequence(self):
        # One sequence runs and one waits for the slot; both clients leave before their answers exist.
        with Server("--max-model-len", "16384", "--max-num-seqs", "1") as s:
            conns = []
            for _ in range(2):
                conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
                conn.request("POST", "/v1/completions", json.dumps(greedy(16000)),
                             {"Content-Type": "application/json"})
                conns.append(conn)
            self.assertTrue(wait_for(lambda: s.metrics()["helixlm:num_requests_running"] == 1
                                     and s.metrics()["helixlm:num_requests_waiting"] == 1, 10.0), s.metrics())
            for conn in conns:
                conn.sock.shutdown(socket.SHUT_RDWR)
                conn.close()

            def freed():
                m = s.metrics()
                return (m["helixlm:num_requests_running"] == 0 and m["helixlm:num_requests_waiting"] == 0
                        and m["helixlm:kv_pages_used"] == 0
                        and m.get('helixlm:requests_finished_total{finish_reason="abort"}') == 2)

            self.assertTrue(wait_for(freed, 15.0), s.metrics())
            m = s.metrics()
            self.assertLess(m["helixlm:generation_tokens_total"], 16000)
            self.assertEqual(m['helixlm:requests_total{status="499"}'], 2)
            status, body = s.post("/v1/completions", greedy(4))
            self.assertEqual(status, 200, body)


class Shutdown(unittest.TestCase):
    """SIGTERM drains: new requests get 503, the running ones finish, exit 0. A second signal ends them
    at once, each with an error (a stream's error event, a whole answer's 503), and the exit code is 1."""

    def start_two(self, s, n):
        """A stream and a whole answer of n tokens each, both running."""
        conn, resp, first = post_stream(s, greedy(n, stream=True))
        pool = concurrent.futures.ThreadPoolExecutor(1)
        self.addCleanup(pool.shutdown)
        whole = pool.submit(s.post, "/v1/completions", greedy(n))
        self.assertTrue(wait_for(lambda: s.metrics()["helixlm:num_requests_running"] == 2, 10.0), s.metrics())
        return conn, resp, first, whole

    def test_sigterm_lets_running_requests_finish_then_exits_0(self):
        n = 3000
        with Server("--max-model-len", "4096") as s:
            conn, resp, first, whole = self.start_two(s, n)
            s.proc.send_signal(signal.SIGTERM)
            self.assertTrue(wait_for(lambda: s.get("/health")[0] == 503, 10.0))
            code, err = s.post("/v1/completions", greedy(2))
            self.assertEqual(code, 503, err)
            assert_openai_error(self, err, 503)
            events = sse_events((first + resp.read()).decode())
            conn.close()
            self.assertEqual(events[-1], "[DONE]")
            self.assertEqual(sum(len(e["choices"][0].get("token_ids", [])) for e in events[:-1] if e["choices"]),
                             n)
            self.assertEqual(events[-2]["choices"][0]["finish_reason"], "length")
            code, body = whole.result()
            self.assertEqual(code, 200, body)
            self.assertEqual(body["usage"]["completion_tokens"], n)
            self.assertEqual(s.proc.wait(timeout=60), 0, s.log_text())

    def test_a_second_signal_ends_running_requests_with_an_error(self):
        with Server("--max-model-len", "16384") as s:
            conn, resp, first, whole = self.start_two(s, 16000)
            s.proc.send_signal(signal.SIGTERM)
            self.assertTrue(wait_for(lambda: s.get("/health")[0] == 503, 10.0))
            s.proc.send_signal(signal.SIGINT)
            events = sse_events((first + resp.read()).decode())
            conn.close()
            self.assertEqual(events[-1], "[DONE]")
            assert_openai_error(self, events[-2], 503)
            code, body = whole.result()
            self.assertEqual(code, 503, body)
            assert_openai_error(self, body, 503)
            self.assertEqual(s.proc.wait(timeout=60), 1, s.log_text())


class Protocol(unittest.TestCase):
    def test_http10_form_bodies_and_methods(self):
        with Server("--max-model-len", "4096") as s:
            body = json.dumps(greedy(5)).encode()
            # HTTP/1.0 knows no chunked encoding: a whole answer comes with its length, a stream ends
            # with the connection.
            status, headers, data = raw_exchange(s.port, b"POST /v1/completions HTTP/1.0\r\nContent-Type: "
                                                 b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                                                 % (len(body), body))
            self.assertIn(" 200 ", status)
            self.assertNotIn("transfer-encoding", headers)
            self.assertEqual(int(headers["content-length"]), len(data))
            self.assertEqual(len(json.loads(data)["choices"][0]["token_ids"]), 5)
            body = json.dumps(greedy(5, stream=True)).encode()
            status, headers, data = raw_exchange(s.port, b"POST /v1/completions HTTP/1.0\r\nContent-Length: "
                                                 b"%d\r\n\r\n%s" % (len(body), body))
            self.assertIn(" 200 ", status)
            self.assertNotIn("transfer-encoding", headers)
            self.assertEqual(sse_events(data.decode())[-1], "[DONE]")
            # Asked to keep the connection alive, the server still ends the stream by closing its side, well
            # before httplib's 5 s idle timeout would (the socket's 3 s timeout fails the test then).
            status, headers, data = raw_exchange(s.port, b"POST /v1/completions HTTP/1.0\r\nConnection: "
                                                 b"Keep-Alive\r\nContent-Length: %d\r\n\r\n%s"
                                                 % (len(body), body), timeout=3)
            self.assertIn(" 200 ", status)
            self.assertEqual(headers.get("connection"), "close")
            self.assertNotIn("keep-alive", headers)
            self.assertEqual(sse_events(data.decode())[-1], "[DONE]")
            # curl -d sends application/x-www-form-urlencoded; a body past httplib's 8 KiB cap on forms is
            # still the JSON request.
            long_prompt = {"prompt": [5, 17] * 1500, "max_tokens": 3, "temperature": 0}
            self.assertGreater(len(json.dumps(long_prompt)), 8192)
            code, out = s.post("/v1/completions", long_prompt,
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
            self.assertEqual(code, 200, out)
            self.assertEqual(out["usage"]["completion_tokens"], 3)
            for method, path, allow in (("GET", "/v1/chat/completions", "POST"), ("DELETE", "/v1/models", "GET, HEAD"),
                                        ("POST", "/v1/models", "GET, HEAD")):
                conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
                conn.request(method, path, b"{}" if method == "POST" else None)
                resp = conn.getresponse()
                self.assertEqual(resp.status, 405, (method, path))
                self.assertEqual(resp.getheader("Allow"), allow)
                assert_openai_error(self, json.loads(resp.read()), 405)
                conn.close()


class BadRequests(unittest.TestCase):
    CASES = [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        ({"prompt": PROMPT, "max_tokens": "ten"}, 400, "max_tokens"),
        ({"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": PROMPT, "temperature": -1}, 400, "temperature"),
        ({"prompt": PROMPT, "top_p": 0}, 400, "top_p"),
        ({"prompt": PROMPT, "top_k": 1.5}, 400, "top_k"),
        ({"prompt": PROMPT, "stream": "yes"}, 400, "stream"),
        ({"prompt": PROMPT, "n": 1000}, 400, "n"),
        ({"prompt": PROMPT, "n": 2, "best_of": 1}, 400, "best_of"),
        ({"prompt": PROMPT, "best_of": 2, "stream": True}, 400, "best_of"),
        ({"prompt": PROMPT, "logprobs": 50}, 400, "logprobs"),
        ({"prompt": PROMPT, "stop_token_ids": [1, -3]}, 400, "stop_token_ids"),
        ({"prompt": PROMPT, "frequency_penalty": 2.5}, 400, "frequency_penalty"),
        ({"prompt": PROMPT, "min_tokens": 17}, 400, "min_tokens"),
        ({"prompt": PROMPT, "logit_bias": {"-1": 5}}, 400, "logit_bias"),
        ({"prompt": [1, 99999]}, 400, "prompt"),
        ({"prompt": []}, 400, "prompt"),
        ({"prompt": [[1, 2], 3]}, 400, "prompt"),
        ({"max_tokens": 3}, 400, "prompt"),
        ({"prompt": PROMPT, "model": "some-other-model"}, 404, "model"),
    ]

    def test_each_gets_its_4xx_and_the_server_keeps_serving(self):
        with Server("--max-model-len", "4096") as s:
            _, alone = s.post("/v1/completions", greedy(300))
            expected = alone["choices"][0]["token_ids"]
            # A long request runs while the bad ones arrive; it must come out exactly as alone.
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                running = pool.submit(s.post, "/v1/completions", greedy(300))
                for body, status, param in self.CASES:
                    code, err = s.post("/v1/completions", body)
                    self.assertEqual(code, status, (body, err))
                    assert_openai_error(self, err, status)
                    self.assertEqual(err["error"]["param"], param, (body, err))
                    ok, _ = s.post("/v1/completions", greedy(2))
                    self.assertEqual(ok, 200)
                code, body = running.result()
            self.assertEqual(code, 200)
            self.assertEqual(body["choices"][0]["token_ids"], expected)

    def test_prompt_over_max_model_len_names_both_numbers(self):
        with Server("--max-model-len", "64") as s:
            code, err = s.post("/v1/completions", {"prompt": list(range(100)), "max_tokens": 1})
            self.assertEqual(code, 400)
            self.assertIn("64", err["error"]["message"])
            self.assertIn("100", err["error"]["message"])
            code, err = s.post("/v1/completions", {"prompt": list(range(10)), "max_tokens": 60})
            self.assertEqual(code, 400)
            for number in ("64", "70", "10", "60"):
                self.assertIn(number, err["error"]["message"])

    def test_unknown_route_body_limit_and_api_key(self):
        with Server("--max-request-bytes", "4096", api_key="sekrit") as s:
            code, err = s.get("/v1/nothing-here")
            self.assertEqual(code, 404)
            assert_openai_error(self, err, 404)
            code, err = s.post("/v1/completions", b'{"prompt": "' + b"a" * 10000 + b'"}')
            self.assertEqual(code, 413)
            assert_openai_error(self, err, 413)
            self.assertIn("--max-request-bytes (4096 bytes)", err["error"]["message"])
            for headers in ({"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"},
                            {"Authorization": ""}):
                code, err = s.post("/v1/completions", greedy(2), headers=headers)
                self.assertEqual(code, 401, headers)
                assert_openai_error(self, err, 401)
                code, _ = s.get("/v1/models", headers=headers)
                self.assertEqual(code, 401)
            self.assertEqual(s.get("/health", headers={"Authorization": "Bearer wrong"})[0], 200)
            code, body = s.post("/v1/completions", greedy(2))
            self.assertEqual(code, 200, body)
            # The scheme is case-insensitive (RFC 7235).
            for scheme in ("bearer", "BEARER"):
                code, body = s.post("/v1/completions", greedy(2), headers={"Authorization": f"{scheme} sekrit"})
                self.assertEqual(code, 200, (scheme, body))

    def test_api_key_from_a_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "key")
            with open(path, "w") as f:
                f.write("from-a-file \nsecond line\n")
            with Server("--api-key-file", path) as s:
                self.assertEqual(s.post("/v1/completions", greedy(2))[0], 401)
                code, body = s.post("/v1/completions", greedy(2), headers={"Authorization": "Bearer from-a-file"})
                self.assertEqual(code, 200, body)
            # A file that cannot be read or holds no key ends serve before it listens, naming the file.
            empty = os.path.join(d, "empty")
            with open(empty, "w") as f:
                f.write("  \n")
            for bad, why in ((os.path.join(d, "missing"), "cannot be read"), (empty, "its first line holds no key")):
                run = subprocess.run([helixlm_binary(), "serve", "-m", TINY_MODEL, "--port", "1", "--api-key-file",
                                      bad], capture_output=True, text=True, timeout=60)
                self.assertNotEqual(run.returncode, 0)
                self.assertIn(f"--api-key-file {bad}: {why}", run.stderr + run.stdout)
            both = subprocess.run([helixlm_binary(), "serve", "-m", TINY_MODEL, "--api-key", "x", "--api-key-file",
                                   path], capture_output=True, text=True, timeout=60)
            self.assertNotEqual(both.returncode, 0)
            self.assertIn("excludes", both.stderr + both.stdout)

    def test_a_refused_body_does_not_become_the_next_request(self):
        # The body goes out after a pause, in a packet of its own, as a slow client's would: a 401 answered
        # before it is read would leave it on the socket to be parsed as the next request.
        with Server(api_key="sekrit") as s:
            body = json.dumps(greedy(2)).encode()
            with socket.create_connection(("127.0.0.1", s.port), timeout=60) as sock:
                for path, key in (("/v1/completions", b""), ("/v1/nothing-here", b""), ("/v1/models", b""),
                                  ("/v1/completions", b"Authorization: Bearer sekrit\r\n")):
                    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n"
                                 % (path.encode(), key, len(body)))
                    time.sleep(0.2)
                    sock.sendall(body)
                    resp = http.client.HTTPResponse(sock)
                    resp.begin()
                    answer = json.loads(resp.read())
                    if key:
                        self.assertEqual(resp.status, 200, answer)
                        self.assertEqual(answer["usage"]["completion_tokens"], 2)
                    else:
                        self.assertEqual(resp.status, 401, (path, answer))
                        assert_openai_error(self, answer, 401)


class Port(unittest.TestCase):
    def test_a_second_server_on_the_same_port_is_refused(self):
        with Server() as s:
            second = subprocess.run([helixlm_binary(), "serve", "-m", TINY_MODEL, "--port", str(s.port)],
                                    capture_output=True, text=True, timeout=60)
            self.assertNotEqual(second.returncode, 0)
            self.assertIn(f"cannot listen on 127.0.0.1:{s.port}", second.stderr)
            self.assertEqual(s.get("/health")[0], 200)


class ModelResolution(unittest.TestCase):
    def test_a_repo_id_is_found_in_the_hub_cache_and_a_miss_says_where_it_looked(self):
        with tempfile.TemporaryDirectory() as cache:
            repo = os.path.join(cache, "models--moonshotai--Kimi-Tiny")
            os.makedirs(os.path.join(repo, "refs"))
            os.makedirs(os.path.join(repo, "snapshots"))
            with open(os.path.join(repo, "refs", "main"), "w") as f:
                f.write("0123abcd")
            os.symlink(TINY_MODEL, os.path.join(repo, "snapshots", "0123abcd"))
            with Server(model="moonshotai/Kimi-Tiny", env={"HF_HUB_CACHE": cache}) as s:
                _, models = s.get("/v1/models")
                self.assertEqual(models["data"][0]["id"], "moonshotai/Kimi-Tiny")
                self.assertEqual(s.post("/v1/completions", greedy(2))[0], 200)
            missing = subprocess.run([helixlm_binary(), "serve", "-m", "moonshotai/Not-Here", "--port", "1"],
                                     env=dict(os.environ, HF_HUB_CACHE=cache), capture_output=True, text=True,
                                     timeout=60)
            self.assertNotEqual(missing.returncode, 0)
            self.assertIn(os.path.join(cache, "models--moonshotai--Not-Here"), missing.stderr)


if __name__ == "__main__":
    unittest.main()
