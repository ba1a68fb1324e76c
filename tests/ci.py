"""Whether the tests run on CI, where scripts/setup.sh has installed everything: a missing component there
fails the test instead of skipping it. CI means the environment's CI is set to a true value (true, 1 or
yes, as .ci/run and most CI runners set it); CI=false or an empty CI is a developer's machine."""
import os
from collections.abc import Mapping


def on_ci(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("CI", "").strip().lower() in ("true", "1", "yes")


ON_CI = on_ci()
