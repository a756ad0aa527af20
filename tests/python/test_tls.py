"""The Python client over mutual TLS (channel_credentials), with a PKI made at test time by the
openssl CLI, as tests/integration/security_test.cc does."""

import os
import shutil
import subprocess

import grpc
import pytest

from retrybudget import BudgetClient, ClientOptions

from conftest import wait_until

KEY = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"


def make_pki(directory: str) -> None:
    def leaf(name, ext):
        return (f"openssl req {KEY} -keyout {name}.key -out {name}.csr -subj /CN={name} && "
                f"printf '{ext}' > {name}.ext && openssl x509 -req -days 2 -in {name}.csr "
                f"-CA ca.pem -CAkey ca.key -CAcreateserial -out {name}.pem -extfile {name}.ext")

    script = " && ".join([
        f"openssl req -x509 {KEY} -days 2 -keyout ca.key -out ca.pem -subj /CN=ca "
        "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign",
        leaf("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n"),
        leaf("client", "extendedKeyUsage=clientAuth\\n"),
    ])
    subprocess.run(script, shell=True, cwd=directory, check=True, capture_output=True)


def read(directory, name) -> bytes:
    with open(os.path.join(directory, name), "rb") as f:
        return f.read()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl CLI")
def test_a_client_with_mutual_tls_credentials_gets_leases(tmp_path, start_server):
    pki = str(tmp_path / "pki")
    os.makedirs(pki)
    make_pki(pki)
    server = start_server()
    server.kill()  # restarted with TLS on the same port
    server.args = [f"--tls_cert={pki}/server.pem", f"--tls_key={pki}/server.key",
                   f"--tls_client_ca={pki}/ca.pem"]
    server.restart()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(pki, "ca.pem"), private_key=read(pki, "client.key"),
        certificate_chain=read(pki, "client.pem"))
    with BudgetClient(ClientOptions(target=server.target, refresh_period=0.05,
                                    channel_credentials=credentials)) as client:
        budget = client.tenant("t")
        wait_until(lambda: budget.stats().lease_active, what="a lease over TLS")
        assert budget.try_acquire()
    assert client.close() is None
    # Without a client certificate the server refuses the handshake: never a lease.
    with BudgetClient(ClientOptions(
            target=server.target, refresh_period=0.05, sync_timeout=0.3,
            channel_credentials=grpc.ssl_channel_credentials(read(pki, "ca.pem")))) as rogue:
        budget = rogue.tenant("t")
        wait_until(lambda: rogue.last_sync_status(), what="a failed Sync")
        assert not budget.stats().lease_active
