"""docker/compose.yml, the Dockerfile and the systemd units, checked by reading them.

No Docker engine runs in CI (docker's client only, no daemon), so these tests do what
`docker compose config` and a
first `up` would catch: every service, image, command, env file, volume and health check the
compose file names exists and agrees with the rest (the code, the settings, each other).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yml"
OUR_IMAGE = "gpufleet:latest"
APP_SERVICES = ("init", "web", "worker", "beat")
AGENTS = ("agent", "agent-gpu")

_VAR = re.compile(
    r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])((?:[^{}]|\{[^{}]*\}|\$\{[^{}]*\})*))?\}"
)


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` (nested) and ``$$`` escapes, as compose does."""
    env = env or {}
    text = text.replace("$$", "\0")  # an escaped dollar is never a variable
    previous = None
    while previous != text:
        previous = text
        text = _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(3) or ""), text)
    return text.replace("\0", "$")


def compose_vars(text: str) -> set[str]:
    return set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


def resolved_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: interpolate(str(v)) for k, v in env.items()}


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    if isinstance(command, str):
        return shlex.split(command)
    return [interpolate(str(part)) for part in command or []]


def sh_c_program(service: dict[str, Any]) -> str:
    """The program of a ``sh -c PROGRAM`` command, with compose's ``$$`` turned into ``$``."""
    command = command_of(service)
    assert command[:2] == ["sh", "-c"], command
    return command[2]


def exec_argv(program: str, env: dict[str, str] | None = None) -> list[str]:
    """The argv of the ``exec …`` at the end of a small shell program, with ``$NAME`` and
    ``"$NAME"`` taken from ``env`` (the container's environment)."""
    tail = program.split("exec ", 1)[1]
    argv = shlex.split(tail)
    env = env or {}
    return [
        re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: env.get(m.group(1), m.group(0)), a)
        for a in argv
    ]


def is_ours(service: dict[str, Any]) -> bool:
    return interpolate(str(service.get("image", ""))) == OUR_IMAGE


@pytest.mark.smoke
def test_every_service_exists_with_an_image_that_exists(services: dict[str, Any]) -> None:
    assert set(services) >= {"postgres", "redis", *APP_SERVICES, *AGENTS}
    for name, service in services.items():
        image = interpolate(str(service.get("image", "")))
        assert image, f"{name} names no image"
        if is_ours(service):
            build = service["build"]
            context = (DOCKER / build["context"]).resolve()
            assert context == ROOT, name
            assert (context / build["dockerfile"]).is_file(), name
        else:
            assert re.fullmatch(r"[a-z0-9./-]+:[A-Za-z0-9._-]+", image), f"{name}: pin a tag"
    postgres_major = int(interpolate(services["postgres"]["image"]).split(":")[1].split(".")[0])
    assert postgres_major >= 15  # docs/deploy.md
    assert interpolate(services["redis"]["image"]).startswith("redis:")


def test_commands_name_real_programs_modules_and_files(services: dict[str, Any]) -> None:
    from django.core.management import get_commands

    web = command_of(services["web"])
    assert web[0] == "gunicorn" and web[1] == "config.wsgi:application"
    assert (ROOT / "config" / "wsgi.py").is_file()
    assert (ROOT / web[web.index("--config") + 1]).is_file()

    for name, role in (("worker", "worker"), ("beat", "beat")):
        command = command_of(services[name])
        assert command[:4] == ["celery", "-A", "config", role], name
        assert (ROOT / "config" / "celery.py").is_file()

    init = command_of(services["init"])
    assert init[0] == "sh"
    script = ROOT / init[1]
    assert script.is_file()
    assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
    manage_commands = re.findall(r"python manage\.py ([a-z_]+)", script.read_text())
    assert {"migrate", "issue_node_token"} <= set(manage_commands)
    known = get_commands()
    for command_name in manage_commands:
        assert command_name in known, f"init.sh runs unknown command {command_name}"


