"""Where notices go: the ``notify`` entries of a rule.

An entry is ``mailto:ADDRESS`` (one plain address, ``fleet.emails.recipient_error``) or an
``http://``/``https://`` URL (a webhook; a link-local, metadata, loopback or private address
is refused as ``alerts.egress`` says). Each is checked when the fleet file is applied and
stored as written; a delivery copies its target from the rule, so nothing an evaluation reads
(a GPU's name, a pool's) can add or change an address.

Symbolic entries (``owner``, for workload rules) are resolved per subject by a function
registered in ``SYMBOLS``; a rule kind lists the symbols it accepts (``RuleKind.symbols``).
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from alerts.egress import host_error
from alerts.rules import Measurement, RuleConfig
from fleet.emails import recipient_error

EMAIL = "email"
WEBHOOK = "webhook"
MAX_TARGETS = 20
MAX_URL_LENGTH = 2000

# symbol → the concrete targets (mailto:…) for one measurement of one rule.
SymbolResolver = Callable[[RuleConfig, Measurement], list[str]]
SYMBOLS: dict[str, SymbolResolver] = {}


def target_channel(target: str) -> str:
    """``email`` or ``webhook`` for a target that ``target_error`` accepted."""
    return EMAIL if target.startswith("mailto:") else WEBHOOK


def target_error(target: object) -> str | None:
    """What is wrong with one concrete ``notify`` entry, or None."""
    if not isinstance(target, str) or not target:
        return "expected mailto:ADDRESS or an http(s):// URL"
    if len(target) > MAX_URL_LENGTH:
        return f"longer than {MAX_URL_LENGTH} characters"
    if any(c.isspace() or not c.isprintable() for c in target):
        return "no spaces or control characters"
    if target.startswith("mailto:"):
        # One plain address (the product's one recipient rule): no second recipient, no
        # ?cc= or ?body= of a mailto URL, nothing a mail server routes elsewhere.
        error = recipient_error(target[len("mailto:") :])
        return None if error is None else f"mailto: takes one plain address; {error}"
    try:
        parts = urlsplit(target)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "expected mailto:ADDRESS or an http(s):// URL"
    if not parts.hostname:
        return "a webhook URL needs a host"
    if parts.fragment:
        return "a webhook URL has no #fragment"
    # An address literal is checked now; a name on what it resolves to, when sent.
    return host_error(parts.hostname)


def target_display(target: str) -> str:
    """A target as pages and the API show it: the address of an email; only the scheme and
    host of a webhook, whose path often is its secret (Slack's, for one)."""
    if target.startswith("mailto:"):
        return target[len("mailto:") :]
    if target in SYMBOLS:
        return target
    parts = urlsplit(target)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}/…"


def targets_for(rule: RuleConfig, measurement: Measurement) -> list[str]:
    """The concrete targets of one notice: the rule's (checked when the file was applied),
    with symbols resolved for the subject (what a resolver returns is checked here, and
    what fails is dropped), each once, in the rule's order."""
    out: list[str] = []
    for entry in rule.notify:
        if entry not in SYMBOLS:
            if entry not in out:
                out.append(entry)
            continue
        for target in SYMBOLS[entry](rule, measurement):
            if target not in out and target_error(target) is None:
                out.append(target)
    return out
