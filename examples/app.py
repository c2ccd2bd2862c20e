"""A stand-in application for the README's walkthrough: answers every POST with 200
and prints the work it does, one line per event (the proxy's Dedupe-Key header).

    python3 examples/app.py [PORT]      # 8080 unless given
"""
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class App(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        print("app did the work for", self.headers.get("dedupe-key"), flush=True)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"ok":true}')

    def log_message(self, *args):
        pass


port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
HTTPServer(("127.0.0.1", port), App).serve_forever()
