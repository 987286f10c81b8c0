"""The image's pins fit together: base image CUDA major = the lock's CUDA wheels = torchao's build,
and the Dockerfile's ARGs equal the lock (containers/requirements.lock)."""

from __future__ import annotations

import functools
import importlib.metadata
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "containers" / "Dockerfile"
LOCK = ROOT / "containers" / "requirements.lock"
LOCK_INPUT = ROOT / "containers" / "requirements.in"


def dockerfile_args(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG ([A-Z_]+)=(\S+)$", text, re.MULTILINE))


def base_image(text: str) -> str:
    (line,) = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    args = dockerfile_args(text)
    return re.sub(r"\$\{([A-Z_]+)\}", lambda match: args[match[1]], line)


def lock_pins(text: str) -> dict[str, str]:
    return dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+) \\$", text, re.MULTILINE))


def cuda_majors(pins: dict[str, str]) -> set[int]:
    """CUDA majors the lock's CUDA wheels are built for: ``*-cuNN`` names and the CUDA 13 toolkit wheels."""
    majors = {int(match[1]) for name in pins if (match := re.search(r"-cu(\d+)$", name))}
    if "cuda-toolkit" in pins:
        majors.add(int(pins["cuda-toolkit"].split(".")[0]))
    if "nvidia-cuda-runtime" in pins:
        majors.add(int(pins["nvidia-cuda-runtime"].split(".")[0]))
    return majors


def base_cuda_major(image: str) -> int:
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.\d+\.\d+-(base|runtime|cudnn-runtime|devel)-ubuntu\d+\.\d+", image)
    assert match, f"base image {image} is not an nvidia/cuda tag"
    return int(match[1])


def check_pins(dockerfile: str, lock: str) -> list[str]:
    """Every disagreement between the Dockerfile and the lock, as a message (empty: they fit)."""
    problems = []
    args, pins = dockerfile_args(dockerfile), lock_pins(lock)
    base = base_cuda_major(base_image(dockerfile))
    majors = cuda_majors(pins)
    if majors != {base}:
        problems.append(f"CUDA majors disagree: base image {base}, lock's CUDA wheels {sorted(majors)}")
    local = pins.get("torch", "").partition("+")[2]
    if local and local != f"cu{base}0" and not local.startswith(f"cu{base}"):
        problems.append(f"torch {pins['torch']} is not a CUDA {base} build")
    for arg, package in (("TORCH_VERSION", "torch"), ("TORCHAO_VERSION", "torchao")):
        if args.get(arg) != pins.get(package, "").partition("+")[0]:
            problems.append(f"Dockerfile {arg}={args.get(arg)} but the lock pins {package}=={pins.get(package)}")
    return problems


def test_the_checked_in_pins_fit() -> None:
    assert check_pins(DOCKERFILE.read_text(), LOCK.read_text()) == []


def test_the_base_is_the_lean_flavour() -> None:
    """No second copy of the CUDA libraries and cuDNN the torch wheel brings (docs/trainer.md)."""
    image = base_image(DOCKERFILE.read_text())
    assert "-base-" in image, image
    assert {"nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cublas"} <= set(lock_pins(LOCK.read_text()))


def test_every_lock_entry_is_hashed_and_the_dockerfile_requires_hashes() -> None:
    lock = LOCK.read_text()
    entries = re.split(r"\n(?=[a-z0-9])", lock.split("\n", 2)[2])
    assert entries and all("--hash=sha256:" in entry for entry in entries if "==" in entry)
    assert "--require-hashes" in DOCKERFILE.read_text()
    assert "requirements.lock" in DOCKERFILE.read_text()


