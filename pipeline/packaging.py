"""The product's top-level packages (the design card's folders: pipeline, stages, schemas, reports, speech,
videobert) are generic names: another installed distribution may own one of them too, and then one install
silently overwrites the other's files, or an import finds the other's module. `collisions` names each such
name and its other owner; `python -m pipeline.packaging` (run by `make install`) and `videobert doctor` say so
in one line each."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

DISTRIBUTION = "videobert-pipeline"
TOP_LEVEL = ("pipeline", "stages", "schemas", "reports", "speech", "videobert")


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def collisions() -> list[str]:
    """One line per top-level package that another distribution also owns, or that imports from somewhere
    else than this product's own folder; [] when every name is ours alone."""
    owners = importlib.metadata.packages_distributions()
    ours = Path(__file__).resolve().parent.parent
    problems = []
    for name in TOP_LEVEL:
        others = sorted({dist for dist in owners.get(name, ()) if _normal(dist) != DISTRIBUTION})
        if others:
            problems.append(
                f"the top-level package {name!r} is also installed by {', '.join(others)}: the two "
                f"overwrite each other's files; install {DISTRIBUTION} in its own virtual environment"
            )
            continue
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
        if origin is None or ours not in origin.parents:
            problems.append(
                f"`import {name}` finds {origin or 'nothing'}, not this product's {ours / name}: "
                f"another package of that name comes first on sys.path"
            )
    return problems


def main() -> int:
    problems = collisions()
    for line in problems:
        print(f"{DISTRIBUTION}: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
