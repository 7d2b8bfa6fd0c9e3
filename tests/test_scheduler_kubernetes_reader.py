"""KubernetesReader against an HTTP server that answers as the API server does: paged lists
(`limit`, `metadata.continue`), a bearer token it checks, 403 for a wrong one."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubernetes_validate
import pytest

from gpufeed.scheduler.kubernetes import KubernetesError, KubernetesReader

K8S = Path(__file__).parent / "fixtures" / "scheduler" / "kubernetes"
TOKEN = "sa-token-123"


class ApiServer(BaseHTTPRequestHandler):
    seen: list[str] = []  # one server per test: the test reads what was asked

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        self.seen.append(self.path)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._send(403, {"kind": "Status", "status": "Failure", "code": 403})
        name = {"/api/v1/pods": "pods.json", "/api/v1/nodes": "nodes.json"}.get(url.path)
        if name is None:
            return self._send(404, {"kind": "Status", "code": 404})
        doc = json.loads((K8S / name).read_text())
        # pages of 2 items, whatever limit was asked (a server may return fewer)
        start = int(q.get("continue") or 0)
        page = doc["items"][start : start + 2]
        more = start + 2 < len(doc["items"])
        meta = {"resourceVersion": "1", **({"continue": str(start + 2)} if more else {})}
        self._send(200, {**doc, "metadata": meta, "items": page})

    def _send(self, code: int, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[str]:
    ApiServer.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ApiServer)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_paged_lists_are_read_whole(api: str, tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    reading = KubernetesReader(api, str(tmp_path / "token"), "").read(1796085000.0)
    assert [j.job_id for j in reading.pending] == [
        "train/llama-ft-7xk2p",
        "train/resnet-dp-q8w4z",
        "train/gated-9xk1",
    ]
    assert [(n.name, n.allocated) for n in reading.nodes] == [
        ("node-a", 7),
        ("node-b", 0),
        ("node-d", 0),
    ]
    pods = [p for p in ApiServer.seen if p.startswith("/api/v1/pods")]
    assert len(pods) == 4  # 7 pods in pages of 2
    assert "fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed" in pods[0]


def test_a_refused_token_is_one_clear_error(api: str, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("wrong")
    with pytest.raises(KubernetesError, match=r"^listing PodList: HTTP 403"):
        KubernetesReader(api, str(tmp_path / "token"), "").read(0.0)
    with pytest.raises(KubernetesError, match=r"^token .*/absent: No such file"):
        KubernetesReader(api, str(tmp_path / "absent"), "").read(0.0)


@pytest.mark.parametrize("version", ["1.25.0", "1.37.0"])
@pytest.mark.parametrize("name", ["pods.json", "nodes.json"])
def test_the_fixtures_are_what_the_api_server_answers(name: str, version: str) -> None:
    """The lists are written by hand (no API server runs here): each is checked, strictly
    (no unknown field, every required one), against the Kubernetes API's own JSON schema
    as kubernetes-validate ships it, for the oldest and newest version it knows. The
    nodes' list lacked the kubelet's machine and boot ids until this check."""
    kubernetes_validate.validate(json.loads((K8S / name).read_text()), version, strict=True)
