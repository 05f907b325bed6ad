"""Same-host transfer through shared memory: segments in ``/dev/shm`` (:mod:`.segments`), the
worker's bookkeeping of them (:mod:`.ledger`), the worker's end (:mod:`.worker_end`) and the
consumer's end (:mod:`.consumer_end`)."""
