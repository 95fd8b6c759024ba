"""The description file of ``qbroker provision``, its roles (data: the library's, the services' entry points,
files) and its permission table, without a broker: bad files are refused with a clear message, and the
patterns say what docs/security.md says (the broker tests in this directory show RabbitMQ enforcing them)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from qbroker.cli.deployment import DescriptionError, load_deployment, permissions_for, service_env
from qbroker.cli.roles import ENTRY_POINT_GROUP, RoleBook, RoleError, load_roles
from qbroker.progress import own_progress, owner_word, progress_key, progress_prefix

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def roles() -> RoleBook:
    book = load_roles()
    assert "queuemaster" in book, "the services' roles are not installed (entry points qbroker.roles): bin/bootstrap"
    return book


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deployment.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('vhost = "v"\n', "account"),
        ('vhost = "v"\n[[account]]\nname = "a"\nrole = "root"\n', "role"),
        ('vhost = "v"\n[[account]]\nname = "a b"\nrole = "client"\n', "name"),
        (
            'vhost = "v"\n[[account]]\nname = "a"\nrole = "client"\n[[account]]\nname = "a"\nrole = "operator"\n',
            "appears twice",
        ),
        ('vhost = "v"\nsurprise = 1\n[[account]]\nname = "a"\nrole = "client"\n', "surprise"),
        ("vhost = \n", "not TOML"),
    ],
)
def test_bad_descriptions_are_refused(tmp_path: Path, text: str, problem: str, roles: RoleBook) -> None:
    with pytest.raises(DescriptionError, match=problem):
        load_deployment(_write(tmp_path, text), roles)


def test_secrets_dir_is_relative_to_the_description(tmp_path: Path) -> None:
    deployment = load_deployment(_write(tmp_path, 'vhost = "v"\n[[account]]\nname = "a"\nrole = "client"\n'))
    assert deployment.secrets_dir == tmp_path / "secrets"


def _allows(pattern: str, name: str) -> bool:
    return re.search(pattern, name) is not None  # RabbitMQ matches unanchored; ours are anchored


def test_topic_patterns(roles: RoleBook) -> None:
    qm, renderer, client, operator = (
        permissions_for(roles[r], roles, "").topics for r in ("queuemaster", "renderer", "client", "operator")
    )
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


def test_exchange_prefix_is_escaped(roles: RoleBook) -> None:
    perms = permissions_for(roles["client"], roles, "a.b")
    assert _allows(perms.write, "a.brpc") and not _allows(perms.write, "aXbrpc")
    own = "reply_" + "0" * 32
    assert _allows(perms.configure, "a.b" + own) and not _allows(perms.configure, "aXb" + own)


SHARED = ("rpc", "reply", "alert", "dead", "dead.kept", "dead.kept.in", "osm")


def test_no_role_may_configure_a_shared_name(roles: RoleBook, tmp_path: Path) -> None:
    """Configure on a shared name lets an account delete it: no role has it, not even one whose
    resources name it; each keeps its own queues."""
    path = tmp_path / "site.toml"
    path.write_text('[role.greedy]\nresources = ["rpc", "osm", "dead\\\\.kept", ".*"]\n')
    book = load_roles([path])
    for prefix in ("", "p."):
        for name, grants in book.roles.items():
            perms = permissions_for(grants, book, prefix, "acct")
            for shared in SHARED:
                full = shared if shared == "osm" else prefix + shared
                assert not _allows(perms.configure, full), (name, full)
            assert _allows(perms.configure, f"{prefix}alert_{'a' * 32}"), name
    assert _allows(permissions_for(book["operator"], book, "").configure, "anything.else")
    assert _allows(permissions_for(book["greedy"], book, "").configure, "rpcx")


def test_a_client_may_bind_its_own_progress_only(roles: RoleBook) -> None:
    """``{account}`` is the account's own routing-key word, escaped: a dot in a name is neither a regex wildcard
    nor a word boundary (``a.b`` must not hear ``a``'s or ``aXb``'s jobs, nor ``a`` those of ``a.b``)."""

    def hears(account: str, key: str) -> bool:
        return _allows(permissions_for(roles["client"], roles, "", account).topics["alert"][1], key)

    assert owner_word("a.b") == "a%2Eb" and owner_word("a*b#") == "a%2Ab%23" and owner_word("") == "%"
    for account in ("a.b", "alice", "ops@example.org"):
        assert hears(account, own_progress(progress_prefix("spark"), account))
    assert not hears("a.b", "spark.progress.a.#") and not hears("a.b", "spark.progress.aXb.#")
    assert not hears("a", own_progress(progress_prefix("spark"), "a.b"))
    assert not hears("a.b", "spark.progress.a%2Eb") and not hears("a.b", "spark.progress.#")
    bridge = permissions_for(roles["spark_bridge"], roles, "", "bridge").topics["alert"][0]
    assert _allows(bridge, progress_key(progress_prefix("spark"), "a.b", "0f" * 16))
    assert not _allows(bridge, "spark.progress.a.b." + "0f" * 16)


def test_the_services_register_their_roles_and_the_library_names_none() -> None:
    """Each service's roles come from its entry point (services/pyproject.toml), all of them installed; the
    library's own roles name no service."""
    stack = tomllib.loads((ROOT / "services" / "pyproject.toml").read_text())
    declared = stack["project"]["entry-points"][ENTRY_POINT_GROUP]
    installed = {e.name: e.value for e in entry_points(group=ENTRY_POINT_GROUP)}
    assert installed == declared, "the installed metadata lags services/pyproject.toml: bin/bootstrap"
    library = load_roles(installed=False)
    assert sorted(library.roles) == ["client", "operator"]
    assert "toposm" not in repr({n: g.model_dump() for n, g in library.roles.items()})
    book = load_roles()
    assert {"queuemaster", "renderer", "spark_bridge", "web"} <= set(book.roles)
    # a role several services add to gets all their grants: the tiles' and the bridge's calls for a client
    assert book.sources["client"][0] == "library" and len(book.sources["client"]) == 3
    assert _allows(permissions_for(book["client"], book, "").topics["rpc"][0], "spark.job")


