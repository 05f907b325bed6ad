"""A convoy dataset as a ``torch.utils.data.IterableDataset``: for ``DataLoader`` workers,
``torch.distributed`` ranks and explicit epochs.

How the elements are split, each element going to one reader:

- A **local** pipeline is run whole by every reader, which keeps every ``n``-th element of
  its output: loader worker ``i`` of ``n`` on rank ``r`` of ``W`` keeps
  ``shard(n * W, i * W + r)``. Elements (batches too) stay intact, and a rank reads
  ``shard(W, r)`` whatever its number of loader workers. Random ops must agree between the
  readers: the ranks build their own pipelines, so their shuffles need a seed.
- A **distributed** pipeline (one ending in ``distribute``, or read by ``from_dataset_id``)
  is one job that all readers share, first come, first served. A job without a name gets
  one when the face is made (rank 0's, sent to the others over ``torch.distributed``), so
  loader workers, forked or spawned, and ranks read one job rather than each all of it.

Epoch ``n`` (``set_epoch(n)``; without it, the count of passes of the face's reader in that
slot: loader worker ``i``, or the process, in shared memory so that loader workers that come
and go per epoch count on) reads the job's repetition ``n``, as TensorFlow names an iteration
by job and repetition, and keys a local pipeline's randomness (the order of
``reshuffle_each_iteration`` shuffles).
"""

from __future__ import annotations

import logging
import pickle
import random
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.utils.data

from convoy._base import check
from convoy._values import pickling as _pickling
from convoy.data import Dataset, DatasetIterator
from convoy.data._core._op import Op, derive_key, replaced, seeded, upstream
from convoy.data._ops._shuffle import ShuffleOp
from convoy.data.service import ShardingPolicy
from convoy.data.service._client_shares import Share, equal_share, share_state
from convoy.data.service._distribute import DataServiceOp
from convoy.errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from convoy.torch._tensors import to_torch

EqualShares = bool | Literal["drop", "pad"]

log = logging.getLogger(__name__)

#: Readers (loader workers) whose passes a face counts.
MAX_READERS = 1024
#: Why default equal shares could not apply, each logged once in a process.
_LOGGED: set[str] = set()


