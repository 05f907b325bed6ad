"""cv.torch.place in this process (variables made outside a strategy's scope live here): a
placed module computes what the plain module computes, pulls once per call, keeps each
thread's gradients apart, and keeps nothing of a forward without backward."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import convoy as cv
import convoy.torch._step as stepping
from convoy.distribute._worker_calls import RunningCall, enter_call
from convoy.errors import InvalidArgumentError


class BagModel(nn.Module):
    def __init__(self, rows=50, dim=4):
        super().__init__()
        self.bag = nn.EmbeddingBag(rows, dim, mode="mean")
        self.fc = nn.Linear(dim, 1)

    def forward(self, ids):
        return self.fc(self.bag(ids)).squeeze(-1)


class TwoLookups(nn.Module):
    """Uses a dense layer before its table, and looks the table up twice."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Linear(1, 1)
        self.table = nn.Embedding(30, 3, padding_idx=0)
        self.out = nn.Linear(6, 1)

    def forward(self, users, items):
        scale = self.scale(torch.ones(1, 1))
        features = torch.cat([self.table(users), self.table(items)], dim=-1)
        return (self.out(features) * scale).squeeze(-1)


def twins(cls, **kwargs):
    """(plain module, placed copy with the same initial values)."""
    torch.manual_seed(0)
    plain = cls(**kwargs)
    placed = cls(**kwargs)
    placed.load_state_dict(plain.state_dict())
    return plain, cv.torch.place(placed)


def dense_gradients(pairs):
    """{variable name: dense gradient} from apply_gradients pairs (rows summed)."""
    out = {}
    for gradient, variable in pairs:
        if isinstance(gradient, cv.IndexedSlices):
            dense = np.zeros(variable.shape, np.float32)
            np.add.at(dense, gradient.indices, gradient.values)
            gradient = dense
        out[variable.name] = out.get(variable.name, 0) + gradient
    return out


@pytest.fixture
def pulls(monkeypatch):
    """Counts the pulls of placed modules (each is one call per parameter server)."""
    count = [0]
    original = stepping.pull

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(stepping, "pull", counting)
    return count


def test_outputs_and_gradients_are_those_of_the_plain_module():
    plain, placed = twins(BagModel)
    ids, target = torch.randint(0, 50, (16, 5)), torch.rand(16)
    out = placed(ids)
    F.mse_loss(out, target).backward()
    pairs = placed.gradients()
    expected = plain(ids)
    F.mse_loss(expected, target).backward()
    torch.testing.assert_close(out, expected)
    kinds = {variable.name: type(gradient) for gradient, variable in pairs}
    assert kinds == {"bag.weight": cv.IndexedSlices, "fc.weight": np.ndarray,
                     "fc.bias": np.ndarray}
    grads = dense_gradients(pairs)
    for name, parameter in plain.named_parameters():
        np.testing.assert_allclose(grads[name], parameter.grad.numpy(), atol=1e-6)
    assert placed.gradients() == []  # released


def test_module_hooks_run_as_on_the_plain_module():
    """A placed module's forward hooks, its submodules' and global ones run (calls go straight
    to forward only when there are none)."""
    _, placed = twins(BagModel)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        unhooked = placed(ids)
    seen = []
    placed.fc.register_forward_hook(lambda module, args, out: seen.append("fc") or out * 2)
    placed.register_forward_pre_hook(lambda module, args: seen.append("model"))
    with torch.no_grad():
        out = placed(ids)
    assert seen == ["model", "fc"]
    torch.testing.assert_close(out, unhooked * 2)  # fc's hook changed its output
    handle = nn.modules.module.register_module_forward_hook(
        lambda module, args, out: seen.append(type(module).__name__))
    try:
        seen.clear()
        with torch.no_grad():
            placed(ids)
    finally:
        handle.remove()
    assert seen == ["model", "EmbeddingBag", "Linear", "fc", "BagModel"]


def test_padding_offsets_and_per_sample_weights_as_pytorch_computes_them():
    torch.manual_seed(1)
    for kwargs in ({"mode": "sum"}, {"mode": "mean", "padding_idx": 2},
                   {"mode": "max", "include_last_offset": True}):
        plain = nn.EmbeddingBag(10, 3, **kwargs)
        placed = nn.EmbeddingBag(10, 3, **kwargs)
        placed.load_state_dict(plain.state_dict())
        cv.torch.place(placed)
        ids = torch.tensor([2, 1, 2, 5, 2, 7, 9, 3])
        offsets = torch.tensor([0, 3, 5, 8] if kwargs.get("include_last_offset") else [0, 3, 5])
        weights = torch.rand(8) if kwargs["mode"] == "sum" else None
        out = placed(ids, offsets, per_sample_weights=weights)
        expected = plain(ids, offsets, per_sample_weights=weights)
        torch.testing.assert_close(out, expected)
        (out * torch.arange(3.0)).sum().backward()
        (expected * torch.arange(3.0)).sum().backward()
        pairs = placed.gradients()
        if "padding_idx" in kwargs:  # padding rows get no gradient, not even a zero one
            assert 2 not in pairs[0][0].indices
        np.testing.assert_allclose(dense_gradients(pairs)["weight"],
                                   plain.weight.grad.numpy(), atol=1e-6)


