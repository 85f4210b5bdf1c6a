"""Fields added after v1alpha1 shipped stay out of a dump while unset (`specs.base.LaterFieldsModel`),
so a spec that does not use one keeps its rendered objects, step keys, digests and model versions."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest

import specs
from specs.base import LaterFieldsModel
from specs.model import Evaluation, Robustness


def _subclasses(cls: type[LaterFieldsModel]) -> list[type[LaterFieldsModel]]:
    found: list[type[LaterFieldsModel]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _all_later_fields_models() -> list[type[LaterFieldsModel]]:
    for module in pkgutil.iter_modules(specs.__path__):
        importlib.import_module(f"specs.{module.name}")
    return _subclasses(LaterFieldsModel)


def _default(cls: type[LaterFieldsModel], name: str) -> Any:
    return cls.model_fields[name].get_default(call_default_factory=True, validated_data={})


@pytest.mark.parametrize("cls", _all_later_fields_models(), ids=lambda c: c.__name__)
def test_each_added_field_is_left_out_at_its_default(cls: type[LaterFieldsModel]) -> None:
    # left out at any other value, a spec that never wrote the field would change its dump
    assert cls.added_later, f"{cls.__name__} adds no field: it need not be a LaterFieldsModel"
    for name, unset in cls.added_later.items():
        assert _default(cls, name) == unset, f"{cls.__name__}.{name}"


def test_an_unset_field_is_out_of_both_dumps_and_a_set_one_in_them() -> None:
    unset = Evaluation()
    assert "robustness" not in unset.model_dump(by_alias=True)
    assert "robustness" not in unset.model_dump(mode="json")
    robust = Evaluation(robustness=Robustness(epsilon=0.1))
    assert robust.model_dump(mode="json", by_alias=True)["robustness"]["pgdSteps"] == 10
    assert robust.model_dump()["robustness"]["pgd_steps"] == 10


def test_a_camel_case_field_is_out_by_its_key_and_by_its_name() -> None:
    from specs.endpoint import Batching

    assert "p99TargetMs" not in Batching().model_dump(by_alias=True)
    assert "p99_target_ms" not in Batching().model_dump()
    assert Batching(p99_target_ms=50).model_dump(by_alias=True)["p99TargetMs"] == 50


def test_naming_no_field_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="added_later names no field: colour"):
        class Typo(LaterFieldsModel):
            color: str | None = None
            added_later = {"colour": None}
