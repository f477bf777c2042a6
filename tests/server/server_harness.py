"""Starts `helixlm serve` for a test on a free loopback port and stops it afterwards.

Used by the server tests (tests/server/test_*.py) and tools/load_test.py. The server's log goes to a
file whose tail is shown when start-up fails, so a CI failure says why.
"""
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_MODEL = os.path.join(REPO, "models", "kimi-linear-tiny")


def helixlm_binary():
    return os.environ.get("HLM_BINARY", os.path.join(REPO, "build", "helixlm"))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running `helixlm serve`; use as a context manager."""

    def __init__(self, *args, model=TINY_MODEL, api_key=None, ranks=1, env=None, startup_timeout=120):
        # free_port's port is released before the server binds it, so another process (mpirun's own
        # listeners, a test running beside this one) can take it first: then start again on a new port.
        for _ in range(5):
            if self._start(args, model, api_key, ranks, env, startup_timeout):
                return
        raise RuntimeError(f"helixlm serve found no free port in 5 attempts:\n{self.log_text()}")

    def _start(self, args, model, api_key, ranks, env, startup_timeout):
        """True once the server is healthy; False if its port was taken before it could listen."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        cmd = [helixlm_binary(), "serve", "-m", model, "--port", str(self.port), *args]
        if ranks > 1:
            # Oversubscribed CPU ranks, as the multi-rank CLI tests run them; mpirun refuses root unless told.
            cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", *cmd, "--threads", "1"]
        if api_key:
            cmd += ["--api-key", api_key]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="helixlm-serve-", suffix=".log", delete=False)
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **(env or {}))
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + startup_timeout
        while True:
            if self.proc.poll() is not None:
                if "cannot listen on" in self.log_text():
                    return False
                raise RuntimeError(f"helixlm serve exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if self.get("/health")[0] == 200:
                    return True
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"helixlm serve not healthy after {startup_timeout} s:\n{self.log_text()}")
            time.sleep(0.1)

    def log_text(self):
        with open(self.log.name) as f:
            return f.read()[-4000:]

    def request(self, method, path, body=None, headers=None, timeout=300):
        """(status, parsed JSON or text) of one plain HTTP request."""
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers or {})
        if self.api_key and "Authorization" not in (headers or {}):
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def metrics(self):
        """/metrics as {name{labels}: value}."""
        _, text = self.get("/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        self.log.close()
        os.unlink(self.log.name)
