"""Local AWS stand-ins for the AWS source tests: a real moto server in a thread, and a tiny HTTP server that
answers with a scripted list of responses (what moto cannot do: throttle, then answer)."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any

import boto3
import requests
from moto.server import ThreadedMotoServer

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
REGION = "us-east-1"


class MotoServer:
    """moto on 127.0.0.1, port chosen by the OS (port=0; read back with get_host_and_port)."""

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.url = ""

    def start(self) -> MotoServer:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self._server.stop()

    def client(self, service: str, **kwargs: Any) -> Any:
        return boto3.client(service, endpoint_url=self.url, region_name=REGION, **CREDENTIALS, **kwargs)

    def reset(self) -> None:
        requests.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()

    def queue_ce(self, results: list[dict]) -> None:
        """Queue get_cost_and_usage answers: moto gives each new request body the next one, in order."""
        r = requests.post(
            f"{self.url}/moto-api/static/ce/cost-and-usage-results", json={"results": results}, timeout=10
        )
        assert r.status_code == 201, r.text


class ScriptedServer:
    """Answers POSTs with the scripted (status, JSON body) responses in order, then repeats the last one;
    records every request body. Headers are what Cost Explorer (awsJson1_1) sends."""

    def __init__(self, responses: list[tuple[int, dict]]):
        self.responses = responses
        self.requests: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append(json.loads(body or b"{}"))
                status, payload = outer.responses[min(len(outer.requests), len(outer.responses)) - 1]
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("x-amzn-RequestId", f"req-{len(outer.requests)}")
                if status >= 400:
                    self.send_header("x-amzn-ErrorType", payload.get("__type", ""))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
