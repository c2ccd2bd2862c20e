// Signs a test delivery the way each provider's own SDK does, for tests/it/signatures.rs.
// Input (argv[2]): {"scheme", "secret", "body", "timestamp" (Unix seconds), "id"}, or an
// array of them (one process signs them all: loading the SDKs takes most of a run).
// Output: the headers to send, as a JSON object, or an array of them.
//
// Stripe, GitHub, Standard Webhooks and Svix are signed by their SDKs. Paddle's, Linear's
// and Shopify's SDKs only verify: the signature is made as their documentation describes,
// and Paddle's and Linear's are checked with their SDKs before they are used (when
// signed at about now: the SDKs judge the timestamp against the clock). Ed25519 (`v1a`) Standard
// Webhooks signatures are made with Node's crypto over the scheme's signed content.
import crypto from "node:crypto";
import Stripe from "stripe";
import { sign as githubSign } from "@octokit/webhooks-methods";
import { Webhook as StandardWebhook } from "standardwebhooks";
import { Webhook as SvixWebhook } from "svix";
import { Paddle } from "@paddle/paddle-node-sdk";
import { LinearWebhookClient } from "@linear/sdk/webhooks";

async function sign({ scheme, secret, body, timestamp, id }) {
  const when = new Date(timestamp * 1000);
  switch (scheme) {
    case "stripe": {
      const stripe = new Stripe("sk_test_unused");
      return { "stripe-signature": stripe.webhooks.generateTestHeaderString({ payload: body, secret, timestamp }) };
    }
    case "github":
      return { "x-hub-signature-256": await githubSign(secret, body) };
    case "standard_webhooks":
      return {
        "webhook-id": id,
        "webhook-timestamp": String(timestamp),
        "webhook-signature": new StandardWebhook(secret).sign(id, when, body),
      };
    case "svix":
      return {
        "svix-id": id,
        "svix-timestamp": String(timestamp),
        "svix-signature": new SvixWebhook(secret).sign(id, when, body),
      };
    case "standard_webhooks_ed25519": {
      // `secret` is a 32-byte seed in base64; the public key comes back for the proxy.
      const der = Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), Buffer.from(secret, "base64")]);
      const privateKey = crypto.createPrivateKey({ key: der, format: "der", type: "pkcs8" });
      const publicKey = crypto.createPublicKey(privateKey).export({ format: "der", type: "spki" }).subarray(-32);
      const signature = crypto.sign(null, Buffer.from(`${id}.${timestamp}.${body}`), privateKey);
      return {
        "webhook-id": id,
        "webhook-timestamp": String(timestamp),
        "webhook-signature": `v1a,${signature.toString("base64")}`,
        "x-test-public-key": `whpk_${publicKey.toString("base64")}`,
      };
    }
    case "paddle": {
      const h1 = crypto.createHmac("sha256", secret).update(`${timestamp}:${body}`).digest("hex");
      const header = `ts=${timestamp};h1=${h1}`;
      if (Math.abs(Date.now() / 1000 - timestamp) < 5) {
        const valid = await new Paddle("unused").webhooks.isSignatureValid(body, secret, header);
        if (!valid) throw new Error("Paddle's SDK rejects the signature");
      }
      return { "paddle-signature": header };
    }
    case "linear": {
      // The time it was sent is inside the body (`webhookTimestamp`), which the caller writes.
      const signature = crypto.createHmac("sha256", secret).update(body, "utf8").digest("hex");
      if (Math.abs(Date.now() / 1000 - timestamp) < 5) {
        new LinearWebhookClient(secret).verify(Buffer.from(body), signature); // throws if refused
      }
      return { "linear-signature": signature };
    }
    case "shopify":
      return { "x-shopify-hmac-sha256": crypto.createHmac("sha256", secret).update(body, "utf8").digest("base64") };
    default:
      throw new Error(`unknown scheme ${scheme}`);
  }
}

const input = JSON.parse(process.argv[2]);
const requests = Array.isArray(input) ? input : [input];
const signed = [];
for (const request of requests) {
  signed.push(await sign(request));
}
process.stdout.write(JSON.stringify(Array.isArray(input) ? signed : signed[0]));