def test_a_roles_file_adds_a_role_and_grants(tmp_path: Path) -> None:
    path = tmp_path / "site.toml"
    path.write_text("""
[role.tileviewer]
call = ['toposm\\.queuemaster']
hear = ['expire_toposm']
listed_in = ["TOPOSM_EXPIRE_USERS"]

[role.client]
hear = ['site\\.news']
""")
    book = load_roles([path])
    assert book.sources["tileviewer"] == [f"file {path}"]
    viewer = permissions_for(book["tileviewer"], book, "").topics
    assert _allows(viewer["rpc"][0], "toposm.queuemaster") and not _allows(viewer["rpc"][0], "spark.job")
    assert _allows(viewer["alert"][1], "expire_toposm")
    assert _allows(permissions_for(book["client"], book, "").topics["alert"][1], "site.news")
    description = _write(
        tmp_path,
        'vhost = "v"\n[[account]]\nname = "viewer"\nrole = "tileviewer"\n'
        '[[account]]\nname = "bridge"\nrole = "spark_bridge"\n',
    )
    assert service_env(load_deployment(description, book), book)["TOPOSM_EXPIRE_USERS"] == "viewer,bridge"
    with pytest.raises(DescriptionError, match="no such role tileviewer"):
        load_deployment(description, load_roles())
    assert load_deployment(description).account[0].role == "tileviewer"  # removing needs no roles


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[role.x]\ncall = ['(']\n", "not a regex"),
        ("[role.x]\nsurprise = 1\n", "surprise"),
        ("[role.X]\n", "not a role name"),
        ("vhost = 'v'\n", "only \\[role.<name>\\] tables"),
        ("[role\n", "not TOML"),
    ],
)
def test_bad_roles_files_are_refused(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "roles.toml"
    path.write_text(text)
    with pytest.raises(RoleError, match=problem):
        load_roles([path], installed=False)


def test_list_roles_names_each_source(tmp_path: Path) -> None:
    path = tmp_path / "site.toml"
    path.write_text("[role.tileviewer]\ncall = ['toposm\\.queuemaster']\n")
    done = subprocess.run(
        [str(BIN / "qbroker"), "provision", "--list-roles", "--roles", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("tileviewer") and f"file {path}" in line for line in lines)
    assert any(line.startswith("renderer") and "entry point tiles" in line for line in lines)
