"""The worker task a process serves, against a real ``convoy server`` worker: functions find
their worker's context and resources, and ``Free`` deletes resources by id.
"""

from __future__ import annotations

import random
import subprocess
import sys

import cloudpickle
import pytest

from convoy._transport import rpc as _rpc
from convoy.distribute._coordinator_calls import call_message
from convoy.distribute._wire import (
    WORKER_METHODS,
    WORKER_SERVICE,
    decode_one,
    encode,
    load_outcomes,
    run_request,
)
from convoy.errors import DataLossError, InvalidArgumentError

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.timeout(60)
def test_free_deletes_resources_and_cancel_and_free_refuse_bad_requests(ps_and_worker):
    client = _rpc.Client(ps_and_worker.cluster["worker"][0], WORKER_SERVICE, WORKER_METHODS)

    def hold(resource_id):
        from convoy.distribute._worker_context import worker_context

        worker_context().resources[resource_id] = [resource_id]
        return len(worker_context().resources)

    ids = [random.randrange(2**60) for _ in range(3)]
    held = [outcome.value for outcome in load_outcomes(client.stream("Run").call(
        run_request([call_message(hold, (i,), {}) for i in ids])))]
    remaining = decode_one(client.call("Free", encode([])))
    assert remaining >= 3 and max(held) <= remaining
    assert decode_one(client.call("Free", encode(ids[:2] + [12345]))) == remaining - 2
    assert decode_one(client.call("Free", encode(ids))) == remaining - 3
    for method in ("Cancel", "Free"):
        for payload in [b"", encode(5), encode(["a"]), encode([1.5]), encode(None)]:
            with pytest.raises((InvalidArgumentError, DataLossError)):
                client.call(method, payload)
    client.close()


def test_a_worker_server_makes_its_process_that_worker_when_it_starts():
    code = """if True:
        from convoy.distribute._worker_context import worker_context
        from convoy.distribute.server import Server
        from convoy.testing import free_port
        spec = {"ps": [f"localhost:{free_port()}"], "worker": [f"localhost:{free_port()}"] * 2}
        ps = Server(spec, "ps", 0)
        worker = Server(spec, "worker", 1, start=False)
        assert worker_context() is None  # neither a ps nor a server not started yet
        worker.start()
        context = worker_context()
        assert (context.task_index, context.num_workers, context.resources) == (1, 2, {})
        worker.stop(); ps.stop()
    """
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("on_a_worker", [True, False], ids=["worker", "elsewhere"])
def test_convoy_torch_keeps_one_intra_op_thread_on_a_worker_only(on_a_worker):
    code = f"""if True:
        import torch
        from convoy.distribute.server import Server
        from convoy.testing import free_port
        torch.set_num_threads(2)
        spec = {{"ps": [f"localhost:{{free_port()}}"], "worker": [f"localhost:{{free_port()}}"]}}
        servers = [Server(spec, "ps", 0), Server(spec, "worker", 0)] if {on_a_worker} else []
        import convoy.torch
        assert torch.get_num_threads() == {1 if on_a_worker else 2}, torch.get_num_threads()
        for server in servers:
            server.stop()
    """
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
