"""``place(module)``: a ``torch.nn.Module`` whose parameters are variables on the parameter
servers.

:func:`place` changes the module in place (as ``torch.nn.utils.parametrize`` and FSDP's
``fully_shard`` do: each module holding parameters gets a subclass of its own class) and
returns it. Its parameters become ``cv.Variable`` s, made through the strategy whose scope is
active (so its partitioner splits them as it splits any variable); the weights of
``nn.Embedding`` and ``nn.EmbeddingBag`` are read by rows, the others whole.

Each call of the module pulls the parameters it needs into fresh tensors of the calling
thread, one call per parameter server: the embeddings' ids are found first, by running the
forward without values up to its last embedding call when the previous call showed they are
not all known at its first parameter use (see :class:`convoy.torch._step.Step`).
``model.gradients()`` then returns the ``(gradient, variable)`` pairs of this thread's pulls
whose tensors received gradients since its last call, and releases them. A forward without
``backward()`` keeps nothing: a pull's tensors are held by the autograd graph alone until a
backward reaches them. Gradients a scheduled function did not take are released when it ends.
"""

from __future__ import annotations

import operator
import threading
import uuid
import weakref
from typing import Any

import cloudpickle
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from convoy._base.bounded import BoundedDict
from convoy._values.pickling import PickleCache, digested, keep_sent_pickles_in
from convoy._values.pickling import dumps as _dumps
from convoy.distribute.variables import Variable
from convoy.errors import InvalidArgumentError
from convoy.torch import _root
from convoy.torch._dynamic import _DynamicBase
from convoy.torch._step import Call, Enough, Recording, Slot, Step, ThreadState, local

_ROW_READ = (nn.Embedding, nn.EmbeddingBag)


#: (module token) -> (embedding calls, look for ids first) learned from the last call.
_plans: dict[str, tuple[int, bool]] = {}
_PLANS_KEPT = 4096


def _ids(input: torch.Tensor, copy: bool) -> np.ndarray:
    if not isinstance(input, torch.Tensor) or input.dtype not in _ID_DTYPES:
        raise InvalidArgumentError(f"an embedding takes a tensor of int32 or int64 ids, got "
                                   f"{getattr(input, 'dtype', type(input).__name__)}")
    array = input.numpy() if input.device.type == "cpu" and not input.requires_grad else \
        input.detach().cpu().numpy()
    return array.copy() if copy else array


_ID_DTYPES = (torch.int32, torch.int64)


#: The hooks of every module (``nn.modules.module.register_module_forward_hook``...): when
#: this torch keeps them elsewhere, placed modules are always called through
#: ``nn.Module.__call__``.
_GLOBAL_HOOKS: tuple[Any, ...] = tuple(
    getattr(torch.nn.modules.module, f"_global_{kind}_hooks", None)
    for kind in ("forward_pre", "forward", "backward_pre", "backward"))
if not all(isinstance(hooks, dict) for hooks in _GLOBAL_HOOKS):
    _GLOBAL_HOOKS = ({None: None},)
#: A module's own hooks.
_hook_tables = operator.itemgetter("_forward_pre_hooks", "_forward_hooks",
                                   "_backward_pre_hooks", "_backward_hooks")


def _module_call(module: nn.Module, args: tuple, kwargs: dict) -> Any:
    """``module(*args, **kwargs)``: straight to ``forward`` when ``nn.Module.__call__`` would
    do just that (no hooks, not traced, not compiled), else through it. (A step's modules are
    called several times a step: the shortcut is most of their cost of calling.)"""
    d = module.__dict__
    if (any(_GLOBAL_HOOKS) or any(_hook_tables(d)) or d.get("_compiled_call_impl") is not None
            or torch._C._get_tracing_state()):
        return nn.Module.__call__(module, *args, **kwargs)
    return module.forward(*args, **kwargs)


