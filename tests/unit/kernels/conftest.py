"""The kernel tests' fixtures over the builders in paged_cases.py (a module of its own, so that a test
can import them by a name no other test folder's conftest shares)."""

from __future__ import annotations

from typing import Callable

import pytest
from paged_cases import BASE_SPECS, CaseSpec, PagedCase, build_case, naive_attention, random_spec
from torch import Tensor


@pytest.fixture(params=BASE_SPECS, ids=CaseSpec.label)
def base_spec(request: pytest.FixtureRequest) -> CaseSpec:
    return request.param


@pytest.fixture
def make_case() -> Callable[..., PagedCase]:
    return build_case


@pytest.fixture
def naive() -> Callable[..., Tensor]:
    return naive_attention


@pytest.fixture
def make_random_spec() -> Callable[[int], CaseSpec]:
    return random_spec