def test_agents_run_the_agent_cli_with_flags_it_accepts(services: dict[str, Any]) -> None:
    from telemetry.agent.cli import build_parser
    from telemetry.agent.fake import parse_spec

    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'gpufleet-agent = "telemetry.agent.cli:main"' in pyproject
    parsed = {}
    for name in AGENTS:
        env = {**resolved_env(services[name]), "AGENT_TOKEN": "<token from init>"}
        argv = exec_argv(sh_c_program(services[name]), env)
        assert argv[0] == "gpufleet-agent", name
        # parse_args exits (and fails the test) on a flag the agent does not know.
        parsed[name] = args = build_parser().parse_args(argv[1:])
        assert args.server == "http://web:8000"
        assert args.token == "<token from init>"
        assert 3600 % args.interval == 0
        assert args.spool == "/var/lib/gpufleet/spool"
        assert args.spool in [v.split(":")[1] for v in services[name]["volumes"]]
    assert parse_spec(parsed["agent"].fake)  # the default fake fleet spec is valid
    assert parsed["agent-gpu"].fake is None  # the real NVML


def test_agent_reads_the_token_that_init_writes(services: dict[str, Any]) -> None:
    init_script = (ROOT / "docker" / "init.sh").read_text()
    tokens_dir = re.search(r"^TOKENS_DIR=(\S+)$", init_script, re.M).group(1)  # type: ignore[union-attr]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["init"]["volumes"]}
    volume = mounts[tokens_dir]
    for name in AGENTS:
        program = sh_c_program(services[name])
        assert "$(cat " in program and "/var/lib/gpufleet/agent-tokens/" in program
        assert tokens_dir == "/var/lib/gpufleet/agent-tokens"
        agent_mounts = {v.split(":")[1]: v.split(":")[0] for v in services[name]["volumes"]}
        assert agent_mounts[tokens_dir] == volume, f"{name} must share init's token volume"
    # The simulated agent's token file is one that init issues by default.
    hostnames = resolved_env(services["init"])["AGENT_HOSTNAMES"].split(",")
    assert "sim-01" in hostnames and "/agent-tokens/sim-01" in sh_c_program(services["agent"])


def test_agents_reach_web_on_its_port_and_name(services: dict[str, Any]) -> None:
    assert "8000" in [str(p) for p in services["web"]["expose"]]
    allowed = resolved_env(services["web"])["ALLOWED_HOSTS"].split(",")
    # Agents post with Host: web:8000; the health check asks 127.0.0.1:8000.
    assert "web" in allowed and "127.0.0.1" in allowed
    assert "localhost" in allowed  # SITE_ADDRESS's default, served by the proxy


def test_environment_points_at_the_services(services: dict[str, Any]) -> None:
    pg_env = resolved_env(services["postgres"])
    for name in APP_SERVICES:
        env = resolved_env(services[name])
        assert env["DJANGO_SETTINGS_MODULE"] == "config.settings.production", name
        url = env["DATABASE_URL"]
        match = re.fullmatch(r"postgres://([^:]+):([^@]+)@([^:/]+):5432/(\w+)", url)
        assert match, url
        user, password, host, db = match.groups()
        assert (user, password, db) == (
            pg_env["POSTGRES_USER"],
            pg_env["POSTGRES_PASSWORD"],
            pg_env["POSTGRES_DB"],
        )
        assert host == "postgres" and host in services
        redis_host = re.fullmatch(r"redis://([^:/]+):6379/\d+", env["REDIS_URL"]).group(1)  # type: ignore[union-attr]
        assert redis_host == "redis" and redis_host in services
        # The secret key file lies in a volume this service mounts (init writes it there).
        key_dir = os.path.dirname(env["SECRET_KEY_FILE"])
        assert key_dir in [v.split(":")[1] for v in services[name]["volumes"]], name
        assert env["NUM_PROXIES"] == "1"
    init_script = (ROOT / "docker" / "init.sh").read_text()
    assert "SECRETS_DIR=/var/lib/gpufleet/secrets" in init_script


