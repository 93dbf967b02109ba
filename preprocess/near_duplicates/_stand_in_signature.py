"""A stand-in for signature.py (branch i24-signature) until it lands: the two names grouping needs."""

SIGNATURE_BITS = 64


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()