def test_bags_of_equal_length_in_every_mode():
    torch.manual_seed(2)
    ids = torch.tensor([[1, 4, 4], [0, 9, 3]])
    for mode, weights in (("sum", torch.rand(2, 3)), ("sum", None), ("max", None)):
        plain = nn.EmbeddingBag(10, 3, mode=mode)
        placed = nn.EmbeddingBag(10, 3, mode=mode)
        placed.load_state_dict(plain.state_dict())
        cv.torch.place(placed)
        out, expected = placed(ids, per_sample_weights=weights), \
            plain(ids, per_sample_weights=weights)
        torch.testing.assert_close(out, expected)
        (out * torch.arange(3.0)).sum().backward()
        (expected * torch.arange(3.0)).sum().backward()
        np.testing.assert_allclose(dense_gradients(placed.gradients())["weight"],
                                   plain.weight.grad.numpy(), atol=1e-6)


def test_an_embedding_output_may_change_in_place():
    plain, placed = twins(TwoLookups)
    users = torch.tensor([[1, 2]])
    out = placed.table(users)
    out *= 2  # as on PyTorch's own output
    out.sum().backward()
    expected = plain.table(users)
    expected *= 2
    expected.sum().backward()
    np.testing.assert_allclose(dense_gradients(placed.gradients())["table.weight"],
                               plain.table.weight.grad.numpy(), atol=1e-6)


def test_one_pull_per_call_when_ids_must_be_found_first(pulls):
    plain, placed = twins(TwoLookups)
    users, items = torch.tensor([[0, 3], [4, 5]]), torch.tensor([[7, 0], [8, 9]])
    placed(users, items)  # learns that its table comes after a dense layer, twice
    placed.gradients()
    for step in range(3):
        pulls[0] = 0
        out = placed(users + step, items)
        assert pulls[0] == 1
        out.sum().backward()
        expected = plain(users + step, items)
        expected.sum().backward()
        torch.testing.assert_close(out, expected)
        grads = dense_gradients(placed.gradients())
        for name, parameter in plain.named_parameters():
            np.testing.assert_allclose(grads[name], parameter.grad.numpy(), atol=1e-6)
            parameter.grad = None


def test_ids_that_differ_from_those_found_are_pulled_on_their_own(pulls):
    class Random(nn.Module):  # the ids depend on a value, unknown to a forward on zeros
        def __init__(self):
            super().__init__()
            self.pick = nn.Linear(1, 1)
            self.table = nn.Embedding(10, 2)

        def forward(self, x):
            return self.table((self.pick(x).abs() * 3).long().clamp(0, 9))

    _, placed = twins(Random)
    for _ in range(3):
        pulls[0] = 0
        out = placed(torch.ones(4, 1))
        assert pulls[0] == 2 and out.shape == (4, 1, 2)


def test_a_forward_without_backward_keeps_nothing(pulls):
    _, placed = twins(BagModel)
    pulled = []
    original = stepping.pull

    def remember(*args, **kwargs):
        context = original(*args, **kwargs)
        pulled_now = context.__enter__()
        pulled.extend(weakref.ref(t) for t, _ in pulled_now.dense)
        pulled.extend(weakref.ref(t) for t in pulled_now.rows.values())
        return _Entered(pulled_now)

    stepping.pull = remember
    try:
        out = placed(torch.randint(0, 50, (8, 3)))
        assert pulled and all(ref() is not None for ref in pulled)
        del out
        assert all(ref() is None for ref in pulled)  # by reference counts: no cycles
        out = placed(torch.randint(0, 50, (8, 3)))
        out.sum().backward()
        placed.gradients()
        del out
        gc.collect()
        assert all(ref() is None for ref in pulled)
    finally:
        stepping.pull = original
    assert stepping.local.state.grads == {}


class _Entered:
    def __init__(self, value):
        self.value = value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


