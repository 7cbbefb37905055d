import mathutils


def test_clamp_inside():
    assert mathutils.clamp(5, 0, 10) == 5


def test_clamp_edges():
    assert mathutils.clamp(-3, 0, 10) == 0
    assert mathutils.clamp(42, 0, 10) == 10


def test_mean():
    assert mathutils.mean([1, 2, 3, 4]) == 2.5
    assert mathutils.mean([7]) == 7


def test_count_words():
    assert mathutils.count_words("a  b\tc\nd") == 4
    assert mathutils.count_words("  one ") == 1
