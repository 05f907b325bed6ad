"""Service iterators checkpoint: ``state_dict()`` is plain data, and a restored iterator (a new
job) yields exactly the elements the saved one had not yielded, under OFF and DYNAMIC."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import convoy as cv
from convoy.errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from convoy.testing import InProcessCluster


def _values(elements: Any) -> list[int]:
    return [int(np.asarray(e)) for e in elements]


def _pipeline(n: int) -> cv.data.Dataset:
    return cv.data.Dataset.range(n).shuffle(64, seed=3).map(lambda x: x * 10)


@pytest.mark.parametrize("mode", ["off", "dynamic"])
@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("taken", [0, 1, 337])
def test_restored_iterator_yields_the_rest(mode: str, num_workers: int, taken: int) -> None:
    with InProcessCluster(num_workers=num_workers) as cluster:
        ds = _pipeline(1000).apply(cv.data.service.distribute(mode, cluster.target))
        it = iter(ds)
        first = _values(next(it) for _ in range(taken))
        state = pickle.loads(pickle.dumps(it.state_dict()))  # plain data
        it.close()
        # a new dataset object, as a new process builds it
        again = _pipeline(1000).apply(
            cv.data.service.distribute(mode, cluster.target))
        restored = iter(again)
        restored.load_state_dict(state)
        rest = _values(restored)
    copies = num_workers if mode == "off" else 1
    expected = sorted([10 * i for i in range(1000)] * copies)
    assert sorted(first + rest) == expected


def test_a_restored_reading_saves_and_restores_again() -> None:
    with InProcessCluster(num_workers=2) as cluster:
        def make() -> cv.data.Dataset:
            return _pipeline(600).apply(
                cv.data.service.distribute("dynamic", cluster.target))

        seen: list[int] = []
        it = iter(make())
        for _ in range(3):
            seen += _values(next(it) for _ in range(150))
            state = it.state_dict()
            it.close()
            it = iter(make())
            it.load_state_dict(state)
        seen += _values(it)
    assert sorted(seen) == [10 * i for i in range(600)]


def test_named_job_restores_into_a_new_job() -> None:
    with InProcessCluster(num_workers=1) as cluster:
        def make() -> cv.data.Dataset:
            return _pipeline(300).apply(cv.data.service.distribute(
                "dynamic", cluster.target, job_name="train"))

        it = iter(make())
        first = _values(next(it) for _ in range(100))
        state = it.state_dict()
        it.close()
        restored = iter(make())
        restored.load_state_dict(state)
        assert sorted(first + _values(restored)) == [10 * i for i in range(300)]


def test_state_of_another_dataset_is_refused() -> None:
    with InProcessCluster(num_workers=1) as cluster:
        dist = cv.data.service.distribute("dynamic", cluster.target)
        it = iter(_pipeline(100).apply(dist))
        next(it)
        state = it.state_dict()
        it.close()
        other = iter(_pipeline(101).apply(dist))
        with pytest.raises(InvalidArgumentError, match="another dataset"):
            other.load_state_dict(state)
        other.close()


def test_unseeded_list_files_shuffle_refuses_to_save(tmp_path: Any) -> None:
    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text(f"{i}\n")
    with InProcessCluster(num_workers=1) as cluster:
        ds = cv.data.Dataset.list_files(str(tmp_path / "*.txt"), shuffle=True).apply(
            cv.data.service.distribute("dynamic", cluster.target))
        it = iter(ds)
        next(it)
        with pytest.raises(FailedPreconditionError, match="seed"):
            it.state_dict()
        it.close()


# ----- give-back ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,num_workers", [("off", 1), ("dynamic", 1), ("dynamic", 2)])
def test_a_consumer_leaving_a_shared_job_gives_back_what_it_had_not_returned(
        mode: str, num_workers: int) -> None:
    with InProcessCluster(num_workers=num_workers) as cluster:
        def shared() -> cv.data.Dataset:  # as each consumer's process builds it
            return cv.data.Dataset.range(2000).apply(cv.data.service.distribute(
                mode, cluster.target, job_name="shared"))

        a = iter(shared())
        first = _values(next(a) for _ in range(500))
        a.close()  # it had fetched more than it returned: those go back to the job
        rest = _values(iter(shared()))
    assert sorted(first + rest) == list(range(2000)) * (num_workers if mode == "off" else 1)


def test_a_collected_consumer_gives_back_too() -> None:
    import gc

    with InProcessCluster(num_workers=1) as cluster:
        def shared() -> cv.data.Dataset:
            return cv.data.Dataset.range(2000).apply(cv.data.service.distribute(
                "dynamic", cluster.target, job_name="shared"))

        a = iter(shared())
        first = _values(next(a) for _ in range(500))
        del a
        gc.collect()
        rest = _values(iter(shared()))
    assert sorted(first + rest) == list(range(2000))


@pytest.mark.parametrize("num_workers", [1, 2])
def test_consumers_of_a_shared_job_resume_together(num_workers: int) -> None:
    with InProcessCluster(num_workers=num_workers) as cluster:
        def shared(name: str) -> cv.data.Dataset:
            return _pipeline(1500).apply(cv.data.service.distribute(
                "dynamic", cluster.target, job_name=name))

        a, b = iter(shared("run-1")), iter(shared("run-1"))
        trained = _values(next(a) for _ in range(200)) + _values(next(b) for _ in range(100))
        state_a = a.state_dict()  # saved at different times, as loader workers do
        trained += _values(next(b) for _ in range(300))
        state_b = b.state_dict()
        _values(next(a) for _ in range(50))  # read after its save: not trained on
        a.close()
        b.close()
        # the restarted run (its own job name), one consumer per saved state
        results = _resume_together(lambda: shared("run-2"), {"a": state_a, "b": state_b})
    rest = results["a"][0] + results["b"][0]
    assert sorted(trained + rest) == [10 * i for i in range(1500)]


def _resume_together(make: Any, states: dict[str, Any], timeout_s: float = 90.0
                     ) -> dict[str, tuple[list[int], Any]]:
    """Restore each of ``states`` into an iterator of ``make()`` of its own, all at once (the
    resumed job of a shared one waits for every consumer that saved it): what each yielded,
    and its state at its end."""
    import threading

    results: dict[str, tuple[list[int], Any]] = {}

    def resume(key: str, state: Any) -> None:
        it = iter(make())
        it.load_state_dict(state)
        results[key] = (_values(it), it.state_dict())

    threads = [threading.Thread(target=resume, args=item, daemon=True)
               for item in states.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s)
    assert not any(t.is_alive() for t in threads), (
        f"the resumed consumers did not end within {timeout_s:.0f} s: {sorted(results)} ended")
    return results


@pytest.mark.timeout(180)
def test_a_consumer_saved_at_the_end_of_a_shared_job_rejoins_its_resume() -> None:
    """A consumer that read the shared job to its end saves a position the job's resume
    waits for: restored, it joins the resumed job and yields nothing, and the consumer saved
    mid-way yields exactly what it had not (before, the resumed job waited for it forever)."""
    with InProcessCluster(num_workers=2) as cluster:
        def shared(name: str) -> cv.data.Dataset:
            return _pipeline(1000).apply(cv.data.service.distribute(
                "dynamic", cluster.target, job_name=name))

        a, b = iter(shared("run-1")), iter(shared("run-1"))
        trained = _values(next(b) for _ in range(100))
        state_b = b.state_dict()
        trained += _values(a)  # to the job's end (b holds what it fetched ahead)
        state_a = pickle.loads(pickle.dumps(a.state_dict()))
        assert state_a["root"]["finished"] and state_a["root"]["consumers"] == 2, state_a
        b.close()
        results = _resume_together(lambda: shared("run-2"), {"a": state_a, "b": state_b})
    (rest_a, saved_a), (rest_b, saved_b) = results["a"], results["b"]
    assert rest_a == []
    assert sorted(trained + rest_b) == [10 * i for i in range(1000)]
    assert saved_a["root"]["finished"] and saved_b["root"]["finished"]


def test_a_shared_off_job_refuses_to_restore() -> None:
    with InProcessCluster(num_workers=1) as cluster:
        def shared() -> cv.data.Dataset:
            return _pipeline(300).apply(cv.data.service.distribute(
                "off", cluster.target, job_name="off-shared"))

        a, b = iter(shared()), iter(shared())
        next(a), next(b)
        state = a.state_dict()
        a.close()
        b.close()
        restored = iter(shared())
        with pytest.raises(UnimplementedError, match="use DYNAMIC"):
            restored.load_state_dict(state)
        restored.close()
