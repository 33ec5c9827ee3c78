"""Which addresses the product may send email to: one rule for every email it sends (alert
notices, owner notices, digests, the weekly report), whoever chose the address.

A user name comes from a workload, which its user chooses, and a valid RFC 5321 address still
relays elsewhere (``evil%attacker.example@example.com``, ``"a@b"@example.com``,
``a!b@example.com``), so only a plain local part and a plain host name are accepted.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.core.validators import validate_email

# A plain local part: letters, digits, '.', '_', '-' (no quotes, '%', '!', '+', '@' or ',':
# what a mail server may route elsewhere or read as a second address); dots only between.
_LOCAL_PART = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*", re.ASCII)
# A plain host name of at least two labels (no address literal such as [127.0.0.1]).
_DOMAIN = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z][A-Za-z0-9-]{0,61}", re.ASCII
)
MAX_LOCAL_PART = 64  # RFC 5321
MAX_ADDRESS = 254


def recipient_error(address: object) -> str | None:
    """What keeps ``address`` from being one recipient the product may mail, or None.

    The one rule for every email the product sends (owner notices, digests, ``mailto:``
    targets, listed people): exactly one address ``LOCAL@DOMAIN`` whose local part is
    letters, digits, ``.``, ``_`` and ``-`` and whose domain is a plain host name."""
    if not isinstance(address, str) or address.count("@") != 1:
        return f"not an email address, or more than one: {address!r}"
    local, _, domain = address.partition("@")
    if len(address) > MAX_ADDRESS or len(local) > MAX_LOCAL_PART:
        return f"longer than an email address may be: {address!r}"
    if not _LOCAL_PART.fullmatch(local):
        return f"only letters, digits, '.', '_' and '-' before the @: {address!r}"
    if not _DOMAIN.fullmatch(domain):
        return f"a host name such as example.com after the @: {address!r}"
    try:  # Django's checks besides (label lengths)
        validate_email(address)
    except ValidationError:
        return f"not an email address: {address!r}"
    return None
