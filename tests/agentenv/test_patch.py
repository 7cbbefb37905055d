"""The apply_patch grammar: parsing, applying, and the messages a bad patch gets."""

from __future__ import annotations

import pytest

from agentenv.patch import AddFile, DeleteFile, PatchError, UpdateFile, apply_hunks, apply_patch, parse_patch

pytestmark = pytest.mark.unit

SRC = "import os\n\n\ndef f():\n    return 1\n\n\ndef g():\n    return 1\n"


def files(**kw: str) -> dict[str, str]:
    return dict(kw)


def test_parse_every_operation() -> None:
    ops = parse_patch(
        "*** Begin Patch\n*** Add File: a/new.py\n+x = 1\n+\n*** Delete File: old.py\n"
        "*** Update File: m.py\n*** Move to: n.py\n@@ def g():\n-    return 1\n+    return 2\n*** End of File\n*** End Patch\n"
    )
    assert ops[0] == AddFile("a/new.py", "x = 1\n\n")
    assert ops[1] == DeleteFile("old.py")
    assert isinstance(ops[2], UpdateFile) and ops[2].move_to == "n.py"
    hunk = ops[2].hunks[0]
    assert hunk.anchor == "def g():" and hunk.end_of_file and hunk.old == ["    return 1"] and hunk.new == ["    return 2"]


def test_anchor_picks_the_right_repeated_block() -> None:
    (op,) = parse_patch("*** Begin Patch\n*** Update File: m.py\n@@ def g():\n-    return 1\n+    return 2\n*** End Patch")
    assert isinstance(op, UpdateFile)
    assert apply_hunks("m.py", SRC, op.hunks).endswith("def g():\n    return 2\n")
    assert apply_hunks("m.py", SRC, op.hunks).count("return 1") == 1


def test_end_of_file_hunk_matches_the_last_occurrence() -> None:
    (op,) = parse_patch("*** Begin Patch\n*** Update File: m.py\n@@\n-    return 1\n+    return 3\n*** End of File\n*** End Patch")
    out = apply_hunks("m.py", SRC, op.hunks)  # type: ignore[union-attr]
    assert out.startswith("import os\n\n\ndef f():\n    return 1\n") and out.endswith("return 3\n")


def test_whitespace_tolerant_context_and_multiple_hunks() -> None:
    patch = "*** Begin Patch\n*** Update File: m.py\n@@\n import os   \n+import sys\n@@\n def g():\n-    return 1\n+    return 9\n*** End Patch"
    (op,) = parse_patch(patch)
    assert apply_hunks("m.py", SRC, op.hunks).splitlines()[:2] == ["import os", "import sys"]  # type: ignore[union-attr]


def test_context_mismatch_names_file_and_hunk_line() -> None:
    patch = "*** Begin Patch\n*** Update File: m.py\n@@\n def f():\n-    return 42\n+    return 0\n*** End Patch"
    with pytest.raises(PatchError, match=r"(?s)m\.py: hunk at patch line 3 does not match.*return 42"):
        apply_patch(parse_patch(patch), lambda p: SRC)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ("", "expected '\\*\\*\\* Begin Patch'"),
        ("*** Begin Patch\n*** Add File: x\n+1", "as the last line"),
        ("*** Begin Patch\n*** Add File: /etc/x\n+1\n*** End Patch", "absolute"),
        ("*** Begin Patch\n*** Add File: x\n1\n*** End Patch", "must start with '\\+'"),
        ("*** Begin Patch\n*** Update File: x\n*** End Patch", "has no hunks"),
        ("*** Begin Patch\n*** Update File: x\n@@\n context\n*** End Patch", "changes nothing"),
        ("*** Begin Patch\n*** Frobnicate: x\n*** End Patch", "patch line 2: expected"),
        ("*** Begin Patch\n*** Update File: x\n@@\n+a\n?b\n*** End Patch", "patch line 5"),
        ("*** Begin Patch\n*** End Patch", "no file operations"),
    ],
)
def test_parse_errors_say_where(patch: str, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        parse_patch(patch)


def test_apply_is_all_or_nothing_and_checks_existence() -> None:
    ops = parse_patch("*** Begin Patch\n*** Delete File: gone.py\n*** End Patch")
    with pytest.raises(PatchError, match="gone.py: cannot delete"):
        apply_patch(ops, lambda p: None)
    ops = parse_patch("*** Begin Patch\n*** Add File: a.py\n+x\n*** Update File: a.py\n@@\n-x\n+y\n*** End Patch")
    changes = apply_patch(ops, lambda p: None)
    assert [(c.path, c.content, c.kind) for c in changes] == [("a.py", "x\n", "A"), ("a.py", "y\n", "M")]


def test_file_without_trailing_newline_and_crlf_patch() -> None:
    (op,) = parse_patch("*** Begin Patch\r\n*** Update File: m\r\n@@\r\n-a\r\n+b\r\n*** End Patch\r\n")
    assert apply_hunks("m", "a", op.hunks) == "b\n"  # type: ignore[union-attr]


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_pieces = st.sampled_from(["*** Begin Patch", "*** End Patch", "*** Add File: a", "*** Update File: a", "*** Move to: b",
                           "*** Delete File: a", "*** End of File", "@@", "@@ def f", " x", "-x", "+y", "", "/abs", "junk"])


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_pieces | st.text(max_size=10), max_size=12), original=st.text(max_size=40))
def test_fuzz_only_patch_errors(lines: list[str], original: str) -> None:
    try:
        apply_patch(parse_patch("\n".join(lines)), lambda p: original if p == "a" else None)
    except PatchError:
        pass
