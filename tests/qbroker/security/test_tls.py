"""amqps:// against a private RabbitMQ node with a TLS listener on loopback and certificates made here
(openssl): the server is verified against the configured CA, and the broker demands a client certificate.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import HANG
from harness.private_node import NodeDied, PrivateNode, free_port, start_private_node, stop_private_node
from qbroker import BrokerTlsFailed, BrokerUnavailable, Config, Unit

pytestmark = pytest.mark.rabbitmq_only


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> None:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        cwd=directory,
    )


def make_cert(directory: Path, ca: str, name: str, *, server: bool) -> None:
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        f"/CN={name}",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        cwd=directory,
    )
    ext = directory / f"{name}.ext"
    usage = "serverAuth" if server else "clientAuth"
    ext.write_text(f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.crt",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        ext.name,
        "-out",
        f"{name}.crt",
        cwd=directory,
    )


@dataclass
class TlsNode:
    node: PrivateNode
    tls_port: int
    certs: Path

    def url(self) -> str:
        return f"amqps://guest:guest@127.0.0.1:{self.tls_port}/"


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNode]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificates")
    certs = tmp_path_factory.mktemp("certs")
    make_ca(certs, "ca")
    make_ca(certs, "other-ca")  # a CA the server's certificate is not signed by
    make_cert(certs, "ca", "server", server=True)
    make_cert(certs, "ca", "client", server=False)
    files = {name: (certs / name).read_bytes() for name in ("ca.crt", "server.crt", "server.key")}
    # The TLS port is written into the config, so a port taken before the node binds it means a new
    # config: pick again (start_private_node retries only the ports it picks itself).
    for attempt in range(1, 4):
        port = free_port()
        config = (
            f"listeners.ssl.default = 127.0.0.1:{port}\n"
            "ssl_options.cacertfile = {base}/ca.crt\n"
            "ssl_options.certfile = {base}/server.crt\n"
            "ssl_options.keyfile = {base}/server.key\n"
            "ssl_options.verify = verify_peer\n"
            "ssl_options.fail_if_no_peer_cert = true\n"
            "ssl_options.versions.1 = tlsv1.2\n"
            "ssl_options.versions.2 = tlsv1.3\n"
        )
        try:
            node = start_private_node(config=config, files=files)
            break
        except NodeDied:
            if attempt == 3:
                raise
    try:
        _wait_port(port)
        yield TlsNode(node, port, certs)
    finally:
        stop_private_node(node)


def _wait_port(port: int) -> None:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"no TLS listener on {port}")


def _config(node: TlsNode, *, ca: str | None = "ca", client: bool = True) -> Config:
    certs = node.certs
    return Config(
        url=node.url(),
        connect_timeout=10,
        reconnect_backoff_max=0.5,
        tls_ca_file=certs / f"{ca}.crt" if ca else None,
        tls_cert_file=certs / "client.crt" if client else None,
        tls_key_file=certs / "client.key" if client else None,
    )


async def test_amqps_with_ca_and_client_certificate(tls_node: TlsNode) -> None:
    server = Unit("test.tls.server", config=_config(tls_node))

    @server.rpc("tls.echo")
    async def echo(text: str) -> str:
        return text

    await server.start()
    client = Unit("test.tls.client", config=_config(tls_node))
    try:
        await client.start()
        assert await client.call("tls.echo", {"text": "over TLS"}, timeout=HANG) == "over TLS"
    finally:
        await client.stop()
        await server.stop()


async def test_server_not_signed_by_the_configured_ca_is_refused(tls_node: TlsNode) -> None:
    unit = Unit("test.tls.wrongca", config=_config(tls_node, ca="other-ca"))
    with pytest.raises(BrokerUnavailable) as info:
        await unit.start()
    assert "guest:guest" not in str(info.value) and "guest:***" in str(info.value)  # URL redacted
    assert isinstance(info.value, BrokerTlsFailed) and "CERTIFICATE_VERIFY_FAILED" in info.value.message


async def test_broker_demands_a_client_certificate(tls_node: TlsNode) -> None:
    unit = Unit("test.tls.nocert", config=_config(tls_node, client=False))
    with pytest.raises(BrokerUnavailable):
        await unit.start()


async def test_plain_amqp_is_not_spoken_on_the_tls_port(tls_node: TlsNode) -> None:
    config = Config(url=f"amqp://guest:guest@127.0.0.1:{tls_node.tls_port}/", connect_timeout=5)
    with pytest.raises(BrokerUnavailable):
        await Unit("test.tls.plain", config=config).start()
