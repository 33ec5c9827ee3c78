"""Bearer tokens: prefixed, random, shown once, stored as a prefix plus a SHA-256 hash.

A token looks like ``gfn_1a2b3c4d_<43 url-safe characters>`` (node) or ``gfa_…`` (API). The
prefix finds the row; the hash of the whole token, compared in constant time, checks it. The
secret part carries 256 bits, so a fast hash is safe (no password stretching needed).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.conf import settings

NODE_KIND = "gfn"
API_KIND = "gfa"


def token_hash(token: str) -> str:
    return hmac.new(settings.TOKEN_PEPPER.encode(), token.encode(), hashlib.sha256).hexdigest()


def token_generate(kind: str) -> tuple[str, str]:
    """A new (token, prefix) pair; the prefix is what listings and ``revoke_token`` show."""
    prefix = f"{kind}_{secrets.token_hex(4)}"
    return f"{prefix}_{secrets.token_urlsafe(32)}", prefix


def token_prefix(token: str) -> str | None:
    """The prefix of a well-formed token, else None."""
    parts = token.split("_")
    if len(parts) < 3 or parts[0] not in (NODE_KIND, API_KIND) or len(parts[1]) != 8:
        return None
    return f"{parts[0]}_{parts[1]}"


def token_matches(token: str, stored_hash: str) -> bool:
    return hmac.compare_digest(token_hash(token), stored_hash)