# ----- the forwards and attributes of placed modules -------------------------------------------
def _served(module: nn.Module, input: torch.Tensor) -> tuple[Call | None, np.ndarray]:
    """For an embedding's forward: the call serving ``input``'s rows; None while the forward
    only looks for ids (the call is recorded)."""
    slot: Slot = module.__dict__["_convoy_slots"]["weight"]
    padding_idx = module.padding_idx
    state = local.state
    recording = state.recording
    if recording is not None:
        ids = _ids(input, copy=True)
        recording.calls.append(Call(slot, ids, padding_idx))
        if len(recording.calls) >= recording.limit:
            raise Enough
        return None, ids
    for step in reversed(state.steps):
        if slot in step.slots:
            ids = _ids(input, copy=False)
            return step.rows(slot, ids, padding_idx), ids
    raise AssertionError("an embedding's forward outside a call of a placed module")


def _embedding_forward(self: nn.Embedding, input: torch.Tensor) -> torch.Tensor:
    call, ids = _served(self, input)
    if call is None:
        return torch.zeros((), dtype=self.__dict__["_convoy_slots"]["weight"].dtype).expand(
            (*input.shape, self.embedding_dim))
    assert call.block is not None
    # The call's rows, in order, are a slice of the block: copied (clone's backward is
    # free), so the output is no view of a leaf and may be changed in place, as PyTorch's.
    if call.whole:
        return call.block.clone()
    rows = call.block.narrow(0, call.start, ids.size)
    return rows.reshape((*input.shape, *rows.shape[1:])).clone()


