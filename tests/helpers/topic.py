"""What the topic-label tests share (``tests/annotate/topic/``, ``tests/annotate/test_cli.py``): the hand-labelled
sample, five problems whose topic is plain, and two stand-in judges on loopback: an OpenAI-compatible HTTP server
with scripted answers, and a raw TCP server that misbehaves on purpose."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HAND_LABELS = Path(__file__).resolve().parents[2] / "data" / "topic_labels_hand.jsonl"


CLEAR_CASES = {
    "Find the determinant of the matrix $\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}$.": "Linear Algebra",
    "A fair die is rolled twice. What is the probability that the sum is 7?": "Probability & Statistics",
    "In triangle $ABC$, the angle at $A$ is $60^\\circ$ and $AB = AC = 4$. Find the area of the triangle.": (
        "Geometry & Trigonometry"
    ),
    "A ball of mass 2 kg is pushed with a force of 10 newtons. What is its acceleration?": "Physics & Chemistry",
    "Evaluate the integral $\\int_0^1 x^2 \\, dx$ and the derivative of $x^3$ at $x = 2$.": "Calculus & Analysis",
}


class FakeJudge:
    """OpenAI-compatible /v1/chat/completions: scripted answers per problem, fails once with a 500."""

    def __init__(self):
        self.requests = []  # (problem, number of messages, auth header, model)
        self.lock = threading.Lock()

    def answer(self, body, auth):
        messages = body["messages"]
        problem = messages[1]["content"]
        with self.lock:
            self.requests.append((problem, len(messages), auth, body["model"]))
            tries = sum(1 for p, *_ in self.requests if p == problem)
        if problem.startswith("FLAKY") and tries == 1:
            return 500, None
        if problem.startswith("NOTFOUND"):
            return 404, None
        if problem.startswith("BANANA"):
            return 200, "Banana"  # never a valid label
        if problem.startswith("REASK"):
            return 200, ("Geometry, I think" if len(messages) == 2 else "Geometry & Trigonometry")
        return 200, "probability and statistics" if "dice" in problem else "Algebra & Number Theory"

    def serve(self):
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                assert self.path == "/v1/chat/completions"
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, content = judge.answer(body, self.headers.get("Authorization"))
                payload = {"choices": [{"message": {"role": "assistant", "content": content}}]}
                data = json.dumps(payload).encode() if status == 200 else b'{"error": "boom"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def fake_judge_server() -> Iterator[tuple[FakeJudge, str]]:
    """A fixture's body (``yield from``): a :class:`FakeJudge` served on loopback; gives it and its URL."""
    judge = FakeJudge()
    server = judge.serve()
    yield judge, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class RawJudge:
    """A raw TCP server on loopback that speaks just enough HTTP/1.1 to misbehave on purpose.

    The problem text (the last user message) picks the behaviour; ``bad_tries[problem]`` is how many
    requests misbehave before it answers properly (default: all of them). Behaviours: ``BADUTF8`` (a body
    that is not UTF-8), ``BADSTATUS`` (a garbage status line), ``TRUNCATED`` (Content-Length larger than the
    body, then close), ``TRICKLE`` (one body byte every 0.2 s: each socket read is quick, the whole body
    of 87 bytes takes 17 s), ``HANG`` (holds the connection until ``release`` is set); anything else
    answers "Algebra & Number Theory".
    """

    def __init__(self, bad_tries=None):
        self.bad_tries = dict(bad_tries or {})
        self.requests: list[str] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, body = data.split(b"\r\n\r\n", 1)
                length = int(
                    next(
                        h.split(b":")[1]
                        for h in head.split(b"\r\n")
                        if h.lower().startswith(b"content-length")
                    )
                )
                while len(body) < length:
                    body += conn.recv(65536)
                problem = json.loads(body)["messages"][-1]["content"]
                with self.lock:
                    self.requests.append(problem)
                    tries = self.requests.count(problem)
                self._reply(conn, problem, tries <= self.bad_tries.get(problem, 10**9))
            except OSError:
                pass

    @staticmethod
    def _ok(content: str) -> bytes:
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body),
            body,
        )

    def _reply(self, conn, problem, misbehave):
        kind = problem.split(":")[0]
        if not misbehave or kind not in ("BADUTF8", "BADSTATUS", "TRUNCATED", "TRICKLE", "HANG"):
            conn.sendall(self._ok("Algebra & Number Theory"))
        elif kind == "BADUTF8":
            body = b'{"choices": [{"message": {"content": "Alg\xe8bre"}}]}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        elif kind == "BADSTATUS":
            conn.sendall(b"I am not HTTP\r\n\r\n")
        elif kind == "TRUNCATED":
            conn.sendall(self._ok("Algebra & Number Theory")[:-15])
        elif kind == "TRICKLE":
            reply = self._ok("Algebra & Number Theory")
            head, body = reply.split(b"\r\n\r\n", 1)
            conn.sendall(head + b"\r\n\r\n")
            for i in range(len(body)):
                conn.sendall(body[i : i + 1])
                time.sleep(0.2)
        elif kind == "HANG":
            self.release.wait(30)
            conn.sendall(self._ok("Geometry & Trigonometry"))

    def close(self):
        self.release.set()
        self.server.close()


def raw_judges() -> Iterator[Callable[..., RawJudge]]:
    """A fixture's body (``yield from``): gives a factory of :class:`RawJudge` servers, closed afterwards."""
    servers = []

    def make(**kw):
        servers.append(RawJudge(**kw))
        return servers[-1]

    yield make
    for server in servers:
        server.close()
