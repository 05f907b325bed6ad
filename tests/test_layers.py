"""convoy's import contract, read from the source (an AST walk, nothing imported).

- **The whole package is layered** (:data:`LAYERS`): the foundations (errors, metrics
  registry, threads, file systems, values, transport, tf.* operations) import no engine and
  no face, the engines (``data``, ``distribute``, ``io``) import no face, and no module of
  ``convoy`` takes part in an import cycle, function-local imports included.
- **``convoy.data`` is layered by role** (:data:`DATA_LAYERS`): its core and file formats,
  sources, ops, persistence, sharding, the faces (``Dataset`` and its iterators), the
  service, then the public modules that gather them. Ops reach the ``Dataset`` face only
  through a hook it fills in, so they never import it; ``data`` has no import cycle.
- **The data service is a core, wings and shells**: ``convoy/data/service`` has a shared
  core (``_common``; the generated ``service_pb2`` counts as core), four wings that import
  only the core (``_dispatcher``, ``_worker``, ``_client``, ``_shm``) and, at the top, the
  shells that join wings (the gRPC servers, the consumer's threads, ``distribute``) and the
  public face. The dispatcher's wing is pure: none of its modules, nor any service module
  they import, opens a socket or speaks gRPC. No service module takes part in an import
  cycle.
- **``convoy.torch`` imports only public names** of the other packages, plus the shared
  helpers (:data:`TORCH_HELPERS`); the private imports it still makes are listed, each one
  to replace (:data:`TORCH_NOT_YET_PUBLIC`).
- **Parameter-server training** (``distribute``, ``train``, ``torch``) has no import cycle.

Imports under ``if TYPE_CHECKING:`` do not count. Each rule has a test that it catches what
it forbids.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[1] / "src"
SERVICE = "convoy.data.service"
CORE = "_common"
WINGS = ("_dispatcher", "_worker", "_client", "_shm")
#: What a module under ``_dispatcher/`` may not import: sockets, gRPC and the RPC layer (which
#: imports gRPC), and the generated messages.
NETWORK = ("socket", "grpc", "convoy._transport.rpc", "convoy._transport.stream",
           "convoy._transport.security", "convoy._transport.channel", f"{SERVICE}.service_pb2")


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name."""
    base = root / package.replace(".", "/")
    found = {}
    for path in base.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path], typing: bool = True) -> set[str]:
    """The modules ``name`` imports (anywhere in it): ``from p import m`` counts as ``p.m``
    when that is a service module, else as ``p`` (and, outside the service, as ``p.m`` too:
    it may be a module). ``typing=False`` leaves out the blocks under ``if TYPE_CHECKING:``,
    which never run."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    if not typing:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
                if not base.startswith(SERVICE):
                    found.add(sub)
    return found


def graph(root: Path = SOURCE) -> dict[str, set[str]]:
    known = modules(root, SERVICE)
    return {name: imports(name, path, known) for name, path in known.items()}


def part(module: str) -> str:
    """The core, the wing or "shell" (the top) that ``module`` belongs to; "" if none."""
    if module == SERVICE:
        return "shell"  # the public face
    if module == f"{SERVICE}.service_pb2":
        return CORE  # the generated wire messages, beside service.proto for `make proto`
    if not module.startswith(SERVICE + "."):
        return ""
    first = module[len(SERVICE) + 1:].split(".")[0]
    return first if first in (CORE, *WINGS) else "shell"


def violations(edges: dict[str, set[str]]) -> Iterator[str]:
    """Every import that breaks the contract, as a sentence."""
    for module, targets in sorted(edges.items()):
        mine = part(module)
        for target in sorted(targets):
            theirs = part(target)
            if mine == CORE and theirs not in ("", CORE):
                yield f"{module} (the core) imports {target}"
            elif mine in WINGS and theirs not in ("", CORE, mine):
                yield f"{module} (wing {mine}) imports {target}"
        if mine == "_dispatcher":
            for path, bad in _network(module, edges):
                yield f"{module} reaches {bad} through {' -> '.join(path)}"


def _network(start: str, edges: dict[str, set[str]]) -> Iterator[tuple[list[str], str]]:
    """The network modules ``start`` imports, directly or through service modules."""
    seen, stack = {start}, [[start]]
    while stack:
        path = stack.pop()
        for target in sorted(edges.get(path[-1], ())):
            if any(target == bad or target.startswith(bad + ".") for bad in NETWORK):
                yield path, target
            elif target in edges and target not in seen:
                seen.add(target)
                stack.append([*path, target])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles among the service's modules (each found once, from its first
    module)."""
    found, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(edges[module] & edges.keys()):
            if target in path:
                found.append([*path[path.index(target):], target])
            elif target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(edges):
        if module not in done:
            visit(module, [module])
    return found