class IterableDataset(torch.utils.data.IterableDataset[Any]):
    """The elements of a convoy ``dataset``, local or distributed, as torch tensors.

    For ``DataLoader(ds, batch_size=None, num_workers=n)``: the loader workers (and the
    ``world_size`` ranks) split the elements, each read once per epoch. ``rank`` and
    ``world_size`` default to ``torch.distributed``'s when it is initialised, else 0 and 1.
    Call ``set_epoch(n)`` before each epoch, as with ``DistributedSampler``; without it,
    each pass (``iter()`` of the loader) is the next epoch, whatever ``num_workers`` and
    ``persistent_workers``.

    Tensors are always writable (shared with the array where numpy allows writing it, else
    copied), dtypes are kept, byte strings come as lists of ``bytes``, numbers as 0-d
    tensors; tuples, namedtuples, lists and dicts keep their structure.

    ``equal_shares`` (``True`` meaning ``"drop"``, or ``"pad"``) gives every rank the same
    number of elements (counted over its loader workers): ``"drop"`` leaves out the tail that
    cannot be shared equally (fewer than ``world_size`` elements), ``"pad"`` adds copies of
    early elements. By default (``None``) ``"pad"`` with more than one rank, as
    ``DistributedSampler`` pads, where equal shares apply (else unequal shares, logged once);
    ``False`` for ``torch.distributed.algorithms.Join``-style loops. A local pipeline needs a
    known length. A distributed one (DYNAMIC, not a coordinated read) is shared as it is
    read, the dispatcher keeping count; its ranks must all come, else the others fail after
    ``dispatcher_timeout_ms``.
    """

    def __init__(self, dataset: Dataset, *, rank: int | None = None,
                 world_size: int | None = None,
                 equal_shares: EqualShares | None = None) -> None:
        if not isinstance(dataset, Dataset):
            raise InvalidArgumentError(
                f"dataset must be a convoy.data.Dataset, got {type(dataset).__name__}")
        self.rank, self.world_size = _rank_and_world_size(rank, world_size)
        _choose_sparse_checks()
        self.distributed = any(isinstance(op, DataServiceOp) for op in upstream(dataset._op))
        self.equal_shares = _applied_equal_shares(dataset, self.distributed, self.world_size,
                                                  equal_shares)
        if self.distributed:
            dataset = _named_jobs(dataset, self.world_size)
        else:
            _check_local(dataset, self.world_size)
        self.dataset = dataset
        # set_epoch's value (-1: not set), and each reader's count of its passes, in shared
        # memory so that loader workers, forked or spawned, persistent or not, see them
        self._epoch = torch.full((), -1, dtype=torch.int64).share_memory_()
        self._passes = torch.zeros(MAX_READERS, dtype=torch.int64).share_memory_()
        self._seed = random.getrandbits(63)
        self._pass: tuple[int, DatasetIterator | Share | None] = (-1, None)  # being read
        self._ended: DatasetIterator | Share | None = None  # the reading of the pass that ended
        self._resume: dict[str, Any] | None = None  # from load_state_dict, for the next pass

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` (its own repetition of a distributed dataset's job) on the
        next pass, in this process and in its loader workers."""
        self._epoch.fill_(check.integer("epoch", epoch, 0))

    def __iter__(self) -> Iterator[Any]:
        resume, self._resume = self._resume, None
        slot = _slot()
        if resume is not None:  # the pass that was saved, from where it stopped
            epoch = resume["epoch"]
            self._passes[slot] = resume["passes"]
            if resume.get("ended") and resume["iterator"] is None and resume["share"] is None:
                return  # (else it rejoins the resumed job at its end, reading nothing)
        else:
            epoch = int(self._epoch)
            if epoch < 0:
                epoch = int(self._passes[slot])
            self._passes[slot] += 1
        if self.distributed and self.equal_shares:
            yield from self._equal_pass(epoch, None if resume is None else resume["share"])
            return
        saved = None if resume is None else resume["iterator"]
        with DatasetIterator(self._epoch_dataset(epoch), derive_key(0, epoch),
                             saved) as iterator:
            self._pass = (epoch, iterator)
            for element in iterator:
                yield to_torch(element)
            self._pass, self._ended = (epoch, None), iterator

    def state_dict(self) -> dict[str, Any]:
        """This reader's position as plain data: its pass (epoch) and where in it, for
        torchdata's ``StatefulDataLoader`` (which saves each loader worker's) or a
        ``Checkpoint``. Within an equal share of a distributed dataset, it holds the elements
        this reader took ahead of its caller (a few), and once the shares are settled at the
        end of the epoch, waits for those handed over to it."""
        epoch, reading = self._pass
        # a loader worker's pass that ended resumes at its end: the others' may go on, in
        # the job's resumed iteration, which waits for every reader of the job to rejoin
        ended = reading is None and epoch >= 0 and torch.utils.data.get_worker_info() is not None
        if ended and self.distributed:
            reading = self._ended
        share = reading if isinstance(reading, Share) else None
        iterator = reading if isinstance(reading, DatasetIterator) else None
        saved = None
        if iterator is not None:
            try:
                saved = iterator.state_dict()
            except (UnimplementedError, FailedPreconditionError):
                if not ended:
                    raise
                # (a reading that cannot be saved resumes at its end alone)
        return {"epoch": epoch, "passes": int(self._passes[_slot()]), "iterator": saved,
                "share": None if share is None else share_state(share), "ended": ended}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass resume the one ``state`` (from :meth:`state_dict`) saved."""
        if not isinstance(state, dict) or not (
                {"epoch", "passes", "iterator"} <= set(state)
                <= {"epoch", "passes", "iterator", "share", "ended"}):
            raise InvalidArgumentError(
                "state must be a dict returned by IterableDataset.state_dict(), got "
                f"{type(state).__name__}")
        state = {"share": None, **state}
        shared = bool(self.distributed and self.equal_shares)
        if state[("iterator", "share")[shared]] is None and state[("share", "iterator")[
                shared]] is not None:
            raise InvalidArgumentError(
                "state was saved within a pass by a face with other equal_shares: "
                f"{'without' if shared else 'with'} equal shares of a distributed dataset, "
                f"this one {'with' if shared else 'without'}")
        if state["iterator"] is None and state["share"] is None and not state.get("ended"):
            # saved between passes: the next starts afresh
            self._passes[_slot()] = state["passes"]
            self._resume = None
        else:
            self._resume = state

    def _equal_pass(self, epoch: int, saved: dict[str, Any] | None) -> Iterator[Any]:
        """This reader's equal share of the epoch's pass of the job (see ``_client_shares``), from
        ``saved`` if given."""
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        dataset = self._epoch_dataset(epoch)
        (op,) = _service_ops(dataset)
        share = Share(f"job {op.options.job_name!r}, repetition {epoch}", self.rank,
                      self.world_size, worker, workers, self.equal_shares == "pad",
                      op.options.timeout_s)
        if saved is not None:
            share.resume(saved)
        key = derive_key(0, epoch)
        self._pass = (epoch, share)
        for element in equal_share(lambda: DatasetIterator(dataset, key, share.iterator_state),
                                   op.dispatcher(), share):
            yield to_torch(element)
        self._pass, self._ended = (epoch, None), share

    def _epoch_dataset(self, epoch: int) -> Dataset:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.distributed:
            return _at_repetition(self.dataset, epoch, workers * self.world_size)
        dataset = _equal(self.dataset, self.world_size, self.equal_shares)
        readers = workers * self.world_size
        return dataset if readers == 1 else dataset.shard(readers,
                                                          worker * self.world_size + self.rank)

    # Spawned loader workers unpickle the dataset: its unseeded shuffles then draw their
    # seeds from one sequence, equal in every worker, so the workers still agree.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pass"] = (-1, None)  # a live iterator stays in its process
        state["dataset"] = _pickling.dumps(self.dataset, "the dataset cannot be sent to the "
                                           "DataLoader's worker processes")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        with seeded(state["_seed"]):
            state["dataset"] = pickle.loads(state["dataset"])
        self.__dict__.update(state)


def _rank_and_world_size(rank: int | None, world_size: int | None) -> tuple[int, int]:
    initialised = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialised else 1
    world_size = check.integer("world_size", world_size, 1)
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    rank = check.integer("rank", rank, 0)
    if rank >= world_size:
        raise InvalidArgumentError(f"rank must be less than world_size ({world_size}), "
                                   f"got {rank}")
    return rank, world_size


def _choose_sparse_checks() -> None:
    """Sparse tensors from loader workers are rebuilt by torch's own pickling, which warns in
    this process unless the program chose whether torch checks sparse invariants. torch's
    default is not to check: make that choice explicit (a program that enabled checks keeps
    them)."""
    checks = torch.sparse.check_sparse_tensor_invariants
    if not checks.is_enabled():
        checks.disable()


def _slot() -> int:
    """This reader's slot in a face's count of passes: its loader worker's id, else 0."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return 0
    if info.id >= MAX_READERS:
        raise InvalidArgumentError(
            f"a face counts the passes of at most {MAX_READERS} loader workers: give "
            f"DataLoader fewer num_workers, got {info.num_workers}")
    return int(info.id)


def _applied_equal_shares(dataset: Dataset, distributed: bool, world_size: int,
                          value: Any) -> Literal["drop", "pad"] | None:
    """The equal shares the face applies: ``value``'s, or by default (``None``) ``"pad"``
    with more than one rank, where they can apply (else none, logged once)."""
    mode = _equal_shares(value) if value is not None else "pad" if world_size > 1 else None
    if mode is None:
        return None
    why = _why_unequal(dataset) if distributed else _why_unequal_local(dataset)
    if why is None:
        return mode
    if value is not None:
        raise InvalidArgumentError(why)
    if why not in _LOGGED:
        _LOGGED.add(why)
        log.warning("The %d ranks read unequal shares (the default, equal_shares='pad', "
                    "cannot apply): %s", world_size, why)
    return None


def _equal_shares(value: Any) -> Literal["drop", "pad"] | None:
    if value is False:
        return None
    if value is True:
        return "drop"
    if value in ("drop", "pad"):
        return value
    raise InvalidArgumentError(
        f"equal_shares must be False, True, 'drop' or 'pad', got {value!r}")


def _service_ops(dataset: Dataset) -> list[DataServiceOp]:
    return [op for op in upstream(dataset._op) if isinstance(op, DataServiceOp)]


def _why_unequal(dataset: Dataset) -> str | None:
    """Why equal shares cannot apply to a distributed dataset, if they cannot."""
    ops = _service_ops(dataset)
    if len(ops) != 1:
        return f"equal_shares needs a dataset reading one job of the data service, got {len(ops)}"
    options = ops[0].options
    if options.processing_mode is ShardingPolicy.OFF:
        return ("equal_shares shares one pass of the data among the ranks; under "
                "processing_mode OFF each worker makes a whole pass: use DYNAMIC "
                "('distributed_epoch'), or equal_shares=False")
    if options.num_consumers is not None:
        return ("equal_shares cannot apply to a coordinated read (num_consumers): its rounds "
                "already give every consumer the same number of elements")
    return None


def _why_unequal_local(dataset: Dataset) -> str | None:
    """Why equal shares cannot apply to a local pipeline, if they cannot."""
    if dataset.cardinality() < 0:
        return ("equal_shares needs a local pipeline of known length; this one's "
                f"cardinality() is {dataset.cardinality()}")
    return None


def _check_local(dataset: Dataset, world_size: int) -> None:
    if world_size > 1 and any(isinstance(op, ShuffleOp) and not op.fixed_seed
                              for op in upstream(dataset._op)):
        raise InvalidArgumentError(
            f"the {world_size} ranks split the elements of one order, so each rank's "
            "pipeline must shuffle alike: give shuffle a seed")


def _equal(dataset: Dataset, world_size: int,
           equal_shares: Literal["drop", "pad"] | None) -> Dataset:
    """``dataset`` cut (``"drop"``) or padded with its first elements (``"pad"``) to a
    multiple of ``world_size``."""
    n = dataset.cardinality()
    if not equal_shares or n % world_size == 0:
        return dataset
    if equal_shares == "drop":
        return dataset.take(n - n % world_size)
    padding = world_size - n % world_size
    while dataset.cardinality() < padding + n:  # fewer elements than ranks
        dataset = dataset.concatenate(dataset)
    return dataset.take(n + padding)


# ----- distributed datasets: the job's name and repetition -----------------------------------

def _named_jobs(dataset: Dataset, world_size: int) -> Dataset:
    """``dataset`` with a name for each job that has none, the same in every rank."""
    anonymous = [op for op in upstream(dataset._op)
                 if isinstance(op, DataServiceOp) and not op.options.job_name]
    if not anonymous:
        return dataset
    base = _agreed_name(world_size)
    names = {id(op): f"{base}/{index}" for index, op in enumerate(anonymous)}

    def rename(op: Op) -> Op | None:
        if not isinstance(op, DataServiceOp) or id(op) not in names:
            return None
        return op.named(names[id(op)])

    return Dataset(replaced(dataset._op, rename))


def _agreed_name(world_size: int) -> str:
    name = f"convoy.torch.{uuid.uuid4().hex}"
    if world_size == 1:
        return name
    if not (dist.is_available() and dist.is_initialized()
            and dist.get_world_size() == world_size):
        raise InvalidArgumentError(
            f"the {world_size} ranks must read one job: give distribute a job_name, or "
            "initialise torch.distributed so that rank 0 names the job for all")
    names = [name]
    dist.broadcast_object_list(names, src=0)
    return str(names[0])


def _at_repetition(dataset: Dataset, repetition: int, readers: int) -> Dataset:
    """``dataset`` reading repetition ``repetition`` of each of its jobs."""

    def at_repetition(op: Op) -> Op | None:
        if not isinstance(op, DataServiceOp):
            return None
        if op.options.num_consumers is not None and readers > 1:
            raise InvalidArgumentError(
                "a coordinated read (num_consumers) has one reader per consumer_index: read "
                "it with num_workers=0 and one rank per consumer")
        return op.at_repetition(repetition)

    return Dataset(replaced(dataset._op, at_repetition))
