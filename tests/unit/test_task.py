from prl.tasks import addition


def test_train_and_heldout_are_disjoint():
    train = addition.train_pool([80, 600, 600, 600], seed=0)
    held = addition.heldout_set(300, 4)
    assert not {p.id for p in train} & {p.id for p in held}
    assert not {addition.unordered(p.id) for p in train} & {addition.unordered(p.id) for p in held}  # no swapped twins
    assert len({p.id for p in train}) == len(train)


def test_problems_are_deterministic():
    assert addition.train_pool([5, 5], seed=3) == addition.train_pool([5, 5], seed=3)


def test_reversed_answer_and_reward():
    p = addition.make_problem(12, 39, 2)
    assert p.prompt == "12+39=" and p.answer == "15" and p.difficulty == 2
    assert addition.exact_match(" 15", p.answer) == 1.0 and addition.exact_match("51", p.answer) == 0.0