def _embedding_bag_forward(self: nn.EmbeddingBag, input: torch.Tensor,
                           offsets: torch.Tensor | None = None,
                           per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
    call, ids = _served(self, input)
    if call is None:
        bags = input.shape[0] if input.dim() == 2 else (
            (offsets.numel() if offsets is not None else 0) - int(self.include_last_offset))
        return torch.zeros((), dtype=self.__dict__["_convoy_slots"]["weight"].dtype).expand(
            (bags, self.embedding_dim))
    assert call.block is not None
    weight, padding_idx = call.block, None
    if input.dim() == 2 and offsets is None and self.padding_idx is None:
        # Bags of equal length over the call's rows in order: a reduction over them, whose
        # backward costs much less than embedding_bag's.
        rows = weight if call.whole else weight.narrow(0, call.start, ids.size).reshape(
            (*input.shape, *weight.shape[1:]))
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise InvalidArgumentError(f"per_sample_weights needs mode 'sum', not "
                                           f"{self.mode!r}")
            return (rows * per_sample_weights.unsqueeze(-1)).sum(dim=1)
        if self.mode == "mean":
            return rows.mean(dim=1)
        return rows.sum(dim=1) if self.mode == "sum" else rows.amax(dim=1)
    if call.whole:
        weight = weight.reshape(ids.size, self.embedding_dim)
    positions = torch.arange(call.start, call.start + ids.size).reshape(input.shape)
    if self.padding_idx is not None:
        padded = torch.from_numpy(ids == self.padding_idx)
        if bool(padded.any()):  # padding ids read a zero row, which bags leave out
            padding_idx = weight.shape[0]
            weight = torch.cat([weight, weight.new_zeros((1, *weight.shape[1:]))])
            positions = torch.where(padded, padding_idx, positions)
    return F.embedding_bag(positions, weight, offsets, mode=self.mode,
                           per_sample_weights=per_sample_weights,
                           include_last_offset=self.include_last_offset,
                           padding_idx=padding_idx)


def _parameter(name: str) -> property:
    def get(self: nn.Module) -> torch.Tensor:
        slot: Slot = self.__dict__["_convoy_slots"][name]
        state = local.state
        if state.recording is not None:
            return slot.zeros()
        for step in reversed(state.steps):
            if slot in step.slots:
                dense = step.dense
                return dense[slot] if dense is not None and slot in dense else \
                    step.dense_value(slot)
        # outside a call of the module: the value on the ps, now
        return torch.from_numpy(np.asarray(slot.variable.read_value()))

    return property(get, doc=f"The placed parameter {name!r}: inside a call of the module, "
                             f"the tensor pulled for it; elsewhere its value on the ps.")


def _placed_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    state = local.state
    if state.recording is not None:
        return _module_call(self, args, kwargs)
    if state.steps:
        tree = self.__dict__["_convoy_tree"]
        for step in reversed(state.steps):
            if step.slots.issuperset(tree):  # a step of a module holding this one serves it
                return _module_call(self, args, kwargs)
    state.new_step()
    step = Step(self, state)
    key = self.__dict__["_convoy_plan"]
    plan = _plans.get(key)
    if plan is not None and plan[1]:
        step.prefetch(_find_ids(self, state, plan[0], args, kwargs))
    state.steps.append(step)
    try:
        output = _module_call(self, args, kwargs)
    finally:
        state.steps.pop()
    if len(_plans) > _PLANS_KEPT:  # modules placed again and again
        _plans.clear()
    _plans[key] = step.plan()
    return output


def _find_ids(module: nn.Module, state: ThreadState, limit: int, args: tuple,
              kwargs: dict) -> list[Call]:
    """The embedding calls of a forward without values, up to the ``limit``-th."""
    recording = state.recording = Recording(limit)
    try:
        with torch.no_grad():
            _module_call(module, args, kwargs)
    except (Enough, Exception):  # a failure on zeros: the real forward decides
        pass
    finally:
        state.recording = None
    return recording.calls


class _Pickling(threading.local):
    whole = False  # pickling a placed module's tree itself, not its cached form


_pickling = _Pickling()
#: The pickled form of each placed module sent from here, with what it was made from.
_sent: weakref.WeakKeyDictionary[nn.Module, tuple[Any, bytes, bytes]] = \
    weakref.WeakKeyDictionary()
keep_sent_pickles_in(_sent)  # they name parameter servers' addresses
#: Placed modules received here: token -> (digest of their pickle, module), newest last.
_received: BoundedDict[str, tuple[bytes, nn.Module]] = BoundedDict(64)
_edits: dict[str, int] = {}  # token -> attribute assignments in its placed modules


def _fingerprint(root: nn.Module) -> Any:
    """Changes when the module tree's attributes, modes or buffers may have changed."""
    return (_edits.get(root.__dict__["_convoy_token"], 0),
            tuple((id(m), m.training, tuple((id(b), b._version) for b in m._buffers.values()
                                           if b is not None))
                  for m in root.modules()))


def _reduce_ex(self: nn.Module, protocol: Any) -> Any:
    if _is_root(self) and not _pickling.whole:
        # A root module travels as its pickle, made again only when it changed: a
        # scheduled function's arguments are pickled for every call, and a worker then
        # reuses the module it has (its calls keep their state per thread).
        fingerprint = _fingerprint(self)
        sent = _sent.get(self)
        if sent is None or sent[0] != fingerprint:
            _pickling.whole = True
            try:
                data = _dumps(self, "a placed module cannot be sent to the workers")
            finally:
                _pickling.whole = False
            sent = _sent[self] = (fingerprint, *digested(data))
        return (_received_module, (self.__dict__["_convoy_token"], sent[1], sent[2]))
    # Rebuilt from the module's own class, pickled once per process (a class defined in a
    # script pickles by value, slowly); empty hook tables are remade, not sent.
    base = type(self).__bases__[0]
    state = {k: v for k, v in self.__getstate__().items()  # the module's own (not __dict__)
             if not (isinstance(v, (dict, set)) and not v and k != "_convoy_slots")}
    return (_rebuild, (_pickled_class(base), tuple(self.__dict__["_convoy_slots"]),
                       _is_root(self)), state)


_pickled_classes = PickleCache()
_unpickled_classes: dict[bytes, type] = {}


def _pickled_class(cls: type) -> tuple[bytes, bytes]:
    """(digest, pickled class), made once per class; the class of a user's own module
    travels by value (see :mod:`convoy._values.pickling`)."""
    return _pickled_classes.get(cls, f"the class {cls.__qualname__} of a placed module cannot "
                                     f"be sent to the workers")


def _received_module(token: str, digest: bytes, data: bytes) -> nn.Module:
    """The module a pickle of ``digest`` holds: the one received before, if the same."""
    known = _received.get(token)
    if known is not None and known[0] == digest:
        return known[1]
    module = cloudpickle.loads(data)
    _received[token] = (digest, module)
    return module


def _setattr(self: nn.Module, name: str, value: Any) -> None:
    _edits[self.__dict__["_convoy_token"]] = _edits.get(self.__dict__["_convoy_token"], 0) + 1
    base: Any = type(self).__bases__[0]
    base.__setattr__(self, name, value)


def _delattr(self: nn.Module, name: str) -> None:
    _edits[self.__dict__["_convoy_token"]] = _edits.get(self.__dict__["_convoy_token"], 0) + 1
    base: Any = type(self).__bases__[0]
    base.__delattr__(self, name)


def _rebuild(pickled: tuple[bytes, bytes], names: tuple[str, ...], root: bool) -> nn.Module:
    base: Any = _unpickled_classes.get(pickled[0])
    if base is None:
        base = _unpickled_classes[pickled[0]] = cloudpickle.loads(pickled[1])
    module = base.__new__(base)
    module.__dict__.update({key: empty.copy() for key, empty in _EMPTY_STATE.items()})
    module.__class__ = _placed_class(base, names, root)
    return module


#: The tables an ``nn.Module`` starts with empty (its hooks...), which a pickle leaves out.
_EMPTY_STATE = {key: value for key, value in nn.Module().__dict__.items()
                if isinstance(value, (dict, set)) and not value}


def _is_root(module: nn.Module) -> bool:
    return "gradients" in type(module).__dict__


def _save_to_state_dict(self: nn.Module, destination: dict[str, Any], prefix: str,
                        keep_vars: bool) -> None:
    base: Any = type(self).__bases__[0]
    base._save_to_state_dict(self, destination, prefix, keep_vars)
    for name, slot in self.__dict__["_convoy_slots"].items():
        destination[prefix + name] = torch.from_numpy(np.asarray(slot.variable.read_value()))


def _load_from_state_dict(self: nn.Module, state_dict: dict[str, Any], prefix: str,
                          local_metadata: Any, strict: bool, missing_keys: list[str],
                          unexpected_keys: list[str], error_msgs: list[str]) -> None:
    base: Any = type(self).__bases__[0]
    base._load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                               unexpected_keys, error_msgs)
    for name, slot in self.__dict__["_convoy_slots"].items():
        key = prefix + name
        if key in unexpected_keys:
            unexpected_keys.remove(key)
        if key not in state_dict:
            missing_keys.append(key)
            continue
        value = state_dict[key]
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else \
            np.asarray(value)
        if tuple(array.shape) != slot.shape:
            error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                              f"{tuple(array.shape)}, the parameter has {slot.shape}")
            continue
        slot.variable.assign(array)


