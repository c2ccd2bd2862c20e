#!/usr/bin/env python3
"""Writes the sample deliveries of this folder, one per provider preset, each signed with a
test secret by the provider's own SDK (tests/signers: Stripe, GitHub, Standard Webhooks,
Svix, Slack) or the algorithm its documentation publishes (Shopify, Paddle, Twilio,
Linear). With --check, writes nothing and exits 1 if a committed sample differs from what
the signers make now, or if a sample is here that no signer makes (tests/it/dry_run.rs
runs it so). Needs `tests/setup` (the SDKs)."""
import base64
import hashlib
import hmac
import json
import pathlib
import subprocess
import sys
import urllib.parse

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SIGNED_AT = 1796126400  # 2026-12-01T12:00:00Z
SIGNED_AT_TEXT = "2026-12-01T12:00:00Z"


def node_signs(scheme, secret, body, message_id=""):
    request = {"scheme": scheme, "secret": secret, "body": body, "timestamp": SIGNED_AT, "id": message_id}
    out = subprocess.run(["node", str(ROOT / "tests/signers/sign.mjs"), json.dumps(request)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def slack_signs(secret, body):
    request = {"secret": secret, "body": body, "timestamp": SIGNED_AT}
    out = subprocess.run([sys.executable, str(ROOT / "tests/signers/slack_sign.py"), json.dumps(request)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def twilio_signs(token, url, form):
    # Twilio's published algorithm: the full URL, then each parameter's name and value
    # sorted by name, HMAC-SHA1 with the auth token, in base64.
    text = url + "".join(name + value for name, value in sorted(form))
    return base64.b64encode(hmac.new(token.encode(), text.encode(), hashlib.sha1).digest()).decode()


def compact(value):
    return json.dumps(value, separators=(",", ":"))


def message(name, what, uses, secret, method_path, headers, body):
    lines = [f"# {what}", f"# Try it: dedupe-proxy try -c {uses} --sample {name}"]
    if secret:
        lines.append(f"# secret: {secret[0]}={secret[1]}")
    lines.append(f"# signed-at: {SIGNED_AT_TEXT}")
    lines.append(f"{method_path} HTTP/1.1")
    headers = dict(headers)
    headers["Content-Length"] = str(len(body.encode()))
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return "\n".join(lines) + "\n\n" + body + "\n"


def samples():
    made = {}

    secret = "whsec_dedupe_proxy_sample_stripe"
    body = compact({"id": "evt_1QSampleStripe0001", "object": "event", "api_version": "2024-06-20",
                    "created": SIGNED_AT, "type": "payment_intent.succeeded", "livemode": False,
                    "data": {"object": {"id": "pi_3QSample0001", "object": "payment_intent", "amount": 2000,
                                        "currency": "usd", "status": "succeeded"}}})
    made["stripe"] = message("stripe", "Stripe payment_intent.succeeded, signed by stripe-node", "config/stripe.yaml",
                             ("STRIPE_WEBHOOK_SECRET", secret), "POST /webhooks/stripe",
                             [("Host", "hooks.example.com"), ("Content-Type", "application/json; charset=utf-8"),
                              ("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)"),
                              ("Stripe-Signature", node_signs("stripe", secret, body)["stripe-signature"])], body)

    secret = "dedupe-proxy-sample-github"
    body = compact({"action": "opened", "number": 7,
                    "pull_request": {"id": 2100000007, "number": 7, "title": "Add a sample", "state": "open"},
                    "repository": {"id": 900000001, "full_name": "example/shop"},
                    "sender": {"login": "octocat", "id": 583231}})
    made["github"] = message("github", "GitHub pull_request, signed by @octokit/webhooks-methods", "config/github.yaml",
                             ("GITHUB_WEBHOOK_SECRET", secret), "POST /webhooks/github",
                             [("Host", "hooks.example.com"), ("Content-Type", "application/json"),
                              ("User-Agent", "GitHub-Hookshot/1a2b3c4"), ("X-GitHub-Event", "pull_request"),
                              ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
                              ("X-GitHub-Hook-ID", "123456789"),
                              ("X-GitHub-Hook-Installation-Target-Type", "repository"),
                              ("X-GitHub-Hook-Installation-Target-ID", "900000001"),
                              ("X-Hub-Signature-256", node_signs("github", secret, body)["x-hub-signature-256"])], body)

    secret = "dedupe-proxy-sample-shopify"
    body = compact({"id": 820982911946154508, "email": "jon@example.com", "total_price": "19.99",
                    "currency": "USD", "financial_status": "paid"})
    made["shopify"] = message("shopify", "Shopify orders/create, signed as Shopify documents", "config/shopify.yaml",
                              ("SHOPIFY_WEBHOOK_SECRET", secret), "POST /webhooks/shopify/orders-create",
                              [("Host", "hooks.example.com"), ("Content-Type", "application/json"),
                               ("X-Shopify-Topic", "orders/create"), ("X-Shopify-Shop-Domain", "example.myshopify.com"),
                               ("X-Shopify-API-Version", "2025-10"),
                               ("X-Shopify-Webhook-Id", "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"),
                               ("X-Shopify-Event-Id", "98880550-7158-44d4-b7cd-2c97c8a091b5"),
                               ("X-Shopify-Triggered-At", "2026-12-01T12:00:00.000Z"),
                               ("X-Shopify-Hmac-Sha256", node_signs("shopify", secret, body)["x-shopify-hmac-sha256"])],
                              body)

    secret = "dedupe-proxy-sample-slack"
    body = compact({"token": "unused", "team_id": "T0SAMPLE1", "api_app_id": "A0SAMPLE1",
                    "event": {"type": "app_mention", "user": "U0SAMPLE1", "text": "<@U0BOT> hello",
                              "ts": "1796126400.000100", "channel": "C0SAMPLE1"},
                    "type": "event_callback", "event_id": "Ev0SAMPLE0001", "event_time": SIGNED_AT})
    slack = slack_signs(secret, body)
    made["slack"] = message("slack", "Slack event_callback, signed by slack_sdk", "config/slack.yaml",
                            ("SLACK_SIGNING_SECRET", secret), "POST /slack/events",
                            [("Host", "hooks.example.com"), ("Content-Type", "application/json"),
                             ("User-Agent", "Slackbot 1.0 (+https://api.slack.com/robots)"),
                             ("X-Slack-Request-Timestamp", slack["x-slack-request-timestamp"]),
                             ("X-Slack-Signature", slack["x-slack-signature"])], body)

    form = [("AccountSid", "AC00000000000000000000000000000001"), ("Body", "Hello"),
            ("From", "+15005550006"), ("MessageSid", "SM00000000000000000000000000000001"),
            ("To", "+15005550001")]
    body = urllib.parse.urlencode(form)
    signature = twilio_signs("dedupe-proxy-sample-twilio", "https://hooks.example.com/twilio/sms", form)
    made["twilio"] = message("twilio", "Twilio incoming SMS (its signature is the app's to check)", "config/twilio.yaml",
                             None, "POST /twilio/sms",
                             [("Host", "hooks.example.com"), ("Content-Type", "application/x-www-form-urlencoded"),
                              ("User-Agent", "TwilioProxy/1.1"),
                              ("I-Twilio-Idempotency-Token", "e4a3f1c2-0000-4000-8000-000000000001"),
                              ("X-Twilio-Signature", signature)], body)

    secret = "pdl_ntfset_dedupe_proxy_sample"
    body = compact({"event_id": "evt_01jsample0000000000000001", "event_type": "transaction.completed",
                    "occurred_at": SIGNED_AT_TEXT, "notification_id": "ntf_01jsample0000000000000001",
                    "data": {"id": "txn_01jsample0000000000000001", "status": "completed"}})
    made["paddle"] = message("paddle", "Paddle transaction.completed, signed as Paddle documents", "config/paddle.yaml",
                             ("PADDLE_WEBHOOK_SECRET", secret), "POST /webhooks/paddle",
                             [("Host", "hooks.example.com"), ("Content-Type", "application/json"),
                              ("Paddle-Signature", node_signs("paddle", secret, body)["paddle-signature"])], body)

    secret = "whsec_" + base64.b64encode(b"dedupe-proxy sample key!").decode()
    body = compact({"type": "invoice.paid", "timestamp": SIGNED_AT_TEXT,
                    "data": {"invoice_id": "inv_0001", "amount": 4200}})
    signed = node_signs("standard_webhooks", secret, body, "msg_2SampleStandard0001")
    made["standard_webhooks"] = message("standard_webhooks", "Standard Webhooks invoice.paid, signed by the standardwebhooks library",
                                        "config/standard-webhooks.yaml", ("WEBHOOK_SECRET", secret),
                                        "POST /webhooks/events",
                                        [("Host", "hooks.example.com"), ("Content-Type", "application/json"),
                                         ("Webhook-Id", signed["webhook-id"]),
                                         ("Webhook-Timestamp", signed["webhook-timestamp"]),
                                         ("Webhook-Signature", signed["webhook-signature"])], body)

    secret = "lin_wh_dedupe_proxy_sample"
    body = compact({"action": "create", "type": "Issue", "createdAt": SIGNED_AT_TEXT,
                    "organizationId": "0a3c8f6e-5b2d-4f7a-9c1e-000000000001",
                    "url": "https://linear.app/example/issue/ENG-7/add-a-sample",
                    "data": {"id": "2f1c9d3a-7e4b-4c8d-a6f2-000000000007", "identifier": "ENG-7",
                             "title": "Add a sample", "priority": 2},
                    "webhookTimestamp": SIGNED_AT * 1000,
                    "webhookId": "5b7e2a90-1c3d-4e8f-b2a4-000000000001"})
    made["linear"] = message("linear", "Linear Issue create, signed as Linear documents", "config/linear.yaml",
                             ("LINEAR_WEBHOOK_SECRET", secret), "POST /webhooks/linear",
                             [("Host", "hooks.example.com"), ("Content-Type", "application/json; charset=utf-8"),
                              ("User-Agent", "Linear-Webhook"), ("Linear-Event", "Issue"),
                              ("Linear-Delivery", "8a4d5c1e-3f2b-4a9d-8e6c-000000000001"),
                              ("Linear-Signature", node_signs("linear", secret, body)["linear-signature"])], body)

    secret = "whsec_" + base64.b64encode(b"dedupe-proxy svix sample!").decode()
    body = compact({"type": "user.created", "timestamp": SIGNED_AT_TEXT,
                    "data": {"id": "user_29w83sxmDNGwOuEthce5gg56FcC", "object": "user"}})
    signed = node_signs("svix", secret, body, "msg_2SampleSvix00000001")
    made["svix"] = message("svix", "A Svix-sent user.created (as Clerk sends), signed by the svix library",
                           "config/svix.yaml", ("SVIX_WEBHOOK_SECRET", secret), "POST /webhooks/svix",
                           [("Host", "hooks.example.com"), ("Content-Type", "application/json"),
                            ("Svix-Id", signed["svix-id"]), ("Svix-Timestamp", signed["svix-timestamp"]),
                            ("Svix-Signature", signed["svix-signature"])], body)
    return made


def main():
    check = "--check" in sys.argv[1:]
    made = samples()
    # A file no signer makes is stale too.
    differ = sorted(path.name for path in HERE.glob("*.http") if path.stem not in made) if check else []
    for name, text in made.items():
        path = HERE / f"{name}.http"
        if check:
            if not path.exists() or path.read_text() != text:
                differ.append(path.name)
        else:
            path.write_text(text)
    if differ:
        print("differ from what the signers make: " + ", ".join(differ), file=sys.stderr)
        sys.exit(1)


main()
