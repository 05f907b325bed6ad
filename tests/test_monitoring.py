"""convoy.monitoring: the metrics and probes a process serves over HTTP, scraped for real."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import convoy
from convoy import monitoring
from convoy._transport import rpc as _rpc
from convoy.errors import InvalidArgumentError, NotFoundError, UnavailableError

#: The names the issue asks for, as a scrape shows them (counters with their _total).
EXPECTED = {
    "convoy_data_elements_produced_total", "convoy_data_bytes_produced_total",
    "convoy_data_elements_served_total", "convoy_data_bytes_served_total",
    "convoy_data_buffered_bytes", "convoy_data_consumer_wait_seconds_bucket",
    "convoy_data_splits_total", "convoy_data_heartbeats_total",
    "convoy_ps_bytes_total",
    "convoy_coordinator_functions_queued", "convoy_coordinator_functions_running",
    "convoy_coordinator_functions_done_total", "convoy_coordinator_functions_failed_total",
    "convoy_process_cpu_seconds_total", "convoy_build_info",
    "convoy_refused_calls_total",
    "convoy_data_workers", "convoy_data_jobs", "convoy_data_iterations", "convoy_data_clients",
    "convoy_data_workers_lost_total", "convoy_data_journal_bytes",
    "convoy_data_journal_segments", "convoy_data_journal_write_seconds_bucket",
    "convoy_data_journal_write_failures_total",
}


def get(server: monitoring.MetricsServer, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET ``path``, whatever the status."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def samples(text: str) -> dict[str, float]:
    """Each sample of a scrape, by name and labels as the text shows them."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


@pytest.fixture
def server():
    for role in monitoring.ROLES:  # this process takes them all
        monitoring.export(role)
    server = monitoring.serve(0)
    yield server
    server.close()


