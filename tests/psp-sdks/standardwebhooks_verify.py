"""Verifies a downstream call as an order service would, with the Standard Webhooks library
(`standardwebhooks.webhooks.Webhook.verify`). stdin: {"secret", "headers": {name: value},
"body_b64"}. Prints `verified` and exits 0, or prints the library's error and exits 1."""
import base64
import json
import sys

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

call = json.load(sys.stdin)
try:
    Webhook(call["secret"]).verify(base64.b64decode(call["body_b64"]), call["headers"])
except WebhookVerificationError as e:
    print(f"refused: {e}")
    sys.exit(1)
print("verified")
