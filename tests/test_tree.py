import numpy as np
import torch

from racer.tree import DraftTree


def sample_tree():
    t = DraftTree.root_only(5)
    a = t.add(0, 7, "retrieval", 0, freq=3)
    b = t.add(0, 9, "logits", 1, breadth=2)
    t.add(a, 11, "retrieval", 0)
    t.add(b, 12, "logits", 0)
    assert t.add(0, 7, "logits", 0) == a  # same sibling token merges
    return t


def test_merge_marks_both_and_validates():
    t = sample_tree()
    t.validate()
    assert t.sources == ["root", "both", "logits", "retrieval", "logits"]
    assert t.depths == [0, 1, 1, 2, 2]
    assert t.child(0, 9) == 2 and t.child(2, 99) == -1
    assert t.path_to(4) == [0, 2, 4]


def test_mask_and_positions():
    t = sample_tree()
    m = t.attention_mask(3, torch.float32, "cpu")
    assert m.shape == (1, 1, 5, 8)
    visible = (m[0, 0] == 0).numpy()
    assert visible[:, :3].all()  # the whole prefix
    expected = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]], bool)
    assert (visible[:, 3:] == expected).all()
    assert m[0, 0, 0, 4].item() == torch.finfo(torch.float32).min
    assert t.position_ids(3, "cpu").tolist() == [[3, 4, 4, 5, 5]]


def test_roundtrip_and_chain():
    t = sample_tree()
    u = DraftTree.from_dict(t.to_dict())
    assert u.to_dict() == t.to_dict() and u.child(0, 7) == 1
    c = DraftTree.root_only(1)
    c.add_path([2, 3, 4], "lookup")
    assert c.is_chain() and not t.is_chain()
