"""The control plane's keys and certificates: one throw-away CA signs every serving certificate (kube-apiserver,
the TPU webhook) and a service-account signing key; static bearer tokens name the clients.

Everything is made fresh per work directory (EC P-256, valid for a week) and written with mode 0600.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LIFETIME = datetime.timedelta(days=7)


def _san(host: str) -> Any:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write_private(path: Path, data: bytes) -> Path:
    path.touch(mode=0o600)
    path.write_bytes(data)
    return path


@dataclass(frozen=True)
class CertificateAuthority:
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def generate(cls, name: str = "tpuflow-controlplane-ca") -> CertificateAuthority:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(
            cert_pem=cert.public_bytes(serialization.Encoding.PEM),
            key_pem=key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )

    @property
    def ca_data(self) -> str:
        """certificate-authority-data for a kubeconfig, caBundle for a webhook configuration."""
        return base64.b64encode(self.cert_pem).decode()

    def serving_pair(self, common_name: str, hosts: Sequence[str]) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) for a server reached as any of ``hosts`` (names or addresses)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + LIFETIME)
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in dict.fromkeys(hosts)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)  # type: ignore[arg-type]
            .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
        )
        return (
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )


def service_account_key() -> tuple[bytes, bytes]:
    """(private PEM, public PEM) of the key kube-apiserver signs service-account tokens with."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return (
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    )


@dataclass(frozen=True)
class Client:
    """A static-token identity of kube-apiserver's --token-auth-file."""

    user: str
    groups: tuple[str, ...] = ()
    token: str = ""

    def line(self) -> str:
        groups = ",".join(self.groups)
        return f'{self.token},{self.user},{self.user},"{groups}"' if groups else f"{self.token},{self.user},{self.user}"


def new_client(user: str, *groups: str) -> Client:
    return Client(user=user, groups=tuple(groups), token=secrets.token_urlsafe(24))


def write_pki(directory: Path, clients: Sequence[Client], *, api_hosts: Sequence[str]) -> dict[str, Path]:
    """Write ca.crt, apiserver.{crt,key}, sa.{key,pub} and tokens.csv into ``directory``; their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority.generate()
    cert, key = ca.serving_pair("kube-apiserver", api_hosts)
    sa_private, sa_public = service_account_key()
    paths = {
        "ca_cert": directory / "ca.crt",
        "ca_key": _write_private(directory / "ca.key", ca.key_pem),
        "apiserver_cert": directory / "apiserver.crt",
        "apiserver_key": _write_private(directory / "apiserver.key", key),
        "sa_key": _write_private(directory / "sa.key", sa_private),
        "sa_pub": directory / "sa.pub",
        "tokens": _write_private(directory / "tokens.csv", "".join(c.line() + "\n" for c in clients).encode()),
    }
    paths["ca_cert"].write_bytes(ca.cert_pem)
    paths["apiserver_cert"].write_bytes(cert)
    paths["sa_pub"].write_bytes(sa_public)
    return paths


def load_ca(directory: Path) -> CertificateAuthority:
    return CertificateAuthority(
        cert_pem=(directory / "ca.crt").read_bytes(), key_pem=(directory / "ca.key").read_bytes()
    )