def test_each_thread_gets_the_gradients_of_its_own_pulls():
    plain, placed = twins(BagModel)
    inputs = {0: torch.tensor([[1, 2, 3]]), 1: torch.tensor([[40, 41, 42]])}
    both_pulled = threading.Barrier(2)
    results = {}

    def run(index):
        out = placed(inputs[index])
        both_pulled.wait()
        out.sum().backward()
        both_pulled.wait()  # both backwards done before either asks
        results[index] = placed.gradients()

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    for index in (0, 1):
        rows = [g for g, v in results[index] if isinstance(g, cv.IndexedSlices)]
        assert [sorted(r.indices.tolist()) for r in rows] == [inputs[index][0].tolist()]
        plain.zero_grad()
        plain(inputs[index]).sum().backward()
        np.testing.assert_allclose(dense_gradients(results[index])["fc.weight"],
                                   plain.fc.weight.grad.numpy(), atol=1e-6)


def test_gradients_not_taken_are_released_when_the_scheduled_function_ends():
    _, placed = twins(BagModel)
    call = RunningCall()
    enter_call(call)  # as a worker runs a scheduled function
    try:
        placed(torch.tensor([[1, 2]])).sum().backward()  # and no gradients()
        assert stepping.local.state.grads
    finally:
        enter_call(None)
    call.finish()
    assert stepping.local.state.grads == {}
    assert stepping.local.state.call is None


def test_gradients_of_several_backwards_add_up_until_asked_for():
    plain, placed = twins(BagModel)
    first, second = torch.tensor([[1, 2]]), torch.tensor([[2, 3]])
    placed(first).sum().backward()
    placed(second).sum().backward()
    plain(first).sum().backward()
    plain(second).sum().backward()
    grads = dense_gradients(placed.gradients())
    for name, parameter in plain.named_parameters():
        np.testing.assert_allclose(grads[name], parameter.grad.numpy(), atol=1e-6)


def test_training_with_an_optimizer_and_state_dict():
    _, placed = twins(BagModel)
    optimizer = cv.optimizers.Adam(0.05)
    rng = np.random.default_rng(0)
    preference = rng.standard_normal(50).astype(np.float32)
    losses = []
    for _ in range(100):
        ids = torch.from_numpy(rng.integers(0, 50, (32, 4)))
        target = torch.from_numpy(preference[ids.numpy()].mean(1))
        loss = F.mse_loss(placed(ids), target)
        loss.backward()
        optimizer.apply_gradients(placed.gradients())
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) / 2
    state = placed.state_dict()
    assert set(state) == {"bag.weight", "fc.weight", "fc.bias"}
    np.testing.assert_array_equal(state["fc.weight"].numpy(), placed.fc.weight.numpy())
    with pytest.raises(InvalidArgumentError, match="none are waiting"):  # see test_grad_utilities
        list(placed.parameters())
    assert placed.variables == placed.trainable_variables and len(placed.variables) == 3
    fresh = cv.torch.place(BagModel())
    fresh.load_state_dict(state)
    ids = torch.randint(0, 50, (5, 4))
    torch.testing.assert_close(fresh(ids), placed(ids))


def test_tied_parameters_become_one_variable():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(12, 4)
            self.head = nn.Linear(4, 12, bias=False)
            self.head.weight = self.table.weight

        def forward(self, ids):
            return self.head(self.table(ids))

    plain, placed = twins(Tied)
    assert len(placed.variables) == 1
    ids = torch.tensor([1, 5, 5])
    out = placed(ids)
    out.sum().backward()
    expected = plain(ids)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    np.testing.assert_allclose(dense_gradients(placed.gradients())["table.weight"],
                               plain.table.weight.grad.numpy(), atol=1e-6)


def test_refusals():
    with pytest.raises(InvalidArgumentError, match="max_norm"):
        cv.torch.place(nn.Sequential(nn.Embedding(5, 2, max_norm=1.0)))
    placed = cv.torch.place(nn.Linear(2, 1))
    with pytest.raises(InvalidArgumentError, match="placed already"):
        cv.torch.place(placed)
    with pytest.raises(InvalidArgumentError, match="torch.nn.Module"):
        cv.torch.place(object())
    with pytest.raises(InvalidArgumentError, match="int32 or int64"):
        cv.torch.place(nn.Embedding(5, 2))(torch.tensor([1.0]))


def test_checkpoint_saves_variables_slots_and_buffers(tmp_path):
    class WithNorm(BagModel):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(4)

        def forward(self, ids):
            return self.fc(self.norm(self.bag(ids))).squeeze(-1)

    _, model = twins(WithNorm)
    optimizer = cv.optimizers.Adam(0.1)
    ids = torch.randint(0, 50, (8, 3))
    model(ids).sum().backward()
    optimizer.apply_gradients(model.gradients())
    path = cv.train.Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "ckpt")
    _, restored = twins(WithNorm)
    again = cv.optimizers.Adam(0.1)
    cv.train.Checkpoint(model=restored, optimizer=again).restore(path).assert_consumed()
    model.eval(), restored.eval()
    torch.testing.assert_close(restored(ids), model(ids))
    torch.testing.assert_close(restored.norm.running_mean, model.norm.running_mean)