_classes: dict[tuple[type, tuple[str, ...], bool], type] = {}


def _placed_class(base: type, names: tuple[str, ...], root: bool) -> type:
    """The subclass of ``base`` a placed module of it becomes (one per base and names)."""
    key = (base, names, root)
    cls = _classes.get(key)
    if cls is not None:
        return cls
    namespace: dict[str, Any] = {name: _parameter(name) for name in names}
    namespace.update(__call__=_placed_call, __reduce_ex__=_reduce_ex, __setattr__=_setattr,
                     __delattr__=_delattr, parameters=_root.parameters,
                     named_parameters=_root.named_parameters, zero_grad=_root.zero_grad,
                     _save_to_state_dict=_save_to_state_dict,
                     _load_from_state_dict=_load_from_state_dict,
                     __doc__=base.__doc__, __module__=base.__module__)
    if "weight" in names and issubclass(base, nn.EmbeddingBag):
        namespace["forward"] = _embedding_bag_forward
    elif "weight" in names and issubclass(base, nn.Embedding):
        namespace["forward"] = _embedding_forward
    if root:
        namespace.update(gradients=_root.gradients, variables=property(_root.variables),
                         trainable_variables=property(_root.trainable_variables),
                         _checkpoint_children=_root.checkpoint_children)
    cls = _classes[key] = type(base.__name__, (base,), namespace)
    cls.__qualname__ = base.__qualname__
    return cls


# ----- place ---------------------------------------------------------------------------------
def _check_embedding(path: str, module: nn.Module) -> None:
    for option in ("max_norm", "scale_grad_by_freq"):
        if getattr(module, option, None):
            raise InvalidArgumentError(
                f"{path or 'the module'} ({type(module).__name__}) sets {option}, which a "
                f"table on parameter servers does not support")


