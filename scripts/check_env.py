"""Fails loudly when the test environment is not what the pins say.

1. Every installed distribution is pinned, at the installed version, in requirements-test.txt or
   requirements-frameworks.txt: a package that arrives unpinned (a new transitive dependency) fails here.
2. A framework installed with ``--no-deps`` (requirements-frameworks.txt) must import.

Those packages are installed without their declared dependencies (verl's would pull a CUDA torch and vLLM), so pip
cannot tell whether the few light modules their imports need are there. This script can: it imports every module
of theirs that rl_otel and its tests use, and checks that each declared requirement that *is* installed has a
version the requirement admits (``tensordict`` asks ``pyvers<0.2``, say). Run by scripts/test.sh before pytest,
from the checkout's root.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

# the frameworks' modules that rl_otel's integrations and the tests import
MODULES = [
    "verl",
    "verl.utils.tracking",
    "verl.trainer.ppo.core_algos",
    "verl.trainer.ppo.metric_utils",
    "verl.workers.config",
    "trinity.utils.monitor",
    "trinity.utils.metrics",
    "trinity.common.config",
    "trinity.common.config_validator",
    "skyrl.train.utils.tracking",
]
FRAMEWORKS = ["verl", "trinity-rft", "tensordict", "ray", "skyrl"]
# conflicts accepted on purpose, each with its reason; any other conflict fails
ACCEPTED = {
    ("verl", "transformers"): "TRL 1.16 (tests/test_integration_transformers.py) needs transformers 5.23; the verl "
                              "modules above import with it, and the tests run them",
    ("skyrl", "transformers"): "the same: SkyRL's Tracking (the one module rl_otel uses) imports with 5.23",
}


def version_conflicts(dist_name: str) -> list[str]:
    problems = []
    for text in md.requires(dist_name) or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            continue  # --no-deps: not every declared dependency is installed, by design
        if (dist_name, req.name) in ACCEPTED:
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            problems.append(f"{dist_name} requires {req}, installed {req.name}=={have}")
    return problems


PIN_FILES = ["requirements-test.txt", "requirements-frameworks.txt"]
UNPINNED = {"pip", "setuptools", "wheel", "rl-otel"}  # the venv's own tools, and this checkout


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def unpinned() -> list[str]:
    pins: dict[str, str] = {}
    for path in PIN_FILES:
        for line in Path(path).read_text().splitlines():
            name, sep, version = line.split("#", 1)[0].strip().partition("==")
            if sep:
                pins[_canonical(name)] = version.strip()
    problems = []
    for dist in md.distributions():
        name, version = _canonical(dist.metadata["Name"]), dist.version
        if name in UNPINNED:
            continue
        pinned = pins.get(name)
        if pinned is None:
            problems.append(f"{name}=={version} is installed but pinned nowhere ({' or '.join(PIN_FILES)})")
        elif version.split("+")[0] != pinned.split("+")[0]:  # torch 2.13.0+cpu is the pin 2.13.0
            problems.append(f"{name}=={version} is installed, the pin says {pinned}")
    return sorted(problems)


def main() -> int:
    problems: list[str] = unpinned()
    for name in FRAMEWORKS:
        problems += version_conflicts(name)
    for module in MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:  # every failure is reported, then the script fails
            problems.append(f"import {module}: {type(exc).__name__}: {exc}")
    for line in problems:
        print(f"check_env: {line}", file=sys.stderr)
    if problems:
        print("check_env: pin what is missing (requirements-test.txt, requirements-frameworks.txt)", file=sys.stderr)
        return 1
    print(f"check_env: every package pinned; {len(MODULES)} framework modules import; no version conflict in "
          f"{', '.join(FRAMEWORKS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
