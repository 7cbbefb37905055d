"""sandboxes.backends.make_backend: the one place a backend is chosen by name."""

from __future__ import annotations

import pytest

from agentenv.env import resolve_backend
from agentenv.errors import BackendNotFound
from sandboxes.backends import BACKENDS, make_backend
from sandboxes.errors import UnknownBackend
from sandboxes.local_backend import LocalBackend

pytestmark = pytest.mark.unit


def test_an_unknown_backend_names_the_known_ones_and_the_nearest() -> None:
    with pytest.raises(UnknownBackend) as info:
        make_backend("dokcer")
    assert str(info.value) == "backend: expected one of docker|local, got 'dokcer' (did you mean 'docker'?)"
    assert isinstance(info.value, LookupError)
    with pytest.raises(UnknownBackend, match=r"expected one of docker\|local, got 'kata'$"):
        make_backend("kata")


def test_the_env_and_the_cli_take_the_same_names() -> None:
    assert BACKENDS == ("docker", "local")
    with pytest.raises(BackendNotFound, match=r"backend: expected one of docker\|local, got 'lokal' \(did you mean 'local'\?\)"):
        resolve_backend("lokal")


def test_local_is_made_by_name_and_owned_by_the_caller() -> None:
    backend = make_backend("local", run_id="ignored")
    try:
        assert isinstance(backend, LocalBackend)
    finally:
        backend.close()
    again, owned = resolve_backend("local")
    try:
        assert isinstance(again, LocalBackend) and owned
    finally:
        again.close()
