"""Razorpay's own Python SDK (razorpay==2.0.1) as a peer of fencehook's `razorpay` scheme.

    razorpay.py verify SECRET SIGNATURE  < body   exit 0 when the SDK's
        razorpay.Utility().verify_webhook_signature(body, SIGNATURE, SECRET) accepts it, 1 when it
        raises SignatureVerificationError
    razorpay.py sign SECRET < body                prints the X-Razorpay-Signature Razorpay sends:
        the rule the SDK verifies (hex HMAC-SHA256 of the body keyed with the secret; the SDK has
        no signing function), checked with the SDK's verifier before it is printed

The body is read as bytes and handed to the SDK as UTF-8 text, as the SDK takes it.
"""

import hashlib
import hmac
import os
import sys

# This file is named like the SDK: its own directory must not shadow the package.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import razorpay  # noqa: E402
from razorpay.errors import SignatureVerificationError  # noqa: E402


def verify(body: str, signature: str, secret: str) -> bool:
    try:
        razorpay.Utility().verify_webhook_signature(body, signature, secret)
        return True
    except SignatureVerificationError:
        return False


def main() -> int:
    command, args = sys.argv[1], sys.argv[2:]
    body = sys.stdin.buffer.read().decode("utf-8")
    if command == "verify":
        secret, signature = args
        ok = verify(body, signature, secret)
        print("verified" if ok else "refused")
        return 0 if ok else 1
    if command == "sign":
        (secret,) = args
        signature = hmac.new(secret.encode("utf-8"), body.encode("utf-8"), hashlib.sha256).hexdigest()
        assert verify(body, signature, secret), "the SDK refuses its own rule's signature"
        print(signature)
        return 0
    print(f"unknown command {command}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
