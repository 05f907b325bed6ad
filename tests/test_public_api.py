"""The public names are a contract: this pins them (add here when you add to a facade)."""

import subprocess
import sys
from pathlib import Path

import pytest

import convoy

PUBLIC = {
    convoy: {"IndexedSlices", "RaggedTensor", "RaggedTensorSpec", "SparseTensor",
             "SparseTensorSpec", "Variable", "__version__", "data", "distribute", "errors", "io",
             "metrics", "monitoring", "nest", "nn", "optimizers", "train",
             "cast", "clip_by_value", "concat", "gather", "image", "one_hot", "pad", "ragged",
             "reshape", "sequence_mask", "sparse", "stack", "strings", "unique", "where"},
    convoy.io: {"BytesList", "Example", "Feature", "FeatureList", "FeatureLists", "Features",
                "FixedLenFeature", "FixedLenSequenceFeature", "FloatList", "Int64List",
                "RaggedFeature", "SequenceExample", "SparseFeature", "VarLenFeature",
                "decode_csv", "decode_raw", "decode_bmp", "decode_gif", "decode_image",
                "decode_jpeg", "decode_png", "encode_jpeg", "encode_png", "parse_example",
                "parse_sequence_example",
                "parse_single_example", "parse_single_sequence_example", "parse_tensor",
                "serialize_tensor", "gfile", "read_file", "write_file", "TFRecordOptions",
                "TFRecordWriter", "set_parse_threads", "get_parse_threads"},
    convoy.data: {"AUTOTUNE", "INFINITE_CARDINALITY", "SHARD_HINT", "UNKNOWN_CARDINALITY",
                  "Dataset", "DatasetIterator", "DatasetSpec", "Options", "RaggedTensorSpec",
                  "SparseTensorSpec", "TFRecordDataset",
                  "TFRecordWriter", "TensorSpec", "TextLineDataset", "experimental", "service",
                  "FixedLengthRecordDataset"},
    convoy.data.experimental: {"AUTOTUNE", "INFINITE_CARDINALITY", "UNKNOWN_CARDINALITY",
                               "CsvDataset", "Optional", "assert_cardinality", "cardinality",
                               "dense_to_ragged_batch", "dense_to_sparse_batch", "distributed_save",
                               "from_list",
                               "get_next_as_optional", "group_by_window", "ignore_errors",
                               "make_csv_dataset", "parse_example_dataset",
                               "rejection_resample", "scan", "unique", "AutoShardPolicy",
                               "AutotuneOptions", "DistributeOptions", "OptimizationOptions",
                               "ThreadingOptions", "bucket_by_sequence_length",
                               "choose_from_datasets", "make_batched_features_dataset",
                               "sample_from_datasets", "service"},
    convoy.data.service: {"CrossTrainerCache", "DispatchServer", "DispatcherConfig",
                          "LocalCluster", "ShardingPolicy", "WorkerConfig", "WorkerServer",
                          "distribute",
                          "from_dataset_id", "register_dataset"},
    convoy.distribute: {"ClusterCoordinator", "ClusterSpec", "InputContext",
                        "ParameterServerStrategy", "ReduceOp", "RemoteValue", "Server",
                        "ShardInfo", "ShardedVariable", "cluster_resolver", "coordinator",
                        "experimental", "partitioners"},
    convoy.metrics: {"AUC", "Accuracy", "BinaryAccuracy", "Mean", "Metric", "Sum"},
    convoy.monitoring: {"BUFFERED_BYTES", "BYTES_PRODUCED", "BYTES_SERVED",
                        "CONSUMER_WAIT_SECONDS", "COORDINATOR_FUNCTIONS_DONE",
                        "COORDINATOR_FUNCTIONS_FAILED", "COORDINATOR_FUNCTIONS_QUEUED",
                        "COORDINATOR_FUNCTIONS_RUNNING", "ELEMENTS_PRODUCED", "ELEMENTS_SERVED",
                        "HEARTBEATS", "MAX_BUFFERED_BYTES", "PS_BYTES", "PS_OPERATIONS",
                        "REFUSED_CALLS", "REGISTRY", "ROLES", "RPC_SECONDS", "MetricsServer",
                        "add_readiness_check", "export", "readiness", "remove_readiness_check",
                        "serve"},
    convoy.train: {"BytesList", "Checkpoint", "CheckpointManager", "Example", "Feature",
                   "FeatureList", "FeatureLists", "Features", "FloatList", "Int64List",
                   "SequenceExample", "latest_checkpoint", "optimizers"},
}
try:
    import convoy.torch

    PUBLIC[convoy.torch] = {"IterableDataset", "Pulled", "place", "pull"}
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
