"""Square's own SDK (squareup) as a peer of fencehook's `square` scheme.

    square.py verify SIGNATURE KEY URL < body
        square.utils.webhooks_helper.verify_signature: the x-square-hmacsha256-signature
        SIGNATURE of the raw body on stdin, for the subscription's signature KEY and
        notification URL. Exit 0 and "verified", or 1 and "refused".
    square.py sign KEY URL < body
        The SDK has no signer: the signature its rule demands (base64 HMAC-SHA256 of URL + body,
        as verify_signature computes it), printed after checking that verify_signature accepts it.
"""

import base64
import hashlib
import hmac
import os
import sys

# This file is named square.py too: drop its own directory from the path, or
# `import square` would import this script instead of the SDK.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

from square.utils.webhooks_helper import verify_signature  # noqa: E402


def main() -> int:
    command, args = sys.argv[1], sys.argv[2:]
    body = sys.stdin.buffer.read().decode("utf-8")
    if command == "verify":
        signature, key, url = args
        ok = verify_signature(
            request_body=body, signature_header=signature, signature_key=key, notification_url=url
        )
        print("verified" if ok else "refused")
        return 0 if ok else 1
    if command == "sign":
        key, url = args
        digest = hmac.new(key.encode("utf-8"), (url + body).encode("utf-8"), hashlib.sha256).digest()
        signature = base64.b64encode(digest).decode("ascii")
        assert verify_signature(
            request_body=body, signature_header=signature, signature_key=key, notification_url=url
        )
        print(signature)
        return 0
    print(f"unknown command {command}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
