"""The provider's client and people (seeded by serve.py, signed in by the tests)."""

CLIENT_ID = "gpufleet-test"
CLIENT_SECRET = "gpufleet-test-secret-0123456789"
PASSWORD = "idp-Secret-123"
# username → the provider's groups (the `groups` claim)
PEOPLE: dict[str, tuple[str, ...]] = {
    "alice": ("gpu-admins",),
    "frank": ("finops",),
    "vera": (),
    "carl": ("contractors",),
}
