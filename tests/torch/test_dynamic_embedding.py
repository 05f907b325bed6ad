"""cv.torch.DynamicEmbedding and DynamicEmbeddingBag in one process: the same outputs and
gradients as nn.Embedding / nn.EmbeddingBag holding the same rows, padding, training with a
cv.optimizers optimizer, state_dict round trips, and clear errors for bad ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import convoy as cv
from convoy.errors import InvalidArgumentError

BIG = 2**63 - 1


def as_fixed(dynamic, ids, cls=nn.Embedding, **kwargs):
    """A fixed table holding the rows of ``ids`` (distinct, sorted) at positions 0.."""
    unique = np.unique(ids)
    fixed = cls(len(unique), dynamic.embedding_dim, **kwargs)
    with torch.no_grad():
        fixed.weight.copy_(torch.from_numpy(dynamic.table.lookup(unique)))
    return fixed, torch.from_numpy(np.searchsorted(unique, ids))


def test_lookups_match_nn_embedding_with_the_same_rows():
    torch.manual_seed(0)
    dynamic = cv.torch.DynamicEmbedding(6)
    ids = torch.tensor([[3, BIG, 3], [1 << 40, 0, 9]])
    out = dynamic(ids)
    fixed, index = as_fixed(dynamic, ids.numpy())
    torch.testing.assert_close(out, fixed(index))
    (out * torch.arange(6.0)).sum().backward()
    (fixed(index) * torch.arange(6.0)).sum().backward()
    ((gradient, table),) = dynamic.gradients()
    assert table is dynamic.table
    summed = np.zeros((5, 6), np.float32)
    np.add.at(summed, np.searchsorted(np.unique(ids.numpy()), gradient.indices), gradient.values)
    np.testing.assert_allclose(summed, fixed.weight.grad.numpy())
    assert dynamic.gradients() == []  # taken


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_bags_match_nn_embedding_bag_with_offsets_and_weights(mode):
    torch.manual_seed(1)
    dynamic = cv.torch.DynamicEmbeddingBag(4, mode=mode)
    ids = torch.tensor([5, BIG, 5, 7, 2, 11])
    offsets = torch.tensor([0, 2, 3])
    fixed, index = as_fixed(dynamic, ids.numpy(), nn.EmbeddingBag, mode=mode)
    weights = torch.rand(6) if mode == "sum" else None
    torch.testing.assert_close(dynamic(ids, offsets, per_sample_weights=weights),
                               fixed(index, offsets, per_sample_weights=weights))
    bags = torch.tensor([[5, BIG], [7, 2]])
    torch.testing.assert_close(dynamic(bags), fixed(index[[0, 1, 3, 4]].reshape(2, 2)))


def test_padding_ids_look_up_zeros_are_not_made_and_get_no_gradient():
    dynamic = cv.torch.DynamicEmbedding(3, padding_idx=0)
    out = dynamic(torch.tensor([0, 4, 0]))
    assert torch.equal(out[0], torch.zeros(3)) and dynamic.size() == 1
    out.sum().backward()
    ((gradient, _),) = dynamic.gradients()
    assert list(gradient.indices) == [4]
    bag = cv.torch.DynamicEmbeddingBag(3, mode="mean", padding_idx=0)
    rows = bag.table.lookup(np.array([4]))
    torch.testing.assert_close(bag(torch.tensor([[0, 4]])), torch.from_numpy(rows))  # 0 left out


def test_a_table_trains_with_a_convoy_optimizer():
    torch.manual_seed(2)
    dynamic = cv.torch.DynamicEmbedding(2, initializer=0.0)
    optimizer = cv.optimizers.SGD(0.5)
    target = torch.tensor([[1.0, -1.0]])
    for _ in range(20):
        loss = ((dynamic(torch.tensor([BIG])) - target) ** 2).sum()
        loss.backward()
        optimizer.apply_gradients(dynamic.gradients())
    np.testing.assert_allclose(dynamic.table.lookup(np.array([BIG])), target.numpy(), atol=1e-3)


def test_the_seed_makes_the_same_rows_and_torch_manual_seed_the_same_seed():
    a = cv.torch.DynamicEmbedding(4, seed=11)(torch.tensor([3, 99]))
    b = cv.torch.DynamicEmbedding(4, seed=11)(torch.tensor([99, 3]))
    torch.testing.assert_close(a, b.flip(0))
    torch.manual_seed(5)
    c = cv.torch.DynamicEmbedding(4)(torch.tensor([3]))
    torch.manual_seed(5)
    torch.testing.assert_close(c, cv.torch.DynamicEmbedding(4)(torch.tensor([3])))


def test_state_dict_round_trips_rows_and_slots():
    dynamic = cv.torch.DynamicEmbedding(3)
    optimizer = cv.optimizers.Adam(0.1)
    dynamic(torch.tensor([4, 8, 1 << 50])).sum().backward()
    optimizer.apply_gradients(dynamic.gradients())
    state = dynamic.state_dict()
    assert {"table.ids", "table.rows", "table.slots.m", "table.slots.v",
            "table.scalars.iterations"} <= set(state)
    restored = cv.torch.DynamicEmbedding(3)
    restored.load_state_dict(state)
    for key, value in restored.state_dict().items():
        torch.testing.assert_close(value, state[key])
    with pytest.raises(RuntimeError, match="table.rows"):
        cv.torch.DynamicEmbedding(3).load_state_dict({"table.ids": state["table.ids"]})


def test_eviction_at_max_rows():
    dynamic = cv.torch.DynamicEmbedding(2, max_rows=4, eviction="lru")
    dynamic(torch.arange(4))
    dynamic(torch.tensor([0, 1]))
    dynamic(torch.tensor([10, 11]))
    assert list(dynamic.keys()) == [0, 1, 10, 11]


@pytest.mark.parametrize("ids, message", [
    (torch.tensor([1, -3]), "ids must be non-negative"),
    (torch.tensor([1.0]), "dtype torch.int64 .or int32., got torch.float32"),
    (torch.tensor([True]), "got torch.bool"),
    ([1, 2], "must be a torch.Tensor"),
])
def test_bad_ids_get_a_clear_error(ids, message):
    with pytest.raises(InvalidArgumentError, match=message):
        cv.torch.DynamicEmbedding(2)(ids)


def test_bad_arguments_get_a_clear_error():
    with pytest.raises(InvalidArgumentError, match="mode must be 'sum', 'mean' or 'max'"):
        cv.torch.DynamicEmbeddingBag(2, mode="median")
    with pytest.raises(InvalidArgumentError, match="needs max_rows"):
        cv.torch.DynamicEmbedding(2, eviction="lfu")
    with pytest.raises(InvalidArgumentError, match="dim must be a positive int"):
        cv.torch.DynamicEmbedding(0)


def test_rows_and_evictions_show_in_the_ps_metrics():
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from convoy import monitoring

    dynamic = cv.torch.DynamicEmbedding(2, max_rows=4, eviction="lfu", name="metered")
    dynamic(torch.arange(4))
    dynamic(torch.tensor([0, 10, 11]))
    monitoring.export("ps")
    server = monitoring.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics",
                                    timeout=10) as answer:
            text = answer.read().decode()
    finally:
        server.close()
    key = dynamic.table.shards[0].key
    found = {(sample.name, sample.labels.get("table")): sample.value
             for family in text_string_to_metric_families(text) for sample in family.samples}
    assert found[("convoy_ps_embedding_rows", key)] == 4
    assert found[("convoy_ps_embedding_evictions_total", key)] == 2


@pytest.mark.parametrize("make", [
    lambda: cv.optimizers.AdamW(0.1, weight_decay=0.1, clipnorm=0.5),
    lambda: cv.optimizers.SGD(cv.optimizers.schedules.ExponentialDecay(0.5, 2, 0.5),
                              momentum=0.9, global_clipnorm=1.0),
    lambda: cv.optimizers.RMSprop(0.05, clipvalue=0.3),
    lambda: cv.optimizers.Ftrl(0.1, l1_regularization_strength=0.01),
], ids=["adamw-clipnorm", "sgd-schedule-global-clipnorm", "rmsprop-clipvalue", "ftrl"])
def test_the_optimizer_kit_updates_dynamic_rows_as_a_fixed_table(make):
    dynamic = cv.torch.DynamicEmbedding(3, seed=3)
    ids = np.array([7, 1 << 33])
    fixed = cv.Variable(dynamic.table.lookup(ids))
    on_dynamic, on_fixed = make(), make()
    for step in range(4):
        grad = np.random.default_rng(step).standard_normal((2, 3)).astype(np.float32)
        on_dynamic.apply_gradients([(cv.IndexedSlices(grad, ids), dynamic.table)])
        on_fixed.apply_gradients([(cv.IndexedSlices(grad, np.array([0, 1])), fixed)])
    np.testing.assert_allclose(dynamic.table.lookup(ids), fixed.numpy(), rtol=1e-5)
