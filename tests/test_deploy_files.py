"""The reference deployment's files, checked offline: the Kubernetes manifest against the
Kubernetes schemas (kubernetes-validate, marked `deploy`: CI installs it) and, always,
against what TinyLoop itself accepts (its command line, its settings, its ports and
probe); the systemd unit and the nginx upstream agree on the replicas' ports.
(tests/test_deploy_e2e.py runs the nginx file and the probe against real processes.)"""
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from asgi.settings import Settings
from tinyloop.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
MANIFEST = DEPLOY / "kubernetes" / "tinyloop.yaml"
UNIT = DEPLOY / "systemd" / "tinyloop@.service"
NGINX = DEPLOY / "nginx" / "tinyloop.conf"
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")     # the oldest release still commonly run, and the newest known


def documents():
    with MANIFEST.open() as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}


def container():
    (only,) = documents()["Deployment"]["spec"]["template"]["spec"]["containers"]
    return only


def serve_args(command: list[str]):
    assert command[:2] == ["tinyloop", "serve"], command
    return build_parser().parse_args(command[1:])


def test_the_manifest_is_a_deployment_and_a_service_whose_selectors_meet():
    docs = documents()
    assert set(docs) == {"Deployment", "Service"}
    deployment, service = docs["Deployment"], docs["Service"]
    assert deployment["apiVersion"] == "apps/v1" and service["apiVersion"] == "v1"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert isinstance(deployment["spec"]["replicas"], int) and deployment["spec"]["replicas"] >= 1


def test_one_gpu_per_pod_and_the_ports_agree_from_the_command_to_the_service():
    spec = container()
    gpus = {spec["resources"][kind].get("nvidia.com/gpu") for kind in ("requests", "limits")}
    assert gpus == {1}, "one replica per GPU: each pod asks for exactly one"
    args = serve_args(spec["command"])
    assert args.host == "0.0.0.0" and args.device == "cuda"
    (port,) = spec["ports"]
    assert port["containerPort"] == args.port and port["protocol"] == "TCP"
    (service_port,) = documents()["Service"]["spec"]["ports"]
    assert service_port["targetPort"] in (port["name"], port["containerPort"])
    assert spec["livenessProbe"]["tcpSocket"]["port"] in (port["name"], port["containerPort"])


def test_the_readiness_probe_asks_health_on_the_served_port_with_the_key_from_the_secret():
    spec = container()
    env = {e["name"]: e for e in spec["env"]}
    assert env["TINYLOOP_API_KEY"]["valueFrom"]["secretKeyRef"]["key"]
    command = spec["readinessProbe"]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    source = command[2]
    compile(source, "readinessProbe", "exec")
    port = serve_args(spec["command"]).port
    assert f"'http://127.0.0.1:{port}/health'" in source
    assert "'Bearer ' + os.environ['TINYLOOP_API_KEY']" in source
    assert spec["readinessProbe"]["timeoutSeconds"] > 3        # longer than the request's own timeout


def test_the_settings_in_the_manifest_are_ones_the_server_accepts(monkeypatch):
    spec = container()
    for name in [k for k in os.environ if k.startswith("TINYLOOP_")]:
        monkeypatch.delenv(name)
    for entry in spec["env"]:
        monkeypatch.setenv(entry["name"], entry.get("value", "secret-from-kubernetes"))
    settings = Settings.from_env()                 # raises on a value it does not accept
    assert settings.api_key == "secret-from-kubernetes" and settings.exit_on_failure
    grace = documents()["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    pause = int(spec["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert grace > pause + settings.drain_timeout_s + 10, "the kubelet would kill the drain short"


def test_the_systemd_unit_serves_gpu_i_on_the_ports_nginx_lists():
    unit = UNIT.read_text()
    (exec_start,) = re.findall(r"^ExecStart=(.*)$", unit, re.MULTILINE)
    shell = shlex.split(exec_start)
    assert shell[:2] == ["/bin/sh", "-c"]
    nginx_ports = [int(p) for p in re.findall(r"^\s*server 127\.0\.0\.1:(\d+) ", NGINX.read_text(), re.MULTILINE)]
    for gpu in range(len(nginx_ports)):
        line = re.sub(r"\$\(\((\d+) \+ (\d+)\)\)", lambda m: str(int(m[1]) + int(m[2])),   # $((8100 + i))
                      shell[2].replace("%i", str(gpu)))
        command = shlex.split(line)
        assert command[0] == "exec" and command[1].endswith("/tinyloop")
        args = build_parser().parse_args(command[2:])
        assert args.host == "127.0.0.1" and args.port == nginx_ports[gpu]
    assert "Environment=CUDA_VISIBLE_DEVICES=%i" in unit
    drain = float(re.search(r"^Environment=TINYLOOP_DRAIN_TIMEOUT=(\S+)$", unit, re.MULTILINE).group(1))
    stop = float(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.MULTILINE).group(1))
    assert stop > drain + 10 and "KillMode=mixed" in unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path):
    (tmp_path / UNIT.name).write_text(UNIT.read_text())
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", "tinyloop@0.service"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=False)
    # It reports what it ignores (unknown keys, bad values) on stderr and still exits 0.
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


@pytest.mark.deploy
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_manifest_passes_the_kubernetes_schemas(version):
    try:
        import kubernetes_validate
    except ImportError:
        if IN_CI:
            pytest.fail("kubernetes-validate is not installed, and in CI this check must run")
        pytest.skip("pip install kubernetes-validate (kubectl --dry-run=client needs a cluster)")
    for document in documents().values():
        kubernetes_validate.validate(document, version, strict=True)     # raises ValidationError
