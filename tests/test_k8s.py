"""``examples/k8s/`` as a cluster would take it, without a cluster.

No control plane runs here, so each part of what one would check is checked on its own:

* every manifest against the API's schema of several Kubernetes versions, strictly (an
  unknown or misspelt field is an error, as ``kubectl apply --validate=strict`` makes it),
  and a misspelt copy is rejected, so the validation is shown to bite;
* the rules the API server adds that the schema cannot say (``restartPolicy: Never`` with a
  pod failure policy, sorted exit codes, a ``containerName`` that exists, ``$(VAR)``
  references that resolve...), each with a broken copy that breaks it;
* ``fanout batch``'s exit statuses, through the Job's ``podFailurePolicy`` as the Job
  controller reads it (first matching rule), into retry, fail the index, fail the Job;
* the pods' command lines, read from the Job (never retyped here) and run as written for
  every index, ``$(JOB_COMPLETION_INDEX)`` expanded as the kubelet expands it, the mounts
  mapped to folders of the test, the config pointed at the embedded upstream; then the
  merge Job's command line over what they wrote.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from fanout.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "examples" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))
# 1.29: the oldest with backoffLimitPerIndex and FailIndex on by default (beta);
# 1.33: where they are GA; 1.37: the newest kubernetes-validate ships.
VERSIONS = ("1.29", "1.33", "1.37")
SECRET_VALUE = "sk-k8s-test-secret-7f3a9c"  # what the Secret holds in these runs
ACTIONS = {"FailJob", "FailIndex", "Ignore", "Count"}
POD_TIMEOUT = 120

Doc = dict[str, Any]


def _documents(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def _all_documents() -> list[tuple[Path, Doc]]:
    return [(path, doc) for path in MANIFESTS for doc in _documents(path)]


def _find(kind: str, name: str) -> Doc:
    found = [doc for _, doc in _all_documents()
             if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"examples/k8s: {len(found)} {kind} named {name!r}"
    return found[0]


def _jobs() -> list[Doc]:
    return [doc for _, doc in _all_documents() if doc["kind"] == "Job"]


def _indexed_job() -> Doc:
    jobs = [job for job in _jobs() if job["spec"].get("completionMode") == "Indexed"]
    assert len(jobs) == 1, "examples/k8s: expected one indexed Job (the shards)"
    return jobs[0]


def _merge_job() -> Doc:
    jobs = [job for job in _jobs()
            if job["spec"]["template"]["spec"]["containers"][0]["command"][:2]
            == ["fanout", "merge"]]
    assert len(jobs) == 1, "examples/k8s: expected one Job running `fanout merge`"
    return jobs[0]


def _container(job: Doc) -> Doc:
    containers = job["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{job['metadata']['name']}: one container expected"
    container: Doc = containers[0]
    return container


# ------------------------------------------------------------------------- the schema

def test_the_example_has_every_part() -> None:
    kinds = Counter(doc["kind"] for _, doc in _all_documents())
    assert kinds["Job"] == 2 and kinds["ConfigMap"] == 1
    assert kinds["PersistentVolumeClaim"] == 1 and kinds["Pod"] == 1
    assert (K8S / "README.md").is_file() and (K8S / "Dockerfile").is_file()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_manifest_is_valid_for_kubernetes(path: Path, version: str) -> None:
    documents = _documents(path)
    assert documents, f"{path.name}: no document"
    for doc in documents:
        # Raises for a kind without a schema too (SchemaNotFoundError): never skipped.
        validated = kubernetes_validate.validate(doc, version, strict=True)
        assert validated == version


def _rename(path: tuple[Any, ...], new: str) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        *parents, last = path
        node = doc
        for key in parents:
            node = node[key]
        node[new] = node.pop(last)
    return mutate


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        *parents, last = path
        node = doc
        for key in parents:
            node = node[key]
        node[last] = value
    return mutate


CONTAINER = ("spec", "template", "spec", "containers", 0)
BROKEN_COPIES = {
    "a misspelt JobSpec field": (
        "batch-job.yaml", _rename(("spec", "backoffLimitPerIndex"), "backoffLimitPerIndx")),
    "a misspelt container field": (
        "batch-job.yaml", _rename((*CONTAINER, "command"), "comand")),
    "a misspelt rule field": (
        "batch-job.yaml", _rename(("spec", "podFailurePolicy", "rules", 1, "onExitCodes"),
                                  "onExitCode")),
    "a misspelt mount field": (
        "merge-job.yaml", _rename((*CONTAINER, "volumeMounts", 0, "mountPath"), "mountPth")),
    "completions as a string": ("batch-job.yaml", _set(("spec", "completions"), "3")),
    "exit codes as strings": (
        "batch-job.yaml", _set(("spec", "podFailurePolicy", "rules", 3, "onExitCodes",
                                "values"), ["75"])),
    "a misspelt PVC field": (
        "pvc.yaml", _rename(("spec", "accessModes"), "accesModes")),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("broken", sorted(BROKEN_COPIES))
def test_a_broken_copy_is_rejected(broken: str, version: str) -> None:
    name, mutate = BROKEN_COPIES[broken]
    (doc,) = _documents(K8S / name)
    kubernetes_validate.validate(doc, version, strict=True)  # the original passes
    doc = copy.deepcopy(doc)
    mutate(doc)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, version, strict=True)


# ------------------------------------------------- what the API server checks beyond it

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _defined_variables(job: Doc, container: Doc) -> set[str]:
    names = {entry["name"] for entry in container.get("env", [])}
    if job["spec"].get("completionMode") == "Indexed":
        names.add("JOB_COMPLETION_INDEX")  # set by the Job controller in every container
    return names


def _api_server_problems(job: Doc) -> list[str]:
    """What the API server (and the kubelet) would refuse or silently mishandle in ``job``
    that the OpenAPI schema does not express."""
    problems: list[str] = []
    spec = job["spec"]
    pod = spec["template"]["spec"]
    names = {c["name"] for c in pod["containers"]} | {
        c["name"] for c in pod.get("initContainers", [])}
    policy = spec.get("podFailurePolicy")
    indexed = spec.get("completionMode") == "Indexed"
    if (policy or "backoffLimitPerIndex" in spec) and pod.get("restartPolicy") != "Never":
        problems.append("restartPolicy must be Never with podFailurePolicy or "
                        "backoffLimitPerIndex")
    if "backoffLimitPerIndex" in spec and not indexed:
        problems.append("backoffLimitPerIndex needs completionMode Indexed")
    if indexed and "completions" not in spec:
        problems.append("completionMode Indexed needs completions")
    if policy and spec.get("podReplacementPolicy", "Failed") != "Failed":
        problems.append("podReplacementPolicy must be Failed with podFailurePolicy")
    for number, rule in enumerate(policy["rules"] if policy else []):
        where = f"podFailurePolicy.rules[{number}]"
        if rule["action"] not in ACTIONS:
            problems.append(f"{where}.action {rule['action']!r} is not one of {sorted(ACTIONS)}")
        if rule["action"] == "FailIndex" and "backoffLimitPerIndex" not in spec:
            problems.append(f"{where}: FailIndex needs backoffLimitPerIndex")
        if ("onExitCodes" in rule) == ("onPodConditions" in rule):
            problems.append(f"{where}: exactly one of onExitCodes and onPodConditions")
        codes = rule.get("onExitCodes")
        if codes is None:
            continue
        if codes["operator"] not in ("In", "NotIn"):
            problems.append(f"{where}.onExitCodes.operator {codes['operator']!r}")
        values = codes["values"]
        if values != sorted(set(values)):
            problems.append(f"{where}.onExitCodes.values must be sorted, without duplicates")
        if codes["operator"] == "In" and 0 in values:
            problems.append(f"{where}.onExitCodes.values: 0 cannot be used with In")
        if codes.get("containerName") not in (None, *names):
            problems.append(f"{where}.onExitCodes.containerName {codes['containerName']!r} "
                            f"is not a container of the pod")
    volumes = {volume["name"] for volume in pod.get("volumes", [])}
    for container in pod["containers"]:
        defined = _defined_variables(job, container)
        for text in [*container.get("command", []), *container.get("args", [])]:
            for match in _REFERENCE.finditer(text):
                if match[1] is not None and match[1] not in defined:
                    # The kubelet would pass the text on as it is: `--shard $(X)/3`.
                    problems.append(f"{container['name']}: $({match[1]}) is not defined")
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in volumes:
                problems.append(f"{container['name']}: mount of unknown volume "
                                f"{mount['name']!r}")
    return problems


@pytest.mark.parametrize("job", _jobs(), ids=lambda job: job["metadata"]["name"])
def test_job_passes_the_api_server_rules(job: Doc) -> None:
    assert _api_server_problems(job) == []


def _policy(job: Doc) -> Doc:
    policy: Doc = job["spec"]["podFailurePolicy"]
    return policy


BROKEN_RULES: dict[str, tuple[Callable[[Doc], None], str]] = {
    "restart on failure": (
        lambda job: job["spec"]["template"]["spec"].update(restartPolicy="OnFailure"),
        "restartPolicy must be Never"),
    "an unknown action": (
        lambda job: _policy(job)["rules"][3].update(action="Retry"),
        "action 'Retry' is not one of"),
    "unsorted exit codes": (
        lambda job: _policy(job)["rules"][2]["onExitCodes"].update(values=[3, 1]),
        "must be sorted"),
    "exit code 0 with In": (
        lambda job: _policy(job)["rules"][2]["onExitCodes"].update(values=[0, 1]),
        "0 cannot be used with In"),
    "a container that is not there": (
        lambda job: _policy(job)["rules"][1]["onExitCodes"].update(containerName="main"),
        "containerName 'main' is not a container"),
    "FailIndex without backoffLimitPerIndex": (
        lambda job: job["spec"].pop("backoffLimitPerIndex"),
        "FailIndex needs backoffLimitPerIndex"),
    "replacement while terminating": (
        lambda job: job["spec"].update(podReplacementPolicy="TerminatingOrFailed"),
        "podReplacementPolicy must be Failed"),
    "an undefined variable": (
        lambda job: _container(job)["args"].append("$(JOB_INDEX)"),
        "$(JOB_INDEX) is not defined"),
    "a mount without its volume": (
        lambda job: job["spec"]["template"]["spec"]["volumes"].pop(),
        "mount of unknown volume"),
}


@pytest.mark.parametrize("broken", sorted(BROKEN_RULES))
def test_the_api_server_rules_bite(broken: str) -> None:
    mutate, expected = BROKEN_RULES[broken]
    job = copy.deepcopy(_indexed_job())
    mutate(job)
    problems = _api_server_problems(job)
    assert any(expected in problem for problem in problems), problems


def _pod_specs() -> list[Doc]:
    specs = []
    for _, doc in _all_documents():
        if doc["kind"] == "Job":
            specs.append(doc["spec"]["template"]["spec"])
        elif doc["kind"] == "Pod":
            specs.append(doc["spec"])
    return specs


def test_the_objects_named_are_the_ones_defined() -> None:
    readme = (K8S / "README.md").read_text(encoding="utf-8")
    for pod in _pod_specs():
        for volume in pod["volumes"]:
            if "configMap" in volume:
                _find("ConfigMap", volume["configMap"]["name"])
            if "persistentVolumeClaim" in volume:
                _find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
        for container in pod["containers"]:
            for entry in container.get("env", []):
                secret = entry.get("valueFrom", {}).get("secretKeyRef")
                if secret:  # never in a manifest: the README says how to create it
                    assert f"secret generic {secret['name']} --from-file={secret['key']}=" \
                        in readme


# ----------------------------------------------------------- exit statuses, as handled

def _action(job: Doc, exit_code: int | None, disrupted: bool = False) -> str:
    """What the Job controller does with a failed pod of ``job`` (rules in order, the
    first that matches wins; none: ``Count``, the default)."""
    container = _container(job)["name"]
    for rule in _policy(job)["rules"]:
        conditions = rule.get("onPodConditions")
        if conditions is not None:
            if disrupted and any(c["type"] == "DisruptionTarget" and c["status"] == "True"
                                 for c in conditions):
                return str(rule["action"])
            continue
        codes = rule["onExitCodes"]
        if exit_code in (None, 0) or codes.get("containerName", container) != container:
            continue
        if (exit_code in codes["values"]) == (codes["operator"] == "In"):
            return str(rule["action"])
    return "Count"


# fanout batch: 0 every unit done; 1 finished, units failed that a rerun will not fix;
# 2 usage or config error; 3 the budget stopped it; 75 (EX_TEMPFAIL) work left that a
# rerun may finish; 130/143 interrupted; 137 killed (out of memory).
BATCH_EXITS = {1: "FailIndex", 2: "FailJob", 3: "FailIndex", 75: "Count",
               130: "Count", 137: "Count", 143: "Count"}


@pytest.mark.parametrize(("exit_code", "action"), sorted(BATCH_EXITS.items()))
def test_a_batch_pod_exit_status_is_handled(exit_code: int, action: str) -> None:
    job = _indexed_job()
    assert _action(job, exit_code) == action
    # Evicted, preempted, drained: replaced without counting, whatever it exited with.
    assert _action(job, exit_code, disrupted=True) == "Ignore"


def test_a_batch_index_is_retried_a_bounded_number_of_times() -> None:
    spec = _indexed_job()["spec"]
    # Count (75, crashes) retries up to backoffLimitPerIndex times, per index: one shard
    # that keeps failing neither starves the others nor retries for ever.
    assert 1 <= spec["backoffLimitPerIndex"] <= 10
    assert "maxFailedIndexes" not in spec  # every shard runs, whatever the others do


def test_a_merge_pod_is_not_retried_but_after_a_disruption() -> None:
    job = _merge_job()
    assert job["spec"]["backoffLimit"] == 0  # a counted failure fails the Job at once
    for exit_code in (1, 2, 75):
        assert _action(job, exit_code) == "Count"
    assert _action(job, 143, disrupted=True) == "Ignore"


# ------------------------------------------------------------- the config of the pods

def _configmap() -> Doc:
    job = _indexed_job()
    (name,) = {v["configMap"]["name"] for v in job["spec"]["template"]["spec"]["volumes"]
               if "configMap" in v}
    return _find("ConfigMap", name)


def test_the_configmap_config_reads_the_key_the_job_sets() -> None:
    text = _configmap()["data"]["fanout.toml"]
    config = parse_config(text, "fanout-batch-input: fanout.toml")
    assert config.select(default=config.batch)  # every [batch] model is defined
    env = {entry["name"]: SECRET_VALUE for entry in _container(_indexed_job())["env"]
           if "secretKeyRef" in entry.get("valueFrom", {})}
    endpoint = config.endpoint(env)
    assert endpoint is not None and endpoint.api_key == SECRET_VALUE
    # Without the Secret's variable the pod stops at once with a config error (exit 2,
    # FailJob), rather than sending requests without a key.
    with pytest.raises(ConfigError, match="api_key_env"):
        config.endpoint({})


def test_the_configmap_prompts_are_prompt_lines() -> None:
    lines = _configmap()["data"]["prompts.jsonl"].splitlines()
    prompts = [json.loads(line) for line in lines]
    ids = [prompt["id"] for prompt in prompts]
    assert len(ids) == len(set(ids)) >= 4
    assert all(isinstance(p["prompt"], str) and "expected" in p for p in prompts)


def test_the_shard_count_is_the_number_of_completions() -> None:
    job = _indexed_job()
    args = _container(job)["args"]
    shard = args[args.index("--shard") + 1]
    assert shard == f"$(JOB_COMPLETION_INDEX)/{job['spec']['completions']}"
    assert job["spec"]["parallelism"] <= job["spec"]["completions"]


def test_the_image_installs_the_command_the_jobs_run() -> None:
    dockerfile = (K8S / "Dockerfile").read_text(encoding="utf-8")
    instructions = [line.split(None, 1) for line in dockerfile.splitlines()
                    if line.strip() and not line.lstrip().startswith("#")
                    and not line.startswith(" ")]
    keywords = {"FROM", "WORKDIR", "COPY", "RUN", "USER", "ENV", "CMD", "ENTRYPOINT", "ARG"}
    assert all(words[0] in keywords for words in instructions), instructions
    for words in instructions:
        if words[0] == "COPY" and not words[1].startswith("--from"):
            *sources, _ = words[1].split()
            for source in sources:  # relative to the build context: the checkout's root
                assert (ROOT / source).exists(), f"Dockerfile: COPY {source}: not in the checkout"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    user = next(words[1] for words in instructions if words[0] == "USER")
    for job in _jobs():
        assert _container(job)["command"][0] in scripts
    for pod in _pod_specs():
        context = pod["securityContext"]
        assert user == f"{context['runAsUser']}:{context['runAsGroup']}"


# ------------------------------------------------------------ the pods, run as written

def _expand(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` as the kubelet expands it in command, args and env values: replaced when
    VAR is defined, left as it is when not; ``$$`` is one ``$``."""
    def one(match: re.Match[str]) -> str:
        if match[1] is None:
            return "$"
        return env.get(match[1], match[0])
    return _REFERENCE.sub(one, text)


