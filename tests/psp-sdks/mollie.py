"""Mollie's own Python client (mollie-api-python) as a reader of the mock Mollie API the
`psp_mollie` tests serve: what fencehook books from a payment, Mollie's client must read the
same way, or the mock is not Mollie's API.

    mollie.py read API_URL API_KEY PAYMENT_ID
        mollie.api.client.Client (set_api_endpoint, set_api_key: which refuses a key that is not
        live_… or test_…) fetches the payment (client.payments.get) and its refunds
        (payment.refunds.list()), and prints one JSON object: the payment's id, status, is_paid(),
        amount, and each refund's id, status and amount. Exit 0, or 1 with the client's error.
"""

import json
import os
import sys

# This file is named mollie.py too: drop its own directory from the path, or
# `import mollie` would import this script instead of the client.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

from mollie.api.client import Client  # noqa: E402
from mollie.api.error import Error  # noqa: E402


def main() -> int:
    command, args = sys.argv[1], sys.argv[2:]
    if command != "read":
        print(f"unknown command {command}", file=sys.stderr)
        return 2
    api_url, api_key, payment_id = args
    client = Client()
    client.set_api_endpoint(api_url)
    try:
        client.set_api_key(api_key)
        payment = client.payments.get(payment_id)
        refunds = [
            {"id": r.id, "status": r.status, "amount": r.amount} for r in payment.refunds.list()
        ]
    except Error as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "id": payment.id,
                "status": payment.status,
                "is_paid": payment.is_paid(),
                "amount": payment.amount,
                "refunds": refunds,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
