"""A throw-away certificate authority for the Kubernetes stand-in: kubectl sends a bearer token only over HTTPS.

``LoopbackTls.generate()`` makes a CA and a server certificate for 127.0.0.1 / localhost signed by it
(EC P-256, valid for a week); the CA goes into the kubeconfig as certificate-authority-data, so
kubectl and the python clients verify the server as they verify a real apiserver.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LoopbackTls:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def generate(cls, common_name: str = "tpuflow-standin") -> LoopbackTls:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.UTC)
        lifetime = datetime.timedelta(days=7)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name}-ca")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + lifetime)
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
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + lifetime)
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.IPAddress(ipaddress.ip_address("::1")),
                    ]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cls(
            ca_pem=ca.public_bytes(serialization.Encoding.PEM),
            cert_pem=cert.public_bytes(serialization.Encoding.PEM),
            key_pem=key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )

    @property
    def ca_data(self) -> str:
        """certificate-authority-data for a kubeconfig."""
        return base64.b64encode(self.ca_pem).decode()

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # load_cert_chain reads files only: hand it a private temporary file that is gone right after.
        with tempfile.TemporaryDirectory(prefix="tpuflow-tls-") as tmp:
            chain, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            chain.write_bytes(self.cert_pem)
            key.touch(mode=0o600)
            key.write_bytes(self.key_pem)
            context.load_cert_chain(chain, key)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts this CA (urllib against the stand-in)."""
        return ssl.create_default_context(cadata=self.ca_pem.decode())
