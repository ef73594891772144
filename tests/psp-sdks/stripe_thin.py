"""Stripe's own Python SDK (stripe) as a peer of fencehook's thin-event handling.

    stripe_thin.py fetch API_BASE API_KEY SECRET SIGNATURE < body
        stripe.StripeClient(API_KEY, base_addresses={"api": API_BASE}).parse_event_notification:
        the Stripe-Signature SIGNATURE of the thin event on stdin verified with the endpoint SECRET
        and the event read as the SDK reads thin events, then fetch_related_object(): the object
        the event names, fetched from API_BASE as the SDK fetches it (its related_object.url, in
        the event's context). Prints one JSON object: the event's id and type, the fetched
        object's id and amount_received. Exit 0, or 1 with the SDK's error.
"""

import json
import sys

import stripe


def main() -> int:
    command, args = sys.argv[1], sys.argv[2:]
    if command != "fetch":
        print(f"unknown command {command}", file=sys.stderr)
        return 2
    api_base, api_key, secret, signature = args
    body = sys.stdin.buffer.read()
    client = stripe.StripeClient(api_key, base_addresses={"api": api_base})
    try:
        notification = client.parse_event_notification(body, signature, secret)
        fetched = notification.fetch_related_object()
    except (stripe.SignatureVerificationError, stripe.StripeError, ValueError) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "id": notification.id,
                "type": notification.type,
                "object_id": fetched["id"],
                "amount_received": fetched["amount_received"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