def test_env_files_and_volumes_exist(compose: dict[str, Any], services: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    used: set[str] = set()
    for name, service in services.items():
        for entry in service.get("env_file") or []:
            path = entry if isinstance(entry, str) else entry["path"]
            required = True if isinstance(entry, str) else entry.get("required", True)
            if required:
                assert (DOCKER / path).is_file(), f"{name}: env file {path}"
            else:  # optional: the operator's copy of the documented example
                assert (DOCKER / (path + ".example")).is_file(), f"{name}: {path}.example"
        for volume in service.get("volumes") or []:
            source, target = volume.split(":")[:2]
            assert target.startswith("/"), volume
            if source.startswith((".", "/")):
                assert (DOCKER / source).exists(), f"{name}: bind mount {source}"
            else:
                assert source in declared, f"{name}: volume {source} not declared"
                used.add(source)
    assert declared == used, f"declared but unused: {declared - used}"


def test_health_checks_and_depends_on_conditions(services: dict[str, Any]) -> None:
    one_shot = {n for n, s in services.items() if s.get("restart") == "no"}
    assert one_shot == {"init"}
    for name, service in services.items():
        if name in one_shot or name in AGENTS:
            continue
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL"), name
        if is_ours(service):
            assert test[1:3] == ["python", "docker/healthcheck.py"], name
            assert (ROOT / test[2]).is_file()
            assert test[3] in ("http", "worker", "beat")
    conditions: dict[str, Callable[[dict[str, Any]], bool]] = {
        "service_healthy": lambda s: "healthcheck" in s,
        "service_completed_successfully": lambda s: s.get("restart") == "no",
        "service_started": lambda s: True,
    }
    for name, service in services.items():
        for target, spec in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on missing {target}"
            assert conditions[spec["condition"]](services[target]), f"{name} → {target}"
    for name in ("web", "worker", "beat"):
        depends = services[name]["depends_on"]
        assert depends["init"]["condition"] == "service_completed_successfully"
        assert depends["postgres"]["condition"] == "service_healthy"
        assert depends["redis"]["condition"] == "service_healthy"
    for name in AGENTS:
        assert services[name]["depends_on"]["web"]["condition"] == "service_healthy"
    # No cycles: a topological order exists.
    remaining = {n: set(s.get("depends_on") or {}) for n, s in services.items()}
    while remaining:
        ready = [n for n, deps in remaining.items() if not deps & set(remaining)]
        assert ready, f"depends_on cycle among {sorted(remaining)}"
        for n in ready:
            del remaining[n]
    # The web health check asks a path that production does not redirect to HTTPS.
    production = (ROOT / "config" / "settings" / "production.py").read_text()
    assert 'r"^healthz$"' in production and 'r"^api/v1/ingest$"' in production


def test_exactly_one_beat(services: dict[str, Any]) -> None:
    beats = [
        n for n, s in services.items() if command_of(s)[:4] == ["celery", "-A", "config", "beat"]
    ]
    assert beats == ["beat"]
    beat = services["beat"]
    assert beat["deploy"]["replicas"] == 1
    assert "scale" not in beat
    schedule = command_of(beat)[command_of(beat).index("--schedule") + 1]
    mounts = [v.split(":")[1] for v in beat["volumes"]]
    assert os.path.dirname(schedule) in mounts  # survives a restart, writable
    assert beat["healthcheck"]["test"][4] == schedule


def test_gpu_agent_uses_the_nvidia_runtime_only_on_request(services: dict[str, Any]) -> None:
    gpu = services["agent-gpu"]
    assert gpu["profiles"] == ["gpu"]  # not started by a plain `up`
    assert gpu["runtime"] == "nvidia"
    env = resolved_env(gpu)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]
    assert "--fake" not in sh_c_program(gpu)
    assert "profiles" not in services["agent"]