def test_the_service_is_a_core_wings_and_shells() -> None:
    edges = graph()
    assert {part(m) for m in edges} == {CORE, *WINGS, "shell"}
    assert list(violations(edges)) == []


def test_the_service_has_no_import_cycle() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize(("module", "source", "broken"), [
    ("_common/x.py", "from convoy.data.service._worker import state", "(the core) imports"),
    ("_client/x.py", "from convoy.data.service._shm.segments import Process", "(wing _client)"),
    ("_worker/x.py", "import convoy.data.service._client_reader", "(wing _worker) imports"),
    ("_dispatcher/x.py", "import socket", "reaches socket"),
    ("_dispatcher/x.py", "from convoy._transport import rpc", "reaches convoy._transport.rpc"),
    ("_dispatcher/x.py", "from . import y", "reaches grpc through"),
])
def test_the_contract_catches_what_it_forbids(tmp_path: Path, module: str, source: str,
                                              broken: str) -> None:
    service = tmp_path / SERVICE.replace(".", "/")
    for wing in (CORE, *WINGS):
        (service / wing).mkdir(parents=True)
        (service / wing / "__init__.py").write_text("")
    (service / "__init__.py").write_text("")
    (service / "_client_reader.py").write_text("")
    (service / "_dispatcher" / "y.py").write_text("import grpc\n")
    (service / module).write_text(source + "\n")
    assert any(broken in line for line in violations(graph(tmp_path)))


def test_cycles_are_found(tmp_path: Path) -> None:
    service = tmp_path / SERVICE.replace(".", "/")
    service.mkdir(parents=True)
    (service / "a.py").write_text("from convoy.data.service import b\n")
    (service / "b.py").write_text("import convoy.data.service.a\n")
    assert cycles(graph(tmp_path)) == [[f"{SERVICE}.a", f"{SERVICE}.b", f"{SERVICE}.a"]]


# ----- convoy.data outside the service ----------------------------------------------------------
DATA = "convoy.data"
#: The layers of ``convoy.data``, lowest first: a module imports only modules of its own layer
#: or lower ones, at run time (imports under ``if TYPE_CHECKING:`` do not count).
DATA_LAYERS = (
    ("_core", "tfrecord"),  # op bases, rows, options; the TFRecord format
    ("_sources",),
    ("_ops",),
    ("_persistence",),
    ("_sharding",),
    ("_dataset", "_iterator", "_file_datasets"),  # the faces
    ("service",),
    ("experimental", ""),  # the public modules that gather the rest ("": the package)
)


def data_layer(module: str) -> int | None:
    """The index in :data:`DATA_LAYERS` of ``module``; None outside ``convoy.data``."""
    if module != DATA and not module.startswith(DATA + "."):
        return None
    first = module[len(DATA) + 1:].split(".")[0]
    return next(i for i, names in enumerate(DATA_LAYERS) if first in names)


def data_graph(root: Path = SOURCE) -> dict[str, set[str]]:
    known = modules(root, DATA)
    return {name: imports(name, path, known, typing=False) for name, path in known.items()}


def data_violations(edges: dict[str, set[str]]) -> Iterator[str]:
    for module, targets in sorted(edges.items()):
        mine = data_layer(module)
        for target in sorted(targets & edges.keys()):
            theirs = data_layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                yield f"{module} imports {target}, a layer above it"


def test_convoy_data_imports_only_down_its_layers() -> None:
    edges = data_graph()
    assert {data_layer(m) for m in edges} == set(range(len(DATA_LAYERS)))
    assert list(data_violations(edges)) == []


def test_convoy_data_has_no_import_cycle() -> None:
    assert cycles(data_graph()) == []


@pytest.mark.parametrize(("module", "source"), [
    ("_ops/_x.py", "from convoy.data._dataset import Dataset"),
    ("_ops/_x.py", "def f():\n    from convoy.data._dataset import Dataset"),
    ("_sharding/_x.py", "import convoy.data.service._worker"),
    ("_core/_x.py", "from convoy.data._ops import _y"),
])
def test_the_data_contract_catches_what_it_forbids(tmp_path: Path, module: str,
                                                   source: str) -> None:
    data = tmp_path / DATA.replace(".", "/")
    for room in ("_core", "_ops", "_sharding", "service/_worker"):
        (data / room).mkdir(parents=True)
        (data / room / "__init__.py").write_text("")
    (data / "__init__.py").write_text("")
    (data / "_dataset.py").write_text("")
    (data / "_ops" / "_y.py").write_text("")
    (data / module).write_text(source + "\n")
    assert len(list(data_violations(data_graph(tmp_path)))) == 1


