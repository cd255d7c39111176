"""A throw-away certificate authority for the Kubernetes stand-in: kubectl sends a bearer token only over HTTPS.

``LoopbackTls.generate()`` makes a CA (tpuflow_rehearsal.controlplane.pki, as the real control plane's) and a server certificate for 127.0.0.1 / localhost signed by it
(EC P-256, valid for a week); the CA goes into the kubeconfig as certificate-authority-data, so
kubectl and the python clients verify the server as they verify a real apiserver.
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tpuflow_rehearsal.controlplane.pki import CertificateAuthority


@dataclass(frozen=True)
class LoopbackTls:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def generate(cls, common_name: str = "tpuflow-standin") -> LoopbackTls:
        ca = CertificateAuthority.generate(f"{common_name}-ca")
        cert, key = ca.serving_pair(common_name, ["localhost", "127.0.0.1", "::1"])
        return cls(ca_pem=ca.cert_pem, cert_pem=cert, key_pem=key)

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