def test_the_lock_holds_the_inputs_and_the_trainer_dependencies() -> None:
    pins = lock_pins(LOCK.read_text())
    wanted = [line.split("==")[0].split(">")[0].split("<")[0].strip()
              for line in LOCK_INPUT.read_text().splitlines() if line and not line.startswith("#")]
    assert all(name in pins for name in wanted), [name for name in wanted if name not in pins]
    trainer = (ROOT / "containers" / "pyproject.toml").read_text()
    for name in re.findall(r'^\s+"([a-z0-9-]+)[<>=]', trainer, re.MULTILINE):
        assert name in pins, f"{name} (containers/pyproject.toml) is not in the lock"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("ARG CUDA_VERSION=13.0.2", "ARG CUDA_VERSION=12.8.1"), "CUDA majors disagree"),
        (("ARG TORCH_VERSION=2.13.0", "ARG TORCH_VERSION=2.12.1"), "TORCH_VERSION"),
        (("ARG TORCHAO_VERSION=0.18.0", "ARG TORCHAO_VERSION=0.17.0"), "TORCHAO_VERSION"),
    ],
)
def test_drift_in_the_dockerfile_is_caught(change: tuple[str, str], expected: str) -> None:
    dockerfile = DOCKERFILE.read_text()
    assert change[0] in dockerfile
    problems = check_pins(dockerfile.replace(*change), LOCK.read_text())
    assert any(expected in problem for problem in problems), problems


def test_drift_in_the_lock_is_caught() -> None:
    lock = LOCK.read_text().replace("nvidia-nccl-cu13==", "nvidia-nccl-cu12==")
    assert any("CUDA majors disagree" in problem for problem in check_pins(DOCKERFILE.read_text(), lock))


def test_torchao_build_links_the_base_images_cuda_major() -> None:
    """torchao's PyPI wheel has CUDA kernels linked against libcudart.so.<major>: read them from the
    same wheel installed here (the tests' venv installs the PyPI torchao the lock pins)."""
    pins = lock_pins(LOCK.read_text())
    try:
        distribution = importlib.metadata.distribution("torchao")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("torchao is not installed here")
    if distribution.version != pins["torchao"]:
        pytest.skip(f"installed torchao {distribution.version} is not the locked {pins['torchao']}")
    libraries = [Path(str(distribution.locate_file(file))) for file in distribution.files or ()
                 if str(file).endswith(".so")]
    linked = {int(major) for library in libraries
              for major in re.findall(rb"libcudart\.so\.(\d+)", library.read_bytes())}
    assert linked, "torchao ships no CUDA kernels: check which build was installed"
    assert linked == {base_cuda_major(base_image(DOCKERFILE.read_text()))}, linked


#: The image's platforms: linux/amd64, and linux/arm64 for Grace-based instances (P6e-GB200), as uv names them.
IMAGE_PLATFORMS = ("x86_64-manylinux_2_28", "aarch64-manylinux_2_28")


def _resolve_on_the_index(lock: Path, target: Path, platform: str = IMAGE_PLATFORMS[0]) -> tuple[int, str]:
    """Whether every pin of ``lock`` is on PyPI for the image (Python 3.12, ``platform``): uv's dry run reads the
    index's metadata and downloads no wheel."""
    import subprocess
    import sys

    uv = Path(sys.executable).parent / "uv"
    result = subprocess.run(
        [str(uv), "pip", "install", "--dry-run", "--no-deps", "--index-url", "https://pypi.org/simple",
         "--python-platform", platform, "--python-version", "3.12", "--target", str(target),
         "-r", str(lock)], capture_output=True, text=True, timeout=300, check=False)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("platform", IMAGE_PLATFORMS)
def test_every_pin_of_the_lock_is_on_the_index_for_the_image(tmp_path: Path, platform: str) -> None:
    """What the GPU benchmark's fresh environment and the image install: each pin, as a wheel for the image's
    platform, on the index the lock was compiled from; a pin the index lacks is named."""
    code, output = _resolve_on_the_index(LOCK, tmp_path / "target", platform)
    assert code == 0, output[-3000:]
    assert all(f"{name}=={version}" in output for name, version in lock_pins(LOCK.read_text()).items())
    missing = tmp_path / "missing.lock"
    missing.write_text(re.sub(r"^torchao==\S+ \\$", "torchao==0.18.99 \\\\", LOCK.read_text(), flags=re.MULTILINE))
    code, output = _resolve_on_the_index(missing, tmp_path / "target", platform)
    assert code != 0 and "torchao==0.18.99" in output