def test_imports_under_type_checking_do_not_count(tmp_path: Path) -> None:
    data = tmp_path / DATA.replace(".", "/")
    (data / "_ops").mkdir(parents=True)
    (data / "__init__.py").write_text("")
    (data / "_dataset.py").write_text("")
    (data / "_ops" / "_x.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from convoy.data._dataset import Dataset\n")
    assert list(data_violations(data_graph(tmp_path))) == []


# ----- convoy.torch -----------------------------------------------------------------------------
TORCH = "convoy.torch"
#: The private modules of other packages that convoy.torch may import: the shared helpers.
TORCH_HELPERS = ("convoy._base.bounded", "convoy._base.check", "convoy._values.pickling")
#: Private modules convoy.torch still imports, by importing module: each entry is one to
#: replace by a public name (the parameter-server handles and the data service's equal shares).
TORCH_NOT_YET_PUBLIC = {
    "convoy.torch": {"convoy.distribute._worker_context"},
    "convoy.torch._data": {"convoy.data._core._op", "convoy.data._ops._shuffle",
                           "convoy.data.service._distribute", "convoy.data.service._client_shares"},
    "convoy.torch._tensors": {"convoy._values.nest", "convoy._values.tensors"},
    "convoy.torch._pull": {"convoy._values.slices", "convoy.distribute._operations",
                           "convoy.distribute._store_clients"},
    "convoy.torch._root": {"convoy._values.slices"},
    "convoy.torch._step": {"convoy.distribute._worker_calls"},
    "convoy.torch._dynamic": {"convoy._values.slices", "convoy.distribute._scope",
                              "convoy.distribute._store_clients",
                              "convoy.distribute._worker_calls"},
}


def private_imports(targets: set[str], known: Iterable[str]) -> set[str]:
    """The modules of other packages (among ``known``) in ``targets`` that a leading
    underscore in their path makes private, less the shared helpers."""
    found = set()
    for target in targets & set(known):
        if target.startswith(TORCH + "."):
            continue
        if any(part.startswith("_") for part in target.split(".")[1:]):
            found.add(target)
    # `from convoy._values import pickling` is seen as both `convoy._values` and the module
    return {t for t in found if t not in TORCH_HELPERS
            and not any(h.startswith(t + ".") for h in TORCH_HELPERS)
            and not any(f.startswith(t + ".") for f in found)}


def torch_violations(root: Path = SOURCE) -> Iterator[str]:
    known = modules(root, "convoy")
    for module, path in sorted(modules(root, TORCH).items()):
        bad = private_imports(imports(module, path, known, typing=False), known)
        for target in sorted(bad - TORCH_NOT_YET_PUBLIC.get(module, set())):
            yield f"{module} imports the private {target}"


def test_convoy_torch_imports_only_public_names() -> None:
    assert list(torch_violations()) == []


