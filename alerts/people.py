"""The fleet file's ``[[people]]`` (docs/alerts.md, "Owners"): who the user of a workload is
by email, and who gets the weekly digest of their workloads.

```toml
[[people]]
user = "alice"                  # the user name the agents report for a workload
email = "alice@example.com"
digest = true                   # the weekly digest; default true for a listed person

[[people]]
email_domain = "example.com"    # every user not listed above: USER@example.com
digest = false                  # default false: a domain rule mails nobody weekly unasked
```

Applied by ``fleet_apply`` through billing's section hook, like ``[[alerts]]``; the rows are
exactly the file's. Resolution is a pure lookup: a listed user first, else the domain rule
(when ``USER@DOMAIN`` passes ``recipient_error``), else nobody.

``fleet.emails.recipient_error`` is the one rule for every address the product mails: a user
name comes from a workload, which its user chooses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from alerts.models import Person
from alerts.rules import Measurement, RuleConfig
from fleet.emails import recipient_error
from fleet.identifiers import identifier_error
from fleet.services import ApplyResult, FleetFileError
from telemetry.models import Workload

KEYS_PERSON = ("user", "email", "digest")
KEYS_DOMAIN = ("email_domain", "digest")
MAX_PEOPLE = 100_000


def person_parse(row: dict[str, Any], *, where: str) -> Person:
    """One ``[[people]]`` table as an unsaved Person; FleetFileError naming the field."""
    keys = KEYS_DOMAIN if "email_domain" in row else KEYS_PERSON
    unknown = sorted(set(row) - set(keys))
    if unknown:
        kind = "a domain rule" if keys is KEYS_DOMAIN else "a person"
        raise FleetFileError(f"{where}.{unknown[0]}: unknown for {kind} (known: {', '.join(keys)})")
    digest = row.get("digest", keys is KEYS_PERSON)
    if not isinstance(digest, bool):
        raise FleetFileError(f"{where}.digest: true or false")
    if keys is KEYS_DOMAIN:
        domain = row["email_domain"]
        error = (
            "a domain such as example.com"
            if not isinstance(domain, str) or not domain or "@" in domain
            else recipient_error(f"user@{domain}")
        )
        if error is not None:
            raise FleetFileError(f"{where}.email_domain: {error}")
        return Person(email_domain=domain.lower(), digest=digest)
    user = row.get("user")
    error = identifier_error(user, max_length=200) if user is not None else "required"
    if error is not None or not isinstance(user, str):
        raise FleetFileError(f"{where}.user: {error or 'must be a string'}")
    email = row.get("email")
    error = "required" if email is None else None
    if error is None:
        error = "must be a string" if not isinstance(email, str) else recipient_error(email)
    if error is not None or not isinstance(email, str):
        raise FleetFileError(f"{where}.email: {error}")
    return Person(user=user, email=email, digest=digest)


def people_section_apply(*, document: dict[str, Any], result: ApplyResult) -> None:
    """Make the people exactly the file's ``[[people]]`` (idempotent)."""
    rows = document.get("people", [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise FleetFileError("people: must be an array of tables ([[people]])")
    if len(rows) > MAX_PEOPLE:
        raise FleetFileError(f"people: at most {MAX_PEOPLE} entries")
    wanted: list[Person] = []
    users: set[str] = set()
    domains = 0
    for i, row in enumerate(rows):
        person = person_parse(row, where=f"people[{i}]")
        if person.user:
            if person.user in users:
                raise FleetFileError(f"people[{i}].user: {person.user!r} appears twice")
            users.add(person.user)
        else:
            domains += 1
            if domains > 1:
                raise FleetFileError(f"people[{i}].email_domain: only one domain rule")
        person.position = i
        wanted.append(person)
    existing = [
        (p.user, p.email, p.email_domain, p.digest) for p in Person.objects.order_by("position")
    ]
    if existing == [(p.user, p.email, p.email_domain, p.digest) for p in wanted]:
        return
    Person.objects.all().delete()
    Person.objects.bulk_create(wanted)
    result.updated["people"] = len(wanted)


@dataclass(frozen=True)
class Directory:
    """The people as one lookup: user → (email, digest), and the domain rule."""

    listed: dict[str, tuple[str, bool]]
    domain: str = ""
    domain_digest: bool = False

    def email(self, user: str) -> str | None:
        """The address a workload user is told at, or None: a listed user's, else
        ``USER@DOMAIN`` of the domain rule; either only if it passes ``recipient_error``
        (rows applied before the rule was as strict are checked again here)."""
        if not user:
            return None
        if user in self.listed:
            address = self.listed[user][0]
        elif self.domain:
            address = f"{user}@{self.domain}"
        else:
            return None
        return address if recipient_error(address) is None else None

    def digest(self, user: str) -> bool:
        """Whether the user gets the weekly digest (and has an address to get it at)."""
        if user in self.listed:
            return self.listed[user][1]
        return self.domain_digest and self.email(user) is not None


def people_directory() -> Directory:
    listed: dict[str, tuple[str, bool]] = {}
    domain, domain_digest = "", False
    for person in Person.objects.order_by("position"):
        if person.user:
            listed[person.user] = (person.email, person.digest)
        else:
            domain, domain_digest = person.email_domain, person.digest
    return Directory(listed=listed, domain=domain, domain_digest=domain_digest)


def owner_targets(rule: RuleConfig, measurement: Measurement) -> list[str]:
    """``notify = ["owner"]``: the address of the user of the workload a measurement is
    about (``workload:PK``), when the people of the fleet file know one."""
    kind, _, pk = measurement.subject.partition(":")
    if kind != "workload" or not pk.isdigit():
        return []
    user = Workload.objects.filter(pk=int(pk)).values_list("user_name", flat=True).first()
    address = people_directory().email(user or "")
    return [f"mailto:{address}"] if address else []
