"""The data service's RPCs: one table per service, used by both servers and clients."""

from __future__ import annotations

import struct

from convoy._transport.rpc import Method
from convoy.data.service import service_pb2 as pb
from convoy.errors import DataLossError

DISPATCHER = "convoy.data.service.Dispatcher"
WORKER = "convoy.data.service.Worker"

DISPATCHER_METHODS = [
    Method("RegisterDataset", pb.RegisterDatasetRequest, pb.RegisterDatasetResponse),
    Method("GetDatasetInfo", pb.GetDatasetInfoRequest, pb.GetDatasetInfoResponse),
    Method("GetOrCreateJob", pb.GetOrCreateJobRequest, pb.GetOrCreateJobResponse),
    Method("GetOrCreateIteration", pb.GetOrCreateIterationRequest,
           pb.GetOrCreateIterationResponse),
    Method("ClientHeartbeat", pb.ClientHeartbeatRequest, pb.ClientHeartbeatResponse),
    Method("ReleaseClient", pb.ReleaseClientRequest, pb.Empty),
    Method("WorkerHeartbeat", pb.WorkerHeartbeatRequest, pb.WorkerHeartbeatResponse),
    Method("GetSplits", pb.GetSplitsRequest, pb.GetSplitsResponse),
    Method("GetStatus", pb.GetStatusRequest, pb.GetStatusResponse),  # read-only
    Method("ReportUnreachableWorker", pb.ReportUnreachableWorkerRequest,
           pb.ReportUnreachableWorkerResponse),
    Method("DeregisterWorker", pb.DeregisterWorkerRequest, pb.Empty),
    Method("GetResumePoint", pb.GetResumePointRequest, pb.GetResumePointResponse),
    Method("Snapshot", pb.SnapshotRequest, pb.Empty),
    Method("GetSnapshotStream", pb.GetSnapshotStreamRequest, pb.GetSnapshotStreamResponse),
    Method("GetSnapshotSplit", pb.GetSnapshotSplitRequest, pb.GetSnapshotSplitResponse),
    Method("SnapshotStreamDone", pb.SnapshotStreamDoneRequest, pb.SnapshotStreamDoneResponse),
    Method("Share", pb.ShareRequest, pb.ShareResponse),
]

#: GetElements answers with raw bytes: a status byte, then a codec message.
WORKER_METHODS = [Method("GetElements", pb.GetElementsRequest, None),
                  Method("PingWorker", pb.PingWorkerRequest, pb.PingWorkerResponse),
                  Method("GiveBack", pb.GiveBackRequest, pb.Empty)]

#: The first byte of a GetElements answer.
ELEMENTS = b"E"  # followed by a codec message with one or more elements
#: followed by the elements' sequence numbers (a little-endian uint32 count of runs, then each
#: run's start and stop as int64), then an ELEMENTS or SHARED_MEMORY answer carrying them
NUMBERED = b"R"
END_OF_SEQUENCE = b"S"  # the task has no more elements
NOT_READY = b"N"  # nothing yet: ask again
#: followed by the length of the codec message in a shared-memory segment and the number of this
#: handout of the segment (little-endian uint64 each), then the segment's name
SHARED_MEMORY = b"M"
#: A SHARED_MEMORY answer's header, before the segment's name.
SHARED_MEMORY_HEADER = struct.Struct("<QQ")

#: In the "unavailable" answer of a worker that leaves gracefully (SIGTERM): its consumers
#: read its tasks elsewhere, and say so without a warning.
DRAINING = "is draining"

#: How long a worker waits for a task's first element (or for the heartbeat that may bring
#: its task) before answering NOT_READY.
ELEMENT_WAIT_S = 0.5


def pack_numbers(runs: list[tuple[int, int]]) -> bytes:
    """The header of a NUMBERED answer carrying the sequence numbers ``runs``."""
    return struct.pack(f"<I{2 * len(runs)}q", len(runs), *(n for run in runs for n in run))


def read_numbers(answer: memoryview) -> tuple[list[tuple[int, int]], memoryview]:
    """The runs of sequence numbers a NUMBERED answer (past its status byte) carries, and its
    codec message."""
    try:
        (count,) = struct.unpack_from("<I", answer)
        flat = struct.unpack_from(f"<{2 * count}q", answer, 4)
    except struct.error as error:
        raise DataLossError(f"a GetElements answer's sequence numbers are cut short: {error}"
                            ) from None
    return list(zip(flat[::2], flat[1::2])), answer[4 + 16 * count:]