@pytest.mark.parametrize(("source", "allowed"), [
    ("from convoy.data.service._client_shares import Share", False),
    ("from convoy.data._core import _op", False),
    ("import convoy.data._dataset", False),
    ("from convoy._values import pickling", True),
    ("from convoy._base import check", True),
    ("from convoy.data import Dataset", True),
    ("from convoy.torch._tensors import to_torch", True),
])
def test_the_torch_contract_catches_what_it_forbids(tmp_path: Path, source: str,
                                                    allowed: bool) -> None:
    for package in ("convoy/torch", "convoy/_values", "convoy/_base", "convoy/data/_core",
                    "convoy/data/service"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    for module in ("convoy/_values/pickling.py", "convoy/_base/check.py",
                   "convoy/data/_core/_op.py", "convoy/data/service/_client_shares.py",
                   "convoy/data/_dataset.py", "convoy/torch/_tensors.py"):
        (tmp_path / module).write_text("")
    (tmp_path / "convoy" / "__init__.py").write_text("")
    (tmp_path / "convoy" / "data" / "__init__.py").write_text("")
    (tmp_path / "convoy" / "torch" / "_x.py").write_text(source + "\n")
    assert (list(torch_violations(tmp_path)) == []) is allowed


# ----- parameter-server training ----------------------------------------------------------------
#: The packages of parameter-server training: no import cycle of ``convoy`` passes through
#: them, counting imports inside functions (``imports`` reads the whole module).
TRAINING = ("convoy.distribute", "convoy.train", "convoy.torch")


def training_cycles(root: Path = SOURCE) -> list[list[str]]:
    """The import cycles of ``convoy`` with a module of :data:`TRAINING` in them."""
    known = modules(root, "convoy")
    edges = {name: imports(name, path, known, typing=False) for name, path in known.items()}
    return [cycle for cycle in cycles(edges)
            if any(m == p or m.startswith(p + ".") for m in cycle for p in TRAINING)]


def test_parameter_server_training_has_no_import_cycle() -> None:
    assert training_cycles() == []


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    for package in ("convoy", "convoy/distribute", "convoy/train"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "convoy/distribute/a.py").write_text("from convoy.train import b\n")
    (tmp_path / "convoy/train/b.py").write_text(
        "def f():\n    from convoy.distribute.a import g\n")
    assert training_cycles(tmp_path) == [
        ["convoy.distribute.a", "convoy.train.b", "convoy.distribute.a"]]


# ----- the whole package --------------------------------------------------------------------
PACKAGE = "convoy"
#: The layers of ``convoy``, lowest first: the foundations (process-wide pieces, then values
#: and transport), the engines, the faces. A module imports only modules of its own layer or
#: lower ones, at run time (function-local imports count; ``if TYPE_CHECKING:`` blocks do
#: not). ``io`` is an engine: its face re-exports the TFRecord writer of ``data``.
LAYERS = (
    ("errors", "_version", "_base", "monitoring"),
    ("_values", "_transport", "_ops", "nest", "codec", "ops", "image", "strings", "sparse",
     "ragged"),
    ("data", "distribute", "io"),
    ("train", "metrics", "nn", "torch", "cli", "testing", "__main__", ""),  # "": the package
)


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``, a module of ``convoy``."""
    first = module[len(PACKAGE) + 1:].split(".")[0] if module != PACKAGE else ""
    found = [i for i, names in enumerate(LAYERS) if first in names]
    assert found, f"{module} is in no layer: add {first!r} to LAYERS"
    return found[0]


def package_graph(root: Path = SOURCE) -> dict[str, set[str]]:
    """Every module of ``convoy`` and the modules of ``convoy`` it imports at run time; a
    compiled module (a ``.pyi`` stub without its ``.py``) imports none."""
    known: dict[str, Path | None] = dict(modules(root, PACKAGE))
    for stub in (root / PACKAGE).rglob("*.pyi"):
        if not stub.with_suffix(".py").exists():
            known[".".join(stub.relative_to(root).with_suffix("").parts)] = None
    return {name: (imports(name, path, known, typing=False) & known.keys()) if path else set()
            for name, path in known.items()}


def layer_violations(edges: dict[str, set[str]]) -> Iterator[str]:
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            if layer(target) > layer(module):
                yield f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)})"


def test_convoy_imports_only_down_its_layers() -> None:
    edges = package_graph()
    assert {layer(m) for m in edges} == set(range(len(LAYERS)))
    assert list(layer_violations(edges)) == []


def test_convoy_has_no_import_cycle() -> None:
    assert cycles(package_graph()) == []


@pytest.mark.parametrize(("module", "source", "broken"), [
    ("_base/x.py", "from convoy.data import Dataset", "convoy._base.x (layer 0) imports"),
    ("_transport/x.py", "def f():\n    import convoy.torch", "convoy._transport.x (layer 1)"),
    ("data/x.py", "from convoy import metrics", "convoy.data.x (layer 2) imports convoy.metrics"),
])
def test_the_layers_catch_what_they_forbid(tmp_path: Path, module: str, source: str,
                                           broken: str) -> None:
    package = tmp_path / PACKAGE
    for room in ("_base", "_transport", "data", "torch"):
        (package / room).mkdir(parents=True)
        (package / room / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "metrics.py").write_text("")
    (package / module).write_text(source + "\n")
    assert [line for line in layer_violations(package_graph(tmp_path)) if broken in line]


def test_a_cycle_through_a_function_local_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / PACKAGE / "_ops"
    package.mkdir(parents=True)
    (package / "a.py").write_text("from convoy._ops.b import g\n")
    (package / "b.py").write_text("def g():\n    from convoy._ops import a\n")
    assert cycles(package_graph(tmp_path)) == [
        [f"{PACKAGE}._ops.a", f"{PACKAGE}._ops.b", f"{PACKAGE}._ops.a"]]
