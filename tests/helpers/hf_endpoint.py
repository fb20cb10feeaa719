"""A local Hugging Face endpoint for tests (``HF_ENDPOINT``): real HTTP, the Hub's routes as huggingface_hub
calls them, so `weights pull` runs the real ``snapshot_download`` against it (huggingface_hub is not mocked).

Routes (as huggingface_hub 2.x requests them: ``HfApi.model_info`` / ``repo_info``, ``list_repo_tree``,
``get_hf_file_metadata`` + the download, which resumes with a ``Range`` header):

* ``GET /api/models/<org>/<name>[/revision/<rev>]`` → ``{"id", "sha", "siblings": [{"rfilename", "size", …}]}``
* ``GET /api/models/<org>/<name>/tree/<rev>?recursive=…`` → ``[{"type": "file", "path", "size", "oid", "lfs"}]``
* ``HEAD|GET /<org>/<name>/resolve/<rev>/<path>`` → the bytes, with ``X-Repo-Commit`` and ``ETag`` (the
  sha256 for LFS files, as the Hub does), ``Range`` honoured (206).

Every file is served as an LFS file. With ``token`` set, a request without ``Authorization: Bearer <token>``
gets 401. ``served_bytes`` counts the bytes of file bodies sent (a resumed pull sends only the tail).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class Repo:
    root: Path
    sha: str = "5ab1e0c0ffee5ab1e0c0ffee5ab1e0c0ffee0040"
    files: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # rel → (size, sha256, git sha1)

    def scan(self) -> Repo:
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                self.files[p.relative_to(self.root).as_posix()] = (len(data), hashlib.sha256(data).hexdigest(), git)
        return self


class HFEndpoint:
    def __init__(self, repos: dict[str, Path], *, token: str | None = None, host: str = "127.0.0.1") -> None:
        self.repos = {rid: Repo(p).scan() for rid, p in repos.items()}
        self.rate = 0.0  # bytes/s a file body is served at (0: as fast as it goes), so a test can stop a pull
        self.token = token
        self.served_bytes = 0
        self.requests: list[str] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_HEAD(self) -> None:
                outer._handle(self, head=True)

            def do_GET(self) -> None:
                outer._handle(self, head=False)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HFEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _json(self, h: BaseHTTPRequestHandler, obj: object, code: int = 200) -> None:
        body = json.dumps(obj).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _repo(self, org: str, name: str, rev: str) -> Repo | None:
        r = self.repos.get(f"{org}/{name}")
        return r if r is not None and rev in ("main", r.sha) else None

    def _handle(self, h: BaseHTTPRequestHandler, *, head: bool) -> None:
        path = unquote(urlparse(h.path).path)
        with self._lock:
            self.requests.append(f"{h.command} {path}")
        if self.token and h.headers.get("Authorization") != f"Bearer {self.token}":
            return self._json(h, {"error": "Invalid credentials"}, 401)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) == 4:  # model_info without a revision: main
            parts += ["revision", "main"]
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo = self._repo(parts[2], parts[3], parts[5])
            if repo is None:
                return self._json(h, {"error": "Repository not found"}, 404)
            if parts[4] == "revision":
                return self._json(h, {"id": f"{parts[2]}/{parts[3]}", "modelId": f"{parts[2]}/{parts[3]}",
                                      "sha": repo.sha, "private": False, "siblings": [
                                          {"rfilename": rel, "size": s, "blobId": g,
                                           "lfs": {"sha256": d, "size": s, "pointerSize": 134}}
                                          for rel, (s, d, g) in repo.files.items()]})
            return self._json(h, [{"type": "file", "path": rel, "size": s, "oid": g,
                                   "lfs": {"oid": d, "size": s, "pointerSize": 134}}
                                  for rel, (s, d, g) in repo.files.items()])
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo(parts[0], parts[1], parts[3])
            rel = "/".join(parts[4:])
            if repo is None or rel not in repo.files:
                h.send_response(404)
                h.send_header("X-Error-Code", "EntryNotFound")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            size, digest, _ = repo.files[rel]
            start = 0
            rng = h.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng[6:].split("-")[0] or 0)
            h.send_response(206 if start else 200)
            h.send_header("X-Repo-Commit", repo.sha)
            h.send_header("ETag", f'"{digest}"')
            h.send_header("Accept-Ranges", "bytes")
            h.send_header("Content-Length", str(size - start))
            if start:
                h.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            h.end_headers()
            if not head:
                t0, sent = time.monotonic(), 0
                with open(repo.root / rel, "rb") as f:
                    f.seek(start)
                    while chunk := f.read(1 << 20):
                        try:
                            h.wfile.write(chunk)
                        except OSError:  # the client went away (a stopped pull)
                            return
                        sent += len(chunk)
                        with self._lock:
                            self.served_bytes += len(chunk)
                        if self.rate and (ahead := sent / self.rate - (time.monotonic() - t0)) > 0:
                            time.sleep(ahead)
            return
        self._json(h, {"error": f"no route {path}"}, 404)
