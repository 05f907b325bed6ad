"""The worker's wing: its state machine (:mod:`.state`), the tasks it serves (:mod:`.served`:
a running pipeline, :mod:`.task`, read plainly, through the cross-trainer cache or in
coordinated rounds). The gRPC shell is :mod:`convoy.data.service._worker_server`."""