def test_every_compose_variable_is_documented() -> None:
    example = (DOCKER / ".env.example").read_text()
    texts = [COMPOSE.read_text(), (DOCKER / "init.sh").read_text()]
    names = set().union(*(compose_vars(t) for t in texts))
    names |= set(
        re.findall(r'os\.environ\.get\("([A-Z_]+)"', (DOCKER / "gunicorn.conf.py").read_text())
    )
    missing = sorted(n for n in names if not re.search(rf"^#? ?{n}=", example, re.M))
    assert not missing, f"not in docker/.env.example: {missing}"


def test_interpolation_follows_compose_rules() -> None:
    # The helper above must get nesting right, or the tests using it prove nothing.
    assert interpolate("${A:-x}") == "x"
    assert interpolate("${A:-${B:-y},z}") == "y,z"
    assert interpolate("${A:-${B:-y},z}", {"B": "b"}) == "b,z"
    assert interpolate("${A:-${B:-y}}", {"A": "a"}) == "a"
    assert interpolate("$${X}") == "${X}"


def dockerfile_stages(text: str) -> list[tuple[str, str]]:
    """(base image, stage name) per FROM line, with the ARG defaults substituted."""
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    stages = []
    for base, name in re.findall(r"^FROM (\S+)(?: AS (\w+))?$", text, re.M):
        stages.append((re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base), name))
    return stages


def test_dockerfile_is_multi_stage_non_root_and_collects_static() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    stages = dockerfile_stages(text)
    assert len(stages) >= 2 and all(name for _, name in stages)
    assert all(base.startswith("python:3.11") for base, _ in stages)  # the pinned Python
    names = {name for _, name in stages}
    for source in re.findall(r"^COPY --from=(\w+)", text, re.M):
        assert source in names
    final = text.split(f"AS {stages[-1][1]}", 1)[1]
    users = re.findall(r"^USER (\S+)$", final, re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.search(r"manage\.py collectstatic --noinput", text)
    assert "collectstatic" not in final  # collected at build, in the build stage
    assert "DJANGO_SETTINGS_MODULE=config.settings.production" in final
    cmd = re.search(r"^CMD (\[.*\])$", final, re.M).group(1)  # type: ignore[union-attr]
    assert "docker/gunicorn.conf.py" in cmd and (DOCKER / "gunicorn.conf.py").is_file()
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv", "docker/.env"} <= set(ignore)


def test_systemd_units_run_what_the_repository_has() -> None:
    units = {p.stem: p.read_text() for p in (DOCKER / "systemd").glob("*.service")}
    assert set(units) == {"gpufleet-web", "gpufleet-worker", "gpufleet-beat"}
    for name, text in units.items():
        assert "User=gpufleet" in text and "NoNewPrivileges=true" in text, name
        assert "Environment=DJANGO_SETTINGS_MODULE=config.settings.production" in text
        exec_start = re.search(r"^ExecStart=(.*)$", text, re.M).group(1).split()  # type: ignore[union-attr]
        assert exec_start[0].startswith("/opt/gpufleet/.venv/bin/")
        for arg in exec_start:
            if arg.startswith("/opt/gpufleet/") and "/.venv/" not in arg:
                assert (ROOT / arg.removeprefix("/opt/gpufleet/")).is_file(), arg
    assert " beat " in units["gpufleet-beat"] and "exactly one" in units["gpufleet-beat"].lower()
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    assert "docs/gpufleet-agent.service" in deploy
    for unit in units:
        assert f"{unit}.service" in deploy


def test_deploy_doc_covers_what_operators_need() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text().lower()
    for topic in (
        "docker compose",
        "systemd",
        "tls",
        "backup",
        "upgrade",
        "migrat",
        "sizing",
        "partition",
        "citus",
        "create_distributed_table",
        "/healthz",
        "/readyz",
        "/metrics",
        "database_replica_url",
        "request_id",
        "node",
    ):
        assert topic in text, topic
