"""A real OpenID Connect provider for the single sign-on tests: django-oauth-toolkit with OIDC
on, in its own process on loopback with its own SQLite database and an RSA key made per run
(process.py starts it; tests/e2e/test_oidc.py uses it)."""
