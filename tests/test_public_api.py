"""The public names are a contract: this pins them (add here when you add to a facade)."""

import subprocess
import sys
from pathlib import Path

import pytest

import convoy

PUBLIC = {
    convoy: {"IndexedSlices", "Variable", "__version__", "data", "distribute", "errors", "nest",
             "nn", "optimizers", "train"},
    convoy.data: {"AUTOTUNE", "INFINITE_CARDINALITY", "SHARD_HINT", "UNKNOWN_CARDINALITY",
                  "Dataset", "DatasetIterator", "Options", "TFRecordDataset", "TFRecordWriter",
                  "TensorSpec", "TextLineDataset", "service"},
    convoy.data.service: {"CrossTrainerCache", "DispatchServer", "DispatcherConfig",
                          "ShardingPolicy", "WorkerConfig", "WorkerServer", "distribute",
                          "from_dataset_id", "register_dataset"},
    convoy.distribute: {"ClusterCoordinator", "ClusterSpec", "InputContext",
                        "ParameterServerStrategy", "ReduceOp", "RemoteValue", "Server",
                        "ShardInfo", "ShardedVariable", "cluster_resolver", "coordinator",
                        "experimental", "partitioners"},
    convoy.train: {"Checkpoint", "CheckpointManager", "latest_checkpoint", "optimizers"},
}
try:
    import convoy.torch

    PUBLIC[convoy.torch] = {"IterableDataset", "Pulled", "pull"}
except ImportError:  # PyTorch is optional
    pass


@pytest.mark.parametrize("module", list(PUBLIC), ids=lambda m: m.__name__)
def test_public_names(module: object) -> None:
    assert set(module.__all__) == PUBLIC[module]
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_torch_glue_is_imported_on_first_use() -> None:
    code = "import sys, convoy; assert 'convoy.torch' not in sys.modules; convoy.torch.pull"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


ENTRY_POINT = str(Path(sys.executable).parent / "convoy")  # installed beside the interpreter


@pytest.mark.parametrize("command", [[ENTRY_POINT], [sys.executable, "-m", "convoy"]],
                         ids=["entry-point", "python-m"])
def test_command_line(command: list[str]) -> None:
    out = subprocess.run([*command, "version"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert out.strip() == f"convoy {convoy.__version__}"
    help_text = subprocess.run([*command, "--help"], capture_output=True, text=True,
                               timeout=60, check=True).stdout
    for subcommand in ("dispatcher", "worker", "server", "version"):
        assert subcommand in help_text
