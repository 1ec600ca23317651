"""Fixtures shared by the tests that compile through ``torch.compile``."""
import pytest
import torch


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches cleared before and after the test: every compile in it is a first one,
    and none of its graphs leaks into the next test's recompile limits."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
