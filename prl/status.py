"""/health and /metrics over HTTP for probes and Prometheus, one small server per service.

/health answers 200 while the service works (503 once its steps have failed on the transport
for a while, or one hangs: prl/service.py ``health_status``), and 200 with status "finished"
once it waits to be stopped after its run;
/metrics is the Prometheus text format of the service's counters and gauges (``finished`` 1
once it waits; ``seconds_idle``: since its steps last got work done), names ``prl_<service>_<key>``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def prometheus_text(service: str, values: dict) -> str:
    lines = []
    for key, value in sorted(values.items()):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        name = re.sub(r"[^a-zA-Z0-9_]", "_", f"prl_{service}_{key}")
        lines.append(f"{name} {value}")
    return "\n".join(lines) + "\n"


class StatusServer:
    def __init__(self, service, port: int, host: str = "127.0.0.1"):
        self.service = service
        handler = self._handler()
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="status-http", daemon=True)
        self.thread.start()

    def _handler(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                svc = outer.service
                if self.path == "/health":
                    answer = svc.health()
                    self._send(200 if answer["status"] in ("ok", "finished") else 503, "application/json",
                               json.dumps(answer).encode())
                elif self.path == "/metrics":
                    text = prometheus_text(svc.name, {**svc.gauges(), "finished": int(svc.ended),
                                                      "seconds_idle": svc.idle.seconds(time.monotonic())})
                    self._send(200, "text/plain; version=0.0.4", text.encode())
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, code, ctype, body):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # probes every few seconds: keep logs quiet
                pass

        return Handler

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