def _lock_hashes(text: str) -> dict[str, set[str]]:
    """Each pin's ``--hash=sha256:`` values."""
    hashes: dict[str, set[str]] = {}
    for block in re.split(r"\n(?=[a-z0-9])", text):
        pin = re.match(r"([a-z0-9][a-z0-9._-]*)==\S+ \\", block)
        if pin:
            hashes[pin[1]] = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return hashes


def _wheel_for(files: tuple[tuple[str, str], ...], machine: str) -> tuple[str, str] | None:
    """The wheel pip picks for CPython 3.12 on manylinux_2_28 ``machine`` from ``(filename, sha256)`` pairs: the
    first of its tags, by priority."""
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import parse_wheel_filename

    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}  # PEP 600's aliases of older glibcs
    platforms = [tag for minor in range(28, 4, -1) for tag in
                 (f"manylinux_2_{minor}_{machine}", *([f"{legacy[minor]}_{machine}"] if minor in legacy else []))]
    ranked = [*cpython_tags((3, 12), platforms=platforms), *compatible_tags((3, 12), platforms=platforms)]
    wheels = [(parse_wheel_filename(item[0])[3], item) for item in files if item[0].endswith(".whl")]
    for tag in ranked:
        for tags, item in wheels:
            if tag in tags:
                return item
    return None


@functools.cache
def _pypi_wheels(name: str, version: str) -> tuple[tuple[str, str], ...]:
    """The pin's wheels on PyPI as (filename, sha256), from its simple index (PEP 691 JSON); no wheel is
    downloaded. urllib3 (botocore's HTTP client) retries a connection error or a 5xx answer twice, backing
    off: a passing hiccup of the index is not a finding; any other answer but 200 is at once."""
    import urllib3
    from packaging.utils import canonicalize_name, parse_wheel_filename

    url = f"https://pypi.org/simple/{canonicalize_name(name)}/"
    answer = urllib3.request("GET", url, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60,
                             retries=urllib3.Retry(total=2, backoff_factor=2, status_forcelist=(500, 502, 503, 504)))
    assert answer.status == 200, f"{url}: HTTP {answer.status}"
    files = answer.json()["files"]
    wheels = [item for item in files  # this version's wheels; other versions' names may predate PEP 427's rules
              if str(item["filename"]).endswith(".whl") and str(item["filename"]).split("-")[1] == version]
    return tuple((str(item["filename"]), str(item["hashes"]["sha256"])) for item in wheels
                 if str(parse_wheel_filename(str(item["filename"]))[1]) == version)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_lock_holds_the_hash_of_the_wheel_each_image_platform_installs(machine: str) -> None:
    """The image installs with ``--require-hashes``: on arm64 (P6e-GB200) as on amd64, the wheel pip chooses for
    each pin has its sha256 in the lock (read once per pin for both platforms)."""
    from concurrent.futures import ThreadPoolExecutor

    text = LOCK.read_text()
    hashes = _lock_hashes(text)
    pins = lock_pins(text)
    with ThreadPoolExecutor(max_workers=8) as pool:
        releases = dict(zip(pins, pool.map(_pypi_wheels, pins, pins.values()), strict=True))
    problems = []
    for name, files in releases.items():
        wheel = _wheel_for(files, machine)
        if wheel is None:
            problems.append(f"{name}: no wheel for {machine}")
        elif wheel[1] not in hashes[name]:
            problems.append(f"{name}: {wheel[0]} is not hashed in the lock")
    assert not problems, problems
