"""The product's layers, read from its imports with `ast`: a file imports only files of its own layer or of
the layers below it, and no files import each other in a circle (directly or through others). An import
under `if TYPE_CHECKING:` never runs and is not counted; an import inside a function is."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# top to bottom; a file belongs to the layer of the longest of these paths that holds it
LAYERS = (
    ("cli", ("pipeline/__main__.py", "pipeline/cli.py", "pipeline/remembered.py", "pipeline/preflight.py")),
    ("applications", ("reports/", "videobert/eval/", "videobert/export.py", "videobert/export_inputs.py")),
    ("stages", ("stages/",)),
    ("trainer", ("videobert/",)),                     # the train stage's heavy code: it never imports eval/
    ("executors", ("pipeline/executors/",)),
    ("networks", ("pipeline/s3d/", "speech/")),     # the models the stages run: S3D, speech recognition
    ("engine", ("pipeline/engine/",)),
    ("media", ("pipeline/media/",)),
    ("foundation", ("pipeline/",)),                   # config, registry, storage, models, devices, progress, ...
    ("schemas", ("schemas/",)),
)
PACKAGES = ("pipeline", "stages", "schemas", "reports", "speech", "videobert")


def _product_files() -> list[str]:
    return sorted(str(path.relative_to(REPO)) for package in PACKAGES for path in (REPO / package).rglob("*.py"))


def _layer(file: str) -> int:
    matches = [(len(path), index) for index, (_, paths) in enumerate(LAYERS) for path in paths
               if file == path or (path.endswith("/") and file.startswith(path))]
    assert matches, f"{file} is in no layer: add it to LAYERS"
    return max(matches)[1]


def _module_file(module: str) -> str | None:
    """The product file a dotted module name is, or None for a module outside the product."""
    path = module.replace(".", "/")
    for candidate in (f"{path}.py", f"{path}/__init__.py"):
        if (REPO / candidate).is_file():
            return candidate
    return None


def _runs(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return False
    return True


def _imports(source: str, file: str = "") -> set[str]:
    """The product files that `source` imports: `from package import name` is the file of the module
    package.name when there is one (`from pipeline import storage`), else the package's own file."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = set()
    for node in ast.walk(tree):
        if not _runs(node, parents):
            continue
        if isinstance(node, ast.Import):
            targets = [_module_file(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [_module_file(f"{node.module}.{alias.name}") or _module_file(node.module)
                       for alias in node.names]
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
    upward = [f"{file} ({LAYERS[_layer(file)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
              for file, targets in _graph().items() for target in sorted(targets) if _layer(target) < _layer(file)]
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def test_no_files_import_each_other_in_a_circle():
    graph = _graph()
    circles, state = [], {}     # state: 1 while a file's imports are being followed, 2 when done

    def visit(file: str, path: list[str]) -> None:
        state[file] = 1
        for target in sorted(graph.get(file, ())):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[file] = 2

    for file in graph:
        if file not in state:
            visit(file, [file])
    assert not circles, "files that import each other:\n" + "\n".join(circles)


def test_the_reader_sees_imports_of_every_kind_and_passes_over_type_checking_ones():
    source = """
from typing import TYPE_CHECKING
import schemas
from pipeline import storage
from pipeline.engine.runner import ShardContext
if TYPE_CHECKING:
    from pipeline.engine.split import Split
def run():
    from pipeline.executors.local import LocalExecutor
"""
    assert _imports(source) == {"schemas/__init__.py", "pipeline/storage.py", "pipeline/engine/runner.py",
                                "pipeline/executors/local.py"}
