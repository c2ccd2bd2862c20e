"""Signs a test delivery with Slack's own SDK (slack_sdk's SignatureVerifier), for
tests/it/signatures.rs. Input (argv[1]): {"secret", "body", "timestamp"}; output: the
headers to send, as a JSON object."""
import json
import sys

from slack_sdk.signature import SignatureVerifier

request = json.loads(sys.argv[1])
timestamp = str(request["timestamp"])
signature = SignatureVerifier(request["secret"]).generate_signature(timestamp=timestamp, body=request["body"])
print(json.dumps({"x-slack-request-timestamp": timestamp, "x-slack-signature": signature}))