def _entry_point(name: str) -> list[str]:
    """The console script ``name`` as the image installs it (pyproject's
    [project.scripts]), run with this interpreter and checkout."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts[name].split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {function}; "
                                  f"sys.exit({function}())"]


class Cluster:
    """The volumes of a one-node cluster, as folders under ``root``: each PVC one folder
    shared by every pod, each ConfigMap its files, each emptyDir fresh per pod."""

    def __init__(self, root: Path, config_text: str) -> None:
        self.root = root
        self.config_text = config_text
        self.pods = 0

    def volume(self, volume: Doc) -> Path:
        if "persistentVolumeClaim" in volume:
            _find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
            path = self.root / "pvc" / volume["persistentVolumeClaim"]["claimName"]
        elif "configMap" in volume:
            configmap = _find("ConfigMap", volume["configMap"]["name"])
            path = self.root / "configmap" / volume["configMap"]["name"]
            path.mkdir(parents=True, exist_ok=True)
            data = dict(configmap["data"])
            data["fanout.toml"] = self.config_text  # the embedded upstream, not the relay
            for key, value in data.items():
                (path / key).write_text(value, encoding="utf-8")
        elif "emptyDir" in volume:
            path = self.root / "pods" / str(self.pods) / volume["name"]
        else:
            raise AssertionError(f"volume {volume['name']}: a kind the test does not map")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def mounts(self, job: Doc) -> dict[str, Path]:
        """Each mount path of ``job``'s container -> the folder it shows (for the pod
        being started: its own emptyDirs)."""
        pod = job["spec"]["template"]["spec"]
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        mounts: dict[str, Path] = {}
        for mount in _container(job)["volumeMounts"]:
            path = self.volume(volumes[mount["name"]])
            if "subPath" in mount:
                path = path / mount["subPath"]
                path.mkdir(parents=True, exist_ok=True)  # the kubelet creates it
            mounts[mount["mountPath"]] = path
        return mounts

    def path(self, job: Doc, arg: str, index: int | None = None) -> Path:
        """The file that the argument ``arg`` of ``job``'s pod (of ``index``) names."""
        env = {} if index is None else {"JOB_COMPLETION_INDEX": str(index)}
        return Path(self.host_path(_expand(arg, env), self.mounts(job)))

    def run(self, job: Doc, index: int | None = None) -> subprocess.Popen[str]:
        """Start the pod of ``job`` (of completion ``index``) as the kubelet would."""
        self.pods += 1
        container = _container(job)
        mounts = self.mounts(job)
        env: dict[str, str] = {}
        if index is not None:
            env["JOB_COMPLETION_INDEX"] = str(index)
        for entry in container.get("env", []):
            if "value" in entry:
                env[entry["name"]] = _expand(entry["value"], env)
            elif "secretKeyRef" in entry["valueFrom"]:
                env[entry["name"]] = SECRET_VALUE
            else:
                raise AssertionError(f"env {entry['name']}: a source the test does not map")
        command = [_expand(part, env) for part in container["command"]]
        args = [self.host_path(_expand(arg, env), mounts)
                for arg in container.get("args", [])]
        base = {key: value for key, value in os.environ.items()
                if not key.startswith(("OPENAI_", "FANOUT_", "RELAY_"))}
        workdir = self.root / "pods" / str(self.pods) / "workdir"  # the image's WORKDIR
        workdir.mkdir(parents=True)
        return subprocess.Popen([*_entry_point(command[0]), *command[1:], *args],
                                cwd=workdir, env={**base, "COLUMNS": "160", **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    @staticmethod
    def host_path(arg: str, mounts: dict[str, Path]) -> str:
        for mount_path in sorted(mounts, key=len, reverse=True):
            if arg == mount_path or arg.startswith(mount_path.rstrip("/") + "/"):
                return str(mounts[mount_path]) + arg[len(mount_path):]
        # The root filesystem is read-only: whatever the pod reads or writes is on a mount.
        assert not arg.startswith("/"), f"{arg}: not on any volume of the pod"
        return arg


def _embedded_config(relay_config: str) -> str:
    """The ConfigMap's config with the embedded upstream for the relay: the same [batch]
    model names, each played by a mock model."""
    config = parse_config(relay_config)
    mocks = ["mock/echo", "mock/fast"]
    lines = ['[endpoint]', 'base_url = "embedded"', '', '[batch]',
             f"models = {json.dumps(list(config.batch))}", '']
    for number, name in enumerate(config.batch):
        lines += ['[[models]]', f'name = {json.dumps(name)}',
                  f'id = "{mocks[number % len(mocks)]}"', '']
    return "\n".join(lines)


def _records(path: Path) -> list[Doc]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _key(record: Doc) -> tuple[str, str, int]:
    return record["id"], record["model"], record["sample"]


def _option(args: list[str], name: str) -> list[str]:
    return [args[at + 1] for at, arg in enumerate(args) if arg == name]


class Run:
    """The indexed Job's pods, each run to its end, in waves of ``parallelism``."""

    def __init__(self, root: Path) -> None:
        self.job = _indexed_job()
        configmap = _configmap()
        relay_config = configmap["data"]["fanout.toml"]
        self.cluster = Cluster(root, _embedded_config(relay_config))
        config = parse_config(relay_config)
        args = _container(self.job)["args"]
        samples = int((_option(args, "--samples") or ["1"])[0])
        ids = [json.loads(line)["id"]
               for line in configmap["data"]["prompts.jsonl"].splitlines()]
        self.planned = {(id_, model, sample) for id_ in ids for model in config.batch
                        for sample in range(samples)}
        self.scorers = _option(args, "--score")
        self.exits: dict[int, int] = {}
        self.printed: list[str] = []
        spec = self.job["spec"]
        indexes = list(range(spec["completions"]))
        wave = spec["parallelism"]
        for start in range(0, len(indexes), wave):
            for index, process in [(i, self.cluster.run(self.job, i))
                                   for i in indexes[start:start + wave]]:
                self.exits[index] = self.finish(process)
        output = _option(_container(self.job)["args"], "-o")[0]
        self.outputs = {index: self.cluster.path(self.job, output, index) for index in indexes}

    def finish(self, process: subprocess.Popen[str]) -> int:
        out, err = process.communicate(timeout=POD_TIMEOUT)
        self.printed += [out, err]
        if process.returncode != 0:
            print(out, err, sep="\n", file=sys.stderr)
        return process.returncode


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield Run(tmp_path_factory.mktemp("k8s"))


def test_every_pod_exits_0(run: Run) -> None:
    assert run.exits == dict.fromkeys(range(run.job["spec"]["completions"]), 0)


def test_every_planned_unit_is_in_exactly_one_shard_file(run: Run) -> None:
    keys: Counter[tuple[str, str, int]] = Counter()
    for index, path in run.outputs.items():
        records = _records(path)
        assert records, f"shard {index} ran nothing: the split did not split"
        assert all(record["outcome"] == "completed" for record in records)
        keys.update(_key(record) for record in records)
    assert set(keys) == run.planned
    assert set(keys.values()) == {1}


def test_every_answer_is_scored_once_beside_its_shard(run: Run) -> None:
    assert run.scorers
    scored: Counter[tuple[str, str, int, str]] = Counter()
    for path in run.outputs.values():
        scores = path.with_name(path.name.removesuffix(".jsonl") + ".scores.jsonl")
        scored.update((*_key(line), line["scorer"]) for line in _records(scores))
    assert set(scored) == {(*key, scorer) for key in run.planned for scorer in run.scorers}
    assert set(scored.values()) == {1}


def test_a_retried_pod_resumes_its_own_file(run: Run) -> None:
    shared = run.cluster.root / "pvc"
    before = {path: path.read_bytes() for path in shared.rglob("*") if path.is_file()}
    assert len(before) == 2 * len(run.outputs)  # each shard's results and scores
    assert run.finish(run.cluster.run(run.job, len(run.outputs) - 1)) == 0
    after = {path: path.read_bytes() for path in shared.rglob("*") if path.is_file()}
    assert after == before  # nothing sent again, nothing written, no other shard touched


def test_the_key_appears_nowhere(run: Run) -> None:
    assert not any(SECRET_VALUE in text for text in run.printed)
    for path in run.cluster.root.rglob("*"):
        if path.is_file():
            assert SECRET_VALUE.encode() not in path.read_bytes(), path


def test_the_merge_job_merges_every_shard(run: Run) -> None:
    merge = _merge_job()
    process = run.cluster.run(merge)
    assert run.finish(process) == 0
    merged = run.cluster.path(merge, _option(_container(merge)["args"], "-o")[0])
    records = _records(merged)
    keys = Counter(_key(record) for record in records)
    assert set(keys) == run.planned and set(keys.values()) == {1}
    scores = merged.with_name(merged.name.removesuffix(".jsonl") + ".scores.jsonl")
    scored = Counter((*_key(line), line["scorer"]) for line in _records(scores))
    assert set(scored) == {(*key, scorer) for key in run.planned for scorer in run.scorers}
    assert set(scored.values()) == {1}
