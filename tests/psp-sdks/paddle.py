"""Paddle Billing's own SDK (paddle-python-sdk) as a peer of fencehook's `paddle` scheme.

    paddle.py verify HEADER SECRET [SECRET...] < body
        paddle_billing.Notifications.Verifier().verify: the Paddle-Signature HEADER of the raw
        body on stdin, against the secrets (rotation), with the SDK's own timestamp check
        at 60 s rather than its default 5 s: a Python start on a loaded test machine can
        take seconds, and what is checked here is the signature (fencehook's own
        tolerance is 300 s). Exit 0 and "verified", or 1 and "refused".
    paddle.py sign SECRET TS < body
        The SDK has no signer: the signature its rule demands (PaddleSignature.calculate_hmac
        over "{ts}:{body}", hex), printed as a Paddle-Signature header, after checking that the
        SDK's own PaddleSignature.verify accepts it.
"""

import sys

from paddle_billing.Notifications import PaddleSignature, Secret, Verifier


class Request:
    """What the Verifier reads of a request: its headers and raw body."""

    def __init__(self, header: str, body: bytes):
        self.headers = {PaddleSignature().HEADER: header}
        self.body = body


def main() -> int:
    command, args = sys.argv[1], sys.argv[2:]
    body = sys.stdin.buffer.read()
    if command == "verify":
        header, secrets = args[0], [Secret(s) for s in args[1:]]
        try:
            ok = Verifier(maximum_variance=60).verify(Request(header, body), secrets)
        except ConnectionRefusedError:
            ok = False
        print("verified" if ok else "refused")
        return 0 if ok else 1
    if command == "sign":
        secret, ts = args[0], int(args[1])
        h1 = PaddleSignature.calculate_hmac(secret, f"{ts}:".encode() + body).hexdigest()
        header = f"ts={ts};h1={h1}"
        assert PaddleSignature().verify(header, body.decode("utf-8"), Secret(secret))
        print(header)
        return 0
    print(f"unknown command {command}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
