"""Real certificates for the TLS tests, made with the openssl command line: a CA, a server
certificate for 127.0.0.1, and client certificates (one from the CA, one from another CA)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str) -> None:
    exe = shutil.which("openssl")
    assert exe, "openssl not found (Debian package openssl)"
    subprocess.run([exe, *args], check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, crt = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "2",
        "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign",
    )  # fmt: skip
    return key, crt


def _leaf(directory: Path, name: str, ca: tuple[Path, Path], san: str, usage: str) -> Path:
    key, csr, crt = (directory / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    ext = directory / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]),
        "-CAcreateserial", "-out", str(crt), "-days", "2", "-extfile", str(ext),
    )  # fmt: skip
    return crt


@dataclass(frozen=True, slots=True)
class Pki:
    directory: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path  # from the CA, SAN DNS:prometheus.example
    client_key: Path
    other_client_cert: Path  # from another CA, SAN DNS:prometheus.example
    other_client_key: Path
    wrong_san_cert: Path  # from the CA, SAN DNS:intruder.example
    wrong_san_key: Path


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "ca")
    other = _ca(directory, "other-ca")
    _leaf(directory, "server", ca, "IP:127.0.0.1,DNS:localhost", "serverAuth")
    _leaf(directory, "client", ca, "DNS:prometheus.example", "clientAuth")
    _leaf(directory, "other-client", other, "DNS:prometheus.example", "clientAuth")
    _leaf(directory, "intruder", ca, "DNS:intruder.example", "clientAuth")
    d = directory
    return Pki(
        d, ca[1], d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
        d / "other-client.crt", d / "other-client.key", d / "intruder.crt", d / "intruder.key",
    )  # fmt: skip
