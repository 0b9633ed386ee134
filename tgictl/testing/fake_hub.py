"""A Hugging Face hub on 127.0.0.1 serving model directories from disk, for download tests without
network. It answers only the calls huggingface_hub makes to download a model (model info, the file
tree, HEAD and GET of a file) and nothing else, so a new call in a future huggingface_hub fails
loudly (404) instead of passing by accident.

    with FakeHub({"acme/tiny": model_dir}) as hub:
        download_model("acme/tiny", hub=HubConfig(..., endpoint=hub.endpoint))
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlparse

_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class FakeHub:
    """Serves `repos` ({repo_id: directory}) at `endpoint`; every repo has one commit, named by a
    hash of its files, reachable as `main` or as that hash. `requests` records each path asked for."""

    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = {repo: Path(directory) for repo, directory in repos.items()}
        self.commits = {repo: self._commit(directory) for repo, directory in self.repos.items()}
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @staticmethod
    def _commit(directory: Path) -> str:
        digest = hashlib.sha1()
        for path in sorted(p for p in directory.iterdir() if p.is_file()):
            digest.update(path.name.encode() + hashlib.sha1(path.read_bytes()).digest())
        return digest.hexdigest()

    def _files(self, repo: str) -> list[Path]:
        return sorted(p for p in self.repos[repo].iterdir() if p.is_file())

    def _revision_ok(self, repo: str, revision: str | None) -> bool:
        return revision in (None, "main", self.commits[repo])

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                self._answer(body=True)

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def _json(self, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _missing(self, error_code: str, message: str) -> None:
                data = json.dumps({"error": message}).encode()
                self.send_response(404)
                self.send_header("X-Error-Code", error_code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _answer(self, *, body: bool) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append(f"{self.command} {path}")
                for pattern in (_INFO, _TREE, _RESOLVE):
                    match = pattern.match(path)
                    if match is None:
                        continue
                    repo, revision = match["repo"], match["rev"]
                    if repo not in hub.repos:
                        return self._missing("RepoNotFound", f"Repository {repo} not found")
                    if not hub._revision_ok(repo, revision):
                        return self._missing("RevisionNotFound", f"Invalid rev id: {revision}")
                    if pattern is _INFO:
                        return self._json(
                            {
                                "id": repo,
                                "modelId": repo,
                                "sha": hub.commits[repo],
                                "siblings": [{"rfilename": p.name} for p in hub._files(repo)],
                            }
                        )
                    if pattern is _TREE:
                        return self._json(
                            [
                                {"type": "file", "path": p.name, "size": p.stat().st_size, "oid": _oid(p)}
                                for p in hub._files(repo)
                            ]
                        )
                    return self._file(repo, match["file"], body=body)
                self._missing("EntryNotFound", f"no route for {path}")

            def _file(self, repo: str, name: str, *, body: bool) -> None:
                path = hub.repos[repo] / name
                if "/" in name or not path.is_file():
                    return self._missing("EntryNotFound", f"{name} not found in {repo}")
                data = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{_oid(path)}"')
                self.send_header("X-Repo-Commit", hub.commits[repo])
                self.end_headers()
                if body:
                    self.wfile.write(data)

        return Handler


def _oid(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()
