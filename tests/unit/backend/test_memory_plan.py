"""Static memory planning: reuse, no aliasing of an op's inputs and output, pinned outputs."""

from kiln.backend.memory_plan import plan_memory


def test_chain_reuses_two_storages():
    # input 0 -> op1 -> op2 -> op3 -> op4 (output)
    sizes = [400, 400, 400, 400, 400]
    ops = [([0], 1), ([1], 2), ([2], 3), ([3], 4)]
    plan = plan_memory(sizes, {0}, ops, {4})
    sid = plan.storage_id
    assert sid[1] != sid[2] and sid[2] != sid[3]
    assert sid[1] == sid[3]  # freed after op2, reused by op3
    assert len(set(sid)) == 3  # input and two ping-pong buffers (the output takes a free one)
    assert plan.total_bytes < sum(sizes)


def test_output_never_shares_its_inputs_storage():
    sizes = [100, 100, 100, 100]
    ops = [([0], 1), ([1], 2), ([2, 1], 3)]
    sid = plan_memory(sizes, {0}, ops, {3}).storage_id
    for inputs, out in ops:
        assert all(sid[out] != sid[i] for i in inputs)


def test_external_and_pinned_entries_are_not_reused():
    sizes = [100, 100, 100, 100]
    ops = [([0, 1], 2), ([2], 3)]
    sid = plan_memory(sizes, {0, 1}, ops, {2, 3}).storage_id
    assert len(set(sid)) == 4


def test_best_fit_and_growth():
    sizes = [10, 1000, 10, 50, 50]
    ops = [([0], 1), ([1], 2), ([2], 3), ([3], 4)]
    plan = plan_memory(sizes, {0}, ops, {4})
    sid = plan.storage_id
    assert sid[3] == sid[1]  # the 1000-byte storage was free and fits
    assert plan.storage_bytes[sid[1]] == 1000
