"""Every ``python`` block of the docs pages and the README runs, so a renamed argument breaks
the build, not the user; and every public name has an entry in the API reference.

A page's blocks run in order in one namespace (a block may build on the ones above it), each
page against what it needs: a working directory of its own, a data service in this process
(``grpc://localhost:5050`` becomes its address; loader workers start from a fork server) or a
training cluster (``TF_CONFIG``). A block that cannot run here says why, on the line before
it: ``<!-- skip: why -->`` (docs/architecture.md, "These docs")."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from convoy.testing import InProcessCluster, TrainingCluster

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.rglob("*.md")) + [README]
FENCE = re.compile(r"^(\s*)(`{3,})(\w*)\s*$")
SKIP = re.compile(r"^\s*<!-- skip: (.+?) -->\s*$")
LOADER_CONTEXT = "forkserver"


@dataclass
class Block:
    page: str
    line: int
    code: str
    skip: str | None


def blocks(path: Path) -> list[Block]:
    """The ``python`` blocks of a page, in order, with the reason each skip gives."""
    found = []
    lines = path.read_text().split("\n")
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, language = fence.groups()
        end = i + 1
        while lines[end].strip() != ticks:
            end += 1
        if language in ("python", "py"):
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            skip = SKIP.match(before)
            code = "\n".join(line[len(indent):] for line in lines[i + 1:end])
            found.append(Block(path.name, i + 1, code, skip.group(1) if skip else None))
            assert language == "python", (
                f"{path.name}:{i + 1}: a block fenced as `py`: fence it as `python`, with "
                "<!-- skip: why --> before it if it cannot run")
        i = end + 1
    return found


def run_page(path: Path, namespace: dict[str, Any],
             edit: Callable[[str], str] = lambda code: code) -> str:
    """Run the page's blocks that do not skip, in one namespace; returns what they printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks(path):
            if block.skip is None:
                exec(compile(edit(block.code), f"{block.page}:{block.line}", "exec"), namespace)
    return out.getvalue()


def on_service(cluster: InProcessCluster) -> Callable[[str], str]:
    """Blocks' edits for the test's data service: its address, loader workers' start."""
    def edit(code: str) -> str:
        code = code.replace("grpc://localhost:5050", cluster.target)
        return re.sub(r"(DataLoader\([^)]*num_workers=\d+)\)",
                      rf"\1, multiprocessing_context={LOADER_CONTEXT!r})", code)
    return edit


