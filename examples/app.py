"""A stand-in application for the README's walkthrough: prints the work it does, one line
per request (the proxy's Dedupe-Key header), and answers 200, or 201 to a payment
(`/v1/payments`, the README's idempotency-key example).

    python3 examples/app.py [PORT]      # 8080 unless given
"""
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class App(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        print("app did the work for", self.headers.get("dedupe-key"), flush=True)
        paid = self.path.startswith("/v1/payments")
        body = b'{"paid":true}' if paid else b'{"ok":true}'
        self.send_response(201 if paid else 200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
server = HTTPServer(("127.0.0.1", port), App)
print(f"app listening on 127.0.0.1:{port}", flush=True)
server.serve_forever()
