"""cudal1.extras: the one optional-dependency probe and its one-line error."""

from __future__ import annotations

import pytest

from cudal1 import extras


def test_probe_and_missing_keep_the_order_given():
    assert extras.is_available("json") and not extras.is_available("cudal1_no_such_package")
    assert extras.missing("cudal1_no_such_b", "json", "cudal1_no_such_a") == ["cudal1_no_such_b", "cudal1_no_such_a"]


def test_require_names_the_feature_the_packages_and_the_extra():
    extras.require("the json thing", "json")  # present: nothing raised
    with pytest.raises(extras.MissingExtra) as info:
        extras.require("the HTML report", "json", "cudal1_no_such_package", extra="report")
    assert str(info.value) == 'the HTML report needs cudal1_no_such_package: pip install "cudal1[report]"'
    assert isinstance(info.value, ImportError)  # existing ImportError handlers keep working
    with pytest.raises(extras.MissingExtra, match="pip install cudal1_no_such_package$"):
        extras.require("a tracker", "cudal1_no_such_package")
    with pytest.raises(ValueError, match="unknown extra"):
        extras.require("x", "json", extra="no-such-extra")


def test_every_extra_is_declared_in_pyproject():
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert set(extras.EXTRAS) <= set(declared["project"]["optional-dependencies"])
