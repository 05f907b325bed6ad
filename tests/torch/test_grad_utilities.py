"""torch utilities that read ``.grad`` on a placed module: ``clip_grad_norm_`` and
``clip_grad_value_`` clip the gradients ``model.gradients()`` returns, as they clip a plain
module's; outside a step they raise, and a ``torch.optim`` optimizer is refused, naming the
``cv.optimizers`` one to use."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import convoy as cv
from convoy.errors import InvalidArgumentError


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(20, 4, padding_idx=0)
        self.fc = nn.Linear(4, 1)

    def forward(self, ids):
        return self.fc(self.embedding(ids).mean(1)).squeeze(-1)


IDS = torch.tensor([[1, 2, 2], [0, 5, 1], [7, 0, 0]])  # repeated ids, padding ids
TARGET = torch.tensor([3.0, -2.0, 1.0])


def twins():
    """A plain module and a placed copy of it."""
    torch.manual_seed(0)
    plain = Model()
    placed = Model()
    placed.load_state_dict(plain.state_dict())
    return plain, cv.torch.place(placed)


def backward(model):
    F.mse_loss(model(IDS), TARGET).backward()


def dense_gradients(placed):
    """``placed.gradients()`` by variable name, embedding rows added into a dense table."""
    grads = {}
    for grad, variable in placed.gradients():
        if isinstance(grad, cv.IndexedSlices):
            table = np.zeros(variable.shape, np.float32)
            np.add.at(table, grad.indices, grad.values)
            grad = table
        grads[variable.name] = grad
    return grads


def assert_same_gradients(plain, placed):
    grads = dense_gradients(placed)
    assert set(grads) == {"embedding.weight", "fc.weight", "fc.bias"}
    for name, parameter in plain.named_parameters():
        np.testing.assert_allclose(grads[name], parameter.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.timeout(30)
def test_clip_grad_norm_clips_what_gradients_returns_and_returns_the_true_norm():
    plain, placed = twins()
    backward(plain)
    backward(placed)
    names = sorted(name for name, _ in placed.named_parameters())
    assert names == ["embedding.weight", "fc.bias", "fc.weight"]
    expected = nn.utils.clip_grad_norm_(plain.parameters(), 0.1)
    norm = nn.utils.clip_grad_norm_(placed.parameters(), 0.1)
    assert float(norm) > 0.1
    torch.testing.assert_close(norm, expected)
    assert_same_gradients(plain, placed)


@pytest.mark.timeout(30)
def test_clip_grad_value_and_a_submodules_parameters():
    plain, placed = twins()
    backward(plain)
    backward(placed)
    assert sorted(tuple(p.shape) for p in placed.fc.parameters()) == [(1,), (1, 4)]
    nn.utils.clip_grad_value_(plain.parameters(), 0.05)
    nn.utils.clip_grad_value_(placed.parameters(), 0.05)
    assert_same_gradients(plain, placed)


@pytest.mark.timeout(30)
def test_outside_a_step_parameters_raise_and_zero_grad_drops_the_gradients():
    _, placed = twins()
    with pytest.raises(InvalidArgumentError, match="none are waiting.*global_clipnorm"):
        nn.utils.clip_grad_norm_(placed.parameters(), 1.0)
    backward(placed)
    placed.zero_grad()
    assert placed.gradients() == []
    backward(placed)
    placed.gradients()
    with pytest.raises(InvalidArgumentError, match="none are waiting"):  # taken already
        nn.utils.clip_grad_norm_(placed.parameters(), 1.0)


@pytest.mark.timeout(30)
def test_a_torch_optimizer_is_refused_naming_the_cv_optimizer():
    _, placed = twins()
    with pytest.raises(InvalidArgumentError, match=r"torch.optim.SGD .*Use cv.optimizers.SGD "):
        torch.optim.SGD(placed.parameters(), lr=0.1)
    backward(placed)  # even while gradients are waiting
    with pytest.raises(InvalidArgumentError, match=r"Use cv.optimizers.Adam "):
        torch.optim.Adam(placed.parameters(), lr=0.1)
    with pytest.raises(InvalidArgumentError, match=r"Use one of cv.optimizers \(.*SGD"):
        torch.optim.Rprop(placed.named_parameters())
    placed.gradients()


def teardown_function():
    assert cv.torch._step.local.state.grads == {}  # every test takes its gradients