def test_metrics_carry_every_name_prefixed_convoy(server):
    status, content_type, text = get(server, "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    names = {name.split("{")[0] for name in samples(text)}
    assert not EXPECTED - names
    assert "# TYPE convoy_ps_operations_total counter" in text  # its series come with use
    assert "# TYPE convoy_rpc_duration_seconds histogram" in text
    assert all(name.startswith("convoy_") for name in names), sorted(names)
    assert samples(text)[f'convoy_build_info{{version="{convoy.__version__}"}}'] == 1
    for event in ("handed_out", "acknowledged", "returned"):  # shown from the start (the
        # counters are the process's: other tests in it may have moved them already)
        assert samples(text)[f'convoy_data_splits_total{{event="{event}"}}'] >= 0


def test_a_metric_moved_shows_in_the_next_scrape(server):
    before = samples(get(server, "/metrics")[2])
    monitoring.ELEMENTS_PRODUCED.inc(3)
    monitoring.CONSUMER_WAIT_SECONDS.observe(0.2)
    after = samples(get(server, "/metrics")[2])
    name = "convoy_data_elements_produced_total"
    assert after[name] == before[name] + 3
    wait = "convoy_data_consumer_wait_seconds_count"
    assert after[wait] == before[wait] + 1


def test_openmetrics_is_served_when_asked_for(server):
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics",
                                     headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
        assert answer.read().decode().rstrip().endswith("# EOF")


def test_every_rpc_a_server_answers_is_timed_by_method(server):
    methods = {_rpc.Method("Echo", None, None): lambda request: request,
               _rpc.Method("Fail", None, None): _fail}
    grpc_server, port = _rpc.serve("test.Timed", methods, 0)
    client = _rpc.Client(f"127.0.0.1:{port}", "test.Timed", list(methods))
    try:
        assert client.call("Echo", b"x", timeout=10) == b"x"
        with pytest.raises(NotFoundError):
            client.call("Fail", b"", timeout=10)
    finally:
        client.close()
        grpc_server.stop(None)
    found = samples(get(server, "/metrics")[2])
    for method, code in (("Echo", "OK"), ("Fail", "NOT_FOUND")):  # a failure too, by code
        key = (f'convoy_rpc_duration_seconds_count{{code="{code}",method="{method}",'
               'service="test.Timed"}')
        assert found[key] == 1


def _fail(request: bytes) -> bytes:
    raise NotFoundError("nothing here")


def test_healthz_answers_while_the_process_runs(server):
    assert get(server, "/healthz")[::2] == (200, "ok\n")
    assert get(server, "/nowhere")[0] == 404


def test_readyz_follows_the_readiness_checks(server):
    assert get(server, "/readyz")[::2] == (200, "ready\n")
    state = {"reason": "journal disk full"}
    monitoring.add_readiness_check("journal", lambda: state["reason"])
    monitoring.add_readiness_check("broken", lambda: 1 / 0)
    try:
        status, content_type, body = get(server, "/readyz")
        assert status == 503 and content_type.startswith("text/plain")
        assert body.startswith("not ready: ")
        assert "journal: journal disk full" in body and "broken: ZeroDivisionError" in body
        monitoring.remove_readiness_check("broken")
        state["reason"] = None
        assert get(server, "/readyz")[::2] == (200, "ready\n")
    finally:
        monitoring.remove_readiness_check("journal")
        monitoring.remove_readiness_check("broken")


def test_close_releases_the_port():
    server = monitoring.serve(0)
    port = server.port
    assert get(server, "/healthz")[0] == 200
    server.close()
    server.close()  # idempotent
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    again = monitoring.serve(port)  # the port is free again
    again.close()


def test_a_port_in_use_is_an_unavailable_error_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UnavailableError, match=f"127.0.0.1:{port}: the port is in use"):
            monitoring.serve(port)


@pytest.mark.parametrize("port", [-1, 65536, "9090", True])
def test_a_bad_port_is_refused_by_name(port):
    with pytest.raises(InvalidArgumentError, match="`port`"):
        monitoring.serve(port)


def test_a_readiness_check_must_be_named_and_callable():
    with pytest.raises(InvalidArgumentError, match="`name`"):
        monitoring.add_readiness_check("", lambda: None)
    with pytest.raises(InvalidArgumentError, match="`fn`"):
        monitoring.add_readiness_check("x", "ready")  # type: ignore[arg-type]


def test_a_dispatcher_reports_its_counts_summed_over_the_dispatchers_of_the_process(server):
    monitoring.export("dispatcher")
    first = monitoring.DispatcherStats(workers=2, jobs=1, iterations=1, clients=3,
                                       workers_lost=1, splits={"handed_out": 5},
                                       journal_bytes=100, journal_segments=2)
    second = monitoring.DispatcherStats(workers=1, splits={"returned": 2})
    before = samples(get(server, "/metrics")[2])
    monitoring.DISPATCHER.watch("first", lambda: first)
    monitoring.DISPATCHER.watch("second", lambda: second)
    try:
        found = samples(get(server, "/metrics")[2])
    finally:
        monitoring.DISPATCHER.forget("first")
        monitoring.DISPATCHER.forget("second")
    assert found["convoy_data_workers"] == before["convoy_data_workers"] + 3
    assert found["convoy_data_clients"] == before["convoy_data_clients"] + 3
    assert found["convoy_data_workers_lost_total"] == before["convoy_data_workers_lost_total"] + 1
    assert found["convoy_data_journal_bytes"] == before["convoy_data_journal_bytes"] + 100
    for event, more in (("handed_out", 5), ("acknowledged", 0), ("returned", 2)):
        key = f'convoy_data_splits_total{{event="{event}"}}'
        assert found[key] == before[key] + more


def test_refused_calls_are_counted_by_reason_and_logged_summarised(caplog):
    refusals = monitoring._Refusals(every_s=60.0)
    before = {reason: monitoring.REFUSED_CALLS.labels(reason)._value.get()
              for reason in ("wrong", "missing")}
    with caplog.at_level("WARNING", logger="convoy.monitoring"):
        for _ in range(5):
            refusals.refused("wrong", "/svc/A", "wrong call signature")
        refusals.refused("missing", "/svc/B", "call not signed")
    assert monitoring.REFUSED_CALLS.labels("wrong")._value.get() == before["wrong"] + 5
    assert monitoring.REFUSED_CALLS.labels("missing")._value.get() == before["missing"] + 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "refused a call to /svc/A: wrong call signature" in lines[0]
    refusals.every_s = 0.0  # the next one ends the period: one summary line
    with caplog.at_level("WARNING", logger="convoy.monitoring"):
        refusals.refused("wrong", "/svc/A", "wrong call signature")
    summary = caplog.records[-1].getMessage()
    assert summary.startswith("refused 6 more calls") and "(missing 1, wrong 5)" in summary


def test_export_takes_a_known_role():
    with pytest.raises(InvalidArgumentError, match="`role`"):
        monitoring.export("trainer")


def test_a_dispatchers_counts_survive_a_snapshot_of_its_journal():
    """What the split and lost-worker counters show is the state's: a compacted journal (a
    snapshot) keeps it, and one written before the counts existed starts them at 0."""
    from convoy.data.service._dispatcher.journal_format import decode_snapshot, encode_snapshot
    from convoy.data.service._dispatcher.state import DispatcherState

    state = DispatcherState()
    state.records.count("handed_out", 7)
    state.records.count("workers_lost")
    restored, generation = decode_snapshot(encode_snapshot(state, 3))
    assert generation == 3
    assert restored.records.counts == {"handed_out": 7, "workers_lost": 1}
    older = encode_snapshot(DispatcherState(), 1).replace(b',"counts":{}', b"")
    assert b"counts" not in older
    assert decode_snapshot(older)[0].records.counts == {}
