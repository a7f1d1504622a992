"""The code-shape prompts (tests/code_shape.py) are counted as docs/architecture.md, "Code
limits", says; the test run lists the package's at its end."""

from __future__ import annotations

from pathlib import Path

from code_shape import oversized, prompts


def test_the_limits_are_counted_as_documented() -> None:
    """Seven parameters, 81 lines or a 601-line module are over; self and six, 80 and 600 are
    not."""
    seven = "def f(a, b, c, d, e, f, *g):\n    pass\n"
    assert oversized(seven, "m.py") == ["m.py:1 f (7 parameters)"]
    six = "class C:\n    def f(self, a, b, c, d, e, f):\n        pass\n"
    assert oversized(six, "m.py") == []
    long = "def f():\n" + "    x = 1\n" * 80
    assert oversized(long, "m.py") == ["m.py:1 f (81 lines)"]
    assert oversized("def f():\n" + "    x = 1\n" * 79, "m.py") == []
    assert oversized("x = 1\n" * 601, "m.py") == ["m.py (601 lines)"]
    assert oversized("x = 1\n" * 600, "m.py") == []


def test_the_package_is_read_whole(tmp_path: Path) -> None:
    """Every module below the package, nested ones too, each prompt named by its path."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "top.py").write_text("def f(a, b, c, d, e, f, g):\n    pass\n")
    (tmp_path / "a" / "b" / "deep.py").write_text("x = 1\n" * 700)
    assert prompts(tmp_path) == ["a/b/deep.py (700 lines)", "top.py:1 f (7 parameters)"]
