"""A self-signed serving certificate, so the emulator can stand where GKE's control plane stands.

GKE clients (``GKEKubernetesHook``, kinetic's GKE backend) connect to ``https://<endpoint>``
and verify it against the cluster CA that the GKE API returns
(``master_auth.cluster_ca_certificate``, base64 PEM). With ``ClusterEmulator(tls=True)``
the emulator serves HTTPS with a certificate for 127.0.0.1 that is its own CA, and
``ca_certificate_b64`` is the value a test hands out as that field.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import ssl
from pathlib import Path

__all__ = ["ServingCertificate"]


class ServingCertificate:
    """A key and a self-signed certificate for ``host`` (an IP address or a DNS name)."""

    def __init__(self, directory: Path, host: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kinetic-cluster-emulator")])
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        self.cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        self.cert_path = directory / "serving.crt"
        self.key_path = directory / "serving.key"
        self.cert_path.write_bytes(self.cert_pem)
        self.key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        self.key_path.chmod(0o600)

    @property
    def ca_certificate_b64(self) -> str:
        """The CA as GKE's API returns it: base64 of the PEM."""
        return base64.b64encode(self.cert_pem).decode()

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_path, self.key_path)
        return context
