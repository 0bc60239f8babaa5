"""A small local stand-in of the Slack Web API (chat.postMessage, the files_upload_v2 calls, HTTP 429 on
demand) that records every request: the delivery tests and the Dagster ``slack`` resource test share it."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class SlackStandIn:
    CHANNELS = {"#gpu-costs": "C0GPUCOSTS"}

    def __init__(self):
        self.requests: list[dict] = []
        self.rate_limit_next = 0  # answer this many calls with HTTP 429 first
        self.fail_posts: set[int] = set()  # chat.postMessage calls (1, 2, ...) answered ok: false
        self.posts = 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = urllib.parse.urlsplit(self.path).path
                kind = self.headers.get("Content-Type", "")
                if kind.startswith("application/json"):
                    params = json.loads(body)
                elif kind.startswith("application/x-www-form-urlencoded"):
                    params = dict(urllib.parse.parse_qsl(body.decode()))
                else:
                    params = {}
                stand_in.requests.append(
                    {"path": path, "headers": dict(self.headers), "params": params, "body": body}
                )
                if path == "/api/chat.postMessage":
                    stand_in.posts += 1
                if path == "/api/chat.postMessage" and stand_in.posts in stand_in.fail_posts:
                    self._answer({"ok": False, "error": "internal_error"})
                elif stand_in.rate_limit_next:
                    stand_in.rate_limit_next -= 1
                    self._answer({"ok": False, "error": "ratelimited"}, status=429, retry_after="0")
                else:
                    self._answer(stand_in.answer(path, params, len(body)))

            def _answer(self, payload, status=200, retry_after=None):
                data = json.dumps(payload).encode() if isinstance(payload, dict) else payload
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                kind = "application/json" if isinstance(payload, dict) else "text/plain"
                self.send_header("Content-Type", f"{kind}; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, path, params, length):
        if path == "/api/chat.postMessage":
            channel = self.CHANNELS.get(params.get("channel"))
            if channel is None:
                return {"ok": False, "error": "channel_not_found"}
            return {"ok": True, "channel": channel, "ts": "1763337600.000100", "message": {}}
        if path == "/api/files.getUploadURLExternal":
            return {"ok": True, "upload_url": f"{self.url}/upload/v1/F0REPORT", "file_id": "F0REPORT"}
        if path == "/upload/v1/F0REPORT":
            return f"OK - {length}".encode()
        if path == "/api/files.completeUploadExternal":
            return {"ok": True, "files": [{"id": "F0REPORT", "title": "report"}]}
        return {"ok": False, "error": "unknown_method"}

    def close(self):
        self.server.shutdown()
        self.server.server_close()
