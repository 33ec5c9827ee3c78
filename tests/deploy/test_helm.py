"""The Helm chart docker/helm/gpufleet (DESIGN.md §9.6), checked without a cluster.

helm-python-sdk (Helm's own Go library, no helm binary) renders and lints the chart with each
values file of tests/deploy/helm_values/; kubernetes-validate checks every rendered object,
strictly (an unknown field is an error), against the three newest Kubernetes minors it knows;
and the properties the design names are asserted on the rendered objects themselves.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest
import yaml

from tests.conftest import service_missing

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "docker" / "helm" / "gpufleet"
VALUES = Path(__file__).resolve().parent / "helm_values"
GOOD = ("defaults", "production", "everything", "dcgm-unprivileged")
RELEASE, NAMESPACE = "gf", "gpufleet"
SERVER_PODS = ("web", "worker", "beat", "migrate")

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def helm() -> ModuleType:
    try:
        import helm_python
    except (ImportError, OSError):  # OSError: the bundled libhelm_c does not load here
        service_missing("helm-python-sdk (pip install -e '.[dev]')")
    return helm_python


@pytest.fixture(scope="module")
def kube_validate() -> ModuleType:
    try:
        import kubernetes_validate
    except ImportError:
        service_missing("kubernetes-validate (pip install -e '.[dev]')")
    return cast(ModuleType, kubernetes_validate)  # untyped package


def values(name: str) -> Obj:
    loaded: Obj = yaml.safe_load((VALUES / f"{name}.yaml").read_text()) or {}
    return loaded


_rendered: dict[str, list[Obj]] = {}


def render(helm: ModuleType, name: str) -> list[Obj]:
    """The objects the chart renders with one values file (cached: rendering is pure)."""
    if name not in _rendered:
        with helm.Chart.load(CHART) as chart:
            manifests = chart.render(values=values(name), name=RELEASE, namespace=NAMESPACE)
        _rendered[name] = [
            doc
            for path, text in sorted(manifests.items())
            if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text)
            if doc
        ]
    return _rendered[name]


def only(objects: list[Obj], kind: str, component: str) -> Obj:
    found = [
        o
        for o in objects
        if o["kind"] == kind and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    assert len(found) == 1, f"{kind} {component}: {len(found)} rendered"
    return found[0]


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def env_of(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def mounts_of(container: Obj) -> dict[str, Obj]:
    return {m["name"]: m for m in container.get("volumeMounts", [])}


def volumes_of(spec: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in spec.get("volumes", [])}


def newest_minors(kube_validate: ModuleType, count: int = 3) -> list[str]:
    from kubernetes_validate.utils import all_versions, major_minor
    from packaging.version import Version

    minors = sorted({major_minor(v) for v in all_versions()}, key=Version)
    return minors[-count:]


# --- Lint, render, validate ---------------------------------------------------------------


@pytest.mark.parametrize("name", GOOD)
def test_lint_is_clean(helm: ModuleType, name: str) -> None:
    report = helm.lint(CHART, values(name), strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    # Severity 1 is Helm's "info" (e.g. "icon is recommended"); warnings fail with strict.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("name", GOOD)
def test_every_object_validates_strictly_on_the_three_newest_minors(
    helm: ModuleType, kube_validate: ModuleType, name: str
) -> None:
    from packaging.version import Version

    minors = newest_minors(kube_validate)
    # The pin in pyproject.toml (>=1.37): at least the schemas of Kubernetes 1.37.
    assert len(minors) == 3 and Version(minors[-1]) >= Version("1.37"), minors
    objects = render(helm, name)
    assert objects
    for minor in minors:
        for obj in objects:
            # validate() answers the schema version it used: the minor asked for, not an older
            # one it fell back to, and it raises for a kind it has no schema for.
            assert kube_validate.validate(obj, minor, strict=True) == minor


def test_strict_validation_catches_a_misspelled_field(
    helm: ModuleType, kube_validate: ModuleType
) -> None:
    # The control for the test above: a field Kubernetes does not know fails, deep in a pod.
    daemonset = only(render(helm, "defaults"), "DaemonSet", "agent")
    broken = yaml.safe_load(yaml.safe_dump(daemonset))
    broken["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kube_validate.ValidationError):
        kube_validate.validate(broken, newest_minors(kube_validate)[-1], strict=True)


def test_the_schema_refuses_a_misspelled_key(helm: ModuleType) -> None:
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError, match=r"/web.*'replica' not allowed"):
            chart.render(values=values("bad-misspelled-key"), name=RELEASE, namespace=NAMESPACE)
    report = helm.lint(CHART, values("bad-misspelled-key"))
    assert any("replica" in error for error in report["errors"])


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"config": {"log_json": "true"}}, "/config"),  # settings are upper case
        ({"config": {"LOG_JSON": True}}, "/config/LOG_JSON"),  # strings, as the env holds
        ({"config": {"ALLOWED_HOSTS": "*"}}, "/config/ALLOWED_HOSTS"),  # the chart's own
        ({"agent": {"source": "nvidia-smi"}}, "/agent/source"),
        ({"agent": {"interval": 70}}, "/agent/interval"),  # must divide 3600
        ({"agent": {"source": "dcgm"}}, "/agent/dcgmUrl"),
        ({"ingress": {"enabled": True}}, "/ingress/host"),
        ({"web": {"service": {"type": "ExternalName", "port": 8000}}}, "/web/service/type"),
        ({"queueCollector": {"enabled": True, "mode": "squeue"}}, "/queueCollector/cluster"),
        (
            {
                "queueCollector": {
                    "enabled": True,
                    "cluster": "c",
                    "tokenSecret": {"name": "t", "key": "k"},
                }
            },
            "/queueCollector/slurmrestdUrl",
        ),
    ],
)
def test_the_schema_names_the_bad_value(helm: ModuleType, bad: Obj, where: str) -> None:
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError, match=re.escape(f"at '{where}")):
            chart.render(values=bad, name=RELEASE, namespace=NAMESPACE)


# --- Secrets ------------------------------------------------------------------------------


def test_an_inline_secret_is_refused(helm: ModuleType) -> None:
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError, match=r"/config/DATABASE_URL"):
            chart.render(values=values("bad-inline-secret"), name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("name", GOOD)
def test_secrets_are_referenced_never_inlined(helm: ModuleType, name: str) -> None:
    objects = render(helm, name)
    assert "Secret" not in {o["kind"] for o in objects}
    wanted = values(name).get("secrets") or {}
    refs = {
        "DATABASE_URL": wanted.get("databaseUrl", {"name": "gpufleet", "key": "DATABASE_URL"}),
        "REDIS_URL": wanted.get("redisUrl", {"name": "gpufleet", "key": "REDIS_URL"}),
        "SECRET_KEY": wanted.get("secretKey", {"name": "gpufleet", "key": "SECRET_KEY"}),
    }
    refs |= {extra["env"]: extra for extra in wanted.get("extra", [])}
    config = only(objects, "ConfigMap", "config")["data"]
    assert not set(refs) & set(config), "a secret's value in the ConfigMap"
    for component in SERVER_PODS:
        kind = "Job" if component == "migrate" else "Deployment"
        spec = pod_spec(only(objects, kind, component))
        (container,) = spec["containers"]
        # The Job carries the ConfigMap's data as env (a pre-install hook runs before the
        # ConfigMap exists); the others read the ConfigMap itself.
        settings = env_of(container) if component == "migrate" else config
        assert not set(refs) & set(env_of(container))
        mount = mounts_of(container)["secrets"]
        assert mount["readOnly"] is True
        provided = {
            f"{mount['mountPath']}/{item['path']}": (source["secret"]["name"], item["key"])
            for source in volumes_of(spec)["secrets"]["projected"]["sources"]
            for item in source["secret"]["items"]
        }
        # Each NAME_FILE the settings read (config/env.py) is the named Secret's key.
        for env_name, ref in refs.items():
            assert provided[settings[f"{env_name}_FILE"]] == (ref["name"], ref["key"])


def test_the_job_has_the_same_settings_as_the_configmap(helm: ModuleType) -> None:
    objects = render(helm, "everything")
    config = only(objects, "ConfigMap", "config")["data"]
    (container,) = pod_spec(only(objects, "Job", "migrate"))["containers"]
    assert env_of(container) == config
    assert "envFrom" not in container


# --- Web, worker, beat, migrations ----------------------------------------------------------


def compose_command(service: str) -> list[str]:
    compose = yaml.safe_load((ROOT / "docker" / "compose.yml").read_text())
    return [str(part) for part in compose["services"][service]["command"]]


@pytest.mark.parametrize("name", GOOD)
def test_server_pods_run_as_the_image_user_on_a_read_only_root(helm: ModuleType, name: str) -> None:
    objects = render(helm, name)
    for component in SERVER_PODS:
        kind = "Job" if component == "migrate" else "Deployment"
        spec = pod_spec(only(objects, kind, component))
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001  # docker/Dockerfile's gpufleet
        assert spec["automountServiceAccountToken"] is False
        (container,) = spec["containers"]
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        # The places they write: /tmp, and HOME for Chromium's profile (the email's charts).
        assert {"/tmp", "/home/gpufleet"} <= {m["mountPath"] for m in container["volumeMounts"]}
        assert container["resources"]["requests"]["memory"]
        assert container["resources"]["limits"]["memory"]


def test_web_worker_and_beat_run_what_compose_runs(helm: ModuleType) -> None:
    objects = render(helm, "everything")
    web = pod_spec(only(objects, "Deployment", "web"))["containers"][0]
    assert web["command"] == compose_command("web")
    worker = pod_spec(only(objects, "Deployment", "worker"))["containers"][0]
    # compose: --concurrency ${CELERY_CONCURRENCY:-2}; here worker.concurrency (4).
    assert worker["command"][:-1] == compose_command("worker")[:-1]
    assert worker["command"][-2:] == ["--concurrency", "4"]
    beat = pod_spec(only(objects, "Deployment", "beat"))["containers"][0]
    assert beat["command"] == compose_command("beat")
    job = pod_spec(only(objects, "Job", "migrate"))["containers"][0]
    assert job["command"] == ["python", "manage.py", "migrate", "--noinput"]
    config = only(objects, "ConfigMap", "config")["data"]
    assert config["WEB_CONCURRENCY"] == "5"
    assert config["DJANGO_SETTINGS_MODULE"] == "config.settings.production"


def test_exactly_one_beat_and_never_two_during_a_rollout(helm: ModuleType) -> None:
    beat = only(render(helm, "everything"), "Deployment", "beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert only(render(helm, "everything"), "Deployment", "worker")["spec"]["replicas"] == 3


def test_migrations_run_as_a_hook_before_install_and_upgrade(helm: ModuleType) -> None:
    job = only(render(helm, "defaults"), "Job", "migrate")
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    assert pod_spec(job)["restartPolicy"] == "Never"


def test_probes_reach_the_health_endpoints_with_an_allowed_host(helm: ModuleType) -> None:
    from django.urls import resolve

    from config import health

    objects = render(helm, "production")
    web = pod_spec(only(objects, "Deployment", "web"))["containers"][0]
    allowed = only(objects, "ConfigMap", "config")["data"]["ALLOWED_HOSTS"].split(",")
    probes = {kind: web[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe")}
    # Liveness never depends on PostgreSQL or Redis; readiness does (config/health.py).
    assert resolve(probes["livenessProbe"]["path"]).func is health.healthz
    assert resolve(probes["readinessProbe"]["path"]).func is health.readyz
    for probe in probes.values():
        assert probe["port"] == "http"
        (host,) = [h["value"] for h in probe["httpHeaders"] if h["name"] == "Host"]
        assert host in allowed  # Django answers 400 to a Host it does not allow
    assert {"fleet.example.com", "gf-gpufleet-web.gpufleet.svc"} <= set(allowed)
    assert only(objects, "ConfigMap", "config")["data"]["SITE_URL"] == "https://fleet.example.com"


def test_worker_and_beat_health_checks_are_composes(helm: ModuleType) -> None:
    compose = yaml.safe_load((ROOT / "docker" / "compose.yml").read_text())["services"]
    objects = render(helm, "defaults")
    for component in ("worker", "beat"):
        container = pod_spec(only(objects, "Deployment", component))["containers"][0]
        assert ["CMD", *container["livenessProbe"]["exec"]["command"]] == compose[component][
            "healthcheck"
        ]["test"]


def test_the_service_and_ingress_reach_the_web_pods(helm: ModuleType) -> None:
    objects = render(helm, "everything")
    web = only(objects, "Deployment", "web")
    service = only(objects, "Service", "web")
    ingress = only(objects, "Ingress", "web")
    assert (
        service["spec"]["selector"].items() <= web["spec"]["template"]["metadata"]["labels"].items()
    )
    ports = {p["name"]: p["containerPort"] for p in pod_spec(web)["containers"][0]["ports"]}
    assert ports == {"http": 8000}  # docker/gunicorn.conf.py binds 0.0.0.0:8000
    (service_port,) = service["spec"]["ports"]
    assert (service_port["port"], service_port["targetPort"]) == (8080, "http")
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "fleet.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": service["metadata"]["name"], "port": {"name": "http"}}
    assert ingress["spec"]["tls"] == [{"hosts": ["fleet.example.com"], "secretName": "fleet-tls"}]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert not [o for o in render(helm, "defaults") if o["kind"] == "Ingress"]


# --- The agent DaemonSet ------------------------------------------------------------------


def all_containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("name", GOOD)
def test_the_agent_requests_no_gpu(helm: ModuleType, name: str) -> None:
    spec = pod_spec(only(render(helm, name), "DaemonSet", "agent"))
    for container in all_containers(spec):
        resources = container.get("resources", {})
        for section in ("requests", "limits"):
            assert not any("nvidia.com" in r for r in resources.get(section, {}))


def test_the_agent_on_nvml_reads_the_host_read_only(helm: ModuleType) -> None:
    spec = pod_spec(only(render(helm, "defaults"), "DaemonSet", "agent"))
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["hostPID"] is True  # NVML names processes by host PID
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    (agent,) = spec["containers"]
    env, mounts, volumes = env_of(agent), mounts_of(agent), volumes_of(spec)
    # Each host path the agent reads is mounted read-only where its variable points.
    for volume, host_path, variable in (
        ("host-proc", "/proc", "GPUFLEET_PROC_ROOT"),
        ("pod-logs", "/var/log/pods", "GPUFLEET_POD_LOG_ROOT"),
        ("alloc", "/run/gpufleet/alloc", "GPUFLEET_ALLOC_DIR"),
    ):
        assert volumes[volume]["hostPath"]["path"] == host_path
        assert mounts[volume]["readOnly"] is True
        assert env[variable] == mounts[volume]["mountPath"]
    assert volumes["pod-logs"]["hostPath"]["type"] == "Directory"
    # The spool outlives the pod; the only host path it writes.
    assert volumes["spool"]["hostPath"]["path"] == "/var/lib/gpufleet-agent"
    assert env["GPUFLEET_SPOOL"] == mounts["spool"]["mountPath"]
    assert [m for m in agent["volumeMounts"] if not m.get("readOnly")] == [
        mounts["spool"],
        mounts["tmp"],
    ]
    assert env["GPUFLEET_HOSTNAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["GPUFLEET_SERVER"] == "http://gf-gpufleet-web.gpufleet.svc:8000"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    assert volumes["node-tokens"]["secret"]["secretName"] == "gpufleet-node-tokens"


def test_the_agents_server_host_is_allowed(helm: ModuleType) -> None:
    objects = render(helm, "everything")
    (agent,) = pod_spec(only(objects, "DaemonSet", "agent"))["containers"]
    server = env_of(agent)["GPUFLEET_SERVER"]
    assert server == "http://fleet-web.gpufleet.svc:8080"
    allowed = only(objects, "ConfigMap", "config")["data"]["ALLOWED_HOSTS"].split(",")
    assert server.split("//")[1].split(":")[0] in allowed


def test_runtime_class_and_tolerations_are_configurable(helm: ModuleType) -> None:
    spec = pod_spec(only(render(helm, "everything"), "DaemonSet", "agent"))
    assert spec["runtimeClassName"] == "nvidia-cdi"
    assert spec["priorityClassName"] == "system-node-critical"
    assert len(spec["tolerations"]) == 2
    (agent,) = spec["containers"]
    assert env_of(agent)["GPUFLEET_INTERVAL"] == "30"


def test_the_agent_reading_dcgm_needs_none_of_the_host(helm: ModuleType) -> None:
    spec = pod_spec(only(render(helm, "dcgm-unprivileged"), "DaemonSet", "agent"))
    assert "runtimeClassName" not in spec
    assert "hostPID" not in spec
    assert not [v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == "/proc"]
    (agent,) = spec["containers"]
    env = env_of(agent)
    assert env["GPUFLEET_SOURCE"] == "dcgm"
    assert env["GPUFLEET_DCGM_URL"] == "http://dcgm-exporter-local.gpu-operator.svc:9400/metrics"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # An init container gives the root-owned hostPath spool to the agent's user.
    (init,) = spec["initContainers"]
    assert init["command"] == ["chown", "10001:10001", env["GPUFLEET_SPOOL"]]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of a command: $$ is $, $(NAME) a defined variable, else kept."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def test_the_agent_takes_its_nodes_token_from_the_secret(helm: ModuleType, tmp_path: Path) -> None:
    spec = pod_spec(only(render(helm, "defaults"), "DaemonSet", "agent"))
    (agent,) = spec["containers"]
    shell, flag, script = agent["command"]
    assert (shell, flag) == ("sh", "-c")
    env = {k: v for k, v in env_of(agent).items() if isinstance(v, str)}
    script = kubelet_expand(script, env)
    # The token directory as mounted, moved under tmp_path, and an agent that prints what it got.
    tokens_dir = mounts_of(agent)["node-tokens"]["mountPath"]
    script = script.replace(tokens_dir, str(tmp_path / "tokens"))
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / "gpu-node-07").write_text("gfn_token-of-node-07\n")
    (tmp_path / "bin").mkdir()
    fake_agent = tmp_path / "bin" / "gpufleet-agent"
    fake_agent.write_text('#!/bin/sh\necho "token=$GPUFLEET_TOKEN"\n')
    fake_agent.chmod(0o755)

    def run(node: str) -> subprocess.CompletedProcess[str]:
        path = f"{tmp_path / 'bin'}:{os.environ['PATH']}"
        return subprocess.run(
            ["sh", "-c", script],
            env={**env, "GPUFLEET_HOSTNAME": node, "PATH": path},
            capture_output=True,
            text=True,
            timeout=10,
        )

    ok = run("gpu-node-07")
    assert (ok.returncode, ok.stdout) == (0, "token=gfn_token-of-node-07\n")
    missing = run("gpu-node-99")
    assert missing.returncode == 1
    assert "Secret gpufleet-node-tokens has no key gpu-node-99" in missing.stderr


# --- The queue collector ------------------------------------------------------------------


def test_the_queue_collector_is_off_by_default(helm: ModuleType) -> None:
    components = {
        o["metadata"]["labels"]["app.kubernetes.io/component"] for o in render(helm, "defaults")
    }
    assert "queue-collector" not in components


def test_the_queue_collector_asks_slurmrestd_with_its_jwt(helm: ModuleType) -> None:
    collector = only(render(helm, "everything"), "Deployment", "queue-collector")
    spec = pod_spec(collector)
    (container,) = spec["containers"]
    command = container["command"]
    assert command[:5] == ["gpufleet-agent", "--queue", "slurm", "--cluster", "hpc-east"]
    assert command[5:7] == ["--slurmrestd", "http://slurmrestd.slurm.svc:6820"]
    jwt_file = command[command.index("--jwt-file") + 1]
    mount = mounts_of(container)["slurm-jwt"]
    (item,) = volumes_of(spec)["slurm-jwt"]["secret"]["items"]
    assert jwt_file == f"{mount['mountPath']}/{item['path']}"
    assert (volumes_of(spec)["slurm-jwt"]["secret"]["secretName"], item["key"]) == (
        "slurm-jwt",
        "token",
    )
    token = env_of(container)["GPUFLEET_TOKEN"]
    assert token == {"secretKeyRef": {"name": "fleet-queue-token", "key": "token"}}
    assert collector["spec"]["replicas"] == 1


@pytest.mark.parametrize("values", ["everything", "dcgm-unprivileged"])
def test_the_queue_collector_s_command_is_one_the_agent_takes(
    helm: ModuleType, values: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendered command and environment, parsed by the agent's own argument parser: the
    queue mode, its cluster, its source and its spool on the pod's volume."""
    from telemetry.agent.cli import build_parser

    spec = pod_spec(only(render(helm, values), "Deployment", "queue-collector"))
    (container,) = spec["containers"]
    for name, value in env_of(container).items():
        if isinstance(value, str):
            monkeypatch.setenv(name, value)
    args = build_parser().parse_args(container["command"][1:])
    assert (args.queue, args.cluster) == ("slurm", container["command"][4])
    assert args.slurmrestd or args.squeue
    assert args.spool == mounts_of(container)["spool"]["mountPath"]


def test_the_queue_collector_runs_squeue_from_a_mounted_slurm(helm: ModuleType) -> None:
    spec = pod_spec(only(render(helm, "dcgm-unprivileged"), "Deployment", "queue-collector"))
    (container,) = spec["containers"]
    assert container["command"][-2:] == ["--squeue", "/opt/slurm/bin/squeue"]
    assert mounts_of(container)["munge"]["mountPath"] == "/run/munge"
    assert volumes_of(spec)["slurm"]["hostPath"]["path"] == "/opt/slurm"
