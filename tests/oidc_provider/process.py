"""Start the test identity provider in its own process and stop it (bounded both ways)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.oidc_provider.people import CLIENT_ID, CLIENT_SECRET

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60  # migrate, seed and runserver on a busy 2-core machine take ~5-10 s
STOP_TIMEOUT_S = 10
REQUEST_TIMEOUT_S = 10


@dataclass
class Provider:
    url: str
    client_id: str = CLIENT_ID
    client_secret: str = CLIENT_SECRET

    @property
    def issuer(self) -> str:
        return f"{self.url}/o"

    def _post(self, path: str, data: dict[str, str]) -> None:
        requests.post(f"{self.url}{path}", data=data, timeout=REQUEST_TIMEOUT_S).raise_for_status()

    def groups_set(self, username: str, groups: list[str]) -> None:
        self._post(f"/testing/groups/{username}", {"groups": ",".join(groups)})

    def tamper(self, mode: str) -> None:
        """Spoil the ID tokens it issues from now on ("" stops): see urls.spoil."""
        self._post("/testing/tamper", {"mode": mode})

    def client_set(self, *, redirect_uris: list[str], post_logout_uris: list[str]) -> None:
        self._post(
            "/testing/client",
            {
                "redirect_uris": " ".join(redirect_uris),
                "post_logout_redirect_uris": " ".join(post_logout_uris),
            },
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@contextmanager
def provider_running(
    folder: Path, *, redirect_uris: list[str], post_logout_uris: list[str]
) -> Iterator[Provider]:
    """The provider on a free loopback port, its database and RSA key in ``folder``."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    port = _free_port()
    provider = Provider(url=f"http://127.0.0.1:{port}")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "OIDC_"))},
        "DJANGO_SETTINGS_MODULE": "tests.oidc_provider.settings",
        "OIDC_PROVIDER_DIR": str(folder),
        "OIDC_PROVIDER_ISSUER": provider.issuer,
        "OIDC_PROVIDER_PORT": str(port),
        "OIDC_PROVIDER_REDIRECT_URIS": " ".join(redirect_uris),
        "OIDC_PROVIDER_POST_LOGOUT_URIS": " ".join(post_logout_uris),
        "PYTHONUNBUFFERED": "1",
    }
    log_path = folder / "provider.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.oidc_provider.serve"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            discovery = f"{provider.issuer}/.well-known/openid-configuration"
            while True:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"the test provider exited ({process.returncode}):\n{_tail(log_path)}"
                    )
                try:
                    if requests.get(discovery, timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the test provider was not up in {START_TIMEOUT_S} s:\n{_tail(log_path)}"
                    )
                time.sleep(0.2)
            yield provider
        finally:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