def _numpy(name: str, parameter: torch.Tensor) -> np.ndarray:
    if parameter.dtype == torch.bfloat16 or parameter.is_complex() or \
            not parameter.is_floating_point():
        raise InvalidArgumentError(f"parameter {name!r} has dtype {parameter.dtype}; placed "
                                   f"parameters are float16, float32 or float64")
    return parameter.detach().cpu().numpy().copy()


def place(module: nn.Module) -> nn.Module:
    """Make ``module``'s parameters variables on the parameter servers of the strategy whose
    ``scope()`` is active, and return ``module`` itself, changed in place.

    Each parameter becomes a ``cv.Variable`` named by its ``state_dict`` key and made
    through the strategy (its partitioner splits it by rows as any variable); a parameter
    shared by several modules becomes one variable. The weights of ``nn.Embedding`` and
    ``nn.EmbeddingBag`` are read by rows: a call pulls only the rows it looks up, and their
    gradients go back as :class:`~convoy.IndexedSlices`.

    Call the module as usual, then ``loss.backward()`` and
    ``optimizer.apply_gradients(model.gradients())``. Each call pulls the parameters into
    fresh tensors of the calling thread (one call per parameter server; a forward that uses
    other parameters before its embeddings, or calls several, may run up to its last
    embedding call a first time without gradients, on zeros, to find their ids). Outside a
    call, ``model.fc.weight`` reads the value on the ps. ``model.variables`` lists the
    variables; ``parameters()`` yields the tensors of this thread's step holding gradients
    that ``gradients()`` will return (so ``torch.nn.utils.clip_grad_norm_`` clips them), and
    refuses a ``torch.optim`` optimizer; ``state_dict()``/``load_state_dict()`` read and
    write the variables. Buffers (batch-norm statistics) stay in the module, each process
    with its own. ``cv.train.Checkpoint(model=model)`` saves the variables (with their
    optimizer slots) and the buffers. A ``cv.torch.DynamicEmbedding(Bag)`` inside keeps its
    table, moved to the parameter servers with its rows if it was made outside the scope;
    ``gradients()`` includes its rows' (by id), and a Checkpoint saves its ids, rows and
    slots. Sent to workers (captured by a scheduled function or
    passed as its argument), the module is pickled again only once its attributes, modes
    (``train()``/``eval()``) or buffers changed; a worker reuses the copy it has.
    """
    if not isinstance(module, nn.Module):
        raise InvalidArgumentError(f"place takes a torch.nn.Module, got "
                                   f"{type(module).__name__}")
    if "_convoy_slots" in module.__dict__:
        raise InvalidArgumentError("this module is placed already")
    slots: dict[int, Slot] = {}
    for path, submodule in module.named_modules():
        if isinstance(submodule, _ROW_READ):
            _check_embedding(path, submodule)
        if isinstance(submodule, _DynamicBase):
            submodule._placed()
        own: dict[str, Slot] = {}
        for name, parameter in list(submodule._parameters.items()):
            if parameter is None:
                continue
            key = f"{path}.{name}" if path else name
            slot = slots.get(id(parameter))
            if slot is None:
                value = _numpy(key, parameter)
                slot = slots[id(parameter)] = Slot(
                    Variable(value, name=key, trainable=parameter.requires_grad),
                    tuple(value.shape), parameter.dtype,
                    isinstance(submodule, _ROW_READ) and name == "weight")
            own[name] = slot
            del submodule._parameters[name]
        submodule.__dict__["_convoy_slots"] = own
    token = uuid.uuid4().hex
    for path, submodule in module.named_modules():
        tree = tuple({id(s): s for m in submodule.modules()
                      for s in m.__dict__.get("_convoy_slots", {}).values()}.values())
        root = submodule is module
        if not tree and not root:
            del submodule.__dict__["_convoy_slots"]
            continue
        submodule.__dict__.update(_convoy_tree=tree, _convoy_slotset=frozenset(tree),
                                  _convoy_dense=tuple(s for s in tree if not s.rows),
                                  _convoy_token=token, _convoy_plan=f"{token}:{path}")
        submodule.__class__ = _placed_class(type(submodule),
                                            tuple(submodule.__dict__["_convoy_slots"]), root)
    return module