@pytest.fixture(scope="module")
def service() -> Iterator[InProcessCluster]:
    with InProcessCluster(num_workers=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def training() -> Iterator[TrainingCluster]:
    with TrainingCluster(num_workers=2, num_ps=2) as cluster:
        yield cluster


# ----- what runs where ---------------------------------------------------------------------

#: The pages whose blocks run, each by a test below.
RUN = {"getting-started.md", "from-tf-data.md", "pytorch.md", "parameter-servers.md",
       "README.md"}


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_runs_or_says_why(path: Path) -> None:
    for block in blocks(path):
        assert block.skip is None or block.skip.strip(), block
        if block.skip is None:
            assert path.name in RUN and path.parent in (DOCS, ROOT), (
                f"{block.page}:{block.line} runs nowhere: give its page a test here, or say "
                "why it cannot run with <!-- skip: why -->")


def test_getting_started(service: InProcessCluster, tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = run_page(DOCS / "getting-started.md", {"__name__": "docs"}, on_service(service))
    assert out.splitlines()[-1] == str([2 * i for i in range(10)])


def test_from_tf_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the cv.io example writes train.tfrecord
    namespace: dict[str, Any] = {"__name__": "docs"}
    run_page(DOCS / "from-tf-data.md", namespace)
    batch = namespace["batch"]
    assert batch["pixels"].shape == (256, 4) and batch["pixels"].dtype == np.float32
    assert batch["tags"].to_dense()[:3].tolist() == [[b"", b""], [b"a", b""], [b"a", b"b"]]
    assert callable(namespace["parse"])  # the map function of "The ops map functions call"


@pytest.mark.timeout(240)
def test_pytorch(service: InProcessCluster) -> None:
    """The DataLoader loop reads every element each epoch; the training killed at step 30
    resumes from its checkpoint of step 20."""
    out = run_page(DOCS / "pytorch.md", {"__name__": "docs"}, on_service(service))
    assert out.splitlines() == [f"epoch {epoch}: 1000 examples" for epoch in range(3)] \
        + ["300 800 True"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_parameter_servers(training: TrainingCluster, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The parameter-server example, with fewer steps and a smaller table."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TF_CONFIG", training.tf_config("chief", 0))
    namespace: dict[str, Any] = {"__name__": "docs"}  # its functions go to workers by value
    try:
        out = run_page(DOCS / "parameter-servers.md", namespace,
                       lambda code: code.replace("range(1000)", "range(300)")
                       .replace("100_000", "10_000"))
        losses = [r.fetch() for r in namespace["losses"]]
        assert np.mean(losses[-30:]) < np.mean(losses[:30]) * 0.9
        assert len(namespace["model"].variables[0].variables) == 2
        assert "training accuracy" in out
        assert (tmp_path / "ckpt" / "ckpt-1.safetensors").exists()
        assert "1280 user rows;" in out  # dynamic tables: one row per hashed id looked up
        assert namespace["ids"].size == namespace["recommender"].items.size()
    finally:
        if "coordinator" in namespace:
            namespace["coordinator"].shutdown()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_readme(service: InProcessCluster, training: TrainingCluster, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TF_CONFIG", training.tf_config("chief", 0))
    namespace: dict[str, Any] = {"__name__": "readme"}
    try:
        run_page(README, namespace, on_service(service))
        losses = [r.fetch() for r in namespace["losses"]]
        assert losses and all(np.isfinite(losses))
    finally:
        if "coordinator" in namespace:
            namespace["coordinator"].shutdown()


# ----- the API reference -------------------------------------------------------------------

#: Every public module, and the reference page that lists its ``__all__``.
MODULES = {
    "convoy": "convoy.md", "convoy.data": "data.md", "convoy.data.service": "data-service.md",
    "convoy.data.experimental": "data-experimental.md", "convoy.io": "io.md",
    "convoy.io.gfile": "io.md", "convoy.distribute": "distribute.md",
    "convoy.distribute.cluster_resolver": "distribute.md",
    "convoy.distribute.partitioners": "distribute.md", "convoy.train": "train.md",
    "convoy.train.optimizers": "optimizers.md", "convoy.train.schedules": "optimizers.md",
    "convoy.torch": "torch.md", "convoy.metrics": "metrics.md",
    "convoy.monitoring": "monitoring.md", "convoy.image": "ops.md", "convoy.strings": "ops.md",
    "convoy.sparse": "ops.md", "convoy.ragged": "ops.md", "convoy.nn": "ops.md",
    "convoy.nest": "nest.md", "convoy.errors": "errors.md", "convoy.testing": "testing.md",
}


def reference_entries(page: Path) -> dict[str, list[str]]:
    """The members each ``::: module`` block of a reference page lists."""
    entries = {}
    for module, members in re.findall(r"^::: (\S+)\n    options:\n      members:\n"
                                      r"((?:        - .*\n)+)", page.read_text(), re.M):
        entries[module] = re.findall(r"- (\S+)", members)
    return entries


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_public_name_has_a_reference_entry(module: str) -> None:
    imported = importlib.import_module(module)
    public = getattr(imported, "__all__", None)
    if public is None:  # no __all__: what the module defines without an underscore
        public = [name for name, value in vars(imported).items()
                  if not name.startswith("_") and getattr(value, "__module__", None) == module]
    public = [name for name in public  # submodules have entries of their own
              if not isinstance(getattr(imported, name), types.ModuleType)]
    listed = reference_entries(DOCS / "reference" / MODULES[module]).get(module)
    assert listed is not None, f"docs/reference/{MODULES[module]} has no `::: {module}`"
    assert sorted(set(public) - set(listed)) == [], f"public names of {module} not listed"
    assert sorted(set(listed) - set(public)) == [], f"{module} lists names it does not export"
