"""The description file of ``qbroker provision`` and its permission table, without a broker: bad files are
refused with a clear message, and the patterns say what docs/security.md says (the broker tests in this
directory show RabbitMQ enforcing them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qbroker.cli.deployment import DescriptionError, load_deployment, permissions_for


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deployment.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "problem"), [
    ('vhost = "v"\n', "account"),
    ('vhost = "v"\n[[account]]\nname = "a"\nrole = "root"\n', "role"),
    ('vhost = "v"\n[[account]]\nname = "a b"\nrole = "client"\n', "name"),
    ('vhost = "v"\n[[account]]\nname = "a"\nrole = "client"\n[[account]]\nname = "a"\nrole = "operator"\n',
     "appears twice"),
    ('vhost = "v"\nsurprise = 1\n[[account]]\nname = "a"\nrole = "client"\n', "surprise"),
    ("vhost = \n", "not TOML"),
])
def test_bad_descriptions_are_refused(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(DescriptionError, match=problem):
        load_deployment(_write(tmp_path, text))


def test_secrets_dir_is_relative_to_the_description(tmp_path: Path) -> None:
    deployment = load_deployment(_write(tmp_path, 'vhost = "v"\n[[account]]\nname = "a"\nrole = "client"\n'))
    assert deployment.secrets_dir == tmp_path / "secrets"


def _allows(pattern: str, name: str) -> bool:
    return re.search(pattern, name) is not None  # RabbitMQ matches unanchored; ours are anchored


def test_topic_patterns() -> None:
    qm, renderer, client, operator = (permissions_for(r, "").topics  # type: ignore[arg-type]
                                      for r in ("queuemaster", "renderer", "client", "operator"))
    # who may send `render` to render threads (rpc write)
    for name in ("toposm.render", "toposm.render.vader", "toposm.render.vader.12.0"):
        assert _allows(qm["rpc"][0], name) and not _allows(operator["rpc"][0], name)
        assert not _allows(client["rpc"][0], name)
    assert not _allows(renderer["rpc"][0], "toposm.render.vader.12.0")  # never to a single thread
    # no wildcard host words in what a renderer may bind
    for key in ("toposm.render.*.1.0", "toposm.render.#", "#"):
        assert not _allows(renderer["rpc"][1], key)
    # control alerts on the render hierarchy: the operator, not a client or the queuemaster
    assert _allows(operator["alert"][0], "toposm.render.vader")
    assert not _allows(client["alert"][0], "toposm.render.vader") and not _allows(qm["alert"][0], "toposm.render")
    assert _allows(client["rpc"][0], "spark.expire") and _allows(client["rpc"][0], "toposm.queuemaster")


def test_exchange_prefix_is_escaped() -> None:
    perms = permissions_for("client", "a.b")
    assert _allows(perms.configure, "a.brpc") and not _allows(perms.configure, "aXbrpc")
