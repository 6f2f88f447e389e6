"""The Kubernetes deployment (deploy/kubernetes/): no cluster here, so this checks what can be
checked without one: the files parse, and the settings that matter agree with the course."""

from __future__ import annotations

import re

import yaml

from conftest import REPO
from multigpu.grading import rules
from multigpu.workshop import layout

K8S = REPO / "deploy" / "kubernetes"


def _pins() -> dict[str, str]:
    pyproject = (REPO / "pyproject.toml").read_text()
    install = (REPO / "deploy" / "hub" / "install.sh").read_text()
    return {"torch": re.search(r'"torch==([^"]+)"', pyproject).group(1),
            "jupyterhub": re.search(r"JUPYTERHUB_VERSION=(\S+)", install).group(1)}


def test_values_give_each_learner_one_gpu_per_worker_on_the_gpu_pool():
    values = yaml.safe_load((K8S / "values.yaml").read_text())
    user = values["singleuser"]
    assert user["extraResource"]["limits"]["nvidia.com/gpu"] == str(rules.WORKERS)
    assert user["extraResource"]["guarantees"]["nvidia.com/gpu"] == str(rules.WORKERS)
    assert user["nodeSelector"] == {"multigpu/pool": "gpu"}
    assert user["cmd"] == "jupyterhub-singleuser" and user["uid"] != 0
    assert user["extraEnv"]["JUPYTER_CONFIG_PATH"].split(":")[-1].endswith("jupyter/learner")
    mounts = {m["name"]: m["mountPath"] for m in user["storage"]["extraVolumeMounts"]}
    hub = layout.Hub(__import__("pathlib").Path(user["extraEnv"]["MULTIGPU_HUB_ROOT"]))
    assert mounts["exchange"] == str(hub.exchange) and mounts["learner-config"] == str(hub.learner_config)
    assert values["hub"]["config"]["JupyterHub"]["authenticator_class"] == "native"
    assert values["hub"]["config"]["NativeAuthenticator"]["open_signup"] is False


def test_grading_runs_alone_on_its_own_pool_and_the_hub_knows_it():
    values = yaml.safe_load((K8S / "values.yaml").read_text())
    docs = {d["kind"] + "/" + d["metadata"]["name"]: d for d in yaml.safe_load_all((K8S / "grading.yaml").read_text())}
    deploy = docs["Deployment/multigpu-grading"]["spec"]
    assert deploy["replicas"] == 1 and deploy["strategy"]["type"] == "Recreate", "one grading at a time"
    pod = deploy["template"]["spec"]
    assert pod["nodeSelector"] == {"multigpu/pool": "grading"} != values["singleuser"]["nodeSelector"]
    (box,) = pod["containers"]
    assert box["command"][-1] == "multigpu.workshop.service"
    env = {e["name"]: e.get("value") for e in box["env"]}
    assert env["MULTIGPU_GRADING_PROFILE"] in rules.PROFILES and env["MULTIGPU_GRADING_PROFILE"] != "quick"
    assert box["resources"]["limits"]["nvidia.com/gpu"] == str(rules.WORKERS)
    service = values["hub"]["services"]["grading"]
    port = docs["Service/multigpu-grading"]["spec"]["ports"][0]["port"]
    assert service["url"] == f"http://multigpu-grading:{port}" and box["ports"][0]["containerPort"] == port
    assert docs["PersistentVolumeClaim/multigpu-exchange"]["spec"]["accessModes"] == ["ReadWriteMany"]
    config = docs["ConfigMap/multigpu-learner-config"]["data"]["nbgrader_config.py"]
    assert f'"{layout.COURSE_ID}"' in config and '"/srv/multigpu/exchange"' in config
    assert "access:services!service=grading" in values["hub"]["loadRoles"]["user"]["scopes"]


def test_the_image_installs_the_course_with_its_pins():
    text = (K8S / "Dockerfile").read_text()
    pins = _pins()
    assert f'"torch=={pins["torch"]}"' in text and f'"jupyterhub=={pins["jupyterhub"]}"' in text
    assert "tools/install_horovod.sh" in text, "Horovod is built with the project's patch, as make setup does"
    assert re.search(r"^USER 1000$", text, re.M) and 'CMD ["jupyterhub-singleuser"]' in text
    values = yaml.safe_load((K8S / "values.yaml").read_text())
    image = values["singleuser"]["image"]
    assert f"{image['name']}:{image['tag']}" in text
    assert f"{image['name']}:{image['tag']}" in (K8S / "grading.yaml").read_text()
    copied = re.findall(r"^COPY (.+) /opt/course/", text, re.M)
    for part in " ".join(copied).split():
        assert (REPO / part).exists(), f"the Dockerfile copies {part}, which the repository lacks"
