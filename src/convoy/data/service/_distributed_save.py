"""distributed_save: a dataset written to disk by the data service's workers.

The caller checks the arguments, writes the save's metadata (TensorFlow's distributed snapshot
layout, :mod:`convoy.data._persistence._distributed_snapshot`), registers the dataset and asks the
dispatcher to start the save; it returns then, as TensorFlow's does. Workers write the
elements in streams; ``Dataset.load(path, wait=True)`` reads the save, waiting for it to be
done.
"""

from __future__ import annotations

import os

from convoy._base import fs as _fs
from convoy._transport import rpc as _rpc
from convoy.data._core._op import INFINITE_CARDINALITY
from convoy.data._dataset import Dataset
from convoy.data._persistence import _distributed_snapshot as layout
from convoy.data._persistence import _save
from convoy.data._sharding._split import split_units
from convoy.data.service import service_pb2 as pb
from convoy.data.service._client.options import dispatcher_client, timeout_s
from convoy.data.service._distribute import _Registration
from convoy.errors import AlreadyExistsError, InvalidArgumentError


def distributed_save(dataset: Dataset, path: str | os.PathLike[str], data_service_address: str,
                     compression: str | None = "AUTO") -> None:
    """Starts writing ``dataset`` under ``path`` through the data service at
    ``data_service_address`` (``Dataset.load`` reads it); returns once the save is
    registered, without waiting for it to finish (``Dataset.load(path, wait=True)`` waits)."""
    if not isinstance(data_service_address, str):
        raise InvalidArgumentError(
            "`data_service_address` must be a string, but is a "
            f"{type(data_service_address)} ({data_service_address})")
    if not data_service_address:
        raise InvalidArgumentError("`data_service_address` must not be empty")
    if not isinstance(dataset, Dataset):
        raise InvalidArgumentError(
            f"dataset must be a convoy.data.Dataset, got {type(dataset).__name__}")
    used = "SNAPPY" if compression == "AUTO" else _save.check_compression(compression)
    if dataset.cardinality() == INFINITE_CARDINALITY:
        raise InvalidArgumentError("Failed to snapshot: Saving an infinite dataset is not "
                                   "allowed")
    split_units(dataset._op)  # refuses what it cannot split, naming the op
    directory = os.fspath(path) if _fs.is_url(path) else os.path.abspath(os.fspath(path))
    if _fs.exists(os.path.join(directory, _save.METADATA_FILE)):
        raise AlreadyExistsError(
            f"Failed to snapshot: the distributed save at {directory} has already started or "
            "completed")
    _fs.makedirs(directory)
    layout.write_metadata(directory, _save.promised_spec(dataset), used)
    registration = _Registration.of(dataset, None, with_spec=False)
    dispatcher = dispatcher_client(data_service_address)
    try:
        waited = timeout_s(None)
        dataset_id = registration.register(dispatcher, "", waited)
        request = pb.SnapshotRequest(path=directory, dataset_id=dataset_id,
                                     compression=used or "")
        _rpc.retry(lambda: dispatcher.call("Snapshot", request), waited,
                   f"starting a distributed save with dispatcher {dispatcher.address}")
    finally:
        dispatcher.close()


__all__ = ["distributed_save"]
