"""A client of an API behind the `idempotency_key` preset, as a user would write it with
`requests`: the same POST twice, with another body, path or query, from another client,
with no key, an unquoted key, and two at once. Prints what it saw as JSON for tests/it/idempotency_key.rs to judge."""

import json
import sys
import threading

import requests

base = sys.argv[1]
seen = {}


def observe(name, response):
    content_type = response.headers.get("content-type", "")
    seen[name] = {
        "status": response.status_code,
        "content_type": content_type,
        "replayed": response.headers.get("idempotent-replayed"),
        "dedupe": response.headers.get("dedupe-status"),
        "location": response.headers.get("location"),
        "json": response.json() if "json" in content_type else None,
    }


def post(path, key, body, client="alice"):
    headers = {"Authorization": f"Bearer {client}-token"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return requests.post(base + path, json=body, headers=headers, timeout=10)


observe("first", post("/orders", '"order-1"', {"amount": 10}))
observe("again", post("/orders", '"order-1"', {"amount": 10}))
observe("other_body", post("/orders", '"order-1"', {"amount": 11}))
observe("other_path", post("/orders/rush", '"order-1"', {"amount": 10}))
observe("other_query", post("/orders?dry_run=1", '"order-1"', {"amount": 10}))
# Another client with the same key: its own request, never the first client's answer.
observe("other_client", post("/orders", '"order-1"', {"amount": 10}, client="mallory"))
observe("no_key", post("/orders", None, {"amount": 10}))
observe("unquoted", post("/orders", "order-1", {"amount": 10}))

together = []
threads = [
    threading.Thread(target=lambda: together.append(post("/orders", '"order-2"', {"amount": 5})))
    for _ in range(2)
]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for index, response in enumerate(sorted(together, key=lambda r: r.status_code)):
    observe(f"together_{index}", response)

print(json.dumps(seen))
