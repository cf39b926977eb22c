"""The product's layers, read from its imports with `ast`: a file imports only files of its own layer or of
the layers below it, and no files import each other in a circle (directly or through others). An import
inside a function counts, and so does one under `if TYPE_CHECKING:` that never runs: a type hint that points
up or closes a circle is a dependency a reader follows all the same. A stage record's "module:name"
strings are imports too: each names its own folder or a layer below the stages layer."""

import ast
import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# top to bottom; a file belongs to the layer of the longest of these patterns that matches it (a pattern
# ending in "/" holds every file below it; the others are fnmatch patterns)
LAYERS = (
    ("cli", ("pipeline/__main__.py", "pipeline/cli/", "pipeline/remembered.py")),
    ("applications", ("reports/", "videobert/eval/", "videobert/export*.py")),  # reached from the CLI alone
    ("stages", ("stages/",)),  # a stage's run code: stages/<name>/run.py, ...
    ("trainer", ("videobert/",)),  # the train stage's heavy code
    ("executors", ("pipeline/executors/",)),
    ("networks", ("speech/",)),  # the models the stages run: speech recognition
    ("engine", ("pipeline/engine/",)),
    ("media", ("pipeline/media/",)),
    # config, registry, contract, storage, models, devices, progress, ...; and each stage's record, section
    # and checks (stages/<name>/__init__.py), which the registry and the config read
    ("foundation", ("pipeline/", "stages/__init__.py", "stages/*/__init__.py")),
    ("schemas", ("schemas/",)),
)
PACKAGES = ("pipeline", "stages", "schemas", "reports", "speech", "videobert")


def _product_files() -> list[str]:
    return sorted(str(path.relative_to(REPO)) for package in PACKAGES for path in (REPO / package).rglob("*.py"))


def _layer(file: str) -> int:
    matches = [
        (len(path), index)
        for index, (_, paths) in enumerate(LAYERS)
        for path in paths
        if (file.startswith(path) if path.endswith("/") else fnmatch.fnmatch(file, path))
    ]
    assert matches, f"{file} is in no layer: add it to LAYERS"
    return max(matches)[1]


def _module_file(module: str) -> str | None:
    """The product file a dotted module name is, or None for a module outside the product."""
    path = module.replace(".", "/")
    for candidate in (f"{path}.py", f"{path}/__init__.py"):
        if (REPO / candidate).is_file():
            return candidate
    return None


def _imports(source: str, file: str = "") -> set[str]:
    """The product files that `source` imports: `from package import name` is the file of the module
    package.name when there is one (`from pipeline import storage`), else the package's own file."""
    tree = ast.parse(source)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [_module_file(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [_module_file(f"{node.module}.{alias.name}") or _module_file(node.module) for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target)
    found.discard(file)
    return found


def _graph() -> dict[str, set[str]]:
    return {file: _imports((REPO / file).read_text(), file) for file in _product_files()}


def test_every_product_file_is_in_a_layer():
    for file in _product_files():
        _layer(file)


def test_no_file_imports_a_file_of_a_higher_layer():
    upward = [
        f"{file} ({LAYERS[_layer(file)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
        for file, targets in _graph().items()
        for target in sorted(targets)
        if _layer(target) < _layer(file)
    ]
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def test_no_files_import_each_other_in_a_circle():
    graph = _graph()
    circles, state = [], {}  # state: 1 while a file's imports are being followed, 2 when done

    def visit(file: str, path: list[str]) -> None:
        state[file] = 1
        for target in sorted(graph.get(file, ())):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[file] = 2

    for file in graph:
        if file not in state:
            visit(file, [file])
    assert not circles, "files that import each other:\n" + "\n".join(circles)


def test_the_reader_sees_imports_of_every_kind_type_checking_ones_too():
    source = """
from typing import TYPE_CHECKING
import schemas
from pipeline import storage
from pipeline.contract import ShardContext
if TYPE_CHECKING:
    from pipeline.engine.split import Split
def run():
    from pipeline.executors.local import LocalExecutor
"""
    assert _imports(source) == {
        "schemas/__init__.py",
        "pipeline/storage.py",
        "pipeline/contract.py",
        "pipeline/engine/split.py",
        "pipeline/executors/local.py",
    }


def _record_problems(stage) -> list[str]:
    """The "module:name" strings of a stage record that name neither a module of its own folder
    (stages/<name>/) nor one of a layer below the stages layer (the trainer, the engine, the foundation, ...)."""
    from pipeline.contract import CODE_FIELDS

    below = [name for name, _ in LAYERS].index("stages")
    named = [(which, getattr(stage, which)) for which in CODE_FIELDS]
    named += [(f"checks[{table!r}]", check) for table, checks in stage.checks.items() for check in checks]
    problems = []
    for which, value in named:
        if not isinstance(value, str) or not value:
            continue
        file = _module_file(value.split(":")[0])
        if file is None:
            problems.append(f"{stage.name}.{which} = {value!r} names no product module")
        elif file.startswith("stages/") and not file.startswith(f"stages/{stage.name}/"):
            problems.append(f"{stage.name}.{which} = {value!r} names another stage's folder ({file})")
        elif not file.startswith(f"stages/{stage.name}/") and _layer(file) <= below:
            problems.append(
                f"{stage.name}.{which} = {value!r} names {file} ({LAYERS[_layer(file)][0]}), above the stages layer"
            )
    return problems


def test_every_record_names_code_of_its_own_folder_or_of_a_layer_below_the_stages():
    from pipeline import registry

    problems = [problem for stage in registry.STAGES for problem in _record_problems(stage)]
    assert not problems, "records naming code they may not:\n" + "\n".join(problems)


def test_the_record_rule_refuses_higher_layers_and_other_stages_folders():
    from pipeline.contract import Stage

    stage = Stage(
        "quantize",
        "",
        reads=(),
        config_sections=(),
        per_shard=True,
        writes="",
        run="stages.quantize.run:run_shard",
        identities="videobert.train:identities",
        preflight="reports.validate:validate_work_dir",
        split="stages.features.run:SPLIT",
        checks={"": ("pipeline.table_checks:clips_in_order", "stages.align:segments")},
    )
    problems = _record_problems(stage)
    assert len(problems) == 3, problems
    assert "reports/validate.py (applications), above the stages layer" in problems[0]
    assert "another stage's folder (stages/features/run.py)" in problems[1]
    assert "another stage's folder (stages/align/__init__.py)" in problems[2]


MAX_FILE_LINES = 500  # a file a reader takes in one sitting; a longer one is split by idea


def test_no_product_file_is_longer_than_a_sitting():
    long = [
        f"{file}: {lines} lines"
        for file in _product_files()
        if (lines := len((REPO / file).read_text().splitlines())) > MAX_FILE_LINES
    ]
    assert not long, f"product files over {MAX_FILE_LINES} lines (split them by idea):\n" + "\n".join(long)


def test_no_benchmark_imports_the_tests():
    """Benchmarks use the product, benchmarks/common.py and scripts/ (the two-node Slurm, the samples'
    speech), never a test's helpers: a test may change them for its own ends."""
    test_modules = {path.stem for path in (REPO / "tests").glob("*.py")}
    found = []
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.name} imports {name}" for name in names if name.split(".")[0] in test_modules | {"tests"}]
        if '"tests"' in source or "'tests'" in source:
            found.append(f"{path.name} puts tests/ on its path")
    assert not found, "\n".join(found)
